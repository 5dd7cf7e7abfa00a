//! window: tumbling and sliding event-time windows with count, sum, avg, min, max, median and
//! population variance.
//!
//! What it is for: the `aggregate` operator. Windows are aligned to the epoch of `t_ns`: window
//! `j` covers `[j*slide, j*slide + size)` for `j >= 0` (tumbling: slide = size). A window is
//! flushed (one `window` line) as soon as event time reaches its end, by a record or by
//! `on_time`; windows with no values produce no line.
//!
//! How: time is cut into panes of `gcd(size, slide)`; each value is folded once into its pane
//! (count, sum, min, max, Welford mean/M2, raw values for the median) and a closing window
//! combines its `size/pane` pane summaries (Chan's parallel variance), so sliding windows do not
//! re-scan values except for the exact median, which needs a selection over the window's
//! values. Raw values kept for medians are bounded by `values_per_window_max` over all live
//! panes (which never span more than one window); past it, values still count in every exact
//! aggregate but not in the median, and the window reports `truncated: true`.
//! `avg` is `sum / count`; `variance` is the population variance (divides by count).
//! A sum that overflows f64 is written as `null`.
//!
//! What it is not for: word counts (`wordcount`) or reference means for change points.

use std::collections::VecDeque;

use crate::result::{self, Aggregate};
use crate::{Clock, Input, OpCounters, Operator, Record};

/// Default bound on raw values kept for one window's median.
pub const VALUES_PER_WINDOW_MAX: usize = 1_000_000;
/// Most panes one window may span (size / gcd(size, slide)).
pub const PANES_PER_WINDOW_MAX: u64 = 10_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowError {
    ZeroSize,
    ZeroSlide,
    SlideLargerThanSize,
    TooManyPanes { panes: u64 },
}

/// Exact median; even count → mean of the two middle values. `None` when empty.
/// Reorders `values`.
pub fn median(values: &mut [f64]) -> Option<f64> {
    let n = values.len();
    if n == 0 {
        return None;
    }
    let (left, mid, _) = values.select_nth_unstable_by(n / 2, f64::total_cmp);
    let hi = *mid;
    if n % 2 == 1 {
        return Some(hi);
    }
    let lo = left.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let m = (lo + hi) / 2.0;
    // Only when lo + hi overflows; halving first keeps the result finite.
    Some(if m.is_finite() { m } else { lo / 2.0 + hi / 2.0 })
}

/// Two-pass population variance (reference implementation). `None` when empty.
pub fn population_variance(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    Some(values.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n)
}

#[derive(Debug)]
struct Pane {
    idx: u64,
    count: u64,
    sum: f64,
    mean: f64,
    m2: f64,
    min: f64,
    max: f64,
    values: Vec<f64>,
    truncated: bool,
}

