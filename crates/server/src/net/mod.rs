//! The network loops: one event loop per worker thread, each with its own SO_REUSEPORT TCP
//! listener (the kernel spreads connections across threads, so there is no accept lock) and its
//! own SO_REUSEPORT UDP socket.
//!
//! What it is for: reading, pipelining and coalescing. A TCP round is plan → read → execute →
//! charge → flush: the gate plans it from the tenant's shaper, the connection reads what the
//! socket has, every complete request in the buffer runs through `dispatch::execute_one`, the
//! shaper is charged, and all of that batch's replies go out with one `write`. Replies never
//! wait for a later request: the flush ends the round that produced them, so the flush delay is
//! bounded by the time to execute one read's worth of requests.
//!
//! Layout, one file per role: `listen` (poll tokens, watching a tenant's sockets, accepting),
//! `conn` (a connection's buffers: the read and flush steps), `gate` (the shaping decision, no
//! I/O), `tcp` (the rounds of a TCP connection), `udp` (datagrams and the UDP wait queues),
//! `worker` (the thread's event loop and throttled list); this file starts and stops them (and
//! binds the `-s` unix socket, which every worker watches with its own handle).
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

mod conn;
mod env;
mod gate;
mod listen;
mod tcp;
mod udp;
mod worker;

pub use conn::{READ_BUF_BYTES_INITIAL, WRITE_BUF_BYTES_HIGH};
pub use udp::{UDP_DATAGRAM_BYTES_MAX, UDP_QUEUE_BYTES_MAX};

use crate::bind::bind_all;
use crate::exec::Settings;
use crate::stats::{ConnEntry, ServerInfo, ThreadStats};
use crate::tenants::TenantTable;
use crate::transport::unix::UnixSpec;
use listen::{UNIX_LISTENER, WAKER};
use mio::net::UnixListener;
use mio::{Interest, Poll, Waker};
use slipstream_store::Store;
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use worker::{Worker, WorkerListeners};

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
    /// More (TCP, UDP) addresses served exactly like the first (memcached `-l a,b`): same
    /// store, settings and counters.
    pub more_addrs: Vec<(Option<SocketAddr>, Option<SocketAddr>)>,
    /// `-s`/`-a`: serve this unix socket (memcached then serves no TCP or UDP).
    pub unix: Option<UnixSpec>,
    /// `-Z`: TLS on the TCP listeners.
    pub tls: Option<Arc<crate::transport::tls::TlsState>>,
    /// `-l notls:`: the addresses (0 = `tcp_addr`, k = `more_addrs[k - 1]`) served without TLS.
    pub tls_exempt: Vec<usize>,
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
        crate::watch::log_evictions(&settings.logger, &store);
        crate::maintainer::look_after(&settings.tunables, &store);
        let backlog = settings.tunables.tcp_backlog;
        let bound = bind_all(net.tcp_addr, net.udp_addr, threads, backlog).map_err(NetError::Bind)?;
        let (tcp_local, udp_local) = (bound.2, bound.3);
        let mut more = Vec::with_capacity(net.more_addrs.len());
        for &(tcp, udp) in &net.more_addrs {
            more.push(bind_all(tcp, udp, threads, backlog).map_err(NetError::Bind)?);
        }
        let per_thread: Vec<Arc<ThreadStats>> = (0..threads).map(|_| Arc::new(ThreadStats::default())).collect();
        let info = Arc::new(ServerInfo {
            per_thread: per_thread.clone(),
            threads,
            tcp_port: tcp_local.map(|a| a.port()).unwrap_or(0),
            udp_port: udp_local.map(|a| a.port()).unwrap_or(0),
            ..info_template
        });
        // memcached gives each worker its own UDP socket for one address, one socket per
        // address for a list (its num_threads_per_udp).
        let udp_listed = if more.is_empty() { threads } else { 1 };
        for b in std::iter::once(&bound).chain(more.iter()) {
            info.register_listeners(b, udp_listed);
        }
        let unix = bind_unix(net.unix.as_ref(), &info)?;
        let mut all = vec![bound];
        all.extend(more);
        let table = Arc::new(TenantTable::single(
            threads,
            net.conn_limit,
            Arc::new(settings),
            store,
            info.clone(),
            all,
            &net.tls_exempt,
        ));
        Server::launch(table, net.read_buf_bytes_max, info, net.worker_sched, Listeners { unix, tls: net.tls })
    }

    /// Tenant mode: serve every tenant of `table` (already bound). `info` stands for the node
    /// (for the daemon's own use; each tenant has its own for `stats`). `tls` (`-Z`): every
    /// tenant's TCP port speaks TLS, those added at run time too.
    pub fn start_tenants(
        table: Arc<TenantTable>,
        read_buf_bytes_max: usize,
        info: Arc<ServerInfo>,
        worker_sched: WorkerSched,
        tls: Option<Arc<crate::transport::tls::TlsState>>,
    ) -> Result<Server, NetError> {
        Server::launch(table, read_buf_bytes_max, info, worker_sched, Listeners { unix: None, tls })
    }

    fn launch(
        table: Arc<TenantTable>,
        read_buf_bytes_max: usize,
        info: Arc<ServerInfo>,
        worker_sched: WorkerSched,
        mut listeners: Listeners,
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
        for (i, poll) in polls.into_iter().enumerate() {
            let unix = listeners.unix_for_worker(i + 1 == threads, &poll)?;
            let own = WorkerListeners { unix, tls: listeners.tls.clone() };
            let inbox = Arc::new(crate::replicated::ReplInbox::new(wakers[i].clone()));
            let worker = Worker::new(i, poll, table.clone(), stop_handle.clone(), read_buf_bytes_max, own, inbox);
            let h = std::thread::Builder::new()
                .name(format!("slipstream-w{i}"))
                .spawn(move || {
                    if let Err(e) = worker_sched.apply() {
                        eprintln!(
                            "slipstream: worker {i}: cannot set {worker_sched:?} scheduling ({e}); keeping the default"
                        );
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
    tls: Option<Arc<crate::transport::tls::TlsState>>,
}

impl Listeners {
    /// A worker's own handle of the unix listener, watched by its `poll`: every worker watches
    /// the one listener; the last takes the original (its fd is the one `stats conns` lists).
    fn unix_for_worker(&mut self, last: bool, poll: &Poll) -> Result<Option<UnixListener>, NetError> {
        let std_unix = if last {
            self.unix.take()
        } else {
            self.unix.as_ref().map(|l| l.try_clone()).transpose().map_err(NetError::Poll)?
        };
        let mut unix = std_unix.map(UnixListener::from_std);
        if let Some(l) = unix.as_mut() {
            poll.registry().register(l, UNIX_LISTENER, Interest::READABLE).map_err(NetError::Poll)?;
        }
        Ok(unix)
    }
}

/// [sec hook] Bind the `-s` unix socket, and list it in `stats conns` as memcached does.
fn bind_unix(spec: Option<&UnixSpec>, info: &ServerInfo) -> Result<Option<std::os::unix::net::UnixListener>, NetError> {
    let Some(spec) = spec else { return Ok(None) };
    let l = crate::transport::unix::bind(spec).map_err(|e| NetError::BindUnix(spec.path.clone(), e))?;
    if let Ok(mut reg) = info.conns.lock() {
        reg.insert(l.as_raw_fd(), ConnEntry::socket(format!("unix:{}", spec.path), info.uptime_s()));
    }
    Ok(Some(l))
}

/// Current connection count (for tests and metrics).
pub fn curr_connections(info: &ServerInfo) -> u64 {
    info.curr_connections.load(Ordering::Relaxed)
}
