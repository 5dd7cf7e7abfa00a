//! End-to-end tests of the kernel fast path with the real daemon: `slipstream serve --xdp` in a
//! server network namespace, clients in a client namespace, joined by a veth pair that the test
//! creates (and removes on drop, even when a check fails). The client veth gets a do-nothing
//! XDP_PASS program: a veth delivers frames its peer bounced with XDP_TX only then.
//!
//! Two tests: the functional walk-through (hits proven by the `fastpath_*` counters, misses,
//! multi-get, TTL, every invalidating command over TCP and UDP, text/meta/binary, IPv6,
//! oversized values, stats and /metrics, detach on exit, restart) and a randomized concurrent
//! stale-read checker (TCP writers, UDP readers, at least 1,000,000 operations, seed printed).
//!
//! Needs root (namespaces, XDP); prints SKIP and passes otherwise. Every wait is bounded.
//! Not for: XDP packet-format details (crates/fastpath fixtures cover those).

// Test code: unwrap() in test set-up is the clearest failure; each scenario reads top to bottom as one story.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

mod common;

use common::{ip, root};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const PORT: u16 = 22211;
const ADMIN_PORT: u16 = 22280;
const V4S: &str = "10.203.0.1";
const V4C: &str = "10.203.0.2";
const V6S: &str = "fd00:203::1";
const V6C: &str = "fd00:203::2";
const IO_TIMEOUT: Duration = Duration::from_secs(2);
const UDP_TIMEOUT: Duration = Duration::from_millis(500);

/// The two tests are heavy on the two CPUs and time-sensitive (TTLs): run them one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn skip_reason() -> Option<String> {
    if !root() {
        return Some("not root: network namespaces and XDP need root".into());
    }
    if Command::new("ip").arg("-V").output().is_err() {
        return Some("no `ip` command (iproute2)".into());
    }
    None
}

/// Namespaces + veth pair + the daemon; all removed on drop.
struct Topology {
    srv: String,
    cli: String,
    vs: String,
    server: Option<common::Daemon>,
}

impl Topology {
    fn new(tag: &str) -> Topology {
        let id = format!("{}{}", tag, std::process::id() % 100_000);
        let t = Topology { srv: format!("ssrv{id}"), cli: format!("scli{id}"), vs: format!("xs{id}"), server: None };
        let vc = format!("xc{id}");
        let setup = || {
            common::veth_namespaces(
                &common::End { ns: &t.srv, dev: &t.vs, v4: V4S, v6: Some(V6S) },
                &common::End { ns: &t.cli, dev: &vc, v4: V4C, v6: Some(V6C) },
            )
        };
        if let Err(e) = setup() {
            panic!("topology setup: {e}");
        }
        t
    }

    /// Start the daemon in the server namespace; returns its status line.
    fn start_server(&mut self, extra: &[&str]) -> String {
        let port = PORT.to_string();
        let mut args = vec!["-l", "::", "-p", &port, "-U", &port];
        args.extend_from_slice(extra);
        let d = common::Daemon::start(Some(&self.srv), &args, Duration::from_secs(15));
        let line = d.status.clone();
        self.server = Some(d);
        assert!(!line.is_empty(), "status line within 15 s");
        // The TCP listener is up once the status line is printed.
        line
    }

    /// SIGTERM the daemon and wait (bounded) for it to exit; returns whether it exited 0.
    fn stop_server(&mut self) -> bool {
        self.server.take().is_some_and(|mut d| d.stop(Duration::from_secs(10)))
    }

    /// The scheduling policy (stat field 41) of each of the daemon's worker threads.
    fn worker_policies(&self) -> Vec<i32> {
        let Some(pid) = self.server.as_ref().and_then(common::Daemon::pid) else { return Vec::new() };
        let mut out = Vec::new();
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("daemon's tasks");
        for t in tasks.flatten() {
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            if !comm.starts_with("slipstream-w") {
                continue;
            }
            let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
            // Fields after the ")" that closes comm start at field 3.
            let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
            out.push(rest.split_whitespace().nth(41 - 3).and_then(|f| f.parse().ok()).unwrap_or(-1));
        }
        out
    }

    fn server_iface_has_xdp(&self) -> bool {
        ip(&["-n", &self.srv, "link", "show", &self.vs]).map(|s| s.contains("xdp")).unwrap_or(false)
    }

