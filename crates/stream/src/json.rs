//! json: the few JSON primitives result lines need, appended to a `Vec<u8>`.
//!
//! What it is for: strings with RFC 8259 escaping (`"` and `\` backslash-escaped; `\b \f \n \r
//! \t` short forms; every other byte below 0x20, and DEL 0x7f, as `\u00XX`; all other UTF-8
//! passed through unchanged), finite numbers, integers and booleans.
//! Decisions: a non-finite f64 (only reachable when a sum overflows) is written as `null`, never
//! as `NaN`/`inf`, so every line stays valid JSON. Finite f64s use Rust's shortest round-trip
//! form (`{:?}`: `10.0`, `0.1`, `1e16`, `1.5e-7`), which is valid JSON and parses back to the
//! identical f64. Byte strings that are not valid UTF-8 ([`push_str_bytes`]) have each invalid
//! sequence replaced by U+FFFD (lossy, documented); the record parser rejects such words before
//! they reach a counter, so counted words are always spelled exactly.
//!
//! What it is not for: parsing JSON, or general serialisation.

use std::io::Write;

/// Appends `s` as a JSON string literal.
pub fn push_str(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let short: Option<&[u8]> = match b {
            b'"' => Some(b"\\\""),
            b'\\' => Some(b"\\\\"),
            b'\n' => Some(b"\\n"),
            b'\r' => Some(b"\\r"),
            b'\t' => Some(b"\\t"),
            0x08 => Some(b"\\b"),
            0x0c => Some(b"\\f"),
            _ => None,
        };
        let needs_u = b < 0x20 || b == 0x7f;
        if short.is_none() && !needs_u {
            continue;
        }
        out.extend_from_slice(bytes.get(start..i).unwrap_or(&[]));
        match short {
            Some(esc) => out.extend_from_slice(esc),
            None => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.extend_from_slice(b"\\u00");
                out.push(HEX[usize::from(b >> 4)]);
                out.push(HEX[usize::from(b & 0x0f)]);
            }
        }
        start = i + 1;
    }
    out.extend_from_slice(bytes.get(start..).unwrap_or(&[]));
    out.push(b'"');
}

/// Appends arbitrary bytes as a JSON string, invalid UTF-8 replaced by U+FFFD (lossy).
pub fn push_str_bytes(out: &mut Vec<u8>, b: &[u8]) {
    push_str(out, &String::from_utf8_lossy(b));
}

/// Appends a finite f64 in shortest round-trip form, or `null` when not finite.
pub fn push_f64(out: &mut Vec<u8>, v: f64) {
    if v.is_finite() {
        // Writing into a Vec cannot fail.
        let _ = write!(out, "{v:?}");
    } else {
        out.extend_from_slice(b"null");
    }
}

/// Appends `Some(v)` as a number (see [`push_f64`]) and `None` as `null`.
pub fn push_opt_f64(out: &mut Vec<u8>, v: Option<f64>) {
    match v {
        Some(v) => push_f64(out, v),
        None => out.extend_from_slice(b"null"),
    }
}

pub fn push_u64(out: &mut Vec<u8>, v: u64) {
    let _ = write!(out, "{v}");
}

pub fn push_bool(out: &mut Vec<u8>, v: bool) {
    out.extend_from_slice(if v { b"true" } else { b"false" });
}

/// Appends `,"key":` (the key is trusted ASCII from this crate, still escaped).
pub fn push_key(out: &mut Vec<u8>, key: &str) {
    out.push(b',');
    push_str(out, key);
    out.push(b':');
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Minimal JSON number grammar check (RFC 8259 §6).
    pub(crate) fn is_json_number(s: &str) -> bool {
        let b = s.as_bytes();
        let mut i = 0;
        if b.first() == Some(&b'-') {
            i += 1;
        }
        match b.get(i) {
            Some(b'0') => i += 1,
            Some(b'1'..=b'9') => {
                while matches!(b.get(i), Some(b'0'..=b'9')) {
                    i += 1
                }
            }
            _ => return false,
        }
        if b.get(i) == Some(&b'.') {
            i += 1;
            let s0 = i;
            while matches!(b.get(i), Some(b'0'..=b'9')) {
                i += 1
            }
            if i == s0 {
                return false;
            }
        }
        if matches!(b.get(i), Some(b'e') | Some(b'E')) {
            i += 1;
            if matches!(b.get(i), Some(b'+') | Some(b'-')) {
                i += 1
            }
            let s0 = i;
            while matches!(b.get(i), Some(b'0'..=b'9')) {
                i += 1
            }
            if i == s0 {
                return false;
            }
        }
        i == b.len()
    }

    fn s(x: &str) -> String {
        let mut o = Vec::new();
        push_str(&mut o, x);
        String::from_utf8(o).unwrap()
    }

    #[test]
    fn escapes() {
        assert_eq!(s("plain"), "\"plain\"");
        assert_eq!(s("a\"b\\c"), r#""a\"b\\c""#);
        assert_eq!(s("\n\r\t\x08\x0c"), r#""\n\r\t\b\f""#);
        assert_eq!(s("\x00\x01\x1f\x7f"), r#""\u0000\u0001\u001f\u007f""#);
        assert_eq!(s("é\u{1F600}"), "\"é\u{1F600}\"");
        let mut o = Vec::new();
        push_str_bytes(&mut o, b"a\xffb\xc3");
        assert_eq!(String::from_utf8(o).unwrap(), "\"a\u{FFFD}b\u{FFFD}\"");
    }

    #[test]
    fn numbers_are_json_and_round_trip() {
        let cases = [
            0.0,
            -0.0,
            1.0,
            -2.5,
            0.1,
            31.2,
            1e16,
            1e-7,
            1.5e300,
            -1.5e-300,
            f64::MAX,
            f64::MIN_POSITIVE,
            5e-324,
            123456789.125,
        ];
        for v in cases {
            let mut o = Vec::new();
            push_f64(&mut o, v);
            let t = String::from_utf8(o).unwrap();
            assert!(is_json_number(&t), "{v} -> {t}");
            assert_eq!(t.parse::<f64>().unwrap().to_bits(), v.to_bits(), "{t}");
        }
        for v in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let mut o = Vec::new();
            push_f64(&mut o, v);
            assert_eq!(o, b"null");
        }
        let mut o = Vec::new();
        push_u64(&mut o, u64::MAX);
        push_bool(&mut o, true);
        push_opt_f64(&mut o, None);
        assert_eq!(o, b"18446744073709551615truenull");
    }
}
