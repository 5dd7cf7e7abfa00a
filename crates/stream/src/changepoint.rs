//! changepoint: one-at-a-time change-point detection against a reference built from past
//! window means (the paper's rule), or CUSUM, with a raw-history ring dumped in each alert.
//!
//! What it is for: the `changepoint` operator.
//! - Windows: tumbling, `window_ms`, aligned to the epoch of `t_ns`. When event time reaches a
//!   window's end its mean (sum / count) joins a ring of the last `reference_windows` (N) means;
//!   windows with no values add nothing. The reference is the plain mean of those N means.
//! - Armed: only once N window means are in the ring. Before that no value is tested.
//! - Reference rule: each value `v` is tested on arrival: alert when `|v - reference| >
//!   threshold` (strictly greater).
//! - CUSUM (two-sided): with the same reference `r`, drift `k` and threshold `h` (both in value
//!   units): `S+ = max(0, S+ + (v - r - k))`, `S- = max(0, S- + (r - v - k))`; alert when `S+ > h`
//!   (direction up) or else `S- > h` (down). Sums start at 0 when armed.
//! - History: a ring of the last `history` raw values (including the one that alerted), dumped
//!   oldest first in the alert. It is not cleared by an alert.
//! - Re-arm policy: an alert discards the reference ring, the CUSUM sums and the partial current
//!   window; the alerting value starts the new current window. Detection re-arms after N more
//!   windows have completed, so one step yields one alert and the new level becomes the
//!   reference.
//!
//! What it is not for: aggregates or word counts; the values are tested but not forwarded.

use std::collections::VecDeque;

use crate::result::{self, Alert, Method};
use crate::{Clock, Input, OpCounters, Operator, Record};

/// Most reference windows and most history values accepted (config validation bounds).
pub const REFERENCE_WINDOWS_MAX: usize = 4_096;
pub const HISTORY_MAX: usize = 65_536;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Detector {
    Reference { threshold: f64 },
    Cusum { drift: f64, threshold: f64 },
}

/// The detector without JSON: alerts are handed to a callback.
#[derive(Debug)]
pub struct ChangePoint {
    window_ns: u64,
    reference_windows: usize,
    detector: Detector,
    history_max: usize,
    current: Option<u64>,
    cur_sum: f64,
    cur_count: u64,
    means: VecDeque<f64>,
    reference: Option<f64>,
    s_hi: f64,
    s_lo: f64,
    history: VecDeque<f64>,
}

impl ChangePoint {
    /// Bounds are the caller's (config) job; here `window_ns` and `reference_windows` of 0 are
    /// raised to 1 and `history` is capped at [`HISTORY_MAX`] so nothing is unbounded.
    pub fn new(window_ns: u64, reference_windows: usize, detector: Detector, history: usize) -> Self {
        let history_max = history.min(HISTORY_MAX);
        ChangePoint {
            window_ns: window_ns.max(1),
            reference_windows: reference_windows.clamp(1, REFERENCE_WINDOWS_MAX),
            detector,
            history_max,
            current: None,
            cur_sum: 0.0,
            cur_count: 0,
            means: VecDeque::new(),
            reference: None,
            s_hi: 0.0,
            s_lo: 0.0,
            history: VecDeque::with_capacity(history_max.min(4_096)),
        }
    }

    /// A detector continuing from a state kept elsewhere (the XDP engine's, when user space
    /// takes a stream over): the open window (`current`, its sum and count), the completed
    /// window means oldest first (at most `reference_windows` are kept; armed when that many),
    /// and the raw history oldest first (the last `history` are kept).
    #[allow(clippy::too_many_arguments)]
    pub fn restore(
        window_ns: u64,
        reference_windows: usize,
        detector: Detector,
        history: usize,
        current: Option<u64>,
        cur_sum: f64,
        cur_count: u64,
        means: &[f64],
        raw: &[f64],
    ) -> Self {
        let mut cp = ChangePoint::new(window_ns, reference_windows, detector, history);
        let n = cp.reference_windows;
        cp.means = means.iter().copied().skip(means.len().saturating_sub(n)).collect();
        if cp.means.len() == n {
            cp.reference = Some(cp.means.iter().sum::<f64>() / n as f64);
        }
        cp.history = raw.iter().copied().skip(raw.len().saturating_sub(cp.history_max)).collect();
        cp.current = current;
        cp.cur_sum = cur_sum;
        cp.cur_count = cur_count;
        cp
    }

