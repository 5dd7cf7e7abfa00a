//! The adaptive strategy's policy: which kind of entry serves a query, decided per *query
//! shape* from that shape's recent statistics (the one home of the rule; the cache asks
//! [`Shapes::each_row`] and feeds the counters). Not for: storing anything (crate::cache).
//!
//! **Shape** ([`ShapeKey`], defined only here): the table (each table keeps its own
//! [`Shapes`]), Get or Scan, the column list, and the read class (plain; a filter string; a time
//! range; more than one version). Scanner batching and sorting are applied when serving, not
//! cached, so they do not make another shape.
//!
//! **Policy** (session 12):
//! 1. A shape each-row entries cannot serve (a filter, a time range, several versions: each-row
//!    entries hold the newest version of every column, unfiltered) is all-row.
//! 2. Gets are each-row: their result is one row either way (no duplicate to save, no
//!    range to drop), and the row is then shared with every scan over it.
//! 3. A scan shape starts each-row and is decided again after every [`WINDOW`] first pages from
//!    the window's counters ([`Window`]; [`decide`]). **each-row** if any of:
//!    - *writes invalidate*: writes (through Slipstream or RegionObserver notices) into the
//!      shape's recent ranges reached [`WRITES_PER_SCAN_MIN`] per scan. Under all-row such a
//!      write drops every range over the row and the next scan re-reads the whole range from
//!      HBase (a miss: ~0.5-1 ms); under each-row one row is dropped and refilled. All-row's
//!      gain is at most ~1 us per hit (8 vs 9 us of daemon CPU per cached 100-row scan), so one
//!      write per window already outweighs it (Zipf, k = 1, 5% writes, session 11: all-row hit
//!      0.916 at 4.9k scans/s vs each-row 0.953 at 7.0k, docs/benchmarks.md);
//!    - *overlap*: at least [`OVERLAP_FRACTION_MIN`] of the rows its fills read were already
//!      inside another recent range of the shape (all-row would hold them again: memory k
//!      times for k-fold overlaps), or of its scans were *shifted* (intersecting a recent range
//!      without equalling it: an all-row miss, often an each-row hit);
//!    - *result size*: its fills average [`LARGE_RESULT_ROWS`] rows or more (a write anywhere
//!      in such a range would make all-row re-read all of it). A window of hits fills nothing:
//!      overlap and size then come from the last window that filled;
//!    - *hit rate*: the shape's exact repeats hit less often in its last all-row window than
//!      in its last each-row window (a range's first lookup after a switch finds the new kind
//!      of entry cold and is not counted), by [`HIT_RATE_MARGIN`] or more (whatever the cause —
//!      evictions, whole-table writes — all-row kept these ranges worse than each-row did); the
//!      shape then stays each-row for [`HOLD_WINDOWS`] windows, after which all-row gets
//!      another try.
//!
//!    Otherwise **all-row** (switching from each-row once [`ALL_ROW_WINDOWS_MIN`] windows in a
//!    row say so): the shape's scans repeat the same ranges, apart from one another, with small
//!    results and no writes. There all-row holds nothing twice, and an all-row hit is one hash
//!    lookup (paired runs: all-row 1.1x each-row's memo hit in session 11, within noise of it in
//!    session 12; memos were removed in session 14). Memory argued for all-row here until
//!    session 15 (each-row 1.04x all-row's accounted bytes at k = 1); since session 16 an
//!    each-row row is its encoding only (0.40x at k = 1) and a first walk costs what an all-row
//!    hit costs (docs/benchmarks.md), so this rule now stands on the hit path alone: kept, not
//!    re-measured.
//!
//! **A switch** drops the entries of the kind the shape left (crate::cache
//! `Cache::drop_after_switch`): to all-row the each-row rows inside its recent
//! ranges (not those inside a recent range of another shape still on each-row); to each-row its
//! all-row entries. The recent ranges are the ones in use: a repeat from the older half of the
//! list moves to its newest end.
//!
//! Bounds: [`SHAPES_PER_TABLE_MAX`] shapes per table (a new shape past it is decided by rules
//! 1-2 and starts each-row, untracked), [`RECENT_RANGES_MAX`] recent distinct ranges per shape,
//! [`WRITE_ROWS_OBSERVED_MAX`] rows of one write looked at.

