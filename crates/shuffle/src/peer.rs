//! The cross-host path (issue 17): when map tasks ran on other hosts, their segments sit in
//! those hosts' daemons. A reducer still asks only its own daemon (LOOKUP); that daemon asks
//! each of its `[shuffle] peers` with FETCH and answers with copies in blocks of its own pool,
//! so the JVM reads every segment the same way, mapped in place.
//!
//! Neither side copies the bytes through user space: the sender writes each segment with
//! sendfile(2) straight from the block file's tmpfs pages to the socket, the receiver moves them
//! with splice(2) from the socket through a pipe into its block file. (Only the bytes that the
//! header line reader happened to buffer are written with one pwrite.)
//!
//! A daemon keeps its connections to a peer open between FETCHes (an answer ends at END, so
//! the connection is ready for the next) in [`PeerConns`]: a LOOKUP does not connect to every
//! peer again, nor the peer start a thread for each. A kept connection the peer has closed
//! (idle timeout, restart) fails at once; that FETCH is asked again once on a new connection.
//!
//! Not for: which segments exist (crate::registry), the wire format (crate::proto), or the
//! choice of peers (the operator lists them; Spark's own scheduler decides where tasks run).

use crate::proto::{self, Record, LINE_BYTES_MAX};
use crate::registry::Found;
use crate::ShuffleError;
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Most bytes one splice call moves: a pipe's default capacity (16 pages).
const SPLICE_CHUNK_BYTES: usize = 64 * 1024;

/// The cross-host counters, exported by the service's metrics.
#[derive(Debug, Default)]
pub struct PeerCounts {
    pub fetches: AtomicU64,
    pub fetch_errors: AtomicU64,
    pub bytes_received: AtomicU64,
    pub bytes_sent: AtomicU64,
    pub connections_opened: AtomicU64,
}

impl PeerCounts {
    /// (name, kind, help, value) rows for the Prometheus exposition.
    pub fn rows(&self) -> [(&'static str, &'static str, &'static str, u64); 5] {
        let v = |c: &AtomicU64| c.load(Ordering::Relaxed);
        [
            ("peer_fetches_total", "counter", "FETCH requests this daemon sent to its peers", v(&self.fetches)),
            (
                "peer_fetch_errors_total",
                "counter",
                "FETCHes that failed (peer down, timeout, bad answer, pool full); their segments are left out",
                v(&self.fetch_errors),
            ),
            (
                "peer_bytes_received_total",
                "counter",
                "Segment bytes received from peers (splice)",
                v(&self.bytes_received),
            ),
            ("peer_bytes_sent_total", "counter", "Segment bytes sent to peers (sendfile)", v(&self.bytes_sent)),
            (
                "peer_connections_opened_total",
                "counter",
                "TCP connections this daemon opened to its peers (kept open and reused across FETCHes)",
                v(&self.connections_opened),
            ),
        ]
    }
}

/// Sends a FETCH answer for `found` (pinned by the caller until this returns): the header
/// lines by write, each segment's bytes by sendfile from its block file (`path_of`).
pub fn send_answer(sock: &mut TcpStream, found: &[Found], path_of: &dyn Fn(u32) -> PathBuf) -> std::io::Result<u64> {
    // Corked: each record line goes out in one packet with its segment's first bytes, not in
    // a packet of its own (with TCP_NODELAY it would); uncorking sends the rest at once.
    set_cork(sock, true)?;
    let sent = send_corked(sock, found, path_of);
    set_cork(sock, false)?;
    sent
}

fn send_corked(sock: &mut TcpStream, found: &[Found], path_of: &dyn Fn(u32) -> PathBuf) -> std::io::Result<u64> {
    let mut head = String::new();
    proto::data_head(&mut head, found.len());
    sock.write_all(head.as_bytes())?;
    let mut open: Option<(u32, File)> = None;
    let mut sent = 0u64;
    for f in found {
        if open.as_ref().is_none_or(|(id, _)| *id != f.block) {
            open = Some((f.block, File::open(path_of(f.block))?));
        }
        head.clear();
        proto::record(&mut head, &Record { map: f.map, attempt: f.attempt, length: f.length });
        sock.write_all(head.as_bytes())?;
        if let Some((_, file)) = &open {
            sendfile_all(sock.as_raw_fd(), file.as_raw_fd(), u64::from(f.offset), f.length as usize)?;
        }
        sent += u64::from(f.length);
    }
    sock.write_all(proto::END)?;
    Ok(sent)
}

fn set_cork(sock: &TcpStream, on: bool) -> std::io::Result<()> {
    let v: libc::c_int = on.into();
    // SAFETY: the socket is open for the call; `v` is a live c_int of the size passed.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CORK,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn sendfile_all(sock: RawFd, file: RawFd, offset: u64, len: usize) -> std::io::Result<()> {
    let mut off = libc::off_t::try_from(offset).map_err(|_| std::io::ErrorKind::InvalidInput)?;
    let mut left = len;
    while left > 0 {
        // SAFETY: both descriptors are open for the call (owned by the caller); `off` is a
        // valid off_t the kernel advances.
        let n = unsafe { libc::sendfile(sock, file, &mut off, left) };
        match n {
            n if n > 0 => left -= n as usize,
            0 => {
                return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "block file ends inside a segment"))
            }
            _ => {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

/// Why a FETCH brought nothing usable.
#[derive(Debug)]
pub enum FetchError {
    Io(std::io::Error),
    /// The peer's answer was not a FETCH answer (an error line, a record longer than a block).
    Answer(ShuffleError),
    /// This daemon could not take the bytes (its pool is full).
    Local(ShuffleError),
}

impl std::fmt::Display for FetchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FetchError::Io(e) => write!(f, "{e}"),
            FetchError::Answer(e) => write!(f, "bad answer: {e}"),
            FetchError::Local(e) => write!(f, "{e}"),
        }
    }
}

