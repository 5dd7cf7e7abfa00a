//! memcached's classic text protocol (memcached 1.6.18 byte-exact): request parsing and reply
//! composition.
//!
//! What it is for: `parse` reads one request from the front of a connection's input and returns
//! it with borrowed keys and data (no allocation), or says more bytes are needed, or says how
//! memcached answers the bytes (`TextError`). The composers append reply bytes to a `Vec<u8>`.
//!
//! What it is not for: executing requests (that is `slipstream-server`'s `memcache_text`), the
//! meta commands (`mg ms md ma mn me` are only *recognised* here, as `Request::Meta`, so the
//! server can hand the input to the meta parser), or I/O.
//!
//! The line, tokenizer, number and item-size rules are memcached's, shared with the other
//! protocols in `crate::rules`. Rules of this protocol (all checked against memcached 1.6.18):
//! - At most `rules::TOKENS_MAX` tokens are looked at; `get`-family keys beyond that are still
//!   all read, in order, as memcached re-tokenizes the rest of the line.
//! - No `\n` within `line_bytes_max` (2048) bytes closes the connection without a reply, unless
//!   the line starts (after at most 100 spaces) with `get ` or `gets ` — a large multiget, which
//!   memcached buffers whatever its length (try_read_command_ascii). `Limits::
//!   multiget_line_bytes_max` can bound it; the server leaves it unbounded and bounds the buffer
//!   by memory instead, so the answer never depends on how the line was split across reads.
//! - A storage command whose item would exceed the item size limit is refused at once, before
//!   its data arrives: the caller swallows `vlen + 2` bytes (`Request::StoreTooLarge`).
//! - A data block not followed by `\r\n` is `CLIENT_ERROR bad data chunk`; exactly `vlen + 2`
//!   bytes after the line are consumed and whatever follows is read as the next command.
//! - After `CLIENT_ERROR bad command line format` on a storage command only the line is
//!   consumed: the data block is then read as a command (typically answering `ERROR`).

use crate::rules::{
    request_line, safe_strtol, safe_strtoll, safe_strtoul, safe_strtoull, ItemLimits, Tokens, Words, DATA_BYTES_MAX,
    KEY_BYTES_MAX, LINE_BYTES_MAX,
};
use crate::Parsed;

/// An over-long line may start with at most this many spaces and still count as a multiget.
pub const LINE_LEADING_SPACES_MAX: usize = 100;
/// Default bound on a multiget line that has no newline yet (memcached: unbounded).
pub const MULTIGET_LINE_BYTES_MAX_DEFAULT: usize = 1 << 20;

/// Limits the parser enforces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// A line without `\n` longer than this closes the connection (memcached: 2048), unless it
    /// is a multiget.
    pub line_bytes_max: usize,
    /// A multiget line without `\n` longer than this closes the connection.
    pub multiget_line_bytes_max: usize,
    /// memcached `-I` and `-C`: which storage commands are refused as too large.
    pub item: ItemLimits,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            line_bytes_max: LINE_BYTES_MAX,
            multiget_line_bytes_max: MULTIGET_LINE_BYTES_MAX_DEFAULT,
            item: ItemLimits::default(),
        }
    }
}

/// The storage commands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreCmd {
    Set,
    Add,
    Replace,
    Append,
    Prepend,
    Cas,
}

/// `shutdown` variants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShutdownMode {
    /// `shutdown`
    Now,
    /// `shutdown graceful`
    Graceful,
    /// anything else: `CLIENT_ERROR invalid shutdown mode` (when shutdown is enabled).
    Invalid,
}

/// `stats` subcommands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatsCmd {
    General,
    Reset,
    Settings,
    Items,
    Slabs,
    Sizes,
    Conns,
    Extstore,
    DetailOn,
    DetailOff,
    DetailDump,
    /// `stats cachedump <class> <limit>` with valid numbers (class < 64).
    Cachedump {
        class: u32,
        limit: u32,
    },
    /// Unknown subcommand: `ERROR`.
    Unknown,
}

/// Keys of a `get`-family request: the rest of the line's words, read lazily (no allocation).
pub type Keys<'a> = Words<'a>;

/// One text-protocol request. Keys and data borrow from the input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request<'a> {
    /// `get`, `gets`, `gat`, `gats`, `bget`. Keys may be longer than `KEY_BYTES_MAX`: memcached
    /// looks keys up in order and only fails (dropping the replies so far) when it reaches such
    /// a key, so the caller checks each key.
    Get {
        with_cas: bool,
        touch_exptime: Option<i64>,
        keys: Keys<'a>,
    },
    /// A storage command with its complete, well-terminated data block.
    Store {
        cmd: StoreCmd,
        key: &'a [u8],
        flags: u32,
        exptime: i64,
        /// Only meaningful for `cas`.
        cas_unique: u64,
        data: &'a [u8],
        noreply: bool,
    },
    /// A storage command whose item is too large; only the line is consumed. The caller
    /// answers `SERVER_ERROR object too large for cache` (unless noreply), swallows
    /// `swallow_bytes` input bytes, and for `set` unlinks the existing item.
    StoreTooLarge {
        cmd: StoreCmd,
        key: &'a [u8],
        noreply: bool,
        swallow_bytes: usize,
    },
    Delete {
        key: &'a [u8],
        noreply: bool,
    },
    Arith {
        incr: bool,
        key: &'a [u8],
        delta: u64,
        noreply: bool,
    },
    Touch {
        key: &'a [u8],
        exptime: i64,
        noreply: bool,
    },
    /// `flush_all [delay] [noreply]`. `delay_s` is None when the delay is not a number
    /// (memcached answers `CLIENT_ERROR invalid exptime argument`, but only after its
    /// flush-disabled check, so the caller decides).
    FlushAll {
        delay_s: Option<i64>,
        noreply: bool,
    },
    Version,
    Verbosity {
        level: u32,
        noreply: bool,
    },
    Stats(StatsCmd),
    Quit,
    Shutdown(ShutdownMode),
    /// A meta command (`mg ms md ma mn me`): hand the whole input to the meta parser.
    Meta,
    /// `cache_memlimit <megabytes> [noreply]` with a value memcached accepts (8 to
    /// 1,000,000,000): set the memory limit to this many MiB, answer `OK`. Refused values are
    /// `Admin` with memcached's line.
    CacheMemlimit {
        megabytes: u32,
        noreply: bool,
    },
    /// An administrative command whose memcached answer follows from its arguments alone
    /// (`cache_memlimit` errors, `slabs automove`, `lru_crawler` tuning): send `line` unless
    /// noreply. Slipstream accepts these for compatibility without changing its own behaviour.
    Admin {
        line: &'static [u8],
        noreply: bool,
    },
    /// `lru_crawler crawl|metadump <classes>`: `classes` is memcached's argument as sent
    /// (`all`, `hash`, or a comma list of class ids), checked by the server.
    LruCrawler {
        metadump: bool,
        classes: &'a [u8],
    },
    /// `lru_crawler enable|disable` (the reply depends on whether the crawler is on).
    LruCrawlerSwitch {
        enable: bool,
    },
    /// `watch [class ...]`: the log classes asked for (memcached's `LOG_*` bits, see
    /// [`watch_class`]); None when a name is not one memcached 1.6.18 knows (its `ERROR`,
    /// which a trailing `noreply` suppresses).
    Watch {
        classes: Option<u16>,
        noreply: bool,
    },
    /// `refresh_certs [...]`: reload the TLS certificates (memcached ignores other tokens; a
    /// trailing `noreply` silences only the success reply).
    RefreshCerts {
        noreply: bool,
    },
    /// memcached-debug's `debugtime N|p|r` (the server answers `ERROR` unless its debug
    /// commands are on).
    DebugTime(DebugTime),
}

/// What `debugtime` asks of the clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DebugTime {
    /// Move the clock by this many seconds.
    Shift(i64),
    Pause,
    Resume,
    /// Not a number: memcached-debug answers `ERROR`.
    Invalid,
}

