//! The admin HTTP endpoint: `GET /healthz`, `GET /metrics` (Prometheus text format) and the
//! runtime tenant control surface (`GET /tenants`, `GET|PUT|DELETE /tenants/{name}`).
//!
//! What it is for: operators, scrapers and orchestration (liveness probes). HTTP/1.1 itself —
//! parsing, framing, writing replies — is hyper's (see `server.rs`, which also holds every
//! connection and time limit); this file holds what the endpoint means: routes, the auth rule,
//! replies and their JSON bodies. `metrics.rs` renders `/metrics`.
//!
//! Security: when a token is configured every route except `/healthz` needs
//! `Authorization: Bearer <token>` (compared in constant time); without a token the read-only
//! routes are open and every change is refused (403). The endpoint should listen on loopback;
//! tenants themselves are separated by port, not by anything here. `/healthz` needs no token
//! and does no work, so a probe stays cheap; idle and slow clients cannot starve it (the
//! header timeout closes them, and at the connection cap the oldest idle one makes room).
//!
//! What it is not for: the cache protocols, tenant validation rules (slipstream-tenancy's
//! spec.rs) or applying changes (the server's `TenantControl` implementation).

mod metrics;
mod server;

pub use metrics::render_metrics;
pub use server::{
    CONNECTIONS_MAX, DRAIN_BYTES_MAX, DRAIN_TIMEOUT_MS, HEADERS_MAX, HEADER_READ_TIMEOUT_MS, REPLY_TIMEOUT_MS,
    REQUEST_BYTES_MAX, REQUEST_TIMEOUT_MS,
};

use crate::stats::ServerInfo;
use metrics::AdminCounters;
use serde_json::Value;
use slipstream_store::Store;
use slipstream_tenancy::spec::{JSON_BYTES_MAX, NAME_BYTES_MAX};
use slipstream_tenancy::{ControlError, ReplicaChange, TenantControl, TenantPatch, TenantSpec};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

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

/// Everything a request handler sees.
struct Shared {
    state: AdminState,
    counters: AdminCounters,
}

/// Bind, then serve on a background thread of its own; returns the bound address.
pub fn start(addr: SocketAddr, state: AdminState) -> io::Result<SocketAddr> {
    server::start(addr, shared(state), server::Limits::default())
}

fn shared(mut state: AdminState) -> Arc<Shared> {
    // An empty token would let `Authorization: Bearer ` through; treat it as no token at all.
    if state.token.as_deref().is_some_and(str::is_empty) {
        state.token = None;
    }
    Arc::new(Shared { state, counters: AdminCounters::default() })
}

// ---------------------------------------------------------------------------------------------
// Replies

/// A reply before it becomes an HTTP response (`server.rs` does that).
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
}

// ---------------------------------------------------------------------------------------------
// Requests (as hyper parsed them) and their bodies

/// How the body is framed, from the head hyper parsed (it has already refused malformed,
/// conflicting and overflowing `Content-Length`s, and drops a `Content-Length` that comes with
/// `Transfer-Encoding`).
#[derive(Debug, PartialEq)]
enum Framing {
    None,
    Length(u64),
    /// `Transfer-Encoding`: we take only sized bodies.
    Unsized,
}

fn framing(headers: &http::HeaderMap) -> Result<Framing, Reply> {
    if headers.contains_key(http::header::TRANSFER_ENCODING) {
        return Ok(Framing::Unsized);
    }
    let mut lengths = headers.get_all(http::header::CONTENT_LENGTH).iter();
    match (lengths.next(), lengths.next()) {
        (None, _) => Ok(Framing::None),
        (Some(v), None) => v
            .to_str()
            .ok()
            .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|s| s.parse().ok())
            .map(Framing::Length)
            .ok_or_else(|| Reply::error(400, "malformed Content-Length")),
        (Some(_), Some(_)) => Err(Reply::error(400, "more than one Content-Length")),
    }
}

