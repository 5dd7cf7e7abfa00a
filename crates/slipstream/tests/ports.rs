//! Black-box tests of port ownership (issue 13 item 1) and of a daemon without KV ports
//! (issue 12 item 2): a second daemon on any port the first holds (TCP, UDP, a tenant's, the
//! results port, a stream's UDP port, the admin port) exits with memcached's "failed to listen on
//! TCP port N: Address already in use", the first keeps serving its data on every connection,
//! the admin API answers 409 for a tenant on another process's port, and `-p 0` with only
//! `[[stream]]`s serves the streams.
//!
//! `SLIPSTREAM_BIN` runs them against another build (e.g. an older one, to see them fail).
//! Every wait is bounded; every child is killed on drop.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn bin() -> String {
    std::env::var("SLIPSTREAM_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_slipstream").to_string())
}

struct Daemon {
    child: Child,
    status_line: String,
    _dir: Option<TempDir>,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A config file in a fresh directory (removed with the daemon).
fn config_file(text: &str) -> (TempDir, String) {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("slipstream-ports-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let f = dir.join("c.toml");
    std::fs::write(&f, text).expect("write config");
    let path = f.to_string_lossy().into_owned();
    (TempDir(dir), path)
}

/// A port free for both TCP and UDP on 127.0.0.1 right now.
fn free_port() -> u16 {
    for _ in 0..100 {
        let t = TcpListener::bind("127.0.0.1:0").expect("probe");
        let p = t.local_addr().expect("probe addr").port();
        if UdpSocket::bind(("127.0.0.1", p)).is_ok() {
            return p;
        }
    }
    panic!("no port free for both TCP and UDP");
}

fn spawn(args: &[&str]) -> Child {
    Command::new(bin())
        .arg("serve")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn slipstream")
}

/// Start a daemon and wait for its status line.
fn start(args: &[&str], dir: Option<TempDir>) -> Daemon {
    let mut child = spawn(args);
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let status_line = rx.recv_timeout(Duration::from_secs(10)).unwrap_or_default();
    if status_line.is_empty() {
        let _ = child.kill();
        let mut err = String::new();
        let _ = child.stderr.take().map(|mut e| e.read_to_string(&mut err));
        panic!("no status line from {args:?}: {err}");
    }
    Daemon { child, status_line, _dir: dir }
}

/// Run a daemon that must refuse to start: its exit status and stderr (killed after 5 s).
fn refused(args: &[&str]) -> (bool, String) {
    let mut child = spawn(args);
    let deadline = Instant::now() + Duration::from_secs(5);
    let status = loop {
        if let Ok(Some(st)) = child.try_wait() {
            break Some(st);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    let _ = child.stderr.take().map(|mut e| e.read_to_string(&mut err));
    (status.is_some_and(|s| !s.success()), err)
}

fn assert_refused(args: &[&str], want: &str) {
    let (failed, err) = refused(args);
    assert!(failed, "a second daemon {args:?} started (or did not exit within 5 s); stderr: {err}");
    assert!(err.contains(want), "{args:?}: expected {want:?} in: {err}");
}

fn connect(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    s
}

/// The first daemon still has its item, on fresh connections (a second process in its
/// SO_REUSEPORT group would take some of them and answer misses).
fn assert_item_everywhere(port: u16) {
    for i in 0..32 {
        let mut s = connect(port);
        let got = common::ask(&mut s, b"get k\r\n", b"END\r\n");
        assert_eq!(got, b"VALUE k 0 1\r\nv\r\nEND\r\n", "connection {i}: {}", String::from_utf8_lossy(&got));
    }
}

fn set_item(port: u16) {
    let mut s = connect(port);
    assert_eq!(common::ask(&mut s, b"set k 0 0 1\r\nv\r\n", b"\r\n"), b"STORED\r\n");
}

fn in_use(port: u16, proto: &str) -> String {
    format!("failed to listen on {proto} port {port}: Address already in use")
}

#[test]
fn second_daemon_on_the_tcp_port_is_refused() {
    let p = free_port();
    let ps = p.to_string();
    let _d = start(&["-l", "127.0.0.1", "-p", &ps, "-t", "2"], None);
    set_item(p);
    assert_refused(&["-l", "127.0.0.1", "-p", &ps, "-t", "2"], &in_use(p, "TCP"));
    // Overlapping addresses: the wildcard (IPv4 and dual-stack IPv6) covers 127.0.0.1.
    assert_refused(&["-l", "0.0.0.0", "-p", &ps, "-t", "2"], &in_use(p, "TCP"));
    assert_refused(&["-l", "::", "-p", &ps, "-t", "2"], &in_use(p, "TCP"));
    assert_item_everywhere(p);
}

#[test]
fn second_daemon_on_the_udp_port_is_refused() {
    let (p, q) = (free_port(), free_port());
    let _d = start(&["-l", "127.0.0.1", "-p", &p.to_string(), "-U", &q.to_string(), "-t", "2"], None);
    set_item(p);
    let other = free_port().to_string();
    assert_refused(&["-l", "127.0.0.1", "-p", &other, "-U", &q.to_string(), "-t", "2"], &in_use(q, "UDP"));
    assert_refused(&["-l", "0.0.0.0", "-p", &other, "-U", &q.to_string(), "-t", "2"], &in_use(q, "UDP"));
    // UDP get still answered by the first daemon, every time.
    let u = UdpSocket::bind("127.0.0.1:0").expect("udp");
    u.set_read_timeout(Some(Duration::from_secs(2))).expect("timeout");
    for id in 0..16u16 {
        let mut req = vec![(id >> 8) as u8, id as u8, 0, 0, 0, 1, 0, 0];
        req.extend_from_slice(b"get k\r\n");
        u.send_to(&req, ("127.0.0.1", q)).expect("send");
        let mut buf = [0u8; 2048];
        let n = u.recv(&mut buf).expect("UDP reply from the first daemon");
        assert_eq!(&buf[8..n], b"VALUE k 0 1\r\nv\r\nEND\r\n");
    }
    assert_item_everywhere(p);
}

#[test]
fn a_tenant_on_another_daemons_port_is_refused() {
    let (p, q) = (free_port(), free_port());
    let _d = start(&["-l", "127.0.0.1", "-p", &p.to_string(), "-U", &q.to_string(), "-t", "2"], None);
    set_item(p);
    let (_dir, cfg) = config_file(&format!(
        "[server]\nlisten = \"127.0.0.1\"\nthreads = 2\n[[tenant]]\nname = \"t0\"\ntcp_port = {p}\nshare = 0.5\n"
    ));
    assert_refused(&["--config", &cfg], &in_use(p, "TCP"));
    let t = free_port();
    let (_dir2, cfg) = config_file(&format!(
        "[server]\nlisten = \"127.0.0.1\"\nthreads = 2\n[[tenant]]\nname = \"t0\"\ntcp_port = {t}\nudp_port = {q}\nshare = 0.5\n"
    ));
    assert_refused(&["--config", &cfg], &in_use(q, "UDP"));
    assert_item_everywhere(p);
}

fn streams_config(results: u16, stream_udp: u16, extra_server: &str) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1\"\nthreads = 2\n{extra_server}[results]\ntcp_port = {results}\n\
         [[stream]]\nname = \"words\"\nudp_port = {stream_udp}\noperator = \"wordcount\"\nwindow_ms = 50\n"
    )
}

#[test]
fn second_daemon_on_the_stream_ports_or_admin_port_is_refused() {
    let (p, r, s, a) = (free_port(), free_port(), free_port(), free_port());
    let (dir, cfg) = config_file(&streams_config(r, s, &format!("admin = \"127.0.0.1:{a}\"\n")));
    let _d = start(&["--config", &cfg, "-p", &p.to_string()], Some(dir));
    set_item(p);
    let other = || free_port().to_string();
    // The same results port / stream port / admin port in another daemon.
    let (_d1, c1) = config_file(&streams_config(r, free_port(), ""));
    assert_refused(&["--config", &c1, "-p", &other()], &in_use(r, "TCP"));
    let (_d2, c2) = config_file(&streams_config(free_port(), s, ""));
    assert_refused(&["--config", &c2, "-p", &other()], &in_use(s, "UDP"));
    assert_refused(&["-l", "127.0.0.1", "-p", &other(), "--admin", &format!("127.0.0.1:{a}")], &in_use(a, "TCP"));
    // And those ports as another daemon's KV ports (its SO_REUSEPORT group).
    assert_refused(&["-l", "127.0.0.1", "-p", &r.to_string(), "-t", "2"], &in_use(r, "TCP"));
    assert_refused(&["-l", "127.0.0.1", "-p", &other(), "-U", &s.to_string(), "-t", "2"], &in_use(s, "UDP"));
    assert_refused(&["-l", "127.0.0.1", "-p", &a.to_string(), "-t", "2"], &in_use(a, "TCP"));
    assert_item_everywhere(p);
}

/// One HTTP/1.1 request with a bearer token; (status, body).
fn http(port: u16, method: &str, path: &str, token: &str, body: &str) -> (u16, String) {
    let mut s = connect(port);
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).expect("write");
    let mut got = String::new();
    let _ = s.read_to_string(&mut got);
    let status = got.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = got.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status, body)
}

