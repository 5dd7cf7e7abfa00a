//! The kernel fast path's tenants through BPF_PROG_TEST_RUN (no interface): keys filled for one
//! slot are never served on another slot's port, per-slot flush and removal leave the other
//! tenants alone, shaped tenants are answered only while their allowance lasts (and what they
//! spent can be taken exactly once), and the Rust model agrees packet by packet.
//! Needs root to load BPF; prints why and skips otherwise.

use slipstream_fastpath::fixtures::{memcached_frame_to, PORT, PORT_B, PORT_NONE};
use slipstream_fastpath::model::{model_apply, ModelState, ModelTenant};
use slipstream_fastpath::{FastPathError, Kernel, Verdict};

fn root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn kernel() -> Option<Kernel> {
    if !root() {
        eprintln!("SKIP: not root, cannot load BPF programs");
        return None;
    }
    Some(Kernel::load_multi(1024).expect("load XDP program"))
}

fn get(port: u16, key: &str) -> Vec<u8> {
    memcached_frame_to(false, port, 0, 1, format!("get {key}\r\n").as_bytes())
}

/// The memcached reply after the frame header (IPv4 frames).
fn payload(packet: &[u8]) -> String {
    String::from_utf8_lossy(&packet[14 + 20 + 16..]).into_owned()
}

fn run(k: &Kernel, packet: &[u8]) -> (Verdict, String) {
    let r = k.test_run(packet, 1).expect("test run");
    let v = r.verdict.expect("known verdict");
    let text = if v == Verdict::Tx { payload(&r.packet) } else { String::new() };
    if v == Verdict::Pass {
        assert_eq!(r.packet, packet, "a passed packet is untouched");
    }
    (v, text)
}

#[test]
fn tenants_are_isolated_by_port_and_slot() {
    let Some(k) = kernel() else { return };
    // Nothing is served before a tenant is added.
    assert_eq!(run(&k, &get(PORT, "foo")).0, Verdict::Pass);
    k.add_tenant(0, PORT, false).unwrap();
    k.add_tenant(1, PORT_B, false).unwrap();
    k.fill_slot(0, b"foo", 0, 1, b"aaa", 0).unwrap();
    k.fill_slot(1, b"foo", 1, 2, b"bbbb", 0).unwrap();
    k.fill_slot(0, b"only0", 0, 3, b"x", 0).unwrap();
    assert_eq!(run(&k, &get(PORT, "foo")), (Verdict::Tx, "VALUE foo 0 3\r\naaa\r\nEND\r\n".into()));
    assert_eq!(run(&k, &get(PORT_B, "foo")), (Verdict::Tx, "VALUE foo 1 4\r\nbbbb\r\nEND\r\n".into()));
    // Slot 0's key asked on slot 1's port: a miss of slot 1, passed up.
    let before = (k.tenant_counters(0).unwrap(), k.tenant_counters(1).unwrap());
    assert_eq!(run(&k, &get(PORT_B, "only0")).0, Verdict::Pass);
    let after = (k.tenant_counters(0).unwrap(), k.tenant_counters(1).unwrap());
    assert_eq!(after.0, before.0, "slot 0's counters do not move");
    assert_eq!(after.1.misses, before.1.misses + 1);
    // A port with no tenant: passed and not counted anywhere.
    let c = k.counters().unwrap();
    assert_eq!(run(&k, &get(PORT_NONE, "foo")).0, Verdict::Pass);
    assert_eq!(k.counters().unwrap(), c);
    assert!(k.lookup_slot(1, b"only0").unwrap().is_none());

    // Flushing slot 0 leaves slot 1 answering.
    k.flush_slot(0).unwrap();
    assert_eq!(run(&k, &get(PORT, "foo")).0, Verdict::Pass);
    assert!(k.lookup_slot(0, b"foo").unwrap().is_none(), "flushed entries are deleted");
    assert_eq!(run(&k, &get(PORT_B, "foo")).0, Verdict::Tx);
    // The global flush hits everyone; refills work for both.
    k.fill_slot(0, b"foo", 0, 1, b"aaa", 0).unwrap();
    assert_eq!(run(&k, &get(PORT, "foo")).0, Verdict::Tx);
    k.flush_all().unwrap();
    assert_eq!(run(&k, &get(PORT, "foo")).0, Verdict::Pass);
    assert_eq!(run(&k, &get(PORT_B, "foo")).0, Verdict::Pass);
    k.fill_slot(0, b"foo", 0, 1, b"aaa", 0).unwrap();
    k.fill_slot(1, b"foo", 1, 2, b"bbbb", 0).unwrap();

    // Removing slot 1: its port passes uncounted, its entries go, slot 0 is untouched.
    k.remove_tenant(1).unwrap();
    let c = k.counters().unwrap();
    assert_eq!(run(&k, &get(PORT_B, "foo")).0, Verdict::Pass);
    assert_eq!(k.counters().unwrap(), c, "a removed tenant's port is not ours");
    assert!(k.lookup_slot(1, b"foo").unwrap().is_none());
    assert_eq!(run(&k, &get(PORT, "foo")).0, Verdict::Tx);
    k.add_tenant(1, PORT_B, false).unwrap();
    assert_eq!(run(&k, &get(PORT_B, "foo")).0, Verdict::Pass, "a reused slot starts empty");
    assert_eq!(k.tenant_port(1), Some(PORT_B));
}

