//! Tests of the kernel cache observer: a mock cache records what the store fills and
//! invalidates; every item-changing operation must drop the mock's copy before the change, and
//! a randomized run checks that the mock never holds a copy that differs from the store.

use super::*;
use std::collections::HashMap;
use std::sync::Mutex as StdMutex;

const START_UNIX_S: i64 = 1_700_000_000;

/// What the mock holds per key: value, flags, cas, relative expiry second (None = never).
type Copy = (Vec<u8>, u32, u64, Option<u32>);

#[derive(Default)]
struct Mock {
    items: StdMutex<HashMap<Vec<u8>, Copy>>,
    fills: AtomicU64,
    invalidations: AtomicU64,
    flushes: AtomicU64,
    /// Keys longer than this are refused (stands in for "reply does not fit").
    refuse_value_bytes_over: usize,
    clock: OnceLock<Clock>,
}

impl Mock {
    fn new(refuse_value_bytes_over: usize) -> Arc<Mock> {
        Arc::new(Mock { refuse_value_bytes_over, ..Mock::default() })
    }
    fn holds(&self, key: &str) -> bool {
        self.items.lock().unwrap().contains_key(key.as_bytes())
    }
    fn fills(&self) -> u64 {
        self.fills.load(Ordering::SeqCst)
    }
}

impl KernelCache for Mock {
    fn fill(&self, key: &[u8], flags: u32, cas: u64, value: &[u8], expires_at: Option<Instant>) -> KernelFill {
        self.fills.fetch_add(1, Ordering::SeqCst);
        if value.len() > self.refuse_value_bytes_over {
            return KernelFill::NotCacheable;
        }
        // Map the deadline back to a relative second of the manual clock (rounding up the
        // few microseconds that passed since the store computed it).
        let rel = expires_at.map(|d| {
            let left = d.saturating_duration_since(Instant::now());
            let now = self.clock.get().map(|c| c.now_rel_s()).unwrap_or(0);
            now + (left.as_millis() as u32).div_ceil(1000)
        });
        self.items.lock().unwrap().insert(key.to_vec(), (value.to_vec(), flags, cas, rel));
        KernelFill::Cached
    }
    fn invalidate(&self, key: &[u8]) {
        self.invalidations.fetch_add(1, Ordering::SeqCst);
        self.items.lock().unwrap().remove(key);
    }
    fn flush_all(&self) {
        self.flushes.fetch_add(1, Ordering::SeqCst);
        self.items.lock().unwrap().clear();
    }
}

fn store_with_mock(memory_bytes_max: usize, refuse_over: usize) -> (Store, Arc<Mock>) {
    let c = StoreConfig { memory_bytes_max, shards: 4, ..StoreConfig::default() };
    let s = Store::with_clock(c, Clock::manual(START_UNIX_S));
    let m = Mock::new(refuse_over);
    let _ = m.clock.set(s.clock().clone());
    assert!(s.set_kernel_cache(m.clone()));
    assert!(!s.set_kernel_cache(m.clone()), "installs only once");
    (s, m)
}

fn read() -> GetOpts {
    GetOpts { bump: true, kernel_fill: true, ..GetOpts::default() }
}

fn fill(s: &Store, k: &str) -> Option<Vec<u8>> {
    s.get(k.as_bytes(), read(), |o| o.item.map(|i| i.value.to_vec()))
}

fn set(s: &Store, k: &str, v: &str, exp: i64) {
    assert!(matches!(
        s.store(SetMode::Set, k.as_bytes(), v.as_bytes(), 0, exp, StoreOpts::default()),
        StoreResult::Stored(_)
    ));
}

#[test]
fn reads_fill_once_and_only_when_asked() {
    let (s, m) = store_with_mock(1 << 20, 100);
    set(&s, "a", "1", 0);
    // A read without kernel_fill (mg with other flags, me, ...) offers nothing.
    s.get(b"a", GetOpts { bump: true, ..GetOpts::default() }, |_| ());
    assert_eq!(m.fills(), 0);
    assert_eq!(fill(&s, "a").as_deref(), Some(&b"1"[..]));
    assert!(m.holds("a"));
    fill(&s, "a");
    assert_eq!(m.fills(), 1, "an item the cache holds is not offered again");
    // Refusals are remembered until the item changes.
    set(&s, "big", &"x".repeat(200), 0);
    fill(&s, "big");
    fill(&s, "big");
    assert_eq!(m.fills(), 2);
    set(&s, "big", "small", 0);
    fill(&s, "big");
    assert!(m.holds("big"));
    // Misses and gat fill nothing.
    assert_eq!(fill(&s, "nope"), None);
    s.get(b"a", GetOpts { touch_exptime: Some(100), kernel_fill: true, ..read() }, |_| ());
    assert!(!m.holds("a"), "gat invalidates and does not refill");
}

