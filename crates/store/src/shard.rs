//! One lock shard: the item slab (a `Vec` of entries reused through a free list), the hash
//! index, an intrusive doubly linked LRU over slab slot numbers, and the shard's counters.
//! The LRU is kept sorted by LRU stamp (see [`LruBoard`]) and the shard publishes its tail's
//! stamp on the board, so a store can find the globally least recently used item without
//! taking any other lock.
//!
//! Not for: locking, CAS numbering or exptime conversion; `Store` does those and calls in
//! here with the lock held. Every operation here is O(1) (index growth amortised).

use crate::index::Index;
use crate::{KernelCache, Miss, ITEM_OVERHEAD_BYTES};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

pub(crate) const NIL: u32 = u32::MAX;

/// Item has been read by a bumping access (memcached ITEM_FETCHED, meta `h`).
pub(crate) const FETCHED: u8 = 1;
/// Item is marked stale by an invalidation (meta `X`).
pub(crate) const STALE: u8 = 2;
/// A win token was handed out for this item (meta `Z` to later readers).
pub(crate) const TOKEN_SENT: u8 = 4;
/// The kernel cache (see [`KernelCache`]) may hold a copy of this item: every change or removal
/// must invalidate it first. Cleared by that invalidation.
pub(crate) const IN_KERNEL: u8 = 16;
/// The kernel cache refused this item (key or reply cannot be served there); do not offer it
/// again until the item changes.
pub(crate) const KERNEL_REFUSED: u8 = 32;
/// The item was stored under a base64 key (meta `b`): memcached echoes its key base64-encoded
/// with a `b` flag, however it is read back.
pub(crate) const KEY_BINARY: u8 = 64;

/// How many LRU tail items an eviction inspects for an expired one before evicting a live one
/// (memcached's lru_pull_tail searches the same small window).
const TAIL_SEARCH_ITEMS: usize = 5;
/// An access relinks an item to the LRU head only when the LRU clock has moved at least this
/// many ticks since the item was last placed there. Every access still counts: the item's
/// position is then at most this many ticks older than its last access, which is the error
/// bound of the eviction order (see the crate doc). 1 = relink whenever the clock has moved,
/// so accesses between the same two stores are the only ones whose order is not kept.
pub(crate) const BUMP_TICKS_MIN: u32 = 1;
/// Published tail stamp of an empty shard: never the oldest.
pub(crate) const EMPTY_TAIL: u64 = u64::MAX;

/// The global LRU clock and every shard's published tail stamp, shared by the store and its
/// shards. The clock ticks once per item written (a new item, a replacement, incr/decr), so
/// stamps order writes exactly and reads to within the writes between them. A shard writes
/// its slot only with its own lock held; readers compare slots without any lock.
pub(crate) struct LruBoard {
    /// Last tick handed out (its own cache line: every write bumps it).
    clock: crate::Padded<AtomicU64>,
    /// Stamp of each shard's LRU tail; `EMPTY_TAIL` for an empty shard. Packed: written only
    /// when a tail changes, read by every eviction scan.
    tails: Box<[AtomicU64]>,
}

impl LruBoard {
    pub(crate) fn new(shards: usize) -> LruBoard {
        LruBoard {
            clock: crate::Padded(AtomicU64::new(0)),
            tails: (0..shards).map(|_| AtomicU64::new(EMPTY_TAIL)).collect(),
        }
    }

    /// The current tick, for a read (does not advance the clock).
    #[inline]
    pub(crate) fn now(&self) -> u64 {
        self.clock.0.load(Ordering::Relaxed)
    }

    /// A fresh tick, for a write.
    #[inline]
    pub(crate) fn tick(&self) -> u64 {
        self.clock.0.fetch_add(1, Ordering::Relaxed).wrapping_add(1)
    }

    /// Stamp of shard `i`'s least recently used item (`EMPTY_TAIL` if it has none).
    #[inline]
    pub(crate) fn tail(&self, i: usize) -> u64 {
        self.tails[i].load(Ordering::Relaxed)
    }

    pub(crate) fn shards(&self) -> usize {
        self.tails.len()
    }

