//! Store clock: seconds since the store started ("relative time", as memcached keeps it), plus
//! the Unix time of the start, so absolute exptimes can be converted.
//!
//! Not for: wall-clock formatting or timers. A manual clock lets tests move time without sleeping;
//! memcached-debug's `debugtime` (shift, pause, resume) moves any clock, for memcached's own
//! test suite (the server allows it only under `-o relaxed_privileges`).
//!
//! The system clock is read on every store operation, so it is cached like memcached's
//! `current_time`: a small ticker thread refreshes an atomic at each whole-second boundary
//! (reading `Instant` costs ~60 ns here; an atomic load ~1 ns). The thread holds only a weak
//! reference and exits within a second of the last `Clock` clone being dropped. If it cannot
//! be started, reads fall back to `Instant::elapsed`.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

#[derive(Clone, Debug)]
pub struct Clock {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Unix seconds when the clock started (memcached's `process_started`).
    started_unix_s: i64,
    kind: Kind,
    /// `debugtime N`: seconds added to the relative time (memcached-debug's `delta`).
    shift_s: AtomicI64,
    /// `debugtime p`: the relative second the clock stands still at; `RUNNING` otherwise.
    paused_rel_s: AtomicU64,
}

/// `paused_rel_s` of a clock that is not paused.
const RUNNING: u64 = u64::MAX;

#[derive(Debug)]
enum Kind {
    System {
        start: Instant,
        /// Cached relative seconds, refreshed by the ticker thread.
        rel_s: AtomicU64,
        /// Whether the ticker thread runs (else compute from `start` on each read).
        ticking: AtomicBool,
    },
    /// Manually advanced relative seconds.
    Manual(AtomicU64),
}

thread_local! {
    /// The proposer's Unix time while a replicated command is applied (see `with_proposer_now`).
    static PROPOSER_NOW_UNIX_S: std::cell::Cell<Option<i64>> = const { std::cell::Cell::new(None) };
}

/// Run `f` with `unix_s` standing for "now" when this thread's store calls turn a *relative*
/// exptime into a moment: a replicated write is applied on every replica with the proposer's
/// clock, so all of them expire the item at the same Unix second whatever their own clock or
/// start time. Lazy expiry checks still read the replica's own clock.
pub fn with_proposer_now<R>(unix_s: i64, f: impl FnOnce() -> R) -> R {
    let before = PROPOSER_NOW_UNIX_S.with(|c| c.replace(Some(unix_s)));
    let r = f();
    PROPOSER_NOW_UNIX_S.with(|c| c.set(before));
    r
}

/// The time set by `with_proposer_now` on this thread, if any.
#[inline]
pub(crate) fn proposer_now_unix_s() -> Option<i64> {
    PROPOSER_NOW_UNIX_S.with(std::cell::Cell::get)
}

/// memcached starts relative time at 2 so that 0 ("never") and 1 ("already expired") are
/// never real moments.
const REL_START_S: u64 = 2;

impl Clock {
    pub fn system() -> Clock {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
        // memcached sets process_started two seconds in the past so that relative time 0/1 are
        // never confused with "never" and "expired"; we keep the same offset for identical math.
        let inner = Arc::new(Inner::new(
            now - REL_START_S as i64,
            Kind::System { start: Instant::now(), rel_s: AtomicU64::new(REL_START_S), ticking: AtomicBool::new(false) },
        ));
        let weak = Arc::downgrade(&inner);
        let spawned = std::thread::Builder::new()
            .name("slipstream-clock".into())
            .stack_size(64 * 1024)
            .spawn(move || tick_until_dropped(weak))
            .is_ok();
        if let Kind::System { ticking, .. } = &inner.kind {
            ticking.store(spawned, Ordering::Release);
        }
        Clock { inner }
    }

    /// A clock that only moves when `advance` is called; starts at relative second 2.
    pub fn manual(started_unix_s: i64) -> Clock {
        Clock { inner: Arc::new(Inner::new(started_unix_s, Kind::Manual(AtomicU64::new(REL_START_S)))) }
    }

    /// Seconds since the start (memcached's `current_time`), as `debugtime` moved it.
    #[inline]
    pub fn now_rel_s(&self) -> u32 {
        let paused = self.inner.paused_rel_s.load(Ordering::Relaxed);
        if paused != RUNNING {
            return paused as u32;
        }
        let shift = self.inner.shift_s.load(Ordering::Relaxed);
        (i64::from(self.base_rel_s()) + shift).clamp(0, i64::from(u32::MAX)) as u32
    }

    /// `debugtime N`: move the clock by `secs` (memcached-debug's test hook).
    pub fn debug_shift(&self, secs: i64) {
        self.inner.shift_s.fetch_add(secs, Ordering::Relaxed);
    }

    /// `debugtime p` / `debugtime r`: stop the clock where it is, or let it run again (from
    /// the real time plus the shifts, as memcached-debug's clock thread resumes).
    pub fn debug_pause(&self, pause: bool) {
        let at = if pause { u64::from(self.now_rel_s()) } else { RUNNING };
        self.inner.paused_rel_s.store(at, Ordering::Relaxed);
    }

