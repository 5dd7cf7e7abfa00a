//! Rust mirror of `bpf/slipstream_kv.h`: map names, limits and the `#[repr(C)]` layouts of the
//! map keys and values, with compile-time size and offset asserts so that a change on either side
//! that is not mirrored fails the build.
//!
//! Not for: logic. Composing item values lives in `item.rs`.

use std::mem::{offset_of, size_of};
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64};

/// Hash map of cached items (`BPF_F_NO_PREALLOC`).
pub const MAP_ITEMS: &str = "ss_items";
/// One-entry array holding [`Config`].
pub const MAP_CONFIG: &str = "ss_config";
/// Per-CPU array of `u64` counters.
pub const MAP_COUNTERS: &str = "ss_counters";
/// Array indexed by UDP port: tenant slot + 1 (0 = not ours).
pub const MAP_PORTS: &str = "ss_ports";
/// Mmapable array of [`Tenant`], one per slot.
pub const MAP_TENANTS: &str = "ss_tenants";
/// Per-CPU array of [`TenantStats`], one per slot.
pub const MAP_TENANT_STATS: &str = "ss_tstats";
/// The XDP program's name in the object.
pub const PROG_XDP: &str = "slipstream_xdp";
/// The do-nothing XDP program's name (tests attach it to the client veth).
pub const PROG_XDP_PASS: &str = "slipstream_xdp_pass";

/// memcached's KEY_MAX_LENGTH.
pub const KEY_BYTES_MAX: usize = 250;
/// `SS_HASH_SEED`, `SS_HASH_MUL`, `SS_KEY_WORDS_MAX`: see [`key_hash`].
pub const HASH_SEED: u64 = 0x736c_6970_7374_7265;
pub const HASH_MUL: u64 = 0x9e37_79b9_7f4a_7c15;
pub const KEY_WORDS_MAX: usize = 32;
/// `SS_HASH_TEST_1` / `SS_HASH_TEST_2`: [`key_hash`] of "key:00000001" and "a".
pub const HASH_TEST_1: u64 = 0x5fc6_5e17_9e0c_cb65;
pub const HASH_TEST_2: u64 = 0xdcef_489f_533e_2bfa;
/// memcached UDP frame header bytes.
pub const FRAME_HEADER_BYTES: usize = 8;
/// Most reply payload bytes (after the frame header) one datagram carries.
pub const REPLY_PAYLOAD_BYTES_MAX: usize = 1392;
/// Bytes of pre-composed reply text per item.
pub const PIECE_BYTES_MAX: usize = 1424;
/// Most keys in one request the kernel answers.
pub const KEYS_MAX: usize = 8;
/// Longest request payload the kernel parses.
pub const REQUEST_BYTES_MAX: usize = 2048;
/// Default number of cached items.
pub const ENTRIES_DEFAULT: u32 = 16384;
/// Most tenant slots (0..TENANTS_MAX).
pub const TENANTS_MAX: u32 = 64;
/// Entries of the ports map (one per port number).
pub const PORTS: u32 = 65536;

/// Counter slots.
pub const COUNTER_HITS: u32 = 0;
pub const COUNTER_MISSES: u32 = 1;
pub const COUNTER_THROTTLED: u32 = 2;
pub const COUNTER_COUNT: u32 = 4;

/// `struct ss_key`: a 64-bit hash of the key bytes and their length, and the tenant's slot. Not
/// unique: the value holds the full key and the program compares it (see the C header).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Key {
    pub hash: u64,
    pub len: u32,
    pub tenant: u32,
}

/// `ss_key_hash`, bit for bit as the XDP program computes it: seed mixed with the length, then
/// per little-endian 8-byte word (the last zero-padded) `h = (h ^ w) * MUL; h ^= h >> 32`.
pub fn key_hash(key: &[u8]) -> u64 {
    let mut h = HASH_SEED ^ (key.len() as u64).wrapping_mul(HASH_MUL);
    for chunk in key.chunks(8) {
        let mut w = [0u8; 8];
        w[..chunk.len()].copy_from_slice(chunk);
        h = (h ^ u64::from_le_bytes(w)).wrapping_mul(HASH_MUL);
        h ^= h >> 32;
    }
    h
}

