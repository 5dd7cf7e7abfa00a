//! Ties memcached's binary protocol (`slipstream_proto::binary`) to the store, reply bytes
//! matching memcached 1.6.18.
//!
//! What it is for: executing one binary request from the front of a connection's input
//! (storage, gets, touch/GAT, incr/decr with create-on-miss, delete, flush, stats, noop,
//! version, quit), the quiet variants, and memcached's answers to bad input: close on bad
//! magic, "Invalid arguments" + close on broken length rules, "Unknown command" + discard for
//! unknown opcodes, "Too large." + discard for values over the item size limit.
//!
//! What it is not for: sockets, or deciding when to write replies (the network loop does that;
//! `ConnState::quiet_pending` tells it the last request was quiet).

use crate::exec::{Ctx, Step};
use crate::stats::ThreadStats;
use crate::stats_report::{self, StatsList, StatsView};
use slipstream_proto::binary::{self, opcode, status, BinaryError, Command, Header, Request, StoreKind};
use slipstream_proto::Parsed;
use slipstream_store::{ArithOpts, ArithResult, DeleteOpts, DeleteResult, GetOpts, SetMode, StoreOpts, StoreResult};

/// memcached's texts for out-of-memory replies (its `SERVER_ERROR` text minus the prefix).
const NO_MEMORY_STORE_TEXT: &[u8] = b"Out of memory allocating item";
const NO_MEMORY_ARITH_TEXT: &[u8] = b"Out of memory incrementing value";
/// memcached's text-protocol line for this case without its "SERVER_ERROR " prefix, as its
/// out_of_memory() sends it on a binary connection.
const NO_MEMORY_GET_TEXT: &[u8] = b"out of memory writing get response";

/// Handle one binary request from the front of `input`, appending its reply to `out`.
pub fn execute(ctx: &mut Ctx<'_>, input: &[u8], out: &mut Vec<u8>) -> Step {
    // Discard the rest of a refused request first (memcached's conn_swallow).
    if ctx.conn.swallow_bytes > 0 {
        let n = ctx.conn.swallow_bytes.min(input.len());
        if n == 0 {
            return Step::Incomplete;
        }
        ctx.conn.swallow_bytes -= n;
        return Step::Consumed(n);
    }
    match binary::parse(input, &ctx.store.config().item_limits()) {
        Parsed::Incomplete => Step::Incomplete,
        Parsed::Invalid { error: BinaryError::BadMagic, .. } => Step::Close,
        Parsed::Invalid { error: BinaryError::Fatal { header, status }, .. } => {
            binary::compose_error(out, &header, status);
            Step::Close
        }
        Parsed::Invalid { error: BinaryError::Unknown { header, swallow_bytes }, consumed } => {
            binary::compose_error(out, &header, status::UNKNOWN_COMMAND);
            ctx.conn.swallow_bytes = swallow_bytes;
            Step::Consumed(consumed)
        }
        Parsed::Complete { request, consumed } => {
            ctx.conn.quiet_pending = request.quiet();
            run(ctx, &request, out, consumed)
        }
    }
}

/// Execute a parsed request; `consumed` is what it used of the input.
fn run(ctx: &mut Ctx<'_>, req: &Request<'_>, out: &mut Vec<u8>, consumed: usize) -> Step {
    let h = &req.header;
    let quiet = req.quiet();
    match req.command {
        Command::Get { key, with_key } => {
            ThreadStats::incr(&ctx.stats.cmd_get);
            let opts = GetOpts { bump: true, kernel_fill: true, ..GetOpts::default() };
            get_reply(ctx, h, key, with_key, quiet, opts, out, false);
        }
        Command::Gat { key, exptime, with_key } => {
            ThreadStats::incr(&ctx.stats.cmd_touch);
            let opts = GetOpts { bump: true, touch_exptime: Some(exptime as i64), ..GetOpts::default() };
            get_reply(ctx, h, key, with_key, quiet, opts, out, true);
        }
        Command::Touch { key, exptime } => touch(ctx, h, key, exptime, out),
        Command::Store { kind, key, flags, exptime, value } => {
            store(ctx, h, kind, key, flags, exptime, value, quiet, out);
        }
        Command::Concat { append, key, value } => concat(ctx, h, append, key, value, quiet, out),
        Command::Oversize { key, unlink_old, value_bytes } => oversize(ctx, h, key, unlink_old, value_bytes, out),
        Command::Delete { key } => delete(ctx, h, key, quiet, out),
        Command::Arith { incr, key, delta, initial, exptime } => {
            arith(ctx, h, ArithArgs { incr, key, delta, initial, exptime }, quiet, out);
        }
        Command::Quit => {
            success(out, h, quiet, 0, &[]);
            return Step::Quit;
        }
        Command::Flush { exptime } => flush(ctx, h, exptime, quiet, out),
        Command::Noop => success(out, h, false, 0, &[]),
        Command::Version => success(out, h, false, 0, ctx.settings.version.as_bytes()),
        Command::Stat { key } => stat(ctx, h, key, out),
    }
    Step::Consumed(consumed)
}

