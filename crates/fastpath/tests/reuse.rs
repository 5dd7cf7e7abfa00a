//! A cached item read by the program while user space churns the items map: since Linux 6.1 a
//! freed element of a `BPF_F_NO_PREALLOC` hash map is reused for the next insert at once (no RCU
//! grace period per element), so without the readers' grace period (see `Kernel`'s docs) a
//! program still copying key A's element could send key B's value, or half of each. Here one
//! thread asks for A over and over (BPF_PROG_TEST_RUN) while another invalidates A, fills other
//! another key (which reuses A's element) and fills A again; every answer must be A's whole value of one
//! generation. Needs root; bounded in time and count.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use slipstream_fastpath::fixtures::{self, PORT};
use slipstream_fastpath::{FastPathConfig, Kernel, Verdict};

const KEY: &[u8] = b"asked:key";
const VALUE_BYTES: usize = 900;
const RUN_FOR: Duration = Duration::from_secs(3);
const READS_MAX: u64 = 2_000_000;

/// The program loaded with fresh maps, or None (said why) when not root.
fn kernel() -> Option<Arc<Kernel>> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIP: not root, cannot load BPF programs");
        return None;
    }
    Some(Arc::new(Kernel::load(FastPathConfig { udp_port: PORT, entries_max: 1024 }).expect("load")))
}

fn value(generation: u64) -> Vec<u8> {
    vec![b'a' + (generation % 26) as u8; VALUE_BYTES]
}

/// The memcached payload of an IPv4 reply (after Ethernet, IP, UDP and the frame header) is
/// `VALUE asked:key 0 900\r\n` + 900 equal letters + `\r\nEND\r\n`; anything else is a reply
/// that mixed items.
fn whole_value_of_key(reply: &[u8]) -> Result<(), String> {
    let payload = reply.get(14 + 20 + 8 + 8..).ok_or("short reply")?;
    let head = format!("VALUE {} 0 {VALUE_BYTES}\r\n", String::from_utf8_lossy(KEY));
    let rest = payload.strip_prefix(head.as_bytes()).ok_or_else(|| {
        format!("reply of another item: {:?}", String::from_utf8_lossy(&payload[..payload.len().min(40)]))
    })?;
    let data = rest.get(..VALUE_BYTES).ok_or("value cut short")?;
    if !data.iter().all(|b| *b == data[0]) || !data[0].is_ascii_lowercase() {
        return Err("value mixes two generations".into());
    }
    if &rest[VALUE_BYTES..] != b"\r\nEND\r\n" {
        return Err("bad reply tail".into());
    }
    Ok(())
}

#[test]
fn a_reader_never_sees_an_element_reused_for_another_fill() {
    let Some(k) = kernel() else { return };
    k.fill(KEY, 0, 1, &value(0), 0).expect("fill");
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (k, stop) = (Arc::clone(&k), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut generation = 0u64;
            while !stop.load(Ordering::Relaxed) && generation < 10_000_000 {
                generation += 1;
                k.invalidate(KEY).expect("invalidate");
                // Another key takes the freed element at once (same sizes, other bytes), then
                // the asked key comes back in a new element, so it is cached most of the time.
                let other = format!("other:{}", generation % 4);
                k.fill(other.as_bytes(), 0, 1, &value(generation + 1), 0).expect("fill other");
                k.fill(KEY, 0, 1, &value(generation), 0).expect("fill");
                k.invalidate(other.as_bytes()).expect("invalidate other");
            }
            generation
        })
    };
    let pkt = fixtures::memcached_frame(false, 0, 1, &[&b"get "[..], KEY, b"\r\n"].concat());
    let started = Instant::now();
    let (mut reads, mut hits, mut bad) = (0u64, 0u64, Vec::new());
    while started.elapsed() < RUN_FOR && reads < READS_MAX {
        reads += 1;
        let r = k.test_run(&pkt, 1).expect("test run");
        if r.verdict == Some(Verdict::Tx) {
            hits += 1;
            if let Err(why) = whole_value_of_key(&r.packet) {
                bad.push(why);
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let generations = writer.join().expect("writer");
    eprintln!("reads {reads}, hits {hits}, writer generations {generations}, bad replies {}", bad.len());
    assert!(hits > 100, "too few hits to say anything ({hits} of {reads})");
    assert!(bad.is_empty(), "{} bad replies, first: {:?}", bad.len(), bad.first());
}

/// The gate itself, deterministically: after a free, an insert waits for a reader that holds an
/// item (a simulated one: its CPU's count raised from user space), gives up after
/// GRACE_WAIT_NS_MAX, and goes ahead as soon as the reader is done; with no free since the last
/// grace period it does not wait at all.
#[test]
fn an_insert_after_a_free_waits_for_every_reader() {
    use slipstream_fastpath::{Filled, GRACE_WAIT_NS_MAX};
    let Some(k) = kernel() else { return };
    let limit = Duration::from_nanos(GRACE_WAIT_NS_MAX);
    k.fill(b"a", 0, 1, b"1", 0).expect("fill");
    k.invalidate(b"a").expect("invalidate");
    let cpu = std::thread::available_parallelism().map_or(1, |n| n.get()) - 1; // any CPU counts
    k.simulate_reader(cpu, true);
    let t = Instant::now();
    assert_eq!(k.fill(b"b", 0, 1, b"2", 0).expect("fill"), Filled::Deferred, "inserted under a reader");
    assert!(t.elapsed() >= limit, "gave up after {:?}, before the limit", t.elapsed());
    assert_eq!(k.gate_counters().skipped, 1);
    assert!(k.lookup(b"b").expect("lookup").is_none());
    // The reader finishes while the next insert waits: the insert then goes ahead.
    let release = {
        let k = Arc::clone(&k);
        std::thread::spawn(move || {
            std::thread::sleep(limit / 5);
            k.simulate_reader(cpu, false);
        })
    };
    let mut filled = Filled::Deferred;
    for _ in 0..50 {
        filled = k.fill(b"b", 0, 1, b"2", 0).expect("fill");
        if filled == Filled::Cached {
            break;
        }
    }
    release.join().expect("release");
    assert_eq!(filled, Filled::Cached);
    assert_eq!(k.gate_counters().graces, 1);
    // No free since that grace period: a held reader does not delay an insert.
    k.simulate_reader(cpu, true);
    assert_eq!(k.fill(b"c", 0, 1, b"3", 0).expect("fill"), Filled::Cached);
    // A fill over a cached key replaces (frees) its element: the next insert waits again.
    assert_eq!(k.fill(b"c", 0, 1, b"4", 0).expect("fill"), Filled::Cached);
    let skipped = k.gate_counters().skipped;
    assert_eq!(k.fill(b"d", 0, 1, b"5", 0).expect("fill"), Filled::Deferred);
    k.simulate_reader(cpu, false);
    assert_eq!(k.fill(b"d", 0, 1, b"5", 0).expect("fill"), Filled::Cached);
    assert_eq!(k.gate_counters(), slipstream_fastpath::GateCounters { graces: 2, skipped: skipped + 1 });
}