/// A segment's 16-bit ones'-complement sum as `struct ss_item` stores it: the bytes read as
/// native-endian 16-bit words from the first, an odd last byte followed by a zero, folded.
/// Native (memory) order because the program adds it to sums of words it loads from packets.
pub fn ones_sum(bytes: &[u8]) -> u16 {
    let mut sum: u64 = 0;
    let mut words = bytes.chunks_exact(2);
    for w in &mut words {
        sum += u64::from(u16::from_ne_bytes([w[0], w[1]]));
    }
    if let [last] = words.remainder() {
        sum += u64::from(u16::from_ne_bytes([*last, 0]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// `struct ss_item`: one item's pre-composed reply text in five segments D E A B C (see the C
/// header for what each holds and why).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Item {
    pub expiry_ns: u64,
    pub epoch: u64,
    pub d_len: u16,
    pub e_len: u16,
    pub a_len: u16,
    pub b_len: u16,
    pub c_len: u16,
    /// Each segment's ones'-complement sum in memory order (see `ones_sum`).
    pub csum_d: u16,
    pub csum_e: u16,
    pub csum_a: u16,
    pub csum_b: u16,
    pub csum_c: u16,
    pub pad0: u16,
    pub pad1: u16,
    pub piece: [u8; PIECE_BYTES_MAX],
}

/// `struct ss_config`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Config {
    /// 0 = every packet passes.
    pub enabled: u16,
    pub pad0: u16,
    pub pad1: u32,
    pub epoch: u64,
}

/// `struct ss_tenant`, as user space sees it through the mmapped map: every field is shared
/// with the program running on other CPUs, hence atomics (same size and alignment as the
/// integers the C side declares).
#[repr(C)]
#[derive(Debug, Default)]
pub struct Tenant {
    pub active: AtomicU32,
    pub shaped: AtomicU32,
    pub epoch: AtomicU64,
    pub allow_in_bytes: AtomicI64,
    pub allow_out_bytes: AtomicI64,
    pub spent_requests: AtomicU64,
    pub spent_in_bytes: AtomicU64,
    pub spent_out_bytes: AtomicU64,
    pub pad0: AtomicU64,
}

/// `struct ss_tenant_stats` (one CPU's copy).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TenantStats {
    pub hits: u64,
    pub misses: u64,
    pub throttled: u64,
    pub pad0: u64,
}

const _: () = assert!(size_of::<Key>() == 16);
const _: () = assert!(offset_of!(Key, hash) == 0);
const _: () = assert!(offset_of!(Key, len) == 8);
const _: () = assert!(KEY_WORDS_MAX * 8 >= KEY_BYTES_MAX);
const _: () = assert!(size_of::<Item>() == 1464);
const _: () = assert!(offset_of!(Item, expiry_ns) == 0);
const _: () = assert!(offset_of!(Item, epoch) == 8);
const _: () = assert!(offset_of!(Item, d_len) == 16);
const _: () = assert!(offset_of!(Item, e_len) == 18);
const _: () = assert!(offset_of!(Item, a_len) == 20);
const _: () = assert!(offset_of!(Item, b_len) == 22);
const _: () = assert!(offset_of!(Item, c_len) == 24);
const _: () = assert!(offset_of!(Item, csum_d) == 26);
const _: () = assert!(offset_of!(Item, csum_e) == 28);
const _: () = assert!(offset_of!(Item, csum_a) == 30);
const _: () = assert!(offset_of!(Item, csum_b) == 32);
const _: () = assert!(offset_of!(Item, csum_c) == 34);
const _: () = assert!(offset_of!(Item, piece) == 40);
const _: () = assert!(offset_of!(Key, tenant) == 12);
const _: () = assert!(size_of::<Config>() == 16);
const _: () = assert!(offset_of!(Config, enabled) == 0);
const _: () = assert!(offset_of!(Config, epoch) == 8);
const _: () = assert!(size_of::<Tenant>() == 64);
const _: () = assert!(std::mem::align_of::<Tenant>() == 8);
const _: () = assert!(offset_of!(Tenant, active) == 0);
const _: () = assert!(offset_of!(Tenant, shaped) == 4);
const _: () = assert!(offset_of!(Tenant, epoch) == 8);
const _: () = assert!(offset_of!(Tenant, allow_in_bytes) == 16);
const _: () = assert!(offset_of!(Tenant, allow_out_bytes) == 24);
const _: () = assert!(offset_of!(Tenant, spent_requests) == 32);
const _: () = assert!(offset_of!(Tenant, spent_in_bytes) == 40);
const _: () = assert!(offset_of!(Tenant, spent_out_bytes) == 48);
const _: () = assert!(size_of::<TenantStats>() == 32);
const _: () = assert!(offset_of!(TenantStats, hits) == 0);
const _: () = assert!(offset_of!(TenantStats, misses) == 8);
const _: () = assert!(offset_of!(TenantStats, throttled) == 16);

impl Key {
    /// The map key for `key`, or `None` if it is empty or longer than memcached allows.
    pub fn new(key: &[u8]) -> Option<Key> {
        Key::for_tenant(key, 0)
    }

    /// The map key for `key` of the tenant in `slot`.
    pub fn for_tenant(key: &[u8], slot: u32) -> Option<Key> {
        if key.is_empty() || key.len() > KEY_BYTES_MAX {
            return None;
        }
        Some(Key { hash: key_hash(key), len: key.len() as u32, tenant: slot })
    }
}

/// Byte views for the bpf(2) syscalls: all three types are plain `repr(C)` integers and byte
/// arrays with explicit padding fields, so every byte is initialised and any byte pattern valid.
pub(crate) trait Plain: Copy {
    fn as_bytes(&self) -> &[u8] {
        // SAFETY: implementors are repr(C) structs of integers/byte arrays with no implicit
        // padding (checked by the size asserts above), so all size_of::<Self>() bytes are
        // initialised; the slice borrows self for its lifetime.
        unsafe { std::slice::from_raw_parts((self as *const Self).cast::<u8>(), size_of::<Self>()) }
    }
}
impl Plain for Key {}
impl Plain for Item {}
impl Plain for Config {}
impl Plain for u32 {}
impl Plain for u64 {}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shared test vectors in the C header: a change to either hash must change both.
    #[test]
    fn key_hash_matches_the_header_vectors() {
        assert_eq!(key_hash(b"key:00000001"), HASH_TEST_1, "{:#x}", key_hash(b"key:00000001"));
        assert_eq!(key_hash(b"a"), HASH_TEST_2, "{:#x}", key_hash(b"a"));
        let header = include_str!("../../../bpf/slipstream_kv.h");
        for (name, v) in [("SS_HASH_TEST_1", HASH_TEST_1), ("SS_HASH_TEST_2", HASH_TEST_2), ("SS_HASH_SEED", HASH_SEED), ("SS_HASH_MUL", HASH_MUL)] {
            let line = format!("#define {name} {v:#018x}ULL");
            assert!(header.contains(&line), "header lacks `{line}`");
        }
        for (name, v) in [("SS_TENANTS_MAX", u64::from(TENANTS_MAX)), ("SS_PORTS", u64::from(PORTS)), ("SS_COUNTER_THROTTLED", u64::from(COUNTER_THROTTLED))] {
            let line = format!("#define {name} {v}");
            assert!(header.contains(&line), "header lacks `{line}`");
        }
    }

    #[test]
    fn key_hash_depends_on_every_byte_and_the_length() {
        let base = key_hash(b"0123456789abcdefXYZ");
        for i in 0..19 {
            let mut k = b"0123456789abcdefXYZ".to_vec();
            k[i] ^= 1;
            assert_ne!(key_hash(&k), base, "byte {i}");
        }
        // Zero padding alone must not collide: the length is mixed in.
        assert_ne!(key_hash(b"ab"), key_hash(b"ab\0"));
    }
}
