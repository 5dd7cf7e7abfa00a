//! Behaviour tests for the store, one per memcached rule; time moves with `Clock::manual`.

use super::*;

const START_UNIX_S: i64 = 1_700_000_000;

fn store_with(f: impl FnOnce(&mut StoreConfig)) -> Store {
    let mut c = StoreConfig::default();
    f(&mut c);
    Store::with_clock(c, Clock::manual(START_UNIX_S))
}

fn new_store() -> Store {
    store_with(|_| {})
}

fn set(s: &Store, k: &str, v: &str, exp: i64) -> StoreResult {
    s.store(SetMode::Set, k.as_bytes(), v.as_bytes(), 0, exp, StoreOpts::default())
}

fn bump() -> GetOpts {
    GetOpts { bump: true, ..GetOpts::default() }
}

/// (value, flags, cas) of a visible item.
fn get(s: &Store, k: &str) -> Option<(String, u32, u64)> {
    s.get(k.as_bytes(), bump(), |o| o.item.map(|i| (String::from_utf8_lossy(i.value).into_owned(), i.flags, i.cas)))
}

fn val(s: &Store, k: &str) -> Option<String> {
    get(s, k).map(|g| g.0)
}

fn cas_of(s: &Store, k: &str) -> u64 {
    get(s, k).map(|g| g.2).unwrap_or(0)
}

fn stored_cas(r: StoreResult) -> u64 {
    match r {
        StoreResult::Stored(c) => c,
        other => panic!("expected Stored, got {other:?}"),
    }
}

// ---- exptime -------------------------------------------------------------------------------

#[test]
fn exptime_zero_never_expires() {
    let s = new_store();
    stored_cas(set(&s, "k", "v", 0));
    s.clock().advance(REALTIME_MAXDELTA_S as u64 * 10);
    assert_eq!(val(&s, "k").as_deref(), Some("v"));
}

#[test]
fn exptime_negative_is_already_expired() {
    let s = new_store();
    stored_cas(set(&s, "k", "old", 0));
    stored_cas(set(&s, "k", "v", -1));
    // Linked, as memcached links it: counted until an access meets it expired.
    assert_eq!((s.stats().curr_items, s.stats().get_expired), (1, 0));
    assert_eq!(val(&s, "k"), None, "negative exptime stores an already expired item");
    assert_eq!(s.stats().total_items, 2);
    assert_eq!((s.stats().curr_items, s.stats().get_expired), (0, 1));
    // A store finds it at its shard's LRU tail and reclaims it before looking the key up
    // (memcached's allocation pulls the tail first, too).
    stored_cas(set(&s, "k", "v", -1));
    stored_cas(set(&s, "k", "w", 0));
    let st = s.stats();
    assert_eq!((st.get_expired, st.reclaimed, val(&s, "k").as_deref()), (1, 1, Some("w")));
}

#[test]
fn exptime_relative_expires_at_now_plus_ttl() {
    let s = new_store();
    stored_cas(set(&s, "k", "v", 10));
    s.clock().advance(9);
    assert_eq!(val(&s, "k").as_deref(), Some("v"));
    s.clock().advance(1);
    assert_eq!(val(&s, "k"), None);
    assert_eq!(s.stats().get_expired, 1);
    assert_eq!(s.stats().curr_items, 0, "expired item is unlinked on access");
}

#[test]
fn exptime_thirty_days_is_relative_one_more_is_absolute() {
    let s = new_store();
    stored_cas(set(&s, "rel", "v", REALTIME_MAXDELTA_S));
    // REALTIME_MAXDELTA_S + 1 read as a Unix time is in 1970: already expired.
    stored_cas(set(&s, "abs", "v", REALTIME_MAXDELTA_S + 1));
    assert_eq!(val(&s, "rel").as_deref(), Some("v"));
    assert_eq!(val(&s, "abs"), None);
}

#[test]
fn exptime_absolute_future() {
    let s = new_store();
    let now_unix = s.clock().now_unix_s();
    stored_cas(set(&s, "k", "v", now_unix + 100));
    s.clock().advance(99);
    assert_eq!(val(&s, "k").as_deref(), Some("v"));
    s.clock().advance(1);
    assert_eq!(val(&s, "k"), None);
}

#[test]
fn exptime_absolute_past() {
    let s = new_store();
    s.clock().advance(1000);
    // Before the process started.
    stored_cas(set(&s, "a", "v", START_UNIX_S - 5));
    // After the start but before now.
    stored_cas(set(&s, "b", "v", START_UNIX_S + 500));
    // Exactly now.
    stored_cas(set(&s, "c", "v", s.clock().now_unix_s()));
    assert_eq!(val(&s, "a"), None);
    assert_eq!(val(&s, "b"), None);
    assert_eq!(val(&s, "c"), None);
    assert_eq!(s.rel_exptime(START_UNIX_S), 1);
}

// ---- flush_all -----------------------------------------------------------------------------

#[test]
fn flush_now_hides_older_items_but_not_later_sets_in_same_second() {
    let s = new_store();
    s.clock().advance(5);
    stored_cas(set(&s, "old", "1", 0));
    stored_cas(set(&s, "same_second", "1", 0));
    s.flush_all(0);
    stored_cas(set(&s, "after", "2", 0));
    assert_eq!(val(&s, "old"), None);
    assert_eq!(val(&s, "same_second"), None);
    assert_eq!(val(&s, "after").as_deref(), Some("2"), "memcached with CAS keeps post-flush sets");
    assert_eq!(s.stats().get_flushed, 2);
    s.clock().advance(3);
    assert_eq!(val(&s, "after").as_deref(), Some("2"));
}

#[test]
fn flush_now_without_cas_hides_sets_until_next_second() {
    // memcached -C: oldest_live = now, so a set in the same second is flushed too.
    let s = store_with(|c| c.cas_enabled = false);
    stored_cas(set(&s, "old", "1", 0));
    s.flush_all(0);
    stored_cas(set(&s, "same", "2", 0));
    assert_eq!(val(&s, "old"), None);
    assert_eq!(val(&s, "same"), None);
    s.clock().advance(1);
    stored_cas(set(&s, "next", "3", 0));
    assert_eq!(val(&s, "next").as_deref(), Some("3"));
}

#[test]
fn flush_delayed_takes_effect_after_delay_minus_one_with_cas() {
    let s = new_store();
    stored_cas(set(&s, "k", "v", 0));
    s.flush_all(10);
    s.clock().advance(8);
    assert_eq!(val(&s, "k").as_deref(), Some("v"), "still visible before the flush time");
    stored_cas(set(&s, "late", "v", 0));
    s.clock().advance(1);
    assert_eq!(val(&s, "k"), None);
    assert_eq!(val(&s, "late"), None, "stored before the flush time: flushed too");
    // A set in the flush second itself is invisible (time <= oldest_live), as memcached.
    stored_cas(set(&s, "at", "v", 0));
    assert_eq!(val(&s, "at"), None);
    s.clock().advance(1);
    stored_cas(set(&s, "new", "v", 0));
    assert_eq!(val(&s, "new").as_deref(), Some("v"));
}

#[test]
fn flush_delayed_without_cas_takes_effect_after_full_delay() {
    let s = store_with(|c| c.cas_enabled = false);
    stored_cas(set(&s, "k", "v", 0));
    s.flush_all(3);
    s.clock().advance(2);
    assert_eq!(val(&s, "k").as_deref(), Some("v"));
    s.clock().advance(1);
    assert_eq!(val(&s, "k"), None);
}

#[test]
fn flush_negative_delay_means_now() {
    let s = new_store();
    stored_cas(set(&s, "k", "v", 0));
    s.flush_all(-5);
    assert_eq!(val(&s, "k"), None);
}

