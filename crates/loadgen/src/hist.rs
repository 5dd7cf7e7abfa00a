//! Latency histogram for the load generator: the `hdrhistogram` crate (3 significant digits,
//! auto-resizing, so any u64 nanosecond latency is recorded) behind the few calls the report
//! needs. Not a general statistics library.

/// Significant decimal digits kept per value: relative error at most 0.1%.
const SIGNIFICANT_DIGITS: u8 = 3;

#[derive(Clone)]
pub struct Histogram {
    h: hdrhistogram::Histogram<u64>,
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

impl Histogram {
    pub fn new() -> Self {
        // 3 significant digits is within hdrhistogram's 0..=5; the constructor only fails
        // outside that, so the fallback (1 digit) is never taken.
        let h = hdrhistogram::Histogram::new(SIGNIFICANT_DIGITS)
            .or_else(|_| hdrhistogram::Histogram::new(1))
            .unwrap_or_else(|_| unreachable!("hdrhistogram accepts 1 significant digit"));
        Histogram { h }
    }

    #[inline]
    pub fn record(&mut self, value: u64) {
        // `record` grows the auto-resizing histogram to fit the value (saturating_record would
        // clamp to the current range instead); it only fails if growing fails, then clamp.
        if self.h.record(value).is_err() {
            self.h.saturating_record(value);
        }
    }

    pub fn merge(&mut self, other: &Histogram) {
        // Both auto-resize, so adding never runs out of range; if it ever did, the counts of
        // `other` are recorded value by value instead of being lost.
        if self.h.add(&other.h).is_err() {
            for v in other.h.iter_recorded() {
                if self.h.record_n(v.value_iterated_to(), v.count_at_value()).is_err() {
                    self.h.saturating_record_n(v.value_iterated_to(), v.count_at_value());
                }
            }
        }
    }

    pub fn count(&self) -> u64 {
        self.h.len()
    }

    pub fn max(&self) -> u64 {
        self.h.max()
    }

    pub fn min(&self) -> u64 {
        if self.h.is_empty() {
            0
        } else {
            self.h.min()
        }
    }

    pub fn mean(&self) -> f64 {
        if self.h.is_empty() {
            0.0
        } else {
            self.h.mean()
        }
    }

    /// Value at quantile `q` (0.0..=1.0), 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.h.is_empty() {
            return 0;
        }
        self.h.value_at_quantile(q.clamp(0.0, 1.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_of_uniform_samples() {
        let mut h = Histogram::new();
        for v in 1..=100_000u64 {
            h.record(v * 10);
        }
        let p50 = h.quantile(0.5) as f64;
        let p99 = h.quantile(0.99) as f64;
        assert!((p50 - 500_000.0).abs() / 500_000.0 < 0.01, "p50 {p50}");
        assert!((p99 - 990_000.0).abs() / 990_000.0 < 0.01, "p99 {p99}");
        assert!((h.quantile(1.0) as f64 - 1_000_000.0).abs() / 1_000_000.0 < 0.001);
        assert_eq!(h.min(), 10);
        assert_eq!(h.count(), 100_000);
        assert!((h.mean() - 500_005.0).abs() / 500_005.0 < 0.001, "mean {}", h.mean());
    }

    #[test]
    fn huge_values_and_merge() {
        let mut a = Histogram::new();
        let mut b = Histogram::new();
        a.record(5);
        b.record(1_000_000);
        b.record(7);
        b.record(u64::MAX / 2);
        a.merge(&b);
        assert_eq!(a.count(), 4);
        assert_eq!(a.min(), 5);
        assert!(a.max() >= u64::MAX / 2);
        assert_eq!(a.quantile(0.5), 7);
        assert_eq!(Histogram::new().quantile(0.5), 0);
        assert_eq!((Histogram::new().min(), Histogram::new().max()), (0, 0));
    }
}
