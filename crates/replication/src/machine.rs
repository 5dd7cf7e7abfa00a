//! The replicated state machine of one tenant: committed log entries applied to the tenant's
//! [`Store`], identically on every replica, and the store's contents as a Raft snapshot.
//!
//! Not for: deciding what is committed (Raft) or building mutations (the server).
//!
//! Determinism: replicas apply the same entries in the same order to stores that started
//! equal, so the results agree as long as every input is in the entry. The CAS is: before
//! applying the entry at log index `i` the store's CAS counter is raised to `i - 1`, so the
//! item written gets CAS `i` (the position the leader assigned when it appended the entry;
//! unique and growing across leaders). A snapshot carries the counter too. Exptimes arrive
//! absolute (see [`crate::mutation`]).
//!
//! Known gaps (see docs/replication.md): an apply reads the replica's own clock for lazy
//! expiry (two replicas whose clocks straddle an item's expiry second can disagree on an
//! `add` at that second); a delayed `flush_all` still pending is not carried by a snapshot.
//!
//! Memory: a replicated tenant's store has deterministic memory
//! (`Store::set_deterministic_memory`): full, it refuses writes (`NoMemory`, the client's
//! `SERVER_ERROR out of memory storing object`) instead of evicting by its own LRU order, and
//! fullness counts expired items freed at local moments until a sweep at an entry's time
//! (`sweep_if_full`), so every replica refuses the same writes.

use crate::mutation::{CommandRef, DecodeError, Mutation};
use slipstream_store::{
    ArithOpts, ArithResult, DeleteOpts, DeleteResult, ItemDecodeError, ItemExport, Store, StoreOpts, StoreResult,
    ITEM_BYTES_MIN,
};
use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

/// Snapshot data version written (1: no memory figures, 2: no recent results; both still
/// read).
const SNAPSHOT_VERSION: u8 = 3;

/// Results of the last this many applied proposals are kept (and carried by snapshots), so a
/// replica that receives a proposal's entry inside a snapshot still answers its caller (a
/// follower's forwarded write). At ~30 bytes each: ~2 MiB per group at most.
pub const RECENT_RESULTS_MAX: usize = 65_536;

/// What applying one mutation did (what the client's reply is built from).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Applied {
    Store(StoreResult),
    Delete(DeleteResult),
    Arith(ArithResult),
    /// touch: whether the key existed.
    Touch(bool),
    FlushAll,
    /// A command entry: what the executor answered.
    Command(CommandOutcome),
    /// A read barrier (ReadIndex) is satisfied: this replica has applied everything committed
    /// when the read was asked for; a local read now is linearizable.
    ReadBarrier,
}

/// What running one command entry produced: the reply bytes for the client, and how many
/// bytes of the client's input still belong to the request (the data block of a refused
/// storage command that the connection must swallow, as memcached's `conn_swallow`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CommandOutcome {
    pub reply: Vec<u8>,
    pub swallow_bytes: u64,
}

/// Runs a command entry against a tenant's store (the server's executor; this crate does not
/// parse protocols). Must be deterministic given the store's contents, the CAS counter, the
/// request bytes and `now_unix_s` (the proposer's clock, standing for "now" in relative
/// exptimes).
pub trait CommandExec: Send + Sync {
    fn execute(&self, store: &Arc<Store>, protocol: u8, now_unix_s: i64, request: &[u8]) -> CommandOutcome;
}

/// One tenant's store as a replicated state machine.
#[derive(Clone)]
pub struct TenantMachine {
    store: Arc<Store>,
    exec: Option<Arc<dyn CommandExec>>,
    /// The entry time (proposer's Unix second) of the last sweep of dead items (see
    /// `sweep_if_full`); part of the replicated state, carried by snapshots.
    last_sweep_s: Arc<AtomicI64>,
    recent: Arc<Mutex<Recent>>,
}

/// The results of the last [`RECENT_RESULTS_MAX`] applied entries that carried a proposal id,
/// in apply order: (id, index, outcome). `from_index`: every such entry at this index or later
/// is here (u64::MAX: none yet). A ring, not a map: every apply adds one (a push, no hashing:
/// an id map per entry cost ~17% of the in-process replicated writes/s); the map is built
/// only when a snapshot is installed ([`TenantMachine::recall_all`]).
#[derive(Debug)]
struct Recent {
    from_index: u64,
    ring: VecDeque<(u64, u64, Option<CommandOutcome>)>,
}