// ---- CAS -----------------------------------------------------------------------------------

#[test]
fn cas_values_are_unique_and_change_on_every_modification() {
    let s = new_store();
    let mut seen = std::collections::HashSet::new();
    for i in 0..1000 {
        assert!(seen.insert(stored_cas(set(&s, &format!("k{}", i % 10), "1", 0))));
    }
    let c0 = cas_of(&s, "k1");
    stored_cas(s.store(SetMode::Append, b"k1", b"2", 0, 0, StoreOpts::default()));
    let c1 = cas_of(&s, "k1");
    assert_ne!(c0, c1, "append changes CAS");
    let ArithResult::Ok { cas: c2, .. } = s.arith(b"k1", true, 1, ArithOpts::default()) else { panic!() };
    assert_ne!(c1, c2, "incr changes CAS");
    assert_eq!(cas_of(&s, "k1"), c2);
    assert!(s.touch(b"k1", 100));
    assert_eq!(cas_of(&s, "k1"), c2, "touch keeps CAS");
}

#[test]
fn cas_on_missing_is_not_found() {
    let s = new_store();
    let opts = StoreOpts { cas: Some(5), ..StoreOpts::default() };
    assert_eq!(s.store(SetMode::Cas, b"nope", b"v", 0, 0, opts), StoreResult::NotFound);
}

#[test]
fn cas_mismatch_is_exists_and_match_stores() {
    let s = new_store();
    let c = stored_cas(set(&s, "k", "v", 0));
    let bad = StoreOpts { cas: Some(c + 1), ..StoreOpts::default() };
    assert_eq!(s.store(SetMode::Cas, b"k", b"x", 0, 0, bad), StoreResult::Exists);
    let zero = StoreOpts { cas: Some(0), ..StoreOpts::default() };
    assert_eq!(s.store(SetMode::Cas, b"k", b"x", 0, 0, zero), StoreResult::Exists, "cas 0 never matches");
    let good = StoreOpts { cas: Some(c), ..StoreOpts::default() };
    let c2 = stored_cas(s.store(SetMode::Cas, b"k", b"new", 3, 0, good));
    assert_ne!(c, c2);
    assert_eq!(get(&s, "k"), Some(("new".into(), 3, c2)));
}

#[test]
fn meta_cas_with_modes() {
    let s = new_store();
    let opts = |c| StoreOpts { cas: Some(c), ..StoreOpts::default() };
    // Set/Replace with a CAS behave as CAS mode.
    assert_eq!(s.store(SetMode::Set, b"k", b"v", 0, 0, opts(9)), StoreResult::NotFound);
    assert_eq!(s.store(SetMode::Replace, b"k", b"v", 0, 0, opts(9)), StoreResult::NotFound);
    // Add ignores the CAS.
    let c = stored_cas(s.store(SetMode::Add, b"k", b"v", 0, 0, opts(9)));
    assert_eq!(s.store(SetMode::Set, b"k", b"w", 0, 0, opts(c + 7)), StoreResult::Exists);
    // Append checks a nonzero CAS.
    assert_eq!(s.store(SetMode::Append, b"k", b"w", 0, 0, opts(c + 7)), StoreResult::Exists);
    let c2 = stored_cas(s.store(SetMode::Append, b"k", b"w", 0, 0, opts(c)));
    assert_eq!(val(&s, "k").as_deref(), Some("vw"));
    stored_cas(s.store(SetMode::Replace, b"k", b"z", 0, 0, opts(c2)));
    assert_eq!(val(&s, "k").as_deref(), Some("z"));
}

#[test]
fn explicit_cas_is_used_for_new_item() {
    let s = new_store();
    let opts = StoreOpts { explicit_cas: Some(424242), ..StoreOpts::default() };
    assert_eq!(s.store(SetMode::Set, b"k", b"v", 0, 0, opts), StoreResult::Stored(424242));
    assert_eq!(cas_of(&s, "k"), 424242);
}

#[test]
fn invalidate_with_older_cas_stores_stale_keeping_ttl() {
    let s = new_store();
    stored_cas(set(&s, "k", "v1", 100));
    let newer = stored_cas(set(&s, "k", "v2", 100));
    let opts = StoreOpts { cas: Some(newer - 1), invalidate: true, ..StoreOpts::default() };
    stored_cas(s.store(SetMode::Set, b"k", b"v3", 0, 5000, opts));
    let (stale, won, ttl, v) = s.get(b"k", GetOpts { win_tokens: true, ..bump() }, |o| {
        let i = o.item.unwrap();
        (o.stale, o.won, i.ttl_remaining_s, i.value.to_vec())
    });
    assert!(stale);
    assert!(won, "first reader of a stale item wins");
    assert_eq!(ttl, 100, "stale store keeps the old TTL");
    assert_eq!(v, b"v3");
    // A higher CAS without match is still a mismatch.
    let c = cas_of(&s, "k");
    let opts = StoreOpts { cas: Some(c + 1), invalidate: true, ..StoreOpts::default() };
    assert_eq!(s.store(SetMode::Set, b"k", b"v4", 0, 0, opts), StoreResult::Exists);
}

#[test]
fn cas_disabled_gives_zero_everywhere() {
    let s = store_with(|c| c.cas_enabled = false);
    assert_eq!(set(&s, "k", "1", 0), StoreResult::Stored(0));
    assert_eq!(cas_of(&s, "k"), 0);
    assert!(matches!(s.arith(b"k", true, 1, ArithOpts::default()), ArithResult::Ok { cas: 0, value: 2, .. }));
    let opts = StoreOpts { explicit_cas: Some(7), ..StoreOpts::default() };
    assert_eq!(s.store(SetMode::Set, b"k", b"v", 0, 0, opts), StoreResult::Stored(0));
}

// ---- storage modes -------------------------------------------------------------------------

#[test]
fn add_only_when_missing() {
    let s = new_store();
    stored_cas(s.store(SetMode::Add, b"k", b"a", 0, 0, StoreOpts::default()));
    assert_eq!(s.store(SetMode::Add, b"k", b"b", 0, 0, StoreOpts::default()), StoreResult::NotStored);
    assert_eq!(val(&s, "k").as_deref(), Some("a"));
    // Add over an expired item succeeds.
    stored_cas(set(&s, "e", "old", 1));
    s.clock().advance(1);
    stored_cas(s.store(SetMode::Add, b"e", b"new", 0, 0, StoreOpts::default()));
    assert_eq!(val(&s, "e").as_deref(), Some("new"));
}

#[test]
fn replace_only_when_present() {
    let s = new_store();
    assert_eq!(s.store(SetMode::Replace, b"k", b"a", 0, 0, StoreOpts::default()), StoreResult::NotStored);
    stored_cas(set(&s, "k", "a", 0));
    stored_cas(s.store(SetMode::Replace, b"k", b"b", 9, 0, StoreOpts::default()));
    assert_eq!(get(&s, "k").map(|g| (g.0, g.1)), Some(("b".into(), 9)));
}

#[test]
fn append_prepend_keep_flags_and_exptime() {
    let s = new_store();
    stored_cas(s.store(SetMode::Set, b"k", b"hi", 5, 100, StoreOpts::default()));
    stored_cas(s.store(SetMode::Append, b"k", b"yo", 7, 0, StoreOpts::default()));
    stored_cas(s.store(SetMode::Prepend, b"k", b"z", 9, 0, StoreOpts::default()));
    let (v, f, ttl) = s.get(b"k", bump(), |o| {
        let i = o.item.unwrap();
        (i.value.to_vec(), i.flags, i.ttl_remaining_s)
    });
    assert_eq!(v, b"zhiyo");
    assert_eq!(f, 5);
    assert_eq!(ttl, 100);
}

