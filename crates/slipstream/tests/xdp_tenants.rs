//! End-to-end test of the kernel fast path serving two tenants, each on its own UDP port with
//! its own store, across a real veth pair: a server network namespace (the XDP program, driven
//! through `KernelFastPath`'s multi-tenant API, plus a tiny user-space UDP responder standing in
//! for the server's miss path) and a client namespace, both created by the test and removed on
//! drop even when a check fails.
//!
//! Checks: a key in tenant A's store is answered by XDP on A's port and never on B's (B's
//! request reaches user space); a shaped tenant with allowance 0 has its cached keys passed up
//! (throttled grows, hits do not); after an allowance the kernel answers and `take_spent`
//! returns exactly the bytes; a per-tenant flush leaves the other tenant's entries answering.
//!
//! Needs root (namespaces, XDP); prints SKIP and passes otherwise. Every wait is bounded.

mod common;

use common::{in_ns, root};
use slipstream_server::fastpath::KernelFastPath;
use slipstream_store::{GetOpts, SetMode, Store, StoreConfig, StoreOpts, StoreResult};
use std::net::UdpSocket;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const PORT_A: u16 = 22311;
const PORT_B: u16 = 22312;
const V4S: &str = "10.204.0.1";
const V4C: &str = "10.204.0.2";

/// The user-space side: answers every memcached UDP request on the tenants' ports with
/// "USER <port>\r\n" (so the client can tell it from a kernel answer). Stops with `stop`.
fn start_responder(ports: &[u16], stop: Arc<AtomicBool>) -> Vec<std::thread::JoinHandle<()>> {
    let mut threads = Vec::new();
    for &port in ports {
        let sock = UdpSocket::bind((V4S, port)).expect("bind responder");
        sock.set_read_timeout(Some(Duration::from_millis(50))).expect("timeout");
        let stop = stop.clone();
        threads.push(std::thread::spawn(move || {
            let mut buf = [0u8; 2048];
            while !stop.load(Ordering::Relaxed) {
                let Ok((n, from)) = sock.recv_from(&mut buf) else { continue };
                if n < 8 {
                    continue;
                }
                let mut reply = buf[..2].to_vec();
                reply.extend_from_slice(&[0, 0, 0, 1, 0, 0]);
                reply.extend_from_slice(format!("USER {port}\r\n").as_bytes());
                let _ = sock.send_to(&reply, from);
            }
        }));
    }
    threads
}

/// Client: one memcached UDP request, the reply text (after the frame header) or None.
struct Client {
    c: common::UdpClient,
}

impl Client {
    fn new() -> Client {
        let local = std::net::SocketAddr::new(V4C.parse().expect("v4"), 0);
        Client { c: common::UdpClient::bind(local, Duration::from_millis(50)) }
    }

    fn ask(&mut self, port: u16, req: &str) -> Option<String> {
        let dst = std::net::SocketAddr::new(V4S.parse().expect("v4"), port);
        self.c.ask(dst, req.as_bytes(), Duration::from_millis(1000))
    }
}

fn store_with(key: &[u8], value: &[u8]) -> Store {
    let s = Store::new(StoreConfig::default());
    let r = s.store(SetMode::Set, key, value, 0, 0, StoreOpts::default());
    assert!(matches!(r, StoreResult::Stored(_)), "store: {r:?}");
    s
}

/// An ordinary read that offers the item to the store's kernel cache observer.
fn read_through(s: &Store, key: &[u8]) {
    s.get(key, GetOpts { kernel_fill: true, ..GetOpts::default() }, |o| assert!(o.item.is_some(), "key present"));
}

