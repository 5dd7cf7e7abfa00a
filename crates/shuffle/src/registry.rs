//! The shuffle registry: Spark applications, their shuffles, each map task's committed segments,
//! and who holds each pool block. Rules:
//! - a map's first successful COMMIT wins; a later attempt gets the winner's segments back and
//!   its own blocks are freed; the winner committing again (a retry) gets the same answer;
//! - blocks allocated but never committed belong to their connection and are freed when it
//!   ends (a map task that died);
//! - LOOKUP pins the blocks it names for the asking connection until RELEASE or its end, so a
//!   block is never reused under a reader; a block whose shuffle is gone is freed at its last
//!   unpin;
//! - LOST (a reader found a segment unreadable) drops that attempt's commit, so Spark's
//!   recomputed attempt can commit;
//! - with tenants (crate::tenants), an application is bound to its tenant at its first
//!   REGISTER; every block it holds (pending, committed, a reader's copies) counts against that
//!   tenant's share until freed, and its bytes in and out are counted per tenant.
//!
//! Every table is bounded (`Limits`). Not for: bytes on the wire (crate::proto) or sockets.

use crate::pool::BlockPool;
use crate::ShuffleError;
use std::collections::{HashMap, HashSet};

/// One contiguous run of a map output's partition inside a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub partition: u32,
    pub block: u32,
    pub offset: u32,
    pub length: u32,
}

/// One segment as a reducer sees it: whose map output it is, and the file id of its block's
/// file (crate::pool; 0 when not known).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    pub map: u32,
    pub attempt: u64,
    pub block: u32,
    pub offset: u32,
    pub length: u32,
    pub file: u64,
}

#[derive(Debug, Clone)]
pub struct Limits {
    pub apps_max: usize,
    pub shuffles_max: usize,
    pub partitions_max: u32,
    /// Committed map outputs over all shuffles (an empty map output holds no block).
    pub map_outputs_max: usize,
    pub segments_per_commit_max: usize,
    pub app_id_bytes_max: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            apps_max: 64,
            shuffles_max: 4096,
            partitions_max: 1 << 20,
            map_outputs_max: 1 << 20,
            segments_per_commit_max: 1 << 18,
            app_id_bytes_max: 64,
        }
    }
}

type ShuffleKey = (String, u32);

struct MapOutput {
    attempt: u64,
    /// In partition order, a partition's own in commit (stream) order: a LOOKUP finds its
    /// partition's by binary search (at 200x200 a scan read every map's ~300 segments per LOOKUP).
    segments: Vec<Segment>,
}

struct Shuffle {
    partitions: u32,
    maps: HashMap<u32, MapOutput>,
}

enum Owner {
    /// Allocated on `conn`, not committed yet.
    Pending {
        conn: u64,
        shuffle: ShuffleKey,
    },
    Committed {
        shuffle: ShuffleKey,
    },
    /// Its shuffle or attempt is gone, or it holds a reader's copies of another host's
    /// segments; freed at the last unpin.
    Dead,
}

struct Block {
    owner: Owner,
    pins: u32,
    /// Index into `Registry::tenants` of the tenant it is charged to.
    tenant: Option<usize>,
}

#[derive(Default)]
struct Conn {
    pending: Vec<u32>,
    pins: HashSet<u32>,
    /// The application whose driver this connection is (DRIVER): its end unregisters it.
    driver_of: Option<String>,
}

/// Counters for the metrics endpoint.
#[derive(Debug, Default, Clone, Copy)]
pub struct Counts {
    pub commits: u64,
    pub commits_lost_race: u64,
    pub lookups: u64,
    pub segments_served: u64,
    pub alloc_refused: u64,
    pub lost_reports: u64,
}

/// Counters of one tenant, for its metrics rows.
#[derive(Debug, Default, Clone, Copy)]
pub struct TenantCounts {
    /// Bytes of map output committed (first winning commits).
    pub bytes_in: u64,
    /// Bytes of segments handed to readers by LOOKUP (and to peers by FETCH).
    pub bytes_out: u64,
    pub alloc_refused: u64,
}

/// One tenant's share and use of the pool.
#[derive(Debug, Clone)]
pub struct TenantUse {
    pub name: String,
    pub blocks_max: usize,
    pub in_use: usize,
    pub counts: TenantCounts,
    /// Bytes (in, out) counted but not yet charged to the tenant's buckets ([`Registry::settle`]).
    unpaid: (u64, u64),
}

pub struct Registry {
    pool: BlockPool,
    /// Empty: no tenants, applications name none and share the whole pool.
    tenants: Vec<TenantUse>,
    /// Application -> index into `tenants`, from its first REGISTER until UNREGISTER_APP.
    app_tenant: HashMap<String, usize>,
    limits: Limits,
    shuffles: HashMap<ShuffleKey, Shuffle>,
    blocks: HashMap<u32, Block>,
    conns: HashMap<u64, Conn>,
    map_outputs: usize,
    pub counts: Counts,
}

