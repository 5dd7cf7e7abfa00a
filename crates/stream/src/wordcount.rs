//! wordcount: exact counts per word per tumbling event-time window.
//!
//! What it is for: the `wordcount` operator. Window `k` covers `[k*window, (k+1)*window)` of
//! `t_ns`; when event time reaches its end the window is flushed as one `wordcount` line (words
//! sorted by bytes, so output is deterministic) and all counts reset. Windows with no words
//! produce no line. At most `distinct_words_max` different words are tracked per window; an
//! occurrence of a further new word is not tracked but is counted in `overflow` (and in
//! `total`), so the line always says how much it does not itemise.
//!
//! What it is not for: parsing (`record` splits words), numeric windows (`window`).

use std::collections::HashMap;

/// The word maps' hasher: seeded per map from process randomness (words come from the
/// network), and much cheaper than the default SipHash for short keys (it was the largest
/// per-word cost of the user-space engine in `perf`).
type WordHasher = foldhash::quality::RandomState;

use crate::{result, Clock, Input, OpCounters, Operator, Record};

/// Default bound on distinct words tracked per window.
pub const DISTINCT_WORDS_PER_WINDOW_MAX: usize = 100_000;

/// One flushed window, handed to the caller of [`WordCounts::advance`].
#[derive(Debug)]
pub struct Counted<'a> {
    pub window_start_ns: u64,
    pub window_end_ns: u64,
    /// Every word occurrence in the window, tracked or not.
    pub total: u64,
    /// Occurrences of words that were not tracked because the distinct limit was reached.
    pub overflow: u64,
    /// Sorted by word bytes.
    pub counts: &'a [(&'a str, u64)],
}

/// The counting engine without JSON.
#[derive(Debug)]
pub struct WordCounts {
    window_ns: u64,
    distinct_max: usize,
    current: Option<u64>,
    counts: HashMap<Box<str>, u64, WordHasher>,
    total: u64,
    overflow: u64,
}

impl WordCounts {
    /// `window_ns` of 0 is treated as 1 (config validation rejects it earlier).
    pub fn new(window_ns: u64, distinct_words_max: usize) -> Self {
        WordCounts {
            window_ns: window_ns.max(1),
            distinct_max: distinct_words_max,
            current: None,
            counts: HashMap::default(),
            total: 0,
            overflow: 0,
        }
    }

    /// Flushes the open window if event time `t_ns` has reached its end.
    pub fn advance(&mut self, t_ns: u64, emit: &mut impl FnMut(&Counted<'_>)) {
        let Some(k) = self.current else { return };
        let start = k.saturating_mul(self.window_ns);
        let end = start.saturating_add(self.window_ns);
        if t_ns < end {
            return;
        }
        {
            let mut sorted: Vec<(&str, u64)> = self.counts.iter().map(|(w, n)| (&**w, *n)).collect();
            sorted.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            emit(&Counted {
                window_start_ns: start,
                window_end_ns: end,
                total: self.total,
                overflow: self.overflow,
                counts: &sorted,
            });
        }
        self.counts.clear();
        self.total = 0;
        self.overflow = 0;
        self.current = None;
    }

    /// Counts `word` at `t_ns` (call `advance(t_ns)` first; `t_ns` must not go backwards).
    pub fn push(&mut self, t_ns: u64, word: &str) {
        if self.current.is_none() {
            self.current = Some(t_ns / self.window_ns);
        }
        self.total += 1;
        if let Some(n) = self.counts.get_mut(word) {
            *n += 1;
        } else if self.counts.len() < self.distinct_max {
            self.counts.insert(word.into(), 1);
        } else {
            self.overflow += 1;
        }
    }
}

/// The `wordcount` operator: [`WordCounts`] plus `wordcount` JSON lines.
pub struct WordCountOp {
    stream: String,
    counts: WordCounts,
    clock: Clock,
    counters: OpCounters,
}

impl WordCountOp {
    pub fn new(stream: &str, counts: WordCounts) -> Self {
        WordCountOp { stream: stream.to_string(), counts, clock: Clock::default(), counters: OpCounters::default() }
    }
}

impl Operator for WordCountOp {
    fn input(&self) -> Input {
        Input::Words
    }

    fn on_record(&mut self, rec: Record<'_>, t_ns: u64, out: &mut Vec<u8>) {
        let t_ns = crate::begin_record(&mut self.clock, &mut self.counters, t_ns);
        self.on_time(t_ns, out);
        match rec {
            Record::Word(w) => self.counts.push(t_ns, w),
            Record::Value(_) => self.counters.ignored += 1,
        }
    }