use crate::sidecar::codec::{ReadSpec, TS_LATEST};
use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};

/// First pages of a scan shape between two decisions.
pub const WINDOW: u32 = 64;
/// Recent distinct ranges remembered per shape (to tell repeats from overlaps): a shape whose
/// hot ranges are more than this looks like new ranges (the load bench has 64).
pub const RECENT_RANGES_MAX: usize = 128;
/// Shapes tracked per table.
pub const SHAPES_PER_TABLE_MAX: usize = 256;
/// Rows of one write checked against the shapes' ranges ([`Shapes::observe_writes`]).
pub const WRITE_ROWS_OBSERVED_MAX: usize = 16;
/// Writes into the shape's ranges per scan from which each-row is chosen (rule 3a): all-row's
/// ~1 us gain per hit against one 100-row HBase read (~0.5 ms) per write = ~1/500.
pub const WRITES_PER_SCAN_MIN: f64 = 1.0 / 512.0;
/// Fraction of filled rows already in another range, or of shifted scans (rule 3b).
pub const OVERLAP_FRACTION_MIN: f64 = 1.0 / 16.0;
/// Mean rows per fill from which each-row is chosen (rule 3c).
pub const LARGE_RESULT_ROWS: u64 = 1000;
/// All-row's window hit rate this far below each-row's sends the shape back (rule 3d).
pub const HIT_RATE_MARGIN: f64 = 0.05;
/// Windows a shape stays each-row after the hit-rate rule.
pub const HOLD_WINDOWS: u32 = 8;
/// Windows in a row that must say all-row before an each-row shape switches: a switch finds
/// the new kind of entry cold (and, before session 13, left the other kind's entries until they
/// were evicted; now the cache drops them: `Cache::drop_after_switch`) (Zipf, k = 1,
/// 5% writes: switching on single quiet windows held both kinds, 1.52x all-row's memory, hit
/// ratio 0.928 vs each-row's 0.940; docs/benchmarks.md session 12). Back to each-row is at once.
pub const ALL_ROW_WINDOWS_MIN: u32 = 4;

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

/// Is `spec` what each-row entries hold (newest version of every column, no time range)?
pub fn each_row_servable(spec: &ReadSpec) -> bool {
    spec.max_versions == 1 && spec.ts_min == 0 && spec.ts_max == TS_LATEST
}

/// Policy rule 1: can each-row entries serve a query reading `spec` with `filter`?
pub fn each_row_serves(spec: &ReadSpec, filter: &[u8]) -> bool {
    filter.is_empty() && each_row_servable(spec)
}

/// What a query reads besides its columns, as far as the policy cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReadClass {
    Plain,
    Filter,
    TimeRange,
    Versions,
}

/// A query shape (see the module doc); the table is the [`Shapes`] it lives in.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ShapeKey {
    pub get: bool,
    pub columns: Vec<Vec<u8>>,
    pub class: ReadClass,
}

impl ShapeKey {
    pub fn of(get: bool, spec: &ReadSpec, filter: &[u8]) -> ShapeKey {
        ShapeKey { get, columns: spec.columns.clone(), class: class_of(spec, filter) }
    }
}

fn class_of(spec: &ReadSpec, filter: &[u8]) -> ReadClass {
    if !filter.is_empty() {
        ReadClass::Filter
    } else if spec.max_versions != 1 {
        ReadClass::Versions
    } else if !each_row_servable(spec) {
        ReadClass::TimeRange
    } else {
        ReadClass::Plain
    }
}

/// The shape's hash, computed without building a [`ShapeKey`] (no allocation per query).
fn shape_hash(get: bool, spec: &ReadSpec, filter: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    get.hash(&mut h);
    spec.columns.hash(&mut h);
    class_of(spec, filter).hash(&mut h);
    h.finish()
}

