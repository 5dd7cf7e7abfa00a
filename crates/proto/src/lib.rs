//! slipstream-proto: memcached's wire protocols as pure functions over byte slices.
//!
//! What it is for: `parse(&[u8])` turns bytes into a typed request (or says more bytes are
//! needed, or that the input is invalid and how memcached answers that), and `compose` functions
//! append reply bytes to a `Vec<u8>`. Text (`text`), meta (`meta`), binary (`binary`) and the
//! 8-byte UDP frame header (`udp`). memcached's byte rules that all of them share — limits, the
//! item-size rule, number parsing, the tokenizer — live in one place, `rules`; the store uses
//! the same module.
//!
//! What it is not for: sockets, buffering policy, or executing requests against a store — that
//! is `slipstream-server`, which ties each protocol to the store in one file per protocol.

#![forbid(unsafe_code)]

pub mod binary;
pub mod meta;
pub mod rules;
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
