//! record: a UDP datagram payload → records. Pure parsing; malformed input is counted, skipped,
//! and never panics.
//!
//! What it is for: the two wire formats of issue 5.
//! - Text: records separated by `\n` (a trailing `\r` is tolerated, so `\r\n` works). Numeric
//!   streams carry one decimal number per line (`[+-]digits[.digits][(e|E)[+-]digits]`, also
//!   `.5`/`5.`); surrounding spaces/tabs are ignored; empty lines are not records and are not
//!   counted. `nan`, `inf`, hex, `1 2`, overflow to infinity (`1e999`) and anything longer than
//!   [`NUMBER_BYTES_MAX`] are malformed. Word streams carry words separated by ASCII whitespace
//!   (space, `\t`, `\n`, `\r`, `\x0b`, `\x0c`); a word longer than `word_bytes_max` or not valid
//!   UTF-8 is malformed (so that every counted word has one exact, lossless JSON spelling).
//! - Binary (numeric streams only): little-endian IEEE-754 f64s, 8 bytes each, optionally
//!   preceded by the 4-byte magic [`BINARY_MAGIC`] (`b"SSF1"`). The length decides: length % 8
//!   == 0 means no magic; length % 8 == 4 requires the magic (else the datagram is malformed);
//!   any other length is a malformed datagram (counted as one malformed record, nothing
//!   parsed). NaN and ±inf values are malformed records. With [`Encoding::Auto`], a payload
//!   that starts with the magic and has length % 8 == 4 is binary, anything else is text
//!   (no text number can start with `S`).
//!
//! What it is not for: deciding what a record means (operators) or where payloads come from.

/// Magic that marks a binary (little-endian f64) payload in `Auto` mode; optional in `Binary`.
pub const BINARY_MAGIC: [u8; 4] = *b"SSF1";
/// Longest text number accepted, bytes; longer lines are malformed (bounds parse work).
pub const NUMBER_BYTES_MAX: usize = 64;

/// How a numeric stream's payloads are encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Encoding {
    /// Binary when the payload starts with `SSF1` and its length % 8 == 4, text otherwise.
    #[default]
    Auto,
    Text,
    /// Little-endian f64s, magic optional (see module doc).
    Binary,
}

/// Per-datagram limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest word, bytes; longer words are malformed.
    pub word_bytes_max: usize,
    /// Most records taken from one datagram; the rest are counted in `over_limit` and skipped.
    pub records_per_datagram_max: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { word_bytes_max: 64, records_per_datagram_max: 65_536 }
    }
}

/// What one datagram yielded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ParseStats {
    /// Records handed on.
    pub records: u64,
    /// Records (or a whole binary datagram of bad length) skipped as malformed.
    pub malformed: u64,
    /// Well-formed records skipped because `records_per_datagram_max` was reached.
    pub over_limit: u64,
}

impl ParseStats {
    pub fn add(&mut self, other: ParseStats) {
        self.records += other.records;
        self.malformed += other.malformed;
        self.over_limit += other.over_limit;
    }
}

/// One record handed to an operator.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Record<'a> {
    /// A finite number.
    Value(f64),
    /// A non-empty, valid UTF-8 word of at most `word_bytes_max` bytes, without whitespace.
    Word(&'a str),
}

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c)
}

fn trim_line(mut s: &[u8]) -> &[u8] {
    while let [first, rest @ ..] = s {
        if matches!(first, b' ' | b'\t' | b'\r') {
            s = rest;
        } else {
            break;
        }
    }
    while let [rest @ .., last] = s {
        if matches!(last, b' ' | b'\t' | b'\r') {
            s = rest;
        } else {
            break;
        }
    }
    s
}

