//! The admin endpoint's HTTP/1.1 server: hyper 1.x on a tokio current-thread runtime that runs
//! on the endpoint's own thread (off the hot path; the serving threads never see it).
//!
//! hyper does the protocol: request-line and header parsing, `Content-Length`/chunked framing,
//! writing replies, the header read timeout. This file holds the limits and what hyper does
//! not do for us:
//! - one request per connection (`Connection: close`), each connection a task, at most
//!   [`CONNECTIONS_MAX`] at once. At the cap the oldest connection that has not finished its
//!   request head is closed to make room, so idle or slowloris clients can never lock out a
//!   liveness probe; only when every slot holds a request in progress (each bounded by
//!   [`REQUEST_TIMEOUT_MS`]) is a newcomer answered 503.
//! - a request head must be complete [`HEADER_READ_TIMEOUT_MS`] after accept (else the
//!   connection is closed; 408 when part of a head came), the body within
//!   [`REQUEST_TIMEOUT_MS`] of accept (408), the reply written within [`REPLY_TIMEOUT_MS`] more.
//! - linger-close: after replying we read and discard (bounded) what the client still sends,
//!   so the kernel does not answer unread bytes with a reset that destroys the reply in flight
//!   (e.g. a 413 sent before the oversized body was read).
//!
//! Not for: routes, auth or reply bodies (mod.rs), metrics text (metrics.rs).

use super::{authorize_and_route, body_len, dispatch, framing, origin_path, Reply, Shared};
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::io;
use std::net::{Shutdown, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::time::Instant;

/// Largest request head (request line plus headers) we read; hyper's smallest buffer bound.
pub const REQUEST_BYTES_MAX: usize = 8 * 1024;
/// Header lines in one request (more is a 431).
pub const HEADERS_MAX: usize = 64;
/// How long after accept a client may take to send its whole request head. Idle connections
/// are closed when it passes.
pub const HEADER_READ_TIMEOUT_MS: u64 = 2000;
/// How long after accept a client may take to send its whole request (head and body).
pub const REQUEST_TIMEOUT_MS: u64 = 2000;
/// How long writing a reply may take on top, for a client that does not read.
pub const REPLY_TIMEOUT_MS: u64 = 2000;
/// Connections held at once (beyond it the oldest idle one is closed, see the module doc).
pub const CONNECTIONS_MAX: usize = 1024;
/// After replying we read and discard at most this much of what the client is still sending...
pub const DRAIN_BYTES_MAX: usize = 64 * 1024;
/// ... and for at most this long.
pub const DRAIN_TIMEOUT_MS: u64 = 200;
/// Listen backlog: a burst of connections (up to the cap) waits in the kernel instead of having
/// its SYNs dropped (which costs a client, e.g. a liveness probe, a 1 s retransmit).
const LISTEN_BACKLOG: i32 = 1024;
/// Pause after a failed accept (e.g. out of descriptors) when no idle connection can be closed.
const ACCEPT_BACKOFF_MS: u64 = 10;

/// The limits in force; [`Limits::default`] is the constants above (tests shrink them).
#[derive(Clone, Copy, Debug)]
pub(super) struct Limits {
    pub header_read_timeout_ms: u64,
    pub request_timeout_ms: u64,
    pub reply_timeout_ms: u64,
    pub connections_max: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            header_read_timeout_ms: HEADER_READ_TIMEOUT_MS,
            request_timeout_ms: REQUEST_TIMEOUT_MS,
            reply_timeout_ms: REPLY_TIMEOUT_MS,
            connections_max: CONNECTIONS_MAX,
        }
    }
}

/// Bind now (so the caller learns of a taken port), then serve on the thread "slipstream-admin".
pub(super) fn start(addr: SocketAddr, shared: Arc<Shared>, limits: Limits) -> io::Result<SocketAddr> {
    // The one rule every Slipstream port is opened by (exclusive to this process, non-blocking).
    let kind = slipstream_bind::Kind::Tcp { backlog: LISTEN_BACKLOG };
    let socket = slipstream_bind::bind_one(kind, addr, &|_| Ok(())).map_err(|e| e.source)?;
    let listener: std::net::TcpListener = socket.into();
    let local = listener.local_addr()?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_io().enable_time().build()?;
    std::thread::Builder::new()
        .name("slipstream-admin".into())
        .spawn(move || rt.block_on(accept_loop(listener, shared, limits)))?;
    Ok(local)
}