#[test]
fn xdp_serves_two_tenants_each_on_its_port_and_share() {
    if !root() {
        println!("SKIP: xdp_serves_two_tenants_each_on_its_port_and_share: not root");
        return;
    }
    if Command::new("ip").arg("-V").output().is_err() {
        println!("SKIP: xdp_serves_two_tenants_each_on_its_port_and_share: no `ip` command");
        return;
    }
    let topo = common::Pair::new("t", V4S, V4C);
    let vs = topo.srv_dev.clone();
    // Attach inside the server namespace (the interface name is resolved there).
    let fp = in_ns(&topo.srv, move || KernelFastPath::attach_multi(&vs, 1024).expect("attach multi-tenant XDP"));
    fp.add_tenant(0, PORT_A, false).expect("tenant A");
    fp.add_tenant(1, PORT_B, true).expect("tenant B (shaped)");
    let store_a = store_with(b"ka", b"alpha");
    let store_b = store_with(b"kb", b"b");
    assert!(store_a.set_kernel_cache(fp.observer(0)));
    assert!(store_b.set_kernel_cache(fp.observer(1)));
    // Tenant A also has "kb" of its own, so the namespaces differ on the same key.
    assert!(matches!(store_a.store(SetMode::Set, b"kb", b"A's", 0, 0, StoreOpts::default()), StoreResult::Stored(_)));
    read_through(&store_a, b"ka");
    read_through(&store_a, b"kb");
    read_through(&store_b, b"kb");

    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let responders = in_ns(&topo.srv, move || start_responder(&[PORT_A, PORT_B], stop2));

    let (fpc, cli) = (fp.clone(), topo.cli.clone());
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        in_ns(&cli, move || {
            let fp = fpc;
            let mut c = Client::new();
            // (1) A's key on A's port: the kernel answers.
            let a0 = fp.tenant_totals(0);
            assert_eq!(c.ask(PORT_A, "get ka\r\n").as_deref(), Some("VALUE ka 0 5\r\nalpha\r\nEND\r\n"));
            assert_eq!(c.ask(PORT_A, "get kb\r\n").as_deref(), Some("VALUE kb 0 3\r\nA's\r\nEND\r\n"));
            let a1 = fp.tenant_totals(0);
            assert_eq!(a1.hits - a0.hits, 2, "answered by XDP for tenant A");
            // A's key on B's port: never from the kernel; B's miss path (user space) answers.
            let b0 = fp.tenant_totals(1);
            assert_eq!(c.ask(PORT_B, "get ka\r\n").as_deref(), Some(&*format!("USER {PORT_B}\r\n")));
            let b1 = fp.tenant_totals(1);
            // (B is shaped with no allowance yet, so it counts as throttled before any lookup.)
            let passed = b1.misses + b1.throttled - b0.misses - b0.throttled;
            assert_eq!((b1.hits - b0.hits, passed), (0, 1), "B's request is passed up by B's slot");
            assert_eq!(fp.tenant_totals(0), a1, "A's counters untouched by B's traffic");

            // (2) B is shaped and has no allowance yet: its cached key goes to user space.
            for _ in 0..3 {
                assert_eq!(c.ask(PORT_B, "get kb\r\n").as_deref(), Some(&*format!("USER {PORT_B}\r\n")));
            }
            let b2 = fp.tenant_totals(1);
            assert_eq!((b2.hits - b1.hits, b2.throttled - b1.throttled), (0, 3), "throttled, not answered");
            assert_eq!(fp.take_spent(1), (0, 0, 0));
            // An allowance: now the kernel answers, and the spending is reported exactly once.
            fp.set_allowance(1, 1 << 20, 1 << 20);
            let reply = "VALUE kb 0 1\r\nb\r\nEND\r\n";
            for _ in 0..4 {
                assert_eq!(c.ask(PORT_B, "get kb\r\n").as_deref(), Some(reply));
            }
            let b3 = fp.tenant_totals(1);
            assert_eq!(b3.hits - b2.hits, 4);
            assert_eq!(fp.take_spent(1), (4, 4 * "get kb\r\n".len() as u64, 4 * reply.len() as u64));
            assert_eq!(fp.take_spent(1), (0, 0, 0));
            assert_eq!(fp.take_spent(0), (0, 0, 0), "unshaped A spends nothing");
        });
        // (3) flush_all on B's store flushes only B's kernel entries.
        store_b.flush_all(0);
        in_ns(&topo.cli, {
            let fp = fp.clone();
            move || {
                let mut c = Client::new();
                let b = fp.tenant_totals(1);
                assert_eq!(c.ask(PORT_B, "get kb\r\n").as_deref(), Some(&*format!("USER {PORT_B}\r\n")));
                assert_eq!(fp.tenant_totals(1).hits, b.hits, "B flushed");
                let a = fp.tenant_totals(0);
                assert_eq!(c.ask(PORT_A, "get ka\r\n").as_deref(), Some("VALUE ka 0 5\r\nalpha\r\nEND\r\n"));
                assert_eq!(fp.tenant_totals(0).hits, a.hits + 1, "A still answered by XDP");
            }
        });
        // (4) Removing A: its port goes to user space.
        fp.remove_tenant(0).expect("remove A");
        in_ns(&topo.cli, move || {
            let mut c = Client::new();
            assert_eq!(c.ask(PORT_A, "get ka\r\n").as_deref(), Some(&*format!("USER {PORT_A}\r\n")));
        });
    }));
    stop.store(true, Ordering::SeqCst);
    for t in responders {
        let _ = t.join();
    }
    fp.shutdown();
    drop(topo);
    if let Err(p) = result {
        std::panic::resume_unwind(p);
    }
}
