//! Listening: the poll tokens of every tenant's listener and UDP socket, watching a tenant's
//! sockets in a worker's poll, and accepting TCP connections (wrapped in TLS under `-Z`) and
//! connections on the `-s` unix socket (the connection limit, `stats conns` registration, a
//! `Conn` for each).
//!
//! What it is for: the CLASSIFY stage on the user-space side — a connection belongs to the
//! tenant whose port it came in on. What it is not for: binding (bind.rs and slipstream-bind
//! bind every port before the workers start; the tenant table hands each worker its sockets).

use super::conn::Conn;
use super::env::{thread_stats, Slot};
use crate::exec::Protocol;
use crate::stats::{ConnEntry, LastCmd, ThreadStats};
use crate::tenants::{Tenant, TenantTable};
use crate::transport::{tls::TlsStream, Stream};
use crate::watch::Peer;
use mio::net::{TcpListener, TcpStream, UdpSocket, UnixListener};
use mio::{Interest, Registry, Token};
use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub(super) const WAKER: Token = Token(usize::MAX - 2);
/// The `-s` unix listener (every worker watches it; the first to accept gets the connection).
pub(super) const UNIX_LISTENER: Token = Token(usize::MAX - 3);
/// Listener tokens: `LISTEN_BASE - 2 * slot` (TCP) and one below it (UDP), one pair per tenant
/// slot; connection tokens are small indexes and never reach this range.
const LISTEN_BASE: usize = usize::MAX - 16;
const SLOTS_MAX: usize = slipstream_tenancy::spec::TENANTS_MAX;

pub(super) fn listen_token(slot: u32, udp: bool) -> Token {
    Token(LISTEN_BASE - 2 * slot as usize - udp as usize)
}

/// (slot, is_udp) for a listener token.
pub(super) fn decode_listen(t: Token) -> Option<(u32, bool)> {
    let t = t.0;
    if t <= LISTEN_BASE && t > LISTEN_BASE - 2 * SLOTS_MAX {
        let d = LISTEN_BASE - t;
        Some(((d / 2) as u32, d % 2 == 1))
    } else {
        None
    }
}

/// A tenant as one worker serves it: its sockets there and its UDP wait queue.
pub(super) struct WorkerTenant {
    pub tenant: Arc<Tenant>,
    pub listener: Option<TcpListener>,
    pub udp: Option<UdpSocket>,
    /// UDP requests held back by the tenant's shaper (payload after the frame header is parsed
    /// again when they run), bounded by `max_outstanding` entries and `UDP_QUEUE_BYTES_MAX`.
    pub udp_queue: VecDeque<(Vec<u8>, SocketAddr)>,
    pub udp_queue_bytes: usize,
    /// Look at the queue again at this monotonic time (0 = nothing waiting).
    pub udp_wait_until_ns: u64,
    /// The `stats conns` entry the UDP socket's traffic shows in: its own, or (a socket beyond
    /// those memcached would have) the listed one of its address. Its fd and request clock.
    pub udp_listed: Option<(i32, Arc<LastCmd>)>,
}

impl WorkerTenant {
    /// Watch the sockets `t` bound for worker `index` in this worker's poll. A socket the poll
    /// refuses is left out (and said so); the tenant's other sockets still serve.
    pub fn watch(registry: &Registry, t: Arc<Tenant>, index: usize) -> WorkerTenant {
        let (tcp, udp_sock) = t.take_sockets(index);
        let mut listener = tcp.map(TcpListener::from_std);
        let mut udp_sock = udp_sock.map(UdpSocket::from_std);
        if let Some(l) = listener.as_mut() {
            if let Err(e) = registry.register(l, listen_token(t.slot, false), Interest::READABLE) {
                eprintln!("slipstream: worker cannot watch tenant {}'s listener: {e}", t.name);
                listener = None;
            }
        }
        if let Some(u) = udp_sock.as_mut() {
            if let Err(e) = registry.register(u, listen_token(t.slot, true), Interest::READABLE) {
                eprintln!("slipstream: worker cannot watch tenant {}'s UDP socket: {e}", t.name);
                udp_sock = None;
            }
        }
        let udp_listed = udp_sock.as_ref().and_then(|u| listed_udp_entry(&t, u));
        WorkerTenant {
            tenant: t,
            listener,
            udp: udp_sock,
            udp_queue: VecDeque::new(),
            udp_queue_bytes: 0,
            udp_wait_until_ns: 0,
            udp_listed,
        }
    }

