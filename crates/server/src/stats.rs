//! Server counters: one `ThreadStats` per worker thread (written only by that thread, relaxed
//! atomics, so no cache line is shared on the hot path), summed on demand for `stats` and the
//! Prometheus endpoint.
//!
//! Not for: store gauges (items, bytes, evictions) — those live in `slipstream-store` next to
//! the code that changes them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

macro_rules! counters {
    ($($name:ident),* $(,)?) => {
        /// Per-thread counters; field names are memcached's `stats` names.
        #[derive(Debug, Default)]
        pub struct ThreadStats {
            $(pub $name: AtomicU64,)*
        }

        /// A summed, plain copy of the counters.
        #[derive(Clone, Debug, Default)]
        pub struct CounterTotals {
            $(pub $name: u64,)*
        }

        impl ThreadStats {
            /// All zeros, usable in a `static`.
            pub const fn new_const() -> ThreadStats {
                ThreadStats { $($name: AtomicU64::new(0),)* }
            }

            /// Counter names and values, in declaration order (for `stats` and metrics).
            pub fn names() -> &'static [&'static str] {
                &[$(stringify!($name)),*]
            }

            fn add_into(&self, t: &mut CounterTotals) {
                $(t.$name += self.$name.load(Ordering::Relaxed);)*
            }

            pub fn reset(&self) {
                $(self.$name.store(0, Ordering::Relaxed);)*
            }
        }

        impl CounterTotals {
            /// (name, value) pairs in declaration order.
            pub fn pairs(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($name), self.$name)),*]
            }
        }
    };
}

counters!(
    cmd_get,
    cmd_set,
    cmd_flush,
    cmd_touch,
    cmd_meta,
    get_hits,
    get_misses,
    get_expired,
    get_flushed,
    delete_misses,
    delete_hits,
    incr_misses,
    incr_hits,
    decr_misses,
    decr_hits,
    cas_misses,
    cas_hits,
    cas_badval,
    touch_hits,
    touch_misses,
    store_too_large,
    store_no_memory,
    auth_cmds,
    auth_errors,
    // Connections closed by `-o idle_timeout`.
    idle_kicks,
    bytes_read,
    bytes_written,
    conn_yields,
    total_connections,
    rejected_connections,
    udp_datagrams_in,
    udp_datagrams_out,
    udp_bad_datagrams,
    writes,
    reads,
    // Requests executed (all protocols); the per-tenant `requests_total` metric.
    requests,
);

impl ThreadStats {
    #[inline]
    pub fn incr(c: &AtomicU64) {
        // Only the owning thread writes, so load+store is enough and avoids a locked RMW.
        c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }

    #[inline]
    pub fn add(c: &AtomicU64, n: u64) {
        c.store(c.load(Ordering::Relaxed) + n, Ordering::Relaxed);
    }
}

/// Kernel fast path counter totals (see `slipstream-fastpath`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FastPathTotals {
    /// get-like UDP requests the kernel answered.
    pub hits: u64,
    /// get-like UDP requests the kernel passed up to user space.
    pub misses: u64,
    /// Kernel copies dropped (per key) plus kernel flushes.
    pub invalidations: u64,
}

/// Where `stats` and /metrics read the fast path counters from while it is attached.
#[derive(Clone)]
pub struct FastPathSource(pub Arc<dyn Fn() -> FastPathTotals + Send + Sync>);

impl std::fmt::Debug for FastPathSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FastPathSource")
    }
}

/// Server-wide information for `stats`: start time, threads, connection gauges and every
/// thread's counters.
#[derive(Debug)]
pub struct ServerInfo {
    pub started: Instant,
    pub pid: u32,
    pub threads: usize,
    pub conn_limit: usize,
    pub tcp_port: u16,
    pub udp_port: u16,
    pub item_bytes_max: usize,
    pub curr_connections: AtomicU64,
    pub per_thread: Vec<Arc<ThreadStats>>,
    /// Fast-path counters are filled in by the kernel fast path when it is on.
    pub fastpath_enabled: bool,
    /// The kernel fast path's counters, when it is attached (zeros otherwise).
    pub fastpath: Option<FastPathSource>,
    /// The `-l` address as given (`stats settings` prints it as `inter`); None = all.
    pub listen_interface: Option<String>,
    /// Last level set by the `verbosity` command (memcached keeps it for `stats settings`).
    pub verbosity: AtomicU64,
    /// Open connections and listeners for `stats conns`. Locked only on accept, close and
    /// `stats conns`, never per request.
    pub conns: std::sync::Mutex<std::collections::BTreeMap<i32, ConnEntry>>,
    /// `stats detail` per-prefix counters (cleared by `reset`).
    pub prefix_stats: crate::stats_prefix::PrefixStats,
    /// Whether `cache_memlimit` may change the store's memory limit. False on a named
    /// tenant's ports: the admin endpoint owns a tenant's memory, so a client cannot raise it.
    pub cache_memlimit_allowed: bool,
}