/// Never returns once listening: errors on one connection (or on accept) are answered or
/// dropped, then the loop goes on.
async fn accept_loop(listener: std::net::TcpListener, shared: Arc<Shared>, limits: Limits) {
    let listener = match TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("slipstream: admin endpoint cannot listen: {e}");
            return;
        }
    };
    let conns = Arc::new(Registry::default());
    let mut next_id = 0u64;
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(_) => {
                // EMFILE and friends: free a descriptor held by an idle client, else back off.
                if conns.evict_oldest_idle(&shared) {
                    tokio::task::yield_now().await;
                } else {
                    tokio::time::sleep(Duration::from_millis(ACCEPT_BACKOFF_MS)).await;
                }
                continue;
            }
        };
        shared.counters.connections.fetch_add(1, Ordering::Relaxed);
        if conns.len() >= limits.connections_max && !conns.evict_oldest_idle(&shared) {
            shared.counters.busy.fetch_add(1, Ordering::Relaxed);
            refuse_busy(&stream);
            continue;
        }
        next_id += 1;
        let ctl = conns.insert(next_id);
        let registered = Registered { id: next_id, conns: conns.clone() };
        tokio::spawn(connection(stream, shared.clone(), ctl, registered, limits));
    }
}

/// One connection's control block, shared by its task and the accept loop.
struct ConnCtl {
    /// True until the request head has been parsed: the connection may be closed to make room.
    idle: AtomicBool,
    /// Tells the task it was evicted.
    cancel: Notify,
}

/// The connections being served, oldest first (ids grow with accept order).
#[derive(Default)]
struct Registry {
    conns: Mutex<BTreeMap<u64, Arc<ConnCtl>>>,
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Arc<ConnCtl>>> {
        // The map stays consistent even if a holder panicked (each update is one call).
        self.conns.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn len(&self) -> usize {
        self.lock().len()
    }

    fn insert(&self, id: u64) -> Arc<ConnCtl> {
        let ctl = Arc::new(ConnCtl { idle: AtomicBool::new(true), cancel: Notify::new() });
        self.lock().insert(id, ctl.clone());
        ctl
    }

    /// Close the oldest connection still without a request head; false when there is none.
    /// It leaves the registry at once, so its slot is free before its task has run.
    fn evict_oldest_idle(&self, shared: &Shared) -> bool {
        let mut map = self.lock();
        let Some(id) = map.iter().find(|(_, c)| c.idle.load(Ordering::Acquire)).map(|(&id, _)| id) else {
            return false;
        };
        if let Some(ctl) = map.remove(&id) {
            ctl.cancel.notify_one();
        }
        shared.counters.evicted.fetch_add(1, Ordering::Relaxed);
        true
    }
}

/// Removes a connection from the registry when its task ends (also if it panics).
struct Registered {
    id: u64,
    conns: Arc<Registry>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.conns.lock().remove(&self.id);
    }
}

fn http1_builder(limits: &Limits) -> http1::Builder {
    let mut b = http1::Builder::new();
    b.timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(limits.header_read_timeout_ms))
        .keep_alive(false)
        // A client may half-close after its request and still read the reply.
        .half_close(true)
        .title_case_headers(true)
        .max_buf_size(REQUEST_BYTES_MAX)
        .max_headers(HEADERS_MAX);
    b
}

/// Serve one connection: one request, one reply, linger-close; every phase under a deadline.
async fn connection(stream: TcpStream, shared: Arc<Shared>, ctl: Arc<ConnCtl>, registered: Registered, limits: Limits) {
    let _registered = registered;
    let _ = stream.set_nodelay(true);
    let deadline = Instant::now() + Duration::from_millis(limits.request_timeout_ms);
    let io = Arc::new(Io { stream, read_bytes: AtomicU64::new(0), written_bytes: AtomicU64::new(0) });
    let service = {
        let (shared, ctl) = (shared.clone(), ctl.clone());
        service_fn(move |req| {
            let (shared, ctl) = (shared.clone(), ctl.clone());
            async move { Ok::<_, Infallible>(handle(&shared, &ctl, req, deadline).await) }
        })
    };
    let conn = http1_builder(&limits).serve_connection(TokioIo::new(IoRef(io.clone())), service);
    let hard_stop = deadline + Duration::from_millis(limits.reply_timeout_ms);
    let outcome = tokio::select! {
        r = tokio::time::timeout_at(hard_stop, conn) => r,
        _ = ctl.cancel.notified() => return,
    };
    match outcome {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            if e.is_timeout() {
                shared.counters.timeouts.fetch_add(1, Ordering::Relaxed);
            }
            answer_failed_head(&io, &e);
        }
        Err(_) => {
            // Reply not taken in time: drop the connection, nothing more to say.
            shared.counters.timeouts.fetch_add(1, Ordering::Relaxed);
            return;
        }
    }
    linger_close(&io).await;
}

/// hyper closes without a word when the head timed out or the client closed inside it; when
/// part of a head came and nothing was answered yet, say why (408 / 400) before closing.
fn answer_failed_head(io: &Io, e: &hyper::Error) {
    if io.read_bytes.load(Ordering::Relaxed) == 0 || io.written_bytes.load(Ordering::Relaxed) != 0 {
        return;
    }
    let reply = if e.is_timeout() {
        Reply::error(408, "request not received in time")
    } else if e.is_incomplete_message() {
        Reply::error(400, "connection closed inside the request head")
    } else {
        return;
    };
    let _ = io.stream.try_write(&raw_reply(&reply));
}

