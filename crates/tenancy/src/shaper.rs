//! The per-tenant shaper the serving loops consult, and the node-wide [`Shaper`] whose control
//! tick re-divides capacity and settles the kernel fast path's spending.
//!
//! How a serving loop uses a [`TenantShaper`] (once per read batch, not per request, so the
//! cost is a few atomic operations per batch):
//! 1. before reading from a tenant's socket: [`TenantShaper::ingress_budget`] (how much may be
//!    read); when it says wait, leave the bytes in the socket (TCP back-pressure) and come back
//!    after `wait_ns`;
//! 2. charge what was read: [`TenantShaper::charge_ingress`];
//! 3. before executing: [`TenantShaper::admit`] gives how many requests and reply bytes this
//!    batch may use; execute up to that, then [`TenantShaper::charge_egress`] with what the
//!    batch really produced and how many requests ran;
//! 4. when those replies have been handed to the socket: [`TenantShaper::complete`].
//!
//! A service that moves a tenant's bytes outside those loops, on its own port with a thread
//! per connection (the Spark shuffle service), uses the same buckets through
//! [`TenantShaper::transfer_wait_ns`] (before a transfer: wait while the direction's bucket is
//! in debt) and [`TenantShaper::charge_transfer`] (after it: what it really moved).
//!
//! Not for: I/O, timers or queues (the loops own those).

use crate::bucket::TokenBucket;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

/// What a batch may do now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    /// Execute at most `requests` requests producing about `reply_bytes` (the batch stops once
    /// its replies reach that; the last request may overshoot, repaid as debt).
    Go { requests: u32, reply_bytes: u64 },
    /// Nothing now; try again in `ns` (u64::MAX: only a control change can reopen it).
    Wait { ns: u64 },
}

/// Which of a tenant's buckets a transfer pays from: bytes coming into the node (`In`) or
/// going out of it (`Out`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    In,
    Out,
}

/// Counters kept by the shaper itself (ops and bytes are counted by the server's per-thread
/// stats, which are cheaper on the hot path).
#[derive(Debug, Default)]
pub struct ShaperCounters {
    /// Times a batch or read was held back for lack of tokens or outstanding slots.
    pub throttled: AtomicU64,
    /// UDP requests dropped because the tenant's queue was full.
    pub dropped: AtomicU64,
    /// Requests and bytes the kernel fast path answered for this tenant (settled each tick).
    pub kernel_requests: AtomicU64,
    pub kernel_bytes_in: AtomicU64,
    pub kernel_bytes_out: AtomicU64,
    /// Requests and bytes served on the tenant's own service ports outside the serving loops
    /// (its Thrift port: a thread per connection, so no per-thread stats there), added by that
    /// service once per reply write; the tenant's request and byte metrics include them.
    pub port_requests: AtomicU64,
    pub port_bytes_in: AtomicU64,
    pub port_bytes_out: AtomicU64,
}

/// One tenant's two buckets and in-flight bound.
#[derive(Debug)]
pub struct TenantShaper {
    pub ingress: TokenBucket,
    pub egress: TokenBucket,
    /// Rates from the tenant's share alone (work-conserving mode may raise the buckets' rates
    /// above these, never lower them below).
    base_ingress_bytes_per_s: AtomicU64,
    base_egress_bytes_per_s: AtomicU64,
    /// Weight for dividing spare capacity (the share).
    weight_ppm: AtomicU64,
    outstanding: AtomicU32,
    max_outstanding: AtomicU32,
    /// Set when the tenant was held back since the last control tick (it wants more).
    wanted_more: AtomicBool,
    pub counters: ShaperCounters,
}

impl TenantShaper {
    pub fn new(
        ingress_bytes_per_s: u64,
        egress_bytes_per_s: u64,
        burst_bytes: u64,
        max_outstanding: u32,
        weight: f64,
        now_ns: u64,
    ) -> TenantShaper {
        TenantShaper {
            ingress: TokenBucket::new(ingress_bytes_per_s, burst_bytes, now_ns),
            egress: TokenBucket::new(egress_bytes_per_s, burst_bytes, now_ns),
            base_ingress_bytes_per_s: AtomicU64::new(ingress_bytes_per_s),
            base_egress_bytes_per_s: AtomicU64::new(egress_bytes_per_s),
            weight_ppm: AtomicU64::new(weight_to_ppm(weight)),
            outstanding: AtomicU32::new(0),
            max_outstanding: AtomicU32::new(max_outstanding.max(1)),
            wanted_more: AtomicBool::new(false),
            counters: ShaperCounters::default(),
        }
    }

