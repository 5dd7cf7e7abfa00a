//! Open-loop pacing (`--rate-per-s`): when each request is due, how many are due now, and
//! what to shed when the client has fallen too far behind; plus a timerfd to sleep until
//! the next send with sub-millisecond precision. Not a scheduler for anything but the
//! load generator's request stream.
//!
//! The schedule is global: request n (n = 0, 1, 2, ...) of the whole run is due at
//! `start + n / rate`, and goes to connection `n mod conns`. A connection therefore owns
//! every conns-th slot, and the aggregate stream is evenly spaced whatever the number of
//! connections or threads. Scheduled times are computed from the index (never by adding
//! periods), so there is no drift over a long run.
//!
//! Latency is measured from the scheduled time, not from the moment the request left the
//! client: a request that waits because the server (or the client) fell behind carries that
//! wait in its latency, which is what avoids coordinated omission.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

/// Highest accepted `--rate-per-s` (requests per second, all connections together).
pub const RATE_PER_S_MAX: f64 = 10_000_000.0;
/// Highest rate a schedule takes (one per nanosecond); each generator bounds its own option
/// below this (`RATE_PER_S_MAX` for requests, `send`'s and `xdp-gen`'s for datagrams and frames).
const SCHEDULE_RATE_PER_S_MAX: f64 = 1e9;
/// Highest accepted `--backlog-max` (due but unsent requests per connection).
pub const BACKLOG_MAX_MAX: u64 = 1_000_000;

/// One connection's (or UDP socket's) share of the global schedule.
#[derive(Clone, Debug)]
pub struct Pacer {
    start: Instant,
    /// Nanoseconds between two consecutive requests of the global stream (1e9 / rate).
    ns_per_req: f64,
    /// Number of connections the global stream is spread over.
    stride: u64,
    /// Global index of this connection's next request to send.
    next_n: u64,
    /// Most due-but-unsent requests kept; older ones are shed.
    backlog_max: u64,
}

impl Pacer {
    /// `conn_index` in `0..conns_total`; `rate_per_s` > 0 (checked by the caller, clamped here).
    pub fn new(start: Instant, rate_per_s: f64, conns_total: u64, conn_index: u64, backlog_max: u64) -> Pacer {
        let rate =
            if rate_per_s.is_finite() && rate_per_s > 0.0 { rate_per_s.min(SCHEDULE_RATE_PER_S_MAX) } else { 1.0 };
        let stride = conns_total.max(1);
        Pacer { start, ns_per_req: 1e9 / rate, stride, next_n: conn_index % stride, backlog_max: backlog_max.max(1) }
    }

    /// Offset from `start` of global request `n`.
    fn offset(&self, n: u64) -> Duration {
        let ns = n as f64 * self.ns_per_req;
        // ns is finite and >= 0; beyond u64 nanoseconds (584 years) it saturates.
        Duration::from_nanos(if ns >= u64::MAX as f64 { u64::MAX } else { ns as u64 })
    }

    /// When this connection's next request is due.
    pub fn due_at(&self) -> Instant {
        self.start.checked_add(self.offset(self.next_n)).unwrap_or(self.start)
    }

    /// How many of this connection's requests are due (scheduled at or before `now`) and
    /// not yet taken.
    pub fn due_count(&self, now: Instant) -> u64 {
        if now < self.start {
            return 0;
        }
        let elapsed_ns = now.saturating_duration_since(self.start).as_nanos() as f64;
        // Global requests 0..=last are due. Guard the float: the exact boundary counts as due.
        let mut last = (elapsed_ns / self.ns_per_req).floor() as u64;
        // The float division may land one below an exact boundary; correct it using the
        // same arithmetic `offset` uses, so "due" and "due_at <= now" always agree.
        while self.start.checked_add(self.offset(last + 1)).is_some_and(|t| t <= now) {
            last += 1;
        }
        while last > 0 && self.start.checked_add(self.offset(last)).is_none_or(|t| t > now) {
            last -= 1;
        }
        if self.next_n > last {
            return 0;
        }
        // next_n, next_n + stride, ... up to last.
        (last - self.next_n) / self.stride + 1
    }

    /// Take the next request: returns its scheduled time and advances the schedule.
    pub fn take(&mut self) -> Instant {
        let at = self.due_at();
        self.next_n = self.next_n.saturating_add(self.stride);
        at
    }

