//! slipstream-proto: memcached's wire protocols as pure functions over byte slices.
//!
//! What it is for: `parse(&[u8])` turns bytes into a typed request (or says more bytes are
//! needed, or that the input is invalid and how memcached answers that), and `compose` functions
//! append reply bytes to a `Vec<u8>`. Text (`text`), meta (`meta`), binary (`binary`) and the
//! 8-byte UDP frame header (`udp`).
//!
//! What it is not for: sockets, buffering policy, or executing requests against a store — that
//! is `slipstream-server`, which ties each protocol to the store in one file per protocol.

#![forbid(unsafe_code)]

pub mod binary;
pub mod meta;
pub mod text;
pub mod udp;

/// Outcome of parsing one request from the front of a buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed<T, E> {
    /// A whole request; `consumed` bytes of the input belong to it.
    Complete { request: T, consumed: usize },
    /// Not enough bytes yet; call again with more.
    Incomplete,
    /// The bytes are not a valid request. `consumed` says how much input the error disposes of
    /// (memcached-compatible resynchronisation), `E` says how to answer.
    Invalid { error: E, consumed: usize },
}

/// Decimal digits of `v` in a stack buffer: (buffer, index of the first digit). Shared by the
/// text and meta composers; no allocation.
#[inline]
pub(crate) fn decimal_digits(mut v: u64) -> ([u8; 20], usize) {
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
