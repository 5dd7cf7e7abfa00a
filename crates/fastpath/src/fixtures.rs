//! Packet fixtures for the fast path: input packet + cache contents → expected verdict, counter
//! changes and memcached reply bytes. The same fixtures run through the kernel program
//! (BPF_PROG_TEST_RUN, [`run_kernel`]) and the pure-Rust model ([`run_model`]); tests demand that
//! both agree with each other byte for byte and with the expected reply. The user-space server
//! can run the same requests ([`Fixture::request`]) and compare with [`Fixture::reply`].
//!
//! Not for: network I/O. Packets are built here with correct checksums.

use crate::abi::Item;
use crate::item;
use crate::model::{self, ModelState, Outcome, Verdict};
use crate::{FastPathError, Kernel};
use std::collections::HashMap;

/// UDP port the fixtures' requests go to.
pub const PORT: u16 = 11211;
/// Client port the fixtures' requests come from.
pub const CLIENT_PORT: u16 = 40000;
/// Request id in every fixture's frame header.
pub const REQUEST_ID: u16 = 0x1234;

const SERVER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
const CLIENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];
const SERVER_V4: [u8; 4] = [10, 201, 0, 1];
const CLIENT_V4: [u8; 4] = [10, 201, 0, 2];
const SERVER_V6: [u8; 16] = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
const CLIENT_V6: [u8; 16] = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];

/// When an item expires, relative to the moment the fixture runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expiry {
    Never,
    /// One second ago.
    Past,
    /// In an hour.
    Future,
}

/// One cached item a fixture needs.
#[derive(Clone, Debug)]
pub struct FixtureItem {
    pub key: Vec<u8>,
    pub flags: u32,
    pub cas: u64,
    pub value: Vec<u8>,
    pub expiry: Expiry,
}

/// One fixture.
#[derive(Clone, Debug)]
pub struct Fixture {
    pub name: &'static str,
    /// The request as it arrives (Ethernet frame).
    pub packet: Vec<u8>,
    /// The memcached request bytes inside it (after the frame header), if it is a memcached
    /// UDP request at all.
    pub request: Option<Vec<u8>>,
    pub items: Vec<FixtureItem>,
    pub verdict: Verdict,
    /// For `Tx`: the reply bytes after the frame header.
    pub reply: Option<Vec<u8>>,
    pub hits: u64,
    pub misses: u64,
}

fn it(key: &[u8], flags: u32, cas: u64, value: &[u8], expiry: Expiry) -> FixtureItem {
    FixtureItem { key: key.to_vec(), flags, cas, value: value.to_vec(), expiry }
}

/// Ones'-complement checksum helper for building packets.
fn csum(parts: &[&[u8]]) -> u16 {
    !model::ones_sum(parts)
}

/// An Ethernet + IPv4/IPv6 + UDP frame to `dport` carrying `udp_payload`, correct checksums;
/// IPv4 frames are padded to Ethernet's 60-byte minimum like real frames.
pub fn udp_frame(v6: bool, dport: u16, udp_payload: &[u8]) -> Vec<u8> {
    let udp_len = (8 + udp_payload.len()) as u16;
    let mut udp = Vec::with_capacity(usize::from(udp_len));
    udp.extend_from_slice(&CLIENT_PORT.to_be_bytes());
    udp.extend_from_slice(&dport.to_be_bytes());
    udp.extend_from_slice(&udp_len.to_be_bytes());
    udp.extend_from_slice(&[0, 0]);
    udp.extend_from_slice(udp_payload);
    let mut p = Vec::with_capacity(128 + udp.len());
    p.extend_from_slice(&SERVER_MAC);
    p.extend_from_slice(&CLIENT_MAC);
    if v6 {
        p.extend_from_slice(&0x86ddu16.to_be_bytes());
        let ulen = udp_len.to_be_bytes();
        let c = csum(&[&CLIENT_V6, &SERVER_V6, &[0, 0, ulen[0], ulen[1], 0, 0, 0, 17], &udp]);
        udp[6..8].copy_from_slice(&(if c == 0 { 0xffff } else { c }).to_be_bytes());
        p.extend_from_slice(&[0x60, 0, 0, 0]);
        p.extend_from_slice(&udp_len.to_be_bytes());
        p.extend_from_slice(&[17, 64]);
        p.extend_from_slice(&CLIENT_V6);
        p.extend_from_slice(&SERVER_V6);
    } else {
        p.extend_from_slice(&0x0800u16.to_be_bytes());
        let ulen = udp_len.to_be_bytes();
        let c = csum(&[&CLIENT_V4, &SERVER_V4, &[0, 17, ulen[0], ulen[1]], &udp]);
        udp[6..8].copy_from_slice(&(if c == 0 { 0xffff } else { c }).to_be_bytes());
        let mut h = [0u8; 20];
        h[0] = 0x45;
        h[2..4].copy_from_slice(&(20 + udp_len).to_be_bytes());
        h[4..6].copy_from_slice(&0x4242u16.to_be_bytes());
        h[8] = 64;
        h[9] = 17;
        h[12..16].copy_from_slice(&CLIENT_V4);
        h[16..20].copy_from_slice(&SERVER_V4);
        let c = csum(&[&h]);
        h[10..12].copy_from_slice(&c.to_be_bytes());
        p.extend_from_slice(&h);
    }
    p.extend_from_slice(&udp);
    while p.len() < 60 {
        p.push(0);
    }
    p
}

