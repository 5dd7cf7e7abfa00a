//! Ties the meta protocol (`slipstream_proto::meta`: mg, ms, md, ma, mn, me) to the store, with
//! memcached 1.6.18's reply rules: which replies `q` hides (mg: EN; ms: HD; md: HD; ma: HD
//! unless the item was just created), which counters each outcome bumps, and the swallowing of
//! a refused `ms` data block. `memcache_text::execute` hands a request here when its command
//! word is a meta command.
//!
//! Not for: byte-level parsing or reply formatting (that is `slipstream_proto::meta`), or item
//! semantics (that is `slipstream_store`).

use crate::exec::{Ctx, Step};
use crate::stats::ThreadStats;
use slipstream_proto::meta::{self, Code, MetaCommand, MetaRequest};
use slipstream_proto::{rules, Parsed};
use slipstream_store::{ArithOpts, ArithResult, DeleteOpts, DeleteResult, GetOpts, SetMode, StoreOpts, StoreResult};

const TOO_LARGE: &[u8] = b"SERVER_ERROR object too large for cache";
const NO_MEMORY_STORE: &[u8] = b"SERVER_ERROR out of memory storing object";
const NO_MEMORY_ARITH: &[u8] = b"SERVER_ERROR out of memory";
const NON_NUMERIC: &[u8] = b"CLIENT_ERROR cannot increment or decrement non-numeric value";
const OPAQUE_TOO_LONG: &[u8] = b"CLIENT_ERROR opaque token too long";
const GET_REPLY_OOM: &[u8] = b"SERVER_ERROR out of memory writing get response";
/// Bound on an `mg` hit's reply beyond key and value: `VA <bytes>`, every flag with a 20-digit
/// number, an opaque of up to 32 bytes, the line ends.
const META_HEADER_BYTES_MAX: usize = 512;

/// Handle one meta request from the front of `input`, appending its reply to `out`.
pub fn execute(ctx: &mut Ctx<'_>, input: &[u8], out: &mut Vec<u8>) -> Step {
    let limits = ctx.store.config().item_limits();
    match meta::parse_with(input, &limits) {
        Parsed::Incomplete => {
            // memcached closes a connection whose pending line has no newline after 2048
            // bytes (only multi-key gets are exempt, and those are not meta commands).
            if rules::line_end(input).is_none() && input.len() > ctx.settings.line_bytes_max {
                Step::Close
            } else {
                Step::Incomplete
            }
        }
        Parsed::Invalid { error, consumed } => {
            error.compose(out);
            ctx.conn.swallow_bytes = error.swallow_bytes;
            Step::Consumed(consumed)
        }
        Parsed::Complete { request, consumed } => {
            match request.command {
                MetaCommand::Get => meta_get(ctx, &request, out),
                MetaCommand::Set => meta_set(ctx, &request, out),
                MetaCommand::Delete => meta_delete(ctx, &request, out),
                MetaCommand::Arith => meta_arith(ctx, &request, out),
                MetaCommand::Noop => meta::compose_noop(out),
                MetaCommand::Debug => meta_debug(ctx, &request, out),
            }
            if request.too_large {
                ctx.conn.swallow_bytes = request.swallow_bytes;
            }
            Step::Consumed(consumed)
        }
    }
}

/// How memcached 1.6.18 applies `T` and `N` in mg and ma: after the fetch (mg) or the
/// arithmetic (ma) it walks the flags in request order, up to a too-long opaque token where it
/// stops with the error. `T` sets the exptime; `N` sets it on an item this request created
/// (created with exptime 0); `t` prints it as it is at that point. So for a created item the
/// later of T and N wins, and a `t` before both prints -1.
struct TtlPlan {
    /// The T reached: the touch for an item that was there.
    touch: Option<i64>,
    /// N anywhere (memcached's pre-parse decides to create): on a miss create the item with
    /// this final exptime (the later of the T and N reached; 0 if neither).
    vivify: Option<i64>,
    /// For a created item, the raw exptime `t` prints (None: -1).
    t_created: Option<i64>,
    /// `t` or `R` come before the T reached, and none after it: read before touching.
    touch_after_read: bool,
}

impl TtlPlan {
    fn new(req: &MetaRequest<'_>) -> TtlPlan {
        let f = &req.flags;
        let end = f.walk_end();
        let reached = |letter| flag_pos(req, letter).filter(|&p| p < end);
        let touch_at = reached(b'T').zip(f.ttl.map(i64::from));
        let vivify_at = reached(b'N').zip(f.vivify.map(i64::from));
        // For a created item: the exptime as of position `p` (the last T or N before it).
        let created_at = |p: usize| {
            let before = |x: Option<(usize, i64)>| x.filter(|&(at, _)| at < p);
            match (before(touch_at), before(vivify_at)) {
                (Some(t), Some(n)) => Some(if t.0 > n.0 { t.1 } else { n.1 }),
                (t, n) => t.or(n).map(|(_, v)| v),
            }
        };
        let touch_after_read = touch_at.is_some_and(|(tp, _)| {
            let (t, r) = (reached(b't'), reached(b'R'));
            (t.is_some() || r.is_some()) && t.is_none_or(|p| p < tp) && r.is_none_or(|p| p < tp)
        });
        TtlPlan {
            touch: touch_at.map(|(_, v)| v),
            vivify: f.vivify.map(|_| created_at(end).unwrap_or(0)),
            t_created: reached(b't').and_then(created_at),
            touch_after_read,
        }
    }
}

