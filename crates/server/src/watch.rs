//! memcached's log stream (`watch`): connections that asked to watch receive one line per
//! event of the classes they named, in memcached 1.6.18's format (logger.c), and nothing else.
//!
//! What it is for: the watcher list (at most `WATCHERS_MAX`, memcached's limit), each watcher's
//! bounded buffer (memcached's `watcher_logbuf_size`, `WATCHER_BUF_BYTES` by default) with
//! memcached's `skipped=N` line when a slow watcher made it drop lines, the writer thread that
//! hands those buffers to the watchers' sockets (and, through `OnClose`, ends a watcher's
//! connection as the network loop would), and the event lines (`item_get`, `item_store`,
//! `eviction`, `conn_new`, `conn_close`).
//!
//! Cost when nobody watches: every event site first asks `Logger::wants(class)`, one relaxed
//! atomic load of the classes the attached watchers want; the line is only built, and the
//! watcher list only locked, when that says yes.
//!
//! What it is not for: deciding where events happen (the executors and the network loop call
//! in) or the `watch` command's parsing (slipstream-proto).

use crate::transport::Stream;
use slipstream_proto::text::watch_class;
use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// memcached's `WATCHER_LIMIT`.
pub const WATCHERS_MAX: usize = 20;
/// memcached's default `watcher_logbuf_size` (256 KB): the most a watcher's unsent lines hold.
pub const WATCHER_BUF_BYTES: usize = 256 * 1024;
/// memcached's bipbuf_request asks for the line plus this much (room for a `skipped=` line).
const LINE_SLACK_BYTES: usize = 128;
/// How long the writer sleeps while a watcher's socket is full, and while idle (it then only
/// looks for watchers that hung up).
const WRITER_BLOCKED_MS: u64 = 5;
const WRITER_IDLE_MS: u64 = 100;

/// Why `Logger::reserve` refused a watcher.
#[derive(Debug, PartialEq, Eq)]
pub enum WatchRefused {
    /// memcached's `WATCHER_TOO_MANY log watcher limit reached`.
    TooMany,
}

/// The counters `stats` shows (memcached's `log_*`).
#[derive(Default)]
pub struct LogStats {
    pub worker_written: AtomicU64,
    pub watcher_sent: AtomicU64,
    pub watcher_skipped: AtomicU64,
    pub watchers: AtomicU64,
}

struct Watcher {
    id: u64,
    classes: u16,
    /// Lines logged before the watcher was added are not its (memcached's `min_gid`).
    min_gid: u64,
    /// Unsent bytes are `buf[sent..]`; never more than the logger's `buf_bytes_max` of them.
    buf: Vec<u8>,
    sent: usize,
    /// Lines dropped since the last one that fit.
    skipped: u64,
    /// None until the network loop hands the connection over.
    stream: Option<Stream>,
    /// Run when the writer drops the watcher, before its socket closes: the connection leaves
    /// the counts and `stats conns` then, and `conn_close` is logged (memcached's
    /// sidethread_conn_close).
    on_close: Option<OnClose>,
}

/// What the network loop does when a watcher's connection ends (see `Logger::attach`).
pub type OnClose = Box<dyn FnOnce() + Send>;

impl Watcher {
    fn pending(&self) -> usize {
        self.buf.len() - self.sent
    }

