//! Helpers shared by the daemon's integration tests (the one Rust home for them; Python's are
//! tests/daemonlib.py and tests/mcwire.py): root check, the `ip` command, the XDP_PASS object for
//! the client side, the two-namespace veth pair the namespace tests use (and [`Pair`], which
//! deletes it on drop, so a failed test still leaves nothing behind), running code inside a
//! namespace, the daemon launcher ([`Daemon`]: spawn, status line, bounded SIGTERM stop), the
//! memcached UDP client ([`UdpClient`]), and one TCP request/reply.
//!
//! Not for: what runs on the topology.

// Each test binary includes this module and uses a different subset of it.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub fn root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

pub fn ip(args: &[&str]) -> Result<String, String> {
    let out = Command::new("ip").args(args).output().map_err(|e| format!("ip {args:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!("ip {} failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The XDP_PASS object the fastpath crate's build script compiled (newest if several).
pub fn pass_object() -> std::path::PathBuf {
    let bin = std::path::PathBuf::from(env!("CARGO_BIN_EXE_slipstream"));
    let build = bin.parent().expect("binary has a directory").join("build");
    let mut best: Option<(std::time::SystemTime, std::path::PathBuf)> = None;
    for e in std::fs::read_dir(&build).expect("target build directory").flatten() {
        if !e.file_name().to_string_lossy().starts_with("slipstream-fastpath-") {
            continue;
        }
        let p = e.path().join("out/xdp_pass.o");
        if let Ok(m) = std::fs::metadata(&p).and_then(|m| m.modified()) {
            if best.as_ref().map(|(t, _)| m > *t).unwrap_or(true) {
                best = Some((m, p));
            }
        }
    }
    best.map(|(_, p)| p).unwrap_or_else(|| panic!("no xdp_pass.o under {}", build.display()))
}

/// Run `f` on a thread inside network namespace `ns` (threads it spawns stay there too).
pub fn in_ns<R: Send + 'static>(ns: &str, f: impl FnOnce() -> R + Send + 'static) -> R {
    let path = format!("/var/run/netns/{ns}");
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"));
        use std::os::fd::AsRawFd;
        // SAFETY: setns moves only this thread into the namespace the fd refers to; the fd is
        // open for the duration of the call.
        let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns into {path}: {}", std::io::Error::last_os_error());
        f()
    })
    .join()
    .unwrap_or_else(|p| std::panic::resume_unwind(p))
}

/// One end of the veth pair: namespace, device, IPv4 address (/24), optional IPv6 (/64).
pub struct End<'a> {
    pub ns: &'a str,
    pub dev: &'a str,
    pub v4: &'a str,
    pub v6: Option<&'a str>,
}

/// Creates namespaces `srv.ns` and `cli.ns` joined by a veth pair, addresses and loopback up,
/// and an XDP_PASS program on the client's end: a veth delivers the XDP_TX frames of its peer
/// (the kernel fast path's answers) only when it has an XDP program itself. The caller deletes
/// both namespaces (which removes the pair), also when this fails part-way.
pub fn veth_namespaces(srv: &End<'_>, cli: &End<'_>) -> Result<(), String> {
    ip(&["netns", "add", srv.ns])?;
    ip(&["netns", "add", cli.ns])?;
    ip(&["link", "add", srv.dev, "type", "veth", "peer", "name", cli.dev])?;
    for e in [srv, cli] {
        ip(&["link", "set", e.dev, "netns", e.ns])?;
        ip(&["-n", e.ns, "link", "set", "lo", "up"])?;
        ip(&["-n", e.ns, "addr", "add", &format!("{}/24", e.v4), "dev", e.dev])?;
        if let Some(v6) = e.v6 {
            ip(&["-n", e.ns, "-6", "addr", "add", &format!("{v6}/64"), "dev", e.dev, "nodad"])?;
        }
        ip(&["-n", e.ns, "link", "set", e.dev, "up"])?;
    }
    let obj = pass_object();
    ip(&["-n", cli.ns, "link", "set", "dev", cli.dev, "xdpdrv", "obj", &obj.to_string_lossy(), "sec", "xdp"])?;
    Ok(())
}