fn meta_get(ctx: &mut Ctx<'_>, req: &MetaRequest<'_>, out: &mut Vec<u8>) {
    let f = &req.flags;
    let plan = TtlPlan::new(req);
    if f.opaque_too_long {
        meta_get_refused(ctx, req, &plan, out);
        return;
    }
    let opts = GetOpts {
        touch_exptime: if plan.touch_after_read { None } else { plan.touch },
        vivify_exptime: plan.vivify,
        vivify_exptime_final: true,
        recache_below_s: f.recache.map(i64::from),
        bump: !f.no_bump,
        win_tokens: true,
        // The kernel fast path can answer `mg <key> v [f]` from a copy of this item.
        kernel_fill: f.has(b'v') && f.ttl.is_none() && f.vivify.is_none() && f.recache.is_none(),
        ..GetOpts::default()
    };
    ctx.log_lookup(req.key.bytes());
    let store = ctx.store;
    let mut created = false;
    let found = store.get(req.key.bytes(), opts, |outcome| match outcome.item {
        Some(item) => {
            // Charge the connection-buffer budget before copying the value out (the flags a
            // reply can carry take well under META_HEADER_BYTES_MAX).
            // A large value is sent by reference instead: not copied, not charged.
            let share = f.has(b'v') && ctx.shares_value(item.value.len());
            let copied = if f.has(b'v') && !share { item.value.len() } else { 0 };
            if !ctx.reserve_reply(out, META_HEADER_BYTES_MAX + item.key.len() + copied) {
                return None;
            }
            // The store does not say "created"; a fresh vivified item is the only kind that
            // wins while empty, unfetched and not stale.
            created =
                f.vivify.is_some() && outcome.won && !outcome.stale && !item.fetched_before && item.value.is_empty();
            let hit = meta::GetHit {
                value: item.value,
                client_flags: item.flags,
                cas: item.cas,
                ttl_remaining_s: match created {
                    true => plan.t_created.map_or(-1, |raw| store.ttl_remaining_for(raw)),
                    false => item.ttl_remaining_s,
                },
                last_access_ago_s: item.last_access_ago_s,
                fetched_before: item.fetched_before,
                won: outcome.won,
                stale: outcome.stale,
                win_token_sent: outcome.win_token_sent,
                key_binary: item.key_binary,
            };
            meta::compose_get_hit_line(out, req, &hit);
            if f.has(b'v') {
                ctx.put_value(out, share, item.data, item.value);
                out.extend_from_slice(b"\r\n");
            }
            Some(true)
        }
        None => Some(false),
    });
    let Some(hit) = found else {
        // Our allocation failure, answered with memcached's line for it (memcached itself
        // never copies the value, so it has no such case for mg).
        meta::compose_error_line(out, GET_REPLY_OOM);
        return;
    };
    // A created item already has its final exptime (plan.vivify).
    if hit && plan.touch_after_read && !created {
        let touch = GetOpts { touch_exptime: plan.touch, bump: !f.no_bump, ..GetOpts::default() };
        ctx.store.get(req.key.bytes(), touch, |_| ());
    }
    let s = ctx.stats;
    if hit {
        // memcached counts a hit that set a TTL as a touch, anything else as a get.
        if f.ttl.is_some() {
            ThreadStats::incr(&s.cmd_touch);
            ThreadStats::incr(&s.touch_hits);
        } else {
            ThreadStats::incr(&s.cmd_get);
            ThreadStats::incr(&s.get_hits);
        }
    } else {
        ThreadStats::incr(&s.cmd_get);
        ThreadStats::incr(&s.get_misses);
        if !f.quiet {
            meta::compose_get_miss(out, req);
        }
    }
}

/// mg with a too-long opaque token: memcached notices while it walks the flags, after the
/// fetch. By then a missing item is created if N was given, the T and N before the token have
/// set its exptime, and an item fetched without the "locked" flags (h, l, N, R, T) has been
/// bumped (a locked fetch's delayed bump is skipped); no win token is handed out and nothing is
/// counted.
fn meta_get_refused(ctx: &mut Ctx<'_>, req: &MetaRequest<'_>, plan: &TtlPlan, out: &mut Vec<u8>) {
    let f = &req.flags;
    let locked = [b'h', b'l', b'N', b'R', b'T'].iter().any(|&c| f.has(c));
    let opts = GetOpts {
        touch_exptime: plan.touch,
        vivify_exptime: plan.vivify,
        vivify_exptime_final: true,
        vivify_without_token: true,
        bump: !locked && !f.no_bump,
        ..GetOpts::default()
    };
    if opts.bump || opts.touch_exptime.is_some() || opts.vivify_exptime.is_some() {
        ctx.store.get(req.key.bytes(), opts, |_| ());
    }
    meta::compose_error_line(out, OPAQUE_TOO_LONG);
}

