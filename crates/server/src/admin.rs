//! The admin HTTP endpoint: `GET /healthz`, `GET /metrics` (Prometheus text format) and the
//! runtime tenant control surface (`GET /tenants`, `GET|PUT|DELETE /tenants/{name}`).
//!
//! What it is for: operators, scrapers and orchestration. It speaks a deliberately small
//! HTTP/1.1 subset: one request per connection, `Connection: close` on every reply, the head
//! bounded by [`REQUEST_BYTES_MAX`], the body by `JSON_BYTES_MAX` and a strict
//! `Content-Length`, the whole request by a [`REQUEST_TIMEOUT_MS`] deadline. Each connection
//! is served on its own short-lived thread, at most [`CONNECTIONS_MAX`] at once (more are
//! answered 503 by the accept thread at once), so a slow or hostile client can hold one slot
//! for at most the deadline and never blocks the others or the serving threads.
//!
//! Security: when a token is configured every route except `/healthz` needs
//! `Authorization: Bearer <token>` (compared in constant time); without a token the read-only
//! routes are open and every change is refused (403). The endpoint should listen on loopback;
//! tenants themselves are separated by port, not by anything here.
//!
//! What it is not for: the cache protocols, tenant validation rules (slipstream-tenancy's
//! spec.rs) or applying changes (the server's `TenantControl` implementation).

use crate::stats::ServerInfo;
use serde_json::Value;
use slipstream_store::Store;
use slipstream_tenancy::spec::{JSON_BYTES_MAX, NAME_BYTES_MAX};
use slipstream_tenancy::{ControlError, TenantControl, TenantPatch, TenantSpec};
use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Largest request head (request line plus headers) we read.
pub const REQUEST_BYTES_MAX: usize = 8 * 1024;
/// How long a client may take to send its whole request (head and body).
pub const REQUEST_TIMEOUT_MS: u64 = 2000;
/// How long writing a reply may block on a client that does not read.
pub const REPLY_TIMEOUT_MS: u64 = 2000;
/// Connections served at once; one more is answered 503 by the accept thread.
pub const CONNECTIONS_MAX: usize = 16;
/// Header lines in one request.
pub const HEADERS_MAX: usize = 64;
/// After replying early (401, 413, ...) we read and discard at most this much of what the
/// client is still sending, so closing does not reset the connection before it reads the reply.
pub const DRAIN_BYTES_MAX: usize = 64 * 1024;
/// ... and for at most this long.
pub const DRAIN_TIMEOUT_MS: u64 = 200;
/// Write timeout for the accept thread's 503 (it must never stall on one client).
const BUSY_REPLY_TIMEOUT_MS: u64 = 50;

/// What the endpoint serves.
pub struct AdminState {
    /// The single-tenant server's counters and store, for `/metrics`; `None` in tenant mode.
    pub node: Option<(Arc<ServerInfo>, Arc<Store>)>,
    /// The tenant control surface; `None` when no tenants are configured.
    pub tenants: Option<Arc<dyn TenantControl>>,
    /// The bearer token. `None` (or empty) leaves GETs open and refuses every change.
    pub token: Option<String>,
    /// Other services' Prometheus text (e.g. the stream offload engine), appended to /metrics.
    pub extra_metrics: Vec<MetricsFn>,
}

/// A service's metrics renderer: appends Prometheus text.
pub type MetricsFn = Arc<dyn Fn(&mut String) + Send + Sync>;

/// The endpoint's own counters, shown in `/metrics`.
#[derive(Default)]
struct AdminCounters {
    requests: AtomicU64,
    unauthorized: AtomicU64,
    busy: AtomicU64,
}

struct Shared {
    state: AdminState,
    counters: AdminCounters,
    /// Connections being served now.
    active: AtomicUsize,
}

/// Bind and serve in a background thread; returns the bound address.
pub fn start(addr: SocketAddr, state: AdminState) -> io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)?;
    let local = listener.local_addr()?;
    let mut state = state;
    // An empty token would let `Authorization: Bearer ` through; treat it as no token at all.
    if state.token.as_deref().is_some_and(str::is_empty) {
        state.token = None;
    }
    let shared = Arc::new(Shared { state, counters: AdminCounters::default(), active: AtomicUsize::new(0) });
    std::thread::Builder::new().name("slipstream-admin".into()).spawn(move || accept_loop(listener, shared))?;
    Ok(local)
}

/// Never returns: errors on one connection (or on accept, e.g. out of descriptors) are
/// answered or dropped, then the loop goes on.
fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(_) => {
                // EMFILE and friends: back off briefly instead of spinning.
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        let Some(slot) = Slot::take(&shared) else {
            shared.counters.busy.fetch_add(1, Ordering::Relaxed);
            refuse_busy(stream);
            continue;
        };
        let conn_shared = shared.clone();
        let spawned = std::thread::Builder::new().name("slipstream-admin-conn".into()).spawn(move || {
            let _slot = slot;
            serve_connection(stream, &conn_shared);
        });
        // If the thread cannot start, the closure (stream and slot) is dropped: the client sees
        // the connection close and the slot is released.
        drop(spawned);
    }
}

/// One of the [`CONNECTIONS_MAX`] serving slots, released on drop (also when a handler panics).
struct Slot(Arc<Shared>);

impl Slot {
    fn take(shared: &Arc<Shared>) -> Option<Slot> {
        let taken = shared
            .active
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < CONNECTIONS_MAX).then_some(n + 1))
            .is_ok();
        taken.then(|| Slot(shared.clone()))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Answer 503 without reading; the reply is small enough to fit the socket buffer, and the
/// short write timeout keeps the accept thread from stalling if it does not.
fn refuse_busy(mut s: TcpStream) {
    let _ = s.set_write_timeout(Some(Duration::from_millis(BUSY_REPLY_TIMEOUT_MS)));
    let mut r = Reply::error(503, "too many admin connections; retry");
    r.headers.push(("Retry-After", "1".into()));
    let _ = s.write_all(&r.to_bytes());
    let _ = s.shutdown(Shutdown::Write);
}

// ---------------------------------------------------------------------------------------------
// Replies

struct Reply {
    status: u16,
    content_type: &'static str,
    headers: Vec<(&'static str, String)>,
    body: Vec<u8>,
}

impl Reply {
    fn json(status: u16, body: Vec<u8>) -> Reply {
        Reply { status, content_type: "application/json", headers: Vec::new(), body }
    }

