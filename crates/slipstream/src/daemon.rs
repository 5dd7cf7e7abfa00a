//! memcached's start-up side files and `-d`: the pid file (`-P`), the port file
//! (`MEMCACHED_PORT_FILENAME`, for `-p -1`/`-U -1`), and running in the background.
//!
//! `-d` forks before any thread exists (forking a threaded process is unsafe). Unlike a bare
//! `daemon(3)`, the parent waits until the child has bound its ports and exits with the child's
//! result, so a failed start (port in use, bad file) is still reported to whoever ran it.
//!
//! Not for: the ports themselves (slipstream-server) or privileges (privs.rs).

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::os::fd::{FromRawFd, OwnedFd};

/// The child's end of the start-up pipe: `ready` tells the waiting parent it may exit 0.
pub struct Daemon {
    pipe: std::fs::File,
    quiet: bool,
}

/// Fork into the background (memcached `-d`). Returns in the child only; the parent exits with
/// 0 once the child calls `ready`, or with the child's exit status if it stops first.
pub fn daemonize(verbose: bool) -> Result<Daemon, String> {
    let mut fds = [0i32; 2];
    // SAFETY: pipe writes two new descriptors into the array we own.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return Err(format!("cannot daemonize: pipe: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: both descriptors were just created by pipe and are owned only here.
    let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: called before the process starts any thread (main calls this first thing in
    // `serve`), so the child is an exact copy with nothing half-locked.
    match unsafe { libc::fork() } {
        -1 => Err(format!("cannot daemonize: fork: {}", std::io::Error::last_os_error())),
        0 => {
            drop(rd);
            // SAFETY: setsid has no memory effects; it detaches from the controlling terminal.
            unsafe { libc::setsid() };
            Ok(Daemon { pipe: std::fs::File::from(wr), quiet: !verbose })
        }
        child => {
            drop(wr);
            let mut buf = [0u8; 2];
            let mut pipe = std::fs::File::from(rd);
            if matches!(pipe.read(&mut buf), Ok(n) if n > 0) {
                std::process::exit(0);
            }
            let mut status = 0;
            // SAFETY: waits for our own child; status is a local we own.
            unsafe { libc::waitpid(child, &mut status, 0) };
            let code = if libc::WIFEXITED(status) { libc::WEXITSTATUS(status) } else { 71 };
            std::process::exit(if code == 0 { 71 } else { code });
        }
    }
}

impl Daemon {
    /// Started: let the parent exit, and (as memcached does unless verbose) leave the
    /// terminal: stdin/stdout/stderr to /dev/null, working directory `/`.
    pub fn ready(mut self) {
        let _ = self.pipe.write_all(b"ok");
        let _ = std::env::set_current_dir("/");
        if self.quiet {
            if let Ok(null) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/null") {
                use std::os::fd::AsRawFd;
                for fd in 0..3 {
                    // SAFETY: dup2 onto the standard descriptors; /dev/null stays open meanwhile.
                    unsafe { libc::dup2(null.as_raw_fd(), fd) };
                }
            }
        }
    }
}

/// An absolute form of `path` (the daemon changes to `/` once started, and removes its pid file
/// at exit).
pub fn absolute(path: &str) -> String {
    std::path::absolute(path).map(|p| p.display().to_string()).unwrap_or_else(|_| path.to_string())
}

/// memcached `-P`: write "PID\n" to `path` through a temporary file and a rename, so a reader
/// never sees it empty; warn (as memcached does) if it names a running process.
pub fn write_pid_file(path: &str) {
    if let Ok(old) = std::fs::read_to_string(path) {
        if let Ok(pid) = old.trim().parse::<i32>() {
            // SAFETY: kill with signal 0 only checks that the process exists.
            if pid > 0 && unsafe { libc::kill(pid, 0) } == 0 {
                eprintln!("WARNING: The pid file contained the following (running) pid: {pid}");
            }
        }
    }
    let tmp = format!("{path}.tmp");
    if let Err(e) = std::fs::write(&tmp, format!("{}\n", std::process::id())) {
        eprintln!("Could not open the pid file {tmp} for writing: {e}");
        return;
    }
    if let Err(e) = std::fs::rename(&tmp, path) {
        eprintln!("Could not rename the pid file from {tmp} to {path}: {e}");
    }
}

/// memcached's `MEMCACHED_PORT_FILENAME`: one line per bound socket, `TCP INET: PORT` (INET6
/// for IPv6), TCP first, written to `FILE.lck` and renamed to `FILE` once all are listed.
pub fn write_port_file(tcp: &[SocketAddr], udp: &[SocketAddr]) {
    let Ok(path) = std::env::var("MEMCACHED_PORT_FILENAME") else { return };
    let mut text = String::new();
    for (proto, addrs) in [("TCP", tcp), ("UDP", udp)] {
        for a in addrs {
            let fam = if a.is_ipv4() { "INET" } else { "INET6" };
            text.push_str(&format!("{proto} {fam}: {}\n", a.port()));
        }
    }
    let tmp = format!("{path}.lck");
    let written =
        std::fs::OpenOptions::new().append(true).create(true).open(&tmp).and_then(|mut f| f.write_all(text.as_bytes()));
    match written {
        Ok(()) => {
            let _ = std::fs::rename(&tmp, &path);
        }
        Err(e) => eprintln!("Failed to open \"{tmp}\": {e}"),
    }
}

/// The one start-up notice for memcached flags accepted without effect.
pub fn no_effect_notice(flags: &[String]) -> Option<String> {
    (!flags.is_empty()).then(|| {
        format!(
            "slipstream: note: memcached option(s) {} accepted but have no effect here (Slipstream has no slab allocator, segmented LRU or hash table to tune)",
            flags.join(", ")
        )
    })
}