/// One window's counters of a scan shape (what [`decide`] reads).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Window {
    /// First pages looked up.
    pub scans: u32,
    /// Of them answered from the cache.
    pub hits: u32,
    /// Of them equal to a recent range of the shape already looked up since the last switch of
    /// strategy, and of those the ones answered.
    pub repeats: u32,
    pub repeat_hits: u32,
    /// Of them intersecting a recent range without equalling it.
    pub shifted: u32,
    /// Fills stored, the rows they read, and of those rows the ones inside another recent range.
    pub fills: u32,
    pub fill_rows: u64,
    pub dup_rows: u64,
    /// Written rows (writes through Slipstream, observer notices) inside a recent range.
    pub writes: u32,
}

/// Repeats in a window from which its repeat hit rate is recorded (rule 3d).
const REPEATS_FOR_RATE_MIN: u32 = WINDOW / 8;

impl Window {
    /// The hit rate of exact repeats (the queries all-row exists for), if there were enough.
    fn repeat_hit_rate(&self) -> Option<f64> {
        (self.repeats >= REPEATS_FOR_RATE_MIN).then(|| self.repeat_hits as f64 / self.repeats as f64)
    }
}

/// What a shape remembers across windows (rule 3d).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct History {
    /// Repeat hit rate of the last window run under each strategy (with enough repeats); the
    /// all-row one is forgotten when a hold ends (all-row gets another try).
    pub all_row_hit_rate: Option<f64>,
    pub each_row_hit_rate: Option<f64>,
    /// Windows left to stay each-row.
    pub hold: u32,
    /// (fills, rows filled, duplicate rows) of the last window that had fills: a window of
    /// hits has none, and overlap and size seen while filling still hold for the cached ranges.
    pub last_fills: Option<(u32, u64, u64)>,
}

/// Why [`decide`] chose what it chose (for tests and the docs' examples).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    Writes,
    Overlap,
    LargeResults,
    HitRate,
    Repeats,
}

/// Policy rule 3 on one finished window of a scan shape.
pub fn decide(w: &Window, h: &History) -> (Strategy, Reason) {
    let scans = w.scans.max(1) as f64;
    if h.hold > 0 {
        return (Strategy::EachRow, Reason::HitRate);
    }
    if w.writes as f64 / scans >= WRITES_PER_SCAN_MIN {
        return (Strategy::EachRow, Reason::Writes);
    }
    let (fills, fill_rows, dup_rows) = match (w.fills, h.last_fills) {
        (0, Some(last)) => last,
        _ => (w.fills, w.fill_rows, w.dup_rows),
    };
    let dup = dup_rows as f64 / fill_rows.max(1) as f64;
    if dup >= OVERLAP_FRACTION_MIN || w.shifted as f64 / scans >= OVERLAP_FRACTION_MIN {
        return (Strategy::EachRow, Reason::Overlap);
    }
    if fills > 0 && fill_rows / fills as u64 >= LARGE_RESULT_ROWS {
        return (Strategy::EachRow, Reason::LargeResults);
    }
    if let (Some(a), Some(e)) = (h.all_row_hit_rate, h.each_row_hit_rate) {
        if a + HIT_RATE_MARGIN <= e {
            return (Strategy::EachRow, Reason::HitRate);
        }
    }
    (Strategy::AllRow, Reason::Repeats)
}

/// Do [a, b) and [c, d) intersect? (Empty stop = end of table.)
pub(crate) fn intersects(a: &[u8], b: &[u8], c: &[u8], d: &[u8]) -> bool {
    (b.is_empty() || c < b) && (d.is_empty() || a < d)
}

pub(crate) fn inside(row: &[u8], start: &[u8], stop: &[u8]) -> bool {
    row >= start && (stop.is_empty() || row < stop)
}

/// One recent range of a shape.
#[derive(Debug)]
struct Recent {
    /// Of (start, stop), compared first (most lookups are repeats of one of many ranges).
    hash: u64,
    start: Vec<u8>,
    stop: Vec<u8>,
    /// Looked up since the last switch of strategy (its first lookup after a switch finds the
    /// new kind of entry cold, which says nothing about the strategy: not counted in the
    /// repeat hit rate).
    warm: bool,
}

