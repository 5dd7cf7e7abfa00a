//! The network loops: one event loop per worker thread, each with its own SO_REUSEPORT TCP
//! listener (the kernel spreads connections across threads, so there is no accept lock) and its
//! own SO_REUSEPORT UDP socket.
//!
//! What it is for: reading, pipelining and coalescing. Each readable event reads what the socket
//! has, runs every complete request in the buffer through the connection's executor, and writes
//! all of that batch's replies with one `write`. Replies never wait for a later request: the
//! flush happens at the end of the batch that produced them, so the flush delay is bounded by
//! the time to execute one read's worth of requests.
//!
//! Tenants: every tenant's ports are watched by every worker (each with its own SO_REUSEPORT
//! sockets); a connection belongs to the tenant whose port it came in on and runs against that
//! tenant's store and counters. When the tenant has a shaper, each read is gated by its ingress
//! bucket (a tenant over its rate is simply not read from: TCP back-pressure, nothing dropped)
//! and each batch by its egress bucket and `max_outstanding`; held-back connections wait on a
//! timer list served round-robin. UDP requests that cannot run yet wait in a bounded per-tenant
//! queue; past the bound they are dropped and counted. Without a shaper none of this runs.
//!
//! What it is not for: protocol rules (the executors), configuration (the binary crate) or
//! shaping arithmetic (slipstream-tenancy).

use crate::bufbudget::REPLY_BYTES_FREE;
use crate::outq::{self, SHARE_VALUE_BYTES_MIN};
use crate::exec::{ConnState, Ctx, Protocol, Settings, Step, Transport};
use crate::stats::{ConnEntry, ServerInfo, ThreadStats};
use crate::bind::bind_all;
use crate::tenants::{Tenant, TenantTable};
use crate::udp_batch::{RecvBatch, SendBatch};
use crate::{memcache_binary, memcache_text};
use mio::net::{TcpListener, UdpSocket, UnixListener};
use crate::transport::{tls::TlsStream, unix::UnixSpec, Stream};
use mio::{Events, Interest, Poll, Registry, Token, Waker};
use slipstream_proto::udp;
use slipstream_store::Store;
use std::io::{self, Read};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::collections::VecDeque;
use std::sync::Arc;
use slipstream_tenancy::{monotonic_now_ns, Admit, TenantShaper};

const WAKER: Token = Token(usize::MAX - 2);
/// The `-s` unix listener (every worker watches it; the first to accept gets the connection).
const UNIX_LISTENER: Token = Token(usize::MAX - 3);
/// Listener tokens: `LISTEN_BASE - 2 * slot` (TCP) and one below it (UDP), one pair per tenant
/// slot; connection tokens are small indexes and never reach this range.
const LISTEN_BASE: usize = usize::MAX - 16;
const SLOTS_MAX: usize = slipstream_tenancy::spec::TENANTS_MAX;

fn listen_token(slot: u32, udp: bool) -> Token {
    Token(LISTEN_BASE - 2 * slot as usize - udp as usize)
}

/// (slot, is_udp) for a listener token.
fn decode_listen(t: Token) -> Option<(u32, bool)> {
    let t = t.0;
    if t <= LISTEN_BASE && t > LISTEN_BASE - 2 * SLOTS_MAX {
        let d = LISTEN_BASE - t;
        Some(((d / 2) as u32, d % 2 == 1))
    } else {
        None
    }
}

/// Read buffer a connection starts with (and shrinks back to when idle).
pub const READ_BUF_BYTES_INITIAL: usize = 16 * 1024;
/// Once this many reply bytes are waiting for the socket, stop executing requests from this
/// connection until the client reads (back-pressure instead of unbounded output).
pub const WRITE_BUF_BYTES_HIGH: usize = 4 * 1024 * 1024;
/// Largest UDP request datagram accepted.
pub const UDP_DATAGRAM_BYTES_MAX: usize = 65_536;
/// Most datagrams one readable event takes from a UDP socket before the loop turns to its other
/// sockets (mio re-arms while data is still queued).
const UDP_DRAIN_DATAGRAMS_MAX: usize = 4096;
/// Bytes of UDP requests one worker holds for one shaped tenant while its buckets refill (on top
/// of the `max_outstanding` count bound).
pub const UDP_QUEUE_BYTES_MAX: usize = 1 << 20;
/// Longest a held-back connection sleeps before looking again, even when its bucket's rate is 0
/// (an admin change may reopen it).
const THROTTLE_RECHECK_NS_MAX: u64 = 100_000_000;
/// Held-back connections served per loop turn before the poll looks at new events again.
const THROTTLED_SERVED_PER_TURN: usize = 2;
/// Smallest read a shaped connection makes when its ingress bucket is open.
const READ_BYTES_MIN_SHAPED: usize = 1024;
/// Events handled per `epoll_wait`.
const EVENTS_MAX: usize = 1024;

/// The scheduling policy of the worker threads.
///
/// `Batch` (Linux SCHED_BATCH) is for when the kernel fast path answers most requests on the
/// same cores: a worker woken by one datagram the fast path passed up then does not preempt the
/// receive processing (threaded NAPI, or any task) running there, but waits for its turn and
/// takes the datagrams that gathered meanwhile in one batch. Without it every passed-up
/// datagram costs two context switches. The price is latency for what user space answers
/// while the core is busy: up to one scheduler slice (a few ms), none when it is idle.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WorkerSched {
    /// The default policy (SCHED_OTHER): a woken worker may preempt.
    #[default]
    Normal,
    /// SCHED_BATCH: a woken worker never preempts.
    Batch,
}

impl WorkerSched {
    /// Apply to the calling thread. SCHED_BATCH needs no privilege (it only gives up wake-up
    /// preemption), so a failure means a kernel without it: the worker goes on as it is.
    fn apply(self) -> io::Result<()> {
        if self == WorkerSched::Normal {
            return Ok(());
        }
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: pid 0 is the calling thread; `param` is a valid sched_param that outlives the
        // call, which only reads it.
        let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

/// Listening configuration shared by all workers.
#[derive(Clone, Debug)]
pub struct NetConfig {
    pub tcp_addr: Option<SocketAddr>,
    pub udp_addr: Option<SocketAddr>,
    pub threads: usize,
    pub conn_limit: usize,
    /// Largest request a connection may buffer (item size + line + slack).
    pub read_buf_bytes_max: usize,
    pub worker_sched: WorkerSched,
    /// `-s`/`-a`: serve this unix socket (memcached then serves no TCP or UDP).
    pub unix: Option<UnixSpec>,
    /// `-Z`: TLS on the TCP listeners.
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

/// Errors that stop the server from starting.
#[derive(Debug)]
pub enum NetError {
    Bind(slipstream_bind::BindError),
    BindUnix(String, io::Error),
    Poll(io::Error),
    Thread(io::Error),
}

impl std::fmt::Display for NetError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NetError::Bind(e) => write!(f, "{e}"),
            NetError::BindUnix(p, e) => write!(f, "failed to listen on UNIX socket: {p}: {e}"),
            NetError::Poll(e) => write!(f, "cannot create event loop: {e}"),
            NetError::Thread(e) => write!(f, "cannot start worker thread: {e}"),
        }
    }
}

