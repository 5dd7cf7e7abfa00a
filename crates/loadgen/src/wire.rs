//! Request bytes and reply parsing for the memcached text protocol, as the load generator
//! needs them: only `set` (expecting `STORED`) and single-key `get` (expecting
//! `VALUE ... END` or `END`). Not a general protocol parser; any other reply is an error.

/// Keys are `key:%08d`; with the key space capped below 10^8 every key is exactly 12 bytes.
pub const KEY_LEN: usize = 12;
pub const KEYS_MAX: u32 = 100_000_000;
/// Longest reply line we wait for before declaring the stream out of sync.
pub const LINE_BYTES_MAX: usize = 4096;

pub fn write_key(dst: &mut [u8; KEY_LEN], index: u32) {
    dst[..4].copy_from_slice(b"key:");
    let mut n = index;
    for slot in dst[4..].iter_mut().rev() {
        *slot = b'0' + (n % 10) as u8;
        n /= 10;
    }
}

pub fn key(index: u32) -> [u8; KEY_LEN] {
    let mut k = [0u8; KEY_LEN];
    write_key(&mut k, index);
    k
}

/// The value every set stores: a fixed, recognisable pattern, checked on every hit.
pub fn value_pattern(value_bytes: usize) -> Vec<u8> {
    (0..value_bytes).map(|i| b'a' + (i % 26) as u8).collect()
}

/// Pre-built request templates; a request is the template with the key digits patched in.
pub struct Templates {
    /// `set key:00000000 0 0 N\r\n<value>\r\n`
    set: Vec<u8>,
    /// `get key:00000000\r\n`
    get: Vec<u8>,
}

/// Offset of the key in both templates (after `set ` / `get `).
const KEY_AT: usize = 4;

impl Templates {
    pub fn new(value: &[u8]) -> Self {
        let mut set = Vec::with_capacity(value.len() + 48);
        set.extend_from_slice(b"set ");
        set.extend_from_slice(&key(0));
        set.extend_from_slice(format!(" 0 0 {}\r\n", value.len()).as_bytes());
        set.extend_from_slice(value);
        set.extend_from_slice(b"\r\n");
        let mut get = Vec::with_capacity(24);
        get.extend_from_slice(b"get ");
        get.extend_from_slice(&key(0));
        get.extend_from_slice(b"\r\n");
        Templates { set, get }
    }

