//! Stream packet fixtures through the XDP program (BPF_PROG_TEST_RUN) and through the
//! user-space parsers/operators of slipstream-stream: the kernel must consume exactly what it
//! can take exactly, count it the same way user space does, and pass everything else up
//! untouched. Needs root to load BPF; prints why and skips otherwise.

use slipstream_fastpath::fixtures::udp_frame;
use slipstream_fastpath::stream::{self as ks, Event, StreamCfg};
use slipstream_fastpath::Kernel;
use slipstream_stream::changepoint::{ChangePoint, Detector};
use slipstream_stream::record::{parse_numbers, parse_words, Encoding, Limits};
use std::collections::BTreeMap;

const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;

fn kernel() -> Option<Kernel> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIP: not root, cannot load BPF programs");
        return None;
    }
    Some(Kernel::load_multi(16).expect("load XDP program"))
}

#[test]
fn word_fixtures_agree_with_the_user_space_parser() {
    let Some(k) = kernel() else { return };
    let s = k.streams();
    let cfg = StreamCfg {
        op: ks::OP_WORDCOUNT,
        window_ns: u64::MAX / 4,
        word_bytes_max: 32,
        records_max: 65_536,
        ..Default::default()
    };
    s.add_stream(3, 7000, cfg).expect("add stream");
    let long = "x".repeat(33);
    let fixtures: Vec<(Vec<u8>, u32)> = vec![
        (b"a b\tc\nd\r\ne\x0bf\x0cg  a".to_vec(), XDP_DROP),
        (b"".to_vec(), XDP_DROP),
        (b"   \n".to_vec(), XDP_DROP),
        (b"\"q\" a\\b \x01ctl\x7f".to_vec(), XDP_DROP),
        ("x".repeat(32).into_bytes(), XDP_DROP),
        (format!("ok {long}").into_bytes(), XDP_PASS), // longer than the kernel key
        ("caf\u{e9} ok".as_bytes().to_vec(), XDP_PASS), // non-ASCII: user space checks UTF-8
        (b"ok \xff".to_vec(), XDP_PASS),
        (vec![b'w'; 3000], XDP_PASS), // longer than the kernel parses
    ];
    let limits = Limits { word_bytes_max: 64, records_per_datagram_max: 65_536 };
    let mut want: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
    let (mut dropped, mut passed) = (0, 0);
    for (i, (payload, verdict)) in fixtures.iter().enumerate() {
        let got = s.test_run(&udp_frame(i % 2 == 1, 7000, payload)).expect("test run");
        assert_eq!(got, *verdict, "fixture {i}: {:?}", String::from_utf8_lossy(payload));
        if got == XDP_DROP {
            dropped += 1;
            parse_words(payload, &limits, |w| *want.entry(w.as_bytes().to_vec()).or_default() += 1);
        } else {
            passed += 1;
        }
    }
    let mut got: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
    let (drained, err) = s.drain_wordcount(3, u64::MAX);
    assert!(err.is_none(), "{err:?}");
    for (_, w, n) in drained {
        *got.entry(w).or_default() += n;
    }
    assert_eq!(got, want);
    let st = s.stats(3).expect("stats");
    assert_eq!((st.datagrams, st.passed, st.records), (dropped, passed, want.values().sum::<u64>()));
    assert!(s.drain_wordcount(3, u64::MAX).0.is_empty(), "drained windows are gone");
    // Another port is not the stream's: the KV path passes it.
    assert_eq!(s.test_run(&udp_frame(false, 7001, b"a")).expect("run"), XDP_PASS);
}

/// The next draw of the project's one RNG (fastrand, seeded; the seed is printed).
fn next(rng: &mut fastrand::Rng) -> u64 {
    rng.u64(..)
}