/// TOUCH: set a new exptime; the reply carries the flags and CAS but no value.
#[inline]
fn touch(ctx: &mut Ctx<'_>, h: &Header, key: &[u8], exptime: u32, out: &mut Vec<u8>) {
    let stats = ctx.stats;
    ThreadStats::incr(&stats.cmd_touch);
    let opts = GetOpts { bump: true, touch_exptime: Some(exptime as i64), ..GetOpts::default() };
    ctx.log_lookup(key);
    let hit = ctx.store.get(key, opts, |o| match o.item {
        Some(item) => {
            // memcached's TOUCH reply carries the flags and CAS but no value.
            binary::compose_response(out, h.opcode, 0, h.opaque, item.cas, &item.flags.to_be_bytes(), &[], &[]);
            true
        }
        None => false,
    });
    crate::stats_prefix::record_get(ctx, key, hit);
    if hit {
        ThreadStats::incr(&stats.touch_hits);
    } else {
        ThreadStats::incr(&stats.touch_misses);
        binary::compose_error(out, h, status::KEY_ENOENT);
    }
}

/// APPEND/PREPEND (and their quiet variants).
#[inline]
fn concat(ctx: &mut Ctx<'_>, h: &Header, append: bool, key: &[u8], value: &[u8], quiet: bool, out: &mut Vec<u8>) {
    let stats = ctx.stats;
    crate::stats_prefix::record_set(ctx, key);
    let mode = if append { SetMode::Append } else { SetMode::Prepend };
    let opts = StoreOpts { cas: nonzero(storage_cas(ctx, h)), ..StoreOpts::default() };
    ctx.log_lookup(key);
    let result = ctx.store.store(mode, key, value, 0, 0, opts);
    ctx.log_store(key, if append { "append" } else { "prepend" }, result, 0, value.len());
    match result {
        StoreResult::Stored(cas) => {
            ThreadStats::incr(&stats.cmd_set);
            success(out, h, quiet, cas, &[]);
        }
        StoreResult::Exists => {
            ThreadStats::incr(&stats.cmd_set);
            binary::compose_error(out, h, status::KEY_EEXISTS);
        }
        // memcached maps every other failure of append/prepend to "Not stored.".
        StoreResult::NotStored | StoreResult::NotFound | StoreResult::TooLarge | StoreResult::NoMemory => {
            ThreadStats::incr(&stats.cmd_set);
            binary::compose_error(out, h, status::NOT_STORED);
        }
    }
}

/// A storage request whose value is over the item size limit: "Too large." and discard it.
#[inline]
fn oversize(ctx: &mut Ctx<'_>, h: &Header, key: &[u8], unlink_old: bool, value_bytes: usize, out: &mut Vec<u8>) {
    // memcached's binary path does not count store_too_large (checked against 1.6.18),
    // but counts the prefix before it finds the item too large.
    crate::stats_prefix::record_set(ctx, key);
    binary::compose_error(out, h, status::E2BIG);
    if unlink_old {
        // memcached never leaves the old value readable after a failed SET.
        ctx.store.unlink(key);
    }
    ctx.conn.swallow_bytes = value_bytes;
}

/// DELETE, comparing the header CAS when it is set.
#[inline]
fn delete(ctx: &mut Ctx<'_>, h: &Header, key: &[u8], quiet: bool, out: &mut Vec<u8>) {
    let stats = ctx.stats;
    crate::stats_prefix::record_delete(ctx, key);
    let opts = DeleteOpts { cas: nonzero(h.cas), ..DeleteOpts::default() };
    ctx.log_lookup(key);
    match ctx.store.delete(key, opts) {
        DeleteResult::Deleted => {
            ThreadStats::incr(&stats.delete_hits);
            success(out, h, quiet, 0, &[]);
        }
        DeleteResult::NotFound => {
            ThreadStats::incr(&stats.delete_misses);
            binary::compose_error(out, h, status::KEY_ENOENT);
        }
        DeleteResult::Exists => binary::compose_error(out, h, status::KEY_EEXISTS),
    }
}

/// The fields of an INCREMENT/DECREMENT request.
struct ArithArgs<'a> {
    incr: bool,
    key: &'a [u8],
    delta: u64,
    initial: u64,
    exptime: u32,
}

/// INCREMENT/DECREMENT, creating the item on a miss unless exptime is 0xffffffff.
#[inline]
fn arith(ctx: &mut Ctx<'_>, h: &Header, a: ArithArgs<'_>, quiet: bool, out: &mut Vec<u8>) {
    let stats = ctx.stats;
    let ArithArgs { incr, key, delta, initial, exptime } = a;
    // 0xffffffff means "fail on a miss instead of creating the item".
    let vivify = (exptime != u32::MAX).then_some((initial, exptime as i64));
    let opts = ArithOpts { vivify, cas: nonzero(h.cas), ..ArithOpts::default() };
    let (hits, misses) =
        if incr { (&stats.incr_hits, &stats.incr_misses) } else { (&stats.decr_hits, &stats.decr_misses) };
    ctx.log_lookup(key);
    match ctx.store.arith(key, incr, delta, opts) {
        ArithResult::Ok { value, cas, .. } => {
            ThreadStats::incr(hits);
            success(out, h, quiet, cas, &value.to_be_bytes());
        }
        ArithResult::NotFound => {
            ThreadStats::incr(misses);
            binary::compose_error(out, h, status::KEY_ENOENT);
        }
        ArithResult::NonNumeric => binary::compose_error(out, h, status::DELTA_BADVAL),
        ArithResult::Exists => binary::compose_error(out, h, status::KEY_EEXISTS),
        ArithResult::NoMemory => binary::compose_error_text(out, h, status::ENOMEM, NO_MEMORY_ARITH_TEXT),
    }
}

