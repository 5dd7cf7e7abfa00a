//! The fast path's packet fixtures (crates/fastpath/src/fixtures.rs) run through the Rust
//! user-space request path too, and the two must agree byte for byte.
//!
//! For each fixture with a memcached request: its items are stored in a real store (exact
//! flags and CAS), the kernel cache is filled *the way the server fills it* (the store's
//! observer, driven by ordinary user-space gets), then the fixture packet runs through the XDP
//! program (BPF_PROG_TEST_RUN, as root) and through the pure-Rust model of it, and the request
//! runs through the UDP executor path (the harness). Every kernel reply must equal the
//! user-space reply and the fixture's expected bytes; every kernel pass must be a fixture pass.
//! Without root the model stands in for the kernel (and says so).
//!
//! Multi-tenant fixtures get one store per tenant, each filling the kernel cache through its
//! own slot (as the server's per-tenant observers do); the request runs on the store of the
//! tenant whose port it is addressed to.
//!
//! Not for: sockets (the netns tests in crates/slipstream/tests/xdp_e2e.rs cover those).

// Test code: unwrap() in test set-up is the clearest failure.
#![allow(clippy::unwrap_used)]

use slipstream_fastpath::abi::Item;
use slipstream_fastpath::fixtures::{self, Expiry, Fixture};
use slipstream_fastpath::model::{self, ModelState, ModelTenant};
use slipstream_fastpath::{clock_monotonic_ns, item, FastPathConfig, Filled, Kernel, Verdict};
use slipstream_server::exec::{ConnState, Transport};
use slipstream_server::harness::Harness;
use slipstream_store::{KernelCache, KernelFill, SetMode, StoreOpts, StoreResult};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// A kernel cache observer that records what the store filled (for the model) and, as root,
/// also fills the real (unattached) XDP program's map.
struct Recorder {
    kernel: Option<Arc<Kernel>>,
    /// The tenant slot this store fills.
    slot: u32,
    items: Mutex<HashMap<Vec<u8>, Item>>,
}

fn expiry_ns(expires_at: Option<Instant>) -> u64 {
    match expires_at {
        None => 0,
        Some(d) => {
            // Monotonic clock first, then Instant: the sum never lands after the deadline.
            let mono = clock_monotonic_ns();
            mono + d.saturating_duration_since(Instant::now()).as_nanos() as u64
        }
    }
}

impl KernelCache for Recorder {
    fn fill(&self, key: &[u8], flags: u32, cas: u64, value: &[u8], expires_at: Option<Instant>) -> KernelFill {
        let exp = expiry_ns(expires_at);
        let epoch = self.kernel.as_ref().map(|k| k.epoch_of(self.slot)).unwrap_or(1);
        let Ok(it) = item::compose(key, flags, cas, value, exp, epoch) else { return KernelFill::NotCacheable };
        if let Some(k) = &self.kernel {
            match k.fill_slot(self.slot, key, flags, cas, value, exp).expect("kernel fill") {
                Filled::Cached => {}
                other => panic!("kernel refused what compose accepted: {other:?}"),
            }
        }
        self.items.lock().unwrap().insert(key.to_vec(), it);
        KernelFill::Cached
    }
    fn invalidate(&self, key: &[u8]) {
        self.items.lock().unwrap().remove(key);
        if let Some(k) = &self.kernel {
            k.invalidate_slot(self.slot, key).expect("kernel invalidate");
        }
    }
    fn flush_all(&self) {
        self.items.lock().unwrap().clear();
        if let Some(k) = &self.kernel {
            k.flush_slot(self.slot).expect("kernel flush");
        }
    }
}

fn root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The memcached payload (after the frame header) of a reply packet.
fn reply_payload(packet: &[u8]) -> Vec<u8> {
    let l4 = if packet[12..14] == [0x86, 0xdd] { 14 + 40 } else { 14 + 20 };
    packet[l4 + 16..].to_vec()
}

/// Store the fixture's items of `slot` in the harness store with their exact flags and CAS.
fn load(h: &mut Harness, f: &Fixture, slot: u32) {
    for it in f.items.iter().filter(|i| i.slot == slot) {
        let exptime = match it.expiry {
            Expiry::Never => 0,
            Expiry::Future => 3600,
            Expiry::Past => 1,
        };
        let opts = StoreOpts { explicit_cas: Some(it.cas), ..StoreOpts::default() };
        let r = h.store.store(SetMode::Set, &it.key, &it.value, it.flags, exptime, opts);
        assert!(matches!(r, StoreResult::Stored(_)), "{}: store {:?}", f.name, r);
    }
    if f.items.iter().any(|i| i.expiry == Expiry::Past) {
        h.store.clock().advance(2);
    }
}

