//! memcached's LRU maintainer, the part of it clients can see: one background thread that frees
//! expired and flushed items at the stores' LRU tails within about a second of their expiry
//! (`reclaimed`, `expired_unfetched`), so their memory comes back although no store lands on
//! their shard, and counts its passes (`lru_maintainer_juggles`).
//!
//! What it is for: which stores are watched (every store the daemon serves registers itself),
//! the thread and its sleep. The tail pull itself is the store's (`Store::reclaim_tails`, the
//! same pull a store runs before each allocation). What it is not for: moving items between
//! hot/warm/cold segments (Slipstream's LRU is not segmented) or full walks of the store (the
//! LRU crawler, `crawler`). Off with `-o no_lru_maintainer`, as memcached's.

use slipstream_store::Store;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

/// memcached's bounds on the maintainer's sleep (`MIN_LRU_MAINTAINER_SLEEP`,
/// `MAX_LRU_MAINTAINER_SLEEP`): it halves its sleep after a pass that freed something and
/// doubles it after one that did not, so an idle daemon wakes once a second.
pub const SLEEP_US_MIN: u64 = 1_000;
pub const SLEEP_US_MAX: u64 = 1_000_000;
/// Items one pass may free per shard: bounds how long it holds a shard's lock.
pub const ITEMS_PER_SHARD_MAX: usize = 64;

/// The process's maintainer: the stores it looks after and its pass count.
pub struct Maintainer {
    stores: Mutex<Vec<Weak<Store>>>,
    started: AtomicBool,
    juggles: AtomicU64,
}

/// Every store the daemon serves comes here: looked after unless `-o no_lru_maintainer`.
pub fn look_after(tunables: &crate::tunables::Tunables, store: &Arc<Store>) {
    if tunables.lru_maintainer {
        MAINTAINER.watch(store);
    }
}

/// The one maintainer (memcached has one maintainer thread for the whole server).
pub static MAINTAINER: Maintainer =
    Maintainer { stores: Mutex::new(Vec::new()), started: AtomicBool::new(false), juggles: AtomicU64::new(0) };

impl Maintainer {
    /// Look after `store` from now on (until it is dropped); starts the thread on first use.
    pub fn watch(&'static self, store: &Arc<Store>) {
        self.stores.lock().unwrap_or_else(PoisonError::into_inner).push(Arc::downgrade(store));
        if self.started.swap(true, Ordering::AcqRel) {
            return;
        }
        let spawned = std::thread::Builder::new().name("slipstream-lru-maint".into()).spawn(move || self.run());
        if let Err(e) = spawned {
            // Expired items are still freed by stores and evictions at the tails they meet.
            eprintln!("slipstream: cannot start the LRU maintainer: {e}");
            self.started.store(false, Ordering::Release);
        }
    }

    /// Passes made so far (memcached's `lru_maintainer_juggles`).
    pub fn juggles(&self) -> u64 {
        self.juggles.load(Ordering::Relaxed)
    }

    fn run(&self) {
        let mut sleep_us = SLEEP_US_MAX;
        loop {
            std::thread::sleep(Duration::from_micros(sleep_us));
            sleep_us = next_sleep_us(sleep_us, self.pass());
        }
    }

    /// One pass over every live store; forgets the dropped ones. Returns the items freed.
    pub fn pass(&self) -> usize {
        let stores: Vec<Arc<Store>> = {
            let mut g = self.stores.lock().unwrap_or_else(PoisonError::into_inner);
            g.retain(|w| w.strong_count() > 0);
            g.iter().filter_map(Weak::upgrade).collect()
        };
        self.juggles.fetch_add(1, Ordering::Relaxed);
        stores.iter().map(|s| s.reclaim_tails(ITEMS_PER_SHARD_MAX)).sum()
    }
}

/// memcached's back-off: busy passes come faster, idle ones slower, within the bounds.
fn next_sleep_us(sleep_us: u64, freed: usize) -> u64 {
    if freed > 0 {
        (sleep_us / 2).max(SLEEP_US_MIN)
    } else {
        (sleep_us * 2).min(SLEEP_US_MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use slipstream_store::{Clock, SetMode, StoreConfig, StoreOpts};

    fn watched(store: &Arc<Store>) -> Maintainer {
        Maintainer {
            stores: Mutex::new(vec![Arc::downgrade(store)]),
            started: AtomicBool::new(true),
            juggles: AtomicU64::new(0),
        }
    }

    #[test]
    fn passes_free_every_expired_item_without_a_store_touching_its_shard() {
        let clock = Clock::manual(1_700_000_000);
        let store = Arc::new(Store::with_clock(StoreConfig::default(), clock.clone()));
        for i in 0..200 {
            store.store(SetMode::Set, format!("k{i}").as_bytes(), b"v", 0, 1, StoreOpts::default());
        }
        let m = watched(&store);
        assert_eq!(m.pass(), 0, "nothing has expired yet");
        clock.advance(5);
        let freed: usize = (0..20).map(|_| m.pass()).sum();
        let s = store.stats();
        assert_eq!((freed, s.reclaimed, s.expired_unfetched, s.curr_items), (200, 200, 200, 0));
        assert_eq!(m.juggles(), 21);
    }

    #[test]
    fn a_pass_stops_at_a_live_tail_item() {
        let clock = Clock::manual(1_700_000_000);
        let cfg = StoreConfig { shards: 1, ..StoreConfig::default() };
        let store = Arc::new(Store::with_clock(cfg, clock.clone()));
        store.store(SetMode::Set, b"live", b"v", 0, 0, StoreOpts::default());
        for i in 0..10 {
            store.store(SetMode::Set, format!("k{i}").as_bytes(), b"v", 0, 1, StoreOpts::default());
        }
        clock.advance(5);
        let m = watched(&store);
        // memcached's maintainer pulls tails too: what sits behind a live item waits for the
        // crawler, a store's eviction or its own lookup.
        assert_eq!((m.pass(), store.stats().curr_items), (0, 11));
    }

    #[test]
    fn dropped_stores_are_forgotten() {
        let store = Arc::new(Store::new(StoreConfig::default()));
        let m = watched(&store);
        drop(store);
        assert_eq!(m.pass(), 0);
        assert!(m.stores.lock().unwrap().is_empty());
    }

    #[test]
    fn the_sleep_halves_when_busy_and_doubles_when_idle_within_bounds() {
        assert_eq!(next_sleep_us(SLEEP_US_MAX, 3), SLEEP_US_MAX / 2);
        assert_eq!(next_sleep_us(SLEEP_US_MIN, 3), SLEEP_US_MIN);
        assert_eq!(next_sleep_us(SLEEP_US_MIN, 0), 2 * SLEEP_US_MIN);
        assert_eq!(next_sleep_us(SLEEP_US_MAX, 0), SLEEP_US_MAX);
    }
}
