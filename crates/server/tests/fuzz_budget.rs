//! Fixed-budget fuzz run over the protocol executors (text, meta, binary), for `make test`.
//! The coverage-guided target for longer runs is `fuzz/` (cargo fuzz).
//!
//! Inputs are mutated from a corpus of valid requests. Properties checked for each input:
//! - no panic, and every `Consumed(n)` is within the input (asserted by the harness);
//! - the replies are the same whether the bytes arrive at once or split at random points
//!   (a request split across reads at any byte is handled identically), unless the input made
//!   the server close the connection or answer a get with CLIENT_ERROR (in both cases
//!   memcached's own answer depends on read boundaries, and we match memcached).
//!
//! Seed: `SLIPSTREAM_FUZZ_SEED` or the clock; always printed. Budget: `SLIPSTREAM_FUZZ_ITERS`
//! (default 200000) and at most 60 seconds.

use slipstream_server::harness::Harness;
use std::time::{Duration, Instant};

/// The project's one RNG (fastrand), seeded so a printed seed replays.
struct Rng(fastrand::Rng);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0.u64(..)
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

fn corpus() -> Vec<Vec<u8>> {
    let text: &[&[u8]] = &[
        b"set k 0 0 1\r\nv\r\n",
        b"set k 5 100 3 noreply\r\nabc\r\n",
        b"add k2 0 0 2\r\nxy\r\n",
        b"replace k 1 0 1\r\nz\r\n",
        b"append k 0 0 2\r\n12\r\n",
        b"prepend k 0 0 2\r\n34\r\n",
        b"cas k 0 0 1 1\r\nq\r\n",
        b"get k k2 k3\r\n",
        b"gets k\r\n",
        b"gat 10 k\r\n",
        b"gats 0 k k2\r\n",
        b"touch k 10\r\n",
        b"delete k\r\n",
        b"delete k noreply\r\n",
        b"incr n 5\r\n",
        b"decr n 3\r\n",
        b"set n 0 0 2\r\n10\r\n",
        b"flush_all\r\n",
        b"flush_all 10 noreply\r\n",
        b"version\r\n",
        b"verbosity 1\r\n",
        b"stats\r\n",
        b"stats items\r\n",
        b"stats slabs\r\n",
        b"stats settings\r\n",
        b"stats reset\r\n",
        b"mn\r\n",
        b"mg k v f c t s k O123 q\r\n",
        b"mg k N30 v t\r\n",
        b"mg k R30 T30 v h l\r\n",
        b"ms k 2 T0 F5 c\r\nhi\r\n",
        b"ms k 2 MA N0\r\nhi\r\n",
        b"ms k 2 I C1\r\nhi\r\n",
        b"md k q\r\n",
        b"md k I T30\r\n",
        b"ma n D5 MI v\r\n",
        b"ma n N0 J10 v\r\n",
        b"me k\r\n",
        b"mg a2V5 b v\r\n",
        b"get \r\n",
        b"\r\n",
        b"bogus command\r\n",
        b"set k 0 0 -1\r\n",
        b"set k 0 0 4\r\nabcdefgh\r\n",
    ];
    let mut c: Vec<Vec<u8>> = text.iter().map(|s| s.to_vec()).collect();
    // Binary protocol: a get, a set and a noop.
    let bin = |op: u8, extras: &[u8], key: &[u8], value: &[u8]| {
        let mut v = Vec::new();
        slipstream_proto::binary::compose_request(&mut v, op, key, extras, value, 0, 7);
        v
    };
    c.push(
        [bin(0x01, &[0, 0, 0, 1, 0, 0, 0, 0], b"k", b"val"), bin(0x00, &[], b"k", b""), bin(0x0a, &[], b"", b"")]
            .concat(),
    );
    c.push(
        [
            bin(0x05, &[0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0], b"n", b""),
            bin(0x0c, &[], b"n", b""),
        ]
        .concat(),
    );
    c.push(
        [bin(0x11, &[0, 0, 0, 0, 0, 0, 0, 0], b"q", b"x"), bin(0x09, &[], b"q", b""), bin(0x10, &[], b"", b"")]
            .concat(),
    );
    c
}

fn mutate(rng: &mut Rng, corpus: &[Vec<u8>]) -> Vec<u8> {
    // Start from 1-4 corpus entries of the same protocol family.
    let binary = rng.below(4) == 0;
    let family: Vec<&Vec<u8>> = corpus.iter().filter(|c| (c.first() == Some(&0x80)) == binary).collect();
    let mut v = Vec::new();
    for _ in 0..1 + rng.below(4) {
        v.extend_from_slice(family[rng.below(family.len())]);
    }
    for _ in 0..rng.below(6) {
        if v.is_empty() {
            break;
        }
        let at = rng.below(v.len());
        match rng.below(7) {
            0 => v[at] ^= 1 << rng.below(8),
            1 => v[at] = rng.next() as u8,
            2 => v.insert(at, b" \r\n0-9\x00\x80"[rng.below(8)]),
            3 => {
                v.remove(at);
            }
            4 => v.truncate(at),
            5 => {
                let n = rng.below(300);
                let fill = [b'a', b'9', b' ', 0xff][rng.below(4)];
                v.splice(at..at, std::iter::repeat_n(fill, n));
            }
            _ => {
                let other = &corpus[rng.below(corpus.len())];
                v.splice(at..at, other.iter().copied());
            }
        }
    }
    v
}

#[test]
fn executors_survive_mutated_input_and_splits() {
    let seed: u64 = std::env::var("SLIPSTREAM_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1)
    }) | 1;
    let iters: usize = std::env::var("SLIPSTREAM_FUZZ_ITERS").ok().and_then(|s| s.parse().ok()).unwrap_or(200_000);
    println!("fuzz_budget seed={seed} iters={iters} (rerun: SLIPSTREAM_FUZZ_SEED={seed})");
    let corpus = corpus();
    let mut rng = Rng(fastrand::Rng::with_seed(seed));
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut compared = 0usize;
    let mut done = 0usize;
    while done < iters && Instant::now() < deadline {
        done += 1;
        let input = mutate(&mut rng, &corpus);

        let mut whole = Harness::small();
        let out_whole = whole.feed(&input);

        let mut split = Harness::small();
        let mut out_split = Vec::new();
        let mut i = 0;
        while i < input.len() {
            let n = 1 + rng.below(17);
            let end = (i + n).min(input.len());
            out_split.extend(split.feed(&input[i..end]));
            i = end;
        }
        // General stats (text or binary) carry uptime and rusage, which differ between runs.
        let volatile = out_whole.windows(6).any(|w| w == b"rusage");
        // memcached drops the replies still queued in a read batch when a get fails with a
        // CLIENT_ERROR, so there what is answered depends on read boundaries (we match that).
        let batch_dependent = [&out_whole, &out_split].iter().any(|o| o.windows(12).any(|w| w == b"CLIENT_ERROR"));
        if !whole.closed && !split.closed && !volatile && !batch_dependent {
            compared += 1;
            assert_eq!(
                String::from_utf8_lossy(&out_whole),
                String::from_utf8_lossy(&out_split),
                "seed={seed} iteration={done}: split delivery changed the replies for input {:?}",
                String::from_utf8_lossy(&input)
            );
        }
    }
    println!("fuzz_budget: {done} inputs, {compared} compared whole vs split");
    assert!(done > 0);
}