    /// Queue `line`, or count it skipped when the buffer cannot take it even after handing the
    /// socket what it will take now (memcached's logger_thread_write_entry polls the watcher
    /// before it skips). True if queued.
    fn offer(&mut self, line: &[u8], buf_bytes_max: usize, stats: &LogStats) -> bool {
        let fits = |w: &Watcher| w.pending() + line.len() + LINE_SLACK_BYTES <= buf_bytes_max;
        if !fits(self) && self.pending() > 0 {
            // A failed socket is the writer's to notice and drop.
            let _ = self.write_out();
        }
        if !fits(self) {
            self.skipped += 1;
            stats.watcher_skipped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        if self.sent > 0 {
            self.buf.drain(..self.sent);
            self.sent = 0;
        }
        if self.skipped > 0 {
            self.buf.extend_from_slice(format!("skipped={}\n", self.skipped).as_bytes());
            self.skipped = 0;
        }
        self.buf.extend_from_slice(line);
        stats.watcher_sent.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Write what the socket takes. Ok(false): it would block with bytes left.
    fn write_out(&mut self) -> io::Result<bool> {
        let Some(s) = self.stream.as_mut() else { return Ok(true) };
        while self.buf.len() > self.sent {
            match s.write(&self.buf[self.sent..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.buf.clear();
        self.sent = 0;
        s.drain()
    }

    /// The watcher's connection ends: `on_close` first, then the socket closes (so its fd
    /// cannot be reused while `stats conns` still lists it).
    fn close(mut self) {
        if let Some(f) = self.on_close.take() {
            f();
        }
        drop(self.stream.take());
    }

    /// Whether the peer hung up (memcached reads one byte: end-of-file or an error closes).
    fn hung_up(&mut self) -> bool {
        let Some(s) = self.stream.as_mut() else { return false };
        let mut b = [0u8; 64];
        match s.read(&mut b) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => !matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted),
        }
    }
}

#[derive(Default)]
struct Watchers {
    list: Vec<Watcher>,
    next_id: u64,
    writer_started: bool,
}

/// The server's one log stream.
pub struct Logger {
    /// Union of the attached watchers' classes: the only thing event sites read when nobody
    /// watches.
    wanted: AtomicU16,
    /// memcached's global log id (`gid=`), one per line.
    gid: AtomicU64,
    watchers: Mutex<Watchers>,
    /// Wakes the writer when a watcher's buffer goes from empty to not, or one is attached.
    wake: Condvar,
    /// Each watcher's buffer bound (`-o watcher_logbuf_size`).
    buf_bytes_max: usize,
    pub stats: LogStats,
}

impl std::fmt::Debug for Logger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Logger").field("wanted", &self.wanted).field("gid", &self.gid).finish_non_exhaustive()
    }
}

impl Default for Logger {
    fn default() -> Self {
        Logger::new(WATCHER_BUF_BYTES)
    }
}

impl Logger {
    /// A logger whose watchers each hold at most `buf_bytes_max` unsent bytes (memcached's
    /// `watcher_logbuf_size`; 0 drops every line, as memcached's empty buffer does).
    pub fn new(buf_bytes_max: usize) -> Logger {
        Logger {
            wanted: AtomicU16::new(0),
            gid: AtomicU64::new(0),
            watchers: Mutex::new(Watchers::default()),
            wake: Condvar::new(),
            buf_bytes_max,
            stats: LogStats::default(),
        }
    }

    /// Each watcher's buffer bound, for `stats settings`.
    pub fn watcher_buf_bytes(&self) -> usize {
        self.buf_bytes_max
    }

    /// Whether any watcher wants `class` lines: check this before building one.
    #[inline(always)]
    pub fn wants(&self, class: u16) -> bool {
        self.wanted.load(Ordering::Relaxed) & class != 0
    }

    fn lock(&self) -> MutexGuard<'_, Watchers> {
        self.watchers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set_wanted(&self, w: &Watchers) {
        let classes = w.list.iter().fold(0, |a, x| a | x.classes);
        self.wanted.store(classes, Ordering::Relaxed);
        self.stats.watchers.store(w.list.len() as u64, Ordering::Relaxed);
    }

    /// Add a watcher of `classes` whose first bytes are memcached's `OK\r\n`; lines start
    /// flowing into its buffer now, and out once `attach` gives it its socket.
    pub fn reserve(&self, classes: u16) -> Result<u64, WatchRefused> {
        let mut w = self.lock();
        if w.list.len() >= WATCHERS_MAX {
            return Err(WatchRefused::TooMany);
        }
        w.next_id += 1;
        let id = w.next_id;
        let min_gid = self.gid.fetch_add(1, Ordering::Relaxed) + 1;
        w.list.push(Watcher {
            id,
            classes,
            min_gid,
            buf: b"OK\r\n".to_vec(),
            sent: 0,
            skipped: 0,
            stream: None,
            on_close: None,
        });
        self.set_wanted(&w);
        Ok(id)
    }