impl Registry {
    /// `tenants`: (name, blocks its share holds), checked by crate::tenants::check_shares.
    pub fn new(pool: BlockPool, limits: Limits, tenants: Vec<(String, usize)>) -> Registry {
        Registry {
            pool,
            tenants: tenants
                .into_iter()
                .map(|(name, blocks_max)| TenantUse {
                    name,
                    blocks_max,
                    in_use: 0,
                    counts: TenantCounts::default(),
                    unpaid: (0, 0),
                })
                .collect(),
            app_tenant: HashMap::new(),
            limits,
            shuffles: HashMap::new(),
            blocks: HashMap::new(),
            conns: HashMap::new(),
            map_outputs: 0,
            counts: Counts::default(),
        }
    }

    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    pub fn shuffle_count(&self) -> usize {
        self.shuffles.len()
    }

    pub fn tenants(&self) -> &[TenantUse] {
        &self.tenants
    }

    fn tenant_names(&self) -> String {
        self.tenants.iter().map(|t| t.name.as_str()).collect::<Vec<_>>().join(", ")
    }

    /// The tenant `name` as an application names it (HELLO, REGISTER): its index, or `None`
    /// on a daemon without tenants when it names none.
    pub fn resolve_tenant(&self, name: Option<&str>) -> Result<Option<usize>, ShuffleError> {
        match name {
            None if self.tenants.is_empty() => Ok(None),
            None => Err(ShuffleError::NoTenant { known: self.tenant_names() }),
            Some(n) => match self.tenants.iter().position(|t| t.name == n) {
                Some(i) => Ok(Some(i)),
                None => Err(ShuffleError::UnknownTenant {
                    name: n.to_string(),
                    known: if self.tenants.is_empty() {
                        "none, this daemon has no tenants".into()
                    } else {
                        self.tenant_names()
                    },
                }),
            },
        }
    }

    /// The tenant `app` is charged to (its index), if any.
    pub fn tenant_of(&self, app: &str) -> Option<usize> {
        self.app_tenant.get(app).copied()
    }

    /// Counts `bytes` handed out for `app` (a LOOKUP's or FETCH's segments) to its tenant.
    pub fn count_out(&mut self, app: &str, bytes: u64) {
        if let Some(t) = self.tenant_of(app).and_then(|i| self.tenants.get_mut(i)) {
            t.counts.bytes_out += bytes;
            t.unpaid.1 += bytes;
        }
    }

    /// Counts `bytes` taken in for `app` (committed map output, a peer's segments copied
    /// here) to its tenant.
    pub fn count_in(&mut self, app: &str, bytes: u64) {
        if let Some(t) = self.tenant_of(app).and_then(|i| self.tenants.get_mut(i)) {
            t.counts.bytes_in += bytes;
            t.unpaid.0 += bytes;
        }
    }

    /// Hands every tenant's bytes counted since the last call to `pay(tenant, in, out)` (the
    /// server charges them to the tenant's buckets), so the buckets see exactly what the
    /// metrics count.
    pub fn settle(&mut self, mut pay: impl FnMut(usize, u64, u64)) {
        for (i, t) in self.tenants.iter_mut().enumerate() {
            let (bytes_in, bytes_out) = std::mem::take(&mut t.unpaid);
            if bytes_in > 0 || bytes_out > 0 {
                pay(i, bytes_in, bytes_out);
            }
        }
    }

    /// A pool block charged to `tenant` (its share checked first), or the limit's error.
    fn take_block(&mut self, tenant: Option<usize>) -> Result<u32, ShuffleError> {
        let block_bytes = self.pool.block_bytes();
        if let Some(t) = tenant.and_then(|i| self.tenants.get_mut(i)) {
            if t.in_use >= t.blocks_max {
                t.counts.alloc_refused += 1;
                self.counts.alloc_refused += 1;
                return Err(ShuffleError::TenantFull { tenant: t.name.clone(), blocks_max: t.blocks_max, block_bytes });
            }
        }
        let id = self.pool.alloc().inspect_err(|_| self.counts.alloc_refused += 1)?;
        if let Some(t) = tenant.and_then(|i| self.tenants.get_mut(i)) {
            t.in_use += 1;
        }
        Ok(id)
    }

    /// Block `id` goes back to the pool and off its tenant's share.
    fn give_back(&mut self, id: u32) {
        if let Some(b) = self.blocks.remove(&id) {
            if let Some(t) = b.tenant.and_then(|i| self.tenants.get_mut(i)) {
                t.in_use = t.in_use.saturating_sub(1);
            }
        }
        self.pool.free(id);
    }

    fn check_app(&self, app: &str) -> Result<(), ShuffleError> {
        let ok = !app.is_empty()
            && app.len() <= self.limits.app_id_bytes_max
            && app.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if ok {
            Ok(())
        } else {
            Err(ShuffleError::Syntax(format!(
                "bad application id (1-{} of A-Z a-z 0-9 . _ -)",
                self.limits.app_id_bytes_max
            )))
        }
    }