#[test]
fn append_prepend_on_missing_not_stored_unless_vivify() {
    let s = new_store();
    assert_eq!(s.store(SetMode::Append, b"k", b"x", 0, 0, StoreOpts::default()), StoreResult::NotStored);
    assert_eq!(s.store(SetMode::Prepend, b"k", b"x", 0, 0, StoreOpts::default()), StoreResult::NotStored);
    let opts = StoreOpts { vivify_exptime: Some(50), ..StoreOpts::default() };
    stored_cas(s.store(SetMode::Append, b"k", b"q", 1, 0, opts));
    let (v, ttl) = s.get(b"k", bump(), |o| o.item.map(|i| (i.value.to_vec(), i.ttl_remaining_s)).unwrap());
    assert_eq!((v.as_slice(), ttl), (&b"q"[..], 50));
}

#[test]
fn append_beyond_item_size_is_not_stored() {
    let s = new_store();
    let big = vec![b'a'; 1_048_514];
    stored_cas(s.store(SetMode::Set, b"foo", &big, 0, 0, StoreOpts::default()));
    assert_eq!(s.store(SetMode::Append, b"foo", b"b", 0, 0, StoreOpts::default()), StoreResult::NotStored);
}

#[test]
fn same_size_overwrite_in_place_is_a_fresh_item() {
    let s = new_store();
    let c1 = stored_cas(s.store(SetMode::Set, b"k", b"aaaa", 1, 0, StoreOpts::default()));
    assert!(get(&s, "k").is_some());
    let c2 = stored_cas(s.store(SetMode::Set, b"k", b"bbbb", 2, 30, StoreOpts::default()));
    assert_ne!(c1, c2);
    let (fetched, ttl) = s.get(b"k", bump(), |o| o.item.map(|i| (i.fetched_before, i.ttl_remaining_s)).unwrap());
    assert!(!fetched, "a new item has not been fetched");
    assert_eq!(ttl, 30);
    assert_eq!(get(&s, "k").map(|g| (g.0, g.1)), Some(("bbbb".into(), 2)));
    assert_eq!(s.stats().curr_items, 1);
}

// ---- size and memory limits ----------------------------------------------------------------

#[test]
fn too_large_matches_memcached_boundary() {
    // Boundaries measured on memcached 1.6.18 -I 1m.
    let s = new_store();
    let v = |n| vec![b'a'; n];
    assert!(matches!(s.store(SetMode::Set, b"foo", &v(1_048_514), 0, 0, StoreOpts::default()), StoreResult::Stored(_)));
    assert_eq!(s.store(SetMode::Set, b"foo", &v(1_048_515), 0, 0, StoreOpts::default()), StoreResult::TooLarge);
    assert!(matches!(s.store(SetMode::Set, b"foo", &v(1_048_510), 1, 0, StoreOpts::default()), StoreResult::Stored(_)));
    assert_eq!(s.store(SetMode::Set, b"foo", &v(1_048_511), 1, 0, StoreOpts::default()), StoreResult::TooLarge);
    let nocas = store_with(|c| c.cas_enabled = false);
    assert!(matches!(
        nocas.store(SetMode::Set, b"foo", &v(1_048_522), 0, 0, StoreOpts::default()),
        StoreResult::Stored(_)
    ));
    assert_eq!(nocas.store(SetMode::Set, b"foo", &v(1_048_523), 0, 0, StoreOpts::default()), StoreResult::TooLarge);
    // Keys over 250 bytes are refused too.
    assert_eq!(s.store(SetMode::Set, &[b'k'; 251], b"v", 0, 0, StoreOpts::default()), StoreResult::TooLarge);
}

#[test]
fn too_large_for_memory_budget() {
    let s = store_with(|c| c.memory_bytes_max = 1000);
    assert_eq!(s.store(SetMode::Set, b"k", &[0u8; 1000], 0, 0, StoreOpts::default()), StoreResult::TooLarge);
    assert!(matches!(s.store(SetMode::Set, b"k", &[0u8; 900], 0, 0, StoreOpts::default()), StoreResult::Stored(_)));
}

#[test]
fn big_item_fits_even_when_larger_than_one_shard_share() {
    // 64 shards x 64 MB: a shard's fair share is 1 MB, smaller than a 1 MB item.
    let s = new_store();
    let big = vec![b'x'; 1_048_000];
    for i in 0..200 {
        let r = s.store(SetMode::Set, format!("big{i}").as_bytes(), &big, 0, 0, StoreOpts::default());
        assert!(matches!(r, StoreResult::Stored(_)), "{i}: {r:?}");
        assert!(s.stats().bytes <= 64 * 1024 * 1024);
    }
    assert!(s.stats().evictions > 100);
}

/// The project's one RNG (fastrand), seeded so a printed seed replays.
struct Rng(fastrand::Rng);
impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(fastrand::Rng::with_seed(seed))
    }
    fn next(&mut self) -> u64 {
        self.0.u64(..)
    }
}

#[test]
fn memory_limit_never_exceeded_under_random_stores() {
    // STORE_TEST_SEED=<n> replays a printed seed.
    let seed = std::env::var("STORE_TEST_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1)
    }) | 1;
    println!("memory_limit_never_exceeded_under_random_stores seed={seed}");
    let max = 2 * 1024 * 1024;
    let s = store_with(|c| {
        c.memory_bytes_max = max;
        c.shards = 8;
    });
    let mut rng = Rng::new(seed);
    let buf = vec![b'v'; 300_000];
    for i in 0..100_000u32 {
        let r = rng.next();
        let key = format!("key{}", r % 5000);
        // Mostly small values, sometimes big ones.
        let len = if r >> 60 == 0 { ((r >> 20) % 300_000) as usize } else { ((r >> 20) % 2000) as usize };
        let mode = match (r >> 40) % 8 {
            0 => SetMode::Append,
            1 => SetMode::Add,
            2 => SetMode::Replace,
            _ => SetMode::Set,
        };
        let exp = ((r >> 44) % 4) as i64 * 3;
        let res = s.store(mode, key.as_bytes(), &buf[..len], 0, exp, StoreOpts::default());
        assert!(!matches!(res, StoreResult::NoMemory | StoreResult::TooLarge), "seed={seed} step {i}: {res:?}");
        if (r >> 50) & 15 == 0 {
            s.arith(key.as_bytes(), true, 1, ArithOpts::default());
        }
        if i % 1000 == 0 {
            s.clock().advance(1);
        }
        let used = s.used_bytes.0.load(Ordering::Relaxed);
        assert!(used <= max, "seed={seed} step {i}: used {used} > {max}");
        if i % 997 == 0 {
            let st = s.stats();
            assert!(st.bytes as usize <= max, "seed={seed}");
            assert_eq!(st.bytes as usize, used, "seed={seed}: shard sums match the global count");
        }
    }
    let st = s.stats();
    assert!(st.evictions + st.reclaimed > 0, "seed={seed}");
}

/// Whether `k` is visible, without bumping it.
fn present(s: &Store, k: &str) -> bool {
    s.get(k.as_bytes(), GetOpts::default(), |o| o.item.is_some())
}

