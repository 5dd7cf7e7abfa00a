//! The byte form of one exported item ([`ItemExport`]): what a replication snapshot and the
//! restart file (`-e`) carry, so both read and write items the same way.
//!
//! Layout (integers little-endian): key (`u8` length, then the bytes), value (`u32` length,
//! then the bytes), `flags: u32`, `cas: u64`, `exptime_unix_s: i64`, `bits: u8` (1 stale,
//! 2 base64 key). Not for: what surrounds the items (headers, counts, files, sockets).

use crate::ItemExport;
use slipstream_proto::rules::KEY_BYTES_MAX;

/// Bytes of an item with an empty key and value: a count of items beyond `len / this` is
/// corrupt data, not an allocation to make.
pub const ITEM_BYTES_MIN: usize = 1 + 4 + 4 + 8 + 8 + 1;

const STALE_BIT: u8 = 1;
const KEY_BINARY_BIT: u8 = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ItemDecodeError {
    /// The data ends inside an item.
    Truncated,
    /// A key longer than memcached's 250 bytes.
    KeyTooLong(usize),
}

impl ItemExport<'_> {
    /// Append this item's bytes to `out`. Keys and values longer than their length fields
    /// cannot be exported by a store (keys ≤ 250 bytes, values ≤ the item size limit).
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(self.key.len() as u8);
        out.extend_from_slice(self.key);
        out.extend_from_slice(&(self.value.len() as u32).to_le_bytes());
        out.extend_from_slice(self.value);
        out.extend_from_slice(&self.flags.to_le_bytes());
        out.extend_from_slice(&self.cas.to_le_bytes());
        out.extend_from_slice(&self.exptime_unix_s.to_le_bytes());
        out.push(if self.stale { STALE_BIT } else { 0 } | if self.key_binary { KEY_BINARY_BIT } else { 0 });
    }

    /// The item at the start of `data` and the bytes it took.
    pub fn decode(data: &[u8]) -> Result<(ItemExport<'_>, usize), ItemDecodeError> {
        let mut at = 0usize;
        let mut take = |n: usize| -> Result<&[u8], ItemDecodeError> {
            let end = at.checked_add(n).filter(|&e| e <= data.len()).ok_or(ItemDecodeError::Truncated)?;
            let s = &data[at..end];
            at = end;
            Ok(s)
        };
        let key_len = take(1)?[0] as usize;
        if key_len > KEY_BYTES_MAX {
            return Err(ItemDecodeError::KeyTooLong(key_len));
        }
        let key = take(key_len)?;
        let value_len = u32::from_le_bytes(array(take(4)?));
        let value = take(value_len as usize)?;
        let flags = u32::from_le_bytes(array(take(4)?));
        let cas = u64::from_le_bytes(array(take(8)?));
        let exptime_unix_s = i64::from_le_bytes(array(take(8)?));
        let bits = take(1)?[0];
        let item = ItemExport {
            key,
            value,
            flags,
            cas,
            exptime_unix_s,
            stale: bits & STALE_BIT != 0,
            key_binary: bits & KEY_BINARY_BIT != 0,
        };
        Ok((item, at))
    }
}

fn array<const N: usize>(b: &[u8]) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(b);
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item<'a>(key: &'a [u8], value: &'a [u8]) -> ItemExport<'a> {
        ItemExport { key, value, flags: 7, cas: 1 << 40, exptime_unix_s: -3, stale: true, key_binary: false }
    }

    #[test]
    fn an_item_decodes_to_itself_and_takes_its_own_bytes() {
        let mut out = Vec::new();
        item(b"k1", b"v").encode(&mut out);
        let first = out.len();
        item(b"", b"").encode(&mut out);
        assert_eq!(ITEM_BYTES_MIN, out.len() - first);
        let (a, n) = ItemExport::decode(&out).expect("first");
        assert_eq!(
            (a.key, a.value, a.flags, a.cas, a.exptime_unix_s, a.stale, a.key_binary),
            (&b"k1"[..], &b"v"[..], 7, 1 << 40, -3, true, false)
        );
        assert_eq!(n, first);
        let (b, m) = ItemExport::decode(&out[n..]).expect("second");
        assert_eq!((b.key, b.value, m), (&b""[..], &b""[..], ITEM_BYTES_MIN));
    }

    #[test]
    fn every_cut_is_truncated_and_a_long_key_is_refused() {
        let mut out = Vec::new();
        item(b"key", b"value").encode(&mut out);
        for cut in 0..out.len() {
            assert_eq!(ItemExport::decode(&out[..cut]).err(), Some(ItemDecodeError::Truncated), "cut {cut}");
        }
        let mut long = vec![251u8];
        long.extend_from_slice(&[b'k'; 251]);
        assert_eq!(ItemExport::decode(&long).err(), Some(ItemDecodeError::KeyTooLong(251)));
    }
}
