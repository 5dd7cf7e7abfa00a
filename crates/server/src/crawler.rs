//! memcached's LRU crawler as `lru_crawler crawl` starts it: a background walk of the store
//! that frees expired and flushed items, in bounded steps (one shard's slots at a time, the
//! shard locked only for that step, `lru_crawler_sleep` between steps), one crawl at a time
//! per process as memcached has one crawler thread.
//!
//! What it is for: starting a crawl (or answering `BUSY`), the crawl thread, and the
//! `lru_crawler_running` / `lru_crawler_starts` figures. The walk itself and its per-item
//! counters (`crawler_reclaimed`, `crawler_items_checked`) are the store's (`Store::crawl_step`).
//! What it is not for: streaming metadump (the connection that asked does it, see `memcache_admin`;
//! only its cursor type lives here).

use slipstream_store::Store;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Where a metadump in progress goes on (kept in the connection's state between
/// rounds; here, beside the crawl, because both walk the store's slots shard by shard).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DumpCursor {
    pub shard: usize,
    pub slot: usize,
}

/// Slots a crawl step looks at under one shard lock: bounds how long a worker waiting for
/// that shard can be delayed (tens of microseconds).
pub const CRAWL_SLOTS_PER_STEP: usize = 1024;

/// The process's crawler state (memcached's `stats_state.lru_crawler_running` and
/// `stats.lru_crawler_starts`).
pub struct Crawler {
    running: AtomicBool,
    starts: AtomicU64,
}

/// The one crawler (memcached has one crawler thread for the whole server).
pub static CRAWLER: Crawler = Crawler { running: AtomicBool::new(false), starts: AtomicU64::new(0) };

/// What `lru_crawler crawl` answers.
#[derive(Debug, PartialEq, Eq)]
pub enum CrawlStart {
    Started,
    /// memcached's `BUSY currently processing crawler request`.
    Busy,
    /// The thread could not be started (memcached's `ERROR an unknown error happened`).
    Failed,
}

impl Crawler {
    pub fn running(&self) -> bool {
        self.running.load(Ordering::Relaxed)
    }

    pub fn starts(&self) -> u64 {
        self.starts.load(Ordering::Relaxed)
    }

    /// Start crawling `store`: `sleep_us` between steps, at most `tocrawl` items per crawl
    /// (0 = all), as `-o lru_crawler_sleep` / `lru_crawler tocrawl` say.
    pub fn start(&'static self, store: Arc<Store>, sleep_us: u32, tocrawl: u32) -> CrawlStart {
        if self.running.swap(true, Ordering::AcqRel) {
            return CrawlStart::Busy;
        }
        self.starts.fetch_add(1, Ordering::Relaxed);
        let spawned = std::thread::Builder::new().name("slipstream-crawl".into()).spawn(move || {
            crawl(&store, sleep_us, tocrawl);
            self.running.store(false, Ordering::Release);
        });
        match spawned {
            Ok(_) => CrawlStart::Started,
            Err(e) => {
                eprintln!("slipstream: cannot start the LRU crawler: {e}");
                self.running.store(false, Ordering::Release);
                CrawlStart::Failed
            }
        }
    }
}

/// One whole crawl, step by step.
fn crawl(store: &Store, sleep_us: u32, tocrawl: u32) {
    let checked_at_start = store.stats().crawler_items_checked;
    for shard in 0..store.shard_count() {
        let mut from = 0;
        loop {
            let next = store.crawl_step(shard, from, CRAWL_SLOTS_PER_STEP);
            if sleep_us > 0 {
                std::thread::sleep(Duration::from_micros(u64::from(sleep_us)));
            }
            match next {
                Some(n) => from = n,
                None => break,
            }
        }
        if tocrawl > 0 && store.stats().crawler_items_checked - checked_at_start >= u64::from(tocrawl) {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use slipstream_store::{Clock, SetMode, Store, StoreConfig, StoreOpts};

    #[test]
    fn a_crawl_frees_expired_items_and_counts_them() {
        let clock = Clock::manual(1_700_000_000);
        let store = Store::with_clock(StoreConfig::default(), clock.clone());
        for i in 0..3000 {
            let exp = if i % 3 == 0 { 0 } else { 5 };
            store.store(SetMode::Set, format!("k{i}").as_bytes(), b"v", 0, exp, StoreOpts::default());
        }
        clock.advance(10);
        super::crawl(&store, 0, 0);
        let s = store.stats();
        assert_eq!(s.curr_items, 1000);
        assert_eq!(s.crawler_reclaimed, 2000);
        assert_eq!(s.crawler_items_checked, 3000);
        assert_eq!(s.expired_unfetched, 2000);
    }
}
