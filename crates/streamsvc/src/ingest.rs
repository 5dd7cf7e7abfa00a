//! ingest: one thread per stream that drains the stream's UDP socket in batches (`recvmmsg`),
//! stamps each batch with the CLOCK_MONOTONIC receive time, feeds every datagram to the
//! stream's operator and hands the result bytes to the hub.
//!
//! What it is for: the receive path. The socket is blocking with `SO_RCVTIMEO` = the stream's
//! tick (min(window/4, 10 ms), at least 100 µs), so an idle stream still wakes to close windows
//! and to notice a stop request; under traffic the tick is checked after every batch. An XDP
//! word-count or change-point stream's thread has nothing to do on time but refresh counters
//! and drain ended windows, so while its socket is quiet (the kernel may be busy counting) its
//! tick backs off (to [`XDP_QUIET_TICK_NS_MAX`]) and a word count's is cut at the next drain. A stop shuts the socket down for reading,
//! which wakes the receive whatever the tick.
//! Kernel drops: `SO_RXQ_OVFL` makes the kernel attach the socket's cumulative drop counter to
//! every datagram queued after a drop; it is read from the control message of each datagram,
//! and on every tick also from `SO_MEMINFO` (same counter) so drops followed by silence are
//! still reported. Both are the kernel's `sk_drops`, counted from socket creation.
//!
//! What it is not for: subscribers (hub) or operator logic (slipstream-stream).

use std::io;
use std::net::UdpSocket;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use slipstream_stream::{feed_datagram, record, Encoding, Limits, ParseStats};

use crate::xdp::{self, Kind, SharedOp, WcMerge, XdpStream};
use crate::{clock_monotonic_ns, Shared};

/// Datagrams taken per `recvmmsg`.
pub(crate) const BATCH: usize = 32;
/// Receive slot per datagram: one more than the largest UDP payload the contract accepts
/// (65535), so a longer one shows up as `MSG_TRUNC` instead of silently cut.
pub(crate) const SLOT_BYTES: usize = 65_536;
/// Control-message space per datagram (one `SO_RXQ_OVFL` cmsg needs 20 bytes; room to spare).
const CTRL_BYTES: usize = 64;
/// After a batch smaller than [`BATCH`], a user-space word-count stream waits this long before
/// reading again, so datagrams arriving one by one are taken a few dozen per wake-up instead of
/// one or two (waking per datagram was a third of the engine's CPU in `perf`). A word count has
/// no per-record output: the price is that a word's receive time (its window) may be read up to
/// this much late. Change point, filter and aggregate streams read without delay.
pub(crate) const WORDS_LINGER: Duration = Duration::from_micros(500);
/// Shortest and longest idle tick.
const TICK_NS_MIN: u64 = 100_000;
const TICK_NS_MAX: u64 = 10_000_000;
/// Longest tick of an XDP stream's thread while its socket is quiet: the kernel counts without
/// waking the thread, so the tick only refreshes the counters (and, for a word count, is cut
/// short at the next window's drain). The tick doubles per quiet tick from the stream's own up
/// to this, and falls back at once when a datagram reaches the socket, so the XDP engine's
/// counters lag by at most this. (At 10 ms an idle daemon woke ~60 times per second per stream;
/// a daemon whose datagrams all stay in XDP woke 100 times per second only to read counters.)
pub(crate) const XDP_QUIET_TICK_NS_MAX: u64 = 100_000_000;

/// The tick for a stream with windows of `window_ns`.
pub(crate) fn tick_ns(window_ns: u64) -> u64 {
    (window_ns / 4).clamp(TICK_NS_MIN, TICK_NS_MAX)
}

/// The next tick of an XDP stream's thread: `tick` doubled after a quiet tick (up to
/// [`XDP_QUIET_TICK_NS_MAX`]), `base` after a busy one.
pub(crate) fn xdp_next_tick_ns(base: u64, tick: u64, quiet: bool) -> u64 {
    if quiet {
        tick.saturating_mul(2).clamp(base, XDP_QUIET_TICK_NS_MAX.max(base))
    } else {
        base
    }
}

