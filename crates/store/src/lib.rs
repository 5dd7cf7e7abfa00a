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
//! Concurrency: the key space is split into shards by the top bits of a fast 64-bit key hash;
//! each shard has its own mutex, hash index and LRU, so there is no global lock on the hot path.
//! CAS values come from one relaxed atomic counter (no lock); the system clock is a cached
//! atomic second (see [`clock`]). A `get` takes one lock, allocates nothing, and touches the
//! index slot, one cache-line entry and the item bytes (key and value in one allocation).
//!
//! Memory policy: every item is charged `key + value + ITEM_OVERHEAD_BYTES`; the sum over all
//! shards is reserved in one atomic before an item is linked, so [`StoreStats::bytes`] never
//! exceeds `memory_bytes_max`. When the budget is full, a store evicts the globally least
//! recently used item ("used" = stored, read with a bumping read, touched, incr/decr'd or
//! re-added), whichever shard holds it, so one 1 MB item fits even when a shard's share of
//! memory is smaller. The limit can change at run time ([`Store::set_memory_limit`]: a
//! tenant's memory being re-allocated, `cache_memlimit`): lowering it evicts in the same order
//! until the charged bytes fit.
//!
//! Global LRU without a global lock: one relaxed atomic LRU clock ticks once per item written.
//! Every use stamps the item with the clock (a write takes a fresh tick, a read the current
//! value) and moves it to the head of its shard's LRU list, under the shard lock it already
//! holds, so each list is sorted by stamp; a read that finds the clock unmoved since the item
//! was last placed writes nothing (hot items in a read-mostly load are not relinked on every
//! hit). Each shard publishes its tail's stamp in an atomic, so an eviction reads the 64 tail
//! stamps, locks the shard whose tail is oldest (try-lock, so two evicting stores never wait on
//! each other) and evicts that tail (an expired item among the last few first, as memcached's
//! tail search does). Error bound: writes are ordered exactly, and reads to within the writes
//! between them: the victim was last used no later than the first write after the last use
//! of the true least recently used item (a tie in stamps; measured in
//! `tests::global_lru_within_one_tick` and against memcached in tests/test_lru.py). Two
//! documented exceptions: when the oldest shard stays locked for a while (contended), the
//! next-oldest one is used; items are stamped with 32 bits, so an item untouched for 2^32
//! writes (about 4 billion) is ordered as if it were 2^32 writes younger.
//! Expiry and flush_all are lazy: an item is checked when accessed; every store first frees
//! the expired items at its shard's LRU tail, and the few items at an LRU tail are checked for
//! expiry before a live item is evicted (both count `reclaimed`, not `evictions`).
//!
//! Kernel cache observer: a [`KernelCache`] installed with [`Store::set_kernel_cache`] mirrors
//! items into an outer cache that answers reads without the store (Slipstream's XDP fast path).
//! The store keeps it coherent by itself, so no protocol executor can forget a path: reads that
//! ask for it (`GetOpts::kernel_fill`) offer the item to `fill` while holding the shard lock,
//! and every change to an item that may be mirrored — any store mode, delete and `md I`,
//! incr/decr, touch, gat/`mg T`, a handed-out win token, eviction, expiry or flush removal,
//! unlink — calls `invalidate` under the same lock *before* the item changes, so before any
//! reply. `flush_all` calls the observer's `flush_all` after the flush is in force. A per-item
//! bit remembers whether the observer may hold the item, so writes to items it does not hold
//! cost nothing; another remembers a refusal so reads do not offer an uncacheable item again.
//!
//! Known differences from memcached 1.6.18 (slab allocator, segmented LRU): no slab classes,
//! so no slab calcification and no per-class `stats items`; `mg l` reports seconds since the
//! last bumping access exactly (memcached updates that time at most once a minute);
//! append/prepend/incr that fail with NoMemory leave the key absent (memcached keeps the old
//! item); the `-I` check is memcached's `item_size_ok`, shared with every protocol parser
//! (`slipstream_proto::rules`, as are the key limit and how incr/decr read a stored number); the
//! memory charge uses ITEM_OVERHEAD_BYTES.

#![forbid(unsafe_code)]

pub mod clock;
mod hash;
mod index;
mod itembytes;
mod shard;

pub use clock::{with_proposer_now, Clock};
pub use hash::hash_key;
pub use itembytes::{ItemDecodeError, ITEM_BYTES_MIN};

use shard::{Counters, Entry, LruBoard, Now, Shard, EMPTY_TAIL, FETCHED, KEY_BINARY, NIL, STALE, TOKEN_SENT};
use shard::{IN_KERNEL, KERNEL_REFUSED};
use slipstream_proto::rules::{self, ItemLimits, KEY_BYTES_MAX};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, TryLockError};
use std::time::Instant;

/// memcached's REALTIME_MAXDELTA: exptimes above this many seconds are absolute Unix times.
pub const REALTIME_MAXDELTA_S: i64 = 60 * 60 * 24 * 30;
/// The last-access time after a fetch or touch at `now` of an item with these `bits`: memcached's
/// segmented LRU (do_item_bump) only marks an item's first fetch (FETCHED) and moves the time on
/// a later one. (Its LRU maintainer can delay that move for an item already in the COLD queue;
/// Slipstream has no such queues and moves it at once.)
fn accessed_at(bits: u8, atime: u32, now: u32) -> u32 {
    if bits & FETCHED != 0 {
        now
    } else {
        atime
    }
}
/// One item allocation holding `parts` back to back (key, then value). Built from an
/// exact-length iterator, so the `Arc` is allocated once (zeroed, then filled: this crate has
/// no unsafe code to skip the zeroing).
fn item_data(parts: &[&[u8]]) -> Arc<[u8]> {
    let len = parts.iter().map(|p| p.len()).sum();
    let mut data: Arc<[u8]> = std::iter::repeat_n(0u8, len).collect();
    if let Some(dst) = Arc::get_mut(&mut data) {
        let mut at = 0;
        for p in parts {
            dst[at..at + p.len()].copy_from_slice(p);
            at += p.len();
        }
    }
    data
}

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
    /// memcached `-M` sets it false: a full store then refuses instead of evicting live items
    /// (see [`Store::set_evict_to_free`], which changes it at run time).
    pub evict_to_free: bool,
}

impl StoreConfig {
    /// The inputs of memcached's item-size rule (`-I`, `-C`), for the protocol parsers.
    pub fn item_limits(&self) -> ItemLimits {
        ItemLimits { item_bytes_max: self.item_bytes_max, cas_enabled: self.cas_enabled }
    }

    /// Lock shards for a store of `memory_bytes` holding items up to `item_bytes_max`: as many as
    /// memory allows while every shard (memory / shards) can still hold a few of the largest
    /// items, a power of two, capped at 64.
    pub fn shards_for(memory_bytes: usize, item_bytes_max: usize) -> usize {
        let fit = (memory_bytes / (4 * item_bytes_max.max(1))).clamp(1, 64);
        // Largest power of two not above `fit`.
        1usize << (usize::BITS - 1 - fit.leading_zeros())
    }
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            memory_bytes_max: 64 * 1024 * 1024,
            item_bytes_max: 1024 * 1024,
            shards: 64,
            cas_enabled: true,
            evict_to_free: true,
        }
    }
}

/// What a [`KernelCache::fill`] did with the item offered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelFill {
    /// The observer holds a copy now: the next change must invalidate it.
    Cached,
    /// The observer can never hold this item as it is (key or reply shape); the store does not
    /// offer it again until the item changes.
    NotCacheable,
    /// Not cached this time (full, expiring now, an error); a later read may offer it again.
    Skipped,
}