impl Default for Recent {
    fn default() -> Recent {
        Recent { from_index: 1, ring: VecDeque::new() }
    }
}

/// The kept results by proposal id (see [`TenantMachine::recall_all`]).
#[derive(Debug)]
pub struct Recall {
    from_index: u64,
    by_id: HashMap<u64, (u64, Option<CommandOutcome>)>,
}

impl Recall {
    /// Whether the entry of proposal `id` was applied (with its result), as far as the kept
    /// results tell.
    pub fn get(&self, id: u64) -> Recalled {
        match self.by_id.get(&id) {
            Some((index, outcome)) => Recalled::Applied { index: *index, outcome: outcome.clone() },
            None => Recalled::NotSince { from_index: self.from_index },
        }
    }
}

/// What this replica knows of a proposal id's entry (see [`TenantMachine::recall`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Recalled {
    /// Applied at `index`; `outcome` is its command result (None: not a command entry, whose
    /// result is not kept).
    Applied { index: u64, outcome: Option<CommandOutcome> },
    /// Not among the entries applied at `from_index` or later (it was not applied there).
    NotSince { from_index: u64 },
}

impl std::fmt::Debug for TenantMachine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantMachine").field("exec", &self.exec.is_some()).finish_non_exhaustive()
    }
}

impl TenantMachine {
    pub fn new(store: Arc<Store>) -> TenantMachine {
        TenantMachine::with_exec(store, None)
    }

    /// A machine that can apply command entries with `exec`.
    pub fn with_exec(store: Arc<Store>, exec: Option<Arc<dyn CommandExec>>) -> TenantMachine {
        TenantMachine {
            store,
            exec,
            last_sweep_s: Arc::new(AtomicI64::new(0)),
            recent: Arc::new(Mutex::new(Recent::default())),
        }
    }

