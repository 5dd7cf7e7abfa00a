//! Per-key-prefix counters for `stats detail on|off|dump`, as memcached 1.6.18's
//! stats_prefix.c: while detail is on, text get/gets/gat/gats, every text storage command and
//! text delete, and the binary protocol's get/touch/gat, set/add/replace/append/prepend and
//! delete count under the key's prefix (the bytes before the first delimiter, `-D`, default
//! ':'); keys without the delimiter are not counted. Meta commands and incr/decr never count
//! (memcached's do not). `stats reset` clears the table.
//!
//! The dump is byte-identical to memcached's: one `PREFIX <p> get <n> hit <n> set <n> del <n>`
//! line per prefix, in memcached's order (256 buckets by MurmurHash3 of the prefix, newest
//! first within a bucket), then `END`. Its lookup quirk is kept too: a key's prefix matches a
//! stored prefix in the same bucket that merely starts with it (C `strncmp` over the key's
//! prefix length), so `ab:x` can count under `abc`.
//!
//! Difference from memcached: the table is bounded (`PREFIXES_MAX`); once full, keys with new
//! prefixes are not counted (memcached grows without limit, and skips a prefix only when
//! calloc fails).
//!
//! Not for: the general counters (stats.rs) or protocol parsing. Cost while detail is off: one
//! relaxed load per request; while on, one mutex per counted request (memcached's STATS_LOCK).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

/// memcached's PREFIX_HASH_SIZE.
const BUCKETS: usize = 256;
/// Most distinct prefixes counted (each at most 250 bytes): bounds the table to a few MB and a
/// dump to a few MB of reply.
pub const PREFIXES_MAX: usize = 16_384;

/// What one request counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Event {
    Get { hit: bool },
    Set,
    Delete,
}

#[derive(Debug)]
struct Prefix {
    name: Box<[u8]>,
    gets: u64,
    hits: u64,
    sets: u64,
    deletes: u64,
}

#[derive(Debug)]
struct Table {
    /// Each bucket oldest first (memcached links new prefixes at the front, so its order is
    /// this one reversed).
    buckets: Vec<Vec<Prefix>>,
    count: usize,
}

/// The on/off switch and the counters; one per `ServerInfo` (per tenant).
#[derive(Debug)]
#[repr(align(64))] // the switch is read by every get/set/delete: keep it off written lines
pub struct PrefixStats {
    enabled: AtomicBool,
    table: Mutex<Table>,
}

impl Default for PrefixStats {
    fn default() -> Self {
        PrefixStats::new(false)
    }
}

impl PrefixStats {
    /// `enabled`: counting from the start (memcached `-D`).
    pub fn new(enabled: bool) -> PrefixStats {
        PrefixStats {
            enabled: AtomicBool::new(enabled),
            table: Mutex::new(Table { buckets: (0..BUCKETS).map(|_| Vec::new()).collect(), count: 0 }),
        }
    }

    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// `stats detail on` / `off`.
    pub fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Ordering::Relaxed);
    }

    /// `stats reset`: forget every prefix (memcached's stats_prefix_clear).
    pub fn clear(&self) {
        let mut t = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        t.buckets.iter_mut().for_each(Vec::clear);
        t.count = 0;
    }

    fn record(&self, delimiter: u8, key: &[u8], ev: Event) {
        // memcached reads the key as a C string: a NUL before the delimiter means no prefix.
        let Some(len) = key.iter().position(|&b| b == delimiter || b == 0) else { return };
        if key[len] != delimiter {
            return;
        }
        let name = &key[..len];
        let bucket = murmur3_32(name) as usize % BUCKETS;
        let mut t = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        let found = t.buckets[bucket].iter().rposition(|p| p.name.starts_with(name));
        let i = match found {
            Some(i) => i,
            None if t.count >= PREFIXES_MAX => return,
            None => {
                t.count += 1;
                let b = &mut t.buckets[bucket];
                b.push(Prefix { name: name.into(), gets: 0, hits: 0, sets: 0, deletes: 0 });
                b.len() - 1
            }
        };
        let p = &mut t.buckets[bucket][i];
        match ev {
            Event::Get { hit } => {
                p.gets += 1;
                p.hits += u64::from(hit);
            }
            Event::Set => p.sets += 1,
            Event::Delete => p.deletes += 1,
        }
    }

    /// `stats detail dump`: memcached's text, `END\r\n` included.
    pub fn dump(&self, out: &mut Vec<u8>) {
        let t = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        for p in t.buckets.iter().flat_map(|b| b.iter().rev()) {
            out.extend_from_slice(b"PREFIX ");
            out.extend_from_slice(&p.name);
            let line = format!(" get {} hit {} set {} del {}\r\n", p.gets, p.hits, p.sets, p.deletes);
            out.extend_from_slice(line.as_bytes());
        }
        out.extend_from_slice(b"END\r\n");
    }
}