    /// Run `f` on a thread inside the client namespace (threads it spawns stay there too).
    fn in_client<R: Send + 'static>(&self, f: impl FnOnce() -> R + Send + 'static) -> R {
        common::in_ns(&self.cli, f)
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        // The daemon (killed on drop) goes before its namespace.
        drop(self.server.take());
        // Deleting a namespace removes the veth pair with it.
        let _ = ip(&["netns", "del", &self.srv]);
        let _ = ip(&["netns", "del", &self.cli]);
    }
}

// ---------------------------------------------------------------------------------------------
// Clients (used inside the client namespace).

struct Tcp {
    s: TcpStream,
}

impl Tcp {
    fn connect(v6: bool) -> Tcp {
        let addr: IpAddr = if v6 { V6S.parse().unwrap() } else { V4S.parse().unwrap() };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match TcpStream::connect_timeout(&SocketAddr::new(addr, PORT), IO_TIMEOUT) {
                Ok(s) => {
                    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
                    s.set_nodelay(true).unwrap();
                    return Tcp { s };
                }
                Err(e) if Instant::now() > deadline => panic!("connect to server: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// Send text requests followed by a meta no-op and return everything before its `MN`.
    fn cmd(&mut self, req: &str) -> String {
        self.cmd_bytes(req.as_bytes())
    }

    fn cmd_bytes(&mut self, req: &[u8]) -> String {
        let mut all = req.to_vec();
        all.extend_from_slice(b"mn\r\n");
        self.s.write_all(&all).expect("tcp write");
        let mut got = Vec::new();
        let mut buf = [0u8; 65536];
        let deadline = Instant::now() + IO_TIMEOUT * 2;
        while !got.ends_with(b"MN\r\n") {
            assert!(
                Instant::now() < deadline,
                "no MN after {:?}: got {:?}",
                String::from_utf8_lossy(req),
                String::from_utf8_lossy(&got)
            );
            match self.s.read(&mut buf) {
                Ok(0) => panic!("server closed the connection"),
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) => panic!("tcp read: {e}"),
            }
        }
        got.truncate(got.len() - 4);
        String::from_utf8_lossy(&got).into_owned()
    }

    fn fastpath(&mut self) -> (u64, u64, u64) {
        let s = self.cmd("stats\r\n");
        let get = |name: &str| -> u64 {
            s.lines()
                .find_map(|l| l.strip_prefix(&format!("STAT {name} ")))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or_else(|| panic!("no {name} in stats"))
        };
        (get("fastpath_hits"), get("fastpath_misses"), get("fastpath_invalidations"))
    }
}

/// A binary-protocol request (magic 0x80), key/extras/value as given.
fn binary_request(opcode: u8, key: &[u8], extras: &[u8], value: &[u8]) -> Vec<u8> {
    let body = extras.len() + key.len() + value.len();
    let mut p = vec![0x80, opcode];
    p.extend_from_slice(&(key.len() as u16).to_be_bytes());
    p.push(extras.len() as u8);
    p.extend_from_slice(&[0, 0, 0]);
    p.extend_from_slice(&(body as u32).to_be_bytes());
    p.extend_from_slice(&[0; 12]); // opaque, cas
    p.extend_from_slice(extras);
    p.extend_from_slice(key);
    p.extend_from_slice(value);
    p
}

/// Send one binary request on a fresh connection and return the response status.
fn binary_status(req: &[u8]) -> u16 {
    let mut t = Tcp::connect(false);
    t.s.write_all(req).unwrap();
    let mut h = [0u8; 24];
    t.s.read_exact(&mut h).expect("binary response header");
    assert_eq!(h[0], 0x81, "binary response magic");
    let body = u32::from_be_bytes([h[8], h[9], h[10], h[11]]) as usize;
    let mut rest = vec![0u8; body];
    t.s.read_exact(&mut rest).unwrap();
    u16::from_be_bytes([h[6], h[7]])
}

/// The memcached UDP client over IPv4 and IPv6 (common::UdpClient, one per family).
struct Udp {
    v4: common::UdpClient,
    v6: common::UdpClient,
}

impl Udp {
    fn new() -> Udp {
        let poll = Duration::from_millis(50);
        let v4 = common::UdpClient::bind(SocketAddr::new(V4C.parse().expect("v4"), 0), poll);
        let v6 = common::UdpClient::bind(SocketAddr::new(V6C.parse().expect("v6"), 0), poll);
        Udp { v4, v6 }
    }

    /// Send `req` as one memcached UDP datagram and collect reply messages until `done` says
    /// the reply is complete (or the timeout: None).
    fn query(&mut self, v6: bool, req: &str, done: impl Fn(&str) -> bool) -> Option<String> {
        let (c, dst) = if v6 {
            (&mut self.v6, SocketAddr::new(V6S.parse().expect("v6"), PORT))
        } else {
            (&mut self.v4, SocketAddr::new(V4S.parse().expect("v4"), PORT))
        };
        c.query(dst, req.as_bytes(), done, UDP_TIMEOUT)
    }

    fn get(&mut self, v6: bool, req: &str) -> Option<String> {
        self.query(v6, req, |s| s.ends_with("END\r\n"))
    }
}

fn value_reply(key: &str, flags: u32, data: &str) -> String {
    format!("VALUE {key} {flags} {}\r\n{data}\r\nEND\r\n", data.len())
}

// ---------------------------------------------------------------------------------------------

#[test]
fn xdp_fast_path_end_to_end() {
    if let Some(why) = skip_reason() {
        println!("SKIP: xdp_fast_path_end_to_end: {why}");
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut topo = Topology::new("e");
    let admin = format!("0.0.0.0:{ADMIN_PORT}");
    let line = topo.start_server(&["--xdp", &topo.vs.clone(), "-t", "2", "--admin", &admin]);
    assert!(line.contains(&format!("kernel fast path on {}", topo.vs)), "status line: {line}");
    assert!(line.contains("native XDP"), "veth supports native XDP: {line}");
    assert!(topo.server_iface_has_xdp(), "program attached");
    // --worker-sched auto: with the fast path on, workers batch what it passes up.
    assert!(line.contains("2 threads (SCHED_BATCH)"), "status line: {line}");
    assert_eq!(topo.worker_policies(), vec![libc::SCHED_BATCH; 2], "worker threads' policy");

    topo.in_client(|| {
        let mut t = Tcp::connect(false);
        let mut u = Udp::new();

        // Hits are answered by the kernel: the first get fills, the next ones are XDP hits.
        assert_eq!(t.cmd("set foo 5 0 3\r\nbar\r\n"), "STORED\r\n");
        let c0 = t.fastpath();
        let want = value_reply("foo", 5, "bar");
        assert_eq!(u.get(false, "get foo\r\n").as_deref(), Some(&*want), "first get (user space)");
        let c1 = t.fastpath();
        assert_eq!((c1.0 - c0.0, c1.1 - c0.1), (0, 1), "first get is a kernel miss");
        assert_eq!(u.get(false, "get foo\r\n").as_deref(), Some(&*want), "second get (XDP)");
        assert_eq!(u.get(true, "get foo\r\n").as_deref(), Some(&*want), "IPv6 get (XDP)");
        let c2 = t.fastpath();
        assert_eq!((c2.0 - c1.0, c2.1 - c1.1), (2, 0), "second get and IPv6 get answered by XDP");
        assert_eq!(u.get(false, "gets foo\r\n").as_deref().map(|s| s.starts_with("VALUE foo 5 3 ")), Some(true));
        let mg = u.query(false, "mg foo v f\r\n", |s| s.ends_with("bar\r\n"));
        assert_eq!(mg.as_deref(), Some("VA 3 f5\r\nbar\r\n"));
        let c3 = t.fastpath();
        assert_eq!(c3.0 - c2.0, 2, "gets and mg v f answered by XDP");

        // Misses go to user space.
        assert_eq!(u.get(false, "get nope\r\n").as_deref(), Some("END\r\n"));
        assert_eq!(u.get(true, "get nope\r\n").as_deref(), Some("END\r\n"));
        let c4 = t.fastpath();
        assert_eq!((c4.0 - c3.0, c4.1 - c3.1), (0, 2), "misses passed up");

        // Multi-get: each key filled by a single get, then one XDP reply for all of them.
        assert_eq!(t.cmd("set ka 1 0 2\r\naa\r\nset kb 2 0 2\r\nbb\r\n"), "STORED\r\nSTORED\r\n");
        u.get(false, "get ka\r\n");
        u.get(false, "get kb\r\n");
        let c5 = t.fastpath();
        let multi = "VALUE ka 1 2\r\naa\r\nVALUE kb 2 2\r\nbb\r\nVALUE foo 5 3\r\nbar\r\nEND\r\n";
        assert_eq!(u.get(false, "get ka kb foo\r\n").as_deref(), Some(multi));
        assert_eq!(u.get(true, "get ka kb foo\r\n").as_deref(), Some(multi));
        let c6 = t.fastpath();
        assert_eq!(c6.0 - c5.0, 2, "multi-gets answered by XDP");
        // One key missing: user space answers the whole request (each key its own message).
        assert_eq!(
            u.get(false, "get ka nope kb\r\n").as_deref(),
            Some("VALUE ka 1 2\r\naa\r\nVALUE kb 2 2\r\nbb\r\nEND\r\n")
        );
        assert_eq!(t.fastpath().0, c6.0, "partial miss is not a hit");

        // TTL: served by the kernel while live, never after the store's expiry.
        assert_eq!(t.cmd("set ttl 0 2 1\r\nv\r\n"), "STORED\r\n");
        let set_at = Instant::now();
        u.get(false, "get ttl\r\n");
        let c7 = t.fastpath();
        assert_eq!(u.get(false, "get ttl\r\n").as_deref(), Some(&*value_reply("ttl", 0, "v")));
        assert_eq!(t.fastpath().0 - c7.0, 1, "live TTL item answered by XDP");
        // Poll through the expiry: once user space says it is gone, the kernel must agree.
        let mut gone_at = None;
        while set_at.elapsed() < Duration::from_secs(4) {
            let tcp = t.cmd("get ttl\r\n");
            let udp = u.get(false, "get ttl\r\n").expect("udp reply");
            if tcp == "END\r\n" {
                assert_eq!(udp, "END\r\n", "kernel served an item user space had expired");
                gone_at.get_or_insert(set_at.elapsed());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(gone_at.is_some(), "TTL item never expired");

        // Every command that changes an item, over TCP and UDP: fill, prove an XDP hit, change,
        // then the UDP get must show the change, and agree with user space over TCP.
        enum Via {
            Tcp(&'static str),
            Udp(&'static str),
            /// opcode, extras, value (the key is the case's).
            Binary(u8, Vec<u8>, &'static [u8]),
            Sleep(&'static str, u64),
        }
        let cases: Vec<(&str, Via, Option<&str>)> = vec![
            ("set", Via::Tcp("set K 0 0 3\r\nnew\r\n"), Some("new")),
            ("set same size", Via::Tcp("set K 0 0 2\r\n20\r\n"), Some("20")),
            ("set with flags", Via::Tcp("set K 7 0 2\r\n10\r\n"), Some("10")),
            ("replace", Via::Tcp("replace K 0 0 3\r\nrep\r\n"), Some("rep")),
            ("append", Via::Tcp("append K 0 0 3\r\napp\r\n"), Some("10app")),
            ("prepend", Via::Tcp("prepend K 0 0 3\r\npre\r\n"), Some("pre10")),
            ("delete", Via::Tcp("delete K\r\n"), None),
            ("delete then add", Via::Tcp("delete K\r\nadd K 0 0 5\r\nadded\r\n"), Some("added")),
            ("incr in place", Via::Tcp("incr K 5\r\n"), Some("15")),
            ("incr longer", Via::Tcp("incr K 1000\r\n"), Some("1010")),
            ("decr", Via::Tcp("decr K 3\r\n"), Some("7 ")),
            ("touch -1", Via::Tcp("touch K -1\r\n"), None),
            ("gat -1", Via::Tcp("gat -1 K\r\n"), None),
            ("gats -1", Via::Tcp("gats -1 K\r\n"), None),
            ("flush_all", Via::Tcp("flush_all\r\n"), None),
            ("ms", Via::Tcp("ms K 2 T0\r\nms\r\n"), Some("ms")),
            ("ms append", Via::Tcp("ms K 1 MA\r\nx\r\n"), Some("10x")),
            ("md", Via::Tcp("md K\r\n"), None),
            ("ma", Via::Tcp("ma K\r\n"), Some("11")),
            ("ma decr", Via::Tcp("ma K MD D4\r\n"), Some("6 ")),
            ("mg T-1", Via::Tcp("mg K T-1\r\n"), None),
            ("udp set", Via::Udp("set K 0 0 4\r\nudps\r\n"), Some("udps")),
            ("udp append", Via::Udp("append K 0 0 1\r\nu\r\n"), Some("10u")),
            ("udp delete", Via::Udp("delete K\r\n"), None),
            ("udp incr", Via::Udp("incr K 2\r\n"), Some("12")),
            ("udp touch -1", Via::Udp("touch K -1\r\n"), None),
            ("udp ms", Via::Udp("ms K 3\r\nums\r\n"), Some("ums")),
            ("udp md", Via::Udp("md K\r\n"), None),
            ("udp flush_all", Via::Udp("flush_all\r\n"), None),
            ("binary set", Via::Binary(0x01, vec![0; 8], b"bin"), Some("bin")),
            ("binary delete", Via::Binary(0x04, vec![], b""), None),
            ("binary append", Via::Binary(0x0e, vec![], b"ba"), Some("10ba")),
            ("binary incr", Via::Binary(0x05, [&5u64.to_be_bytes()[..], &[0; 12]].concat(), b""), Some("15")),
            ("touch to 1s, then expiry", Via::Sleep("touch K 1\r\n", 2100), None),
        ];
        for (i, (name, via, want)) in cases.into_iter().enumerate() {
            let key = format!("inv{i}");
            let k = key.as_str();
            assert_eq!(t.cmd(&format!("set {k} 0 0 2\r\n10\r\n")), "STORED\r\n", "{name}: setup");
            let before = value_reply(k, 0, "10");
            assert_eq!(u.get(false, &format!("get {k}\r\n")).as_deref(), Some(&*before), "{name}: fill");
            let h0 = t.fastpath().0;
            assert_eq!(u.get(i % 2 == 1, &format!("get {k}\r\n")).as_deref(), Some(&*before), "{name}: hit");
            assert_eq!(t.fastpath().0 - h0, 1, "{name}: the pre-change get was an XDP hit");
            match via {
                Via::Tcp(c) => {
                    t.cmd(&c.replace('K', k));
                }
                Via::Udp(c) => {
                    let r = u.query(false, &c.replace('K', k), |_| true);
                    assert!(r.is_some(), "{name}: udp command answered");
                }
                Via::Binary(op, extras, value) => {
                    let status = binary_status(&binary_request(op, k.as_bytes(), &extras, value));
                    assert_eq!(status, 0, "{name}: binary status");
                }
                Via::Sleep(c, ms) => {
                    t.cmd(&c.replace('K', k));
                    std::thread::sleep(Duration::from_millis(ms));
                }
            }
            // The first get after the change must see it, whoever answers.
            let got = u.get(i % 3 == 0, &format!("get {k}\r\n"));
            let want = match want {
                Some(v) => value_reply(k, if name == "set with flags" { 7 } else { 0 }, v),
                None => "END\r\n".to_string(),
            };
            assert_eq!(got.as_deref(), Some(&*want), "{name}: UDP get after the change");
            assert_eq!(t.cmd(&format!("get {k}\r\n")), want, "{name}: user space agrees");
            // And again, now possibly from the kernel's new copy.
            assert_eq!(u.get(false, &format!("get {k}\r\n")).as_deref(), Some(&*want), "{name}: refilled");
        }

        // A delayed flush_all: the kernel stops answering at once and fills stay off until the
        // flush is in force, after which the items are gone.
        assert_eq!(t.cmd("set df 0 0 1\r\nd\r\n"), "STORED\r\n");
        u.get(false, "get df\r\n");
        let h = t.fastpath().0;
        u.get(false, "get df\r\n");
        assert_eq!(t.fastpath().0 - h, 1);
        assert_eq!(t.cmd("flush_all 3\r\n"), "OK\r\n");
        let h = t.fastpath().0;
        let mut flushed = false;
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(5) {
            let udp = u.get(false, "get df\r\n").expect("udp reply");
            let tcp = t.cmd("get df\r\n");
            // The flush may come into force between the two gets (its second boundary), and
            // only in that order: the UDP get still sees the item, the TCP get no longer does.
            let crossed = udp == value_reply("df", 0, "d") && tcp == "END\r\n";
            assert!(udp == tcp || crossed, "kernel and user space disagree during a delayed flush: {udp:?} vs {tcp:?}");
            if tcp == "END\r\n" {
                assert_eq!(u.get(false, "get df\r\n").as_deref(), Some("END\r\n"), "UDP after the flush");
                flushed = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(flushed, "delayed flush took effect");
        assert_eq!(t.fastpath().0, h, "no kernel hits while a delayed flush is pending");
        // memcached also hides items stored in the second the flush takes effect: move on.
        std::thread::sleep(Duration::from_millis(1100));

        // Oversized values are not cached but still served (by user space, several datagrams).
        let big = "x".repeat(2000);
        assert_eq!(t.cmd(&format!("set big 0 0 2000\r\n{big}\r\n")), "STORED\r\n");
        let c8 = t.fastpath();
        for v6 in [false, true, false] {
            assert_eq!(u.get(v6, "get big\r\n").as_deref(), Some(&*value_reply("big", 0, &big)), "oversized");
        }
        let c9 = t.fastpath();
        assert_eq!((c9.0 - c8.0, c9.1 - c8.1), (0, 3), "oversized value never answered by XDP");

        // Stats and the metrics endpoint show the same counters.
        let (hits, misses, inval) = t.fastpath();
        assert!(hits >= 40 && misses >= 20 && inval >= 30, "counters: {hits} {misses} {inval}");
        let mut http = TcpStream::connect((V4S, ADMIN_PORT)).expect("admin endpoint");
        http.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        http.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut body = String::new();
        let _ = http.read_to_string(&mut body);
        let metric = |name: &str| -> u64 {
            body.lines()
                .find_map(|l| l.strip_prefix(&format!("{name} ")))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or_else(|| panic!("no {name} in /metrics"))
        };
        assert_eq!(metric("slipstream_fastpath_enabled"), 1);
        assert_eq!(metric("slipstream_fastpath_hits_total"), hits);
        assert_eq!(metric("slipstream_fastpath_misses_total"), misses);
        assert_eq!(metric("slipstream_fastpath_invalidations_total"), inval);
    });

    // Detach on exit, and a restart starts empty.
    assert!(topo.stop_server(), "daemon exits cleanly on SIGTERM");
    assert!(!topo.server_iface_has_xdp(), "XDP program detached on exit");
    let line = topo.start_server(&["--xdp", &topo.vs.clone(), "-t", "1"]);
    assert!(line.contains("kernel fast path on"), "{line}");
    topo.in_client(|| {
        let mut u = Udp::new();
        let mut t = Tcp::connect(true);
        assert_eq!(u.get(false, "get foo\r\n").as_deref(), Some("END\r\n"), "no stale data after restart");
        assert_eq!(t.cmd("set foo 0 0 3\r\nnew\r\n"), "STORED\r\n");
        u.get(false, "get foo\r\n");
        assert_eq!(u.get(false, "get foo\r\n").as_deref(), Some(&*value_reply("foo", 0, "new")));
        assert_eq!(t.fastpath().0, 1);
    });
    assert!(topo.stop_server());

    // Without root, or with no such interface, the daemon says why and serves from user space.
    let vs = topo.vs.clone();
    let line = topo.start_server(&["--xdp", "nosuchif0", "-t", "1"]);
    assert!(line.contains("kernel fast path off: no network interface named \"nosuchif0\""), "{line}");
    assert!(line.contains("serving from user space"), "{line}");
    assert!(line.contains("1 threads,"), "auto: no SCHED_BATCH with the fast path off: {line}");
    topo.in_client(|| {
        let mut t = Tcp::connect(false);
        assert_eq!(t.cmd("set a 0 0 1\r\n1\r\nget a\r\n"), "STORED\r\nVALUE a 0 1\r\n1\r\nEND\r\n");
    });
    assert!(topo.stop_server());
    let port = PORT.to_string();
    let mut child = Command::new("ip")
        .args(["netns", "exec", &topo.srv, "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"])
        .args([env!("CARGO_BIN_EXE_slipstream"), "serve", "-p", &port, "-U", &port, "-t", "1", "--xdp", &vs])
        // SCHED_BATCH asked for explicitly needs no privilege.
        .args(["--worker-sched", "batch"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn unprivileged slipstream");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = out.read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx.recv_timeout(Duration::from_secs(10));
    let _ = child.kill();
    let _ = child.wait();
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    let line = line.expect("unprivileged status line");
    assert!(line.contains("kernel fast path off: XDP fast path needs root"), "{line}");
    assert!(line.contains("serving from user space"), "{line}");
    assert!(line.contains("1 threads (SCHED_BATCH)"), "{line}");
    assert!(!err.contains("cannot set"), "unprivileged SCHED_BATCH: {err}");
}

// ---------------------------------------------------------------------------------------------

/// xorshift64*: small, seedable.
const KEYS: usize = 16;
const WRITERS: usize = 2;
const READERS: usize = 3;
const OPS_MIN: u64 = 1_000_000;
const RUN_LIMIT: Duration = Duration::from_secs(50);

fn ckey(i: usize) -> String {
    format!("stale{i:02}")
}

/// Versions are 12 zero-padded digits so every value has the same length.
fn version_value(v: u64) -> String {
    format!("{v:012}")
}

/// Parse a get reply into (key, version) pairs; None if malformed.
fn parse_values(mut s: &str) -> Option<Vec<(String, u64)>> {
    let mut out = Vec::new();
    loop {
        if s == "END\r\n" {
            return Some(out);
        }
        let rest = s.strip_prefix("VALUE ")?;
        let (header, rest) = rest.split_once("\r\n")?;
        let mut it = header.split(' ');
        let key = it.next()?.to_string();
        let _flags = it.next()?;
        let len: usize = it.next()?.parse().ok()?;
        let data = rest.get(..len)?;
        s = rest.get(len..)?.strip_prefix("\r\n")?;
        out.push((key, data.trim_end().parse().ok()?));
    }
}

#[derive(Default)]
struct Tally {
    ops: AtomicU64,
    reads: AtomicU64,
    writes: AtomicU64,
    stale: AtomicU64,
    missing: AtomicU64,
    lost: AtomicU64,
    malformed: AtomicU64,
}

#[test]
fn xdp_no_stale_reads_under_concurrent_writes() {
    if let Some(why) = skip_reason() {
        println!("SKIP: xdp_no_stale_reads_under_concurrent_writes: {why}");
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let seed = std::env::var("STALE_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(7)
    }) | 1;
    println!("stale-read checker seed {seed} (rerun with STALE_SEED={seed})");
    let mut topo = Topology::new("s");
    let line = topo.start_server(&["--xdp", &topo.vs.clone(), "-t", "2"]);
    assert!(line.contains("kernel fast path on"), "{line}");

    let (tally, (hits, misses, inval), elapsed) = topo.in_client(move || {
        // acked[k]: newest version of key k whose write the server acknowledged.
        let acked: Arc<Vec<AtomicU64>> = Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
        let tally = Arc::new(Tally::default());
        let stop = Arc::new(AtomicBool::new(false));
        let mut t = Tcp::connect(false);
        for k in 0..KEYS {
            assert_eq!(t.cmd(&format!("set {} 0 0 12\r\n{}\r\n", ckey(k), version_value(1))), "STORED\r\n");
            acked[k].store(1, Ordering::SeqCst);
        }
        let started = Instant::now();
        let mut threads = Vec::new();
        // Writers: each owns KEYS/WRITERS keys, so per key writes are sequential and versions
        // increase in the order the server applies them. Text set, meta ms and binary set.
        for w in 0..WRITERS {
            let (acked, tally, stop) = (acked.clone(), tally.clone(), stop.clone());
            threads.push(std::thread::spawn(move || {
                let mut rng = fastrand::Rng::with_seed(seed ^ (0x1000 + w as u64));
                let mut t = Tcp::connect(w % 2 == 1);
                let mut bin = Tcp::connect(false);
                let mut version = [1u64; KEYS];
                while !stop.load(Ordering::Relaxed) {
                    let r = rng.u64(..);
                    let k = w + WRITERS * (r as usize % (KEYS / WRITERS));
                    version[k] += 1;
                    let v = version_value(version[k]);
                    let key = ckey(k);
                    match (r >> 20) % 8 {
                        0..=4 => assert_eq!(t.cmd(&format!("set {key} 0 0 12\r\n{v}\r\n")), "STORED\r\n"),
                        5 | 6 => assert_eq!(t.cmd(&format!("ms {key} 12\r\n{v}\r\n")), "HD\r\n"),
                        _ => {
                            let req = binary_request(0x01, key.as_bytes(), &[0; 8], v.as_bytes());
                            bin.s.write_all(&req).unwrap();
                            let mut h = [0u8; 24];
                            bin.s.read_exact(&mut h).expect("binary set reply");
                            let body = u32::from_be_bytes([h[8], h[9], h[10], h[11]]) as usize;
                            let mut rest = vec![0u8; body];
                            bin.s.read_exact(&mut rest).unwrap();
                            assert_eq!(u16::from_be_bytes([h[6], h[7]]), 0, "binary set status");
                        }
                    }
                    // Acknowledged: from now on no read may return an older version.
                    acked[k].store(version[k], Ordering::SeqCst);
                    tally.writes.fetch_add(1, Ordering::Relaxed);
                    tally.ops.fetch_add(1, Ordering::Relaxed);
                    // Writers run at a fraction of the readers' rate so that reads also find
                    // kernel copies (a write per key every few hundred reads of it).
                    if r.is_multiple_of(4) {
                        std::thread::sleep(Duration::from_micros(200));
                    }
                }
            }));
        }
        for rd in 0..READERS {
            let (acked, tally, stop) = (acked.clone(), tally.clone(), stop.clone());
            threads.push(std::thread::spawn(move || {
                let mut rng = fastrand::Rng::with_seed(seed ^ (0x2000 + rd as u64));
                let v6 = rd == READERS - 1;
                let mut u = Udp::new();
                while !stop.load(Ordering::Relaxed) {
                    let r = rng.u64(..);
                    let nkeys = match r % 20 {
                        0 | 1 => 3,
                        2 => 2,
                        _ => 1,
                    };
                    let ks: Vec<usize> = (0..nkeys).map(|i| ((r >> (8 + 5 * i)) as usize) % KEYS).collect();
                    let mg = nkeys == 1 && (r >> 40).is_multiple_of(10);
                    // The floor is taken before the request is sent.
                    let floors: Vec<u64> = ks.iter().map(|&k| acked[k].load(Ordering::SeqCst)).collect();
                    let names: Vec<String> = ks.iter().map(|&k| ckey(k)).collect();
                    let reply = if mg {
                        u.query(v6, &format!("mg {} v\r\n", names[0]), |s| {
                            s.ends_with("\r\n") && s.matches("\r\n").count() >= 2
                        })
                        .map(|s| {
                            match s.strip_prefix("VA 12\r\n").and_then(|v| v.strip_suffix("\r\n")) {
                                Some(v) => format!("VALUE {} 0 12\r\n{v}\r\nEND\r\n", names[0]),
                                None => s,
                            }
                        })
                    } else {
                        u.get(v6, &format!("get {}\r\n", names.join(" ")))
                    };
                    tally.ops.fetch_add(1, Ordering::Relaxed);
                    tally.reads.fetch_add(1, Ordering::Relaxed);
                    let Some(reply) = reply else {
                        tally.lost.fetch_add(1, Ordering::Relaxed);
                        continue;
                    };
                    let Some(vals) = parse_values(&reply) else {
                        eprintln!("malformed reply: {reply:?}");
                        tally.malformed.fetch_add(1, Ordering::Relaxed);
                        continue;
                    };
                    if vals.len() != ks.len() {
                        tally.missing.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    for (i, (key, ver)) in vals.iter().enumerate() {
                        if key != &names[i] {
                            tally.malformed.fetch_add(1, Ordering::Relaxed);
                        } else if *ver < floors[i] {
                            eprintln!(
                                "STALE: {key} returned version {ver}, acknowledged {} before the read",
                                floors[i]
                            );
                            tally.stale.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }));
        }
        let want_ops = OPS_MIN + OPS_MIN / 10;
        while started.elapsed() < RUN_LIMIT && tally.ops.load(Ordering::Relaxed) < want_ops {
            std::thread::sleep(Duration::from_millis(50));
        }
        stop.store(true, Ordering::SeqCst);
        for th in threads {
            th.join().expect("checker thread");
        }
        let elapsed = started.elapsed();
        let fp = t.fastpath();
        (tally, fp, elapsed)
    });
    let g = |a: &AtomicU64| a.load(Ordering::SeqCst);
    println!(
        "stale-read checker: {} ops in {:.1} s ({} reads, {} writes), stale {}, missing {}, lost {}, malformed {}; \
         fastpath hits {hits}, misses {misses}, invalidations {inval}; seed {seed}",
        g(&tally.ops),
        elapsed.as_secs_f64(),
        g(&tally.reads),
        g(&tally.writes),
        g(&tally.stale),
        g(&tally.missing),
        g(&tally.lost),
        g(&tally.malformed),
    );
    assert_eq!(g(&tally.stale), 0, "stale reads (seed {seed})");
    assert_eq!(g(&tally.missing), 0, "keys missing from replies (seed {seed})");
    assert_eq!(g(&tally.malformed), 0, "malformed replies (seed {seed})");
    assert!(g(&tally.ops) >= OPS_MIN, "only {} operations in {RUN_LIMIT:?} (seed {seed})", g(&tally.ops));
    assert!(g(&tally.lost) * 1000 <= g(&tally.reads), "over 0.1% of reads lost (seed {seed})");
    // The run must have exercised both paths heavily, or it proves nothing.
    assert!(hits >= g(&tally.reads) / 5, "kernel answered only {hits} of {} reads", g(&tally.reads));
    assert!(misses >= 1000 && inval >= 1000, "too few misses/invalidations: {misses} {inval}");
    assert!(topo.stop_server());
}
