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
//! What it is not for: protocol rules (the executors) or configuration (the binary crate).

use crate::exec::{ConnState, Ctx, Protocol, Settings, Step, Transport};
use crate::stats::{ConnEntry, ServerInfo, ThreadStats};
use crate::{memcache_binary, memcache_text};
use mio::net::{TcpListener, TcpStream, UdpSocket};
use mio::{Events, Interest, Poll, Registry, Token, Waker};
use slipstream_proto::udp;
use slipstream_store::Store;
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

const LISTENER: Token = Token(usize::MAX - 1);
const WAKER: Token = Token(usize::MAX - 2);
const UDP: Token = Token(usize::MAX - 3);

/// Read buffer a connection starts with (and shrinks back to when idle).
pub const READ_BUF_BYTES_INITIAL: usize = 16 * 1024;
/// Once this many reply bytes are waiting for the socket, stop executing requests from this
/// connection until the client reads (back-pressure instead of unbounded output).
pub const WRITE_BUF_BYTES_HIGH: usize = 4 * 1024 * 1024;
/// Largest UDP request datagram accepted.
pub const UDP_DATAGRAM_BYTES_MAX: usize = 65_536;
/// Events handled per `epoll_wait`.
const EVENTS_MAX: usize = 1024;

/// Listening configuration shared by all workers.
#[derive(Clone, Debug)]
pub struct NetConfig {
    pub tcp_addr: Option<SocketAddr>,
    pub udp_addr: Option<SocketAddr>,
    pub threads: usize,
    pub conn_limit: usize,
    /// Largest request a connection may buffer (item size + line + slack).
    pub read_buf_bytes_max: usize,
}

/// Errors that stop the server from starting.
#[derive(Debug)]
pub enum NetError {
    Bind { addr: SocketAddr, source: io::Error },
    Poll(io::Error),
    Thread(io::Error),
}

impl std::fmt::Display for NetError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NetError::Bind { addr, source } => write!(f, "cannot listen on {addr}: {source}"),
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
    /// Local addresses actually bound (port 0 resolved).
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

fn bind_tcp(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    let domain = socket2::Domain::for_address(addr);
    let s = socket2::Socket::new(domain, socket2::Type::STREAM, Some(socket2::Protocol::TCP))?;
    s.set_reuse_address(true)?;
    s.set_reuse_port(true)?;
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    s.listen(1024)?;
    Ok(s.into())
}

fn bind_udp(addr: SocketAddr) -> io::Result<std::net::UdpSocket> {
    let domain = socket2::Domain::for_address(addr);
    let s = socket2::Socket::new(domain, socket2::Type::DGRAM, Some(socket2::Protocol::UDP))?;
    s.set_reuse_address(true)?;
    s.set_reuse_port(true)?;
    s.set_nonblocking(true)?;
    // Bigger buffers absorb bursts from many clients; the kernel caps these at rmem_max.
    let _ = s.set_recv_buffer_size(4 * 1024 * 1024);
    let _ = s.set_send_buffer_size(4 * 1024 * 1024);
    s.bind(&addr.into())?;
    Ok(s.into())
}

