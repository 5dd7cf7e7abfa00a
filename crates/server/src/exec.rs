//! The contract between the network loops and the protocol executors.
//!
//! What it is for: a network loop hands an executor the unconsumed input of one connection (or
//! one UDP datagram's payload) and an output buffer; the executor handles exactly one request
//! from the front, appends its reply bytes, and says how many bytes it used. The loop repeats
//! until `Incomplete`, then writes all replies of the batch at once (coalescing).
//!
//! What it is not for: I/O. Executors never touch sockets, so they are unit-testable and the
//! same executor serves TCP and UDP.

use crate::bufbudget::BufBudget;
use crate::outq::{SharedQueue, SHARE_VALUE_BYTES_MIN};
use crate::stats::{ServerInfo, ThreadStats};
use crate::stats_prefix::{PrefixSink, PrefixStats};
use crate::tunables::Tunables;
use slipstream_proto::text::watch_class;
use slipstream_store::{Store, StoreResult};
use std::sync::Arc;

/// Which wire protocol a connection speaks; decided by its first byte (0x80 = binary), as
/// memcached does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Undecided,
    Text,
    Binary,
}

impl Protocol {
    /// The protocol a new TCP connection starts in under `-B` (UDP decides per datagram
    /// whatever `-B` says, as memcached does).
    pub fn bound_by(b: crate::tunables::BindingProtocol) -> Protocol {
        use crate::tunables::BindingProtocol;
        match b {
            BindingProtocol::Auto => Protocol::Undecided,
            BindingProtocol::Ascii => Protocol::Text,
            BindingProtocol::Binary => Protocol::Binary,
        }
    }
}

/// Transport the request arrived on; some replies differ (UDP has no `quit`, and large
/// replies are split into datagrams by the loop).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Tcp,
    Udp,
}

/// Per-connection protocol state that outlives one request.
#[derive(Debug)]
pub struct ConnState {
    pub protocol: Protocol,
    pub transport: Transport,
    /// Bytes still to discard after an over-size or refused storage command (memcached's
    /// `conn_swallow`). The text executor drains this before parsing.
    pub swallow_bytes: usize,
    /// Binary protocol: replies of quiet commands held back until a non-quiet one.
    pub quiet_pending: bool,
    /// UDP only: offsets in `out` where memcached would start a new response object (each
    /// key of a multi-get is its own). The UDP loop sends each non-empty piece as its own
    /// message, as memcached does.
    pub udp_marks: Vec<usize>,
    /// This connection's key in `ServerInfo::conns`: its fd, or for UDP the socket's listed
    /// fd, as memcached numbers them (-1 when it has none: tests).
    pub conn_id: i32,
    /// UDP only: who sent the datagram being served (`stats conns` shows the asking UDP
    /// socket with it, as memcached's does).
    pub udp_peer: Option<std::net::SocketAddr>,
    /// Bytes of `Settings::conn_buf` this connection's unsent replies hold (given back by the
    /// network loop when the socket has taken them or the connection closes).
    pub reply_charged_bytes: usize,
    /// Large values the unsent replies send by reference (TCP only; see `outq`). Positions
    /// are offsets in the connection's reply buffer.
    pub shared: SharedQueue,
    /// Passed the server's authentication (`auth`); always true when it requires none.
    pub authenticated: bool,
    /// Ascii auth: the `set` line was read; its data (token + CRLF) is this long.
    pub auth_body_bytes: Option<usize>,
    /// SASL: an AUTH without data asked for it; the next STEP brings it.
    pub sasl_continue: bool,
    /// `lru_crawler metadump` in progress: the TCP loop produces the rest as the client
    /// reads, before any later request runs (see `memcache_admin::dump_more`, which steps it).
    pub dump: Option<crate::crawler::DumpCursor>,
    /// `watch` accepted this watcher (its id in `Settings::logger`): the network loop hands
    /// the connection to the log writer after this batch.
    pub watcher: Option<u64>,
}

impl ConnState {
    pub fn new(transport: Transport) -> ConnState {
        ConnState {
            protocol: Protocol::Undecided,
            transport,
            swallow_bytes: 0,
            quiet_pending: false,
            udp_marks: Vec::new(),
            conn_id: -1,
            udp_peer: None,
            reply_charged_bytes: 0,
            shared: SharedQueue::default(),
            authenticated: false,
            auth_body_bytes: None,
            sasl_continue: false,
            dump: None,
            watcher: None,
        }
    }
}

