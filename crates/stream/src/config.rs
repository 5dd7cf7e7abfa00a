//! config: the `[[stream]]` / `[results]` TOML contract of issue 5 as plain Rust structs, their
//! validation (typed errors) and the construction of a boxed [`Operator`].
//!
//! What it is for: one source of truth for option names, defaults and bounds. Field names are
//! the TOML keys; enumerations are kept as strings (`operator`, `method`, `filter`,
//! `filter_action`, `format`) so a serde layer can deserialize straight into these structs.
//! Keys beyond the contract (all optional, defaults in [`StreamConfig::default`]):
//! - aggregate: `slide_ms` (absent = tumbling; must divide into at most
//!   [`PANES_PER_WINDOW_MAX`] panes of gcd(window_ms, slide_ms)), `values_per_window_max`.
//! - changepoint: `method = "reference" | "cusum"`; for CUSUM `threshold` is `h` and `drift` is
//!   `k`, both in value units.
//! - filter: `filter = "lt"|"le"|"gt"|"ge"|"eq"|"between"` with `filter_value` (and
//!   `filter_upper` for `between`, inclusive), or `"equals"|"prefix"|"contains"` with
//!   `filter_word`; `filter_action = "pass" | "drop"`.
//! - parsing: `format = "auto"|"text"|"binary"` (numeric streams), `word_bytes_max`,
//!   `records_per_datagram_max`; wordcount: `distinct_words_per_window_max`.
//!
//! What it is not for: reading TOML (the binary wires serde), sockets, or running operators.

use std::fmt;

use crate::changepoint::{ChangePoint, ChangePointOp, Detector, HISTORY_MAX, REFERENCE_WINDOWS_MAX};
use crate::filter::{Action, Filter, Predicate};
use crate::record::{Encoding, Limits};
use crate::window::{WindowError, WindowOp, Windows, PANES_PER_WINDOW_MAX};
use crate::wordcount::{WordCountOp, WordCounts};
use crate::Operator;

pub const NAME_BYTES_MAX: usize = 64;
pub const WINDOW_MS_MAX: u64 = 86_400_000;
pub const WORD_BYTES_MAX: usize = 1_024;
pub const RECORDS_PER_DATAGRAM_MAX: usize = 65_536;
pub const VALUES_PER_WINDOW_MAX: usize = 10_000_000;
pub const DISTINCT_WORDS_PER_WINDOW_MAX: usize = 1_000_000;
const NS_PER_MS: u64 = 1_000_000;

/// `[results]`.
#[derive(Debug, Clone, PartialEq)]
pub struct ResultsConfig {
    pub tcp_port: u16,
}

impl Default for ResultsConfig {
    fn default() -> Self {
        ResultsConfig { tcp_port: 7100 }
    }
}

impl ResultsConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.tcp_port == 0 {
            return Err(ConfigError::ZeroPort { key: "tcp_port" });
        }
        Ok(())
    }
}

/// One `[[stream]]`.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamConfig {
    pub name: String,
    pub udp_port: u16,
    pub operator: String,
    pub window_ms: u64,
    pub slide_ms: Option<u64>,
    pub reference_windows: u32,
    pub threshold: f64,
    pub history: u32,
    pub method: String,
    pub drift: f64,
    pub filter: Option<String>,
    pub filter_value: Option<f64>,
    pub filter_upper: Option<f64>,
    pub filter_word: Option<String>,
    pub filter_action: String,
    pub format: String,
    pub word_bytes_max: usize,
    pub records_per_datagram_max: usize,
    pub values_per_window_max: usize,
    pub distinct_words_per_window_max: usize,
    /// `"auto"` (XDP when the daemon runs with `--xdp` and the stream fits the kernel engine,
    /// else user space), `"user"` or `"xdp"` (XDP required: the stream says why if it cannot).
    pub engine: String,
}