    /// `encoded` is `serde_json::to_value(..)` of the reply (taking the value rather than a
    /// generic `Serialize` keeps this crate off a direct serde dependency).
    fn value(status: u16, encoded: Result<Value, serde_json::Error>) -> Reply {
        match encoded.and_then(|v| serde_json::to_vec(&v)) {
            Ok(mut body) => {
                body.push(b'\n');
                Reply::json(status, body)
            }
            Err(e) => Reply::error(500, &format!("cannot encode reply: {e}")),
        }
    }

    fn error(status: u16, msg: &str) -> Reply {
        let mut body = serde_json::json!({ "error": msg }).to_string().into_bytes();
        body.push(b'\n');
        Reply::json(status, body)
    }

    fn text(status: u16, content_type: &'static str, body: String) -> Reply {
        Reply { status, content_type, headers: Vec::new(), body: body.into_bytes() }
    }

    fn no_content() -> Reply {
        Reply { status: 204, content_type: "", headers: Vec::new(), body: Vec::new() }
    }

    fn to_bytes(&self) -> Vec<u8> {
        let mut head = format!("HTTP/1.1 {} {}\r\n", self.status, reason(self.status));
        // 204 carries neither a body nor Content-Length (RFC 9110 §8.6).
        if self.status != 204 {
            let _ = write!(head, "Content-Type: {}\r\nContent-Length: {}\r\n", self.content_type, self.body.len());
        }
        for (k, v) in &self.headers {
            let _ = write!(head, "{k}: {v}\r\n");
        }
        head.push_str("Connection: close\r\n\r\n");
        let mut out = head.into_bytes();
        out.extend_from_slice(&self.body);
        out
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        411 => "Length Required",
        413 => "Content Too Large",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        505 => "HTTP Version Not Supported",
        _ => "Unknown",
    }
}

// ---------------------------------------------------------------------------------------------
// Reading a request

/// A parsed request head. Header names are kept lower-cased.
#[derive(Debug)]
struct Head {
    method: String,
    /// The target's path, query string removed.
    path: String,
    headers: Vec<(String, Vec<u8>)>,
}

impl Head {
    fn header_all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.headers.iter().filter(move |(k, _)| k == name).map(|(_, v)| v.as_slice())
    }
}

/// How the body is framed, from the head.
#[derive(Debug, PartialEq)]
enum Framing {
    None,
    Length(u64),
    /// `Transfer-Encoding` without `Content-Length`: we take only sized bodies.
    Unsized,
}

enum ReadFail {
    /// The client went away or the socket failed: nothing to answer.
    Gone,
    TimedOut,
}

/// One read that respects the request deadline.
fn read_until(s: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> Result<usize, ReadFail> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ReadFail::TimedOut);
        }
        if s.set_read_timeout(Some(left)).is_err() {
            return Err(ReadFail::Gone);
        }
        match s.read(buf) {
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                return Err(ReadFail::TimedOut)
            }
            Err(_) => return Err(ReadFail::Gone),
        }
    }
}

/// End of the head (index just past the blank line), accepting CRLF or bare LF line ends.
fn head_end(buf: &[u8]) -> Option<usize> {
    let mut i = 0;
    while let Some(off) = buf.get(i..)?.iter().position(|&b| b == b'\n') {
        let nl = i + off;
        match buf.get(nl + 1) {
            Some(b'\n') => return Some(nl + 2),
            Some(b'\r') if buf.get(nl + 2) == Some(&b'\n') => return Some(nl + 3),
            _ => {}
        }
        i = nl + 1;
    }
    None
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Parse the head (without its blank line). Errors are the status to answer and why.
fn parse_head(raw: &[u8]) -> Result<Head, (u16, String)> {
    let bad = |m: &str| (400u16, m.to_string());
    let mut lines = raw.split(|&b| b == b'\n').map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    let first = lines.next().ok_or_else(|| bad("empty request"))?;
    if first.iter().any(|&b| b.is_ascii_control()) {
        return Err(bad("control character in request line"));
    }
    let first = std::str::from_utf8(first).map_err(|_| bad("request line is not UTF-8"))?;
    let mut parts = first.split(' ');
    let (Some(method), Some(target), Some(version), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad("malformed request line"));
    };
    if method.is_empty() || method.len() > 16 || !method.bytes().all(is_tchar) {
        return Err(bad("malformed method"));
    }
    if !target.starts_with('/') {
        return Err(bad("request target must be a path"));
    }
    match version {
        "HTTP/1.1" | "HTTP/1.0" => {}
        v if v.len() == 8
            && v.starts_with("HTTP/")
            && v.as_bytes().get(5).is_some_and(u8::is_ascii_digit)
            && v.as_bytes().get(6) == Some(&b'.')
            && v.as_bytes().get(7).is_some_and(u8::is_ascii_digit) =>
        {
            return Err((505, format!("{v} is not supported; use HTTP/1.1")));
        }
        _ => return Err(bad("malformed HTTP version")),
    }
    let path = target.split(['?', '#']).next().unwrap_or("").to_string();

    let mut headers = Vec::new();
    for line in lines {
        if line.is_empty() {
            // The blank line the caller left on (or the tail after it): the head is over.
            break;
        }
        if headers.len() >= HEADERS_MAX {
            return Err((431, format!("more than {HEADERS_MAX} header lines")));
        }
        if line.first().is_some_and(|&b| b == b' ' || b == b'\t') {
            return Err(bad("folded header lines are not accepted"));
        }
        let colon = line.iter().position(|&b| b == b':').ok_or_else(|| bad("header line without ':'"))?;
        let (name, rest) = line.split_at(colon);
        if name.is_empty() || !name.iter().copied().all(is_tchar) {
            return Err(bad("malformed header name"));
        }
        let value = rest.get(1..).unwrap_or(&[]);
        if value.iter().any(|&b| (b.is_ascii_control() && b != b'\t') || b == 0x7f) {
            return Err(bad("control character in header value"));
        }
        let value = trim_ows(value);
        // Names are ASCII (tchar), so this lossless lower-casing is all case-insensitivity needs.
        let name = String::from_utf8_lossy(name).to_ascii_lowercase();
        headers.push((name, value.to_vec()));
    }
    Ok(Head { method: method.to_string(), path, headers })
}

fn trim_ows(mut v: &[u8]) -> &[u8] {
    while let Some((&b, rest)) = v.split_first() {
        if b != b' ' && b != b'\t' {
            break;
        }
        v = rest;
    }
    while let Some((&b, rest)) = v.split_last() {
        if b != b' ' && b != b'\t' {
            break;
        }
        v = rest;
    }
    v
}