#[test]
fn admin_api_answers_409_for_a_tenant_on_another_process_port() {
    let (p, q) = (free_port(), free_port());
    let _d = start(&["-l", "127.0.0.1", "-p", &p.to_string(), "-U", &q.to_string(), "-t", "2"], None);
    set_item(p);
    let (t, a) = (free_port(), free_port());
    let (dir, cfg) = config_file(&format!(
        "[server]\nlisten = \"127.0.0.1\"\nthreads = 2\nadmin = \"127.0.0.1:{a}\"\nadmin_token = \"tok\"\n\
         [[tenant]]\nname = \"t0\"\ntcp_port = {t}\nshare = 0.25\n"
    ));
    let _tenants = start(&["--config", &cfg], Some(dir));
    let (status, body) = http(a, "PUT", "/tenants/t1", "tok", &format!("{{\"tcp_port\": {p}, \"share\": 0.25}}"));
    assert_eq!(status, 409, "{body}");
    assert!(body.contains(&in_use(p, "TCP")), "{body}");
    let (status, body) = http(
        a,
        "PUT",
        "/tenants/t2",
        "tok",
        &format!("{{\"tcp_port\": {}, \"udp_port\": {q}, \"share\": 0.25}}", free_port()),
    );
    assert_eq!(status, 409, "{body}");
    assert!(body.contains(&in_use(q, "UDP")), "{body}");
    // Nothing half-added; a free port still works.
    let (status, body) = http(a, "GET", "/tenants", "tok", "");
    assert_eq!(status, 200, "{body}");
    assert!(!body.contains("\"t1\"") && !body.contains("\"t2\""), "{body}");
    let (status, body) =
        http(a, "PUT", "/tenants/t3", "tok", &format!("{{\"tcp_port\": {}, \"share\": 0.25}}", free_port()));
    assert_eq!(status, 201, "{body}");
    assert_item_everywhere(p);
}