/// Random payloads (separators of every kind, words around the 8-byte steps of the kernel's
/// tokenizer and its 32-byte key, now and then a byte >= 0x80 or too many words): the kernel
/// consumes exactly the datagrams user space would count whole, and counts the same words.
#[test]
fn random_word_payloads_agree_with_the_user_space_parser() {
    let Some(k) = kernel() else { return };
    let s = k.streams();
    let records_max = 40u32;
    let cfg = StreamCfg {
        op: ks::OP_WORDCOUNT,
        window_ns: u64::MAX / 4,
        word_bytes_max: 32,
        records_max,
        ..Default::default()
    };
    s.add_stream(4, 7004, cfg).expect("add stream");
    let seed = test_seed();
    eprintln!("random_word_payloads: SEED={seed}");
    let mut st = fastrand::Rng::with_seed(seed);
    let seps = [b' ', b'\t', b'\n', b'\r', 0x0b, 0x0c];
    // No user-space limits here: every word is seen, so the kernel's own limits can be checked.
    let limits = Limits { word_bytes_max: 65_536, records_per_datagram_max: 65_536 };
    let mut want: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
    for case in 0..3000 {
        let mut p = Vec::new();
        let len_max = [8, 17, 40, 120, 400][(next(&mut st) % 5) as usize];
        while p.len() < len_max {
            let r = next(&mut st) % 100;
            if r < 30 {
                p.push(seps[(next(&mut st) % seps.len() as u64) as usize]);
            } else {
                let wl = if r < 35 { 30 + next(&mut st) % 5 } else { 1 + next(&mut st) % 12 };
                for _ in 0..wl {
                    let c = next(&mut st) % 1000;
                    p.push(if c == 0 { 0xc3 } else { b'!' + (c % 94) as u8 });
                }
            }
        }
        let ascii = p.iter().all(|b| *b < 0x80);
        let mut words = Vec::new();
        if ascii {
            parse_words(&p, &limits, |w| words.push(w.as_bytes().to_vec()));
        }
        let whole = ascii && words.len() <= records_max as usize && words.iter().all(|w| w.len() <= 32);
        let got = s.test_run(&udp_frame(case % 2 == 1, 7004, &p)).expect("test run");
        let expect = if whole { XDP_DROP } else { XDP_PASS };
        assert_eq!(got, expect, "SEED={seed} case {case}: {:?}", String::from_utf8_lossy(&p));
        if got == XDP_DROP {
            for w in words {
                *want.entry(w).or_default() += 1;
            }
        }
    }
    let mut got: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
    let (drained, err) = s.drain_wordcount(4, u64::MAX);
    assert!(err.is_none(), "{err:?}");
    for (_, w, n) in drained {
        *got.entry(w).or_default() += n;
    }
    assert_eq!(got, want, "SEED={seed}");
}

/// Runs `payloads` through the program on `port`; every one must get `verdict`.
fn run_all(s: &ks::StreamKernel, port: u16, payloads: &[Vec<u8>], verdict: u32) {
    for (i, p) in payloads.iter().enumerate() {
        let got = s.test_run(&udp_frame(i % 2 == 1, port, p)).expect("test run");
        assert_eq!(got, verdict, "payload {i} of {}: {:?}", payloads.len(), String::from_utf8_lossy(p));
    }
}

/// Distinct words `prefix0..prefixN`, `per` to a datagram, `rounds` times over.
fn word_datagrams(prefix: &str, n: usize, per: usize, rounds: usize) -> Vec<Vec<u8>> {
    let words: Vec<String> = (0..n).map(|i| format!("{prefix}{i}")).collect();
    let mut out = Vec::new();
    for _ in 0..rounds {
        for chunk in words.chunks(per) {
            out.push(chunk.join(" ").into_bytes());
        }
    }
    out
}

fn drained(s: &ks::StreamKernel, slot: u32, before: u64) -> BTreeMap<Vec<u8>, u64> {
    let (d, err) = s.drain_wordcount(slot, before);
    assert!(err.is_none(), "{err:?}");
    let mut got = BTreeMap::new();
    for (_, w, n) in d {
        assert!(got.insert(w, n).is_none(), "one entry per (window, word)");
    }
    got
}

/// A word-count stream on `slot`/`port` taking up to 1,024 words of up to 32 bytes per datagram.
fn wc_stream(s: &ks::StreamKernel, slot: u32, port: u16, window_ns: u64) {
    let cfg =
        StreamCfg { op: ks::OP_WORDCOUNT, window_ns, word_bytes_max: 32, records_max: 1024, ..Default::default() };
    s.add_stream(slot, port, cfg).expect("add stream");
}