    /// Registers (app, shuffle) with its reduce partition count, `app` charged to `tenant`
    /// (required on a daemon with tenants, refused on one without); again with the same count
    /// and tenant is a no-op (every writer registers, in case the daemon restarted).
    pub fn register(
        &mut self,
        app: &str,
        shuffle: u32,
        partitions: u32,
        tenant: Option<&str>,
    ) -> Result<(), ShuffleError> {
        self.check_app(app)?;
        let tenant = self.resolve_tenant(tenant)?;
        if let (Some(bound), Some(asked)) = (self.tenant_of(app), tenant) {
            if bound != asked {
                let name = self.tenants.get(bound).map(|t| t.name.clone()).unwrap_or_default();
                return Err(ShuffleError::TenantMismatch { app: app.to_string(), tenant: name });
            }
        }
        if partitions == 0 || partitions > self.limits.partitions_max {
            return Err(ShuffleError::Syntax(format!("partitions must be 1..={}", self.limits.partitions_max)));
        }
        let key = (app.to_string(), shuffle);
        if let Some(s) = self.shuffles.get(&key) {
            if s.partitions != partitions {
                return Err(ShuffleError::PartitionsMismatch { registered: s.partitions, asked: partitions });
            }
            return Ok(());
        }
        if self.shuffles.len() >= self.limits.shuffles_max {
            return Err(ShuffleError::Limit { what: "shuffles", max: self.limits.shuffles_max });
        }
        let apps: HashSet<&str> = self.shuffles.keys().map(|(a, _)| a.as_str()).collect();
        if !apps.contains(app) && apps.len() >= self.limits.apps_max {
            return Err(ShuffleError::Limit { what: "applications", max: self.limits.apps_max });
        }
        self.shuffles.insert(key, Shuffle { partitions, maps: HashMap::new() });
        if let Some(t) = tenant {
            self.app_tenant.insert(app.to_string(), t);
        }
        Ok(())
    }

    /// A block for a map task of (app, shuffle), pending on `conn` until its commit.
    pub fn alloc(&mut self, conn: u64, app: &str, shuffle: u32) -> Result<u32, ShuffleError> {
        let key = (app.to_string(), shuffle);
        if !self.shuffles.contains_key(&key) {
            return Err(ShuffleError::UnknownShuffle);
        }
        let tenant = self.tenant_of(app);
        let id = self.take_block(tenant)?;
        self.blocks.insert(id, Block { owner: Owner::Pending { conn, shuffle: key }, pins: 0, tenant });
        self.conns.entry(conn).or_default().pending.push(id);
        Ok(id)
    }

    /// Map `map`'s attempt `attempt` is done with `segments` in blocks it allocated on `conn`.
    /// Returns the winning attempt and its segments (this attempt's unless another won first).
    /// Checked before anything changes: a refused commit leaves every table as it was.
    pub fn commit(
        &mut self,
        conn: u64,
        app: &str,
        shuffle: u32,
        map: u32,
        attempt: u64,
        segments: Vec<Segment>,
    ) -> Result<(u64, Vec<Segment>), ShuffleError> {
        let key = (app.to_string(), shuffle);
        let sh = self.shuffles.get(&key).ok_or(ShuffleError::UnknownShuffle)?;
        if let Some(won) = sh.maps.get(&map) {
            let answer = (won.attempt, won.segments.clone());
            self.counts.commits += 1;
            if won.attempt != attempt {
                self.counts.commits_lost_race += 1;
            }
            // A loser's (or a retry's fresh) blocks for this shuffle are of no use now.
            self.free_pending(conn, &key);
            return Ok(answer);
        }
        if segments.len() > self.limits.segments_per_commit_max {
            return Err(ShuffleError::Limit {
                what: "segments in one commit",
                max: self.limits.segments_per_commit_max,
            });
        }
        if self.map_outputs >= self.limits.map_outputs_max {
            return Err(ShuffleError::Limit { what: "map outputs", max: self.limits.map_outputs_max });
        }
        let block_bytes = self.pool.block_bytes() as u64;
        for s in &segments {
            match self.blocks.get(&s.block) {
                Some(Block { owner: Owner::Pending { conn: c, shuffle: k }, .. }) if *c == conn && *k == key => {}
                _ => return Err(ShuffleError::NotYourBlock(s.block)),
            }
            if s.partition >= sh.partitions {
                return Err(ShuffleError::BadSegment(format!("partition {} of {}", s.partition, sh.partitions)));
            }
            if s.length == 0 || u64::from(s.offset) + u64::from(s.length) > block_bytes {
                return Err(ShuffleError::BadSegment(format!(
                    "offset {} length {} in a block of {block_bytes} bytes",
                    s.offset, s.length
                )));
            }
        }
        let used: HashSet<u32> = segments.iter().map(|s| s.block).collect();
        for b in &used {
            if let Some(bl) = self.blocks.get_mut(b) {
                bl.owner = Owner::Committed { shuffle: key.clone() };
            }
        }
        if let Some(c) = self.conns.get_mut(&conn) {
            c.pending.retain(|b| !used.contains(b));
        }
        self.free_pending(conn, &key);
        let mut segments = segments;
        segments.sort_by_key(|s| s.partition); // stable
        let answer = (attempt, segments.clone());
        let bytes: u64 = segments.iter().map(|s| u64::from(s.length)).sum();
        if let Some(sh) = self.shuffles.get_mut(&key) {
            sh.maps.insert(map, MapOutput { attempt, segments });
        }
        self.count_in(app, bytes);
        self.map_outputs += 1;
        self.counts.commits += 1;
        Ok(answer)
    }

