//! `/metrics`: Prometheus text exposition (format 0.0.4) of the endpoint's own counters, the
//! single-tenant server's counters and store gauges, the tenants' and other services' text.
//!
//! Every family is written through [`family`], so each has its `# HELP` and `# TYPE` line; the
//! endpoint's own counters are declared once in [`AdminCounters`] next to their help text.
//! Not for: per-tenant series (the server's `TenantControl::render_metrics`) or the stream
//! engine's (streamsvc), which write their own HELP/TYPE.

use super::Shared;
use crate::stats::ServerInfo;
use slipstream_store::Store;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

/// The endpoint's own counters, shown in `/metrics`.
#[derive(Default)]
pub(super) struct AdminCounters {
    /// Requests whose head was read and parsed (hyper's own 400/431 replies are not counted).
    pub requests: AtomicU64,
    pub unauthorized: AtomicU64,
    /// Connections refused with 503 because every slot held a request in progress.
    pub busy: AtomicU64,
    pub connections: AtomicU64,
    /// Idle connections closed early to make room for a new one at the connection cap.
    pub evicted: AtomicU64,
    /// Connections closed because the request head (or body) did not arrive in time.
    pub timeouts: AtomicU64,
}

impl AdminCounters {
    /// (name without `slipstream_` and `_total`, help, counter), the one list `/metrics` shows.
    fn series(&self) -> [(&'static str, &'static str, &AtomicU64); 6] {
        [
            ("admin_requests", "Admin HTTP requests read", &self.requests),
            ("admin_unauthorized", "Admin requests refused for a missing or wrong token", &self.unauthorized),
            ("admin_busy", "Admin connections refused because all slots held requests in progress", &self.busy),
            ("admin_connections", "Admin TCP connections accepted", &self.connections),
            ("admin_evicted", "Idle admin connections closed to make room at the connection cap", &self.evicted),
            ("admin_timeouts", "Admin connections closed because the request did not arrive in time", &self.timeouts),
        ]
    }
}

/// Metric kinds we write.
#[derive(Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
}

/// One single-series family: `# HELP`, `# TYPE` and the sample. `name` is the full name
/// (counters end in `_total`).
fn family(out: &mut String, name: &str, kind: Kind, help: &str, value: u64) {
    let kind = match kind {
        Kind::Counter => "counter",
        Kind::Gauge => "gauge",
    };
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}");
}

/// The whole `/metrics` body.
pub(super) fn render(shared: &Shared) -> String {
    let mut out = match &shared.state.node {
        Some((info, store)) => render_metrics(info, store),
        None => String::new(),
    };
    for (name, help, c) in shared.counters.series() {
        family(&mut out, &format!("slipstream_{name}_total"), Kind::Counter, help, c.load(Ordering::Relaxed));
    }
    if let Some(t) = &shared.state.tenants {
        family(&mut out, "slipstream_tenants", Kind::Gauge, "Tenants configured", t.list().len() as u64);
        t.render_metrics(&mut out);
    }
    for f in &shared.state.extra_metrics {
        f(&mut out);
    }
    out
}