impl Pane {
    fn new(idx: u64) -> Self {
        Pane {
            idx,
            count: 0,
            sum: 0.0,
            mean: 0.0,
            m2: 0.0,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
            values: Vec::new(),
            truncated: false,
        }
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// The window engine without JSON: closed windows are handed to a callback.
#[derive(Debug)]
pub struct Windows {
    size_ns: u64,
    slide_ns: u64,
    pane_ns: u64,
    values_max: usize,
    panes: VecDeque<Pane>,
    next_j: u64,
    stored_values: usize,
    scratch: Vec<f64>,
}

impl Windows {
    pub fn new(size_ns: u64, slide_ns: u64, values_per_window_max: usize) -> Result<Self, WindowError> {
        if size_ns == 0 {
            return Err(WindowError::ZeroSize);
        }
        if slide_ns == 0 {
            return Err(WindowError::ZeroSlide);
        }
        if slide_ns > size_ns {
            return Err(WindowError::SlideLargerThanSize);
        }
        let pane_ns = gcd(size_ns, slide_ns);
        let panes = size_ns / pane_ns;
        if panes > PANES_PER_WINDOW_MAX {
            return Err(WindowError::TooManyPanes { panes });
        }
        Ok(Windows {
            size_ns,
            slide_ns,
            pane_ns,
            values_max: values_per_window_max,
            panes: VecDeque::new(),
            next_j: 0,
            stored_values: 0,
            scratch: Vec::new(),
        })
    }

    /// Smallest window index whose end is after `x`.
    fn first_window_ending_after(&self, x: u64) -> u64 {
        if x < self.size_ns {
            0
        } else {
            (x - self.size_ns) / self.slide_ns + 1
        }
    }

    /// Flushes every window whose end is `<= t_ns`. `t_ns` must not go backwards.
    pub fn advance(&mut self, t_ns: u64, emit: &mut impl FnMut(&Aggregate)) {
        while let Some(front) = self.panes.front() {
            // Skip windows that hold no values (between sparse panes).
            let j = self.next_j.max(self.first_window_ending_after(front.idx * self.pane_ns));
            self.next_j = j;
            let start = j.saturating_mul(self.slide_ns);
            let end = start.saturating_add(self.size_ns);
            if end > t_ns {
                break;
            }
            let agg = self.combine(start, end);
            emit(&agg);
            self.next_j = j + 1;
            let new_start = self.next_j.saturating_mul(self.slide_ns);
            while let Some(p) = self.panes.front() {
                if p.idx.saturating_add(1).saturating_mul(self.pane_ns) > new_start {
                    break;
                }
                self.stored_values -= p.values.len();
                self.panes.pop_front();
            }
        }
    }

    fn combine(&mut self, start: u64, end: u64) -> Aggregate {
        let (mut count, mut sum, mut mean, mut m2) = (0u64, 0.0f64, 0.0f64, 0.0f64);
        let (mut min, mut max, mut truncated) = (f64::INFINITY, f64::NEG_INFINITY, false);
        self.scratch.clear();
        for p in self.panes.iter() {
            if p.idx.saturating_mul(self.pane_ns) >= end {
                break;
            }
            if p.count == 0 {
                continue;
            }
            // Chan et al. pairwise combination of (count, mean, M2).
            let n = count + p.count;
            let delta = p.mean - mean;
            mean += delta * (p.count as f64 / n as f64);
            m2 += p.m2 + delta * delta * (count as f64 * p.count as f64 / n as f64);
            count = n;
            sum += p.sum;
            min = min.min(p.min);
            max = max.max(p.max);
            truncated |= p.truncated;
            self.scratch.extend_from_slice(&p.values);
        }
        Aggregate {
            window_start_ns: start,
            window_end_ns: end,
            count,
            sum,
            avg: sum / count.max(1) as f64,
            min,
            max,
            median: median(&mut self.scratch),
            variance: (m2 / count.max(1) as f64).max(0.0),
            truncated,
        }
    }

    /// Adds one value at `t_ns` (call `advance(t_ns)` first; `t_ns` must not go backwards).
    pub fn push(&mut self, t_ns: u64, v: f64) {
        let idx = t_ns / self.pane_ns;
        let need_new = match self.panes.back() {
            Some(p) => p.idx < idx,
            None => true,
        };
        if need_new {
            self.panes.push_back(Pane::new(idx));
        }
        let Some(p) = self.panes.back_mut() else { return };
        p.count += 1;
        p.sum += v;
        let delta = v - p.mean;
        p.mean += delta / p.count as f64;
        p.m2 += delta * (v - p.mean);
        p.min = p.min.min(v);
        p.max = p.max.max(v);
        if self.stored_values < self.values_max {
            p.values.push(v);
            self.stored_values += 1;
        } else {
            p.truncated = true;
        }
    }
}

/// The `aggregate` operator: [`Windows`] plus `window` JSON lines.
pub struct WindowOp {
    stream: String,
    windows: Windows,
    clock: Clock,
    counters: OpCounters,
}

impl WindowOp {
    pub fn new(stream: &str, windows: Windows) -> Self {
        WindowOp { stream: stream.to_string(), windows, clock: Clock::default(), counters: OpCounters::default() }
    }
}

impl Operator for WindowOp {
    fn input(&self) -> Input {
        Input::Numbers
    }

    fn on_record(&mut self, rec: Record<'_>, t_ns: u64, out: &mut Vec<u8>) {
        let t_ns = crate::begin_record(&mut self.clock, &mut self.counters, t_ns);
        self.on_time(t_ns, out);
        match rec {
            Record::Value(v) => self.windows.push(t_ns, v),
            Record::Word(_) => self.counters.ignored += 1,
        }
    }

    fn on_time(&mut self, t_ns: u64, out: &mut Vec<u8>) {
        let (t_ns, _) = self.clock.advance(t_ns);
        let stream = &self.stream;
        let lines = &mut self.counters.lines;
        self.windows.advance(t_ns, &mut |a| {
            result::window(out, stream, a);
            *lines += 1;
        });
    }

    fn counters(&self) -> OpCounters {
        self.counters
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::Rng;

    #[test]
    fn median_variance_edges() {
        assert_eq!(median(&mut []), None);
        assert_eq!(population_variance(&[]), None);
        assert_eq!(median(&mut [4.0]), Some(4.0));
        assert_eq!(population_variance(&[4.0]), Some(0.0));
        assert_eq!(median(&mut [4.0, 1.0]), Some(2.5));
        assert_eq!(median(&mut [3.0, 1.0, 4.0, 1.0, 5.0, 9.0]), Some(3.5));
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&mut [-0.0, 0.0]), Some(0.0));
        assert_eq!(population_variance(&[1.0, 3.0]), Some(1.0));
        assert_eq!(median(&mut [f64::MAX, f64::MAX]), Some(f64::MAX));
    }

    #[test]
    fn single_value_window_and_empty_windows_skipped() {
        let mut w = Windows::new(100, 100, 10).unwrap();
        let mut got = Vec::new();
        w.push(5, 7.0);
        w.advance(1_000, &mut |a| got.push(a.clone()));
        w.push(1_050, 1.0);
        w.push(1_060, 3.0);
        w.advance(1_100, &mut |a| got.push(a.clone()));
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].window_start_ns, got[0].window_end_ns, got[0].count), (0, 100, 1));
        assert_eq!((got[0].median, got[0].variance), (Some(7.0), 0.0));
        assert_eq!((got[1].window_start_ns, got[1].count, got[1].median, got[1].variance), (1_000, 2, Some(2.0), 1.0));
    }

    #[test]
    fn truncation_is_reported() {
        let mut w = Windows::new(100, 100, 3).unwrap();
        let mut got = Vec::new();
        for (i, v) in [5.0, 1.0, 2.0, 100.0, 200.0].iter().enumerate() {
            w.push(i as u64, *v);
        }
        w.advance(100, &mut |a| got.push(a.clone()));
        w.push(150, 1.0);
        w.advance(200, &mut |a| got.push(a.clone()));
        assert!(got[0].truncated);
        assert_eq!(got[0].count, 5);
        assert_eq!(got[0].max, 200.0);
        assert_eq!(got[0].median, Some(2.0)); // over the first 3 values only
        assert!(!got[1].truncated, "budget is freed when a window closes");
    }

    /// Naive reference: every window j with at least one value, recomputed from scratch.
    fn naive(data: &[(u64, f64)], size: u64, slide: u64, until: u64) -> Vec<Aggregate> {
        let mut res = Vec::new();
        let mut j = 0;
        while j * slide + size <= until {
            let (s, e) = (j * slide, j * slide + size);
            let mut vals: Vec<f64> = data.iter().filter(|(t, _)| *t >= s && *t < e).map(|x| x.1).collect();
            if !vals.is_empty() {
                let sum: f64 = vals.iter().sum();
                res.push(Aggregate {
                    window_start_ns: s,
                    window_end_ns: e,
                    count: vals.len() as u64,
                    sum,
                    avg: sum / vals.len() as f64,
                    min: vals.iter().copied().fold(f64::INFINITY, f64::min),
                    max: vals.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                    variance: population_variance(&vals).unwrap(),
                    median: {
                        vals.sort_by(f64::total_cmp);
                        let n = vals.len();
                        Some(if n % 2 == 1 { vals[n / 2] } else { (vals[n / 2 - 1] + vals[n / 2]) / 2.0 })
                    },
                    truncated: false,
                });
            }
            j += 1;
        }
        res
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * (1.0 + a.abs().max(b.abs()))
    }

    #[test]
    fn random_windows_match_naive() {
        let seed = crate::testutil::seed(0x5eed_0001);
        let mut rng = Rng::new(seed);
        for (size, slide) in [(100u64, 100u64), (100, 25), (100, 30), (70, 70), (90, 60)] {
            let mut data = Vec::new();
            let mut t = 0u64;
            for _ in 0..2_000 {
                // Mostly dense, sometimes a gap of several windows.
                t += if rng.below(50) == 0 { rng.below(500) } else { rng.below(3) };
                data.push((t, rng.uniform() * 200.0 - 100.0));
            }
            let until = t + 1;
            let mut w = Windows::new(size, slide, VALUES_PER_WINDOW_MAX).unwrap();
            let mut got = Vec::new();
            for &(t, v) in &data {
                w.advance(t, &mut |a| got.push(a.clone()));
                w.push(t, v);
            }
            w.advance(until, &mut |a| got.push(a.clone()));
            let want = naive(&data, size, slide, until);
            assert_eq!(got.len(), want.len(), "seed {seed} size {size} slide {slide}");
            assert!(want.len() > 20, "the data spans many windows: {}", want.len());
            for (g, e) in got.iter().zip(&want) {
                assert_eq!(
                    (g.window_start_ns, g.window_end_ns, g.count),
                    (e.window_start_ns, e.window_end_ns, e.count),
                    "seed {seed}"
                );
                assert_eq!((g.min, g.max, g.median, g.truncated), (e.min, e.max, e.median, false), "seed {seed}");
                assert!(
                    close(g.sum, e.sum) && close(g.avg, e.avg) && close(g.variance, e.variance),
                    "seed {seed} {g:?} {e:?}"
                );
            }
        }
    }

    #[test]
    fn operator_writes_lines_and_handles_time_regression() {
        let mut op = WindowOp::new("s", Windows::new(100, 100, 10).unwrap());
        let mut out = Vec::new();
        op.on_record(Record::Value(1.0), 50, &mut out);
        op.on_record(Record::Value(3.0), 40, &mut out); // clamped to 50
        op.on_record(Record::Word("x"), 60, &mut out);
        assert!(out.is_empty());
        op.on_time(100, &mut out);
        assert_eq!(String::from_utf8(out).unwrap(), "{\"stream\":\"s\",\"type\":\"window\",\"window_start_ns\":0,\"window_end_ns\":100,\"count\":2,\"sum\":4.0,\"avg\":2.0,\"min\":1.0,\"max\":3.0,\"median\":2.0,\"variance\":1.0,\"truncated\":false}\n");
        let c = op.counters();
        assert_eq!((c.records, c.ignored, c.time_clamped, c.lines), (3, 1, 1, 1));
    }

    #[test]
    fn overflowing_sum_is_null_not_invalid_json() {
        let mut op = WindowOp::new("s", Windows::new(10, 10, 10).unwrap());
        let mut out = Vec::new();
        op.on_record(Record::Value(f64::MAX), 1, &mut out);
        op.on_record(Record::Value(f64::MAX), 2, &mut out);
        op.on_time(10, &mut out);
        let line = String::from_utf8(out).unwrap();
        assert!(line.contains("\"sum\":null,\"avg\":null,"), "{line}");
        assert!(
            line.contains("\"max\":1.7976931348623157e308,\"median\":1.7976931348623157e308,\"variance\":0.0"),
            "{line}"
        );
    }

    #[test]
    fn errors() {
        assert_eq!(Windows::new(0, 1, 1).err(), Some(WindowError::ZeroSize));
        assert_eq!(Windows::new(1, 0, 1).err(), Some(WindowError::ZeroSlide));
        assert_eq!(Windows::new(1, 2, 1).err(), Some(WindowError::SlideLargerThanSize));
        assert!(matches!(Windows::new(1_000_000, 999_999, 1), Err(WindowError::TooManyPanes { .. })));
    }
}
