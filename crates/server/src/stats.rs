//! Server counters: one `ThreadStats` per worker thread (written only by that thread, relaxed
//! atomics, so no cache line is shared on the hot path), summed on demand for `stats` and the
//! Prometheus endpoint.
//!
//! Not for: store gauges (items, bytes, evictions) — those live in `slipstream-store` next to
//! the code that changes them — or the lists `stats` prints (`stats_report.rs`).

use std::os::fd::AsRawFd;
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
    /// Fills that first waited for kernel readers of freed map elements.
    pub fill_graces: u64,
    /// Fills skipped because those readers did not finish in time.
    pub fills_deferred: u64,
}

/// Where `stats` and /metrics read the fast path counters from: None while it is not attached
/// (then `stats` shows memcached's names only).
#[derive(Clone)]
pub struct FastPathSource(pub Arc<dyn Fn() -> Option<FastPathTotals> + Send + Sync>);

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
    /// When the last request batch came, shared with the connection (or UDP socket), which
    /// marks it once per read batch.
    pub last_cmd: Arc<LastCmd>,
    /// `watch` handed the connection to the log writer (memcached's `conn_watch`).
    pub watching: bool,
}

impl ConnEntry {
    /// A listener's or UDP socket's entry, created `now_s` (`ServerInfo::uptime_s`).
    pub fn socket(addr: String, now_s: u64) -> ConnEntry {
        ConnEntry { addr, listen_addr: None, last_cmd: Arc::new(LastCmd::new(now_s)), watching: false }
    }
}

/// The relative second (`ServerInfo::uptime_s`) of a connection's last request batch, and
/// whether it has sent one at all (memcached shows a connection that never did as
/// `conn_new_cmd`, one idle after a request as `conn_read`).
#[derive(Debug, Default)]
pub struct LastCmd(AtomicU64);

impl LastCmd {
    /// Set when a request was seen (seconds never reach this bit).
    const SEEN: u64 = 1 << 63;
    /// Set while the connection waits for the rest of a request whose command it has read
    /// (a storage command's data block, a binary body): memcached's `conn_nread`.
    const AWAITING_DATA: u64 = 1 << 62;

    /// Opened at `now_s`, no request yet.
    pub fn new(now_s: u64) -> LastCmd {
        LastCmd(AtomicU64::new(now_s & !Self::SEEN))
    }

    /// A request batch came at `now_s`.
    pub fn mark(&self, now_s: u64) {
        self.0.store(now_s | Self::SEEN, Ordering::Relaxed);
    }

    /// The second of the last request (of the opening while there was none).
    pub fn secs(&self) -> u64 {
        self.0.load(Ordering::Relaxed) & !(Self::SEEN | Self::AWAITING_DATA)
    }

    /// Whether the connection waits for a request's data (see `AWAITING_DATA`).
    pub fn awaiting_data(&self) -> bool {
        self.0.load(Ordering::Relaxed) & Self::AWAITING_DATA != 0
    }

    /// Record whether the connection's unconsumed input is a request waiting for its data.
    pub fn set_awaiting_data(&self, waiting: bool) {
        if waiting {
            self.0.fetch_or(Self::AWAITING_DATA, Ordering::Relaxed);
        } else if self.awaiting_data() {
            self.0.fetch_and(!Self::AWAITING_DATA, Ordering::Relaxed);
        }
    }

    /// Whether any request came.
    pub fn seen(&self) -> bool {
        self.0.load(Ordering::Relaxed) & Self::SEEN != 0
    }
}

impl ServerInfo {
    /// List one address's sockets in `stats conns` as memcached does: its TCP listener (with
    /// SO_REUSEPORT every thread has one, and the first stands for them all) and the first
    /// `udp_listed` of its UDP sockets (`udp:` address, no listen address: an idle UDP socket).
    pub(crate) fn register_listeners(&self, b: &crate::bind::Bound, udp_listed: usize) {
        let now_s = self.uptime_s();
        let Ok(mut reg) = self.conns.lock() else { return };
        let entry = |addr: String| ConnEntry::socket(addr, now_s);
        if let Some(Some(l)) = b.0.first() {
            let addr = l.local_addr().map(|a| format!("tcp:{a}")).unwrap_or_default();
            reg.insert(l.as_raw_fd(), entry(addr));
        }
        for u in b.1.iter().flatten().take(udp_listed) {
            let addr = u.local_addr().map(|a| format!("udp:{a}")).unwrap_or_default();
            reg.insert(u.as_raw_fd(), entry(addr));
        }
    }

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
        self.fastpath_attached().unwrap_or_default()
    }

    /// The fast path counters while it is attached.
    pub fn fastpath_attached(&self) -> Option<FastPathTotals> {
        self.fastpath.as_ref().and_then(|f| (f.0)())
    }
}
