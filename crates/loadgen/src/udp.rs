//! UDP GET load for the memcached UDP protocol (8-byte frame header: request id, sequence
//! number, datagram count, reserved). Each socket keeps a window of requests in flight,
//! refilled as replies arrive (closed loop), or, with `--rate-per-s`, as requests fall due
//! (open loop, see pace.rs: latency from the scheduled time; a request due while the
//! window is full waits and counts `behind`); requests unanswered after the timeout are
//! counted as lost. Datagrams move in batches with sendmmsg/recvmmsg.
//! Gets only (UDP sets are not what the fast path serves); not a general UDP client.

use std::io;
use std::net::{SocketAddr, UdpSocket as StdUdpSocket};
use std::time::{Duration, Instant};

use mio::net::UdpSocket;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use std::os::fd::AsRawFd;

use crate::hist::Histogram;
use crate::pace::{Pacer, Timer};
use crate::wire::{parse_reply, Op, Outcome, Reply, KEY_LEN};
use crate::{Config, Counts, Rng, ThreadResult, Window};

const HEADER_BYTES: usize = 8;
/// Datagrams per sendmmsg/recvmmsg call.
const BATCH_MAX: usize = 64;
/// Receive buffer per datagram: memcached's UDP replies are at most 1400 bytes; anything
/// larger is truncated and flagged as an error.
const DATAGRAM_BYTES_MAX: usize = 2048;
/// `get key:00000000\r\n` behind the header.
const REQUEST_BYTES: usize = HEADER_BYTES + 4 + KEY_LEN + 2;
const TIMER_TOKEN: Token = Token(usize::MAX);

#[derive(Clone, Copy)]
struct Slot {
    busy: bool,
    request_id: u16,
    key: u32,
    /// When the request was due (open loop) or sent (closed loop): latency starts here.
    scheduled: Instant,
    /// When it left: the loss timeout starts here.
    sent: Instant,
    /// Datagrams announced by the reply (0 until the first arrives) and received so far.
    total: u16,
    got: u16,
}

struct Sock {
    sock: UdpSocket,
    slots: Vec<Slot>,
    free: Vec<u16>,
    generation: u16,
    rng: Rng,
    /// Open loop only.
    pacer: Option<Pacer>,
    behind_until: Option<Instant>,
}

/// Bits of the request id that carry the slot number; the rest is a generation counter so a
/// late reply to an earlier use of the slot is recognised (up to the counter's wrap).
fn slot_bits(window: usize) -> u32 {
    usize::BITS - (window.max(2) - 1).leading_zeros()
}