impl Recent {
    fn is(&self, hash: u64, start: &[u8], stop: &[u8]) -> bool {
        self.hash == hash && self.start == start && self.stop == stop
    }
}

fn range_hash(start: &[u8], stop: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    start.hash(&mut h);
    stop.hash(&mut h);
    h.finish()
}

/// A scan shape's state: its choice, the current window, its history, its recent ranges.
#[derive(Debug)]
pub struct Shape {
    key: ShapeKey,
    choice: Strategy,
    window: Window,
    history: History,
    /// Recent distinct ranges, oldest first.
    recent: VecDeque<Recent>,
    /// Windows in a row, while on each-row, that [`decide`] said all-row.
    all_row_streak: u32,
    decisions_all_row: u64,
    decisions_each_row: u64,
}

impl Shape {
    fn new(key: ShapeKey) -> Shape {
        Shape {
            key,
            choice: Strategy::EachRow,
            window: Window::default(),
            history: History::default(),
            recent: VecDeque::new(),
            all_row_streak: 0,
            decisions_all_row: 0,
            decisions_each_row: 0,
        }
    }

    pub fn choice(&self) -> Strategy {
        self.choice
    }

    /// Records a scan's first page of [start, stop) and whether the cache answered it.
    /// Returns the new strategy when this scan ended a window that switched the shape (the
    /// cache then drops the old kind's entries of the shape: [`Shape::recent_ranges`]).
    pub fn observe_scan(&mut self, start: &[u8], stop: &[u8], hit: bool) -> Option<Strategy> {
        let w = &mut self.window;
        w.scans += 1;
        w.hits += hit as u32;
        let hash = range_hash(start, stop);
        if let Some(i) = self.recent.iter().position(|r| r.is(hash, start, stop)) {
            let r = &mut self.recent[i];
            if std::mem::replace(&mut r.warm, true) {
                w.repeats += 1;
                w.repeat_hits += hit as u32;
            }
            // A repeat from the older half moves to the newest end, so the ranges remembered
            // are the ones in use (what a switch drops), not the first ones seen; the newer
            // half stays put (no move per hit for the hottest ranges).
            if i < self.recent.len() / 2 {
                if let Some(r) = self.recent.remove(i) {
                    self.recent.push_back(r);
                }
            }
        } else {
            if self.recent.iter().any(|r| intersects(&r.start, &r.stop, start, stop)) {
                w.shifted += 1;
            }
            if self.recent.len() >= RECENT_RANGES_MAX {
                self.recent.pop_front();
            }
            self.recent.push_back(Recent { hash, start: start.to_vec(), stop: stop.to_vec(), warm: true });
        }
        if w.scans < WINDOW {
            return None;
        }
        let before = self.choice;
        self.end_window();
        (self.choice != before).then_some(self.choice)
    }

    /// The shape's recent ranges (start, stop), oldest first.
    pub fn recent_ranges(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.recent.iter().map(|r| (r.start.as_slice(), r.stop.as_slice()))
    }