/// An outer cache that mirrors items (the kernel fast path). All three calls are made with the
/// item's shard lock held (`flush_all`: after the store flush is in force), so they must be
/// quick and must not call back into the store.
pub trait KernelCache: Send + Sync {
    /// Mirror an item just read. `expires_at` is when the store starts treating it as expired
    /// (None = never); a copy must stop being served at or before that moment.
    fn fill(&self, key: &[u8], flags: u32, cas: u64, value: &[u8], expires_at: Option<Instant>) -> KernelFill;
    /// Drop the copy of `key`. Must not return before the copy can no longer be served.
    fn invalidate(&self, key: &[u8]);
    /// Drop every copy.
    fn flush_all(&self);
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
    /// Meta `ms <key> ... b`: the key arrived base64-encoded; the item remembers it (see
    /// `ItemRef::key_binary`). Append/prepend keep the item's existing mark.
    pub key_binary: bool,
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
    /// The created item keeps `vivify_exptime` (the caller worked out which of T and N comes
    /// last, as memcached applies them in request order); otherwise T applies to it as well.
    pub vivify_exptime_final: bool,
    /// A created item gets no win token: the request fails after the fetch (memcached's mg
    /// with a too-long opaque token creates the item, then answers with the error).
    pub vivify_without_token: bool,
    /// `mg R<ttl>`: if the item's remaining TTL is below this many seconds, hand out the win
    /// token once (recache).
    pub recache_below_s: Option<i64>,
    /// Whether this access counts as a fetch (updates `fetched`, last access and LRU position).
    /// True for ordinary gets.
    pub bump: bool,
    /// mg only: apply the win-token logic (hand out `W` for stale items and recache). Plain
    /// gets, `me` and the binary/UDP paths read without touching tokens, as memcached does.
    pub win_tokens: bool,
    /// An ordinary read whose reply the kernel cache can reproduce (text get/gets, `mg <key> v`,
    /// binary get): offer a hit to the installed [`KernelCache`], if any.
    pub kernel_fill: bool,
}

/// A borrowed view of one item, valid while the shard lock is held inside `Store::get`.
#[derive(Debug)]
pub struct ItemRef<'a> {
    pub key: &'a [u8],
    pub value: &'a [u8],
    /// The item's whole allocation (key, then value: `value` is its last `value.len()` bytes).
    /// A reply may keep a clone to send a large value without copying it; the item's memory
    /// then stays alive, after a replacement or eviction too, until the clone is dropped.
    pub data: &'a Arc<[u8]>,
    pub flags: u32,
    pub cas: u64,
    /// Seconds until expiry; -1 = never expires (what `mg t` prints).
    pub ttl_remaining_s: i64,
    /// Seconds since last access before this one (`mg l`).
    pub last_access_ago_s: u64,
    /// Whether the item had been fetched before this access (`mg h`).
    pub fetched_before: bool,
    /// Stored under a base64 key (`ms ... b`): meta echoes of its key are base64 plus ` b`.
    pub key_binary: bool,
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
    /// Why `item` is None (memcached's `item_get` log status); `Absent` when it is Some.
    pub miss: Miss,
}

/// What a read that found nothing met (memcached's do_item_get `was_found` 0, 2, 3).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Miss {
    /// No item under the key.
    #[default]
    Absent,
    /// An item invalidated by `flush_all` (unlinked by this read).
    Flushed,
    /// An expired item (unlinked by this read).
    Expired,
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
    /// A created item keeps the `vivify` exptime (see [`GetOpts::vivify_exptime_final`]);
    /// otherwise T wins over N for it.
    pub vivify_exptime_final: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArithResult {
    /// New value and new CAS.
    Ok {
        value: u64,
        cas: u64,
        ttl_remaining_s: i64,
    },
    NotFound,
    /// Current value is not a decimal number that fits u64
    /// (memcached: `CLIENT_ERROR cannot increment or decrement non-numeric value`).
    NonNumeric,
    Exists,
    /// Could not allocate the new value.
    NoMemory,
}

/// One live item as `lru_crawler metadump` and `stats cachedump` list it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ItemMeta {
    pub key: Vec<u8>,
    /// Absolute expiry (unix seconds); None = never.
    pub exptime_unix_s: Option<i64>,
    /// Last access (unix seconds).
    pub atime_unix_s: i64,
    pub cas: u64,
    pub fetched: bool,
    pub value_bytes: usize,
    /// memcached's item size for this key/value/flags (its `ITEM_ntotal`).
    pub item_bytes: usize,
}

/// A live item as it is evicted (what memcached's `eviction` log line shows).
pub struct Evicted<'a> {
    pub key: &'a [u8],
    pub fetched: bool,
    /// Seconds it had left to live; -1 = no expiry.
    pub ttl_s: i64,
    pub last_access_ago_s: u32,
    pub value_bytes: usize,
}

/// See [`Store::set_eviction_log`].
pub type EvictionLog = Arc<dyn Fn(&Evicted<'_>) + Send + Sync>;

/// Counters and gauges for `stats`, `stats items`, `stats slabs`.
#[derive(Clone, Debug, Default)]
pub struct StoreStats {
    pub curr_items: u64,
    pub total_items: u64,
    pub bytes: u64,
    /// Memory held for items (item allocations, entry slabs, index tables): `total_malloced`.
    /// Flat while items are replaced by same-sized ones; the slabs stay after removals.
    pub malloced_bytes: u64,
    pub limit_maxbytes: u64,
    pub evictions: u64,
    pub expired_unfetched: u64,
    pub evicted_unfetched: u64,
    pub reclaimed: u64,
    pub get_expired: u64,
    pub get_flushed: u64,
    /// Expired or flushed items the LRU crawler freed (`lru_crawler crawl`).
    pub crawler_reclaimed: u64,
    /// Items the LRU crawler looked at.
    pub crawler_items_checked: u64,
    /// Age in seconds of the oldest item in any LRU (for `stats items`).
    pub oldest_item_age_s: u64,
}

/// Aligns its content to its own cache lines so hot atomics and shard locks never share one
/// (false sharing would make every CAS increment invalidate readers' flush-state line).
#[repr(align(128))]
struct Padded<T>(T);

/// flush_all state, read on every lookup, written only by flush_all.
struct FlushState {
    /// memcached's settings.oldest_live (relative second); 0 = no flush.
    oldest_live: AtomicU32,
    /// memcached's settings.oldest_cas: items with a smaller CAS are flushed too.
    oldest_cas: AtomicU64,
    /// Bumped by every flush_all after the two fields above are written. A kernel fill that
    /// sees it change between reading the flush state and finishing the fill undoes itself
    /// (see `Store::get`).
    generation: AtomicU64,
}

/// Most lock shards a store will create: every eviction reads each shard's published tail
/// stamp, and a 64-bit mask tracks the shards it found locked.
const SHARDS_MAX: usize = 64;
/// Most eviction steps one store may take before it gives up with `NoMemory`.
const RESERVE_STEPS_MAX: usize = 1 << 20;
/// How often a store retries when nothing could be evicted because other shards were locked.
const STEAL_RETRIES_MAX: usize = 64;
/// How many times an eviction retries the try-lock of the shard holding the oldest item before
/// it takes the next-oldest shard instead (the holder is usually inside a short operation).
const OLDEST_LOCK_SPINS_MAX: usize = 64;

/// Outcome of comparing a supplied CAS with the item's (memcached's cas_res).
#[derive(Clone, Copy, PartialEq, Eq)]
enum CasCheck {
    /// No CAS supplied (or 0).
    NoneGiven,
    Match,
    /// Supplied CAS is older and invalidation was asked for.
    Stale,
    Mismatch,
}

/// The store. Cheap to share: wrap in `Arc`.
pub struct Store {
    config: StoreConfig,
    clock: Clock,
    shards: Box<[Padded<Mutex<Shard>>]>,
    /// log2 of the shard count; the shard is the top `shard_bits` bits of the key hash.
    shard_bits: u32,
    /// The memory limit in force: starts at `config.memory_bytes_max`, changed at run time by
    /// [`Store::set_memory_limit`] (a tenant's memory can be re-allocated without a restart).
    memory_bytes_max: AtomicUsize,
    /// Charged bytes of all items; never above `memory_bytes_max` (reserved before insert).
    used_bytes: Padded<AtomicUsize>,
    /// Last CAS value handed out.
    cas_last: Padded<AtomicU64>,
    flush: Padded<FlushState>,
    /// The LRU clock and the shards' published tail stamps (see the crate doc).
    lru: Arc<LruBoard>,
    /// The kernel cache observer, once installed (each shard holds a clone too).
    kernel: OnceLock<Arc<dyn KernelCache>>,
    eviction_log: OnceLock<EvictionLog>,
    /// memcached's `evict_to_free`: false (`-M`) = a full store frees only expired or flushed
    /// items at the LRU tails and otherwise refuses the store with `NoMemory`.
    evict_to_free: AtomicBool,
    /// Stores refused for want of memory while eviction was off (memcached's `outofmemory`).
    outofmemory: AtomicU64,
    /// Replicated tenants: fullness is decided on `used + dead_freed` (see
    /// [`Store::set_deterministic_memory`]).
    deterministic: AtomicBool,
    /// Charged bytes of expired/flushed items freed since the last [`Store::sweep_dead`].
    dead_freed: Arc<AtomicUsize>,
    /// The most items seen at once (sampled by `stats` and the maintainer's passes, raised by a
    /// restart file): memcached's hash table grows with it and never shrinks, and
    /// `hash_power_level` reports that.
    items_peak: AtomicU64,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("config", &self.config).finish_non_exhaustive()
    }
}

