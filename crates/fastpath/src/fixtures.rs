//! Packet fixtures for the fast path: input packet + cache contents → expected verdict, counter
//! changes and memcached reply bytes. The same fixtures run through the kernel program
//! (BPF_PROG_TEST_RUN, [`run_kernel`]) and the pure-Rust model ([`run_model`]); tests demand that
//! both agree with each other byte for byte and with the expected reply. The user-space server
//! can run the same requests ([`Fixture::request`]) and compare with [`Fixture::reply`].
//!
//! Not for: network I/O. Packets are built here with correct checksums.

use crate::item;
use crate::model::{self, ModelState, ModelTenant, Outcome, Verdict};
use crate::{FastPathError, Kernel};
use std::collections::HashMap;

/// UDP port the fixtures' requests go to (tenant slot 0 unless a fixture says otherwise).
pub const PORT: u16 = 11211;
/// A second tenant's port (multi-tenant fixtures).
pub const PORT_B: u16 = 11212;
/// A port no tenant is served on.
pub const PORT_NONE: u16 = 11213;
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
    /// The tenant slot it is cached for.
    pub slot: u32,
    pub key: Vec<u8>,
    pub flags: u32,
    pub cas: u64,
    pub value: Vec<u8>,
    pub expiry: Expiry,
}

/// A tenant a fixture serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FixtureTenant {
    pub slot: u32,
    pub port: u16,
    pub shaped: bool,
    /// Allowances (shaped tenants only).
    pub allow_in_bytes: u64,
    pub allow_out_bytes: u64,
}

impl FixtureTenant {
    /// An unshaped tenant.
    pub fn plain(slot: u32, port: u16) -> FixtureTenant {
        FixtureTenant { slot, port, shaped: false, allow_in_bytes: 0, allow_out_bytes: 0 }
    }

    /// A shaped tenant with these allowances.
    pub fn shaped(slot: u32, port: u16, allow_in_bytes: u64, allow_out_bytes: u64) -> FixtureTenant {
        FixtureTenant { slot, port, shaped: true, allow_in_bytes, allow_out_bytes }
    }
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
    /// Passed up for lack of allowance.
    pub throttled: u64,
    /// What the tenant paid: (requests, request bytes, reply bytes).
    pub spent: (u64, u64, u64),
    /// The tenants served (default: slot 0 on [`PORT`], unshaped).
    pub tenants: Vec<FixtureTenant>,
}

fn it(key: &[u8], flags: u32, cas: u64, value: &[u8], expiry: Expiry) -> FixtureItem {
    FixtureItem { slot: 0, key: key.to_vec(), flags, cas, value: value.to_vec(), expiry }
}

impl FixtureItem {
    fn in_slot(mut self, slot: u32) -> FixtureItem {
        self.slot = slot;
        self
    }
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

/// A memcached UDP request frame to [`PORT`]: frame header (id, seq, total) + `request`.
pub fn memcached_frame(v6: bool, seq: u16, total: u16, request: &[u8]) -> Vec<u8> {
    memcached_frame_to(v6, PORT, seq, total, request)
}

/// A memcached UDP request frame to `port`.
pub fn memcached_frame_to(v6: bool, port: u16, seq: u16, total: u16, request: &[u8]) -> Vec<u8> {
    let mut pl = Vec::with_capacity(8 + request.len());
    pl.extend_from_slice(&REQUEST_ID.to_be_bytes());
    pl.extend_from_slice(&seq.to_be_bytes());
    pl.extend_from_slice(&total.to_be_bytes());
    pl.extend_from_slice(&[0, 0]);
    pl.extend_from_slice(request);
    udp_frame(v6, port, &pl)
}

fn default_tenants() -> Vec<FixtureTenant> {
    vec![FixtureTenant::plain(0, PORT)]
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
        throttled: 0,
        spent: (0, 0, 0),
        tenants: default_tenants(),
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
        throttled: 0,
        spent: (0, 0, 0),
        tenants: default_tenants(),
    }
}

fn other(name: &'static str, packet: Vec<u8>, items: Vec<FixtureItem>) -> Fixture {
    Fixture {
        name,
        packet,
        request: None,
        items,
        verdict: Verdict::Pass,
        reply: None,
        hits: 0,
        misses: 0,
        throttled: 0,
        spent: (0, 0, 0),
        tenants: default_tenants(),
    }
}