/// A memcached UDP request frame: frame header (id, seq, total) + `request`.
pub fn memcached_frame(v6: bool, seq: u16, total: u16, request: &[u8]) -> Vec<u8> {
    let mut pl = Vec::with_capacity(8 + request.len());
    pl.extend_from_slice(&REQUEST_ID.to_be_bytes());
    pl.extend_from_slice(&seq.to_be_bytes());
    pl.extend_from_slice(&total.to_be_bytes());
    pl.extend_from_slice(&[0, 0]);
    pl.extend_from_slice(request);
    udp_frame(v6, PORT, &pl)
}

fn hit(name: &'static str, v6: bool, req: &[u8], items: Vec<FixtureItem>, reply: &[u8]) -> Fixture {
    Fixture {
        name,
        packet: memcached_frame(v6, 0, 1, req),
        request: Some(req.to_vec()),
        items,
        verdict: Verdict::Tx,
        reply: Some(reply.to_vec()),
        hits: 1,
        misses: 0,
    }
}

fn miss(name: &'static str, v6: bool, req: &[u8], items: Vec<FixtureItem>) -> Fixture {
    Fixture {
        name,
        packet: memcached_frame(v6, 0, 1, req),
        request: Some(req.to_vec()),
        items,
        verdict: Verdict::Pass,
        reply: None,
        hits: 0,
        misses: 1,
    }
}

fn other(name: &'static str, packet: Vec<u8>, items: Vec<FixtureItem>) -> Fixture {
    Fixture { name, packet, request: None, items, verdict: Verdict::Pass, reply: None, hits: 0, misses: 0 }
}

fn foo() -> FixtureItem {
    it(b"foo", 5, 77, b"bar", Expiry::Never)
}

fn k2() -> FixtureItem {
    it(b"k2", 4294967295, 78, b"", Expiry::Future)
}