    fn on_time(&mut self, t_ns: u64, out: &mut Vec<u8>) {
        let (t_ns, _) = self.clock.advance(t_ns);
        let stream = &self.stream;
        let lines = &mut self.counters.lines;
        self.counts.advance(t_ns, &mut |c| {
            result::wordcount(out, stream, c.window_start_ns, c.window_end_ns, c.total, c.overflow, c.counts);
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
    use crate::record::{parse_words, Limits};
    use crate::testutil::Rng;
    use std::collections::BTreeMap;

    type Flushed = Vec<(u64, u64, u64, u64, BTreeMap<String, u64>)>;

    fn collect(wc: &mut WordCounts, t: u64, got: &mut Flushed) {
        wc.advance(t, &mut |c| {
            got.push((
                c.window_start_ns,
                c.window_end_ns,
                c.total,
                c.overflow,
                c.counts.iter().map(|(w, n)| (w.to_string(), *n)).collect(),
            ))
        });
    }

    #[test]
    fn exact_counts_over_known_multiset_across_datagrams_and_windows() {
        let seed = crate::testutil::seed(0x5eed_0002);
        let mut rng = Rng::new(seed);
        let vocab = ["alpha", "beta", "gamma", "delta", "\"q\"", "back\\slash", "\u{1F600}", "x"];
        let window_ns = 1_000_000u64;
        let limits = Limits::default();
        let mut wc = WordCounts::new(window_ns, DISTINCT_WORDS_PER_WINDOW_MAX);
        let mut want: BTreeMap<u64, BTreeMap<String, u64>> = BTreeMap::new();
        let mut got = Flushed::new();
        let mut t = 0u64;
        for _ in 0..3_000 {
            // One datagram: a few lines of random words with random separators.
            t += rng.below(window_ns / 7);
            let mut payload = Vec::new();
            for _ in 0..rng.below(20) {
                let w = vocab[rng.below(vocab.len() as u64) as usize];
                payload.extend_from_slice(w.as_bytes());
                payload.extend_from_slice([&b" "[..], b"\t", b"\n", b"\r\n", b"  "][rng.below(5) as usize]);
                *want.entry(t / window_ns).or_default().entry(w.to_string()).or_default() += 1;
            }
            collect(&mut wc, t, &mut got);
            let st = parse_words(&payload, &limits, |w| wc.push(t, w));
            assert_eq!(st.malformed + st.over_limit, 0);
        }
        collect(&mut wc, u64::MAX, &mut got);
        assert_eq!(got.len(), want.len(), "seed {seed}");
        for ((s, e, total, overflow, counts), (k, w)) in got.iter().zip(&want) {
            assert_eq!((*s, *e), (k * window_ns, (k + 1) * window_ns), "seed {seed}");
            assert_eq!(counts, w, "seed {seed}");
            assert_eq!((*total, *overflow), (w.values().sum::<u64>(), 0));
        }
    }

    #[test]
    fn distinct_limit_reports_overflow() {
        let mut wc = WordCounts::new(100, 2);
        let mut got = Flushed::new();
        for w in ["a", "b", "c", "a", "d", "c"] {
            wc.push(1, w);
        }
        collect(&mut wc, 100, &mut got);
        assert_eq!(got.len(), 1);
        let (_, _, total, overflow, counts) = &got[0];
        assert_eq!((*total, *overflow), (6, 3));
        assert_eq!(counts.get("a"), Some(&2));
        assert_eq!(counts.get("b"), Some(&1));
        // Reset at the window end: the limit applies afresh.
        wc.push(150, "c");
        collect(&mut wc, 200, &mut got);
        assert_eq!(got[1].4.get("c"), Some(&1));
        assert_eq!(got[1].3, 0);
    }

    #[test]
    fn operator_line() {
        let mut op = WordCountOp::new("words", WordCounts::new(10, 100));
        let mut out = Vec::new();
        for w in ["b", "a\"", "b"] {
            op.on_record(Record::Word(w), 3, &mut out);
        }
        op.on_record(Record::Value(1.0), 4, &mut out);
        op.on_time(9, &mut out);
        assert!(out.is_empty());
        op.on_time(10, &mut out);
        op.on_time(1_000, &mut out); // empty windows: no lines
        assert_eq!(String::from_utf8(out).unwrap(), "{\"stream\":\"words\",\"type\":\"wordcount\",\"window_start_ns\":0,\"window_end_ns\":10,\"total\":3,\"distinct\":2,\"overflow\":0,\"counts\":{\"a\\\"\":1,\"b\":2}}\n");
        assert_eq!(op.counters().ignored, 1);
    }
}