/// memcached 1.6.18's log classes (logger.h `LOG_*`), as `watch` names them.
pub mod watch_class {
    pub const SYSEVENTS: u16 = 1 << 1;
    pub const FETCHERS: u16 = 1 << 2;
    pub const MUTATIONS: u16 = 1 << 3;
    pub const CONNEVENTS: u16 = 1 << 5;
    pub const EVICTIONS: u16 = 1 << 6;
    pub const RAWCMDS: u16 = 1 << 9;
    pub const PROXYREQS: u16 = 1 << 10;
    pub const PROXYEVENTS: u16 = 1 << 11;
    pub const PROXYUSER: u16 = 1 << 12;

    /// The class a `watch` argument names.
    pub fn named(name: &[u8]) -> Option<u16> {
        Some(match name {
            b"rawcmds" => RAWCMDS,
            b"evictions" => EVICTIONS,
            b"fetchers" => FETCHERS,
            b"mutations" => MUTATIONS,
            b"sysevents" => SYSEVENTS,
            b"connevents" => CONNEVENTS,
            b"proxyreqs" => PROXYREQS,
            b"proxyevents" => PROXYEVENTS,
            b"proxyuser" => PROXYUSER,
            _ => return None,
        })
    }
}

/// How memcached answers bytes that are not a valid request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TextErrorKind {
    /// `ERROR`
    Error,
    /// `CLIENT_ERROR bad command line format`
    BadFormat,
    /// `CLIENT_ERROR bad data chunk` (memcached counts it as a `cmd_set`).
    BadDataChunk,
    /// `CLIENT_ERROR invalid exptime argument`
    InvalidExptime,
    /// `CLIENT_ERROR invalid numeric delta argument`
    InvalidDelta,
    /// `CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]`
    DeleteUsage,
    /// `CLIENT_ERROR usage: stats detail on|off|dump`
    StatsDetailUsage,
    /// `CLIENT_ERROR bad command line`
    BadCommandLine,
    /// `CLIENT_ERROR Illegal slab id`
    IllegalSlabId,
    /// Close the connection without a reply (over-long line, HTTP request).
    Close,
}

/// An invalid request: the answer, and whether `noreply` suppresses it (memcached suppresses
/// every reply of a command that carried `noreply`, errors included).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TextError {
    pub kind: TextErrorKind,
    pub noreply: bool,
}

impl TextError {
    const fn new(kind: TextErrorKind, noreply: bool) -> TextError {
        TextError { kind, noreply }
    }

    /// The reply line including `\r\n`, or None when nothing is sent.
    pub fn reply(&self) -> Option<&'static [u8]> {
        if self.noreply {
            return None;
        }
        Some(match self.kind {
            TextErrorKind::Error => b"ERROR\r\n",
            TextErrorKind::BadFormat => b"CLIENT_ERROR bad command line format\r\n",
            TextErrorKind::BadDataChunk => b"CLIENT_ERROR bad data chunk\r\n",
            TextErrorKind::InvalidExptime => b"CLIENT_ERROR invalid exptime argument\r\n",
            TextErrorKind::InvalidDelta => b"CLIENT_ERROR invalid numeric delta argument\r\n",
            TextErrorKind::DeleteUsage => b"CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n",
            TextErrorKind::StatsDetailUsage => b"CLIENT_ERROR usage: stats detail on|off|dump\r\n",
            TextErrorKind::BadCommandLine => b"CLIENT_ERROR bad command line\r\n",
            TextErrorKind::IllegalSlabId => b"CLIENT_ERROR Illegal slab id\r\n",
            TextErrorKind::Close => return None,
        })
    }
}

/// Smallest `cache_memlimit` memcached accepts, in MiB.
pub const MEMLIMIT_MB_MIN: u32 = 8;
/// Largest `cache_memlimit` memcached accepts, in MiB (a larger number is taken to be bytes).
pub const MEMLIMIT_MB_MAX: u32 = 1_000_000_000;

/// The second word of the request line at the front of `input` (the key of a storage
/// command), read by the same rules as `parse`. For counting a storage request whose data
/// block turned out bad (`CLIENT_ERROR bad data chunk`): memcached counts it by key
/// (`stats detail`) before it reads the data.
pub fn line_key(input: &[u8]) -> &[u8] {
    let line = request_line(input).map_or(&[][..], |(line, _)| line);
    Words::new(line).nth(1).unwrap_or(&[])
}

// ---------------------------------------------------------------------------------------------
// Parsing.

/// memcached 1.6.18's `lru tune|mode|temp_ttl` replies (its LRU maintainer thread is on by
/// default). Slipstream has one LRU per shard and nothing to tune: the reply is memcached's,
/// the setting has no effect.
fn lru_reply(t: &Tokens<'_>) -> &'static [u8] {
    let n = t.count();
    let float = |tok: &[u8]| std::str::from_utf8(tok).ok().and_then(|s| s.parse::<f64>().ok());
    match t.get(1) {
        b"tune" if n >= 6 => match (safe_strtoul(t.get(2)), safe_strtoul(t.get(3)), float(t.get(4)), float(t.get(5))) {
            (Some(hot), Some(warm), Some(hot_factor), Some(factor)) => {
                if u64::from(hot) + u64::from(warm) > 80 {
                    b"ERROR hot and warm pcts must not exceed 80\r\n"
                } else if factor <= 0.0 || hot_factor <= 0.0 {
                    b"ERROR hot/warm age factors must be greater than 0\r\n"
                } else {
                    b"OK\r\n"
                }
            }
            _ => b"ERROR\r\n",
        },
        b"mode" if n >= 3 => match t.get(2) {
            b"flat" | b"segmented" => b"OK\r\n",
            _ => b"ERROR\r\n",
        },
        b"temp_ttl" if n >= 3 => match safe_strtol(t.get(2)) {
            Some(_) => b"OK\r\n",
            None => b"ERROR\r\n",
        },
        _ => b"ERROR\r\n",
    }
}

#[inline]
fn invalid<'a>(kind: TextErrorKind, noreply: bool, consumed: usize) -> Parsed<Request<'a>, TextError> {
    Parsed::Invalid { error: TextError::new(kind, noreply), consumed }
}

#[inline]
fn complete(request: Request<'_>, consumed: usize) -> Parsed<Request<'_>, TextError> {
    Parsed::Complete { request, consumed }
}

/// Parse one request from the front of `input`.
pub fn parse<'a>(input: &'a [u8], limits: &Limits) -> Parsed<Request<'a>, TextError> {
    let Some((line, consumed)) = request_line(input) else {
        return no_newline_yet(input, limits);
    };
    parse_line(line, input, consumed, limits)
}

/// A storage command whose line has arrived but whose data block has not (all of it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PendingStore<'a> {
    pub cmd: StoreCmd,
    pub key: &'a [u8],
    pub noreply: bool,
    /// Bytes of the command line, its `\n` included.
    pub line_bytes: usize,
    /// Bytes of the data block, its `\r\n` included.
    pub block_bytes: usize,
}

/// If `input` starts with a valid storage command line whose data block is not complete yet,
/// say so (the network loop uses it to refuse, memcached-style, a data block it cannot buffer).
pub fn pending_store<'a>(input: &'a [u8], limits: &Limits) -> Option<PendingStore<'a>> {
    let nl = crate::rules::line_end(input)?;
    // With no room for any item, a valid storage line parses as "too large" at once, which
    // carries what we need without waiting for (or looking at) the data.
    let probe = Limits { item: ItemLimits { item_bytes_max: 0, ..limits.item }, ..*limits };
    match parse(input.get(..=nl)?, &probe) {
        Parsed::Complete { request: Request::StoreTooLarge { cmd, key, noreply, swallow_bytes }, consumed } => (input
            .len()
            < consumed.saturating_add(swallow_bytes))
        .then_some(PendingStore { cmd, key, noreply, line_bytes: consumed, block_bytes: swallow_bytes }),
        _ => None,
    }
}

