//! slipstream-streamsvc: the user-space stream offload engine of issue 5.
//!
//! What it is for: running the pure operators of `slipstream-stream` on live UDP traffic and
//! delivering their result lines to TCP subscribers. [`StreamService::start`] binds everything
//! (or fails with the reason) and starts:
//! - one ingest thread per stream (module `ingest`): its UDP socket, `recvmmsg` batches, the
//!   operator, and the stream's counters. One thread per stream rather than one loop for all,
//!   so a busy stream never delays another's windows or alerts, the hot path has no poll layer
//!   and no shared state but an append-only queue, and the blocking receive with
//!   `SO_RCVTIMEO` doubles as the window-closing tick.
//! - one hub thread (module `hub`): the results listener, subscriber buffers, `stats` lines.
//!
//! Clock: every `t_ns` in result lines is `CLOCK_MONOTONIC` in nanoseconds ([`clock_monotonic_ns`]),
//! read when a `recvmmsg` batch returns, so a generator or benchmark on the same host can
//! compare its own `CLOCK_MONOTONIC` send time with the alert's `t_ns` and its arrival time.
//!
//! Ports: `udp_port = 0` / `tcp_port = 0` are allowed here (the kernel picks, see
//! [`StreamService::results_addr`] / [`StreamService::stream_addrs`]) so tests can run in
//! parallel; `ResultsConfig::validate` / `StreamConfig::validate` refuse 0, so the daemon
//! should call them on user input, while this crate validates everything else itself.
//!
//! Counters (stats line and metrics): `datagrams` every datagram the socket delivered (all are
//! parsed), `records` / `malformed` / `over_limit` the parser's verdicts, `socket_drops` the
//! kernel's count (SO_RXQ_OVFL / SO_MEMINFO), `lines` result lines the operator produced (not
//! counting `stats` / `dropped` lines), `subscriber_drops` lines lost per subscriber.
//! `stop` does not flush open windows: a partial window at shutdown produces no line.
//!
//! What it is not for: TOML, the XDP engine, or operator semantics.

use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use mio::{Poll, Waker};
use slipstream_stream::config::{ConfigError, ResultsConfig};
use slipstream_stream::StreamConfig;

mod hub;
mod ingest;
mod xdp;

pub use hub::{RETAIN_BYTES_MAX, SUBSCRIBERS_MAX, SUBSCRIBE_LINE_BYTES_MAX, SUBSCRIBE_WAIT_NS};

/// Most streams one service runs.
pub const STREAMS_MAX: usize = 256;
/// Bytes of result lines one stream may have waiting for the hub; beyond that lines are
/// dropped for every subscriber (counted in `subscriber_drops`, announced as `dropped`).
pub const HUB_QUEUE_BYTES_MAX: usize = 64 << 20;
pub const SUBSCRIBER_BUFFER_BYTES_MAX: usize = 256 << 20;
pub const STATS_INTERVAL_MS_MAX: u64 = 3_600_000;
pub const UDP_RCVBUF_BYTES_MAX: usize = 1 << 30;

/// CLOCK_MONOTONIC now, in nanoseconds: the clock of every `t_ns` this engine writes (the same
/// clock `bpf_ktime_get_ns` reads; its one home is the fast-path crate).
pub use slipstream_fastpath::clock_monotonic_ns;

/// Everything the service needs.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// Address the UDP sockets and the results listener bind (the daemon's `-l`).
    pub listen: IpAddr,
    pub results: ResultsConfig,
    pub streams: Vec<StreamConfig>,
    /// Per-subscriber buffer bound (default 4 MiB).
    pub subscriber_buffer_bytes_max: usize,
    /// Period of each stream's `stats` line (default 1000).
    pub stats_interval_ms: u64,
    /// SO_RCVBUF asked for each UDP socket (default 8 MiB; best effort, see `bind_udp`).
    pub udp_rcvbuf_bytes: usize,
    /// Run the streams that fit it in the XDP engine on this interface (module `xdp`).
    pub xdp_iface: Option<String>,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        ServiceConfig {
            listen: IpAddr::V4(Ipv4Addr::LOCALHOST),
            results: ResultsConfig::default(),
            streams: Vec::new(),
            subscriber_buffer_bytes_max: 4 << 20,
            stats_interval_ms: 1000,
            udp_rcvbuf_bytes: 8 << 20,
            xdp_iface: None,
        }
    }
}

