//! result: the newline-delimited JSON result lines of the issue-5 contract.
//!
//! What it is for: one function per line type, each appending exactly one JSON object and `\n`.
//! Every line starts with `"stream"` and `"type"`; field order is fixed so that two engines fed
//! the same records produce byte-identical lines.
//! - `filtered`: `{"stream":S,"type":"filtered","t_ns":T,"value":V}` (or `"word":W`).
//! - `window`: `{"stream":S,"type":"window","window_start_ns":A,"window_end_ns":B,"count":N,
//!   "sum":..,"avg":..,"min":..,"max":..,"median":..,"variance":..,"truncated":bool}`;
//!   `variance` is the population variance, `truncated` says the median was taken over only
//!   the first `values_per_window_max` values.
//! - `wordcount`: `{"stream":S,"type":"wordcount","window_start_ns":A,"window_end_ns":B,
//!   "total":N,"distinct":D,"overflow":O,"counts":{"word":n,...}}`; words sorted by bytes,
//!   `overflow` = occurrences of words not tracked (`total` includes them).
//! - `changepoint`: `{"stream":S,"type":"changepoint","value":V,"reference":R,"t_ns":T,
//!   "method":"reference"|"cusum","deviation":V-R,"threshold":H,
//!   ["direction":"up"|"down","statistic":C,] "history":[...]}`.
//! - `stats`: the engine's own counters (`records`, `malformed`, `over_limit`, and any extra
//!   `(name, value)` pairs it passes), so drops are reported in-stream.
//!
//! What it is not for: deciding when a line is due (operators) or sending it.

use crate::json::{push_bool, push_f64, push_key, push_opt_f64, push_str, push_u64};

/// Aggregates of one closed window. Count, sum, avg, min, max and variance are exact over every
/// value; `median` is exact unless `truncated`.
#[derive(Debug, Clone, PartialEq)]
pub struct Aggregate {
    pub window_start_ns: u64,
    pub window_end_ns: u64,
    pub count: u64,
    pub sum: f64,
    pub avg: f64,
    pub min: f64,
    pub max: f64,
    pub median: Option<f64>,
    /// Population variance (divide by count, not count - 1).
    pub variance: f64,
    pub truncated: bool,
}

/// Which detector raised an alert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Reference,
    Cusum,
}

/// A change-point alert.
#[derive(Debug, Clone, PartialEq)]
pub struct Alert {
    pub t_ns: u64,
    pub value: f64,
    /// Mean of the last N window means when the alert fired.
    pub reference: f64,
    pub method: Method,
    /// `value - reference`.
    pub deviation: f64,
    /// Reference rule: `threshold`; CUSUM: `h`.
    pub threshold: f64,
    /// CUSUM only: `(up, statistic)`: which one-sided sum crossed `h`, and its value.
    pub cusum: Option<(bool, f64)>,
    /// Raw values, oldest first, ending with `value`.
    pub history: Vec<f64>,
}

fn begin(out: &mut Vec<u8>, stream: &str, ty: &str) {
    out.extend_from_slice(b"{\"stream\":");
    push_str(out, stream);
    push_key(out, "type");
    push_str(out, ty);
}

fn end(out: &mut Vec<u8>) {
    out.extend_from_slice(b"}\n");
}

pub fn filtered_value(out: &mut Vec<u8>, stream: &str, t_ns: u64, value: f64) {
    begin(out, stream, "filtered");
    push_key(out, "t_ns");
    push_u64(out, t_ns);
    push_key(out, "value");
    push_f64(out, value);
    end(out);
}

pub fn filtered_word(out: &mut Vec<u8>, stream: &str, t_ns: u64, word: &str) {
    begin(out, stream, "filtered");
    push_key(out, "t_ns");
    push_u64(out, t_ns);
    push_key(out, "word");
    push_str(out, word);
    end(out);
}

pub fn window(out: &mut Vec<u8>, stream: &str, a: &Aggregate) {
    begin(out, stream, "window");
    push_key(out, "window_start_ns");
    push_u64(out, a.window_start_ns);
    push_key(out, "window_end_ns");
    push_u64(out, a.window_end_ns);
    push_key(out, "count");
    push_u64(out, a.count);
    push_key(out, "sum");
    push_f64(out, a.sum);
    push_key(out, "avg");
    push_f64(out, a.avg);
    push_key(out, "min");
    push_f64(out, a.min);
    push_key(out, "max");
    push_f64(out, a.max);
    push_key(out, "median");
    push_opt_f64(out, a.median);
    push_key(out, "variance");
    push_f64(out, a.variance);
    push_key(out, "truncated");
    push_bool(out, a.truncated);
    end(out);
}

