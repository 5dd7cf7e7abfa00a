//! filter: a stateless per-record predicate; records that survive become `filtered` lines.
//!
//! What it is for: value predicates (`lt le gt ge eq between`, `between` inclusive at both ends,
//! `eq` exact f64 equality) for numeric streams and word predicates (`equals prefix contains`,
//! byte-wise, case-sensitive) for word streams. With [`Action::Pass`] the records that match are
//! emitted; with [`Action::Drop`] the records that match are dropped and the rest emitted.
//!
//! What it is not for: windows or state across records. A record of the other kind (a word for
//! a value predicate) is counted in `ignored` and never emitted.

use crate::{result, Clock, Input, OpCounters, Operator, Record};

#[derive(Debug, Clone, PartialEq)]
pub enum Predicate {
    Lt(f64),
    Le(f64),
    Gt(f64),
    Ge(f64),
    Eq(f64),
    /// Inclusive `lo <= v <= hi`.
    Between(f64, f64),
    WordEquals(String),
    WordPrefix(String),
    WordContains(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Emit records that match.
    Pass,
    /// Emit records that do not match.
    Drop,
}

impl Predicate {
    pub fn input(&self) -> Input {
        match self {
            Predicate::WordEquals(_) | Predicate::WordPrefix(_) | Predicate::WordContains(_) => Input::Words,
            _ => Input::Numbers,
        }
    }

    /// `None` when the record is of the wrong kind.
    pub fn matches(&self, rec: Record<'_>) -> Option<bool> {
        Some(match (self, rec) {
            (Predicate::Lt(x), Record::Value(v)) => v < *x,
            (Predicate::Le(x), Record::Value(v)) => v <= *x,
            (Predicate::Gt(x), Record::Value(v)) => v > *x,
            (Predicate::Ge(x), Record::Value(v)) => v >= *x,
            (Predicate::Eq(x), Record::Value(v)) => v == *x,
            (Predicate::Between(lo, hi), Record::Value(v)) => *lo <= v && v <= *hi,
            (Predicate::WordEquals(p), Record::Word(w)) => w == p,
            (Predicate::WordPrefix(p), Record::Word(w)) => w.starts_with(p.as_str()),
            (Predicate::WordContains(p), Record::Word(w)) => w.contains(p.as_str()),
            _ => return None,
        })
    }
}

pub struct Filter {
    stream: String,
    predicate: Predicate,
    action: Action,
    clock: Clock,
    counters: OpCounters,
}

impl Filter {
    pub fn new(stream: &str, predicate: Predicate, action: Action) -> Self {
        Filter {
            stream: stream.to_string(),
            predicate,
            action,
            clock: Clock::default(),
            counters: OpCounters::default(),
        }
    }
}

impl Operator for Filter {
    fn input(&self) -> Input {
        self.predicate.input()
    }

    fn on_record(&mut self, rec: Record<'_>, t_ns: u64, out: &mut Vec<u8>) {
        let t_ns = crate::begin_record(&mut self.clock, &mut self.counters, t_ns);
        let Some(m) = self.predicate.matches(rec) else {
            self.counters.ignored += 1;
            return;
        };
        if m != (self.action == Action::Pass) {
            return;
        }
        match rec {
            Record::Value(v) => result::filtered_value(out, &self.stream, t_ns, v),
            Record::Word(w) => result::filtered_word(out, &self.stream, t_ns, w),
        }
        self.counters.lines += 1;
    }

    fn on_time(&mut self, t_ns: u64, _out: &mut Vec<u8>) {
        let _ = self.clock.advance(t_ns);
    }

    fn counters(&self) -> OpCounters {
        self.counters
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(p: Predicate, a: Action, recs: &[Record<'_>]) -> (String, OpCounters) {
        let mut f = Filter::new("f", p, a);
        let mut out = Vec::new();
        for (i, r) in recs.iter().enumerate() {
            f.on_record(*r, i as u64, &mut out);
        }
        (String::from_utf8(out).unwrap(), f.counters())
    }

    #[test]
    fn value_predicates() {
        let vals: Vec<Record> = [1.0, 2.0, 3.0, 4.0].iter().map(|v| Record::Value(*v)).collect();
        let count = |p: Predicate, a| run(p, a, &vals).1.lines;
        assert_eq!(count(Predicate::Lt(2.0), Action::Pass), 1);
        assert_eq!(count(Predicate::Le(2.0), Action::Pass), 2);
        assert_eq!(count(Predicate::Gt(2.0), Action::Pass), 2);
        assert_eq!(count(Predicate::Ge(2.0), Action::Pass), 3);
        assert_eq!(count(Predicate::Eq(2.0), Action::Pass), 1);
        assert_eq!(count(Predicate::Between(2.0, 3.0), Action::Pass), 2);
        assert_eq!(count(Predicate::Between(2.0, 3.0), Action::Drop), 2);
        let (s, _) = run(Predicate::Gt(3.5), Action::Pass, &vals);
        assert_eq!(s, "{\"stream\":\"f\",\"type\":\"filtered\",\"t_ns\":3,\"value\":4.0}\n");
    }

    #[test]
    fn word_predicates_and_wrong_kind() {
        let recs = [Record::Word("apple"), Record::Word("pineapple"), Record::Word("ap"), Record::Value(1.0)];
        let (_, c) = run(Predicate::WordEquals("apple".into()), Action::Pass, &recs);
        assert_eq!((c.lines, c.ignored), (1, 1));
        let (s, c) = run(Predicate::WordPrefix("ap".into()), Action::Pass, &recs);
        assert_eq!(c.lines, 2);
        assert!(s.contains("\"word\":\"apple\"") && s.contains("\"word\":\"ap\""));
        let (_, c) = run(Predicate::WordContains("apple".into()), Action::Drop, &recs);
        assert_eq!(c.lines, 1);
    }
}