    /// Every committed segment of reduce partition `reduce`, in map order; pins their blocks
    /// for `conn`.
    pub fn lookup(&mut self, conn: u64, app: &str, shuffle: u32, reduce: u32) -> Result<Vec<Found>, ShuffleError> {
        let key = (app.to_string(), shuffle);
        let sh = self.shuffles.get(&key).ok_or(ShuffleError::UnknownShuffle)?;
        let pool = &self.pool;
        if reduce >= sh.partitions {
            return Err(ShuffleError::BadSegment(format!("partition {reduce} of {}", sh.partitions)));
        }
        let mut found: Vec<Found> = sh
            .maps
            .iter()
            .flat_map(|(&map, m)| {
                let from = m.segments.partition_point(|s| s.partition < reduce);
                m.segments[from..].iter().take_while(move |s| s.partition == reduce).map(move |s| Found {
                    map,
                    attempt: m.attempt,
                    block: s.block,
                    offset: s.offset,
                    length: s.length,
                    file: pool.file_id(s.block),
                })
            })
            .collect();
        // Map order; within a map, the order the writer committed (the stream's order).
        found.sort_by_key(|f| f.map);
        let pins = &mut self.conns.entry(conn).or_default().pins;
        for f in &found {
            if pins.insert(f.block) {
                if let Some(b) = self.blocks.get_mut(&f.block) {
                    b.pins += 1;
                }
            }
        }
        self.counts.lookups += 1;
        self.counts.segments_served += found.len() as u64;
        let bytes: u64 = found.iter().map(|f| u64::from(f.length)).sum();
        self.count_out(app, bytes);
        Ok(found)
    }

    /// A block for copies of other hosts' segments that a LOOKUP on `conn` fetched
    /// (crate::peer): owned by no shuffle, pinned for `conn`, so it is freed at the reader's
    /// RELEASE or the connection's end. Counted against the pool's memory limit like any block,
    /// and against the share of `app`'s tenant when the application is known here.
    pub fn alloc_copy(&mut self, conn: u64, app: &str) -> Result<u32, ShuffleError> {
        let tenant = self.tenant_of(app);
        let id = self.take_block(tenant)?;
        self.blocks.insert(id, Block { owner: Owner::Dead, pins: 1, tenant });
        self.conns.entry(conn).or_default().pins.insert(id);
        Ok(id)
    }

    /// `conn` is done reading `block`.
    pub fn release(&mut self, conn: u64, block: u32) -> Result<(), ShuffleError> {
        let pinned = self.conns.get_mut(&conn).is_some_and(|c| c.pins.remove(&block));
        if !pinned {
            return Err(ShuffleError::UnknownBlock(block));
        }
        self.unpin(block);
        Ok(())
    }

    /// A reader could not use attempt `attempt` of `map`: drop that commit (if it is still the
    /// winner) so a recomputed attempt can commit.
    pub fn lost(&mut self, app: &str, shuffle: u32, map: u32, attempt: u64) -> Result<(), ShuffleError> {
        let key = (app.to_string(), shuffle);
        let sh = self.shuffles.get_mut(&key).ok_or(ShuffleError::UnknownShuffle)?;
        if sh.maps.get(&map).is_some_and(|m| m.attempt == attempt) {
            if let Some(m) = sh.maps.remove(&map) {
                self.map_outputs -= 1;
                self.counts.lost_reports += 1;
                let blocks: HashSet<u32> = m.segments.iter().map(|s| s.block).collect();
                for b in blocks {
                    self.kill(b);
                }
            }
        }
        Ok(())
    }

    /// Drops a shuffle and frees its blocks (those pinned, at their last unpin).
    pub fn unregister(&mut self, app: &str, shuffle: u32) {
        let key = (app.to_string(), shuffle);
        if let Some(sh) = self.shuffles.remove(&key) {
            self.map_outputs -= sh.maps.len();
        }
        let owned: Vec<u32> = self
            .blocks
            .iter()
            .filter(|(_, b)| match &b.owner {
                Owner::Pending { shuffle, .. } | Owner::Committed { shuffle, .. } => *shuffle == key,
                Owner::Dead => false,
            })
            .map(|(&id, _)| id)
            .collect();
        for id in owned {
            self.kill(id);
        }
        // The binding goes with the application's last shuffle (the table stays bounded by
        // `apps_max`); its blocks still pinned keep their own tenant until freed.
        if !self.shuffles.keys().any(|(a, _)| a == app) {
            self.app_tenant.remove(app);
        }
    }

