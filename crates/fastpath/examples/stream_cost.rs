//! Per-datagram cost of the XDP stream engine (word count, change point), measured in the
//! kernel with BPF_PROG_TEST_RUN's repeat loop (no interface needed; fresh maps). Prints one
//! line per case: kernel-timed mean ns per datagram and per record, and the verdict. Needs root.
//!
//! Usage: `stream_cost [RUNS]` (default 20000). The fixed word-count datagrams are what
//! `slipstream send --kind words` writes (words `w<rank>`, one space apart); repeated runs
//! count the same words into the same window, so every lookup after the first hits, as in a
//! steady stream over a small vocabulary. The last lines cycle through 256 different Zipf
//! datagrams of 16, 64, 150, 256 and 1 words, warm and with the caches flushed between
//! datagrams (what live runs see: see `rotation`). Word-count windows are 1 s and drained as
//! soon as they end, as the daemon does (a window not drained keeps its words' cache slots, and
//! every later word would be counted in the hash map instead).
//!
//! Not for: end-to-end figures (bench/stream_cpu.sh measures those across a veth pair).

use slipstream_fastpath::fixtures::udp_frame;
use slipstream_fastpath::stream::{self as ks, StreamCfg};
use slipstream_fastpath::Kernel;

const WC_PORT: u16 = 7100;
const CP_PORT: u16 = 7101;
/// The word-count stream's slot and window.
const WC_SLOT: u32 = 0;
const WC_WINDOW_NS: u64 = 1_000_000_000;

/// The window below which everything has been drained.
static DRAINED_TO: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Drains the word-count windows that have ended (outside the timed runs, and only when one
/// has: a drain reads every cache slot, which would warm them), as the daemon does.
fn drain_ended(s: &slipstream_fastpath::stream::StreamKernel) {
    use std::sync::atomic::Ordering;
    let now = slipstream_fastpath::clock_monotonic_ns() / WC_WINDOW_NS;
    if DRAINED_TO.swap(now, Ordering::Relaxed) == now {
        return;
    }
    if let (_, Some(e)) = s.drain_wordcount(WC_SLOT, now) {
        eprintln!("stream_cost: drain: {e}");
    }
}

fn words(n: usize) -> Vec<u8> {
    // Zipf-like ranks: mostly short words, some up to four digits.
    let ranks = [0, 1, 12, 3, 0, 145, 2, 7, 0, 31, 1, 999, 4, 0, 58, 2];
    let v: Vec<String> = (0..n).map(|i| format!("w{}", ranks[i % ranks.len()])).collect();
    v.join(" ").into_bytes()
}

/// `n` datagrams of `words_per` Zipf (s = 1) draws over 1,000 words `w<rank>`, as `slipstream send
/// --kind words` writes them (same shape, own generator: this crate does not depend on send's).
fn zipf_datagrams(n: usize, words_per: usize, seed: u64) -> Vec<Vec<u8>> {
    let h: Vec<f64> = (1..=1000)
        .scan(0.0, |acc, k| {
            *acc += 1.0 / f64::from(k);
            Some(*acc)
        })
        .collect();
    let total = h[h.len() - 1];
    let mut x = seed | 1;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x >> 11) as f64 / (1u64 << 53) as f64
    };
    (0..n)
        .map(|_| {
            let v: Vec<String> = (0..words_per)
                .map(|_| {
                    let u = next() * total;
                    format!("w{}", h.partition_point(|&c| c < u).min(999))
                })
                .collect();
            v.join(" ").into_bytes()
        })
        .collect()
}