    /// The reference in force (None while not armed).
    pub fn reference(&self) -> Option<f64> {
        self.reference
    }

    /// Closes the current window if event time `t_ns` has reached its end.
    pub fn advance(&mut self, t_ns: u64) {
        let Some(k) = self.current else { return };
        let end = k.saturating_add(1).saturating_mul(self.window_ns);
        if t_ns < end {
            return;
        }
        if self.cur_count > 0 {
            let mean = self.cur_sum / self.cur_count as f64;
            if self.means.len() == self.reference_windows {
                self.means.pop_front();
            }
            self.means.push_back(mean);
            if self.means.len() == self.reference_windows {
                self.reference = Some(self.means.iter().sum::<f64>() / self.means.len() as f64);
            }
        }
        self.current = None;
        self.cur_sum = 0.0;
        self.cur_count = 0;
    }

    /// Tests and then absorbs `v` at `t_ns` (call `advance(t_ns)` first; time must not go
    /// backwards). Calls `emit` at most once.
    pub fn push(&mut self, t_ns: u64, v: f64, emit: &mut impl FnMut(&Alert)) {
        if self.history_max > 0 {
            if self.history.len() == self.history_max {
                self.history.pop_front();
            }
            self.history.push_back(v);
        }
        if self.current.is_none() {
            self.current = Some(t_ns / self.window_ns);
        }
        if let Some(r) = self.reference {
            let fired = match self.detector {
                Detector::Reference { threshold } => {
                    ((v - r).abs() > threshold).then_some((Method::Reference, threshold, None))
                }
                Detector::Cusum { drift, threshold } => {
                    self.s_hi = (self.s_hi + (v - r - drift)).max(0.0);
                    self.s_lo = (self.s_lo + (r - v - drift)).max(0.0);
                    if self.s_hi > threshold {
                        Some((Method::Cusum, threshold, Some((true, self.s_hi))))
                    } else if self.s_lo > threshold {
                        Some((Method::Cusum, threshold, Some((false, self.s_lo))))
                    } else {
                        None
                    }
                }
            };
            if let Some((method, threshold, cusum)) = fired {
                emit(&Alert {
                    t_ns,
                    value: v,
                    reference: r,
                    method,
                    deviation: v - r,
                    threshold,
                    cusum,
                    history: self.history.iter().copied().collect(),
                });
                // Re-arm: forget the old regime entirely.
                self.means.clear();
                self.reference = None;
                self.s_hi = 0.0;
                self.s_lo = 0.0;
                self.cur_sum = 0.0;
                self.cur_count = 0;
            }
        }
        self.cur_sum += v;
        self.cur_count += 1;
    }
}

/// The `changepoint` operator: [`ChangePoint`] plus `changepoint` JSON lines.
pub struct ChangePointOp {
    stream: String,
    cp: ChangePoint,
    clock: Clock,
    counters: OpCounters,
}

impl ChangePointOp {
    pub fn new(stream: &str, cp: ChangePoint) -> Self {
        ChangePointOp { stream: stream.to_string(), cp, clock: Clock::default(), counters: OpCounters::default() }
    }
}

impl ChangePointOp {
    /// The operator around a restored detector whose event clock had reached `high_ns`.
    pub fn restored(stream: &str, cp: ChangePoint, high_ns: u64) -> Self {
        let mut op = ChangePointOp::new(stream, cp);
        op.clock.advance(high_ns);
        op
    }
}

impl Operator for ChangePointOp {
    fn input(&self) -> Input {
        Input::Numbers
    }

    fn on_record(&mut self, rec: Record<'_>, t_ns: u64, out: &mut Vec<u8>) {
        let t_ns = crate::begin_record(&mut self.clock, &mut self.counters, t_ns);
        self.cp.advance(t_ns);
        let Record::Value(v) = rec else {
            self.counters.ignored += 1;
            return;
        };
        let stream = &self.stream;
        let lines = &mut self.counters.lines;
        self.cp.push(t_ns, v, &mut |a| {
            result::changepoint(out, stream, a);
            *lines += 1;
        });
    }