fn foo() -> FixtureItem {
    it(b"foo", 5, 77, b"bar", Expiry::Never)
}

fn k2() -> FixtureItem {
    it(b"k2", 4294967295, 78, b"", Expiry::Future)
}

/// Every fixture.
#[allow(clippy::too_many_lines)] // a table of packet fixtures
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
    v.push(hit(
        "not yet expired",
        false,
        b"get new\r\n",
        vec![it(b"new", 0, 1, b"v", Expiry::Future)],
        b"VALUE new 0 1\r\nv\r\nEND\r\n",
    ));
    v.push(hit("mg v", false, b"mg foo v\r\n", vec![foo()], b"VA 3\r\nbar\r\n"));
    v.push(hit("mg v f", false, b"mg foo v f\r\n", vec![foo()], b"VA 3 f5\r\nbar\r\n"));
    v.push(hit("mg f v ipv6", true, b"mg foo f v\r\n", vec![foo()], b"VA 3 f5\r\nbar\r\n"));
    v.push(miss("mg unsupported flag", false, b"mg foo v t\r\n", vec![foo()]));
    v.push(miss("mg without v", false, b"mg foo\r\n", vec![foo()]));
    v.push(miss("mg miss", false, b"mg nope v\r\n", vec![foo()]));
    v.push(other(
        "non-memcached udp port",
        udp_frame(false, 53, b"\x12\x34\x00\x00\x00\x01\x00\x00get foo\r\n"),
        vec![foo()],
    ));
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
    let eight: Vec<FixtureItem> =
        (0..9u8).map(|i| it(&[b'a' + i], u32::from(i), 1, &[b'0' + i], Expiry::Never)).collect();
    let mut reply = Vec::new();
    for i in 0..8u8 {
        reply.extend_from_slice(
            format!("VALUE {} {} 1\r\n{}\r\n", char::from(b'a' + i), i, char::from(b'0' + i)).as_bytes(),
        );
    }
    reply.extend_from_slice(b"END\r\n");
    v.push(hit("eight keys", false, b"get a b c d e f g h\r\n", eight.clone(), &reply));
    v.push(miss("nine keys", false, b"get a b c d e f g h i\r\n", eight));
    // The largest value the kernel caches (its `gets` form, " 9" included, fills a datagram),
    // spanning several checksum chunks.
    let big = vec![b'x'; crate::abi::REPLY_PAYLOAD_BYTES_MAX - "VALUE big 0 1365".len() - " 9".len() - 4 - 5];
    let mut reply = format!("VALUE big 0 {}\r\n", big.len()).into_bytes();
    reply.extend_from_slice(&big);
    reply.extend_from_slice(b"\r\nEND\r\n");
    debug_assert_eq!(reply.len(), 1390);
    v.push(hit(
        "largest single-datagram reply ipv6",
        true,
        b"get big\r\n",
        vec![it(b"big", 0, 9, &big, Expiry::Never)],
        &reply,
    ));
    let half = vec![b'y'; 800];
    v.push(miss(
        "reply over one datagram",
        false,
        b"get h1 h2\r\n",
        vec![it(b"h1", 0, 1, &half, Expiry::Never), it(b"h2", 0, 1, &half, Expiry::Never)],
    ));
    v.push(miss("uppercase command is not get", false, b"GET foo\r\n", vec![foo()]).not_getlike());
    v.extend(tenant_fixtures());
    v
}

