//! A memcached mutation as a Raft log entry: a compact binary encoding, versioned.
//!
//! Not for: parsing protocol bytes (the server's executors build a [`Mutation`] from a parsed
//! request) or applying it ([`crate::machine`]).
//!
//! Everything that would differ between replicas is fixed by the proposer before the entry
//! is written: relative exptimes become absolute Unix seconds ([`absolute_exptime`], from the
//! leader's clock), so every replica expires the item at the same moment whatever its own
//! start time. The CAS of the new item comes from the entry's log position, assigned when
//! the leader appends it (see `machine`), so it needs no field here.
//!
//! Layout (integers little-endian): `version: u8 = 1`, `op: u8`, then per op:
//! - store: `mode: u8`, `bits: u8` (1 cas, 2 explicit cas, 4 invalidate, 8 vivify,
//!   16 base64 key), `flags: u32`, `exptime: i64`, optional `cas: u64`, `explicit: u64`,
//!   `vivify: i64` in that order, key (`u8` length), value (`u32` length).
//! - delete: `bits: u8` (1 cas, 2 invalidate, 4 invalidate exptime), optional `cas: u64`,
//!   `exptime: i64`, key.
//! - arith: `bits: u8` (1 incr, 2 vivify, 4 cas, 8 touch), `delta: u64`, optional
//!   `initial: u64` + `exptime: i64`, `cas: u64`, `touch: i64`, key.
//! - touch: `exptime: i64`, key.  - flush_all: `delay: i64`.
//! - command: `protocol: u8`, `now_unix_s: i64`, request bytes (`u32` length).
//!
//! A *command* entry is what the serving path proposes: one whole memcached request (text,
//! meta or binary) exactly as the client sent it, with the proposer's Unix time. Every replica
//! runs it through the server's own executor ([`crate::machine::CommandExec`]) with that time
//! standing for "now" in relative exptimes, so replies are byte-identical to an unreplicated
//! tenant's and every replica derives the same absolute expiry. The field-wise ops above are
//! the same mutations spelled out (used by the crate's own tests and tools).

use slipstream_proto::rules::KEY_BYTES_MAX;
use slipstream_store::{SetMode, REALTIME_MAXDELTA_S};

const VERSION: u8 = 1;
const OP_STORE: u8 = 1;
const OP_DELETE: u8 = 2;
const OP_ARITH: u8 = 3;
const OP_TOUCH: u8 = 4;
const OP_FLUSH_ALL: u8 = 5;
const OP_COMMAND: u8 = 6;

/// Largest value an encoded store may carry (the store's `-I` limit is checked at apply).
pub const VALUE_BYTES_MAX: usize = 1 << 30;

/// One mutating memcached command (text, meta or binary), as every replica applies it.
/// Exptimes are raw protocol values already made absolute with [`absolute_exptime`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mutation {
    /// set/add/replace/append/prepend/cas and `ms`.
    Store {
        mode: SetMode,
        key: Vec<u8>,
        value: Vec<u8>,
        flags: u32,
        exptime: i64,
        /// cas / `ms C`: the CAS the client compares with.
        cas: Option<u64>,
        /// `ms E`: the client's CAS for the new item.
        explicit_cas: Option<u64>,
        /// `ms I`.
        invalidate: bool,
        /// `ms MA/MP N<ttl>`: autovivify exptime.
        vivify_exptime: Option<i64>,
        /// `ms b`.
        key_binary: bool,
    },
    /// delete / `md` (with `I` and `T`).
    Delete { key: Vec<u8>, cas: Option<u64>, invalidate: bool, invalidate_exptime: Option<i64> },
    /// incr/decr / `ma`.
    Arith {
        key: Vec<u8>,
        incr: bool,
        delta: u64,
        /// `ma N<ttl> J<initial>`: (initial, exptime).
        vivify: Option<(u64, i64)>,
        cas: Option<u64>,
        touch_exptime: Option<i64>,
    },
    /// touch (and the touch half of gat / `mg T`).
    Touch { key: Vec<u8>, exptime: i64 },
    /// flush_all [delay].
    FlushAll { delay: i64 },
    /// One whole client request, run by the server's executor on every replica (see the
    /// module doc). `protocol`: 1 text/meta, 2 binary.
    Command { protocol: u8, now_unix_s: i64, request: Vec<u8> },
}

