//! memcached's serving tunables that come from its command line (`-R`, `-B`, `-b`, `-X`, `-W`,
//! `-o idle_timeout`, `-o read_buf_mem_limit`, `-o no_lru_crawler`, ...): what the network
//! loops and executors enforce, and what `stats settings` reports for them.
//!
//! Not for: parsing them (the `slipstream` binary) or item memory (`-m`/`-M` are the store's).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// memcached `-B`: which protocols a connection may speak.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BindingProtocol {
    /// Decided by each connection's first byte (0x80 = binary), memcached's default.
    #[default]
    Auto,
    Ascii,
    Binary,
}

impl BindingProtocol {
    /// The name `stats settings` prints (`binding_protocol`).
    pub fn stats_name(self) -> &'static str {
        match self {
            BindingProtocol::Auto => "auto-negotiate",
            BindingProtocol::Ascii => "ascii",
            BindingProtocol::Binary => "binary",
        }
    }

    /// `-B NAME` as memcached spells it.
    pub fn parse(name: &str) -> Option<BindingProtocol> {
        match name {
            "auto" => Some(BindingProtocol::Auto),
            "ascii" => Some(BindingProtocol::Ascii),
            "binary" => Some(BindingProtocol::Binary),
            _ => None,
        }
    }
}

/// memcached's default `-R`.
pub const REQS_PER_EVENT_DEFAULT: u32 = 20;
/// memcached's default `-b`.
pub const TCP_BACKLOG_DEFAULT: i32 = 1024;

#[derive(Clone, Debug)]
pub struct Tunables {
    /// `-R`: requests one connection may run per event before it yields to the others
    /// (`conn_yields`). Enforced only when given (`reqs_per_event_set`): by default a batch is
    /// what one read brought, bounded by the reply-buffer high-water mark, which keeps
    /// pipelined replies coalesced in one write.
    pub reqs_per_event: u32,
    pub reqs_per_event_set: bool,
    pub binding_protocol: BindingProtocol,
    /// `-b`: accept backlog of each listener.
    pub tcp_backlog: i32,
    /// `-o idle_timeout`: close a TCP connection idle (no request, nothing unsent) for more than
    /// this many seconds (`idle_kicks`); 0 = never.
    pub idle_timeout_s: u32,
    /// `-o read_buf_mem_limit` in bytes as given (0 = unlimited), for `stats settings`.
    pub read_buf_mem_limit_bytes: u64,
    /// `-X` turns off `stats cachedump` and `lru_crawler metadump`.
    pub dump_enabled: bool,
    /// `-W` turns off `watch`.
    pub watch_enabled: bool,
    /// memcached's LRU crawler switch: off with `-o no_lru_crawler` or `lru_crawler disable`
    /// (then `lru_crawler crawl|metadump` answer as memcached's stopped crawler does), on again
    /// with `lru_crawler enable`. Shared by every connection.
    pub lru_crawler: Arc<AtomicBool>,
    /// `-o lru_crawler_sleep` / `lru_crawler_tocrawl`: the crawler's pause between steps (µs)
    /// and the most items one crawl looks at (0 = all); see `crawler`.
    pub lru_crawler_sleep_us: u32,
    pub lru_crawler_tocrawl: u32,
    /// memcached's LRU maintainer switch (`-o no_lru_maintainer` / `lru_maintainer`): the
    /// background freeing of expired items at the LRU tails (`maintainer`), and which
    /// segmented-LRU rows `stats` and `stats items` list, as memcached's does.
    pub lru_maintainer: bool,
    /// memcached-debug's test hooks (`debugtime`), on with `-o relaxed_privileges` (the option
    /// memcached's own test suite starts its `memcached-debug` with); off, `debugtime` is
    /// `ERROR` as in a memcached release build.
    pub debug_commands: bool,
    /// `-o idle_timeout` etc. given as memcached's `-o` names with no effect here: reported
    /// in `stats settings` as given so a comparison with memcached's sees the same values.
    pub maxconns_fast: bool,
    /// `-o watcher_logbuf_size` (memcached's unit, KB, times 1024): the most each `watch`
    /// connection's unsent log lines hold.
    pub watcher_logbuf_bytes: usize,
    /// `stats settings` values of memcached options accepted without effect here (slab and
    /// LRU tuning, hash table size, ...), as memcached would print them: (name, value).
    pub reported: Vec<(&'static str, String)>,
}

/// memcached's hash table: default and largest power of two of its bucket count.
const HASH_POWER_DEFAULT: u32 = 16;
const HASH_POWER_MAX: u32 = 32;

impl Tunables {
    /// The `stats settings` value an accepted no-effect option set for `name` (the last one
    /// given wins, as with memcached's options).
    pub fn reported(&self, name: &str) -> Option<&str> {
        self.reported.iter().rev().find(|(n, _)| *n == name).map(|(_, v)| v.as_str())
    }