    /// Records the fill of a scan of [start, stop) with the keys of the rows it read: how many
    /// of them lie inside another recent range of the shape (rows all-row would hold twice).
    /// Only a first page counts (its range was recorded by its lookup); a later page of the same
    /// scan starts elsewhere and would count its own scan's range as another.
    pub fn observe_fill<'a>(&mut self, start: &[u8], stop: &[u8], rows: impl Iterator<Item = &'a [u8]>) {
        let hash = range_hash(start, stop);
        if !self.recent.iter().any(|r| r.is(hash, start, stop)) {
            return;
        }
        let others: Vec<(&[u8], &[u8])> = self
            .recent
            .iter()
            .filter(|r| !r.is(hash, start, stop) && intersects(&r.start, &r.stop, start, stop))
            .map(|r| (r.start.as_slice(), r.stop.as_slice()))
            .collect();
        let (mut n, mut dup) = (0u64, 0u64);
        for r in rows {
            n += 1;
            dup += others.iter().any(|(a, b)| inside(r, a, b)) as u64;
        }
        self.window.fills += 1;
        self.window.fill_rows += n;
        self.window.dup_rows += dup;
    }

    /// Records a written row (counted if inside one of the shape's recent ranges).
    fn observe_write(&mut self, row: &[u8]) {
        if self.recent.iter().any(|r| inside(row, &r.start, &r.stop)) {
            self.window.writes += 1;
        }
    }

    fn end_window(&mut self) {
        if let Some(rate) = self.window.repeat_hit_rate() {
            match self.choice {
                Strategy::AllRow => self.history.all_row_hit_rate = Some(rate),
                _ => self.history.each_row_hit_rate = Some(rate),
            }
        }
        let (mut choice, reason) = decide(&self.window, &self.history);
        // Each-row -> all-row only after ALL_ROW_WINDOWS_MIN windows in a row say so.
        if choice == Strategy::AllRow && self.choice != Strategy::AllRow {
            self.all_row_streak += 1;
            if self.all_row_streak < ALL_ROW_WINDOWS_MIN {
                choice = self.choice;
            }
        } else {
            self.all_row_streak = 0;
        }
        if self.window.fills > 0 {
            self.history.last_fills = Some((self.window.fills, self.window.fill_rows, self.window.dup_rows));
        }
        if self.history.hold > 0 {
            self.history.hold -= 1;
            if self.history.hold == 0 {
                self.history.all_row_hit_rate = None;
            }
        } else if reason == Reason::HitRate {
            self.history.hold = HOLD_WINDOWS;
        }
        if choice != self.choice {
            for r in self.recent.iter_mut() {
                r.warm = false;
            }
        }
        self.choice = choice;
        match choice {
            Strategy::AllRow => self.decisions_all_row += 1,
            _ => self.decisions_each_row += 1,
        }
        self.window = Window::default();
    }
}

/// One table's scan shapes (bounded by [`SHAPES_PER_TABLE_MAX`]), by shape hash.
#[derive(Debug, Default)]
pub struct Shapes {
    by_hash: HashMap<u64, Shape>,
}

impl Shapes {
    /// Should a query of this shape use each-row entries? (Rules 1-3; `get` = a Get.)
    pub fn each_row(&self, get: bool, spec: &ReadSpec, filter: &[u8]) -> bool {
        if !each_row_serves(spec, filter) {
            return false;
        }
        if get {
            return true;
        }
        self.find(get, spec, filter).is_none_or(|s| s.choice == Strategy::EachRow)
    }

    fn find(&self, get: bool, spec: &ReadSpec, filter: &[u8]) -> Option<&Shape> {
        let s = self.by_hash.get(&shape_hash(get, spec, filter))?;
        // A hash collision with another shape reads as untracked.
        (s.key.get == get && s.key.columns == spec.columns && s.key.class == class_of(spec, filter)).then_some(s)
    }

    /// The tracked scan shape of a query (made if there is room), None for shapes rules 1-2
    /// decide.
    pub fn scan_shape(&mut self, spec: &ReadSpec, filter: &[u8]) -> Option<&mut Shape> {
        if !each_row_serves(spec, filter) {
            return None;
        }
        let h = shape_hash(false, spec, filter);
        if !self.by_hash.contains_key(&h) && self.by_hash.len() >= SHAPES_PER_TABLE_MAX {
            return None;
        }
        let s = self.by_hash.entry(h).or_insert_with(|| Shape::new(ShapeKey::of(false, spec, filter)));
        (s.key.columns == spec.columns && s.key.class == class_of(spec, filter)).then_some(s)
    }

    /// Rows of the table are being written: every tracked shape counts those inside its recent
    /// ranges. Only the first [`WRITE_ROWS_OBSERVED_MAX`] rows of a write are looked at, which
    /// bounds the work under the cache's lock (rows x shapes x recent ranges comparisons) for
    /// large batches; a write of that many rows already says "writes invalidate" (rule 3).
    pub fn observe_writes(&mut self, rows: &[Vec<u8>]) {
        for row in rows.iter().take(WRITE_ROWS_OBSERVED_MAX) {
            for s in self.by_hash.values_mut() {
                s.observe_write(row);
            }
        }
    }