    /// The full stamp whose low 32 bits are `lo`: the latest one not after now. Exact for
    /// items placed within the last 2^32 ticks; an item untouched for longer is taken to be
    /// 2^32 ticks younger than it is (documented in the crate doc).
    fn widen(&self, lo: u32) -> u64 {
        let now = self.now();
        now.wrapping_sub(u64::from((now as u32).wrapping_sub(lo)))
    }
}

#[repr(align(64))] // one cache line per entry: a lookup touches exactly one line here
pub(crate) struct Entry {
    /// Key bytes followed by value bytes: one allocation per item, reference-counted so a
    /// reply can send a large value without copying it (`ItemRef::data`). Only the store holds
    /// it except while such a reply is queued; a replaced or evicted item's memory then lives
    /// on until that reply is written (the server bounds how much a connection may pin).
    pub(crate) data: Arc<[u8]>,
    pub(crate) cas: u64,
    /// Low 32 hash bits, kept so the index slot can be found on removal.
    pub(crate) tag: u32,
    pub(crate) prev: u32,
    pub(crate) next: u32,
    pub(crate) flags: u32,
    /// Relative expiry second; 0 = never.
    pub(crate) exptime: u32,
    /// Relative second the item was stored (compared against flush_all's oldest_live).
    pub(crate) time: u32,
    /// Relative second of the last access (meta `l`, `stats items` age).
    pub(crate) atime: u32,
    /// Low 32 bits of the LRU tick when the item was last placed at its shard's LRU head;
    /// the LRU is sorted by it (see [`LruBoard`]).
    pub(crate) stamp: u32,
    pub(crate) key_len: u16,
    pub(crate) bits: u8,
}

// One cache line per entry is what keeps a lookup to one line: a field that does not fit
// must go elsewhere.
const _: () = assert!(std::mem::size_of::<Entry>() == 64);

impl Entry {
    #[inline]
    pub(crate) fn key(&self) -> &[u8] {
        &self.data[..self.key_len as usize]
    }
    #[inline]
    pub(crate) fn value(&self) -> &[u8] {
        &self.data[self.key_len as usize..]
    }
    #[inline]
    pub(crate) fn charge(&self) -> usize {
        self.data.len() + ITEM_OVERHEAD_BYTES
    }
}

/// The snapshot of time and flush state one operation works with.
#[derive(Clone, Copy)]
pub(crate) struct Now {
    pub(crate) now: u32,
    /// 0 = no flush pending or done.
    pub(crate) oldest_live: u32,
    pub(crate) oldest_cas: u64,
}

impl Now {
    #[inline]
    pub(crate) fn is_flushed(&self, e: &Entry) -> bool {
        if self.oldest_live == 0 || self.oldest_live > self.now {
            return false;
        }
        e.time <= self.oldest_live || (self.oldest_cas != 0 && e.cas != 0 && e.cas < self.oldest_cas)
    }
    #[inline]
    pub(crate) fn is_expired(&self, e: &Entry) -> bool {
        e.exptime != 0 && e.exptime <= self.now
    }
}

#[derive(Clone, Copy, Default)]
pub(crate) struct Counters {
    pub(crate) total_items: u64,
    pub(crate) evictions: u64,
    pub(crate) expired_unfetched: u64,
    pub(crate) evicted_unfetched: u64,
    pub(crate) reclaimed: u64,
    pub(crate) get_expired: u64,
    pub(crate) get_flushed: u64,
    pub(crate) crawler_reclaimed: u64,
    pub(crate) crawler_items_checked: u64,
}

pub(crate) struct Shard {
    index: Index,
    pub(crate) entries: Vec<Entry>,
    free_head: u32,
    head: u32,
    tail: u32,
    /// Charged bytes of the items in this shard.
    pub(crate) bytes: usize,
    pub(crate) items: u64,
    pub(crate) counters: Counters,
    /// The kernel cache observer, if one is installed (same one in every shard).
    pub(crate) kernel: Option<Arc<dyn KernelCache>>,
    /// Told of every eviction of a live item, if installed (same one in every shard).
    pub(crate) eviction_log: Option<crate::EvictionLog>,
    /// Where this shard publishes its tail stamp (slot `id`) and reads the LRU clock.
    board: Arc<LruBoard>,
    id: usize,
    /// Charged bytes of expired or flushed items freed since the store's last sweep (the
    /// store's counter, shared by every shard; see `Store::set_deterministic_memory`).
    dead_freed: Arc<AtomicUsize>,
}

