//! The apply thread of a node: applies every group's committed entries to its tenant's store,
//! in log order, and answers the callers waiting for them — off the node (raft) thread.
//!
//! What it is for: on the node that leads every group, the raft thread did raft work (step,
//! append, sync, send) *and* applied each entry to the store (parse and execute the memcached
//! command, keep its result): the one-leader layout was bound by that one serial thread. The
//! raft thread now decides, per committed entry, who waits for it (a proposal made here as
//! leader, a forwarded one, or nobody) and hands the entry over in order; this thread applies
//! it and completes the waiters. Raft-rs's applied index is "handed over" (the raft thread
//! calls `advance_apply` as before); the index this thread has really applied is published per
//! group ([`AppliedIndex::index`]) and is what `GroupStatus::applied_index` reports.
//!
//! What it is not for: entries that touch raft itself (membership changes, the preferred
//! leader, a new leader's empty entry) stay on the raft thread, which also answers every
//! caller whose entry was *not* applied (`Dropped`, `Timeout`, ...): those need no apply.
//!
//! Ordering rules that keep replies linearizable:
//! - Jobs run in the order the raft thread queued them (one FIFO for all groups), so a
//!   read barrier (`Job::Reply` queued once raft-rs's applied index reached the read's index)
//!   is answered only after every entry up to that index was applied here.
//! - Whatever reads or replaces the whole store on the raft thread (a snapshot for
//!   compaction, installing a leader's snapshot) first [`Applier::drain`]s: waits until this
//!   thread has applied everything queued, so the store is exactly at raft-rs's applied index.
//! - The queue is bounded ([`APPLY_BATCHES_MAX`] batches): a raft thread that commits faster
//!   than the store applies waits (back-pressure), it does not buffer without bound.
//!
//! Callbacks (`Done`) run on this thread; they must not block on the node (the server's hand a
//! result to a worker and wake it).