/// How long an XDP word-count thread may sleep at `now_ns`: `tick`, cut short at the moment
/// the next window becomes drainable (its end plus [`xdp::WC_GRACE_NS`]), at least
/// [`TICK_NS_MIN`].
pub(crate) fn wc_wait_ns(tick: u64, window_ns: u64, now_ns: u64) -> u64 {
    let window_ns = window_ns.max(1);
    let next = (now_ns.saturating_sub(xdp::WC_GRACE_NS) / window_ns)
        .saturating_add(1)
        .saturating_mul(window_ns)
        .saturating_add(xdp::WC_GRACE_NS);
    tick.min(next.saturating_sub(now_ns)).max(TICK_NS_MIN)
}

/// The kernel's cumulative drop counter found in a control-message buffer (`msg_control`,
/// `msg_controllen` bytes), if an `SOL_SOCKET`/`SO_RXQ_OVFL` message is there. Parses the
/// Linux `cmsghdr` layout (`size_t cmsg_len; int level; int type;` then data aligned to
/// `size_t`) by hand, so no pointer arithmetic on kernel-filled memory is needed.
pub(crate) fn parse_rxq_ovfl(ctrl: &[u8]) -> Option<u32> {
    const ALIGN: usize = std::mem::size_of::<usize>();
    let hdr = std::mem::size_of::<libc::cmsghdr>();
    let align = |n: usize| n.checked_add(ALIGN - 1).map(|n| n & !(ALIGN - 1));
    let mut off = 0usize;
    let mut found = None;
    while let Some(h) = ctrl.get(off..off.checked_add(hdr)?) {
        let len = usize::from_ne_bytes(h.get(0..ALIGN)?.try_into().ok()?);
        let level = i32::from_ne_bytes(h.get(ALIGN..ALIGN + 4)?.try_into().ok()?);
        let ty = i32::from_ne_bytes(h.get(ALIGN + 4..ALIGN + 8)?.try_into().ok()?);
        if len < hdr {
            break;
        }
        let data = ctrl.get(off + hdr..off.checked_add(len)?)?;
        if level == libc::SOL_SOCKET && ty == libc::SO_RXQ_OVFL {
            if let Some(b) = data.get(0..4) {
                found = Some(u32::from_ne_bytes(b.try_into().ok()?));
            }
        }
        off = align(off.checked_add(len)?)?;
    }
    found
}

/// A batch receiver over one UDP socket.
pub(crate) struct Receiver {
    sock: UdpSocket,
    bufs: Vec<u8>,
    /// `u64` words so each slot is aligned for `cmsghdr`.
    ctrl: Vec<u64>,
    lens: [usize; BATCH],
    truncated: [bool; BATCH],
    drops_raw: u32,
    /// Kernel socket drops seen so far (wrapping u32 deltas accumulated).
    pub socket_drops: u64,
}

impl Receiver {
    pub(crate) fn new(sock: UdpSocket) -> Receiver {
        Receiver {
            sock,
            bufs: vec![0; BATCH * SLOT_BYTES],
            ctrl: vec![0; BATCH * CTRL_BYTES / 8],
            lens: [0; BATCH],
            truncated: [false; BATCH],
            drops_raw: 0,
            socket_drops: 0,
        }
    }

    fn note_drops(&mut self, raw: u32) {
        // The counter is cumulative; a wrapping delta keeps the u64 exact across u32 wrap.
        let delta = raw.wrapping_sub(self.drops_raw);
        // A stale (smaller) value can arrive after SO_MEMINFO already moved us on: ignore it.
        if delta < u32::MAX / 2 {
            self.socket_drops += u64::from(delta);
            self.drops_raw = raw;
        }
    }

    /// Reads the drop counter with `SO_MEMINFO`.
    pub(crate) fn poll_drops(&mut self) {
        let mut info = [0u32; 16];
        let mut len = std::mem::size_of_val(&info) as libc::socklen_t;
        // SAFETY: `info` is a writable buffer of `len` bytes that outlives the call; the
        // kernel writes at most `len` bytes and updates `len`.
        let rc = unsafe {
            libc::getsockopt(
                self.sock.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_MEMINFO,
                info.as_mut_ptr().cast(),
                &mut len,
            )
        };
        let idx = libc::SK_MEMINFO_DROPS as usize;
        if rc == 0 && (len as usize) >= (idx + 1) * 4 {
            if let Some(&d) = info.get(idx) {
                self.note_drops(d);
            }
        }
    }