    /// Apply new allocations (admin edits). Buckets change within one refill grain.
    pub fn reconfigure(
        &self,
        ingress_bytes_per_s: u64,
        egress_bytes_per_s: u64,
        burst_bytes: u64,
        max_outstanding: u32,
        weight: f64,
    ) {
        self.base_ingress_bytes_per_s.store(ingress_bytes_per_s, Ordering::Relaxed);
        self.base_egress_bytes_per_s.store(egress_bytes_per_s, Ordering::Relaxed);
        self.weight_ppm.store(weight_to_ppm(weight), Ordering::Relaxed);
        self.max_outstanding.store(max_outstanding.max(1), Ordering::Relaxed);
        self.ingress.set(ingress_bytes_per_s, burst_bytes);
        self.egress.set(egress_bytes_per_s, burst_bytes);
    }

    pub fn base_rates(&self) -> (u64, u64) {
        (self.base_ingress_bytes_per_s.load(Ordering::Relaxed), self.base_egress_bytes_per_s.load(Ordering::Relaxed))
    }

    pub fn weight(&self) -> f64 {
        self.weight_ppm.load(Ordering::Relaxed) as f64 / 1e6
    }

    pub fn max_outstanding(&self) -> u32 {
        self.max_outstanding.load(Ordering::Relaxed)
    }

    pub fn outstanding(&self) -> u32 {
        self.outstanding.load(Ordering::Relaxed)
    }

    /// Whether a read may happen now; `Err(wait_ns)` when the ingress bucket is in debt.
    pub fn ingress_open(&self, now_ns: u64) -> Result<(), u64> {
        self.ingress_budget(now_ns).map(|_| ())
    }

    /// How many bytes a read may take now (`Ok`, > 0), or how long to wait (`Err`). One refill
    /// and one balance read, for the per-batch path.
    pub fn ingress_budget(&self, now_ns: u64) -> Result<u64, u64> {
        let t = self.ingress.available(now_ns);
        if t > 0 {
            return Ok(t as u64);
        }
        self.held_back();
        Err(self.ingress.wait_ns(now_ns).max(1))
    }

    pub fn charge_ingress(&self, bytes: u64) {
        self.ingress.charge(bytes);
    }

    /// How much the next batch may execute.
    pub fn admit(&self, now_ns: u64) -> Admit {
        let out = self.outstanding.load(Ordering::Acquire);
        let max = self.max_outstanding.load(Ordering::Relaxed);
        if out >= max {
            self.held_back();
            // Slots free when some connection's replies are written; poll again soon.
            return Admit::Wait { ns: crate::bucket::REFILL_GRAIN_NS * 5 };
        }
        let tokens = self.egress.available(now_ns);
        if tokens <= 0 {
            self.held_back();
            // Never 0: a caller told to wait must come back later, not drop the work.
            return Admit::Wait { ns: self.egress.wait_ns(now_ns).max(1) };
        }
        Admit::Go { requests: max - out, reply_bytes: tokens as u64 }
    }

    /// A batch ran `requests` requests producing `reply_bytes`; they count as outstanding until
    /// [`TenantShaper::complete`].
    pub fn charge_egress(&self, requests: u32, reply_bytes: u64) {
        self.egress.charge(reply_bytes);
        if requests > 0 {
            self.outstanding.fetch_add(requests, Ordering::AcqRel);
        }
    }

