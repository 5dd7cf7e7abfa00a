//! Ties memcached's text protocol (`slipstream_proto::text`) to the store, byte-exact with
//! memcached 1.6.18: replies, `noreply` suppression, error resynchronisation, counters and the
//! `stats` family.
//!
//! What it is for: handling one text request from the front of a connection's input. Meta
//! commands (`mg ms md ma mn me`) are recognised here and handed, whole, to
//! `memcache_meta::execute`.
//!
//! Contract this relies on: `out` holds only replies not yet written to the socket (true for
//! the TCP loop, which flushes before each batch, for UDP and for the harness). memcached drops
//! all unsent replies when it closes on bad input, on `shutdown`, and on a `get` key over 250
//! bytes, so this executor clears `out` in those cases.
//!
//! What it is not for: protocol byte rules (in `slipstream-proto`), I/O, or buffering — the
//! network loop owns buffers and must let a connection's input grow to one whole storage
//! request (line + item) or, for a multiget line, as far as the connection-buffer budget allows
//! (`bufbudget`; `refuse_unbufferable` answers when it does not).

use crate::exec::{Ctx, Step};
use crate::stats::ThreadStats;
use crate::stats_prefix;
use crate::stats_report::{self, StatsList, StatsView};
use slipstream_proto::rules::KEY_BYTES_MAX;
use slipstream_proto::text::{
    self, compose_end, compose_number, compose_stat, compose_value_line, Keys, Limits, Request, ShutdownMode, StatsCmd,
    StoreCmd, TextErrorKind,
};
use slipstream_proto::Parsed;
use slipstream_store::{ArithOpts, ArithResult, DeleteOpts, DeleteResult, GetOpts, SetMode, StoreOpts, StoreResult};

const BAD_FORMAT: &[u8] = b"CLIENT_ERROR bad command line format\r\n";
/// Most reply bytes one get/gets/gat/gats request may produce, values sent by reference
/// included. memcached streams item memory straight to the socket; we copy small values into
/// the reply buffer and queue large ones by reference (`outq`), so an unbounded multi-get (1 MiB
/// of keys naming 1 MB items) would be unbounded memory or pinning. Past this bound the request
/// is answered with memcached's own line for a get response it cannot allocate. (Each copy is
/// also charged to the connection-buffer budget first, which usually refuses sooner.)
pub const GET_REPLY_BYTES_MAX: usize = 32 * 1024 * 1024;
/// memcached's line for a get response it cannot allocate: past `GET_REPLY_BYTES_MAX`, or when
/// the connection-buffer budget (`bufbudget`) refuses the copy of a value.
pub const GET_REPLY_OOM: &[u8] = b"SERVER_ERROR out of memory writing get response\r\n";
/// Bound on a `VALUE <key> <flags> <bytes> [<cas>]\r\n` line and the value's `\r\n`, key
/// excluded (three numbers of at most 20 digits, spaces, the word).
const VALUE_LINE_BYTES_MAX: usize = 80;

/// The text parser's limits for this connection's store and settings.
fn text_limits(ctx: &Ctx<'_>) -> Limits {
    text_limits_of(ctx.store, ctx.settings)
}

/// The text parser's limits for `store` and `settings` (also what `replicated::route` parses
/// with, so both see the same request).
pub(crate) fn text_limits_of(store: &slipstream_store::Store, settings: &crate::exec::Settings) -> Limits {
    let config = store.config();
    Limits {
        line_bytes_max: settings.line_bytes_max,
        // memcached buffers a get line whatever its length; what bounds it here is the
        // connection-buffer budget (the network loop), so the answer does not depend on how
        // the line was split across reads.
        multiget_line_bytes_max: usize::MAX,
        item: config.item_limits(),
    }
}

/// Handle one text or meta request from the front of `input`, appending its reply to `out`.
pub fn execute(ctx: &mut Ctx<'_>, input: &[u8], out: &mut Vec<u8>) -> Step {
    // Drain the data block of a refused storage command first (memcached's conn_swallow).
    if ctx.conn.swallow_bytes > 0 {
        if input.is_empty() {
            return Step::Incomplete;
        }
        let n = ctx.conn.swallow_bytes.min(input.len());
        ctx.conn.swallow_bytes -= n;
        return Step::Consumed(n);
    }
    let limits = text_limits(ctx);
    match text::parse(input, &limits) {
        Parsed::Incomplete => Step::Incomplete,
        Parsed::Invalid { error, consumed } => {
            match error.kind {
                TextErrorKind::Close => {
                    // memcached closes without writing the replies it still holds.
                    ctx.truncate_reply(out, 0);
                    ctx.conn.udp_marks.clear();
                    return Step::Close;
                }
                // memcached counts the set as soon as the data block is read, before checking it.
                TextErrorKind::BadDataChunk => {
                    ThreadStats::incr(&ctx.stats.cmd_set);
                    stats_prefix::record_set(ctx, text::line_key(input));
                }
                _ => {}
            }
            if let Some(reply) = error.reply() {
                out.extend_from_slice(reply);
            }
            Step::Consumed(consumed)
        }
        Parsed::Complete { request, consumed } => run(ctx, request, consumed, input, out),
    }
}

/// The network loop could not buffer more of the request at the front of `input` (the
/// connection-buffer budget refused; see `bufbudget`). Answer as memcached does when the
/// allocation fails: a storage command whose data block is still arriving gets `SERVER_ERROR
/// out of memory storing object` (unless noreply), its data is swallowed and a `set` unlinks
/// the old item (memcached's process_update_command); anything else gets `SERVER_ERROR out of
/// memory reading request` and the connection closes after it (memcached's try_read_network).
pub fn refuse_unbufferable(ctx: &mut Ctx<'_>, input: &[u8], out: &mut Vec<u8>) -> Step {
    let limits = text_limits(ctx);
    if ctx.conn.swallow_bytes == 0 && ctx.conn.protocol != crate::exec::Protocol::Binary {
        if let Some(p) = text::pending_store(input, &limits) {
            ThreadStats::incr(&ctx.stats.store_no_memory);
            reply(out, p.noreply, b"SERVER_ERROR out of memory storing object\r\n");
            ctx.conn.swallow_bytes = (p.line_bytes + p.block_bytes).saturating_sub(input.len());
            if p.cmd == StoreCmd::Set {
                ctx.store.unlink(p.key);
            }
            return Step::Consumed(input.len().max(1));
        }
        out.extend_from_slice(b"SERVER_ERROR out of memory reading request\r\n");
    }
    Step::Close
}

/// Append `line` unless the command carried `noreply`.
#[inline]
fn reply(out: &mut Vec<u8>, noreply: bool, line: &[u8]) {
    if !noreply {
        out.extend_from_slice(line);
    }
}