/// A whole reply as bytes, for the two places hyper cannot write one for us (a failed head
/// above, and the 503 from the accept loop); both fit a socket buffer, so one non-blocking
/// write is enough.
fn raw_reply(r: &Reply) -> Vec<u8> {
    let reason = StatusCode::from_u16(r.status).ok().and_then(|s| s.canonical_reason()).unwrap_or("Unknown");
    let mut head = format!(
        "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\n",
        r.status,
        r.content_type,
        r.body.len()
    );
    for (k, v) in &r.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("Connection: close\r\n\r\n");
    let mut out = head.into_bytes();
    out.extend_from_slice(&r.body);
    out
}

/// Answer 503 without reading (every slot holds a request in progress).
fn refuse_busy(s: &TcpStream) {
    let mut r = Reply::error(503, "too many admin connections; retry");
    r.headers.push(("Retry-After", "1".into()));
    let _ = s.try_write(&raw_reply(&r));
    let _ = socket2::SockRef::from(s).shutdown(Shutdown::Write);
}

/// Half-close, then read and discard what the client still sends (bounded in bytes and time).
async fn linger_close(io: &Io) {
    let _ = socket2::SockRef::from(&io.stream).shutdown(Shutdown::Write);
    let deadline = Instant::now() + Duration::from_millis(DRAIN_TIMEOUT_MS);
    let mut scratch = [0u8; 4096];
    let mut drained = 0usize;
    while drained < DRAIN_BYTES_MAX {
        match tokio::time::timeout_at(deadline, io.stream.readable()).await {
            Ok(Ok(())) => {}
            _ => break,
        }
        match io.stream.try_read(&mut scratch) {
            Ok(0) => break,
            Ok(n) => drained += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => break,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// One request

async fn handle(shared: &Shared, ctl: &ConnCtl, req: Request<Incoming>, deadline: Instant) -> Response<Full<Bytes>> {
    ctl.idle.store(false, Ordering::Release);
    shared.counters.requests.fetch_add(1, Ordering::Relaxed);
    response(answer(shared, req, deadline).await)
}

/// Everything that can be refused without the body is refused before reading it.
async fn answer(shared: &Shared, req: Request<Incoming>, deadline: Instant) -> Reply {
    let (parts, body) = req.into_parts();
    let method = parts.method.as_str();
    let checked = origin_path(&parts.uri).and_then(|path| {
        let framing = framing(&parts.headers)?;
        let route = authorize_and_route(shared, method, path, &parts.headers)?;
        Ok((route, body_len(&framing, method)?))
    });
    let (route, len) = match checked {
        Ok(ok) => ok,
        Err(reply) => return reply,
    };
    let body = if len == 0 {
        Bytes::new()
    } else {
        match tokio::time::timeout_at(deadline, body.collect()).await {
            Ok(Ok(b)) => b.to_bytes(),
            Ok(Err(_)) => return Reply::error(400, "connection closed inside the body"),
            Err(_) => {
                shared.counters.timeouts.fetch_add(1, Ordering::Relaxed);
                return Reply::error(408, "request body not received in time");
            }
        }
    };
    dispatch(shared, method, route, &body)
}

fn response(r: Reply) -> Response<Full<Bytes>> {
    let mut b = Response::builder().status(r.status);
    // 204 carries neither a body nor Content-Length (RFC 9110 §8.6); hyper adds the length.
    if r.status != 204 {
        b = b.header(hyper::header::CONTENT_TYPE, r.content_type);
    }
    for (k, v) in r.headers {
        b = b.header(k, v);
    }
    b = b.header(hyper::header::CONNECTION, "close");
    b.body(Full::new(Bytes::from(r.body))).unwrap_or_else(|e| {
        let mut resp = Response::new(Full::new(Bytes::from(format!("{{\"error\":\"bad reply header: {e}\"}}\n"))));
        *resp.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
        resp
    })
}

// ---------------------------------------------------------------------------------------------
// The socket, shared between hyper and this file (which answers and lingers after hyper is
// done with it), counting bytes so we know whether anything was read or answered.

struct Io {
    stream: TcpStream,
    read_bytes: AtomicU64,
    written_bytes: AtomicU64,
}

struct IoRef(Arc<Io>);

impl AsyncRead for IoRef {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let io = &self.0;
        loop {
            ready!(io.stream.poll_read_ready(cx))?;
            match io.stream.try_read(buf.initialize_unfilled()) {
                Ok(n) => {
                    buf.advance(n);
                    io.read_bytes.fetch_add(n as u64, Ordering::Relaxed);
                    return Poll::Ready(Ok(()));
                }
                // Readiness was stale; try_read cleared it, so the next poll waits.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl AsyncWrite for IoRef {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let io = &self.0;
        loop {
            ready!(io.stream.poll_write_ready(cx))?;
            match io.stream.try_write(buf) {
                Ok(n) => {
                    io.written_bytes.fetch_add(n as u64, Ordering::Relaxed);
                    return Poll::Ready(Ok(n));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Writes go straight to the socket.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(socket2::SockRef::from(&self.0.stream).shutdown(Shutdown::Write))
    }
}