    /// The relative second of the clock itself, before `debugtime`.
    #[inline]
    fn base_rel_s(&self) -> u32 {
        match &self.inner.kind {
            Kind::System { start, rel_s, ticking } => {
                if ticking.load(Ordering::Relaxed) {
                    rel_s.load(Ordering::Relaxed) as u32
                } else {
                    (start.elapsed().as_secs() + REL_START_S) as u32
                }
            }
            Kind::Manual(s) => s.load(Ordering::Relaxed) as u32,
        }
    }

    pub fn started_unix_s(&self) -> i64 {
        self.inner.started_unix_s
    }

    /// Current Unix time in seconds as this clock sees it.
    pub fn now_unix_s(&self) -> i64 {
        self.inner.started_unix_s + self.now_rel_s() as i64
    }

    /// The moment relative second `rel` begins, as an `Instant` (CLOCK_MONOTONIC on Linux): an
    /// item with exptime `rel` is expired from then on. The cached second lags the true one, so
    /// this is never later than the moment the store itself starts treating the item as
    /// expired (what the kernel fast path needs: it may expire a copy early, never late). A
    /// manual clock maps `rel` to the same distance from the current `Instant`.
    pub fn deadline_of_rel_s(&self, rel: u32) -> Option<Instant> {
        // A shifted clock reaches `rel` `shift` seconds early; an early deadline is allowed.
        let shift = self.inner.shift_s.load(Ordering::Relaxed);
        let rel = (i64::from(rel) - shift).clamp(0, i64::from(u32::MAX)) as u32;
        match &self.inner.kind {
            Kind::System { start, .. } => {
                start.checked_add(Duration::from_secs(u64::from(rel).saturating_sub(REL_START_S)))
            }
            Kind::Manual(s) => {
                let now = s.load(Ordering::Relaxed);
                let ahead = u64::from(rel).saturating_sub(now);
                Instant::now().checked_add(Duration::from_secs(ahead))
            }
        }
    }

    /// Advance a manual clock; no effect on a system clock.
    pub fn advance(&self, secs: u64) {
        if let Kind::Manual(s) = &self.inner.kind {
            s.fetch_add(secs, Ordering::Relaxed);
        }
    }
}

impl Inner {
    fn new(started_unix_s: i64, kind: Kind) -> Inner {
        Inner { started_unix_s, kind, shift_s: AtomicI64::new(0), paused_rel_s: AtomicU64::new(RUNNING) }
    }
}

/// Refresh the cached second just after each whole-second boundary of the monotonic clock.
fn tick_until_dropped(weak: Weak<Inner>) {
    loop {
        let wait = {
            let Some(inner) = weak.upgrade() else { return };
            let Kind::System { start, rel_s, .. } = &inner.kind else { return };
            let elapsed = start.elapsed();
            rel_s.store(elapsed.as_secs() + REL_START_S, Ordering::Relaxed);
            Duration::from_secs(1).saturating_sub(Duration::from_nanos(elapsed.subsec_nanos() as u64))
        };
        std::thread::sleep(wait + Duration::from_micros(200));
    }
}

#[cfg(test)]
mod tests {
    use super::Clock;

    #[test]
    fn system_clock_ticks_each_second() {
        let c = Clock::system();
        let t0 = c.now_rel_s();
        assert!((2..=3).contains(&t0));
        std::thread::sleep(std::time::Duration::from_millis(1300));
        let t1 = c.now_rel_s();
        assert!(t1 == t0 + 1 || t1 == t0 + 2, "{t0} -> {t1}");
        assert_eq!(c.now_unix_s(), c.started_unix_s() + t1 as i64);
        // The deadline of the current second is in the past, of the next one at most one
        // second away.
        let now = std::time::Instant::now();
        assert!(c.deadline_of_rel_s(t1).unwrap() <= now);
        assert!(c.deadline_of_rel_s(t1 + 1).unwrap() <= now + std::time::Duration::from_secs(1));
    }

    #[test]
    fn debugtime_shifts_pauses_and_resumes() {
        let c = Clock::manual(1000);
        c.debug_shift(10);
        assert_eq!(c.now_rel_s(), 12);
        c.debug_pause(true);
        c.advance(5);
        assert_eq!(c.now_rel_s(), 12, "paused");
        c.debug_pause(false);
        assert_eq!(c.now_rel_s(), 17);
        c.debug_shift(-100);
        assert_eq!(c.now_rel_s(), 0, "never before the start");
    }

    #[test]
    fn manual_clock_moves_only_on_advance() {
        let c = Clock::manual(1000);
        assert_eq!(c.now_rel_s(), 2);
        c.advance(5);
        assert_eq!(c.now_rel_s(), 7);
        assert_eq!(c.now_unix_s(), 1007);
    }
}