/// Every fixture.
pub fn all() -> Vec<Fixture> {
    let mut v = vec![
        hit("get hit ipv4", false, b"get foo\r\n", vec![foo()], b"VALUE foo 5 3\r\nbar\r\nEND\r\n"),
        hit("get hit ipv6", true, b"get foo\r\n", vec![foo()], b"VALUE foo 5 3\r\nbar\r\nEND\r\n"),
    ];
    v.push(miss("get miss", false, b"get nope\r\n", vec![foo()]));
    v.push(miss("get miss ipv6", true, b"get nope\r\n", vec![]));
    v.push(hit(
        "multi-key get all hit",
        false,
        b"get foo k2 foo\r\n",
        vec![foo(), k2()],
        b"VALUE foo 5 3\r\nbar\r\nVALUE k2 4294967295 0\r\n\r\nVALUE foo 5 3\r\nbar\r\nEND\r\n",
    ));
    v.push(hit(
        "multi-key get extra spaces",
        true,
        b"get  foo   k2 \r\n",
        vec![foo(), k2()],
        b"VALUE foo 5 3\r\nbar\r\nVALUE k2 4294967295 0\r\n\r\nEND\r\n",
    ));
    v.push(miss("multi-key get one miss", false, b"get foo nope k2\r\n", vec![foo(), k2()]));
    v.push(hit("gets with cas", false, b"gets foo\r\n", vec![foo()], b"VALUE foo 5 3 77\r\nbar\r\nEND\r\n"));
    v.push(hit(
        "gets multi-key ipv6",
        true,
        b"gets k2 foo\r\n",
        vec![foo(), k2()],
        b"VALUE k2 4294967295 0 78\r\n\r\nVALUE foo 5 3 77\r\nbar\r\nEND\r\n",
    ));
    v.push(miss("expired", false, b"get old\r\n", vec![it(b"old", 0, 1, b"v", Expiry::Past)]));
    v.push(hit("not yet expired", false, b"get new\r\n", vec![it(b"new", 0, 1, b"v", Expiry::Future)], b"VALUE new 0 1\r\nv\r\nEND\r\n"));
    v.push(hit("mg v", false, b"mg foo v\r\n", vec![foo()], b"VA 3\r\nbar\r\n"));
    v.push(hit("mg v f", false, b"mg foo v f\r\n", vec![foo()], b"VA 3 f5\r\nbar\r\n"));
    v.push(hit("mg f v ipv6", true, b"mg foo f v\r\n", vec![foo()], b"VA 3 f5\r\nbar\r\n"));
    v.push(miss("mg unsupported flag", false, b"mg foo v t\r\n", vec![foo()]));
    v.push(miss("mg without v", false, b"mg foo\r\n", vec![foo()]));
    v.push(miss("mg miss", false, b"mg nope v\r\n", vec![foo()]));
    v.push(other("non-memcached udp port", udp_frame(false, 53, b"\x12\x34\x00\x00\x00\x01\x00\x00get foo\r\n"), vec![foo()]));
    v.push(other("udp set passes", memcached_frame(false, 0, 1, b"set foo 0 0 1\r\nx\r\n"), vec![foo()]));
    // TCP to the memcached port carrying a get.
    let mut tcp = memcached_frame(false, 0, 1, b"get foo\r\n");
    tcp[14 + 9] = 6;
    v.push(other("tcp passes", tcp, vec![foo()]));
    let mut frag = memcached_frame(false, 0, 1, b"get foo\r\n");
    frag[14 + 6] = 0x20; // MF
    v.push(other("ipv4 fragment passes", frag, vec![foo()]));
    let mut bad = miss("multi-datagram frame", false, b"get foo\r\n", vec![foo()]);
    bad.packet = memcached_frame(false, 0, 2, b"get foo\r\n");
    v.push(bad);
    let mut bad = miss("nonzero sequence", false, b"get foo\r\n", vec![foo()]);
    bad.packet = memcached_frame(false, 1, 1, b"get foo\r\n");
    v.push(bad);
    v.push(other("runt frame header", udp_frame(false, PORT, b"\x12\x34\x00"), vec![foo()]));
    v.push(miss("bare LF line end", false, b"get foo\n", vec![foo()]));
    v.push(miss("two commands in one datagram", false, b"get foo\r\nget foo\r\n", vec![foo()]));
    v.push(miss("get without key", false, b"get \r\n", vec![foo()]));
    let long = vec![b'k'; 251];
    let mut req = b"get ".to_vec();
    req.extend_from_slice(&long);
    req.extend_from_slice(b"\r\n");
    v.push(miss("oversized key", false, &req, vec![foo()]));
    let max = vec![b'm'; 250];
    let mut req = b"get ".to_vec();
    req.extend_from_slice(&max);
    req.extend_from_slice(b"\r\n");
    let mut reply = b"VALUE ".to_vec();
    reply.extend_from_slice(&max);
    reply.extend_from_slice(b" 1 2\r\nhi\r\nEND\r\n");
    v.push(hit("250-byte key", false, &req, vec![it(&max, 1, 1, b"hi", Expiry::Never)], &reply));
    // Eight keys hit; nine are more than the kernel handles.
    let eight: Vec<FixtureItem> = (0..9u8).map(|i| it(&[b'a' + i], u32::from(i), 1, &[b'0' + i], Expiry::Never)).collect();
    let mut reply = Vec::new();
    for i in 0..8u8 {
        reply.extend_from_slice(format!("VALUE {} {} 1\r\n{}\r\n", char::from(b'a' + i), i, char::from(b'0' + i)).as_bytes());
    }
    reply.extend_from_slice(b"END\r\n");
    v.push(hit("eight keys", false, b"get a b c d e f g h\r\n", eight.clone(), &reply));
    v.push(miss("nine keys", false, b"get a b c d e f g h i\r\n", eight));
    // The largest value the kernel caches (its `gets` form, " 9" included, fills a datagram),
    // spanning several checksum chunks.
    let big = vec![b'x'; 1392 - "VALUE big 0 1365".len() - " 9".len() - 4 - 5];
    let mut reply = format!("VALUE big 0 {}\r\n", big.len()).into_bytes();
    reply.extend_from_slice(&big);
    reply.extend_from_slice(b"\r\nEND\r\n");
    debug_assert_eq!(reply.len(), 1390);
    v.push(hit("largest single-datagram reply ipv6", true, b"get big\r\n", vec![it(b"big", 0, 9, &big, Expiry::Never)], &reply));
    let half = vec![b'y'; 800];
    v.push(miss(
        "reply over one datagram",
        false,
        b"get h1 h2\r\n",
        vec![it(b"h1", 0, 1, &half, Expiry::Never), it(b"h2", 0, 1, &half, Expiry::Never)],
    ));
    v.push(miss("uppercase command is not get", false, b"GET foo\r\n", vec![foo()]).not_getlike());
    v
}