    /// If more than `backlog_max` requests are due, skip the oldest ones so that exactly
    /// `backlog_max` remain due; returns how many were skipped (never sent).
    pub fn shed(&mut self, now: Instant) -> u64 {
        let due = self.due_count(now);
        if due <= self.backlog_max {
            return 0;
        }
        let skip = due - self.backlog_max;
        self.next_n = self.next_n.saturating_add(skip.saturating_mul(self.stride));
        skip
    }

    /// How many of this connection's requests scheduled in `[from, to)` were never taken:
    /// what a generator that was not scheduled (CPU) before its window closed left unsent.
    pub fn untaken_in(&self, from: Instant, to: Instant) -> u64 {
        let before = |t: Instant| t.checked_sub(Duration::from_nanos(1)).map_or(0, |t| self.due_count(t));
        before(to).saturating_sub(before(from))
    }

    /// Take the next `k` requests at once (a generator that sends them in one call).
    pub fn take_many(&mut self, k: u64) {
        self.next_n = self.next_n.saturating_add(k.saturating_mul(self.stride));
    }

    /// Scheduled time of the request `k` places after the next one (k = 0: the next).
    pub fn due_at_ahead(&self, k: u64) -> Instant {
        let n = self.next_n.saturating_add(k.saturating_mul(self.stride));
        self.start.checked_add(self.offset(n)).unwrap_or(self.start)
    }
}

/// A one-shot CLOCK_MONOTONIC timerfd, registered with the worker's poll, so the worker
/// sleeps in one place (epoll) until either a reply arrives or the next request is due;
/// epoll's own timeout has only millisecond resolution.
pub struct Timer {
    fd: OwnedFd,
}