/// FLUSH (and FLUSHQ), refused under memcached's -F.
#[inline]
fn flush(ctx: &mut Ctx<'_>, h: &Header, exptime: u32, quiet: bool, out: &mut Vec<u8>) {
    if !ctx.settings.flush_enabled {
        // memcached -F answers every flush, quiet or not, with an auth error.
        binary::compose_error(out, h, status::AUTH_ERROR);
    } else {
        ThreadStats::incr(&ctx.stats.cmd_flush);
        ctx.store.flush_all(exptime as i64);
        success(out, h, quiet, 0, &[]);
    }
}

/// The header CAS as storage commands see it: memcached stores it into the new item, which is
/// a no-op under `-C`, so with CAS disabled set/add/replace/append/prepend ignore it (delete and
/// incr/decr still compare it, against the item's CAS of 0).
fn storage_cas(ctx: &Ctx<'_>, h: &Header) -> u64 {
    if ctx.store.config().cas_enabled {
        h.cas
    } else {
        0
    }
}

fn nonzero(cas: u64) -> Option<u64> {
    (cas != 0).then_some(cas)
}

/// A success reply with `value` as body, unless the command is quiet.
fn success(out: &mut Vec<u8>, h: &Header, quiet: bool, cas: u64, value: &[u8]) {
    if !quiet {
        binary::compose_response(out, h.opcode, status::NO_ERROR, h.opaque, cas, &[], &[], value);
    }
}

/// GET/GETK/GETQ/GETKQ and GAT*: hit = flags + (key) + value; miss = "Not found" (or just the
/// key for the K variants), nothing when quiet.
#[allow(clippy::too_many_arguments)]
fn get_reply(
    ctx: &mut Ctx<'_>,
    h: &Header,
    key: &[u8],
    with_key: bool,
    quiet: bool,
    opts: GetOpts,
    out: &mut Vec<u8>,
    touch: bool,
) {
    ctx.log_lookup(key);
    let store = ctx.store;
    let found = store.get(key, opts, |o| match o.item {
        Some(item) => {
            // Charge the connection-buffer budget before copying the value out.
            // A large value is sent by reference instead: not copied, not charged.
            let share = ctx.shares_value(item.value.len());
            let copied = if share { 0 } else { item.value.len() };
            if !ctx.reserve_reply(out, binary::HEADER_BYTES + 4 + key.len() + copied) {
                return None;
            }
            let reply_key = if with_key { key } else { &[][..] };
            let extras = item.flags.to_be_bytes();
            let body_bytes = extras.len() + reply_key.len() + item.value.len();
            binary::compose_header(
                out,
                h.opcode,
                status::NO_ERROR,
                h.opaque,
                item.cas,
                extras.len() as u8,
                reply_key.len() as u16,
                body_bytes as u32,
            );
            out.extend_from_slice(&extras);
            out.extend_from_slice(reply_key);
            ctx.put_value(out, share, item.data, item.value);
            Some(true)
        }
        None => Some(false),
    });
    let Some(hit) = found else {
        // The binary form of memcached's out-of-memory answer (its out_of_memory() strips the
        // "SERVER_ERROR " prefix); quiet or not, an error is always sent.
        binary::compose_error_text(out, h, status::ENOMEM, NO_MEMORY_GET_TEXT);
        return;
    };
    crate::stats_prefix::record_get(ctx, key, hit);
    let stats = ctx.stats;
    match (hit, touch) {
        (true, false) => ThreadStats::incr(&stats.get_hits),
        (false, false) => ThreadStats::incr(&stats.get_misses),
        (true, true) => ThreadStats::incr(&stats.touch_hits),
        (false, true) => ThreadStats::incr(&stats.touch_misses),
    }
    if hit || quiet {
        return;
    }
    if with_key {
        binary::compose_response(out, h.opcode, status::KEY_ENOENT, h.opaque, 0, &[], key, &[]);
    } else {
        binary::compose_error(out, h, status::KEY_ENOENT);
    }
}