/// Whether `input` (no newline in it yet) is the start of a `get`/`gets` line, which memcached
/// buffers whatever its length (other lines close the connection past `line_bytes_max`).
pub fn is_multiget_start(input: &[u8]) -> bool {
    let spaces = input.iter().take_while(|&&b| b == b' ').count();
    let after = input.get(spaces..).unwrap_or(&[]);
    spaces <= LINE_LEADING_SPACES_MAX && (after.starts_with(b"get ") || after.starts_with(b"gets "))
}

fn no_newline_yet<'a>(input: &'a [u8], limits: &Limits) -> Parsed<Request<'a>, TextError> {
    if input.len() <= limits.line_bytes_max {
        return Parsed::Incomplete;
    }
    if !is_multiget_start(input) || input.len() > limits.multiget_line_bytes_max {
        return invalid(TextErrorKind::Close, false, input.len());
    }
    Parsed::Incomplete
}

fn parse_line<'a>(line: &'a [u8], input: &'a [u8], consumed: usize, limits: &Limits) -> Parsed<Request<'a>, TextError> {
    // Fast path for the most common request: "get <keys>" with no leading spaces.
    if let Some(rest) = line.strip_prefix(b"get ") {
        let keys = Keys::new(rest);
        if keys.clone().next().is_none() {
            return invalid(TextErrorKind::Error, false, consumed);
        }
        return complete(Request::Get { with_cas: false, touch_exptime: None, keys }, consumed);
    }

    let mut words = Words::new(line);
    let Some(cmd) = words.next() else {
        return invalid(TextErrorKind::Error, false, consumed);
    };
    if cmd.len() < 2 {
        return invalid(TextErrorKind::Error, false, consumed);
    }
    let first = cmd.first().copied().unwrap_or(0);
    if first == b'm' && cmd.len() == 2 {
        return match cmd.get(1) {
            Some(b'g' | b's' | b'd' | b'n' | b'a' | b'e') => complete(Request::Meta, consumed),
            _ => invalid(TextErrorKind::Error, false, consumed),
        };
    }
    if let Some(parsed) = parse_retrieval(cmd, words, consumed) {
        return parsed;
    }
    let t = Tokens::split(line);
    match cmd {
        b"set" => parse_storage(StoreCmd::Set, &t, input, consumed, limits),
        b"add" => parse_storage(StoreCmd::Add, &t, input, consumed, limits),
        b"replace" => parse_storage(StoreCmd::Replace, &t, input, consumed, limits),
        b"append" => parse_storage(StoreCmd::Append, &t, input, consumed, limits),
        b"prepend" => parse_storage(StoreCmd::Prepend, &t, input, consumed, limits),
        b"cas" => parse_storage(StoreCmd::Cas, &t, input, consumed, limits),
        b"delete" => parse_delete(&t, consumed),
        b"incr" | b"decr" => parse_arith(cmd == b"incr", &t, consumed),
        b"touch" => parse_touch(&t, consumed),
        _ => parse_admin(cmd, &t, consumed),
    }
}

/// The get family (`get`, `bget`, `gets`, `gat`, `gats`); `None` for any other command.
/// Keys are read lazily; memcached wants at least one token after the command.
#[inline]
fn parse_retrieval<'a>(cmd: &[u8], mut keys: Words<'a>, consumed: usize) -> Option<Parsed<Request<'a>, TextError>> {
    let (with_cas, touch) = match cmd {
        b"get" | b"bget" => (false, false),
        b"gets" => (true, false),
        b"gat" => (false, true),
        b"gats" => (true, true),
        _ => return None,
    };
    let Some(first_arg) = keys.clone().next() else {
        return Some(invalid(TextErrorKind::Error, false, consumed));
    };
    let touch_exptime = if touch {
        keys.next();
        match safe_strtol(first_arg) {
            Some(e) => Some(i64::from(e)),
            None => return Some(invalid(TextErrorKind::InvalidExptime, false, consumed)),
        }
    } else {
        None
    };
    Some(complete(Request::Get { with_cas, touch_exptime, keys }, consumed))
}

/// `delete <key> [0] [noreply]`.
#[inline]
fn parse_delete<'a>(t: &Tokens<'a>, consumed: usize) -> Parsed<Request<'a>, TextError> {
    let n = t.count();
    if !(2..=4).contains(&n) {
        return invalid(TextErrorKind::Error, false, consumed);
    }
    let mut noreply = false;
    if n > 2 {
        let hold_is_zero = t.get(2) == b"0";
        noreply = t.last_is_noreply();
        let valid = (n == 3 && (hold_is_zero || noreply)) || (n == 4 && hold_is_zero && noreply);
        if !valid {
            return invalid(TextErrorKind::DeleteUsage, noreply, consumed);
        }
    }
    let key = t.get(1);
    if key.len() > KEY_BYTES_MAX {
        return invalid(TextErrorKind::BadFormat, noreply, consumed);
    }
    complete(Request::Delete { key, noreply }, consumed)
}

/// `<cmd> <key> <arg> [noreply]` split: the key, the raw argument and `noreply`.
struct KeyArg<'a> {
    key: &'a [u8],
    arg: &'a [u8],
    noreply: bool,
}

/// The shape `incr|decr|touch <key> <arg> [noreply]`, or memcached's reply to a wrong token
/// count (`ERROR`) or a key that is too long.
#[inline]
fn key_arg_head<'a>(t: &Tokens<'a>, consumed: usize) -> Result<KeyArg<'a>, Parsed<Request<'a>, TextError>> {
    let n = t.count();
    if n != 3 && n != 4 {
        return Err(invalid(TextErrorKind::Error, false, consumed));
    }
    let noreply = t.last_is_noreply();
    let key = t.get(1);
    if key.len() > KEY_BYTES_MAX {
        return Err(invalid(TextErrorKind::BadFormat, noreply, consumed));
    }
    Ok(KeyArg { key, arg: t.get(2), noreply })
}

/// `incr|decr <key> <delta> [noreply]`.
#[inline]
fn parse_arith<'a>(incr: bool, t: &Tokens<'a>, consumed: usize) -> Parsed<Request<'a>, TextError> {
    let KeyArg { key, arg, noreply } = match key_arg_head(t, consumed) {
        Ok(head) => head,
        Err(reply) => return reply,
    };
    let Some(delta) = safe_strtoull(arg) else {
        return invalid(TextErrorKind::InvalidDelta, noreply, consumed);
    };
    complete(Request::Arith { incr, key, delta, noreply }, consumed)
}

/// `touch <key> <exptime> [noreply]`.
#[inline]
fn parse_touch<'a>(t: &Tokens<'a>, consumed: usize) -> Parsed<Request<'a>, TextError> {
    let KeyArg { key, arg, noreply } = match key_arg_head(t, consumed) {
        Ok(head) => head,
        Err(reply) => return reply,
    };
    let Some(exptime) = safe_strtol(arg) else {
        return invalid(TextErrorKind::InvalidExptime, noreply, consumed);
    };
    complete(Request::Touch { key, exptime: i64::from(exptime), noreply }, consumed)
}

