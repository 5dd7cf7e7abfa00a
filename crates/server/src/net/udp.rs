//! The UDP loop: memcached's UDP frame around each request datagram, requests run through
//! `dispatch::execute_one` like TCP's, replies split into frames and sent with `sendmmsg`.
//!
//! What it is for: draining a tenant's UDP socket (bounded per event), holding datagrams of a
//! shaped tenant in a bounded queue while the gate says wait, and sending each response message
//! with its own sequence numbering.
//!
//! What it is not for: frame parsing (slipstream-proto's `udp`), the batched system calls
//! (udp_batch.rs) or protocol rules (the executors).

use super::env::{thread_stats, Env};
use super::gate::{self, THROTTLE_RECHECK_NS_MAX};
use super::listen::WorkerTenant;
use crate::dispatch::execute_one;
use crate::exec::{ConnState, Ctx, Protocol, Step, Transport};
use crate::stats::ThreadStats;
use crate::tenants::Tenant;
use crate::udp_batch::{RecvBatch, SendBatch};
use mio::net::UdpSocket;
use slipstream_proto::udp;
use slipstream_tenancy::since_start_ns;
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;

/// Largest UDP request datagram accepted.
pub const UDP_DATAGRAM_BYTES_MAX: usize = 65_536;
/// Most datagrams one readable event takes from a UDP socket before the loop turns to its other
/// sockets (mio re-arms while data is still queued).
const UDP_DRAIN_DATAGRAMS_MAX: usize = 4096;
/// Bytes of UDP requests one worker holds for one shaped tenant while its buckets refill (on top
/// of the `max_outstanding` count bound).
pub const UDP_QUEUE_BYTES_MAX: usize = 1 << 20;
/// Requests one datagram may carry at most (a bound on the loop, far above any real one).
const REQUESTS_PER_DATAGRAM_MAX: usize = 4096;

/// Buffers the UDP path reuses for every datagram.
pub(super) struct UdpBufs {
    /// Replies waiting for the next sendmmsg (flushed at the end of every drain).
    pub tx: SendBatch,
    pub out: Vec<u8>,
    pub frame: Vec<u8>,
    /// Protocol state for UDP requests, reset per datagram (kept to reuse its buffers).
    pub state: ConnState,
}

impl UdpBufs {
    pub fn new() -> UdpBufs {
        UdpBufs {
            tx: SendBatch::new(),
            out: Vec::with_capacity(UDP_DATAGRAM_BYTES_MAX),
            frame: Vec::with_capacity(udp::REPLY_PAYLOAD_BYTES_MAX + udp::FRAME_HEADER_BYTES),
            state: ConnState::new(Transport::Udp),
        }
    }
}

/// Take the datagrams waiting on `wt`'s UDP socket: run each now, or queue it while the gate
/// says its tenant must wait.
pub(super) fn udp_drain(wt: &mut WorkerTenant, rx: &mut RecvBatch, bufs: &mut UdpBufs, env: &Env<'_>) {
    {
        // Bounded per event so one busy UDP socket cannot starve this thread's TCP clients;
        // mio re-arms on the next datagram, and we stop early only while data is still queued,
        // so loop until WouldBlock but cap the batch by count.
        let mut taken = 0usize;
        while taken < UDP_DRAIN_DATAGRAMS_MAX {
            let Some(sock) = wt.udp.as_ref() else { return };
            let fd = sock.as_raw_fd();
            let got = match rx.recv(fd) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            };
            taken += got;
            for i in 0..got {
                let Some((datagram, peer)) = rx.get(i) else {
                    // Larger than any UDP datagram memcached takes, or an unknown family.
                    ThreadStats::incr(&thread_stats(&wt.tenant, env.index).udp_bad_datagrams);
                    continue;
                };
                if let Some(sh) = wt.tenant.shaper.as_deref() {
                    // Keep arrival order: once something waits, later datagrams queue behind it.
                    let wait = if wt.udp_queue.is_empty() { gate::udp_wait_ns(sh, since_start_ns()) } else { 1 };
                    if wait > 0 {
                        let stats = thread_stats(&wt.tenant, env.index);
                        ThreadStats::incr(&stats.udp_datagrams_in);
                        ThreadStats::add(&stats.bytes_read, datagram.len() as u64);
                        let n = datagram.len();
                        if wt.udp_queue.len() < sh.max_outstanding() as usize
                            && wt.udp_queue_bytes + n <= UDP_QUEUE_BYTES_MAX
                        {
                            wt.udp_queue.push_back((datagram.to_vec(), peer));
                            wt.udp_queue_bytes += n;
                            if wt.udp_wait_until_ns == 0 {
                                wt.udp_wait_until_ns =
                                    since_start_ns().saturating_add(wait.min(THROTTLE_RECHECK_NS_MAX));
                            }
                        } else {
                            sh.dropped();
                        }
                        continue;
                    }
                }
                udp_datagram(wt, datagram, peer, bufs, env, false);
            }
        }
        udp_flush(wt, bufs, env);
    }
}

/// Run queued UDP requests of shaped tenants while their buckets allow.
pub(super) fn serve_udp_queues(tenants: &mut [WorkerTenant], bufs: &mut UdpBufs, env: &Env<'_>, now: u64) {
    {
        for wt in tenants.iter_mut() {
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
                let wait = gate::udp_wait_ns(&*sh, since_start_ns());
                if wait > 0 {
                    wt.udp_wait_until_ns = since_start_ns().saturating_add(wait.min(THROTTLE_RECHECK_NS_MAX));
                    break;
                }
                let Some((d, peer)) = wt.udp_queue.pop_front() else { break };
                wt.udp_queue_bytes = wt.udp_queue_bytes.saturating_sub(d.len());
                udp_datagram(wt, &d, peer, bufs, env, true);
            }
            udp_flush(wt, bufs, env);
        }
    }
}