/// Why an entry could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecodeError {
    Truncated,
    UnknownVersion(u8),
    UnknownOp(u8),
    BadMode(u8),
    KeyTooLong(usize),
    ValueTooLong(usize),
    TrailingBytes(usize),
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "bad replicated mutation: {self:?}")
    }
}

impl std::error::Error for DecodeError {}

/// A raw protocol exptime made absolute on the proposer: 0 stays "never", a negative one
/// stays "already expired", up to 30 days is relative to `now_unix_s`, above that it already
/// is a Unix time (memcached's rule).
pub fn absolute_exptime(raw: i64, now_unix_s: i64) -> i64 {
    match raw {
        0 => 0,
        r if r < 0 => -1,
        r if r <= REALTIME_MAXDELTA_S => now_unix_s.saturating_add(r),
        r => r,
    }
}

fn mode_byte(m: SetMode) -> u8 {
    match m {
        SetMode::Set => 1,
        SetMode::Add => 2,
        SetMode::Replace => 3,
        SetMode::Append => 4,
        SetMode::Prepend => 5,
        SetMode::Cas => 6,
    }
}

fn mode_of(b: u8) -> Result<SetMode, DecodeError> {
    Ok(match b {
        1 => SetMode::Set,
        2 => SetMode::Add,
        3 => SetMode::Replace,
        4 => SetMode::Append,
        5 => SetMode::Prepend,
        6 => SetMode::Cas,
        x => return Err(DecodeError::BadMode(x)),
    })
}