/// Each case: prepare key "k" (value "10"), fill it, run `op`, and demand the copy is gone.
#[test]
fn every_change_invalidates_first() {
    type Op = fn(&Store);
    let cases: Vec<(&str, Op)> = vec![
        ("set", |s| set(s, "k", "new", 0)),
        ("set same size (in place)", |s| set(s, "k", "20", 0)),
        ("replace", |s| {
            s.store(SetMode::Replace, b"k", b"r", 0, 0, StoreOpts::default());
        }),
        ("append", |s| {
            s.store(SetMode::Append, b"k", b"a", 0, 0, StoreOpts::default());
        }),
        ("prepend", |s| {
            s.store(SetMode::Prepend, b"k", b"p", 0, 0, StoreOpts::default());
        }),
        ("cas", |s| {
            let cas = s.get(b"k", GetOpts::default(), |o| o.item.map(|i| i.cas)).unwrap();
            s.store(SetMode::Cas, b"k", b"c", 0, 0, StoreOpts { cas: Some(cas), ..StoreOpts::default() });
        }),
        ("ms I (stale cas)", |s| {
            s.store(
                SetMode::Set,
                b"k",
                b"i",
                0,
                0,
                StoreOpts { cas: Some(1), invalidate: true, ..StoreOpts::default() },
            );
        }),
        ("set already expired", |s| set(s, "k", "x", -1)),
        ("delete", |s| {
            s.delete(b"k", DeleteOpts::default());
        }),
        ("md I", |s| {
            s.delete(b"k", DeleteOpts { invalidate: true, ..DeleteOpts::default() });
        }),
        ("incr in place", |s| {
            s.arith(b"k", true, 1, ArithOpts::default());
        }),
        ("incr longer", |s| {
            s.arith(b"k", true, 1000, ArithOpts::default());
        }),
        ("decr", |s| {
            s.arith(b"k", false, 1, ArithOpts::default());
        }),
        ("touch", |s| {
            s.touch(b"k", 100);
        }),
        ("gat", |s| {
            s.get(b"k", GetOpts { touch_exptime: Some(5), bump: true, ..GetOpts::default() }, |_| ());
        }),
        ("mg R (win token)", |s| {
            s.touch(b"k", 10);
            fill(s, "k");
            let o = GetOpts { recache_below_s: Some(30), win_tokens: true, bump: true, ..GetOpts::default() };
            assert!(s.get(b"k", o, |o| o.won));
        }),
        ("unlink", |s| {
            s.unlink(b"k");
        }),
        ("flush_all", |s| s.flush_all(0)),
        ("flush_all delayed", |s| s.flush_all(10)),
    ];
    for (name, op) in cases {
        let (s, m) = store_with_mock(1 << 20, 100);
        set(&s, "k", "10", 0);
        fill(&s, "k");
        assert!(m.holds("k"), "{name}: filled");
        op(&s);
        assert!(!m.holds("k"), "{name}: kernel copy survived the change");
    }
}

#[test]
fn failed_writes_and_reads_keep_the_copy() {
    let (s, m) = store_with_mock(1 << 20, 100);
    set(&s, "k", "v", 0);
    fill(&s, "k");
    let inv = m.invalidations.load(Ordering::SeqCst);
    s.store(SetMode::Add, b"k", b"x", 0, 0, StoreOpts::default());
    s.store(SetMode::Cas, b"k", b"x", 0, 0, StoreOpts { cas: Some(999_999), ..StoreOpts::default() });
    s.delete(b"k", DeleteOpts { cas: Some(999_999), ..DeleteOpts::default() });
    assert_eq!(s.arith(b"k", true, 1, ArithOpts::default()), ArithResult::NonNumeric);
    fill(&s, "k");
    assert!(m.holds("k"));
    assert_eq!(m.invalidations.load(Ordering::SeqCst), inv, "no-op commands cost no invalidation");
    // Writes to items the cache does not hold cost nothing either.
    set(&s, "other", "1", 0);
    set(&s, "other", "2", 0);
    assert_eq!(m.invalidations.load(Ordering::SeqCst), inv);
}