/// Why the service did not start.
#[derive(Debug)]
pub enum ServiceError {
    /// A stream's configuration is invalid.
    Config {
        stream: String,
        error: ConfigError,
    },
    Limit {
        key: &'static str,
        value: u64,
        max: u64,
    },
    BindUdp {
        stream: String,
        error: slipstream_bind::BindError,
    },
    BindTcp(slipstream_bind::BindError),
    Poll(io::Error),
    Thread(io::Error),
}

impl fmt::Display for ServiceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServiceError::Config { stream, error } => write!(f, "stream {stream:?}: {error}"),
            ServiceError::Limit { key, value, max } => write!(f, "{key} = {value}: expected 1..={max}"),
            ServiceError::BindUdp { stream, error } => write!(f, "stream {stream:?}: {error}"),
            ServiceError::BindTcp(error) => write!(f, "results: {error}"),
            ServiceError::Poll(e) => write!(f, "cannot create results event loop: {e}"),
            ServiceError::Thread(e) => write!(f, "cannot start stream thread: {e}"),
        }
    }
}

impl std::error::Error for ServiceError {}

/// One stream's counters; the ingest thread owns (stores) the first six.
#[derive(Default)]
pub(crate) struct Counters {
    pub datagrams: AtomicU64,
    pub records: AtomicU64,
    pub malformed: AtomicU64,
    pub over_limit: AtomicU64,
    pub socket_drops: AtomicU64,
    /// Result lines the operator produced.
    pub lines: AtomicU64,
    /// Lines lost: per subscriber that could not take one, plus once per line the hub queue
    /// had no room for.
    pub subscriber_drops: AtomicU64,
    /// Hub-queue losses the hub has not yet turned into `dropped` announcements.
    pub hub_unannounced: AtomicU64,
    /// Active subscribers receiving this stream.
    pub subscribers: AtomicU64,
    /// XDP engine: datagrams consumed in the kernel / passed up to the socket.
    pub xdp_datagrams: AtomicU64,
    pub xdp_passed: AtomicU64,
    /// XDP engine: ring-buffer records (alerts, parsed values) the kernel could not send
    /// because the ring was full.
    pub xdp_events_lost: AtomicU64,
}

pub(crate) struct StreamShared {
    pub name: String,
    /// The configured operator (`wordcount`, ...), told to clients by the hub's `INFO` line.
    pub operator: String,
    pub counters: Counters,
    /// Complete result lines waiting for the hub.
    pub queue: Mutex<Vec<u8>>,
}

pub(crate) struct Shared {
    pub streams: Vec<StreamShared>,
    pub stop: AtomicBool,
    /// Set by a publisher that woke the hub; cleared by the hub before it drains.
    pub wake_pending: AtomicBool,
    pub waker: Waker,
}

impl Shared {
    fn names(&self) -> Vec<&str> {
        self.streams.iter().map(|s| s.name.as_str()).collect()
    }

    /// Hands `out` (complete lines) to the hub and clears it. Never blocks beyond the append.
    pub(crate) fn publish(&self, idx: usize, out: &mut Vec<u8>) {
        let Some(s) = self.streams.get(idx) else {
            out.clear();
            return;
        };
        {
            let mut q = s.queue.lock().unwrap_or_else(|p| p.into_inner());
            if q.len() + out.len() <= HUB_QUEUE_BYTES_MAX {
                q.extend_from_slice(out);
            } else {
                let lines = out.iter().filter(|&&b| b == b'\n').count() as u64;
                s.counters.subscriber_drops.fetch_add(lines, Ordering::Relaxed);
                s.counters.hub_unannounced.fetch_add(lines, Ordering::Relaxed);
            }
        }
        out.clear();
        if !self.wake_pending.swap(true, Ordering::SeqCst) {
            // A failed wake (eventfd full) still leaves the hub due to wake: it is already set.
            let _ = self.waker.wake();
        }
    }
}