impl std::error::Error for NetError {}

/// A running server: worker threads plus the means to stop them.
pub struct Server {
    workers: Vec<std::thread::JoinHandle<()>>,
    wakers: Vec<Arc<Waker>>,
    stop: Arc<AtomicBool>,
    pub info: Arc<ServerInfo>,
    pub table: Arc<TenantTable>,
    /// Local addresses actually bound (port 0 resolved); single-tenant mode's -p/-U sockets.
    pub tcp_local: Option<SocketAddr>,
    pub udp_local: Option<SocketAddr>,
}

/// Handle to request a stop from anywhere (signal thread, `shutdown` command).
#[derive(Clone)]
pub struct StopHandle {
    stop: Arc<AtomicBool>,
    wakers: Vec<Arc<Waker>>,
}

impl StopHandle {
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        for w in &self.wakers {
            let _ = w.wake();
        }
    }

    pub fn is_stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }
}

impl Server {
    /// Single-tenant mode: bind every listener and start the workers. With port 0, the first
    /// bind picks the port and the other threads bind the same one.
    pub fn start(
        net: NetConfig,
        store: Arc<Store>,
        settings: Settings,
        info_template: ServerInfo,
    ) -> Result<Server, NetError> {
        let threads = net.threads.max(1);
        let bound = bind_all(net.tcp_addr, net.udp_addr, threads).map_err(NetError::Bind)?;
        let (tcp_local, udp_local) = (bound.2, bound.3);
        let per_thread: Vec<Arc<ThreadStats>> = (0..threads).map(|_| Arc::new(ThreadStats::default())).collect();
        let info = Arc::new(ServerInfo {
            per_thread: per_thread.clone(),
            threads,
            tcp_port: tcp_local.map(|a| a.port()).unwrap_or(0),
            udp_port: udp_local.map(|a| a.port()).unwrap_or(0),
            ..info_template
        });
        if let (Some(Some(l)), Ok(mut reg)) = (bound.0.first(), info.conns.lock()) {
            // memcached lists its listening socket in `stats conns`; with SO_REUSEPORT every
            // thread has one, and the first stands for them all.
            use std::os::fd::AsRawFd;
            let addr = l.local_addr().map(|a| format!("tcp:{a}")).unwrap_or_default();
            reg.insert(l.as_raw_fd(), ConnEntry { addr, listen_addr: None, last_cmd_s: Arc::new(AtomicU64::new(0)) });
        }
        let unix = match &net.unix {
            Some(spec) => Some(crate::transport::unix::bind(spec).map_err(|e| NetError::BindUnix(spec.path.clone(), e))?),
            None => None,
        };
        if let (Some(l), Some(spec), Ok(mut reg)) = (unix.as_ref(), net.unix.as_ref(), info.conns.lock()) {
            // memcached lists the unix listener in `stats conns` too.
            reg.insert(l.as_raw_fd(), ConnEntry { addr: format!("unix:{}", spec.path), listen_addr: None, last_cmd_s: Arc::new(AtomicU64::new(0)) });
        }
        let table = Arc::new(TenantTable::single(threads, net.conn_limit, Arc::new(settings), store, info.clone(), bound));
        Server::launch_with(table, net.read_buf_bytes_max, info, net.worker_sched, Listeners { unix, tls: net.tls })
    }

    /// Tenant mode: serve every tenant of `table` (already bound). `info` stands for the node
    /// (for the daemon's own use; each tenant has its own for `stats`).
    pub fn start_tenants(
        table: Arc<TenantTable>,
        read_buf_bytes_max: usize,
        info: Arc<ServerInfo>,
        worker_sched: WorkerSched,
    ) -> Result<Server, NetError> {
        Server::launch_with(table, read_buf_bytes_max, info, worker_sched, Listeners::default())
    }

    fn launch_with(
        table: Arc<TenantTable>,
        read_buf_bytes_max: usize,
        info: Arc<ServerInfo>,
        worker_sched: WorkerSched,
        listeners: Listeners,
    ) -> Result<Server, NetError> {
        let threads = table.threads.max(1);
        let (tcp_local, udp_local) = table.first_locals();
        let stop = Arc::new(AtomicBool::new(false));
        let mut polls = Vec::new();
        let mut wakers = Vec::new();
        for _ in 0..threads {
            let poll = Poll::new().map_err(NetError::Poll)?;
            let waker = Arc::new(Waker::new(poll.registry(), WAKER).map_err(NetError::Poll)?);
            polls.push(poll);
            wakers.push(waker);
        }
        table.set_wakers(wakers.clone());
        let stop_handle = StopHandle { stop: stop.clone(), wakers: wakers.clone() };

        let mut workers = Vec::new();
        let mut unix_orig = listeners.unix;
        for (i, poll) in polls.into_iter().enumerate() {
            // [sec hook] Every worker watches its own handle of the one unix listener; the last
            // takes the original (its fd is the one `stats conns` lists).
            let std_unix = if i + 1 == threads {
                unix_orig.take()
            } else {
                unix_orig.as_ref().map(|l| l.try_clone()).transpose().map_err(NetError::Poll)?
            };
            let mut unix = std_unix.map(UnixListener::from_std);
            if let Some(l) = unix.as_mut() {
                poll.registry().register(l, UNIX_LISTENER, Interest::READABLE).map_err(NetError::Poll)?;
            }
            let worker = Worker {
                unix,
                tls: listeners.tls.clone(),
                index: i,
                poll,
                table: table.clone(),
                seen_generation: 0,
                tenants: Vec::new(),
                conns: Vec::new(),
                free: Vec::new(),
                settings: table.settings.clone(),
                stop: stop_handle.clone(),
                read_buf_bytes_max,
                udp_rx: RecvBatch::new(UDP_DATAGRAM_BYTES_MAX),
                udp: UdpBufs {
                    tx: SendBatch::new(),
                    out: Vec::with_capacity(UDP_DATAGRAM_BYTES_MAX),
                    frame: Vec::with_capacity(udp::REPLY_PAYLOAD_BYTES_MAX + udp::FRAME_HEADER_BYTES),
                    state: ConnState::new(Transport::Udp),
                },
                throttled: Vec::new(),
                rr: 0,
            };
            let h = std::thread::Builder::new()
                .name(format!("slipstream-w{i}"))
                .spawn(move || {
                    if let Err(e) = worker_sched.apply() {
                        eprintln!("slipstream: worker {i}: cannot set {worker_sched:?} scheduling ({e}); keeping the default");
                    }
                    worker.run()
                })
                .map_err(NetError::Thread)?;
            workers.push(h);
        }
        Ok(Server { workers, wakers, stop, info, table, tcp_local, udp_local })
    }

    pub fn stop_handle(&self) -> StopHandle {
        StopHandle { stop: self.stop.clone(), wakers: self.wakers.clone() }
    }

    /// Wait for all workers to finish (after a stop).
    pub fn join(self) {
        for w in self.workers {
            let _ = w.join();
        }
    }
}

