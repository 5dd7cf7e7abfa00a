//! Helpers shared by the daemon's integration tests: root check, the `ip` command, the XDP_PASS
//! object for the client side, the two-namespace veth pair the namespace tests use (and
//! [`Pair`], which deletes it on drop, so a failed test still leaves nothing behind), running
//! code inside a namespace, reading a spawned daemon's status line, and one TCP request/reply.
//!
//! Not for: what runs on the topology.

// Each test binary includes this module and uses a different subset of it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command};
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
        let p = Pair { srv: format!("{prefix}srv{id}"), cli: format!("{prefix}cli{id}"), srv_dev: format!("{prefix}s{id}") };
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