#[test]
fn a_slot_flush_kills_its_entries_only() {
    let Some(k) = kernel() else { return };
    k.add_tenant(5, PORT, false).unwrap();
    k.fill_slot(5, b"k", 0, 1, b"v", 0).unwrap();
    let it = k.lookup_slot(5, b"k").unwrap().expect("filled");
    assert_eq!(it.epoch, k.epoch_of(5));
    k.flush_slot(5).unwrap();
    assert_ne!(it.epoch, k.epoch_of(5), "the slot's epoch moved on");
    assert_eq!(run(&k, &get(PORT, "k")).0, Verdict::Pass);
    // A fill after the flush answers again; another tenant's flush does not touch it.
    k.fill_slot(5, b"k", 0, 1, b"v", 0).unwrap();
    k.add_tenant(6, PORT_B, false).unwrap();
    k.flush_slot(6).unwrap();
    assert_eq!(run(&k, &get(PORT, "k")).0, Verdict::Tx);
}

#[test]
fn add_tenant_refuses_conflicts() {
    let Some(k) = kernel() else { return };
    let bad = |r: Result<(), FastPathError>| matches!(r, Err(FastPathError::BadConfig { .. }));
    assert!(bad(k.add_tenant(64, PORT, false)), "slot out of range");
    assert!(bad(k.add_tenant(0, 0, false)), "port 0");
    k.add_tenant(0, PORT, false).unwrap();
    assert!(bad(k.add_tenant(1, PORT, false)), "port taken by slot 0");
    assert!(bad(k.add_tenant(0, PORT_B, false)), "slot 0 serves another port");
    k.add_tenant(0, PORT, true).expect("same slot and port: only shaping changes");
    k.remove_tenant(0).unwrap();
    k.remove_tenant(0).expect("removing an empty slot is a no-op");
    k.add_tenant(1, PORT, false).expect("the port is free again");
    assert!(k.fill_slot(64, b"k", 0, 0, b"v", 0).is_err());
    assert!(k.invalidate_slot(64, b"k").is_err());
    assert_eq!(k.take_spent(64), (0, 0, 0));
}