/// CPUs the test's runs may land on (each has its own cache slots).
fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// More distinct words than the word-count cache has slots on every CPU together: by
/// pigeonhole, thousands of them find their slot taken and are counted in the hash map, the
/// rest in the cache; the drain must merge both places exactly, and leave nothing behind.
#[test]
fn cache_collisions_fall_back_to_the_map_and_merge_exactly() {
    let Some(k) = kernel() else { return };
    let s = k.streams();
    wc_stream(s, 5, 7005, u64::MAX / 4);
    let distinct = 3 * ks::WCC_SLOTS as usize * cpus() + 17;
    // Twice over, plus one hot word in every datagram (it stays in its slot).
    let mut payloads = word_datagrams("c", distinct, 100, 2);
    for p in &mut payloads {
        p.extend_from_slice(b" hot hot");
    }
    run_all(s, 7005, &payloads, XDP_DROP);
    let mut want: BTreeMap<Vec<u8>, u64> = (0..distinct).map(|i| (format!("c{i}").into_bytes(), 2)).collect();
    want.insert(b"hot".to_vec(), 2 * payloads.len() as u64);
    assert_eq!(drained(s, 5, u64::MAX), want);
    assert!(drained(s, 5, u64::MAX).is_empty(), "the cache and the map are empty after a drain");
    // The emptied slots are taken again.
    run_all(s, 7005, &[b"hot c1 c1".to_vec()], XDP_DROP);
    let again: BTreeMap<Vec<u8>, u64> = [(b"c1".to_vec(), 2), (b"hot".to_vec(), 1)].into_iter().collect();
    assert_eq!(drained(s, 5, u64::MAX), again);
}