#[test]
fn lru_evicts_the_least_recently_used() {
    // One shard, room for exactly three 100-byte charged items.
    let s = store_with(|c| {
        c.shards = 1;
        c.memory_bytes_max = 3 * 100;
    });
    let v = vec![b'x'; 100 - ITEM_OVERHEAD_BYTES - 1];
    let put = |k: &str| stored_cas(s.store(SetMode::Set, k.as_bytes(), &v, 0, 0, StoreOpts::default()));
    put("a");
    put("b");
    put("c");
    assert!(get(&s, "a").is_some()); // a is now more recent than b and c
    put("d");
    assert!(!present(&s, "b"), "b was least recently used");
    assert!(present(&s, "a") && present(&s, "c") && present(&s, "d"));
    assert_eq!(s.stats().bytes, 300);
    // Recency order now: c (oldest), a, d. A non-bumping read does not refresh c.
    put("e");
    assert!(!present(&s, "c"), "c was least recently used; a non-bumping read does not protect it");
    // a, d, e: bump a, so d is the least recently used.
    assert!(get(&s, "a").is_some());
    put("f");
    assert!(!present(&s, "d"));
    assert!(present(&s, "a") && present(&s, "e") && present(&s, "f"));
    assert_eq!(s.lock(0).lru_keys().len(), 3);
}

#[test]
fn lru_touch_and_failed_add_count_as_use() {
    let s = store_with(|c| {
        c.shards = 1;
        c.memory_bytes_max = 2 * 100;
    });
    let v = vec![b'x'; 100 - ITEM_OVERHEAD_BYTES - 1];
    let put = |k: &str| stored_cas(s.store(SetMode::Set, k.as_bytes(), &v, 0, 0, StoreOpts::default()));
    put("a");
    put("b");
    assert!(s.touch(b"a", 0));
    put("c");
    assert!(present(&s, "a") && !present(&s, "b"));
    assert_eq!(s.store(SetMode::Add, b"a", &v, 0, 0, StoreOpts::default()), StoreResult::NotStored);
    put("d");
    assert!(present(&s, "a") && !present(&s, "c"));
}

#[test]
fn stores_reclaim_expired_items_at_the_tail() {
    // memcached's lru_pull_tail before an allocation: the expired items at the very tail are
    // freed (reclaimed) even with memory to spare; a live item at the tail stops the search.
    let s = store_with(|c| c.shards = 1);
    stored_cas(set(&s, "a", "x", 5));
    stored_cas(set(&s, "b", "x", 5));
    stored_cas(set(&s, "live", "x", 0));
    stored_cas(set(&s, "c", "x", 5));
    assert!(get(&s, "b").is_some()); // fetched: not expired_unfetched; now the newest
    s.clock().advance(5);
    stored_cas(set(&s, "n", "x", 0)); // tail: a (expired), live (stops) — c and b stay
    let st = s.stats();
    assert_eq!((st.reclaimed, st.expired_unfetched, st.curr_items), (1, 1, 4));
    assert!(s.delete(b"live", DeleteOpts::default()) == DeleteResult::Deleted);
    stored_cas(set(&s, "m", "x", 0)); // tail: c, b (expired), n (stops)
    let st = s.stats();
    assert_eq!((st.reclaimed, st.expired_unfetched, st.curr_items, st.get_expired), (3, 2, 2, 0));
}

#[test]
fn eviction_counters() {
    let s = store_with(|c| {
        c.shards = 1;
        c.memory_bytes_max = 4 * 100;
    });
    let v = vec![b'x'; 100 - ITEM_OVERHEAD_BYTES - 1];
    let put = |k: &str, exp: i64| stored_cas(s.store(SetMode::Set, k.as_bytes(), &v, 0, exp, StoreOpts::default()));
    put("a", 0); // will be evicted unfetched
    put("b", 0); // fetched, then evicted
    put("c", 5); // expires unfetched
    put("d", 0);
    assert!(get(&s, "b").is_some());
    // LRU order (least recent first): a, c, d, b.
    s.clock().advance(5);
    put("e", 0); // tail search finds expired c: reclaimed
    let st = s.stats();
    assert_eq!((st.reclaimed, st.expired_unfetched, st.evictions), (1, 1, 0));
    put("f", 0); // evicts a (live, never fetched)
    put("g", 0); // evicts d (live, never fetched)
    let st = s.stats();
    assert_eq!((st.evictions, st.evicted_unfetched), (2, 2));
    assert!(get(&s, "a").is_none());
    // b was read before e, f and g were stored: it is the least recently used now.
    put("h", 0); // evicts b (fetched)
    let st = s.stats();
    assert_eq!((st.evictions, st.evicted_unfetched), (3, 2));
    assert!(!present(&s, "b"));
    put("i", 0); // evicts e (never fetched)
    put("j", 0); // evicts f (never fetched)
    let st = s.stats();
    assert_eq!((st.evictions, st.evicted_unfetched), (5, 4));
    assert!(!present(&s, "e") && !present(&s, "f"));
    assert_eq!(st.curr_items, 4);
    assert_eq!(st.total_items, 10);
    s.reset_stats();
    let st = s.stats();
    assert_eq!((st.evictions, st.total_items, st.curr_items, st.bytes), (0, 0, 4, 400));
}

#[test]
fn no_memory_when_nothing_can_be_evicted() {
    // One shard, 300 bytes: a 250-byte item plus a 200-byte one can never coexist, but the
    // store frees the old version of the same key first, so replacing works.
    let s = store_with(|c| {
        c.shards = 1;
        c.memory_bytes_max = 300;
    });
    stored_cas(s.store(SetMode::Set, b"k", &[0u8; 150], 0, 0, StoreOpts::default()));
    stored_cas(s.store(SetMode::Set, b"k", &[1u8; 200], 0, 0, StoreOpts::default()));
    stored_cas(s.store(SetMode::Set, b"j", &[1u8; 200], 0, 0, StoreOpts::default()));
    assert!(get(&s, "k").is_none());
    assert!(s.stats().bytes <= 300);
}

// ---- incr / decr ---------------------------------------------------------------------------

fn arith_val(s: &Store, k: &str, incr: bool, d: u64) -> ArithResult {
    s.arith(k.as_bytes(), incr, d, ArithOpts::default())
}

fn arith_value(r: ArithResult) -> u64 {
    match r {
        ArithResult::Ok { value, .. } => value,
        other => panic!("expected Ok, got {other:?}"),
    }
}

#[test]
fn incr_wraps_at_2_pow_64() {
    let s = new_store();
    stored_cas(set(&s, "w", "18446744073709551615", 0));
    assert_eq!(arith_value(arith_val(&s, "w", true, 2)), 1);
    assert_eq!(val(&s, "w").as_deref(), Some("1                   "), "memcached pads in place");
}

/// Replication snapshot: export from one store, clear and import into another started at a
/// different Unix time; items, CAS, flags, absolute expiry and marks come back exactly.
#[test]
fn export_import_round_trip_keeps_cas_and_absolute_expiry() {
    let a = new_store();
    a.set_cas_last(99);
    assert_eq!(set(&a, "k1", "v1", 0), StoreResult::Stored(100));
    assert_eq!(a.store(SetMode::Set, b"k2", b"v2", 7, 100, StoreOpts::default()), StoreResult::Stored(101));
    assert_eq!(set(&a, "gone", "x", 5), StoreResult::Stored(102));
    assert_eq!(a.delete(b"k1", DeleteOpts { invalidate: true, ..DeleteOpts::default() }), DeleteResult::Deleted);
    a.clock().advance(10);
    type Row = (Vec<u8>, Vec<u8>, u32, u64, i64, bool);
    let mut items: Vec<Row> = Vec::new();
    a.export(|i| items.push((i.key.to_vec(), i.value.to_vec(), i.flags, i.cas, i.exptime_unix_s, i.stale)));
    items.sort();
    assert_eq!(items.len(), 2, "expired item skipped: {items:?}");
    assert_eq!(items[1], (b"k2".to_vec(), b"v2".to_vec(), 7, 101, START_UNIX_S + 2 + 100, false));
    assert!(items[0].5, "stale mark exported");
    let b = Store::with_clock(StoreConfig::default(), Clock::manual(START_UNIX_S + 50));
    set(&b, "other", "o", 0);
    b.clear();
    assert_eq!(val(&b, "other"), None);
    assert_eq!(b.stats().bytes, 0);
    for (k, v, f, c, e, st) in &items {
        let it = ItemExport { key: k, value: v, flags: *f, cas: *c, exptime_unix_s: *e, stale: *st, key_binary: false };
        assert!(matches!(b.import(&it), StoreResult::Stored(_)));
    }
    assert_eq!(get(&b, "k2"), Some(("v2".into(), 7, 101)));
    b.get(b"k2", GetOpts::default(), |o| assert_eq!(o.item.map(|i| i.ttl_remaining_s), Some(50)));
    b.get(b"k1", GetOpts::default(), |o| assert!(o.stale));
}