/// [sec hook] The listeners beyond the per-tenant TCP/UDP sockets, and TLS for the TCP ones.
#[derive(Default)]
struct Listeners {
    unix: Option<std::os::unix::net::UnixListener>,
    tls: Option<Arc<rustls::ServerConfig>>,
}

struct Conn {
    stream: Stream,
    rbuf: Vec<u8>,
    /// Unconsumed input is rbuf[rstart..rend].
    rstart: usize,
    rend: usize,
    wbuf: Vec<u8>,
    /// Bytes of wbuf already written.
    wstart: usize,
    /// Bytes of the connection-buffer budget `rbuf` holds beyond `READ_BUF_BYTES_INITIAL`
    /// (the replies' share is `state.reply_charged_bytes`).
    rbuf_charged: usize,
    /// `rbuf` is full with one incomplete request at its front: the next read may grow it.
    /// (A full buffer that still holds complete requests is executed first, not grown.)
    needs_grow: bool,
    /// The budget refused to grow `rbuf` for the request at its front: the executor refuses
    /// that request the way memcached refuses one it cannot allocate for.
    grow_refused: bool,
    state: ConnState,
    /// Waiting for the socket to drain (write interest registered).
    blocked_on_write: bool,
    close_after_flush: bool,
    /// Its round budget ran out with work left; the worker comes back to it after this poll.
    needs_revisit: bool,
    /// Key in `ServerInfo::conns` (the socket's fd, as memcached numbers connections).
    fd: i32,
    /// When this connection last sent requests (shared with its `stats conns` entry).
    last_cmd_s: Arc<AtomicU64>,
    /// Requests executed whose replies are not yet handed to the socket (the tenant's
    /// `max_outstanding` counts these).
    outstanding: u32,
    /// Held back by its tenant's shaper until this monotonic time (0 = not held back).
    throttle_until_ns: u64,
    /// Already on the worker's throttled list.
    in_throttled: bool,
    /// Held back by its tenant's shaper and not yet caught up: takes small turns.
    held: bool,
}

/// A connection and the tenant it belongs to (kept apart so both can be borrowed at once).
struct Slot {
    tenant: Arc<Tenant>,
    conn: Conn,
}

/// A tenant as one worker serves it: its sockets there and its UDP wait queue.
struct WorkerTenant {
    tenant: Arc<Tenant>,
    listener: Option<TcpListener>,
    udp: Option<UdpSocket>,
    /// UDP requests held back by the tenant's shaper (payload after the frame header is parsed
    /// again when they run), bounded by `max_outstanding` entries and `UDP_QUEUE_BYTES_MAX`.
    udp_queue: VecDeque<(Vec<u8>, SocketAddr)>,
    udp_queue_bytes: usize,
    /// Look at the queue again at this monotonic time (0 = nothing waiting).
    udp_wait_until_ns: u64,
}

/// Buffers the UDP path reuses for every datagram.
struct UdpBufs {
    /// Replies waiting for the next sendmmsg (flushed at the end of every drain).
    tx: SendBatch,
    out: Vec<u8>,
    frame: Vec<u8>,
    /// Protocol state for UDP requests, reset per datagram (kept to reuse its buffers).
    state: ConnState,
}

struct Worker {
    index: usize,
    /// `-s`: this worker's handle of the unix listener.
    unix: Option<UnixListener>,
    /// `-Z`: TCP connections are TLS.
    tls: Option<Arc<rustls::ServerConfig>>,
    poll: Poll,
    table: Arc<TenantTable>,
    seen_generation: u64,
    tenants: Vec<WorkerTenant>,
    conns: Vec<Option<Slot>>,
    free: Vec<usize>,
    settings: Arc<Settings>,
    stop: StopHandle,
    read_buf_bytes_max: usize,
    /// recvmmsg buffers.
    udp_rx: RecvBatch,
    udp: UdpBufs,
    /// Connections held back by their tenant's shaper, served round-robin when due.
    throttled: Vec<usize>,
    /// Where the next round-robin pass over `throttled` starts.
    rr: usize,
}

/// What handling an event decided for a connection.
enum After {
    Keep,
    Close,
}

/// What the serving functions need besides the connection and its tenant.
struct Env<'a> {
    settings: &'a Settings,
    stop: &'a StopHandle,
    index: usize,
    read_buf_bytes_max: usize,
}

/// This worker's counters in `tenant`'s stats.
fn thread_stats(tenant: &Tenant, index: usize) -> &ThreadStats {
    // per_thread has one entry per worker; fall back to the first rather than panic.
    match tenant.info.per_thread.get(index).or_else(|| tenant.info.per_thread.first()) {
        Some(s) => s,
        None => &FALLBACK_STATS,
    }
}

static FALLBACK_STATS: ThreadStats = ThreadStats::new_const();

/// How long the shaper holds `sh` back before a datagram may run (0 = now).
fn udp_wait_ns(sh: &TenantShaper, now: u64) -> u64 {
    if let Err(ns) = sh.ingress_open(now) {
        return ns;
    }
    match sh.admit(now) {
        Admit::Go { .. } => 0,
        Admit::Wait { ns } => ns,
    }
}