    /// Forget watcher `id` (its connection could not be handed over, or went away).
    pub fn release(&self, id: u64) {
        let mut w = self.lock();
        w.list.retain(|x| x.id != id);
        self.set_wanted(&w);
    }

    /// Give watcher `id` its connection: from now on the writer thread owns the socket, and
    /// runs `on_close` when it drops the watcher (before the socket closes). If the watcher is
    /// gone already, `on_close` runs now.
    pub fn attach(self: &Arc<Self>, id: u64, stream: Stream, on_close: OnClose) {
        let mut w = self.lock();
        let Some(x) = w.list.iter_mut().find(|x| x.id == id) else {
            drop(w);
            on_close();
            return;
        };
        x.stream = Some(stream);
        x.on_close = Some(on_close);
        if !w.writer_started {
            let me = self.clone();
            let spawned = std::thread::Builder::new().name("slipstream-log".into()).spawn(move || me.writer());
            match spawned {
                Ok(_) => w.writer_started = true,
                Err(e) => {
                    eprintln!("slipstream: cannot start the log writer: {e}");
                    let gone: Vec<Watcher> = w.list.extract_if(.., |x| x.id == id).collect();
                    self.set_wanted(&w);
                    drop(w);
                    gone.into_iter().for_each(Watcher::close);
                    return;
                }
            }
        }
        self.wake.notify_one();
    }

    /// Log one `class` line: `body` writes what follows memcached's `ts=... gid=... ` prefix
    /// (its `\n` included). Call only after `wants(class)`.
    #[cold]
    #[inline(never)]
    pub fn log(&self, class: u16, body: impl FnOnce(&mut Vec<u8>)) {
        let gid = self.gid.fetch_add(1, Ordering::Relaxed) + 1;
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        // memcached prints the microseconds unpadded (`%lld.%d`).
        let mut line = format!("ts={}.{} gid={gid} ", now.as_secs(), now.subsec_micros()).into_bytes();
        body(&mut line);
        let mut w = self.lock();
        let mut woke = false;
        for x in w.list.iter_mut().filter(|x| x.classes & class != 0 && gid >= x.min_gid) {
            let was_empty = x.pending() == 0;
            if x.offer(&line, self.buf_bytes_max, &self.stats) && was_empty && x.stream.is_some() {
                woke = true;
            }
        }
        drop(w);
        self.stats.worker_written.fetch_add(1, Ordering::Relaxed);
        if woke {
            self.wake.notify_one();
        }
    }

    /// The writer thread: hands each watcher's buffer to its socket, drops watchers that hung
    /// up or failed, sleeps while there is nothing to do.
    fn writer(self: Arc<Self>) {
        let mut w = self.lock();
        loop {
            let mut blocked = false;
            let gone: Vec<Watcher> = w
                .list
                .extract_if(.., |x| {
                    if x.stream.is_none() {
                        return false;
                    }
                    match x.write_out() {
                        Ok(done) => blocked |= !done,
                        Err(_) => return true,
                    }
                    x.hung_up()
                })
                .collect();
            if !gone.is_empty() {
                self.set_wanted(&w);
                // Its close is logged like any connection's, which takes the lock.
                drop(w);
                gone.into_iter().for_each(Watcher::close);
                w = self.lock();
            }
            let wait = Duration::from_millis(if blocked { WRITER_BLOCKED_MS } else { WRITER_IDLE_MS });
            w = match self.wake.wait_timeout(w, wait) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        }
    }
}

/// memcached's uriencode (keys in log lines and metadump): RFC 3986 unreserved bytes as they
/// are, the rest as `%XX`.
pub fn uriencode(key: &[u8], out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in key {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b);
        } else {
            out.extend_from_slice(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]);
        }
    }
}

/// What an `item_get` line reports: the value's size when found, else what the read met
/// (memcached's `status=not_found|flushed|expired`, all with clsid 0 and size 0).
pub type GetFound = Result<usize, slipstream_store::Miss>;

