//! The one request-dispatch entry: every way a request reaches an executor — the TCP loop, the
//! UDP loop and the executor harness the tests and the fuzzer drive — goes through
//! `execute_one`, so what the fuzzer exercises is the product path, not a copy of it.
//!
//! What it is for: choosing the protocol from a connection's first byte (0x80 = binary, as
//! memcached does), running one request through that protocol's executor, dropping the
//! by-reference values of replies the executor discarded, checking the executor's claim of what
//! it consumed, and counting the request.
//!
//! What it is not for: batching, budgets, shaping or I/O — each loop decides how many requests a
//! round may run and what to do with each `Step`.

use crate::auth::Auth;
use crate::exec::{Ctx, Protocol, Step};
use crate::stats::ThreadStats;
use crate::{memcache_binary, memcache_text};

/// Run the request at the front of `input` (not empty) and append its replies to `out`.
///
/// `Step::Consumed(n)` always has `0 < n <= input.len()`: an executor that claims otherwise is
/// a bug, reported as `Step::Close` (a debug build, as the fuzzer runs, panics instead) so the
/// connection closes rather than indexing out of bounds.
#[inline]
pub fn execute_one(ctx: &mut Ctx<'_>, input: &[u8], out: &mut Vec<u8>) -> Step {
    if ctx.conn.protocol == Protocol::Undecided {
        let Some(&first) = input.first() else { return Step::Incomplete };
        ctx.conn.protocol = if first == 0x80 { Protocol::Binary } else { Protocol::Text };
    }
    let step = match ctx.conn.protocol {
        Protocol::Binary => memcache_binary::execute(ctx, input, out),
        _ => memcache_text::execute(ctx, input, out),
    };
    settle(ctx, input, out, step)
}

/// `execute_one` for a TCP or unix connection of a server with `-Y`/`-S`: the auth executor
/// fixes the protocol and answers until the connection has authenticated (see `auth`). UDP
/// does not come here: memcached 1.6.18 does not authenticate it either.
#[inline]
pub fn execute_authenticating(auth: &Auth, ctx: &mut Ctx<'_>, input: &[u8], out: &mut Vec<u8>) -> Step {
    if input.is_empty() {
        return Step::Incomplete;
    }
    let step = crate::auth::execute(auth, ctx, input, out);
    settle(ctx, input, out, step)
}

/// After an executor: drop discarded replies' by-reference values, check its claim, count.
#[inline]
fn settle(ctx: &mut Ctx<'_>, input: &[u8], out: &[u8], step: Step) -> Step {
    // Replies an executor discarded take the values they sent by reference with them.
    ctx.conn.shared.discard_after(out.len());
    match step {
        Step::Consumed(n) => {
            debug_assert!(n > 0 && n <= input.len(), "executor consumed {n} of {} bytes", input.len());
            if n == 0 || n > input.len() {
                return Step::Close;
            }
            ThreadStats::incr(&ctx.stats.requests);
            step
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::Harness;

    #[test]
    fn first_byte_chooses_the_protocol_for_the_connection() {
        let mut h = Harness::small();
        assert_eq!(h.feed(b"version\r\n"), format!("VERSION {}\r\n", crate::VERSION_STRING).into_bytes());
        assert_eq!(h.conn.protocol, Protocol::Text);
        let mut b = Harness::small();
        // Binary NOOP, opaque 7.
        let mut noop = vec![0x80, 0x0a, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7];
        noop.extend_from_slice(&[0; 8]);
        let out = b.feed(&noop);
        assert_eq!(b.conn.protocol, Protocol::Binary);
        assert_eq!(out.len(), 24);
        assert_eq!(out[0], 0x81);
    }

    #[test]
    fn every_executed_request_is_counted() {
        let mut h = Harness::small();
        h.feed(b"set a 0 0 1\r\nx\r\nget a\r\nget");
        assert_eq!(h.stats.requests.load(std::sync::atomic::Ordering::Relaxed), 2);
    }
}
