//! A self-contained executor harness: a store, settings, counters and connection state wired
//! together without sockets, so tests and the fuzz targets can drive the protocol executors the
//! same way the network loop does.
//!
//! Each request goes through `dispatch::execute_one`, the entry the TCP and UDP loops use, so
//! the fuzz targets exercise the product's dispatch, not a copy of it.
//!
//! Not for: production serving (the network loop builds its own `Ctx` per event).

use crate::dispatch::execute_one;
use crate::exec::{ConnState, Ctx, Settings, Step, Transport};
use crate::stats::{ServerInfo, ThreadStats};
use slipstream_store::{Clock, Store, StoreConfig};
use std::sync::Arc;

/// Requests executed per `feed` call at most — a bound so a buggy executor cannot loop forever.
pub const STEPS_PER_FEED_MAX: usize = 1 << 20;

pub struct Harness {
    pub store: Arc<Store>,
    pub stats: Arc<ThreadStats>,
    pub settings: Settings,
    pub info: ServerInfo,
    pub conn: ConnState,
    /// Bytes received but not yet consumed (a request split across reads waits here).
    pub pending: Vec<u8>,
    pub closed: bool,
    pub shutdown: bool,
}

impl Harness {
    pub fn new(store_cfg: StoreConfig, clock: Clock) -> Harness {
        let stats = Arc::new(ThreadStats::default());
        let item_bytes_max = store_cfg.item_bytes_max;
        Harness {
            store: Arc::new(Store::with_clock(store_cfg, clock)),
            stats: stats.clone(),
            settings: Settings::default(),
            info: ServerInfo::detached(vec![stats], item_bytes_max),
            conn: ConnState::new(Transport::Tcp),
            pending: Vec::new(),
            closed: false,
            shutdown: false,
        }
    }

    /// Small store with a manual clock: what most tests want.
    pub fn small() -> Harness {
        let cfg = StoreConfig { memory_bytes_max: 8 << 20, shards: 4, ..StoreConfig::default() };
        Harness::new(cfg, Clock::manual(1_700_000_000))
    }

    /// Feed bytes as if one read returned them; returns the replies produced. As the network
    /// loop does: requests executed (by `execute_one`) until one is incomplete, the connection
    /// closes, or the server is told to shut down.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        if self.closed {
            return out;
        }
        self.pending.extend_from_slice(bytes);
        let mut start = 0usize;
        for _ in 0..STEPS_PER_FEED_MAX {
            let input = &self.pending[start..];
            if input.is_empty() {
                break;
            }
            let mut ctx = Ctx {
                store: &self.store,
                stats: &self.stats,
                settings: &self.settings,
                server: &self.info,
                conn: &mut self.conn,
            };
            // The network loops' own entry: protocol sniffing, the executor, discarded
            // replies' by-reference values, the consumed-bytes check.
            let step = execute_one(&mut ctx, input, &mut out);
            match step {
                Step::Consumed(n) => start += n,
                Step::Incomplete => break,
                Step::Close | Step::Quit => {
                    self.closed = true;
                    break;
                }
                Step::Shutdown => {
                    self.shutdown = true;
                    self.closed = true;
                    break;
                }
            }
        }
        self.pending.drain(..start);
        // Values sent by reference go out where the network loop's writev puts them.
        let mut spliced = Vec::with_capacity(out.len() + self.conn.shared.pinned_bytes());
        let mut at = 0;
        match crate::outq::write_pending(&mut spliced, &out, &mut at, &mut self.conn.shared, |_| ()) {
            Ok(true) => spliced,
            _ => unreachable!("a Vec takes every write"),
        }
    }
}