impl Default for StreamConfig {
    fn default() -> Self {
        StreamConfig {
            name: String::new(),
            udp_port: 0,
            operator: String::new(),
            window_ms: 100,
            slide_ms: None,
            reference_windows: 8,
            threshold: 5.0,
            history: 1024,
            method: "reference".into(),
            drift: 0.5,
            filter: None,
            filter_value: None,
            filter_upper: None,
            filter_word: None,
            filter_action: "pass".into(),
            format: "auto".into(),
            word_bytes_max: 64,
            records_per_datagram_max: 65_536,
            values_per_window_max: crate::window::VALUES_PER_WINDOW_MAX,
            distinct_words_per_window_max: crate::wordcount::DISTINCT_WORDS_PER_WINDOW_MAX,
            engine: "auto".into(),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum ConfigError {
    EmptyName,
    NameTooLong { bytes: usize },
    NameHasControlChar,
    ZeroPort { key: &'static str },
    UnknownOperator(String),
    WindowMs { value: u64 },
    SlideMs { value: u64 },
    TooManyPanes { panes: u64 },
    ReferenceWindows { value: u32 },
    Threshold { value: f64 },
    History { value: u32 },
    UnknownMethod(String),
    Drift { value: f64 },
    MissingFilter,
    UnknownFilter(String),
    MissingFilterKey { key: &'static str },
    FilterValueNotFinite { key: &'static str },
    FilterBoundsReversed,
    FilterWord,
    UnknownFilterAction(String),
    UnknownFormat(String),
    UnknownEngine(String),
    Limit { key: &'static str, value: usize, max: usize },
    DuplicateName(String),
    DuplicatePort(u16),
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use ConfigError::*;
        match self {
            EmptyName => write!(f, "stream name is empty"),
            NameTooLong { bytes } => write!(f, "stream name is {bytes} bytes, at most {NAME_BYTES_MAX}"),
            NameHasControlChar => write!(f, "stream name contains a control character"),
            ZeroPort { key } => write!(f, "{key} must be 1..=65535"),
            UnknownOperator(s) => write!(f, "operator {s:?}: expected changepoint, wordcount, aggregate or filter"),
            WindowMs { value } => write!(f, "window_ms = {value}: expected 1..={WINDOW_MS_MAX}"),
            SlideMs { value } => write!(f, "slide_ms = {value}: expected 1..=window_ms"),
            TooManyPanes { panes } => {
                write!(f, "window_ms / gcd(window_ms, slide_ms) = {panes}, at most {PANES_PER_WINDOW_MAX}")
            }
            ReferenceWindows { value } => {
                write!(f, "reference_windows = {value}: expected 1..={REFERENCE_WINDOWS_MAX}")
            }
            Threshold { value } => write!(f, "threshold = {value}: expected a finite number > 0"),
            History { value } => write!(f, "history = {value}: at most {HISTORY_MAX}"),
            UnknownMethod(s) => write!(f, "method {s:?}: expected reference or cusum"),
            Drift { value } => write!(f, "drift = {value}: expected a finite number >= 0"),
            MissingFilter => write!(f, "operator filter needs `filter`"),
            UnknownFilter(s) => {
                write!(f, "filter {s:?}: expected lt, le, gt, ge, eq, between, equals, prefix or contains")
            }
            MissingFilterKey { key } => write!(f, "this filter needs `{key}`"),
            FilterValueNotFinite { key } => write!(f, "{key} must be finite"),
            FilterBoundsReversed => write!(f, "between: filter_value must be <= filter_upper"),
            FilterWord => write!(f, "filter_word must be 1..=word_bytes_max bytes without whitespace"),
            UnknownFilterAction(s) => write!(f, "filter_action {s:?}: expected pass or drop"),
            UnknownFormat(s) => write!(f, "format {s:?}: expected auto, text or binary"),
            UnknownEngine(s) => write!(f, "engine {s:?}: expected auto, user or xdp"),
            Limit { key, value, max } => write!(f, "{key} = {value}: expected 1..={max}"),
            DuplicateName(s) => write!(f, "two streams are named {s:?}"),
            DuplicatePort(p) => write!(f, "two streams use udp_port {p}"),
        }
    }
}

impl std::error::Error for ConfigError {}

fn limit(key: &'static str, value: usize, max: usize) -> Result<(), ConfigError> {
    if value == 0 || value > max {
        return Err(ConfigError::Limit { key, value, max });
    }
    Ok(())
}

fn finite(key: &'static str, v: Option<f64>) -> Result<f64, ConfigError> {
    let v = v.ok_or(ConfigError::MissingFilterKey { key })?;
    if !v.is_finite() {
        return Err(ConfigError::FilterValueNotFinite { key });
    }
    Ok(v)
}

/// Checks every stream and that names and ports are unique.
pub fn validate_streams(streams: &[StreamConfig]) -> Result<(), ConfigError> {
    for (i, s) in streams.iter().enumerate() {
        s.validate()?;
        for t in streams.iter().take(i) {
            if t.name == s.name {
                return Err(ConfigError::DuplicateName(s.name.clone()));
            }
            if t.udp_port == s.udp_port {
                return Err(ConfigError::DuplicatePort(s.udp_port));
            }
        }
    }
    Ok(())
}

impl StreamConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.name.is_empty() {
            return Err(ConfigError::EmptyName);
        }
        if self.name.len() > NAME_BYTES_MAX {
            return Err(ConfigError::NameTooLong { bytes: self.name.len() });
        }
        if self.name.chars().any(char::is_control) {
            return Err(ConfigError::NameHasControlChar);
        }
        if self.udp_port == 0 {
            return Err(ConfigError::ZeroPort { key: "udp_port" });
        }
        if self.window_ms == 0 || self.window_ms > WINDOW_MS_MAX {
            return Err(ConfigError::WindowMs { value: self.window_ms });
        }
        limit("word_bytes_max", self.word_bytes_max, WORD_BYTES_MAX)?;
        limit("records_per_datagram_max", self.records_per_datagram_max, RECORDS_PER_DATAGRAM_MAX)?;
        self.encoding()?;
        if !matches!(self.engine.as_str(), "auto" | "user" | "xdp") {
            return Err(ConfigError::UnknownEngine(self.engine.clone()));
        }
        match self.operator.as_str() {
            "aggregate" => {
                limit("values_per_window_max", self.values_per_window_max, VALUES_PER_WINDOW_MAX)?;
                self.windows().map(|_| ())
            }
            "wordcount" => limit(
                "distinct_words_per_window_max",
                self.distinct_words_per_window_max,
                DISTINCT_WORDS_PER_WINDOW_MAX,
            ),
            "changepoint" => {
                if self.reference_windows == 0 || self.reference_windows as usize > REFERENCE_WINDOWS_MAX {
                    return Err(ConfigError::ReferenceWindows { value: self.reference_windows });
                }
                if self.history as usize > HISTORY_MAX {
                    return Err(ConfigError::History { value: self.history });
                }
                self.detector().map(|_| ())
            }
            "filter" => self.predicate().map(|_| ()),
            other => Err(ConfigError::UnknownOperator(other.to_string())),
        }
    }

    /// Parser limits for this stream's datagrams.
    pub fn limits(&self) -> Limits {
        Limits { word_bytes_max: self.word_bytes_max, records_per_datagram_max: self.records_per_datagram_max }
    }

    pub fn encoding(&self) -> Result<Encoding, ConfigError> {
        match self.format.as_str() {
            "auto" => Ok(Encoding::Auto),
            "text" => Ok(Encoding::Text),
            "binary" => Ok(Encoding::Binary),
            other => Err(ConfigError::UnknownFormat(other.to_string())),
        }
    }

    fn window_ns(&self) -> u64 {
        self.window_ms.saturating_mul(NS_PER_MS)
    }

    fn windows(&self) -> Result<Windows, ConfigError> {
        let slide_ms = self.slide_ms.unwrap_or(self.window_ms);
        if slide_ms == 0 || slide_ms > self.window_ms {
            return Err(ConfigError::SlideMs { value: slide_ms });
        }
        Windows::new(self.window_ns(), slide_ms.saturating_mul(NS_PER_MS), self.values_per_window_max).map_err(|e| {
            match e {
                WindowError::TooManyPanes { panes } => ConfigError::TooManyPanes { panes },
                WindowError::ZeroSize => ConfigError::WindowMs { value: self.window_ms },
                WindowError::ZeroSlide | WindowError::SlideLargerThanSize => ConfigError::SlideMs { value: slide_ms },
            }
        })
    }

    fn detector(&self) -> Result<Detector, ConfigError> {
        if !(self.threshold.is_finite() && self.threshold > 0.0) {
            return Err(ConfigError::Threshold { value: self.threshold });
        }
        match self.method.as_str() {
            "reference" => Ok(Detector::Reference { threshold: self.threshold }),
            "cusum" => {
                if !(self.drift.is_finite() && self.drift >= 0.0) {
                    return Err(ConfigError::Drift { value: self.drift });
                }
                Ok(Detector::Cusum { drift: self.drift, threshold: self.threshold })
            }
            other => Err(ConfigError::UnknownMethod(other.to_string())),
        }
    }

    fn predicate(&self) -> Result<(Predicate, Action), ConfigError> {
        let action = match self.filter_action.as_str() {
            "pass" => Action::Pass,
            "drop" => Action::Drop,
            other => return Err(ConfigError::UnknownFilterAction(other.to_string())),
        };
        let kind = self.filter.as_deref().ok_or(ConfigError::MissingFilter)?;
        let word = || -> Result<String, ConfigError> {
            let w = self.filter_word.as_deref().ok_or(ConfigError::MissingFilterKey { key: "filter_word" })?;
            if w.is_empty() || w.len() > self.word_bytes_max || w.bytes().any(|b| b.is_ascii_whitespace() || b == 0x0b)
            {
                return Err(ConfigError::FilterWord);
            }
            Ok(w.to_string())
        };
        let value = || finite("filter_value", self.filter_value);
        let p = match kind {
            "lt" => Predicate::Lt(value()?),
            "le" => Predicate::Le(value()?),
            "gt" => Predicate::Gt(value()?),
            "ge" => Predicate::Ge(value()?),
            "eq" => Predicate::Eq(value()?),
            "between" => {
                let (lo, hi) = (value()?, finite("filter_upper", self.filter_upper)?);
                if lo > hi {
                    return Err(ConfigError::FilterBoundsReversed);
                }
                Predicate::Between(lo, hi)
            }
            "equals" => Predicate::WordEquals(word()?),
            "prefix" => Predicate::WordPrefix(word()?),
            "contains" => Predicate::WordContains(word()?),
            other => return Err(ConfigError::UnknownFilter(other.to_string())),
        };
        Ok((p, action))
    }

    /// Validates and builds this stream's operator.
    pub fn build(&self) -> Result<Box<dyn Operator + Send>, ConfigError> {
        self.validate()?;
        Ok(match self.operator.as_str() {
            "aggregate" => Box::new(WindowOp::new(&self.name, self.windows()?)),
            "wordcount" => Box::new(WordCountOp::new(
                &self.name,
                WordCounts::new(self.window_ns(), self.distinct_words_per_window_max),
            )),
            "changepoint" => Box::new(ChangePointOp::new(
                &self.name,
                ChangePoint::new(
                    self.window_ns(),
                    self.reference_windows as usize,
                    self.detector()?,
                    self.history as usize,
                ),
            )),
            "filter" => {
                let (p, a) = self.predicate()?;
                Box::new(Filter::new(&self.name, p, a))
            }
            other => return Err(ConfigError::UnknownOperator(other.to_string())),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{feed_datagram, Input};

    fn sensor() -> StreamConfig {
        StreamConfig { name: "sensor".into(), udp_port: 7001, operator: "changepoint".into(), ..Default::default() }
    }

    #[test]
    fn contract_example_builds_and_detects() {
        let c = sensor();
        assert_eq!((c.window_ms, c.reference_windows, c.threshold, c.history), (100, 8, 5.0, 1024));
        let mut op = c.build().unwrap();
        assert_eq!(op.input(), Input::Numbers);
        let mut out = Vec::new();
        let ms = 1_000_000;
        for i in 0..900u64 {
            let st = feed_datagram(&mut *op, b"10\n10.0\r\n", Encoding::Auto, &c.limits(), i * ms, &mut out);
            assert_eq!(st.records, 2);
        }
        assert!(out.is_empty());
        let mut bin = b"SSF1".to_vec();
        bin.extend_from_slice(&31.2f64.to_le_bytes());
        feed_datagram(&mut *op, &bin, Encoding::Auto, &c.limits(), 900 * ms, &mut out);
        let line = String::from_utf8(out).unwrap();
        assert!(
            line.starts_with(
                "{\"stream\":\"sensor\",\"type\":\"changepoint\",\"value\":31.2,\"reference\":10.0,\"t_ns\":900000000,"
            ),
            "{line}"
        );
        assert!(line.ends_with("]}\n") && line.matches('\n').count() == 1);
    }

    #[test]
    fn every_operator_builds() {
        let mk = |op: &str| StreamConfig { operator: op.into(), ..sensor() };
        assert_eq!(mk("wordcount").build().unwrap().input(), Input::Words);
        assert_eq!(StreamConfig { slide_ms: Some(25), ..mk("aggregate") }.build().unwrap().input(), Input::Numbers);
        assert!(StreamConfig { method: "cusum".into(), ..mk("changepoint") }.build().is_ok());
        let f = StreamConfig {
            filter: Some("between".into()),
            filter_value: Some(1.0),
            filter_upper: Some(2.0),
            ..mk("filter")
        };
        assert_eq!(f.build().unwrap().input(), Input::Numbers);
        let f = StreamConfig {
            filter: Some("prefix".into()),
            filter_word: Some("ab".into()),
            filter_action: "drop".into(),
            ..mk("filter")
        };
        assert_eq!(f.build().unwrap().input(), Input::Words);
    }

    #[test]
    fn typed_errors() {
        let e = |c: StreamConfig| c.validate().err();
        assert_eq!(e(StreamConfig { name: "".into(), ..sensor() }), Some(ConfigError::EmptyName));
        assert_eq!(e(StreamConfig { name: "a\nb".into(), ..sensor() }), Some(ConfigError::NameHasControlChar));
        assert_eq!(e(StreamConfig { udp_port: 0, ..sensor() }), Some(ConfigError::ZeroPort { key: "udp_port" }));
        assert_eq!(
            e(StreamConfig { operator: "join".into(), ..sensor() }),
            Some(ConfigError::UnknownOperator("join".into()))
        );
        assert_eq!(e(StreamConfig { window_ms: 0, ..sensor() }), Some(ConfigError::WindowMs { value: 0 }));
        assert_eq!(
            e(StreamConfig { reference_windows: 0, ..sensor() }),
            Some(ConfigError::ReferenceWindows { value: 0 })
        );
        assert_eq!(
            e(StreamConfig { threshold: f64::NAN, ..sensor() }).map(|x| matches!(x, ConfigError::Threshold { .. })),
            Some(true)
        );
        assert_eq!(e(StreamConfig { history: 1 << 20, ..sensor() }), Some(ConfigError::History { value: 1 << 20 }));
        assert_eq!(e(StreamConfig { method: "ph".into(), ..sensor() }), Some(ConfigError::UnknownMethod("ph".into())));
        assert_eq!(
            e(StreamConfig { method: "cusum".into(), drift: -1.0, ..sensor() }),
            Some(ConfigError::Drift { value: -1.0 })
        );
        assert_eq!(
            e(StreamConfig { format: "xml".into(), ..sensor() }),
            Some(ConfigError::UnknownFormat("xml".into()))
        );
        assert_eq!(
            e(StreamConfig { word_bytes_max: 0, ..sensor() }),
            Some(ConfigError::Limit { key: "word_bytes_max", value: 0, max: WORD_BYTES_MAX })
        );
        let agg = StreamConfig { operator: "aggregate".into(), ..sensor() };
        assert_eq!(e(StreamConfig { slide_ms: Some(200), ..agg.clone() }), Some(ConfigError::SlideMs { value: 200 }));
        assert_eq!(
            e(StreamConfig { window_ms: 100_000, slide_ms: Some(99_999), ..agg }),
            Some(ConfigError::TooManyPanes { panes: 100_000 })
        );
        let f = StreamConfig { operator: "filter".into(), ..sensor() };
        assert_eq!(e(f.clone()), Some(ConfigError::MissingFilter));
        assert_eq!(
            e(StreamConfig { filter: Some("gt".into()), ..f.clone() }),
            Some(ConfigError::MissingFilterKey { key: "filter_value" })
        );
        assert_eq!(
            e(StreamConfig {
                filter: Some("between".into()),
                filter_value: Some(3.0),
                filter_upper: Some(1.0),
                ..f.clone()
            }),
            Some(ConfigError::FilterBoundsReversed)
        );
        assert_eq!(
            e(StreamConfig { filter: Some("equals".into()), filter_word: Some("a b".into()), ..f.clone() }),
            Some(ConfigError::FilterWord)
        );
        assert_eq!(
            e(StreamConfig { filter: Some("gt".into()), filter_value: Some(1.0), filter_action: "keep".into(), ..f }),
            Some(ConfigError::UnknownFilterAction("keep".into()))
        );
        let two = [sensor(), StreamConfig { name: "b".into(), ..sensor() }];
        assert_eq!(validate_streams(&two), Err(ConfigError::DuplicatePort(7001)));
        let two = [sensor(), StreamConfig { udp_port: 7002, ..sensor() }];
        assert_eq!(validate_streams(&two), Err(ConfigError::DuplicateName("sensor".into())));
        assert_eq!(ResultsConfig { tcp_port: 0 }.validate(), Err(ConfigError::ZeroPort { key: "tcp_port" }));
        assert!(ConfigError::MissingFilter.to_string().contains("filter"));
    }
}