impl Store {
    pub fn new(config: StoreConfig) -> Store {
        Store::with_clock(config, Clock::system())
    }

    pub fn with_clock(mut config: StoreConfig, clock: Clock) -> Store {
        let shards = config.shards.clamp(1, SHARDS_MAX).next_power_of_two();
        config.shards = shards;
        let lru = Arc::new(LruBoard::new(shards));
        let dead_freed = Arc::new(AtomicUsize::new(0));
        Store {
            shards: (0..shards).map(|i| Padded(Mutex::new(Shard::new(lru.clone(), i, dead_freed.clone())))).collect(),
            shard_bits: shards.trailing_zeros(),
            memory_bytes_max: AtomicUsize::new(config.memory_bytes_max),
            lru,
            used_bytes: Padded(AtomicUsize::new(0)),
            cas_last: Padded(AtomicU64::new(0)),
            flush: Padded(FlushState {
                oldest_live: AtomicU32::new(0),
                oldest_cas: AtomicU64::new(0),
                generation: AtomicU64::new(0),
            }),
            kernel: OnceLock::new(),
            eviction_log: OnceLock::new(),
            evict_to_free: AtomicBool::new(config.evict_to_free),
            outofmemory: AtomicU64::new(0),
            deterministic: AtomicBool::new(false),
            dead_freed,
            items_peak: AtomicU64::new(0),
            config,
            clock,
        }
    }

    /// A replicated tenant's store: a full store refuses (`NoMemory`) instead of evicting, and
    /// "full" is decided on the same number on every replica applying the same log. Replicas
    /// free expired and flushed items at different moments (a local read meets them, the LRU
    /// tails differ), so those frees do not count: fullness is `used + dead`, where `dead` is
    /// the bytes of expired/flushed items freed since the last [`Store::sweep_dead`] — a
    /// function of the log alone (as exact as the replicas' clocks agree on expiry seconds).
    pub fn set_deterministic_memory(&self, on: bool) {
        self.deterministic.store(on, Ordering::Relaxed);
        if on {
            self.set_evict_to_free(false);
        }
    }

    pub fn deterministic_memory(&self) -> bool {
        self.deterministic.load(Ordering::Relaxed)
    }

    /// The bytes a deterministic store counts as used: charged bytes plus the dead ones freed
    /// since the last sweep (see [`Store::set_deterministic_memory`]).
    pub fn memory_used_deterministic(&self) -> usize {
        self.used_bytes.0.load(Ordering::Relaxed) + self.dead_freed.load(Ordering::Relaxed)
    }

    /// Set the dead bytes so that [`Store::memory_used_deterministic`] reads `total` (a
    /// replica that restored a snapshot takes the figure its source had).
    pub fn set_memory_used_deterministic(&self, total: usize) {
        let used = self.used_bytes.0.load(Ordering::Relaxed);
        self.dead_freed.store(total.saturating_sub(used), Ordering::Relaxed);
    }

    /// Free every item expired at Unix second `now_unix_s` (absolute: every replica passes the
    /// same, a log entry's time) or flushed, then forget the dead bytes: afterwards every
    /// replica holds the items live at that second and counts the same. Returns the bytes
    /// freed. O(items): callers run it rarely (only near full, once per second at most).
    pub fn sweep_dead(&self, now_unix_s: i64) -> usize {
        let mut t = self.now();
        t.now = u32::try_from((now_unix_s - self.clock.started_unix_s()).max(0)).unwrap_or(u32::MAX);
        let used = &self.used_bytes.0;
        let before = used.load(Ordering::Relaxed);
        for i in 0..self.shards.len() {
            let mut sh = self.lock(i);
            for idx in sh.linked() {
                let e = &sh.entries[idx as usize];
                if t.is_expired(e) || t.is_flushed(e) {
                    sh.counters.reclaimed += 1;
                    sh.remove(idx, used);
                }
            }
        }
        self.dead_freed.store(0, Ordering::Relaxed);
        before.saturating_sub(used.load(Ordering::Relaxed))
    }

    /// memcached `-M`: with `false`, a store that needs memory frees only expired or flushed
    /// items from the LRU tails (never a live one) and otherwise fails with `NoMemory`
    /// (`SERVER_ERROR out of memory storing object`), counted in [`Store::outofmemory`].
    pub fn set_evict_to_free(&self, on: bool) {
        self.evict_to_free.store(on, Ordering::Relaxed);
    }

    /// Whether a full store evicts live items (memcached's `stats settings` `evictions on|off`).
    pub fn evict_to_free(&self) -> bool {
        self.evict_to_free.load(Ordering::Relaxed)
    }

    /// Stores refused because eviction is off and nothing expired could be freed.
    pub fn outofmemory(&self) -> u64 {
        self.outofmemory.load(Ordering::Relaxed)
    }

    /// Install the kernel cache observer (once; later calls return false and change nothing).
    /// Install it before the observer holds anything: the store assumes it starts empty.
    pub fn set_kernel_cache(&self, kernel: Arc<dyn KernelCache>) -> bool {
        if self.kernel.set(kernel.clone()).is_err() {
            return false;
        }
        for i in 0..self.shards.len() {
            self.lock(i).kernel = Some(kernel.clone());
        }
        true
    }

    /// Install what is told of every eviction of a live item (memcached's `watch evictions`;
    /// once; later calls return false and change nothing). It runs under a shard's lock: it
    /// must be quick and must not call back into the store.
    pub fn set_eviction_log(&self, log: EvictionLog) -> bool {
        if self.eviction_log.set(log.clone()).is_err() {
            return false;
        }
        for i in 0..self.shards.len() {
            self.lock(i).eviction_log = Some(log.clone());
        }
        true
    }

    /// Whether a kernel cache observer is installed.
    pub fn has_kernel_cache(&self) -> bool {
        self.kernel.get().is_some()
    }

    /// The configuration the store was built with (`shards` rounded up to a power of two).
    /// Its `memory_bytes_max` is the limit at creation; the limit in force now is
    /// [`Store::memory_bytes_max`] (see [`Store::set_memory_limit`]).
    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    /// The memory limit in force now (charged bytes; what `stats` reports as limit_maxbytes).
    pub fn memory_bytes_max(&self) -> usize {
        self.memory_bytes_max.load(Ordering::Relaxed)
    }