#[allow(clippy::too_many_arguments)]
fn store(
    ctx: &mut Ctx<'_>,
    h: &Header,
    kind: StoreKind,
    key: &[u8],
    flags: u32,
    exptime: u32,
    value: &[u8],
    quiet: bool,
    out: &mut Vec<u8>,
) {
    let stats = ctx.stats;
    crate::stats_prefix::record_set(ctx, key);
    let cas = storage_cas(ctx, h);
    // A nonzero CAS in the header turns set, add and replace alike into a CAS operation.
    let mode = match (kind, cas) {
        (_, c) if c != 0 => SetMode::Cas,
        (StoreKind::Set, _) => SetMode::Set,
        (StoreKind::Add, _) => SetMode::Add,
        (StoreKind::Replace, _) => SetMode::Replace,
    };
    let opts = StoreOpts { cas: nonzero(cas), ..StoreOpts::default() };
    ctx.log_lookup(key);
    let result = ctx.store.store(mode, key, value, flags, exptime as i64, opts);
    let name = match mode {
        SetMode::Add => "add",
        SetMode::Replace => "replace",
        SetMode::Cas => "cas",
        _ => "set",
    };
    ctx.log_store(key, name, result, i64::from(exptime), value.len());
    // memcached counts cmd_set only once the item was allocated; it does not count
    // store_too_large / store_no_memory on the binary path at all.
    if !matches!(result, StoreResult::TooLarge | StoreResult::NoMemory) {
        ThreadStats::incr(&stats.cmd_set);
    }
    match result {
        StoreResult::Stored(cas) => {
            if mode == SetMode::Cas {
                ThreadStats::incr(&stats.cas_hits);
            }
            success(out, h, quiet, cas, &[]);
        }
        StoreResult::Exists => {
            ThreadStats::incr(&stats.cas_badval);
            binary::compose_error(out, h, status::KEY_EEXISTS);
        }
        StoreResult::NotFound => {
            ThreadStats::incr(&stats.cas_misses);
            binary::compose_error(out, h, status::KEY_ENOENT);
        }
        StoreResult::NotStored => {
            let st = match kind {
                StoreKind::Add => status::KEY_EEXISTS,
                StoreKind::Replace => status::KEY_ENOENT,
                StoreKind::Set => status::NOT_STORED,
            };
            binary::compose_error(out, h, st);
        }
        StoreResult::TooLarge => {
            binary::compose_error(out, h, status::E2BIG);
            if kind == StoreKind::Set {
                ctx.store.unlink(key);
            }
        }
        StoreResult::NoMemory => {
            binary::compose_error_text(out, h, status::ENOMEM, NO_MEMORY_STORE_TEXT);
            if kind == StoreKind::Set {
                ctx.store.unlink(key);
            }
        }
    }
}

/// One stat packet (key = name, value = text).
fn stat_packet(out: &mut Vec<u8>, h: &Header, name: &[u8], value: &[u8]) {
    binary::compose_response(out, opcode::STAT, status::NO_ERROR, h.opaque, 0, &[], name, value);
}

/// STAT: memcached matches the sub-command names by prefix for reset/settings/detail and
/// exactly for the rest (`conns` is text-only there); every successful form ends with an empty
/// packet. The lists come from `stats_report` (shared with the text protocol); this frames them.
fn stat(ctx: &mut Ctx<'_>, h: &Header, key: &[u8], out: &mut Vec<u8>) {
    let list = if key.is_empty() {
        Some(StatsList::General)
    } else if key.starts_with(b"reset") {
        ctx.server.reset();
        ctx.store.reset_stats();
        None
    } else if key.starts_with(b"settings") {
        Some(StatsList::Settings)
    } else if let Some(rest) = key.strip_prefix(b"detail") {
        if !stat_detail(ctx, h, rest, out) {
            return;
        }
        None
    } else if key == b"items" {
        Some(StatsList::Items)
    } else if key == b"slabs" {
        Some(StatsList::Slabs)
    } else if key == b"sizes" {
        Some(StatsList::Sizes)
    } else {
        binary::compose_error(out, h, status::KEY_ENOENT);
        return;
    };
    if let Some(list) = list {
        let view = StatsView { server: ctx.server, store: ctx.store, settings: ctx.settings };
        for (name, value) in stats_report::rows(view, list) {
            stat_packet(out, h, name.as_bytes(), &value);
        }
    }
    stat_packet(out, h, b"", b"");
}