#[test]
fn shaped_tenants_pay_from_their_allowance() {
    let Some(k) = kernel() else { return };
    k.add_tenant(0, PORT, true).unwrap();
    k.add_tenant(1, PORT_B, false).unwrap();
    k.fill_slot(0, b"foo", 5, 77, b"bar", 0).unwrap();
    k.fill_slot(1, b"foo", 5, 77, b"bar", 0).unwrap();
    let mut st = ModelState { enabled: true, ..Default::default() };
    st.ports.insert(PORT, 0);
    st.ports.insert(PORT_B, 1);
    for (slot, shaped) in [(0, true), (1, false)] {
        let mut items = std::collections::HashMap::new();
        items.insert(b"foo".to_vec(), k.lookup_slot(slot, b"foo").unwrap().unwrap());
        st.tenants.insert(slot, ModelTenant { shaped, epoch: k.epoch_of(slot), items, ..Default::default() });
    }
    let (req, reply) = (9u64, 25u64); // "get foo\r\n", "VALUE foo 5 3\r\nbar\r\nEND\r\n"
    let pa = get(PORT, "foo");
    let pb = get(PORT_B, "foo");
    let step = |k: &Kernel, st: &mut ModelState, p: &[u8]| -> Verdict {
        let r = k.test_run(p, 1).unwrap();
        let m = model_apply(p, st);
        assert_eq!(r.verdict, Some(m.verdict), "kernel and model verdicts");
        assert_eq!(r.packet, m.packet, "kernel and model packets");
        m.verdict
    };
    // A zero allowance: everything goes up, counted as throttled, not as hits.
    let c0 = k.counters().unwrap();
    for _ in 0..3 {
        assert_eq!(step(&k, &mut st, &pa), Verdict::Pass);
    }
    let c1 = k.counters().unwrap();
    assert_eq!((c1.fastpath_throttled - c0.fastpath_throttled, c1.fastpath_hits - c0.fastpath_hits), (3, 0));
    assert_eq!(k.tenant_counters(0).unwrap().throttled, 3);
    // The unshaped tenant is answered regardless.
    assert_eq!(step(&k, &mut st, &pb), Verdict::Tx);
    assert_eq!(k.take_spent(1), (0, 0, 0), "unshaped tenants spend nothing");

    // Room for exactly three answers (ingress is the limit): then passed up again.
    k.set_allowance(0, 3 * req, 10 * reply);
    if let Some(t) = st.tenants.get_mut(&0) {
        t.allow_in_bytes = 3 * req as i64;
        t.allow_out_bytes = 10 * reply as i64;
    }
    for i in 0..5 {
        let want = if i < 3 { Verdict::Tx } else { Verdict::Pass };
        assert_eq!(step(&k, &mut st, &pa), want, "request {i}");
    }
    assert_eq!(k.allowance(0), (0, 7 * reply as i64));
    assert_eq!(k.take_spent(0), (3, 3 * req, 3 * reply));
    assert_eq!(k.take_spent(0), (0, 0, 0), "taken once");
    let t = k.tenant_counters(0).unwrap();
    assert_eq!((t.hits, t.throttled), (3, 5));

    // Egress as the limit: two replies' worth.
    k.set_allowance(0, 1 << 20, 2 * reply + reply / 2);
    assert_eq!(run(&k, &pa).0, Verdict::Tx);
    assert_eq!(run(&k, &pa).0, Verdict::Tx);
    assert_eq!(run(&k, &pa).0, Verdict::Pass);
    assert_eq!(k.take_spent(0), (2, 2 * req, 2 * reply));
    // Becoming unshaped lifts the limit.
    k.add_tenant(0, PORT, false).unwrap();
    assert_eq!(run(&k, &pa).0, Verdict::Tx);
}

#[test]
fn disable_stays_off_across_flushes() {
    let Some(k) = kernel() else { return };
    k.add_tenant(0, PORT, false).unwrap();
    k.fill(b"foo", 0, 1, b"bar", 0).unwrap();
    assert_eq!(run(&k, &get(PORT, "foo")).0, Verdict::Tx);
    k.disable().unwrap();
    assert_eq!(run(&k, &get(PORT, "foo")).0, Verdict::Pass);
    k.flush_all().unwrap();
    k.fill(b"foo", 0, 1, b"bar", 0).unwrap();
    assert_eq!(run(&k, &get(PORT, "foo")).0, Verdict::Pass, "a flush does not turn it back on");
}

/// Per-packet cost of a hit for an unshaped and a shaped tenant (kernel-timed).
#[test]
fn shaping_cost_is_reported() {
    let Some(k) = kernel() else { return };
    k.add_tenant(0, PORT, false).unwrap();
    k.add_tenant(1, PORT_B, true).unwrap();
    k.set_allowance(1, u64::MAX, u64::MAX);
    for slot in [0, 1] {
        k.fill_slot(slot, b"key:00000001", 0, 1, &[b'v'; 32], 0).unwrap();
    }
    let (plain, v1) = k.mean_ns(&get(PORT, "key:00000001"), 2000).unwrap();
    let (shaped, v2) = k.mean_ns(&get(PORT_B, "key:00000001"), 2000).unwrap();
    k.set_allowance(1, 0, 0);
    let (throttled, v3) = k.mean_ns(&get(PORT_B, "key:00000001"), 2000).unwrap();
    assert_eq!((v1, v2, v3), (Some(Verdict::Tx), Some(Verdict::Tx), Some(Verdict::Pass)));
    println!("XDP get hit: unshaped tenant {plain} ns, shaped tenant {shaped} ns; shaped with no allowance (passed up) {throttled} ns");
}