/// A UDP socket for ingest: SO_RXQ_OVFL on (required: drops must never be silent), SO_RCVBUF
/// as large as allowed (`SO_RCVBUF`, then `SO_RCVBUFFORCE` which works with CAP_NET_ADMIN).
/// One socket, exclusive to this process by the project's port rule (`slipstream-bind`): a
/// taken port fails with "Address already in use".
pub(crate) fn bind_udp(addr: SocketAddr, rcvbuf_bytes: usize) -> Result<UdpSocket, slipstream_bind::BindError> {
    let prepare = |sock: &socket2::Socket| {
        let _ = sock.set_recv_buffer_size(rcvbuf_bytes);
        // The kernel reports double the usable size; compare against that.
        if sock.recv_buffer_size().unwrap_or(0) < rcvbuf_bytes {
            let v = libc::c_int::try_from(rcvbuf_bytes).unwrap_or(libc::c_int::MAX);
            setsockopt_int(sock.as_raw_fd(), libc::SO_RCVBUFFORCE, v).ok();
        }
        setsockopt_int(sock.as_raw_fd(), libc::SO_RXQ_OVFL, 1)
    };
    let sock = slipstream_bind::bind_one(slipstream_bind::Kind::Udp, addr, &prepare)?;
    // The ingest thread blocks in recvmmsg with SO_RCVTIMEO as its tick.
    sock.set_nonblocking(false).map_err(|source| slipstream_bind::BindError {
        kind: slipstream_bind::Kind::Udp,
        addr,
        source,
    })?;
    Ok(sock.into())
}

/// Listen backlog of the results port.
const RESULTS_BACKLOG: i32 = 128;

fn setsockopt_int(fd: libc::c_int, opt: libc::c_int, v: libc::c_int) -> io::Result<()> {
    // SAFETY: passes a pointer to a live c_int and its exact size; `fd` is an open socket.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            opt,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn check_limit(key: &'static str, value: u64, max: u64) -> Result<(), ServiceError> {
    if value == 0 || value > max {
        return Err(ServiceError::Limit { key, value, max });
    }
    Ok(())
}

/// The running engine.
pub struct StreamService {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    results_addr: SocketAddr,
    stream_addrs: Vec<(String, SocketAddr)>,
    /// Each stream's engine, for the status line (`xdp` or `user (why)`).
    engines: Vec<String>,
    /// Held while XDP streams run (dropped after the threads stop).
    _xdp: Option<xdp::XdpEngine>,
    /// Wakes the XDP event reader at stop (it sleeps without a timeout).
    reader_waker: Option<Waker>,
    /// The ingest sockets, shut down for reading at stop: that wakes a thread blocked in
    /// `recvmmsg` whatever its tick (an XDP stream's idle tick is long).
    ingest_socks: Vec<UdpSocket>,
}