/// Windows: a slot holding a window that has not been drained is not reused for the next one
/// (those words go to the other slot of the pair or to the map), and a drain up to a window takes only the windows before it.
#[test]
fn cache_slots_of_an_undrained_window_are_left_alone() {
    let Some(k) = kernel() else { return };
    let s = k.streams();
    let window_ns = 200_000_000u64;
    wc_stream(s, 6, 7006, window_ns);
    let now_window = || slipstream_fastpath::clock_monotonic_ns() / window_ns;
    // Start right after a window boundary so the first batch stays within one window.
    let w0 = now_window();
    while now_window() == w0 {
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let first = now_window();
    let a = word_datagrams("x", 300, 50, 1);
    run_all(s, 7006, &a, XDP_DROP);
    assert_eq!(now_window(), first, "the first batch took longer than a window on this machine");
    while now_window() == first {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let second = now_window();
    let b = word_datagrams("x", 300, 50, 2);
    run_all(s, 7006, &b, XDP_DROP);
    assert!(drained(s, 6, first).is_empty(), "nothing before the first window");
    let want_a: BTreeMap<Vec<u8>, u64> = (0..300).map(|i| (format!("x{i}").into_bytes(), 1)).collect();
    assert_eq!(drained(s, 6, second), want_a, "exactly the first window");
    let (rest, err) = s.drain_wordcount(6, u64::MAX);
    assert!(err.is_none(), "{err:?}");
    let mut by_window: BTreeMap<u64, u64> = BTreeMap::new();
    for (w, _, n) in &rest {
        *by_window.entry(*w).or_default() += n;
    }
    assert_eq!(by_window.keys().next(), Some(&second), "{by_window:?}");
    assert_eq!(by_window.values().sum::<u64>(), 600, "every word of the later windows: {by_window:?}");
}

/// Parses `payloads` as user space does and counts every word (the kernel consumed them all).
fn user_counts(payloads: &[Vec<u8>]) -> BTreeMap<Vec<u8>, u64> {
    let limits = Limits { word_bytes_max: 64, records_per_datagram_max: 65_536 };
    let mut want = BTreeMap::new();
    for p in payloads {
        parse_words(p, &limits, |w| *want.entry(w.as_bytes().to_vec()).or_default() += 1);
    }
    want
}

/// Words around the cache's word limit (16 bytes) and the 8-byte steps of a slot's word: words
/// that share their first 8 or 16 bytes, end in NUL bytes (a zero-padded slot must still tell
/// `a` from `a\0`), and every length from 1 to the key's 32. The short ones are counted in
/// cache slots, the longer ones in the hash map only; the drain must give exactly the
/// user-space parser's counts, each word once.
#[test]
fn word_lengths_around_the_cache_limit_count_exactly() {
    let Some(k) = kernel() else { return };
    let s = k.streams();
    wc_stream(s, 8, 7008, u64::MAX / 4);
    assert_eq!(ks::WCC_WORD_BYTES, 16, "the fixture's boundary words assume 16-byte slot words");
    let alphabet = b"abcdefghijklmnopqrstuvwxyz0123456789ABCDEF";
    let mut words: Vec<Vec<u8>> = (1..=ks::WORD_KEY_BYTES).map(|n| alphabet[..n].to_vec()).collect();
    for w in ["a\0", "a\0\0", "\0", "abcdefg\0", "abcdefgh\0", "abcdefghijklmno\0", "abcdefghijklmnop\0"] {
        words.push(w.as_bytes().to_vec());
    }
    // The same lengths with a different last byte (same first 8 / 16 bytes).
    for n in [8, 9, 15, 16, 17] {
        let mut w = alphabet[..n].to_vec();
        if let Some(last) = w.last_mut() {
            *last = b'#';
        }
        words.push(w);
    }
    let mut payloads = Vec::new();
    for round in 0..3 {
        // Each word once, twice (reversed order), once: under the kernel's 2,048 payload bytes.
        let mut p: Vec<u8> = Vec::new();
        for (i, w) in words.iter().enumerate() {
            let w = if round == 1 { &words[words.len() - 1 - i] } else { w };
            for _ in 0..(1 + round % 2) {
                p.extend_from_slice(w);
                p.push(b" \t\n"[i % 3]);
            }
        }
        payloads.push(p);
    }
    assert!(payloads.iter().all(|p| p.len() <= ks::STREAM_PAYLOAD_MAX));
    run_all(s, 7008, &payloads, XDP_DROP);
    let want = user_counts(&payloads);
    assert_eq!(want.len(), words.len(), "every fixture word is distinct");
    assert_eq!(drained(s, 8, u64::MAX), want);
    assert!(drained(s, 8, u64::MAX).is_empty(), "the cache and the map are empty after a drain");
    let st = s.stats(8).expect("stats");
    assert_eq!((st.datagrams, st.passed, st.records), (3, 0, want.values().sum::<u64>()));
}

/// Windows past what a cache slot's tag holds (`WCC_WINDOW_END`) are counted in the map, with
/// their full window number: 1 ns windows after 2^40 ns (18 minutes) of uptime.
#[test]
fn windows_past_the_cache_tag_are_counted_in_the_map() {
    let Some(k) = kernel() else { return };
    let s = k.streams();
    let t0 = slipstream_fastpath::clock_monotonic_ns();
    if t0 < ks::WCC_WINDOW_END {
        eprintln!("SKIP: uptime {t0} ns is below {} (1 ns windows still fit the cache's tag)", ks::WCC_WINDOW_END);
        return;
    }
    wc_stream(s, 9, 7009, 1);
    let payloads = word_datagrams("t", 40, 8, 3);
    run_all(s, 7009, &payloads, XDP_DROP);
    let t1 = slipstream_fastpath::clock_monotonic_ns();
    let (d, err) = s.drain_wordcount(9, u64::MAX);
    assert!(err.is_none(), "{err:?}");
    let mut got: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
    for (w, word, n) in d {
        assert!((t0..=t1).contains(&w), "window {w} outside [{t0}, {t1}]: not truncated to the tag");
        *got.entry(word).or_default() += n;
    }
    assert_eq!(got, user_counts(&payloads));
}

/// A full hash map: a datagram with a word that finds neither a cache slot nor room in the map
/// passes to user space whole, and what it had counted before that word (in the cache and in
/// the map) is undone exactly.
#[test]
fn a_full_map_undoes_the_cache_too() {
    let Some(k) = kernel() else { return };
    let s = k.streams();
    wc_stream(s, 7, 7007, u64::MAX / 4);
    // One CPU: a word counted in one CPU's cache slots is not in another's, and with every
    // slot and the map full, the last datagram below would pass on another CPU.
    pin_to_this_cpu();
    // Words longer than a cache slot holds (the map only), counted while the map has room.
    let long: Vec<Vec<u8>> = (0..10).map(|i| format!("long-word-{i:07}").into_bytes()).collect();
    assert!(long.iter().all(|w| w.len() == ks::WCC_WORD_BYTES + 1));
    let mut want: BTreeMap<Vec<u8>, u64> = long.iter().map(|w| (w.clone(), 1)).collect();
    run_all(s, 7007, &[long.join(&b' ')], XDP_DROP);
    // Enough distinct words to fill every cache slot and the map.
    let distinct = ks::WC_ENTRIES as usize + ks::WCC_SLOTS as usize * cpus() + 5_000;
    let mut consumed_all = true;
    for (i, p) in word_datagrams("f", distinct, 200, 1).iter().enumerate() {
        let got = s.test_run(&udp_frame(false, 7007, p)).expect("test run");
        if got == XDP_DROP {
            for w in p.split(|b| *b == b' ') {
                *want.entry(w.to_vec()).or_default() += 1;
            }
        } else {
            assert_eq!(got, XDP_PASS, "datagram {i}");
            consumed_all = false;
        }
    }
    assert!(!consumed_all, "the map never filled up");
    // Words already counted (short ones in a slot or in the map, long ones in the map), then
    // one that fits nowhere: a long word (map only) and a short one (its slot taken).
    let counted: Vec<Vec<u8>> = want.keys().filter(|w| w.starts_with(b"f")).take(50).cloned().collect();
    for never in [&b"never-seen-before"[..], b"f-never"] {
        let mut p = counted.join(&b' ');
        p.push(b' ');
        p.extend_from_slice(&long.join(&b' '));
        p.push(b' ');
        p.extend_from_slice(never);
        assert_eq!(s.test_run(&udp_frame(false, 7007, &p)).expect("test run"), XDP_PASS);
    }
    // Only words counted before: the kernel still takes it with the map full.
    let mut again = counted.join(&b' ');
    again.push(b' ');
    again.extend_from_slice(&long.join(&b' '));
    assert_eq!(s.test_run(&udp_frame(false, 7007, &again)).expect("test run"), XDP_DROP);
    for w in counted.iter().chain(&long) {
        *want.entry(w.clone()).or_default() += 1;
    }
    assert_eq!(drained(s, 7, u64::MAX), want, "the passed datagrams counted nothing");
}

/// Fills `ss_wc` through `port` with distinct words too long for the cache (they never touch a
/// slot) until a datagram passes for want of room; returns the words the kernel counted.
fn fill_the_map_with_long_words(s: &ks::StreamKernel, port: u16) -> BTreeMap<Vec<u8>, u64> {
    let mut counted = BTreeMap::new();
    let mut full = false;
    // The prefix alone is one byte longer than a cache slot's word ("long-fill-word-0" .. "-9"
    // were 16 bytes and took cache slots, which a fixture counting on free slots can trip over).
    let prefix = "long-fill-word-..";
    assert_eq!(prefix.len(), ks::WCC_WORD_BYTES + 1);
    for p in word_datagrams(prefix, ks::WC_ENTRIES as usize + 1_000, 80, 1) {
        if s.test_run(&udp_frame(false, port, &p)).expect("test run") == XDP_DROP {
            for w in p.split(|b| *b == b' ') {
                *counted.entry(w.to_vec()).or_default() += 1;
            }
        } else {
            full = true;
        }
    }
    assert!(full, "the map never filled up");
    counted
}

/// The cache is two-way: with the hash map full, two words whose hash picks the same slot are
/// both counted in the cache (the second in the other slot of the pair) and the datagram is
/// consumed; a third word on the same slot finds both taken and no room in the map, so its
/// datagram passes whole and the two counts it made are undone. A one-way cache passes the
/// first datagram already.
#[test]
fn two_words_sharing_a_slot_both_stay_in_the_cache() {
    let Some(k) = kernel() else { return };
    let s = k.streams();
    const SLOT: u32 = 8;
    wc_stream(s, SLOT, 7008, u64::MAX / 4);
    let target = ks::wcc_slot_of(SLOT, b"k0").expect("a short word");
    let same: Vec<Vec<u8>> = (0..200_000)
        .map(|i| format!("k{i}").into_bytes())
        .filter(|w| ks::wcc_slot_of(SLOT, w) == Some(target))
        .take(3)
        .collect();
    assert_eq!(same.len(), 3, "three words on slot {target}");
    let mut want = fill_the_map_with_long_words(s, 7008);
    let (a, b, c) = (&same[0], &same[1], &same[2]);
    let two = [a.as_slice(), b].join(&b' ');
    let three = [a.as_slice(), b, c].join(&b' ');
    assert_eq!(s.test_run(&udp_frame(false, 7008, &two)).expect("test run"), XDP_DROP, "two words, one slot");
    assert_eq!(s.test_run(&udp_frame(false, 7008, &three)).expect("test run"), XDP_PASS, "a third has no room");
    assert_eq!(s.test_run(&udp_frame(false, 7008, &two)).expect("test run"), XDP_DROP);
    want.insert(a.clone(), 2);
    want.insert(b.clone(), 2);
    assert_eq!(drained(s, SLOT, u64::MAX), want, "the third word's datagram counted nothing");
}

/// Pins the calling thread to the CPU it is on, so test runs share one CPU's cache slots.
fn pin_to_this_cpu() {
    // SAFETY: sched_getcpu has no preconditions; the cpu_set_t is zeroed, then one CPU is set
    // with the libc macro and passed with its own size for the calling thread (pid 0).
    unsafe {
        let cpu = libc::sched_getcpu();
        if cpu >= 0 {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu as usize, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        }
    }
}

/// A window change with the hash map full: the words of the window that just ended keep their
/// slots until the drain, and the same words in the next window are still counted in the cache
/// (each in the other slot of its pair), not passed to user space for want of map room. The
/// one-way cache sent every word of a new window to the map until the drain.
#[test]
fn a_new_window_does_not_wait_for_the_last_ones_drain() {
    let Some(k) = kernel() else { return };
    let s = k.streams();
    const SLOT: u32 = 9;
    let window_ns = 400_000_000u64;
    wc_stream(s, SLOT, 7009, window_ns);
    pin_to_this_cpu();
    // 40 short words, no two on one slot pair.
    let mut pairs = std::collections::HashSet::new();
    let words: Vec<Vec<u8>> = (0..100_000)
        .map(|i| format!("n{i}").into_bytes())
        .filter(|w| ks::wcc_slot_of(SLOT, w).is_some_and(|i| pairs.insert(i / 2)))
        .take(40)
        .collect();
    assert_eq!(words.len(), 40);
    let mut before = fill_the_map_with_long_words(s, 7009);
    let now_window = || slipstream_fastpath::clock_monotonic_ns() / window_ns;
    let w0 = now_window();
    while now_window() == w0 {
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let first = now_window();
    let p = words.join(&b' ');
    assert_eq!(s.test_run(&udp_frame(false, 7009, &p)).expect("test run"), XDP_DROP, "first window");
    assert_eq!(now_window(), first, "the first datagram took longer than a window on this machine");
    while now_window() == first {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let second = now_window();
    assert_eq!(s.test_run(&udp_frame(false, 7009, &p)).expect("test run"), XDP_DROP, "next window, no drain");
    for w in &words {
        before.insert(w.clone(), 1);
    }
    assert_eq!(drained(s, SLOT, second), before, "the fill words and the first window");
    let again: BTreeMap<Vec<u8>, u64> = words.iter().map(|w| (w.clone(), 1)).collect();
    assert_eq!(drained(s, SLOT, u64::MAX), again, "the second window");
}

/// A values (aggregate/filter) stream in `slot` on `port`: the kernel parses its numbers and
/// ships them through the ring buffer.
fn add_values_stream(s: &ks::StreamKernel, slot: u32, port: u16, records_max: u32) {
    let cfg =
        StreamCfg { op: ks::OP_VALUES, window_ns: 1_000_000, word_bytes_max: 32, records_max, ..Default::default() };
    s.add_stream(slot, port, cfg).expect("add stream");
}

/// The randomized tests' seed: `SEED` from the environment, else the clock (each test prints it).
fn test_seed() -> u64 {
    std::env::var("SEED").ok().and_then(|v| v.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1) | 1
    })
}

#[test]
fn number_fixtures_agree_with_the_user_space_parser() {
    let Some(k) = kernel() else { return };
    let s = k.streams();
    let mut ring = s.take_events().expect("ring buffer");
    add_values_stream(s, 5, 7005, 65_536);
    let fixtures: Vec<(&[u8], u32)> = vec![
        (b"1\n-2.5\n  3.25 \r\n\n.5\n5.\n+7.000001", XDP_DROP),
        (b"abc\n1 2\n+\n1e\n4", XDP_DROP), // malformed lines counted, 4 kept
        (b"42\r\t-xe\r\n42 -x \n1e \n2e+\t\n5", XDP_DROP), // blanks after garbage or a bare exponent
        (b"nan\ninf\n0x10\n8", XDP_DROP),
        (b"99999999.999999\n-100000000", XDP_DROP),
        (b"1.0000001", XDP_PASS),                // 7 significant fractional digits
        (b"1.50000000000", XDP_DROP),            // zeros beyond the 6th digit are exact
        (b"1e3", XDP_PASS),                      // exponent: user space
        (b"100000001", XDP_PASS),                // over 10^8
        (b"-0", XDP_PASS),                       // -0.0 has no fixed-point form
        (b"SSF1\0\0\0\0\0\0\xf0\x3f", XDP_PASS), // binary
    ];
    let limits = Limits::default();
    let mut want_vals = Vec::new();
    let mut want_bad = 0;
    for (i, (p, verdict)) in fixtures.iter().enumerate() {
        let got = s.test_run(&udp_frame(false, 7005, p)).expect("test run");
        assert_eq!(got, *verdict, "fixture {i}: {:?}", String::from_utf8_lossy(p));
        if got == XDP_DROP {
            let st = parse_numbers(p, Encoding::Auto, &limits, |v| want_vals.push(v));
            want_bad += st.malformed;
        }
    }
    let mut got_vals = Vec::new();
    while let Some(item) = ring.next() {
        if let Some(Event::Values { stream, values, .. }) = ks::parse_event(&item) {
            assert_eq!(stream, 5);
            got_vals.extend(values.into_iter().map(ks::micro_to_f64));
        }
    }
    assert_eq!(got_vals, want_vals);
    let st = s.stats(5).expect("stats");
    assert_eq!((st.malformed, st.records), (want_bad, want_vals.len() as u64));
}

#[test]
fn changepoint_in_kernel_matches_the_operator() {
    let Some(k) = kernel() else { return };
    let s = k.streams();
    let mut ring = s.take_events().expect("ring buffer");
    // Windows of 1 ns: every datagram (a later bpf_ktime_get_ns) opens a new window, as the
    // user-space detector does below with t = 0, 1, 2, ...
    let cfg = StreamCfg {
        op: ks::OP_CHANGEPOINT,
        window_ns: 1,
        word_bytes_max: 32,
        records_max: 256,
        reference_windows: 3,
        history: 5,
        threshold_n: ks::threshold_n(5.0).expect("threshold"),
        ..Default::default()
    };
    s.add_stream(7, 7007, cfg).expect("add stream");
    let series = ["10.5", "9.25", "10.125", "10", "9.75", "30.5", "31", "30.25", "29.75", "30", "10"];
    let mut cp = ChangePoint::new(1, 3, Detector::Reference { threshold: 5.0 }, 5);
    let mut want = Vec::new();
    for (i, v) in series.iter().enumerate() {
        assert_eq!(s.test_run(&udp_frame(false, 7007, v.as_bytes())).expect("run"), XDP_DROP, "{v}");
        let t = i as u64;
        cp.advance(t);
        cp.push(t, v.parse().expect("number"), &mut |a| want.push(a.clone()));
    }
    let mut got = Vec::new();
    while let Some(item) = ring.next() {
        if let Some(Event::Alert { stream, value_micro, windows, history, .. }) = ks::parse_event(&item) {
            assert_eq!(stream, 7);
            let means: Vec<f64> = windows.iter().map(|(s, n)| ks::micro_to_f64(*s) / *n as f64).collect();
            let reference = means.iter().sum::<f64>() / means.len() as f64;
            got.push((
                ks::micro_to_f64(value_micro),
                reference,
                history.into_iter().map(ks::micro_to_f64).collect::<Vec<_>>(),
            ));
        }
    }
    assert_eq!(want.len(), 2, "{want:?}");
    assert_eq!(got.len(), want.len(), "{got:?}");
    for ((v, r, h), a) in got.iter().zip(&want) {
        assert_eq!(*v, a.value);
        assert!(((r - a.reference) / a.reference).abs() <= 1e-12, "{r} vs {}", a.reference);
        assert_eq!(h, &a.history);
    }
    // A datagram the kernel cannot take hands the stream to user space for good.
    assert_eq!(s.test_run(&udp_frame(false, 7007, b"1e1")).expect("run"), XDP_PASS);
    assert_eq!(s.test_run(&udp_frame(false, 7007, b"10")).expect("run"), XDP_PASS);
    let snap = s.cp_snapshot(7, 3, 5).expect("snapshot");
    assert_eq!(snap.mode, 1);
    assert_eq!(
        snap.history.iter().map(|m| ks::micro_to_f64(*m)).collect::<Vec<_>>(),
        vec![31.0, 30.25, 29.75, 30.0, 10.0]
    );
    assert_eq!(s.stats(7).expect("stats").alerts, 2);
}

/// Random number payloads (well-formed and not, every length up to 300 bytes, so lines and the
/// payload end at every offset within the parser's 8-byte steps): a datagram the kernel keeps
/// yields exactly the values and malformed count of the user-space parser, in order.
#[test]
fn random_number_payloads_agree_with_the_user_space_parser() {
    let Some(k) = kernel() else { return };
    let s = k.streams();
    let mut ring = s.take_events().expect("ring buffer");
    add_values_stream(s, 6, 7006, 256);
    let seed = test_seed();
    eprintln!("random_number_payloads: SEED={seed}");
    let mut st = fastrand::Rng::with_seed(seed);
    let pieces: [&[u8]; 14] =
        [b"0", b"7", b"42", b"-", b"+", b".", b"5", b"000001", b" ", b"\t", b"\r", b"x", b"e", b"123456789"];
    let limits = Limits::default();
    let (mut want_vals, mut want_bad, mut kept) = (Vec::new(), 0u64, 0u32);
    for case in 0..2000 {
        let len_max = 1 + (next(&mut st) % 300) as usize;
        let mut p = Vec::new();
        while p.len() < len_max {
            if next(&mut st) % 6 == 0 {
                p.push(b'\n');
            } else {
                p.extend_from_slice(pieces[(next(&mut st) % pieces.len() as u64) as usize]);
            }
        }
        p.truncate(len_max);
        let got = s.test_run(&udp_frame(false, 7006, &p)).expect("test run");
        let mut got_vals = Vec::new();
        while let Some(item) = ring.next() {
            if let Some(Event::Values { values, .. }) = ks::parse_event(&item) {
                got_vals.extend(values.into_iter().map(ks::micro_to_f64));
            }
        }
        if got == XDP_DROP {
            kept += 1;
            let mut want = Vec::new();
            let r = parse_numbers(&p, Encoding::Auto, &limits, |v| want.push(v));
            want_bad += r.malformed;
            assert_eq!(got_vals, want, "seed {seed} case {case}: {:?}", String::from_utf8_lossy(&p));
            want_vals.extend(want);
        } else {
            assert_eq!(got, XDP_PASS, "case {case}");
            assert!(got_vals.is_empty(), "case {case}: a passed datagram shipped values");
        }
    }
    assert!(kept > 200, "too few datagrams kept by the kernel to compare: {kept}");
    let stats = s.stats(6).expect("stats");
    assert_eq!((stats.malformed, stats.records), (want_bad, want_vals.len() as u64), "seed {seed}");
}