impl Worker {
    fn run(mut self) {
        let mut events = Events::with_capacity(EVENTS_MAX);
        let mut revisit: Vec<usize> = Vec::new();
        let mut deferred: Vec<(usize, bool, bool, bool)> = Vec::with_capacity(EVENTS_MAX);
        while !self.stop.is_stopped() {
            self.reconcile();
            // Connections with work left from the last round: look at them again without
            // sleeping in epoll.
            for i in std::mem::take(&mut revisit) {
                let again = self.conns.get_mut(i).and_then(Option::as_mut).map(|s| std::mem::replace(&mut s.conn.needs_revisit, false));
                if again == Some(true) {
                    let after = self.conn_event(i, true, false, false);
                    self.after_serve(i, after, &mut revisit);
                }
            }
            let mut deadline = None;
            if !self.throttled.is_empty() || self.tenants.iter().any(|w| w.udp_wait_until_ns != 0) {
                let now = monotonic_now_ns();
                self.serve_throttled(now, &mut revisit);
                self.serve_udp_queues(now);
                deadline = self.next_deadline();
            }
            // Decided after the throttled pass, which may leave connections for a revisit.
            let mut timeout = if revisit.is_empty() { None } else { Some(std::time::Duration::ZERO) };
            if let Some(next) = deadline {
                let wait = std::time::Duration::from_nanos(next.saturating_sub(monotonic_now_ns()));
                timeout = Some(timeout.map_or(wait, |t| t.min(wait)));
            }
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                eprintln!("slipstream: event loop failed: {e}");
                break;
            }
            for ev in events.iter() {
                let token = ev.token();
                if token == WAKER {
                    continue;
                }
                if token == UNIX_LISTENER {
                    self.accept_unix();
                    continue;
                }
                if let Some((slot, is_udp)) = decode_listen(token) {
                    let Some(k) = self.tenants.iter().position(|w| w.tenant.slot == slot) else { continue };
                    if is_udp {
                        self.udp_drain(k);
                    } else {
                        self.accept_all(k);
                    }
                    continue;
                }
                let i = token.0;
                let (r, w, closed) = (ev.is_readable() || ev.is_read_closed(), ev.is_writable(), ev.is_read_closed() || ev.is_error());
                if self.conns.get(i).and_then(Option::as_ref).is_some_and(|s| s.conn.held) && deferred.len() < EVENTS_MAX {
                    // Its tenant is at its share: serve it after the connections of tenants
                    // within theirs from this same poll (latency isolation).
                    deferred.push((i, r, w, closed));
                    continue;
                }
                let after = self.conn_event(i, r, w, closed);
                self.after_serve(i, after, &mut revisit);
            }
            for (i, r, w, closed) in deferred.drain(..) {
                let after = self.conn_event(i, r, w, closed);
                self.after_serve(i, after, &mut revisit);
            }
        }
        // Close every connection on the way out so clients see EOF, not a hang.
        for i in 0..self.conns.len() {
            if self.conns[i].is_some() {
                self.close(i);
            }
        }
    }

    /// Close, queue for a revisit, or put on the throttled list, as serving left the connection.
    fn after_serve(&mut self, i: usize, after: After, revisit: &mut Vec<usize>) {
        if let After::Close = after {
            self.close(i);
            return;
        }
        let Some(s) = self.conns.get_mut(i).and_then(Option::as_mut) else { return };
        if s.conn.throttle_until_ns != 0 {
            if !s.conn.in_throttled {
                s.conn.in_throttled = true;
                self.throttled.push(i);
            }
        } else if s.conn.needs_revisit {
            revisit.push(i);
        }
    }

    /// Serve the held-back connections whose time has come, starting at a rotating position so
    /// tenants waiting on their buckets take turns.
    fn serve_throttled(&mut self, now: u64, revisit: &mut Vec<usize>) {
        if self.throttled.is_empty() {
            return;
        }
        let list = std::mem::take(&mut self.throttled);
        let n = list.len();
        self.rr = self.rr.wrapping_add(1);
        let start = self.rr % n;
        let mut served = 0usize;
        for j in 0..n {
            let i = list[(start + j) % n];
            let Some(s) = self.conns.get_mut(i).and_then(Option::as_mut) else { continue };
            if !s.conn.in_throttled {
                continue;
            }
            if s.conn.throttle_until_ns > now || served >= THROTTLED_SERVED_PER_TURN {
                // Not yet due, or this turn's share of work for held-back connections is used
                // up: the rest wait for the next turn, after the poll has looked at new events,
                // so a tenant within its share is not queued behind a crowd of throttled ones.
                self.throttled.push(i);
                continue;
            }
            served += 1;
            s.conn.in_throttled = false;
            s.conn.throttle_until_ns = 0;
            if s.conn.blocked_on_write {
                // The writable event resumes it.
                continue;
            }
            let after = self.conn_event(i, true, false, false);
            self.after_serve(i, after, revisit);
        }
    }

    /// Earliest monotonic time something held back may run.
    fn next_deadline(&self) -> Option<u64> {
        let conns = self.throttled.iter().filter_map(|&i| self.conns.get(i).and_then(Option::as_ref)).map(|s| s.conn.throttle_until_ns).filter(|&t| t != 0);
        let udps = self.tenants.iter().map(|w| w.udp_wait_until_ns).filter(|&t| t != 0);
        conns.chain(udps).min()
    }

    /// Pick up tenants added or removed since the last look.
    fn reconcile(&mut self) {
        let g = self.table.generation();
        if g == self.seen_generation {
            return;
        }
        self.seen_generation = g;
        let list = self.table.snapshot();
        let mut k = 0;
        while k < self.tenants.len() {
            let gone = self.tenants[k].tenant.is_removed() || !list.iter().any(|t| Arc::ptr_eq(t, &self.tenants[k].tenant));
            if !gone {
                k += 1;
                continue;
            }
            let mut wt = self.tenants.swap_remove(k);
            if let Some(l) = wt.listener.as_mut() {
                let _ = self.poll.registry().deregister(l);
            }
            if let Some(u) = wt.udp.as_mut() {
                let _ = self.poll.registry().deregister(u);
            }
            for i in 0..self.conns.len() {
                if self.conns[i].as_ref().is_some_and(|s| Arc::ptr_eq(&s.tenant, &wt.tenant)) {
                    self.close(i);
                }
            }
        }
        for t in list {
            if self.tenants.iter().any(|w| Arc::ptr_eq(&w.tenant, &t)) {
                continue;
            }
            let (tcp, udp_sock) = t.take_sockets(self.index);
            let mut listener = tcp.map(TcpListener::from_std);
            let mut udp_sock = udp_sock.map(UdpSocket::from_std);
            if let Some(l) = listener.as_mut() {
                if let Err(e) = self.poll.registry().register(l, listen_token(t.slot, false), Interest::READABLE) {
                    eprintln!("slipstream: worker cannot watch tenant {}'s listener: {e}", t.name);
                    listener = None;
                }
            }
            if let Some(u) = udp_sock.as_mut() {
                if let Err(e) = self.poll.registry().register(u, listen_token(t.slot, true), Interest::READABLE) {
                    eprintln!("slipstream: worker cannot watch tenant {}'s UDP socket: {e}", t.name);
                    udp_sock = None;
                }
            }
            self.tenants.push(WorkerTenant { tenant: t, listener, udp: udp_sock, udp_queue: VecDeque::new(), udp_queue_bytes: 0, udp_wait_until_ns: 0 });
        }
    }

    fn accept_all(&mut self, k: usize) {
        loop {
            let Some(wt) = self.tenants.get(k) else { return };
            let Some(listener) = wt.listener.as_ref() else { return };
            match listener.accept() {
                Ok((stream, peer)) => {
                    let tenant = wt.tenant.clone();
                    let listen_addr = listener.local_addr().ok().map(|a| format!("tcp:{a}"));
                    let _ = stream.set_nodelay(true);
                    // [sec hook] -Z: every TCP connection is TLS.
                    let stream = match &self.tls {
                        None => Stream::Tcp(stream),
                        Some(cfg) => match TlsStream::new(stream, cfg) {
                            Ok(t) => Stream::Tls(Box::new(t)),
                            Err(e) => {
                                eprintln!("slipstream: TLS connection setup failed: {e}");
                                continue;
                            }
                        },
                    };
                    self.admit(tenant, stream, format!("tcp:{peer}"), listen_addr);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // EMFILE and friends: say so, back off this event; the listener stays.
                    eprintln!("slipstream: accept failed: {e}");
                    return;
                }
            }
        }
    }

    /// [sec hook] Accept what waits on the `-s` unix listener (single-tenant mode: tenant 0).
    fn accept_unix(&mut self) {
        loop {
            let Some(l) = self.unix.as_ref() else { return };
            let Some(tenant) = self.tenants.first().map(|w| w.tenant.clone()) else { return };
            match l.accept() {
                Ok((stream, _)) => {
                    let path = l.local_addr().ok().and_then(|a| a.as_pathname().map(|p| p.display().to_string())).unwrap_or_default();
                    // memcached 1.6.18 shows a unix client's address as `?:<AF 0>` (it keeps no
                    // peer address for them).
                    self.admit(tenant, Stream::Unix(stream), "?:<AF 0>".to_string(), Some(format!("unix:{path}")));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    eprintln!("slipstream: accept failed: {e}");
                    return;
                }
            }
        }
    }

    /// Take an accepted connection: the connection limit, counters, registration, `stats conns`.
    fn admit(&mut self, tenant: Arc<Tenant>, mut stream: Stream, addr: String, listen_addr: Option<String>) {
        let curr = self.table.conns_total.fetch_add(1, Ordering::Relaxed) + 1;
        let stats = thread_stats(&tenant, self.index);
        if curr as usize > self.table.conn_limit {
            // memcached's answer when over the connection limit (on the raw socket,
            // as memcached writes it, TLS or not).
            // SAFETY: the fd is the stream's open socket; write only reads the slice.
            let msg = b"ERROR Too many open connections\r\n";
            let _ = unsafe { libc::write(stream.as_raw_fd(), msg.as_ptr().cast(), msg.len()) };
            self.table.conns_total.fetch_sub(1, Ordering::Relaxed);
            ThreadStats::incr(&stats.rejected_connections);
            return;
        }
        tenant.info.curr_connections.fetch_add(1, Ordering::Relaxed);
        ThreadStats::incr(&stats.total_connections);
        let idx = match self.free.pop() {
            Some(i) => i,
            None => {
                self.conns.push(None);
                self.conns.len() - 1
            }
        };
        if let Err(e) = self.poll.registry().register(&mut stream, Token(idx), Interest::READABLE) {
            eprintln!("slipstream: cannot watch connection: {e}");
            self.table.conns_total.fetch_sub(1, Ordering::Relaxed);
            tenant.info.curr_connections.fetch_sub(1, Ordering::Relaxed);
            self.free.push(idx);
            return;
        }
        let fd = stream.as_raw_fd();
        let last_cmd_s = Arc::new(AtomicU64::new(tenant.info.uptime_s()));
        if let Ok(mut reg) = tenant.info.conns.lock() {
            reg.insert(fd, ConnEntry { addr, listen_addr, last_cmd_s: last_cmd_s.clone() });
        }
        let mut state = ConnState::new(Transport::Tcp);
        state.conn_id = fd;
        self.conns[idx] = Some(Slot {
            tenant,
            conn: Conn {
                stream,
                rbuf: vec![0u8; READ_BUF_BYTES_INITIAL],
                rstart: 0,
                rend: 0,
                wbuf: Vec::with_capacity(READ_BUF_BYTES_INITIAL),
                wstart: 0,
                rbuf_charged: 0,
                needs_grow: false,
                grow_refused: false,
                state,
                blocked_on_write: false,
                close_after_flush: false,
                needs_revisit: false,
                fd,
                last_cmd_s,
                outstanding: 0,
                throttle_until_ns: 0,
                in_throttled: false,
                held: false,
            },
        });
    }

    fn close(&mut self, idx: usize) {
        if let Some(mut s) = self.conns.get_mut(idx).and_then(Option::take) {
            let _ = self.poll.registry().deregister(&mut s.conn.stream);
            self.settings.conn_buf.release(s.conn.rbuf_charged + s.conn.state.reply_charged_bytes);
            if let Ok(mut reg) = s.tenant.info.conns.lock() {
                reg.remove(&s.conn.fd);
            }
            if let Some(sh) = s.tenant.shaper.as_ref() {
                sh.complete(s.conn.outstanding);
            }
            s.tenant.info.curr_connections.fetch_sub(1, Ordering::Relaxed);
            self.table.conns_total.fetch_sub(1, Ordering::Relaxed);
            self.free.push(idx);
        }
    }

    /// `peer_closed`: the event says the peer shut its side (EPOLLRDHUP) or the socket failed;
    /// then we read to the end, so data and end-of-file that arrive together are both seen.
    fn conn_event(&mut self, idx: usize, readable: bool, writable: bool, peer_closed: bool) -> After {
        let Some(Slot { tenant, conn }) = self.conns.get_mut(idx).and_then(Option::as_mut) else { return After::Keep };
        let registry = self.poll.registry();
        let env = Env { settings: &self.settings, stop: &self.stop, index: self.index, read_buf_bytes_max: self.read_buf_bytes_max };
        if writable && conn.blocked_on_write {
            match flush(conn, thread_stats(tenant, self.index), &self.settings) {
                Ok(true) => {
                    if let Some(sh) = tenant.shaper.as_ref() {
                        sh.complete(std::mem::take(&mut conn.outstanding));
                    }
                    if conn.close_after_flush {
                        return After::Close;
                    }
                    conn.blocked_on_write = false;
                    if registry.reregister(&mut conn.stream, Token(idx), Interest::READABLE).is_err() {
                        return After::Close;
                    }
                    if conn.in_throttled {
                        // Its turn comes from the throttled list.
                        return After::Keep;
                    }
                    // Input may have piled up while we were blocked; execute it now.
                    return serve(conn, tenant, idx, registry, &env, true, peer_closed);
                }
                Ok(false) => return After::Keep,
                Err(_) => return After::Close,
            }
        }
        if readable && !conn.blocked_on_write {
            if conn.in_throttled && !peer_closed {
                // Held back: the bytes wait in the socket (back-pressure); the throttled list
                // brings it back when its tenant has tokens again.
                return After::Keep;
            }
            return serve(conn, tenant, idx, registry, &env, true, peer_closed);
        }
        After::Keep
    }

    fn udp_drain(&mut self, k: usize) {
        // Bounded per event so one busy UDP socket cannot starve this thread's TCP clients;
        // mio re-arms on the next datagram, and we stop early only while data is still queued,
        // so loop until WouldBlock but cap the batch by count.
        let env = Env { settings: &self.settings, stop: &self.stop, index: self.index, read_buf_bytes_max: self.read_buf_bytes_max };
        let Some(wt) = self.tenants.get_mut(k) else { return };
        let mut taken = 0usize;
        while taken < UDP_DRAIN_DATAGRAMS_MAX {
            let Some(sock) = wt.udp.as_ref() else { return };
            let fd = sock.as_raw_fd();
            let got = match self.udp_rx.recv(fd) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            };
            taken += got;
            for i in 0..got {
                let Some((datagram, peer)) = self.udp_rx.get(i) else {
                    // Larger than any UDP datagram memcached takes, or an unknown family.
                    ThreadStats::incr(&thread_stats(&wt.tenant, env.index).udp_bad_datagrams);
                    continue;
                };
                let n = datagram.len();
                if let Some(sh) = wt.tenant.shaper.as_deref() {
                    // Keep arrival order: once something waits, later datagrams queue behind it.
                    let wait = if wt.udp_queue.is_empty() { udp_wait_ns(sh, monotonic_now_ns()) } else { 1 };
                    if wait > 0 {
                        let stats = thread_stats(&wt.tenant, env.index);
                        ThreadStats::incr(&stats.udp_datagrams_in);
                        ThreadStats::add(&stats.bytes_read, n as u64);
                        if wt.udp_queue.len() < sh.max_outstanding() as usize && wt.udp_queue_bytes + n <= UDP_QUEUE_BYTES_MAX {
                            wt.udp_queue.push_back((datagram.to_vec(), peer));
                            wt.udp_queue_bytes += n;
                            if wt.udp_wait_until_ns == 0 {
                                wt.udp_wait_until_ns = monotonic_now_ns().saturating_add(wait.min(THROTTLE_RECHECK_NS_MAX));
                            }
                        } else {
                            sh.dropped();
                        }
                        continue;
                    }
                }
                udp_datagram(wt, datagram, peer, &mut self.udp, &env, false);
            }
        }
        udp_flush(wt, &mut self.udp, &env);
    }

    /// Run queued UDP requests of shaped tenants while their buckets allow.
    fn serve_udp_queues(&mut self, now: u64) {
        let env = Env { settings: &self.settings, stop: &self.stop, index: self.index, read_buf_bytes_max: self.read_buf_bytes_max };
        for wt in self.tenants.iter_mut() {
            if wt.udp_wait_until_ns == 0 || wt.udp_wait_until_ns > now {
                continue;
            }
            wt.udp_wait_until_ns = 0;
            let Some(sh) = wt.tenant.shaper.clone() else {
                wt.udp_queue.clear();
                wt.udp_queue_bytes = 0;
                continue;
            };
            while !wt.udp_queue.is_empty() {
                let wait = udp_wait_ns(&sh, monotonic_now_ns());
                if wait > 0 {
                    wt.udp_wait_until_ns = monotonic_now_ns().saturating_add(wait.min(THROTTLE_RECHECK_NS_MAX));
                    break;
                }
                let Some((d, peer)) = wt.udp_queue.pop_front() else { break };
                wt.udp_queue_bytes = wt.udp_queue_bytes.saturating_sub(d.len());
                udp_datagram(wt, &d, peer, &mut self.udp, &env, true);
            }
            udp_flush(wt, &mut self.udp, &env);
        }
    }
}

