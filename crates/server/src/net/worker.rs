//! The worker: one thread, one `mio` poll, every tenant's sockets (its own SO_REUSEPORT
//! listener and UDP socket per tenant) and the TCP connections it accepted.
//!
//! What it is for: the event loop — revisits of connections whose round budget ran out, the
//! throttled list (connections the gate held back, served round-robin when due), UDP queues of
//! shaped tenants, then the poll and its events; picking up tenants added or removed; closing
//! connections with their accounting.
//!
//! What it is not for: what a round does (tcp.rs, udp.rs), listening and accepting (listen.rs,
//! the `-s` unix listener included).

use super::env::{thread_stats, Env, Slot};
use super::listen::{decode_listen, Acceptor, Conns, WorkerTenant, UNIX_LISTENER, WAKER};
use super::tcp::{self, After};
use super::udp;
use super::udp::{UdpBufs, UDP_DATAGRAM_BYTES_MAX};
use super::StopHandle;
use crate::exec::Settings;
use crate::replicated::ReplInbox;
use crate::stats::ThreadStats;
use crate::tenants::{Tenant, TenantTable};
use crate::udp_batch::RecvBatch;
use crate::watch::CloseReason;
use mio::net::UnixListener;
use mio::{Events, Poll};
use slipstream_tenancy::since_start_ns;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// [sec hook] A worker's listeners beyond the tenants' TCP/UDP sockets, and TLS for the TCP ones.
#[derive(Default)]
pub(super) struct WorkerListeners {
    /// Its handle of the `-s` unix listener, already registered with its poll.
    pub unix: Option<UnixListener>,
    pub tls: Option<Arc<crate::transport::tls::TlsState>>,
}

/// Held-back connections served per loop turn before the poll looks at new events again.
const THROTTLED_SERVED_PER_TURN: usize = 2;
/// Events handled per `epoll_wait`.
const EVENTS_MAX: usize = 1024;

/// How often a worker looks for idle connections under `-o idle_timeout` (memcached's timeout
/// thread also works in whole seconds).
const IDLE_SCAN_NS: u64 = 1_000_000_000;

pub(super) struct Worker {
    pub index: usize,
    /// `-s`: this worker's handle of the unix listener (watched as `UNIX_LISTENER`).
    pub unix: Option<UnixListener>,
    /// `-Z`: TCP connections are TLS.
    pub tls: Option<Arc<crate::transport::tls::TlsState>>,
    pub poll: Poll,
    pub table: Arc<TenantTable>,
    pub seen_generation: u64,
    pub tenants: Vec<WorkerTenant>,
    pub conns: Conns,
    pub settings: Arc<Settings>,
    pub stop: StopHandle,
    pub read_buf_bytes_max: usize,
    /// recvmmsg buffers.
    pub udp_rx: RecvBatch,
    pub udp: UdpBufs,
    /// Connections held back by their tenant's shaper, served round-robin when due.
    pub throttled: Vec<usize>,
    /// Where the next round-robin pass over `throttled` starts.
    pub rr: usize,
    /// `-o idle_timeout`: when this worker next looks for idle connections (monotonic ns).
    pub idle_scan_at_ns: u64,
    /// Outcomes of replicated requests for this worker's parked connections.
    pub inbox: Arc<ReplInbox>,
}

impl Worker {
    pub(super) fn new(
        index: usize,
        poll: Poll,
        table: Arc<TenantTable>,
        stop: StopHandle,
        read_buf_bytes_max: usize,
        listeners: WorkerListeners,
        inbox: Arc<ReplInbox>,
    ) -> Worker {
        Worker {
            index,
            unix: listeners.unix,
            tls: listeners.tls,
            poll,
            settings: table.settings.clone(),
            table,
            seen_generation: 0,
            tenants: Vec::new(),
            conns: Conns { slots: Vec::new(), free: Vec::new() },
            stop,
            read_buf_bytes_max,
            udp_rx: RecvBatch::new(UDP_DATAGRAM_BYTES_MAX),
            udp: UdpBufs::new(),
            throttled: Vec::new(),
            rr: 0,
            idle_scan_at_ns: 0,
            inbox,
        }
    }

