//! slipstream-store: the in-memory item store behind every Slipstream cache protocol.
//!
//! What it is for: memcached 1.6 item semantics — 32-bit client flags, exptime rules (0 = never,
//! negative = already expired, up to 30 days = relative, larger = absolute Unix time), unique CAS
//! values, 64-bit incr wrap and decr floor at 0, append/prepend, delayed `flush_all`, a hard
//! memory limit with LRU eviction, and the per-item metadata the meta protocol reports (hit
//! before, last access, stale/win tokens).
//!
//! What it is not for: parsing or composing protocol bytes, sockets, or threads. The protocol
//! executors in `slipstream-server` translate requests into calls on [`Store`].
//!
//! Concurrency: the key space is split into shards by hash; each shard has its own lock, LRU and
//! memory budget (`memory_bytes_max / shards`), so there is no global lock on the hot path.
//! CAS values come from one relaxed atomic counter (no lock).

#![forbid(unsafe_code)]

pub mod clock;

pub use clock::Clock;

/// Largest key memcached accepts, in bytes.
pub const KEY_BYTES_MAX: usize = 250;
/// memcached's REALTIME_MAXDELTA: exptimes above this many seconds are absolute Unix times.
pub const REALTIME_MAXDELTA_S: i64 = 60 * 60 * 24 * 30;
/// Bytes charged per item on top of key and value (hash slot, LRU links, metadata). Documented
/// in README so that "memory never exceeds the limit plus a documented overhead" is checkable.
pub const ITEM_OVERHEAD_BYTES: usize = 64;

/// Store configuration. Units are in the names.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// Hard limit on the bytes charged for all items (key + value + ITEM_OVERHEAD_BYTES each).
    pub memory_bytes_max: usize,
    /// Largest item accepted (memcached `-I`); larger stores fail with `TooLarge`.
    pub item_bytes_max: usize,
    /// Number of lock shards (power of two). More shards = less contention.
    pub shards: usize,
    /// memcached `-C` turns CAS off: then every item's CAS is 0 and `gets` returns 0.
    pub cas_enabled: bool,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            memory_bytes_max: 64 * 1024 * 1024,
            item_bytes_max: 1024 * 1024,
            shards: 64,
            cas_enabled: true,
        }
    }
}

/// Which storage command is being executed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetMode {
    Set,
    Add,
    Replace,
    Append,
    Prepend,
    /// Store only if the item's current CAS equals `StoreOpts::cas`.
    Cas,
}

/// Options of a store request beyond key, value, flags and exptime.
#[derive(Clone, Copy, Debug, Default)]
pub struct StoreOpts {
    /// Compare-and-swap value. For `SetMode::Cas` it is required; for the meta protocol's
    /// `ms ... C<cas>` any mode may carry one (then a mismatch gives `Exists`).
    pub cas: Option<u64>,
    /// Meta `ms ... E<cas>`: use this CAS value for the new item instead of a fresh one.
    pub explicit_cas: Option<u64>,
    /// Meta `ms ... I`: with `cas` given and older than the item's, store and mark stale
    /// (memcached's "invalidate" mode) instead of failing.
    pub invalidate: bool,
    /// Meta append/prepend with `N<ttl>`: autovivify a missing item with this raw exptime.
    pub vivify_exptime: Option<i64>,
}

/// Result of a store request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreResult {
    /// Stored; carries the new CAS value.
    Stored(u64),
    /// add on an existing key, replace/append/prepend on a missing key.
    NotStored,
    /// CAS mismatch.
    Exists,
    /// cas on a missing key.
    NotFound,
    /// Item larger than `item_bytes_max` (memcached: `SERVER_ERROR object too large for cache`).
    TooLarge,
    /// Could not free enough memory (memcached: `SERVER_ERROR out of memory storing object`).
    NoMemory,
}

/// Options of a read.
#[derive(Clone, Copy, Debug, Default)]
pub struct GetOpts {
    /// gat/gats/`mg T<ttl>`/touch: set the item's exptime (raw protocol value) on hit.
    pub touch_exptime: Option<i64>,
    /// `mg N<ttl>`: on miss, create an empty item with this raw exptime and hand the caller the
    /// win token (`GetOutcome::won`).
    pub vivify_exptime: Option<i64>,
    /// `mg R<ttl>`: if the item's remaining TTL is below this many seconds, hand out the win
    /// token once (recache).
    pub recache_below_s: Option<i64>,
    /// Whether this access counts as a fetch (updates `fetched`, last access and LRU position).
    /// True for ordinary gets.
    pub bump: bool,
}

/// A borrowed view of one item, valid while the shard lock is held inside `Store::get`.
#[derive(Debug)]
pub struct ItemRef<'a> {
    pub key: &'a [u8],
    pub value: &'a [u8],
    pub flags: u32,
    pub cas: u64,
    /// Seconds until expiry; -1 = never expires (what `mg t` prints).
    pub ttl_remaining_s: i64,
    /// Seconds since last access before this one (`mg l`).
    pub last_access_ago_s: u64,
    /// Whether the item had been fetched before this access (`mg h`).
    pub fetched_before: bool,
}

