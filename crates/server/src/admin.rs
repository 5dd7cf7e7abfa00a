//! The admin HTTP endpoint: `GET /metrics` (Prometheus text format) and `GET /healthz`.
//!
//! What it is for: operators and scrapers. It runs on its own thread with blocking I/O, one
//! request per connection, every read bounded in bytes and time, so it can never slow the
//! serving threads.
//!
//! What it is not for: the cache protocols, or (yet) runtime control — tenancy adds that.

use crate::stats::ServerInfo;
use slipstream_store::Store;
use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

/// Largest request head we read.
pub const REQUEST_BYTES_MAX: usize = 8 * 1024;
/// How long a client may take to send its request.
pub const REQUEST_TIMEOUT_MS: u64 = 2000;

/// Bind and serve in a background thread; returns the bound address.
pub fn start(addr: SocketAddr, info: Arc<ServerInfo>, store: Arc<Store>) -> io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)?;
    let local = listener.local_addr()?;
    std::thread::Builder::new().name("slipstream-admin".into()).spawn(move || {
        for stream in listener.incoming() {
            match stream {
                Ok(s) => {
                    let _ = handle(s, &info, &store);
                }
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    })?;
    Ok(local)
}

fn handle(mut s: TcpStream, info: &ServerInfo, store: &Store) -> io::Result<()> {
    s.set_read_timeout(Some(Duration::from_millis(REQUEST_TIMEOUT_MS)))?;
    s.set_write_timeout(Some(Duration::from_millis(REQUEST_TIMEOUT_MS)))?;
    let mut buf = vec![0u8; REQUEST_BYTES_MAX];
    let mut n = 0;
    while n < buf.len() {
        let k = s.read(&mut buf[n..])?;
        if k == 0 {
            break;
        }
        n += k;
        if buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
            break;
        }
    }
    let head = String::from_utf8_lossy(&buf[..n]);
    let first = head.lines().next().unwrap_or("");
    let mut parts = first.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (status, ctype, body) = match (method, path) {
        ("GET", "/metrics") => ("200 OK", "text/plain; version=0.0.4", render_metrics(info, store)),
        ("GET", "/healthz") => ("200 OK", "text/plain", "ok\n".to_string()),
        ("GET", _) => ("404 Not Found", "text/plain", "not found\n".to_string()),
        _ => ("405 Method Not Allowed", "text/plain", "only GET is served here\n".to_string()),
    };
    let resp = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(resp.as_bytes())
}

/// Prometheus text for every server counter and store gauge.
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
        ("curr_connections", info.curr_connections.load(std::sync::atomic::Ordering::Relaxed)),
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
