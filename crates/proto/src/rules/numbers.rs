//! memcached's number parsing (`safe_strtoull`, `safe_strtoul`, `safe_strtol` in its util.c,
//! over C `strto*` in the "C" locale) and decimal formatting.
//!
//! The rules, each checked against memcached 1.6.18:
//! - leading C white space and one `+` or `-` are accepted (`" 12"`, `"+7"`, `"\t7"`);
//! - the number must end the string or be followed by C white space (`"7\t"` is 7, `"7x"` and
//!   `"0x10"` are refused); a NUL ends the string, as in C (a stored value `"12\0x"` is 12);
//! - no digits is refused (`""`, `"-"`, `"abc"`), so is a magnitude over 2^64-1 (ERANGE);
//! - unsigned parses negate in two's complement, as C does (`"-0"` is 0,
//!   `"-18446744073709551615"` is 1) and refuse the result only when its top bit is set *and*
//!   the string holds a `-` anywhere (memcached's `strchr(str, '-')`: even after the number,
//!   so `"18446744073709551615\t-"` is refused);
//! - `safe_strtoul` and `safe_strtol` parse 64 bits and memcached stores the result into 32
//!   bits: silently truncated (`flags 4294967296` is 0, `exptime 4294967396` is 100);
//!   `safe_strtol` refuses only what overflows a 64-bit `long`.
//!
//! The input is a token (no spaces, no NUL: see `tokens`) or a stored value; nothing allocates.

#[inline]
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// What C `strto*(str, &end, 10)` reads from the front of a string.
struct Scan {
    negative: bool,
    magnitude: u64,
    /// ERANGE: the magnitude does not fit 64 bits.
    overflow: bool,
}

/// White space, sign, digits, then the `safe_strto*` end check. None when there are no
/// digits (memcached sees `endptr == str`), or when the number is followed by anything but
/// white space or the end of the (C) string.
#[inline]
fn scan(s: &[u8]) -> Option<Scan> {
    let mut i = 0;
    while s.get(i).is_some_and(|&b| is_c_space(b)) {
        i += 1;
    }
    let mut negative = false;
    match s.get(i) {
        Some(b'-') => {
            negative = true;
            i += 1;
        }
        Some(b'+') => i += 1,
        _ => {}
    }
    let digits_start = i;
    let mut magnitude: u64 = 0;
    let mut overflow = false;
    while let Some(&b) = s.get(i) {
        if !b.is_ascii_digit() {
            break;
        }
        match magnitude.checked_mul(10).and_then(|m| m.checked_add(u64::from(b - b'0'))) {
            Some(m) => magnitude = m,
            None => overflow = true,
        }
        i += 1;
    }
    if i == digits_start {
        return None;
    }
    match s.get(i) {
        None | Some(0) => {}
        Some(&b) if is_c_space(b) => {}
        Some(_) => return None,
    }
    Some(Scan { negative, magnitude, overflow })
}

/// memcached's `strchr(str, '-')`: a `-` anywhere before the string's end (its first NUL).
#[cold]
fn has_minus(s: &[u8]) -> bool {
    s.iter().take_while(|&&b| b != 0).any(|&b| b == b'-')
}

/// memcached `safe_strtoull`: a u64 (see the module doc for the exact rules).
#[inline]
pub fn safe_strtoull(s: &[u8]) -> Option<u64> {
    let c = scan(s)?;
    if c.overflow {
        return None;
    }
    let v = if c.negative { c.magnitude.wrapping_neg() } else { c.magnitude };
    if (v as i64) < 0 && has_minus(s) {
        return None;
    }
    Some(v)
}

/// memcached `safe_strtoul`: as [`safe_strtoull`] (an `unsigned long` is 64 bits), then stored
/// into a `uint32_t`: truncated.
#[inline]
pub fn safe_strtoul(s: &[u8]) -> Option<u32> {
    safe_strtoull(s).map(|v| v as u32)
}

/// memcached `safe_strtol`: a 64-bit `long` (out of range is refused), stored into an
/// `int32_t`: truncated.
#[inline]
pub fn safe_strtol(s: &[u8]) -> Option<i32> {
    safe_strtoll(s).map(|v| v as i32)
}

/// memcached `safe_strtoll`: a 64-bit `long long`; out of range is refused.
#[inline]
pub fn safe_strtoll(s: &[u8]) -> Option<i64> {
    let c = scan(s)?;
    if c.overflow {
        return None;
    }
    let v: i64 = if c.negative {
        if c.magnitude > 1u64 << 63 {
            return None;
        }
        (c.magnitude as i64).wrapping_neg()
    } else {
        if c.magnitude > i64::MAX as u64 {
            return None;
        }
        c.magnitude as i64
    };
    Some(v)
}