fn flag_pos(req: &MetaRequest<'_>, letter: u8) -> Option<usize> {
    req.flags.tokens().iter().position(|f| f.letter == letter)
}

fn meta_set(ctx: &mut Ctx<'_>, req: &MetaRequest<'_>, out: &mut Vec<u8>) {
    let s = ctx.stats;
    let key = req.key.bytes();
    if req.too_large {
        // Refused before the data is read; the old item goes too, so no reader sees data
        // older than a failed write.
        ThreadStats::incr(&s.store_too_large);
        ctx.store.unlink(key);
        meta::compose_error_line(out, TOO_LARGE);
        return;
    }
    let f = &req.flags;
    let mut mode = match req.set_mode() {
        meta::SetMode::Set => SetMode::Set,
        meta::SetMode::Add => SetMode::Add,
        meta::SetMode::Append => SetMode::Append,
        meta::SetMode::Prepend => SetMode::Prepend,
        meta::SetMode::Replace => SetMode::Replace,
    };
    // memcached turns set/replace with a C token into its cas command; add ignores the
    // token; append/prepend compare it unless it is 0.
    let cas = match (mode, f.cas) {
        (SetMode::Set | SetMode::Replace, Some(c)) => {
            mode = SetMode::Cas;
            Some(c)
        }
        (SetMode::Append | SetMode::Prepend, Some(c)) if c != 0 => Some(c),
        _ => None,
    };
    let opts = StoreOpts {
        cas,
        explicit_cas: None,
        // `I` only means something to the cas path.
        invalidate: f.invalidate && mode == SetMode::Cas,
        // memcached 1.6.18 ignores `N` on ms (no append autovivify yet).
        vivify_exptime: None,
        key_binary: req.key.is_binary(),
    };
    let exptime = i64::from(f.ttl.unwrap_or(0));
    ctx.log_lookup(key);
    let result = ctx.store.store(mode, key, req.data, f.client_flags, exptime, opts);
    ctx.log_store(key, set_mode_name(mode), result, exptime, req.data.len());
    ThreadStats::incr(&s.cmd_set);
    let is_cas = mode == SetMode::Cas;
    let (code, new_cas) = match result {
        StoreResult::Stored(c) => {
            if is_cas {
                ThreadStats::incr(&s.cas_hits);
            }
            (Code::Stored, c)
        }
        StoreResult::NotStored => (Code::NotStored, 0),
        StoreResult::Exists => {
            if is_cas {
                ThreadStats::incr(&s.cas_badval);
            }
            (Code::Exists, 0)
        }
        StoreResult::NotFound => {
            if is_cas {
                ThreadStats::incr(&s.cas_misses);
            }
            (Code::NotFound, 0)
        }
        StoreResult::TooLarge => {
            ThreadStats::incr(&s.store_too_large);
            ctx.store.unlink(key);
            meta::compose_error_line(out, TOO_LARGE);
            return;
        }
        StoreResult::NoMemory => {
            ThreadStats::incr(&s.store_no_memory);
            ctx.store.unlink(key);
            meta::compose_error_line(out, NO_MEMORY_STORE);
            return;
        }
    };
    if code == Code::Stored && f.quiet {
        return;
    }
    meta::compose_set_reply(out, req, code, new_cas);
}

/// memcached's command names in `item_store` log lines.
fn set_mode_name(mode: SetMode) -> &'static str {
    match mode {
        SetMode::Set => "set",
        SetMode::Add => "add",
        SetMode::Replace => "replace",
        SetMode::Append => "append",
        SetMode::Prepend => "prepend",
        SetMode::Cas => "cas",
    }
}

fn meta_delete(ctx: &mut Ctx<'_>, req: &MetaRequest<'_>, out: &mut Vec<u8>) {
    let f = &req.flags;
    let s = ctx.stats;
    let opts = DeleteOpts {
        cas: f.cas,
        invalidate: f.invalidate,
        // T only counts together with I.
        invalidate_exptime: if f.invalidate { f.ttl.map(i64::from) } else { None },
    };
    ctx.log_lookup(req.key.bytes());
    let code = match ctx.store.delete(req.key.bytes(), opts) {
        DeleteResult::Deleted => {
            // Marking stale is not a delete in memcached's counters.
            if !f.invalidate {
                ThreadStats::incr(&s.delete_hits);
            }
            if f.quiet {
                return;
            }
            Code::Stored
        }
        DeleteResult::NotFound => {
            ThreadStats::incr(&s.delete_misses);
            Code::NotFound
        }
        DeleteResult::Exists => {
            ThreadStats::incr(&s.delete_misses);
            Code::Exists
        }
    };
    meta::compose_code_reply(out, req, code);
}

