//! The kernel fast path wired into the server: attaches `slipstream-fastpath`'s XDP program and
//! installs it in the store as its [`KernelCache`] observer, so the store's shard locks order
//! every fill against every write (see the store's crate doc and the fastpath crate doc for
//! the argument). Also the source of the `fastpath_*` counters for `stats` and /metrics.
//!
//! Not for: deciding what is cached (the store offers items on ordinary reads) or packet
//! handling (the XDP program).
//!
//! The guarantee, as documented in README and the fastpath crate: *a GET answered by the
//! kernel never returns a value older than the newest write acknowledged by the server.*
//!
//! Failure policy: an invalidation the kernel refuses would break that guarantee, so the
//! first failure turns the kernel side off for good (the program is told to pass every packet
//! up, then all entries are flushed) and says so on stderr; the server keeps serving from user
//! space. Fill failures only mean "not cached".
//!
//! Tenants: [`KernelFastPath::attach`] + [`KernelFastPath::install`] is the single-tenant fast
//! path (slot 0, unshaped). With tenants, [`KernelFastPath::attach_multi`], then per tenant
//! [`KernelFastPath::add_tenant`] (its slot and UDP port) and `store.set_kernel_cache(fp.observer(slot))`
//! on that tenant's store: the observer fills, invalidates and flushes only that slot's keys,
//! which the program serves only on that slot's port. Shaped tenants are paid for through
//! [`KernelLedger`]: the control tick takes what XDP spent and sets the next allowance.

use crate::stats::{FastPathSource, FastPathTotals};
use slipstream_fastpath::{clock_monotonic_ns, AttachMode, FastPath, FastPathConfig, FastPathError, Filled};
use slipstream_store::{KernelCache, KernelFill, Store};
use slipstream_tenancy::KernelLedger;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Instant;

pub use slipstream_fastpath::{FastPathError as Error, TenantCounters, ENTRIES_MAX_LIMIT};

/// Most tenant slots the kernel fast path serves (slots are 0..TENANTS_MAX).
pub const TENANTS_MAX: u32 = slipstream_fastpath::abi::TENANTS_MAX;

// The kernel answers only what the daemon would: its key limit (bpf/slipstream_kv.h) must be
// memcached's, as user space applies it (slipstream_proto::rules).
const _: () = assert!(slipstream_fastpath::abi::KEY_BYTES_MAX == slipstream_proto::rules::KEY_BYTES_MAX);

/// The attached fast path, shared by the store (as its observer) and the daemon (to detach on
/// exit). The `RwLock` is only write-locked once, by [`KernelFastPath::shutdown`]; its read lock
/// is taken only on calls that make a bpf(2) syscall anyway.
pub struct KernelFastPath {
    fp: RwLock<Option<FastPath>>,
    /// Set after a failed invalidation turned the kernel side off.
    broken: AtomicBool,
    iface: String,
    mode: AttachMode,
}

impl KernelFastPath {
    /// Load and attach on `iface` for memcached UDP port `udp_port`, caching at most
    /// `entries_max` items.
    pub fn attach(iface: &str, udp_port: u16, entries_max: u32) -> Result<Arc<KernelFastPath>, FastPathError> {
        Self::wrap(FastPath::attach(iface, FastPathConfig { udp_port, entries_max })?, iface)
    }

    /// Load and attach on `iface` serving no tenant yet (add them with
    /// [`KernelFastPath::add_tenant`]); at most `entries_max` items over all tenants.
    pub fn attach_multi(iface: &str, entries_max: u32) -> Result<Arc<KernelFastPath>, FastPathError> {
        Self::wrap(FastPath::attach_multi(iface, entries_max)?, iface)
    }

    fn wrap(fp: FastPath, iface: &str) -> Result<Arc<KernelFastPath>, FastPathError> {
        let mode = fp.mode().clone();
        Ok(Arc::new(KernelFastPath {
            fp: RwLock::new(Some(fp)),
            broken: AtomicBool::new(false),
            iface: iface.to_string(),
            mode,
        }))
    }

    /// Native or generic, and why.
    pub fn mode(&self) -> &AttachMode {
        &self.mode
    }

    pub fn iface(&self) -> &str {
        &self.iface
    }

    /// Make `store` keep the kernel cache coherent (call before serving; the kernel cache
    /// starts empty). False if the store already had an observer. Single-tenant: slot 0.
    pub fn install(self: &Arc<Self>, store: &Store) -> bool {
        store.set_kernel_cache(self.clone())
    }