/// Execute one UDP request datagram for `wt`'s tenant and send the replies. `counted`: its
/// arrival was already counted (it waited in the queue).
fn udp_datagram(
    wt: &mut WorkerTenant,
    datagram: &[u8],
    peer: SocketAddr,
    bufs: &mut UdpBufs,
    env: &Env<'_>,
    counted: bool,
) {
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
    // As memcached's UDP connection: a request resets its `secs_since_last_cmd`, and
    // `stats conns` asked here shows it serving this sender.
    bufs.state.conn_id = wt.udp_listed.as_ref().map_or(-1, |(fd, _)| *fd);
    bufs.state.udp_peer = Some(peer);
    if let Some((_, last)) = wt.udp_listed.as_ref() {
        last.mark(tenant.info.uptime_s());
    }
    let (requests, closed) = execute_payload(tenant, stats, env, payload, bufs);
    if let Some(sh) = tenant.shaper.as_ref() {
        sh.charge_egress(requests, bufs.out.len() as u64);
        sh.complete(requests);
    }
    let Some(sock) = wt.udp.as_ref() else { return };
    if closed {
        bufs.frame.clear();
        udp::compose(
            &mut bufs.frame,
            udp::FrameHeader { request_id: hdr.request_id, sequence: 0, total: 0, reserved: 0 },
        );
        if bufs.tx.push(&bufs.frame, peer) {
            flush_to(sock, stats, &mut bufs.tx);
        }
        return;
    }
    send_messages(sock, stats, bufs, hdr.request_id, peer);
}

/// Run the requests of one datagram's payload into `bufs.out`, marking where each response
/// message starts. Returns (requests executed, the payload asked to close).
fn execute_payload(
    tenant: &Tenant,
    stats: &ThreadStats,
    env: &Env<'_>,
    payload: &[u8],
    bufs: &mut UdpBufs,
) -> (u32, bool) {
    bufs.out.clear();
    let state = &mut bufs.state;
    state.protocol = Protocol::Undecided;
    state.swallow_bytes = 0;
    state.udp_marks.clear();
    let mut ctx = Ctx { store: &tenant.store, stats, settings: env.settings, server: &tenant.info, conn: state };
    let mut input = payload;
    let mut requests = 0u32;
    for _ in 0..REQUESTS_PER_DATAGRAM_MAX {
        if input.is_empty() {
            break;
        }
        // Every request starts a new response message.
        ctx.conn.udp_marks.push(bufs.out.len());
        if let Some(n) = refused_replicated_write(tenant, &ctx, input, &mut bufs.out) {
            input = &input[n..];
            requests += 1;
            continue;
        }
        match execute_one(&mut ctx, input, &mut bufs.out) {
            Step::Consumed(k) => {
                input = &input[k..];
                requests += 1;
            }
            Step::Shutdown => {
                env.stop.stop();
                break;
            }
            // memcached answers a UDP `quit` with a bare frame header whose total is 0 (its
            // close of a UDP "connection" flushes an empty message).
            Step::Close | Step::Quit => return (requests, true),
            Step::Incomplete => break,
        }
    }
    (requests, false)
}

/// A replicated tenant takes writes over TCP only (a datagram cannot wait for its group):
/// a write over UDP is answered with an error and skipped; reads are served locally.
fn refused_replicated_write(tenant: &Tenant, ctx: &Ctx<'_>, input: &[u8], out: &mut Vec<u8>) -> Option<usize> {
    tenant.replica.get()?;
    match crate::replicated::route(ctx.store, ctx.settings, ctx.conn, input) {
        crate::replicated::Route::Write(n) | crate::replicated::Route::WriteAlone(n) => {
            let protocol = crate::replicated::protocol_of(ctx.conn, input);
            crate::replicated::compose_udp_refusal(out, protocol, &input[..n]);
            Some(n)
        }
        _ => None,
    }
}

/// Send each response message (the pieces of `bufs.out` between marks) with its own sequence
/// numbering; empty pieces (a missed key) send nothing, as in memcached.
fn send_messages(sock: &UdpSocket, stats: &ThreadStats, bufs: &mut UdpBufs, request_id: u16, peer: SocketAddr) {
    if bufs.out.is_empty() {
        return;
    }
    let marks = std::mem::take(&mut bufs.state.udp_marks);
    let len = bufs.out.len();
    let mut from = 0usize;
    for &m in marks.iter().chain(std::iter::once(&len)) {
        let to = m.min(len);
        if to > from {
            udp_send_message(sock, stats, bufs, request_id, from, to, peer);
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
fn udp_send_message(
    sock: &UdpSocket,
    stats: &ThreadStats,
    bufs: &mut UdpBufs,
    request_id: u16,
    from: usize,
    to: usize,
    peer: SocketAddr,
) {
    let total = udp::datagrams_for(to - from);
    if total > u16::MAX as usize {
        ThreadStats::incr(&stats.udp_bad_datagrams);
        return;
    }
    for seq in 0..total {
        let start = from + seq * udp::REPLY_PAYLOAD_BYTES_MAX;
        let end = (start + udp::REPLY_PAYLOAD_BYTES_MAX).min(to);
        bufs.frame.clear();
        udp::compose(
            &mut bufs.frame,
            udp::FrameHeader { request_id, sequence: seq as u16, total: total as u16, reserved: 0 },
        );
        bufs.frame.extend_from_slice(&bufs.out[start..end]);
        if bufs.tx.push(&bufs.frame, peer) {
            flush_to(sock, stats, &mut bufs.tx);
        }
    }
}