/// Admin and miscellaneous commands (flush_all, version, quit, verbosity, shutdown, stats,
/// cache_memlimit, slabs, lru_crawler, lru) and unknown commands.
fn parse_admin<'a>(cmd: &[u8], t: &Tokens<'a>, consumed: usize) -> Parsed<Request<'a>, TextError> {
    let n = t.count();
    let bad = |kind| invalid(kind, false, consumed);
    match cmd {
        b"flush_all" => parse_flush_all(t, consumed),
        b"version" => complete(Request::Version, consumed),
        b"quit" => complete(Request::Quit, consumed),
        b"verbosity" => {
            if n != 2 && n != 3 {
                return bad(TextErrorKind::Error);
            }
            let noreply = t.last_is_noreply();
            match safe_strtoul(t.get(1)) {
                Some(level) => complete(Request::Verbosity { level, noreply }, consumed),
                None => invalid(TextErrorKind::BadFormat, noreply, consumed),
            }
        }
        b"shutdown" => {
            let mode = match n {
                1 => ShutdownMode::Now,
                2 if t.get(1) == b"graceful" => ShutdownMode::Graceful,
                _ => ShutdownMode::Invalid,
            };
            complete(Request::Shutdown(mode), consumed)
        }
        b"stats" => parse_stats(t, consumed),
        // Commands memcached knows but Slipstream does not offer; memcached's own answers
        // need its slab allocator, LRU crawler or log watchers.
        b"cache_memlimit" => parse_cache_memlimit(t, consumed),
        b"slabs" => parse_slabs(t, consumed),
        b"lru_crawler" => parse_lru_crawler(t, consumed),
        b"lru" if n >= 2 => complete(Request::Admin { line: lru_reply(t), noreply: t.last_is_noreply() }, consumed),
        b"watch" => parse_watch(t, consumed),
        b"refresh_certs" => complete(Request::RefreshCerts { noreply: t.last_is_noreply() }, consumed),
        b"debugtime" if n >= 2 => {
            let arg = match t.get(1) {
                b"p" => DebugTime::Pause,
                b"r" => DebugTime::Resume,
                a => safe_strtoll(a).map_or(DebugTime::Invalid, DebugTime::Shift),
            };
            complete(Request::DebugTime(arg), consumed)
        }
        b"lru" | b"misbehave" | b"extstore" => bad(TextErrorKind::Error),
        _ => parse_unknown(cmd, t, consumed),
    }
}

/// `flush_all [delay] [noreply]`; a delay that does not parse is reported by the executor.
fn parse_flush_all<'a>(t: &Tokens<'a>, consumed: usize) -> Parsed<Request<'a>, TextError> {
    let n = t.count();
    if !(1..=3).contains(&n) {
        return invalid(TextErrorKind::Error, false, consumed);
    }
    let noreply = t.last_is_noreply();
    let delay_s = if n != if noreply { 2 } else { 1 } { safe_strtol(t.get(1)).map(i64::from) } else { Some(0) };
    complete(Request::FlushAll { delay_s, noreply }, consumed)
}

/// `cache_memlimit <megabytes> [noreply]`.
fn parse_cache_memlimit<'a>(t: &Tokens<'a>, consumed: usize) -> Parsed<Request<'a>, TextError> {
    let n = t.count();
    if n != 2 && n != 3 {
        return invalid(TextErrorKind::Error, false, consumed);
    }
    let noreply = t.last_is_noreply();
    // memcached's process_memlimit_command; a 32-bit parse, so 4294967296 reads as 0.
    let line: &'static [u8] = match safe_strtoul(t.get(1)) {
        None => b"ERROR\r\n",
        Some(mb) if mb < MEMLIMIT_MB_MIN => b"MEMLIMIT_TOO_SMALL cannot set maxbytes to less than 8m\r\n",
        Some(mb) if mb > MEMLIMIT_MB_MAX => b"MEMLIMIT_ADJUST_FAILED input value is megabytes not bytes\r\n",
        Some(megabytes) => return complete(Request::CacheMemlimit { megabytes, noreply }, consumed),
    };
    complete(Request::Admin { line, noreply }, consumed)
}

/// `watch [class ...]` (memcached's process_watch_command): no class = fetchers; every
/// argument, a trailing `noreply` included, must name a class.
fn parse_watch<'a>(t: &Tokens<'a>, consumed: usize) -> Parsed<Request<'a>, TextError> {
    let noreply = t.last_is_noreply();
    let mut classes = 0u16;
    for i in 1..t.count() {
        match watch_class::named(t.get(i)) {
            Some(c) => classes |= c,
            None => return complete(Request::Watch { classes: None, noreply }, consumed),
        }
    }
    let classes = if t.count() < 2 { watch_class::FETCHERS } else { classes };
    complete(Request::Watch { classes: Some(classes), noreply }, consumed)
}

/// `lru_crawler <subcommand> ...`.
fn parse_lru_crawler<'a>(t: &Tokens<'a>, consumed: usize) -> Parsed<Request<'a>, TextError> {
    let line: &'static [u8] = match (t.count(), t.get(1)) {
        (3, b"tocrawl") | (3, b"sleep") => match safe_strtoul(t.get(2)) {
            None => b"CLIENT_ERROR bad command line format\r\n",
            Some(v) if t.get(1) == b"sleep" && v > 1_000_000 => b"CLIENT_ERROR sleep must be one second or less\r\n",
            Some(_) => b"OK\r\n",
        },
        (2, b"enable") | (2, b"disable") => {
            return complete(Request::LruCrawlerSwitch { enable: t.get(1) == b"enable" }, consumed)
        }
        (3, b"crawl") => return complete(Request::LruCrawler { metadump: false, classes: t.get(2) }, consumed),
        (3, b"metadump") => return complete(Request::LruCrawler { metadump: true, classes: t.get(2) }, consumed),
        _ => b"ERROR\r\n",
    };
    complete(Request::Admin { line, noreply: false }, consumed)
}

/// An unknown command: `ERROR`, or close on what looks like an HTTP request line.
fn parse_unknown<'a>(cmd: &[u8], t: &Tokens<'a>, consumed: usize) -> Parsed<Request<'a>, TextError> {
    let first = cmd.first().copied().unwrap_or(0);
    // memcached closes on what looks like an HTTP request line.
    let last = t.get(t.count().saturating_sub(1));
    if first != b'g' && !matches!(first, b's' | b'a' | b'c' | b'i' | b'd' | b't') && last.starts_with(b"HTTP/") {
        invalid(TextErrorKind::Close, false, consumed)
    } else {
        invalid(TextErrorKind::Error, false, consumed)
    }
}

fn parse_storage<'a>(
    cmd: StoreCmd,
    t: &Tokens<'a>,
    input: &'a [u8],
    consumed: usize,
    limits: &Limits,
) -> Parsed<Request<'a>, TextError> {
    let n = t.count();
    let want = if cmd == StoreCmd::Cas { 6 } else { 5 };
    if n != want && n != want + 1 {
        return invalid(TextErrorKind::Error, false, consumed);
    }
    let noreply = t.last_is_noreply();
    let bad_format = || invalid(TextErrorKind::BadFormat, noreply, consumed);
    let key = t.get(1);
    if key.len() > KEY_BYTES_MAX {
        return bad_format();
    }
    let (Some(flags), Some(exptime), Some(vlen)) =
        (safe_strtoul(t.get(2)), safe_strtol(t.get(3)), safe_strtol(t.get(4)))
    else {
        return bad_format();
    };
    let mut cas_unique = 0;
    if cmd == StoreCmd::Cas {
        match safe_strtoull(t.get(5)) {
            Some(c) => cas_unique = c,
            None => return bad_format(),
        }
    }
    let Some(value_bytes) = usize::try_from(vlen).ok().filter(|&v| v <= DATA_BYTES_MAX) else {
        return bad_format();
    };
    let block_bytes = value_bytes + 2;
    if limits.item.too_large(key.len(), flags, value_bytes) {
        return complete(Request::StoreTooLarge { cmd, key, noreply, swallow_bytes: block_bytes }, consumed);
    }
    let need = consumed.saturating_add(block_bytes);
    let Some(block) = input.get(consumed..need) else {
        return Parsed::Incomplete;
    };
    let (data, tail) = block.split_at(value_bytes);
    if tail != b"\r\n" {
        return invalid(TextErrorKind::BadDataChunk, noreply, need);
    }
    complete(Request::Store { cmd, key, flags, exptime: i64::from(exptime), cas_unique, data, noreply }, need)
}