    /// Replies of `requests` requests were handed to the socket (or their connection closed).
    pub fn complete(&self, requests: u32) {
        if requests > 0 {
            let _ = self
                .outstanding
                .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |o| Some(o.saturating_sub(requests)));
        }
    }

    /// For a service outside the serving loops: 0 when a transfer in direction `dir` may start
    /// now (the bucket is positive; the transfer is charged after with what it really moved,
    /// as a batch is), else how long to wait. A wait counts as held back, like a loop's, so
    /// work-conserving mode lends the tenant spare capacity.
    pub fn transfer_wait_ns(&self, dir: Direction, now_ns: u64) -> u64 {
        let bucket = self.bucket(dir);
        if bucket.available(now_ns) > 0 {
            return 0;
        }
        self.held_back();
        bucket.wait_ns(now_ns).max(1)
    }

    /// Charge a transfer of `bytes` in direction `dir` (may run into debt).
    pub fn charge_transfer(&self, dir: Direction, bytes: u64) {
        self.bucket(dir).charge(bytes);
    }

    fn bucket(&self, dir: Direction) -> &TokenBucket {
        match dir {
            Direction::In => &self.ingress,
            Direction::Out => &self.egress,
        }
    }

    /// A UDP request dropped (queue full).
    pub fn dropped(&self) {
        self.counters.dropped.fetch_add(1, Ordering::Relaxed);
    }

    fn held_back(&self) {
        self.counters.throttled.fetch_add(1, Ordering::Relaxed);
        self.wanted_more.store(true, Ordering::Relaxed);
    }

    /// Read and clear the "held back since the last tick" flag (control tick only).
    pub fn take_wanted_more(&self) -> bool {
        self.wanted_more.swap(false, Ordering::AcqRel)
    }
}

fn weight_to_ppm(w: f64) -> u64 {
    if w.is_finite() && w > 0.0 {
        (w * 1e6).round().min(1e12) as u64
    } else {
        0
    }
}

/// The kernel fast path's side of a tenant's buckets. XDP cannot take from the user-space
/// buckets directly, so each control tick settles: what XDP spent since the last tick is charged
/// to the tenant's buckets, and XDP gets a fresh allowance equal to the tenant's positive
/// balance. XDP answers only while its allowance lasts and passes the request up otherwise (then
/// user space shapes it). So every kernel answer is paid from the same buckets.
pub trait KernelLedger: Send + Sync {
    /// Requests, request bytes and reply bytes XDP answered for `slot` since the last call.
    fn take_spent(&self, slot: u32) -> (u64, u64, u64);
    /// What XDP may spend for `slot` until the next tick.
    fn set_allowance(&self, slot: u32, ingress_bytes: u64, egress_bytes: u64);
}

/// One registered tenant as the control tick sees it.
#[derive(Clone)]
pub struct Member {
    pub shaper: Arc<TenantShaper>,
    /// Slot in the kernel fast path's tenant table, if the tenant is served there.
    pub kernel_slot: Option<u32>,
}

/// Node-wide shaping: the node's capacities, the mode, and every tenant's shaper.
pub struct Shaper {
    capacity_ingress_bytes_per_s: AtomicU64,
    capacity_egress_bytes_per_s: AtomicU64,
    work_conserving: AtomicBool,
    members: Mutex<Vec<Member>>,
    /// Usage snapshot from the previous tick, per member, for rate measurement.
    last: Mutex<TickState>,
}

#[derive(Default)]
struct TickState {
    /// When the previous tick ran (every `Usage::charged` below was read then).
    at_ns: u64,
    /// Keyed by the shaper's address. Members come and go between ticks, so order cannot be
    /// the key; the `Weak` in each entry keeps the allocation (not the shaper) alive, so a new
    /// shaper can never reuse a remembered address and inherit someone else's totals.
    usage: HashMap<usize, Usage>,
}

struct Usage {
    _pins_address: Weak<TenantShaper>,
    /// `charged_bytes_total()` of the (ingress, egress) buckets at the previous tick.
    charged: [u64; 2],
    /// Smoothed bytes/s actually used per direction; None until one full tick was measured.
    bytes_per_s: [Option<f64>; 2],
}

/// Weight of the newest tick in the usage average. One tick (10 ms) can hold a whole burst,
/// which read raw looks like a rate far above the tenant's share; averaging with the previous
/// estimate halves such a spike while still following a real change within a few ticks.
/// A tenant that wakes up is not slowed by this: it runs out of tokens, is held back, and
/// then counts at its full base rate at once, whatever its average says.
const USAGE_EMA_WEIGHT: f64 = 0.5;
/// A tenant using more than its base rate by this fraction is taking spare capacity: it keeps
/// competing for spare even in a tick where it was not held back. Without this a tenant whose
/// demand lies between its base and its raised rate would flip every tick between the two
/// (raised -> not held back -> base -> held back -> raised ...), getting about the mean.
const OVER_BASE_TOLERANCE: f64 = 0.02;