fn meta_arith(ctx: &mut Ctx<'_>, req: &MetaRequest<'_>, out: &mut Vec<u8>) {
    let f = &req.flags;
    let s = ctx.stats;
    let key = req.key.bytes();
    let incr = req.is_incr();
    // Whether this request creates the item decides counters and `q`; the store's arith
    // does not say, so look first when autovivify is asked for (a race here only affects
    // those two things).
    let existed = match f.vivify {
        Some(_) => ctx.store.get(key, GetOpts::default(), |o| o.item.is_some()),
        None => true,
    };
    let plan = TtlPlan::new(req);
    let opts = ArithOpts {
        vivify: plan.vivify.map(|exptime| (f.initial, exptime)),
        cas: f.cas,
        touch_exptime: if plan.touch_after_read { None } else { plan.touch },
        vivify_exptime_final: true,
    };
    ctx.log_lookup(key);
    let result = ctx.store.arith(key, incr, f.delta, opts);
    // Compose in place; the reply is cut again if `q` hides it or the opaque is refused.
    let start = out.len();
    let mut hide = false;
    match result {
        ArithResult::Ok { value, cas, ttl_remaining_s } => {
            let created = f.vivify.is_some() && !existed;
            if !created {
                ThreadStats::incr(if incr { &s.incr_hits } else { &s.decr_hits });
                hide = f.quiet;
            }
            // As in mg: `t` prints the exptime as of its place among the flags.
            let ttl = match created {
                true => plan.t_created.map_or(-1, |raw| ctx.store.ttl_remaining_for(raw)),
                false => ttl_remaining_s,
            };
            meta::compose_arith_ok(out, req, value, cas, ttl);
            if plan.touch_after_read && !created {
                let touch = GetOpts { touch_exptime: plan.touch, ..GetOpts::default() };
                ctx.store.get(key, touch, |_| ());
            }
        }
        ArithResult::NotFound => {
            ThreadStats::incr(if incr { &s.incr_misses } else { &s.decr_misses });
            meta::compose_code_reply(out, req, Code::NotFound);
        }
        ArithResult::Exists => meta::compose_code_reply(out, req, Code::Exists),
        ArithResult::NonNumeric => {
            meta::compose_error_line(out, NON_NUMERIC);
            return;
        }
        ArithResult::NoMemory => {
            meta::compose_error_line(out, NO_MEMORY_ARITH);
            return;
        }
    }
    // memcached checks the opaque length while composing, after the arithmetic happened.
    if f.opaque_too_long {
        ctx.truncate_reply(out, start);
        meta::compose_error_line(out, OPAQUE_TOO_LONG);
    } else if hide {
        ctx.truncate_reply(out, start);
    }
}

fn meta_debug(ctx: &mut Ctx<'_>, req: &MetaRequest<'_>, out: &mut Vec<u8>) {
    let cas_enabled = ctx.store.config().cas_enabled;
    let found = ctx.store.get(req.key.bytes(), GetOpts::default(), |o| match o.item {
        Some(item) => {
            let info = meta::DebugInfo {
                ttl_remaining_s: item.ttl_remaining_s,
                last_access_ago_s: item.last_access_ago_s,
                cas: item.cas,
                fetched: item.fetched_before,
                value_bytes: item.value.len(),
                client_flags: item.flags,
                key_binary: item.key_binary,
            };
            meta::compose_debug(out, &req.key, &info, cas_enabled);
            true
        }
        None => false,
    });
    if !found {
        meta::compose_debug_miss(out);
    }
    ThreadStats::incr(&ctx.stats.cmd_meta);
}

#[cfg(test)]
mod tests {
    //! Each scenario replays requests that were sent to a fresh memcached 1.6.18
    //! (`memcached -U 0 -l 127.0.0.1`) and expects the exact bytes it answered.
    use super::*;
    use slipstream_store::{Clock, StoreConfig};

    /// The crate's executor harness (routing, swallowing and counters as the network loop
    /// has them), with the checks these scenarios want on top.
    struct Harness {
        h: crate::harness::Harness,
    }

    impl Harness {
        fn new() -> Harness {
            let cfg = StoreConfig::default();
            Harness { h: crate::harness::Harness::new(cfg, Clock::manual(1_700_000_000)) }
        }

        /// Feed `input` as one read; every request in it must complete without a close.
        fn send(&mut self, input: &[u8]) -> Vec<u8> {
            let out = self.h.feed(input);
            assert!(
                !self.h.closed && self.h.pending.is_empty(),
                "connection closed or request incomplete with {} bytes left",
                self.h.pending.len()
            );
            out
        }

        fn expect(&mut self, script: &[(&[u8], &[u8])]) {
            for (req, want) in script {
                let got = self.send(req);
                assert_eq!(
                    String::from_utf8_lossy(&got),
                    String::from_utf8_lossy(want),
                    "request {:?}",
                    String::from_utf8_lossy(&req[..req.len().min(80)])
                );
            }
        }