#[test]
fn expiry_eviction_and_flush_removals_invalidate() {
    // Expiry: the store drops the item on access and must drop the copy with it.
    let (s, m) = store_with_mock(1 << 20, 100);
    set(&s, "t", "v", 5);
    fill(&s, "t");
    assert_eq!(m.items.lock().unwrap().get(&b"t"[..]).map(|c| c.3), Some(Some(s.clock().now_rel_s() + 5)));
    s.clock().advance(6);
    assert_eq!(fill(&s, "t"), None);
    assert!(!m.holds("t"));

    // Eviction under memory pressure.
    let (s, m) = store_with_mock(64 * 1024, 10_000);
    set(&s, "first", "v", 0);
    fill(&s, "first");
    let v = "y".repeat(1000);
    for i in 0..200 {
        set(&s, &format!("fill{i}"), &v, 0);
    }
    assert!(s.stats().evictions > 0);
    assert!(!s.get(b"first", GetOpts::default(), |o| o.item.is_some()));
    assert!(!m.holds("first"), "evicted item's copy survived");

    // A delayed flush empties the cache at once and nothing is filled until it is in force.
    let (s, m) = store_with_mock(1 << 20, 100);
    set(&s, "d", "v", 0);
    fill(&s, "d");
    s.flush_all(10);
    assert!(!m.holds("d"));
    let fills = m.fills();
    assert!(fill(&s, "d").is_some(), "still visible while the flush is pending");
    assert_eq!(m.fills(), fills, "no fill while a delayed flush is pending");
    s.clock().advance(11);
    assert_eq!(fill(&s, "d"), None);
    set(&s, "d", "after", 0);
    fill(&s, "d");
    assert!(m.holds("d"), "fills resume after the flush took effect");
    assert_eq!(m.flushes.load(Ordering::SeqCst), 1);
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Random operations on a few keys; after each, every copy the mock would serve (not past its
/// expiry) must equal the store's visible item exactly.
#[allow(clippy::too_many_lines)] // one test scenario, read top to bottom
#[test]
fn randomized_copies_always_match_the_store() {
    let seed =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1)
            | 1;
    println!("randomized_copies_always_match_the_store seed {seed}");
    let mut rng = Rng(seed);
    let (s, m) = store_with_mock(48 * 1024, 300);
    let keys: Vec<String> = (0..8).map(|i| format!("k{i}")).collect();
    for step in 0..20_000 {
        let r = rng.next();
        let k = keys[(r % keys.len() as u64) as usize].as_bytes();
        let n = (r >> 8) % 100;
        let vlen = ((r >> 16) % 700) as usize;
        let v = vec![b'a' + (step % 26) as u8; vlen];
        let exp = [0i64, 0, 0, 2, 5, -1][((r >> 32) % 6) as usize];
        let o = StoreOpts::default();
        match n {
            0..=29 => {
                s.get(k, read(), |_| ());
            }
            30..=44 => {
                s.store(SetMode::Set, k, &v, (r >> 40) as u32 % 4, exp, o);
            }
            45..=47 => {
                s.store(SetMode::Add, k, &v, 0, exp, o);
            }
            48..=50 => {
                s.store(SetMode::Replace, k, &v, 0, exp, o);
            }
            51..=53 => {
                s.store(SetMode::Append, k, &v[..vlen.min(40)], 0, 0, o);
            }
            54..=55 => {
                s.store(SetMode::Prepend, k, &v[..vlen.min(40)], 0, 0, o);
            }
            56..=58 => {
                let cas = s.get(k, GetOpts::default(), |o| o.item.map(|i| i.cas)).unwrap_or(1);
                s.store(SetMode::Cas, k, &v, 0, exp, StoreOpts { cas: Some(cas), ..o });
            }
            59..=63 => {
                s.delete(k, DeleteOpts::default());
            }
            64..=65 => {
                s.delete(k, DeleteOpts { invalidate: true, ..DeleteOpts::default() });
            }
            66..=69 => {
                s.store(SetMode::Set, k, b"99", 0, 0, o);
                s.arith(k, true, (r >> 20) % 5, ArithOpts::default());
            }
            70..=72 => {
                s.arith(k, false, 1, ArithOpts::default());
            }
            73..=76 => {
                s.touch(k, exp);
            }
            77..=79 => {
                s.get(k, GetOpts { touch_exptime: Some(exp), bump: true, ..GetOpts::default() }, |_| ());
            }
            80..=82 => {
                let g = GetOpts { win_tokens: true, recache_below_s: Some(3), bump: true, ..GetOpts::default() };
                s.get(k, g, |_| ());
            }
            83 => s.flush_all(if r & (1 << 50) != 0 { 2 } else { 0 }),
            84..=86 => s.clock().advance(1),
            87 => {
                s.unlink(k);
            }
            _ => {
                // Bulk stores of other keys force evictions.
                let big = vec![b'z'; 2000];
                s.store(SetMode::Set, format!("bulk{}", r % 64).as_bytes(), &big, 0, 0, o);
            }
        }
        let held: Vec<(Vec<u8>, Copy)> = m.items.lock().unwrap().iter().map(|(k, c)| (k.clone(), c.clone())).collect();
        let now = s.clock().now_rel_s();
        for (key, (value, flags, cas, exp_rel)) in held {
            if matches!(exp_rel, Some(e) if e <= now) {
                continue; // the kernel itself would not serve it
            }
            let in_store = s.get(&key, GetOpts::default(), |o| {
                o.item.map(|i| (i.value.to_vec(), i.flags, i.cas, i.ttl_remaining_s))
            });
            let Some((sv, sf, sc, ttl)) = in_store else {
                panic!(
                    "seed {seed} step {step}: copy of {:?} served but the store has no item",
                    String::from_utf8_lossy(&key)
                );
            };
            assert!(
                sv == value && sf == flags && sc == cas,
                "seed {seed} step {step}: copy of {:?} differs from the store",
                String::from_utf8_lossy(&key)
            );
            if let Some(e) = exp_rel {
                assert!(
                    ttl >= 0 && i64::from(e) <= i64::from(now) + ttl,
                    "seed {seed} step {step}: copy outlives the item"
                );
            } else {
                assert_eq!(ttl, -1, "seed {seed} step {step}: copy never expires but the item does");
            }
        }
    }
    assert!(m.fills() > 100, "the run exercised fills");
}
