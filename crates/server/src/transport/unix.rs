//! The unix-domain listening socket (`-s <path>`, `-a <mode>`), bound the way memcached's
//! `server_socket_unix` does: a stale socket file at the path is removed, any other file is
//! left alone (and the bind fails), and the socket is created with the given permission bits.
//!
//! Not for: accepting (the network loop), or TCP/UDP (`bind`).

use std::io;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixListener;

/// Where and how to listen on a unix socket.
#[derive(Clone, Debug)]
pub struct UnixSpec {
    pub path: String,
    /// Permission bits of the socket file (memcached `-a`, default 0700).
    pub mode: u32,
    pub backlog: i32,
}

/// Bind and listen (non-blocking).
pub fn bind(spec: &UnixSpec) -> io::Result<UnixListener> {
    if let Ok(meta) = std::fs::symlink_metadata(&spec.path) {
        if meta.file_type().is_socket() {
            // A previous run's socket: nothing listens on a path twice.
            std::fs::remove_file(&spec.path)?;
        }
    }
    let sock = socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::STREAM, None)?;
    let addr = socket2::SockAddr::unix(&spec.path)?;
    // The mode comes from the umask at bind time (as memcached does); this runs at start-up,
    // before the worker threads exist.
    // SAFETY: umask only swaps the process's file-creation mask; it cannot fail.
    let old = unsafe { libc::umask(!(spec.mode & 0o777) as libc::mode_t & 0o777) };
    let bound = sock.bind(&addr);
    // SAFETY: as above; restores the mask.
    unsafe { libc::umask(old) };
    bound?;
    sock.listen(spec.backlog)?;
    sock.set_nonblocking(true)?;
    Ok(sock.into())
}