    /// memcached's slab mover switch (`-o slab_reassign` / `no_slab_reassign` / `no_modern`):
    /// Slipstream has no slabs to move; the switch decides which `stats` rows are listed.
    pub fn slab_reassign(&self) -> bool {
        self.reported("slab_reassign") != Some("no")
    }

    /// memcached's `hash_power_level`: its table starts at `-o hashpower` (default 16) and
    /// doubles once the items exceed 1.5 per bucket; it never shrinks. Slipstream's per-shard
    /// indexes grow on their own, so this reports what memcached's table would be after the
    /// most items the store has held (`Store::items_peak`).
    pub fn hash_power_level(&self, items_peak: u64) -> u32 {
        let init = self.reported("hashpower_init").and_then(|v| v.parse::<u32>().ok()).filter(|&p| p > 0);
        let mut power = init.unwrap_or(HASH_POWER_DEFAULT);
        while power < HASH_POWER_MAX && items_peak > (1u64 << power) * 3 / 2 {
            power += 1;
        }
        power
    }

    pub fn lru_crawler_on(&self) -> bool {
        self.lru_crawler.load(Ordering::Relaxed)
    }

    /// `lru_crawler enable|disable`: memcached's reply (enabling a running crawler fails).
    pub fn switch_lru_crawler(&self, enable: bool) -> &'static [u8] {
        if enable && self.lru_crawler.swap(true, Ordering::Relaxed) {
            return b"ERROR failed to start lru crawler thread\r\n";
        }
        self.lru_crawler.store(enable, Ordering::Relaxed);
        b"OK\r\n"
    }
}

impl Default for Tunables {
    fn default() -> Self {
        Tunables {
            reqs_per_event: REQS_PER_EVENT_DEFAULT,
            reqs_per_event_set: false,
            binding_protocol: BindingProtocol::Auto,
            tcp_backlog: TCP_BACKLOG_DEFAULT,
            idle_timeout_s: 0,
            read_buf_mem_limit_bytes: 0,
            dump_enabled: true,
            watch_enabled: true,
            lru_crawler: Arc::new(AtomicBool::new(true)),
            lru_crawler_sleep_us: 100,
            lru_crawler_tocrawl: 0,
            lru_maintainer: true,
            debug_commands: false,
            maxconns_fast: true,
            watcher_logbuf_bytes: crate::watch::WATCHER_BUF_BYTES,
            reported: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_power_grows_past_one_and_a_half_items_per_bucket_as_memcacheds() {
        let mut t = Tunables::default();
        assert_eq!(t.hash_power_level(0), 16);
        assert_eq!(t.hash_power_level(98_304), 16);
        assert_eq!(t.hash_power_level(98_305), 17);
        assert_eq!(t.hash_power_level(1 << 17), 17);
        assert_eq!(t.hash_power_level(u64::MAX), 32);
        t.reported.push(("hashpower_init", "20".into()));
        assert_eq!(t.hash_power_level(10), 20);
    }
}