    /// Drops every shuffle of `app` (and so its tenant binding).
    pub fn unregister_app(&mut self, app: &str) {
        let ids: Vec<u32> = self.shuffles.keys().filter(|(a, _)| a == app).map(|(_, s)| *s).collect();
        for s in ids {
            self.unregister(app, s);
        }
    }

    /// `conn` is `app`'s driver: when it ends (drop_conn) without UNREGISTER_APP, the application
    /// is unregistered, so a driver that crashed does not leave its blocks in the pool. Executors'
    /// connections never say DRIVER and so never end an application.
    pub fn driver(&mut self, conn: u64, app: &str) -> Result<(), ShuffleError> {
        self.check_app(app)?;
        self.conns.entry(conn).or_default().driver_of = Some(app.to_string());
        Ok(())
    }

    /// Whether `conn` is some application's driver now (a DRIVER that was refused is not).
    pub fn is_driver(&self, conn: u64) -> bool {
        self.conns.get(&conn).is_some_and(|c| c.driver_of.is_some())
    }

    /// UNREGISTER_APP: the application ended cleanly; its driver connections are drivers of
    /// nothing from now on (so their end cannot unregister a later application of the same id).
    pub fn end_app(&mut self, app: &str) {
        self.unregister_app(app);
        for c in self.conns.values_mut() {
            if c.driver_of.as_deref() == Some(app) {
                c.driver_of = None;
            }
        }
    }

    /// `conn` ended: its uncommitted blocks are freed and its pins dropped; the application it
    /// was the driver of is unregistered unless another of its driver connections is still open
    /// (a driver that reconnected after a daemon restart, or a second SparkContext's manager).
    /// Returns the application it unregistered, for the server to pass on to the peers.
    pub fn drop_conn(&mut self, conn: u64) -> Option<String> {
        let c = self.conns.remove(&conn)?;
        let ended = c.driver_of.filter(|app| !self.conns.values().any(|o| o.driver_of.as_ref() == Some(app)));
        if let Some(app) = &ended {
            self.unregister_app(app);
        }
        for b in c.pending {
            // Only if still this connection's: an unregistered shuffle's block may have been
            // freed and handed to someone else since.
            if matches!(self.blocks.get(&b), Some(Block { owner: Owner::Pending { conn: c, .. }, .. }) if *c == conn) {
                self.kill(b);
            }
        }
        for b in c.pins {
            self.unpin(b);
        }
        ended
    }

    fn free_pending(&mut self, conn: u64, key: &ShuffleKey) {
        let mine: Vec<u32> = match self.conns.get_mut(&conn) {
            Some(c) => {
                let (mine, rest): (Vec<u32>, Vec<u32>) = c.pending.iter().partition(|b| {
                    matches!(self.blocks.get(b), Some(Block { owner: Owner::Pending { shuffle, .. }, .. }) if shuffle == key)
                });
                c.pending = rest;
                mine
            }
            None => Vec::new(),
        };
        for b in mine {
            self.kill(b);
        }
    }

    /// The block's owner is gone: free it now, or at its last unpin.
    fn kill(&mut self, id: u32) {
        let Some(b) = self.blocks.get_mut(&id) else { return };
        b.owner = Owner::Dead;
        if b.pins == 0 {
            self.give_back(id);
        }
    }