        fn counter(&self, name: &str) -> u64 {
            let totals = self.h.info.totals();
            match totals.pairs().into_iter().find(|(n, _)| *n == name) {
                Some((_, v)) => v,
                None => panic!("no counter {name}"),
            }
        }
    }

    #[test]
    fn incomplete_and_overlong_lines() {
        let mut h = Harness::new();
        let mut out = Vec::new();
        let mut ctx = Ctx {
            store: &h.h.store,
            stats: &h.h.stats,
            settings: &h.h.settings,
            server: &h.h.info,
            conn: &mut h.h.conn,
        };
        assert_eq!(execute(&mut ctx, b"mg foo v", &mut out), Step::Incomplete);
        assert_eq!(execute(&mut ctx, b"ms foo 5\r\nab", &mut out), Step::Incomplete);
        let long = vec![b'k'; 3000];
        assert_eq!(execute(&mut ctx, &long, &mut out), Step::Close);
        assert!(out.is_empty());
    }

    #[test]
    fn basic_get_and_set() {
        let mut h = Harness::new();
        h.expect(&[
            (b"ms foo 3 T0 F5\r\nbar\r\n", b"HD\r\n"),
            (b"mg foo v f s t k O1 c\r\n", b"VA 3 f5 s3 t-1 kfoo O1 c1\r\nbar\r\n"),
            (b"mg foo\r\n", b"HD\r\n"),
            (b"mg foo q\r\n", b"HD\r\n"),
            (b"mg miss v\r\n", b"EN\r\n"),
            (b"mg miss v q k\r\nmn\r\n", b"MN\r\n"),
            (b"mg miss k O5\r\n", b"EN kmiss O5\r\n"),
            (b"mg foo h l\r\n", b"HD h1 l0\r\n"),
            (b"mg foo u h\r\n", b"HD h1\r\n"),
        ]);
        let long = [b"mg foo v O".as_slice(), &[b'x'; 32], b"\r\n"].concat();
        h.expect(&[(&long, b"CLIENT_ERROR opaque token too long\r\n")]);
        assert_eq!(h.counter("cmd_set"), 1);
        assert_eq!(h.counter("cmd_get"), 8);
        assert_eq!(h.counter("get_hits"), 5);
        assert_eq!(h.counter("get_misses"), 3);
    }

    #[test]
    fn long_opaque_on_mg_still_fetches() {
        let mut h = Harness::new();
        let long = [b"mg foo O".as_slice(), &[b'x'; 40], b"\r\n"].concat();
        h.expect(&[
            (b"ms foo 1\r\nx\r\n", b"HD\r\n"),
            (&long, b"CLIENT_ERROR opaque token too long\r\n"),
            (b"me foo\r\n", b"ME foo exp=-1 la=0 cas=1 fetch=yes cls=1 size=63\r\n"),
        ]);
        assert_eq!(h.counter("cmd_get"), 0);
    }

    /// memcached walks mg's and ma's flags in request order after the fetch or the arithmetic:
    /// T sets the exptime, N sets it on an item the request created, t prints it as it is at
    /// that point (memcached's own clock ticked once during the recording: t29 there, t30 here).
    #[test]
    fn t_and_n_apply_in_request_order_on_created_items() {
        let mut h = Harness::new();
        h.expect(&[
            (b"mg m5 T60 t N30\r\n", b"HD t60 W\r\n"),
            (b"mg m5 t\r\n", b"HD t30 Z\r\n"),
            (b"mg m6 t T60 N30\r\n", b"HD t-1 W\r\n"),
            (b"mg m6 t\r\n", b"HD t30 Z\r\n"),
            (b"mg u1 T60 N30 t\r\n", b"HD t30 W\r\n"),
            (b"mg u1 t\r\n", b"HD t30 Z\r\n"),
            (b"mg u2 N30 T60 t\r\n", b"HD t60 W\r\n"),
            (b"mg u2 t\r\n", b"HD t60 Z\r\n"),
            (b"ms m1 1 T100\r\n5\r\n", b"HD\r\n"),
            (b"ma m1 t T30\r\n", b"HD t100\r\n"),
            (b"mg m1 t\r\n", b"HD t30\r\n"),
            (b"ma m2 N30 T60 t\r\n", b"HD t60\r\n"),
            (b"mg m2 t\r\n", b"HD t60\r\n"),
            (b"ma m3 T60 N30 t\r\n", b"HD t30\r\n"),
            (b"mg m3 t\r\n", b"HD t30\r\n"),
            (b"ma m4 T60 t N30\r\n", b"HD t60\r\n"),
            (b"mg m4 t\r\n", b"HD t30\r\n"),
        ]);
    }

