//! memcached's byte rules, in one place: the limits (key length, tokens per line, the request
//! line, the item-size rule with its CAS and flags bytes), number parsing (`safe_strto*`) and
//! the request-line tokenizer. Every protocol parser (`text`, `meta`, `binary`) and the store
//! (`slipstream-store`: the `-I` check, incr/decr on a stored value) use these and define none
//! of their own, so the protocols cannot disagree with each other or drift from memcached.
//!
//! - [`limits`]: the numbers memcached 1.6.18 enforces and the item-size rule (`item_size_ok`).
//! - [`numbers`]: `safe_strtoull` / `safe_strtoul` / `safe_strtol` over C `strto*`, and decimal
//!   formatting.
//! - [`tokens`]: the request line (`\n`, `\r`, NUL) and memcached's space-only tokenizer.
//!
//! What it is not for: what a command means or how it is answered (the protocol modules), or
//! I/O. Everything here is on the hot path: no allocation, no I/O, checked against a real
//! memcached 1.6.18 (tests/test_differential.py).

pub mod limits;
pub mod numbers;
pub mod tokens;

pub use limits::{
    item_bytes, ItemLimits, DATA_BYTES_MAX, ITEM_BYTES_MAX_DEFAULT, ITEM_CAS_BYTES, ITEM_FLAGS_BYTES,
    ITEM_HEADER_BYTES, KEY_BYTES_MAX, LINE_BYTES_MAX, META_OPAQUE_BYTES_MAX, META_TOKENS_MAX, TOKENS_MAX,
};
pub use numbers::{decimal_digits, safe_strtol, safe_strtoll, safe_strtoul, safe_strtoull};
pub use tokens::{line_end, request_line, Tokens, Words};