/// Strict decimal grammar check before handing the text to `str::parse` (which would also
/// accept `inf`, `nan`, `infinity`).
fn is_decimal(s: &[u8]) -> bool {
    let mut i = 0;
    let at = |i: usize| s.get(i).copied();
    if matches!(at(i), Some(b'+') | Some(b'-')) {
        i += 1;
    }
    let mut digits = 0;
    while matches!(at(i), Some(b'0'..=b'9')) {
        i += 1;
        digits += 1;
    }
    if at(i) == Some(b'.') {
        i += 1;
        while matches!(at(i), Some(b'0'..=b'9')) {
            i += 1;
            digits += 1;
        }
    }
    if digits == 0 {
        return false;
    }
    if matches!(at(i), Some(b'e') | Some(b'E')) {
        i += 1;
        if matches!(at(i), Some(b'+') | Some(b'-')) {
            i += 1;
        }
        let mut exp_digits = 0;
        while matches!(at(i), Some(b'0'..=b'9')) {
            i += 1;
            exp_digits += 1;
        }
        if exp_digits == 0 {
            return false;
        }
    }
    i == s.len()
}

/// Parses one text number (already trimmed). `None` = malformed.
pub fn parse_number(s: &[u8]) -> Option<f64> {
    if s.is_empty() || s.len() > NUMBER_BYTES_MAX || !is_decimal(s) {
        return None;
    }
    let text = std::str::from_utf8(s).ok()?;
    let v: f64 = text.parse().ok()?;
    v.is_finite().then_some(v)
}

/// Parses a numeric payload, calling `emit` for each good value in order.
pub fn parse_numbers(payload: &[u8], encoding: Encoding, limits: &Limits, mut emit: impl FnMut(f64)) -> ParseStats {
    let binary = match encoding {
        Encoding::Text => false,
        Encoding::Binary => true,
        Encoding::Auto => payload.len() % 8 == 4 && payload.starts_with(&BINARY_MAGIC),
    };
    let mut st = ParseStats::default();
    let mut take = |v: Option<f64>, st: &mut ParseStats| match v {
        None => st.malformed += 1,
        Some(_) if st.records >= limits.records_per_datagram_max as u64 => st.over_limit += 1,
        Some(v) => {
            st.records += 1;
            emit(v);
        }
    };
    if binary {
        let body = match payload.len() % 8 {
            0 => payload,
            4 if payload.starts_with(&BINARY_MAGIC) => payload.get(4..).unwrap_or(&[]),
            _ => {
                st.malformed += 1;
                return st;
            }
        };
        for chunk in body.chunks_exact(8) {
            let mut b = [0u8; 8];
            b.copy_from_slice(chunk);
            let v = f64::from_le_bytes(b);
            take(v.is_finite().then_some(v), &mut st);
        }
    } else {
        for line in payload.split(|&b| b == b'\n') {
            let line = trim_line(line);
            if line.is_empty() {
                continue;
            }
            take(parse_number(line), &mut st);
        }
    }
    st
}