    /// A too-long opaque token stops that walk with the error: what came before it has acted
    /// (a T touched, N created the item, with its TTL only if N came first; ma's arithmetic
    /// happened), what came after has not; an item mg created this way holds no win token, and
    /// a locked fetch (h) is not bumped.
    #[test]
    fn long_opaque_stops_the_flag_walk() {
        let mut h = Harness::new();
        let o = [b"O".as_slice(), &[b'a'; 40]].concat();
        let line = |head: &str, tail: &str| [head.as_bytes(), &o, tail.as_bytes()].concat();
        let err: &[u8] = b"CLIENT_ERROR opaque token too long\r\n";
        let script: Vec<(Vec<u8>, &[u8])> = vec![
            (b"ms wa 1\r\n5\r\n".to_vec(), b"HD\r\n"),
            (line("mg wa T99 ", "\r\n"), err),
            (b"mg wa t v\r\n".to_vec(), b"VA 1 t99\r\n5\r\n"),
            (line("mg wb N30 ", " v\r\n"), err),
            (b"mg wb t v\r\n".to_vec(), b"VA 0 t30\r\n\r\n"),
            (line("mg wc ", " N30 v t\r\n"), err),
            (b"mg wc v t\r\n".to_vec(), b"VA 0 t-1\r\n\r\n"),
            (line("mg vz ", " N30\r\n"), err),
            (b"mg vz N30 v t\r\n".to_vec(), b"VA 0 t-1\r\n\r\n"),
            (b"ms vx 1\r\n5\r\n".to_vec(), b"HD\r\n"),
            (line("mg vx ", " h\r\n"), err),
            (b"mg vx h\r\n".to_vec(), b"HD h0\r\n"),
            (line("ma wd N30 ", "\r\n"), err),
            (b"mg wd t v\r\n".to_vec(), b"VA 1 t30\r\n0\r\n"),
            (line("ma we ", " N30 J4\r\n"), err),
            (b"mg we t v\r\n".to_vec(), b"VA 1 t-1\r\n4\r\n"),
            (b"ms wf 1 T100\r\n5\r\n".to_vec(), b"HD\r\n"),
            (line("ma wf ", " T30\r\n"), err),
            (b"mg wf t v\r\n".to_vec(), b"VA 1 t100\r\n6\r\n"),
        ];
        let script: Vec<(&[u8], &[u8])> = script.iter().map(|(r, w)| (r.as_slice(), *w)).collect();
        h.expect(&script);
    }

    /// memcached marks an item's first fetch and moves its last-access time on a later one
    /// (do_item_bump), so `l` counts from the store until the second fetch. Recorded from a
    /// fresh memcached 1.6.18 (3 s sleep; an item its LRU maintainer has already moved to the
    /// COLD queue gets that move a little later, which Slipstream does not model).
    #[test]
    fn first_fetch_and_last_access() {
        let mut h = Harness::new();
        h.expect(&[(b"ms foo 1\r\nx\r\n", b"HD\r\n"), (b"mg foo h l t\r\n", b"HD h0 l0 t-1\r\n")]);
        h.h.store.clock().advance(3);
        h.expect(&[(b"mg foo h l\r\n", b"HD h1 l3\r\n"), (b"mg foo h l\r\n", b"HD h1 l0\r\n")]);
        h.expect(&[(b"ms bar 1\r\nx\r\n", b"HD\r\n")]);
        h.h.store.clock().advance(2);
        h.expect(&[
            (b"mg bar v\r\n", b"VA 1\r\nx\r\n"),
            (b"me bar\r\n", b"ME bar exp=-1 la=2 cas=2 fetch=yes cls=1 size=63\r\n"),
        ]);
    }

    #[test]
    fn touch_through_mg_counts_as_touch() {
        let mut h = Harness::new();
        h.expect(&[
            (b"ms zz 1\r\na\r\n", b"HD\r\n"),
            (b"mg zz v T10 t\r\n", b"VA 1 t10\r\na\r\n"),
            (b"mg zz2 v T10\r\n", b"EN\r\n"),
        ]);
        assert_eq!((h.counter("cmd_touch"), h.counter("touch_hits")), (1, 1));
        assert_eq!((h.counter("cmd_get"), h.counter("get_misses")), (1, 1));
        h.h.store.clock().advance(11);
        h.expect(&[(b"mg zz v\r\n", b"EN\r\n")]);
    }

    #[test]
    fn ttl_flags_apply_in_request_order() {
        let mut h = Harness::new();
        h.expect(&[
            (b"ms num 1\r\n1\r\n", b"HD\r\n"),
            // t and R before T see the old (infinite) TTL; T-1 then expires the item.
            (b"mg num t R+3 T-1 I k\r\n", b"HD t-1 knum\r\n"),
            (b"mg num\r\n", b"EN\r\n"),
            (b"ms num 1\r\n1\r\n", b"HD\r\n"),
            (b"mg num t T30\r\n", b"HD t-1\r\n"),
            (b"mg num T60 t\r\n", b"HD t60\r\n"),
            (b"mg num t\r\n", b"HD t60\r\n"),
        ]);
    }