    fn unpin(&mut self, id: u32) {
        let Some(b) = self.blocks.get_mut(&id) else { return };
        b.pins = b.pins.saturating_sub(1);
        if b.pins == 0 && matches!(b.owner, Owner::Dead) {
            self.give_back(id);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const BLOCK: usize = 64 * 1024;

    fn registry(blocks_max: usize) -> (Registry, PathBuf) {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("slipstream-shuffle-test-{}-{n}", std::process::id()));
        let pool = BlockPool::open(&dir, BLOCK, blocks_max, 2).unwrap();
        (Registry::new(pool, Limits::default(), Vec::new()), dir)
    }
    use std::path::PathBuf;

    fn seg(partition: u32, block: u32, offset: u32, length: u32) -> Segment {
        Segment { partition, block, offset, length }
    }

    #[test]
    fn lookup_finds_a_partitions_segments_in_commit_order_among_interleaved_ones() {
        let (mut r, _dir) = registry(8);
        r.register("app-1", 0, 4, None).unwrap();
        let a = r.alloc(1, "app-1", 0).unwrap();
        let segs =
            vec![seg(2, a, 0, 1), seg(0, a, 1, 1), seg(2, a, 2, 1), seg(1, a, 3, 1), seg(2, a, 4, 1), seg(0, a, 5, 1)];
        r.commit(1, "app-1", 0, 5, 1, segs).unwrap();
        let offsets =
            |r: &mut Registry, p| r.lookup(2, "app-1", 0, p).unwrap().iter().map(|f| f.offset).collect::<Vec<_>>();
        assert_eq!(offsets(&mut r, 2), vec![0, 2, 4]);
        assert_eq!(offsets(&mut r, 0), vec![1, 5]);
        assert_eq!(offsets(&mut r, 1), vec![3]);
        assert!(offsets(&mut r, 3).is_empty());
    }

    #[test]
    fn first_successful_attempt_wins_and_the_loser_is_freed() {
        let (mut r, dir) = registry(8);
        r.register("app-1", 0, 4, None).unwrap();
        let a = r.alloc(1, "app-1", 0).unwrap();
        let b = r.alloc(2, "app-1", 0).unwrap();
        assert!(dir.join(format!("blk-{a}")).exists());
        assert_eq!(r.pool().in_use(), 2);
        let won = r.commit(1, "app-1", 0, 7, 100, vec![seg(0, a, 0, 10), seg(3, a, 10, 5)]).unwrap();
        assert_eq!(won, (100, vec![seg(0, a, 0, 10), seg(3, a, 10, 5)]));
        // The speculative attempt 101 of the same map commits later: it is told 100 won, and
        // its block goes back to the pool.
        let lost = r.commit(2, "app-1", 0, 7, 101, vec![seg(0, b, 0, 99)]).unwrap();
        assert_eq!(lost, won);
        assert_eq!(r.pool().in_use(), 1);
        assert_eq!(r.counts.commits_lost_race, 1);
        let found = r.lookup(3, "app-1", 0, 3).unwrap();
        assert_eq!(
            found,
            vec![Found { map: 7, attempt: 100, block: a, offset: 10, length: 5, file: r.pool().file_id(a) }]
        );
        assert!(r.lookup(3, "app-1", 0, 1).unwrap().is_empty());
    }

    #[test]
    fn a_retried_commit_is_idempotent() {
        let (mut r, _dir) = registry(8);
        r.register("a", 1, 2, None).unwrap();
        let blk = r.alloc(1, "a", 1).unwrap();
        let first = r.commit(1, "a", 1, 0, 5, vec![seg(1, blk, 0, 3)]).unwrap();
        // The answer was lost; the same attempt sends the same commit again (its blocks are no
        // longer pending, which must not matter).
        let again = r.commit(1, "a", 1, 0, 5, vec![seg(1, blk, 0, 3)]).unwrap();
        assert_eq!(first, again);
        assert_eq!(r.counts.commits_lost_race, 0);
        assert_eq!(r.pool().in_use(), 1);
        // Registering again with the same count is fine, with another is refused.
        r.register("a", 1, 2, None).unwrap();
        assert_eq!(r.register("a", 1, 3, None), Err(ShuffleError::PartitionsMismatch { registered: 2, asked: 3 }));
    }

    #[test]
    fn the_memory_limit_refuses_with_a_clear_error_and_frees_make_room() {
        let (mut r, _dir) = registry(2);
        r.register("a", 0, 1, None).unwrap();
        let b0 = r.alloc(1, "a", 0).unwrap();
        r.alloc(1, "a", 0).unwrap();
        let e = r.alloc(1, "a", 0).unwrap_err();
        assert_eq!(e, ShuffleError::PoolFull { blocks_max: 2, block_bytes: BLOCK });
        assert!(!e.is_client());
        assert!(e.to_string().contains("shuffle pool full"), "{e}");
        assert_eq!(r.counts.alloc_refused, 1);
        // Committing uses b0 and frees the unused pending block.
        r.commit(1, "a", 0, 0, 1, vec![seg(0, b0, 0, 1)]).unwrap();
        assert_eq!(r.pool().in_use(), 1);
        r.alloc(2, "a", 0).unwrap();
        // A connection that ends without committing gives its blocks back.
        r.drop_conn(2);
        assert_eq!(r.pool().in_use(), 1);
        r.unregister_app("a");
        assert_eq!(r.pool().in_use(), 0);
    }

    #[test]
    fn bad_commits_are_refused_and_change_nothing() {
        let (mut r, _dir) = registry(4);
        r.register("a", 0, 2, None).unwrap();
        r.register("b", 0, 2, None).unwrap();
        let mine = r.alloc(1, "a", 0).unwrap();
        let other = r.alloc(2, "a", 0).unwrap();
        let other_shuffle = r.alloc(1, "b", 0).unwrap();
        let bad = |r: &mut Registry, s: Segment| r.commit(1, "a", 0, 0, 1, vec![s]).unwrap_err();
        assert_eq!(bad(&mut r, seg(0, other, 0, 1)), ShuffleError::NotYourBlock(other));
        assert_eq!(bad(&mut r, seg(0, other_shuffle, 0, 1)), ShuffleError::NotYourBlock(other_shuffle));
        assert_eq!(bad(&mut r, seg(0, 999, 0, 1)), ShuffleError::NotYourBlock(999));
        assert!(matches!(bad(&mut r, seg(2, mine, 0, 1)), ShuffleError::BadSegment(_)));
        assert!(matches!(bad(&mut r, seg(0, mine, BLOCK as u32 - 1, 2)), ShuffleError::BadSegment(_)));
        assert!(matches!(bad(&mut r, seg(0, mine, 0, 0)), ShuffleError::BadSegment(_)));
        assert!(matches!(bad(&mut r, seg(0, mine, u32::MAX, u32::MAX)), ShuffleError::BadSegment(_)));
        assert_eq!(r.commit(1, "zz", 0, 0, 1, vec![]), Err(ShuffleError::UnknownShuffle));
        assert!(r.lookup(1, "a", 0, 0).unwrap().is_empty());
        assert!(r.lookup(1, "a", 0, 2).is_err());
        assert_eq!(r.pool().in_use(), 3);
        // Still committable after the refusals.
        r.commit(1, "a", 0, 0, 1, vec![seg(1, mine, 0, 1)]).unwrap();
        assert!(r.register("bad app", 0, 1, None).is_err());
        assert!(r.register("a", 9, 0, None).is_err());
        assert_eq!(r.release(1, 12345), Err(ShuffleError::UnknownBlock(12345)));
    }

    #[test]
    fn pinned_blocks_outlive_their_shuffle_and_lost_outputs_can_be_recommitted() {
        let (mut r, _dir) = registry(4);
        r.register("a", 0, 1, None).unwrap();
        let b = r.alloc(1, "a", 0).unwrap();
        r.commit(1, "a", 0, 0, 1, vec![seg(0, b, 0, 8)]).unwrap();
        assert_eq!(r.lookup(9, "a", 0, 0).unwrap().len(), 1);
        // A reader reports attempt 1 lost: its output goes (freed once the pin is released) and
        // attempt 2 may commit.
        r.lost("a", 0, 0, 2).unwrap(); // not the winner: ignored
        assert_eq!(r.lookup(8, "a", 0, 0).unwrap().len(), 1);
        r.release(8, b).unwrap();
        r.lost("a", 0, 0, 1).unwrap();
        assert!(r.lookup(8, "a", 0, 0).unwrap().is_empty());
        assert_eq!(r.pool().in_use(), 1, "still pinned by connection 9");
        r.release(9, b).unwrap();
        assert_eq!(r.pool().in_use(), 0);
        let b2 = r.alloc(1, "a", 0).unwrap();
        assert_eq!(r.commit(1, "a", 0, 0, 2, vec![seg(0, b2, 0, 4)]).unwrap().0, 2);
        // Unregister while pinned: freed at the end of the reader's connection.
        r.lookup(7, "a", 0, 0).unwrap();
        r.unregister("a", 0);
        assert_eq!(r.pool().in_use(), 1);
        r.drop_conn(7);
        assert_eq!(r.pool().in_use(), 0);
        assert_eq!(r.shuffle_count(), 0);
    }

    #[test]
    fn two_pools_never_share_a_directory() {
        let (_r, dir) = registry(1);
        let e = BlockPool::open(&dir, BLOCK, 1, 1).err().unwrap();
        assert!(e.to_string().contains("in use by another"), "{e}");
    }

    #[test]
    fn a_drivers_hang_up_ends_its_application_and_an_executors_does_not() {
        let (mut r, _dir) = registry(8);
        r.register("a", 1, 2, None).unwrap();
        r.register("b", 1, 2, None).unwrap();
        r.driver(1, "a").unwrap();
        r.driver(2, "a").unwrap(); // a second driver connection of the same application
        assert!(r.driver(3, "bad id").is_err());
        assert!(r.is_driver(1) && !r.is_driver(3), "a refused DRIVER makes no driver");
        for (conn, app) in [(5, "a"), (5, "b")] {
            let blk = r.alloc(conn, app, 1).unwrap();
            r.commit(conn, app, 1, 0, 1, vec![seg(0, blk, 0, 10)]).unwrap();
        }
        assert_eq!(r.drop_conn(5), None); // an executor: nothing of a or b goes
        assert_eq!((r.pool().in_use(), r.shuffle_count()), (2, 2));
        assert_eq!(r.drop_conn(1), None); // a's other driver connection is still open
        assert_eq!((r.pool().in_use(), r.shuffle_count()), (2, 2));
        assert_eq!(r.drop_conn(2).as_deref(), Some("a"), "ended: for the peers too");
        assert_eq!((r.pool().in_use(), r.shuffle_count()), (1, 1), "a's driver gone: a freed, b kept");
        assert!(r.lookup(6, "b", 1, 0).is_ok());
        // UNREGISTER_APP first, then a new application of the same id, then the old driver's
        // connection ends: the new application stays.
        r.driver(7, "b").unwrap();
        r.end_app("b");
        r.register("b", 2, 2, None).unwrap();
        assert_eq!(r.drop_conn(7), None);
        assert_eq!(r.shuffle_count(), 1, "a driver connection after UNREGISTER_APP ends nothing");
    }

    #[test]
    fn copy_blocks_count_against_the_limit_and_go_at_release_or_hang_up() {
        let (mut r, _dir) = registry(2);
        let a = r.alloc_copy(1, "a").unwrap();
        let b = r.alloc_copy(2, "a").unwrap();
        assert!(matches!(r.alloc_copy(1, "a"), Err(ShuffleError::PoolFull { .. })));
        r.release(1, a).unwrap();
        assert_eq!(r.pool().in_use(), 1);
        assert!(r.release(1, a).is_err(), "released twice");
        r.drop_conn(2);
        assert_eq!(r.pool().in_use(), 0, "block {b} freed when its reader hung up");
    }

    fn tenanted(blocks_max: usize, shares: &[(&str, usize)]) -> Registry {
        let (r, _dir) = registry(blocks_max);
        let tenants = shares.iter().map(|(n, b)| (n.to_string(), *b)).collect();
        Registry::new(r.pool, Limits::default(), tenants)
    }

    #[test]
    fn a_tenant_at_its_share_is_refused_and_the_others_go_on() {
        let mut r = tenanted(8, &[("etl", 2), ("adhoc", 3)]);
        r.register("app-e", 0, 2, Some("etl")).unwrap();
        r.register("app-a", 0, 2, Some("adhoc")).unwrap();
        let e0 = r.alloc(1, "app-e", 0).unwrap();
        r.alloc(1, "app-e", 0).unwrap();
        let e = r.alloc(1, "app-e", 0).unwrap_err();
        assert_eq!(e, ShuffleError::TenantFull { tenant: "etl".into(), blocks_max: 2, block_bytes: BLOCK });
        assert!(!e.is_client());
        assert!(e.to_string().contains("shuffle pool full for tenant \"etl\""), "{e}");
        // The pool has room and the other tenant's share is whole.
        assert_eq!(r.pool().in_use(), 2);
        let a0 = r.alloc(2, "app-a", 0).unwrap();
        r.alloc(2, "app-a", 0).unwrap();
        r.alloc(2, "app-a", 0).unwrap();
        assert!(matches!(r.alloc(2, "app-a", 0), Err(ShuffleError::TenantFull { .. })));
        let used: Vec<(usize, u64)> = r.tenants().iter().map(|t| (t.in_use, t.counts.alloc_refused)).collect();
        assert_eq!(used, vec![(2, 1), (3, 1)]);
        // Committing frees the unused pending block back to its own tenant's share.
        r.commit(1, "app-e", 0, 0, 1, vec![seg(0, e0, 0, 100), seg(1, e0, 100, 20)]).unwrap();
        assert_eq!(r.tenants()[0].in_use, 1);
        r.alloc(1, "app-e", 0).unwrap();
        // A reader's copy block is charged to its application's tenant, and freed off it.
        r.drop_conn(2);
        assert_eq!(r.tenants()[1].in_use, 0);
        let copy = r.alloc_copy(5, "app-a").unwrap();
        assert_eq!(r.tenants()[1].in_use, 1);
        r.release(5, copy).unwrap();
        assert_eq!(r.tenants()[1].in_use, 0);
        // Bytes in at commit, out at lookup; settle hands them over once.
        r.lookup(3, "app-e", 0, 0).unwrap();
        let mut paid = Vec::new();
        r.settle(|i, bytes_in, bytes_out| paid.push((i, bytes_in, bytes_out)));
        assert_eq!(paid, vec![(0, 120, 100)]);
        r.settle(|i, _, _| panic!("tenant {i} paid twice"));
        assert_eq!((r.tenants()[0].counts.bytes_in, r.tenants()[0].counts.bytes_out), (120, 100));
        let _ = a0;
        // The application gone (pending and committed blocks; the reader's pin first), its
        // blocks leave the share.
        r.unregister_app("app-e");
        assert_eq!(r.tenants()[0].in_use, 1, "the committed block still pinned by reader 3");
        r.drop_conn(3);
        assert_eq!(r.tenants()[0].in_use, 0);
        assert_eq!(r.pool().in_use(), 0);
        assert_eq!(r.tenant_of("app-e"), None);
    }

    #[test]
    fn tenants_are_named_or_refused_clearly() {
        let mut r = tenanted(4, &[("etl", 2)]);
        let e = r.register("app", 0, 1, None).unwrap_err();
        assert!(e.to_string().contains("set spark.slipstream.shuffle.tenant to one of etl"), "{e}");
        let e = r.register("app", 0, 1, Some("nope")).unwrap_err();
        assert_eq!(e, ShuffleError::UnknownTenant { name: "nope".into(), known: "etl".into() });
        assert!(e.is_client());
        assert_eq!(r.resolve_tenant(Some("etl")), Ok(Some(0)));
        r.register("app", 0, 1, Some("etl")).unwrap();
        r.register("app", 1, 1, Some("etl")).unwrap();
        let mut other = tenanted(4, &[("etl", 2), ("b", 2)]);
        other.register("app", 0, 1, Some("etl")).unwrap();
        let e = other.register("app", 1, 1, Some("b")).unwrap_err();
        assert_eq!(e, ShuffleError::TenantMismatch { app: "app".into(), tenant: "etl".into() });
        // Without tenants, naming one is refused and naming none is fine.
        let (mut plain, _dir) = registry(4);
        assert!(plain.register("app", 0, 1, Some("etl")).unwrap_err().to_string().contains("no tenants"));
        plain.register("app", 0, 1, None).unwrap();
        assert_eq!(plain.resolve_tenant(None), Ok(None));
    }
}