/// Server and client namespaces joined by a veth pair with IPv4 addresses (see
/// [`veth_namespaces`]), named from `prefix` and the process id; both deleted on drop.
pub struct Pair {
    pub srv: String,
    pub cli: String,
    /// The server's end of the veth pair (where XDP attaches).
    pub srv_dev: String,
}

impl Pair {
    /// Panics with the reason if the set-up fails (after deleting what it made).
    pub fn new(prefix: &str, v4_srv: &str, v4_cli: &str) -> Pair {
        let id = std::process::id() % 100_000;
        let p = Pair {
            srv: format!("{prefix}srv{id}"),
            cli: format!("{prefix}cli{id}"),
            srv_dev: format!("{prefix}s{id}"),
        };
        let cli_dev = format!("{prefix}c{id}");
        let srv = End { ns: &p.srv, dev: &p.srv_dev, v4: v4_srv, v6: None };
        let cli = End { ns: &p.cli, dev: &cli_dev, v4: v4_cli, v6: None };
        if let Err(e) = veth_namespaces(&srv, &cli) {
            panic!("topology setup: {e}");
        }
        p
    }

    /// Is an XDP program attached to the server's end?
    pub fn srv_has_xdp(&self) -> bool {
        ip(&["-n", &self.srv, "link", "show", &self.srv_dev]).map(|s| s.contains("xdp")).unwrap_or(false)
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        // Deleting a namespace removes the veth pair with it.
        let _ = ip(&["netns", "del", &self.srv]);
        let _ = ip(&["netns", "del", &self.cli]);
    }
}

/// The first line a spawned daemon prints on stdout (its status line), waiting at most `wait`;
/// empty if none came. A thread keeps draining stdout afterwards so the daemon never blocks on a
/// full pipe. `child` must have been spawned with `stdout(Stdio::piped())`.
pub fn status_line(child: &mut Child, wait: Duration) -> String {
    let Some(stdout) = child.stdout.take() else { return String::new() };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut r = BufReader::new(stdout);
        let mut line = String::new();
        let _ = r.read_line(&mut line);
        let _ = tx.send(line);
        let mut sink = Vec::new();
        let _ = r.read_to_end(&mut sink);
    });
    rx.recv_timeout(wait).unwrap_or_default()
}

