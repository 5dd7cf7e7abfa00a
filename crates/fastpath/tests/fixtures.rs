//! Runs every packet fixture through the kernel program (BPF_PROG_TEST_RUN) and the Rust model,
//! and checks verdicts, counter changes, reply bytes and checksums (verified here independently).
//! Needs root to load BPF; prints why and skips otherwise.

use slipstream_fastpath::fixtures::{self, Fixture, PORT};
use slipstream_fastpath::{FastPathConfig, Kernel, Verdict};

fn root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn kernel() -> Option<Kernel> {
    if !root() {
        eprintln!("SKIP: not root, cannot load BPF programs");
        return None;
    }
    Some(Kernel::load(FastPathConfig { udp_port: PORT, entries_max: 1024 }).expect("load XDP program"))
}

/// Independent ones'-complement sum over 16-bit big-endian words.
fn sum16(data: &[u8]) -> u32 {
    let mut s: u32 = 0;
    let mut i = 0;
    while i + 1 < data.len() {
        s += u32::from(data[i]) << 8 | u32::from(data[i + 1]);
        i += 2;
    }
    if i < data.len() {
        s += u32::from(data[i]) << 8;
    }
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    s
}

/// Check the reply packet's headers against the request and verify every checksum; return the
/// memcached payload after the frame header.
fn check_reply(f: &Fixture, out: &[u8]) -> Vec<u8> {
    let req = &f.packet;
    assert_eq!(&out[0..6], &req[6..12], "{}: dst MAC = request src MAC", f.name);
    assert_eq!(&out[6..12], &req[0..6], "{}: src MAC = request dst MAC", f.name);
    let v6 = out[12..14] == [0x86, 0xdd];
    let (l4, pseudo) = if v6 {
        let ip = &out[14..54];
        assert_eq!(&ip[8..24], &req[14 + 24..14 + 40], "{}: v6 src", f.name);
        assert_eq!(&ip[24..40], &req[14 + 8..14 + 24], "{}: v6 dst", f.name);
        let plen = u16::from_be_bytes([ip[4], ip[5]]) as usize;
        assert_eq!(54 + plen, out.len(), "{}: payload length", f.name);
        assert_eq!(ip[6], 17);
        let mut ps = Vec::new();
        ps.extend_from_slice(&ip[8..40]);
        ps.extend_from_slice(&(plen as u32).to_be_bytes());
        ps.extend_from_slice(&[0, 0, 0, 17]);
        (54, ps)
    } else {
        let ip = &out[14..34];
        assert_eq!(ip[0], 0x45);
        assert_eq!(sum16(ip), 0xffff, "{}: IPv4 header checksum", f.name);
        assert_eq!(&ip[12..16], &req[14 + 16..14 + 20], "{}: v4 src", f.name);
        assert_eq!(&ip[16..20], &req[14 + 12..14 + 16], "{}: v4 dst", f.name);
        let tot = u16::from_be_bytes([ip[2], ip[3]]) as usize;
        assert_eq!(14 + tot, out.len(), "{}: total length", f.name);
        let mut ps = Vec::new();
        ps.extend_from_slice(&ip[12..20]);
        ps.extend_from_slice(&[0, 17]);
        ps.extend_from_slice(&((tot - 20) as u16).to_be_bytes());
        (34, ps)
    };
    let udp = &out[l4..];
    assert_eq!(&udp[0..2], &req[l4 + 2..l4 + 4], "{}: src port", f.name);
    assert_eq!(&udp[2..4], &req[l4..l4 + 2], "{}: dst port", f.name);
    assert_eq!(u16::from_be_bytes([udp[4], udp[5]]) as usize, udp.len(), "{}: UDP length", f.name);
    assert_ne!(&udp[6..8], &[0, 0], "{}: UDP checksum present", f.name);
    let mut all = pseudo;
    all.extend_from_slice(udp);
    assert_eq!(sum16(&all), 0xffff, "{}: UDP checksum", f.name);
    assert_eq!(&udp[8..16], &[0x12, 0x34, 0, 0, 0, 1, 0, 0], "{}: frame header", f.name);
    udp[16..].to_vec()
}