/// `counts` must already be sorted by word bytes (the word-count operator does this).
#[allow(clippy::too_many_arguments)]
pub fn wordcount(
    out: &mut Vec<u8>,
    stream: &str,
    window_start_ns: u64,
    window_end_ns: u64,
    total: u64,
    overflow: u64,
    counts: &[(&str, u64)],
) {
    begin(out, stream, "wordcount");
    push_key(out, "window_start_ns");
    push_u64(out, window_start_ns);
    push_key(out, "window_end_ns");
    push_u64(out, window_end_ns);
    push_key(out, "total");
    push_u64(out, total);
    push_key(out, "distinct");
    push_u64(out, counts.len() as u64);
    push_key(out, "overflow");
    push_u64(out, overflow);
    push_key(out, "counts");
    out.push(b'{');
    for (i, (w, n)) in counts.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        push_str(out, w);
        out.push(b':');
        push_u64(out, *n);
    }
    out.push(b'}');
    end(out);
}

pub fn changepoint(out: &mut Vec<u8>, stream: &str, a: &Alert) {
    begin(out, stream, "changepoint");
    push_key(out, "value");
    push_f64(out, a.value);
    push_key(out, "reference");
    push_f64(out, a.reference);
    push_key(out, "t_ns");
    push_u64(out, a.t_ns);
    push_key(out, "method");
    push_str(
        out,
        match a.method {
            Method::Reference => "reference",
            Method::Cusum => "cusum",
        },
    );
    push_key(out, "deviation");
    push_f64(out, a.deviation);
    push_key(out, "threshold");
    push_f64(out, a.threshold);
    if let Some((up, statistic)) = a.cusum {
        push_key(out, "direction");
        push_str(out, if up { "up" } else { "down" });
        push_key(out, "statistic");
        push_f64(out, statistic);
    }
    push_key(out, "history");
    out.push(b'[');
    for (i, v) in a.history.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        push_f64(out, *v);
    }
    out.push(b']');
    end(out);
}

/// Engine counters line: `{"stream":S,"type":"stats","t_ns":T,"name":n,...}`.
pub fn stats(out: &mut Vec<u8>, stream: &str, t_ns: u64, fields: &[(&str, u64)]) {
    begin(out, stream, "stats");
    push_key(out, "t_ns");
    push_u64(out, t_ns);
    for (k, v) in fields {
        push_key(out, k);
        push_u64(out, *v);
    }
    end(out);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(out: Vec<u8>) -> String {
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn lines_are_exact() {
        let mut o = Vec::new();
        changepoint(
            &mut o,
            "sensor",
            &Alert {
                t_ns: 42,
                value: 31.2,
                reference: 10.1,
                method: Method::Reference,
                deviation: 21.1,
                threshold: 5.0,
                cusum: None,
                history: vec![10.0, 31.2],
            },
        );
        assert_eq!(text(o), "{\"stream\":\"sensor\",\"type\":\"changepoint\",\"value\":31.2,\"reference\":10.1,\"t_ns\":42,\"method\":\"reference\",\"deviation\":21.1,\"threshold\":5.0,\"history\":[10.0,31.2]}\n");

        let mut o = Vec::new();
        wordcount(&mut o, "w\"x", 0, 100, 4, 1, &[("a\\", 2), ("b\n", 1)]);
        assert_eq!(text(o), "{\"stream\":\"w\\\"x\",\"type\":\"wordcount\",\"window_start_ns\":0,\"window_end_ns\":100,\"total\":4,\"distinct\":2,\"overflow\":1,\"counts\":{\"a\\\\\":2,\"b\\n\":1}}\n");

        let mut o = Vec::new();
        window(
            &mut o,
            "s",
            &Aggregate {
                window_start_ns: 0,
                window_end_ns: 10,
                count: 2,
                sum: 3.0,
                avg: 1.5,
                min: 1.0,
                max: 2.0,
                median: Some(1.5),
                variance: 0.25,
                truncated: false,
            },
        );
        assert_eq!(text(o), "{\"stream\":\"s\",\"type\":\"window\",\"window_start_ns\":0,\"window_end_ns\":10,\"count\":2,\"sum\":3.0,\"avg\":1.5,\"min\":1.0,\"max\":2.0,\"median\":1.5,\"variance\":0.25,\"truncated\":false}\n");

        let mut o = Vec::new();
        filtered_value(&mut o, "s", 7, -1.0);
        filtered_word(&mut o, "s", 8, "\x01");
        stats(&mut o, "s", 9, &[("malformed", 3)]);
        assert_eq!(text(o), "{\"stream\":\"s\",\"type\":\"filtered\",\"t_ns\":7,\"value\":-1.0}\n{\"stream\":\"s\",\"type\":\"filtered\",\"t_ns\":8,\"word\":\"\\u0001\"}\n{\"stream\":\"s\",\"type\":\"stats\",\"t_ns\":9,\"malformed\":3}\n");
    }
}