/// Several tenants: isolation by port and key namespace, and shaping by allowance.
fn tenant_fixtures() -> Vec<Fixture> {
    let two = vec![FixtureTenant::plain(0, PORT), FixtureTenant::plain(1, PORT_B)];
    let foo_b = || it(b"foo", 9, 99, b"bee", Expiry::Never).in_slot(1);
    let mut v = Vec::new();
    // Filled for slot 0 only: asked on slot 1's port it is a miss (user space answers).
    let mut f = miss("tenant isolation: slot 0's key asked on slot 1's port", false, b"get foo\r\n", vec![foo()]);
    f.packet = memcached_frame_to(false, PORT_B, 0, 1, b"get foo\r\n");
    v.push(f.with_tenants(two.clone()));
    // The same key in both slots: each port gets its own tenant's value.
    let mut f = hit(
        "tenant isolation: same key, slot 1's value on its port",
        true,
        b"get foo\r\n",
        vec![foo(), foo_b()],
        b"VALUE foo 9 3\r\nbee\r\nEND\r\n",
    );
    f.packet = memcached_frame_to(true, PORT_B, 0, 1, b"get foo\r\n");
    v.push(f.with_tenants(two.clone()));
    v.push(
        hit(
            "tenant isolation: same key, slot 0's value on its port",
            false,
            b"get foo\r\n",
            vec![foo(), foo_b()],
            b"VALUE foo 5 3\r\nbar\r\nEND\r\n",
        )
        .with_tenants(two.clone()),
    );
    // The last slot works too.
    let mut f = hit("slot 63 on its port", false, b"mg foo v\r\n", vec![foo().in_slot(63)], b"VA 3\r\nbar\r\n");
    f.packet = memcached_frame_to(false, PORT_B, 0, 1, b"mg foo v\r\n");
    v.push(f.with_tenants(vec![FixtureTenant::plain(63, PORT_B)]));
    // A memcached request to a port no tenant is on: not ours at all (not even a miss).
    v.push(
        other("get to a port with no tenant", memcached_frame_to(false, PORT_NONE, 0, 1, b"get foo\r\n"), vec![foo()])
            .with_tenants(two),
    );
    // Shaping. "get foo\r\n" is 9 request bytes; its reply "VALUE foo 5 3\r\nbar\r\nEND\r\n" 25.
    let reply = b"VALUE foo 5 3\r\nbar\r\nEND\r\n";
    let (req_b, rep_b) = (9u64, reply.len() as u64);
    v.push(miss("shaped, allowance 0: passed up", false, b"get foo\r\n", vec![foo()]).throttled(0, 0));
    v.push(miss("shaped, ingress one byte short", false, b"get foo\r\n", vec![foo()]).throttled(req_b - 1, 1 << 20));
    v.push(miss("shaped, egress one byte short", true, b"get foo\r\n", vec![foo()]).throttled(1 << 20, rep_b - 1));
    v.push(
        hit("shaped, allowance exactly enough", false, b"get foo\r\n", vec![foo()], reply)
            .with_tenants(vec![FixtureTenant::shaped(0, PORT, req_b, rep_b)])
            .paid(req_b, rep_b),
    );
    v.push(
        hit(
            "shaped, plenty of allowance, gets",
            false,
            b"gets foo k2\r\n",
            vec![foo(), k2()],
            b"VALUE foo 5 3 77\r\nbar\r\nVALUE k2 4294967295 0 78\r\n\r\nEND\r\n",
        )
        .with_tenants(vec![FixtureTenant::shaped(0, PORT, 1 << 20, 1 << 20)])
        .paid(13, 56),
    );
    // A shaped tenant's miss is a miss (and costs nothing); a non-get passes uncounted.
    v.push(miss("shaped, miss", false, b"get nope\r\n", vec![foo()]).with_tenants(vec![FixtureTenant::shaped(
        0,
        PORT,
        1 << 20,
        1 << 20,
    )]));
    v.push(
        other(
            "shaped, allowance 0, set passes uncounted",
            memcached_frame(false, 0, 1, b"set foo 0 0 1\r\nx\r\n"),
            vec![foo()],
        )
        .with_tenants(vec![FixtureTenant::shaped(0, PORT, 0, 0)]),
    );
    v
}

impl Fixture {
    fn not_getlike(mut self) -> Fixture {
        self.misses = 0;
        self
    }

    fn with_tenants(mut self, tenants: Vec<FixtureTenant>) -> Fixture {
        self.tenants = tenants;
        self
    }

    /// Slot 0 shaped with these allowances, and the request expected to be passed up for lack
    /// of them.
    fn throttled(mut self, allow_in_bytes: u64, allow_out_bytes: u64) -> Fixture {
        self.tenants = vec![FixtureTenant::shaped(0, PORT, allow_in_bytes, allow_out_bytes)];
        self.misses = 0;
        self.throttled = 1;
        self
    }

    fn paid(mut self, in_bytes: u64, out_bytes: u64) -> Fixture {
        self.spent = (1, in_bytes, out_bytes);
        self
    }

    /// Whether this fixture uses anything but the default single tenant.
    pub fn multi_tenant(&self) -> bool {
        self.tenants != default_tenants()
    }