impl Fixture {
    fn not_getlike(mut self) -> Fixture {
        self.misses = 0;
        self
    }

    /// The expiry time for `e` given "now".
    fn expiry_ns(e: Expiry, now_ns: u64) -> u64 {
        match e {
            Expiry::Never => 0,
            Expiry::Past => now_ns.saturating_sub(1_000_000_000).max(1),
            Expiry::Future => now_ns + 3_600_000_000_000,
        }
    }

    /// The model state for this fixture at `now_ns` and flush epoch `epoch`.
    pub fn model_state(&self, now_ns: u64, epoch: u64) -> ModelState {
        let mut items: HashMap<Vec<u8>, Item> = HashMap::new();
        for f in &self.items {
            if let Ok(i) = item::compose(&f.key, f.flags, f.cas, &f.value, Self::expiry_ns(f.expiry, now_ns), epoch) {
                items.insert(f.key.clone(), i);
            }
        }
        ModelState { udp_port: PORT, epoch, now_ns, items }
    }
}

/// Run a fixture through the model.
pub fn run_model(f: &Fixture, now_ns: u64, epoch: u64) -> Outcome {
    model::model(&f.packet, &f.model_state(now_ns, epoch))
}

/// Run a fixture through the kernel program: empty the cache, fill the fixture's items, run the
/// packet once with BPF_PROG_TEST_RUN and report verdict, output and counter deltas. `k` must
/// have been loaded with `udp_port == PORT`. Returns the outcome and the `now_ns` used for
/// expiries (for running the model at the same instant).
pub fn run_kernel(k: &Kernel, f: &Fixture) -> Result<(Outcome, u64), FastPathError> {
    k.flush_all()?;
    let now = crate::monotonic_now_ns();
    for i in &f.items {
        k.fill(&i.key, i.flags, i.cas, &i.value, Fixture::expiry_ns(i.expiry, now))?;
    }
    let before = k.counters()?;
    let r = k.test_run(&f.packet, 1)?;
    let after = k.counters()?;
    let verdict = r.verdict.unwrap_or(Verdict::Drop);
    Ok((
        Outcome {
            verdict,
            packet: r.packet,
            hits: after.fastpath_hits - before.fastpath_hits,
            misses: after.fastpath_misses - before.fastpath_misses,
        },
        now,
    ))
}
