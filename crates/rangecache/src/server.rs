//! The range cache as a daemon service: its `[hbase]` config table, the Thrift listener (one
//! thread per connection, bounded), and its Prometheus metrics.

use crate::cache::{Cache, Strategy};
use crate::gen::hbase1::HbaseSyncProcessor;
use crate::service::{Handler, RangeCache};
use crate::sidecar::client::SidecarClient;
use crate::transport::serve_connection;
use serde::Deserialize;
use std::fmt::Write as _;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// `[hbase]` in the daemon's TOML file. Every key is optional.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct HbaseConfig {
    /// Address for HBase's Thrift1 API (HBase's default port is 9090).
    pub listen: String,
    pub thrift_port: u16,
    /// The sidecar (connectors/hbase) on loopback.
    pub sidecar: String,
    /// Cache budget.
    pub memory_mb: usize,
    /// "all-row", "each-row" or "adaptive" (per query shape; crate::adaptive has the policy).
    pub strategy: String,
    /// Deadline for one sidecar call; past it the client gets IOError.
    pub timeout_ms: u64,
    /// The cache serves only within this long of the sidecar's last answer (a PING every
    /// quarter keeps it up); the sidecar holds writes this long after dropping an unresponsive
    /// Slipstream, so writes by other clients are never missed.
    pub lease_ms: u64,
    pub connections_max: usize,
    pub scanners_max: usize,
    /// Largest Thrift message (or frame) accepted from a client.
    pub message_bytes_max: usize,
}

impl Default for HbaseConfig {
    fn default() -> Self {
        HbaseConfig {
            listen: "127.0.0.1".into(),
            thrift_port: 9090,
            sidecar: "127.0.0.1:9091".into(),
            memory_mb: 256,
            strategy: "all-row".into(),
            timeout_ms: 15_000,
            lease_ms: 2_000,
            connections_max: 256,
            scanners_max: 10_000,
            message_bytes_max: 16 << 20,
        }
    }
}

/// A checked `[hbase]` table.
#[derive(Clone, Debug)]
pub struct Settings {
    pub thrift_addr: SocketAddr,
    pub sidecar_addr: SocketAddr,
    pub memory_bytes_max: usize,
    pub strategy: Strategy,
    pub timeout: Duration,
    pub lease: Duration,
    pub connections_max: usize,
    pub scanners_max: usize,
    pub message_bytes_max: usize,
}

impl HbaseConfig {
    pub fn validate(&self) -> Result<Settings, String> {
        let thrift_addr: SocketAddr =
            format!("{}:{}", self.listen, self.thrift_port).parse().map_err(|e| format!("listen/thrift_port: {e}"))?;
        let sidecar_addr: SocketAddr = self.sidecar.parse().map_err(|e| format!("sidecar {:?}: {e}", self.sidecar))?;
        let strategy = Strategy::parse(&self.strategy)?;
        if self.memory_mb == 0 {
            return Err("memory_mb must be at least 1".into());
        }
        if !(100..=60_000).contains(&self.lease_ms) {
            return Err("lease_ms must be between 100 and 60000".into());
        }
        if self.timeout_ms == 0 || self.connections_max == 0 || self.scanners_max == 0 {
            return Err("timeout_ms, connections_max and scanners_max must be positive".into());
        }
        if !(1024..=(1 << 30)).contains(&self.message_bytes_max) {
            return Err("message_bytes_max must be between 1024 and 1073741824".into());
        }
        Ok(Settings {
            thrift_addr,
            sidecar_addr,
            memory_bytes_max: self.memory_mb.saturating_mul(1 << 20),
            strategy,
            timeout: Duration::from_millis(self.timeout_ms),
            lease: Duration::from_millis(self.lease_ms),
            connections_max: self.connections_max,
            scanners_max: self.scanners_max,
            message_bytes_max: self.message_bytes_max,
        })
    }
}

/// A running HBase front end.
pub struct HbaseService {
    pub local_addr: SocketAddr,
    pub settings: Settings,
    state: Arc<RangeCache>,
    connections: Arc<AtomicUsize>,
}