    /// The slot the fixture's packet is addressed to (by its UDP destination port), if any.
    pub fn target_slot(&self) -> Option<u32> {
        let l4 = if self.packet.get(12..14) == Some(&[0x86, 0xdd][..]) { 14 + 40 } else { 14 + 20 };
        let port = u16::from_be_bytes([*self.packet.get(l4 + 2)?, *self.packet.get(l4 + 3)?]);
        self.tenants.iter().find(|t| t.port == port).map(|t| t.slot)
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
    /// (Every slot's items carry `epoch`.)
    pub fn model_state(&self, now_ns: u64, epoch: u64) -> ModelState {
        let mut st = ModelState { enabled: true, now_ns, ..Default::default() };
        for t in &self.tenants {
            st.ports.insert(t.port, t.slot);
            st.tenants.insert(
                t.slot,
                ModelTenant {
                    shaped: t.shaped,
                    epoch,
                    allow_in_bytes: t.allow_in_bytes as i64,
                    allow_out_bytes: t.allow_out_bytes as i64,
                    items: HashMap::new(),
                },
            );
        }
        for f in &self.items {
            if let Ok(i) = item::compose(&f.key, f.flags, f.cas, &f.value, Self::expiry_ns(f.expiry, now_ns), epoch) {
                if let Some(t) = st.tenants.get_mut(&f.slot) {
                    t.items.insert(f.key.clone(), i);
                }
            }
        }
        st
    }
}

/// Run a fixture through the model.
pub fn run_model(f: &Fixture, now_ns: u64, epoch: u64) -> Outcome {
    model::model(&f.packet, &f.model_state(now_ns, epoch))
}

/// Make `k` serve exactly the fixture's tenants (with their allowances) and nothing else, with
/// an empty cache.
pub fn setup_tenants(k: &Kernel, f: &Fixture) -> Result<(), FastPathError> {
    for slot in 0..crate::abi::TENANTS_MAX {
        let want = f.tenants.iter().find(|t| t.slot == slot);
        if k.tenant_port(slot).is_some() && k.tenant_port(slot) != want.map(|t| t.port) {
            k.remove_tenant(slot)?;
        }
    }
    for t in &f.tenants {
        k.add_tenant(t.slot, t.port, t.shaped)?;
        k.set_allowance(t.slot, t.allow_in_bytes, t.allow_out_bytes);
        k.take_spent(t.slot);
    }
    k.flush_all()
}

/// Run a fixture through the kernel program: set up its tenants, empty the cache, fill the
/// fixture's items, run the packet once with BPF_PROG_TEST_RUN and report verdict, output,
/// counter deltas and what the tenant spent. `k` may be loaded any way (its tenants are
/// replaced). The outcome's `slot` is the slot the packet's port maps to, and only if that
/// slot's own counters moved exactly as the global ones did (else `None`, which no model
/// outcome for a tenant's port matches). Returns the outcome and the `now_ns` used for expiries
/// (for running the model at the same instant).
pub fn run_kernel(k: &Kernel, f: &Fixture) -> Result<(Outcome, u64), FastPathError> {
    setup_tenants(k, f)?;
    let now = crate::clock_monotonic_ns();
    for i in &f.items {
        k.fill_slot(i.slot, &i.key, i.flags, i.cas, &i.value, Fixture::expiry_ns(i.expiry, now))?;
    }
    let slot = f.target_slot();
    let tenant = |k: &Kernel| slot.map(|s| k.tenant_counters(s)).transpose();
    let before = k.counters()?;
    let tbefore = tenant(k)?;
    let r = k.test_run(&f.packet, 1)?;
    let after = k.counters()?;
    let tafter = tenant(k)?;
    let spent = slot.map_or((0, 0, 0), |s| k.take_spent(s));
    let verdict = r.verdict.unwrap_or(Verdict::Drop);
    let hits = after.fastpath_hits - before.fastpath_hits;
    let misses = after.fastpath_misses - before.fastpath_misses;
    let throttled = after.fastpath_throttled - before.fastpath_throttled;
    let tenant_agrees = match (tbefore, tafter) {
        (Some(b), Some(a)) => {
            (a.hits - b.hits, a.misses - b.misses, a.throttled - b.throttled) == (hits, misses, throttled)
        }
        _ => false,
    };
    Ok((
        Outcome { verdict, packet: r.packet, hits, misses, throttled, slot: slot.filter(|_| tenant_agrees), spent },
        now,
    ))
}