    /// Stop watching the tenant's sockets (it was removed).
    pub fn unwatch(&mut self, registry: &Registry) {
        if let Some(l) = self.listener.as_mut() {
            let _ = registry.deregister(l);
        }
        if let Some(u) = self.udp.as_mut() {
            let _ = registry.deregister(u);
        }
    }
}

/// The `stats conns` entry of UDP socket `u`: its own, else the first listed for its address.
fn listed_udp_entry(t: &Tenant, u: &UdpSocket) -> Option<(i32, Arc<LastCmd>)> {
    let reg = t.info.conns.lock().ok()?;
    if let Some(e) = reg.get(&u.as_raw_fd()) {
        return Some((u.as_raw_fd(), e.last_cmd.clone()));
    }
    let addr = format!("udp:{}", u.local_addr().ok()?);
    reg.iter().find(|(_, e)| e.listen_addr.is_none() && e.addr == addr).map(|(fd, e)| (*fd, e.last_cmd.clone()))
}

/// A worker's connections: slots indexed by poll token, and the free indexes.
pub(super) struct Conns {
    pub slots: Vec<Option<Slot>>,
    pub free: Vec<usize>,
}

/// What accepting needs from the worker.
pub(super) struct Acceptor<'a> {
    pub registry: &'a Registry,
    pub table: &'a TenantTable,
    pub index: usize,
    /// `-Z`: TCP connections are TLS.
    pub tls: Option<&'a Arc<crate::transport::tls::TlsState>>,
}