    #[test]
    fn set_modes() {
        let mut h = Harness::new();
        h.expect(&[
            (b"ms k 1 ME c\r\na\r\n", b"HD c1\r\n"),
            (b"ms k 1 ME c\r\nb\r\n", b"NS c0\r\n"),
            (b"ms k 1 MA c k\r\nc\r\n", b"HD c2 kk\r\n"),
            (b"ms k 1 MP q\r\nd\r\n", b""),
            (b"mg k v c\r\n", b"VA 3 c3\r\ndac\r\n"),
            (b"ms k2 1 MR\r\nx\r\n", b"NS\r\n"),
            (b"ms k2 1 MA q O7\r\nx\r\n", b"NS O7\r\n"),
            (b"ms k 2 MR T0 F9 c\r\nrr\r\n", b"HD c4\r\n"),
            (b"mg k v f c\r\n", b"VA 2 f9 c4\r\nrr\r\n"),
            (b"ms k 1 MS q\r\ns\r\nmn\r\n", b"MN\r\n"),
            // 1.6.18 has no append autovivify: N is accepted and ignored.
            (b"ms nx 3 MA N30 c\r\nabc\r\n", b"NS c0\r\n"),
        ]);
        assert_eq!(h.counter("cmd_set"), 9);
    }

    #[test]
    fn compare_and_swap() {
        let mut h = Harness::new();
        h.expect(&[
            (b"ms c 1\r\na\r\n", b"HD\r\n"),
            (b"mg c c\r\n", b"HD c1\r\n"),
            (b"ms c 1 C999 c\r\nb\r\n", b"EX c0\r\n"),
            (b"ms c 1 C1 c\r\nb\r\n", b"HD c2\r\n"),
            (b"ms nope 1 C1 c\r\nb\r\n", b"NF c0\r\n"),
            (b"ms c 1 C2 MA\r\nz\r\n", b"HD\r\n"),
            (b"ms c 1 C0 MA\r\nz\r\n", b"HD\r\n"),
            (b"mg c v c\r\n", b"VA 3 c4\r\nbzz\r\n"),
            // Older CAS with I: stored, but marked stale.
            (b"ms c 1 C1 I\r\nq\r\n", b"HD\r\n"),
            (b"mg c v c\r\n", b"VA 1 c5 X W\r\nq\r\n"),
            (b"mg c v c\r\n", b"VA 1 c5 Z X\r\nq\r\n"),
        ]);
        assert_eq!((h.counter("cas_hits"), h.counter("cas_badval"), h.counter("cas_misses")), (2, 1, 1));
    }

    #[test]
    fn vivify_recache_and_stale() {
        let mut h = Harness::new();
        h.expect(&[
            (b"mg v1 N30 v c t k\r\n", b"VA 0 c1 t30 kv1 W\r\n\r\n"),
            (b"mg v1 N30 v c t k\r\n", b"VA 0 c1 t30 kv1 Z\r\n\r\n"),
            (b"mg v1 v s\r\n", b"VA 0 s0 Z\r\n\r\n"),
            (b"ms v1 3 T100\r\nabc\r\n", b"HD\r\n"),
            (b"mg v1 R30 v t\r\n", b"VA 3 t100\r\nabc\r\n"),
            (b"mg v1 R200 v t\r\n", b"VA 3 t100 W\r\nabc\r\n"),
            (b"mg v1 R200 v t\r\n", b"VA 3 t100 Z\r\nabc\r\n"),
            (b"md v1 I T30\r\n", b"HD\r\n"),
            (b"mg v1 v t c\r\n", b"VA 3 t30 c3 X W\r\nabc\r\n"),
            (b"mg v1 v t c\r\n", b"VA 3 t30 c3 Z X\r\nabc\r\n"),
            (b"mg v2 N30 q\r\n", b"HD W\r\n"),
            (b"mg v2 N30 q\r\n", b"HD Z\r\n"),
            // t before N on a created item: no exptime yet.
            (b"mg v3 t N100 s\r\n", b"HD t-1 s0 W\r\n"),
            (b"mg v3 t\r\n", b"HD t100 Z\r\n"),
            (b"ma v4 t N100 J5 v\r\n", b"VA 1 t-1\r\n5\r\n"),
            (b"ma v4 t v\r\n", b"VA 1 t100\r\n6\r\n"),
        ]);
    }

    #[test]
    fn meta_delete() {
        let mut h = Harness::new();
        h.expect(&[
            (b"ms d 1\r\na\r\n", b"HD\r\n"),
            (b"md d q\r\nmn\r\n", b"MN\r\n"),
            // q hides only HD: NF is still sent.
            (b"md d q k O1\r\nmn\r\n", b"NF kd O1\r\nMN\r\n"),
            (b"ms d 1\r\na\r\n", b"HD\r\n"),
            (b"md d C999 k\r\n", b"EX kd\r\n"),
            (b"md d C1 O2\r\n", b"EX O2\r\n"),
            (b"ms d 1\r\na\r\n", b"HD\r\n"),
            (b"md d I T10 q\r\nmn\r\n", b"MN\r\n"),
            (b"mg d t v\r\n", b"VA 1 t10 X W\r\na\r\n"),
            (b"md d\r\n", b"HD\r\n"),
            (b"mg d\r\n", b"EN\r\n"),
            (b"md Zm9v b k\r\n", b"NF kZm9v b\r\n"),
        ]);
        assert_eq!((h.counter("delete_hits"), h.counter("delete_misses")), (2, 4));
    }