    /// Serve the tenant in `slot` (0..[`TENANTS_MAX`]) on `udp_port`. A `shaped` tenant's
    /// requests go to user space until the first [`KernelLedger::set_allowance`]. Then install
    /// [`KernelFastPath::observer`]`(slot)` on the tenant's store before serving it.
    pub fn add_tenant(&self, slot: u32, udp_port: u16, shaped: bool) -> Result<(), FastPathError> {
        self.with_fp(|fp| fp.kernel().add_tenant(slot, udp_port, shaped))
    }

    /// Stop serving the tenant in `slot`: its port passes to user space from now on and its
    /// kernel entries are flushed. Other tenants are untouched.
    pub fn remove_tenant(&self, slot: u32) -> Result<(), FastPathError> {
        self.with_fp(|fp| fp.kernel().remove_tenant(slot))
    }

    /// The kernel cache observer for the tenant in `slot`, to install on that tenant's store
    /// (`store.set_kernel_cache(..)`): fill, invalidate and flush_all act on that slot only.
    pub fn observer(self: &Arc<Self>, slot: u32) -> Arc<dyn KernelCache> {
        Arc::new(SlotObserver { fp: self.clone(), slot })
    }

    /// The counters of the tenant in `slot` (zeros after shutdown or for a bad slot).
    pub fn tenant_totals(&self, slot: u32) -> TenantCounters {
        let g = self.fp.read().unwrap_or_else(PoisonError::into_inner);
        g.as_ref().and_then(|fp| fp.kernel().tenant_counters(slot).ok()).unwrap_or_default()
    }

    /// Requests, request bytes and reply bytes XDP answered for the shaped tenant in `slot`
    /// since the last call (see [`KernelLedger::take_spent`]).
    pub fn take_spent(&self, slot: u32) -> (u64, u64, u64) {
        let g = self.fp.read().unwrap_or_else(PoisonError::into_inner);
        g.as_ref().map_or((0, 0, 0), |fp| fp.kernel().take_spent(slot))
    }

    /// What XDP may spend for the shaped tenant in `slot` until the next call.
    pub fn set_allowance(&self, slot: u32, ingress_bytes: u64, egress_bytes: u64) {
        let g = self.fp.read().unwrap_or_else(PoisonError::into_inner);
        if let Some(fp) = g.as_ref() {
            fp.kernel().set_allowance(slot, ingress_bytes, egress_bytes);
        }
    }

    fn with_fp(&self, f: impl FnOnce(&FastPath) -> Result<(), FastPathError>) -> Result<(), FastPathError> {
        let g = self.fp.read().unwrap_or_else(PoisonError::into_inner);
        match g.as_ref() {
            Some(fp) => f(fp),
            None => Err(FastPathError::BadConfig { detail: "the kernel fast path was shut down".into() }),
        }
    }

    /// Counter source for `ServerInfo::fastpath`.
    pub fn source(self: &Arc<Self>) -> FastPathSource {
        let me = self.clone();
        FastPathSource(Arc::new(move || Some(me.totals())))
    }

    /// Current counters (zeros after shutdown).
    pub fn totals(&self) -> FastPathTotals {
        let g = self.fp.read().unwrap_or_else(PoisonError::into_inner);
        match g.as_ref().map(FastPath::counters) {
            Some(Ok(c)) => FastPathTotals {
                hits: c.fastpath_hits,
                misses: c.fastpath_misses,
                invalidations: c.fastpath_invalidations,
                fill_graces: c.fastpath_fill_graces,
                fills_deferred: c.fastpath_fills_deferred,
            },
            _ => FastPathTotals::default(),
        }
    }

    /// Detach the program and free the maps now (idempotent). Afterwards fills are skipped and
    /// invalidations are no-ops: nothing in the kernel can answer any more.
    pub fn shutdown(&self) {
        let fp = self.fp.write().unwrap_or_else(PoisonError::into_inner).take();
        drop(fp);
    }

    /// Whether the program is attached and answering.
    pub fn active(&self) -> bool {
        !self.broken.load(Ordering::SeqCst) && self.fp.read().map(|g| g.is_some()).unwrap_or(false)
    }

    fn fill_slot(
        &self,
        slot: u32,
        key: &[u8],
        flags: u32,
        cas: u64,
        value: &[u8],
        expires_at: Option<Instant>,
    ) -> KernelFill {
        if self.broken.load(Ordering::Relaxed) {
            return KernelFill::Skipped;
        }
        let expiry_ns = match expires_at {
            None => 0,
            Some(d) => match monotonic_ns_of(d) {
                Some(ns) => ns,
                None => return KernelFill::Skipped,
            },
        };
        let g = self.fp.read().unwrap_or_else(PoisonError::into_inner);
        let Some(fp) = g.as_ref() else { return KernelFill::Skipped };
        match fp.kernel().fill_slot(slot, key, flags, cas, value, expiry_ns) {
            Ok(Filled::Cached) => KernelFill::Cached,
            Ok(Filled::NotCacheable(_)) => KernelFill::NotCacheable,
            Ok(Filled::MapFull | Filled::Deferred) | Err(_) => KernelFill::Skipped,
        }
    }