/// Execute one UDP request datagram for `wt`'s tenant and send the replies. `counted`: its
/// arrival was already counted (it waited in the queue).
fn udp_datagram(wt: &mut WorkerTenant, datagram: &[u8], peer: SocketAddr, bufs: &mut UdpBufs, env: &Env<'_>, counted: bool) {
    let tenant = &*wt.tenant;
    let stats = thread_stats(tenant, env.index);
    let n = datagram.len();
    if !counted {
        ThreadStats::incr(&stats.udp_datagrams_in);
        ThreadStats::add(&stats.bytes_read, n as u64);
    }
    if let Some(sh) = tenant.shaper.as_ref() {
        sh.charge_ingress(n as u64);
    }
    let Ok((hdr, payload)) = udp::parse(datagram) else {
        // memcached drops malformed and multi-datagram requests silently.
        ThreadStats::incr(&stats.udp_bad_datagrams);
        return;
    };
    bufs.out.clear();
    let state = &mut bufs.state;
    state.protocol = Protocol::Undecided;
    state.swallow_bytes = 0;
    state.udp_marks.clear();
    let mut ctx = Ctx { store: &tenant.store, stats, settings: env.settings, server: &tenant.info, conn: state };
    let mut input = payload;
    let mut closed = false;
    let mut bounded = 0usize;
    let mut requests = 0u32;
    while !input.is_empty() && bounded < 4096 {
        bounded += 1;
        // Every request starts a new response message.
        ctx.conn.udp_marks.push(bufs.out.len());
        if ctx.conn.protocol == Protocol::Undecided {
            ctx.conn.protocol = if input[0] == 0x80 { Protocol::Binary } else { Protocol::Text };
        }
        let step = match ctx.conn.protocol {
            Protocol::Binary => memcache_binary::execute(&mut ctx, input, &mut bufs.out),
            _ => memcache_text::execute(&mut ctx, input, &mut bufs.out),
        };
        match step {
            Step::Consumed(k) if k > 0 && k <= input.len() => {
                input = &input[k..];
                requests += 1;
                ThreadStats::incr(&stats.requests);
            }
            Step::Shutdown => {
                env.stop.stop();
                break;
            }
            Step::Close => {
                // memcached answers a UDP `quit` with a bare frame header whose total
                // is 0 (its close of a UDP "connection" flushes an empty message).
                closed = true;
                break;
            }
            _ => break,
        }
    }
    if let Some(sh) = tenant.shaper.as_ref() {
        sh.charge_egress(requests, bufs.out.len() as u64);
        sh.complete(requests);
    }
    let Some(sock) = wt.udp.as_ref() else { return };
    if closed {
        bufs.frame.clear();
        udp::compose(&mut bufs.frame, udp::FrameHeader { request_id: hdr.request_id, sequence: 0, total: 0, reserved: 0 });
        if bufs.tx.push(&bufs.frame, peer) {
            flush_to(sock, stats, &mut bufs.tx);
        }
        return;
    }
    if bufs.out.is_empty() {
        return;
    }
    // Send each response message (the pieces between marks) with its own sequence
    // numbering; empty pieces (a missed key) send nothing, as in memcached.
    let marks = std::mem::take(&mut bufs.state.udp_marks);
    let len = bufs.out.len();
    let mut from = 0usize;
    for &m in marks.iter().chain(std::iter::once(&len)) {
        let to = m.min(len);
        if to > from {
            udp_send_message(sock, stats, bufs, hdr.request_id, from, to, peer);
            from = to;
        }
    }
    bufs.state.udp_marks = marks;
}