fn run(ctx: &mut Ctx<'_>, request: Request<'_>, consumed: usize, input: &[u8], out: &mut Vec<u8>) -> Step {
    match request {
        Request::Get { with_cas, touch_exptime, keys } => get(ctx, with_cas, touch_exptime, keys, out),
        Request::Store { cmd, key, flags, exptime, cas_unique, data, noreply } => {
            store(ctx, cmd, key, flags, exptime, cas_unique, data, noreply, out)
        }
        Request::StoreTooLarge { cmd, key, noreply, swallow_bytes } => {
            store_too_large(ctx, cmd, key, noreply, swallow_bytes, out)
        }
        Request::Delete { key, noreply } => delete(ctx, key, noreply, out),
        Request::Arith { incr, key, delta, noreply } => arith(ctx, incr, key, delta, noreply, out),
        Request::Touch { key, exptime, noreply } => touch(ctx, key, exptime, noreply, out),
        Request::Stats(cmd) => stats(ctx, cmd, out),
        Request::Quit => return Step::Quit,
        Request::Shutdown(mode) => return shutdown(ctx, mode, consumed, out),
        Request::Meta => return crate::memcache_meta::execute(ctx, input, out),
        other => admin(ctx, other, out),
    }
    Step::Consumed(consumed)
}

/// A storage line whose data block is over the item size limit: the block is swallowed.
#[inline]
fn store_too_large(
    ctx: &mut Ctx<'_>,
    cmd: StoreCmd,
    key: &[u8],
    noreply: bool,
    swallow_bytes: usize,
    out: &mut Vec<u8>,
) {
    stats_prefix::record_set(ctx, key);
    ThreadStats::incr(&ctx.stats.store_too_large);
    ctx.log_store(key, store_cmd_name(cmd), StoreResult::TooLarge, 0, 0);
    reply(out, noreply, b"SERVER_ERROR object too large for cache\r\n");
    ctx.conn.swallow_bytes = swallow_bytes;
    // memcached: a failed set must not leave the old value readable.
    if cmd == StoreCmd::Set {
        ctx.log_lookup(key);
        ctx.store.unlink(key);
    }
}

#[inline]
fn delete(ctx: &mut Ctx<'_>, key: &[u8], noreply: bool, out: &mut Vec<u8>) {
    stats_prefix::record_delete(ctx, key);
    ctx.log_lookup(key);
    match ctx.store.delete(key, DeleteOpts::default()) {
        DeleteResult::Deleted => {
            ThreadStats::incr(&ctx.stats.delete_hits);
            reply(out, noreply, b"DELETED\r\n");
        }
        DeleteResult::NotFound | DeleteResult::Exists => {
            ThreadStats::incr(&ctx.stats.delete_misses);
            reply(out, noreply, b"NOT_FOUND\r\n");
        }
    }
}

