//! The range cache as a daemon service: its `[hbase]` config table, the Thrift listener (one
//! thread per connection, bounded), tenants' Thrift ports ([`Fronts`]: one listener and cache
//! per tenant with a `thrift_port`, shaped by its buckets), and the Prometheus metrics.

use crate::cache::{Cache, Strategy};
use crate::gen::hbase1::HbaseSyncProcessor;
use crate::service::{Handler, RangeCache};
use crate::sidecar::client::SidecarClient;
use crate::transport::serve_connection;
use serde::Deserialize;
use slipstream_tenancy::TenantShaper;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
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

/// Which tenant a Thrift front end serves (none: the `[hbase]` port of the single-store mode).
#[derive(Clone)]
pub struct TenantLink {
    pub name: String,
    /// The tenant's buckets (the same ones its KV ports pay from).
    pub shaper: Arc<TenantShaper>,
}

/// A running HBase front end: one Thrift port with its own cache, scanners and sidecar
/// subscription.
pub struct HbaseService {
    pub local_addr: SocketAddr,
    pub settings: Settings,
    pub tenant: Option<TenantLink>,
    state: Arc<RangeCache>,
    connections: Arc<AtomicUsize>,
    /// Set by [`HbaseService::stop`]: the accept loop ends.
    stopping: Arc<AtomicBool>,
    /// Open client connections (to shut down at `stop`), by a connection number.
    open: Arc<Mutex<HashMap<u64, TcpStream>>>,
}

impl HbaseService {
    /// Binds the Thrift port and starts accepting (the sidecar is dialled on first use, so the
    /// daemon starts even while HBase is still coming up; calls meanwhile get IOError).
    pub fn start(settings: Settings) -> std::io::Result<HbaseService> {
        Self::start_for(settings, None)
    }

    /// As [`HbaseService::start`], for a tenant's port when `tenant` is given: every connection
    /// on it is the tenant's and is shaped by its buckets (crate::transport).
    pub fn start_for(settings: Settings, tenant: Option<TenantLink>) -> std::io::Result<HbaseService> {
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
        let svc = HbaseService {
            local_addr,
            settings,
            tenant,
            state,
            connections: Arc::new(AtomicUsize::new(0)),
            stopping: Arc::new(AtomicBool::new(false)),
            open: Arc::new(Mutex::new(HashMap::new())),
        };
        let accept = Accept {
            state: svc.state.clone(),
            conns: svc.connections.clone(),
            max: svc.settings.connections_max,
            msg_max: svc.settings.message_bytes_max,
            stopping: svc.stopping.clone(),
            open: svc.open.clone(),
            shaper: svc.tenant.as_ref().map(|t| t.shaper.clone()),
        };
        std::thread::Builder::new().name("hbase-accept".into()).spawn(move || accept.run(listener))?;
        Ok(svc)
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
        render_metrics(&[self], out);
    }

    /// The cache's memory limit changes (a tenant's `memory_mb` edited at run time): evicts
    /// down to it at once.
    pub fn set_memory_limit(&self, bytes: usize) {
        self.state.cache().set_memory_limit(bytes);
    }