    fn recent(&self) -> std::sync::MutexGuard<'_, Recent> {
        self.recent.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Keep the result of the entry applied at `index` that carried proposal `id` (the oldest
    /// kept one goes past [`RECENT_RESULTS_MAX`]).
    pub fn remember(&self, index: u64, id: u64, outcome: Option<CommandOutcome>) {
        let mut r = self.recent();
        if r.from_index == u64::MAX {
            r.from_index = index;
        }
        r.ring.push_back((id, index, outcome));
        if r.ring.len() > RECENT_RESULTS_MAX {
            if let Some((_, i, _)) = r.ring.pop_front() {
                r.from_index = r.from_index.max(i + 1);
            }
        }
    }

    /// The kept results by id (built now: O(kept); for a snapshot install, not per entry).
    pub fn recall_all(&self) -> Recall {
        let r = self.recent();
        let by_id = r.ring.iter().map(|(id, index, outcome)| (*id, (*index, outcome.clone()))).collect();
        Recall { from_index: r.from_index, by_id }
    }

    /// [`TenantMachine::recall_all`] for one id.
    pub fn recall(&self, id: u64) -> Recalled {
        self.recall_all().get(id)
    }

    /// A store with deterministic memory (a replicated tenant's) that is within one item of
    /// full frees what expired by this entry's time, at most once per entry second: the same
    /// decision on every replica (it depends only on the log), so they refuse the same writes.
    fn sweep_if_full(&self, entry_unix_s: i64) {
        let s = &*self.store;
        if !s.deterministic_memory() || entry_unix_s <= self.last_sweep_s.load(Ordering::Relaxed) {
            return;
        }
        if s.memory_used_deterministic().saturating_add(s.config().item_bytes_max) < s.memory_bytes_max() {
            return;
        }
        s.sweep_dead(entry_unix_s);
        self.last_sweep_s.store(entry_unix_s, Ordering::Relaxed);
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// Apply the mutation committed at log `index`.
    pub fn apply(&self, index: u64, m: &Mutation) -> Applied {
        let s = &*self.store;
        s.set_cas_last(s.cas_last().max(index.saturating_sub(1)));
        match m {
            Mutation::Store {
                mode,
                key,
                value,
                flags,
                exptime,
                cas,
                explicit_cas,
                invalidate,
                vivify_exptime,
                key_binary,
            } => {
                let opts = StoreOpts {
                    cas: *cas,
                    explicit_cas: *explicit_cas,
                    invalidate: *invalidate,
                    vivify_exptime: *vivify_exptime,
                    key_binary: *key_binary,
                };
                let r = s.store(*mode, key, value, *flags, *exptime, opts);
                if matches!(r, StoreResult::TooLarge | StoreResult::NoMemory) {
                    // memcached unlinks the old item after a failed store (see Store::unlink).
                    s.unlink(key);
                }
                Applied::Store(r)
            }
            Mutation::Delete { key, cas, invalidate, invalidate_exptime } => Applied::Delete(s.delete(
                key,
                DeleteOpts { cas: *cas, invalidate: *invalidate, invalidate_exptime: *invalidate_exptime },
            )),
            Mutation::Arith { key, incr, delta, vivify, cas, touch_exptime } => Applied::Arith(s.arith(
                key,
                *incr,
                *delta,
                ArithOpts { vivify: *vivify, cas: *cas, touch_exptime: *touch_exptime, ..ArithOpts::default() },
            )),
            Mutation::Touch { key, exptime } => Applied::Touch(s.touch(key, *exptime)),
            Mutation::FlushAll { delay } => {
                s.flush_all(*delay);
                Applied::FlushAll
            }
            Mutation::Command { protocol, now_unix_s, request } => {
                Applied::Command(self.run_command(CommandRef { protocol: *protocol, now_unix_s: *now_unix_s, request }))
            }
        }
    }

    /// Apply the command entry at `index` (what [`TenantMachine::apply`] does with a
    /// [`Mutation::Command`], from the entry's bytes without copying the request).
    pub fn apply_command(&self, index: u64, c: CommandRef<'_>) -> CommandOutcome {
        let s = &*self.store;
        s.set_cas_last(s.cas_last().max(index.saturating_sub(1)));
        self.run_command(c)
    }

    fn run_command(&self, c: CommandRef<'_>) -> CommandOutcome {
        match &self.exec {
            Some(x) => {
                if self.store.deterministic_memory() {
                    self.sweep_if_full(c.now_unix_s);
                }
                x.execute(&self.store, c.protocol, c.now_unix_s, c.request)
            }
            // Every replica of a serving node has an executor; a bare machine (tests,
            // tools) answers the same on every replica.
            None => CommandOutcome { reply: b"SERVER_ERROR no executor\r\n".to_vec(), swallow_bytes: 0 },
        }
    }

    /// The store's contents as snapshot data: `version: u8`, `cas_last: u64`,
    /// `memory_used_deterministic: u64`, `last_sweep_s: i64`, `count: u64`,
    /// then per item key (`u8` len), value (`u32` len), `flags: u32`, `cas: u64`,
    /// `exptime_unix_s: i64`, `bits: u8` (1 stale, 2 base64 key); then the recent results:
    /// `from_index: u64`, `count: u32`, per result `index: u64`, `id: u64`, `kind: u8` (0 no
    /// outcome kept, 1 command) and for a command `swallow_bytes: u64`, reply (`u32` len).
    /// Integers little-endian.
    pub fn snapshot_data(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.snapshot_data_into(&mut out);
        out
    }

    /// [`TenantMachine::snapshot_data`] written into `out` (cleared first), so a compaction
    /// can reuse the previous snapshot's buffer: the items are encoded once, straight into
    /// it (the count is patched in after them), with no second buffer to grow and copy.
    pub fn snapshot_data_into(&self, out: &mut Vec<u8>) {
        out.clear();
        out.push(SNAPSHOT_VERSION);
        out.extend_from_slice(&self.store.cas_last().to_le_bytes());
        out.extend_from_slice(&(self.store.memory_used_deterministic() as u64).to_le_bytes());
        out.extend_from_slice(&self.last_sweep_s.load(Ordering::Relaxed).to_le_bytes());
        let count_at = out.len();
        out.extend_from_slice(&0u64.to_le_bytes());
        let mut count = 0u64;
        self.store.export(|i| {
            count += 1;
            i.encode(out);
        });
        out[count_at..count_at + 8].copy_from_slice(&count.to_le_bytes());
        let r = self.recent();
        out.extend_from_slice(&r.from_index.to_le_bytes());
        out.extend_from_slice(&(r.ring.len() as u32).to_le_bytes());
        for (id, index, outcome) in &r.ring {
            out.extend_from_slice(&index.to_le_bytes());
            out.extend_from_slice(&id.to_le_bytes());
            match outcome {
                None => out.push(0),
                Some(o) => {
                    out.push(1);
                    out.extend_from_slice(&o.swallow_bytes.to_le_bytes());
                    out.extend_from_slice(&(o.reply.len() as u32).to_le_bytes());
                    out.extend_from_slice(&o.reply);
                }
            }
        }
    }

    /// Replace the store's contents with snapshot `data` (empty data = empty store). The data
    /// is checked whole before the store is touched.
    pub fn restore(&self, data: &[u8]) -> Result<(), DecodeError> {
        let snap = if data.is_empty() { Snap::default() } else { parse_snapshot(data)? };
        self.store.clear();
        for it in &snap.items {
            // An item that no longer fits (the tenant's memory was lowered) is skipped.
            let _ = self.store.import(it);
        }
        self.store.set_cas_last(snap.cas_last);
        // The source's count of used + dead bytes, so this replica refuses what it refuses.
        if let Some(m) = snap.memory_used {
            self.store.set_memory_used_deterministic(usize::try_from(m).unwrap_or(usize::MAX));
        }
        self.last_sweep_s.store(snap.last_sweep_s, Ordering::Relaxed);
        *self.recent() = snap.recent;
        Ok(())
    }

    /// An order-independent hash of the visible contents (key, value, flags, CAS, absolute
    /// expiry, stale mark): equal on replicas that applied the same entries.
    pub fn content_hash(&self) -> u64 {
        let mut sum = 0u64;
        let mut n = 0u64;
        self.store.export(|i| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            (i.key, i.value, i.flags, i.cas, i.exptime_unix_s, i.stale).hash(&mut h);
            sum = sum.wrapping_add(h.finish());
            n += 1;
        });
        sum ^ n.rotate_left(32)
    }
}

/// Snapshot data, parsed.
#[derive(Default)]
struct Snap<'a> {
    cas_last: u64,
    /// None in version 1 data.
    memory_used: Option<u64>,
    last_sweep_s: i64,
    items: Vec<ItemExport<'a>>,
    /// Version 3; before it nothing is known (from_index u64::MAX: the next applied entry
    /// starts the record).
    recent: Recent,
}

