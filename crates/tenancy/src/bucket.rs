//! A token bucket shared by the serving threads without a lock.
//!
//! Tokens are bytes. They may go negative: a batch is admitted while the balance is positive and
//! charged what it really used afterwards, so one reply larger than the balance leaves a debt the
//! tenant repays (by waiting) before its next batch. That keeps the long-run rate exact without
//! knowing a reply's size before it is built.
//!
//! Not for: deciding shares (the control tick sets `rate`), or waiting (the caller asks
//! [`TokenBucket::wait_ns`] and schedules itself).

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

/// Refills happen at most this often per bucket; between them callers only read atomics.
pub const REFILL_GRAIN_NS: u64 = 20_000;
/// Deepest debt a bucket records; a bigger charge is clipped (keeps arithmetic far from overflow).
pub const DEBT_BYTES_MAX: i64 = 1 << 40;
/// Highest rate a bucket accepts (1 TB/s): keeps `dt * rate` inside u128 comfortably and rejects typos.
pub const RATE_BYTES_PER_S_MAX: u64 = 1 << 40;

#[derive(Debug)]
pub struct TokenBucket {
    tokens: AtomicI64,
    /// Time up to which refill has been credited.
    credited_ns: AtomicU64,
    rate_bytes_per_s: AtomicU64,
    burst_bytes: AtomicU64,
    /// Everything ever charged (for the control tick's usage measurement).
    charged_bytes_total: AtomicU64,
}

impl TokenBucket {
    /// A full bucket.
    pub fn new(rate_bytes_per_s: u64, burst_bytes: u64, now_ns: u64) -> TokenBucket {
        let burst = burst_bytes.min(DEBT_BYTES_MAX as u64);
        TokenBucket {
            tokens: AtomicI64::new(burst as i64),
            credited_ns: AtomicU64::new(now_ns),
            rate_bytes_per_s: AtomicU64::new(rate_bytes_per_s.min(RATE_BYTES_PER_S_MAX)),
            burst_bytes: AtomicU64::new(burst),
            charged_bytes_total: AtomicU64::new(0),
        }
    }

    /// Change rate and burst; takes effect at the next refill (within [`REFILL_GRAIN_NS`]).
    /// Tokens above a lowered burst are dropped.
    pub fn set(&self, rate_bytes_per_s: u64, burst_bytes: u64) {
        let burst = burst_bytes.min(DEBT_BYTES_MAX as u64);
        self.rate_bytes_per_s.store(rate_bytes_per_s.min(RATE_BYTES_PER_S_MAX), Ordering::Relaxed);
        self.burst_bytes.store(burst, Ordering::Relaxed);
        let _ = self.tokens.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |t| Some(t.min(burst as i64)));
    }

    pub fn set_rate(&self, rate_bytes_per_s: u64) {
        self.rate_bytes_per_s.store(rate_bytes_per_s.min(RATE_BYTES_PER_S_MAX), Ordering::Relaxed);
    }

    pub fn rate_bytes_per_s(&self) -> u64 {
        self.rate_bytes_per_s.load(Ordering::Relaxed)
    }

    pub fn burst_bytes(&self) -> u64 {
        self.burst_bytes.load(Ordering::Relaxed)
    }

    pub fn charged_bytes_total(&self) -> u64 {
        self.charged_bytes_total.load(Ordering::Relaxed)
    }

    /// Credit the time since the last refill. Only one thread wins the credit for a stretch of
    /// time (compare-and-swap on `credited_ns`), so no time is credited twice. The credited time
    /// advances only by whole bytes' worth, so rounding never loses tokens.
    fn refill(&self, now_ns: u64) {
        let from = self.credited_ns.load(Ordering::Acquire);
        if now_ns < from.saturating_add(REFILL_GRAIN_NS) {
            return;
        }
        let rate = self.rate_bytes_per_s.load(Ordering::Relaxed);
        let burst = self.burst_bytes.load(Ordering::Relaxed) as i64;
        let dt = (now_ns - from) as u128;
        let add = dt * rate as u128 / 1_000_000_000;
        // Time those whole bytes stand for; at rate 0 nothing is owed, so all time is used up.
        let used_ns = if rate == 0 { dt } else { add * 1_000_000_000 / rate as u128 };
        // Idle for a long time: no need to credit more than a burst (avoids huge numbers).
        let (add, to) = if add > burst as u128 + DEBT_BYTES_MAX as u128 {
            ((burst + DEBT_BYTES_MAX) as u128, now_ns)
        } else {
            (add, from + used_ns as u64)
        };
        if self.credited_ns.compare_exchange(from, to, Ordering::AcqRel, Ordering::Relaxed).is_err() {
            return; // another thread credited this stretch
        }
        let add = add as i64;
        let _ =
            self.tokens.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |t| Some(t.saturating_add(add).min(burst)));
    }

    /// Balance after refilling to `now_ns` (may be negative: debt).
    pub fn available(&self, now_ns: u64) -> i64 {
        self.refill(now_ns);
        self.tokens.load(Ordering::Acquire)
    }

    /// Take `bytes` (may run into debt).
    pub fn charge(&self, bytes: u64) {
        if bytes == 0 {
            return;
        }
        let b = bytes.min(DEBT_BYTES_MAX as u64) as i64;
        let _ = self
            .tokens
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |t| Some(t.saturating_sub(b).max(-DEBT_BYTES_MAX)));
        self.charged_bytes_total.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Nanoseconds until the balance is positive again (0 if it is now). At rate 0 a bucket in
    /// debt never refills; callers get `u64::MAX` and should wait for a rate change.
    pub fn wait_ns(&self, now_ns: u64) -> u64 {
        let t = self.available(now_ns);
        if t > 0 {
            return 0;
        }
        let rate = self.rate_bytes_per_s.load(Ordering::Relaxed);
        if rate == 0 {
            return u64::MAX;
        }
        let owed = (1 - t) as u128;
        let ns = owed * 1_000_000_000 / rate as u128 + 1;
        (ns as u64).max(REFILL_GRAIN_NS)
    }
}