    /// Change the memory limit at run time. Raising it takes effect at once. Lowering it
    /// evicts before returning until the charged bytes fit the new limit, in global LRU order
    /// (expired items at a tail first), exactly as a store's own eviction does. Stores racing
    /// with this call already reserve against the new limit, so they evict for themselves.
    /// Items larger than the new limit can no longer be stored (`NoMemory`/`TooLarge` rules as
    /// for the limit at creation).
    pub fn set_memory_limit(&self, bytes: usize) {
        self.memory_bytes_max.store(bytes, Ordering::Relaxed);
        let used = &self.used_bytes.0;
        let t = self.now();
        for _ in 0..RESERVE_STEPS_MAX {
            if used.load(Ordering::Relaxed) <= bytes {
                return;
            }
            // No shard lock is held here, so waiting for the oldest shard's lock is safe.
            let Some(i) = self.oldest_shard(0) else { return };
            self.lock(i).evict_one(&t, used, true);
        }
    }

    /// The shard whose LRU tail is oldest by the published stamps, skipping the shards in
    /// `skip` (bit i = shard i); None if every other shard is empty.
    #[inline]
    fn oldest_shard(&self, skip: u64) -> Option<usize> {
        let mut best = (EMPTY_TAIL, usize::MAX);
        for i in 0..self.lru.shards() {
            let s = self.lru.tail(i);
            if s < best.0 && skip & (1 << i) == 0 {
                best = (s, i);
            }
        }
        (best.0 != EMPTY_TAIL).then_some(best.1)
    }

    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Convert a raw protocol exptime to relative seconds, as memcached's `realtime()` with
    /// the negative-to-past rule applied first: 0 = never; negative or an absolute time at or
    /// before the start = 1 (already expired); up to 30 days = relative to now.
    pub fn rel_exptime(&self, raw: i64) -> u32 {
        self.realtime(raw, self.clock.now_rel_s())
    }

    /// What `mg t` would print for an item given exptime `raw` now (-1: never expires).
    pub fn ttl_remaining_for(&self, raw: i64) -> i64 {
        let now = self.clock.now_rel_s();
        ttl_remaining(self.realtime(raw, now), now)
    }

    #[inline]
    fn realtime(&self, raw: i64, now: u32) -> u32 {
        let raw = if raw < 0 { REALTIME_MAXDELTA_S + 1 } else { raw };
        if raw == 0 {
            return 0;
        }
        // A replicated apply: relative to the proposer's clock, made absolute (see clock.rs).
        let raw = match clock::proposer_now_unix_s() {
            Some(p) if raw <= REALTIME_MAXDELTA_S => p.saturating_add(raw).max(REALTIME_MAXDELTA_S + 1),
            _ => raw,
        };
        if raw > REALTIME_MAXDELTA_S {
            let started = self.clock.started_unix_s();
            if raw <= started {
                return 1;
            }
            return (raw - started).min(u32::MAX as i64) as u32;
        }
        now.saturating_add(raw as u32)
    }

    #[inline]
    fn shard_index(&self, hash: u64) -> usize {
        if self.shard_bits == 0 {
            0
        } else {
            (hash >> (64 - self.shard_bits)) as usize
        }
    }

    #[inline]
    fn lock(&self, i: usize) -> MutexGuard<'_, Shard> {
        // A panic inside a caller's `get` closure must not brick the shard for everyone.
        self.shards[i].0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    #[inline]
    fn now(&self) -> Now {
        let now = self.clock.now_rel_s();
        let oldest_live = self.flush.0.oldest_live.load(Ordering::Acquire);
        let oldest_cas = self.flush.0.oldest_cas.load(Ordering::Relaxed);
        Now { now, oldest_live, oldest_cas }
    }

    #[inline]
    fn next_cas(&self) -> u64 {
        if !self.config.cas_enabled {
            return 0;
        }
        self.cas_last.0.fetch_add(1, Ordering::Relaxed).wrapping_add(1)
    }

    #[inline]
    fn new_item_cas(&self, explicit: Option<u64>) -> u64 {
        match explicit {
            Some(c) if self.config.cas_enabled => c,
            _ => self.next_cas(),
        }
    }

    /// Whether an item of this shape can ever be stored: memcached's key limit and `-I` rule
    /// (`rules`; checked against memcached 1.6.18: with key "foo", flags 0 and CAS on, a
    /// 1048514-byte value is the largest stored) and within the memory budget (charged bytes =
    /// key + value + ITEM_OVERHEAD_BYTES).
    fn fits_limits(&self, key_len: usize, value_len: usize, flags: u32) -> bool {
        key_len <= KEY_BYTES_MAX
            && !self.config.item_limits().too_large(key_len, flags, value_len)
            && key_len + value_len + ITEM_OVERHEAD_BYTES <= self.memory_bytes_max()
    }