    /// Waits (up to the socket's read timeout) for at least one datagram and takes up to
    /// [`BATCH`]. Returns how many; `Ok(0)` on timeout.
    pub(crate) fn recv_batch(&mut self) -> io::Result<usize> {
        // SAFETY: all-zero bytes are a valid value for these plain C structs (null pointers,
        // zero lengths).
        let mut iov: [libc::iovec; BATCH] = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut hdrs: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
        let base = self.bufs.as_mut_ptr();
        let cbase = self.ctrl.as_mut_ptr().cast::<u8>();
        for i in 0..BATCH {
            // SAFETY: `i * SLOT_BYTES + SLOT_BYTES <= bufs.len()` and `i * CTRL_BYTES +
            // CTRL_BYTES <= ctrl bytes`, so both offsets stay inside their allocations.
            let (buf, ctl) = unsafe { (base.add(i * SLOT_BYTES), cbase.add(i * CTRL_BYTES)) };
            iov[i] = libc::iovec { iov_base: buf.cast(), iov_len: SLOT_BYTES };
            let h = &mut hdrs[i].msg_hdr;
            h.msg_iov = &mut iov[i];
            h.msg_iovlen = 1;
            h.msg_control = ctl.cast();
            h.msg_controllen = CTRL_BYTES as _;
        }
        // SAFETY: every header points at a live iovec (local array, not moved during the call)
        // describing a slot of `self.bufs`, and at a control slot of `self.ctrl`; the kernel
        // writes only within those lengths. Blocking honours SO_RCVTIMEO.
        let n = unsafe {
            libc::recvmmsg(
                self.sock.as_raw_fd(),
                hdrs.as_mut_ptr(),
                BATCH as libc::c_uint,
                libc::MSG_WAITFORONE,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted => Ok(0),
                _ => Err(e),
            };
        }
        let n = (n as usize).min(BATCH);
        for (i, h) in hdrs.iter().enumerate().take(n) {
            self.lens[i] = (h.msg_len as usize).min(SLOT_BYTES);
            self.truncated[i] = h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
            // `msg_controllen` is size_t on glibc but socklen_t on musl: keep the cast.
            #[allow(clippy::unnecessary_cast)]
            let clen = (h.msg_hdr.msg_controllen as usize).min(CTRL_BYTES);
            if clen == 0 {
                continue;
            }
            let ctrl = self.ctrl_bytes(i);
            if let Some(raw) = parse_rxq_ovfl(ctrl.get(..clen).unwrap_or(&[])) {
                self.note_drops(raw);
            }
        }
        Ok(n)
    }

    /// Control slot `i` as bytes (a copy on the stack; only made when the kernel wrote one).
    fn ctrl_bytes(&self, i: usize) -> [u8; CTRL_BYTES] {
        let words = CTRL_BYTES / 8;
        let mut v = [0u8; CTRL_BYTES];
        for (dst, w) in v.chunks_exact_mut(8).zip(self.ctrl.iter().skip(i * words).take(words)) {
            dst.copy_from_slice(&w.to_ne_bytes());
        }
        v
    }

    /// Datagram `i` of the last batch; `None` if it was longer than a slot (truncated).
    pub(crate) fn payload(&self, i: usize) -> Option<&[u8]> {
        if *self.truncated.get(i)? {
            return None;
        }
        let start = i.checked_mul(SLOT_BYTES)?;
        self.bufs.get(start..start + *self.lens.get(i)?)
    }
}

/// Everything one ingest thread owns.
pub(crate) struct Ingest {
    pub idx: usize,
    pub name: String,
    /// Set when the stream runs in the XDP engine (see module `xdp`).
    pub xdp: Option<XdpStream>,
    /// XDP word count: what this thread parsed itself, waiting for the window's drain.
    pub wc: WcMerge,
    pub rx: Receiver,
    /// Shared with the XDP event reader (value batches of aggregate/filter streams).
    pub op: SharedOp,
    pub encoding: Encoding,
    pub limits: Limits,
    pub tick_ns: u64,
    /// Wait after a short batch ([`WORDS_LINGER`] or zero).
    pub linger: Duration,
    pub shared: Arc<Shared>,
}

impl Ingest {
    /// Makes `wait` the socket's receive timeout if `cur` (the one in force) differs.
    fn set_wait(&self, cur: &mut u64, wait: u64) {
        if *cur != wait {
            *cur = wait;
            let _ = self.rx.sock.set_read_timeout(Some(Duration::from_nanos(wait)));
        }
    }