/// Where a request's executor finds the table and the delimiter (the executor context
/// implements it; this module does not depend on the executors).
pub trait PrefixSink {
    fn prefix_stats(&self) -> &PrefixStats;
    /// The byte that ends a key's prefix (memcached `-D`).
    fn prefix_delimiter(&self) -> u8;
}

/// Count a get-like read of `key` (get/gets/gat/gats, binary get/touch/gat).
#[inline]
pub fn record_get(ctx: &impl PrefixSink, key: &[u8], hit: bool) {
    let p = ctx.prefix_stats();
    if p.enabled() {
        p.record(ctx.prefix_delimiter(), key, Event::Get { hit });
    }
}

/// Count a storage command for `key` (counted before it is executed, whatever its outcome).
#[inline]
pub fn record_set(ctx: &impl PrefixSink, key: &[u8]) {
    let p = ctx.prefix_stats();
    if p.enabled() {
        p.record(ctx.prefix_delimiter(), key, Event::Set);
    }
}

/// Count a delete of `key` (hit or miss).
#[inline]
pub fn record_delete(ctx: &impl PrefixSink, key: &[u8]) {
    let p = ctx.prefix_stats();
    if p.enabled() {
        p.record(ctx.prefix_delimiter(), key, Event::Delete);
    }
}

/// MurmurHash3_x86_32 with seed 0: memcached 1.6's default `hash`, which orders its prefix
/// buckets. Not a hot path (only while detail is on); kept here because the dump order
/// depends on this exact function.
fn murmur3_32(data: &[u8]) -> u32 {
    const C1: u32 = 0xcc9e_2d51;
    const C2: u32 = 0x1b87_3593;
    let mix = |k: u32| k.wrapping_mul(C1).rotate_left(15).wrapping_mul(C2);
    let mut h: u32 = 0;
    let mut blocks = data.chunks_exact(4);
    for b in &mut blocks {
        h ^= mix(u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        h = h.rotate_left(13).wrapping_mul(5).wrapping_add(0xe654_6b64);
    }
    let tail = blocks.remainder();
    if !tail.is_empty() {
        let k = tail.iter().rev().fold(0u32, |k, &b| (k << 8) | u32::from(b));
        h ^= mix(k);
    }
    h ^= data.len() as u32;
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dump(p: &PrefixStats) -> String {
        let mut out = Vec::new();
        p.dump(&mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn murmur3_matches_the_reference_vectors() {
        // SMHasher's MurmurHash3_x86_32 with seed 0.
        assert_eq!(murmur3_32(b""), 0);
        assert_eq!(murmur3_32(b"hello"), 0x248b_fa47);
        assert_eq!(murmur3_32(b"hello, world"), 0x149b_bb7f);
        assert_eq!(murmur3_32(b"The quick brown fox jumps over the lazy dog"), 0x2e4f_f723);
    }

    #[test]
    fn counts_by_prefix_like_memcached() {
        let p = PrefixStats::new(true);
        p.record(b':', b"abc:1", Event::Set);
        p.record(b':', b"abc:2", Event::Get { hit: true });
        p.record(b':', b"abc:3", Event::Get { hit: false });
        p.record(b':', b"abc:", Event::Delete);
        p.record(b':', b"noprefix", Event::Set);
        p.record(b':', b"a\0b:c", Event::Set);
        assert_eq!(dump(&p), "PREFIX abc get 2 hit 1 set 1 del 1\r\nEND\r\n");
        p.record(b':', b":x", Event::Set);
        assert!(dump(&p).contains("PREFIX  get 0 hit 0 set 1 del 0\r\n"));
        p.clear();
        assert_eq!(dump(&p), "END\r\n");
        p.record(b'|', b"x|y", Event::Set);
        assert_eq!(dump(&p), "PREFIX x get 0 hit 0 set 1 del 0\r\nEND\r\n");
    }

    #[test]
    fn the_table_is_bounded() {
        let p = PrefixStats::new(true);
        for i in 0..PREFIXES_MAX + 10 {
            p.record(b':', format!("p{i}:k").as_bytes(), Event::Set);
        }
        assert_eq!(dump(&p).lines().count(), PREFIXES_MAX + 1);
    }
}