/// Decimal digits of `v` in a stack buffer: (buffer, index of the first digit). Every reply
/// number and every incr/decr result is written with this; no allocation.
#[inline]
pub fn decimal_digits(mut v: u64) -> ([u8; 20], usize) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        if let Some(slot) = buf.get_mut(i) {
            *slot = b'0' + (v % 10) as u8;
        }
        v /= 10;
        if v == 0 || i == 0 {
            break;
        }
    }
    (buf, i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsigned_follows_c_strtoull() {
        assert_eq!(safe_strtoull(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(safe_strtoull(b"18446744073709551616"), None);
        assert_eq!(safe_strtoull(b"-18446744073709551616"), None);
        assert_eq!(safe_strtoull(b"-1"), None);
        assert_eq!(safe_strtoull(b"-0"), Some(0));
        assert_eq!(safe_strtoull(b"-18446744073709551615"), Some(1));
        assert_eq!(safe_strtoull(b" 12"), Some(12));
        assert_eq!(safe_strtoull(b"+5"), Some(5));
        assert_eq!(safe_strtoull(b"0000000000000000000000001"), Some(1));
        // memcached looks for '-' in the whole string once the value's top bit is set.
        assert_eq!(safe_strtoull(b"18446744073709551615\t-"), None);
        assert_eq!(safe_strtoull(b"5\t-"), Some(5));
        assert_eq!(safe_strtoull(b"9223372036854775808"), Some(1 << 63));
        assert_eq!(safe_strtoull(b"-9223372036854775808"), None);
        assert_eq!(safe_strtoull(b""), None);
        assert_eq!(safe_strtoull(b"   "), None);
        assert_eq!(safe_strtoull(b"+"), None);
        assert_eq!(safe_strtoull(b"0x10"), None);
    }

    #[test]
    fn stored_values_read_like_memcached_incr() {
        // Each case was checked against memcached 1.6.18 with `set v; incr v 1`: the value is
        // followed by "\r\n" in memcached's item, which ends the number like white space.
        assert_eq!(safe_strtoull(b"100"), Some(100));
        assert_eq!(safe_strtoull(b"12 abc"), Some(12));
        assert_eq!(safe_strtoull(b"12\r\n3"), Some(12));
        assert_eq!(safe_strtoull(b"7\t"), Some(7));
        assert_eq!(safe_strtoull(b"12abc"), None);
        assert_eq!(safe_strtoull(b"-5"), None);
        // A NUL ends memcached's C string: the number is complete.
        assert_eq!(safe_strtoull(b"12\x00x"), Some(12));
        assert_eq!(safe_strtoull(b"18446744073709551615 -"), None);
        assert_eq!(safe_strtoull(b"18446744073709551615\x00-"), Some(u64::MAX));
    }

    #[test]
    fn narrow_parses_truncate_like_memcached() {
        assert_eq!(safe_strtoul(b"4294967295"), Some(u32::MAX));
        assert_eq!(safe_strtoul(b"4294967296"), Some(0));
        assert_eq!(safe_strtoul(b"-0"), Some(0));
        assert_eq!(safe_strtoul(b"-1"), None);
        assert_eq!(safe_strtoul(b"-18446744073709551615"), Some(1));
        assert_eq!(safe_strtoul(b"+7"), Some(7));
        assert_eq!(safe_strtoul(b"\t7"), Some(7));
        assert_eq!(safe_strtoul(b"7\t"), Some(7));
        assert_eq!(safe_strtoul(b"7x"), None);
        assert_eq!(safe_strtoul(b"18446744073709551615\t-"), None);
        assert_eq!(safe_strtoul(b""), None);
        assert_eq!(safe_strtoul(b"-"), None);
        assert_eq!(safe_strtoul(b"abc"), None);
        assert_eq!(safe_strtol(b"9999999999"), Some(9999999999i64 as i32));
        assert_eq!(safe_strtol(b"4294967396"), Some(100));
        assert_eq!(safe_strtol(b"-1"), Some(-1));
        assert_eq!(safe_strtol(b"3000000000"), Some(3000000000i64 as i32));
        assert_eq!(safe_strtol(b"9223372036854775807"), Some(-1));
        assert_eq!(safe_strtol(b"9223372036854775808"), None);
        assert_eq!(safe_strtol(b"-9223372036854775808"), Some(0));
        assert_eq!(safe_strtol(b"-9223372036854775809"), None);
        assert_eq!(safe_strtol(b"5\t-"), Some(5));
    }

    #[test]
    fn decimal_digits_writes_every_width() {
        let s = |v| {
            let (b, i) = decimal_digits(v);
            b[i..].to_vec()
        };
        assert_eq!(s(0), b"0");
        assert_eq!(s(1200), b"1200");
        assert_eq!(s(u64::MAX), b"18446744073709551615");
    }
}