    /// The stream's counters for the stats line and metrics: user space's own plus the XDP
    /// engine's `k` (as last read).
    fn store_counters(&self, datagrams: u64, parsed: &ParseStats, k: &slipstream_fastpath::stream::StreamStats) {
        let c = &self.shared.streams[self.idx].counters;
        let mut extra_lines = 0;
        if let Some(x) = &self.xdp {
            extra_lines = self.wc.lines + x.lines.load(Ordering::Relaxed);
            c.xdp_datagrams.store(k.datagrams, Ordering::Relaxed);
            c.xdp_passed.store(k.passed, Ordering::Relaxed);
            c.xdp_events_lost.store(k.events_lost, Ordering::Relaxed);
        }
        c.datagrams.store(datagrams + k.datagrams, Ordering::Relaxed);
        c.records.store(parsed.records + k.records, Ordering::Relaxed);
        c.malformed.store(parsed.malformed + k.malformed, Ordering::Relaxed);
        c.over_limit.store(parsed.over_limit, Ordering::Relaxed);
        c.socket_drops.store(self.rx.socket_drops, Ordering::Relaxed);
        let op_lines = self.op.lock().unwrap_or_else(|p| p.into_inner()).counters().lines;
        c.lines.store(op_lines + extra_lines, Ordering::Relaxed);
    }

