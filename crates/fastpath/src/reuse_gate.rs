//! The grace period between freeing `ss_items` elements and inserting again.
//!
//! Since Linux 6.1 (commit 0fd7c5d43339) an element freed from a `BPF_F_NO_PREALLOC` hash map —
//! by a delete, or as the old element of an update — goes to a per-CPU free list and the next
//! insert takes it at once, without waiting for an RCU grace period. A program that looked the
//! element up before the free may still be copying it: it would send the new key's item under
//! the old key's request, or a mix of two items (seen once in a million reads in CI). So every
//! operation on the map goes through this gate: frees mark the gate, and the next insert first
//! waits until every CPU's reader count (`ss_readers`, mmapped; the program holds it above 0
//! from before its first lookup to after its last read of an item) has been seen at 0. A program
//! that held a freed element has then finished, and later ones cannot find it (it was unlinked
//! before the wait began). Only our own inserts reuse this map's elements (each hash map has its
//! own allocator), so nothing else can take a freed element before the wait.
//!
//! One lock orders frees and inserts: an insert on one thread must not overtake a free on
//! another whose grace period it has not waited for. A wait that readers do not let finish
//! within `GRACE_WAIT_NS_MAX` skips the insert (a fill is only an optimisation; the item is
//! then served by user space) and leaves the gate marked.
//!
//! Not for: what to fill or invalidate (the crate docs' coherence rules), or readers in user
//! space (bpf(2) lookups copy under the kernel's own protection).

use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::abi;
use crate::mapped::MappedArray;

/// Longest an insert waits for readers: a program runs for about a microsecond, so this is
/// hit only when a reader is preempted (BPF_PROG_TEST_RUN from a descheduled thread).
pub const GRACE_WAIT_NS_MAX: u64 = 500_000;

pub(crate) struct ReuseGate {
    readers: MappedArray<abi::Reader>,
    /// CPUs to wait for: the possible CPUs the program can count itself on.
    cpus: usize,
    /// true = an element was freed since the last completed grace period.
    freed: Mutex<bool>,
    graces: AtomicU64,
    skipped: AtomicU64,
}

/// How often the gate waited and gave up (cumulative).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GateCounters {
    /// Grace periods completed before an insert.
    pub graces: u64,
    /// Inserts skipped because readers did not drain within `GRACE_WAIT_NS_MAX`.
    pub skipped: u64,
}

impl ReuseGate {
    pub(crate) fn new(readers: MappedArray<abi::Reader>, cpus: usize) -> ReuseGate {
        let cpus = cpus.min(abi::READER_CPUS_MAX as usize);
        ReuseGate { readers, cpus, freed: Mutex::new(false), graces: AtomicU64::new(0), skipped: AtomicU64::new(0) }
    }

    /// Run `op`, which may free elements (a delete), under the gate.
    pub(crate) fn free<R>(&self, op: impl FnOnce() -> R) -> R {
        let mut freed = self.freed.lock().unwrap_or_else(PoisonError::into_inner);
        let r = op();
        // Orders the unlink (inside the syscall) before the next grace period's loads of the
        // reader counts, whichever thread runs it (the lock's release/acquire carries it on).
        fence(Ordering::SeqCst);
        *freed = true;
        r
    }

    /// Run `op`, which may insert (reusing a freed element) and says whether it also freed one
    /// (an update that replaced an element), once no reader can hold a freed element. None if
    /// readers did not drain in time (`op` was not run).
    pub(crate) fn insert<R>(&self, op: impl FnOnce() -> (R, bool)) -> Option<R> {
        let mut freed = self.freed.lock().unwrap_or_else(PoisonError::into_inner);
        if *freed {
            if !self.grace() {
                self.skipped.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            self.graces.fetch_add(1, Ordering::Relaxed);
            *freed = false;
        }
        let (r, freed_one) = op();
        if freed_one {
            fence(Ordering::SeqCst);
            *freed = true;
        }
        Some(r)
    }

    pub(crate) fn counters(&self) -> GateCounters {
        GateCounters { graces: self.graces.load(Ordering::Relaxed), skipped: self.skipped.load(Ordering::Relaxed) }
    }

    /// Wait until every CPU's reader count has been seen at 0 (true), or the time limit.
    fn grace(&self) -> bool {
        fence(Ordering::SeqCst);
        let deadline = Instant::now() + Duration::from_nanos(GRACE_WAIT_NS_MAX);
        for cpu in 0..self.cpus {
            let Some(r) = self.readers.get(cpu) else { continue };
            let mut spins = 0u32;
            while r.active.load(Ordering::Acquire) != 0 {
                spins = spins.wrapping_add(1);
                if spins % 64 == 0 && Instant::now() >= deadline {
                    return false;
                }
                std::hint::spin_loop();
            }
        }
        true
    }

    /// Tests only: pretend a program on `cpu` holds an item (`hold`), or let it go.
    pub(crate) fn simulate_reader(&self, cpu: usize, hold: bool) {
        if let Some(r) = self.readers.get(cpu) {
            if hold {
                r.active.fetch_add(1, Ordering::SeqCst);
            } else {
                r.active.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }
}