#[test]
fn fixtures_kernel_and_model_agree() {
    let Some(k) = kernel() else { return };
    let mut failures = Vec::new();
    for f in fixtures::all() {
        let (kout, now) = fixtures::run_kernel(&k, &f).expect("test run");
        let mout = fixtures::run_model(&f, now, k.epoch());
        let mut fail = |what: String| failures.push(format!("{}: {what}", f.name));
        if kout.verdict != f.verdict {
            fail(format!("kernel verdict {:?}, want {:?}", kout.verdict, f.verdict));
        }
        if mout.verdict != f.verdict {
            fail(format!("model verdict {:?}, want {:?}", mout.verdict, f.verdict));
        }
        let want = (f.hits, f.misses, f.throttled);
        if (kout.hits, kout.misses, kout.throttled) != want {
            fail(format!(
                "kernel hits/misses/throttled {}/{}/{}, want {want:?}",
                kout.hits, kout.misses, kout.throttled
            ));
        }
        if (mout.hits, mout.misses, mout.throttled) != want {
            fail(format!(
                "model hits/misses/throttled {}/{}/{}, want {want:?}",
                mout.hits, mout.misses, mout.throttled
            ));
        }
        if kout.spent != f.spent || mout.spent != f.spent {
            fail(format!("spent: kernel {:?}, model {:?}, want {:?}", kout.spent, mout.spent, f.spent));
        }
        // The model names a slot only for packets that got as far as the port lookup.
        if kout.slot != f.target_slot() || (mout.slot.is_some() && mout.slot != f.target_slot()) {
            fail(format!(
                "slot: kernel {:?} (None: its per-tenant counters disagree with the global ones), model {:?}, want {:?}",
                kout.slot,
                mout.slot,
                f.target_slot()
            ));
        }
        if kout.packet != mout.packet {
            fail(format!(
                "kernel and model packets differ:\n kernel {:02x?}\n model  {:02x?}",
                kout.packet, mout.packet
            ));
        }
        match f.verdict {
            Verdict::Tx => {
                let payload = check_reply(&f, &kout.packet);
                let want = f.reply.clone().unwrap_or_default();
                if payload != want {
                    fail(format!(
                        "reply {:?}, want {:?}",
                        String::from_utf8_lossy(&payload),
                        String::from_utf8_lossy(&want)
                    ));
                }
            }
            _ => {
                if kout.packet != f.packet {
                    fail("passed packet was modified".into());
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} fixture failures:\n{}", failures.len(), failures.join("\n"));
}

/// The model alone (no root needed): every fixture's verdict, counters and reply bytes.
#[test]
fn model_gives_expected_replies() {
    let now = 1_000_000_000_000;
    for f in fixtures::all() {
        let out = fixtures::run_model(&f, now, 1);
        assert_eq!(out.verdict, f.verdict, "{}", f.name);
        assert_eq!((out.hits, out.misses, out.throttled), (f.hits, f.misses, f.throttled), "{}", f.name);
        assert_eq!(out.spent, f.spent, "{}", f.name);
        if f.verdict == Verdict::Tx {
            assert_eq!(check_reply(&f, &out.packet), f.reply.clone().unwrap_or_default(), "{}", f.name);
        } else {
            assert_eq!(out.packet, f.packet, "{}", f.name);
        }
    }
}

#[test]
fn flush_all_and_invalidate_turn_hits_into_misses() {
    let Some(k) = kernel() else { return };
    let pkt = fixtures::memcached_frame(false, 0, 1, b"get foo\r\n");
    k.fill(b"foo", 0, 1, b"bar", 0).unwrap();
    assert_eq!(k.test_run(&pkt, 1).unwrap().verdict, Some(Verdict::Tx));
    k.invalidate(b"foo").unwrap();
    assert_eq!(k.test_run(&pkt, 1).unwrap().verdict, Some(Verdict::Pass));
    k.fill(b"foo", 0, 1, b"bar", 0).unwrap();
    assert_eq!(k.test_run(&pkt, 1).unwrap().verdict, Some(Verdict::Tx));
    k.flush_all().unwrap();
    assert!(k.lookup(b"foo").unwrap().is_none(), "flush_all deletes entries");
    assert_eq!(k.test_run(&pkt, 1).unwrap().verdict, Some(Verdict::Pass));
    // A value filled with an epoch that a flush has since left behind is dead even if present.
    let before = k.epoch();
    k.fill(b"foo", 0, 1, b"bar", 0).unwrap();
    k.flush_all().unwrap();
    assert_eq!(k.epoch(), before + 1);
    let c = k.counters().unwrap();
    assert_eq!(c.fastpath_invalidations, 3);
}

#[test]
fn not_cacheable_items_are_refused() {
    let Some(k) = kernel() else { return };
    use slipstream_fastpath::{Filled, NotCacheable};
    assert_eq!(k.fill(b"k", 0, 0, &vec![0u8; 1400], 0).unwrap(), Filled::NotCacheable(NotCacheable::TooLarge));
    assert_eq!(k.fill(&[b'k'; 251], 0, 0, b"v", 0).unwrap(), Filled::NotCacheable(NotCacheable::Key));
    assert_eq!(k.fill(b"ok", 0, 0, b"v", 0).unwrap(), Filled::Cached);
}

#[test]
fn map_full_skips_fills() {
    if !root() {
        eprintln!("SKIP: not root");
        return;
    }
    let k = Kernel::load(FastPathConfig { udp_port: PORT, entries_max: 4 }).unwrap();
    let mut cached = 0;
    for i in 0..8 {
        match k.fill(format!("key{i}").as_bytes(), 0, 0, b"v", 0).unwrap() {
            slipstream_fastpath::Filled::Cached => cached += 1,
            slipstream_fastpath::Filled::MapFull => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(cached, 4);
}

#[test]
fn per_packet_cost_is_reported() {
    let Some(k) = kernel() else { return };
    k.fill(b"foo", 0, 1, b"bar", 0).unwrap();
    let pkt = fixtures::memcached_frame(false, 0, 1, b"get foo\r\n");
    let (hit_ns, verdict) = k.mean_ns(&pkt, 2000).unwrap();
    assert_eq!(verdict, Some(Verdict::Tx));
    let miss = fixtures::memcached_frame(false, 0, 1, b"get nope\r\n");
    let (miss_ns, verdict) = k.mean_ns(&miss, 2000).unwrap();
    assert_eq!(verdict, Some(Verdict::Pass));
    let other = fixtures::udp_frame(false, 53, b"not memcached");
    let (base_ns, _) = k.mean_ns(&other, 2000).unwrap();
    println!(
        "XDP per packet (BPF_PROG_TEST_RUN, mean of 2000 single runs): get hit {hit_ns} ns, \
         get miss {miss_ns} ns, other UDP {base_ns} ns (includes the test harness per run)"
    );
    assert!(hit_ns < 100_000, "a hit should take microseconds at most, took {hit_ns} ns");
}

/// The map is keyed by a hash of the key: an entry holding another key's item (what a hash
/// collision would leave) must be a miss, in the kernel and in the model, never that item.
#[test]
fn an_entry_for_another_key_is_a_miss() {
    use slipstream_fastpath::item::compose;
    use slipstream_fastpath::model::{model, ModelState};
    let Some(k) = kernel() else { return };
    // Same length (so the map key could collide), differing in one byte, and in the last word.
    for (asked, filed) in [(&b"key:00000001"[..], &b"key:00000002"[..]), (b"a", b"b"), (b"abcdefgh", b"abcdefgi")] {
        k.flush_all().unwrap();
        k.fill_colliding(asked, filed, b"theirs").unwrap();
        assert!(k.lookup(asked).unwrap().is_none(), "lookup checks the key too");
        let pkt = fixtures::memcached_frame(false, 0, 1, &[&b"get "[..], asked, b"\r\n"].concat());
        let before = k.counters().unwrap();
        let r = k.test_run(&pkt, 1).unwrap();
        let after = k.counters().unwrap();
        assert_eq!(r.verdict, Some(Verdict::Pass), "{}", String::from_utf8_lossy(asked));
        assert_eq!(r.packet, pkt);
        assert_eq!(after.fastpath_misses - before.fastpath_misses, 1);
        let mut st = ModelState::single(PORT, k.epoch(), 0);
        st.items_mut(0).insert(asked.to_vec(), compose(filed, 0, 1, b"theirs", 0, k.epoch()).unwrap());
        let m = model(&pkt, &st);
        assert_eq!((m.verdict, m.misses), (Verdict::Pass, 1));
        // And the real fill of the asked key answers it.
        k.fill(asked, 0, 1, b"mine", 0).unwrap();
        assert_eq!(k.test_run(&pkt, 1).unwrap().verdict, Some(Verdict::Tx));
    }
}

/// Keys of every length class the word-wise hash and compare treat differently (shorter than,
/// equal to, longer than a word; the longest key), next to other keys in the same request so
/// the bytes after each key are not zeros. Kernel and model must agree byte for byte.
#[test]
fn keys_of_every_word_length_hit() {
    use slipstream_fastpath::model::model;
    let Some(k) = kernel() else { return };
    let lens: Vec<usize> = (1..=17).chain([23, 24, 25, 31, 32, 33, 63, 64, 65, 127, 248, 249, 250]).collect();
    for &n in &lens {
        k.flush_all().unwrap();
        let key: Vec<u8> = (0..n).map(|i| b'a' + (i % 26) as u8).collect();
        let mut other = key.clone();
        other.push(b'z');
        let mut shorter = key.clone();
        shorter.pop();
        k.fill(&key, 3, 9, b"val", 0).unwrap();
        let mut req = b"get ".to_vec();
        req.extend_from_slice(&key);
        req.extend_from_slice(b" ");
        req.extend_from_slice(&key);
        req.extend_from_slice(b"\r\n");
        let pkt = fixtures::memcached_frame(n % 2 == 0, 0, 1, &req);
        let r = k.test_run(&pkt, 1).unwrap();
        assert_eq!(r.verdict, Some(Verdict::Tx), "key length {n}");
        let mut st = slipstream_fastpath::model::ModelState::single(PORT, k.epoch(), 0);
        st.items_mut(0).insert(key.clone(), k.lookup(&key).unwrap().unwrap());
        let m = model(&pkt, &st);
        assert_eq!(m.packet, r.packet, "key length {n}: kernel and model replies differ");
        // Neighbours of the same prefix are other keys: misses.
        for probe in [&other, &shorter] {
            if probe.is_empty() || probe.len() > 250 {
                continue;
            }
            let req = [&b"get "[..], probe, b"\r\n"].concat();
            let pkt = fixtures::memcached_frame(false, 0, 1, &req);
            assert_eq!(k.test_run(&pkt, 1).unwrap().verdict, Some(Verdict::Pass), "probe of length {}", probe.len());
        }
    }
}

/// The tokenizer reads 8 bytes at a time and skips whole words inside a token: a space or LF
/// anywhere in such a word (any of its 8 positions), runs of spaces, and tokens ending exactly
/// at a word boundary must all be seen. Kernel and model must agree on each.
#[test]
fn tokenizer_word_boundaries_agree_with_the_model() {
    use slipstream_fastpath::model::{model, ModelState};
    let Some(k) = kernel() else { return };
    k.flush_all().unwrap();
    let keys: [&[u8]; 4] = [b"abcdefghijklmnop", b"abcdefg", b"abcdefghijklmnopq", b"x"];
    let mut st = ModelState::single(PORT, k.epoch(), 0);
    for key in keys {
        k.fill(key, 1, 2, b"val", 0).unwrap();
        st.items_mut(0).insert(key.to_vec(), k.lookup(key).unwrap().unwrap());
    }
    let mut reqs: Vec<Vec<u8>> = vec![
        b"get abcdefghijklmnop\r\n".to_vec(),
        b"get abcdefghijklmnop abcdefg abcdefghijklmnopq x\r\n".to_vec(),
        b"get        abcdefg        x        \r\n".to_vec(),
        b"gets x abcdefghijklmnopq\r\n".to_vec(),
    ];
    // An LF or a space at each position of a long key (LF: miss; space: splits the key).
    for i in 0..17 {
        for ch in [b'\n', b' ', b'\r'] {
            let mut r = b"get abcdefghijklmnopq x\r\n".to_vec();
            r[4 + i] = ch;
            reqs.push(r);
        }
    }
    for (n, req) in reqs.iter().enumerate() {
        let pkt = fixtures::memcached_frame(n % 2 == 1, 0, 1, req);
        let r = k.test_run(&pkt, 1).unwrap();
        let m = model(&pkt, &st);
        assert_eq!(r.verdict, Some(m.verdict), "{:?}", String::from_utf8_lossy(req));
        assert_eq!(r.packet, m.packet, "{:?}", String::from_utf8_lossy(req));
    }
    // The first four are hits.
    for req in &reqs[..4] {
        let r = k.test_run(&fixtures::memcached_frame(false, 0, 1, req), 1).unwrap();
        assert_eq!(r.verdict, Some(Verdict::Tx), "{:?}", String::from_utf8_lossy(req));
    }
}