    /// Reserve `need` charged bytes in the global budget, evicting the globally least recently
    /// used items as needed (see `evict_lru`).
    fn reserve(&self, si: usize, sh: &mut Shard, need: usize, t: &Now) -> bool {
        let max = self.memory_bytes_max();
        let used = &self.used_bytes.0;
        if self.deterministic_memory() {
            // Dead bytes count as used until a sweep; nothing is evicted.
            let dead = self.dead_freed.load(Ordering::Relaxed);
            let fits = used
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |cur| {
                    (cur.saturating_add(dead).saturating_add(need) <= max).then_some(cur + need)
                })
                .is_ok();
            if !fits {
                self.outofmemory.fetch_add(1, Ordering::Relaxed);
            }
            return fits;
        }
        let mut blocked_rounds = 0;
        for _ in 0..RESERVE_STEPS_MAX {
            let cur = used.load(Ordering::Relaxed);
            if cur.saturating_add(need) <= max {
                if used.compare_exchange_weak(cur, cur + need, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
                    return true;
                }
                continue;
            }
            if self.evict_lru(si, sh, t) {
                continue;
            }
            if !self.evict_to_free() {
                // -M: nothing expired at the tails to free, and live items stay.
                self.outofmemory.fetch_add(1, Ordering::Relaxed);
                return false;
            }
            // Nothing evictable (every other shard locked or empty, reservations in flight):
            // give their holders a moment, then retry.
            blocked_rounds += 1;
            if blocked_rounds > STEAL_RETRIES_MAX {
                return false;
            }
            std::thread::yield_now();
        }
        false
    }

    /// Evict one item for a store that holds shard `si` (`sh`): the tail of the shard whose
    /// published tail stamp is oldest. Other shards are only try-locked (two stores evicting
    /// from each other's shard must not deadlock): the oldest one is retried a few times, then
    /// the next-oldest is taken. False if nothing could be evicted.
    fn evict_lru(&self, si: usize, sh: &mut Shard, t: &Now) -> bool {
        let used = &self.used_bytes.0;
        let live = self.evict_to_free();
        let mut skip = 0u64;
        while let Some(j) = self.oldest_shard(skip) {
            if j == si {
                if sh.evict_one(t, used, live) {
                    return true;
                }
            } else {
                for _ in 0..OLDEST_LOCK_SPINS_MAX {
                    let mut g = match self.shards[j].0.try_lock() {
                        Ok(g) => g,
                        Err(TryLockError::Poisoned(p)) => p.into_inner(),
                        Err(TryLockError::WouldBlock) => {
                            std::hint::spin_loop();
                            continue;
                        }
                    };
                    if g.evict_one(t, used, live) {
                        return true;
                    }
                    break;
                }
            }
            skip |= 1 << j;
        }
        // Every shard was locked or empty by its published stamp; this one may still hold
        // something (its own slot is current, so only if it is empty will this fail).
        sh.evict_one(t, used, live)
    }

    /// Reserve memory for and link a new entry built from `data` (key then value).
    #[allow(clippy::too_many_arguments)]
    fn insert_new(
        &self,
        si: usize,
        sh: &mut Shard,
        data: Arc<[u8]>,
        key_len: usize,
        tag: u32,
        flags: u32,
        exptime: u32,
        cas: u64,
        bits: u8,
        t: &Now,
    ) -> Option<u32> {
        let charge = data.len() + ITEM_OVERHEAD_BYTES;
        if !self.reserve(si, sh, charge, t) {
            return None;
        }
        // The tick is taken after eviction, with the lock held: the newest stamp in the shard.
        let stamp = self.lru.tick();
        let entry = Entry {
            data,
            cas,
            tag,
            prev: NIL,
            next: NIL,
            flags,
            exptime,
            time: t.now,
            atime: t.now,
            stamp: stamp as u32,
            key_len: key_len as u16,
            bits,
        };
        Some(sh.insert(entry, stamp))
    }

    /// Store `value` as the new item for `key`, replacing `existing`. Same-size replacements
    /// are written in place (no allocation); otherwise the old item is freed first so its
    /// memory counts toward the new one (a failure then leaves the key absent, as memcached's
    /// failed set does).
    #[allow(clippy::too_many_arguments)]
    fn put(
        &self,
        si: usize,
        sh: &mut Shard,
        existing: Option<u32>,
        key: &[u8],
        tag: u32,
        value: &[u8],
        flags: u32,
        exptime: u32,
        cas: u64,
        bits: u8,
        t: &Now,
    ) -> StoreResult {
        let used = &self.used_bytes.0;
        if let Some(i) = existing {
            // Before the item changes (in place or by removal), not after.
            sh.kernel_invalidate(i);
        }
        // An already-expired item (negative or past exptime) is linked like any other, as
        // memcached links it: the next access meets it expired (`get_expired`), and until then
        // it is counted in curr_items and charged like any item (reclaimed at the LRU tail).
        if let Some(i) = existing {
            let e = &mut sh.entries[i as usize];
            // In place only while no reply holds the old value (see `Entry::data`).
            if let Some(d) = Arc::get_mut(&mut e.data).filter(|d| d.len() == key.len() + value.len()) {
                d[key.len()..].copy_from_slice(value);
                e.cas = cas;
                e.flags = flags;
                e.exptime = exptime;
                e.time = t.now;
                e.atime = t.now;
                e.bits = bits;
                sh.lru_touch(i, self.lru.tick());
                sh.counters.total_items += 1;
                return StoreResult::Stored(cas);
            }
            sh.remove(i, used);
        }
        match self.insert_new(si, sh, item_data(&[key, value]), key.len(), tag, flags, exptime, cas, bits, t) {
            Some(_) => StoreResult::Stored(cas),
            None => StoreResult::NoMemory,
        }
    }

    /// Look up `key`; `f` sees the outcome while the shard lock is held (copy the value out
    /// inside `f`, do no I/O there).
    pub fn get<R>(&self, key: &[u8], opts: GetOpts, f: impl FnOnce(GetOutcome<'_>) -> R) -> R {
        let miss = |miss| GetOutcome { item: None, won: false, stale: false, win_token_sent: false, miss };
        let h = hash_key(key);
        let tag = h as u32;
        let si = self.shard_index(h);
        let mut guard = self.lock(si);
        let sh = &mut *guard;
        // Read before the flush state (see FlushState::generation and the fill below).
        let flush_generation = self.flush.0.generation.load(Ordering::SeqCst);
        let t = self.now();
        let (idx, created) = match sh.lookup(key, tag, &t, &self.used_bytes.0) {
            Ok(i) => (i, false),
            Err(why) => {
                let Some(viv) = opts.vivify_exptime else { return f(miss(why)) };
                if !self.fits_limits(key.len(), 0, 0) {
                    return f(miss(why));
                }
                let exp = self.realtime(viv, t.now);
                let cas = self.next_cas();
                match self.insert_new(si, sh, item_data(&[key]), key.len(), tag, 0, exp, cas, 0, &t) {
                    Some(i) => (i, true),
                    None => return f(miss(why)),
                }
            }
        };
        // T also applies to an item N just created (memcached 1.6.18: `mg k N30 T60 t` on a
        // miss reports t60).
        let touch_to = opts.touch_exptime.map(|x| self.realtime(x, t.now));
        let recache_at = opts.recache_below_s.map(|r| self.realtime(r, t.now));
        let e = &sh.entries[idx as usize];
        // h and l report the state before this access (memcached delays its bump for them).
        let fetched_before = e.bits & FETCHED != 0;
        let last_access_ago_s = t.now.saturating_sub(e.atime) as u64;
        let win_token_sent = e.bits & TOKEN_SENT != 0;
        let stale = e.bits & STALE != 0;
        let mut won = created && !opts.vivify_without_token;
        if let Some(r) = recache_at {
            if !win_token_sent && !created && e.exptime != 0 && e.exptime < r {
                won = true;
            }
        }
        if stale && !win_token_sent && opts.win_tokens {
            won = true;
        }
        if !opts.win_tokens && !created {
            won = false;
        }
        if touch_to.is_some() || (won && !win_token_sent) {
            // A new TTL, or a token that meta replies report (Z): the kernel copy is stale.
            sh.kernel_invalidate(idx);
        }
        let e = &mut sh.entries[idx as usize];
        if let Some(x) = touch_to.filter(|_| !(created && opts.vivify_exptime_final)) {
            e.exptime = x;
        }
        if won {
            e.bits |= TOKEN_SENT;
        }
        if opts.bump {
            e.atime = accessed_at(e.bits, e.atime, t.now);
            e.bits |= FETCHED;
            sh.lru_touch(idx, self.lru.now());
        }
        if opts.kernel_fill && !created && touch_to.is_none() {
            self.kernel_fill(sh, idx, &t, flush_generation);
        }
        let e = &sh.entries[idx as usize];
        let item = ItemRef {
            key: e.key(),
            value: e.value(),
            data: &e.data,
            flags: e.flags,
            cas: e.cas,
            ttl_remaining_s: ttl_remaining(e.exptime, t.now),
            last_access_ago_s,
            fetched_before,
            key_binary: e.bits & KEY_BINARY != 0,
        };
        f(GetOutcome { item: Some(item), won, stale, win_token_sent, miss: Miss::Absent })
    }

    /// Offer item `idx` to the kernel cache (shard lock held; `t` and `flush_generation` are
    /// what this operation read before looking the item up).
    ///
    /// Not offered: items the cache may already hold or refused, stale items and items with a
    /// win token out (meta replies flag those, the kernel's would not), and anything while a
    /// delayed `flush_all` is pending (the kernel could not stop serving it on time; the
    /// command already emptied the kernel cache). A flush_all that lands during the fill is
    /// caught by the generation check: it bumps the generation after its flush state is in
    /// force and before it flushes the kernel, so either the fill read the old kernel epoch
    /// (the copy is dead) or this check sees the new generation and drops the copy.
    fn kernel_fill(&self, sh: &mut Shard, idx: u32, t: &Now, flush_generation: u64) {
        let Some(kernel) = sh.kernel.clone() else { return };
        let e = &sh.entries[idx as usize];
        if e.bits & (IN_KERNEL | KERNEL_REFUSED | STALE | TOKEN_SENT) != 0 {
            return;
        }
        if t.oldest_live > t.now {
            return;
        }
        let expires_at = if e.exptime == 0 {
            None
        } else {
            match self.clock.deadline_of_rel_s(e.exptime) {
                Some(d) => Some(d),
                None => return,
            }
        };
        let r = kernel.fill(e.key(), e.flags, e.cas, e.value(), expires_at);
        let e = &mut sh.entries[idx as usize];
        match r {
            KernelFill::Cached => {
                if self.flush.0.generation.load(Ordering::SeqCst) != flush_generation {
                    kernel.invalidate(e.key());
                } else {
                    e.bits |= IN_KERNEL;
                }
            }
            KernelFill::NotCacheable => e.bits |= KERNEL_REFUSED,
            KernelFill::Skipped => {}
        }
    }

    /// Store `value` under `key`. `exptime` is the raw protocol value.
    ///
    /// Mode rules follow memcached's do_store_item: a supplied `opts.cas` turns Set/Replace
    /// into CAS mode (missing = NotFound, mismatch = Exists, CAS 0 never matches); Add ignores
    /// it; Append/Prepend check it only when nonzero. Append/Prepend keep the old item's flags
    /// and exptime; an append beyond `-I` is NotStored (as memcached's failed allocation).
    pub fn store(
        &self,
        mode: SetMode,
        key: &[u8],
        value: &[u8],
        flags: u32,
        exptime: i64,
        opts: StoreOpts,
    ) -> StoreResult {
        if !self.fits_limits(key.len(), value.len(), flags) {
            return StoreResult::TooLarge;
        }
        let h = hash_key(key);
        let tag = h as u32;
        let si = self.shard_index(h);
        let mut guard = self.lock(si);
        let sh = &mut *guard;
        let t = self.now();
        // Before the lookup, as memcached allocates (and pulls its LRU tail) before it looks
        // the key up: an expired item at the tail is reclaimed, not met by this store.
        let _ = sh.reclaim_tail(&t, &self.used_bytes.0);
        let cas_in = opts.cas.unwrap_or(0);
        let key_bit = if opts.key_binary { KEY_BINARY } else { 0 };
        let cas_mode = mode == SetMode::Cas || (opts.cas.is_some() && matches!(mode, SetMode::Set | SetMode::Replace));
        let Some(idx) = sh.lookup_live(key, tag, &t, &self.used_bytes.0) else {
            let exp_raw = match mode {
                _ if cas_mode => return StoreResult::NotFound,
                SetMode::Set | SetMode::Add => exptime,
                SetMode::Append | SetMode::Prepend => match opts.vivify_exptime {
                    Some(v) => v,
                    None => return StoreResult::NotStored,
                },
                SetMode::Replace | SetMode::Cas => return StoreResult::NotStored,
            };
            let exp = self.realtime(exp_raw, t.now);
            let cas = self.new_item_cas(opts.explicit_cas);
            return self.put(si, sh, None, key, tag, value, flags, exp, cas, key_bit, &t);
        };
        let (old_cas, old_flags, old_exptime, old_bits) = {
            let e = &sh.entries[idx as usize];
            (e.cas, e.flags, e.exptime, e.bits)
        };
        let old_key_bit = old_bits & KEY_BINARY;
        let check = if cas_in == 0 {
            CasCheck::NoneGiven
        } else if cas_in == old_cas {
            CasCheck::Match
        } else if opts.invalidate && cas_in < old_cas {
            CasCheck::Stale
        } else {
            CasCheck::Mismatch
        };
        if cas_mode {
            let (exp, bits) = match check {
                CasCheck::Match => (self.realtime(exptime, t.now), key_bit),
                // memcached: replace the value but keep the TTL, mark stale, keep a sent token.
                CasCheck::Stale => (old_exptime, STALE | (old_bits & TOKEN_SENT) | key_bit),
                CasCheck::NoneGiven | CasCheck::Mismatch => return StoreResult::Exists,
            };
            let cas = self.new_item_cas(opts.explicit_cas);
            return self.put(si, sh, Some(idx), key, tag, value, flags, exp, cas, bits, &t);
        }
        match mode {
            SetMode::Add => {
                // memcached bumps an existing item on a failed add.
                sh.lru_touch(idx, self.lru.now());
                StoreResult::NotStored
            }
            SetMode::Append | SetMode::Prepend => {
                if matches!(check, CasCheck::Stale | CasCheck::Mismatch) {
                    return StoreResult::Exists;
                }
                let old_len = sh.entries[idx as usize].value().len();
                let new_len = old_len + value.len();
                if !self.fits_limits(key.len(), new_len, old_flags) {
                    return StoreResult::NotStored;
                }
                let data = {
                    let old = sh.entries[idx as usize].value();
                    if mode == SetMode::Append {
                        item_data(&[key, old, value])
                    } else {
                        item_data(&[key, value, old])
                    }
                };
                let cas = self.new_item_cas(opts.explicit_cas);
                sh.remove(idx, &self.used_bytes.0);
                match self.insert_new(si, sh, data, key.len(), tag, old_flags, old_exptime, cas, old_key_bit, &t) {
                    Some(_) => StoreResult::Stored(cas),
                    None => StoreResult::NoMemory,
                }
            }
            SetMode::Set | SetMode::Replace | SetMode::Cas => {
                let exp = self.realtime(exptime, t.now);
                let cas = self.new_item_cas(opts.explicit_cas);
                self.put(si, sh, Some(idx), key, tag, value, flags, exp, cas, key_bit, &t)
            }
        }
    }

    /// memcached's `set` that failed with TooLarge/NoMemory also unlinks the old item, so a
    /// reader never sees data older than a failed write. Executors call this in that case.
    /// Counts nothing; returns whether a visible item was removed.
    pub fn unlink(&self, key: &[u8]) -> bool {
        let h = hash_key(key);
        let mut guard = self.lock(self.shard_index(h));
        let sh = &mut *guard;
        let t = self.now();
        let Some(idx) = sh.find(key, h as u32) else { return false };
        let e = &sh.entries[idx as usize];
        let live = !t.is_flushed(e) && !t.is_expired(e);
        if live {
            sh.remove(idx, &self.used_bytes.0);
        } else {
            sh.remove_dead(idx, &self.used_bytes.0);
        }
        live
    }

    /// Delete, or with `invalidate` mark stale: the item stays readable with the X flag, its
    /// win token is reset so the next reader wins, it gets a fresh CAS, and
    /// `invalidate_exptime` (if given) becomes its TTL — as memcached's `md I`.
    pub fn delete(&self, key: &[u8], opts: DeleteOpts) -> DeleteResult {
        let h = hash_key(key);
        let mut guard = self.lock(self.shard_index(h));
        let sh = &mut *guard;
        let t = self.now();
        let Some(idx) = sh.lookup_live(key, h as u32, &t, &self.used_bytes.0) else {
            return DeleteResult::NotFound;
        };
        if let Some(c) = opts.cas {
            if sh.entries[idx as usize].cas != c {
                return DeleteResult::Exists;
            }
        }
        if opts.invalidate {
            sh.kernel_invalidate(idx);
            let exp = opts.invalidate_exptime.map(|x| self.realtime(x, t.now));
            let cas = self.next_cas();
            let e = &mut sh.entries[idx as usize];
            if let Some(x) = exp {
                e.exptime = x;
            }
            e.bits = (e.bits | STALE) & !TOKEN_SENT;
            e.cas = cas;
        } else {
            sh.remove(idx, &self.used_bytes.0);
        }
        DeleteResult::Deleted
    }

    /// incr (`incr = true`) or decr. incr wraps at 2^64, decr floors at 0.
    ///
    /// As memcached's do_add_delta: an empty value is NonNumeric; a nonzero `opts.cas` must
    /// match; the value is read like strtoull (`rules::safe_strtoull`); when the new number is no longer
    /// than the stored value it is written in place and padded with spaces ("100" decr 1 reads
    /// back as "99 "), otherwise a new item of exactly the digits replaces it (flags and
    /// exptime kept). Every success gets a new CAS. A vivified item holds the initial value.
    pub fn arith(&self, key: &[u8], incr: bool, delta: u64, opts: ArithOpts) -> ArithResult {
        let h = hash_key(key);
        let tag = h as u32;
        let si = self.shard_index(h);
        let mut guard = self.lock(si);
        let sh = &mut *guard;
        let t = self.now();
        let Some(idx) = sh.lookup_live(key, tag, &t, &self.used_bytes.0) else {
            let Some((initial, viv)) = opts.vivify else { return ArithResult::NotFound };
            let (buf, first) = rules::decimal_digits(initial);
            let digits = &buf[first..];
            if !self.fits_limits(key.len(), digits.len(), 0) {
                return ArithResult::NotFound;
            }
            // As in get, T (when given) wins over N for the new item unless the caller decided.
            let raw = if opts.vivify_exptime_final { viv } else { opts.touch_exptime.unwrap_or(viv) };
            let exp = self.realtime(raw, t.now);
            let cas = self.next_cas();
            return match self.insert_new(si, sh, item_data(&[key, digits]), key.len(), tag, 0, exp, cas, 0, &t) {
                Some(_) => ArithResult::Ok { value: initial, cas, ttl_remaining_s: ttl_remaining(exp, t.now) },
                None => ArithResult::NoMemory,
            };
        };
        let e = &sh.entries[idx as usize];
        let old = e.value();
        if old.is_empty() {
            return ArithResult::NonNumeric;
        }
        if let Some(c) = opts.cas {
            if c != 0 && c != e.cas {
                return ArithResult::Exists;
            }
        }
        // memcached reads the value with safe_strtoull: its "\r\n" (or a NUL) ends the number.
        let Some(cur) = rules::safe_strtoull(old) else { return ArithResult::NonNumeric };
        let value = if incr { cur.wrapping_add(delta) } else { cur.saturating_sub(delta) };
        let (buf, first) = rules::decimal_digits(value);
        let digits = &buf[first..];
        let cas = self.next_cas();
        let touch_to = opts.touch_exptime.map(|x| self.realtime(x, t.now));
        let idx = if digits.len() <= old.len() {
            sh.kernel_invalidate(idx);
            let e = &mut sh.entries[idx as usize];
            let kl = e.key_len as usize;
            if Arc::get_mut(&mut e.data).is_none() {
                // A queued reply holds the old value: write a fresh copy of the same size.
                e.data = item_data(&[&e.data[..]]);
            }
            if let Some(d) = Arc::get_mut(&mut e.data) {
                let (num, pad) = d[kl..].split_at_mut(digits.len());
                num.copy_from_slice(digits);
                pad.fill(b' ');
            }
            e.cas = cas;
            e.atime = t.now;
            sh.lru_touch(idx, self.lru.tick());
            idx
        } else {
            let (flags, exptime) = (e.flags, e.exptime);
            sh.remove(idx, &self.used_bytes.0);
            match self.insert_new(si, sh, item_data(&[key, digits]), key.len(), tag, flags, exptime, cas, 0, &t) {
                Some(i) => i,
                None => return ArithResult::NoMemory,
            }
        };
        let e = &mut sh.entries[idx as usize];
        if let Some(x) = touch_to {
            e.exptime = x;
        }
        ArithResult::Ok { value, cas, ttl_remaining_s: ttl_remaining(e.exptime, t.now) }
    }

    /// `touch`: set exptime; false if missing. Counts as a fetch (memcached's item_touch
    /// uses DO_UPDATE), does not change the CAS.
    pub fn touch(&self, key: &[u8], exptime: i64) -> bool {
        let h = hash_key(key);
        let mut guard = self.lock(self.shard_index(h));
        let sh = &mut *guard;
        let t = self.now();
        let Some(idx) = sh.lookup_live(key, h as u32, &t, &self.used_bytes.0) else { return false };
        sh.kernel_invalidate(idx);
        let exp = self.realtime(exptime, t.now);
        let e = &mut sh.entries[idx as usize];
        e.exptime = exp;
        e.atime = accessed_at(e.bits, e.atime, t.now);
        e.bits |= FETCHED;
        sh.lru_touch(idx, self.lru.now());
        true
    }

    /// `flush_all [delay]`: items stored at or before the moment the flush takes effect become
    /// invisible. `delay_s` is the raw protocol value (0 = now; same exptime rules as items).
    ///
    /// Exactly memcached 1.6's arithmetic: oldest_live = realtime(delay) (or now when delay
    /// <= 0), minus one when CAS is on; with CAS on and the flush immediate, items with a CAS
    /// below a freshly taken CAS value are flushed too, so a set right after an immediate
    /// flush in the same second survives. With CAS off such a set stays invisible until the
    /// next second, and a delayed flush (delay N) takes effect N-1 seconds later with CAS on.
    /// Nothing is scanned: every lookup compares the item's store time with oldest_live.
    pub fn flush_all(&self, delay_s: i64) {
        let now = self.clock.now_rel_s();
        let new_oldest = if delay_s > 0 { self.realtime(delay_s, now) } else { now };
        let fs = &self.flush.0;
        if self.config.cas_enabled {
            let oldest_live = new_oldest.wrapping_sub(1);
            if oldest_live <= now {
                fs.oldest_cas.store(self.next_cas(), Ordering::Relaxed);
            }
            fs.oldest_live.store(oldest_live, Ordering::Release);
        } else {
            fs.oldest_live.store(new_oldest, Ordering::Release);
        }
        // After the flush state, before the kernel flush: see `kernel_fill`.
        fs.generation.fetch_add(1, Ordering::SeqCst);
        // A delayed flush empties the kernel cache now too; fills stay off until it is in
        // force, so nothing filled meanwhile can outlive it there.
        if let Some(k) = self.kernel.get() {
            k.flush_all();
        }
    }

    pub fn stats(&self) -> StoreStats {
        let now = self.clock.now_rel_s();
        let mut s = StoreStats { limit_maxbytes: self.memory_bytes_max() as u64, ..StoreStats::default() };
        for i in 0..self.shards.len() {
            let g = self.lock(i);
            let c = &g.counters;
            s.curr_items += g.items;
            s.bytes += g.bytes as u64;
            s.malloced_bytes += g.malloced_bytes() as u64;
            s.total_items += c.total_items;
            s.evictions += c.evictions;
            s.expired_unfetched += c.expired_unfetched;
            s.evicted_unfetched += c.evicted_unfetched;
            s.reclaimed += c.reclaimed;
            s.get_expired += c.get_expired;
            s.get_flushed += c.get_flushed;
            s.crawler_reclaimed += c.crawler_reclaimed;
            s.crawler_items_checked += c.crawler_items_checked;
            if let Some(a) = g.tail_atime() {
                s.oldest_item_age_s = s.oldest_item_age_s.max(now.saturating_sub(a) as u64);
            }
        }
        self.raise_items_peak(s.curr_items);
        s
    }

    /// The most items seen at once (a sample: `stats` and the maintainer's passes look).
    pub fn items_peak(&self) -> u64 {
        self.items_peak.load(Ordering::Relaxed)
    }

    /// Raise the peak to at least `items` (a restart file carries the one before the restart).
    pub fn raise_items_peak(&self, items: u64) {
        self.items_peak.fetch_max(items, Ordering::Relaxed);
    }

    /// Live items (not expired, not flushed), each shard from its most recently used end, at
    /// most `limit` of them (0 = all): for `lru_crawler metadump` and `stats cachedump`.
    /// One shard is locked at a time, and only while its items are copied out, so a dump of
    /// a large store delays no request by more than one shard's walk.
    pub fn dump(&self, limit: usize, mut f: impl FnMut(ItemMeta)) {
        let t = self.now();
        let started = self.clock.started_unix_s();
        let mut left = if limit == 0 { usize::MAX } else { limit };
        for i in 0..self.shards.len() {
            let mut batch = Vec::new();
            {
                let g = self.lock(i);
                for e in g.iter_lru() {
                    if left == 0 {
                        break;
                    }
                    if t.is_expired(e) || t.is_flushed(e) {
                        continue;
                    }
                    left -= 1;
                    batch.push(self.item_meta(e, started));
                }
            }
            batch.into_iter().for_each(&mut f);
            if left == 0 {
                return;
            }
        }
    }

    /// One pass of memcached's LRU maintainer over this store: free the expired and flushed
    /// items at every shard's LRU tail (stopping at each tail's first live item, at most
    /// `items_per_shard_max` per shard), counted as `reclaimed` as a store's own tail pull counts
    /// them. A shard another thread holds is skipped this pass (`try_lock`): the maintainer must
    /// never make a request wait. Returns the items freed.
    pub fn reclaim_tails(&self, items_per_shard_max: usize) -> usize {
        let t = self.now();
        let used = &self.used_bytes.0;
        let mut freed = 0;
        // A lower bound when a shard is skipped; the peak only ever takes a maximum.
        let mut items = 0;
        for lock in self.shards.iter() {
            let mut g = match lock.0.try_lock() {
                Ok(g) => g,
                Err(TryLockError::Poisoned(p)) => p.into_inner(),
                Err(TryLockError::WouldBlock) => continue,
            };
            items += g.items;
            let mut here = 0;
            while here < items_per_shard_max {
                let n = g.reclaim_tail(&t, used);
                here += n;
                if n == 0 {
                    break;
                }
            }
            freed += here;
        }
        self.raise_items_peak(items);
        freed
    }

    /// How many shards the store has: the outer loop of a step-wise walk (`crawl_step`,
    /// `dump_step`).
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// One bounded step of the LRU crawler (`lru_crawler crawl`): look at up to `slots_max`
    /// slots of shard `shard` from slot `from`, freeing the expired and flushed items there
    /// (counted as memcached's crawler counts them: `crawler_reclaimed`, `crawler_items_checked`,
    /// `expired_unfetched` for expired ones never fetched). The shard is locked for this step
    /// only. Returns where the next step starts in this shard (None: the shard is done).
    pub fn crawl_step(&self, shard: usize, from: usize, slots_max: usize) -> Option<usize> {
        let t = self.now();
        let lock = self.shards.get(shard)?;
        let mut g = lock.0.lock().unwrap_or_else(PoisonError::into_inner);
        let sh = &mut *g;
        let end = from.saturating_add(slots_max).min(sh.entries.len());
        for i in from..end {
            let e = &sh.entries[i];
            if e.data.is_empty() {
                continue; // a free slot (every item has a key of at least one byte)
            }
            sh.counters.crawler_items_checked += 1;
            let flushed = t.is_flushed(e);
            if flushed || t.is_expired(e) {
                sh.counters.crawler_reclaimed += 1;
                if e.bits & shard::FETCHED == 0 && !flushed {
                    sh.counters.expired_unfetched += 1;
                }
                sh.remove_dead(i as u32, &self.used_bytes.0);
            }
        }
        (end < sh.entries.len()).then_some(end)
    }

    /// One bounded step of a dump (`lru_crawler metadump`): the live items among up to
    /// `slots_max` slots of shard `shard` from slot `from`, copied out under the shard's lock
    /// and handed to `f` after it is released. Returns where the next step starts in this
    /// shard (None: the shard is done). Items stored while a dump runs may or may not appear,
    /// as with memcached's crawler.
    pub fn dump_step(&self, shard: usize, from: usize, slots_max: usize, f: impl FnMut(ItemMeta)) -> Option<usize> {
        let t = self.now();
        let started = self.clock.started_unix_s();
        let lock = self.shards.get(shard)?;
        let mut batch = Vec::new();
        let next = {
            let g = lock.0.lock().unwrap_or_else(PoisonError::into_inner);
            let end = from.saturating_add(slots_max).min(g.entries.len());
            for e in g.entries.get(from..end).unwrap_or_default() {
                if e.data.is_empty() || t.is_expired(e) || t.is_flushed(e) {
                    continue;
                }
                batch.push(self.item_meta(e, started));
            }
            (end < g.entries.len()).then_some(end)
        };
        batch.into_iter().for_each(f);
        next
    }

    fn item_meta(&self, e: &shard::Entry, started: i64) -> ItemMeta {
        ItemMeta {
            key: e.key().to_vec(),
            exptime_unix_s: (e.exptime != 0).then(|| started + i64::from(e.exptime)),
            atime_unix_s: started + i64::from(e.atime),
            cas: e.cas,
            fetched: e.bits & shard::FETCHED != 0,
            value_bytes: e.value().len(),
            item_bytes: rules::item_bytes(e.key().len(), e.flags, e.value().len(), self.config.cas_enabled),
        }
    }

    /// `stats reset` clears counters (not gauges such as curr_items/bytes).
    pub fn reset_stats(&self) {
        for i in 0..self.shards.len() {
            self.lock(i).counters = Counters::default();
        }
    }
}