/// Send what `tx` holds. A full socket buffer drops a reply, as UDP may; only what was sent is
/// counted in datagrams_out.
fn flush_to(sock: &UdpSocket, stats: &ThreadStats, tx: &mut SendBatch) {
    let sent = tx.flush(sock.as_raw_fd());
    ThreadStats::add(&stats.udp_datagrams_out, sent.datagrams);
    ThreadStats::add(&stats.bytes_written, sent.bytes);
}

/// Send the replies `wt`'s requests left queued (end of a drain or of a queue run).
fn udp_flush(wt: &WorkerTenant, bufs: &mut UdpBufs, env: &Env<'_>) {
    if bufs.tx.is_empty() {
        return;
    }
    let stats = thread_stats(&wt.tenant, env.index);
    match wt.udp.as_ref() {
        Some(sock) => flush_to(sock, stats, &mut bufs.tx),
        None => bufs.tx.clear(),
    }
}

/// Send `bufs.out[from..to]` as one memcached UDP message: as many datagrams as it needs,
/// each with the frame header (same request id, sequence numbers, total).
fn udp_send_message(sock: &UdpSocket, stats: &ThreadStats, bufs: &mut UdpBufs, request_id: u16, from: usize, to: usize, peer: SocketAddr) {
    let total = udp::datagrams_for(to - from);
    if total > u16::MAX as usize {
        ThreadStats::incr(&stats.udp_bad_datagrams);
        return;
    }
    for seq in 0..total {
        let start = from + seq * udp::REPLY_PAYLOAD_BYTES_MAX;
        let end = (start + udp::REPLY_PAYLOAD_BYTES_MAX).min(to);
        bufs.frame.clear();
        udp::compose(&mut bufs.frame, udp::FrameHeader { request_id, sequence: seq as u16, total: total as u16, reserved: 0 });
        bufs.frame.extend_from_slice(&bufs.out[start..end]);
        if bufs.tx.push(&bufs.frame, peer) {
            flush_to(sock, stats, &mut bufs.tx);
        }
    }
}