/// `detail on|off|dump`; false (after the error reply) for anything else.
fn stat_detail(ctx: &mut Ctx<'_>, h: &Header, rest: &[u8], out: &mut Vec<u8>) -> bool {
    if rest.starts_with(b" dump") {
        let mut dump = Vec::new();
        ctx.server.prefix_stats.dump(&mut dump);
        stat_packet(out, h, b"detailed", &dump);
    } else if rest.starts_with(b" on") {
        ctx.server.prefix_stats.set_enabled(true);
    } else if rest.starts_with(b" off") {
        ctx.server.prefix_stats.set_enabled(false);
    } else {
        binary::compose_error(out, h, status::KEY_ENOENT);
        return false;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::{ConnState, Settings, Transport};
    use crate::stats::ServerInfo;
    use slipstream_store::{Clock, Store, StoreConfig};
    use std::sync::Arc;

    struct Rig {
        store: Arc<Store>,
        stats: Arc<ThreadStats>,
        settings: Settings,
        server: ServerInfo,
        conn: ConnState,
    }

    impl Rig {
        fn new() -> Rig {
            let cfg = StoreConfig { memory_bytes_max: 8 << 20, shards: 4, ..StoreConfig::default() };
            let store = Arc::new(Store::with_clock(cfg, Clock::manual(1_700_000_000)));
            let stats = Arc::new(ThreadStats::default());
            let server = ServerInfo { pid: 42, tcp_port: 11211, ..ServerInfo::detached(vec![stats.clone()], 1 << 20) };
            Rig { store, stats, settings: Settings::default(), server, conn: ConnState::new(Transport::Tcp) }
        }

        /// Feed `input` like the network loop does; returns replies and the last step.
        fn run(&mut self, input: &[u8]) -> (Vec<u8>, Step) {
            let mut ctx = Ctx {
                store: &self.store,
                stats: &self.stats,
                settings: &self.settings,
                server: &self.server,
                conn: &mut self.conn,
            };
            let mut out = Vec::new();
            let mut pos = 0;
            let mut last = Step::Incomplete;
            for _ in 0..10_000 {
                if pos >= input.len() {
                    break;
                }
                last = execute(&mut ctx, &input[pos..], &mut out);
                match last {
                    Step::Consumed(n) => {
                        assert!(n > 0 && pos + n <= input.len(), "bad consumed {n}");
                        pos += n;
                    }
                    _ => break,
                }
            }
            (out, last)
        }
    }

    fn req(op: u8, key: &[u8], extras: &[u8], value: &[u8], cas: u64, opaque: u32) -> Vec<u8> {
        let mut v = Vec::new();
        slipstream_proto::binary::compose_request(&mut v, op, key, extras, value, cas, opaque);
        v
    }

    fn set(op: u8, key: &[u8], value: &[u8], flags: u32, cas: u64, opaque: u32) -> Vec<u8> {
        let mut ex = flags.to_be_bytes().to_vec();
        ex.extend_from_slice(&0u32.to_be_bytes());
        req(op, key, &ex, value, cas, opaque)
    }

    fn arith(op: u8, key: &[u8], delta: u64, initial: u64, exptime: u32, opaque: u32) -> Vec<u8> {
        let mut ex = delta.to_be_bytes().to_vec();
        ex.extend_from_slice(&initial.to_be_bytes());
        ex.extend_from_slice(&exptime.to_be_bytes());
        req(op, key, &ex, b"", 0, opaque)
    }

    /// Expected response bytes.
    fn resp(op: u8, status: u16, opaque: u32, cas: u64, extras: &[u8], key: &[u8], value: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        binary::compose_response(&mut v, op, status, opaque, cas, extras, key, value);
        v
    }

    /// The CAS field of the response starting at `at`.
    fn cas_at(out: &[u8], at: usize) -> u64 {
        u64::from_be_bytes(out[at + 16..at + 24].try_into().unwrap())
    }

    /// A large value goes out by reference (not through `out`), in the same bytes: the reply
    /// buffer holds the headers and keys only, and the spliced stream equals the copied one.
    #[test]
    fn large_values_go_out_by_reference_in_the_same_bytes() {
        let mut r = Rig::new();
        let value: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let (out, _) = r.run(&set(opcode::SET, b"big", &value, 7, 0, 1));
        let cas = cas_at(&out, 0);
        let mut input = req(opcode::GETKQ, b"big", b"", b"", 0, 2);
        input.extend_from_slice(&req(opcode::GET, b"big", b"", b"", 0, 3));
        input.extend_from_slice(&req(opcode::NOOP, b"", b"", b"", 0, 4));
        let (out, _) = r.run(&input);
        assert!(out.len() < 200, "values were copied: {} bytes", out.len());
        assert_eq!(r.conn.shared.pinned_bytes(), 200_000);
        let mut spliced = Vec::new();
        let mut start = 0;
        assert!(crate::outq::write_pending(&mut spliced, &out, &mut start, &mut r.conn.shared, |_| ()).unwrap());
        let flags = 7u32.to_be_bytes();
        let want = [
            resp(opcode::GETKQ, 0, 2, cas, &flags, b"big", &value),
            resp(opcode::GET, 0, 3, cas, &flags, b"", &value),
            resp(opcode::NOOP, 0, 4, 0, b"", b"", b""),
        ]
        .concat();
        assert!(spliced == want, "spliced reply differs from the copied one");
    }

    #[test]
    fn get_miss_and_hit_bytes() {
        let mut r = Rig::new();
        let (out, _) = r.run(&req(opcode::GET, b"k", b"", b"", 0, 1));
        // Captured from memcached 1.6.18.
        let mut want = vec![0x81, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 9, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0];
        want.extend_from_slice(b"Not found");
        assert_eq!(out, want);
        let (out, _) = r.run(&req(opcode::GETK, b"k", b"", b"", 0, 2));
        assert_eq!(out, resp(opcode::GETK, 1, 2, 0, b"", b"k", b""));

        let (out, _) = r.run(&set(opcode::SET, b"k", b"hello", 0xdeadbeef, 0, 3));
        let cas = cas_at(&out, 0);
        assert_ne!(cas, 0);
        assert_eq!(out, resp(opcode::SET, 0, 3, cas, b"", b"", b""));
        let flags = 0xdeadbeefu32.to_be_bytes();
        let (out, _) = r.run(&req(opcode::GET, b"k", b"", b"", 0, 4));
        assert_eq!(out, resp(opcode::GET, 0, 4, cas, &flags, b"", b"hello"));
        let (out, _) = r.run(&req(opcode::GETK, b"k", b"", b"", 0, 5));
        assert_eq!(out, resp(opcode::GETK, 0, 5, cas, &flags, b"k", b"hello"));
        let (out, _) = r.run(&req(opcode::GETKQ, b"k", b"", b"", 0, 6));
        assert_eq!(out, resp(opcode::GETKQ, 0, 6, cas, &flags, b"k", b"hello"));
        assert!(r.conn.quiet_pending);
    }

    #[test]
    fn quiet_variants_suppress_success_and_get_misses() {
        let mut r = Rig::new();
        let mut input = set(opcode::SETQ, b"a", b"1", 0, 0, 1);
        input.extend(req(opcode::GETQ, b"missing", b"", b"", 0, 2));
        input.extend(req(opcode::GETKQ, b"missing", b"", b"", 0, 3));
        input.extend(set(opcode::ADDQ, b"a", b"2", 0, 0, 4)); // exists: error is sent
        input.extend(req(opcode::DELETEQ, b"a", b"", b"", 0, 5));
        input.extend(req(opcode::DELETEQ, b"a", b"", b"", 0, 6)); // miss: error is sent
        input.extend(req(opcode::FLUSHQ, b"", b"", b"", 0, 7));
        input.extend(req(opcode::NOOP, b"", b"", b"", 0, 8));
        let (out, step) = r.run(&input);
        assert_eq!(step, Step::Consumed(24));
        let mut want = resp(opcode::ADDQ, 2, 4, 0, b"", b"", b"Data exists for key.");
        want.extend(resp(opcode::DELETEQ, 1, 6, 0, b"", b"", b"Not found"));
        want.extend(resp(opcode::NOOP, 0, 8, 0, b"", b"", b""));
        assert_eq!(out, want);
        assert!(!r.conn.quiet_pending);
    }

    #[test]
    fn add_replace_append_prepend_statuses() {
        let mut r = Rig::new();
        let (out, _) = r.run(&set(opcode::REPLACE, b"r", b"x", 0, 0, 1));
        assert_eq!(out, resp(opcode::REPLACE, 1, 1, 0, b"", b"", b"Not found"));
        let (out, _) = r.run(&set(opcode::ADD, b"r", b"mid", 7, 0, 2));
        assert_eq!(out[6..8], [0, 0]);
        let (out, _) = r.run(&set(opcode::ADD, b"r", b"x", 0, 0, 3));
        assert_eq!(out, resp(opcode::ADD, 2, 3, 0, b"", b"", b"Data exists for key."));
        r.run(&req(opcode::APPEND, b"r", b"", b"-tail", 0, 4));
        r.run(&req(opcode::PREPEND, b"r", b"", b"head-", 0, 5));
        let (out, _) = r.run(&req(opcode::GET, b"r", b"", b"", 0, 6));
        let cas = cas_at(&out, 0);
        assert_eq!(out, resp(opcode::GET, 0, 6, cas, &7u32.to_be_bytes(), b"", b"head-mid-tail"));
        let (out, _) = r.run(&req(opcode::APPEND, b"nope", b"", b"x", 0, 7));
        assert_eq!(out, resp(opcode::APPEND, 5, 7, 0, b"", b"", b"Not stored."));
    }

    #[test]
    fn cas_rules() {
        let mut r = Rig::new();
        let (out, _) = r.run(&set(opcode::SET, b"c", b"v1", 0, 0, 1));
        let c1 = cas_at(&out, 0);
        let (out, _) = r.run(&set(opcode::SET, b"c", b"v2", 0, c1, 2));
        let c2 = cas_at(&out, 0);
        assert_eq!(out, resp(opcode::SET, 0, 2, c2, b"", b"", b""));
        let (out, _) = r.run(&set(opcode::SET, b"c", b"v3", 0, c1, 3));
        assert_eq!(out, resp(opcode::SET, 2, 3, 0, b"", b"", b"Data exists for key."));
        let (out, _) = r.run(&set(opcode::SET, b"nocas", b"v", 0, 12345, 4));
        assert_eq!(out, resp(opcode::SET, 1, 4, 0, b"", b"", b"Not found"));
        // ADD with a CAS is a CAS operation too.
        let (out, _) = r.run(&set(opcode::ADD, b"c", b"v", 0, c1, 5));
        assert_eq!(out, resp(opcode::ADD, 2, 5, 0, b"", b"", b"Data exists for key."));
        let (out, _) = r.run(&req(opcode::DELETE, b"c", b"", b"", c2 + 1, 6));
        assert_eq!(out, resp(opcode::DELETE, 2, 6, 0, b"", b"", b"Data exists for key."));
        let (out, _) = r.run(&req(opcode::DELETE, b"c", b"", b"", c2, 7));
        assert_eq!(out, resp(opcode::DELETE, 0, 7, 0, b"", b"", b""));
        assert_eq!(r.stats.cas_hits.load(std::sync::atomic::Ordering::Relaxed), 1);
        assert_eq!(r.stats.cas_badval.load(std::sync::atomic::Ordering::Relaxed), 2);
        assert_eq!(r.stats.cas_misses.load(std::sync::atomic::Ordering::Relaxed), 1);
    }

    #[test]
    fn cas_disabled_ignores_header_cas_on_storage() {
        let mut r = Rig::new();
        let cfg = StoreConfig { cas_enabled: false, ..r.store.config().clone() };
        r.store = Arc::new(Store::with_clock(cfg, Clock::manual(1_700_000_000)));
        // memcached -C: a set with a CAS on a missing key is a plain set, CAS 0 in the reply.
        let (out, _) = r.run(&set(opcode::SET, b"c", b"v", 0, 12345, 1));
        assert_eq!(out, resp(opcode::SET, 0, 1, 0, b"", b"", b""));
        let (out, _) = r.run(&req(opcode::APPEND, b"c", b"", b"w", 999, 2));
        assert_eq!(out, resp(opcode::APPEND, 0, 2, 0, b"", b"", b""));
    }

    #[test]
    fn incr_decr() {
        let mut r = Rig::new();
        let (out, _) = r.run(&arith(opcode::INCREMENT, b"n", 1, 10, u32::MAX, 1));
        assert_eq!(out, resp(opcode::INCREMENT, 1, 1, 0, b"", b"", b"Not found"));
        let (out, _) = r.run(&arith(opcode::INCREMENT, b"n", 1, 10, 0, 2));
        assert_eq!(out, resp(opcode::INCREMENT, 0, 2, cas_at(&out, 0), b"", b"", &10u64.to_be_bytes()));
        let (out, _) = r.run(&arith(opcode::INCREMENT, b"n", 5, 10, 0, 3));
        assert_eq!(out, resp(opcode::INCREMENT, 0, 3, cas_at(&out, 0), b"", b"", &15u64.to_be_bytes()));
        let (out, _) = r.run(&arith(opcode::DECREMENT, b"n", 100, 10, 0, 4));
        assert_eq!(out, resp(opcode::DECREMENT, 0, 4, cas_at(&out, 0), b"", b"", &0u64.to_be_bytes()));
        let (out, _) = r.run(&arith(opcode::INCREMENTQ, b"n", 3, 0, 0, 5));
        assert!(out.is_empty());
        r.run(&set(opcode::SET, b"t", b"abc", 0, 0, 6));
        let (out, _) = r.run(&arith(opcode::DECREMENTQ, b"t", 1, 0, 0, 7));
        assert_eq!(out, resp(opcode::DECREMENTQ, 6, 7, 0, b"", b"", b"Non-numeric server-side value for incr or decr"));
    }

    #[test]
    fn touch_and_gat() {
        let mut r = Rig::new();
        let ex = 100u32.to_be_bytes();
        let (out, _) = r.run(&req(opcode::GATK, b"t", &ex, b"", 0, 1));
        assert_eq!(out, resp(opcode::GATK, 1, 1, 0, b"", b"t", b""));
        let (out, _) = r.run(&req(opcode::GATQ, b"t", &ex, b"", 0, 2));
        assert!(out.is_empty());
        let (out, _) = r.run(&req(opcode::TOUCH, b"t", &ex, b"", 0, 3));
        assert_eq!(out, resp(opcode::TOUCH, 1, 3, 0, b"", b"", b"Not found"));
        let (out, _) = r.run(&set(opcode::SET, b"t", b"tv", 9, 0, 4));
        let cas = cas_at(&out, 0);
        let flags = 9u32.to_be_bytes();
        let (out, _) = r.run(&req(opcode::TOUCH, b"t", &ex, b"", 0, 5));
        assert_eq!(out, resp(opcode::TOUCH, 0, 5, cas, &flags, b"", b""));
        let (out, _) = r.run(&req(opcode::GAT, b"t", &ex, b"", 0, 6));
        assert_eq!(out, resp(opcode::GAT, 0, 6, cas, &flags, b"", b"tv"));
        let (out, _) = r.run(&req(opcode::GATKQ, b"t", &ex, b"", 0, 7));
        assert_eq!(out, resp(opcode::GATKQ, 0, 7, cas, &flags, b"t", b"tv"));
        // An exptime of 1 second: gone once the clock passes it.
        r.run(&req(opcode::TOUCH, b"t", &1u32.to_be_bytes(), b"", 0, 8));
        r.store.clock().advance(3);
        let (out, _) = r.run(&req(opcode::GET, b"t", b"", b"", 0, 9));
        assert_eq!(out, resp(opcode::GET, 1, 9, 0, b"", b"", b"Not found"));
    }

    #[test]
    fn flush_noop_version_quit() {
        let mut r = Rig::new();
        r.run(&set(opcode::SET, b"f", b"x", 0, 0, 1));
        let (out, _) = r.run(&req(opcode::FLUSH, b"", b"", b"", 0, 2));
        assert_eq!(out, resp(opcode::FLUSH, 0, 2, 0, b"", b"", b""));
        let (out, _) = r.run(&req(opcode::GET, b"f", b"", b"", 0, 3));
        assert_eq!(out[6..8], [0, 1]);
        let (out, _) = r.run(&req(opcode::VERSION, b"", b"", b"", 0, 4));
        assert_eq!(out, resp(opcode::VERSION, 0, 4, 0, b"", b"", crate::VERSION_STRING.as_bytes()));
        r.settings.flush_enabled = false;
        let (out, _) = r.run(&req(opcode::FLUSHQ, b"", b"", b"", 0, 5));
        assert_eq!(out, resp(opcode::FLUSHQ, 0x20, 5, 0, b"", b"", b"Auth failure."));
        let (out, step) = r.run(&req(opcode::QUIT, b"", b"", b"", 0, 6));
        assert_eq!((out, step), (resp(opcode::QUIT, 0, 6, 0, b"", b"", b""), Step::Quit));
        let (out, step) = r.run(&req(opcode::QUITQ, b"", b"", b"", 0, 7));
        assert_eq!((out, step), (Vec::new(), Step::Quit));
    }

    #[test]
    fn bad_input_answers() {
        let mut r = Rig::new();
        let (out, step) = r.run(&[0x81; 24]);
        assert_eq!((out.len(), step), (0, Step::Close));
        let (out, step) = r.run(&req(opcode::GET, &[b'k'; 251], b"", b"", 0, 1));
        assert_eq!((out, step), (resp(opcode::GET, 4, 1, 0, b"", b"", b"Invalid arguments"), Step::Close));
        // Unknown opcode: reply, then swallow bodylen after extras + key (memcached's quirk).
        let mut input = req(0x1b, b"", &[0; 4], b"", 0, 2);
        input.extend_from_slice(&[0xee; 4]);
        input.extend(req(opcode::NOOP, b"", b"", b"", 0, 3));
        let (out, step) = r.run(&input);
        let mut want = resp(0x1b, 0x81, 2, 0, b"", b"", b"Unknown command");
        want.extend(resp(opcode::NOOP, 0, 3, 0, b"", b"", b""));
        assert_eq!((out, step), (want, Step::Consumed(24)));
        // Partial header: nothing consumed.
        assert_eq!(r.run(&req(opcode::NOOP, b"", b"", b"", 0, 4)[..23]).1, Step::Incomplete);
    }

    #[test]
    fn oversize_value_is_refused_swallowed_and_unlinks_old() {
        let mut r = Rig::new();
        r.run(&set(opcode::SET, b"big", b"old", 0, 0, 1));
        let mut input = set(opcode::SETQ, b"big", &vec![b'v'; (1 << 20) + 1], 0, 0, 2);
        input.extend(req(opcode::GET, b"big", b"", b"", 0, 3));
        let (out, _) = r.run(&input);
        let mut want = resp(opcode::SETQ, 3, 2, 0, b"", b"", b"Too large.");
        want.extend(resp(opcode::GET, 1, 3, 0, b"", b"", b"Not found"));
        assert_eq!(out, want);
        // Arriving in pieces: the swallow spans several calls.
        let big = set(opcode::ADD, b"big2", &vec![b'v'; 3 << 20], 0, 0, 4);
        let (out, _) = r.run(&big[..100_000]);
        assert_eq!(out, resp(opcode::ADD, 3, 4, 0, b"", b"", b"Too large."));
        let (out, _) = r.run(&big[100_000..]);
        assert!(out.is_empty());
        assert_eq!(r.conn.swallow_bytes, 0);
        let (out, _) = r.run(&req(opcode::NOOP, b"", b"", b"", 0, 5));
        assert_eq!(out, resp(opcode::NOOP, 0, 5, 0, b"", b"", b""));
    }

    #[test]
    fn stats_stream_and_terminate() {
        let mut r = Rig::new();
        let (out, _) = r.run(&req(opcode::STAT, b"", b"", b"", 0, 9));
        // Walk the packets: all STAT, opaque 9, last one empty.
        let mut pos = 0;
        let mut names = Vec::new();
        while pos < out.len() {
            let keylen = u16::from_be_bytes([out[pos + 2], out[pos + 3]]) as usize;
            let bodylen = u32::from_be_bytes(out[pos + 8..pos + 12].try_into().unwrap()) as usize;
            assert_eq!(out[pos + 1], opcode::STAT);
            assert_eq!(out[pos + 12..pos + 16], 9u32.to_be_bytes());
            names.push(String::from_utf8(out[pos + 24..pos + 24 + keylen].to_vec()).unwrap());
            pos += 24 + bodylen;
        }
        assert_eq!(names.first().map(String::as_str), Some("pid"));
        assert_eq!(names.last().map(String::as_str), Some(""));
        // memcached's 92 general stats and the terminator (no fast path attached: none of
        // Slipstream's `fastpath_*`).
        assert_eq!(names.len(), 93);
        assert!(!names.iter().any(|n| n.starts_with("fastpath_")));
        let (out, _) = r.run(&req(opcode::STAT, b"bogus", b"", b"", 0, 1));
        assert_eq!(out, resp(opcode::STAT, 1, 1, 0, b"", b"", b"Not found"));
        let (out, _) = r.run(&req(opcode::STAT, b"reset", b"", b"", 0, 2));
        assert_eq!(out, resp(opcode::STAT, 0, 2, 0, b"", b"", b""));
    }

    #[test]
    fn random_input_never_panics() {
        let seed = 0x2545_f491_4f6c_dd1du64;
        println!("seed {seed:#x}");
        let mut x = seed;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let ops = [0u8, 1, 2, 3, 4, 5, 6, 8, 9, 0x0a, 0x0c, 0x0e, 0x10, 0x11, 0x1c, 0x1d, 0x23, 0x30];
        for _ in 0..300 {
            let mut r = Rig::new();
            let mut input = Vec::new();
            for _ in 0..20 {
                let op = ops[(next() % ops.len() as u64) as usize];
                let key = [b'a' + (next() % 4) as u8];
                let ext_len = [0usize, 4, 8, 20][(next() % 4) as usize];
                let ext: Vec<u8> = (0..ext_len).map(|_| next() as u8).collect();
                let val: Vec<u8> = (0..(next() % 6)).map(|_| b'0' + (next() % 10) as u8).collect();
                input.extend(req(op, &key, &ext, &val, next() % 3, 1));
            }
            let _ = r.run(&input);
        }
    }
}