    /// The recent ranges of every tracked shape on each-row other than the scan shape of
    /// (`spec`, `filter`): rows a switch of that shape to all-row must leave cached.
    pub fn each_row_ranges_of_others(&self, spec: &ReadSpec, filter: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
        let h = shape_hash(false, spec, filter);
        self.by_hash
            .iter()
            .filter(|(k, s)| **k != h && s.choice == Strategy::EachRow)
            .flat_map(|(_, s)| s.recent_ranges().map(|(a, b)| (a.to_vec(), b.to_vec())))
            .collect()
    }

    /// Tracked shapes currently on all-row and on each-row.
    pub fn counts(&self) -> (u64, u64) {
        let all = self.by_hash.values().filter(|s| s.choice == Strategy::AllRow).count() as u64;
        (all, self.by_hash.len() as u64 - all)
    }

    /// Window decisions made so far for all-row and for each-row, over every shape.
    pub fn decisions(&self) -> (u64, u64) {
        self.by_hash.values().fold((0, 0), |(a, e), s| (a + s.decisions_all_row, e + s.decisions_each_row))
    }

    pub fn clear(&mut self) {
        self.by_hash.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u32) -> Vec<u8> {
        format!("r{i:06}").into_bytes()
    }

    /// Rules 1-2: each-row only where each-row can serve; Gets each-row whatever the stats.
    #[test]
    fn shapes_each_row_cannot_serve_are_all_row_and_gets_each_row() {
        let latest = ReadSpec::latest();
        let cols = ReadSpec { columns: vec![b"f:a".to_vec()], ..ReadSpec::latest() };
        assert!(each_row_serves(&latest, b""), "whole rows");
        assert!(each_row_serves(&cols, b""), "a column list");
        assert!(!each_row_serves(&latest, b"ValueFilter(=, 'binary:x')"), "a filter");
        assert!(!each_row_serves(&ReadSpec { ts_max: 5, ..ReadSpec::latest() }, b""), "a time range");
        assert!(!each_row_serves(&ReadSpec { ts_min: 5, ..ReadSpec::latest() }, b""), "a time range");
        assert!(!each_row_serves(&ReadSpec { max_versions: 3, ..ReadSpec::latest() }, b""), "versions");
        let mut shapes = Shapes::default();
        assert!(shapes.each_row(true, &latest, b""), "a Get");
        assert!(!shapes.each_row(true, &latest, b"KeyOnlyFilter()"), "a filtered Get");
        assert!(shapes.each_row(false, &latest, b""), "a new scan shape starts each-row");
        assert!(shapes.scan_shape(&latest, b"KeyOnlyFilter()").is_none(), "not tracked");
        // A scan shape turned all-row leaves Gets of the same columns each-row.
        let s = shapes.scan_shape(&latest, b"").expect("tracked");
        for i in 0..WINDOW * ALL_ROW_WINDOWS_MIN {
            s.observe_scan(&key(i % 4 * 1000), &key(i % 4 * 1000 + 100), true);
        }
        assert_eq!(s.choice(), Strategy::AllRow);
        assert!(!shapes.each_row(false, &latest, b""));
        assert!(shapes.each_row(true, &latest, b""));
        assert!(shapes.each_row(false, &cols, b""), "another column list is another shape");
    }