    fn invalidate_slot(&self, slot: u32, key: &[u8]) {
        let g = self.fp.read().unwrap_or_else(PoisonError::into_inner);
        let Some(fp) = g.as_ref() else { return };
        if let Err(e) = fp.kernel().invalidate_slot(slot, key) {
            self.give_up(fp, &e);
        }
    }

    fn flush_slot(&self, slot: u32) {
        let g = self.fp.read().unwrap_or_else(PoisonError::into_inner);
        let Some(fp) = g.as_ref() else { return };
        if let Err(e) = fp.kernel().flush_slot(slot) {
            self.give_up(fp, &e);
        }
    }

    /// An invalidation or flush failed: stop the kernel answering before anything else.
    fn give_up(&self, fp: &FastPath, e: &FastPathError) {
        if self.broken.swap(true, Ordering::SeqCst) {
            return;
        }
        let disabled = fp.kernel().disable();
        let flushed = fp.flush_all();
        eprintln!(
            "slipstream: kernel fast path turned off: {e} (disable: {}, flush: {}); serving from user space",
            disabled.map(|_| "ok".to_string()).unwrap_or_else(|e| e.to_string()),
            flushed.map(|_| "ok".to_string()).unwrap_or_else(|e| e.to_string()),
        );
    }
}

/// Absolute CLOCK_MONOTONIC ns for `deadline`, rounded down, or None if it has passed.
/// `Instant` reads CLOCK_MONOTONIC on Linux, the clock `bpf_ktime_get_ns` reads; the monotonic
/// clock is read *before* `Instant::now()`, so `mono + (deadline - now)` is never later than
/// the deadline itself.
fn monotonic_ns_of(deadline: Instant) -> Option<u64> {
    let mono = clock_monotonic_ns();
    let now = Instant::now();
    let left = deadline.checked_duration_since(now)?;
    if left.is_zero() || mono == 0 {
        return None;
    }
    Some(mono.saturating_add(u64::try_from(left.as_nanos()).unwrap_or(u64::MAX)))
}

/// The single-tenant observer: slot 0.
impl KernelCache for KernelFastPath {
    fn fill(&self, key: &[u8], flags: u32, cas: u64, value: &[u8], expires_at: Option<Instant>) -> KernelFill {
        self.fill_slot(0, key, flags, cas, value, expires_at)
    }

    fn invalidate(&self, key: &[u8]) {
        self.invalidate_slot(0, key)
    }

    fn flush_all(&self) {
        self.flush_slot(0)
    }
}

/// One tenant's view of the kernel cache (see [`KernelFastPath::observer`]).
struct SlotObserver {
    fp: Arc<KernelFastPath>,
    slot: u32,
}

impl KernelCache for SlotObserver {
    fn fill(&self, key: &[u8], flags: u32, cas: u64, value: &[u8], expires_at: Option<Instant>) -> KernelFill {
        self.fp.fill_slot(self.slot, key, flags, cas, value, expires_at)
    }

    fn invalidate(&self, key: &[u8]) {
        self.fp.invalidate_slot(self.slot, key)
    }

    fn flush_all(&self) {
        self.fp.flush_slot(self.slot)
    }
}

/// XDP answers for shaped tenants are paid from the tenant's buckets: see the tenancy crate's
/// `KernelLedger` and `struct ss_tenant` in bpf/slipstream_kv.h.
impl KernelLedger for KernelFastPath {
    fn take_spent(&self, slot: u32) -> (u64, u64, u64) {
        KernelFastPath::take_spent(self, slot)
    }

    fn set_allowance(&self, slot: u32, ingress_bytes: u64, egress_bytes: u64) {
        KernelFastPath::set_allowance(self, slot, ingress_bytes, egress_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_round_down_and_past_ones_are_refused() {
        let d = Instant::now() + std::time::Duration::from_millis(500);
        let before = clock_monotonic_ns();
        let ns = monotonic_ns_of(d).expect("future deadline");
        let after = clock_monotonic_ns();
        // Within the 500 ms window, and not past the deadline as read around the call.
        assert!(ns > before && ns <= after + 500_000_000, "{before} {ns} {after}");
        let past = Instant::now().checked_sub(std::time::Duration::from_millis(1)).expect("uptime above 1 ms");
        assert_eq!(monotonic_ns_of(past), None);
    }
}