/// `slabs automove <0|1|2>` / `slabs automove ratio <r>` / `slabs reassign <src> <dst>`.
fn parse_slabs<'a>(t: &Tokens<'a>, consumed: usize) -> Parsed<Request<'a>, TextError> {
    let n = t.count();
    let line: &'static [u8] = if n == 4 && t.get(1) == b"reassign" {
        match (safe_strtol(t.get(2)), safe_strtol(t.get(3))) {
            (Some(src), Some(dst)) if src == dst => b"SAME src and dst class are identical\r\n",
            (Some(src), Some(dst)) if !(0..64).contains(&src) || !(0..64).contains(&dst) => {
                b"BADCLASS invalid src or dst class id\r\n"
            }
            // Slipstream has no slab pages to move.
            (Some(_), Some(_)) => b"NOSPARE source class has no spare pages\r\n",
            _ => b"CLIENT_ERROR bad command line format\r\n",
        }
    } else if n >= 3 && t.get(1) == b"automove" {
        let noreply = t.last_is_noreply();
        let line: &'static [u8] = if t.get(2) == b"ratio" {
            let ratio_ok = n >= 4 && {
                let r = t.get(3);
                !r.is_empty() && r.iter().all(|b| b.is_ascii_digit() || *b == b'.')
            };
            if ratio_ok {
                b"OK\r\n"
            } else {
                b"ERROR\r\n"
            }
        } else {
            match safe_strtoul(t.get(2)) {
                None => b"CLIENT_ERROR bad command line format\r\n",
                Some(0..=2) => b"OK\r\n",
                Some(_) => b"ERROR\r\n",
            }
        };
        return complete(Request::Admin { line, noreply }, consumed);
    } else {
        b"ERROR\r\n"
    };
    complete(Request::Admin { line, noreply: false }, consumed)
}

fn parse_stats<'a>(t: &Tokens<'a>, consumed: usize) -> Parsed<Request<'a>, TextError> {
    let n = t.count();
    if n == 1 {
        return complete(Request::Stats(StatsCmd::General), consumed);
    }
    let cmd = match t.get(1) {
        b"reset" => StatsCmd::Reset,
        b"settings" => StatsCmd::Settings,
        b"items" => StatsCmd::Items,
        b"slabs" => StatsCmd::Slabs,
        b"sizes" => StatsCmd::Sizes,
        b"conns" => StatsCmd::Conns,
        b"extstore" => StatsCmd::Extstore,
        b"detail" => match (n >= 3).then(|| t.get(2)) {
            Some(b"on") => StatsCmd::DetailOn,
            Some(b"off") => StatsCmd::DetailOff,
            Some(b"dump") => StatsCmd::DetailDump,
            _ => return invalid(TextErrorKind::StatsDetailUsage, false, consumed),
        },
        b"cachedump" => {
            if n < 4 {
                return invalid(TextErrorKind::BadCommandLine, false, consumed);
            }
            let (Some(id), Some(limit)) = (safe_strtoul(t.get(2)), safe_strtoul(t.get(3))) else {
                return invalid(TextErrorKind::BadFormat, false, consumed);
            };
            if id >= 64 {
                return invalid(TextErrorKind::IllegalSlabId, false, consumed);
            }
            StatsCmd::Cachedump { class: id, limit }
        }
        _ => StatsCmd::Unknown,
    };
    complete(Request::Stats(cmd), consumed)
}

// ---------------------------------------------------------------------------------------------
// Composing replies.

/// Append the decimal form of `v`.
#[inline]
pub fn compose_u64(out: &mut Vec<u8>, v: u64) {
    let (buf, i) = crate::rules::decimal_digits(v);
    out.extend_from_slice(buf.get(i..).unwrap_or(&[]));
}

/// Append the decimal form of a signed number.
pub fn compose_i64(out: &mut Vec<u8>, v: i64) {
    if v < 0 {
        out.push(b'-');
    }
    compose_u64(out, v.unsigned_abs());
}