/// Body framing from the head: a single all-digits `Content-Length`, never together with
/// `Transfer-Encoding` (that pair is the classic request-smuggling ambiguity).
fn framing(head: &Head) -> Result<Framing, (u16, String)> {
    let bad = |m: &str| (400u16, m.to_string());
    let lengths: Vec<&[u8]> = head.header_all("content-length").collect();
    let chunked = head.header_all("transfer-encoding").next().is_some();
    match (lengths.as_slice(), chunked) {
        ([], false) => Ok(Framing::None),
        ([], true) => Ok(Framing::Unsized),
        ([_], true) => Err(bad("both Content-Length and Transfer-Encoding")),
        ([v], false) => {
            // Digits only (no sign, no spaces inside, no list), and at most 19 of them so the
            // value fits a u64 without overflow checks failing on hostile input.
            if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
                return Err(bad("malformed Content-Length"));
            }
            let n = v.iter().fold(0u64, |n, &d| n * 10 + u64::from(d - b'0'));
            Ok(Framing::Length(n))
        }
        _ => Err(bad("more than one Content-Length")),
    }
}

/// Serve one connection: read one request, answer it, close.
fn serve_connection(mut s: TcpStream, shared: &Shared) {
    let deadline = Instant::now() + Duration::from_millis(REQUEST_TIMEOUT_MS);
    let _ = s.set_nodelay(true);
    let reply = match read_and_answer(&mut s, shared, deadline) {
        Some(r) => r,
        None => return,
    };
    let _ = s.set_write_timeout(Some(Duration::from_millis(REPLY_TIMEOUT_MS)));
    if s.write_all(&reply.to_bytes()).is_err() {
        return;
    }
    let _ = s.flush();
    linger_close(s);
}

/// Half-close, then read and discard what the client still sends (bounded), so the kernel
/// does not answer unread bytes with a reset that could destroy the reply in flight.
fn linger_close(mut s: TcpStream) {
    if s.shutdown(Shutdown::Write).is_err() {
        return;
    }
    let deadline = Instant::now() + Duration::from_millis(DRAIN_TIMEOUT_MS);
    let mut scratch = [0u8; 4096];
    let mut drained = 0usize;
    while drained < DRAIN_BYTES_MAX {
        match read_until(&mut s, &mut scratch, deadline) {
            Ok(0) | Err(_) => break,
            Ok(n) => drained += n,
        }
    }
}

/// Read the request and compute the reply; `None` when the client left before asking anything.
fn read_and_answer(s: &mut TcpStream, shared: &Shared, deadline: Instant) -> Option<Reply> {
    let mut buf = vec![0u8; REQUEST_BYTES_MAX];
    let mut n = 0usize;
    let end = loop {
        if let Some(e) = head_end(buf.get(..n)?) {
            break e;
        }
        if n >= buf.len() {
            return Some(Reply::error(431, &format!("request head over {REQUEST_BYTES_MAX} bytes")));
        }
        match read_until(s, buf.get_mut(n..)?, deadline) {
            Ok(0) if n == 0 => return None,
            Ok(0) => return Some(Reply::error(400, "connection closed inside the request head")),
            Ok(k) => n += k,
            Err(ReadFail::Gone) => return None,
            Err(ReadFail::TimedOut) if n == 0 => return None,
            Err(ReadFail::TimedOut) => return Some(Reply::error(408, "request not received in time")),
        }
    };
    shared.counters.requests.fetch_add(1, Ordering::Relaxed);
    let head = match parse_head(buf.get(..end)?) {
        Ok(h) => h,
        Err((code, msg)) => return Some(Reply::error(code, &msg)),
    };
    let framing = match framing(&head) {
        Ok(f) => f,
        Err((code, msg)) => return Some(Reply::error(code, &msg)),
    };
    // Everything that can be refused without the body is refused before reading it.
    let route = match authorize_and_route(shared, &head) {
        Ok(r) => r,
        Err(reply) => return Some(reply),
    };
    let body_len = match (&framing, head.method.as_str()) {
        (Framing::Unsized, _) => return Some(Reply::error(411, "Content-Length required (chunked bodies are not accepted)")),
        (Framing::None, "PUT") => return Some(Reply::error(411, "Content-Length required")),
        (Framing::None, _) => 0,
        (Framing::Length(len), _) => match usize::try_from(*len) {
            Ok(len) if len <= JSON_BYTES_MAX => len,
            _ => return Some(Reply::error(413, &format!("body over {JSON_BYTES_MAX} bytes"))),
        },
    };
    let mut body = Vec::with_capacity(body_len);
    let already = buf.get(end..n)?;
    body.extend_from_slice(already.get(..body_len.min(already.len()))?);
    while body.len() < body_len {
        let mut chunk = [0u8; 4096];
        let want = (body_len - body.len()).min(chunk.len());
        match read_until(s, chunk.get_mut(..want)?, deadline) {
            Ok(0) => return Some(Reply::error(400, "connection closed inside the body")),
            Ok(k) => body.extend_from_slice(chunk.get(..k)?),
            Err(ReadFail::Gone) => return None,
            Err(ReadFail::TimedOut) => return Some(Reply::error(408, "request body not received in time")),
        }
    }
    Some(dispatch(shared, &head.method, route, &body))
}

// ---------------------------------------------------------------------------------------------
// Routing and answering

#[derive(Debug, PartialEq)]
enum Route {
    Healthz,
    Metrics,
    Tenants,
    Tenant(String),
}

impl Route {
    fn parse(path: &str) -> Option<Route> {
        match path {
            "/healthz" => Some(Route::Healthz),
            "/metrics" => Some(Route::Metrics),
            "/tenants" => Some(Route::Tenants),
            p => {
                let name = p.strip_prefix("/tenants/")?;
                valid_name(name).then(|| Route::Tenant(name.to_string()))
            }
        }
    }

    fn allow(&self) -> &'static str {
        match self {
            Route::Tenant(_) => "GET, PUT, DELETE",
            _ => "GET",
        }
    }

    fn allows(&self, method: &str) -> bool {
        match self {
            Route::Tenant(_) => matches!(method, "GET" | "PUT" | "DELETE"),
            _ => method == "GET",
        }
    }
}

