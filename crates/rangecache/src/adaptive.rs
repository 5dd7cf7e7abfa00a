//! The adaptive strategy: chooses all-row or each-row per *query shape* (table, kind — Get or
//! Scan —, columns, time range, versions) from what that shape's recent queries did. Not for:
//! storing anything (the cache does); this only keeps a few counters and recent ranges per shape.
//!
//! Policy (evaluated every `WINDOW` queries of a shape; a new shape starts on all-row):
//! 1. Shapes each-row cannot serve (a filter, a time range, several versions) are all-row.
//! 2. Gets are each-row: one row either way, and the row is shared with every scan over it.
//! 3. A scan shape whose hit rate in the window was at least `HIT_RATE_KEEP` keeps its strategy
//!    (what works is not churned).
//! 4. Otherwise each-row if its results are large (mean rows per query at least
//!    `LARGE_RESULT_ROWS`: overlapping all-row entries would duplicate them in memory), or if more
//!    queries *overlapped* a recent different range than *repeated* a recent range exactly (all-row
//!    would miss on the shifted ranges and store their common rows again); all-row when exact
//!    repeats dominate (its hit is one hash lookup, the fastest).

use std::collections::VecDeque;

/// Queries of a shape between two decisions.
pub const WINDOW: u32 = 64;
/// Recent ranges remembered per shape to tell exact repeats from overlaps.
const RECENT_RANGES_MAX: usize = 32;
/// A window hit rate at or above this keeps the current strategy.
pub const HIT_RATE_KEEP: f64 = 0.9;
/// Mean result rows at or above this choose each-row.
pub const LARGE_RESULT_ROWS: u64 = 1000;

/// Which strategy serves scans.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    AllRow,
    EachRow,
    /// Per query shape (crate::adaptive).
    Adaptive,
}

impl Strategy {
    pub fn parse(s: &str) -> Result<Strategy, String> {
        match s {
            "all-row" | "allrow" => Ok(Strategy::AllRow),
            "each-row" | "eachrow" => Ok(Strategy::EachRow),
            "adaptive" => Ok(Strategy::Adaptive),
            other => Err(format!("unknown strategy {other:?} (all-row, each-row, adaptive)")),
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Strategy::AllRow => "all-row",
            Strategy::EachRow => "each-row",
            Strategy::Adaptive => "adaptive",
        }
    }
}

/// What one shape's recent queries did, and its current choice.
#[derive(Debug)]
pub struct Shape {
    choice: Strategy,
    recent: VecDeque<(Vec<u8>, Vec<u8>)>,
    queries: u32,
    hits: u32,
    exact: u32,
    overlap: u32,
    result_rows: u64,
    results: u32,
}

impl Default for Shape {
    fn default() -> Shape {
        Shape {
            choice: Strategy::AllRow,
            recent: VecDeque::new(),
            queries: 0,
            hits: 0,
            exact: 0,
            overlap: 0,
            result_rows: 0,
            results: 0,
        }
    }
}

/// Do [a, b) and [c, d) intersect? (Empty stop = end of table.)
fn intersects(a: &[u8], b: &[u8], c: &[u8], d: &[u8]) -> bool {
    (b.is_empty() || c < b) && (d.is_empty() || a < d)
}

impl Shape {
    pub fn choice(&self) -> Strategy {
        self.choice
    }

    /// Records a scan of [start, stop) and whether the cache answered it.
    pub fn observe(&mut self, start: &[u8], stop: &[u8], hit: bool) {
        self.queries += 1;
        self.hits += hit as u32;
        if self.recent.iter().any(|(a, b)| a == start && b == stop) {
            self.exact += 1;
        } else {
            if self.recent.iter().any(|(a, b)| intersects(a, b, start, stop)) {
                self.overlap += 1;
            }
            if self.recent.len() >= RECENT_RANGES_MAX {
                self.recent.pop_front();
            }
            self.recent.push_back((start.to_vec(), stop.to_vec()));
        }
        if self.queries >= WINDOW {
            self.decide();
        }
    }

    /// Records how many rows a query read from HBase.
    pub fn observe_result(&mut self, rows: usize) {
        self.result_rows += rows as u64;
        self.results += 1;
    }

    fn decide(&mut self) {
        let hit_rate = self.hits as f64 / self.queries.max(1) as f64;
        let mean_rows = self.result_rows / self.results.max(1) as u64;
        if hit_rate < HIT_RATE_KEEP {
            self.choice = if mean_rows >= LARGE_RESULT_ROWS || self.overlap > self.exact {
                Strategy::EachRow
            } else {
                Strategy::AllRow
            };
        }
        self.queries = 0;
        self.hits = 0;
        self.exact = 0;
        self.overlap = 0;
        self.result_rows = 0;
        self.results = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u32) -> Vec<u8> {
        format!("r{i:06}").into_bytes()
    }

    #[test]
    fn exact_repeats_choose_all_row_and_shifted_ranges_choose_each_row() {
        let mut s = Shape::default();
        // A few hot ranges repeated, and mostly missing: all-row (the repeats dominate).
        for i in 0..WINDOW {
            s.observe(&key(i % 4 * 1000), &key(i % 4 * 1000 + 100), false);
            s.observe_result(100);
        }
        assert_eq!(s.choice(), Strategy::AllRow);
        // Sliding windows (each overlaps the previous, none repeats): each-row.
        for i in 0..WINDOW {
            s.observe(&key(i * 10), &key(i * 10 + 100), false);
            s.observe_result(100);
        }
        assert_eq!(s.choice(), Strategy::EachRow);
        // Back to exact repeats: all-row again.
        for i in 0..WINDOW {
            s.observe(&key(i % 2 * 5000), &key(i % 2 * 5000 + 100), false);
        }
        assert_eq!(s.choice(), Strategy::AllRow);
    }

    #[test]
    fn large_results_choose_each_row_and_a_high_hit_rate_keeps_the_choice() {
        let mut s = Shape::default();
        for i in 0..WINDOW {
            s.observe(&key(i % 2 * 50_000), &key(i % 2 * 50_000 + 5000), false);
            s.observe_result(5000);
        }
        assert_eq!(s.choice(), Strategy::EachRow, "large results");
        // Sliding ranges now all hit: the choice stays, whatever the shape of the ranges.
        let mut s = Shape::default();
        for i in 0..WINDOW {
            s.observe(&key(i * 10), &key(i * 10 + 100), true);
        }
        assert_eq!(s.choice(), Strategy::AllRow, "kept at a high hit rate");
    }

    #[test]
    fn intersection_of_half_open_ranges() {
        assert!(intersects(b"a", b"c", b"b", b"d"));
        assert!(!intersects(b"a", b"b", b"b", b"c"));
        assert!(intersects(b"a", b"", b"x", b"y"));
        assert!(intersects(b"x", b"y", b"a", b""));
    }
}