fn parse_snapshot(data: &[u8]) -> Result<Snap<'_>, DecodeError> {
    let at = std::cell::Cell::new(0usize);
    let take = |n: usize| -> Result<&[u8], DecodeError> {
        let end = at.get().checked_add(n).filter(|&e| e <= data.len()).ok_or(DecodeError::Truncated)?;
        let s = &data[at.get()..end];
        at.set(end);
        Ok(s)
    };
    let u64_of = |b: &[u8]| {
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        u64::from_le_bytes(a)
    };
    let v = take(1)?[0];
    if !(1..=SNAPSHOT_VERSION).contains(&v) {
        return Err(DecodeError::UnknownVersion(v));
    }
    let cas_last = u64_of(take(8)?);
    let (memory_used, last_sweep_s) =
        if v >= 2 { (Some(u64_of(take(8)?)), u64_of(take(8)?) as i64) } else { (None, 0) };
    let count = u64_of(take(8)?);
    // A count beyond what the data could hold is corrupt, not an allocation to make.
    let mut items = Vec::with_capacity((count as usize).min(data.len() / ITEM_BYTES_MIN));
    for _ in 0..count {
        let (item, used) = ItemExport::decode(&data[at.get()..]).map_err(|e| match e {
            ItemDecodeError::Truncated => DecodeError::Truncated,
            ItemDecodeError::KeyTooLong(n) => DecodeError::KeyTooLong(n),
        })?;
        at.set(at.get() + used);
        items.push(item);
    }
    let mut recent = Recent { from_index: u64::MAX, ..Recent::default() };
    if v >= 3 {
        recent.from_index = u64_of(take(8)?);
        let mut l4 = [0u8; 4];
        l4.copy_from_slice(take(4)?);
        let n = u32::from_le_bytes(l4) as usize;
        if n > RECENT_RESULTS_MAX {
            return Err(DecodeError::Truncated);
        }
        for _ in 0..n {
            let index = u64_of(take(8)?);
            let id = u64_of(take(8)?);
            let outcome = match take(1)?[0] {
                0 => None,
                _ => {
                    let swallow_bytes = u64_of(take(8)?);
                    l4.copy_from_slice(take(4)?);
                    let reply = take(u32::from_le_bytes(l4) as usize)?.to_vec();
                    Some(CommandOutcome { reply, swallow_bytes })
                }
            };
            recent.ring.push_back((id, index, outcome));
        }
    }
    if at.get() != data.len() {
        return Err(DecodeError::TrailingBytes(data.len() - at.get()));
    }
    Ok(Snap { cas_last, memory_used, last_sweep_s, items, recent })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mutation::absolute_exptime;
    use slipstream_store::{Clock, GetOpts, SetMode, StoreConfig, StoreOpts};

    fn machine(started_unix_s: i64) -> TenantMachine {
        TenantMachine::new(Arc::new(Store::with_clock(StoreConfig::default(), Clock::manual(started_unix_s))))
    }

    fn set(key: &str, value: &str, exptime: i64) -> Mutation {
        Mutation::Store {
            mode: SetMode::Set,
            key: key.into(),
            value: value.into(),
            flags: 0,
            exptime,
            cas: None,
            explicit_cas: None,
            invalidate: false,
            vivify_exptime: None,
            key_binary: false,
        }
    }

    fn value(m: &TenantMachine, key: &str) -> Option<(String, u64)> {
        m.store().get(key.as_bytes(), GetOpts::default(), |o| {
            o.item.map(|i| (String::from_utf8_lossy(i.value).into_owned(), i.cas))
        })
    }

    /// The same entries on replicas whose clocks started at different moments give the same
    /// contents, CAS values (from the log index) and absolute expiry.
    #[test]
    fn replicas_applying_the_same_log_agree() {
        let leader_now = 1_700_000_000;
        let log: Vec<(u64, Mutation)> = vec![
            (3, set("a", "1", absolute_exptime(100, leader_now))),
            (4, set("b", "x", 0)),
            (
                6,
                Mutation::Arith {
                    key: "a".into(),
                    incr: true,
                    delta: 41,
                    vivify: None,
                    cas: None,
                    touch_exptime: None,
                },
            ),
            (
                7,
                Mutation::Store {
                    mode: SetMode::Append,
                    key: "b".into(),
                    value: "y".into(),
                    flags: 0,
                    exptime: 0,
                    cas: None,
                    explicit_cas: None,
                    invalidate: false,
                    vivify_exptime: None,
                    key_binary: false,
                },
            ),
            (8, Mutation::Delete { key: "zz".into(), cas: None, invalidate: false, invalidate_exptime: None }),
            (9, Mutation::Touch { key: "b".into(), exptime: absolute_exptime(50, leader_now) }),
        ];
        let r1 = machine(leader_now - 10);
        let r2 = machine(leader_now - 1000);
        // Same wall time now, different process start (relative clocks differ by 990 s).
        r2.store().clock().advance(990);
        let mut results = Vec::new();
        for (i, m) in &log {
            let a = r1.apply(*i, m);
            assert_eq!(a, r2.apply(*i, m));
            results.push(a);
        }
        assert_eq!(results[0], Applied::Store(StoreResult::Stored(3)));
        assert!(matches!(results[2], Applied::Arith(ArithResult::Ok { value: 42, cas: 6, .. })));
        assert_eq!(results[4], Applied::Delete(DeleteResult::NotFound));
        assert_eq!(value(&r1, "b"), Some(("xy".into(), 7)));
        assert_eq!(r1.content_hash(), r2.content_hash());
        assert_ne!(r1.content_hash(), machine(0).content_hash());
    }

    #[test]
    fn snapshot_restore_reproduces_contents_and_cas_counter() {
        let a = machine(1_700_000_000);
        a.apply(1, &set("k", "v", 0));
        a.apply(2, &set("e", "w", 1_700_000_500));
        a.apply(5, &Mutation::Delete { key: "k".into(), cas: None, invalidate: true, invalidate_exptime: None });
        let b = machine(1_700_000_300);
        b.apply(1, &set("junk", "j", 0));
        b.restore(&a.snapshot_data()).unwrap();
        assert_eq!(a.content_hash(), b.content_hash());
        assert_eq!(value(&b, "junk"), None);
        // The next entry gets the same CAS on both.
        assert_eq!(a.apply(9, &set("n", "1", 0)), b.apply(9, &set("n", "1", 0)));
        assert_eq!(a.content_hash(), b.content_hash());
        // Corrupt data is refused and leaves the store alone.
        let mut bad = a.snapshot_data();
        bad.truncate(bad.len() - 3);
        assert!(b.restore(&bad).is_err());
        assert_eq!(a.content_hash(), b.content_hash());
        b.restore(&[]).unwrap();
        assert_eq!(b.store().stats().curr_items, 0);
    }

    /// A compaction reuses the previous snapshot's buffer: whatever it held is replaced, and
    /// the bytes are those of a fresh snapshot (the patched-in count included).
    #[test]
    fn snapshot_into_a_used_buffer_equals_a_fresh_snapshot() {
        let a = machine(1_700_000_000);
        a.apply(1, &set("k", "v", 0));
        a.apply(2, &set("e", "w", 0));
        a.remember(2, 77, None);
        let mut buf = vec![0xAB; 4096];
        a.snapshot_data_into(&mut buf);
        assert_eq!(buf, a.snapshot_data());
        let b = machine(1_700_000_000);
        b.restore(&buf).unwrap();
        assert_eq!(a.content_hash(), b.content_hash());
        assert_eq!(b.store().stats().curr_items, 2);
    }

    #[test]
    fn snapshots_carry_the_results_of_recent_proposals() {
        let a = machine(1_700_000_000);
        let out = |r: &str| CommandOutcome { reply: r.as_bytes().to_vec(), swallow_bytes: 3 };
        a.remember(4, 77, Some(out("STORED\r\n")));
        a.remember(6, 78, None);
        let b = machine(1_700_000_000);
        assert_eq!(b.recall(77), Recalled::NotSince { from_index: 1 });
        b.restore(&a.snapshot_data()).unwrap();
        assert_eq!(b.recall(77), Recalled::Applied { index: 4, outcome: Some(out("STORED\r\n")) });
        assert_eq!(b.recall(78), Recalled::Applied { index: 6, outcome: None });
        assert_eq!(b.recall(79), Recalled::NotSince { from_index: 1 });
        // Bounded: the oldest go, and with them what "not applied since" can claim.
        for i in 0..RECENT_RESULTS_MAX as u64 {
            a.remember(10 + i, 1000 + i, None);
        }
        assert_eq!(a.recall(77), Recalled::NotSince { from_index: 7 });
        assert!(matches!(a.recall(1000), Recalled::Applied { index: 10, .. }));
        // Version-2 data (no results) still restores; nothing is known until the next entry.
        let mut v2 = machine(1_700_000_000).snapshot_data();
        v2[0] = 2;
        v2.truncate(v2.len() - 12);
        b.restore(&v2).unwrap();
        assert_eq!(b.recall(77), Recalled::NotSince { from_index: u64::MAX });
        b.remember(20, 5, None);
        assert_eq!(b.recall(6), Recalled::NotSince { from_index: 20 });
    }
    /// A command executor for tests: the request is `key`, stored with a 3000-byte value and
    /// a 10-second TTL if the key starts with `e` (relative to the entry's time).
    struct FillExec;

    impl CommandExec for FillExec {
        fn execute(&self, store: &Arc<Store>, _protocol: u8, now_unix_s: i64, request: &[u8]) -> CommandOutcome {
            let exptime = if request.first() == Some(&b'e') { now_unix_s + 10 } else { 0 };
            let r = slipstream_store::with_proposer_now(now_unix_s, || {
                store.store(SetMode::Set, request, &[b'v'; 3000], 0, exptime, StoreOpts::default())
            });
            let reply = if matches!(r, StoreResult::NoMemory) { b"OOM".to_vec() } else { b"OK".to_vec() };
            CommandOutcome { reply, swallow_bytes: 0 }
        }
    }

    fn small(started_unix_s: i64, deterministic: bool) -> TenantMachine {
        let c = StoreConfig { memory_bytes_max: 64 * 1024, item_bytes_max: 8 * 1024, shards: 1, ..Default::default() };
        let store = Arc::new(Store::with_clock(c, Clock::manual(started_unix_s)));
        store.set_deterministic_memory(deterministic);
        if !deterministic {
            store.set_evict_to_free(false); // memcached -M: refuses, but frees what it meets
        }
        TenantMachine::with_exec(store, Some(Arc::new(FillExec)))
    }

    fn cmd(key: &str, now_unix_s: i64) -> Mutation {
        Mutation::Command { protocol: 1, now_unix_s, request: key.as_bytes().to_vec() }
    }

    /// Full replicated tenants refuse the same writes on every replica, although one replica
    /// freed expired items at its own moments (a local read met them); a later entry sweeps
    /// what expired by its time on all of them alike. Plain `-M` stores diverge here.
    #[test]
    fn full_replicas_refuse_the_same_writes() {
        let t0 = 1_700_000_000;
        for deterministic in [true, false] {
            let (a, b) = (small(t0, deterministic), small(t0 - 500, deterministic));
            b.store().clock().advance(500);
            let mut index = 0;
            let mut step = |m: &Mutation, a: &TenantMachine, b: &TenantMachine| {
                index += 1;
                (a.apply(index, m), b.apply(index, m))
            };
            // Three items that expire at t0 + 2, then live ones until both refuse.
            for k in ["e1", "e2", "e3"] {
                step(&cmd(k, t0), &a, &b);
            }
            let mut refused = false;
            for i in 0..40 {
                let (x, y) = step(&cmd(&format!("k{i}"), t0), &a, &b);
                assert_eq!(x, y);
                if x == Applied::Command(CommandOutcome { reply: b"OOM".to_vec(), swallow_bytes: 0 }) {
                    refused = true;
                    break;
                }
            }
            assert!(refused, "never full");
            // Replica a's clients read the soon-expiring items (its LRU order now differs).
            for k in ["e1", "e2", "e3"] {
                let bump = GetOpts { bump: true, ..GetOpts::default() };
                assert!(a.store().get(k.as_bytes(), bump, |o| o.item.is_some()));
            }
            // Time passes; only replica b meets the expired items (a local read).
            a.store().clock().advance(15);
            b.store().clock().advance(15);
            for k in ["e1", "e2", "e3"] {
                assert!(b.store().get(k.as_bytes(), GetOpts::default(), |o| o.item.is_none()));
            }
            // Same second as the fill: no sweep yet; then a later entry second sweeps.
            let mut diverged = false;
            let mut stored_after_sweep = 0;
            for (i, when) in [t0, t0, t0 + 15, t0 + 15, t0 + 15, t0 + 15].into_iter().enumerate() {
                let (x, y) = step(&cmd(&format!("n{i}"), when), &a, &b);
                diverged |= x != y;
                let ok = Applied::Command(CommandOutcome { reply: b"OK".to_vec(), swallow_bytes: 0 });
                stored_after_sweep += usize::from(when > t0 && x == ok);
            }
            if deterministic {
                assert!(!diverged);
                // The sweep at t0 + 15 freed the three expired items on both: three fit again.
                assert_eq!(stored_after_sweep, 3);
                assert_eq!(a.content_hash(), b.content_hash());
                assert_eq!(a.store().memory_used_deterministic(), b.store().memory_used_deterministic());
                // A replica restored from a's snapshot refuses what a refuses.
                let c = small(t0, true);
                c.store().clock().advance(15);
                c.restore(&a.snapshot_data()).unwrap();
                for i in 0..4 {
                    let m = cmd(&format!("z{i}"), t0 + 15);
                    assert_eq!(a.apply(100 + i, &m), c.apply(100 + i, &m));
                }
                assert_eq!(a.content_hash(), c.content_hash());
                assert_eq!(a.store().stats().evictions, 0);
            } else {
                assert!(diverged, "a plain -M store was expected to diverge here");
            }
        }
    }
}