impl Mutation {
    /// The key the mutation changes (None for flush_all).
    pub fn key(&self) -> Option<&[u8]> {
        match self {
            Mutation::Store { key, .. }
            | Mutation::Delete { key, .. }
            | Mutation::Arith { key, .. }
            | Mutation::Touch { key, .. } => Some(key),
            Mutation::FlushAll { .. } | Mutation::Command { .. } => None,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(32 + self.key().map_or(0, |k| k.len()));
        b.push(VERSION);
        match self {
            Mutation::Store {
                mode,
                key,
                value,
                flags,
                exptime,
                cas,
                explicit_cas,
                invalidate,
                vivify_exptime,
                key_binary,
            } => {
                b.push(OP_STORE);
                b.push(mode_byte(*mode));
                let bits = bit(cas.is_some(), 1)
                    | bit(explicit_cas.is_some(), 2)
                    | bit(*invalidate, 4)
                    | bit(vivify_exptime.is_some(), 8)
                    | bit(*key_binary, 16);
                b.push(bits);
                b.extend_from_slice(&flags.to_le_bytes());
                b.extend_from_slice(&exptime.to_le_bytes());
                put_opt_u64(&mut b, *cas);
                put_opt_u64(&mut b, *explicit_cas);
                put_opt_u64(&mut b, vivify_exptime.map(|v| v as u64));
                put_key(&mut b, key);
                b.extend_from_slice(&(value.len() as u32).to_le_bytes());
                b.extend_from_slice(value);
            }
            Mutation::Delete { key, cas, invalidate, invalidate_exptime } => {
                b.push(OP_DELETE);
                b.push(bit(cas.is_some(), 1) | bit(*invalidate, 2) | bit(invalidate_exptime.is_some(), 4));
                put_opt_u64(&mut b, *cas);
                put_opt_u64(&mut b, invalidate_exptime.map(|v| v as u64));
                put_key(&mut b, key);
            }
            Mutation::Arith { key, incr, delta, vivify, cas, touch_exptime } => {
                b.push(OP_ARITH);
                b.push(
                    bit(*incr, 1) | bit(vivify.is_some(), 2) | bit(cas.is_some(), 4) | bit(touch_exptime.is_some(), 8),
                );
                b.extend_from_slice(&delta.to_le_bytes());
                if let Some((initial, exp)) = vivify {
                    b.extend_from_slice(&initial.to_le_bytes());
                    b.extend_from_slice(&exp.to_le_bytes());
                }
                put_opt_u64(&mut b, *cas);
                put_opt_u64(&mut b, touch_exptime.map(|v| v as u64));
                put_key(&mut b, key);
            }
            Mutation::Touch { key, exptime } => {
                b.push(OP_TOUCH);
                b.extend_from_slice(&exptime.to_le_bytes());
                put_key(&mut b, key);
            }
            Mutation::FlushAll { delay } => {
                b.push(OP_FLUSH_ALL);
                b.extend_from_slice(&delay.to_le_bytes());
            }
            Mutation::Command { protocol, now_unix_s, request } => {
                b.reserve(request.len() + 13);
                b.push(OP_COMMAND);
                b.push(*protocol);
                b.extend_from_slice(&now_unix_s.to_le_bytes());
                b.extend_from_slice(&(request.len() as u32).to_le_bytes());
                b.extend_from_slice(request);
            }
        }
        b
    }

    /// Decode an entry, a command entry's request borrowed from `buf` (no copy: every
    /// replica applies every entry, and a restarted one re-applies its committed log).
    pub fn decode_entry(buf: &[u8]) -> Result<Decoded<'_>, DecodeError> {
        if buf.get(1) != Some(&OP_COMMAND) {
            return Mutation::decode(buf).map(Decoded::Other);
        }
        let mut r = Reader { buf, at: 0 };
        let v = r.u8()?;
        if v != VERSION {
            return Err(DecodeError::UnknownVersion(v));
        }
        r.u8()?;
        let c = command_body(&mut r)?;
        if r.at != buf.len() {
            return Err(DecodeError::TrailingBytes(buf.len() - r.at));
        }
        Ok(Decoded::Command(c))
    }

    pub fn decode(buf: &[u8]) -> Result<Mutation, DecodeError> {
        let mut r = Reader { buf, at: 0 };
        let v = r.u8()?;
        if v != VERSION {
            return Err(DecodeError::UnknownVersion(v));
        }
        let m = match r.u8()? {
            OP_STORE => {
                let mode = mode_of(r.u8()?)?;
                let bits = r.u8()?;
                let flags = r.u32()?;
                let exptime = r.i64()?;
                let cas = r.opt_u64(bits & 1 != 0)?;
                let explicit_cas = r.opt_u64(bits & 2 != 0)?;
                let vivify_exptime = r.opt_u64(bits & 8 != 0)?.map(|v| v as i64);
                let key = r.key()?;
                let vlen = r.u32()? as usize;
                if vlen > VALUE_BYTES_MAX {
                    return Err(DecodeError::ValueTooLong(vlen));
                }
                let value = r.bytes(vlen)?.to_vec();
                Mutation::Store {
                    mode,
                    key,
                    value,
                    flags,
                    exptime,
                    cas,
                    explicit_cas,
                    invalidate: bits & 4 != 0,
                    vivify_exptime,
                    key_binary: bits & 16 != 0,
                }
            }
            OP_DELETE => {
                let bits = r.u8()?;
                let cas = r.opt_u64(bits & 1 != 0)?;
                let invalidate_exptime = r.opt_u64(bits & 4 != 0)?.map(|v| v as i64);
                Mutation::Delete { key: r.key()?, cas, invalidate: bits & 2 != 0, invalidate_exptime }
            }
            OP_ARITH => {
                let bits = r.u8()?;
                let delta = r.u64()?;
                let vivify = if bits & 2 != 0 { Some((r.u64()?, r.i64()?)) } else { None };
                let cas = r.opt_u64(bits & 4 != 0)?;
                let touch_exptime = r.opt_u64(bits & 8 != 0)?.map(|v| v as i64);
                Mutation::Arith { key: r.key()?, incr: bits & 1 != 0, delta, vivify, cas, touch_exptime }
            }
            OP_TOUCH => {
                let exptime = r.i64()?;
                Mutation::Touch { key: r.key()?, exptime }
            }
            OP_FLUSH_ALL => Mutation::FlushAll { delay: r.i64()? },
            OP_COMMAND => {
                let c = command_body(&mut r)?;
                Mutation::Command { protocol: c.protocol, now_unix_s: c.now_unix_s, request: c.request.to_vec() }
            }
            op => return Err(DecodeError::UnknownOp(op)),
        };
        if r.at != buf.len() {
            return Err(DecodeError::TrailingBytes(buf.len() - r.at));
        }
        Ok(m)
    }
}