impl Shard {
    pub(crate) fn new(board: Arc<LruBoard>, id: usize, dead_freed: Arc<AtomicUsize>) -> Shard {
        Shard {
            index: Index::new(),
            entries: Vec::new(),
            free_head: NIL,
            head: NIL,
            tail: NIL,
            bytes: 0,
            items: 0,
            counters: Counters::default(),
            kernel: None,
            eviction_log: None,
            board,
            id,
            dead_freed,
        }
    }

    /// Bytes this shard holds from the allocator for items: every linked item's allocation
    /// (key and value behind an `Arc` header), the entry slab (kept for reuse after a removal,
    /// as memcached keeps its slab pages) and the index table. memcached's `total_malloced`.
    pub(crate) fn malloced_bytes(&self) -> usize {
        const ARC_HEADER_BYTES: usize = 2 * std::mem::size_of::<usize>();
        let items = self.items as usize;
        let data = self.bytes - items * ITEM_OVERHEAD_BYTES;
        data + items * ARC_HEADER_BYTES
            + self.entries.capacity() * std::mem::size_of::<Entry>()
            + self.index.table_bytes()
    }

    /// Publish the stamp of the current tail (after the tail changed).
    #[inline]
    fn publish_tail(&self, stamp: u64) {
        self.board.tails[self.id].store(stamp, Ordering::Relaxed);
    }

    /// Publish the tail found in the list, widening its stored stamp.
    fn publish_list_tail(&self) {
        let s = if self.tail == NIL { EMPTY_TAIL } else { self.board.widen(self.entries[self.tail as usize].stamp) };
        self.publish_tail(s);
    }

    /// Drop the kernel's copy of item `idx` (if it may have one) before the item changes:
    /// called with this shard's lock held, so no fill of the same key can interleave. Also
    /// forgets an earlier refusal, since the changed item may be cacheable.
    #[inline]
    pub(crate) fn kernel_invalidate(&mut self, idx: u32) {
        let e = &mut self.entries[idx as usize];
        if e.bits & IN_KERNEL != 0 {
            if let Some(k) = &self.kernel {
                k.invalidate(e.key());
            }
        }
        e.bits &= !(IN_KERNEL | KERNEL_REFUSED);
    }

    /// Slot of `key` whatever its state (expired and flushed included).
    #[inline(always)]
    pub(crate) fn find(&self, key: &[u8], tag: u32) -> Option<u32> {
        let entries = &self.entries;
        self.index.find(tag, |i| entries[i as usize].key() == key)
    }

    /// Slot of `key` if it is visible now. Expired or flushed items met here are unlinked and
    /// counted as memcached's do_item_get does (get_flushed is checked first).
    #[inline(always)]
    pub(crate) fn lookup_live(&mut self, key: &[u8], tag: u32, t: &Now, used: &AtomicUsize) -> Option<u32> {
        self.lookup(key, tag, t, used).ok()
    }

    /// `lookup_live`, saying what a miss met (for memcached's `item_get` log status).
    #[inline(always)]
    pub(crate) fn lookup(&mut self, key: &[u8], tag: u32, t: &Now, used: &AtomicUsize) -> Result<u32, Miss> {
        let idx = self.find(key, tag).ok_or(Miss::Absent)?;
        let e = &self.entries[idx as usize];
        if t.is_flushed(e) {
            self.counters.get_flushed += 1;
            self.remove_dead(idx, used);
            return Err(Miss::Flushed);
        }
        if t.is_expired(e) {
            self.counters.get_expired += 1;
            self.remove_dead(idx, used);
            return Err(Miss::Expired);
        }
        Ok(idx)
    }