/// One line group of `stats conns`: a listener or a client connection.
#[derive(Clone, Debug)]
pub struct ConnEntry {
    /// `tcp:ADDR:PORT` of the peer (or of the socket, for a listener).
    pub addr: String,
    /// For client connections, the listener they arrived on.
    pub listen_addr: Option<String>,
    /// Relative second (`ServerInfo::uptime_s`) of the last request batch, shared with the
    /// connection, which stores into it once per read batch.
    pub last_cmd_s: Arc<AtomicU64>,
}

impl ServerInfo {
    /// A ServerInfo for tests and harnesses: one thread's counters, no listeners.
    pub fn detached(per_thread: Vec<Arc<ThreadStats>>, item_bytes_max: usize) -> ServerInfo {
        ServerInfo {
            started: Instant::now(),
            pid: std::process::id(),
            threads: per_thread.len().max(1),
            conn_limit: 1024,
            tcp_port: 0,
            udp_port: 0,
            item_bytes_max,
            curr_connections: AtomicU64::new(1),
            per_thread,
            fastpath_enabled: false,
            fastpath: None,
            listen_interface: None,
            verbosity: AtomicU64::new(0),
            conns: Default::default(),
            prefix_stats: Default::default(),
            cache_memlimit_allowed: true,
        }
    }

    pub fn totals(&self) -> CounterTotals {
        let mut t = CounterTotals::default();
        for s in &self.per_thread {
            s.add_into(&mut t);
        }
        t
    }

    /// `stats reset`: every counter, and the per-prefix table (as memcached's stats_reset).
    pub fn reset(&self) {
        for s in &self.per_thread {
            s.reset();
        }
        self.prefix_stats.clear();
    }

    pub fn uptime_s(&self) -> u64 {
        self.started.elapsed().as_secs()
    }

    /// The fast path counters (all zero while it is off).
    pub fn fastpath_totals(&self) -> FastPathTotals {
        self.fastpath.as_ref().map(|f| (f.0)()).unwrap_or_default()
    }
}