/// `type=item_get ...` (memcached's _logger_parse_ige).
pub fn item_get_line(key: &[u8], found: GetFound, cfd: i32, out: &mut Vec<u8>) {
    use slipstream_store::Miss;
    out.extend_from_slice(b"type=item_get key=");
    uriencode(key, out);
    let (status, clsid, size) = match found {
        Ok(n) => ("found", 1, n),
        Err(Miss::Absent) => ("not_found", 0, 0),
        Err(Miss::Flushed) => ("flushed", 0, 0),
        Err(Miss::Expired) => ("expired", 0, 0),
    };
    out.extend_from_slice(format!(" status={status} clsid={clsid} cfd={cfd} size={size}\n").as_bytes());
}

/// memcached's `item_store` line fields.
pub struct StoreEvent<'a> {
    pub key: &'a [u8],
    /// memcached's status name (`stored`, `not_stored`, `exists`, `not_found`, `too_large`,
    /// `no_memory`).
    pub status: &'static str,
    /// `set`, `add`, `replace`, `append`, `prepend`, `cas`.
    pub cmd: &'static str,
    /// Seconds left to live (0 = never), as memcached's unsigned `ttl=`.
    pub ttl_s: u32,
    /// Value bytes (0 for a refused item, as memcached logs it).
    pub value_bytes: usize,
    pub cfd: i32,
}

/// `type=item_store ...` (memcached's _logger_parse_ise). Slipstream reports every item in
/// class 1, as `stats items` does.
pub fn item_store_line(e: &StoreEvent<'_>, out: &mut Vec<u8>) {
    out.extend_from_slice(b"type=item_store key=");
    uriencode(e.key, out);
    // memcached logs a refused item (too large, no memory) before it has a class.
    let clsid = u8::from(!matches!(e.status, "too_large" | "no_memory"));
    out.extend_from_slice(
        format!(
            " status={} cmd={} ttl={} clsid={clsid} cfd={} size={}\n",
            e.status, e.cmd, e.ttl_s, e.cfd, e.value_bytes
        )
        .as_bytes(),
    );
}

/// How a connection event names its peer: memcached's `rip`, `rport` and `transport`.
#[derive(Clone, Debug)]
pub struct Peer {
    pub rip: String,
    pub rport: u16,
    /// `tcp`, `udp` or `local` (unix socket).
    pub transport: &'static str,
}

impl Peer {
    pub fn tcp(addr: std::net::SocketAddr) -> Peer {
        Peer { rip: addr.ip().to_string(), rport: addr.port(), transport: "tcp" }
    }

    pub fn unix() -> Peer {
        Peer { rip: "unix".into(), rport: 0, transport: "local" }
    }
}

/// memcached's close reasons (`reason=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CloseReason {
    Error,
    Normal,
    IdleTimeout,
    Shutdown,
}

impl CloseReason {
    fn name(self) -> &'static str {
        match self {
            CloseReason::Error => "error",
            CloseReason::Normal => "normal",
            CloseReason::IdleTimeout => "idle_timeout",
            CloseReason::Shutdown => "shutdown",
        }
    }
}

/// `type=conn_new ...` / `type=conn_close ...` (memcached's _logger_parse_cne / _cce).
pub fn log_conn(logger: &Logger, peer: &Peer, cfd: i32, closed: Option<CloseReason>) {
    if !logger.wants(watch_class::CONNEVENTS) {
        return;
    }
    logger.log(watch_class::CONNEVENTS, |out| {
        let head = format!("rip={} rport={} transport={}", peer.rip, peer.rport, peer.transport);
        let line = match closed {
            None => format!("type=conn_new {head} cfd={cfd}\n"),
            Some(r) => format!("type=conn_close {head} reason={} cfd={cfd}\n", r.name()),
        };
        out.extend_from_slice(line.as_bytes());
    });
}