use crate::machine::{Applied, TenantMachine};
use crate::mutation::{Decoded, Mutation};
use crate::node::{Done, ProposeError};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Jobs (at most two per raft-thread turn, each the turn's entries of its groups) queued for
/// the apply thread before the raft thread waits.
pub const APPLY_BATCHES_MAX: usize = 256;

/// The index up to which a group's entries are applied to its store on this node.
#[derive(Clone, Debug, Default)]
pub struct AppliedIndex(Arc<AtomicU64>);

impl AppliedIndex {
    pub fn new(index: u64) -> AppliedIndex {
        AppliedIndex(Arc::new(AtomicU64::new(index)))
    }

    pub fn index(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    /// Set by the apply thread, or by the raft thread while the apply thread is drained.
    pub fn set(&self, index: u64) {
        self.0.store(index, Ordering::Release);
    }
}

/// One thing the apply thread does for a group, in order.
pub enum Item {
    /// A command entry: apply it, keep its result under `id`, hand the result to `waiters`.
    Entry { index: u64, data: bytes::Bytes, id: Option<u64>, waiters: Vec<Done> },
    /// An entry the raft thread handled itself (no store change): applied up to `index`.
    Mark(u64),
    /// A result decided on the raft thread that must not overtake the entries before it (a
    /// read barrier).
    Reply(Done, Result<Applied, ProposeError>),
}

enum Job {
    /// Groups' items, in order (one job per hand-over point of a raft-thread turn: one wake-up
    /// of this thread, not one per group).
    Batch(Vec<(u64, Vec<Item>)>),
    Drain(mpsc::Sender<()>),
}

/// The raft thread's handle on the apply thread; dropping it lets the thread finish what is
/// queued and joins it.
pub struct Applier {
    tx: Option<SyncSender<Job>>,
    thread: Option<JoinHandle<()>>,
}

/// What the apply thread knows of a group.
pub struct Target {
    pub machine: TenantMachine,
    pub applied: AppliedIndex,
}

impl Applier {
    pub fn start(node_id: u64, targets: HashMap<u64, Target>) -> std::io::Result<Applier> {
        let (tx, rx) = mpsc::sync_channel(APPLY_BATCHES_MAX);
        let thread =
            std::thread::Builder::new().name(format!("raft-apply-{node_id}")).spawn(move || run(rx, targets))?;
        Ok(Applier { tx: Some(tx), thread: Some(thread) })
    }

    /// Queue a group's items (waits while the queue is full).
    pub fn send(&self, group: u64, items: Vec<Item>) {
        if !items.is_empty() {
            self.send_groups(vec![(group, items)]);
        }
    }

    /// Queue several groups' items as one job (waits while the queue is full).
    pub fn send_groups(&self, batch: Vec<(u64, Vec<Item>)>) {
        if batch.is_empty() {
            return;
        }
        if let Some(tx) = &self.tx {
            // The thread only ends when this handle is dropped; a send error means it
            // panicked (in a caller's callback): the callers queued here are lost with it.
            let _ = tx.send(Job::Batch(batch));
        }
    }

    /// Wait until everything queued so far is applied.
    pub fn drain(&self) {
        let Some(tx) = &self.tx else { return };
        let (done_tx, done_rx) = mpsc::channel();
        if tx.send(Job::Drain(done_tx)).is_ok() {
            let _ = done_rx.recv();
        }
    }
}

impl Drop for Applier {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(rx: Receiver<Job>, targets: HashMap<u64, Target>) {
    while let Ok(job) = rx.recv() {
        match job {
            Job::Batch(batch) => {
                for (group, items) in batch {
                    if let Some(t) = targets.get(&group) {
                        apply_items(t, items);
                    }
                }
            }
            Job::Drain(done) => {
                let _ = done.send(());
            }
        }
    }
}

fn apply_items(t: &Target, items: Vec<Item>) {
    for item in items {
        match item {
            Item::Entry { index, data, id, waiters } => apply_entry(t, index, &data, id, waiters),
            Item::Mark(index) => t.applied.set(index),
            Item::Reply(done, r) => done(r),
        }
    }
}

/// Apply one command entry; its result is kept (for callers that learn it from a snapshot or
/// a retry) and handed to whoever waits here.
fn apply_entry(t: &Target, index: u64, data: &[u8], id: Option<u64>, mut waiters: Vec<Done>) {
    let result = match Mutation::decode_entry(data) {
        Ok(Decoded::Command(c)) => Ok(Applied::Command(t.machine.apply_command(index, c))),
        Ok(Decoded::Other(m)) => Ok(t.machine.apply(index, &m)),
        Err(_) => Err(ProposeError::Corrupt),
    };
    if let Some(id) = id {
        let outcome = |r: &Result<Applied, ProposeError>| match r {
            Ok(Applied::Command(o)) => Some(o.clone()),
            _ => None,
        };
        if waiters.is_empty() {
            // Nobody waits here for most entries (every follower's, and a restarted node's
            // re-applied log): the result moves into the kept results, no copy.
            let kept = match result {
                Ok(Applied::Command(o)) => Some(o),
                _ => None,
            };
            t.machine.remember(index, id, kept);
            t.applied.set(index);
            return;
        }
        t.machine.remember(index, id, outcome(&result));
    }
    // Published before anyone is answered: a caller that got its reply sees the entry applied.
    t.applied.set(index);
    let last = waiters.pop();
    for w in waiters {
        w(result.clone());
    }
    if let Some(w) = last {
        w(result);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use slipstream_store::{GetOpts, SetMode, Store, StoreConfig};

    fn set(key: &str) -> bytes::Bytes {
        let m = Mutation::Store {
            mode: SetMode::Set,
            key: key.into(),
            value: b"v".to_vec(),
            flags: 0,
            exptime: 0,
            cas: None,
            explicit_cas: None,
            invalidate: false,
            vivify_exptime: None,
            key_binary: false,
        };
        m.encode().into()
    }

    fn applier() -> (Applier, TenantMachine, AppliedIndex) {
        let machine = TenantMachine::new(Arc::new(Store::new(StoreConfig { shards: 4, ..StoreConfig::default() })));
        let applied = AppliedIndex::new(0);
        let targets = HashMap::from([(1, Target { machine: machine.clone(), applied: applied.clone() })]);
        (Applier::start(1, targets).expect("thread"), machine, applied)
    }

    fn has(m: &TenantMachine, key: &str) -> bool {
        m.store().get(key.as_bytes(), GetOpts::default(), |o| o.item.is_some())
    }

    /// What the read barrier relies on: a reply queued after entries runs once they are all
    /// applied (and the applied index says so); what compaction and snapshot install rely
    /// on: `drain` returns only once everything queued is applied.
    #[test]
    fn replies_follow_the_entries_queued_before_them_and_drain_waits_for_all() {
        const ENTRIES: u64 = 20_000;
        let (a, machine, applied) = applier();
        let (tx, rx) = mpsc::channel();
        let m2 = machine.clone();
        let seen = applied.clone();
        let entries: Vec<Item> = (1..=ENTRIES)
            .map(|i| Item::Entry { index: i, data: set(&format!("k{i}")), id: Some(i), waiters: Vec::new() })
            .collect();
        a.send(1, entries);
        let check: Done = Box::new(move |_| {
            let _ = tx.send((has(&m2, &format!("k{ENTRIES}")), seen.index()));
        });
        a.send(1, vec![Item::Reply(check, Ok(Applied::ReadBarrier))]);
        assert_eq!(rx.recv_timeout(std::time::Duration::from_secs(30)), Ok((true, ENTRIES)));
        let more: Vec<Item> = (ENTRIES + 1..=2 * ENTRIES)
            .map(|i| Item::Entry { index: i, data: set(&format!("k{i}")), id: None, waiters: Vec::new() })
            .chain(std::iter::once(Item::Mark(2 * ENTRIES + 1)))
            .collect();
        a.send(1, more);
        a.drain();
        assert_eq!(applied.index(), 2 * ENTRIES + 1);
        assert!(has(&machine, &format!("k{}", 2 * ENTRIES)));
    }

    /// A waiter gets its entry's result, the same result the kept results hold.
    #[test]
    fn a_waiter_hears_its_entrys_result_and_it_is_kept() {
        let (a, machine, _) = applier();
        let (tx, rx) = mpsc::channel();
        let done: Done = Box::new(move |r| {
            let _ = tx.send(r);
        });
        a.send(1, vec![Item::Entry { index: 7, data: set("w"), id: Some(42), waiters: vec![done] }]);
        let r = rx.recv_timeout(std::time::Duration::from_secs(10)).expect("answered");
        assert!(matches!(r, Ok(Applied::Store(_))), "{r:?}");
        a.drain();
        assert!(matches!(machine.recall(42), crate::machine::Recalled::Applied { index: 7, .. }));
    }
}