/// incr/decr.
#[inline]
fn arith(ctx: &mut Ctx<'_>, incr: bool, key: &[u8], delta: u64, noreply: bool, out: &mut Vec<u8>) {
    ctx.log_lookup(key);
    match ctx.store.arith(key, incr, delta, ArithOpts::default()) {
        ArithResult::Ok { value, .. } => {
            ThreadStats::incr(if incr { &ctx.stats.incr_hits } else { &ctx.stats.decr_hits });
            if !noreply {
                compose_number(out, value);
            }
        }
        // Exists needs a CAS, which text incr/decr never sends; treat it as a miss.
        ArithResult::NotFound | ArithResult::Exists => {
            ThreadStats::incr(if incr { &ctx.stats.incr_misses } else { &ctx.stats.decr_misses });
            reply(out, noreply, b"NOT_FOUND\r\n");
        }
        ArithResult::NonNumeric => {
            reply(out, noreply, b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n")
        }
        ArithResult::NoMemory => reply(out, noreply, b"SERVER_ERROR out of memory\r\n"),
    }
}

#[inline]
fn touch(ctx: &mut Ctx<'_>, key: &[u8], exptime: i64, noreply: bool, out: &mut Vec<u8>) {
    ThreadStats::incr(&ctx.stats.cmd_touch);
    ctx.log_lookup(key);
    if ctx.store.touch(key, exptime) {
        ThreadStats::incr(&ctx.stats.touch_hits);
        reply(out, noreply, b"TOUCHED\r\n");
    } else {
        ThreadStats::incr(&ctx.stats.touch_misses);
        reply(out, noreply, b"NOT_FOUND\r\n");
    }
}

/// `shutdown`: refused unless enabled (-A); otherwise close without a reply.
fn shutdown(ctx: &mut Ctx<'_>, mode: ShutdownMode, consumed: usize, out: &mut Vec<u8>) -> Step {
    if !ctx.settings.shutdown_enabled {
        out.extend_from_slice(b"ERROR: shutdown not enabled\r\n");
    } else if mode == ShutdownMode::Invalid {
        out.extend_from_slice(b"CLIENT_ERROR invalid shutdown mode\r\n");
    } else {
        // memcached closes without a reply and without writing the replies it still
        // holds; `shutdown graceful` differs only in how the server drains, which the
        // loop decides.
        ctx.truncate_reply(out, 0);
        ctx.conn.udp_marks.clear();
        return Step::Shutdown;
    }
    Step::Consumed(consumed)
}

/// Admin and misc commands off the hot path: flush_all, version, verbosity, cache_memlimit,
/// fixed admin lines and the LRU crawler. Only ever called with those requests.
fn admin(ctx: &mut Ctx<'_>, request: Request<'_>, out: &mut Vec<u8>) {
    match request {
        Request::FlushAll { delay_s, noreply } => flush_all(ctx, delay_s, noreply, out),
        Request::Version => {
            out.extend_from_slice(b"VERSION ");
            out.extend_from_slice(ctx.settings.version.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        // memcached's verbosity only changes its stderr logging; the level is kept so that
        // `stats settings` reports it, as memcached does.
        Request::Verbosity { level, noreply } => {
            ctx.server.verbosity.store(u64::from(level), std::sync::atomic::Ordering::Relaxed);
            reply(out, noreply, b"OK\r\n")
        }
        Request::CacheMemlimit { megabytes, noreply } => {
            // memcached's own answer when it cannot adjust the limit.
            let line: &[u8] = if ctx.server.cache_memlimit_allowed {
                ctx.store.set_memory_limit((megabytes as usize).saturating_mul(1024 * 1024));
                b"OK\r\n"
            } else {
                b"MEMLIMIT_ADJUST_FAILED out of bounds or unable to adjust\r\n"
            };
            reply(out, noreply, line);
        }
        Request::Admin { line, noreply } => reply(out, noreply, line),
        Request::LruCrawler { metadump, classes } => crate::memcache_admin::lru_crawler(ctx, metadump, classes, out),
        Request::LruCrawlerSwitch { enable } => out.extend_from_slice(ctx.settings.tunables.switch_lru_crawler(enable)),
        Request::Watch { classes, noreply } => {
            let line = crate::memcache_admin::watch(ctx, classes, !out.is_empty());
            reply(out, noreply, line);
        }
        Request::RefreshCerts { noreply } => crate::memcache_admin::refresh_certs(ctx, noreply, out),
        Request::DebugTime(arg) => debug_time(ctx, arg, out),
        // `run` handles every other request itself.
        Request::Get { .. }
        | Request::Store { .. }
        | Request::StoreTooLarge { .. }
        | Request::Delete { .. }
        | Request::Arith { .. }
        | Request::Touch { .. }
        | Request::Stats(_)
        | Request::Quit
        | Request::Shutdown(_)
        | Request::Meta => {}
    }
}

fn flush_all(ctx: &mut Ctx<'_>, delay_s: Option<i64>, noreply: bool, out: &mut Vec<u8>) {
    // memcached counts the command before its permission and argument checks.
    ThreadStats::incr(&ctx.stats.cmd_flush);
    if !ctx.settings.flush_enabled {
        reply(out, noreply, b"CLIENT_ERROR flush_all not allowed\r\n");
    } else if let Some(delay) = delay_s {
        // memcached treats a negative delay like none: flush now.
        ctx.store.flush_all(delay.max(0));
        reply(out, noreply, b"OK\r\n");
    } else {
        reply(out, noreply, b"CLIENT_ERROR invalid exptime argument\r\n");
    }
}

fn get(ctx: &mut Ctx<'_>, with_cas: bool, touch_exptime: Option<i64>, keys: Keys<'_>, out: &mut Vec<u8>) {
    let opts = GetOpts {
        touch_exptime,
        bump: true,
        // get/gets replies are what the kernel fast path reproduces; gat/gats are not.
        kernel_fill: touch_exptime.is_none(),
        ..GetOpts::default()
    };
    let stats = ctx.stats;
    let udp = ctx.conn.transport == crate::exec::Transport::Udp;
    let reply_start = out.len();
    // Values sent by reference count toward the request's reply bytes too.
    let pinned_start = ctx.conn.shared.pinned_bytes();
    for key in keys {
        if out.len() - reply_start + (ctx.conn.shared.pinned_bytes() - pinned_start) > GET_REPLY_BYTES_MAX {
            ctx.truncate_reply(out, reply_start);
            ctx.conn.udp_marks.retain(|&m| m <= reply_start);
            out.extend_from_slice(GET_REPLY_OOM);
            return;
        }
        if udp {
            // memcached answers each key of a UDP multi-get as its own response message.
            ctx.conn.udp_marks.push(out.len());
        }
        if key.len() > KEY_BYTES_MAX {
            // memcached 1.6.18 culls every reply not yet written to the socket — this
            // request's VALUEs and those of earlier requests in the same read batch.
            ctx.truncate_reply(out, 0);
            ctx.conn.udp_marks.clear();
            out.extend_from_slice(BAD_FORMAT);
            return;
        }
        let store = ctx.store;
        let found = store.get(key, opts, |o| match o.item {
            Some(item) => {
                ctx.log_get(key, Ok(item.value.len()));
                // Charge the connection-buffer budget before copying the value out (a large
                // value is sent by reference instead: not copied, not charged).
                let share = ctx.shares_value(item.value.len());
                let copied = if share { 0 } else { item.value.len() };
                if !ctx.reserve_reply(out, VALUE_LINE_BYTES_MAX + key.len() + copied) {
                    return None;
                }
                compose_value_line(out, key, item.flags, item.value.len(), with_cas.then_some(item.cas));
                ctx.put_value(out, share, item.data, item.value);
                out.extend_from_slice(b"\r\n");
                Some(true)
            }
            None => {
                ctx.log_get(key, Err(o.miss));
                Some(false)
            }
        });
        let Some(hit) = found else {
            ctx.truncate_reply(out, reply_start);
            ctx.conn.udp_marks.retain(|&m| m <= reply_start);
            out.extend_from_slice(GET_REPLY_OOM);
            return;
        };
        stats_prefix::record_get(ctx, key, hit);
        if touch_exptime.is_some() {
            // gat/gats count as touches, not gets (memcached's process_get_command).
            ThreadStats::incr(&stats.cmd_touch);
            ThreadStats::incr(if hit { &stats.touch_hits } else { &stats.touch_misses });
        } else {
            ThreadStats::incr(&stats.cmd_get);
            ThreadStats::incr(if hit { &stats.get_hits } else { &stats.get_misses });
        }
    }
    compose_end(out);
}

/// memcached's command names in `item_store` log lines.
fn store_cmd_name(cmd: StoreCmd) -> &'static str {
    match cmd {
        StoreCmd::Set => "set",
        StoreCmd::Add => "add",
        StoreCmd::Replace => "replace",
        StoreCmd::Append => "append",
        StoreCmd::Prepend => "prepend",
        StoreCmd::Cas => "cas",
    }
}

#[allow(clippy::too_many_arguments)]
fn store(
    ctx: &mut Ctx<'_>,
    cmd: StoreCmd,
    key: &[u8],
    flags: u32,
    exptime: i64,
    cas_unique: u64,
    data: &[u8],
    noreply: bool,
    out: &mut Vec<u8>,
) {
    let mode = match cmd {
        StoreCmd::Set => SetMode::Set,
        StoreCmd::Add => SetMode::Add,
        StoreCmd::Replace => SetMode::Replace,
        StoreCmd::Append => SetMode::Append,
        StoreCmd::Prepend => SetMode::Prepend,
        StoreCmd::Cas => SetMode::Cas,
    };
    let opts = StoreOpts { cas: (cmd == StoreCmd::Cas).then_some(cas_unique), ..StoreOpts::default() };
    let stats = ctx.stats;
    stats_prefix::record_set(ctx, key);
    ctx.log_lookup(key);
    let result = ctx.store.store(mode, key, data, flags, exptime, opts);
    ctx.log_store(key, store_cmd_name(cmd), result, exptime, data.len());
    // memcached refuses too-large / out-of-memory items before reading the data, so those are
    // not counted as sets.
    if !matches!(result, StoreResult::TooLarge | StoreResult::NoMemory) {
        ThreadStats::incr(&stats.cmd_set);
    }
    let line: &[u8] = match result {
        StoreResult::Stored(_) => {
            if cmd == StoreCmd::Cas {
                ThreadStats::incr(&stats.cas_hits);
            }
            b"STORED\r\n"
        }
        StoreResult::NotStored => b"NOT_STORED\r\n",
        StoreResult::Exists => {
            ThreadStats::incr(&stats.cas_badval);
            b"EXISTS\r\n"
        }
        StoreResult::NotFound => {
            ThreadStats::incr(&stats.cas_misses);
            b"NOT_FOUND\r\n"
        }
        StoreResult::TooLarge => {
            ThreadStats::incr(&stats.store_too_large);
            if cmd == StoreCmd::Set {
                ctx.store.unlink(key);
            }
            b"SERVER_ERROR object too large for cache\r\n"
        }
        StoreResult::NoMemory => {
            ThreadStats::incr(&stats.store_no_memory);
            if cmd == StoreCmd::Set {
                ctx.store.unlink(key);
            }
            b"SERVER_ERROR out of memory storing object\r\n"
        }
    };
    reply(out, noreply, line);
}

// ---------------------------------------------------------------------------------------------
// stats

/// The `stats` family: the lists come from `stats_report` (shared with the binary protocol);
/// this only frames them as `STAT name value` lines and `END`.
fn stats(ctx: &mut Ctx<'_>, cmd: StatsCmd, out: &mut Vec<u8>) {
    let list = match cmd {
        StatsCmd::General => StatsList::General,
        StatsCmd::Settings => StatsList::Settings,
        StatsCmd::Items => StatsList::Items,
        StatsCmd::Slabs => StatsList::Slabs,
        StatsCmd::Sizes => StatsList::Sizes,
        StatsCmd::Conns => StatsList::Conns { asking_conn_id: ctx.conn.conn_id, asking_udp_peer: ctx.conn.udp_peer },
        // No extstore and no slab classes to dump: memcached prints the same for nothing there.
        StatsCmd::Extstore => return compose_end(out),
        StatsCmd::Cachedump { class, limit } => return crate::memcache_admin::cachedump(ctx, class, limit, out),
        StatsCmd::DetailDump => return ctx.server.prefix_stats.dump(out),
        StatsCmd::Reset => {
            ctx.server.reset();
            ctx.store.reset_stats();
            return out.extend_from_slice(b"RESET\r\n");
        }
        StatsCmd::DetailOn | StatsCmd::DetailOff => {
            ctx.server.prefix_stats.set_enabled(cmd == StatsCmd::DetailOn);
            return out.extend_from_slice(b"OK\r\n");
        }
        StatsCmd::Unknown => return out.extend_from_slice(b"ERROR\r\n"),
    };
    let view = StatsView { server: ctx.server, store: ctx.store, settings: ctx.settings };
    let rows = stats_report::rows(view, list);
    out.reserve(rows.len() * 32 + 5);
    for (name, value) in rows {
        compose_stat(out, &name, &value);
    }
    compose_end(out);
}

/// memcached-debug's `debugtime N|p|r`: move, stop or restart this store's clock. A release
/// memcached does not know the command (`ERROR`), nor does Slipstream without
/// `-o relaxed_privileges`. Refused while the kernel fast path is attached: its copies expire
/// by the real clock, and a clock moved ahead would let it serve items the store calls expired.
fn debug_time(ctx: &mut Ctx<'_>, arg: slipstream_proto::text::DebugTime, out: &mut Vec<u8>) {
    use slipstream_proto::text::DebugTime;
    if !ctx.settings.tunables.debug_commands {
        return out.extend_from_slice(b"ERROR\r\n");
    }
    if ctx.server.fastpath_attached().is_some() {
        return out.extend_from_slice(b"CLIENT_ERROR debugtime is off while the kernel fast path is attached\r\n");
    }
    let clock = ctx.store.clock();
    match arg {
        DebugTime::Shift(s) => clock.debug_shift(s),
        DebugTime::Pause => clock.debug_pause(true),
        DebugTime::Resume => clock.debug_pause(false),
        DebugTime::Invalid => return out.extend_from_slice(b"ERROR\r\n"),
    }
    out.extend_from_slice(b"OK\r\n");
}

#[cfg(test)]
mod tests {
    use crate::exec::Settings;
    use crate::harness::Harness;

    fn h() -> Harness {
        Harness::small()
    }

    /// Feed `input` whole and assert the exact reply.
    fn check(h: &mut Harness, input: &[u8], want: &[u8]) {
        let got = h.feed(input);
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(want),
            "input {:?}",
            String::from_utf8_lossy(input)
        );
    }

    #[test]
    fn cache_memlimit_sets_the_store_limit_unless_refused() {
        let mut h = h();
        check(
            &mut h,
            b"cache_memlimit 16\r\ncache_memlimit 7\r\n",
            b"OK\r\nMEMLIMIT_TOO_SMALL cannot set maxbytes to less than 8m\r\n",
        );
        assert_eq!(h.store.memory_bytes_max(), 16 << 20);
        check(&mut h, b"cache_memlimit 9 noreply\r\n", b"");
        assert_eq!(h.store.memory_bytes_max(), 9 << 20);
        // A named tenant's port: the admin endpoint owns the limit.
        h.info.cache_memlimit_allowed = false;
        check(&mut h, b"cache_memlimit 32\r\n", b"MEMLIMIT_ADJUST_FAILED out of bounds or unable to adjust\r\n");
        assert_eq!(h.store.memory_bytes_max(), 9 << 20);
    }

    #[test]
    fn stats_detail_counts_with_the_configured_delimiter() {
        let mut h = h();
        h.settings.prefix_delimiter = b'|';
        check(
            &mut h,
            b"stats detail on\r\nset a|1 0 0 1\r\nx\r\nset a:1 0 0 1\r\nx\r\nget a|1 a|2\r\n",
            b"OK\r\nSTORED\r\nSTORED\r\nVALUE a|1 0 1\r\nx\r\nEND\r\n",
        );
        check(&mut h, b"stats detail dump\r\n", b"PREFIX a get 2 hit 1 set 1 del 0\r\nEND\r\n");
        let settings = String::from_utf8(h.feed(b"stats settings\r\n")).unwrap();
        assert!(settings.contains("STAT stat_key_prefix |\r\nSTAT detail_enabled yes\r\n"), "{settings}");
    }

    #[test]
    fn multiget_reply_is_bounded_with_memcacheds_oom_line() {
        use slipstream_store::{Clock, StoreConfig};
        let cfg = StoreConfig { memory_bytes_max: 64 << 20, shards: 4, ..StoreConfig::default() };
        let mut h = Harness::new(cfg, Clock::manual(1_700_000_000));
        let value = vec![b'v'; 1_000_000];
        let mut set = b"set big 0 0 1000000\r\n".to_vec();
        set.extend_from_slice(&value);
        set.extend_from_slice(b"\r\n");
        check(&mut h, &set, b"STORED\r\n");
        // 40 copies of a 1 MB item would be 40 MB of reply: over the bound.
        let mut get = b"get".to_vec();
        for _ in 0..40 {
            get.extend_from_slice(b" big");
        }
        get.extend_from_slice(b"\r\nget nothing\r\n");
        check(&mut h, &get, b"SERVER_ERROR out of memory writing get response\r\nEND\r\n");
        // Under the bound the same item is served as often as asked.
        let out = h.feed(b"get big big big\r\n");
        assert_eq!(out.len(), 3 * (b"VALUE big 0 1000000\r\n".len() + 1_000_002) + 5);
    }

    /// Text and meta gets of a large value (sent by reference) read the same as copies, and a
    /// value replaced while its reply is queued goes out as it was when the get ran.
    #[test]
    fn large_values_by_reference_read_like_copies() {
        let mut h = h();
        let value: Vec<u8> = (0..50_000u32).map(|i| b'a' + (i % 26) as u8).collect();
        let set = [&b"set big 5 0 50000\r\n"[..], &value, b"\r\n"].concat();
        check(&mut h, &set, b"STORED\r\n");
        let out = h.feed(b"get big\r\nmg big s v f\r\nmg big s\r\n");
        let want =
            [&b"VALUE big 5 50000\r\n"[..], &value, b"\r\nEND\r\nVA 50000 s50000 f5\r\n", &value, b"\r\nHD s50000\r\n"]
                .concat();
        assert!(out == want, "reply differs from the copied form");
        // Queue a get, then replace the value in place-sized form before the reply is written.
        let mut ctx = crate::exec::Ctx {
            store: &h.store,
            stats: &h.stats,
            settings: &h.settings,
            server: &h.info,
            conn: &mut h.conn,
        };
        let mut out = Vec::new();
        assert!(matches!(super::execute(&mut ctx, b"get big\r\n", &mut out), crate::exec::Step::Consumed(_)));
        let other = vec![b'z'; 50_000];
        let set2 = [&b"set big 5 0 50000\r\n"[..], &other, b"\r\n"].concat();
        assert!(matches!(super::execute(&mut ctx, &set2, &mut out), crate::exec::Step::Consumed(_)));
        assert!(matches!(super::execute(&mut ctx, b"get big\r\n", &mut out), crate::exec::Step::Consumed(_)));
        let mut spliced = Vec::new();
        let mut start = 0;
        assert!(crate::outq::write_pending(&mut spliced, &out, &mut start, &mut h.conn.shared, |_| ()).unwrap());
        let want = [
            &b"VALUE big 5 50000\r\n"[..],
            &value,
            b"\r\nEND\r\nSTORED\r\nVALUE big 5 50000\r\n",
            &other,
            b"\r\nEND\r\n",
        ]
        .concat();
        assert!(spliced == want, "a queued value changed under its reply");
    }

    #[test]
    fn get_replies_are_charged_to_the_connection_buffer_budget() {
        use crate::bufbudget::{BufBudget, REPLY_BYTES_FREE};
        use std::sync::Arc;
        let mut h = h();
        let budget = Arc::new(BufBudget::new(300_000));
        h.settings.conn_buf = budget.clone();
        // Large values go out by reference: served however many, never charged.
        let mut set = b"set big 0 0 100000\r\n".to_vec();
        set.extend_from_slice(&[b'b'; 100_000]);
        set.extend_from_slice(b"\r\nset v 0 0 10000\r\n");
        set.extend_from_slice(&[b'v'; 10_000]);
        set.extend_from_slice(b"\r\n");
        check(&mut h, &set, b"STORED\r\nSTORED\r\n");
        let out = h.feed(b"get big big big big big\r\n");
        let one = [&b"VALUE big 0 100000\r\n"[..], &[b'b'; 100_000], b"\r\n"].concat();
        assert_eq!(out, [one.repeat(5), b"END\r\n".to_vec()].concat());
        assert_eq!(budget.used_bytes(), 0);
        // Small values are copied: within the free part plus the budget, served and charged.
        let out = h.feed(b"get v v v v v v v v v v\r\n");
        assert_eq!(out.len(), 10 * (b"VALUE v 0 10000\r\n".len() + 10_002) + 5);
        assert!(budget.used_bytes() > 0 && budget.used_bytes() <= 300_000);
        // Beyond it: memcached's line for a get response it cannot allocate. (The harness never
        // flushes, so the charge of the first reply is still held.)
        let get40 = [&b"get"[..], &b" v".repeat(40), b"\r\n"].concat();
        check(&mut h, &get40, b"SERVER_ERROR out of memory writing get response\r\n");
        assert!(budget.refused() > 0);
        // Small replies never touch the budget.
        let used = budget.used_bytes();
        let mut small = Harness::small();
        small.settings.conn_buf = budget.clone();
        check(&mut small, b"set s 0 0 1\r\nx\r\nget s\r\n", b"STORED\r\nVALUE s 0 1\r\nx\r\nEND\r\n");
        assert_eq!(budget.used_bytes(), used);
        const { assert!(REPLY_BYTES_FREE < 300_000) };
    }

    #[test]
    fn an_unbufferable_request_is_refused_like_memcached() {
        use crate::exec::Ctx;
        let mut h = h();
        check(&mut h, b"set k 0 0 1\r\nx\r\n", b"STORED\r\n");
        let mut out = Vec::new();
        let input = b"set k 0 0 10\r\nabc";
        let step = {
            let mut ctx =
                Ctx { store: &h.store, stats: &h.stats, settings: &h.settings, server: &h.info, conn: &mut h.conn };
            super::refuse_unbufferable(&mut ctx, input, &mut out)
        };
        assert_eq!(step, crate::exec::Step::Consumed(input.len()));
        assert_eq!(out, b"SERVER_ERROR out of memory storing object\r\n");
        // The rest of the data block (7 value bytes and \r\n) is swallowed; the old value is gone.
        check(&mut h, b"defghij\r\nget k\r\n", b"END\r\n");
        assert_eq!(stat(&mut h, "store_no_memory"), 1);
        // Anything else: memcached's "out of memory reading request", then close.
        let mut out = Vec::new();
        let step = {
            let mut ctx =
                Ctx { store: &h.store, stats: &h.stats, settings: &h.settings, server: &h.info, conn: &mut h.conn };
            super::refuse_unbufferable(&mut ctx, b"get aaaa bbbb", &mut out)
        };
        assert_eq!(step, crate::exec::Step::Close);
        assert_eq!(out, b"SERVER_ERROR out of memory reading request\r\n");
    }

    fn stat(h: &mut Harness, name: &str) -> u64 {
        let out = h.feed(b"stats\r\n");
        let text = String::from_utf8_lossy(&out).into_owned();
        for line in text.lines() {
            let mut it = line.split(' ');
            if it.next() == Some("STAT") && it.next() == Some(name) {
                return it.next().and_then(|v| v.parse().ok()).unwrap_or(u64::MAX);
            }
        }
        panic!("no stat {name} in {text}");
    }

    #[test]
    fn set_get_gets_and_storage_words() {
        let mut h = h();
        check(&mut h, b"set a 5 0 3\r\nabc\r\n", b"STORED\r\n");
        check(&mut h, b"get a\r\n", b"VALUE a 5 3\r\nabc\r\nEND\r\n");
        check(&mut h, b"get a b a\r\n", b"VALUE a 5 3\r\nabc\r\nVALUE a 5 3\r\nabc\r\nEND\r\n");
        check(&mut h, b"get zz\r\n", b"END\r\n");
        let out = h.feed(b"gets a\r\n");
        let s = String::from_utf8(out).unwrap();
        let cas: u64 = s.lines().next().unwrap().rsplit(' ').next().unwrap().parse().unwrap();
        check(&mut h, format!("cas a 0 0 1 {}\r\nx\r\n", cas + 1000).as_bytes(), b"EXISTS\r\n");
        check(&mut h, format!("cas a 0 0 1 {cas}\r\nx\r\n").as_bytes(), b"STORED\r\n");
        check(&mut h, b"cas zz 0 0 1 5\r\nx\r\n", b"NOT_FOUND\r\n");
        check(&mut h, b"add a 0 0 1\r\ny\r\n", b"NOT_STORED\r\n");
        check(&mut h, b"replace zz 0 0 1\r\ny\r\n", b"NOT_STORED\r\n");
        check(&mut h, b"append zz 0 0 1\r\ny\r\n", b"NOT_STORED\r\n");
        check(&mut h, b"prepend a 0 0 1\r\nP\r\nappend a 0 0 1\r\nA\r\n", b"STORED\r\nSTORED\r\n");
        check(&mut h, b"get a\r\n", b"VALUE a 0 3\r\nPxA\r\nEND\r\n");
        check(&mut h, b"set e 0 0 0\r\n\r\nget e\r\n", b"STORED\r\nVALUE e 0 0\r\n\r\nEND\r\n");
        check(&mut h, b"set f 4294967296 0 1\r\nx\r\nget f\r\n", b"STORED\r\nVALUE f 0 1\r\nx\r\nEND\r\n");
        assert_eq!(stat(&mut h, "cas_badval"), 1);
        assert_eq!(stat(&mut h, "cas_hits"), 1);
        assert_eq!(stat(&mut h, "cas_misses"), 1);
        assert_eq!(stat(&mut h, "cmd_set"), 11);
        assert_eq!(stat(&mut h, "cmd_get"), 9);
        assert_eq!(stat(&mut h, "get_hits"), 7);
        assert_eq!(stat(&mut h, "get_misses"), 2);
    }

    #[test]
    fn noreply_suppresses_everything() {
        let mut h = h();
        check(&mut h, b"set a 0 0 1 noreply\r\nx\r\nget a\r\n", b"VALUE a 0 1\r\nx\r\nEND\r\n");
        check(&mut h, b"add a 0 0 1 noreply\r\nx\r\ndelete a noreply\r\ndelete a 0 noreply\r\n", b"");
        check(&mut h, b"delete a 1 noreply\r\nincr a abc noreply\r\ntouch a abc noreply\r\n", b"");
        check(&mut h, b"set a 0 abc 1 noreply\r\nx\r\nversion\r\n", b"ERROR\r\nVERSION 1.6.18-slipstream-0.1.0\r\n");
        check(&mut h, b"set a 0 0 1 noreply\r\nxyz\r\nget a\r\n", b"ERROR\r\nEND\r\n");
        check(&mut h, b"flush_all noreply\r\nflush_all 0 noreply\r\nverbosity 1 noreply\r\nverbosity noreply\r\n", b"");
        check(&mut h, b"set n 0 0 1\r\n5\r\nincr n 1 noreply\r\nget n\r\n", b"STORED\r\nVALUE n 0 1\r\n6\r\nEND\r\n");
    }

    #[test]
    fn error_resynchronisation() {
        let mut h = h();
        check(&mut h, b"set a 0 0 1\r\nx\r\n", b"STORED\r\n");
        // Bad command line: the data line is read as a command.
        check(
            &mut h,
            b"set a 0 0 -1\r\nget a\r\n",
            b"CLIENT_ERROR bad command line format\r\nVALUE a 0 1\r\nx\r\nEND\r\n",
        );
        check(&mut h, b"set a -1 0 1\r\nx\r\n", b"CLIENT_ERROR bad command line format\r\nERROR\r\n");
        check(&mut h, b"set a 0 0\r\nx\r\n", b"ERROR\r\nERROR\r\n");
        check(&mut h, b"cas a 0 0 1\r\nx\r\n", b"ERROR\r\nERROR\r\n");
        let long = [b"set ".as_slice(), &[b'k'; 251], b" 0 0 1\r\nx\r\n"].concat();
        check(&mut h, &long, b"CLIENT_ERROR bad command line format\r\nERROR\r\n");
        // Bad data chunk: exactly vlen+2 bytes go, the rest is the next command; old value kept.
        check(
            &mut h,
            b"set a 0 0 1\r\nxyz\r\nget a\r\n",
            b"CLIENT_ERROR bad data chunk\r\nERROR\r\nVALUE a 0 1\r\nx\r\nEND\r\n",
        );
        check(
            &mut h,
            b"set a 0 0 1\r\nabcdef get a\r\nget a\r\n",
            b"CLIENT_ERROR bad data chunk\r\nERROR\r\nVALUE a 0 1\r\nx\r\nEND\r\n",
        );
        check(
            &mut h,
            b"set a 0 0 1\r\nx\r\r\nget a\r\n",
            b"CLIENT_ERROR bad data chunk\r\nERROR\r\nVALUE a 0 1\r\nx\r\nEND\r\n",
        );
        check(&mut h, b"\r\n\nx\r\nGET a\r\nmisbehave\r\n", b"ERROR\r\nERROR\r\nERROR\r\nERROR\r\nERROR\r\n");
    }

    #[test]
    fn too_large_swallows_and_unlinks_for_set() {
        let mut h = h();
        check(&mut h, b"set b 0 0 1\r\ny\r\n", b"STORED\r\n");
        let big = vec![b'x'; 2_000_000];
        let req = [b"add b 0 0 2000000\r\n".as_slice(), &big, b"\r\nget b\r\n"].concat();
        check(&mut h, &req, b"SERVER_ERROR object too large for cache\r\nVALUE b 0 1\r\ny\r\nEND\r\n");
        // The data may arrive in pieces after the refusal.
        assert_eq!(h.feed(b"set b 0 0 2000000\r\n"), b"SERVER_ERROR object too large for cache\r\n");
        for chunk in big.chunks(300_000) {
            assert_eq!(h.feed(chunk), b"");
        }
        check(&mut h, b"\r\nget b\r\n", b"END\r\n");
        check(&mut h, b"set b 0 0 1\r\ny\r\nset b 0 0 2000000 noreply\r\n", b"STORED\r\n");
        check(&mut h, &[big.as_slice(), b"\r\nget b\r\n"].concat(), b"END\r\n");
        assert_eq!(stat(&mut h, "store_too_large"), 3);
    }

    #[test]
    fn delete_incr_decr_touch() {
        let mut h = h();
        check(&mut h, b"set a 0 0 1\r\nx\r\n", b"STORED\r\n");
        check(&mut h, b"delete a 0\r\ndelete a\r\ndelete a 5\r\ndelete b x y z\r\n",
            b"DELETED\r\nNOT_FOUND\r\nCLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\nERROR\r\n");
        check(&mut h, b"incr n 1\r\nset n 0 0 2\r\n10\r\nincr n 5\r\ndecr n 100\r\nincr n -1\r\nincr n abc\r\nincr n\r\nincr n 18446744073709551615\r\nincr n 18446744073709551616\r\n",
            b"NOT_FOUND\r\nSTORED\r\n15\r\n0\r\nCLIENT_ERROR invalid numeric delta argument\r\nCLIENT_ERROR invalid numeric delta argument\r\nERROR\r\n18446744073709551615\r\nCLIENT_ERROR invalid numeric delta argument\r\n");
        check(&mut h, b"incr n 1\r\n", b"0\r\n");
        check(
            &mut h,
            b"set t 0 0 2\r\nab\r\nincr t 1\r\ndecr zz 1\r\n",
            b"STORED\r\nCLIENT_ERROR cannot increment or decrement non-numeric value\r\nNOT_FOUND\r\n",
        );
        check(
            &mut h,
            b"touch t 10\r\ntouch zz 10\r\ntouch t abc\r\ntouch t\r\n",
            b"TOUCHED\r\nNOT_FOUND\r\nCLIENT_ERROR invalid exptime argument\r\nERROR\r\n",
        );
        check(&mut h, b"gat 100 t zz\r\n", b"VALUE t 0 2\r\nab\r\nEND\r\n");
        let out = String::from_utf8(h.feed(b"gats 100 t\r\n")).unwrap();
        assert!(out.starts_with("VALUE t 0 2 ") && out.ends_with("\r\nab\r\nEND\r\n"), "{out}");
        check(&mut h, b"gat abc t\r\ngat 10\r\n", b"CLIENT_ERROR invalid exptime argument\r\nEND\r\n");
        assert_eq!(stat(&mut h, "delete_hits"), 1);
        assert_eq!(stat(&mut h, "delete_misses"), 1);
        assert_eq!(stat(&mut h, "incr_hits"), 3);
        assert_eq!(stat(&mut h, "incr_misses"), 1);
        assert_eq!(stat(&mut h, "decr_hits"), 1);
        assert_eq!(stat(&mut h, "decr_misses"), 1);
        assert_eq!(stat(&mut h, "cmd_touch"), 5);
        assert_eq!(stat(&mut h, "touch_hits"), 3);
        assert_eq!(stat(&mut h, "touch_misses"), 2);
        assert_eq!(stat(&mut h, "cmd_get"), 0);
    }

    #[test]
    fn gat_reply_details() {
        let mut h = h();
        check(&mut h, b"set t 3 0 2\r\nab\r\n", b"STORED\r\n");
        let out = String::from_utf8(h.feed(b"gats 100 t zz\r\n")).unwrap();
        assert!(out.starts_with("VALUE t 3 2 ") && out.ends_with("\r\nab\r\nEND\r\n"), "{out}");
        check(&mut h, b"gat abc t\r\ngat 10\r\n", b"CLIENT_ERROR invalid exptime argument\r\nEND\r\n");
        // gat -1 returns the item, which then expires.
        check(&mut h, b"gat -1 t\r\nget t\r\n", b"VALUE t 3 2\r\nab\r\nEND\r\nEND\r\n");
    }

    #[test]
    fn get_key_too_long_drops_earlier_values() {
        let mut h = h();
        check(&mut h, b"set a 0 0 1\r\nx\r\n", b"STORED\r\n");
        let keys: Vec<u8> = (0..40).flat_map(|_| b" a".to_vec()).collect();
        let req = [b"get".as_slice(), &keys, b" ", &[b'k'; 251], b"\r\nget a\r\n"].concat();
        check(&mut h, &req, b"CLIENT_ERROR bad command line format\r\nVALUE a 0 1\r\nx\r\nEND\r\n");
        let ok250 = [b"get ".as_slice(), &[b'k'; 250], b"\r\n"].concat();
        check(&mut h, &ok250, b"END\r\n");
        // Many keys (memcached works in 24-token chunks; replies are identical).
        let many = [b"get".as_slice(), &keys, b"\r\n"].concat();
        check(
            &mut h,
            &many,
            &b"VALUE a 0 1\r\nx\r\n".repeat(40).into_iter().chain(b"END\r\n".iter().copied()).collect::<Vec<u8>>(),
        );
    }

    #[test]
    fn unsent_replies_are_culled_like_memcached() {
        let mut h = h();
        let req = [b"version\r\nget ".as_slice(), &[b'k'; 251], b"\r\nversion\r\n"].concat();
        check(&mut h, &req, b"CLIENT_ERROR bad command line format\r\nVERSION 1.6.18-slipstream-0.1.0\r\n");
        check(&mut h, b"version\r\nGET / HTTP/1.0\r\n", b"");
        assert!(h.closed);
        let mut h = self::h();
        h.settings.shutdown_enabled = true;
        check(&mut h, b"version\r\nshutdown\r\n", b"");
        assert!(h.shutdown);
    }

    #[test]
    fn flush_version_verbosity_quit_shutdown() {
        let mut h = h();
        check(&mut h, b"set a 0 0 1\r\nx\r\nflush_all\r\nget a\r\n", b"STORED\r\nOK\r\nEND\r\n");
        check(
            &mut h,
            b"flush_all 0\r\nflush_all abc\r\nflush_all 1 2 3\r\nflush_all -1\r\n",
            b"OK\r\nCLIENT_ERROR invalid exptime argument\r\nERROR\r\nOK\r\n",
        );
        check(
            &mut h,
            b"version\r\nverbosity 1\r\nverbosity\r\nverbosity abc\r\n",
            b"VERSION 1.6.18-slipstream-0.1.0\r\nOK\r\nERROR\r\nCLIENT_ERROR bad command line format\r\n",
        );
        check(
            &mut h,
            b"shutdown\r\nshutdown graceful\r\nshutdown foo\r\n",
            b"ERROR: shutdown not enabled\r\nERROR: shutdown not enabled\r\nERROR: shutdown not enabled\r\n",
        );
        assert_eq!(stat(&mut h, "cmd_flush"), 4);
        check(&mut h, b"quit\r\nget a\r\n", b"");
        assert!(h.closed);

        let mut h2 = h2_with(Settings { shutdown_enabled: true, flush_enabled: false, ..Settings::default() });
        check(
            &mut h2,
            b"flush_all\r\nflush_all noreply\r\nshutdown foo\r\n",
            b"CLIENT_ERROR flush_all not allowed\r\nCLIENT_ERROR invalid shutdown mode\r\n",
        );
        check(&mut h2, b"shutdown graceful\r\nversion\r\n", b"");
        assert!(h2.shutdown);
    }

    fn h2_with(settings: Settings) -> Harness {
        let mut h = h();
        h.settings = settings;
        h
    }

    #[test]
    fn long_lines_close_unless_multiget() {
        let mut h = h();
        check(&mut h, &[b'x'; 2048], b"");
        assert!(!h.closed);
        check(&mut h, b"x", b"");
        assert!(h.closed);
        let mut h = self::h();
        let mg = [b"get ".as_slice(), &b"a ".repeat(1500)].concat();
        check(&mut h, &mg, b"");
        check(&mut h, b"\r\n", b"END\r\n");
        assert!(!h.closed);
        let mut h = self::h();
        check(&mut h, b"foo HTTP/1.1\r\nversion\r\n", b"");
        assert!(h.closed);
    }

    #[test]
    fn stats_family() {
        let mut h = h();
        let out = String::from_utf8(h.feed(b"stats\r\n")).unwrap();
        let names: Vec<&str> =
            out.lines().filter_map(|l| l.strip_prefix("STAT ")).map(|l| l.split(' ').next().unwrap()).collect();
        assert_eq!(&names[..6], &["pid", "uptime", "time", "version", "libevent", "pointer_size"]);
        assert!(names.contains(&"curr_items") && names.contains(&"evictions") && names.contains(&"rusage_user"));
        // memcached's 92; Slipstream's `fastpath_*` only while the kernel fast path is attached.
        assert_eq!(names.len(), 92);
        assert_eq!(names[91], "lru_bumps_dropped");
        assert!(out.ends_with("END\r\n"));
        assert!(out.contains("STAT version 1.6.18-slipstream-0.1.0\r\n"));
        let settings = String::from_utf8(h.feed(b"stats settings\r\n")).unwrap();
        assert!(
            settings.starts_with("STAT maxbytes 8388608\r\n") && settings.contains("STAT item_size_max 1048576\r\n")
        );
        check(&mut h, b"stats items\r\n", b"END\r\n");
        check(&mut h, b"set a 0 0 1\r\nx\r\n", b"STORED\r\n");
        let items = String::from_utf8(h.feed(b"stats items\r\n")).unwrap();
        assert!(items.starts_with("STAT items:1:number 1\r\n") && items.ends_with("END\r\n"));
        let slabs = String::from_utf8(h.feed(b"stats slabs\r\n")).unwrap();
        assert!(slabs.contains("STAT active_slabs 1\r\n") && slabs.ends_with("END\r\n"));
        check(&mut h, b"stats sizes\r\n", b"STAT sizes_status disabled\r\nEND\r\n");
        check(
            &mut h,
            b"stats foo\r\nstats detail\r\nstats detail on\r\nstats detail dump\r\nstats detail off\r\n",
            b"ERROR\r\nCLIENT_ERROR usage: stats detail on|off|dump\r\nOK\r\nEND\r\nOK\r\n",
        );
        check(&mut h, b"get a\r\n", b"VALUE a 0 1\r\nx\r\nEND\r\n");
        assert_eq!(stat(&mut h, "get_hits"), 1);
        check(&mut h, b"stats reset\r\n", b"RESET\r\n");
        assert_eq!(stat(&mut h, "get_hits"), 0);
        assert_eq!(stat(&mut h, "curr_items"), 1);
    }

    #[test]
    fn every_split_point_gives_the_same_replies() {
        let script: &[u8] = b"set a 1 0 5\r\nhello\r\nget a b\r\nappend a 0 0 1\r\n!\r\ngets zz\r\n\
            incr a 1\r\nset n 0 0 2\r\n41\r\nincr n 1\r\ndecr n 2\r\ntouch a 10\r\ngat 5 a\r\n\
            delete a 0\r\nset a 0 0 1\r\nxyz\r\nset a 0 0 -1\r\nflush_all\r\nget n\r\nversion\r\nbogus\r\n\
            set big 0 0 2000000\r\n";
        let mut whole = h();
        let want = whole.feed(script);
        assert!(!want.is_empty());
        for cut in 0..=script.len() {
            let mut h = h();
            let mut got = h.feed(&script[..cut]);
            got.extend(h.feed(&script[cut..]));
            assert_eq!(String::from_utf8_lossy(&got), String::from_utf8_lossy(&want), "split at {cut}");
        }
        // And byte by byte.
        let mut h = h();
        let mut got = Vec::new();
        for b in script {
            got.extend(h.feed(std::slice::from_ref(b)));
        }
        assert_eq!(String::from_utf8_lossy(&got), String::from_utf8_lossy(&want));
    }

    #[test]
    fn swallow_drains_first() {
        let mut h = h();
        h.conn.swallow_bytes = 5;
        check(&mut h, b"abc", b"");
        assert_eq!(h.conn.swallow_bytes, 2);
        check(&mut h, b"de\r\nversion\r\n", b"ERROR\r\nVERSION 1.6.18-slipstream-0.1.0\r\n");
        assert_eq!(h.conn.swallow_bytes, 0);
    }
}

#[cfg(test)]
mod bench {
    use crate::harness::Harness;
    use std::time::Instant;

    /// Rough cost of the text path (parse + store + compose) per request; run with
    /// `cargo test --release -p slipstream-server --lib memcache_text::bench -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn text_path_ns_per_request() {
        let mut h = Harness::small();
        h.feed(b"set key:000001 0 0 32\r\n01234567890123456789012345678901\r\n");
        let batch_gets = b"get key:000001\r\n".repeat(1000);
        let batch_sets = b"set key:000002 0 0 32\r\n01234567890123456789012345678901\r\n".repeat(1000);
        for (name, batch) in [("get", &batch_gets), ("set", &batch_sets)] {
            let start = Instant::now();
            let rounds = 200;
            for _ in 0..rounds {
                let out = h.feed(batch);
                assert!(!out.is_empty());
            }
            let ns = start.elapsed().as_nanos() as f64 / (rounds * 1000) as f64;
            println!("{name}: {ns:.0} ns/request");
        }
    }
}