impl Acceptor<'_> {
    /// Accept every connection waiting on `wt`'s listener into `conns`.
    pub fn accept_all(&self, wt: &WorkerTenant, conns: &mut Conns) {
        loop {
            let Some(listener) = wt.listener.as_ref() else { return };
            match listener.accept() {
                Ok((stream, peer)) => {
                    let listen_addr = listener.local_addr().ok().map(|a| format!("tcp:{a}"));
                    let _ = stream.set_nodelay(true);
                    if let Some(relay) = wt.tenant.relay.get() {
                        self.relay_conn(relay, stream);
                        continue;
                    }
                    let tls = self.tls.filter(|_| !wt.tenant.tls_exempt);
                    let Some(stream) = wrap_tcp(stream, tls) else { continue };
                    let addr = format!("tcp:{peer}");
                    self.admit_conn(conns, wt.tenant.clone(), stream, (addr, Peer::tcp(peer)), listen_addr);
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

    /// [sec hook] Accept what waits on the `-s` unix listener (single-tenant mode: the one
    /// tenant, `tenant`).
    pub fn accept_unix(&self, listener: &UnixListener, tenant: &Arc<Tenant>, conns: &mut Conns) {
        loop {
            match listener.accept() {
                Ok((stream, _)) => {
                    let path = listener
                        .local_addr()
                        .ok()
                        .and_then(|a| a.as_pathname().map(|p| p.display().to_string()))
                        .unwrap_or_default();
                    // memcached 1.6.18 shows a unix client's address as `?:<AF 0>` (it keeps no
                    // peer address for them).
                    self.admit_conn(
                        conns,
                        tenant.clone(),
                        Stream::Unix(stream),
                        ("?:<AF 0>".to_string(), Peer::unix()),
                        Some(format!("unix:{path}")),
                    );
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

    /// A connection to a tenant this node holds no replica of: relayed to one that does;
    /// at most the node's connection limit of them at once.
    fn relay_conn(&self, relay: &Arc<crate::relay::Relay>, stream: mio::net::TcpStream) {
        if relay.open.load(Ordering::Relaxed) >= self.table.conn_limit {
            refuse_over_limit(&Stream::Tcp(stream));
            return;
        }
        relay.start(std::net::TcpStream::from(stream));
    }

    /// Take an accepted connection in: within the connection limit (memcached's refusal
    /// otherwise), watched by the poll, listed in `stats conns` as `addr`, counted.
    fn admit_conn(
        &self,
        conns: &mut Conns,
        tenant: Arc<Tenant>,
        mut stream: Stream,
        (addr, peer): (String, Peer),
        listen_addr: Option<String>,
    ) {
        let curr = self.table.conns_total.fetch_add(1, Ordering::Relaxed) + 1;
        let stats = thread_stats(&tenant, self.index);
        if curr as usize > self.table.conn_limit {
            refuse_over_limit(&stream);
            self.table.conns_total.fetch_sub(1, Ordering::Relaxed);
            ThreadStats::incr(&stats.rejected_connections);
            return;
        }
        tenant.info.curr_connections.fetch_add(1, Ordering::Relaxed);
        ThreadStats::incr(&stats.total_connections);
        let idx = match conns.free.pop() {
            Some(i) => i,
            None => {
                conns.slots.push(None);
                conns.slots.len() - 1
            }
        };
        if let Err(e) = self.registry.register(&mut stream, Token(idx), Interest::READABLE) {
            eprintln!("slipstream: cannot watch connection: {e}");
            self.table.conns_total.fetch_sub(1, Ordering::Relaxed);
            tenant.info.curr_connections.fetch_sub(1, Ordering::Relaxed);
            conns.free.push(idx);
            return;
        }
        let fd = stream.as_raw_fd();
        let last_cmd = Arc::new(LastCmd::new(tenant.info.uptime_s()));
        if let Ok(mut reg) = tenant.info.conns.lock() {
            reg.insert(fd, ConnEntry { addr, listen_addr, last_cmd: last_cmd.clone(), watching: false });
        }
        crate::watch::log_conn(&self.table.settings.logger, &peer, fd, None);
        let mut conn = Conn::new(stream, fd, last_cmd, peer);
        // -B ascii|binary: the connection speaks only that protocol.
        conn.state.protocol = Protocol::bound_by(self.table.settings.tunables.binding_protocol);
        conns.slots[idx] = Some(Slot { tenant, conn });
    }
}

/// memcached's answer when over the connection limit, written on the raw socket as memcached
/// writes it, TLS or not.
fn refuse_over_limit(stream: &Stream) {
    let msg = b"ERROR Too many open connections\r\n";
    // SAFETY: the fd is the stream's open socket; write only reads `msg`, which outlives the call.
    let _ = unsafe { libc::write(stream.as_raw_fd(), msg.as_ptr().cast(), msg.len()) };
}

/// [sec hook] A TCP connection as served: plain, or TLS under `-Z` unless its listener is
/// exempt (`-l notls:`) (None: the TLS set-up failed, said so; the socket closes).
fn wrap_tcp(stream: TcpStream, tls: Option<&Arc<crate::transport::tls::TlsState>>) -> Option<Stream> {
    let Some(cfg) = tls else { return Some(Stream::Tcp(stream)) };
    match TlsStream::new(stream, cfg) {
        Ok(t) => Some(Stream::Tls(Box::new(t))),
        Err(e) => {
            eprintln!("slipstream: TLS connection setup failed: {e}");
            None
        }
    }
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
        assert_eq!(decode_listen(UNIX_LISTENER), None);
        assert_eq!(decode_listen(Token(0)), None);
        assert_eq!(decode_listen(Token(1 << 40)), None);
    }
}