/// The body length to read, or the refusal; checked before a byte of the body is read.
fn body_len(framing: &Framing, method: &str) -> Result<usize, Reply> {
    match (framing, method) {
        (Framing::Unsized, _) => Err(Reply::error(411, "Content-Length required (chunked bodies are not accepted)")),
        (Framing::None, "PUT") => Err(Reply::error(411, "Content-Length required")),
        (Framing::None, _) => Ok(0),
        (Framing::Length(len), _) => match usize::try_from(*len) {
            Ok(len) if len <= JSON_BYTES_MAX => Ok(len),
            _ => Err(Reply::error(413, &format!("body over {JSON_BYTES_MAX} bytes"))),
        },
    }
}

/// The request target must be a path (origin form): not `*`, not `host:port`, not a full URL.
fn origin_path(uri: &http::Uri) -> Result<&str, Reply> {
    if uri.scheme().is_some() || uri.authority().is_some() || !uri.path().starts_with('/') {
        return Err(Reply::error(400, "request target must be a path"));
    }
    Ok(uri.path())
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

/// Exactly one `Authorization: Bearer <token>` header with the right token.
fn authorized(headers: &http::HeaderMap, token: &str) -> bool {
    let mut auths = headers.get_all(http::header::AUTHORIZATION).iter();
    let (Some(v), None) = (auths.next(), auths.next()) else {
        return false;
    };
    let v = v.as_bytes();
    let Some(sp) = v.iter().position(|&b| b == b' ') else {
        return false;
    };
    let (scheme, rest) = v.split_at(sp);
    scheme.eq_ignore_ascii_case(b"bearer") && token_matches(trim_ows(rest), token.as_bytes())
}

/// Auth, route and method checks, in the order that leaks least: an unauthenticated client
/// learns nothing about which paths exist.
fn authorize_and_route(shared: &Shared, method: &str, path: &str, headers: &http::HeaderMap) -> Result<Route, Reply> {
    let route = Route::parse(path);
    if route != Some(Route::Healthz) {
        if let Some(token) = &shared.state.token {
            if !authorized(headers, token) {
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
    if !route.allows(method) {
        let mut r = Reply::error(405, &format!("{method} is not allowed here"));
        r.headers.push(("Allow", route.allow().into()));
        return Err(r);
    }
    if method != "GET" && shared.state.token.is_none() {
        return Err(Reply::error(403, "admin_token not configured"));
    }
    Ok(route)
}

fn dispatch(shared: &Shared, method: &str, route: Route, body: &[u8]) -> Reply {
    match route {
        Route::Healthz => Reply::text(200, "text/plain; charset=utf-8", "ok\n".into()),
        Route::Metrics => Reply::text(200, "text/plain; version=0.0.4; charset=utf-8", metrics::render(shared)),
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
            let change = match replica_change(obj) {
                Ok(c) => c,
                Err(msg) => return Reply::error(400, &msg),
            };
            if let Some(change) = change {
                if let Err(e) = t.change_replica(name, change) {
                    return control_error(&e);
                }
                if obj.is_empty() {
                    return match t.get(name) {
                        Some(v) => Reply::value(200, serde_json::to_value(&v)),
                        None => not_found_tenant(name),
                    };
                }
            }
            let patch = match serde_json::to_vec(&doc)
                .map_err(|e| e.to_string())
                .and_then(|b| TenantPatch::from_json(&b).map_err(|e| e.to_string()))
            {
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
            let spec = match serde_json::to_vec(&doc)
                .map_err(|e| e.to_string())
                .and_then(|b| TenantSpec::from_json(&b).map_err(|e| e.to_string()))
            {
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

/// The replication keys of a tenant edit (taken out of `obj`): `leader`, `add_voter` with
/// `address`, or `remove_voter` — one of them per request.
fn replica_change(obj: &mut serde_json::Map<String, Value>) -> Result<Option<ReplicaChange>, String> {
    let id = |v: Value, key: &str| {
        v.as_u64().filter(|&n| n > 0).ok_or_else(|| format!("{key} must be a node id (1 or more)"))
    };
    let leader = obj.remove("leader");
    let add = obj.remove("add_voter");
    let address = obj.remove("address");
    let remove = obj.remove("remove_voter");
    let change = match (leader, add, remove) {
        (None, None, None) => None,
        (Some(l), None, None) => Some(ReplicaChange::Leader(id(l, "leader")?)),
        (None, Some(a), None) => {
            let addr = address
                .as_ref()
                .and_then(Value::as_str)
                .and_then(|s| s.parse::<SocketAddr>().ok())
                .ok_or("add_voter needs \"address\": \"ip:port\" (the node's raft address)")?;
            Some(ReplicaChange::AddVoter(id(a, "add_voter")?, addr))
        }
        (None, None, Some(r)) => Some(ReplicaChange::RemoveVoter(id(r, "remove_voter")?)),
        _ => return Err("one of leader, add_voter, remove_voter per request".into()),
    };
    if address.is_some() && !matches!(change, Some(ReplicaChange::AddVoter(..))) {
        return Err("address goes with add_voter".into());
    }
    Ok(change)
}

#[cfg(test)]
mod tests {
    use super::*;
    use slipstream_tenancy::TenantView;
    use std::fmt::Write as _;
    use std::io::{Read, Write};
    use std::net::{Shutdown, TcpStream};
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

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
        let state =
            AdminState { node: None, tenants: control, token: token.map(str::to_string), extra_metrics: Vec::new() };
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
    fn replication_keys_of_a_tenant_edit_parse_one_at_a_time() {
        let parse = |body: &str| {
            let mut v: Value = serde_json::from_str(body).unwrap();
            let obj = v.as_object_mut().unwrap();
            replica_change(obj).map(|c| (c, obj.len()))
        };
        assert_eq!(parse(r#"{"share":0.5}"#), Ok((None, 1)));
        assert_eq!(parse(r#"{"leader":2}"#), Ok((Some(ReplicaChange::Leader(2)), 0)));
        assert_eq!(parse(r#"{"remove_voter":3,"share":0.1}"#), Ok((Some(ReplicaChange::RemoveVoter(3)), 1)));
        let add = parse(r#"{"add_voter":4,"address":"127.0.0.1:13004"}"#);
        assert_eq!(add, Ok((Some(ReplicaChange::AddVoter(4, "127.0.0.1:13004".parse().unwrap())), 0)));
        for bad in [
            r#"{"leader":0}"#,
            r#"{"leader":-1}"#,
            r#"{"leader":"1"}"#,
            r#"{"add_voter":4}"#,
            r#"{"add_voter":4,"address":"nowhere"}"#,
            r#"{"address":"127.0.0.1:1"}"#,
            r#"{"leader":1,"remove_voter":2}"#,
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
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
        for cl in [
            "Content-Length: 1x",
            "Content-Length: -1",
            "Content-Length: 1, 1",
            "Content-Length: 99999999999999999999999",
        ] {
            let r = raw(
                addr,
                format!("PUT /tenants/t1 HTTP/1.1\r\nAuthorization: Bearer {TOKEN}\r\n{cl}\r\n\r\n{{}}").as_bytes(),
            );
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
        s.write_all(
            format!("PUT /tenants/t1 HTTP/1.1\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: 50\r\n\r\n{{")
                .as_bytes(),
        )
        .expect("send");
        s.shutdown(Shutdown::Write).expect("half-close");
        assert_eq!(read_resp(&mut s).status, 400);
        assert!(mock.calls().is_empty());
        // The body may arrive in pieces after the head.
        let body = r#"{"tcp_port":12000,"share":0.5}"#;
        let mut s = TcpStream::connect(addr).expect("connect");
        s.write_all(
            format!(
                "PUT /tenants/t1 HTTP/1.1\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: {}\r\n\r\n",
                body.len()
            )
            .as_bytes(),
        )
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
        for path in [
            "/",
            "/nope",
            "/tenants/",
            "/tenants/a/b",
            "/tenants/bad%20name",
            "/tenants/caf%C3%A9",
            "/metricsx",
            "/healthz/",
        ] {
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
            // hyper refuses versions other than 1.x as malformed (the hand-written parser said 505).
            (b"GET /healthz HTTP/2.0\r\n\r\n", 400),
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

    /// A server with a small connection cap, to reach it cheaply.
    fn serve_capped(connections_max: usize) -> SocketAddr {
        let state = AdminState {
            node: None,
            tenants: Some(Arc::new(Mock::default())),
            token: Some(TOKEN.into()),
            extra_metrics: Vec::new(),
        };
        let limits = server::Limits { connections_max, ..server::Limits::default() };
        server::start("127.0.0.1:0".parse().expect("literal address"), shared(state), limits).expect("bind admin")
    }

    #[test]
    fn idle_connections_make_room_at_the_cap() {
        let addr = serve_capped(4);
        let idle: Vec<TcpStream> = (0..8).map(|_| TcpStream::connect(addr).expect("connect")).collect();
        std::thread::sleep(Duration::from_millis(200));
        for _ in 0..3 {
            let t0 = Instant::now();
            let r = req(addr, "GET", "/healthz", None, None);
            assert_eq!(r.status, 200);
            assert!(t0.elapsed() < Duration::from_millis(500), "{:?}", t0.elapsed());
        }
        // The oldest idle ones were closed (EOF, no reply).
        let mut first = idle.into_iter().next().expect("one");
        assert_eq!(read_resp(&mut first).status, 0);
        let m = req(addr, "GET", "/metrics", Some(TOKEN), None);
        let evicted = m
            .body
            .lines()
            .find_map(|l| l.strip_prefix("slipstream_admin_evicted_total "))
            .and_then(|v| v.parse::<u64>().ok());
        assert!(evicted.is_some_and(|n| n >= 4), "{}", m.body);
    }

    #[test]
    fn requests_in_progress_are_not_evicted() {
        let addr = serve_capped(2);
        // Two requests whose body is still coming hold both slots (until REQUEST_TIMEOUT_MS).
        let busy: Vec<TcpStream> = (0..2)
            .map(|_| {
                let mut s = TcpStream::connect(addr).expect("connect");
                let head = format!(
                    "PUT /tenants/t1 HTTP/1.1\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: 50\r\n\r\n{{"
                );
                s.write_all(head.as_bytes()).expect("send");
                s
            })
            .collect();
        std::thread::sleep(Duration::from_millis(200));
        let r = req(addr, "GET", "/healthz", None, None);
        assert_eq!(r.status, 503);
        assert_eq!(r.header("Retry-After").as_deref(), Some("1"));
        // At the deadline they get 408 and the slots come back.
        for mut s in busy {
            assert_eq!(read_resp(&mut s).status, 408);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if req(addr, "GET", "/healthz", None, None).status == 200 {
                break;
            }
            assert!(Instant::now() < deadline, "slots never freed");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn helpers() {
        assert!(token_matches(b"abc", b"abc"));
        assert!(!token_matches(b"abd", b"abc"));
        assert!(!token_matches(b"ab", b"abc"));
        assert!(!token_matches(b"abcd", b"abc"));
        assert!(!token_matches(b"", b"abc"));
        assert_eq!(Route::parse("/tenants/a-b_c.9"), Some(Route::Tenant("a-b_c.9".into())));
        assert_eq!(Route::parse("/tenants/a+b"), None);
        let mut h = http::HeaderMap::new();
        h.insert(http::header::CONTENT_LENGTH, http::HeaderValue::from_static("0012"));
        assert_eq!(framing(&h).map_err(|r| r.status), Ok(Framing::Length(12)));
        h.insert(http::header::TRANSFER_ENCODING, http::HeaderValue::from_static("chunked"));
        assert_eq!(framing(&h).map_err(|r| r.status), Ok(Framing::Unsized));
        let uri: http::Uri = "/x?y=1".parse().expect("uri");
        assert_eq!(origin_path(&uri).map_err(|r| r.status), Ok("/x"));
        let uri: http::Uri = "http://h/x".parse().expect("uri");
        assert_eq!(origin_path(&uri).map_err(|r| r.status), Err(400));
    }
}