    fn on_time(&mut self, t_ns: u64, _out: &mut Vec<u8>) {
        let (t_ns, _) = self.clock.advance(t_ns);
        self.cp.advance(t_ns);
    }

    fn counters(&self) -> OpCounters {
        self.counters
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::Rng;

    const MS: u64 = 1_000_000;
    const WINDOW_NS: u64 = 100 * MS;

    /// One sample per ms, Gaussian noise (σ = 1) around `level(t)`; returns the alerts.
    fn run(cp: &mut ChangePoint, seed: u64, samples: u64, level: impl Fn(u64) -> f64) -> Vec<Alert> {
        let mut rng = Rng::new(seed);
        let mut alerts = Vec::new();
        for i in 0..samples {
            let t = i * MS;
            cp.advance(t);
            let v = level(t) + rng.gauss();
            cp.push(t, v, &mut |a| alerts.push(a.clone()));
        }
        alerts
    }

    // Reference rule test threshold: 6.0 with σ = 1 noise (per-sample false-alarm probability
    // ≈ 2e-9, so none expected in 200k samples).
    const THRESHOLD: f64 = 6.0;

    #[test]
    fn reference_rule_no_false_alarm_when_stationary() {
        let seed = crate::testutil::seed(0x5eed_0003);
        let mut cp = ChangePoint::new(WINDOW_NS, 8, Detector::Reference { threshold: THRESHOLD }, 64);
        let alerts = run(&mut cp, seed, 200_000, |_| 10.0);
        assert!(alerts.is_empty(), "seed {seed}: {alerts:?}");
        assert!((cp.reference().unwrap() - 10.0).abs() < 0.2);
    }

    #[test]
    fn reference_rule_detects_step_within_one_window_once() {
        let seed = crate::testutil::seed(0x5eed_0004);
        let step_ns = 2_000 * MS + 500_000; // between samples
        let mut cp = ChangePoint::new(WINDOW_NS, 8, Detector::Reference { threshold: THRESHOLD }, 16);
        let alerts = run(&mut cp, seed, 6_000, |t| if t < step_ns { 10.0 } else { 30.0 });
        assert_eq!(alerts.len(), 1, "seed {seed}: one step, one alert (re-armed at the new level)");
        let a = &alerts[0];
        assert!(a.t_ns >= step_ns && a.t_ns < step_ns + WINDOW_NS, "seed {seed}: {}", a.t_ns);
        assert_eq!(a.t_ns, 2_001 * MS, "first post-step sample alerts");
        assert!((a.reference - 10.0).abs() < 0.2 && a.value > 20.0);
        assert_eq!(a.history.len(), 16);
        assert_eq!(a.history.last(), Some(&a.value));
        assert!(a.history[..15].iter().all(|v| *v < 20.0), "history holds the pre-change values");
        assert_eq!(cp.reference().map(|r| (r - 30.0).abs() < 0.2), Some(true), "re-armed at 30");
    }

    #[test]
    fn not_armed_before_n_windows_and_rearms_after_alert() {
        let mut cp = ChangePoint::new(100, 3, Detector::Reference { threshold: 5.0 }, 4);
        let mut alerts = Vec::new();
        let mut feed = |cp: &mut ChangePoint, t: u64, v: f64| {
            cp.advance(t);
            cp.push(t, v, &mut |a| alerts.push((a.t_ns, a.reference)));
        };
        feed(&mut cp, 0, 10.0);
        feed(&mut cp, 100, 10.0);
        feed(&mut cp, 250, 1000.0); // only 2 windows complete: not armed, no alert
        assert_eq!(cp.reference(), None);
        feed(&mut cp, 300, 10.0); // 3 windows complete (means 10, 10, 1000): |10 - 340| > 5
        assert_eq!(cp.reference(), None, "alert re-arms");
        feed(&mut cp, 310, -500.0); // not armed again yet: no alert
        for t in [400, 500] {
            feed(&mut cp, t, 10.0);
        }
        assert_eq!(cp.reference(), None);
        // Window [300,400) = {10, -500} (the alerting value starts it), then 10, 10.
        feed(&mut cp, 600, 10.0);
        assert_eq!(alerts, vec![(300, 340.0), (600, -75.0)]);
    }

    #[test]
    fn cusum_no_false_alarm_and_detects_small_steps() {
        // k = 1σ, h = 10σ: in-control ARL in the 1e9 range, a 3σ step crosses in ~5 samples.
        let det = Detector::Cusum { drift: 1.0, threshold: 10.0 };
        let seed = crate::testutil::seed(0x5eed_0005);
        let mut cp = ChangePoint::new(WINDOW_NS, 8, det, 8);
        assert!(run(&mut cp, seed, 200_000, |_| 10.0).is_empty(), "seed {seed}");

        let step_ns = 2_000 * MS + 1;
        for (to, up) in [(13.0, true), (7.0, false)] {
            let mut cp = ChangePoint::new(WINDOW_NS, 8, det, 8);
            let alerts = run(&mut cp, seed, 6_000, |t| if t < step_ns { 10.0 } else { to });
            assert_eq!(alerts.len(), 1, "seed {seed} step to {to}");
            let a = &alerts[0];
            assert!(a.t_ns >= step_ns && a.t_ns < step_ns + WINDOW_NS, "seed {seed}");
            assert_eq!(a.method, Method::Cusum);
            assert_eq!(a.cusum.map(|c| c.0), Some(up));
            assert!(a.cusum.map(|c| c.1 > 10.0) == Some(true));
        }
        // The same 3σ step is not reliably caught by the reference rule at threshold 6.
    }

    #[test]
    fn restored_detector_continues_like_the_original() {
        let det = Detector::Reference { threshold: THRESHOLD };
        let seed = crate::testutil::seed(0x5eed_0006);
        let mut rng = Rng::new(seed);
        let vals: Vec<f64> = (0..3_000).map(|i| if i < 2_000 { 10.0 } else { 30.0 } + rng.gauss()).collect();
        let mut a = ChangePoint::new(WINDOW_NS, 4, det, 8);
        let mut alerts_a = Vec::new();
        for (i, v) in vals.iter().enumerate() {
            let t = i as u64 * MS;
            a.advance(t);
            a.push(t, *v, &mut |x| alerts_a.push(x.clone()));
        }
        // Same values, but the state is handed over after 1_550 values.
        let mut b = ChangePoint::new(WINDOW_NS, 4, det, 8);
        for (i, v) in vals.iter().enumerate().take(1_550) {
            let t = i as u64 * MS;
            b.advance(t);
            b.push(t, *v, &mut |_| {});
        }
        let mut c = ChangePoint::restore(
            WINDOW_NS,
            4,
            det,
            8,
            b.current,
            b.cur_sum,
            b.cur_count,
            &b.means.iter().copied().collect::<Vec<_>>(),
            &b.history.iter().copied().collect::<Vec<_>>(),
        );
        let mut alerts_c = Vec::new();
        for (i, v) in vals.iter().enumerate().skip(1_550) {
            let t = i as u64 * MS;
            c.advance(t);
            c.push(t, *v, &mut |x| alerts_c.push(x.clone()));
        }
        assert_eq!(alerts_a, alerts_c, "seed {seed}");
        assert_eq!(alerts_c.len(), 1);
    }

    #[test]
    fn operator_json_and_zero_history() {
        let mut op = ChangePointOp::new("sensor", ChangePoint::new(10, 1, Detector::Reference { threshold: 5.0 }, 0));
        let mut out = Vec::new();
        op.on_record(Record::Value(10.0), 0, &mut out);
        op.on_time(10, &mut out);
        op.on_record(Record::Value(31.5), 12, &mut out);
        assert_eq!(String::from_utf8(out).unwrap(), "{\"stream\":\"sensor\",\"type\":\"changepoint\",\"value\":31.5,\"reference\":10.0,\"t_ns\":12,\"method\":\"reference\",\"deviation\":21.5,\"threshold\":5.0,\"history\":[]}\n");
        assert_eq!(op.counters().lines, 1);
    }
}
