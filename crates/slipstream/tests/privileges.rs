//! `-u USER` as root (issue 13 item 7): the daemon binds and attaches as root, then runs as the
//! user with no capability in any thread (on kernels before 5.9 the main thread keeps
//! cap_net_admin permitted for the XDP detach at exit), still serves,
//! and with `--xdp` the kernel fast path still answers and is kept coherent, and detaches on
//! SIGTERM. Unknown users are memcached's error; root without `-u` is said in the status line.
//!
//! Needs root (and for the XDP test `ip` and namespaces); prints SKIP and passes otherwise.
//! Every wait is bounded; every child is killed on drop.

mod common;

use common::root;

use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const V4S: &str = "10.211.0.1";
const V4C: &str = "10.211.0.2";
const XDP_PORT: u16 = 22411;
/// CAP_NET_ADMIN's bit in /proc/*/status capability masks.
const CAP_NET_ADMIN_MASK: u64 = 1 << 12;

/// The user the tests become, and its uid/gid from the passwd database.
fn nobody() -> (u32, u32) {
    let out = Command::new("getent").args(["passwd", "nobody"]).output().expect("getent");
    let line = String::from_utf8_lossy(&out.stdout).into_owned();
    let f: Vec<&str> = line.trim().split(':').collect();
    (f[2].parse().expect("uid"), f[3].parse().expect("gid"))
}

