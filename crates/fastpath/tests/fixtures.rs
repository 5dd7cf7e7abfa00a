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
        if (kout.hits, kout.misses) != (f.hits, f.misses) {
            fail(format!("kernel hits/misses {}/{}, want {}/{}", kout.hits, kout.misses, f.hits, f.misses));
        }
        if (mout.hits, mout.misses) != (f.hits, f.misses) {
            fail(format!("model hits/misses {}/{}, want {}/{}", mout.hits, mout.misses, f.hits, f.misses));
        }
        if kout.packet != mout.packet {
            fail(format!("kernel and model packets differ:\n kernel {:02x?}\n model  {:02x?}", kout.packet, mout.packet));
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
        assert_eq!((out.hits, out.misses), (f.hits, f.misses), "{}", f.name);
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
