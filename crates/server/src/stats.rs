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
    /// The `-l` address as given (`stats settings` prints it as `inter`); None = all.
    pub listen_interface: Option<String>,
    /// Last level set by the `verbosity` command (memcached keeps it for `stats settings`).
    pub verbosity: AtomicU64,
}

impl ServerInfo {
    pub fn totals(&self) -> CounterTotals {
        let mut t = CounterTotals::default();
        for s in &self.per_thread {
            s.add_into(&mut t);
        }
        t
    }

    pub fn reset(&self) {
        for s in &self.per_thread {
            s.reset();
        }
    }

    pub fn uptime_s(&self) -> u64 {
        self.started.elapsed().as_secs()
    }
}
