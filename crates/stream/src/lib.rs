//! slipstream-stream: the stream offload operators of issue 5 as pure, one-record-at-a-time logic.
//!
//! What it is for: turning a UDP payload into records (`record`), running one operator per
//! stream over them with an explicit event time (`filter`, `window`, `wordcount`,
//! `changepoint`), and appending the newline-delimited JSON result lines subscribers receive
//! (`result`, built on the small encoder in `json`). `config` mirrors the TOML contract and
//! builds a boxed [`Operator`].
//!
//! What it is not for: sockets, clocks, threads, subscriber fan-out or TOML parsing. The engine
//! that owns the UDP receiver passes the receive time in as `t_ns` and ships the bytes appended
//! to `out`; nothing in here reads a clock or blocks, so the same inputs always give the same
//! lines (which is what lets a user-space and an XDP engine be compared on shared fixtures).

#![forbid(unsafe_code)]

pub mod changepoint;
pub mod config;
pub mod filter;
pub mod json;
pub mod record;
pub mod result;
#[cfg(test)]
mod testutil;
pub mod window;
pub mod wordcount;

pub use config::{ConfigError, StreamConfig};
pub use record::{Encoding, Limits, ParseStats, Record};

/// Which record parser feeds an operator: numbers (text lines or binary f64s) or words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    Numbers,
    Words,
}

/// Counters every operator keeps, so nothing it skips is silent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpCounters {
    /// Records handed to `on_record`.
    pub records: u64,
    /// Records of the wrong kind for this operator (a word given to a numeric operator), skipped.
    pub ignored: u64,
    /// Records whose `t_ns` was below the highest time already seen; they were processed as if
    /// they arrived at that highest time (event time never goes backwards).
    pub time_clamped: u64,
    /// JSON result lines appended to `out`.
    pub lines: u64,
}

/// One stream operator. Each call may append zero or more complete JSON lines (object + `\n`)
/// to `out`; it never removes or rewrites bytes already there.
pub trait Operator {
    /// The parser this operator wants.
    fn input(&self) -> Input;
    /// One record at event time `t_ns` (ns since an epoch the engine chooses, normally the
    /// receive time). Windows whose end is `<= t_ns` are flushed first.
    fn on_record(&mut self, rec: Record<'_>, t_ns: u64, out: &mut Vec<u8>);
    /// Time has advanced to `t_ns` without a record: flush windows that ended.
    fn on_time(&mut self, t_ns: u64, out: &mut Vec<u8>);
    /// Counters so far.
    fn counters(&self) -> OpCounters;
}

/// Parses `payload` with the operator's parser and feeds every good record to `op` at `t_ns`.
/// Malformed and over-limit records are skipped and counted in the returned stats.
pub fn feed_datagram(
    op: &mut dyn Operator,
    payload: &[u8],
    encoding: Encoding,
    limits: &Limits,
    t_ns: u64,
    out: &mut Vec<u8>,
) -> ParseStats {
    match op.input() {
        Input::Numbers => {
            record::parse_numbers(payload, encoding, limits, |v| op.on_record(Record::Value(v), t_ns, out))
        }
        Input::Words => record::parse_words(payload, limits, |w| op.on_record(Record::Word(w), t_ns, out)),
    }
}

/// Event-time guard shared by the operators: returns the time to use and whether it was clamped.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Clock {
    high_ns: u64,
}

/// The prologue every operator runs for a record: count it, and move the event clock to it.
/// Returns the event time to use (never earlier than one already seen; a clamp is counted).
pub(crate) fn begin_record(clock: &mut Clock, counters: &mut OpCounters, t_ns: u64) -> u64 {
    counters.records += 1;
    let (t_ns, clamped) = clock.advance(t_ns);
    counters.time_clamped += u64::from(clamped);
    t_ns
}

impl Clock {
    pub(crate) fn advance(&mut self, t_ns: u64) -> (u64, bool) {
        if t_ns < self.high_ns {
            (self.high_ns, true)
        } else {
            self.high_ns = t_ns;
            (t_ns, false)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wordcount::{WordCountOp, WordCounts};

    #[test]
    fn odd_words_end_to_end() {
        let mut op = WordCountOp::new("w", WordCounts::new(1_000, 100));
        let mut out = Vec::new();
        let limits = Limits { word_bytes_max: 8, records_per_datagram_max: 100 };
        let payload = b"\"q\" a\\b \x01\x7f caf\xc3\xa9 bad\xff waytoolongword \"q\"\r\n";
        let st = feed_datagram(&mut op, payload, Encoding::Auto, &limits, 5, &mut out);
        assert_eq!(st, ParseStats { records: 5, malformed: 2, over_limit: 0 });
        op.on_time(1_000, &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "{\"stream\":\"w\",\"type\":\"wordcount\",\"window_start_ns\":0,\"window_end_ns\":1000,\"total\":5,\"distinct\":4,\"overflow\":0,\"counts\":{\"\\u0001\\u007f\":1,\"\\\"q\\\"\":2,\"a\\\\b\":1,\"caf\u{e9}\":1}}\n"
        );
    }
}
