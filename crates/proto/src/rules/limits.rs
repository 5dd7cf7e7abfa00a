//! The limits memcached 1.6.18 enforces on requests and items, and its item-size rule.
//!
//! Every protocol refuses an item with the same arithmetic (memcached's `item_size_ok`): the
//! text `set` family, `ms`, the binary storage commands and the store itself call
//! [`ItemLimits::too_large`], so `-I` and `-C` move all of them together.

/// Longest key memcached accepts (`KEY_MAX_LENGTH`), on every protocol; for meta `b` keys this
/// is the encoded length on the wire.
pub const KEY_BYTES_MAX: usize = 250;
/// memcached splits at most this many tokens of a request line (its `MAX_TOKENS` 24 counts a
/// terminal token too); the rest of the line stays unsplit.
pub const TOKENS_MAX: usize = 23;
/// A request line with no `\n` within this many bytes closes the connection, unless it is a
/// multiget (memcached's 2048 in `try_read_command_ascii`).
pub const LINE_BYTES_MAX: usize = 2048;
/// memcached refuses a meta line with more than this many tokens, counting the command, the
/// key, `ms`'s data length and the tokenizer's terminal token (`MFLAG_MAX_OPT_LENGTH`).
pub const META_TOKENS_MAX: usize = 20;
/// Longest meta `O` (opaque) token including the `O` (`MFLAG_MAX_OPAQUE_LENGTH`).
pub const META_OPAQUE_BYTES_MAX: usize = 32;
/// Largest data block a storage line may announce (`INT_MAX - 2`; more is a bad command line).
pub const DATA_BYTES_MAX: usize = i32::MAX as usize - 2;

/// memcached's `sizeof(item)` on 64-bit builds, without the CAS.
pub const ITEM_HEADER_BYTES: usize = 48;
/// Bytes every item carries for its CAS unless `-C` turns CAS off.
pub const ITEM_CAS_BYTES: usize = 8;
/// Bytes an item carries for its client flags, only when they are non-zero.
pub const ITEM_FLAGS_BYTES: usize = 4;
/// memcached's default `-I` (1 MiB).
pub const ITEM_BYTES_MAX_DEFAULT: usize = 1024 * 1024;

/// The inputs of the item-size rule: `-I` and whether `-C` is off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ItemLimits {
    /// memcached `-I`: the largest item, header, key, flags, value, `\r\n` and CAS included.
    pub item_bytes_max: usize,
    /// CAS on (memcached's default; `-C` turns it off and items are 8 bytes smaller).
    pub cas_enabled: bool,
}

impl Default for ItemLimits {
    fn default() -> Self {
        ItemLimits { item_bytes_max: ITEM_BYTES_MAX_DEFAULT, cas_enabled: true }
    }
}

/// The size memcached gives an item of this shape (`item_make_header` + CAS, its `ITEM_ntotal`):
/// header, key and its NUL, flags when non-zero, the value and its `\r\n`, the CAS when
/// enabled. The `-I` check and `me`'s `size=` both use it.
#[inline]
pub fn item_bytes(key_bytes: usize, flags: u32, value_bytes: usize, cas_enabled: bool) -> usize {
    ITEM_HEADER_BYTES
        .saturating_add(key_bytes)
        .saturating_add(1)
        .saturating_add(if flags == 0 { 0 } else { ITEM_FLAGS_BYTES })
        .saturating_add(value_bytes)
        .saturating_add(2)
        .saturating_add(if cas_enabled { ITEM_CAS_BYTES } else { 0 })
}

impl ItemLimits {
    /// memcached's `!item_size_ok`: the item can never be stored under `-I`, whatever memory
    /// is free (`SERVER_ERROR object too large for cache`, binary `E2BIG`). `key_bytes` is the
    /// key as stored (a meta `b` key decoded).
    #[inline]
    pub fn too_large(&self, key_bytes: usize, flags: u32, value_bytes: usize) -> bool {
        item_bytes(key_bytes, flags, value_bytes, self.cas_enabled) > self.item_bytes_max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn item_rule_matches_memcached_edges() {
        // Checked against memcached 1.6.18 with key "k" (tests/test_differential.py
        // item_size_edges*): 1048516 value bytes fit with CAS, 1048524 without.
        let on = ItemLimits::default();
        let off = ItemLimits { cas_enabled: false, ..on };
        assert!(!on.too_large(1, 0, 1_048_516));
        assert!(on.too_large(1, 0, 1_048_517));
        assert!(!off.too_large(1, 0, 1_048_524));
        assert!(off.too_large(1, 0, 1_048_525));
        // Non-zero flags cost 4 bytes.
        assert!(on.too_large(1, 7, 1_048_513));
        assert!(!on.too_large(1, 7, 1_048_512));
        // No overflow on absurd sizes.
        assert!(on.too_large(usize::MAX, 1, usize::MAX));
    }
}