    /// Closes the port and every connection on it and drops what was cached (a tenant removed).
    /// The sidecar subscription ends when the last connection thread has let go of the cache.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        // Wakes the blocking accept, which sees the flag and drops the listener.
        let _ = TcpStream::connect_timeout(&self.local_addr, Duration::from_secs(1));
        for (_, c) in lock(&self.open).drain() {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
        self.state.cache().clear_all();
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The accept loop's share of the service.
struct Accept {
    state: Arc<RangeCache>,
    conns: Arc<AtomicUsize>,
    max: usize,
    msg_max: usize,
    stopping: Arc<AtomicBool>,
    open: Arc<Mutex<HashMap<u64, TcpStream>>>,
    shaper: Option<Arc<TenantShaper>>,
}

impl Accept {
    fn run(self, listener: TcpListener) {
        let mut next_id = 0u64;
        for stream in listener.incoming() {
            if self.stopping.load(Ordering::SeqCst) {
                return;
            }
            let Ok(stream) = stream else { continue };
            if self.conns.fetch_add(1, Ordering::SeqCst) >= self.max {
                // Over the limit: close at once (the client sees the connection end).
                self.conns.fetch_sub(1, Ordering::SeqCst);
                continue;
            }
            next_id += 1;
            let id = next_id;
            if let Ok(c) = stream.try_clone() {
                lock(&self.open).insert(id, c);
            }
            if self.stopping.load(Ordering::SeqCst) {
                // `stop` ran between the accept and the insert: it did not see this one.
                lock(&self.open).remove(&id);
                self.conns.fetch_sub(1, Ordering::SeqCst);
                return;
            }
            let (st, c, open, shaper, msg_max) =
                (self.state.clone(), self.conns.clone(), self.open.clone(), self.shaper.clone(), self.msg_max);
            let spawned = std::thread::Builder::new().name("hbase-conn".into()).spawn(move || {
                let hot = Handler(st.clone());
                let processor = HbaseSyncProcessor::new(Handler(st));
                // A protocol error closes this connection only; nothing else is affected.
                let _ = serve_connection(stream, &processor, &hot, msg_max, shaper.as_deref());
                lock(&open).remove(&id);
                c.fetch_sub(1, Ordering::SeqCst);
            });
            if spawned.is_err() {
                lock(&self.open).remove(&id);
                self.conns.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }
}

/// Every Thrift front end of a daemon in tenant mode, one per tenant with a `thrift_port`,
/// each built from the `[hbase]` table (sidecar, strategy, limits) with the tenant's address,
/// port and memory share. The tenant table opens and closes them (through the binary).
pub struct Fronts {
    base: Settings,
    list: Mutex<Vec<HbaseService>>,
}

impl Fronts {
    pub fn new(base: Settings) -> Fronts {
        Fronts { base, list: Mutex::new(Vec::new()) }
    }

    /// Opens `tenant`'s Thrift port at `addr` with a cache of `memory_bytes`.
    pub fn start_tenant(&self, tenant: TenantLink, addr: SocketAddr, memory_bytes: usize) -> std::io::Result<String> {
        let settings = Settings { thrift_addr: addr, memory_bytes_max: memory_bytes.max(1), ..self.base.clone() };
        let svc = HbaseService::start_for(settings, Some(tenant))?;
        let line = svc.describe();
        lock(&self.list).push(svc);
        Ok(line)
    }

    fn find<R>(&self, name: &str, f: impl FnOnce(&HbaseService) -> R) -> Option<R> {
        lock(&self.list).iter().find(|s| s.tenant.as_ref().is_some_and(|t| t.name == name)).map(f)
    }

    pub fn set_memory_limit(&self, name: &str, bytes: usize) {
        self.find(name, |s| s.set_memory_limit(bytes.max(1)));
    }

    /// Closes `name`'s Thrift port (its connections, its cache).
    pub fn stop_tenant(&self, name: &str) {
        let mut list = lock(&self.list);
        if let Some(i) = list.iter().position(|s| s.tenant.as_ref().is_some_and(|t| t.name == name)) {
            list.remove(i).stop();
        }
    }

    pub fn local_addr(&self, name: &str) -> Option<SocketAddr> {
        self.find(name, |s| s.local_addr)
    }

    /// Every front end's metrics, one family at a time (each series labelled with its tenant).
    pub fn render_metrics(&self, out: &mut String) {
        let list = lock(&self.list);
        let refs: Vec<&HbaseService> = list.iter().collect();
        render_metrics(&refs, out);
    }
}

fn metric(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP slipstream_hbase_{name} {help}\n# TYPE slipstream_hbase_{name} {kind}");
}

fn label(table: &[u8]) -> String {
    String::from_utf8_lossy(table).replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// The series labels of a front end: its tenant (none on the `[hbase]` port) and `more`.
fn labels(svc: &HbaseService, more: &str) -> String {
    let tenant = svc.tenant.as_ref().map(|t| format!("tenant=\"{}\"", label(t.name.as_bytes())));
    match (tenant, more.is_empty()) {
        (None, true) => String::new(),
        (None, false) => format!("{{{more}}}"),
        (Some(t), true) => format!("{{{t}}}"),
        (Some(t), false) => format!("{{{t},{more}}}"),
    }
}

#[allow(clippy::too_many_lines)] // a table of metric series
fn render_metrics(fronts: &[&HbaseService], out: &mut String) {
    type Front = fn(&HbaseService) -> u64;
    let scalars: [(&str, &str, &str, Front); 8] = [
        ("scanners_opened_total", "counter", "Scanners opened through the Thrift API", |f| {
            f.state.stats.scanners_opened.load(Ordering::Relaxed)
        }),
        ("sidecar_calls_total", "counter", "Requests sent to the HBase sidecar", |f| {
            f.state.stats.sidecar_calls.load(Ordering::Relaxed)
        }),
        (
            "refills_total",
            "counter",
            "Rows re-read from HBase right after a write (through Slipstream or reported by the RegionObserver) invalidated them (each-row)",
            |f| f.state.stats.refills.load(Ordering::Relaxed),
        ),
        ("connections", "gauge", "Open Thrift client connections", |f| f.connections.load(Ordering::Relaxed) as u64),
        (
            "notify_channel_up",
            "gauge",
            "1 while subscribed to write notices within the lease (else the cache is bypassed)",
            |f| f.state.channel().0 as u64,
        ),
        (
            "observer_loaded",
            "gauge",
            "1 if the sidecar reports the RegionObserver (writes by other HBase clients are covered)",
            |f| f.state.channel().1 as u64,
        ),
        ("cache_bytes", "gauge", "Bytes held by the range cache (a tenant's: counted against its memory_mb)", |f| {
            f.state.cache().bytes() as u64
        }),
        ("cache_limit_bytes", "gauge", "The range cache's memory limit (a tenant's: its thrift_cache_mb, or half its memory_mb)", |f| {
            f.state.cache().memory_limit() as u64
        }),
    ];
    for (name, kind, help, pick) in scalars {
        metric(out, name, kind, help);
        for f in fronts {
            let _ = writeln!(out, "slipstream_hbase_{name}{} {}", labels(f, ""), pick(f));
        }
    }
    metric(out, "strategy", "gauge", "Strategy serving scans (1 = chosen)");
    for f in fronts {
        let more = format!("strategy=\"{}\"", f.state.cache().strategy().name());
        let _ = writeln!(out, "slipstream_hbase_strategy{} 1", labels(f, &more));
    }
    let tables: Vec<_> = fronts.iter().map(|f| (*f, f.state.cache().table_stats())).collect();
    type Pick = fn(&crate::cache::Stats) -> u64;
    let per_table: [(&str, &str, Pick); 9] = [
        ("all_row_hits_total", "Queries answered from all-row entries", |s| s.hits_all_row),
        ("each_row_hits_total", "Queries answered from each-row entries", |s| s.hits_each_row),
        ("misses_total", "Queries that went to HBase", |s| s.misses),
        ("fills_total", "Results stored in the cache", |s| s.fills),
        ("fills_discarded_total", "Results dropped because a write raced them (version check)", |s| s.fills_discarded),
        ("invalidations_total", "Entries dropped by writes or table changes", |s| s.invalidations),
        ("evictions_total", "Entries evicted by the memory limit", |s| s.evictions),
        ("notices_total", "Write notices from the RegionObserver (writes by any HBase client)", |s| s.notices),
        (
            "switch_drops_total",
            "Adaptive: entries of the strategy a scan shape left (all-row entries, or each-row rows), dropped at the switch",
            |s| s.switch_drops,
        ),
    ];
    for (name, help, pick) in per_table {
        metric(out, name, "counter", help);
        for (f, ts) in &tables {
            for (t, st, _) in ts {
                let _ = writeln!(out, "slipstream_hbase_{name}{} {}", labels(f, &table_label(t)), pick(st));
            }
        }
    }
    type PickPair = fn(&crate::cache::Stats) -> (u64, u64);
    let per_strategy: [(&str, &str, &str, PickPair); 2] = [
        (
            "strategy_chosen_total",
            "counter",
            "Gets and scans (first pages) decided for all-row or each-row entries, per table",
            |s| (s.chosen_all_row, s.chosen_each_row),
        ),
        (
            "adaptive_shapes",
            "gauge",
            "Adaptive strategy: scan shapes tracked per table, by the strategy each is on now",
            |s| (s.shapes_all_row, s.shapes_each_row),
        ),
    ];
    for (metric_name, kind, help, pick) in per_strategy {
        metric(out, metric_name, kind, help);
        for (f, ts) in &tables {
            for (t, st, _) in ts {
                let (all, each) = pick(st);
                for (name, v) in [("all-row", all), ("each-row", each)] {
                    let more = format!("{},strategy=\"{name}\"", table_label(t));
                    let _ = writeln!(out, "slipstream_hbase_{metric_name}{} {v}", labels(f, &more));
                }
            }
        }
    }
    metric(out, "table_cache_bytes", "gauge", "Bytes cached per table");
    for (f, ts) in &tables {
        for (t, _, bytes) in ts {
            let _ = writeln!(out, "slipstream_hbase_table_cache_bytes{} {bytes}", labels(f, &table_label(t)));
        }
    }
}

fn table_label(t: &[u8]) -> String {
    format!("table=\"{}\"", label(t))
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
