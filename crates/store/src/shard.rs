//! One lock shard: the item slab (a `Vec` of entries reused through a free list), the hash
//! index, an intrusive doubly linked LRU over slab slot numbers, and the shard's counters.
//!
//! Not for: locking, CAS numbering or exptime conversion; `Store` does those and calls in
//! here with the lock held. Every operation here is O(1) (index growth amortised).

use crate::index::Index;
use crate::{KernelCache, ITEM_OVERHEAD_BYTES};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

pub(crate) const NIL: u32 = u32::MAX;

/// Item has been read by a bumping access (memcached ITEM_FETCHED, meta `h`).
pub(crate) const FETCHED: u8 = 1;
/// Item is marked stale by an invalidation (meta `X`).
pub(crate) const STALE: u8 = 2;
/// A win token was handed out for this item (meta `Z` to later readers).
pub(crate) const TOKEN_SENT: u8 = 4;
/// Accessed since it was last placed at the LRU head. Reads only set this bit (one write to
/// an entry already in cache) instead of relinking the list; eviction gives such an item a
/// second chance by moving it to the head. The result orders like LRU by last access.
pub(crate) const ACTIVE: u8 = 8;
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
/// Most ACTIVE tail items one eviction moves back to the head before it evicts anyway.
const SECOND_CHANCE_MAX: usize = 256;

#[repr(align(64))] // one cache line per entry: a lookup touches exactly one line here
pub(crate) struct Entry {
    /// Key bytes followed by value bytes: one allocation per item.
    pub(crate) data: Box<[u8]>,
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
    pub(crate) key_len: u16,
    pub(crate) bits: u8,
}

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
}

impl Shard {
    pub(crate) fn new() -> Shard {
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
        }
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
        let idx = self.find(key, tag)?;
        let e = &self.entries[idx as usize];
        if t.is_flushed(e) {
            self.counters.get_flushed += 1;
            self.remove(idx, used);
            return None;
        }
        if t.is_expired(e) {
            self.counters.get_expired += 1;
            self.remove(idx, used);
            return None;
        }
        Some(idx)
    }

    pub(crate) fn lru_unlink(&mut self, idx: u32) {
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
    }

    pub(crate) fn lru_push_front(&mut self, idx: u32) {
        let old_head = self.head;
        {
            let e = &mut self.entries[idx as usize];
            e.prev = NIL;
            e.next = old_head;
        }
        if old_head == NIL {
            self.tail = idx;
        } else {
            self.entries[old_head as usize].prev = idx;
        }
        self.head = idx;
    }

    /// Move to the most recently used end.
    #[inline]
    pub(crate) fn lru_bump(&mut self, idx: u32) {
        if self.head != idx {
            self.lru_unlink(idx);
            self.lru_push_front(idx);
        }
    }

    /// Put a new entry in the slab, index and LRU head. The caller has already reserved its
    /// charge in the global byte count.
    pub(crate) fn insert(&mut self, e: Entry) -> u32 {
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
        self.lru_push_front(idx);
        self.bytes += charge;
        self.items += 1;
        self.counters.total_items += 1;
        idx
    }

    /// Unlink an item from index and LRU, free its memory and give its charge back.
    pub(crate) fn remove(&mut self, idx: u32, used: &AtomicUsize) {
        self.lru_unlink(idx);
        self.remove_detached(idx, used);
    }

    /// Like `remove` for an item already taken off the LRU.
    pub(crate) fn remove_detached(&mut self, idx: u32, used: &AtomicUsize) {
        // Every removal (delete, replacement, eviction, expiry, flush, unlink) passes here:
        // a kernel copy must never outlive the item, or a later write to a key the store no
        // longer has would find no IN_KERNEL bit to tell it to invalidate.
        self.kernel_invalidate(idx);
        let free_head = self.free_head;
        let e = &mut self.entries[idx as usize];
        let charge = e.charge();
        let tag = e.tag;
        e.data = Box::default();
        e.next = free_head;
        e.prev = NIL;
        e.bits = 0;
        self.free_head = idx;
        self.index.remove(tag, idx);
        self.bytes -= charge;
        self.items -= 1;
        used.fetch_sub(charge, Ordering::Relaxed);
    }

    /// Free one item from the LRU tail: an expired/flushed one among the last few if any
    /// (`reclaimed`), else the least recently used live one (`evictions`). False if empty.
    pub(crate) fn evict_one(&mut self, t: &Now, used: &AtomicUsize) -> bool {
        for _ in 0..SECOND_CHANCE_MAX {
            let tail = self.tail;
            if tail == NIL {
                break;
            }
            let e = &mut self.entries[tail as usize];
            if e.bits & ACTIVE == 0 {
                break;
            }
            e.bits &= !ACTIVE;
            self.lru_bump(tail);
        }
        let mut i = self.tail;
        for _ in 0..TAIL_SEARCH_ITEMS {
            if i == NIL {
                break;
            }
            let e = &self.entries[i as usize];
            if t.is_expired(e) || t.is_flushed(e) {
                self.counters.reclaimed += 1;
                if e.bits & FETCHED == 0 {
                    self.counters.expired_unfetched += 1;
                }
                self.remove(i, used);
                return true;
            }
            i = e.prev;
        }
        let victim = self.tail;
        if victim == NIL {
            return false;
        }
        self.counters.evictions += 1;
        if self.entries[victim as usize].bits & FETCHED == 0 {
            self.counters.evicted_unfetched += 1;
        }
        self.remove(victim, used);
        true
    }

    /// Access time of the least recently used item, if any.
    pub(crate) fn tail_atime(&self) -> Option<u32> {
        (self.tail != NIL).then(|| self.entries[self.tail as usize].atime)
    }

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
