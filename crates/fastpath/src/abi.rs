//! Rust mirror of `bpf/slipstream_kv.h`: map names, limits and the `#[repr(C)]` layouts of the
//! map keys and values, with compile-time size and offset asserts so that a change on either side
//! that is not mirrored fails the build.
//!
//! Not for: logic. Composing item values lives in `item.rs`.

use std::mem::{offset_of, size_of};

/// Hash map of cached items (`BPF_F_NO_PREALLOC`).
pub const MAP_ITEMS: &str = "ss_items";
/// One-entry array holding [`Config`].
pub const MAP_CONFIG: &str = "ss_config";
/// Per-CPU array of `u64` counters.
pub const MAP_COUNTERS: &str = "ss_counters";
/// The XDP program's name in the object.
pub const PROG_XDP: &str = "slipstream_xdp";
/// The do-nothing XDP program's name (tests attach it to the client veth).
pub const PROG_XDP_PASS: &str = "slipstream_xdp_pass";

/// memcached's KEY_MAX_LENGTH.
pub const KEY_BYTES_MAX: usize = 250;
/// Key storage bytes in [`Key`].
pub const KEY_STORE_BYTES: usize = 256;
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

/// Counter slots.
pub const COUNTER_HITS: u32 = 0;
pub const COUNTER_MISSES: u32 = 1;
pub const COUNTER_COUNT: u32 = 4;

/// `struct ss_key`: key bytes zero-padded so equal keys hash equal.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Key {
    pub len: u32,
    pub bytes: [u8; KEY_STORE_BYTES],
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
    pub pad0: u16,
    pub pad1: u32,
    pub piece: [u8; PIECE_BYTES_MAX],
}

/// `struct ss_config`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Config {
    pub udp_port: u16,
    pub pad0: u16,
    pub pad1: u32,
    pub epoch: u64,
}

const _: () = assert!(size_of::<Key>() == 260);
const _: () = assert!(offset_of!(Key, bytes) == 4);
const _: () = assert!(KEY_STORE_BYTES >= KEY_BYTES_MAX);
const _: () = assert!(size_of::<Item>() == 1456);
const _: () = assert!(offset_of!(Item, expiry_ns) == 0);
const _: () = assert!(offset_of!(Item, epoch) == 8);
const _: () = assert!(offset_of!(Item, d_len) == 16);
const _: () = assert!(offset_of!(Item, e_len) == 18);
const _: () = assert!(offset_of!(Item, a_len) == 20);
const _: () = assert!(offset_of!(Item, b_len) == 22);
const _: () = assert!(offset_of!(Item, c_len) == 24);
const _: () = assert!(offset_of!(Item, piece) == 32);
const _: () = assert!(size_of::<Config>() == 16);
const _: () = assert!(offset_of!(Config, udp_port) == 0);
const _: () = assert!(offset_of!(Config, epoch) == 8);

impl Key {
    /// The map key for `key`, or `None` if it is empty or longer than memcached allows.
    pub fn new(key: &[u8]) -> Option<Key> {
        if key.is_empty() || key.len() > KEY_BYTES_MAX {
            return None;
        }
        let mut k = Key { len: key.len() as u32, bytes: [0; KEY_STORE_BYTES] };
        k.bytes[..key.len()].copy_from_slice(key);
        Some(k)
    }

    /// The key bytes.
    pub fn as_slice(&self) -> &[u8] {
        let n = (self.len as usize).min(KEY_STORE_BYTES);
        &self.bytes[..n]
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