/// Tenant names in paths: `[A-Za-z0-9_.-]{1,NAME_BYTES_MAX}` (anything else cannot name a
/// tenant, so it is simply not found).
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= NAME_BYTES_MAX
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// Equality whose time depends only on the expected token's length, not on where the first
/// difference is.
fn token_matches(given: &[u8], expected: &[u8]) -> bool {
    let mut diff = u8::from(given.len() != expected.len());
    for (i, &e) in expected.iter().enumerate() {
        diff |= given.get(i).copied().unwrap_or(0) ^ e;
    }
    std::hint::black_box(diff) == 0
}

fn authorized(head: &Head, token: &str) -> bool {
    let mut auths = head.header_all("authorization");
    let (Some(v), None) = (auths.next(), auths.next()) else {
        return false;
    };
    let Some(sp) = v.iter().position(|&b| b == b' ') else {
        return false;
    };
    let (scheme, rest) = v.split_at(sp);
    scheme.eq_ignore_ascii_case(b"bearer") && token_matches(trim_ows(rest), token.as_bytes())
}

/// Auth, route and method checks, in the order that leaks least: an unauthenticated client
/// learns nothing about which paths exist.
fn authorize_and_route(shared: &Shared, head: &Head) -> Result<Route, Reply> {
    let route = Route::parse(&head.path);
    if route != Some(Route::Healthz) {
        if let Some(token) = &shared.state.token {
            if !authorized(head, token) {
                shared.counters.unauthorized.fetch_add(1, Ordering::Relaxed);
                let mut r = Reply::error(401, "missing or wrong bearer token");
                r.headers.push(("WWW-Authenticate", "Bearer realm=\"slipstream-admin\"".into()));
                return Err(r);
            }
        }
    }
    let Some(route) = route else {
        return Err(Reply::error(404, "not found"));
    };
    if !route.allows(&head.method) {
        let mut r = Reply::error(405, &format!("{} is not allowed here", head.method));
        r.headers.push(("Allow", route.allow().into()));
        return Err(r);
    }
    if head.method != "GET" && shared.state.token.is_none() {
        return Err(Reply::error(403, "admin_token not configured"));
    }
    Ok(route)
}

fn dispatch(shared: &Shared, method: &str, route: Route, body: &[u8]) -> Reply {
    match route {
        Route::Healthz => Reply::text(200, "text/plain; charset=utf-8", "ok\n".into()),
        Route::Metrics => Reply::text(200, "text/plain; version=0.0.4; charset=utf-8", metrics(shared)),
        Route::Tenants => match &shared.state.tenants {
            Some(t) => Reply::value(200, serde_json::to_value(t.list())),
            None => Reply::error(404, "no tenants configured"),
        },
        Route::Tenant(name) => {
            let Some(t) = &shared.state.tenants else {
                return Reply::error(404, "no tenants configured");
            };
            match method {
                "GET" => match t.get(&name) {
                    Some(v) => Reply::value(200, serde_json::to_value(&v)),
                    None => not_found_tenant(&name),
                },
                "PUT" => put_tenant(t.as_ref(), &name, body),
                "DELETE" => match t.remove(&name) {
                    Ok(()) => Reply::no_content(),
                    Err(e) => control_error(&e),
                },
                _ => Reply::error(405, "method not allowed"),
            }
        }
    }
}

fn not_found_tenant(name: &str) -> Reply {
    control_error(&ControlError::NotFound(name.to_string()))
}

fn control_error(e: &ControlError) -> Reply {
    let code = match e {
        ControlError::NotFound(_) => 404,
        ControlError::Conflict(_) => 409,
        ControlError::Invalid(_) => 400,
        ControlError::Failed(_) => 500,
    };
    Reply::error(code, &e.to_string())
}

/// `PUT /tenants/{name}`: edit the tenant if it exists, else create it.
///
/// For an edit the body may repeat the tenant's `name`, `tcp_port` and `udp_port` unchanged (so
/// re-sending a full spec is an idempotent PUT); changing them is refused, since a tenant's
/// identity and ports are fixed for its life (remove and re-add instead).
fn put_tenant(t: &dyn TenantControl, name: &str, body: &[u8]) -> Reply {
    let mut doc: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return Reply::error(400, &format!("bad JSON: {e}")),
    };
    let Some(obj) = doc.as_object_mut() else {
        return Reply::error(400, "body must be a JSON object");
    };
    match t.get(name) {
        Some(current) => {
            let fixed: [(&str, Value); 3] = [
                ("name", Value::from(current.spec.name.clone())),
                ("tcp_port", Value::from(current.spec.tcp_port)),
                ("udp_port", current.spec.udp_port.map_or(Value::Null, Value::from)),
            ];
            for (key, now) in fixed {
                if let Some(given) = obj.remove(key) {
                    if given != now {
                        return Reply::error(
                            400,
                            &format!("{key} cannot change on an existing tenant (remove and re-add it)"),
                        );
                    }
                }
            }
            let patch = match serde_json::to_vec(&doc).map_err(|e| e.to_string()).and_then(|b| {
                TenantPatch::from_json(&b).map_err(|e| e.to_string())
            }) {
                Ok(p) => p,
                Err(msg) => return Reply::error(400, &msg),
            };
            match t.update(name, patch) {
                Ok(v) => Reply::value(200, serde_json::to_value(&v)),
                Err(e) => control_error(&e),
            }
        }
        None => {
            match obj.get("name") {
                None => {
                    obj.insert("name".into(), Value::from(name));
                }
                Some(Value::String(n)) if n == name => {}
                Some(_) => return Reply::error(400, "name in the body must match the path"),
            }
            let spec = match serde_json::to_vec(&doc).map_err(|e| e.to_string()).and_then(|b| {
                TenantSpec::from_json(&b).map_err(|e| e.to_string())
            }) {
                Ok(s) => s,
                Err(msg) => return Reply::error(400, &msg),
            };
            match t.add(spec) {
                Ok(v) => {
                    let mut r = Reply::value(201, serde_json::to_value(&v));
                    r.headers.push(("Location", format!("/tenants/{name}")));
                    r
                }
                Err(e) => control_error(&e),
            }
        }
    }
}