impl StreamService {
    /// Validates, binds every socket and starts the threads, or fails with the reason.
    #[allow(clippy::too_many_lines)] // start-up: validate, bind, spawn — one sequence read top to bottom
    pub fn start(cfg: ServiceConfig) -> Result<StreamService, ServiceError> {
        if cfg.streams.len() > STREAMS_MAX {
            return Err(ServiceError::Limit {
                key: "streams",
                value: cfg.streams.len() as u64,
                max: STREAMS_MAX as u64,
            });
        }
        check_limit(
            "subscriber_buffer_bytes_max",
            cfg.subscriber_buffer_bytes_max as u64,
            SUBSCRIBER_BUFFER_BYTES_MAX as u64,
        )?;
        check_limit("stats_interval_ms", cfg.stats_interval_ms, STATS_INTERVAL_MS_MAX)?;
        check_limit("udp_rcvbuf_bytes", cfg.udp_rcvbuf_bytes as u64, UDP_RCVBUF_BYTES_MAX as u64)?;
        // Port 0 (kernel-chosen) is allowed here: each stream is validated as a copy with a
        // placeholder port, and the duplicate checks ignore 0.
        let mut placeholder: Vec<StreamConfig> = Vec::with_capacity(cfg.streams.len());
        for s in &cfg.streams {
            let mut p = s.clone();
            if p.udp_port == 0 {
                p.udp_port = 1;
            }
            p.validate().map_err(|error| ServiceError::Config { stream: s.name.clone(), error })?;
            for t in cfg.streams.iter().take(placeholder.len()) {
                let dup = if t.name == s.name {
                    Some(ConfigError::DuplicateName(s.name.clone()))
                } else if s.udp_port != 0 && t.udp_port == s.udp_port {
                    Some(ConfigError::DuplicatePort(s.udp_port))
                } else {
                    None
                };
                if let Some(error) = dup {
                    return Err(ServiceError::Config { stream: s.name.clone(), error });
                }
            }
            placeholder.push(p);
        }
        let mut ops = Vec::new();
        for s in &placeholder {
            let op = s.build().map_err(|error| ServiceError::Config { stream: s.name.clone(), error })?;
            let enc = s.encoding().map_err(|error| ServiceError::Config { stream: s.name.clone(), error })?;
            ops.push((
                Arc::new(Mutex::new(op)) as xdp::SharedOp,
                enc,
                s.limits(),
                ingest::tick_ns(s.window_ms.saturating_mul(1_000_000)),
            ));
        }
        let mut socks = Vec::new();
        let mut stream_addrs = Vec::new();
        for s in &cfg.streams {
            let addr = SocketAddr::new(cfg.listen, s.udp_port);
            let sock = bind_udp(addr, cfg.udp_rcvbuf_bytes)
                .map_err(|error| ServiceError::BindUdp { stream: s.name.clone(), error })?;
            let local = sock.local_addr().unwrap_or(addr);
            stream_addrs.push((s.name.clone(), local));
            socks.push(sock);
        }
        let taddr = SocketAddr::new(cfg.listen, cfg.results.tcp_port);
        // The kernel engine is set up before the results port listens: a client that sees the
        // port open may start sending at once, and datagrams that arrived before the XDP slots
        // were filled would all go to the socket (at line rate, beyond what it can queue).
        let (engine, xdp_streams, engines, reader) = xdp::setup(&cfg, &stream_addrs, &ops);
        let std_listener: std::net::TcpListener =
            slipstream_bind::bind_one(slipstream_bind::Kind::Tcp { backlog: RESULTS_BACKLOG }, taddr, &|_| Ok(()))
                .map_err(ServiceError::BindTcp)?
                .into();
        let results_addr = std_listener.local_addr().unwrap_or(taddr);
        let mut listener = mio::net::TcpListener::from_std(std_listener);
        let poll = Poll::new().map_err(ServiceError::Poll)?;
        poll.registry()
            .register(&mut listener, mio::Token(usize::MAX - 1), mio::Interest::READABLE)
            .map_err(ServiceError::Poll)?;
        let waker = Waker::new(poll.registry(), hub::WAKER).map_err(ServiceError::Poll)?;
        let shared = Arc::new(Shared {
            streams: cfg
                .streams
                .iter()
                .map(|s| StreamShared {
                    name: s.name.clone(),
                    operator: s.operator.clone(),
                    counters: Counters::default(),
                    queue: Mutex::new(Vec::new()),
                })
                .collect(),
            stop: AtomicBool::new(false),
            wake_pending: AtomicBool::new(false),
            waker,
        });
        let mut svc = StreamService {
            shared: shared.clone(),
            threads: Vec::new(),
            results_addr,
            stream_addrs,
            engines,
            _xdp: engine,
            reader_waker: None,
            ingest_socks: Vec::new(),
        };
        let hub = hub::Hub {
            poll,
            listener,
            shared: shared.clone(),
            buf_bytes_max: cfg.subscriber_buffer_bytes_max,
            stats_interval_ns: cfg.stats_interval_ms.saturating_mul(1_000_000),
        };
        let h = std::thread::Builder::new()
            .name("stream-hub".into())
            .spawn(move || hub.run())
            .map_err(ServiceError::Thread)?;
        svc.threads.push(h);
        if let Some((ring, slots)) = reader {
            let sh = shared.clone();
            let rpoll = Poll::new().map_err(ServiceError::Poll)?;
            svc.reader_waker = Some(Waker::new(rpoll.registry(), xdp::READER_STOP).map_err(ServiceError::Poll)?);
            let h = std::thread::Builder::new()
                .name("stream-xdp-events".into())
                .spawn(move || xdp::run_reader(ring, slots, sh, rpoll))
                .map_err(ServiceError::Thread)?;
            svc.threads.push(h);
        }
        let mut xdp_streams = xdp_streams.into_iter();
        for (idx, (sock, (op, encoding, limits, tick_ns))) in socks.into_iter().zip(ops).enumerate() {
            let xdp = xdp_streams.next().flatten();
            // A second handle on the socket, to wake the thread's blocking receive at stop.
            if let Ok(s) = sock.try_clone() {
                svc.ingest_socks.push(s);
            }
            let wordcount = cfg.streams.get(idx).is_some_and(|s| s.operator == "wordcount");
            let ing = ingest::Ingest {
                idx,
                name: cfg.streams.get(idx).map(|s| s.name.clone()).unwrap_or_default(),
                // Word counts in user space read in batches (see ingest::WORDS_LINGER).
                linger: if wordcount && xdp.is_none() { ingest::WORDS_LINGER } else { Duration::ZERO },
                xdp,
                wc: xdp::WcMerge::default(),
                rx: ingest::Receiver::new(sock),
                op,
                encoding,
                limits,
                tick_ns,
                shared: shared.clone(),
            };
            let name = format!("stream-{}", idx);
            // On failure `svc` is dropped, which stops and joins what already started.
            let h = std::thread::Builder::new().name(name).spawn(move || ing.run()).map_err(ServiceError::Thread)?;
            svc.threads.push(h);
        }
        Ok(svc)
    }