/// How often the control thread should call [`Shaper::tick`]; also the "one refill period"
/// within which admin changes are in force.
pub const TICK_NS: u64 = 10_000_000;

impl Shaper {
    pub fn new(capacity_ingress_bytes_per_s: u64, capacity_egress_bytes_per_s: u64, work_conserving: bool) -> Shaper {
        Shaper {
            capacity_ingress_bytes_per_s: AtomicU64::new(capacity_ingress_bytes_per_s),
            capacity_egress_bytes_per_s: AtomicU64::new(capacity_egress_bytes_per_s),
            work_conserving: AtomicBool::new(work_conserving),
            members: Mutex::new(Vec::new()),
            last: Mutex::new(TickState::default()),
        }
    }

    pub fn capacities(&self) -> (u64, u64) {
        (
            self.capacity_ingress_bytes_per_s.load(Ordering::Relaxed),
            self.capacity_egress_bytes_per_s.load(Ordering::Relaxed),
        )
    }

    pub fn work_conserving(&self) -> bool {
        self.work_conserving.load(Ordering::Relaxed)
    }

    pub fn set_work_conserving(&self, on: bool) {
        self.work_conserving.store(on, Ordering::Relaxed);
    }

    pub fn add(&self, member: Member) {
        self.members.lock().unwrap_or_else(PoisonError::into_inner).push(member);
    }

    /// Forget a tenant's shaper (by identity).
    pub fn remove(&self, shaper: &Arc<TenantShaper>) {
        self.members.lock().unwrap_or_else(PoisonError::into_inner).retain(|m| !Arc::ptr_eq(&m.shaper, shaper));
    }

    /// The control tick (call every [`TICK_NS`] from one thread): settle kernel spending, then,
    /// in work-conserving mode, re-divide capacity (see the module doc); otherwise make sure every
    /// bucket runs at its base rate.
    ///
    /// Work-conserving division, per direction (Pisces-like weighted sharing): a member is
    /// *wanting* if it was held back since the last tick (or is already using more than its
    /// base rate, see [`OVER_BASE_TOLERANCE`]). Others keep their base rate and are counted at
    /// what they used (at most their base). Wanting members are counted at their base, and
    /// what is left of the capacity, the spare, is split between them by weight:
    /// `rate = base + spare * weight / sum of wanting weights`. No rate goes below base, and the
    /// rates add up to at most the capacity (rounded down) whenever the bases do.
    pub fn tick(&self, now_ns: u64, kernel: Option<&dyn KernelLedger>) {
        // A copy, so admin edits are not blocked behind kernel map syscalls.
        let members: Vec<Member> = self.members.lock().unwrap_or_else(PoisonError::into_inner).clone();
        if let Some(ledger) = kernel {
            for m in &members {
                if let Some(slot) = m.kernel_slot {
                    settle_kernel(&m.shaper, slot, ledger, now_ns);
                }
            }
        }
        // Read (and clear) every flag each tick, also in fixed mode, so a stale flag does not
        // count once work-conserving mode is switched on.
        let wanted: Vec<bool> = members.iter().map(|m| m.shaper.take_wanted_more()).collect();

        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        let usage = measure(&mut last, &members, now_ns);

        if !self.work_conserving() {
            for m in &members {
                let (bi, be) = m.shaper.base_rates();
                m.shaper.ingress.set_rate(bi);
                m.shaper.egress.set_rate(be);
            }
            return;
        }
        let (cap_in, cap_out) = self.capacities();
        for (dir, cap) in [(0usize, cap_in), (1, cap_out)] {
            let claims: Vec<Claim> = members
                .iter()
                .zip(&usage)
                .zip(&wanted)
                .map(|((m, u), &held_back)| {
                    let (bi, be) = m.shaper.base_rates();
                    let (base, used) = if dir == 0 { (bi, u[0]) } else { (be, u[1]) };
                    Claim { base, used, held_back, weight: m.shaper.weight() }
                })
                .collect();
            let rates = divide(cap, &claims);
            for (m, rate) in members.iter().zip(rates) {
                bucket_of(&m.shaper, dir).set_rate(rate);
            }
        }
    }
}

fn bucket_of(s: &TenantShaper, dir: usize) -> &TokenBucket {
    if dir == 0 {
        &s.ingress
    } else {
        &s.egress
    }
}