/// `thread_index`: socket j of this thread is socket `j * threads + thread_index` of the run.
pub fn run_thread(
    cfg: &Config,
    addr: SocketAddr,
    sockets: usize,
    seed: u64,
    window: Window,
    thread_index: usize,
) -> io::Result<ThreadResult> {
    let value = crate::wire::value_pattern(cfg.value_bytes);
    let bits = slot_bits(cfg.pipeline);
    let mask = (1u32 << bits) - 1;
    let now = Instant::now();
    let mut poll = Poll::new()?;
    let mut socks = Vec::with_capacity(sockets);
    for i in 0..sockets {
        let bind: SocketAddr = if addr.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }.parse().map_err(io::Error::other)?;
        let s = StdUdpSocket::bind(bind)?;
        s.connect(addr)?;
        s.set_nonblocking(true)?;
        let mut sock = UdpSocket::from_std(s);
        poll.registry().register(&mut sock, Token(i), Interest::READABLE)?;
        let idle = Slot { busy: false, request_id: 0, key: 0, scheduled: now, sent: now, total: 0, got: 0 };
        let global = (i * cfg.threads + thread_index) as u64;
        socks.push(Sock {
            sock,
            slots: vec![idle; cfg.pipeline],
            free: (0..cfg.pipeline as u16).rev().collect(),
            generation: 0,
            rng: Rng::with_seed(seed ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)),
            pacer: cfg.rate_per_s.map(|r| Pacer::new(window.load_start, r, cfg.conns as u64, global, cfg.backlog_max)),
            behind_until: None,
        });
    }
    let mut hist = Histogram::new();
    let mut counts = Counts::default();
    let mut send_bufs = vec![[0u8; REQUEST_BYTES]; BATCH_MAX];
    let mut recv_bufs = vec![[0u8; DATAGRAM_BYTES_MAX]; BATCH_MAX];
    let mut events = Events::with_capacity(1024);
    let timeout = cfg.udp_timeout;
    let scan_every = (timeout / 4).max(Duration::from_millis(1));
    let mut last_scan = Instant::now();
    let timer = Timer::new()?;
    let timer_fd = timer.raw_fd();
    poll.registry().register(&mut SourceFd(&timer_fd), TIMER_TOKEN, Interest::READABLE)?;

    for s in socks.iter_mut() {
        refill(s, cfg, bits, window, &mut send_bufs, &mut counts)?;
    }
    loop {
        let now = Instant::now();
        if now >= window.end {
            break;
        }
        if cfg.rate_per_s.is_some() {
            // Open loop: send what fell due, then sleep until the next due request of a
            // socket with a free slot (a full socket wakes on its replies or the loss scan).
            let mut wake = window.end;
            for s in socks.iter_mut() {
                refill(s, cfg, bits, window, &mut send_bufs, &mut counts)?;
                if let Some(p) = s.pacer.as_ref().filter(|_| !s.free.is_empty()) {
                    wake = wake.min(p.due_at());
                }
            }
            timer.arm(wake.saturating_duration_since(Instant::now()))?;
        }
        match poll.poll(&mut events, Some(Duration::from_millis(1))) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        for ev in events.iter() {
            if ev.token() == TIMER_TOKEN {
                timer.clear();
                continue;
            }
            let Some(s) = socks.get_mut(ev.token().0) else { continue };
            drain(s, mask, &value, window, &mut recv_bufs, &mut hist, &mut counts)?;
            refill(s, cfg, bits, window, &mut send_bufs, &mut counts)?;
        }
        let now = Instant::now();
        if now.duration_since(last_scan) >= scan_every {
            last_scan = now;
            let measuring = now >= window.start && now < window.end;
            for s in socks.iter_mut() {
                for (i, slot) in s.slots.iter_mut().enumerate() {
                    if slot.busy && now.duration_since(slot.sent) >= timeout {
                        slot.busy = false;
                        s.free.push(i as u16);
                        if measuring {
                            counts.lost += 1;
                        }
                    }
                }
                // Also retries sends that hit EAGAIN earlier.
                refill(s, cfg, bits, window, &mut send_bufs, &mut counts)?;
            }
        }
    }
    for s in socks.iter() {
        counts.unsent += s.pacer.as_ref().map_or(0, |p| p.untaken_in(window.start, window.end));
    }
    Ok(ThreadResult { hist, counts })
}