impl From<std::io::Error> for FetchError {
    fn from(e: std::io::Error) -> Self {
        FetchError::Io(e)
    }
}

/// What one FETCH left behind: the segments received (in the peer's order), the copy blocks
/// allocated for them (the caller releases them if it drops the segments), and the outcome.
pub struct Fetched {
    pub found: Vec<Found>,
    pub blocks: Vec<u32>,
    pub result: Result<u64, FetchError>,
}

/// What a fetch needs to know of this daemon.
pub struct FetchLimits {
    pub timeout: Duration,
    pub block_bytes: usize,
    pub records_max: usize,
}

/// Most idle connections kept per peer (about the reduce tasks of this host running at once).
const IDLE_CONNECTIONS_PER_PEER_MAX: usize = 16;

/// The connections to the peers that no FETCH is using, kept for the next.
#[derive(Default)]
pub struct PeerConns {
    idle: Mutex<HashMap<SocketAddr, Vec<BufReader<TcpStream>>>>,
}

impl PeerConns {
    fn take(&self, peer: SocketAddr) -> Option<BufReader<TcpStream>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).get_mut(&peer).and_then(Vec::pop)
    }

    fn put(&self, peer: SocketAddr, conn: BufReader<TcpStream>) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let list = idle.entry(peer).or_default();
        if list.len() < IDLE_CONNECTIONS_PER_PEER_MAX {
            list.push(conn);
        }
    }
}

/// A connection to `peer` whose connect, reads and writes each give up after `timeout` (also
/// crate::forward's).
pub(crate) fn connect(peer: SocketAddr, timeout: Duration) -> std::io::Result<BufReader<TcpStream>> {
    let sock = TcpStream::connect_timeout(&peer, timeout)?;
    sock.set_read_timeout(Some(timeout))?;
    sock.set_write_timeout(Some(timeout))?;
    sock.set_nodelay(true)?;
    Ok(BufReader::new(sock))
}

/// Asks `peer` for reduce partition `reduce` of (app, shuffle) and stores each segment in a
/// copy block from `alloc` (id and file), packing segments while they fit. On a kept
/// connection from `conns` if there is one (asked again once on a new connection if that one
/// turns out closed); the connection is kept again after a whole answer.
pub fn fetch(
    conns: &PeerConns,
    counts: &PeerCounts,
    peer: SocketAddr,
    limits: &FetchLimits,
    request: (&str, u32, u32),
    alloc: &mut dyn FnMut() -> Result<(u32, PathBuf), ShuffleError>,
) -> Fetched {
    let mut out = Fetched { found: Vec::new(), blocks: Vec::new(), result: Ok(0) };
    let mut kept = conns.take(peer);
    loop {
        let reused = kept.is_some();
        let fresh = || {
            let c = connect(peer, limits.timeout)?;
            counts.connections_opened.fetch_add(1, Ordering::Relaxed);
            Ok(c)
        };
        let mut conn = match kept.take().map_or_else(fresh, Ok) {
            Ok(c) => c,
            Err(e) => {
                out.result = Err(FetchError::Io(e));
                return out;
            }
        };
        out.result = fetch_into(&mut conn, limits, request, alloc, &mut out.found, &mut out.blocks);
        match &out.result {
            Ok(_) => conns.put(peer, conn),
            // A kept connection the peer closed meanwhile: EOF or a reset, at once (a timeout
            // is a peer that is there but slow: not asked twice). Blocks allocated by the
            // failed try are in `out.blocks` for the caller to release.
            Err(FetchError::Io(e)) if reused && !matches!(e.kind(), ErrorKind::TimedOut | ErrorKind::WouldBlock) => {
                out.found.clear();
                continue;
            }
            Err(_) => {}
        }
        return out;
    }
}