    /// Rule 3 on synthetic counters: each condition alone decides, and its threshold is where.
    #[test]
    fn the_decision_follows_the_counters() {
        let calm = Window { scans: 64, hits: 60, repeats: 60, fills: 4, fill_rows: 400, ..Window::default() };
        let none = History::default();
        assert_eq!(decide(&calm, &none), (Strategy::AllRow, Reason::Repeats), "exact repeats, small, no writes");
        assert_eq!(decide(&Window { writes: 1, ..calm }, &none), (Strategy::EachRow, Reason::Writes));
        let few = Window { scans: 1024, writes: 1, ..calm };
        assert_eq!(decide(&few, &none).0, Strategy::AllRow, "1 write per 1024 scans is under 1/512");
        assert_eq!(decide(&Window { dup_rows: 25, ..calm }, &none), (Strategy::EachRow, Reason::Overlap), "25 of 400");
        assert_eq!(decide(&Window { dup_rows: 24, ..calm }, &none).0, Strategy::AllRow, "24 of 400 < 1/16");
        assert_eq!(decide(&Window { shifted: 4, ..calm }, &none), (Strategy::EachRow, Reason::Overlap), "4 of 64");
        assert_eq!(decide(&Window { shifted: 3, ..calm }, &none).0, Strategy::AllRow);
        let large = Window { fills: 2, fill_rows: 2000, ..calm };
        assert_eq!(decide(&large, &none), (Strategy::EachRow, Reason::LargeResults));
        let worse = History { all_row_hit_rate: Some(0.80), each_row_hit_rate: Some(0.95), ..none };
        assert_eq!(decide(&calm, &worse), (Strategy::EachRow, Reason::HitRate));
        let close = History { all_row_hit_rate: Some(0.93), each_row_hit_rate: Some(0.95), ..none };
        assert_eq!(decide(&calm, &close).0, Strategy::AllRow, "within the margin");
        assert_eq!(decide(&calm, &History { hold: 1, ..none }).0, Strategy::EachRow, "held");
        // A window of hits fills nothing: the overlap and size of the last filling window count.
        let hits = Window { fills: 0, fill_rows: 0, ..calm };
        assert_eq!(decide(&hits, &none).0, Strategy::AllRow);
        let overlapped = History { last_fills: Some((4, 400, 100)), ..none };
        assert_eq!(decide(&hits, &overlapped), (Strategy::EachRow, Reason::Overlap));
        assert_eq!(decide(&calm, &overlapped).0, Strategy::AllRow, "this window's own fills first");
        let large = History { last_fills: Some((1, 5000, 0)), ..none };
        assert_eq!(decide(&hits, &large), (Strategy::EachRow, Reason::LargeResults));
    }