#[test]
fn decr_floors_at_zero() {
    let s = new_store();
    stored_cas(set(&s, "d", "5", 0));
    assert_eq!(arith_value(arith_val(&s, "d", false, 10)), 0);
    assert_eq!(val(&s, "d").as_deref(), Some("0"));
}

#[test]
fn decr_shorter_pads_with_spaces_and_incr_longer_reallocates() {
    // memcached 1.6.18: set n "100"; decr n 1 -> get "99 "; incr n 1 -> "100".
    let s = new_store();
    stored_cas(s.store(SetMode::Set, b"n", b"100", 7, 60, StoreOpts::default()));
    assert_eq!(arith_value(arith_val(&s, "n", false, 1)), 99);
    assert_eq!(val(&s, "n").as_deref(), Some("99 "));
    assert_eq!(arith_value(arith_val(&s, "n", true, 1)), 100);
    assert_eq!(val(&s, "n").as_deref(), Some("100"));
    // "99" -> 100 grows: a new 3-byte item with the same flags and exptime.
    stored_cas(s.store(SetMode::Set, b"m", b"99", 7, 60, StoreOpts::default()));
    assert_eq!(arith_value(arith_val(&s, "m", true, 1)), 100);
    let (v, f, ttl) = s.get(b"m", bump(), |o| o.item.map(|i| (i.value.to_vec(), i.flags, i.ttl_remaining_s)).unwrap());
    assert_eq!((v.as_slice(), f, ttl), (&b"100"[..], 7, 60));
    // Leading zeros: "0000000000000000000000001" incr 1 -> "2" plus 24 spaces.
    stored_cas(set(&s, "z", "0000000000000000000000001", 0));
    assert_eq!(arith_value(arith_val(&s, "z", true, 1)), 2);
    assert_eq!(val(&s, "z").unwrap(), format!("2{}", " ".repeat(24)));
}

#[test]
fn arith_non_numeric() {
    let s = new_store();
    for v in ["abc", "12abc", "-5", "18446744073709551616", "", "0x10"] {
        stored_cas(set(&s, "v", v, 0));
        assert_eq!(arith_val(&s, "v", true, 1), ArithResult::NonNumeric, "value {v:?}");
        assert_eq!(val(&s, "v").as_deref(), Some(v), "value untouched");
    }
    stored_cas(set(&s, "v", "12 abc", 0));
    assert_eq!(arith_value(arith_val(&s, "v", true, 1)), 13);
    assert_eq!(val(&s, "v").as_deref(), Some("13    "));
}

#[test]
fn arith_missing_cas_vivify_touch() {
    let s = new_store();
    assert_eq!(arith_val(&s, "m", true, 1), ArithResult::NotFound);
    let viv = ArithOpts { vivify: Some((42, 30)), ..ArithOpts::default() };
    let r = s.arith(b"m", true, 5, viv);
    assert!(matches!(r, ArithResult::Ok { value: 42, ttl_remaining_s: 30, .. }), "{r:?}");
    assert_eq!(val(&s, "m").as_deref(), Some("42"));
    let c = cas_of(&s, "m");
    let bad = ArithOpts { cas: Some(c + 1), ..ArithOpts::default() };
    assert_eq!(s.arith(b"m", true, 1, bad), ArithResult::Exists);
    let good = ArithOpts { cas: Some(c), touch_exptime: Some(0), ..ArithOpts::default() };
    assert!(matches!(s.arith(b"m", true, 1, good), ArithResult::Ok { value: 43, ttl_remaining_s: -1, .. }));
    s.clock().advance(31);
    assert_eq!(val(&s, "m").as_deref(), Some("43"), "T0 removed the expiry");
    // Expired items are missing for arith.
    stored_cas(set(&s, "e", "1", 1));
    s.clock().advance(1);
    assert_eq!(arith_val(&s, "e", true, 1), ArithResult::NotFound);
}

// ---- touch / gat ---------------------------------------------------------------------------

#[test]
fn touch_updates_exptime_and_reports_missing() {
    let s = new_store();
    assert!(!s.touch(b"k", 10));
    stored_cas(set(&s, "k", "v", 5));
    assert!(s.touch(b"k", 100));
    s.clock().advance(50);
    assert_eq!(val(&s, "k").as_deref(), Some("v"));
    s.clock().advance(50);
    assert!(!s.touch(b"k", 100), "expired item cannot be touched");
}

#[test]
fn gat_touches_on_hit() {
    let s = new_store();
    stored_cas(set(&s, "k", "v", 5));
    let opts = GetOpts { touch_exptime: Some(60), bump: true, ..GetOpts::default() };
    let ttl = s.get(b"k", opts, |o| o.item.map(|i| i.ttl_remaining_s));
    assert_eq!(ttl, Some(60));
    s.clock().advance(30);
    assert!(get(&s, "k").is_some());
}

// ---- meta tokens ---------------------------------------------------------------------------

/// (value, won, stale, win_token_sent) of a meta get.
fn mg(s: &Store, k: &str, opts: GetOpts) -> Option<(Vec<u8>, bool, bool, bool)> {
    s.get(k.as_bytes(), opts, |o| o.item.as_ref().map(|i| (i.value.to_vec(), o.won, o.stale, o.win_token_sent)))
}

#[test]
fn meta_vivify_gives_win_once_then_z_until_replaced() {
    let s = new_store();
    let viv = GetOpts { win_tokens: true, vivify_exptime: Some(30), bump: true, ..GetOpts::default() };
    assert_eq!(mg(&s, "k", viv), Some((vec![], true, false, false)), "first: W");
    assert_eq!(mg(&s, "k", viv), Some((vec![], false, false, true)), "second: Z");
    assert_eq!(mg(&s, "k", bump()), Some((vec![], false, false, true)), "plain get: Z");
    let ttl = s.get(b"k", bump(), |o| o.item.map(|i| i.ttl_remaining_s));
    assert_eq!(ttl, Some(30));
    stored_cas(set(&s, "k", "real", 0));
    assert_eq!(mg(&s, "k", viv), Some((b"real".to_vec(), false, false, false)), "set clears tokens");
    // T applies to a just-vivified item as well.
    let viv_t = GetOpts {
        win_tokens: true,
        vivify_exptime: Some(30),
        touch_exptime: Some(60),
        bump: true,
        ..GetOpts::default()
    };
    let ttl = s.get(b"k2", viv_t, |o| (o.won, o.item.map(|i| i.ttl_remaining_s)));
    assert_eq!(ttl, (true, Some(60)));
    assert!(s.get(b"miss", bump(), |o| o.item.is_none() && !o.won));
}