/// The live benchmark's shape: 256 different datagrams in turn (one run each: branches and
/// cache slots vary as on the wire), warm, and with the CPU caches flushed between datagrams by
/// writing 8 MiB (as other work on the receive core does between bursts).
fn rotation(s: &slipstream_fastpath::stream::StreamKernel, runs: u32, words_per: usize) {
    let frames: Vec<Vec<u8>> =
        zipf_datagrams(256, words_per, 0x5eed).iter().map(|p| udp_frame(false, WC_PORT, p)).collect();
    let mut junk = vec![0u8; 8 << 20];
    for cold in [false, true] {
        let mut total = 0u64;
        let mut n = 0u64;
        let rounds = (runs as usize / frames.len()).max(1);
        for r in 0..rounds {
            for f in &frames {
                drain_ended(s);
                if cold {
                    for b in junk.iter_mut().step_by(64) {
                        *b = b.wrapping_add(r as u8 | 1);
                    }
                }
                if let Ok((1, ns)) = s.test_run_ns(f, 1) {
                    total += u64::from(ns);
                    n += 1;
                }
            }
        }
        let ns = total as f64 / n.max(1) as f64;
        println!(
            "  wordcount, 256 Zipf datagrams of {words_per:>3} words in turn{:<6} {:>6.0} ns/datagram {:>6.1} ns/record  ({n} consumed)",
            if cold { ", cold" } else { ", warm" },
            ns,
            ns / words_per as f64
        );
    }
    std::hint::black_box(&junk);
}

fn numbers(n: usize) -> Vec<u8> {
    let v: Vec<String> = (0..n).map(|i| format!("{:.6}", 10.0 + (i as f64 * 0.37).sin())).collect();
    v.join("\n").into_bytes()
}

fn main() {
    let runs: u32 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(20_000).clamp(1, 1_000_000);
    let k = match Kernel::load_multi(16) {
        Ok(k) => k,
        Err(e) => {
            eprintln!("stream_cost: cannot load the XDP program: {e}");
            std::process::exit(1);
        }
    };
    let s = k.streams();
    let wc = StreamCfg {
        op: ks::OP_WORDCOUNT,
        window_ns: WC_WINDOW_NS,
        word_bytes_max: 32,
        records_max: 65_536,
        ..Default::default()
    };
    let cp = StreamCfg {
        op: ks::OP_CHANGEPOINT,
        window_ns: 10_000_000,
        reference_windows: 4,
        history: 64,
        threshold_n: ks::threshold_n(7.0).unwrap_or(0),
        records_max: 65_536,
        ..Default::default()
    };
    if let Err(e) = s.add_stream(WC_SLOT, WC_PORT, wc).and_then(|()| s.add_stream(1, CP_PORT, cp)) {
        eprintln!("stream_cost: add stream: {e}");
        std::process::exit(1);
    }
    let cases: Vec<(&str, u16, Vec<u8>, usize)> = vec![
        ("wordcount, 16 words (the benchmark's datagram)", WC_PORT, words(16), 16),
        ("wordcount, 64 words", WC_PORT, words(64), 64),
        ("wordcount, 1 word", WC_PORT, words(1), 1),
        ("changepoint, 16 values (6 decimals)", CP_PORT, numbers(16), 16),
        ("changepoint, 1 value", CP_PORT, numbers(1), 1),
    ];
    println!("XDP stream engine cost, {runs} runs per case (kernel-timed):");
    for (name, port, payload, records) in cases {
        drain_ended(s);
        match s.test_run_ns(&udp_frame(false, port, &payload), runs) {
            Ok((verdict, ns)) => println!(
                "  {name:<48} {:>6} ns/datagram {:>6.1} ns/record  verdict {}",
                ns,
                f64::from(ns) / records as f64,
                match verdict {
                    1 => "DROP (consumed)",
                    2 => "PASS",
                    _ => "other",
                }
            ),
            Err(e) => println!("  {name:<48} error: {e}"),
        }
    }
    // The datagram shapes of the words-per-datagram curve (docs/benchmarks.md, session 15):
    // 16, 64, 150 and 256 words (256 of these 2-4-byte words are a ~1,000-byte payload).
    for words_per in [16, 64, 150, 256, 1] {
        rotation(s, runs, words_per);
    }
}