/// Closed loop: fill every free slot of the window with a new get. Open loop: send the
/// requests that are due, as far as free slots allow. In sendmmsg batches either way.
fn refill(
    s: &mut Sock,
    cfg: &Config,
    bits: u32,
    window: Window,
    bufs: &mut [[u8; REQUEST_BYTES]],
    counts: &mut Counts,
) -> io::Result<()> {
    let now = Instant::now();
    // Open loop: how many requests may go now (None = as many as there are free slots).
    let mut due: Option<u64> = None;
    if let Some(p) = s.pacer.as_mut() {
        if now >= window.end {
            return Ok(());
        }
        let shed = p.shed(now);
        if shed > 0 && window.contains(now) {
            counts.dropped += shed;
        }
        let d = p.due_count(now);
        let waiting = d.saturating_sub(s.free.len() as u64);
        if waiting > 0 {
            let last = p.due_at_ahead(d - 1);
            s.behind_until = Some(s.behind_until.map_or(last, |b| b.max(last)));
            counts.backlog_peak = counts.backlog_peak.max(waiting);
        }
        due = Some(d);
    }
    while !s.free.is_empty() && due != Some(0) {
        let n = s.free.len().min(bufs.len()).min(due.map_or(usize::MAX, |d| d.min(usize::MAX as u64) as usize));
        let mut taken = [0u16; BATCH_MAX];
        let mut scheduled_at = [now; BATCH_MAX];
        for (j, buf) in bufs.iter_mut().take(n).enumerate() {
            let Some(slot_index) = s.free.pop() else { break };
            let scheduled = match s.pacer.as_mut() {
                Some(p) => {
                    let at = p.take();
                    if window.contains(at) {
                        counts.sent += 1;
                        if s.behind_until.is_some_and(|b| at <= b) {
                            counts.behind += 1;
                        }
                    }
                    at
                }
                None => Instant::now(),
            };
            scheduled_at[j] = scheduled;
            taken[j] = slot_index;
            s.generation = s.generation.wrapping_add(1);
            let request_id = ((u32::from(s.generation) << bits) | u32::from(slot_index)) as u16;
            let key = s.rng.u32(..cfg.keys.max(1));
            buf[0..2].copy_from_slice(&request_id.to_be_bytes());
            buf[2..4].copy_from_slice(&0u16.to_be_bytes()); // sequence number
            buf[4..6].copy_from_slice(&1u16.to_be_bytes()); // datagrams in this message
            buf[6..8].copy_from_slice(&0u16.to_be_bytes()); // reserved
            buf[8..12].copy_from_slice(b"get ");
            let mut k = [0u8; KEY_LEN];
            crate::wire::write_key(&mut k, key);
            buf[12..12 + KEY_LEN].copy_from_slice(&k);
            buf[12 + KEY_LEN..].copy_from_slice(b"\r\n");
            if let Some(slot) = s.slots.get_mut(usize::from(slot_index)) {
                *slot = Slot { busy: true, request_id, key, scheduled, sent: Instant::now(), total: 0, got: 0 };
            }
        }
        let sent = send_batch(s.sock.as_raw_fd(), &bufs[..n])?;
        counts.udp_sent += sent as u64;
        if window.contains(Instant::now()) {
            counts.tx_bytes += (sent * REQUEST_BYTES) as u64;
        }
        if sent < n {
            // The socket buffer is full: give the unsent slots back and retry later. Open
            // loop: they have no free slot to go in now; count them and let them be lost
            // rather than re-queue them (the schedule has moved past them).
            for (j, &slot_index) in taken[sent..n].iter().enumerate().rev() {
                if let Some(slot) = s.slots.get_mut(usize::from(slot_index)) {
                    slot.busy = false;
                }
                s.free.push(slot_index);
                if s.pacer.is_some() && window.contains(scheduled_at[sent + j]) {
                    counts.dropped += 1;
                    counts.sent = counts.sent.saturating_sub(1);
                }
            }
            return Ok(());
        }
        if let Some(d) = due.as_mut() {
            *d -= n as u64;
        }
    }
    Ok(())
}

/// sendmmsg the datagrams in `bufs` on a connected socket; returns how many were sent
/// (0 on EAGAIN).
fn send_batch(fd: i32, bufs: &[[u8; REQUEST_BYTES]]) -> io::Result<usize> {
    let n = bufs.len().min(BATCH_MAX);
    let mut iovs = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; BATCH_MAX];
    // SAFETY: mmsghdr is a plain C struct for which all-zero bytes is a valid value
    // (null pointers, zero lengths).
    let mut msgs: [libc::mmsghdr; BATCH_MAX] = unsafe { std::mem::zeroed() };
    for i in 0..n {
        iovs[i].iov_base = bufs[i].as_ptr() as *mut libc::c_void;
        iovs[i].iov_len = bufs[i].len();
        msgs[i].msg_hdr.msg_iov = &mut iovs[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
    }
    loop {
        // SAFETY: `msgs[..n]` point at `iovs[..n]`, which point at `bufs[..n]`; all outlive
        // the call, and the kernel only reads the buffers for a send. The socket is
        // connected, so msg_name is null.
        let r = unsafe { libc::sendmmsg(fd, msgs.as_mut_ptr(), n as libc::c_uint, libc::MSG_DONTWAIT) };
        if r >= 0 {
            return Ok(r as usize);
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock => return Ok(0),
            // A closed server port shows as ECONNREFUSED on a connected socket: those
            // requests will simply time out and be counted lost.
            io::ErrorKind::ConnectionRefused => return Ok(0),
            _ => return Err(e),
        }
    }
}