/// Have `store` log its evictions to `logger` (`type=eviction ...`, memcached's
/// _logger_parse_ee) while someone watches evictions.
pub fn log_evictions(logger: &Arc<Logger>, store: &slipstream_store::Store) {
    let logger = logger.clone();
    store.set_eviction_log(Arc::new(move |e: &slipstream_store::Evicted<'_>| {
        if !logger.wants(watch_class::EVICTIONS) {
            return;
        }
        logger.log(watch_class::EVICTIONS, |out| {
            out.extend_from_slice(b"type=eviction key=");
            uriencode(e.key, out);
            let fetch = if e.fetched { "yes" } else { "no" };
            let rest =
                format!(" fetch={fetch} ttl={} la={} clsid=1 size={}\n", e.ttl_s, e.last_access_ago_s, e.value_bytes);
            out.extend_from_slice(rest.as_bytes());
        });
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nobody_watching_wants_nothing() {
        let l = Logger::default();
        assert!(!l.wants(watch_class::FETCHERS));
        let id = l.reserve(watch_class::FETCHERS | watch_class::MUTATIONS).expect("room");
        assert!(l.wants(watch_class::FETCHERS) && !l.wants(watch_class::EVICTIONS));
        l.release(id);
        assert!(!l.wants(watch_class::FETCHERS));
    }

    #[test]
    fn at_most_twenty_watchers() {
        let l = Logger::default();
        for _ in 0..WATCHERS_MAX {
            l.reserve(watch_class::FETCHERS).expect("room");
        }
        assert_eq!(l.reserve(watch_class::FETCHERS), Err(WatchRefused::TooMany));
    }

    #[test]
    fn a_full_buffer_skips_lines_and_says_how_many() {
        let l = Logger::default();
        l.reserve(watch_class::FETCHERS).expect("room");
        let line = vec![b'x'; 1000];
        for _ in 0..400 {
            l.log(watch_class::FETCHERS, |o| o.extend_from_slice(&line));
        }
        let sent = l.stats.watcher_sent.load(Ordering::Relaxed);
        let skipped = l.stats.watcher_skipped.load(Ordering::Relaxed);
        assert_eq!(sent + skipped, 400);
        assert!(skipped > 0 && sent > 200, "sent {sent} skipped {skipped}");
        assert!(l.lock().list[0].pending() <= WATCHER_BUF_BYTES);
        // A 1 KB buffer (`-o watcher_logbuf_size=1`) takes a few lines only.
        let small = Logger::new(1024);
        small.reserve(watch_class::FETCHERS).expect("room");
        for _ in 0..10 {
            small.log(watch_class::FETCHERS, |o| o.extend_from_slice(&line[..300]));
        }
        let small_sent = small.stats.watcher_sent.load(Ordering::Relaxed);
        assert!((1..4).contains(&small_sent), "sent {small_sent}");
        assert_eq!(small_sent + small.stats.watcher_skipped.load(Ordering::Relaxed), 10);
        assert!(small.lock().list[0].pending() <= 1024);
        let mut w = l.lock();
        // Drained, the next line that fits is preceded by memcached's skipped line.
        w.list[0].sent = w.list[0].buf.len();
        drop(w);
        l.log(watch_class::FETCHERS, |o| o.extend_from_slice(b"type=x\n"));
        let w = l.lock();
        let tail = String::from_utf8_lossy(&w.list[0].buf[w.list[0].sent..]).to_string();
        assert!(tail.starts_with(&format!("skipped={skipped}\nts=")), "{tail}");
    }

    #[test]
    fn lines_are_memcacheds() {
        let mut o = Vec::new();
        item_get_line(b"a b", Ok(3), 15, &mut o);
        assert_eq!(o, b"type=item_get key=a%20b status=found clsid=1 cfd=15 size=3\n");
        o.clear();
        item_get_line(b"k", Err(slipstream_store::Miss::Absent), 7, &mut o);
        assert_eq!(o, b"type=item_get key=k status=not_found clsid=0 cfd=7 size=0\n");
        o.clear();
        item_get_line(b"k", Err(slipstream_store::Miss::Expired), 7, &mut o);
        assert_eq!(o, b"type=item_get key=k status=expired clsid=0 cfd=7 size=0\n");
        o.clear();
        let e = StoreEvent { key: b"k", status: "stored", cmd: "set", ttl_s: 100, value_bytes: 2, cfd: 9 };
        item_store_line(&e, &mut o);
        assert_eq!(o, b"type=item_store key=k status=stored cmd=set ttl=100 clsid=1 cfd=9 size=2\n");
    }
}