fn fetch_into(
    r: &mut BufReader<TcpStream>,
    limits: &FetchLimits,
    (app, shuffle, reduce): (&str, u32, u32),
    alloc: &mut dyn FnMut() -> Result<(u32, PathBuf), ShuffleError>,
    found: &mut Vec<Found>,
    blocks: &mut Vec<u32>,
) -> Result<u64, FetchError> {
    r.get_mut().write_all(format!("FETCH {app} {shuffle} {reduce}\r\n").as_bytes())?;
    let mut line = Vec::with_capacity(LINE_BYTES_MAX);
    read_line(r, &mut line)?;
    let n = proto::parse_data_head(&line).map_err(FetchError::Answer)?;
    if n > limits.records_max {
        return Err(FetchError::Answer(ShuffleError::Limit {
            what: "records in one FETCH answer",
            max: limits.records_max,
        }));
    }
    let pipe = Pipe::new()?;
    let mut block: Option<(u32, File, usize)> = None;
    let mut received = 0u64;
    for _ in 0..n {
        read_line(r, &mut line)?;
        let rec = proto::parse_record(&line).map_err(FetchError::Answer)?;
        let len = rec.length as usize;
        if len > limits.block_bytes {
            return Err(FetchError::Answer(ShuffleError::BadSegment(format!("{len} bytes, more than a block"))));
        }
        if block.as_ref().is_none_or(|(_, _, used)| used + len > limits.block_bytes) {
            let (id, path) = alloc().map_err(FetchError::Local)?;
            blocks.push(id);
            block = Some((id, OpenOptions::new().write(true).open(path)?, 0));
        }
        let Some((id, file, used)) = block.as_mut() else { continue };
        recv_into(r, &pipe, file, *used as u64, len)?;
        // The file id is the receiving daemon's to add (its pool's; crate::server).
        found.push(Found {
            map: rec.map,
            attempt: rec.attempt,
            block: *id,
            offset: *used as u32,
            length: rec.length,
            file: 0,
        });
        *used += len;
        received += len as u64;
    }
    read_line(r, &mut line)?;
    if line != proto::END {
        return Err(FetchError::Answer(ShuffleError::Syntax("FETCH answer without END".into())));
    }
    Ok(received)
}

/// One answer line (crate::forward's too); a closed stream or an overlong line is an error.
pub(crate) fn read_line(r: &mut BufReader<TcpStream>, line: &mut Vec<u8>) -> std::io::Result<()> {
    line.clear();
    let n = Read::take(&mut *r, LINE_BYTES_MAX as u64).read_until(b'\n', line)?;
    if n == 0 || line.last() != Some(&b'\n') {
        return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "peer closed or sent a line too long"));
    }
    Ok(())
}

/// Moves `len` bytes of the stream into `file` at `offset`: what the line reader already
/// buffered by pwrite, the rest socket → pipe → file by splice.
fn recv_into(r: &mut BufReader<TcpStream>, pipe: &Pipe, file: &File, offset: u64, len: usize) -> std::io::Result<()> {
    let buffered = r.buffer();
    let k = buffered.len().min(len);
    file.write_all_at(&buffered[..k], offset)?;
    r.consume(k);
    let sock = r.get_ref().as_raw_fd();
    let mut at = libc::loff_t::try_from(offset + k as u64).map_err(|_| std::io::ErrorKind::InvalidInput)?;
    let mut left = len - k;
    while left > 0 {
        let n = splice(sock, None, pipe.write.as_raw_fd(), left.min(SPLICE_CHUNK_BYTES))?;
        if n == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "peer closed inside a segment"));
        }
        let mut moved = 0;
        while moved < n {
            moved += splice(pipe.read.as_raw_fd(), Some(&mut at), file.as_raw_fd(), n - moved)?;
        }
        left -= n;
    }
    Ok(())
}

/// One splice call, retried on EINTR. `off_out` is the file offset when the output is a file
/// (advanced by the kernel); `None` for a pipe or socket.
fn splice(from: RawFd, off_out: Option<&mut libc::loff_t>, to: RawFd, len: usize) -> std::io::Result<usize> {
    let off = off_out.map_or(std::ptr::null_mut(), |o| o as *mut libc::loff_t);
    loop {
        // SAFETY: both descriptors are open for the call; `off` is null or points at a live
        // loff_t the kernel advances; no user memory is read or written.
        let n = unsafe { libc::splice(from, std::ptr::null_mut(), to, off, len, libc::SPLICE_F_MOVE) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
}

impl Pipe {
    fn new() -> std::io::Result<Pipe> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: `fds` is a valid array of two ints for pipe2 to fill.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: pipe2 succeeded, so both are open descriptors that nothing else owns.
        Ok(unsafe { Pipe { read: OwnedFd::from_raw_fd(fds[0]), write: OwnedFd::from_raw_fd(fds[1]) } })
    }
}