/// recvmmsg until the socket is empty; account every datagram.
fn drain(
    s: &mut Sock,
    mask: u32,
    value: &[u8],
    window: Window,
    bufs: &mut [[u8; DATAGRAM_BYTES_MAX]],
    hist: &mut Histogram,
    counts: &mut Counts,
) -> io::Result<()> {
    loop {
        let n = bufs.len().min(BATCH_MAX);
        let mut iovs = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; BATCH_MAX];
        // SAFETY: all-zero bytes is a valid mmsghdr (null pointers, zero lengths).
        let mut msgs: [libc::mmsghdr; BATCH_MAX] = unsafe { std::mem::zeroed() };
        for i in 0..n {
            iovs[i].iov_base = bufs[i].as_mut_ptr() as *mut libc::c_void;
            iovs[i].iov_len = bufs[i].len();
            msgs[i].msg_hdr.msg_iov = &mut iovs[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
        }
        // SAFETY: `msgs[..n]` point at `iovs[..n]`, which point at distinct writable
        // buffers `bufs[..n]` of the stated lengths; all outlive the call. No timeout
        // pointer; MSG_DONTWAIT makes it non-blocking.
        let r = unsafe {
            libc::recvmmsg(
                s.sock.as_raw_fd(),
                msgs.as_mut_ptr(),
                n as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => return Ok(()),
                io::ErrorKind::ConnectionRefused => return Ok(()),
                _ => return Err(e),
            }
        }
        let now = Instant::now();
        let measuring = now >= window.start && now < window.end;
        let got = r as usize;
        for i in 0..got {
            let len = (msgs[i].msg_len as usize).min(DATAGRAM_BYTES_MAX);
            if measuring {
                counts.rx_bytes += len as u64;
            }
            let truncated = msgs[i].msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
            on_datagram(s, mask, value, &bufs[i][..len], truncated, now, measuring, hist, counts);
        }
        if got < n {
            return Ok(());
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn on_datagram(
    s: &mut Sock,
    mask: u32,
    value: &[u8],
    d: &[u8],
    truncated: bool,
    now: Instant,
    measuring: bool,
    hist: &mut Histogram,
    counts: &mut Counts,
) {
    if d.len() < HEADER_BYTES || truncated {
        counts.errors += 1;
        return;
    }
    let request_id = u16::from_be_bytes([d[0], d[1]]);
    let seq = u16::from_be_bytes([d[2], d[3]]);
    let total = u16::from_be_bytes([d[4], d[5]]);
    let slot_index = usize::from(request_id) & mask as usize;
    let Some(slot) = s.slots.get_mut(slot_index).filter(|sl| sl.busy && sl.request_id == request_id) else {
        // A reply to a request already counted lost (or never sent by us).
        if measuring {
            counts.late += 1;
        }
        return;
    };
    let payload = &d[HEADER_BYTES..];
    let outcome = if total == 1 && seq == 0 {
        match parse_reply(payload, Op::Get, slot.key, value) {
            Reply::Done { outcome, consumed } if consumed == payload.len() => Some(outcome),
            _ => Some(Outcome::Error),
        }
    } else if total == 0 || seq >= total || (slot.total != 0 && slot.total != total) {
        Some(Outcome::Error)
    } else {
        // A multi-datagram reply: only complete once every part is in. The value is not
        // reassembled (our values fit one datagram; this only keeps the count honest).
        slot.total = total;
        slot.got += 1;
        if seq == 0 && !payload.starts_with(b"VALUE ") {
            Some(Outcome::Error)
        } else if slot.got >= total {
            Some(Outcome::Hit)
        } else {
            None
        }
    };
    if let Some(outcome) = outcome {
        let latency_ns = now.saturating_duration_since(slot.scheduled).as_nanos() as u64;
        slot.busy = false;
        s.free.push(slot_index as u16);
        if measuring {
            hist.record(latency_ns);
            counts.record(Op::Get, outcome);
        } else if outcome == Outcome::Error {
            counts.errors_outside_window += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_bits_cover_window() {
        assert_eq!(slot_bits(1), 1);
        assert_eq!(slot_bits(2), 1);
        assert_eq!(slot_bits(16), 4);
        assert_eq!(slot_bits(17), 5);
        assert_eq!(slot_bits(1024), 10);
    }
}