    /// Take `idx` off the list; republish the tail if it was the tail.
    fn lru_unlink(&mut self, idx: u32) {
        let (prev, next) = {
            let e = &self.entries[idx as usize];
            (e.prev, e.next)
        };
        if prev == NIL {
            self.head = next;
        } else {
            self.entries[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.entries[next as usize].prev = prev;
        }
        let e = &mut self.entries[idx as usize];
        e.prev = NIL;
        e.next = NIL;
        if next == NIL {
            self.publish_list_tail();
        }
    }

    /// Link `idx` at the head with the full stamp `stamp` (the newest in this shard).
    fn lru_push_front(&mut self, idx: u32, stamp: u64) {
        let old_head = self.head;
        {
            let e = &mut self.entries[idx as usize];
            e.prev = NIL;
            e.next = old_head;
            e.stamp = stamp as u32;
        }
        if old_head == NIL {
            self.tail = idx;
            self.publish_tail(stamp);
        } else {
            self.entries[old_head as usize].prev = idx;
        }
        self.head = idx;
    }

    /// An access at LRU tick `now` (from [`LruBoard::now`] for reads, [`LruBoard::tick`] for
    /// writes, taken with this shard's lock held so stamps never decrease along the list):
    /// move the item to the head unless it was placed there less than `BUMP_TICKS_MIN` ticks
    /// ago. Reads that find the clock unmoved write nothing.
    #[inline]
    pub(crate) fn lru_touch(&mut self, idx: u32, now: u64) {
        let e = &mut self.entries[idx as usize];
        if (now as u32).wrapping_sub(e.stamp) < BUMP_TICKS_MIN {
            return;
        }
        if self.head != idx {
            self.lru_unlink(idx);
            self.lru_push_front(idx, now);
        } else {
            e.stamp = now as u32;
            if self.tail == idx {
                self.publish_tail(now);
            }
        }
    }

    /// Put a new entry in the slab, index and LRU head with full stamp `stamp` (a fresh tick
    /// taken under this shard's lock). The caller has already reserved its charge in the
    /// global byte count.
    pub(crate) fn insert(&mut self, e: Entry, stamp: u64) -> u32 {
        let tag = e.tag;
        let charge = e.charge();
        let idx = if self.free_head != NIL {
            let idx = self.free_head;
            let slot = &mut self.entries[idx as usize];
            self.free_head = slot.next;
            *slot = e;
            idx
        } else {
            self.entries.push(e);
            (self.entries.len() - 1) as u32
        };
        self.index.insert(tag, idx);
        self.lru_push_front(idx, stamp);
        self.bytes += charge;
        self.items += 1;
        self.counters.total_items += 1;
        idx
    }

    /// Slots of all linked items (live, expired or flushed), most recently used first.
    pub(crate) fn linked(&self) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.items as usize);
        let mut i = self.head;
        while i != NIL && out.len() < self.entries.len() {
            out.push(i);
            i = self.entries[i as usize].next;
        }
        out
    }

    /// Unlink an item from index and LRU, free its memory and give its charge back.
    pub(crate) fn remove(&mut self, idx: u32, used: &AtomicUsize) {
        self.lru_unlink(idx);
        self.remove_detached(idx, used);
    }

    /// `remove` for an item that is expired or flushed: its bytes also count as freed dead
    /// bytes (what differs between replicas that met it at different moments).
    pub(crate) fn remove_dead(&mut self, idx: u32, used: &AtomicUsize) {
        self.dead_freed.fetch_add(self.entries[idx as usize].charge(), Ordering::Relaxed);
        self.remove(idx, used);
    }

    /// Like `remove` for an item already taken off the LRU.
    fn remove_detached(&mut self, idx: u32, used: &AtomicUsize) {
        // Every removal (delete, replacement, eviction, expiry, flush, unlink) passes here:
        // a kernel copy must never outlive the item, or a later write to a key the store no
        // longer has would find no IN_KERNEL bit to tell it to invalidate.
        self.kernel_invalidate(idx);
        let free_head = self.free_head;
        let e = &mut self.entries[idx as usize];
        let charge = e.charge();
        let tag = e.tag;
        e.data = Arc::default();
        e.next = free_head;
        e.prev = NIL;
        e.bits = 0;
        self.free_head = idx;
        self.index.remove(tag, idx);
        self.bytes -= charge;
        self.items -= 1;
        used.fetch_sub(charge, Ordering::Relaxed);
    }

    /// Free the expired or flushed items at the very tail of the LRU, up to
    /// `TAIL_SEARCH_ITEMS`, stopping at the first live one (`reclaimed`): memcached's
    /// lru_pull_tail before each item allocation, which its LRU maintainer also runs in the
    /// background. Here it runs before each store, on the storing shard only (its lock is held),
    /// and from the server's maintainer thread for every shard (`Store::reclaim_tails`).
    /// Returns how many items it freed.
    pub(crate) fn reclaim_tail(&mut self, t: &Now, used: &AtomicUsize) -> usize {
        for freed in 0..TAIL_SEARCH_ITEMS {
            let i = self.tail;
            if i == NIL {
                return freed;
            }
            let e = &self.entries[i as usize];
            if !(t.is_expired(e) || t.is_flushed(e)) {
                return freed;
            }
            self.reclaim(i, used);
        }
        TAIL_SEARCH_ITEMS
    }

    /// Free expired or flushed item `i` met at the LRU tail, counted as memcached's tail pull
    /// counts it (`reclaimed`; `expired_unfetched` if never fetched).
    fn reclaim(&mut self, i: u32, used: &AtomicUsize) {
        self.counters.reclaimed += 1;
        if self.entries[i as usize].bits & FETCHED == 0 {
            self.counters.expired_unfetched += 1;
        }
        self.remove_dead(i, used);
    }

    /// Free one item from the LRU tail: an expired/flushed one among the last few if any
    /// (`reclaimed`), else, when `live`, the least recently used live one (`evictions`).
    /// False if nothing was freed.
    pub(crate) fn evict_one(&mut self, t: &Now, used: &AtomicUsize, live: bool) -> bool {
        let mut i = self.tail;
        for _ in 0..TAIL_SEARCH_ITEMS {
            if i == NIL {
                break;
            }
            let e = &self.entries[i as usize];
            if t.is_expired(e) || t.is_flushed(e) {
                self.reclaim(i, used);
                return true;
            }
            i = e.prev;
        }
        let victim = self.tail;
        if victim == NIL || !live {
            return false;
        }
        self.counters.evictions += 1;
        let e = &self.entries[victim as usize];
        if e.bits & FETCHED == 0 {
            self.counters.evicted_unfetched += 1;
        }
        if let Some(log) = &self.eviction_log {
            log(&crate::Evicted {
                key: e.key(),
                fetched: e.bits & FETCHED != 0,
                ttl_s: if e.exptime == 0 { -1 } else { i64::from(e.exptime) - i64::from(t.now) },
                last_access_ago_s: t.now.saturating_sub(e.atime),
                value_bytes: e.value().len(),
            });
        }
        self.remove(victim, used);
        true
    }

    /// The items from the most recently used to the least.
    pub(crate) fn iter_lru(&self) -> impl Iterator<Item = &Entry> + '_ {
        let mut i = self.head;
        std::iter::from_fn(move || {
            if i == NIL {
                return None;
            }
            let e = self.entries.get(i as usize)?;
            i = e.next;
            Some(e)
        })
    }

    /// Access time of the least recently used item, if any.
    pub(crate) fn tail_atime(&self) -> Option<u32> {
        (self.tail != NIL).then(|| self.entries[self.tail as usize].atime)
    }

    /// Check the LRU invariants: stamps never increase from head to tail, and the published
    /// tail stamp is the tail's.
    #[cfg(test)]
    pub(crate) fn check_lru(&self) {
        let mut i = self.head;
        let mut prev: Option<u32> = None;
        while i != NIL {
            let e = &self.entries[i as usize];
            if let Some(p) = prev {
                assert!(p.wrapping_sub(e.stamp) < 1 << 31, "stamps out of order: {p} before {}", e.stamp);
            }
            prev = Some(e.stamp);
            i = e.next;
        }
        let published = self.board.tail(self.id);
        match prev {
            None => assert_eq!(published, EMPTY_TAIL),
            Some(p) => assert_eq!(published as u32, p, "published tail stamp"),
        }
    }

    /// Keys from the LRU head (most recent) to the tail.
    #[cfg(test)]
    pub(crate) fn lru_keys(&self) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut i = self.head;
        while i != NIL {
            out.push(self.entries[i as usize].key().to_vec());
            i = self.entries[i as usize].next;
        }
        out
    }
}
