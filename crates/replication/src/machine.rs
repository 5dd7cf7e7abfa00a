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
//! `add` at that second); eviction when a replicated tenant is full is per replica;
//! a delayed `flush_all` still pending is not carried by a snapshot.

use crate::mutation::{DecodeError, Mutation};
use slipstream_proto::rules::KEY_BYTES_MAX;
use slipstream_store::{ArithOpts, ArithResult, DeleteOpts, DeleteResult, ItemExport, Store, StoreOpts, StoreResult};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

const SNAPSHOT_VERSION: u8 = 1;

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
}

impl std::fmt::Debug for TenantMachine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantMachine").field("exec", &self.exec.is_some()).finish_non_exhaustive()
    }
}

impl TenantMachine {
    pub fn new(store: Arc<Store>) -> TenantMachine {
        TenantMachine { store, exec: None }
    }

    /// A machine that can apply command entries with `exec`.
    pub fn with_exec(store: Arc<Store>, exec: Option<Arc<dyn CommandExec>>) -> TenantMachine {
        TenantMachine { store, exec }
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
                ArithOpts { vivify: *vivify, cas: *cas, touch_exptime: *touch_exptime },
            )),
            Mutation::Touch { key, exptime } => Applied::Touch(s.touch(key, *exptime)),
            Mutation::FlushAll { delay } => {
                s.flush_all(*delay);
                Applied::FlushAll
            }
            Mutation::Command { protocol, now_unix_s, request } => Applied::Command(match &self.exec {
                Some(x) => x.execute(&self.store, *protocol, *now_unix_s, request),
                // Every replica of a serving node has an executor; a bare machine (tests,
                // tools) answers the same on every replica.
                None => CommandOutcome { reply: b"SERVER_ERROR no executor\r\n".to_vec(), swallow_bytes: 0 },
            }),
        }
    }

    /// The store's contents as snapshot data: `version: u8`, `cas_last: u64`, `count: u64`,
    /// then per item key (`u8` len), value (`u32` len), `flags: u32`, `cas: u64`,
    /// `exptime_unix_s: i64`, `bits: u8` (1 stale, 2 base64 key). Integers little-endian.
    pub fn snapshot_data(&self) -> Vec<u8> {
        let mut body = Vec::new();
        let mut count = 0u64;
        self.store.export(|i| {
            count += 1;
            body.push(i.key.len() as u8);
            body.extend_from_slice(i.key);
            body.extend_from_slice(&(i.value.len() as u32).to_le_bytes());
            body.extend_from_slice(i.value);
            body.extend_from_slice(&i.flags.to_le_bytes());
            body.extend_from_slice(&i.cas.to_le_bytes());
            body.extend_from_slice(&i.exptime_unix_s.to_le_bytes());
            body.push(u8::from(i.stale) | (u8::from(i.key_binary) << 1));
        });
        let mut out = Vec::with_capacity(body.len() + 17);
        out.push(SNAPSHOT_VERSION);
        out.extend_from_slice(&self.store.cas_last().to_le_bytes());
        out.extend_from_slice(&count.to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    /// Replace the store's contents with snapshot `data` (empty data = empty store). The data
    /// is checked whole before the store is touched.
    pub fn restore(&self, data: &[u8]) -> Result<(), DecodeError> {
        let (cas_last, items) = if data.is_empty() { (0, Vec::new()) } else { parse_snapshot(data)? };
        self.store.clear();
        for it in &items {
            // An item that no longer fits (the tenant's memory was lowered) is skipped; the
            // memory policy for full replicated tenants is an open item (docs/replication.md).
            let _ = self.store.import(it);
        }
        self.store.set_cas_last(cas_last);
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

fn parse_snapshot(data: &[u8]) -> Result<(u64, Vec<ItemExport<'_>>), DecodeError> {
    let mut at = 0usize;
    let mut take = |n: usize| -> Result<&[u8], DecodeError> {
        let end = at.checked_add(n).filter(|&e| e <= data.len()).ok_or(DecodeError::Truncated)?;
        let s = &data[at..end];
        at = end;
        Ok(s)
    };
    let u64_of = |b: &[u8]| {
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        u64::from_le_bytes(a)
    };
    let v = take(1)?[0];
    if v != SNAPSHOT_VERSION {
        return Err(DecodeError::UnknownVersion(v));
    }
    let cas_last = u64_of(take(8)?);
    let count = u64_of(take(8)?);
    // Each item takes at least 26 bytes: a count beyond that is corrupt, not an allocation.
    let mut items = Vec::with_capacity((count as usize).min(data.len() / 26));
    for _ in 0..count {
        let kl = take(1)?[0] as usize;
        if kl > KEY_BYTES_MAX {
            return Err(DecodeError::KeyTooLong(kl));
        }
        let key = take(kl)?;
        let mut l4 = [0u8; 4];
        l4.copy_from_slice(take(4)?);
        let value = take(u32::from_le_bytes(l4) as usize)?;
        l4.copy_from_slice(take(4)?);
        let flags = u32::from_le_bytes(l4);
        let cas = u64_of(take(8)?);
        let exptime_unix_s = u64_of(take(8)?) as i64;
        let bits = take(1)?[0];
        items.push(ItemExport {
            key,
            value,
            flags,
            cas,
            exptime_unix_s,
            stale: bits & 1 != 0,
            key_binary: bits & 2 != 0,
        });
    }
    if at != data.len() {
        return Err(DecodeError::TrailingBytes(data.len() - at));
    }
    Ok((cas_last, items))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mutation::absolute_exptime;
    use slipstream_store::{Clock, GetOpts, SetMode, StoreConfig};

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
}
