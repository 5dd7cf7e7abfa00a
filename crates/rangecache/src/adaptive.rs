//! The adaptive strategy's policy: which kind of entry serves a query (the one home of the
//! rule; the cache asks [`each_row_serves`]). Not for: storing anything (crate::cache).
//!
//! Policy (session 11; per query, from its shape alone, no statistics):
//! 1. **all-row** where each-row cannot serve the query: a filter string (the cached rows are
//!    not filtered), a time range, or more than one version (each-row entries hold the newest
//!    version of every column only).
//! 2. **each-row** everywhere else: Gets, and scans with or without a column list, bounded or
//!    open-ended, with a prefix or not. Why not all-row for exact repeats, as before: a repeated
//!    each-row scan is answered from its result memo with one hash lookup as all-row is (paired
//!    runs: all-row only 1.16x faster, docs/benchmarks.md), each-row stores a row once however
//!    many overlapping ranges read it (memory 0.24-0.60 of all-row for 2-8-fold overlaps), a
//!    write invalidates one row instead of every range over it (and the row is refilled), and a
//!    new range inside cached ones is a hit. The per-shape statistics the earlier policy used
//!    (hit rate, exact repeats vs overlaps, result size; every 64 queries) chose all-row for
//!    exact repeats and so paid all-row's memory and write costs for 16%.
//!
//! Each-row mode follows the same rule (its queries of rule 1 use all-row entries too), so
//! `adaptive` and `each-row` now decide alike; `adaptive` names the per-query rule.

use crate::sidecar::codec::{ReadSpec, TS_LATEST};

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

/// Policy rule 1/2: can each-row entries serve a query reading `spec` with `filter`?
pub fn each_row_serves(spec: &ReadSpec, filter: &[u8]) -> bool {
    filter.is_empty() && each_row_servable(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every query shape: each-row unless a filter, a time range or versions rule it out.
    #[test]
    fn each_row_wherever_it_can_serve() {
        let latest = ReadSpec::latest();
        let cols = ReadSpec { columns: vec![b"f:a".to_vec()], ..ReadSpec::latest() };
        assert!(each_row_serves(&latest, b""), "whole rows");
        assert!(each_row_serves(&cols, b""), "a column list");
        assert!(!each_row_serves(&latest, b"ValueFilter(=, 'binary:x')"), "a filter");
        assert!(!each_row_serves(&ReadSpec { ts_max: 5, ..ReadSpec::latest() }, b""), "a time range");
        assert!(!each_row_serves(&ReadSpec { ts_min: 5, ..ReadSpec::latest() }, b""), "a time range");
        assert!(!each_row_serves(&ReadSpec { max_versions: 3, ..ReadSpec::latest() }, b""), "versions");
    }
}