    /// Append the request for (`op`, key `index`) to `out` (no allocation once `out` has
    /// grown to a batch's size).
    #[inline]
    pub fn append(&self, out: &mut Vec<u8>, op: Op, index: u32) {
        let start = out.len();
        let template = match op {
            Op::Set => &self.set,
            Op::Get => &self.get,
        };
        out.extend_from_slice(template);
        let mut k = [0u8; KEY_LEN];
        write_key(&mut k, index);
        if let Some(dst) = out.get_mut(start + KEY_AT..start + KEY_AT + KEY_LEN) {
            dst.copy_from_slice(&k);
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Set,
    Get,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Stored,
    Hit,
    Miss,
    /// A well-framed but unexpected reply (e.g. `SERVER_ERROR ...`, `NOT_STORED`, wrong key).
    Error,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Reply {
    Done {
        outcome: Outcome,
        consumed: usize,
    },
    Incomplete,
    /// The byte stream cannot be framed any more (bad VALUE block, line too long):
    /// the connection is useless from here on.
    Desync,
}

fn find_crlf(buf: &[u8]) -> Option<usize> {
    buf.windows(2).position(|w| w == b"\r\n")
}

fn parse_decimal(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 19 {
        return None;
    }
    let mut n = 0u64;
    for &b in s {
        if !b.is_ascii_digit() {
            return None;
        }
        n = n * 10 + u64::from(b - b'0');
    }
    Some(n)
}

/// Parse the reply to one request from the front of `buf`.
/// `key_index` is the key the request named; `value` is what a hit must contain.
pub fn parse_reply(buf: &[u8], op: Op, key_index: u32, value: &[u8]) -> Reply {
    let line_end = match find_crlf(buf) {
        Some(e) => e,
        None if buf.len() > LINE_BYTES_MAX => return Reply::Desync,
        None => return Reply::Incomplete,
    };
    let line = &buf[..line_end];
    let after_line = line_end + 2;
    match op {
        Op::Set => {
            let outcome = if line == b"STORED" { Outcome::Stored } else { Outcome::Error };
            Reply::Done { outcome, consumed: after_line }
        }
        Op::Get => {
            if line == b"END" {
                return Reply::Done { outcome: Outcome::Miss, consumed: after_line };
            }
            let Some(rest) = line.strip_prefix(b"VALUE ") else {
                // A one-line error reply (ERROR, CLIENT_ERROR ..., SERVER_ERROR ...).
                return Reply::Done { outcome: Outcome::Error, consumed: after_line };
            };
            let mut fields = rest.split(|&b| b == b' ');
            let (Some(got_key), Some(flags), Some(bytes)) = (fields.next(), fields.next(), fields.next()) else {
                return Reply::Desync;
            };
            let (Some(_flags), Some(bytes)) = (parse_decimal(flags), parse_decimal(bytes)) else {
                return Reply::Desync;
            };
            // A length other than ours means someone else's data; we cannot know the
            // framing is sane beyond this point if it is also huge, so treat as desync.
            if bytes != value.len() as u64 {
                return Reply::Desync;
            }
            let data_end = after_line + value.len();
            let total = data_end + 2 + 5;
            if buf.len() < total {
                return Reply::Incomplete;
            }
            if &buf[data_end..total] != b"\r\nEND\r\n" {
                return Reply::Desync;
            }
            let outcome = if got_key == key(key_index) && &buf[after_line..data_end] == value {
                Outcome::Hit
            } else {
                Outcome::Error
            };
            Reply::Done { outcome, consumed: total }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_zero_padded() {
        assert_eq!(&key(0), b"key:00000000");
        assert_eq!(&key(12345), b"key:00012345");
        assert_eq!(&key(KEYS_MAX - 1), b"key:99999999");
    }

    #[test]
    fn templates_patch_keys() {
        let t = Templates::new(b"abc");
        let mut out = Vec::new();
        t.append(&mut out, Op::Set, 7);
        t.append(&mut out, Op::Get, 42);
        assert_eq!(out, b"set key:00000007 0 0 3\r\nabc\r\nget key:00000042\r\n");
    }

    #[test]
    fn parses_set_replies() {
        let v = b"xy";
        assert_eq!(parse_reply(b"STORED\r\nEND", Op::Set, 1, v), Reply::Done { outcome: Outcome::Stored, consumed: 8 });
        assert_eq!(parse_reply(b"STOR", Op::Set, 1, v), Reply::Incomplete);
        assert_eq!(
            parse_reply(b"SERVER_ERROR out of memory\r\n", Op::Set, 1, v),
            Reply::Done { outcome: Outcome::Error, consumed: 28 }
        );
    }

    #[test]
    fn parses_get_replies() {
        let v = b"xy";
        let hit = b"VALUE key:00000001 0 2\r\nxy\r\nEND\r\n";
        assert_eq!(parse_reply(hit, Op::Get, 1, v), Reply::Done { outcome: Outcome::Hit, consumed: hit.len() });
        // Every strict prefix is incomplete, never an error.
        for n in 0..hit.len() {
            assert_eq!(parse_reply(&hit[..n], Op::Get, 1, v), Reply::Incomplete, "prefix {n}");
        }
        assert_eq!(parse_reply(hit, Op::Get, 2, v), Reply::Done { outcome: Outcome::Error, consumed: hit.len() });
        let bad_data = b"VALUE key:00000001 0 2\r\nxz\r\nEND\r\n";
        assert_eq!(
            parse_reply(bad_data, Op::Get, 1, v),
            Reply::Done { outcome: Outcome::Error, consumed: bad_data.len() }
        );
        assert_eq!(parse_reply(b"END\r\n", Op::Get, 1, v), Reply::Done { outcome: Outcome::Miss, consumed: 5 });
        assert_eq!(parse_reply(b"ERROR\r\n", Op::Get, 1, v), Reply::Done { outcome: Outcome::Error, consumed: 7 });
        assert_eq!(parse_reply(b"VALUE key:00000001 0 3\r\nxyz\r\nEND\r\n", Op::Get, 1, v), Reply::Desync);
        assert_eq!(parse_reply(b"VALUE key:00000001 0 2\r\nxy\r\nEXD\r\n", Op::Get, 1, v), Reply::Desync);
        assert_eq!(parse_reply(b"VALUE k\r\n", Op::Get, 1, v), Reply::Desync);
        assert_eq!(parse_reply(&[b'x'; LINE_BYTES_MAX + 1], Op::Get, 1, v), Reply::Desync);
    }
}