/// Rounds of read → execute → write one event may take before the connection goes to the back
/// of the line (memcached's `reqs_per_event` idea): a streaming client cannot starve the others.
const ROUNDS_PER_EVENT: usize = 8;
/// Turns of a connection its tenant's buckets held back lately: a connection resumed after its
/// bucket refilled would otherwise spend a whole burst in one go while other tenants' requests
/// wait behind it.
const ROUNDS_PER_EVENT_HELD: usize = 1;
const BATCH_REQUESTS_MAX_HELD: u32 = 4;
const BATCH_REPLY_BYTES_MAX_HELD: u64 = 4 * 1024;

/// Read what is there, execute every complete request, write the batch's replies; repeat while
/// the socket may hold more and the round budget lasts. With a shaper, each round first asks
/// it what this round may do, and a connection held back gets `throttle_until_ns`.
fn serve(conn: &mut Conn, tenant: &Tenant, idx: usize, registry: &Registry, env: &Env<'_>, mut do_read: bool, peer_closed: bool) -> After {
    let stats = thread_stats(tenant, env.index);
    let shaper = tenant.shaper.as_deref();
    // A connection its tenant's buckets held back lately (the tenant is at its share) takes
    // small turns until it catches up, so requests of tenants within their share never wait
    // long behind it (latency isolation). Throughput is set by the buckets, not by turn size.
    let rounds = if conn.held { ROUNDS_PER_EVENT_HELD } else { ROUNDS_PER_EVENT };
    for _ in 0..rounds {
        let mut limits: Option<(u32, u64)> = None;
        let mut wait_ns = 0u64;
        let mut read_budget = usize::MAX;
        let mut may_execute = true;
        if let Some(sh) = shaper {
            let now = monotonic_now_ns();
            match sh.admit(now) {
                Admit::Go { requests, reply_bytes } => {
                    limits = Some(if conn.held {
                        (requests.min(BATCH_REQUESTS_MAX_HELD), reply_bytes.min(BATCH_REPLY_BYTES_MAX_HELD))
                    } else {
                        (requests, reply_bytes)
                    })
                }
                Admit::Wait { ns } => {
                    // No replies may be produced now, so reading more would only pile up input.
                    may_execute = false;
                    do_read = false;
                    wait_ns = ns;
                }
            }
            if do_read {
                match sh.ingress_budget(now) {
                    // A shaped tenant reads no more than its ingress balance (at least a small
                    // chunk, so a tiny balance does not mean one-byte reads); the rest stays in
                    // the socket.
                    Ok(tokens) => read_budget = tokens.max(READ_BYTES_MIN_SHAPED as u64).min(usize::MAX as u64) as usize,
                    Err(ns) => {
                        // Over its ingress rate: leave the bytes in the socket (back-pressure);
                        // what is already buffered still runs.
                        do_read = false;
                        wait_ns = ns;
                    }
                }
            }
        }
        let mut eof = false;
        // Whether the socket may still hold unread bytes (the buffer filled before it drained).
        let mut more_to_read = false;
        let mut read_bytes = 0u64;
        if do_read {
            // A short read means the socket had no more; the edge-triggered poll reports any
            // later arrival, so we skip the extra read that would only return EAGAIN.
            loop {
                if conn.rend == conn.rbuf.len() {
                    if conn.rstart > 0 {
                        conn.rbuf.copy_within(conn.rstart..conn.rend, 0);
                        conn.rend -= conn.rstart;
                        conn.rstart = 0;
                    } else if !conn.needs_grow {
                        // Execute what the buffer holds before deciding it must grow.
                        more_to_read = true;
                        break;
                    } else if conn.rbuf.len() < env.read_buf_bytes_max || long_get_line(conn) {
                        // A get line may outgrow the bound for other requests: memcached
                        // buffers it whatever its length; the budget bounds it here.
                        let len = conn.rbuf.len();
                        let new_len = if len < env.read_buf_bytes_max { (len * 2).min(env.read_buf_bytes_max) } else { len * 2 };
                        if !env.settings.conn_buf.try_charge(new_len - len) {
                            conn.grow_refused = true;
                            more_to_read = true;
                            break;
                        }
                        conn.rbuf_charged += new_len - len;
                        conn.rbuf.resize(new_len, 0);
                        conn.needs_grow = false;
                    } else {
                        more_to_read = true;
                        break;
                    }
                }
                let left = read_budget - read_bytes as usize;
                if left == 0 {
                    more_to_read = true;
                    break;
                }
                let space = (conn.rbuf.len() - conn.rend).min(left);
                match conn.stream.read(&mut conn.rbuf[conn.rend..conn.rend + space]) {
                    Ok(0) => {
                        eof = true;
                        break;
                    }
                    Ok(n) => {
                        conn.rend += n;
                        read_bytes += n as u64;
                        ThreadStats::add(&stats.bytes_read, n as u64);
                        ThreadStats::incr(&stats.reads);
                        // Unless the peer has closed (then read on to the end-of-file).
                        if n < space && !peer_closed {
                            break;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(_) => return After::Close,
                }
            }
        }
        if let Some(sh) = shaper {
            sh.charge_ingress(read_bytes);
        }

        if conn.rend > conn.rstart {
            // Once per batch, not per request: `stats conns` only needs seconds.
            conn.last_cmd_s.store(tenant.info.uptime_s(), Ordering::Relaxed);
        }
        let batch = if may_execute { execute_batch(conn, tenant, stats, env, limits) } else { BatchEnd::default() };
        if let Some(sh) = shaper {
            if batch.requests > 0 || batch.reply_bytes > 0 {
                sh.charge_egress(batch.requests, batch.reply_bytes);
            }
        }
        conn.outstanding = conn.outstanding.saturating_add(batch.requests);

        match flush(conn, stats, env.settings) {
            Ok(true) => {
                if let Some(sh) = shaper {
                    sh.complete(std::mem::take(&mut conn.outstanding));
                } else {
                    conn.outstanding = 0;
                }
            }
            Ok(false) => {
                conn.blocked_on_write = true;
                return match registry.reregister(&mut conn.stream, Token(idx), Interest::WRITABLE) {
                    Ok(()) => After::Keep,
                    Err(_) => After::Close,
                };
            }
            Err(_) => return After::Close,
        }
        if conn.close_after_flush || eof {
            return After::Close;
        }
        if wait_ns > 0 {
            let wait = wait_ns.min(THROTTLE_RECHECK_NS_MAX);
            conn.throttle_until_ns = monotonic_now_ns().saturating_add(wait).max(1);
            conn.held = true;
            return After::Keep;
        }
        if !more_to_read && !batch.high && !batch.limited {
            // Caught up without being held back: full turns again.
            conn.held = false;
            return After::Keep;
        }
        do_read = more_to_read;
    }
    conn.needs_revisit = true;
    After::Keep
}

/// How a batch ended.
#[derive(Default)]
struct BatchEnd {
    /// Stopped because too many reply bytes wait for the socket (input may remain).
    high: bool,
    /// Stopped at the shaper's limits (input remains).
    limited: bool,
    requests: u32,
    reply_bytes: u64,
}

/// Execute complete requests from the read buffer, appending replies, up to `limits`
/// (requests, reply bytes) when the tenant is shaped.
fn execute_batch(conn: &mut Conn, tenant: &Tenant, stats: &ThreadStats, env: &Env<'_>, limits: Option<(u32, u64)>) -> BatchEnd {
    let mut ctx = Ctx {
        store: &tenant.store,
        stats,
        settings: env.settings,
        server: &tenant.info,
        conn: &mut conn.state,
    };
    let (requests_max, reply_bytes_max) = limits.unwrap_or((u32::MAX, u64::MAX));
    let start_len = conn.wbuf.len();
    // Values sent by reference are reply bytes too (the shaper counts them); the queue only
    // grows while the batch runs.
    let start_pinned = ctx.conn.shared.pinned_bytes();
    let mut end = BatchEnd::default();
    loop {
        if conn.wbuf.len() - conn.wstart >= WRITE_BUF_BYTES_HIGH
            || !ctx.conn.shared.has_room(SHARE_VALUE_BYTES_MIN)
            || !env.settings.conn_buf.charge_reply(&mut ctx.conn.reply_charged_bytes, conn.wbuf.capacity())
        {
            // Too much waiting for the socket, or replies that grew the buffer (a get charges
            // before it copies; other replies are small) and the budget cannot cover them:
            // execute nothing more until the client reads.
            end.high = true;
            break;
        }
        let input = &conn.rbuf[conn.rstart..conn.rend];
        if input.is_empty() {
            break;
        }
        let reply_bytes = conn.wbuf.len().saturating_sub(start_len) + ctx.conn.shared.pinned_bytes().saturating_sub(start_pinned);
        if end.requests >= requests_max || reply_bytes as u64 >= reply_bytes_max {
            end.limited = true;
            break;
        }
        let step = if let Some(auth) = env.settings.auth.as_deref() {
            // [sec hook] A server with -Y/-S: the auth executor decides (see crate::auth).
            crate::auth::execute(auth, &mut ctx, input, &mut conn.wbuf)
        } else {
            if ctx.conn.protocol == Protocol::Undecided {
                ctx.conn.protocol = if input[0] == 0x80 { Protocol::Binary } else { Protocol::Text };
            }
            match ctx.conn.protocol {
                Protocol::Binary => memcache_binary::execute(&mut ctx, input, &mut conn.wbuf),
                _ => memcache_text::execute(&mut ctx, input, &mut conn.wbuf),
            }
        };
        // Replies an executor discarded take the values they sent by reference with them.
        ctx.conn.shared.discard_after(conn.wbuf.len());
        match step {
            Step::Consumed(n) => {
                // An executor that claims more than it was given is a bug; close rather than
                // index out of bounds.
                if n == 0 || n > input.len() {
                    conn.close_after_flush = true;
                    break;
                }
                conn.rstart += n;
                conn.needs_grow = false;
                end.requests += 1;
                ThreadStats::incr(&stats.requests);
            }
            Step::Incomplete => {
                let full = conn.rstart == 0 && conn.rend == conn.rbuf.len();
                conn.needs_grow = full;
                if full && std::mem::take(&mut conn.grow_refused) {
                    conn.needs_grow = false;
                    // The budget would not let the buffer grow for this request.
                    let refused = memcache_text::refuse_unbufferable(&mut ctx, input, &mut conn.wbuf);
                    ctx.conn.shared.discard_after(conn.wbuf.len());
                    match refused {
                        Step::Consumed(n) if n <= input.len() => {
                            conn.rstart += n;
                            continue;
                        }
                        _ => conn.close_after_flush = true,
                    }
                } else if full && conn.rbuf.len() >= env.read_buf_bytes_max && !long_get_line(conn) {
                    // A single request larger than we will ever buffer.
                    conn.close_after_flush = true;
                }
                break;
            }
            Step::Close => {
                conn.close_after_flush = true;
                break;
            }
            Step::Shutdown => {
                env.stop.stop();
                conn.close_after_flush = true;
                break;
            }
        }
    }
    end.reply_bytes = (conn.wbuf.len().saturating_sub(start_len) + conn.state.shared.pinned_bytes().saturating_sub(start_pinned)) as u64;
    if conn.rstart == conn.rend {
        conn.rstart = 0;
        conn.rend = 0;
        if conn.rbuf.len() > READ_BUF_BYTES_INITIAL {
            // Give back the memory a large request needed.
            conn.rbuf.truncate(READ_BUF_BYTES_INITIAL);
            conn.rbuf.shrink_to_fit();
            env.settings.conn_buf.release(std::mem::take(&mut conn.rbuf_charged));
        }
    }
    end
}

/// Whether the unconsumed input is the start of a text `get`/`gets` line still waiting for its
/// newline (memcached buffers those whatever their length).
fn long_get_line(conn: &Conn) -> bool {
    let input = &conn.rbuf[conn.rstart..conn.rend];
    conn.state.protocol == Protocol::Text
        && conn.state.swallow_bytes == 0
        && !input.contains(&b'\n')
        && slipstream_proto::text::is_multiget_start(input)
}

/// Write pending replies. Ok(true) = all written (then the buffer is back within its free
/// size and its budget charge is given back).
fn flush(conn: &mut Conn, stats: &ThreadStats, settings: &Settings) -> io::Result<bool> {
    let done = outq::write_pending(&mut conn.stream, &conn.wbuf, &mut conn.wstart, &mut conn.state.shared, |n| {
        ThreadStats::add(&stats.bytes_written, n as u64);
        ThreadStats::incr(&stats.writes);
    })?;
    // [sec hook] TLS records still held count as unwritten (no-op for plain sockets).
    if !done || !conn.stream.drain()? {
        return Ok(false);
    }
    conn.wbuf.clear();
    conn.wstart = 0;
    if conn.wbuf.capacity() > REPLY_BYTES_FREE {
        conn.wbuf.shrink_to(READ_BUF_BYTES_INITIAL);
    }
    settings.conn_buf.release(std::mem::take(&mut conn.state.reply_charged_bytes));
    Ok(true)
}

/// Current connection count (for tests and metrics).
pub fn curr_connections(info: &ServerInfo) -> u64 {
    info.curr_connections.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listener_tokens_round_trip_and_never_meet_connection_tokens() {
        for slot in 0..SLOTS_MAX as u32 {
            for udp in [false, true] {
                assert_eq!(decode_listen(listen_token(slot, udp)), Some((slot, udp)));
            }
        }
        assert_eq!(decode_listen(WAKER), None);
        assert_eq!(decode_listen(Token(0)), None);
        assert_eq!(decode_listen(Token(1 << 40)), None);
    }
}