struct Daemon {
    child: Child,
    status_line: String,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(cmd: &mut Command) -> Daemon {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().expect("spawn slipstream");
    let status_line = common::status_line(&mut child, Duration::from_secs(15));
    assert!(!status_line.is_empty(), "no status line");
    Daemon { child, status_line }
}

impl Daemon {
    /// SIGTERM, then wait (bounded); whether it exited 0.
    fn stop(&mut self) -> bool {
        // SAFETY: kill sends a signal to the pid of a child we spawned and have not reaped.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(st)) = self.child.try_wait() {
                return st.success();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// `field` of /proc/PID/status for each thread: (is the main thread, name, value).
    fn threads(&self, field: &str) -> Vec<(bool, String, String)> {
        let pid = self.child.id().to_string();
        let mut out = Vec::new();
        for t in std::fs::read_dir(format!("/proc/{pid}/task")).expect("tasks").flatten() {
            let main = t.file_name().to_string_lossy() == pid.as_str();
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default().trim().to_string();
            let st = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
            let v = st.lines().find_map(|l| l.strip_prefix(&format!("{field}:"))).unwrap_or("").trim().to_string();
            out.push((main, comm, v));
        }
        out
    }

    fn status(&self, field: &str) -> String {
        let st = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).expect("status");
        st.lines().find_map(|l| l.strip_prefix(&format!("{field}:"))).unwrap_or("").trim().to_string()
    }
}

fn mask(v: &str) -> u64 {
    u64::from_str_radix(v, 16).unwrap_or(u64::MAX)
}

/// Every thread runs as `uid`/`gid` with no effective capability; the permitted set is empty
/// everywhere but the main thread's cap_net_admin when `net_admin_kept`.
fn assert_dropped(d: &Daemon, uid: u32, gid: u32, net_admin_kept: bool) {
    assert_eq!(d.status("Uid"), format!("{uid}\t{uid}\t{uid}\t{uid}"));
    assert_eq!(d.status("Gid"), format!("{gid}\t{gid}\t{gid}\t{gid}"));
    assert_eq!(d.status("Groups"), "");
    let main_prm = if net_admin_kept { CAP_NET_ADMIN_MASK } else { 0 };
    assert_eq!(mask(&d.status("CapEff")), 0);
    assert_eq!(mask(&d.status("CapPrm")), main_prm);
    let threads = d.threads("CapEff").into_iter().zip(d.threads("CapPrm"));
    let mut n = 0;
    for ((main, name, eff), (_, _, prm)) in threads {
        n += 1;
        assert_eq!(mask(&eff), 0, "thread {name}: CapEff {eff}");
        assert_eq!(mask(&prm), if main { main_prm } else { 0 }, "thread {name}: CapPrm {prm}");
    }
    assert!(n >= 3, "only {n} threads");
    for (_, name, uids) in d.threads("Uid") {
        assert_eq!(uids, format!("{uid}\t{uid}\t{uid}\t{uid}"), "thread {name}");
    }
}

fn ask(s: &mut TcpStream, req: &[u8], end: &[u8]) -> String {
    String::from_utf8_lossy(&common::ask(s, req, end)).into_owned()
}

fn connect(addr: SocketAddr) -> TcpStream {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
            Ok(s) => {
                s.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
                return s;
            }
            Err(e) if Instant::now() > deadline => panic!("connect {addr}: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("probe");
    l.local_addr().expect("addr").port()
}

#[test]
fn as_root_u_nobody_drops_everything_and_serves() {
    if !root() {
        println!("SKIP: as_root_u_nobody_drops_everything_and_serves: not root");
        return;
    }
    let (uid, gid) = nobody();
    let p = free_port();
    let ps = p.to_string();
    let mut d = start(Command::new(env!("CARGO_BIN_EXE_slipstream")).args([
        "serve",
        "-l",
        "127.0.0.1",
        "-p",
        &ps,
        "-U",
        &ps,
        "-t",
        "2",
        "-u",
        "nobody",
    ]));
    assert!(
        d.status_line.contains("running as user nobody") && d.status_line.contains("no capabilities"),
        "{}",
        d.status_line
    );
    assert_dropped(&d, uid, gid, false);
    let mut s = connect(SocketAddr::from(([127, 0, 0, 1], p)));
    assert_eq!(ask(&mut s, b"set a 0 0 1\r\nx\r\nget a\r\n", b"END\r\n"), "STORED\r\nVALUE a 0 1\r\nx\r\nEND\r\n");
    assert!(d.stop(), "clean exit on SIGTERM");

    // Root without -u: served, and said.
    let p = free_port().to_string();
    let d =
        start(Command::new(env!("CARGO_BIN_EXE_slipstream")).args(["serve", "-l", "127.0.0.1", "-p", &p, "-t", "1"]));
    assert!(d.status_line.contains("running as root (-u USER drops privileges after start-up)"), "{}", d.status_line);
    assert_eq!(d.status("Uid"), "0\t0\t0\t0");

    // An unknown user: memcached's line, before anything is bound.
    let out = Command::new(env!("CARGO_BIN_EXE_slipstream"))
        .args(["serve", "-l", "127.0.0.1", "-p", &free_port().to_string(), "-u", "no-such-user-x"])
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("can't find the user no-such-user-x to switch to"), "{err}");
}

/// One memcached UDP get; the reply's text (None after 500 ms).
fn udp_get(sock: &UdpSocket, rid: u16, key: &str) -> Option<String> {
    let mut frame = rid.to_be_bytes().to_vec();
    frame.extend_from_slice(&[0, 0, 0, 1, 0, 0]);
    frame.extend_from_slice(format!("get {key}\r\n").as_bytes());
    sock.send_to(&frame, (V4S, XDP_PORT)).expect("udp send");
    let deadline = Instant::now() + Duration::from_millis(500);
    let mut buf = [0u8; 2048];
    while Instant::now() < deadline {
        if let Ok(n) = sock.recv(&mut buf) {
            if n >= 8 && u16::from_be_bytes([buf[0], buf[1]]) == rid {
                return Some(String::from_utf8_lossy(&buf[8..n]).into_owned());
            }
        }
    }
    None
}

fn stat(s: &mut TcpStream, name: &str) -> u64 {
    let text = ask(s, b"stats\r\n", b"END\r\n");
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("STAT {name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

#[test]
fn xdp_fast_path_works_after_dropping_to_nobody_and_detaches_on_sigterm() {
    if !root() || Command::new("ip").arg("-V").output().is_err() {
        println!("SKIP: xdp_fast_path_works_after_dropping_to_nobody_and_detaches_on_sigterm: needs root and ip");
        return;
    }
    let (uid, gid) = nobody();
    let topo = common::Pair::new("p", V4S, V4C);
    let port = XDP_PORT.to_string();
    let mut d = start(Command::new("ip").args([
        "netns",
        "exec",
        &topo.srv,
        env!("CARGO_BIN_EXE_slipstream"),
        "serve",
        "-l",
        V4S,
        "-p",
        &port,
        "-U",
        &port,
        "-t",
        "2",
        "--xdp",
        &topo.srv_dev,
        "-u",
        "nobody",
    ]));
    assert!(d.status_line.contains("kernel fast path on"), "{}", d.status_line);
    assert!(d.status_line.contains("running as user nobody"), "{}", d.status_line);
    // `ip netns exec` execs the daemon: the child's pid is the daemon's. On kernels with XDP
    // bpf_links (5.9+) nothing is kept, not even for the detach.
    let kept = d.status_line.contains("cap_net_admin permitted");
    assert!(kept || d.status_line.contains("no capabilities"), "{}", d.status_line);
    assert_dropped(&d, uid, gid, kept);
    assert!(topo.srv_has_xdp());
    common::in_ns(&topo.cli, || {
        let mut t = connect(SocketAddr::new(V4S.parse().unwrap(), XDP_PORT));
        let u = UdpSocket::bind((V4C, 0)).expect("udp");
        u.set_read_timeout(Some(Duration::from_millis(50))).expect("timeout");
        assert_eq!(ask(&mut t, b"set foo 0 0 3\r\nold\r\n", b"\r\n"), "STORED\r\n");
        // The first get fills the kernel cache (from user space), the second is a kernel hit.
        assert_eq!(udp_get(&u, 1, "foo").as_deref(), Some("VALUE foo 0 3\r\nold\r\nEND\r\n"));
        assert_eq!(udp_get(&u, 2, "foo").as_deref(), Some("VALUE foo 0 3\r\nold\r\nEND\r\n"));
        assert_eq!(stat(&mut t, "fastpath_hits"), 1, "kernel hit after the drop");
        // A set from the (capability-less) workers invalidates the kernel's copy.
        assert_eq!(ask(&mut t, b"set foo 0 0 3\r\nnew\r\n", b"\r\n"), "STORED\r\n");
        assert!(stat(&mut t, "fastpath_invalidations") >= 1);
        assert_eq!(udp_get(&u, 3, "foo").as_deref(), Some("VALUE foo 0 3\r\nnew\r\nEND\r\n"));
        assert_eq!(udp_get(&u, 4, "foo").as_deref(), Some("VALUE foo 0 3\r\nnew\r\nEND\r\n"));
        assert_eq!(stat(&mut t, "fastpath_hits"), 2, "kernel hit on the new value");
    });
    assert!(d.stop(), "clean exit on SIGTERM");
    assert!(!topo.srv_has_xdp(), "XDP program detached on exit");
}