#[test]
fn meta_recache_hands_out_win_once_below_threshold() {
    let s = new_store();
    stored_cas(set(&s, "r", "x", 100));
    let r = |t| GetOpts { win_tokens: true, recache_below_s: Some(t), bump: true, ..GetOpts::default() };
    assert_eq!(mg(&s, "r", r(30)), Some((b"x".to_vec(), false, false, false)), "TTL 100 >= 30");
    assert_eq!(mg(&s, "r", r(200)), Some((b"x".to_vec(), true, false, false)), "TTL 100 < 200: W");
    assert_eq!(mg(&s, "r", r(200)), Some((b"x".to_vec(), false, false, true)), "then Z");
    // No expiry: never recache.
    stored_cas(set(&s, "n", "x", 0));
    assert_eq!(mg(&s, "n", r(200)).map(|m| m.1), Some(false));
}

#[test]
fn meta_delete_invalidate_marks_stale_and_resets_token() {
    let s = new_store();
    let c0 = stored_cas(set(&s, "s", "x", 0));
    let viv = GetOpts { win_tokens: true, vivify_exptime: Some(30), bump: true, ..GetOpts::default() };
    // Hand out a token first (recache with no TTL does not; use stale path below).
    let del = DeleteOpts { invalidate: true, invalidate_exptime: Some(30), ..DeleteOpts::default() };
    assert_eq!(s.delete(b"s", del), DeleteResult::Deleted);
    let (c1, won) = s.get(b"s", viv, |o| (o.item.map(|i| i.cas).unwrap_or(0), o.won));
    assert_ne!(c0, c1, "invalidation bumps CAS");
    assert!(won, "X W");
    assert_eq!(mg(&s, "s", viv), Some((b"x".to_vec(), false, true, true)), "X Z");
    // Invalidating again lets the next reader win again.
    assert_eq!(s.delete(b"s", del), DeleteResult::Deleted);
    assert_eq!(mg(&s, "s", viv), Some((b"x".to_vec(), true, true, false)));
    let ttl = s.get(b"s", bump(), |o| o.item.map(|i| i.ttl_remaining_s));
    assert_eq!(ttl, Some(30));
    // A normal set replaces the stale item.
    stored_cas(set(&s, "s", "y", 0));
    assert_eq!(mg(&s, "s", viv), Some((b"y".to_vec(), false, false, false)));
}

#[test]
fn meta_hit_before_and_last_access() {
    let s = new_store();
    stored_cas(set(&s, "h", "x", 0));
    let hl = |o: GetOpts| s.get(b"h", o, |o| o.item.map(|i| (i.fetched_before, i.last_access_ago_s)).unwrap());
    s.clock().advance(3);
    assert_eq!(hl(GetOpts::default()), (false, 3), "non-bumping read changes nothing");
    // The first fetch only marks the item fetched; a later one moves the time (memcached's
    // do_item_bump).
    assert_eq!(hl(bump()), (false, 3));
    assert_eq!(hl(bump()), (true, 3));
    assert_eq!(hl(bump()), (true, 0));
    s.clock().advance(7);
    assert_eq!(hl(bump()), (true, 7));
}

// ---- delete / unlink -----------------------------------------------------------------------

#[test]
fn delete_with_and_without_cas() {
    let s = new_store();
    assert_eq!(s.delete(b"k", DeleteOpts::default()), DeleteResult::NotFound);
    let c = stored_cas(set(&s, "k", "v", 0));
    let bad = DeleteOpts { cas: Some(c + 1), ..DeleteOpts::default() };
    assert_eq!(s.delete(b"k", bad), DeleteResult::Exists);
    let good = DeleteOpts { cas: Some(c), ..DeleteOpts::default() };
    assert_eq!(s.delete(b"k", good), DeleteResult::Deleted);
    assert_eq!(val(&s, "k"), None);
    assert_eq!(s.stats().curr_items, 0);
    assert_eq!(s.stats().bytes, 0);
}

#[test]
fn unlink_removes_without_counting() {
    let s = new_store();
    stored_cas(set(&s, "k", "v", 0));
    assert!(s.unlink(b"k"));
    assert!(!s.unlink(b"k"));
    let st = s.stats();
    assert_eq!((st.curr_items, st.bytes, st.get_expired, st.get_flushed), (0, 0, 0, 0));
}

// ---- stats and config ----------------------------------------------------------------------

#[test]
fn stats_track_items_bytes_and_age() {
    let s = new_store();
    stored_cas(set(&s, "a", "12345", 0));
    stored_cas(set(&s, "bb", "1", 0));
    s.clock().advance(4);
    let st = s.stats();
    assert_eq!(st.curr_items, 2);
    assert_eq!(st.total_items, 2);
    assert_eq!(st.bytes as usize, 6 + 3 + 2 * ITEM_OVERHEAD_BYTES);
    assert_eq!(st.limit_maxbytes, 64 * 1024 * 1024);
    assert_eq!(st.oldest_item_age_s, 4);
}

#[test]
fn shard_count_rounds_up_to_power_of_two() {
    assert_eq!(store_with(|c| c.shards = 5).config().shards, 8);
    assert_eq!(store_with(|c| c.shards = 0).config().shards, 1);
    assert_eq!(store_with(|c| c.shards = 64).config().shards, 64);
}

#[test]
fn many_keys_round_trip_across_shards() {
    let s = new_store();
    for i in 0..20_000 {
        stored_cas(set(&s, &format!("key:{i}"), &i.to_string(), 0));
    }
    for i in (0..20_000).step_by(7) {
        assert_eq!(val(&s, &format!("key:{i}")), Some(i.to_string()));
    }
    for i in (0..20_000).step_by(2) {
        assert_eq!(s.delete(format!("key:{i}").as_bytes(), DeleteOpts::default()), DeleteResult::Deleted);
    }
    for i in 0..20_000 {
        assert_eq!(val(&s, &format!("key:{i}")).is_some(), i % 2 == 1, "key:{i}");
    }
    assert_eq!(s.stats().curr_items, 10_000);
}