#[test]
fn fixtures_agree_with_the_user_space_path() {
    let kernel_available = root();
    if !kernel_available {
        println!("SKIP (kernel part): not root, cannot load BPF; comparing user space with the model only");
    }
    let mut compared_kernel = 0;
    let mut compared_hits = 0;
    let mut failures = Vec::new();
    let shared = kernel_available.then(|| {
        Arc::new(
            Kernel::load(FastPathConfig { udp_port: fixtures::PORT, entries_max: 1024 }).expect("load XDP program"),
        )
    });
    let mut multi = 0;
    for f in fixtures::all() {
        let Some(request) = f.request.clone() else { continue };
        let Some(target) = f.target_slot() else { continue };
        if let Some(k) = &shared {
            fixtures::setup_tenants(k, &f).expect("serve the fixture's tenants, cache empty");
        }
        multi += usize::from(f.multi_tenant());
        // One store per tenant, each filling its own slot.
        let mut state = ModelState { enabled: true, now_ns: 0, ..Default::default() };
        let mut user = Vec::new();
        for t in &f.tenants {
            let rec = Arc::new(Recorder { kernel: shared.clone(), slot: t.slot, items: Mutex::new(HashMap::new()) });
            let mut h = Harness::small();
            assert!(h.store.set_kernel_cache(rec.clone()));
            h.conn = ConnState::new(Transport::Udp);
            load(&mut h, &f, t.slot);
            // Fill the way the server does: ordinary user-space gets of each item.
            for it in f.items.iter().filter(|i| i.slot == t.slot) {
                let mut g = b"get ".to_vec();
                g.extend_from_slice(&it.key);
                g.extend_from_slice(b"\r\n");
                h.feed(&g);
            }
            if t.slot == target {
                // The user-space answer to the fixture's request, from its tenant's store.
                h.conn = ConnState::new(Transport::Udp);
                user = h.feed(&request);
            }
            state.ports.insert(t.port, t.slot);
            state.tenants.insert(
                t.slot,
                ModelTenant {
                    shaped: t.shaped,
                    epoch: shared.as_ref().map(|k| k.epoch_of(t.slot)).unwrap_or(1),
                    allow_in_bytes: t.allow_in_bytes as i64,
                    allow_out_bytes: t.allow_out_bytes as i64,
                    items: rec.items.lock().unwrap().clone(),
                },
            );
        }
        state.now_ns = clock_monotonic_ns();
        let mout = model::model(&f.packet, &state);
        let mut outs = vec![("model", mout.verdict, mout.packet)];
        if let Some(k) = &shared {
            let r = k.test_run(&f.packet, 1).expect("BPF_PROG_TEST_RUN");
            outs.push(("kernel", r.verdict.unwrap_or(Verdict::Drop), r.packet));
            compared_kernel += 1;
        }
        for (who, verdict, packet) in outs {
            let mut fail = |what: String| failures.push(format!("{} ({who}): {what}", f.name));
            if verdict != f.verdict {
                fail(format!("verdict {verdict:?}, fixture says {:?}", f.verdict));
                continue;
            }
            if verdict == Verdict::Tx {
                let payload = reply_payload(&packet);
                if payload != user {
                    fail(format!(
                        "XDP reply {:?} but user space replies {:?}",
                        String::from_utf8_lossy(&payload),
                        String::from_utf8_lossy(&user)
                    ));
                }
                if Some(&payload) != f.reply.as_ref() {
                    fail(format!("XDP reply {:?} differs from the fixture", String::from_utf8_lossy(&payload)));
                }
                compared_hits += 1;
            } else if user.is_empty() {
                fail("passed up, but user space sends no reply".into());
            }
        }
    }
    assert!(failures.is_empty(), "{} disagreements:\n{}", failures.len(), failures.join("\n"));
    assert!(compared_hits >= 10, "only {compared_hits} hit fixtures compared");
    assert!(multi >= 8, "only {multi} multi-tenant or shaped fixtures compared");
    println!(
        "fixtures: {compared_hits} XDP replies equal the user-space replies ({compared_kernel} fixtures through the kernel, \
         {multi} with several tenants or shaping)"
    );
}