#[test]
fn two_daemons_starting_together_never_both_serve() {
    for round in 0..5 {
        let p = free_port().to_string();
        let args = ["-l", "127.0.0.1", "-p", p.as_str(), "-t", "4"];
        let mut a = spawn(&args);
        let mut b = spawn(&args);
        std::thread::sleep(Duration::from_millis(700));
        let alive = [a.try_wait().ok().flatten().is_none(), b.try_wait().ok().flatten().is_none()];
        for c in [&mut a, &mut b] {
            let _ = c.kill();
            let _ = c.wait();
        }
        assert!(!(alive[0] && alive[1]), "round {round}: both daemons run on port {p}");
    }
}

#[test]
fn a_streams_only_daemon_serves_its_results() {
    let (r, s) = (free_port(), free_port());
    let (dir, cfg) = config_file(&streams_config(r, s, ""));
    let d = start(&["--config", &cfg, "-p", "0"], Some(dir));
    assert!(d.status_line.contains("tcp off, udp off"), "{}", d.status_line);
    assert!(d.status_line.contains(&format!("results tcp 127.0.0.1:{r}")), "{}", d.status_line);
    let mut sub = connect(r);
    sub.write_all(b"SUBSCRIBE words\n").expect("subscribe");
    sub.set_read_timeout(Some(Duration::from_millis(50))).expect("timeout");
    let tx = UdpSocket::bind("127.0.0.1:0").expect("udp");
    let mut got = String::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut buf = [0u8; 8192];
    while !got.contains("\"hello\":2") && Instant::now() < deadline {
        tx.send_to(b"hello world hello\n", ("127.0.0.1", s)).expect("send");
        if let Ok(n) = sub.read(&mut buf) {
            got.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    }
    assert!(got.contains("\"stream\":\"words\"") && got.contains("\"hello\":2"), "{got}");
}

/// memcached 1.6.18 with `-p 0` (UDP off by default) and nothing else runs with no listener and
/// writes an empty port file (its own suite's issue_67 relies on it): so does Slipstream, saying
/// why once.
#[test]
fn nothing_configured_runs_with_no_listener_as_memcached() {
    let (dir, _) = config_file("");
    let port_file = dir.0.join("ports");
    let mut child = Command::new(bin())
        .args(["serve", "-p", "0"])
        .env("MEMCACHED_PORT_FILENAME", &port_file)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn slipstream");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !port_file.exists() && Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let running = matches!(child.try_wait(), Ok(None));
    let _ = child.kill();
    let _ = child.wait();
    let mut err = String::new();
    let _ = child.stderr.take().map(|mut e| e.read_to_string(&mut err));
    assert!(running, "exited: {err}");
    assert_eq!(std::fs::read_to_string(&port_file).expect("port file"), "", "{err}");
    assert!(err.contains("nothing to serve; running with no listener"), "{err}");
}

#[test]
fn a_shuffle_only_daemon_serves_its_port_and_metrics() {
    let (port, admin) = (free_port(), free_port());
    let blocks = std::env::temp_dir().join(format!("slipstream-ports-shuffle-{}", std::process::id()));
    let text = format!(
        "[server]\nadmin = \"127.0.0.1:{admin}\"\n[shuffle]\ntcp_port = {port}\nmemory_mb = 1\nblock_kb = 64\ndir = \"{}\"\n",
        blocks.display()
    );
    let (dir, cfg) = config_file(&text);
    let d = start(&["--config", &cfg, "-p", "0"], Some(dir));
    assert!(d.status_line.contains("tcp off, udp off"), "{}", d.status_line);
    assert!(d.status_line.contains(&format!("shuffle 127.0.0.1:{port}")), "{}", d.status_line);
    let mut c = connect(port);
    c.write_all(b"HELLO\r\n").expect("hello");
    let mut line = String::new();
    BufReader::new(&mut c).read_line(&mut line).expect("answer");
    assert!(line.starts_with("OK 1 65536 "), "{line:?}");
    let (code, body) = http(admin, "GET", "/metrics", "", "");
    assert!(code == 200 && body.contains("slipstream_shuffle_blocks_max 16\n"), "{code} {body}");
    drop(d);
    let _ = std::fs::remove_dir_all(&blocks);
}