    pub(crate) fn run(mut self) {
        // A change-point stream in the XDP engine has nothing for this thread to do on time
        // (the kernel keeps its windows; alerts come through the event reader): until user
        // space takes it over, it ticks only to refresh the counters, at the longest tick.
        let xdp_cp = matches!(&self.xdp, Some(XdpStream { kind: Kind::ChangePoint { .. }, .. }));
        let base_ns = if xdp_cp { self.tick_ns.max(TICK_NS_MAX) } else { self.tick_ns };
        let mut tick_ns = base_ns;
        let _ = self.rx.sock.set_read_timeout(Some(Duration::from_nanos(tick_ns)));
        // The receive timeout in force (an XDP stream's changes with its quiet ticks).
        let mut wait_ns = tick_ns;
        // XDP stream: user-space datagrams since the last tick.
        let mut since_tick = 0usize;
        let mut out: Vec<u8> = Vec::with_capacity(64 * 1024);
        let mut datagrams = 0u64;
        let mut parsed = ParseStats::default();
        let mut next_tick = clock_monotonic_ns().saturating_add(tick_ns);
        // XDP change point: whether user space has taken the stream over.
        let mut taken_over = false;
        // The XDP engine's counters for this stream, read once per tick (a map lookup is a
        // system call: not one per received batch).
        let mut k = slipstream_fastpath::stream::StreamStats::default();
        while !self.shared.stop.load(Ordering::Acquire) {
            let n = match self.rx.recv_batch() {
                Ok(n) => n,
                Err(_) => {
                    // A persistent socket error (should not happen on a bound UDP socket):
                    // back off one tick instead of spinning.
                    std::thread::sleep(Duration::from_nanos(tick_ns));
                    0
                }
            };
            if self.shared.stop.load(Ordering::Acquire) {
                // Woken by the stop's shutdown (what it returned are no datagrams).
                break;
            }
            since_tick += n;
            if n > 0 && wait_ns > base_ns && !taken_over {
                // Traffic after a quiet spell: back to the stream's own tick at once, so the
                // next tick (a drain, the counters) is not a long timeout away.
                self.set_wait(&mut wait_ns, base_ns);
            }
            if n > 0 && !taken_over {
                if let Some(x) = &self.xdp {
                    if matches!(x.kind, Kind::ChangePoint { .. }) {
                        // A datagram reached the socket: from now on this stream is ours.
                        if let Some(op) = xdp::take_over(x, &self.name) {
                            *self.op.lock().unwrap_or_else(|p| p.into_inner()) = op;
                        }
                        taken_over = true;
                        tick_ns = self.tick_ns;
                        self.set_wait(&mut wait_ns, tick_ns);
                    }
                }
            }
            // One receive time per batch: the datagrams were all queued by then.
            let t_ns = clock_monotonic_ns();
            let wc_window = match &self.xdp {
                Some(XdpStream { kind: Kind::WordCount { window_ns, .. }, .. }) => Some(*window_ns),
                _ => None,
            };
            {
                let mut op = self.op.lock().unwrap_or_else(|p| p.into_inner());
                for i in 0..n {
                    datagrams += 1;
                    match (self.rx.payload(i), wc_window) {
                        (Some(p), Some(window_ns)) => {
                            let w = t_ns / window_ns.max(1);
                            let wc = &mut self.wc;
                            parsed.add(record::parse_words(p, &self.limits, |word| wc.push(w, word)));
                        }
                        (Some(p), None) => {
                            let st = feed_datagram(&mut **op, p, self.encoding, &self.limits, t_ns, &mut out);
                            parsed.add(st);
                        }
                        // Longer than the 65535-byte contract limit: one malformed record.
                        (None, _) => parsed.malformed += 1,
                    }
                }
                if t_ns >= next_tick {
                    op.on_time(t_ns, &mut out);
                }
            }
            if t_ns >= next_tick {
                self.rx.poll_drops();
                next_tick = t_ns.saturating_add(tick_ns);
                if let Some(x) = &self.xdp {
                    if let Kind::WordCount { window_ns, distinct_max } = x.kind {
                        self.wc.flush(x, &self.name, window_ns, distinct_max, t_ns, &mut out);
                    }
                    k = x.kernel.stats(x.slot).unwrap_or_default();
                    if !taken_over && matches!(x.kind, Kind::WordCount { .. } | Kind::ChangePoint { .. }) {
                        // Back off while the socket is quiet; the wait is what the socket's
                        // timeout says. The kernel's counters moving is no work for this
                        // thread (the kernel counts, and a word count's ended windows are
                        // drained on time by `wc_wait_ns`): waking every 10 ms under XDP
                        // traffic only to read them was most of the daemon's CPU there.
                        tick_ns = xdp_next_tick_ns(base_ns, tick_ns, since_tick == 0);
                        let wait = match x.kind {
                            Kind::WordCount { window_ns, .. } => wc_wait_ns(tick_ns, window_ns, t_ns),
                            _ => tick_ns,
                        };
                        self.set_wait(&mut wait_ns, wait);
                        next_tick = t_ns.saturating_add(wait);
                    }
                }
                since_tick = 0;
            }
            self.store_counters(datagrams, &parsed, &k);
            if !out.is_empty() {
                self.shared.publish(self.idx, &mut out);
            }
            if n > 0 && n < BATCH && !self.linger.is_zero() {
                std::thread::sleep(self.linger);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmsg(level: i32, ty: i32, data: &[u8]) -> Vec<u8> {
        let hdr = std::mem::size_of::<libc::cmsghdr>();
        let len = hdr + data.len();
        let mut v = Vec::new();
        v.extend_from_slice(&len.to_ne_bytes());
        v.extend_from_slice(&level.to_ne_bytes());
        v.extend_from_slice(&ty.to_ne_bytes());
        v.resize(hdr, 0);
        v.extend_from_slice(data);
        while v.len() % 8 != 0 {
            v.push(0);
        }
        v
    }

    #[test]
    fn cmsg_parsing_on_crafted_buffers() {
        assert_eq!(parse_rxq_ovfl(&[]), None);
        let ovfl = cmsg(libc::SOL_SOCKET, libc::SO_RXQ_OVFL, &7u32.to_ne_bytes());
        assert_eq!(parse_rxq_ovfl(&ovfl), Some(7));
        // Preceded by another message (a timestamp-like 16-byte payload).
        let mut two = cmsg(libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, &[1u8; 16]);
        two.extend_from_slice(&ovfl);
        assert_eq!(parse_rxq_ovfl(&two), Some(7));
        // Wrong level, short data, truncated header, bogus lengths: no panic, no value.
        assert_eq!(parse_rxq_ovfl(&cmsg(libc::IPPROTO_IP, libc::SO_RXQ_OVFL, &7u32.to_ne_bytes())), None);
        assert_eq!(parse_rxq_ovfl(&cmsg(libc::SOL_SOCKET, libc::SO_RXQ_OVFL, &[1, 2])), None);
        assert_eq!(parse_rxq_ovfl(&ovfl[..10]), None);
        let mut bogus = ovfl.clone();
        bogus[..8].copy_from_slice(&usize::MAX.to_ne_bytes());
        assert_eq!(parse_rxq_ovfl(&bogus), None);
        bogus[..8].copy_from_slice(&0usize.to_ne_bytes());
        assert_eq!(parse_rxq_ovfl(&bogus), None);
    }

    #[test]
    fn drop_counter_wraps_and_ignores_stale() {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut r = Receiver::new(sock);
        r.note_drops(5);
        r.note_drops(3); // stale
        assert_eq!(r.socket_drops, 5);
        r.drops_raw = u32::MAX - 1;
        r.note_drops(2);
        assert_eq!(r.socket_drops, 5 + 4);
    }

    /// A socket that is not read while a burst arrives drops in the kernel; the receiver
    /// reports those drops (via the cmsg and SO_MEMINFO) and the datagrams it did get.
    #[test]
    fn socket_drops_are_reported_when_not_reading() {
        let sock = crate::bind_udp("127.0.0.1:0".parse().unwrap(), 4096).unwrap();
        let addr = sock.local_addr().unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let sent = 2_000u64;
        let payload = [b'7'; 1000];
        for _ in 0..sent {
            tx.send_to(&payload, addr).unwrap();
        }
        // One more after the burst so its cmsg carries the final counter.
        tx.send_to(b"1", addr).unwrap();
        let mut r = Receiver::new(sock);
        let mut got = 0u64;
        let mut cmsg_drops = 0;
        loop {
            let n = r.recv_batch().unwrap();
            if n == 0 {
                break;
            }
            got += n as u64;
            cmsg_drops = r.socket_drops;
        }
        r.poll_drops();
        eprintln!("sent {} received {got} drops via cmsg {cmsg_drops} via meminfo {}", sent + 1, r.socket_drops);
        assert!(cmsg_drops > 0, "the burst into a 4 KiB buffer must have dropped");
        assert_eq!(cmsg_drops, r.socket_drops);
        assert!(got + r.socket_drops <= sent + 1);
        // Loopback drops happen at the socket queue, so the books balance exactly.
        assert_eq!(got + r.socket_drops, sent + 1);
    }

    #[test]
    fn xdp_tick_backs_off_when_quiet_and_returns_at_once() {
        let base = 10_000_000;
        let mut t = base;
        let mut seen = vec![t];
        for _ in 0..8 {
            t = xdp_next_tick_ns(base, t, true);
            seen.push(t);
        }
        assert_eq!(&seen[..5], &[base, 2 * base, 4 * base, 8 * base, XDP_QUIET_TICK_NS_MAX]);
        assert_eq!(t, XDP_QUIET_TICK_NS_MAX, "bounded");
        assert_eq!(xdp_next_tick_ns(base, t, false), base, "a busy tick falls back at once");
        // A stream whose own tick is longer than the bound keeps its own.
        assert_eq!(
            xdp_next_tick_ns(2 * XDP_QUIET_TICK_NS_MAX, 2 * XDP_QUIET_TICK_NS_MAX, true),
            2 * XDP_QUIET_TICK_NS_MAX
        );
    }

    #[test]
    fn wc_wait_ends_at_the_next_drain() {
        let w = 1_000_000_000;
        let g = xdp::WC_GRACE_NS;
        // Mid-window: the tick is shorter than the time to the drain.
        assert_eq!(wc_wait_ns(100_000_000, w, 5 * w + 300_000_000), 100_000_000);
        // Close to the end: cut at end + grace.
        assert_eq!(wc_wait_ns(100_000_000, w, 6 * w - 10_000_000), 10_000_000 + g);
        // Inside the grace after an end: that window's drain is due at end + grace.
        assert_eq!(wc_wait_ns(100_000_000, w, 6 * w + 1_000_000), g - 1_000_000);
        // Exactly at a drain moment: the next one, a window later (capped by the tick).
        assert_eq!(wc_wait_ns(2 * w, w, 6 * w + g), w);
        // Never 0 (SO_RCVTIMEO 0 means forever).
        assert_eq!(wc_wait_ns(0, w, 0), TICK_NS_MIN);
    }

    /// The stop wakes a thread blocked in `recvmmsg` by shutting the socket down for reading,
    /// whatever its receive timeout (an XDP stream's quiet tick is long).
    #[test]
    fn shutdown_wakes_a_blocked_receive() {
        let sock = crate::bind_udp("127.0.0.1:0".parse().unwrap(), 1 << 16).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let other = sock.try_clone().unwrap();
        let t0 = std::time::Instant::now();
        let h = std::thread::spawn(move || {
            let mut r = Receiver::new(sock);
            r.recv_batch().map(|_| ())
        });
        std::thread::sleep(Duration::from_millis(100));
        let _ = socket2::SockRef::from(&other).shutdown(std::net::Shutdown::Read);
        let _ = h.join().unwrap();
        let took = t0.elapsed();
        assert!(took < Duration::from_secs(5), "receive still blocked after shutdown: {took:?}");
    }
}