impl HbaseService {
    /// Binds the Thrift port and starts accepting (the sidecar is dialled on first use, so the
    /// daemon starts even while HBase is still coming up; calls meanwhile get IOError).
    pub fn start(settings: Settings) -> std::io::Result<HbaseService> {
        // The one rule every Slipstream port is opened by (exclusive to this process); this
        // service accepts with blocking calls on its own thread.
        let kind = slipstream_bind::Kind::Tcp { backlog: 1024 };
        let socket = slipstream_bind::bind_one(kind, settings.thrift_addr, &|_| Ok(())).map_err(|e| e.source)?;
        socket.set_nonblocking(false)?;
        let listener: TcpListener = socket.into();
        let local_addr = listener.local_addr()?;
        let sidecar = SidecarClient::new(settings.sidecar_addr, settings.timeout, settings.lease);
        let cache = Cache::new(settings.strategy, settings.memory_bytes_max);
        let state = Arc::new(RangeCache::new(sidecar, cache, settings.scanners_max));
        state.attach()?;
        let connections = Arc::new(AtomicUsize::new(0));
        let (st, conns, max, msg_max) =
            (state.clone(), connections.clone(), settings.connections_max, settings.message_bytes_max);
        std::thread::Builder::new()
            .name("hbase-accept".into())
            .spawn(move || accept_loop(listener, st, conns, max, msg_max))?;
        Ok(HbaseService { local_addr, settings, state, connections })
    }

    /// One line for the daemon's start-up banner.
    pub fn describe(&self) -> String {
        format!(
            "; hbase thrift {} -> sidecar {} ({}, {} MB cache)",
            self.local_addr,
            self.settings.sidecar_addr,
            self.settings.strategy.name(),
            self.settings.memory_bytes_max >> 20
        )
    }

    /// Appends this service's Prometheus metrics.
    pub fn render_metrics(&self, out: &mut String) {
        render_metrics(&self.state, self.connections.load(Ordering::Relaxed), out);
    }
}