/// What a read found, with the meta-protocol tokens.
#[derive(Debug)]
pub struct GetOutcome<'a> {
    /// None on a miss (and no vivify).
    pub item: Option<ItemRef<'a>>,
    /// The caller won the right to recache (`W` flag in meta replies).
    pub won: bool,
    /// Item is marked stale (`X` flag).
    pub stale: bool,
    /// Another client already holds the win token (`Z` flag).
    pub win_token_sent: bool,
}

/// Options of a delete.
#[derive(Clone, Copy, Debug, Default)]
pub struct DeleteOpts {
    /// `md C<cas>`: delete only if CAS matches.
    pub cas: Option<u64>,
    /// `md I`: mark stale instead of removing; `md T<ttl>` with I updates the TTL.
    pub invalidate: bool,
    pub invalidate_exptime: Option<i64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeleteResult {
    Deleted,
    NotFound,
    Exists,
}

/// Options of incr/decr.
#[derive(Clone, Copy, Debug, Default)]
pub struct ArithOpts {
    /// `ma N<ttl> J<initial>`: on miss create the item with `initial` and this raw exptime.
    pub vivify: Option<(u64, i64)>,
    /// `ma C<cas>`: only if CAS matches.
    pub cas: Option<u64>,
    /// `ma T<ttl>`: update exptime on success.
    pub touch_exptime: Option<i64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArithResult {
    /// New value and new CAS.
    Ok { value: u64, cas: u64, ttl_remaining_s: i64 },
    NotFound,
    /// Current value is not a decimal number that fits u64
    /// (memcached: `CLIENT_ERROR cannot increment or decrement non-numeric value`).
    NonNumeric,
    Exists,
    /// Could not allocate the new value.
    NoMemory,
}

/// Counters and gauges for `stats`, `stats items`, `stats slabs`.
#[derive(Clone, Debug, Default)]
pub struct StoreStats {
    pub curr_items: u64,
    pub total_items: u64,
    pub bytes: u64,
    pub limit_maxbytes: u64,
    pub evictions: u64,
    pub expired_unfetched: u64,
    pub evicted_unfetched: u64,
    pub reclaimed: u64,
    pub get_expired: u64,
    pub get_flushed: u64,
    /// Age in seconds of the oldest item in any LRU (for `stats items`).
    pub oldest_item_age_s: u64,
}

/// The store. Cheap to share: wrap in `Arc`.
pub struct Store {
    _private: (),
}

impl Store {
    pub fn new(config: StoreConfig) -> Store {
        Store::with_clock(config, Clock::system())
    }

    pub fn with_clock(config: StoreConfig, clock: Clock) -> Store {
        let _ = (config, clock);
        todo!("slipstream-store: implemented by the store work")
    }

    pub fn config(&self) -> &StoreConfig {
        todo!()
    }

    pub fn clock(&self) -> &Clock {
        todo!()
    }

    /// Look up `key`; `f` sees the outcome while the shard lock is held (copy the value out
    /// inside `f`, do no I/O there).
    pub fn get<R>(&self, key: &[u8], opts: GetOpts, f: impl FnOnce(GetOutcome<'_>) -> R) -> R {
        let _ = (key, opts, f);
        todo!()
    }

    /// Store `value` under `key`. `exptime` is the raw protocol value.
    pub fn store(
        &self,
        mode: SetMode,
        key: &[u8],
        value: &[u8],
        flags: u32,
        exptime: i64,
        opts: StoreOpts,
    ) -> StoreResult {
        let _ = (mode, key, value, flags, exptime, opts);
        todo!()
    }

    /// memcached's `set` that failed with TooLarge/NoMemory also unlinks the old item, so a
    /// reader never sees data older than a failed write. Executors call this in that case.
    pub fn unlink(&self, key: &[u8]) -> bool {
        let _ = key;
        todo!()
    }

    pub fn delete(&self, key: &[u8], opts: DeleteOpts) -> DeleteResult {
        let _ = (key, opts);
        todo!()
    }

    /// incr (`incr = true`) or decr. incr wraps at 2^64, decr floors at 0.
    pub fn arith(&self, key: &[u8], incr: bool, delta: u64, opts: ArithOpts) -> ArithResult {
        let _ = (key, incr, delta, opts);
        todo!()
    }

    /// `touch`: set exptime; false if missing.
    pub fn touch(&self, key: &[u8], exptime: i64) -> bool {
        let _ = (key, exptime);
        todo!()
    }

    /// `flush_all [delay]`: items stored at or before the moment the flush takes effect become
    /// invisible. `delay_s` is the raw protocol value (0 = now; same exptime rules as items).
    pub fn flush_all(&self, delay_s: i64) {
        let _ = delay_s;
        todo!()
    }

    pub fn stats(&self) -> StoreStats {
        todo!()
    }

    /// `stats reset` clears counters (not gauges such as curr_items/bytes).
    pub fn reset_stats(&self) {
        todo!()
    }
}