    /// Each stream's engine in configuration order: `xdp` or `user (why)`.
    pub fn engines(&self) -> &[String] {
        &self.engines
    }

    /// The results listener's bound address (port 0 resolved).
    pub fn results_addr(&self) -> SocketAddr {
        self.results_addr
    }

    /// Each stream's name and bound UDP address, in configuration order.
    pub fn stream_addrs(&self) -> Vec<(String, SocketAddr)> {
        self.stream_addrs.clone()
    }

    /// Prometheus text: per-stream counters and the subscriber gauge, label `stream="name"`.
    pub fn render_metrics(&self, out: &mut String) {
        use std::fmt::Write as _;
        type Get = fn(&Counters) -> &AtomicU64;
        let metrics: [(&str, &str, &str, Get); 11] = [
            ("datagrams", "counter", "UDP datagrams received", |c| &c.datagrams),
            ("records", "counter", "records parsed and fed to the operator", |c| &c.records),
            ("malformed", "counter", "malformed records skipped", |c| &c.malformed),
            ("over_limit", "counter", "records skipped over records_per_datagram_max", |c| &c.over_limit),
            ("socket_drops", "counter", "datagrams dropped by the kernel socket queue (SO_RXQ_OVFL)", |c| {
                &c.socket_drops
            }),
            ("lines", "counter", "result lines produced by the operator", |c| &c.lines),
            ("subscriber_drops", "counter", "result lines dropped for slow subscribers", |c| &c.subscriber_drops),
            ("subscribers", "gauge", "subscribers receiving this stream", |c| &c.subscribers),
            ("xdp_datagrams", "counter", "datagrams consumed by the XDP engine (included in datagrams)", |c| {
                &c.xdp_datagrams
            }),
            ("xdp_passed", "counter", "datagrams the XDP engine passed to the user-space socket", |c| &c.xdp_passed),
            ("xdp_events_lost", "counter", "XDP engine ring-buffer records lost to a full ring", |c| {
                &c.xdp_events_lost
            }),
        ];
        for (name, kind, help, get) in metrics {
            let full = if kind == "counter" {
                format!("slipstream_stream_{name}_total")
            } else {
                format!("slipstream_stream_{name}")
            };
            let _ = writeln!(out, "# HELP {full} {help}");
            let _ = writeln!(out, "# TYPE {full} {kind}");
            for s in &self.shared.streams {
                let v = get(&s.counters).load(Ordering::Relaxed);
                let _ = writeln!(out, "{full}{{stream=\"{}\"}} {v}", escape_label(&s.name));
            }
        }
    }

    /// Stops every thread and waits for them (each is woken: no tick to wait out).
    pub fn stop(self) {
        drop(self);
    }
}

impl Drop for StreamService {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        let _ = self.shared.waker.wake();
        if let Some(w) = &self.reader_waker {
            let _ = w.wake();
        }
        for s in &self.ingest_socks {
            // Linux wakes the blocked receiver (which then sees `stop`) even though an
            // unconnected UDP socket answers ENOTCONN.
            let _ = socket2::SockRef::from(s).shutdown(std::net::Shutdown::Read);
        }
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
    }
}

/// Prometheus label-value escaping: backslash, double quote, newline.
fn escape_label(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => o.push_str("\\\\"),
            '"' => o.push_str("\\\""),
            '\n' => o.push_str("\\n"),
            c => o.push(c),
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_escaping() {
        assert_eq!(escape_label("a\"b\\c"), "a\\\"b\\\\c");
    }

    #[test]
    fn clock_is_monotonic() {
        let a = clock_monotonic_ns();
        let b = clock_monotonic_ns();
        assert!(b >= a && a > 0);
    }
}