/// Parses a word payload, calling `emit` for each good word in order.
pub fn parse_words<'a>(payload: &'a [u8], limits: &Limits, mut emit: impl FnMut(&'a str)) -> ParseStats {
    let mut st = ParseStats::default();
    // One UTF-8 validation for the whole datagram (the common case: it is valid) instead of
    // one per word; separators are ASCII, so every word of a valid payload is a slice of it
    // on char boundaries.
    let whole = std::str::from_utf8(payload).ok();
    let base = payload.as_ptr() as usize;
    for w in payload.split(|&b| is_ws(b)) {
        if w.is_empty() {
            continue;
        }
        if w.len() > limits.word_bytes_max {
            st.malformed += 1;
            continue;
        }
        let off = w.as_ptr() as usize - base;
        let valid = match whole {
            Some(text) => text.get(off..off + w.len()),
            None => std::str::from_utf8(w).ok(),
        };
        let Some(w) = valid else {
            st.malformed += 1;
            continue;
        };
        if st.records >= limits.records_per_datagram_max as u64 {
            st.over_limit += 1;
            continue;
        }
        st.records += 1;
        emit(w);
    }
    st
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nums(p: &[u8], e: Encoding, l: &Limits) -> (Vec<f64>, ParseStats) {
        let mut v = Vec::new();
        let st = parse_numbers(p, e, l, |x| v.push(x));
        (v, st)
    }

    #[test]
    fn text_numbers_good_and_malformed() {
        let l = Limits::default();
        let p = b"1\r\n-2.5\n  3e2 \n\n.5\n5.\nnan\ninf\n-infinity\n0x10\n1 2\n1e999\nabc\n+\n1e\n7";
        let (v, st) = nums(p, Encoding::Text, &l);
        assert_eq!(v, vec![1.0, -2.5, 300.0, 0.5, 5.0, 7.0]);
        assert_eq!(st, ParseStats { records: 6, malformed: 9, over_limit: 0 });
        let long = format!("1{}", "0".repeat(NUMBER_BYTES_MAX));
        let (v, st) = nums(long.as_bytes(), Encoding::Text, &l);
        assert!(v.is_empty());
        assert_eq!(st.malformed, 1);
    }

    #[test]
    fn binary_numbers() {
        let l = Limits::default();
        let mut p = BINARY_MAGIC.to_vec();
        for x in [1.5f64, f64::NAN, -2.0, f64::INFINITY] {
            p.extend_from_slice(&x.to_le_bytes());
        }
        let (v, st) = nums(&p, Encoding::Auto, &l);
        assert_eq!(v, vec![1.5, -2.0]);
        assert_eq!(st, ParseStats { records: 2, malformed: 2, over_limit: 0 });
        // Binary without magic (length % 8 == 0).
        let (v, _) = nums(&p[4..], Encoding::Binary, &l);
        assert_eq!(v, vec![1.5, -2.0]);
        // Bad lengths: whole datagram malformed.
        let (v, st) = nums(&p[..p.len() - 3], Encoding::Binary, &l);
        assert!(v.is_empty());
        assert_eq!(st, ParseStats { records: 0, malformed: 1, over_limit: 0 });
        let mut wrong_magic = b"XXXX".to_vec();
        wrong_magic.extend_from_slice(&1.0f64.to_le_bytes());
        assert_eq!(nums(&wrong_magic, Encoding::Binary, &l).1.malformed, 1);
        // In Auto mode that is text, and malformed text.
        assert_eq!(nums(&wrong_magic, Encoding::Auto, &l).1.malformed, 1);
    }

    #[test]
    fn limits_are_counted() {
        let l = Limits { word_bytes_max: 4, records_per_datagram_max: 3 };
        let mut w = Vec::new();
        let st = parse_words(b"ab toolong cd\r\nef gh ij \xff\xfe", &l, |x| w.push(x.to_string()));
        assert_eq!(w, vec!["ab", "cd", "ef"]);
        assert_eq!(st, ParseStats { records: 3, malformed: 2, over_limit: 2 });
        let (v, st) = nums(b"1\n2\n3\n4\nx\n5", Encoding::Text, &l);
        assert_eq!(v, vec![1.0, 2.0, 3.0]);
        assert_eq!(st, ParseStats { records: 3, malformed: 1, over_limit: 2 });
    }

    #[test]
    fn words_keep_odd_bytes_but_reject_non_utf8() {
        let l = Limits::default();
        let mut w = Vec::new();
        let st = parse_words("\"q\" a\\b \x01ctl\x7f é \u{1F600}".as_bytes(), &l, |x| w.push(x.to_string()));
        assert_eq!(w, vec!["\"q\"", "a\\b", "\x01ctl\x7f", "é", "\u{1F600}"]);
        assert_eq!(st.malformed, 0);
        let st = parse_words(b"ok \xc3\x28 ok", &l, |_| {});
        assert_eq!(st, ParseStats { records: 2, malformed: 1, over_limit: 0 });
    }
}