/// Charge what XDP spent for `slot` to the tenant's buckets, then hand XDP the positive
/// balance as its allowance until the next tick.
fn settle_kernel(s: &TenantShaper, slot: u32, ledger: &dyn KernelLedger, now_ns: u64) {
    let (requests, bytes_in, bytes_out) = ledger.take_spent(slot);
    s.ingress.charge(bytes_in);
    s.egress.charge(bytes_out);
    s.counters.kernel_requests.fetch_add(requests, Ordering::Relaxed);
    s.counters.kernel_bytes_in.fetch_add(bytes_in, Ordering::Relaxed);
    s.counters.kernel_bytes_out.fetch_add(bytes_out, Ordering::Relaxed);
    let ingress = s.ingress.available(now_ns).max(0) as u64;
    let egress = s.egress.available(now_ns).max(0) as u64;
    ledger.set_allowance(slot, ingress, egress);
}

/// Each member's smoothed (ingress, egress) usage in bytes/s since the previous tick; None for
/// a member not seen at the previous tick. Updates `state` for the next tick and forgets
/// removed members.
fn measure(state: &mut TickState, members: &[Member], now_ns: u64) -> Vec<[Option<f64>; 2]> {
    let elapsed_ns = now_ns.saturating_sub(state.at_ns);
    let mut old = std::mem::take(&mut state.usage);
    let mut out = Vec::with_capacity(members.len());
    for m in members {
        let key = Arc::as_ptr(&m.shaper) as usize;
        let charged = [m.shaper.ingress.charged_bytes_total(), m.shaper.egress.charged_bytes_total()];
        let entry = match old.remove(&key) {
            // A tick at the same instant (or a clock step back) measures nothing: keep all.
            Some(prev) if elapsed_ns == 0 => prev,
            Some(prev) => {
                let mut bytes_per_s = prev.bytes_per_s;
                for ((est, &now_total), &then_total) in bytes_per_s.iter_mut().zip(&charged).zip(&prev.charged) {
                    let delta = now_total.saturating_sub(then_total) as f64;
                    let now_rate = delta * 1e9 / elapsed_ns as f64;
                    *est = Some(match *est {
                        None => now_rate,
                        Some(e) => e + USAGE_EMA_WEIGHT * (now_rate - e),
                    });
                }
                Usage { _pins_address: prev._pins_address, charged, bytes_per_s }
            }
            None => Usage { _pins_address: Arc::downgrade(&m.shaper), charged, bytes_per_s: [None; 2] },
        };
        out.push(entry.bytes_per_s);
        state.usage.insert(key, entry);
    }
    if elapsed_ns > 0 {
        state.at_ns = now_ns;
    }
    out
}

/// One member in one direction, as [`divide`] sees it.
struct Claim {
    base: u64,
    /// Measured bytes/s; None (not measured yet) counts as the member's base: until measured,
    /// assume it may use all of its own share.
    used: Option<f64>,
    held_back: bool,
    weight: f64,
}

/// One direction's rates, in member order (see [`Shaper::tick`]).
fn divide(capacity: u64, claims: &[Claim]) -> Vec<u64> {
    let wanting: Vec<bool> = claims
        .iter()
        .map(|c| {
            let base = c.base as f64;
            c.held_back || c.used.unwrap_or(base) > base * (1.0 + OVER_BASE_TOLERANCE)
        })
        .collect();
    let mut spare = capacity as f64;
    let mut weight_sum = 0.0;
    let mut n_wanting = 0usize;
    for (c, &w) in claims.iter().zip(&wanting) {
        let base = c.base as f64;
        if w {
            spare -= base;
            weight_sum += c.weight;
            n_wanting += 1;
        } else {
            spare -= c.used.unwrap_or(base).clamp(0.0, base);
        }
    }
    let spare = spare.max(0.0);
    claims
        .iter()
        .zip(&wanting)
        .map(|(c, &w)| {
            if !w || spare <= 0.0 {
                return c.base;
            }
            // Weightless members (a weight of 0 cannot come from a valid spec) split evenly.
            let fraction = if weight_sum > 0.0 { c.weight / weight_sum } else { 1.0 / n_wanting as f64 };
            // Rounded down so the rates never add up to more than the capacity.
            let extra = (spare * fraction).floor();
            c.base.saturating_add(extra as u64)
        })
        .collect()
}