/// Writes `req` and reads until the reply ends with `end` (or 5 s pass, or the peer closes).
pub fn ask(s: &mut TcpStream, req: &[u8], end: &[u8]) -> Vec<u8> {
    s.write_all(req).expect("write");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(5);
    while !got.ends_with(end) && Instant::now() < deadline {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    got
}

/// Stderr kept from a daemon for failure messages.
const DAEMON_STDERR_BYTES_MAX: usize = 64 * 1024;

/// A `slipstream serve` spawned by a test (in a network namespace or not): killed on drop.
pub struct Daemon {
    child: Option<Child>,
    /// Its status line (the first line on stdout), empty if none came in time.
    pub status: String,
    stderr: Arc<Mutex<String>>,
}

impl Daemon {
    /// Spawns `slipstream serve ARGS` (inside namespace `ns` when given) and waits at most
    /// `wait` for its status line. Stderr is echoed with a `[daemon]` prefix and kept (bounded)
    /// for [`Daemon::stderr_text`].
    pub fn start(ns: Option<&str>, args: &[&str], wait: Duration) -> Daemon {
        let bin = env!("CARGO_BIN_EXE_slipstream");
        let mut cmd = match ns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, bin]);
                c
            }
            None => Command::new(bin),
        };
        let mut child = cmd
            .arg("serve")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn slipstream");
        let stderr = Arc::new(Mutex::new(String::new()));
        if let Some(err) = child.stderr.take() {
            let sink = stderr.clone();
            std::thread::spawn(move || {
                // Bounded by the daemon's life: ends at EOF when it exits.
                for line in BufReader::new(err).lines().map_while(Result::ok) {
                    eprintln!("[daemon] {line}");
                    let mut s = sink.lock().unwrap_or_else(|p| p.into_inner());
                    if s.len() < DAEMON_STDERR_BYTES_MAX {
                        s.push_str(&line);
                        s.push('\n');
                    }
                }
            });
        }
        let status = status_line(&mut child, wait);
        Daemon { child: Some(child), status, stderr }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn stderr_text(&self) -> String {
        self.stderr.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// SIGTERM and wait at most `wait` for the exit (then SIGKILL); whether it exited 0.
    pub fn stop(&mut self, wait: Duration) -> bool {
        let Some(mut child) = self.child.take() else { return false };
        // SAFETY: kill sends a signal to the pid of a child we spawned and have not reaped.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + wait;
        while Instant::now() < deadline {
            if let Ok(Some(st)) = child.try_wait() {
                return st.success();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        false
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// One memcached UDP request frame: request id, sequence 0, 1 datagram, reserved.
pub fn udp_frame(rid: u16, req: &[u8]) -> Vec<u8> {
    let mut frame = rid.to_be_bytes().to_vec();
    frame.extend_from_slice(&[0, 0, 0, 1, 0, 0]);
    frame.extend_from_slice(req);
    frame
}

/// A memcached UDP client: one socket, a fresh request id per request, replies reassembled.
pub struct UdpClient {
    pub sock: UdpSocket,
    rid: u16,
}

impl UdpClient {
    /// Binds `local` (port 0 for any); reads poll every `poll` until a request's timeout.
    pub fn bind(local: SocketAddr, poll: Duration) -> UdpClient {
        let sock = UdpSocket::bind(local).expect("bind client UDP socket");
        sock.set_read_timeout(Some(poll)).expect("read timeout");
        UdpClient { sock, rid: 0 }
    }

    /// Sends `req` to `dst` as one datagram and collects reply messages until `done` says the
    /// reply is complete; None after `timeout`.
    pub fn query(
        &mut self,
        dst: SocketAddr,
        req: &[u8],
        done: impl Fn(&str) -> bool,
        timeout: Duration,
    ) -> Option<String> {
        self.rid = self.rid.wrapping_add(1).max(1);
        self.sock.send_to(&udp_frame(self.rid, req), dst).expect("udp send");
        udp_collect(&self.sock, self.rid, done, timeout)
    }

    /// One request whose reply is one message (any number of datagrams).
    pub fn ask(&mut self, dst: SocketAddr, req: &[u8], timeout: Duration) -> Option<String> {
        self.query(dst, req, |_| true, timeout)
    }
}

/// Reassembles the reply to request `rid`: messages (each `total` datagrams by `seq`) appended
/// in arrival order until `done(text)`; datagrams of other requests (late replies) are skipped.
pub fn udp_collect(sock: &UdpSocket, rid: u16, done: impl Fn(&str) -> bool, timeout: Duration) -> Option<String> {
    let deadline = Instant::now() + timeout;
    let mut acc = String::new();
    let mut parts: HashMap<u16, Vec<u8>> = HashMap::new();
    let mut buf = [0u8; 2048];
    while Instant::now() < deadline {
        let Ok(n) = sock.recv(&mut buf) else { continue };
        if n < 8 || u16::from_be_bytes([buf[0], buf[1]]) != rid {
            continue;
        }
        let seq = u16::from_be_bytes([buf[2], buf[3]]);
        let total = u16::from_be_bytes([buf[4], buf[5]]).max(1);
        parts.insert(seq, buf[8..n].to_vec());
        if parts.len() >= usize::from(total) {
            for i in 0..total {
                if let Some(p) = parts.get(&i) {
                    acc.push_str(&String::from_utf8_lossy(p));
                }
            }
            parts.clear();
            if done(&acc) {
                return Some(acc);
            }
        }
    }
    None
}