    #[test]
    fn meta_arithmetic() {
        let mut h = Harness::new();
        let long_opaque = [b"ma n O".as_slice(), &[b'x'; 32], b"\r\n"].concat();
        h.expect(&[
            (b"ma n\r\n", b"NF\r\n"),
            (b"ma n q\r\nmn\r\n", b"NF\r\nMN\r\n"),
            (b"ma n N0 J10 v c t k\r\n", b"VA 2 c1 t-1 kn\r\n10\r\n"),
            (b"ma n v D5\r\n", b"VA 2\r\n15\r\n"),
            (b"ma n MD D100 v\r\n", b"VA 1\r\n0\r\n"),
            (b"ma n M+ q\r\nmn\r\n", b"MN\r\n"),
            (b"ma n M- v O1 k\r\n", b"VA 1 O1 kn\r\n0\r\n"),
            (b"ma n C1 k\r\n", b"EX kn\r\n"),
            // Creating the item is not hidden by q; a later hit is.
            (b"ma n2 N0 J42 q\r\nmn\r\n", b"HD\r\nMN\r\n"),
            (b"ma n2 N100 J42 q v t\r\nmn\r\n", b"MN\r\n"),
            (b"ms s 1\r\nx\r\n", b"HD\r\n"),
            (b"ma s q\r\n", b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n"),
            // The arithmetic happens, then the long opaque is refused.
            (&long_opaque, b"CLIENT_ERROR opaque token too long\r\n"),
            (b"ma n v\r\n", b"VA 1\r\n2\r\n"),
            (b"ms big 20\r\n18446744073709551615\r\n", b"HD\r\n"),
            (b"ma big v\r\n", b"VA 1\r\n0\r\n"),
        ]);
        assert_eq!(h.counter("incr_misses"), 2);
        assert_eq!(h.counter("incr_hits"), 6);
        assert_eq!(h.counter("decr_hits"), 2);
    }

    #[test]
    fn meta_debug_and_noop() {
        let mut h = Harness::new();
        h.expect(&[
            (b"ms t 1 T100 F3\r\n1\r\n", b"HD\r\n"),
            (b"me t\r\n", b"ME t exp=-100 la=0 cas=1 fetch=no cls=1 size=65\r\n"),
            (b"mg t v\r\n", b"VA 1\r\n1\r\n"),
            (b"me t\r\n", b"ME t exp=-100 la=0 cas=1 fetch=yes cls=1 size=65\r\n"),
            // memcached remembers per item whether its key was stored with `b`: `t` was
            // stored plainly, so `me` prints it plainly even when asked in base64.
            (b"me dA== b\r\n", b"ME t exp=-100 la=0 cas=1 fetch=yes cls=1 size=65\r\n"),
            (b"me nope\r\n", b"EN\r\n"),
            (b"ms Zm9v 2 b\r\nhi\r\n", b"HD\r\n"),
            (b"me Zm9v b\r\n", b"ME Zm9v exp=-1 la=0 cas=2 fetch=no cls=1 size=64\r\n"),
            (b"mg Zm9v b k v\r\n", b"VA 2 kZm9v b\r\nhi\r\n"),
            (b"mn\r\n", b"MN\r\n"),
            (b"me\r\n", b"CLIENT_ERROR bad command line format\r\n"),
        ]);
        assert_eq!(h.counter("cmd_meta"), 5);
    }

    #[test]
    fn refused_data_is_swallowed() {
        let mut h = Harness::new();
        let huge = [b"ms foo 2000000 T0\r\n".as_slice(), &vec![b'x'; 2_000_002], b"mn\r\n"].concat();
        let over =
            [b"ms foo 1\r\na\r\nms foo 1048515 k\r\n".as_slice(), &vec![b'x'; 1_048_517], b"mg foo v\r\n"].concat();
        h.expect(&[
            (&huge, b"SERVER_ERROR object too large for cache\r\nMN\r\n"),
            (b"ms foo 3\r\nbarXYmn\r\n", b"CLIENT_ERROR bad data chunk\r\nMN\r\n"),
            (b"ms foo 3 zz\r\nabc\r\nmn\r\n", b"CLIENT_ERROR invalid flag\r\nMN\r\n"),
            (&over, b"HD\r\nSERVER_ERROR object too large for cache\r\nEN\r\n"),
            (b"mg foo v v\r\n", b"CLIENT_ERROR duplicate flag\r\n"),
        ]);
        assert_eq!(h.counter("store_too_large"), 2);
        // A refusal split across reads: the rest of the block is swallowed later.
        let mut h = Harness::new();
        assert_eq!(h.send(b"ms foo 10 zz\r\nabc"), b"CLIENT_ERROR invalid flag\r\n");
        assert_eq!(h.h.conn.swallow_bytes, 9);
        assert_eq!(h.send(b"defghij\r\nmn\r\n"), b"MN\r\n");
    }
}