fn accept_loop(listener: TcpListener, state: Arc<RangeCache>, conns: Arc<AtomicUsize>, max: usize, msg_max: usize) {
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        if conns.fetch_add(1, Ordering::SeqCst) >= max {
            // Over the limit: close at once (the client sees the connection end).
            conns.fetch_sub(1, Ordering::SeqCst);
            continue;
        }
        let (st, c) = (state.clone(), conns.clone());
        let spawned = std::thread::Builder::new().name("hbase-conn".into()).spawn(move || {
            let hot = Handler(st.clone());
            let processor = HbaseSyncProcessor::new(Handler(st));
            // A protocol error closes this connection only; nothing else is affected.
            let _ = serve_connection(stream, &processor, &hot, msg_max);
            c.fetch_sub(1, Ordering::SeqCst);
        });
        if spawned.is_err() {
            conns.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

fn metric(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP slipstream_hbase_{name} {help}\n# TYPE slipstream_hbase_{name} {kind}");
}

fn label(table: &[u8]) -> String {
    String::from_utf8_lossy(table).replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[allow(clippy::too_many_lines)] // a table of metric series
fn render_metrics(state: &RangeCache, connections: usize, out: &mut String) {
    let s = &state.stats;
    for (name, help, v) in [
        ("scanners_opened_total", "Scanners opened through the Thrift API", s.scanners_opened.load(Ordering::Relaxed)),
        ("sidecar_calls_total", "Requests sent to the HBase sidecar", s.sidecar_calls.load(Ordering::Relaxed)),
        (
            "refills_total",
            "Rows re-read from HBase right after a write through Slipstream invalidated them (each-row)",
            s.refills.load(Ordering::Relaxed),
        ),
    ] {
        metric(out, name, "counter", help);
        let _ = writeln!(out, "slipstream_hbase_{name} {v}");
    }
    metric(out, "connections", "gauge", "Open Thrift client connections");
    let _ = writeln!(out, "slipstream_hbase_connections {connections}");
    let (lease, observer) = state.channel();
    metric(
        out,
        "notify_channel_up",
        "gauge",
        "1 while subscribed to write notices within the lease (else the cache is bypassed)",
    );
    let _ = writeln!(out, "slipstream_hbase_notify_channel_up {}", lease as u8);
    metric(
        out,
        "observer_loaded",
        "gauge",
        "1 if the sidecar reports the RegionObserver (writes by other HBase clients are covered)",
    );
    let _ = writeln!(out, "slipstream_hbase_observer_loaded {}", observer as u8);
    let c = state.cache();
    metric(out, "cache_bytes", "gauge", "Bytes held by the range cache");
    let _ = writeln!(out, "slipstream_hbase_cache_bytes {}", c.bytes());
    let _ = writeln!(
        out,
        "# HELP slipstream_hbase_strategy Strategy serving scans (1 = chosen)\n# TYPE slipstream_hbase_strategy gauge"
    );
    let _ = writeln!(out, "slipstream_hbase_strategy{{strategy=\"{}\"}} 1", c.strategy().name());
    let tables = c.table_stats();
    type Pick = fn(&crate::cache::Stats) -> u64;
    let per_table: [(&str, &str, Pick); 8] = [
        ("all_row_hits_total", "Queries answered from all-row entries", |s| s.hits_all_row),
        ("each_row_hits_total", "Queries answered from each-row entries", |s| s.hits_each_row),
        ("misses_total", "Queries that went to HBase", |s| s.misses),
        ("fills_total", "Results stored in the cache", |s| s.fills),
        ("fills_discarded_total", "Results dropped because a write raced them (version check)", |s| s.fills_discarded),
        ("invalidations_total", "Entries dropped by writes or table changes", |s| s.invalidations),
        ("evictions_total", "Entries evicted by the memory limit", |s| s.evictions),
        ("notices_total", "Write notices from the RegionObserver (writes by any HBase client)", |s| s.notices),
    ];
    for (name, help, pick) in per_table {
        metric(out, name, "counter", help);
        for (t, st, _) in &tables {
            let _ = writeln!(out, "slipstream_hbase_{name}{{table=\"{}\"}} {}", label(t), pick(st));
        }
    }
    metric(
        out,
        "strategy_chosen_total",
        "counter",
        "Gets and scans (first pages) decided for all-row or each-row entries, per table",
    );
    for (t, st, _) in &tables {
        for (name, v) in [("all-row", st.chosen_all_row), ("each-row", st.chosen_each_row)] {
            let _ = writeln!(
                out,
                "slipstream_hbase_strategy_chosen_total{{table=\"{}\",strategy=\"{name}\"}} {v}",
                label(t)
            );
        }
    }
    metric(out, "table_cache_bytes", "gauge", "Bytes cached per table");
    for (t, _, bytes) in &tables {
        let _ = writeln!(out, "slipstream_hbase_table_cache_bytes{{table=\"{}\"}} {bytes}", label(t));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_defaults_and_errors() {
        let d = HbaseConfig::default().validate().unwrap();
        assert_eq!(d.thrift_addr.port(), 9090);
        assert_eq!(d.strategy, Strategy::AllRow);
        let a = HbaseConfig { strategy: "adaptive".into(), ..Default::default() };
        assert_eq!(a.validate().unwrap().strategy, Strategy::Adaptive);
        let bad = HbaseConfig { strategy: "sometimes".into(), ..Default::default() };
        assert!(bad.validate().unwrap_err().contains("unknown strategy"));
        let bad = HbaseConfig { sidecar: "nope".into(), ..Default::default() };
        assert!(bad.validate().is_err());
    }

    #[test]
    fn config_table_parses_and_rejects_unknown_keys() {
        let c: HbaseConfig = toml::from_str("thrift_port = 9999\nstrategy = \"each-row\"\n").unwrap();
        let s = c.validate().unwrap();
        assert_eq!((s.thrift_addr.port(), s.strategy, s.memory_bytes_max), (9999, Strategy::EachRow, 256 << 20));
        assert!(toml::from_str::<HbaseConfig>("thrift_prot = 1\n").is_err());
    }
}