/// One live item as a replication snapshot carries it: the expiry as an absolute Unix time,
/// so a replica whose clock started at another moment restores the same deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ItemExport<'a> {
    pub key: &'a [u8],
    pub value: &'a [u8],
    pub flags: u32,
    pub cas: u64,
    /// Absolute Unix second the item expires at; 0 = never.
    pub exptime_unix_s: i64,
    /// Marked stale by `md I` / `ms I`.
    pub stale: bool,
    /// Stored under a base64 key (`ms ... b`).
    pub key_binary: bool,
}

/// Replication support (slipstream-replication): a replicated tenant's store is changed only
/// by applying committed log entries, so every replica must assign the same CAS values and a
/// snapshot must carry the items exactly. Not for the request path of unreplicated tenants.
impl Store {
    /// Make the next CAS handed out `cas_last + 1`. A replicated store sets this from the log
    /// index before applying each entry, so all replicas give an entry the same CAS. Only for
    /// stores whose every mutation comes from the log (a local write in between would reuse
    /// a value).
    pub fn set_cas_last(&self, cas_last: u64) {
        self.cas_last.0.store(cas_last, Ordering::Relaxed);
    }

    /// The last CAS value handed out.
    pub fn cas_last(&self) -> u64 {
        self.cas_last.0.load(Ordering::Relaxed)
    }