#[test]
fn concurrent_stores_under_memory_pressure_stay_within_budget() {
    let max = 512 * 1024;
    let s = std::sync::Arc::new(store_with(|c| {
        c.memory_bytes_max = max;
        c.shards = 4;
    }));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let s = s.clone();
            std::thread::spawn(move || {
                let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15 ^ (t + 1));
                let v = vec![b'q'; 20_000];
                for _ in 0..20_000 {
                    let r = rng.next();
                    let k = format!("k{}", r % 3000);
                    let len = (r >> 32) as usize % v.len();
                    let res = s.store(SetMode::Set, k.as_bytes(), &v[..len], 0, 0, StoreOpts::default());
                    assert!(!matches!(res, StoreResult::TooLarge));
                    s.get(k.as_bytes(), GetOpts { bump: true, ..GetOpts::default() }, |o| {
                        o.item.map(|i| i.value.len())
                    });
                    assert!(s.used_bytes.0.load(Ordering::Relaxed) <= max);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let st = s.stats();
    assert!(st.bytes as usize <= max);
    assert_eq!(st.bytes as usize, s.used_bytes.0.load(Ordering::Relaxed));
}

#[test]
fn plain_reads_of_stale_items_leave_the_win_token_for_mg() {
    let s = new_store();
    stored_cas(set(&s, "p", "x", 0));
    let del = DeleteOpts { invalidate: true, ..DeleteOpts::default() };
    assert_eq!(s.delete(b"p", del), DeleteResult::Deleted);
    // A text `get` (no win tokens) sees the stale item but takes no token...
    let (stale, won) = s.get(b"p", bump(), |o| (o.stale, o.won));
    assert!(stale && !won);
    // ...so the next mg still wins (memcached: X W, not Z X).
    let mgo = GetOpts { win_tokens: true, ..bump() };
    assert_eq!(s.get(b"p", mgo, |o| (o.stale, o.won, o.win_token_sent)), (true, true, false));
}

// ---- run-time memory limit -----------------------------------------------------------------

fn used_now(s: &Store) -> usize {
    s.used_bytes.0.load(Ordering::Relaxed)
}

#[test]
fn lowering_the_memory_limit_evicts_lru_and_raising_it_admits_again() {
    let s = store_with(|c| {
        c.memory_bytes_max = 8 << 20;
        c.shards = 4;
    });
    let v = vec![b'm'; 1000];
    let put = |i: usize| s.store(SetMode::Set, format!("key{i:05}").as_bytes(), &v, 0, 0, StoreOpts::default());
    // About 4 MB of 1 KB items.
    let n = 4 * 1024 * 1024 / (1000 + 8 + ITEM_OVERHEAD_BYTES);
    for i in 0..n {
        stored_cas(put(i));
    }
    assert!(used_now(&s) >= 4_000_000, "filled {}", used_now(&s));
    // Read the ten oldest keys: a read makes an item recently used too.
    for i in 0..10 {
        assert!(get(&s, &format!("key{i:05}")).is_some());
    }
    s.set_memory_limit(1 << 20);
    assert!(used_now(&s) <= 1 << 20, "used {} after lowering", used_now(&s));
    assert_eq!(s.memory_bytes_max(), 1 << 20);
    let st = s.stats();
    assert_eq!(st.limit_maxbytes, 1 << 20);
    assert_eq!(st.bytes as usize, used_now(&s));
    assert!(st.evictions as usize >= n - (1 << 20) / 1000, "evictions {}", st.evictions);
    // The most recently stored keys survive, and so do the recently read old ones.
    for i in n - 200..n {
        assert!(present(&s, &format!("key{i:05}")), "recent key{i:05} evicted");
    }
    for i in 0..10 {
        assert!(present(&s, &format!("key{i:05}")), "recently read key{i:05} evicted");
    }
    // The least recently used ones are gone.
    let old_left = (10..1000).filter(|i| present(&s, &format!("key{i:05}"))).count();
    assert_eq!(old_left, 0);
    // Under the lowered limit stores still work (evicting), never exceeding it.
    for i in n..n + 500 {
        stored_cas(put(i));
        assert!(used_now(&s) <= 1 << 20);
    }
    // Raised again: stores succeed and fill past the old, lower limit without evicting.
    s.set_memory_limit(4 << 20);
    let ev = s.stats().evictions;
    for i in n + 500..n + 2500 {
        stored_cas(put(i));
    }
    assert!(used_now(&s) > 2 << 20, "used {} after raising", used_now(&s));
    assert!(used_now(&s) <= 4 << 20);
    assert_eq!(s.stats().evictions, ev, "nothing evicted below the raised limit");
    assert_eq!(s.stats().limit_maxbytes, 4 << 20);
    // The creation-time config is unchanged.
    assert_eq!(s.config().memory_bytes_max, 8 << 20);
}

#[test]
fn memory_limit_lowered_below_an_item_refuses_it() {
    let s = store_with(|c| c.shards = 1);
    s.set_memory_limit(500);
    assert_eq!(s.store(SetMode::Set, b"big", &[0u8; 600], 0, 0, StoreOpts::default()), StoreResult::TooLarge);
    stored_cas(s.store(SetMode::Set, b"small", &[0u8; 100], 0, 0, StoreOpts::default()));
    s.set_memory_limit(0);
    assert_eq!(used_now(&s), 0);
    assert!(!present(&s, "small"));
}

#[test]
fn lowering_the_memory_limit_under_concurrent_stores() {
    let s = std::sync::Arc::new(store_with(|c| {
        c.memory_bytes_max = 4 << 20;
        c.shards = 8;
    }));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let threads: Vec<_> = (0..2u64)
        .map(|t| {
            let (s, stop) = (s.clone(), stop.clone());
            std::thread::spawn(move || {
                let v = vec![b'c'; 700];
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) && i < 200_000 {
                    let k = format!("t{t}k{}", i % 20_000);
                    let r = s.store(SetMode::Set, k.as_bytes(), &v, 0, 0, StoreOpts::default());
                    assert!(matches!(r, StoreResult::Stored(_)), "{r:?}");
                    i += 1;
                }
            })
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(50));
    s.set_memory_limit(256 << 10);
    std::thread::sleep(std::time::Duration::from_millis(50));
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    // A store that reserved against the old limit just before the change may have landed
    // after it; the next store evicts for itself down to the limit.
    stored_cas(s.store(SetMode::Set, b"last", &[0u8; 700], 0, 0, StoreOpts::default()));
    assert!(used_now(&s) <= 256 << 10, "used {}", used_now(&s));
    assert_eq!(s.stats().bytes as usize, used_now(&s));
}

// ---- global LRU order ----------------------------------------------------------------------

/// The randomized tests' seed: STORE_TEST_SEED=<n> replays a printed one.
fn test_seed(name: &str) -> u64 {
    let seed = std::env::var("STORE_TEST_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1)
    }) | 1;
    println!("{name} seed={seed}");
    seed
}

#[test]
fn stores_evict_the_globally_oldest_items_across_shards() {
    // The daemon's shape for -m 64: 64 shards; 101 items of ~1 MB, so a shard's share of
    // memory (1 MB) is smaller than one item. Exactly the oldest ones must go, whatever shard
    // holds them.
    let s = new_store();
    assert_eq!(s.config().shards, 64);
    let v = vec![b'x'; 1_040_000];
    for i in 0..101 {
        stored_cas(s.store(SetMode::Set, format!("item_{i}").as_bytes(), &v, 0, 0, StoreOpts::default()));
    }
    let kept: Vec<usize> = (0..101).filter(|i| present(&s, &format!("item_{i}"))).collect();
    let fit = 64 * 1024 * 1024 / (1_040_000 + 8 + ITEM_OVERHEAD_BYTES);
    assert!(kept.len() >= fit - 1 && kept.len() <= fit, "kept {}", kept.len());
    assert_eq!(kept, (101 - kept.len()..101).collect::<Vec<_>>(), "survivors are the newest items");
    // A read makes an old item recent; the next evictions take the oldest unread ones.
    let oldest = kept[0];
    assert!(get(&s, &format!("item_{oldest}")).is_some());
    for i in 101..104 {
        stored_cas(s.store(SetMode::Set, format!("item_{i}").as_bytes(), &v, 0, 0, StoreOpts::default()));
    }
    assert!(present(&s, &format!("item_{oldest}")), "read item survives");
    for i in oldest + 1..oldest + 4 {
        assert!(!present(&s, &format!("item_{i}")), "item_{i} (oldest unread) evicted");
    }
    assert!(present(&s, &format!("item_{}", oldest + 4)));
}

/// Reference model for `global_lru_within_one_tick`: per key, the LRU tick of its last use
/// (the store's clock: +1 per item written, reads see the current value) and a global
/// sequence number (the exact order of uses).
#[derive(Default)]
struct LruModel {
    tick: u64,
    seq: u64,
    keys: std::collections::HashMap<String, (u64, u64)>,
}

impl LruModel {
    fn write(&mut self, k: &str) {
        self.tick += 1;
        self.seq += 1;
        self.keys.insert(k.to_string(), (self.tick, self.seq));
    }
    fn read(&mut self, k: &str) {
        self.seq += 1;
        if let Some(e) = self.keys.get_mut(k) {
            *e = (self.tick, self.seq);
        }
    }
}

#[test]
fn global_lru_within_one_tick() {
    // Random sets, bumping and non-bumping reads, touches, failed adds, incr and deletes on
    // equal-size items in a store with room for CAP of them. After every step, every item the
    // store evicted must have been last used no later (in LRU ticks) than every item it kept:
    // the documented bound (a victim ties with the true least recently used item). The share
    // of victims that differ from an exact LRU's is printed.
    let seed = test_seed("global_lru_within_one_tick");
    const CAP: usize = 120;
    const KEYS: u64 = 400;
    let value = b"0000000000000000000000000000000000000000000000000000000000000000";
    let charge = 8 + value.len() + ITEM_OVERHEAD_BYTES; // keys are 8 bytes: "k0000123"
    for shards in [1, 8, 64] {
        let s = store_with(|c| {
            c.shards = shards;
            c.memory_bytes_max = CAP * charge;
        });
        let mut rng = Rng::new(seed ^ shards as u64);
        let mut m = LruModel::default();
        let (mut victims, mut inexact) = (0u64, 0u64);
        for step in 0..6000u32 {
            let r = rng.next();
            let k = format!("k{:07}", r % KEYS);
            let kb = k.as_bytes();
            match (r >> 32) % 16 {
                0..=5 => {
                    stored_cas(s.store(SetMode::Set, kb, value, 0, 0, StoreOpts::default()));
                    m.write(&k);
                }
                6..=10 => {
                    if get(&s, &k).is_some() {
                        m.read(&k);
                    }
                }
                11 => {
                    present(&s, &k);
                }
                12 => {
                    if s.touch(kb, 0) {
                        m.read(&k);
                    }
                }
                13 => {
                    if s.store(SetMode::Add, kb, value, 0, 0, StoreOpts::default()) == StoreResult::NotStored {
                        m.read(&k);
                    } else {
                        m.write(&k);
                    }
                }
                14 => {
                    // The value is all digits and stays 64 bytes long: written in place.
                    if matches!(s.arith(kb, true, 1, ArithOpts::default()), ArithResult::Ok { .. }) {
                        m.write(&k);
                    }
                }
                _ => {
                    if s.delete(kb, DeleteOpts::default()) == DeleteResult::Deleted {
                        m.keys.remove(&k);
                    }
                }
            }
            let gone: Vec<String> = m.keys.keys().filter(|k| !present(&s, k)).cloned().collect();
            if gone.is_empty() {
                continue;
            }
            let removed: Vec<(u64, u64)> = gone.iter().filter_map(|k| m.keys.remove(k)).collect();
            let kept_min_tick = m.keys.values().map(|e| e.0).min().unwrap_or(u64::MAX);
            let kept_min_seq = m.keys.values().map(|e| e.1).min().unwrap_or(u64::MAX);
            for (tick, seq) in removed {
                victims += 1;
                assert!(
                    tick <= kept_min_tick,
                    "seed={seed} shards={shards} step {step}: evicted an item used at tick {tick}, kept one used at {kept_min_tick}"
                );
                if seq > kept_min_seq {
                    inexact += 1;
                }
            }
            assert_eq!(m.keys.len(), CAP, "seed={seed} shards={shards} step {step}: evicted only when full");
        }
        assert!(victims > 1000, "seed={seed}: only {victims} evictions");
        println!("shards={shards}: {victims} evictions, {inexact} differ from an exact LRU's (same tick)");
    }
}

#[test]
fn concurrent_stores_and_reads_keep_every_lru_sorted_and_published() {
    let seed = test_seed("concurrent_stores_and_reads_keep_every_lru_sorted_and_published");
    let s = std::sync::Arc::new(store_with(|c| {
        c.memory_bytes_max = 1 << 20;
        c.shards = 8;
    }));
    let threads: Vec<_> = (0..3u64)
        .map(|t| {
            let s = s.clone();
            std::thread::spawn(move || {
                let mut rng = Rng::new(seed ^ (t + 1));
                let v = vec![b'c'; 900];
                for _ in 0..60_000 {
                    let r = rng.next();
                    let k = format!("k{}", r % 3000);
                    if r >> 62 == 0 {
                        let r = s.store(
                            SetMode::Set,
                            k.as_bytes(),
                            &v[..(r >> 40) as usize % 900],
                            0,
                            0,
                            StoreOpts::default(),
                        );
                        assert!(matches!(r, StoreResult::Stored(_)), "seed={seed}: {r:?}");
                    } else {
                        s.get(k.as_bytes(), bump(), |o| o.item.is_some());
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    for i in 0..s.shards.len() {
        s.lock(i).check_lru();
    }
    assert!(s.stats().evictions > 0 && used_now(&s) <= 1 << 20, "seed={seed}");
}

/// memcached `-M`: a full store refuses new items instead of evicting live ones, but still
/// frees expired ones at the LRU tail.
#[test]
fn no_evict_refuses_when_full_and_reclaims_expired() {
    let s = store_with(|c| {
        c.memory_bytes_max = 64 * 1024;
        c.item_bytes_max = 8 * 1024;
        c.shards = 1;
    });
    s.set_evict_to_free(false);
    assert!(!s.evict_to_free());
    let v = "x".repeat(4000);
    // The oldest item expires soon: it sits at the LRU tail.
    assert!(matches!(set(&s, "e", &v, 2), StoreResult::Stored { .. }));
    let mut stored = 0;
    let mut refused = false;
    for i in 0..100 {
        match set(&s, &format!("k{i}"), &v, 0) {
            StoreResult::Stored { .. } => stored += 1,
            StoreResult::NoMemory => {
                refused = true;
                break;
            }
            r => panic!("unexpected {r:?}"),
        }
    }
    assert!(refused && stored > 0, "stored {stored}");
    assert_eq!(s.stats().evictions, 0);
    assert_eq!(s.outofmemory(), 1);
    for i in 0..stored {
        assert!(val(&s, &format!("k{i}")).is_some(), "k{i} evicted");
    }
    // Once the tail item has expired it is freed for a new one; live items still stay.
    s.clock().advance(5);
    assert!(matches!(set(&s, "n", &v, 0), StoreResult::Stored { .. }));
    assert_eq!((s.stats().evictions, s.stats().reclaimed), (0, 1));
    assert!(matches!(set(&s, "m", &v, 0), StoreResult::NoMemory));
    // With eviction back on, the store evicts again.
    s.set_evict_to_free(true);
    assert!(matches!(set(&s, "later", &v, 0), StoreResult::Stored { .. }));
    assert_eq!(s.stats().evictions, 1);
}

#[test]
fn malloced_bytes_flat_under_replacement_and_kept_after_removal() {
    let s = store_with(|c| c.shards = 1);
    let v = "x".repeat(1000);
    stored_cas(set(&s, "a", &v, 0));
    let first = s.stats();
    assert!(first.malloced_bytes >= first.bytes, "{first:?}");
    for i in 0..50 {
        // Held by a reader during some overwrites, so those are not written in place.
        let held = (i % 2 == 0).then(|| s.get(b"a", GetOpts::default(), |o| o.item.map(|it| it.data.clone())));
        stored_cas(set(&s, "a", &v, 0));
        drop(held);
        assert_eq!(s.stats().malloced_bytes, first.malloced_bytes, "overwrite {i}");
    }
    assert!(s.delete(b"a", DeleteOpts::default()) == DeleteResult::Deleted);
    let after = s.stats();
    assert_eq!(after.bytes, 0);
    assert!(after.malloced_bytes > 0 && after.malloced_bytes < first.malloced_bytes, "{after:?}");
}