/// Help for a server counter (field names are memcached's `stats` names, see stats.rs).
fn counter_help(name: &str) -> String {
    let known = match name {
        "cmd_get" => "Keys requested by get-like commands",
        "cmd_set" => "Storage commands (set, add, replace, append, prepend, cas)",
        "cmd_flush" => "flush_all commands",
        "cmd_touch" => "touch-like commands",
        "cmd_meta" => "Meta protocol commands",
        "get_hits" => "Keys found by get-like commands",
        "get_misses" => "Keys not found by get-like commands",
        "get_expired" => "Gets that found an expired item",
        "get_flushed" => "Gets that found an item invalidated by flush_all",
        "delete_misses" => "Deletes of missing keys",
        "delete_hits" => "Deletes that removed an item",
        "incr_misses" => "incr of missing keys",
        "incr_hits" => "incr of existing keys",
        "decr_misses" => "decr of missing keys",
        "decr_hits" => "decr of existing keys",
        "cas_misses" => "cas of missing keys",
        "cas_hits" => "cas that stored",
        "cas_badval" => "cas refused for a stale CAS value",
        "touch_hits" => "touch of existing keys",
        "touch_misses" => "touch of missing keys",
        "store_too_large" => "Stores refused as larger than the item size limit",
        "store_no_memory" => "Stores refused for lack of memory",
        "auth_cmds" => "Authentication commands",
        "auth_errors" => "Failed authentications",
        "bytes_read" => "Bytes read from clients",
        "bytes_written" => "Bytes written to clients",
        "conn_yields" => "Times a connection yielded to others after a request batch",
        "total_connections" => "Connections opened since start",
        "rejected_connections" => "Connections refused at the connection limit",
        "udp_datagrams_in" => "UDP datagrams received",
        "udp_datagrams_out" => "UDP datagrams sent",
        "udp_bad_datagrams" => "UDP datagrams dropped as malformed",
        "writes" => "Socket write calls",
        "reads" => "Socket read calls",
        "requests" => "Requests executed (all protocols)",
        _ => "",
    };
    if known.is_empty() {
        format!("Server counter {name} (memcached stats name)")
    } else {
        known.to_string()
    }
}

/// Prometheus text for every server counter and store gauge (single-tenant mode).
pub fn render_metrics(info: &ServerInfo, store: &Store) -> String {
    let mut out = String::new();
    let st = store.stats();
    for (name, v) in info.totals().pairs() {
        // One family per name: `get_flushed` is counted by both the server and the store and
        // shown summed, as `stats` shows it.
        let v = if name == "get_flushed" { v + st.get_flushed } else { v };
        family(&mut out, &format!("slipstream_{name}_total"), Kind::Counter, &counter_help(name), v);
    }
    let gauges: [(&str, &str, u64); 4] = [
        ("curr_items", "Items stored now", st.curr_items),
        ("bytes", "Bytes used by stored items", st.bytes),
        ("limit_maxbytes", "Memory limit for items in bytes", st.limit_maxbytes),
        ("curr_connections", "Client connections open now", info.curr_connections.load(Ordering::Relaxed)),
    ];
    for (name, help, v) in gauges {
        family(&mut out, &format!("slipstream_{name}"), Kind::Gauge, help, v);
    }
    let store_counters: [(&str, &str, u64); 5] = [
        ("total_items", "Items stored since start", st.total_items),
        ("evictions", "Items evicted to make room", st.evictions),
        ("reclaimed", "Expired items' memory reused for new items", st.reclaimed),
        ("expired_unfetched", "Items that expired without being fetched", st.expired_unfetched),
        ("evicted_unfetched", "Items evicted without being fetched", st.evicted_unfetched),
    ];
    for (name, help, v) in store_counters {
        family(&mut out, &format!("slipstream_{name}_total"), Kind::Counter, help, v);
    }
    family(&mut out, "slipstream_uptime_seconds", Kind::Gauge, "Seconds since the server started", info.uptime_s());
    family(
        &mut out,
        "slipstream_fastpath_enabled",
        Kind::Gauge,
        "1 when the kernel (XDP) fast path is attached",
        u64::from(info.fastpath_enabled),
    );
    let fp = info.fastpath_totals();
    for (name, help, v) in [
        ("fastpath_hits", "UDP get-like requests the kernel fast path answered", fp.hits),
        ("fastpath_misses", "UDP get-like requests the kernel fast path passed up to user space", fp.misses),
        ("fastpath_invalidations", "Kernel fast path copies dropped (per key) plus kernel flushes", fp.invalidations),
        (
            "fastpath_fill_graces",
            "Kernel fills that first waited until no XDP program could still hold a freed item",
            fp.fill_graces,
        ),
        (
            "fastpath_fills_deferred",
            "Kernel fills skipped because such XDP readers did not finish in time",
            fp.fills_deferred,
        ),
    ] {
        family(&mut out, &format!("slipstream_{name}_total"), Kind::Counter, help, v);
    }
    out
}