    /// Call `f` for every live item (expired and flushed ones skipped), shard by shard with
    /// that shard's lock held: do no I/O and do not call back into the store inside `f`.
    /// Order is unspecified. Reads do not count as fetches.
    pub fn export(&self, mut f: impl FnMut(ItemExport<'_>)) {
        for i in 0..self.shards.len() {
            self.export_shard(i, &mut f);
        }
    }

    /// [`Store::export`] for shard `shard` alone (`0..shard_count()`): a caller writing a file
    /// takes one shard at a time and writes between them, outside the lock.
    pub fn export_shard(&self, shard: usize, mut f: impl FnMut(ItemExport<'_>)) {
        let t = self.now();
        let started = self.clock.started_unix_s();
        let sh = self.lock(shard);
        for idx in sh.linked() {
            let e = &sh.entries[idx as usize];
            if t.is_flushed(e) || t.is_expired(e) {
                continue;
            }
            f(ItemExport {
                key: e.key(),
                value: e.value(),
                flags: e.flags,
                cas: e.cas,
                exptime_unix_s: if e.exptime == 0 { 0 } else { started + i64::from(e.exptime) },
                stale: e.bits & STALE != 0,
                key_binary: e.bits & KEY_BINARY != 0,
            });
        }
    }

    /// Store an exported item exactly (CAS, flags, absolute expiry, stale and base64-key
    /// marks), replacing any item under its key. Evicts as a `set` would when memory is short.
    pub fn import(&self, item: &ItemExport<'_>) -> StoreResult {
        if !self.fits_limits(item.key.len(), item.value.len(), item.flags) {
            return StoreResult::TooLarge;
        }
        let h = hash_key(item.key);
        let tag = h as u32;
        let si = self.shard_index(h);
        let mut guard = self.lock(si);
        let sh = &mut *guard;
        let t = self.now();
        let existing = sh.find(item.key, tag);
        // An absolute time at or before the clock's start reads as already expired (1).
        let exp = if item.exptime_unix_s == 0 {
            0
        } else {
            self.realtime(item.exptime_unix_s.max(REALTIME_MAXDELTA_S + 1), t.now)
        };
        let bits = if item.stale { STALE } else { 0 } | if item.key_binary { KEY_BINARY } else { 0 };
        let cas = if self.config.cas_enabled { item.cas } else { 0 };
        self.put(si, sh, existing, item.key, tag, item.value, item.flags, exp, cas, bits, &t)
    }

    /// Remove every item (kernel copies invalidated first): a replica about to restore a
    /// snapshot. Counters are kept; the flush state is left as it is.
    pub fn clear(&self) {
        for i in 0..self.shards.len() {
            let mut sh = self.lock(i);
            for idx in sh.linked() {
                sh.remove(idx, &self.used_bytes.0);
            }
        }
        self.dead_freed.store(0, Ordering::Relaxed);
    }
}

/// Seconds until `exptime`; -1 for never (what `mg t` prints), never below 0 otherwise.
#[inline]
fn ttl_remaining(exptime: u32, now: u32) -> i64 {
    if exptime == 0 {
        -1
    } else {
        (exptime as i64 - now as i64).max(0)
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod kernel_tests;