    /// The event loop, until the server is told to stop.
    pub(super) fn run(mut self) {
        let mut events = Events::with_capacity(EVENTS_MAX);
        let mut revisit: Vec<usize> = Vec::new();
        let mut deferred: Vec<(usize, bool, bool, bool)> = Vec::with_capacity(EVENTS_MAX);
        while !self.stop.is_stopped() {
            self.reconcile();
            let timeout = self.before_poll(&mut revisit);
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                eprintln!("slipstream: event loop failed: {e}");
                break;
            }
            self.handle_events(&events, &mut deferred, &mut revisit);
        }
        // Close every connection on the way out so clients see EOF, not a hang.
        for i in 0..self.conns.slots.len() {
            if self.conns.slots[i].is_some() {
                self.close(i, CloseReason::Shutdown);
            }
        }
    }

    /// Serve what is due before sleeping: connections with work left from the last round, held
    /// back connections and UDP queues whose time has come. Returns the poll's timeout.
    fn before_poll(&mut self, revisit: &mut Vec<usize>) -> Option<std::time::Duration> {
        // Connections with work left from the last round: look at them again without
        // sleeping in epoll.
        for i in std::mem::take(revisit) {
            let again = self
                .conns
                .slots
                .get_mut(i)
                .and_then(Option::as_mut)
                .map(|s| std::mem::replace(&mut s.conn.needs_revisit, false));
            if again == Some(true) {
                let after = self.conn_event(i, true, false, false);
                self.after_serve(i, after, revisit);
            }
        }
        let mut deadline = None;
        if !self.throttled.is_empty() || self.tenants.iter().any(|w| w.udp_wait_until_ns != 0) {
            let now = since_start_ns();
            self.serve_throttled(now, revisit);
            self.serve_udp_queues(now);
            deadline = self.next_deadline();
        }
        // Decided after the throttled pass, which may leave connections for a revisit.
        let mut timeout = if revisit.is_empty() { None } else { Some(std::time::Duration::ZERO) };
        if let Some(next) = deadline {
            let wait = std::time::Duration::from_nanos(next.saturating_sub(since_start_ns()));
            timeout = Some(timeout.map_or(wait, |t| t.min(wait)));
        }
        if let Some(wait) = self.kick_idle() {
            timeout = Some(timeout.map_or(wait, |t| t.min(wait)));
        }
        timeout
    }

    /// `-o idle_timeout`: close the TCP connections that sent nothing for more than the timeout
    /// and have nothing unsent (memcached kicks only connections waiting for a command), counting
    /// `idle_kicks`. Returns how long the poll may sleep before the next look (None: off).
    fn kick_idle(&mut self) -> Option<std::time::Duration> {
        let idle_s = u64::from(self.settings.tunables.idle_timeout_s);
        if idle_s == 0 {
            return None;
        }
        let now = since_start_ns();
        if now >= self.idle_scan_at_ns {
            self.idle_scan_at_ns = now + IDLE_SCAN_NS;
            for i in 0..self.conns.slots.len() {
                let Some(s) = self.conns.slots[i].as_ref() else { continue };
                let since = s.tenant.info.uptime_s().saturating_sub(s.conn.last_cmd.secs());
                // A connection still being sent a metadump is not idle.
                if since > idle_s && !s.conn.blocked_on_write && s.conn.state.dump.is_none() {
                    ThreadStats::incr(&thread_stats(&s.tenant, self.index).idle_kicks);
                    self.close(i, CloseReason::IdleTimeout);
                }
            }
        }
        Some(std::time::Duration::from_nanos(self.idle_scan_at_ns.saturating_sub(now)))
    }

    /// One poll's events: listeners accept or drain, connections serve — those of tenants at
    /// their share after the others (`deferred`).
    fn handle_events(
        &mut self,
        events: &Events,
        deferred: &mut Vec<(usize, bool, bool, bool)>,
        revisit: &mut Vec<usize>,
    ) {
        for ev in events.iter() {
            let token = ev.token();
            if token == WAKER {
                self.resume_parked(revisit);
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
            let (r, w, closed) =
                (ev.is_readable() || ev.is_read_closed(), ev.is_writable(), ev.is_read_closed() || ev.is_error());
            if self.conns.slots.get(i).and_then(Option::as_ref).is_some_and(|s| s.conn.gate.held)
                && deferred.len() < EVENTS_MAX
            {
                // Its tenant is at its share: serve it after the connections of tenants
                // within theirs from this same poll (latency isolation).
                deferred.push((i, r, w, closed));
                continue;
            }
            let after = self.conn_event(i, r, w, closed);
            self.after_serve(i, after, revisit);
        }
        for (i, r, w, closed) in deferred.drain(..) {
            let after = self.conn_event(i, r, w, closed);
            self.after_serve(i, after, revisit);
        }
    }

    /// Replicated tenants: hand each connection its outcomes (replies join in request order)
    /// and serve it on once (a connection blocked on writing goes on when the socket drains).
    fn resume_parked(&mut self, revisit: &mut Vec<usize>) {
        let mut moved: Vec<usize> = Vec::new();
        for d in self.inbox.take() {
            let Some(s) = self.conns.slots.get_mut(d.idx).and_then(Option::as_mut) else { continue };
            if s.conn.repl.serial != d.serial {
                continue;
            }
            let before = s.conn.wbuf.len();
            if tcp::resume(&mut s.conn, s.tenant.replica.get(), d.seq, d.outcome) {
                moved.push(d.idx);
            }
            // Replies of replicated requests come out of the tenant's egress bucket like any.
            if let Some(sh) = s.tenant.shaper.as_deref() {
                sh.charge_egress(0, s.conn.wbuf.len().saturating_sub(before) as u64);
            }
        }
        moved.sort_unstable();
        moved.dedup();
        for idx in moved {
            let Some(s) = self.conns.slots.get_mut(idx).and_then(Option::as_mut) else { continue };
            if s.conn.blocked_on_write || s.conn.gate.in_throttled {
                continue;
            }
            let after = self.conn_event(idx, true, false, false);
            self.after_serve(idx, after, revisit);
        }
    }

    /// Close, queue for a revisit, or put on the throttled list, as serving left the connection.
    fn after_serve(&mut self, i: usize, after: After, revisit: &mut Vec<usize>) {
        match after {
            After::Close => {
                let reason = self
                    .conns
                    .slots
                    .get(i)
                    .and_then(Option::as_ref)
                    .map_or(CloseReason::Error, |s| s.conn.close_reason);
                return self.close(i, reason);
            }
            After::Watch(id) => return self.hand_to_logger(i, id),
            After::Keep => {}
        }
        let Some(s) = self.conns.slots.get_mut(i).and_then(Option::as_mut) else { return };
        if s.conn.gate.throttle_until_ns != 0 {
            if !s.conn.gate.in_throttled {
                s.conn.gate.in_throttled = true;
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
            let Some(s) = self.conns.slots.get_mut(i).and_then(Option::as_mut) else { continue };
            if !s.conn.gate.in_throttled {
                continue;
            }
            if s.conn.gate.throttle_until_ns > now || served >= THROTTLED_SERVED_PER_TURN {
                // Not yet due, or this turn's share of work for held-back connections is used
                // up: the rest wait for the next turn, after the poll has looked at new events,
                // so a tenant within its share is not queued behind a crowd of throttled ones.
                self.throttled.push(i);
                continue;
            }
            served += 1;
            s.conn.gate.in_throttled = false;
            s.conn.gate.throttle_until_ns = 0;
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
        let conns = self
            .throttled
            .iter()
            .filter_map(|&i| self.conns.slots.get(i).and_then(Option::as_ref))
            .map(|s| s.conn.gate.throttle_until_ns)
            .filter(|&t| t != 0);
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
            let gone =
                self.tenants[k].tenant.is_removed() || !list.iter().any(|t| Arc::ptr_eq(t, &self.tenants[k].tenant));
            if !gone {
                k += 1;
                continue;
            }
            let mut wt = self.tenants.swap_remove(k);
            wt.unwatch(self.poll.registry());
            for i in 0..self.conns.slots.len() {
                if self.conns.slots[i].as_ref().is_some_and(|s| Arc::ptr_eq(&s.tenant, &wt.tenant)) {
                    self.close(i, CloseReason::Shutdown);
                }
            }
        }
        for t in list {
            if self.tenants.iter().any(|w| Arc::ptr_eq(&w.tenant, &t)) {
                continue;
            }
            let wt = WorkerTenant::watch(self.poll.registry(), t, self.index);
            self.tenants.push(wt);
        }
    }

    /// An event on connection `idx` (tcp.rs serves it).
    fn conn_event(&mut self, idx: usize, readable: bool, writable: bool, peer_closed: bool) -> After {
        let Some(slot) = self.conns.slots.get_mut(idx).and_then(Option::as_mut) else { return After::Keep };
        let env = Env {
            settings: &self.settings,
            stop: &self.stop,
            index: self.index,
            read_buf_bytes_max: self.read_buf_bytes_max,
            inbox: &self.inbox,
        };
        tcp::conn_event(slot, idx, self.poll.registry(), &env, readable, writable, peer_closed)
    }

    /// Tenant `k`'s UDP socket is readable (udp.rs drains it).
    fn udp_drain(&mut self, k: usize) {
        let env = Env {
            settings: &self.settings,
            stop: &self.stop,
            index: self.index,
            read_buf_bytes_max: self.read_buf_bytes_max,
            inbox: &self.inbox,
        };
        let Some(wt) = self.tenants.get_mut(k) else { return };
        udp::udp_drain(wt, &mut self.udp_rx, &mut self.udp, &env);
    }

    /// Run the UDP queues whose time has come (udp.rs).
    fn serve_udp_queues(&mut self, now: u64) {
        let env = Env {
            settings: &self.settings,
            stop: &self.stop,
            index: self.index,
            read_buf_bytes_max: self.read_buf_bytes_max,
            inbox: &self.inbox,
        };
        udp::serve_udp_queues(&mut self.tenants, &mut self.udp, &env, now);
    }

    /// Tenant `k`'s listener is readable (listen.rs accepts).
    fn accept_all(&mut self, k: usize) {
        let Some(wt) = self.tenants.get(k) else { return };
        let acceptor =
            Acceptor { registry: self.poll.registry(), table: &self.table, index: self.index, tls: self.tls.as_ref() };
        acceptor.accept_all(wt, &mut self.conns);
    }

    /// [sec hook] The `-s` unix listener is readable (listen.rs accepts, for the one tenant).
    fn accept_unix(&mut self) {
        let (Some(l), Some(wt)) = (self.unix.as_ref(), self.tenants.first()) else { return };
        let acceptor = Acceptor { registry: self.poll.registry(), table: &self.table, index: self.index, tls: None };
        acceptor.accept_unix(l, &wt.tenant, &mut self.conns);
    }

    /// Close connection `idx` (memcached's `conn_close` log line says `reason`).
    pub(super) fn close(&mut self, idx: usize, reason: CloseReason) {
        if let Some(s) = self.detach(idx) {
            crate::watch::log_conn(&self.settings.logger, &s.conn.peer, s.conn.fd, Some(reason));
        }
    }

    /// `watch` was accepted on connection `idx`: the log writer takes its socket over. As in
    /// memcached, the connection still counts (`curr_connections`, the connection limit) and
    /// shows in `stats conns` as `conn_watch` until it ends; then the writer logs its
    /// `conn_close` (reason `error`, as memcached's side-thread close does).
    fn hand_to_logger(&mut self, idx: usize, id: u64) {
        let Some(s) = self.unpoll(idx) else {
            self.settings.logger.release(id);
            return;
        };
        let Slot { tenant, conn } = s;
        let fd = conn.fd;
        if let Ok(mut reg) = tenant.info.conns.lock() {
            if let Some(e) = reg.get_mut(&fd) {
                e.watching = true;
            }
        }
        let (table, logger, peer) = (self.table.clone(), self.settings.logger.clone(), conn.peer.clone());
        let on_close = Box::new(move || {
            uncount(&table, &tenant, fd);
            crate::watch::log_conn(&logger, &peer, fd, Some(CloseReason::Error));
        });
        self.settings.logger.attach(id, conn.stream, on_close);
    }

    /// Take connection `idx` out of the poll and this worker: give back its buffers' budget
    /// and its outstanding requests, drop it from `stats conns` and the connection counts.
    fn detach(&mut self, idx: usize) -> Option<Slot> {
        let s = self.unpoll(idx)?;
        uncount(&self.table, &s.tenant, s.conn.fd);
        Some(s)
    }

    /// The part of `detach` that concerns this worker: the poll, the buffers' budget, the
    /// outstanding requests, the slot.
    fn unpoll(&mut self, idx: usize) -> Option<Slot> {
        let mut s = self.conns.slots.get_mut(idx).and_then(Option::take)?;
        let _ = self.poll.registry().deregister(&mut s.conn.stream);
        self.settings.conn_buf.release(s.conn.charged_bytes());
        if let Some(sh) = s.tenant.shaper.as_ref() {
            sh.complete(s.conn.gate.outstanding);
        }
        self.conns.free.push(idx);
        Some(s)
    }
}

/// A connection ends: out of `stats conns` and the connection counts.
fn uncount(table: &TenantTable, tenant: &Tenant, fd: i32) {
    if let Ok(mut reg) = tenant.info.conns.lock() {
        reg.remove(&fd);
    }
    tenant.info.curr_connections.fetch_sub(1, Ordering::Relaxed);
    table.conns_total.fetch_sub(1, Ordering::Relaxed);
}