fn bit(on: bool, b: u8) -> u8 {
    if on {
        b
    } else {
        0
    }
}

fn put_opt_u64(b: &mut Vec<u8>, v: Option<u64>) {
    if let Some(v) = v {
        b.extend_from_slice(&v.to_le_bytes());
    }
}

fn put_key(b: &mut Vec<u8>, key: &[u8]) {
    // Keys come from parsed requests (<= KEY_BYTES_MAX = 250); a longer one is cut to what
    // the store would refuse anyway rather than corrupting the length byte.
    let k = &key[..key.len().min(u8::MAX as usize)];
    b.push(k.len() as u8);
    b.extend_from_slice(k);
}

/// An entry as [`Mutation::decode_entry`] reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decoded<'a> {
    /// [`Mutation::Command`]'s fields, the request borrowed.
    Command(CommandRef<'a>),
    Other(Mutation),
}

/// A command entry's fields (see [`Decoded::Command`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommandRef<'a> {
    pub protocol: u8,
    pub now_unix_s: i64,
    pub request: &'a [u8],
}

/// The fields of a command entry after its op byte (one reader for both decodes).
fn command_body<'a>(r: &mut Reader<'a>) -> Result<CommandRef<'a>, DecodeError> {
    let protocol = r.u8()?;
    let now_unix_s = r.i64()?;
    let len = r.u32()? as usize;
    if len > VALUE_BYTES_MAX {
        return Err(DecodeError::ValueTooLong(len));
    }
    Ok(CommandRef { protocol, now_unix_s, request: r.bytes(len)? })
}

struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn bytes(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.buf.len()).ok_or(DecodeError::Truncated)?;
        let s = &self.buf[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.bytes(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        let mut a = [0u8; 4];
        a.copy_from_slice(self.bytes(4)?);
        Ok(u32::from_le_bytes(a))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.bytes(8)?);
        Ok(u64::from_le_bytes(a))
    }
    fn i64(&mut self) -> Result<i64, DecodeError> {
        Ok(self.u64()? as i64)
    }
    fn opt_u64(&mut self, present: bool) -> Result<Option<u64>, DecodeError> {
        if present {
            self.u64().map(Some)
        } else {
            Ok(None)
        }
    }
    fn key(&mut self) -> Result<Vec<u8>, DecodeError> {
        let n = self.u8()? as usize;
        if n > KEY_BYTES_MAX {
            return Err(DecodeError::KeyTooLong(n));
        }
        Ok(self.bytes(n)?.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples() -> Vec<Mutation> {
        let k = b"key".to_vec();
        vec![
            Mutation::Store {
                mode: SetMode::Set,
                key: k.clone(),
                value: b"value".to_vec(),
                flags: 7,
                exptime: 1_800_000_000,
                cas: None,
                explicit_cas: None,
                invalidate: false,
                vivify_exptime: None,
                key_binary: false,
            },
            Mutation::Store {
                mode: SetMode::Append,
                key: k.clone(),
                value: vec![0, 1, 2, 255],
                flags: u32::MAX,
                exptime: -1,
                cas: Some(42),
                explicit_cas: Some(9),
                invalidate: true,
                vivify_exptime: Some(1_800_000_100),
                key_binary: true,
            },
            Mutation::Delete { key: k.clone(), cas: Some(3), invalidate: true, invalidate_exptime: Some(5) },
            Mutation::Delete { key: k.clone(), cas: None, invalidate: false, invalidate_exptime: None },
            Mutation::Arith {
                key: k.clone(),
                incr: true,
                delta: u64::MAX,
                vivify: Some((10, 0)),
                cas: Some(1),
                touch_exptime: Some(-1),
            },
            Mutation::Arith { key: k.clone(), incr: false, delta: 1, vivify: None, cas: None, touch_exptime: None },
            Mutation::Touch { key: k, exptime: 0 },
            Mutation::FlushAll { delay: 1_800_000_000 },
            Mutation::Command { protocol: 1, now_unix_s: 1_800_000_000, request: b"set a 0 60 1\r\nx\r\n".to_vec() },
            Mutation::Command { protocol: 2, now_unix_s: -3, request: Vec::new() },
        ]
    }

    #[test]
    fn every_op_round_trips() {
        for m in samples() {
            assert_eq!(Mutation::decode(&m.encode()).as_ref(), Ok(&m));
        }
    }

    /// `decode_entry` reads what `decode` reads (a command's request borrowed), and refuses
    /// what it refuses: every cut and every padded entry of every kind.
    #[test]
    fn decode_entry_agrees_with_decode() {
        for m in samples() {
            let b = m.encode();
            let got = match Mutation::decode_entry(&b).unwrap() {
                Decoded::Command(c) => {
                    assert!(std::ptr::eq(c.request.as_ptr_range().end, b.as_ptr_range().end), "{m:?} copied");
                    Mutation::Command { protocol: c.protocol, now_unix_s: c.now_unix_s, request: c.request.to_vec() }
                }
                Decoded::Other(o) => {
                    assert!(!matches!(o, Mutation::Command { .. }), "{m:?}");
                    o
                }
            };
            assert_eq!(got, m);
            for n in 0..b.len() {
                assert!(Mutation::decode_entry(&b[..n]).is_err(), "{m:?} cut at {n}");
            }
            let mut longer = b.clone();
            longer.push(0);
            assert_eq!(Mutation::decode_entry(&longer).err(), Mutation::decode(&longer).err(), "{m:?} padded");
        }
    }

    /// Every strict prefix and every extension of a valid entry is refused, never panics.
    #[test]
    fn truncated_or_padded_entries_are_refused() {
        for m in samples() {
            let b = m.encode();
            for n in 0..b.len() {
                assert!(Mutation::decode(&b[..n]).is_err(), "{m:?} cut at {n}");
            }
            let mut longer = b.clone();
            longer.push(0);
            assert_eq!(Mutation::decode(&longer), Err(DecodeError::TrailingBytes(1)));
        }
        assert_eq!(Mutation::decode(&[2, 1]), Err(DecodeError::UnknownVersion(2)));
        assert_eq!(Mutation::decode(&[1, 99]), Err(DecodeError::UnknownOp(99)));
    }

    #[test]
    fn exptimes_become_absolute_on_the_proposer() {
        let now = 1_700_000_000;
        assert_eq!(absolute_exptime(0, now), 0);
        assert_eq!(absolute_exptime(-5, now), -1);
        assert_eq!(absolute_exptime(100, now), now + 100);
        assert_eq!(absolute_exptime(REALTIME_MAXDELTA_S, now), now + REALTIME_MAXDELTA_S);
        assert_eq!(absolute_exptime(REALTIME_MAXDELTA_S + 1, now), REALTIME_MAXDELTA_S + 1);
        assert_eq!(absolute_exptime(1_800_000_000, now), 1_800_000_000);
    }
}