impl Server {
    /// Bind every listener and start the workers. With port 0, the first bind picks the port and
    /// the other threads bind the same one.
    pub fn start(
        net: NetConfig,
        store: Arc<Store>,
        settings: Settings,
        info_template: ServerInfo,
    ) -> Result<Server, NetError> {
        let threads = net.threads.max(1);
        let mut tcp_listeners = Vec::new();
        let mut udp_sockets = Vec::new();
        let mut tcp_local = None;
        let mut udp_local = None;
        for _ in 0..threads {
            if let Some(mut addr) = net.tcp_addr {
                if let Some(l) = tcp_local {
                    addr = l;
                }
                let l = bind_tcp(addr).map_err(|source| NetError::Bind { addr, source })?;
                tcp_local = l.local_addr().ok();
                tcp_listeners.push(Some(l));
            } else {
                tcp_listeners.push(None);
            }
            if let Some(mut addr) = net.udp_addr {
                if let Some(l) = udp_local {
                    addr = l;
                }
                let u = bind_udp(addr).map_err(|source| NetError::Bind { addr, source })?;
                udp_local = u.local_addr().ok();
                udp_sockets.push(Some(u));
            } else {
                udp_sockets.push(None);
            }
        }

        let per_thread: Vec<Arc<ThreadStats>> = (0..threads).map(|_| Arc::new(ThreadStats::default())).collect();
        let info = Arc::new(ServerInfo {
            per_thread: per_thread.clone(),
            threads,
            tcp_port: tcp_local.map(|a| a.port()).unwrap_or(0),
            udp_port: udp_local.map(|a| a.port()).unwrap_or(0),
            ..info_template
        });
        if let (Some(Some(l)), Ok(mut reg)) = (tcp_listeners.first(), info.conns.lock()) {
            // memcached lists its listening socket in `stats conns`; with SO_REUSEPORT every
            // thread has one, and the first stands for them all.
            use std::os::fd::AsRawFd;
            let addr = l.local_addr().map(|a| format!("tcp:{a}")).unwrap_or_default();
            reg.insert(l.as_raw_fd(), ConnEntry { addr, listen_addr: None, last_cmd_s: Arc::new(AtomicU64::new(0)) });
        }
        let stop = Arc::new(AtomicBool::new(false));
        let settings = Arc::new(settings);

        let mut polls = Vec::new();
        let mut wakers = Vec::new();
        for _ in 0..threads {
            let poll = Poll::new().map_err(NetError::Poll)?;
            let waker = Arc::new(Waker::new(poll.registry(), WAKER).map_err(NetError::Poll)?);
            polls.push(poll);
            wakers.push(waker);
        }
        let stop_handle = StopHandle { stop: stop.clone(), wakers: wakers.clone() };

        let mut workers = Vec::new();
        for (i, ((poll, tcp), udp)) in polls.into_iter().zip(tcp_listeners).zip(udp_sockets).enumerate() {
            let worker = Worker {
                poll,
                listener: tcp.map(TcpListener::from_std),
                udp: udp.map(UdpSocket::from_std),
                conns: Vec::new(),
                free: Vec::new(),
                store: store.clone(),
                settings: settings.clone(),
                info: info.clone(),
                stats: per_thread[i].clone(),
                stop: stop_handle.clone(),
                conn_limit: net.conn_limit,
                read_buf_bytes_max: net.read_buf_bytes_max,
                udp_in: vec![0u8; UDP_DATAGRAM_BYTES_MAX],
                udp_out: Vec::with_capacity(UDP_DATAGRAM_BYTES_MAX),
                udp_frame: Vec::with_capacity(udp::REPLY_PAYLOAD_BYTES_MAX + udp::FRAME_HEADER_BYTES),
                udp_state: ConnState::new(Transport::Udp),
            };
            let h = std::thread::Builder::new()
                .name(format!("slipstream-w{i}"))
                .spawn(move || worker.run())
                .map_err(NetError::Thread)?;
            workers.push(h);
        }
        Ok(Server { workers, wakers, stop, info, tcp_local, udp_local })
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

struct Conn {
    stream: TcpStream,
    rbuf: Vec<u8>,
    /// Unconsumed input is rbuf[rstart..rend].
    rstart: usize,
    rend: usize,
    wbuf: Vec<u8>,
    /// Bytes of wbuf already written.
    wstart: usize,
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
}

struct Worker {
    poll: Poll,
    listener: Option<TcpListener>,
    udp: Option<UdpSocket>,
    conns: Vec<Option<Conn>>,
    free: Vec<usize>,
    store: Arc<Store>,
    settings: Arc<Settings>,
    info: Arc<ServerInfo>,
    stats: Arc<ThreadStats>,
    stop: StopHandle,
    conn_limit: usize,
    read_buf_bytes_max: usize,
    udp_in: Vec<u8>,
    udp_out: Vec<u8>,
    udp_frame: Vec<u8>,
    /// Protocol state for UDP requests, reset per datagram (kept to reuse its buffers).
    udp_state: ConnState,
}

/// What handling an event decided for a connection.
enum After {
    Keep,
    Close,
}

impl Worker {
    fn run(mut self) {
        if let Some(l) = self.listener.as_mut() {
            if let Err(e) = self.poll.registry().register(l, LISTENER, Interest::READABLE) {
                eprintln!("slipstream: worker cannot watch its listener: {e}");
                return;
            }
        }
        if let Some(u) = self.udp.as_mut() {
            if let Err(e) = self.poll.registry().register(u, UDP, Interest::READABLE) {
                eprintln!("slipstream: worker cannot watch its UDP socket: {e}");
                return;
            }
        }
        let mut events = Events::with_capacity(EVENTS_MAX);
        let mut revisit: Vec<usize> = Vec::new();
        while !self.stop.is_stopped() {
            // Connections with work left from the last round: look at them again without
            // sleeping in epoll.
            let timeout = if revisit.is_empty() { None } else { Some(std::time::Duration::ZERO) };
            for i in std::mem::take(&mut revisit) {
                let again = self.conns.get_mut(i).and_then(Option::as_mut).map(|c| std::mem::replace(&mut c.needs_revisit, false));
                if again == Some(true) {
                    if let After::Close = self.conn_event(i, true, false, false) {
                        self.close(i);
                    } else if self.conns.get(i).and_then(Option::as_ref).is_some_and(|c| c.needs_revisit) {
                        revisit.push(i);
                    }
                }
            }
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                eprintln!("slipstream: event loop failed: {e}");
                break;
            }
            for ev in events.iter() {
                match ev.token() {
                    WAKER => {}
                    LISTENER => self.accept_all(),
                    UDP => self.udp_drain(),
                    Token(i) => {
                        let after = self.conn_event(i, ev.is_readable() || ev.is_read_closed(), ev.is_writable(), ev.is_read_closed() || ev.is_error());
                        if let After::Close = after {
                            self.close(i);
                        } else if self.conns.get(i).and_then(Option::as_ref).is_some_and(|c| c.needs_revisit) {
                            revisit.push(i);
                        }
                    }
                }
            }
        }
        // Close every connection on the way out so clients see EOF, not a hang.
        for i in 0..self.conns.len() {
            if self.conns[i].is_some() {
                self.close(i);
            }
        }
    }

    fn accept_all(&mut self) {
        loop {
            let Some(listener) = self.listener.as_ref() else { return };
            match listener.accept() {
                Ok((mut stream, peer)) => {
                    let curr = self.info.curr_connections.fetch_add(1, Ordering::Relaxed) + 1;
                    if curr as usize > self.conn_limit {
                        // memcached's answer when over the connection limit.
                        let _ = stream.write(b"ERROR Too many open connections\r\n");
                        self.info.curr_connections.fetch_sub(1, Ordering::Relaxed);
                        ThreadStats::incr(&self.stats.rejected_connections);
                        continue;
                    }
                    ThreadStats::incr(&self.stats.total_connections);
                    let _ = stream.set_nodelay(true);
                    let idx = match self.free.pop() {
                        Some(i) => i,
                        None => {
                            self.conns.push(None);
                            self.conns.len() - 1
                        }
                    };
                    if let Err(e) = self.poll.registry().register(&mut stream, Token(idx), Interest::READABLE) {
                        eprintln!("slipstream: cannot watch connection: {e}");
                        self.info.curr_connections.fetch_sub(1, Ordering::Relaxed);
                        self.free.push(idx);
                        continue;
                    }
                    use std::os::fd::AsRawFd;
                    let fd = stream.as_raw_fd();
                    let last_cmd_s = Arc::new(AtomicU64::new(self.info.uptime_s()));
                    if let Ok(mut reg) = self.info.conns.lock() {
                        let listen_addr = self.listener.as_ref().and_then(|l| l.local_addr().ok()).map(|a| format!("tcp:{a}"));
                        reg.insert(fd, ConnEntry { addr: format!("tcp:{peer}"), listen_addr, last_cmd_s: last_cmd_s.clone() });
                    }
                    let mut state = ConnState::new(Transport::Tcp);
                    state.conn_id = fd;
                    self.conns[idx] = Some(Conn {
                        stream,
                        rbuf: vec![0u8; READ_BUF_BYTES_INITIAL],
                        rstart: 0,
                        rend: 0,
                        wbuf: Vec::with_capacity(READ_BUF_BYTES_INITIAL),
                        wstart: 0,
                        state,
                        blocked_on_write: false,
                        close_after_flush: false,
                        needs_revisit: false,
                        fd,
                        last_cmd_s,
                    });
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

    fn close(&mut self, idx: usize) {
        if let Some(mut c) = self.conns.get_mut(idx).and_then(Option::take) {
            let _ = self.poll.registry().deregister(&mut c.stream);
            if let Ok(mut reg) = self.info.conns.lock() {
                reg.remove(&c.fd);
            }
            self.info.curr_connections.fetch_sub(1, Ordering::Relaxed);
            self.free.push(idx);
        }
    }

    /// `peer_closed`: the event says the peer shut its side (EPOLLRDHUP) or the socket failed;
    /// then we read to the end, so data and end-of-file that arrive together are both seen.
    fn conn_event(&mut self, idx: usize, readable: bool, writable: bool, peer_closed: bool) -> After {
        let Some(conn) = self.conns.get_mut(idx).and_then(Option::as_mut) else { return After::Keep };
        let registry = self.poll.registry();
        let mut ctx_parts = CtxParts {
            store: &self.store,
            stats: &self.stats,
            settings: &self.settings,
            info: &self.info,
            stop: &self.stop,
        };
        if writable && conn.blocked_on_write {
            match flush(conn, &self.stats) {
                Ok(true) => {
                    if conn.close_after_flush {
                        return After::Close;
                    }
                    conn.blocked_on_write = false;
                    if registry.reregister(&mut conn.stream, Token(idx), Interest::READABLE).is_err() {
                        return After::Close;
                    }
                    // Input may have piled up while we were blocked; execute it now.
                    return serve(conn, idx, registry, &mut ctx_parts, self.read_buf_bytes_max, true, peer_closed);
                }
                Ok(false) => return After::Keep,
                Err(_) => return After::Close,
            }
        }
        if readable && !conn.blocked_on_write {
            return serve(conn, idx, registry, &mut ctx_parts, self.read_buf_bytes_max, true, peer_closed);
        }
        After::Keep
    }

    fn udp_drain(&mut self) {
        // Bounded per event so one busy UDP socket cannot starve this thread's TCP clients;
        // mio re-arms on the next datagram, and we stop early only while data is still queued,
        // so loop until WouldBlock but cap the batch by count.
        for _ in 0..4096 {
            let Some(sock) = self.udp.as_ref() else { return };
            let (n, peer) = match sock.recv_from(&mut self.udp_in) {
                Ok(x) => x,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return,
            };
            ThreadStats::incr(&self.stats.udp_datagrams_in);
            ThreadStats::add(&self.stats.bytes_read, n as u64);
            let Ok((hdr, payload)) = udp::parse(&self.udp_in[..n]) else {
                // memcached drops malformed and multi-datagram requests silently.
                ThreadStats::incr(&self.stats.udp_bad_datagrams);
                continue;
            };
            self.udp_out.clear();
            let state = &mut self.udp_state;
            state.protocol = Protocol::Undecided;
            state.swallow_bytes = 0;
            state.udp_marks.clear();
            let mut ctx = Ctx {
                store: &self.store,
                stats: &self.stats,
                settings: &self.settings,
                server: &self.info,
                conn: state,
            };
            let mut input = payload;
            let mut closed = false;
            let mut bounded = 0usize;
            while !input.is_empty() && bounded < 4096 {
                bounded += 1;
                // Every request starts a new response message.
                ctx.conn.udp_marks.push(self.udp_out.len());
                if ctx.conn.protocol == Protocol::Undecided {
                    ctx.conn.protocol = if input[0] == 0x80 { Protocol::Binary } else { Protocol::Text };
                }
                let step = match ctx.conn.protocol {
                    Protocol::Binary => memcache_binary::execute(&mut ctx, input, &mut self.udp_out),
                    _ => memcache_text::execute(&mut ctx, input, &mut self.udp_out),
                };
                match step {
                    Step::Consumed(k) if k > 0 && k <= input.len() => input = &input[k..],
                    Step::Shutdown => {
                        self.stop.stop();
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
            if closed {
                self.udp_frame.clear();
                udp::compose(&mut self.udp_frame, udp::FrameHeader { request_id: hdr.request_id, sequence: 0, total: 0, reserved: 0 });
                if let Some(sock) = self.udp.as_ref() {
                    if sock.send_to(&self.udp_frame, peer).is_ok() {
                        ThreadStats::incr(&self.stats.udp_datagrams_out);
                    }
                }
                continue;
            }
            if self.udp_out.is_empty() {
                continue;
            }
            // Send each response message (the pieces between marks) with its own sequence
            // numbering; empty pieces (a missed key) send nothing, as in memcached.
            let marks = std::mem::take(&mut self.udp_state.udp_marks);
            let len = self.udp_out.len();
            let mut from = 0usize;
            for &m in marks.iter().chain(std::iter::once(&len)) {
                let to = m.min(len);
                if to > from {
                    self.udp_send_message(hdr.request_id, from, to, peer);
                    from = to;
                }
            }
            self.udp_state.udp_marks = marks;
        }
    }

    /// Send `udp_out[from..to]` as one memcached UDP message: as many datagrams as it needs,
    /// each with the frame header (same request id, sequence numbers, total).
    fn udp_send_message(&mut self, request_id: u16, from: usize, to: usize, peer: SocketAddr) {
        {
            let total = udp::datagrams_for(to - from);
            if total > u16::MAX as usize {
                ThreadStats::incr(&self.stats.udp_bad_datagrams);
                return;
            }
            for seq in 0..total {
                let start = from + seq * udp::REPLY_PAYLOAD_BYTES_MAX;
                let end = (start + udp::REPLY_PAYLOAD_BYTES_MAX).min(to);
                self.udp_frame.clear();
                udp::compose(
                    &mut self.udp_frame,
                    udp::FrameHeader { request_id, sequence: seq as u16, total: total as u16, reserved: 0 },
                );
                self.udp_frame.extend_from_slice(&self.udp_out[start..end]);
                if let Some(sock) = self.udp.as_ref() {
                    // A full socket buffer drops the reply, as UDP may; counted via datagrams_out.
                    if sock.send_to(&self.udp_frame, peer).is_ok() {
                        ThreadStats::incr(&self.stats.udp_datagrams_out);
                        ThreadStats::add(&self.stats.bytes_written, self.udp_frame.len() as u64);
                    }
                }
            }
        }
    }
}

struct CtxParts<'a> {
    store: &'a Arc<Store>,
    stats: &'a Arc<ThreadStats>,
    settings: &'a Arc<Settings>,
    info: &'a Arc<ServerInfo>,
    stop: &'a StopHandle,
}

/// Rounds of read → execute → write one event may take before the connection goes to the back
/// of the line (memcached's `reqs_per_event` idea): a streaming client cannot starve the others.
const ROUNDS_PER_EVENT: usize = 8;

/// Read what is there, execute every complete request, write the batch's replies; repeat while
/// the socket may hold more and the round budget lasts.
fn serve(
    conn: &mut Conn,
    idx: usize,
    registry: &Registry,
    parts: &mut CtxParts<'_>,
    read_buf_bytes_max: usize,
    mut do_read: bool,
    peer_closed: bool,
) -> After {
    for _ in 0..ROUNDS_PER_EVENT {
        let mut eof = false;
        // Whether the socket may still hold unread bytes (the buffer filled before it drained).
        let mut more_to_read = false;
        if do_read {
            // A short read means the socket had no more; the edge-triggered poll reports any
            // later arrival, so we skip the extra read that would only return EAGAIN.
            loop {
                if conn.rend == conn.rbuf.len() {
                    if conn.rstart > 0 {
                        conn.rbuf.copy_within(conn.rstart..conn.rend, 0);
                        conn.rend -= conn.rstart;
                        conn.rstart = 0;
                    } else if conn.rbuf.len() < read_buf_bytes_max {
                        let new_len = (conn.rbuf.len() * 2).min(read_buf_bytes_max);
                        conn.rbuf.resize(new_len, 0);
                    } else {
                        more_to_read = true;
                        break;
                    }
                }
                let space = conn.rbuf.len() - conn.rend;
                match conn.stream.read(&mut conn.rbuf[conn.rend..]) {
                    Ok(0) => {
                        eof = true;
                        break;
                    }
                    Ok(n) => {
                        conn.rend += n;
                        ThreadStats::add(&parts.stats.bytes_read, n as u64);
                        ThreadStats::incr(&parts.stats.reads);
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

        if conn.rend > conn.rstart {
            // Once per batch, not per request: `stats conns` only needs seconds.
            conn.last_cmd_s.store(parts.info.uptime_s(), Ordering::Relaxed);
        }
        let stopped_high = execute_batch(conn, parts, read_buf_bytes_max);

        match flush(conn, parts.stats) {
            Ok(true) => {}
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
        if !more_to_read && !stopped_high {
            return After::Keep;
        }
        do_read = more_to_read;
    }
    conn.needs_revisit = true;
    After::Keep
}

/// Execute every complete request in the read buffer, appending replies. Returns true when it
/// stopped because too many reply bytes are waiting (input may remain).
fn execute_batch(conn: &mut Conn, parts: &mut CtxParts<'_>, read_buf_bytes_max: usize) -> bool {
    let mut ctx = Ctx {
        store: parts.store,
        stats: parts.stats,
        settings: parts.settings,
        server: parts.info,
        conn: &mut conn.state,
    };
    let mut stopped_high = false;
    loop {
        if conn.wbuf.len() - conn.wstart >= WRITE_BUF_BYTES_HIGH {
            stopped_high = true;
            break;
        }
        let input = &conn.rbuf[conn.rstart..conn.rend];
        if input.is_empty() {
            break;
        }
        if ctx.conn.protocol == Protocol::Undecided {
            ctx.conn.protocol = if input[0] == 0x80 { Protocol::Binary } else { Protocol::Text };
        }
        let step = match ctx.conn.protocol {
            Protocol::Binary => memcache_binary::execute(&mut ctx, input, &mut conn.wbuf),
            _ => memcache_text::execute(&mut ctx, input, &mut conn.wbuf),
        };
        match step {
            Step::Consumed(n) => {
                // An executor that claims more than it was given is a bug; close rather than
                // index out of bounds.
                if n == 0 || n > input.len() {
                    conn.close_after_flush = true;
                    break;
                }
                conn.rstart += n;
            }
            Step::Incomplete => {
                if conn.rstart == 0 && conn.rend == conn.rbuf.len() && conn.rbuf.len() >= read_buf_bytes_max {
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
                parts.stop.stop();
                conn.close_after_flush = true;
                break;
            }
        }
    }
    if conn.rstart == conn.rend {
        conn.rstart = 0;
        conn.rend = 0;
        if conn.rbuf.len() > READ_BUF_BYTES_INITIAL {
            // Give back the memory a large request needed.
            conn.rbuf.truncate(READ_BUF_BYTES_INITIAL);
            conn.rbuf.shrink_to_fit();
        }
    }
    stopped_high
}

/// Write pending replies. Ok(true) = all written.
fn flush(conn: &mut Conn, stats: &ThreadStats) -> io::Result<bool> {
    while conn.wstart < conn.wbuf.len() {
        match conn.stream.write(&conn.wbuf[conn.wstart..]) {
            Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
            Ok(n) => {
                conn.wstart += n;
                ThreadStats::add(&stats.bytes_written, n as u64);
                ThreadStats::incr(&stats.writes);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    conn.wbuf.clear();
    conn.wstart = 0;
    if conn.wbuf.capacity() > WRITE_BUF_BYTES_HIGH {
        conn.wbuf.shrink_to(READ_BUF_BYTES_INITIAL);
    }
    Ok(true)
}

/// Current connection count (for tests and metrics).
pub fn curr_connections(info: &ServerInfo) -> u64 {
    info.curr_connections.load(Ordering::Relaxed)
}

#[allow(dead_code)]
fn _assert_send() {
    fn is_send<T: Send>() {}
    is_send::<Arc<AtomicU64>>();
}