fn metrics(shared: &Shared) -> String {
    let mut out = match &shared.state.node {
        Some((info, store)) => render_metrics(info, store),
        None => String::new(),
    };
    let c = &shared.counters;
    for (name, help, v) in [
        ("admin_requests", "Admin HTTP requests read", c.requests.load(Ordering::Relaxed)),
        ("admin_unauthorized", "Admin requests refused for a missing or wrong token", c.unauthorized.load(Ordering::Relaxed)),
        ("admin_busy", "Admin connections refused because all slots were busy", c.busy.load(Ordering::Relaxed)),
    ] {
        let _ = writeln!(out, "# HELP slipstream_{name}_total {help}\n# TYPE slipstream_{name}_total counter\nslipstream_{name}_total {v}");
    }
    if let Some(t) = &shared.state.tenants {
        let _ = writeln!(out, "# HELP slipstream_tenants Tenants configured\n# TYPE slipstream_tenants gauge\nslipstream_tenants {}", t.list().len());
        t.render_metrics(&mut out);
    }
    for f in &shared.state.extra_metrics {
        f(&mut out);
    }
    out
}

/// Prometheus text for every server counter and store gauge (single-tenant mode).
pub fn render_metrics(info: &ServerInfo, store: &Store) -> String {
    let mut out = String::new();
    let totals = info.totals();
    for (name, v) in totals.pairs() {
        let _ = writeln!(out, "# TYPE slipstream_{name}_total counter\nslipstream_{name}_total {v}");
    }
    let st = store.stats();
    let gauges: [(&str, u64); 4] = [
        ("curr_items", st.curr_items),
        ("bytes", st.bytes),
        ("limit_maxbytes", st.limit_maxbytes),
        ("curr_connections", info.curr_connections.load(Ordering::Relaxed)),
    ];
    for (name, v) in gauges {
        let _ = writeln!(out, "# TYPE slipstream_{name} gauge\nslipstream_{name} {v}");
    }
    let store_counters: [(&str, u64); 6] = [
        ("total_items", st.total_items),
        ("evictions", st.evictions),
        ("reclaimed", st.reclaimed),
        ("expired_unfetched", st.expired_unfetched),
        ("evicted_unfetched", st.evicted_unfetched),
        ("get_flushed", st.get_flushed),
    ];
    for (name, v) in store_counters {
        let _ = writeln!(out, "# TYPE slipstream_{name}_total counter\nslipstream_{name}_total {v}");
    }
    let _ = writeln!(out, "# TYPE slipstream_uptime_seconds gauge\nslipstream_uptime_seconds {}", info.uptime_s());
    let _ = writeln!(
        out,
        "# TYPE slipstream_fastpath_enabled gauge\nslipstream_fastpath_enabled {}",
        u8::from(info.fastpath_enabled)
    );
    let fp = info.fastpath_totals();
    for (name, v) in [
        ("fastpath_hits", fp.hits),
        ("fastpath_misses", fp.misses),
        ("fastpath_invalidations", fp.invalidations),
    ] {
        let _ = writeln!(out, "# TYPE slipstream_{name}_total counter\nslipstream_{name}_total {v}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use slipstream_tenancy::TenantView;
    use std::sync::Mutex;

    /// An in-memory stand-in for the server's tenant registry that records every change call.
    #[derive(Default)]
    struct Mock {
        tenants: Mutex<Vec<TenantView>>,
        calls: Mutex<Vec<String>>,
    }

    impl Mock {
        fn calls(&self) -> Vec<String> {
            self.calls.lock().map(|c| c.clone()).unwrap_or_default()
        }
        fn record(&self, call: String) {
            if let Ok(mut c) = self.calls.lock() {
                c.push(call);
            }
        }
    }

    fn view(spec: TenantSpec) -> TenantView {
        TenantView {
            spec,
            ingress_bytes_per_s: 0,
            egress_bytes_per_s: 0,
            memory_used_bytes: 0,
            items: 0,
            evictions: 0,
            outstanding: 0,
            throttled: 0,
            dropped: 0,
        }
    }

    impl TenantControl for Mock {
        fn list(&self) -> Vec<TenantView> {
            self.tenants.lock().map(|t| t.clone()).unwrap_or_default()
        }
        fn get(&self, name: &str) -> Option<TenantView> {
            self.list().into_iter().find(|v| v.spec.name == name)
        }
        fn add(&self, spec: TenantSpec) -> Result<TenantView, ControlError> {
            self.record(format!("add {}", spec.name));
            if spec.name == "boom" {
                return Err(ControlError::Failed("cannot bind".into()));
            }
            let mut t = self.tenants.lock().map_err(|_| ControlError::Failed("poisoned".into()))?;
            if t.iter().any(|v| v.spec.name == spec.name || v.spec.tcp_port == spec.tcp_port) {
                return Err(ControlError::Conflict(format!("{} or its port is taken", spec.name)));
            }
            let v = view(spec);
            t.push(v.clone());
            Ok(v)
        }
        fn update(&self, name: &str, patch: TenantPatch) -> Result<TenantView, ControlError> {
            self.record(format!("update {name}"));
            let mut t = self.tenants.lock().map_err(|_| ControlError::Failed("poisoned".into()))?;
            let v = t.iter_mut().find(|v| v.spec.name == name).ok_or_else(|| ControlError::NotFound(name.into()))?;
            // Applied by hand so this test does not depend on spec.rs's own patching.
            if let Some(s) = patch.share {
                v.spec.share = s;
            }
            if let Some(b) = patch.burst_bytes {
                v.spec.burst_bytes = b;
            }
            if let Some(m) = patch.memory_mb {
                v.spec.memory_mb = m;
            }
            if let Some(o) = patch.max_outstanding {
                v.spec.max_outstanding = o;
            }
            Ok(v.clone())
        }
        fn remove(&self, name: &str) -> Result<(), ControlError> {
            self.record(format!("remove {name}"));
            let mut t = self.tenants.lock().map_err(|_| ControlError::Failed("poisoned".into()))?;
            let i = t.iter().position(|v| v.spec.name == name).ok_or_else(|| ControlError::NotFound(name.into()))?;
            t.remove(i);
            Ok(())
        }
        fn render_metrics(&self, out: &mut String) {
            for v in self.list() {
                let _ = writeln!(out, "slipstream_tenant_mock_total{{tenant=\"{}\"}} 1", v.spec.name);
            }
        }
    }

    const TOKEN: &str = "s3cret-token";

    fn serve(token: Option<&str>, tenants: bool) -> (SocketAddr, Arc<Mock>) {
        let mock = Arc::new(Mock::default());
        let control: Option<Arc<dyn TenantControl>> = if tenants { Some(mock.clone()) } else { None };
        let state = AdminState { node: None, tenants: control, token: token.map(str::to_string), extra_metrics: Vec::new() };
        let addr = start("127.0.0.1:0".parse().expect("literal address"), state).expect("bind admin");
        (addr, mock)
    }

    struct Resp {
        status: u16,
        head: String,
        body: String,
    }

    impl Resp {
        fn header(&self, name: &str) -> Option<String> {
            self.head.lines().skip(1).find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
            })
        }
        fn json(&self) -> Value {
            serde_json::from_str(&self.body).unwrap_or(Value::Null)
        }
    }

    fn read_resp(s: &mut TcpStream) -> Resp {
        s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        let mut raw = Vec::new();
        let _ = s.read_to_end(&mut raw);
        let text = String::from_utf8_lossy(&raw).to_string();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status = head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        Resp { status, head: head.to_string(), body: body.to_string() }
    }

    fn raw(addr: SocketAddr, bytes: &[u8]) -> Resp {
        let mut s = TcpStream::connect(addr).expect("connect");
        s.write_all(bytes).expect("send");
        read_resp(&mut s)
    }

    fn req(addr: SocketAddr, method: &str, path: &str, token: Option<&str>, body: Option<&str>) -> Resp {
        let mut r = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\n");
        if let Some(t) = token {
            r.push_str(&format!("Authorization: Bearer {t}\r\n"));
        }
        if let Some(b) = body {
            r.push_str(&format!("Content-Type: application/json\r\nContent-Length: {}\r\n", b.len()));
        }
        r.push_str("\r\n");
        r.push_str(body.unwrap_or(""));
        raw(addr, r.as_bytes())
    }

    #[test]
    fn auth_is_required_except_for_healthz() {
        let (addr, _) = serve(Some(TOKEN), true);
        let r = req(addr, "GET", "/tenants", None, None);
        assert_eq!(r.status, 401);
        assert!(r.header("WWW-Authenticate").is_some_and(|v| v.starts_with("Bearer")), "{}", r.head);
        assert_eq!(r.header("Content-Type").as_deref(), Some("application/json"));
        assert!(r.json()["error"].is_string());
        assert_eq!(req(addr, "GET", "/tenants", Some("s3cret-tokem"), None).status, 401);
        assert_eq!(req(addr, "GET", "/tenants", Some("s3cret-token-longer"), None).status, 401);
        assert_eq!(req(addr, "GET", "/tenants", Some(""), None).status, 401);
        assert_eq!(req(addr, "GET", "/metrics", None, None).status, 401);
        // Without the token, unknown paths and wrong methods look the same as known ones.
        assert_eq!(req(addr, "GET", "/nope", None, None).status, 401);
        assert_eq!(req(addr, "DELETE", "/tenants/x", None, None).status, 401);
        let ok = req(addr, "GET", "/tenants", Some(TOKEN), None);
        assert_eq!((ok.status, ok.json()), (200, serde_json::json!([])));
        assert_eq!(ok.header("Connection").as_deref(), Some("close"));
        // Scheme and header name are case-insensitive.
        let r = raw(addr, format!("GET /tenants HTTP/1.1\r\nauthorization: bearer {TOKEN}\r\n\r\n").as_bytes());
        assert_eq!(r.status, 200);
        // Basic auth with the right secret is still not a bearer token.
        let r = raw(addr, format!("GET /tenants HTTP/1.1\r\nAuthorization: Basic {TOKEN}\r\n\r\n").as_bytes());
        assert_eq!(r.status, 401);
        let h = req(addr, "GET", "/healthz", None, None);
        assert_eq!((h.status, h.body.as_str()), (200, "ok\n"));
        let m = req(addr, "GET", "/metrics", Some(TOKEN), None);
        assert_eq!(m.status, 200);
        assert!(m.body.contains("slipstream_admin_unauthorized_total "), "{}", m.body);
    }

    #[test]
    fn create_patch_delete_cycle() {
        let (addr, mock) = serve(Some(TOKEN), true);
        let r = req(addr, "PUT", "/tenants/t1", Some(TOKEN), Some(r#"{"tcp_port":12000,"share":0.5}"#));
        assert_eq!(r.status, 201, "{}", r.body);
        assert_eq!(r.json()["name"], "t1");
        assert_eq!(r.json()["tcp_port"], 12000);
        assert_eq!(r.header("Location").as_deref(), Some("/tenants/t1"));
        // A body that names the tenant the same way as the path is fine too.
        let r = req(addr, "PUT", "/tenants/t2", Some(TOKEN), Some(r#"{"name":"t2","tcp_port":12001,"share":0.25}"#));
        assert_eq!(r.status, 201, "{}", r.body);

        let list = req(addr, "GET", "/tenants?verbose=1", Some(TOKEN), None);
        assert_eq!(list.status, 200);
        let names: Vec<String> =
            list.json().as_array().map(|a| a.iter().map(|v| v["name"].to_string()).collect()).unwrap_or_default();
        assert_eq!(names, ["\"t1\"", "\"t2\""]);

        let r = req(addr, "PUT", "/tenants/t1", Some(TOKEN), Some(r#"{"share":0.25,"burst_bytes":4096}"#));
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.json()["share"], 0.25);
        assert_eq!(r.json()["burst_bytes"], 4096);
        // Re-sending the unchanged identity fields with a patch is accepted.
        let r = req(addr, "PUT", "/tenants/t1", Some(TOKEN), Some(r#"{"name":"t1","tcp_port":12000,"memory_mb":8}"#));
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.json()["memory_mb"], 8);
        let g = req(addr, "GET", "/tenants/t1", Some(TOKEN), None);
        assert_eq!((g.status, g.json()["memory_mb"].as_u64()), (200, Some(8)));

        let d = req(addr, "DELETE", "/tenants/t1", Some(TOKEN), None);
        assert_eq!((d.status, d.body.as_str()), (204, ""));
        assert_eq!(d.header("Content-Length"), None);
        assert_eq!(req(addr, "GET", "/tenants/t1", Some(TOKEN), None).status, 404);
        assert_eq!(req(addr, "DELETE", "/tenants/t1", Some(TOKEN), None).status, 404);
        assert_eq!(mock.calls(), ["add t1", "add t2", "update t1", "update t1", "remove t1", "remove t1"]);

        // Metrics in tenant mode: the control's text plus the tenant count.
        let m = req(addr, "GET", "/metrics", Some(TOKEN), None);
        assert!(m.body.contains("slipstream_tenant_mock_total{tenant=\"t2\"} 1"), "{}", m.body);
        assert!(m.body.contains("slipstream_tenants 1\n"), "{}", m.body);
    }

    #[test]
    fn bad_input_changes_nothing() {
        let (addr, mock) = serve(Some(TOKEN), true);
        let bad_create = [
            "{not json",
            "[1,2]",
            r#"{"name":"other","tcp_port":12000,"share":0.5}"#,
            r#"{"name":7,"tcp_port":12000,"share":0.5}"#,
            r#"{"tcp_port":12000,"share":1.5}"#,
            r#"{"tcp_port":12000,"share":0.5,"colour":"blue"}"#,
            r#"{"share":0.5}"#,
        ];
        for body in bad_create {
            let r = req(addr, "PUT", "/tenants/t1", Some(TOKEN), Some(body));
            assert_eq!(r.status, 400, "{body}: {}", r.body);
            assert!(r.json()["error"].is_string(), "{}", r.body);
        }
        assert!(mock.calls().is_empty(), "{:?}", mock.calls());

        assert_eq!(req(addr, "PUT", "/tenants/t1", Some(TOKEN), Some(r#"{"tcp_port":12000,"share":0.5}"#)).status, 201);
        let bad_patch =
            ["{", r#"{"tcp_port":12999}"#, r#"{"name":"t9"}"#, r#""share""#, r#"{"share":-0.5}"#, r#"{"burst":1}"#];
        for body in bad_patch {
            let r = req(addr, "PUT", "/tenants/t1", Some(TOKEN), Some(body));
            assert_eq!(r.status, 400, "{body}: {}", r.body);
        }
        assert_eq!(mock.calls(), ["add t1"]);
        // A conflict reported by the control is a 409.
        let r = req(addr, "PUT", "/tenants/t2", Some(TOKEN), Some(r#"{"tcp_port":12000,"share":0.1}"#));
        assert_eq!(r.status, 409, "{}", r.body);
        assert_eq!(mock.list().len(), 1);
        // A failure inside the node is a 500 with the reason.
        let r = req(addr, "PUT", "/tenants/boom", Some(TOKEN), Some(r#"{"tcp_port":12002,"share":0.1}"#));
        assert_eq!(r.status, 500, "{}", r.body);
        assert!(r.json()["error"].as_str().is_some_and(|e| e.contains("cannot bind")), "{}", r.body);
    }

    #[test]
    fn body_limits() {
        let (addr, mock) = serve(Some(TOKEN), true);
        let big = "x".repeat(JSON_BYTES_MAX + 1);
        let r = req(addr, "PUT", "/tenants/t1", Some(TOKEN), Some(&big));
        assert_eq!(r.status, 413, "{}", r.head);
        let r = raw(addr, format!("PUT /tenants/t1 HTTP/1.1\r\nAuthorization: Bearer {TOKEN}\r\n\r\n").as_bytes());
        assert_eq!(r.status, 411);
        let r = raw(
            addr,
            format!("PUT /tenants/t1 HTTP/1.1\r\nAuthorization: Bearer {TOKEN}\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
                .as_bytes(),
        );
        assert_eq!(r.status, 411);
        for cl in ["Content-Length: 1x", "Content-Length: -1", "Content-Length: 1, 1", "Content-Length: 99999999999999999999999"] {
            let r = raw(addr, format!("PUT /tenants/t1 HTTP/1.1\r\nAuthorization: Bearer {TOKEN}\r\n{cl}\r\n\r\n{{}}").as_bytes());
            assert_eq!(r.status, 400, "{cl}");
        }
        let r = raw(
            addr,
            format!("PUT /tenants/t1 HTTP/1.1\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: 2\r\ncontent-length: 2\r\n\r\n{{}}")
                .as_bytes(),
        );
        assert_eq!(r.status, 400);
        // A body announced but cut short: the client closing its side is a 400, not a hang.
        let mut s = TcpStream::connect(addr).expect("connect");
        s.write_all(format!("PUT /tenants/t1 HTTP/1.1\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: 50\r\n\r\n{{").as_bytes())
            .expect("send");
        s.shutdown(Shutdown::Write).expect("half-close");
        assert_eq!(read_resp(&mut s).status, 400);
        assert!(mock.calls().is_empty());
        // The body may arrive in pieces after the head.
        let body = r#"{"tcp_port":12000,"share":0.5}"#;
        let mut s = TcpStream::connect(addr).expect("connect");
        s.write_all(format!("PUT /tenants/t1 HTTP/1.1\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: {}\r\n\r\n", body.len()).as_bytes())
            .expect("send");
        std::thread::sleep(Duration::from_millis(50));
        let (a, b) = body.split_at(10);
        s.write_all(a.as_bytes()).expect("send");
        std::thread::sleep(Duration::from_millis(50));
        s.write_all(b.as_bytes()).expect("send");
        assert_eq!(read_resp(&mut s).status, 201);
    }

    #[test]
    fn routes_and_methods() {
        let (addr, _) = serve(Some(TOKEN), true);
        for path in ["/", "/nope", "/tenants/", "/tenants/a/b", "/tenants/bad%20name", "/tenants/caf%C3%A9", "/metricsx", "/healthz/"] {
            let r = req(addr, "GET", path, Some(TOKEN), None);
            assert_eq!(r.status, 404, "{path}");
        }
        let long = format!("/tenants/{}", "a".repeat(NAME_BYTES_MAX + 1));
        assert_eq!(req(addr, "GET", &long, Some(TOKEN), None).status, 404);
        assert_eq!(req(addr, "GET", "/tenants/ghost", Some(TOKEN), None).status, 404);
        let r = req(addr, "POST", "/tenants", Some(TOKEN), Some("{}"));
        assert_eq!((r.status, r.header("Allow").as_deref()), (405, Some("GET")));
        let r = req(addr, "PATCH", "/tenants/t1", Some(TOKEN), Some("{}"));
        assert_eq!((r.status, r.header("Allow").as_deref()), (405, Some("GET, PUT, DELETE")));
        assert_eq!(req(addr, "DELETE", "/metrics", Some(TOKEN), None).status, 405);
        assert_eq!(req(addr, "GET", "/healthz?probe=1", None, None).status, 200);

        // No tenant control at all: tenant routes say so.
        let (addr, _) = serve(Some(TOKEN), false);
        let r = req(addr, "GET", "/tenants", Some(TOKEN), None);
        assert_eq!((r.status, r.json()["error"].as_str()), (404, Some("no tenants configured")));
        let r = req(addr, "PUT", "/tenants/t1", Some(TOKEN), Some("{}"));
        assert_eq!(r.status, 404);
        let m = req(addr, "GET", "/metrics", Some(TOKEN), None);
        assert!(m.status == 200 && m.body.contains("slipstream_admin_requests_total"));
    }

    #[test]
    fn without_token_reads_are_open_and_writes_refused() {
        let (addr, mock) = serve(None, true);
        assert_eq!(req(addr, "GET", "/tenants", None, None).status, 200);
        assert_eq!(req(addr, "GET", "/metrics", None, None).status, 200);
        let r = req(addr, "PUT", "/tenants/t1", None, Some(r#"{"tcp_port":12000,"share":0.5}"#));
        assert_eq!((r.status, r.json()["error"].as_str()), (403, Some("admin_token not configured")));
        // Presenting some token does not help when none is configured.
        assert_eq!(req(addr, "DELETE", "/tenants/t1", Some("anything"), None).status, 403);
        assert!(mock.calls().is_empty());
        // An empty configured token counts as none.
        let (addr, mock) = serve(Some(""), true);
        assert_eq!(req(addr, "PUT", "/tenants/t1", Some(""), Some(r#"{"tcp_port":1,"share":0.5}"#)).status, 403);
        assert!(mock.calls().is_empty());
    }

    #[test]
    fn malformed_requests_get_4xx() {
        let (addr, _) = serve(Some(TOKEN), true);
        let cases: [(&[u8], u16); 12] = [
            (b"HELLO\r\n\r\n", 400),
            (b"GET /healthz\r\n\r\n", 400),
            (b"GET  /healthz HTTP/1.1\r\n\r\n", 400),
            (b"GET /healthz HTTP/1.1 extra\r\n\r\n", 400),
            (b"GET healthz HTTP/1.1\r\n\r\n", 400),
            (b"G(T /healthz HTTP/1.1\r\n\r\n", 400),
            (b"GET /healthz HTTX/1.1\r\n\r\n", 400),
            (b"GET /healthz HTTP/2.0\r\n\r\n", 505),
            (b"GET /healthz HTTP/1.1\r\nno colon here\r\n\r\n", 400),
            (b"GET /healthz HTTP/1.1\r\nBad Name: x\r\n\r\n", 400),
            (b"GET /healthz HTTP/1.1\r\nX: a\r\n folded\r\n\r\n", 400),
            (b"\xff\xfe\x00garbage\r\n\r\n", 400),
        ];
        for (bytes, want) in cases {
            let r = raw(addr, bytes);
            assert_eq!(r.status, want, "{:?}", String::from_utf8_lossy(bytes));
        }
        // Bare-LF line ends are tolerated.
        assert_eq!(raw(addr, b"GET /healthz HTTP/1.0\nHost: x\n\n").status, 200);
        // A head longer than the bound.
        let mut big = b"GET /healthz HTTP/1.1\r\n".to_vec();
        while big.len() <= REQUEST_BYTES_MAX {
            big.extend_from_slice(b"X-Filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n");
        }
        assert_eq!(raw(addr, &big).status, 431);
        let many: String = (0..=HEADERS_MAX).map(|i| format!("X-{i}: 1\r\n")).collect();
        assert_eq!(raw(addr, format!("GET /healthz HTTP/1.1\r\n{many}\r\n").as_bytes()).status, 431);
        // A client that connects and leaves, or sends half a head and closes, does not stop the
        // accept loop.
        drop(TcpStream::connect(addr).expect("connect"));
        let mut s = TcpStream::connect(addr).expect("connect");
        s.write_all(b"GET /hea").expect("send");
        s.shutdown(Shutdown::Write).expect("half-close");
        assert_eq!(read_resp(&mut s).status, 400);
        assert_eq!(req(addr, "GET", "/healthz", None, None).status, 200);
    }

    #[test]
    fn slow_client_does_not_block_others() {
        let (addr, _) = serve(Some(TOKEN), true);
        let t0 = Instant::now();
        let mut slow = TcpStream::connect(addr).expect("connect");
        slow.write_all(b"GET /tenants HTTP/1.1\r\nHost: x").expect("send");
        let fast_started = Instant::now();
        let r = req(addr, "GET", "/tenants", Some(TOKEN), None);
        assert_eq!(r.status, 200);
        let fast = fast_started.elapsed();
        assert!(fast < Duration::from_millis(REQUEST_TIMEOUT_MS / 2), "fast client waited {fast:?}");
        // The slow one is cut off at the deadline with a 408.
        let r = read_resp(&mut slow);
        let waited = t0.elapsed();
        assert_eq!(r.status, 408);
        assert!(waited >= Duration::from_millis(REQUEST_TIMEOUT_MS - 100), "{waited:?}");
        assert!(waited < Duration::from_millis(REQUEST_TIMEOUT_MS + 1500), "{waited:?}");
    }

    #[test]
    fn connection_slots_are_bounded() {
        let (addr, _) = serve(Some(TOKEN), true);
        let idle: Vec<TcpStream> = (0..CONNECTIONS_MAX).map(|_| TcpStream::connect(addr).expect("connect")).collect();
        // Let the accept thread hand all of them to workers.
        std::thread::sleep(Duration::from_millis(200));
        let t0 = Instant::now();
        let r = req(addr, "GET", "/healthz", None, None);
        assert_eq!(r.status, 503);
        assert_eq!(r.header("Retry-After").as_deref(), Some("1"));
        assert!(t0.elapsed() < Duration::from_millis(500));
        drop(idle);
        // Once the idle ones are gone (their threads see EOF), service resumes.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let r = req(addr, "GET", "/healthz", None, None);
            if r.status == 200 {
                break;
            }
            assert!(Instant::now() < deadline, "slots never freed");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn helpers() {
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n\r\nbody"), Some(18));
        assert_eq!(head_end(b"GET / HTTP/1.1\n\nbody"), Some(16));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nA: b\r\n"), None);
        assert_eq!(head_end(b""), None);
        assert!(token_matches(b"abc", b"abc"));
        assert!(!token_matches(b"abd", b"abc"));
        assert!(!token_matches(b"ab", b"abc"));
        assert!(!token_matches(b"abcd", b"abc"));
        assert!(!token_matches(b"", b"abc"));
        assert_eq!(Route::parse("/tenants/a-b_c.9"), Some(Route::Tenant("a-b_c.9".into())));
        assert_eq!(Route::parse("/tenants/a+b"), None);
        let head = parse_head(b"PUT /x HTTP/1.1\r\nContent-Length:  0012 \r\n\r\n").expect("parses");
        assert_eq!(framing(&head), Ok(Framing::Length(12)));
        assert_eq!(head.path, "/x");
    }
}