/// `VALUE <key> <flags> <bytes>[ <cas>]\r\n<data>\r\n`
#[inline]
pub fn compose_value(out: &mut Vec<u8>, key: &[u8], flags: u32, data: &[u8], cas: Option<u64>) {
    out.reserve(key.len() + data.len() + 48);
    compose_value_line(out, key, flags, data.len(), cas);
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// The `VALUE <key> <flags> <bytes> [<cas>]\r\n` line alone, for a caller that appends the
/// `value_bytes` of data and their `\r\n` itself (a value sent without copying it here).
pub fn compose_value_line(out: &mut Vec<u8>, key: &[u8], flags: u32, value_bytes: usize, cas: Option<u64>) {
    out.extend_from_slice(b"VALUE ");
    out.extend_from_slice(key);
    out.push(b' ');
    compose_u64(out, u64::from(flags));
    out.push(b' ');
    compose_u64(out, value_bytes as u64);
    if let Some(c) = cas {
        out.push(b' ');
        compose_u64(out, c);
    }
    out.extend_from_slice(b"\r\n");
}

/// `END\r\n`
#[inline]
pub fn compose_end(out: &mut Vec<u8>) {
    out.extend_from_slice(b"END\r\n");
}

/// A whole reply line: `<line>\r\n`.
#[inline]
pub fn compose_line(out: &mut Vec<u8>, line: &[u8]) {
    out.extend_from_slice(line);
    out.extend_from_slice(b"\r\n");
}

/// incr/decr reply: `<value>\r\n`.
#[inline]
pub fn compose_number(out: &mut Vec<u8>, v: u64) {
    compose_u64(out, v);
    out.extend_from_slice(b"\r\n");
}

/// `STAT <name> <value>\r\n`
pub fn compose_stat(out: &mut Vec<u8>, name: &str, value: &[u8]) {
    out.extend_from_slice(b"STAT ");
    out.extend_from_slice(name.as_bytes());
    out.push(b' ');
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// `STAT <name> <number>\r\n`
pub fn compose_stat_u64(out: &mut Vec<u8>, name: &str, value: u64) {
    out.extend_from_slice(b"STAT ");
    out.extend_from_slice(name.as_bytes());
    out.push(b' ');
    compose_u64(out, value);
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lim() -> Limits {
        Limits::default()
    }

    fn p(input: &[u8]) -> Parsed<Request<'_>, TextError> {
        parse(input, &lim())
    }

    fn err(input: &[u8]) -> (TextErrorKind, bool, usize) {
        match p(input) {
            Parsed::Invalid { error, consumed } => (error.kind, error.noreply, consumed),
            other => panic!("expected Invalid for {:?}, got {:?}", String::from_utf8_lossy(input), other),
        }
    }

    fn ok(input: &[u8]) -> (Request<'_>, usize) {
        match p(input) {
            Parsed::Complete { request, consumed } => (request, consumed),
            other => panic!("expected Complete for {:?}, got {:?}", String::from_utf8_lossy(input), other),
        }
    }

    fn keys(r: &Request<'_>) -> Vec<Vec<u8>> {
        match r {
            Request::Get { keys, .. } => keys.map(|k| k.to_vec()).collect(),
            _ => panic!("not a get: {r:?}"),
        }
    }

    use TextErrorKind::*;

    #[test]
    fn get_forms() {
        let (r, c) = ok(b"get a\r\n");
        assert_eq!(c, 7);
        assert_eq!(keys(&r), vec![b"a".to_vec()]);
        let (r, _) = ok(b"  get   a   b  \r\n");
        assert_eq!(keys(&r), vec![b"a".to_vec(), b"b".to_vec()]);
        let (r, _) = ok(b"get a\tb\n");
        assert_eq!(keys(&r), vec![b"a\tb".to_vec()]);
        let (r, _) = ok(b"get a\x00b c\r\n");
        assert_eq!(keys(&r), vec![b"a".to_vec()]);
        let (r, _) = ok(b"gets a\r\n");
        assert!(matches!(r, Request::Get { with_cas: true, touch_exptime: None, .. }));
        let (r, _) = ok(b"bget a\r\n");
        assert!(matches!(r, Request::Get { with_cas: false, touch_exptime: None, .. }));
        let (r, _) = ok(b"gat 10 a b\r\n");
        assert!(matches!(r, Request::Get { with_cas: false, touch_exptime: Some(10), .. }));
        assert_eq!(keys(&r), vec![b"a".to_vec(), b"b".to_vec()]);
        let (r, _) = ok(b"gats -1 a\r\n");
        assert!(matches!(r, Request::Get { with_cas: true, touch_exptime: Some(-1), .. }));
        let (r, _) = ok(b"gat 10\r\n");
        assert_eq!(keys(&r).len(), 0);
        assert_eq!(err(b"gat abc a\r\n"), (InvalidExptime, false, 11));
        assert_eq!(err(b"get\r\n").0, Error);
        assert_eq!(err(b"get \r\n").0, Error);
        assert_eq!(err(b"gets\r\n").0, Error);
        assert_eq!(err(b"gats\r\n").0, Error);
        assert_eq!(err(b"GET a\r\n").0, Error);
        // Long keys are reported to the executor, which fails the request when it reaches one.
        let long = [b"get a ".as_slice(), &[b'k'; 251], b"\r\n"].concat();
        let (r, _) = ok(&long);
        assert_eq!(keys(&r)[1].len(), 251);
        // Many keys: memcached's 24-token chunking does not change the key list.
        let many: Vec<u8> =
            [b"get".as_slice(), &(0..100).flat_map(|i| format!(" k{i}").into_bytes()).collect::<Vec<u8>>(), b"\r\n"]
                .concat();
        let (r, _) = ok(&many);
        assert_eq!(keys(&r).len(), 100);
        assert_eq!(keys(&r)[99], b"k99".to_vec());
    }

    #[test]
    fn empty_and_short_lines() {
        assert_eq!(err(b"\r\n"), (Error, false, 2));
        assert_eq!(err(b"\n"), (Error, false, 1));
        assert_eq!(err(b"x\r\n"), (Error, false, 3));
        assert_eq!(err(b"   \r\n"), (Error, false, 5));
        assert_eq!(p(b"get a\r"), Parsed::Incomplete);
        assert_eq!(p(b""), Parsed::Incomplete);
    }

    #[test]
    fn storage_commands() {
        let (r, c) = ok(b"set a 5 10 3\r\nabc\r\nget a\r\n");
        assert_eq!(c, 19);
        assert_eq!(
            r,
            Request::Store {
                cmd: StoreCmd::Set,
                key: b"a",
                flags: 5,
                exptime: 10,
                cas_unique: 0,
                data: b"abc",
                noreply: false
            }
        );
        let (r, _) = ok(b"cas a 0 0 1 99 noreply\r\nx\r\n");
        assert_eq!(
            r,
            Request::Store {
                cmd: StoreCmd::Cas,
                key: b"a",
                flags: 0,
                exptime: 0,
                cas_unique: 99,
                data: b"x",
                noreply: true
            }
        );
        for (w, cmd) in [
            (&b"add"[..], StoreCmd::Add),
            (b"replace", StoreCmd::Replace),
            (b"append", StoreCmd::Append),
            (b"prepend", StoreCmd::Prepend),
        ] {
            let line = [w, b" k 1 2 0\r\n\r\n"].concat();
            let (r, c) = ok(&line);
            assert_eq!(c, line.len());
            assert_eq!(
                r,
                Request::Store { cmd, key: b"k", flags: 1, exptime: 2, cas_unique: 0, data: b"", noreply: false }
            );
        }
        // A sixth token that is not "noreply" is ignored.
        let (r, _) = ok(b"set a 0 0 1 xxx\r\nx\r\n");
        assert!(matches!(r, Request::Store { noreply: false, .. }));
        // '\n' alone ends the line; the data block itself must end in "\r\n".
        let (r, c) = ok(b"set a 0 0 1\nx\r\n");
        assert_eq!(c, 15);
        assert!(matches!(r, Request::Store { data: b"x", .. }));
        // Truncations memcached does.
        let (r, _) = ok(b"set a 4294967296 4294967396 4294967297\r\nx\r\n");
        assert!(matches!(r, Request::Store { flags: 0, exptime: 100, data: b"x", .. }));
        let (r, _) = ok(b"set a -18446744073709551615 +0 +1\t\r\nx\r\n");
        assert!(matches!(r, Request::Store { flags: 1, data: b"x", .. }));
        // Incomplete data.
        assert_eq!(p(b"set a 0 0 3\r\nab"), Parsed::Incomplete);
        assert_eq!(p(b"set a 0 0 3\r\nabc\r"), Parsed::Incomplete);
        assert_eq!(p(b"set a 0 0 3\r\n"), Parsed::Incomplete);
    }

    #[test]
    fn storage_errors() {
        // Wrong token counts: ERROR, only the line consumed (the data then reads as a command).
        assert_eq!(err(b"set a 0 0\r\nx\r\n"), (Error, false, 11));
        assert_eq!(err(b"set a 0 0 1 noreply extra\r\nx\r\n"), (Error, false, 27));
        assert_eq!(err(b"cas a 0 0 1\r\nx\r\n"), (Error, false, 13));
        let many = [b"set a 0 0 1".as_slice(), &b" x".repeat(30), b"\r\n"].concat();
        assert_eq!(err(&many).0, Error);
        // Bad numbers: CLIENT_ERROR bad command line format, line consumed.
        assert_eq!(err(b"set a 0 0 -1\r\n"), (BadFormat, false, 14));
        assert_eq!(err(b"set a 0 0 abc\r\n").0, BadFormat);
        assert_eq!(err(b"set a -1 0 1\r\nx\r\n"), (BadFormat, false, 14));
        assert_eq!(err(b"set a 0 0 1x\r\n").0, BadFormat);
        assert_eq!(err(b"set a 0 x 1\r\n").0, BadFormat);
        assert_eq!(err(b"set a 0 0 3000000000\r\n").0, BadFormat);
        assert_eq!(err(b"set a 0 0 2147483646\r\n").0, BadFormat);
        assert_eq!(err(b"cas a 0 0 1 abc\r\n").0, BadFormat);
        assert_eq!(err(b"cas a 0 0 1 -1\r\n").0, BadFormat);
        assert_eq!(err(b"set a 0 abc 1 noreply\r\n"), (BadFormat, true, 23));
        let long = [b"set ".as_slice(), &[b'k'; 251], b" 0 0 1\r\nx\r\n"].concat();
        assert_eq!(err(&long), (BadFormat, false, 263));
        let ok250 = [b"set ".as_slice(), &[b'k'; 250], b" 0 0 1\r\nx\r\n"].concat();
        assert!(matches!(ok(&ok250).0, Request::Store { .. }));
        // Bad data chunk: exactly vlen+2 bytes consumed.
        assert_eq!(err(b"set a 0 0 1\r\nxyz\r\n"), (BadDataChunk, false, 16));
        assert_eq!(err(b"set a 0 0 1\r\nabcdef get a\r\n"), (BadDataChunk, false, 16));
        assert_eq!(err(b"set a 0 0 1 noreply\r\nxy\r\n"), (BadDataChunk, true, 24));
        assert_eq!(err(b"set a 0 0 1\r\n\r\n\r\n"), (BadDataChunk, false, 16));
    }

    #[test]
    fn too_large_is_refused_before_the_data() {
        // memcached 1.6.18 -I 1m: key "a", flags 0 accepts 1048516 bytes and refuses 1048517.
        let (r, c) = ok(b"set a 0 0 1048517\r\n");
        assert_eq!(c, 19);
        assert_eq!(r, Request::StoreTooLarge { cmd: StoreCmd::Set, key: b"a", noreply: false, swallow_bytes: 1048519 });
        assert_eq!(p(b"set a 0 0 1048516\r\n"), Parsed::Incomplete);
        // Non-zero flags cost 4 bytes.
        assert!(matches!(ok(b"set a 1 0 1048513\r\n").0, Request::StoreTooLarge { .. }));
        assert_eq!(p(b"set a 1 0 1048512\r\n"), Parsed::Incomplete);
        let k250 = [b"set ".as_slice(), &[b'k'; 250], b" 7 0 1048264 noreply\r\n"].concat();
        assert!(matches!(ok(&k250).0, Request::StoreTooLarge { noreply: true, .. }));
        let k250 = [b"set ".as_slice(), &[b'k'; 250], b" 7 0 1048263\r\n"].concat();
        assert_eq!(p(&k250), Parsed::Incomplete);
        assert!(matches!(ok(b"add b 0 0 2000000\r\n").0, Request::StoreTooLarge { cmd: StoreCmd::Add, .. }));
        // Under -C the same line fits 8 bytes more (the rule itself: rules::limits).
        let no_cas = Limits { item: ItemLimits { cas_enabled: false, ..ItemLimits::default() }, ..lim() };
        let k250 = [b"set ".as_slice(), &[b'k'; 250], b" 7 0 1048271\r\n"].concat();
        assert_eq!(parse(&k250, &no_cas), Parsed::Incomplete);
        let k250 = [b"set ".as_slice(), &[b'k'; 250], b" 7 0 1048272\r\n"].concat();
        assert!(matches!(parse(&k250, &no_cas), Parsed::Complete { request: Request::StoreTooLarge { .. }, .. }));
    }

    #[test]
    fn delete_forms() {
        assert_eq!(ok(b"delete a\r\n").0, Request::Delete { key: b"a", noreply: false });
        assert_eq!(ok(b"delete a 0\r\n").0, Request::Delete { key: b"a", noreply: false });
        assert_eq!(ok(b"delete a noreply\r\n").0, Request::Delete { key: b"a", noreply: true });
        assert_eq!(ok(b"delete a 0 noreply\r\n").0, Request::Delete { key: b"a", noreply: true });
        assert_eq!(err(b"delete a 5\r\n"), (DeleteUsage, false, 12));
        assert_eq!(err(b"delete a 1 noreply\r\n"), (DeleteUsage, true, 20));
        assert_eq!(err(b"delete a 0 0\r\n"), (DeleteUsage, false, 14));
        assert_eq!(err(b"delete b x y z\r\n").0, Error);
        assert_eq!(err(b"delete\r\n").0, Error);
        let long = [b"delete ".as_slice(), &[b'k'; 251], b" 0\r\n"].concat();
        assert_eq!(err(&long).0, BadFormat);
        let long = [b"delete ".as_slice(), &[b'k'; 251], b" 5\r\n"].concat();
        assert_eq!(err(&long).0, DeleteUsage);
        assert_eq!(
            TextError { kind: DeleteUsage, noreply: false }.reply().unwrap(),
            b"CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n"
        );
    }

    #[test]
    #[allow(clippy::too_many_lines)] // a table of request → parse cases
    fn arith_touch_flush_verbosity() {
        assert_eq!(ok(b"incr a 5\r\n").0, Request::Arith { incr: true, key: b"a", delta: 5, noreply: false });
        assert_eq!(ok(b"decr a 5 noreply\r\n").0, Request::Arith { incr: false, key: b"a", delta: 5, noreply: true });
        assert_eq!(ok(b"incr a 1 2\r\n").0, Request::Arith { incr: true, key: b"a", delta: 1, noreply: false });
        assert_eq!(err(b"incr a -1\r\n").0, InvalidDelta);
        assert_eq!(err(b"incr a 18446744073709551616\r\n").0, InvalidDelta);
        assert_eq!(err(b"incr a abc noreply\r\n"), (InvalidDelta, true, 20));
        assert_eq!(err(b"incr a\r\n").0, Error);
        assert_eq!(err(b"incr a 1 noreply x\r\n").0, Error);
        assert_eq!(err(b"incr\r\n").0, Error);
        assert_eq!(ok(b"touch a 10\r\n").0, Request::Touch { key: b"a", exptime: 10, noreply: false });
        assert_eq!(ok(b"touch a 10 foo\r\n").0, Request::Touch { key: b"a", exptime: 10, noreply: false });
        assert_eq!(err(b"touch a abc\r\n").0, InvalidExptime);
        assert_eq!(err(b"touch a abc noreply\r\n"), (InvalidExptime, true, 21));
        assert_eq!(err(b"touch a\r\n").0, Error);
        let long = [b"touch ".as_slice(), &[b'k'; 251], b" 1\r\n"].concat();
        assert_eq!(err(&long).0, BadFormat);
        let long = [b"incr ".as_slice(), &[b'k'; 251], b" 1\r\n"].concat();
        assert_eq!(err(&long).0, BadFormat);

        assert_eq!(ok(b"flush_all\r\n").0, Request::FlushAll { delay_s: Some(0), noreply: false });
        assert_eq!(ok(b"flush_all 0\r\n").0, Request::FlushAll { delay_s: Some(0), noreply: false });
        assert_eq!(ok(b"flush_all noreply\r\n").0, Request::FlushAll { delay_s: Some(0), noreply: true });
        assert_eq!(ok(b"flush_all 10 noreply\r\n").0, Request::FlushAll { delay_s: Some(10), noreply: true });
        assert_eq!(ok(b"flush_all abc\r\n").0, Request::FlushAll { delay_s: None, noreply: false });
        assert_eq!(ok(b"flush_all 1 2\r\n").0, Request::FlushAll { delay_s: Some(1), noreply: false });
        assert_eq!(ok(b"flush_all noreply x\r\n").0, Request::FlushAll { delay_s: None, noreply: false });
        assert_eq!(ok(b"flush_all x noreply\r\n").0, Request::FlushAll { delay_s: None, noreply: true });
        assert_eq!(err(b"flush_all 0 noreply x\r\n").0, Error);

        assert_eq!(ok(b"verbosity 1\r\n").0, Request::Verbosity { level: 1, noreply: false });
        assert_eq!(ok(b"verbosity 1 noreply\r\n").0, Request::Verbosity { level: 1, noreply: true });
        assert_eq!(err(b"verbosity\r\n").0, Error);
        assert_eq!(err(b"verbosity abc\r\n").0, BadFormat);
        assert_eq!(err(b"verbosity noreply\r\n"), (BadFormat, true, 19));
        assert_eq!(err(b"verbosity 1 2 3\r\n").0, Error);
    }

    #[test]
    fn misc_commands() {
        assert_eq!(ok(b"version\r\n").0, Request::Version);
        assert_eq!(ok(b"version foo\r\n").0, Request::Version);
        assert_eq!(ok(b"quit\r\n").0, Request::Quit);
        assert_eq!(ok(b"quit extra\r\n").0, Request::Quit);
        assert_eq!(ok(b"shutdown\r\n").0, Request::Shutdown(ShutdownMode::Now));
        assert_eq!(ok(b"shutdown graceful\r\n").0, Request::Shutdown(ShutdownMode::Graceful));
        assert_eq!(ok(b"shutdown foo\r\n").0, Request::Shutdown(ShutdownMode::Invalid));
        assert_eq!(ok(b"shutdown 1 2\r\n").0, Request::Shutdown(ShutdownMode::Invalid));
        assert_eq!(ok(b"stats\r\n").0, Request::Stats(StatsCmd::General));
        assert_eq!(ok(b"stats  \r\n").0, Request::Stats(StatsCmd::General));
        assert_eq!(ok(b"stats reset foo\r\n").0, Request::Stats(StatsCmd::Reset));
        assert_eq!(ok(b"stats settings\r\n").0, Request::Stats(StatsCmd::Settings));
        assert_eq!(ok(b"stats items\r\n").0, Request::Stats(StatsCmd::Items));
        assert_eq!(ok(b"stats slabs\r\n").0, Request::Stats(StatsCmd::Slabs));
        assert_eq!(ok(b"stats foo\r\n").0, Request::Stats(StatsCmd::Unknown));
        assert_eq!(ok(b"stats detail on\r\n").0, Request::Stats(StatsCmd::DetailOn));
        assert_eq!(err(b"stats detail\r\n").0, StatsDetailUsage);
        assert_eq!(err(b"stats detail foo\r\n").0, StatsDetailUsage);
        assert_eq!(err(b"stats cachedump 1\r\n").0, BadCommandLine);
        assert_eq!(err(b"stats cachedump x 1\r\n").0, BadFormat);
        assert_eq!(err(b"stats cachedump 64 1\r\n").0, IllegalSlabId);
        for m in [&b"mg a v\r\n"[..], b"ms a 1\r\nx\r\n", b"md a\r\n", b"ma a\r\n", b"mn\r\n", b"me a\r\n"] {
            assert_eq!(ok(m).0, Request::Meta);
        }
        assert_eq!(err(b"mx a\r\n").0, Error);
        assert_eq!(err(b"misbehave\r\n").0, Error);
        let admin = |i: &'static [u8]| match ok(i).0 {
            Request::Admin { line, noreply } => (line, noreply),
            other => panic!("{other:?}"),
        };
        let memlimit = |i: &'static [u8]| match ok(i).0 {
            Request::CacheMemlimit { megabytes, noreply } => (megabytes, noreply),
            other => panic!("{other:?}"),
        };
        assert_eq!(memlimit(b"cache_memlimit 100\r\n"), (100, false));
        assert_eq!(memlimit(b"cache_memlimit 08\r\n"), (8, false));
        assert_eq!(memlimit(b"cache_memlimit 1000000000 noreply\r\n"), (1_000_000_000, true));
        assert_eq!(memlimit(b"cache_memlimit 100 x\r\n"), (100, false));
        assert_eq!(admin(b"cache_memlimit abc\r\n"), (&b"ERROR\r\n"[..], false));
        assert_eq!(admin(b"cache_memlimit -5\r\n"), (&b"ERROR\r\n"[..], false));
        assert_eq!(
            admin(b"cache_memlimit 7\r\n").0,
            &b"MEMLIMIT_TOO_SMALL cannot set maxbytes to less than 8m\r\n"[..]
        );
        assert_eq!(
            admin(b"cache_memlimit 4294967296\r\n").0,
            &b"MEMLIMIT_TOO_SMALL cannot set maxbytes to less than 8m\r\n"[..]
        );
        assert_eq!(
            admin(b"cache_memlimit 1000000001 noreply\r\n"),
            (&b"MEMLIMIT_ADJUST_FAILED input value is megabytes not bytes\r\n"[..], true)
        );
        assert_eq!(line_key(b"set k:1 0 0 1\r\nxx\r\n"), b"k:1");
        assert_eq!(line_key(b"  cas  a  0 0 1 1\r\n"), b"a");
        assert_eq!(line_key(b"set\r\n"), b"");
        assert_eq!(admin(b"slabs automove 1\r\n"), (&b"OK\r\n"[..], false));
        assert_eq!(admin(b"slabs automove 3\r\n"), (&b"ERROR\r\n"[..], false));
        assert_eq!(admin(b"slabs\r\n"), (&b"ERROR\r\n"[..], false));
        assert_eq!(admin(b"lru_crawler bogus\r\n"), (&b"ERROR\r\n"[..], false));
        assert_eq!(admin(b"lru_crawler sleep 5\r\n"), (&b"OK\r\n"[..], false));
        assert_eq!(err(b"foo HTTP/1.1\r\n").0, Close);
        assert_eq!(err(b"GET / HTTP/1.1\r\n").0, Close);
        assert_eq!(err(b"foo bar\r\n").0, Error);
    }

    #[test]
    fn stats_tab_is_part_of_the_word() {
        // "stats\tx" is one token, an unknown command.
        assert_eq!(err(b"stats\tx\r\n").0, Error);
    }

    #[test]
    fn pending_store_lines() {
        let l = lim();
        let p = pending_store(b"set k 0 0 10 noreply\r\nabc", &l).unwrap();
        assert_eq!(p, PendingStore { cmd: StoreCmd::Set, key: b"k", noreply: true, line_bytes: 22, block_bytes: 12 });
        assert_eq!(pending_store(b"set k 0 0 1\r\na\r\n", &l), None);
        assert_eq!(pending_store(b"set k 0 0 1", &l), None);
        assert_eq!(pending_store(b"get k\r\n", &l), None);
        assert_eq!(pending_store(b"set k 0 0 x\r\n", &l), None);
        assert!(is_multiget_start(b"  gets a b"));
        assert!(!is_multiget_start(b"gat 0 a"));
    }

    #[test]
    fn over_long_lines() {
        assert_eq!(p(&[b'x'; 2048]), Parsed::Incomplete);
        assert_eq!(err(&[b'x'; 2049]), (Close, false, 2049));
        let mg = [b"get ".as_slice(), &b"a ".repeat(1500)].concat();
        assert_eq!(p(&mg), Parsed::Incomplete);
        let mg = [b"gets ".as_slice(), &b"a ".repeat(1500)].concat();
        assert_eq!(p(&mg), Parsed::Incomplete);
        let sp = [&[b' '; 100][..], b"get ", &b"a ".repeat(1500)].concat();
        assert_eq!(p(&sp), Parsed::Incomplete);
        let sp = [&[b' '; 101][..], b"get ", &b"a ".repeat(1500)].concat();
        assert_eq!(err(&sp).0, Close);
        let gat = [b"gat 0 ".as_slice(), &b"a ".repeat(1500)].concat();
        assert_eq!(err(&gat).0, Close);
        // A line with its newline is processed whatever its length.
        let v = [b"version".as_slice(), &[b' '; 5000], b"\r\n"].concat();
        assert_eq!(ok(&v).0, Request::Version);
        // The multiget bound.
        let l = Limits { multiget_line_bytes_max: 4096, ..lim() };
        let mg = [b"get ".as_slice(), &b"a ".repeat(3000)].concat();
        assert!(matches!(parse(&mg, &l), Parsed::Invalid { error: TextError { kind: Close, .. }, .. }));
    }

    #[test]
    fn composers() {
        let mut out = Vec::new();
        compose_value(&mut out, b"k", 4294967295, b"xy", None);
        compose_value(&mut out, b"k", 0, b"", Some(18446744073709551615));
        compose_end(&mut out);
        compose_number(&mut out, 0);
        compose_stat_u64(&mut out, "pid", 42);
        compose_i64(&mut out, -5);
        assert_eq!(
            out,
            b"VALUE k 4294967295 2\r\nxy\r\nVALUE k 0 0 18446744073709551615\r\n\r\nEND\r\n0\r\nSTAT pid 42\r\n-5"
                .to_vec()
        );
    }

    #[test]
    fn random_input_never_panics() {
        // Deterministic xorshift; print the seed so a failure can be replayed.
        let seed: u64 = 0x5eed_1234_abcd_0001;
        println!("seed {seed:#x}");
        let mut s = seed;
        let alphabet = b"getsadcrplinouhfv 0123456789-+\r\n\t\x00kx";
        for _ in 0..20000 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let len = (s % 40) as usize;
            let mut buf = Vec::with_capacity(len);
            let mut t = s;
            for _ in 0..len {
                t ^= t << 13;
                t ^= t >> 7;
                t ^= t << 17;
                buf.push(alphabet[(t % alphabet.len() as u64) as usize]);
            }
            match parse(&buf, &lim()) {
                Parsed::Complete { consumed, request } => {
                    assert!(consumed > 0 && consumed <= buf.len());
                    if let Request::Get { keys, .. } = request {
                        for k in keys {
                            assert!(!k.is_empty() && !k.contains(&b' '));
                        }
                    }
                }
                Parsed::Invalid { consumed, .. } => assert!(consumed > 0 && consumed <= buf.len()),
                Parsed::Incomplete => {}
            }
        }
    }
}

#[cfg(test)]
mod bench {
    use super::*;
    use std::time::Instant;

    /// Parser cost alone; `cargo test --release -p slipstream-proto --lib text::bench -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn parse_ns_per_request() {
        let l = Limits::default();
        for line in [&b"get key:000001\r\n"[..], b"set key:000002 0 0 32\r\n01234567890123456789012345678901\r\n"] {
            let n = 2_000_000;
            let start = Instant::now();
            let mut total = 0usize;
            for _ in 0..n {
                if let Parsed::Complete { consumed, .. } = parse(std::hint::black_box(line), &l) {
                    total += consumed;
                }
            }
            assert!(total > 0);
            println!(
                "{:?}: {:.1} ns",
                String::from_utf8_lossy(&line[..3]),
                start.elapsed().as_nanos() as f64 / n as f64
            );
        }
    }
}