/// Server-wide settings the executors need (from the command line / config).
#[derive(Clone, Debug)]
pub struct Settings {
    /// Longest request line without a newline before memcached's handling kicks in (2048).
    pub line_bytes_max: usize,
    /// `shutdown` command allowed (memcached `-A`).
    pub shutdown_enabled: bool,
    /// `flush_all` allowed (memcached `-F` disables it).
    pub flush_enabled: bool,
    /// Text reported by `version`.
    pub version: &'static str,
    /// The byte that ends a key's prefix for `stats detail` (memcached `-D`, default ':').
    pub prefix_delimiter: u8,
    /// Per-prefix counting on from the start (memcached `-D` turns it on); `stats detail
    /// on|off` switches it at run time.
    pub detail_enabled: bool,
    /// The budget all connections' buffers share (see `bufbudget`).
    pub conn_buf: Arc<BufBudget>,
    /// memcached's command-line tunables (`-R`, `-B`, `-b`, `-o idle_timeout`, ...).
    pub tunables: Tunables,
    /// Authentication every connection must pass first (`-Y` / `-S`); None = none.
    pub auth: Option<Arc<crate::credentials::Auth>>,
    /// `-s <path>`: the unix socket served instead of TCP/UDP (for `stats settings`).
    pub domain_socket: Option<String>,
    /// `-a <mask>`: the unix socket's permission bits (memcached's default 0700).
    pub socket_mode: u32,
    /// The log stream `watch` connections receive (shared by every tenant, as memcached has
    /// one logger).
    pub logger: Arc<crate::watch::Logger>,
    /// `-Z`: the TLS state (`refresh_certs` reloads it, `stats` shows its counters).
    pub tls: Option<Arc<crate::transport::tls::TlsState>>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            line_bytes_max: slipstream_proto::rules::LINE_BYTES_MAX,
            shutdown_enabled: false,
            flush_enabled: true,
            version: crate::VERSION_STRING,
            prefix_delimiter: b':',
            detail_enabled: false,
            conn_buf: Arc::new(BufBudget::default()),
            tunables: Tunables::default(),
            auth: None,
            domain_socket: None,
            socket_mode: 0o700,
            logger: Arc::default(),
            tls: None,
        }
    }
}

/// Everything an executor may use while handling one request.
pub struct Ctx<'a> {
    /// Shared so that a background job (the LRU crawler) can hold it.
    pub store: &'a Arc<Store>,
    /// This thread's counters (no sharing on the hot path).
    pub stats: &'a ThreadStats,
    pub settings: &'a Settings,
    /// Server-wide gauges and all threads' counters, for `stats`.
    pub server: &'a ServerInfo,
    pub conn: &'a mut ConnState,
}

impl Ctx<'_> {
    /// Make room in `out` for `extra` more reply bytes, charging the connection-buffer budget
    /// for whatever the buffer's capacity grows beyond the free part (TCP only; a UDP reply is
    /// sent before the next datagram is read). False means the budget refused: the get that
    /// asked answers with its out-of-memory reply instead of copying the value.
    ///
    /// Capacity, not length, is charged (what the allocator hands out is what may be resident),
    /// and it grows by half at a time so a multi-get copies each byte a bounded number of times.
    pub fn reserve_reply(&mut self, out: &mut Vec<u8>, extra: usize) -> bool {
        let need = out.len().saturating_add(extra);
        if need <= out.capacity() || self.conn.transport == Transport::Udp {
            return true;
        }
        let target = need.max(out.capacity().saturating_add(out.capacity() / 2));
        if !self.settings.conn_buf.charge_reply(&mut self.conn.reply_charged_bytes, target) {
            return false;
        }
        out.reserve_exact(target - out.len());
        true
    }
}