    /// Through a shape's own observations: exact repeats go all-row, sliding ranges each-row,
    /// a write into its ranges each-row, and a worse all-row hit rate holds it on each-row.
    #[test]
    fn a_shape_decides_from_what_it_observed() {
        let mut s = Shape::new(ShapeKey::of(false, &ReadSpec::latest(), b""));
        assert_eq!(s.choice(), Strategy::EachRow, "starts each-row");
        let repeats = |s: &mut Shape, hit: bool| {
            for i in 0..WINDOW {
                let (a, b) = (key(i % 4 * 1000), key(i % 4 * 1000 + 100));
                s.observe_scan(&a, &b, hit || i >= 4);
                if i < 4 && !hit {
                    s.observe_fill(&a, &b, (0..100).map(|_| &b"x"[..]));
                }
            }
        };
        // Each-row -> all-row only after ALL_ROW_WINDOWS_MIN windows of repeats in a row.
        let to_all_row = |s: &mut Shape, hit: bool| {
            for n in 1..=ALL_ROW_WINDOWS_MIN {
                repeats(s, hit);
                let want = if n < ALL_ROW_WINDOWS_MIN { Strategy::EachRow } else { Strategy::AllRow };
                assert_eq!(s.choice(), want, "window {n}");
            }
        };
        to_all_row(&mut s, false);
        for i in 0..WINDOW {
            s.observe_scan(&key(i * 10), &key(i * 10 + 100), false);
        }
        assert_eq!(s.choice(), Strategy::EachRow, "sliding ranges: at once");
        repeats(&mut s, false);
        for i in 0..WINDOW {
            // New sliding ranges (the earlier ones are repeats of recent ranges now).
            s.observe_scan(&key(i * 10 + 5), &key(i * 10 + 105), false);
        }
        // That window of overlap started the streak again: four more windows of repeats.
        to_all_row(&mut s, false);
        // Fills of overlapping ranges: the rows inside another recent range count as duplicates.
        let mut o = Shape::new(ShapeKey::of(false, &ReadSpec::latest(), b""));
        o.observe_scan(&key(0), &key(100), false);
        o.observe_scan(&key(50), &key(150), false);
        let rows: Vec<Vec<u8>> = (50..150).map(key).collect();
        o.observe_fill(&key(50), &key(150), rows.iter().map(Vec::as_slice));
        assert_eq!((o.window.fill_rows, o.window.dup_rows), (100, 50));
        o.observe_fill(&key(100), &key(150), rows[50..].iter().map(Vec::as_slice));
        assert_eq!(o.window.fills, 1, "a later page of a scan is not a fill of its own");
        // One write inside a recent range in a window of repeats: each-row.
        for i in 0..WINDOW {
            if i == 10 {
                s.observe_write(&key(1050));
                s.observe_write(&key(999_999)); // outside every range: not counted
            }
            s.observe_scan(&key(i % 4 * 1000), &key(i % 4 * 1000 + 100), true);
        }
        assert_eq!(s.choice(), Strategy::EachRow, "a write into its ranges");
        // Each-row hit every repeat; all-row then hits only half: back to each-row, held.
        to_all_row(&mut s, true);
        let half = |s: &mut Shape| {
            for i in 0..WINDOW {
                s.observe_scan(&key(i % 4 * 1000), &key(i % 4 * 1000 + 100), i % 2 == 0);
            }
        };
        half(&mut s);
        assert_eq!((s.choice(), s.history.hold), (Strategy::EachRow, HOLD_WINDOWS));
        for _ in 0..HOLD_WINDOWS {
            repeats(&mut s, true);
            assert_eq!(s.choice(), Strategy::EachRow, "held");
        }
        to_all_row(&mut s, true);
    }

    /// A write's rows are counted per shape whose recent ranges hold them, at most
    /// WRITE_ROWS_OBSERVED_MAX of one write.
    #[test]
    fn writes_count_for_the_shapes_whose_ranges_they_hit() {
        let mut shapes = Shapes::default();
        let cols = |c: &str| ReadSpec { columns: vec![c.as_bytes().to_vec()], ..ReadSpec::latest() };
        shapes.scan_shape(&cols("f:a"), b"").expect("a").observe_scan(&key(0), &key(100), false);
        shapes.scan_shape(&cols("f:b"), b"").expect("b").observe_scan(&key(500), &key(600), false);
        let many: Vec<Vec<u8>> = (0..100).map(key).collect();
        shapes.observe_writes(&many);
        shapes.observe_writes(&[key(550), key(9000)]);
        let a = shapes.scan_shape(&cols("f:a"), b"").expect("a").window.writes;
        let b = shapes.scan_shape(&cols("f:b"), b"").expect("b").window.writes;
        assert_eq!((a, b), (WRITE_ROWS_OBSERVED_MAX as u32, 1));
    }

    #[test]
    fn the_table_of_shapes_is_bounded() {
        let mut shapes = Shapes::default();
        for i in 0..SHAPES_PER_TABLE_MAX + 10 {
            let spec = ReadSpec { columns: vec![format!("f:{i}").into_bytes()], ..ReadSpec::latest() };
            let tracked = shapes.scan_shape(&spec, b"").is_some();
            assert_eq!(tracked, i < SHAPES_PER_TABLE_MAX, "{i}");
            assert!(shapes.each_row(false, &spec, b""), "untracked shapes are each-row");
        }
        assert_eq!(shapes.by_hash.len(), SHAPES_PER_TABLE_MAX);
    }

    #[test]
    fn intersection_of_half_open_ranges() {
        assert!(intersects(b"a", b"c", b"b", b"d"));
        assert!(!intersects(b"a", b"b", b"b", b"c"));
        assert!(intersects(b"a", b"", b"x", b"y"));
        assert!(intersects(b"x", b"y", b"a", b""));
    }
}