impl Timer {
    pub fn new() -> io::Result<Timer> {
        // SAFETY: timerfd_create takes no pointers; a negative return is an error.
        let fd = unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_NONBLOCK | libc::TFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor we own exclusively.
        Ok(Timer { fd: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    /// Fire once after `after` (at least 1 ns: a zero it_value would disarm the timer).
    pub fn arm(&self, after: Duration) -> io::Result<()> {
        let after = after.max(Duration::from_nanos(1));
        let spec = libc::itimerspec {
            it_interval: libc::timespec { tv_sec: 0, tv_nsec: 0 },
            it_value: libc::timespec {
                tv_sec: after.as_secs().min(i64::MAX as u64) as libc::time_t,
                tv_nsec: after.subsec_nanos() as libc::c_long,
            },
        };
        // SAFETY: `spec` is a valid itimerspec that outlives the call; old_value may be null.
        let r = unsafe { libc::timerfd_settime(self.fd.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Consume a pending expiry (so the edge-triggered registration fires again next time).
    pub fn clear(&self) {
        let mut buf = [0u8; 8];
        // SAFETY: reads at most 8 bytes into a live 8-byte buffer; the fd is non-blocking,
        // and EAGAIN (nothing pending) is fine to ignore.
        let _ = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    }

    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn global_stream_is_evenly_spread_over_connections() {
        let t0 = Instant::now();
        // 1000/s over 4 connections: request n at n ms, connection n % 4.
        let p: Vec<Pacer> = (0..4).map(|c| Pacer::new(t0, 1000.0, 4, c, 100)).collect();
        for (c, pc) in p.iter().enumerate() {
            assert_eq!(pc.due_at(), t0 + ms(c as u64));
            assert_eq!(pc.due_at_ahead(1), t0 + ms(c as u64 + 4));
            assert_eq!(pc.due_at_ahead(10), t0 + ms(c as u64 + 40));
        }
        // At t0 only connection 0's first request is due; at t0+3ms one each; at t0+4ms
        // connection 0 has two.
        assert_eq!(p.iter().map(|x| x.due_count(t0)).collect::<Vec<_>>(), [1, 0, 0, 0]);
        assert_eq!(p.iter().map(|x| x.due_count(t0 + ms(3))).collect::<Vec<_>>(), [1, 1, 1, 1]);
        assert_eq!(p.iter().map(|x| x.due_count(t0 + ms(4))).collect::<Vec<_>>(), [2, 1, 1, 1]);
        // Over one second exactly 1000 requests are due in total (0..=999 at t < 1 s).
        let total: u64 = p.iter().map(|x| x.due_count(t0 + ms(999) + Duration::from_micros(999))).sum();
        assert_eq!(total, 1000);
    }

    #[test]
    fn untaken_in_counts_only_the_window_and_only_what_was_not_taken() {
        let t0 = Instant::now();
        // 1000/s on one connection: request n at n ms. Window [100 ms, 200 ms): 100 requests.
        let mut p = Pacer::new(t0, 1000.0, 1, 0, 1_000_000);
        assert_eq!(p.untaken_in(t0 + ms(100), t0 + ms(200)), 100);
        // Taking the first 150 (0..=149) leaves 150..=199 of the window untaken.
        p.take_many(150);
        assert_eq!(p.untaken_in(t0 + ms(100), t0 + ms(200)), 50);
        p.take_many(50);
        assert_eq!(p.untaken_in(t0 + ms(100), t0 + ms(200)), 0);
        // A window from the schedule's origin counts request 0 too.
        let q = Pacer::new(t0, 1000.0, 1, 0, 1_000_000);
        assert_eq!(q.untaken_in(t0, t0 + ms(10)), 10);
    }

    #[test]
    fn take_advances_and_due_boundary_is_inclusive() {
        let t0 = Instant::now();
        let mut p = Pacer::new(t0, 3.0, 1, 0, 100); // a non-integer period: 333_333_333.3 ns
        assert_eq!(p.take(), t0);
        let second = p.due_at();
        assert_eq!(second, t0 + Duration::from_nanos(333_333_333));
        assert_eq!(p.due_count(second - Duration::from_nanos(1)), 0);
        assert_eq!(p.due_count(second), 1);
        // No drift: request 3000 is due at exactly 1000 s, not 3000 x the rounded period.
        let mut q = Pacer::new(t0, 3.0, 1, 0, 100);
        assert_eq!(q.due_at_ahead(3000), t0 + Duration::from_secs(1000));
        for _ in 0..3000 {
            q.take();
        }
        assert_eq!(q.due_at(), t0 + Duration::from_secs(1000));
    }

    #[test]
    fn due_count_agrees_with_due_at_everywhere() {
        // For awkward rates, every instant just before / at a scheduled time gives the
        // count that due_at implies.
        for &(rate, conns) in &[(7.0, 3u64), (1450.0, 4), (123_457.0, 16), (0.5, 1)] {
            let t0 = Instant::now();
            for c in 0..conns {
                let mut p = Pacer::new(t0, rate, conns, c, 1_000_000);
                for _ in 0..200 {
                    let at = p.due_at();
                    if at > t0 {
                        assert_eq!(p.due_count(at - Duration::from_nanos(1)), 0, "rate {rate} conn {c}");
                    }
                    assert_eq!(p.due_count(at), 1, "rate {rate} conn {c}");
                    assert_eq!(p.due_count(p.due_at_ahead(5)), 6, "rate {rate} conn {c}");
                    p.take();
                }
            }
        }
    }

    #[test]
    fn shed_keeps_the_newest_backlog_max() {
        let t0 = Instant::now();
        let mut p = Pacer::new(t0, 1000.0, 2, 1, 10); // this conn: 1, 3, 5, ... ms
        let now = t0 + ms(100); // due: global 1,3,...,99 -> 50 requests
        assert_eq!(p.due_count(now), 50);
        assert_eq!(p.shed(now), 40);
        assert_eq!(p.due_count(now), 10);
        assert_eq!(p.due_at(), t0 + ms(81)); // the 10 newest: 81..=99
        assert_eq!(p.shed(now), 0);
        for _ in 0..10 {
            p.take();
        }
        assert_eq!(p.due_count(now), 0);
        assert_eq!(p.due_at(), t0 + ms(101));
    }

    #[test]
    fn bad_rates_are_clamped_not_panics() {
        let t0 = Instant::now();
        for r in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e300] {
            let p = Pacer::new(t0, r, 0, 5, 0);
            let _ = p.due_count(t0 + Duration::from_secs(1));
            let _ = p.due_at_ahead(u64::MAX);
        }
    }

    #[test]
    fn timer_fires() {
        let t = Timer::new().unwrap();
        t.arm(Duration::from_millis(2)).unwrap();
        let mut pfd = libc::pollfd { fd: t.raw_fd(), events: libc::POLLIN, revents: 0 };
        let start = Instant::now();
        // SAFETY: one valid pollfd, live for the call.
        let r = unsafe { libc::poll(&mut pfd, 1, 1000) };
        assert_eq!(r, 1);
        assert!(start.elapsed() >= Duration::from_millis(2));
        t.clear();
    }
}