/// Log-stream events (`watch`): each first checks, with one relaxed atomic load, that a
/// watcher wants the class; building the line is out of line (see `watch`).
impl Ctx<'_> {
    /// memcached's `item_get` line for a read that found a value of `found` bytes (or met
    /// nothing, a flushed or an expired item).
    #[inline(always)]
    pub fn log_get(&self, key: &[u8], found: crate::watch::GetFound) {
        if self.settings.logger.wants(watch_class::FETCHERS) {
            let cfd = self.conn.conn_id;
            self.settings.logger.log(watch_class::FETCHERS, |o| crate::watch::item_get_line(key, found, cfd, o));
        }
    }

    /// memcached looks an item up (and logs `item_get`) before a store, delete, touch or
    /// arithmetic changes it: the same line, from a look that changes nothing.
    #[inline(always)]
    pub fn log_lookup(&self, key: &[u8]) {
        if self.settings.logger.wants(watch_class::FETCHERS) {
            self.log_lookup_slow(key);
        }
    }

    #[cold]
    #[inline(never)]
    fn log_lookup_slow(&self, key: &[u8]) {
        let found =
            self.store.get(key, slipstream_store::GetOpts::default(), |o| o.item.map(|i| i.value.len()).ok_or(o.miss));
        self.log_get(key, found);
    }

    /// memcached's `item_store` line: `result` of a `cmd` store of `value_bytes` with raw
    /// exptime `exptime`.
    #[inline(always)]
    pub fn log_store(&self, key: &[u8], cmd: &'static str, result: StoreResult, exptime: i64, value_bytes: usize) {
        if self.settings.logger.wants(watch_class::MUTATIONS) {
            self.log_store_slow(key, cmd, result, exptime, value_bytes);
        }
    }

    #[cold]
    #[inline(never)]
    fn log_store_slow(&self, key: &[u8], cmd: &'static str, result: StoreResult, exptime: i64, value_bytes: usize) {
        let status = match result {
            StoreResult::Stored(_) => "stored",
            StoreResult::NotStored => "not_stored",
            StoreResult::Exists => "exists",
            StoreResult::NotFound => "not_found",
            StoreResult::TooLarge => "too_large",
            StoreResult::NoMemory => "no_memory",
        };
        let refused = matches!(result, StoreResult::TooLarge | StoreResult::NoMemory);
        // memcached: the item's expiry less the current time, unsigned; 0 = never.
        let rel = if refused { 0 } else { self.store.rel_exptime(exptime) };
        let mut ttl_s = if rel == 0 { 0 } else { rel.wrapping_sub(self.store.clock().now_rel_s()) };
        let mut value_bytes = if refused { 0 } else { value_bytes };
        if matches!(result, StoreResult::Stored(_)) && matches!(cmd, "append" | "prepend") {
            // memcached logs the combined item, which keeps the old one's expiry.
            let now = self
                .store
                .get(key, slipstream_store::GetOpts::default(), |o| o.item.map(|i| (i.value.len(), i.ttl_remaining_s)));
            if let Some((n, ttl)) = now {
                value_bytes = n;
                ttl_s = u32::try_from(ttl).unwrap_or(0);
            }
        }
        let e = crate::watch::StoreEvent { key, status, cmd, ttl_s, value_bytes, cfd: self.conn.conn_id };
        self.settings.logger.log(watch_class::MUTATIONS, |o| crate::watch::item_store_line(&e, o));
    }
}

impl PrefixSink for Ctx<'_> {
    fn prefix_stats(&self) -> &PrefixStats {
        &self.server.prefix_stats
    }

    fn prefix_delimiter(&self) -> u8 {
        self.settings.prefix_delimiter
    }
}

impl Ctx<'_> {
    /// Discard the unsent replies from byte `len` of `out` on (memcached culls replies not yet
    /// written on some errors), with the values they send by reference.
    pub fn truncate_reply(&mut self, out: &mut Vec<u8>, len: usize) {
        out.truncate(len);
        self.conn.shared.discard_after(len);
    }

    /// Whether a hit's value of `value_bytes` will be sent by reference rather than copied: a
    /// large value, on TCP, while the connection's pinned values stay within their cap. The
    /// caller then reserves reply room for its header only, and calls `put_value`.
    pub fn shares_value(&self, value_bytes: usize) -> bool {
        self.conn.transport == Transport::Tcp
            && value_bytes >= SHARE_VALUE_BYTES_MIN
            && self.conn.shared.has_room(value_bytes)
    }

    /// Append a hit's `value` (the tail of the item allocation `data`) to the reply: queued by
    /// reference at the current end of `out` when `share` (from `shares_value`), else copied.
    pub fn put_value(&mut self, out: &mut Vec<u8>, share: bool, data: &Arc<[u8]>, value: &[u8]) {
        if share {
            let len = data.len();
            self.conn.shared.push(out.len(), data, len - value.len()..len);
        } else {
            out.extend_from_slice(value);
        }
    }
}

/// What handling one request did.
///
/// `out` holds only replies not yet handed to the socket; an executor may truncate it to
/// emulate memcached discarding unsent replies (it does so on some errors and on close).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Used this many bytes (> 0) of the input; replies (if any) are in `out`.
    Consumed(usize),
    /// The front of the input is not a whole request yet; nothing was consumed.
    Incomplete,
    /// Flush `out`, then close the connection: input memcached answers by closing (logged as
    /// `reason=error` to watchers, as memcached's default close reason is).
    Close,
    /// `quit` (text or binary): flush `out`, then close (`reason=normal`).
    Quit,
    /// `shutdown`: flush `out`, then stop the server.
    Shutdown,
}