/// memcached 1.6.18's general `stats`, names and order exactly as it prints them. Fields
/// Slipstream has no equivalent for (slab mover, LRU crawler, logger) report 0. Shared by the
/// text (`stats`) and binary (`Stat`) executors so the two can never disagree.
pub fn general_stats(ctx: &crate::exec::Ctx<'_>) -> Vec<(&'static str, String)> {
    let server = ctx.server;
    let t = server.totals();
    let st = ctx.store.stats();
    let curr_conns = server.curr_connections.load(std::sync::atomic::Ordering::Relaxed);
    let (user, system) = rusage();
    let mut v: Vec<(&'static str, String)> = Vec::with_capacity(96);
    let mut put = |name: &'static str, value: String| v.push((name, value));
    put("pid", server.pid.to_string());
    put("uptime", server.uptime_s().to_string());
    put("time", ctx.store.clock().now_unix_s().to_string());
    put("version", ctx.settings.version.to_string());
    put("libevent", "slipstream".to_string());
    put("pointer_size", usize::BITS.to_string());
    put("rusage_user", user);
    put("rusage_system", system);
    put("max_connections", server.conn_limit.to_string());
    put("curr_connections", curr_conns.to_string());
    put("total_connections", t.total_connections.to_string());
    put("rejected_connections", t.rejected_connections.to_string());
    put("connection_structures", curr_conns.to_string());
    for name in ["response_obj_oom", "response_obj_count", "response_obj_bytes", "read_buf_count"] {
        put(name, "0".to_string());
    }
    for name in ["read_buf_bytes", "read_buf_bytes_free", "read_buf_oom"] {
        put(name, "0".to_string());
    }
    put("reserved_fds", "20".to_string());
    let counters = [
        ("cmd_get", t.cmd_get),
        ("cmd_set", t.cmd_set),
        ("cmd_flush", t.cmd_flush),
        ("cmd_touch", t.cmd_touch),
        ("cmd_meta", t.cmd_meta),
        ("get_hits", t.get_hits),
        ("get_misses", t.get_misses),
        ("get_expired", t.get_expired + st.get_expired),
        ("get_flushed", t.get_flushed + st.get_flushed),
        ("delete_misses", t.delete_misses),
        ("delete_hits", t.delete_hits),
        ("incr_misses", t.incr_misses),
        ("incr_hits", t.incr_hits),
        ("decr_misses", t.decr_misses),
        ("decr_hits", t.decr_hits),
        ("cas_misses", t.cas_misses),
        ("cas_hits", t.cas_hits),
        ("cas_badval", t.cas_badval),
        ("touch_hits", t.touch_hits),
        ("touch_misses", t.touch_misses),
        ("store_too_large", t.store_too_large),
        ("store_no_memory", t.store_no_memory),
        ("auth_cmds", t.auth_cmds),
        ("auth_errors", t.auth_errors),
        ("bytes_read", t.bytes_read),
        ("bytes_written", t.bytes_written),
        ("limit_maxbytes", st.limit_maxbytes),
    ];
    for (name, value) in counters {
        put(name, value.to_string());
        // memcached lists idle_kicks only when -o idle_timeout is set.
        if name == "auth_errors" && ctx.settings.tunables.idle_timeout_s > 0 {
            put("idle_kicks", t.idle_kicks.to_string());
        }
    }
    put("accepting_conns", "1".to_string());
    put("listen_disabled_num", "0".to_string());
    put("time_in_listen_disabled_us", "0".to_string());
    put("threads", server.threads.to_string());
    put("conn_yields", t.conn_yields.to_string());
    put("hash_power_level", "16".to_string());
    put("hash_bytes", "524288".to_string());
    put("hash_is_expanding", "0".to_string());
    for name in [
        "slab_reassign_rescues",
        "slab_reassign_chunk_rescues",
        "slab_reassign_evictions_nomem",
        "slab_reassign_inline_reclaim",
        "slab_reassign_busy_items",
        "slab_reassign_busy_deletes",
        "slab_reassign_running",
        "slabs_moved",
        "lru_crawler_running",
        "lru_crawler_starts",
        "lru_maintainer_juggles",
        "malloc_fails",
        "log_worker_dropped",
        "log_worker_written",
        "log_watcher_skipped",
        "log_watcher_sent",
        "log_watchers",
        "unexpected_napi_ids",
        "round_robin_fallback",
    ] {
        put(name, "0".to_string());
    }
    put("bytes", st.bytes.to_string());
    put("curr_items", st.curr_items.to_string());
    put("total_items", st.total_items.to_string());
    put("slab_global_page_pool", "0".to_string());
    put("expired_unfetched", st.expired_unfetched.to_string());
    put("evicted_unfetched", st.evicted_unfetched.to_string());
    put("evicted_active", "0".to_string());
    put("evictions", st.evictions.to_string());
    put("reclaimed", st.reclaimed.to_string());
    for name in [
        "crawler_reclaimed",
        "crawler_items_checked",
        "lrutail_reflocked",
        "moves_to_cold",
        "moves_to_warm",
        "moves_within_lru",
        "direct_reclaims",
        "lru_bumps_dropped",
    ] {
        put(name, "0".to_string());
    }
    // Slipstream's own: the kernel fast path (0 while it is off).
    let fp = server.fastpath_totals();
    put("fastpath_hits", fp.hits.to_string());
    put("fastpath_misses", fp.misses.to_string());
    put("fastpath_invalidations", fp.invalidations.to_string());
    v
}

/// User and system CPU time as memcached prints them (`seconds.microseconds`).
fn rusage() -> (String, String) {
    // SAFETY: getrusage only writes into the zero-initialised struct we own; RUSAGE_SELF is
    // always a valid `who`.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut ru) != 0 {
            return ("0.000000".to_string(), "0.000000".to_string());
        }
        ru
    };
    let fmt = |tv: libc::timeval| format!("{}.{:06}", tv.tv_sec, tv.tv_usec);
    (fmt(ru.ru_utime), fmt(ru.ru_stime))
}

