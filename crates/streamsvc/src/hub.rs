//! hub: the results TCP listener and subscriber fan-out, one mio event loop on its own thread.
//!
//! What it is for: taking the result bytes the ingest threads publish (per-stream queues,
//! swapped out under a lock held only to append/swap), and copying each line into the bounded
//! buffer of every subscriber that wants that stream, then writing non-blocking. A line that
//! does not fit a subscriber's buffer is dropped for that subscriber only and counted; the next
//! line it does get is preceded by one `dropped` line per stream that lost lines. The hub also
//! emits each stream's periodic `stats` line.
//!
//! Latency: an ingest thread that publishes wakes the hub (eventfd, once per burst thanks to a
//! pending flag); the hub drains every queue and writes in the same loop turn, and subscriber
//! sockets have TCP_NODELAY, so an alert is on the wire one event-loop turn after its datagram
//! was parsed.
//!
//! Subscriber protocol: optionally one line `SUBSCRIBE a,b` / `SUBSCRIBE *` within
//! [`SUBSCRIBE_WAIT_NS`] of connecting (no line = all streams). Lines produced before the
//! subscription is settled are not delivered to it. A bad line or an unknown stream name gets
//! one `{"stream":"*","type":"error","error":...}` line and the connection is closed. Anything
//! read after the subscription is discarded; end of file removes the subscriber.
//!
//! What it is not for: parsing datagrams or running operators (ingest).

use std::io::{self, Read, Write};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};
use slipstream_stream::{json, result};

use crate::{monotonic_ns, Shared};

pub(crate) const WAKER: Token = Token(usize::MAX);
const LISTENER: Token = Token(usize::MAX - 1);
/// Most connected subscribers (pending or active); further connections are closed at once.
pub const SUBSCRIBERS_MAX: usize = 256;
/// Longest SUBSCRIBE line, bytes including `\n`.
pub const SUBSCRIBE_LINE_BYTES_MAX: usize = 4096;
/// How long a new connection may take to send its SUBSCRIBE line.
pub const SUBSCRIBE_WAIT_NS: u64 = 100_000_000;
/// An emptied subscriber buffer keeps at most this much capacity.
const IDLE_BUF_BYTES: usize = 64 * 1024;
const READ_CHUNK_BYTES: usize = 4096;
const EVENTS_MAX: usize = 512;

enum State {
    Pending { deadline_ns: u64, line: Vec<u8> },
    Active,
}

struct Sub {
    sock: TcpStream,
    state: State,
    /// Bytes queued for the socket; `out[head..]` is still to be written.
    out: Vec<u8>,
    head: usize,
    /// Per stream: does this subscriber want it (all false while pending).
    wants: Vec<bool>,
    /// Per stream: lines dropped and not yet announced.
    dropped: Vec<u64>,
}

impl Sub {
    fn queued(&self) -> usize {
        self.out.len() - self.head
    }
}

pub(crate) struct Hub {
    pub poll: Poll,
    pub listener: TcpListener,
    pub shared: Arc<Shared>,
    pub buf_bytes_max: usize,
    pub stats_interval_ns: u64,
}

/// What to do with a subscriber after handling it.
enum Fate {
    Keep,
    Remove,
}

impl Hub {
    pub(crate) fn run(mut self) {
        let nstreams = self.shared.streams.len();
        let mut subs: Vec<Option<Sub>> = Vec::new();
        let mut events = Events::with_capacity(EVENTS_MAX);
        let mut next_stats = monotonic_ns().saturating_add(self.stats_interval_ns);
        let mut chunk: Vec<u8> = Vec::new();
        let mut scratch: Vec<u8> = Vec::new();
        loop {
            let now = monotonic_ns();
            let mut deadline = next_stats;
            for s in subs.iter().flatten() {
                if let State::Pending { deadline_ns, .. } = s.state {
                    deadline = deadline.min(deadline_ns);
                }
            }
            let timeout = Duration::from_nanos(deadline.saturating_sub(now));
            if let Err(e) = self.poll.poll(&mut events, Some(timeout)) {
                if e.kind() != io::ErrorKind::Interrupted {
                    // The event loop is broken; nothing sensible is left to do but stop serving.
                    return;
                }
            }
            if self.shared.stop.load(Ordering::Acquire) {
                return;
            }
            for ev in events.iter() {
                match ev.token() {
                    WAKER => {}
                    LISTENER => self.accept(&mut subs, nstreams),
                    Token(i) => {
                        let fate = match subs.get_mut(i).and_then(Option::as_mut) {
                            Some(sub) => {
                                let mut fate = Fate::Keep;
                                if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                                    fate = self.read_sub(sub);
                                }
                                if matches!(fate, Fate::Keep) && ev.is_writable() {
                                    fate = flush(sub);
                                }
                                fate
                            }
                            None => Fate::Keep,
                        };
                        if matches!(fate, Fate::Remove) {
                            self.remove(&mut subs, i);
                        }
                    }
                }
            }
            let now = monotonic_ns();
            // Subscribers that sent no line in time take every stream.
            for s in subs.iter_mut().flatten() {
                if let State::Pending { deadline_ns, .. } = s.state {
                    if now >= deadline_ns {
                        self.activate(s, vec![true; nstreams]);
                    }
                }
            }
            // Clear the flag before draining: a publish after this point wakes us again.
            self.shared.wake_pending.store(false, Ordering::SeqCst);
            for idx in 0..nstreams {
                self.drain(idx, &mut chunk, &mut subs, &mut scratch);
            }
            if now >= next_stats {
                for idx in 0..nstreams {
                    chunk.clear();
                    self.stats_line(idx, now, &mut chunk);
                    deliver(&self.shared, &mut subs, idx, &chunk, self.buf_bytes_max, &mut scratch);
                }
                // After a stall, skip missed periods rather than emitting a burst of them.
                next_stats = next_stats.saturating_add(self.stats_interval_ns);
                if next_stats <= now {
                    next_stats = now.saturating_add(self.stats_interval_ns);
                }
            }
            for i in 0..subs.len() {
                let fate = match subs.get_mut(i).and_then(Option::as_mut) {
                    Some(sub) if sub.queued() > 0 => flush(sub),
                    _ => Fate::Keep,
                };
                if matches!(fate, Fate::Remove) {
                    self.remove(&mut subs, i);
                }
            }
        }
    }

    fn stats_line(&self, idx: usize, now: u64, out: &mut Vec<u8>) {
        let Some(s) = self.shared.streams.get(idx) else { return };
        let c = &s.counters;
        let f = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        result::stats(out, &s.name, now, &[
            ("datagrams", f(&c.datagrams)),
            ("records", f(&c.records)),
            ("malformed", f(&c.malformed)),
            ("over_limit", f(&c.over_limit)),
            ("socket_drops", f(&c.socket_drops)),
            ("lines", f(&c.lines)),
            ("subscriber_drops", f(&c.subscriber_drops)),
        ]);
    }

    /// Takes stream `idx`'s published bytes and hands them to its subscribers.
    fn drain(&self, idx: usize, chunk: &mut Vec<u8>, subs: &mut [Option<Sub>], scratch: &mut Vec<u8>) {
        let Some(s) = self.shared.streams.get(idx) else { return };
        chunk.clear();
        {
            let mut q = s.queue.lock().unwrap_or_else(|p| p.into_inner());
            std::mem::swap(&mut *q, chunk);
        }
        // Lines the hub queue had no room for: every subscriber of the stream lost them.
        let lost = s.counters.hub_unannounced.swap(0, Ordering::Relaxed);
        if lost > 0 {
            for sub in subs.iter_mut().flatten() {
                if sub.wants.get(idx).copied().unwrap_or(false) {
                    if let Some(d) = sub.dropped.get_mut(idx) {
                        *d += lost;
                    }
                }
            }
        }
        if !chunk.is_empty() {
            deliver(&self.shared, subs, idx, chunk, self.buf_bytes_max, scratch);
            // Keep the spare buffer bounded so one burst does not pin memory forever.
            if chunk.capacity() > crate::HUB_QUEUE_BYTES_MAX / 4 {
                *chunk = Vec::new();
            }
        }
    }

    fn accept(&mut self, subs: &mut Vec<Option<Sub>>, nstreams: usize) {
        loop {
            let (mut sock, _) = match self.listener.accept() {
                Ok(c) => c,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // ECONNABORTED, EMFILE, ...: skip this one; the listener stays usable.
                Err(_) => return,
            };
            let live = subs.iter().flatten().count();
            if live >= SUBSCRIBERS_MAX {
                drop(sock);
                continue;
            }
            // Alert lines are small; without this Nagle could hold one back for an ACK.
            let _ = sock.set_nodelay(true);
            let slot = match subs.iter().position(Option::is_none) {
                Some(i) => i,
                None => {
                    subs.push(None);
                    subs.len() - 1
                }
            };
            if self
                .poll
                .registry()
                .register(&mut sock, Token(slot), Interest::READABLE | Interest::WRITABLE)
                .is_err()
            {
                continue;
            }
            if let Some(e) = subs.get_mut(slot) {
                *e = Some(Sub {
                    sock,
                    state: State::Pending {
                        deadline_ns: monotonic_ns().saturating_add(SUBSCRIBE_WAIT_NS),
                        line: Vec::new(),
                    },
                    out: Vec::new(),
                    head: 0,
                    wants: vec![false; nstreams],
                    dropped: vec![0; nstreams],
                });
            }
        }
    }

    fn activate(&self, sub: &mut Sub, wants: Vec<bool>) {
        for (i, w) in wants.iter().enumerate() {
            if *w {
                if let Some(s) = self.shared.streams.get(i) {
                    s.counters.subscribers.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        sub.wants = wants;
        sub.state = State::Active;
    }

    fn remove(&self, subs: &mut [Option<Sub>], i: usize) {
        let Some(slot) = subs.get_mut(i) else { return };
        if let Some(mut sub) = slot.take() {
            let _ = self.poll.registry().deregister(&mut sub.sock);
            if matches!(sub.state, State::Active) {
                for (i, w) in sub.wants.iter().enumerate() {
                    if *w {
                        if let Some(s) = self.shared.streams.get(i) {
                            s.counters.subscribers.fetch_sub(1, Ordering::Relaxed);
                        }
                    }
                }
            }
        }
    }

    fn read_sub(&self, sub: &mut Sub) -> Fate {
        let mut buf = [0u8; READ_CHUNK_BYTES];
        loop {
            let n = match sub.sock.read(&mut buf) {
                Ok(0) => {
                    // The client closed its sending side (`nc` does at once when its input
                    // ends). That ends the SUBSCRIBE line, not the subscription: results keep
                    // flowing until a write fails.
                    if let State::Pending { line, .. } = &mut sub.state {
                        let l = std::mem::take(line);
                        let end = l.iter().position(|&b| b == b'\n').unwrap_or(l.len());
                        match parse_subscribe(l.get(..end).unwrap_or(&[]), &self.shared.names()) {
                            Ok(wants) => self.activate(sub, wants),
                            Err(msg) => return self.refuse(sub, &msg),
                        }
                    }
                    return Fate::Keep;
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Fate::Keep,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return Fate::Remove,
            };
            let data = buf.get(..n).unwrap_or(&[]);
            let State::Pending { line, .. } = &mut sub.state else {
                continue; // active: input is discarded
            };
            let room = SUBSCRIBE_LINE_BYTES_MAX.saturating_sub(line.len());
            let take = data.len().min(room);
            line.extend_from_slice(data.get(..take).unwrap_or(&[]));
            let Some(nl) = line.iter().position(|&b| b == b'\n') else {
                if line.len() >= SUBSCRIBE_LINE_BYTES_MAX {
                    return self.refuse(sub, "SUBSCRIBE line longer than 4096 bytes");
                }
                continue;
            };
            let parsed = parse_subscribe(line.get(..nl).unwrap_or(&[]), &self.shared.names());
            match parsed {
                Ok(wants) => self.activate(sub, wants),
                Err(msg) => return self.refuse(sub, &msg),
            }
        }
    }

    /// Sends one error line (best effort) and asks for removal.
    fn refuse(&self, sub: &mut Sub, msg: &str) -> Fate {
        // Drain unread input first so closing sends FIN, not RST (which could discard the line).
        let mut buf = [0u8; READ_CHUNK_BYTES];
        for _ in 0..64 {
            match sub.sock.read(&mut buf) {
                Ok(n) if n > 0 => {}
                _ => break,
            }
        }
        let mut line = Vec::new();
        line.extend_from_slice(b"{\"stream\":\"*\",\"type\":\"error\",\"error\":");
        json::push_str(&mut line, msg);
        line.extend_from_slice(b"}\n");
        let _ = sub.sock.write(&line);
        Fate::Remove
    }
}

/// `SUBSCRIBE` line (without `\n`) → which streams. `SUBSCRIBE`, `SUBSCRIBE *` or an empty
/// line mean all; names are comma-separated, spaces around them ignored.
pub(crate) fn parse_subscribe(line: &[u8], names: &[&str]) -> Result<Vec<bool>, String> {
    let text = std::str::from_utf8(line).map_err(|_| "SUBSCRIBE line is not UTF-8".to_string())?;
    let text = text.trim();
    if text.is_empty() {
        return Ok(vec![true; names.len()]);
    }
    let rest = text
        .strip_prefix("SUBSCRIBE")
        .filter(|r| r.is_empty() || r.starts_with([' ', '\t']))
        .ok_or_else(|| "expected SUBSCRIBE name[,name...] or SUBSCRIBE *".to_string())?
        .trim();
    if rest.is_empty() || rest == "*" {
        return Ok(vec![true; names.len()]);
    }
    let mut wants = vec![false; names.len()];
    for name in rest.split(',').map(str::trim) {
        match names.iter().position(|n| *n == name) {
            Some(i) => {
                if let Some(w) = wants.get_mut(i) {
                    *w = true;
                }
            }
            None => return Err(format!("unknown stream {name:?}")),
        }
    }
    Ok(wants)
}

/// Appends stream `idx`'s complete lines in `chunk` to every subscriber that wants them.
fn deliver(shared: &Shared, subs: &mut [Option<Sub>], idx: usize, chunk: &[u8], max: usize, scratch: &mut Vec<u8>) {
    for sub in subs.iter_mut().flatten() {
        if !sub.wants.get(idx).copied().unwrap_or(false) {
            continue;
        }
        let clean = sub.dropped.iter().all(|&d| d == 0);
        if clean && sub.queued() + chunk.len() <= max {
            sub.out.extend_from_slice(chunk);
            continue;
        }
        for line in chunk.split_inclusive(|&b| b == b'\n') {
            deliver_line(shared, sub, idx, line, max, scratch);
        }
    }
}

fn deliver_line(shared: &Shared, sub: &mut Sub, idx: usize, line: &[u8], max: usize, scratch: &mut Vec<u8>) {
    let mut fits = sub.queued() + line.len() <= max;
    if fits && sub.dropped.iter().any(|&d| d > 0) {
        scratch.clear();
        let now = monotonic_ns();
        for (i, &n) in sub.dropped.iter().enumerate() {
            if n > 0 {
                let name = shared.streams.get(i).map(|s| s.name.as_str()).unwrap_or("");
                scratch.extend_from_slice(b"{\"stream\":");
                json::push_str(scratch, name);
                scratch.extend_from_slice(b",\"type\":\"dropped\",\"lines\":");
                json::push_u64(scratch, n);
                scratch.extend_from_slice(b",\"t_ns\":");
                json::push_u64(scratch, now);
                scratch.extend_from_slice(b"}\n");
            }
        }
        fits = sub.queued() + scratch.len() + line.len() <= max;
        if fits {
            sub.out.extend_from_slice(scratch);
            sub.dropped.iter_mut().for_each(|d| *d = 0);
        }
    }
    if fits {
        sub.out.extend_from_slice(line);
    } else {
        if let Some(d) = sub.dropped.get_mut(idx) {
            *d += 1;
        }
        if let Some(s) = shared.streams.get(idx) {
            s.counters.subscriber_drops.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Writes what the socket takes without blocking.
fn flush(sub: &mut Sub) -> Fate {
    while sub.head < sub.out.len() {
        match sub.sock.write(sub.out.get(sub.head..).unwrap_or(&[])) {
            Ok(0) => return Fate::Remove,
            Ok(n) => sub.head += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return Fate::Remove,
        }
    }
    if sub.head == sub.out.len() {
        sub.out.clear();
        sub.head = 0;
        if sub.out.capacity() > IDLE_BUF_BYTES {
            sub.out.shrink_to(IDLE_BUF_BYTES);
        }
    } else if sub.head > sub.out.len() / 2 {
        sub.out.drain(..sub.head);
        sub.head = 0;
    }
    Fate::Keep
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subscribe_lines() {
        let names = ["a", "b", "c d"];
        assert_eq!(parse_subscribe(b"", &names), Ok(vec![true; 3]));
        assert_eq!(parse_subscribe(b"SUBSCRIBE *\r", &names), Ok(vec![true; 3]));
        assert_eq!(parse_subscribe(b"SUBSCRIBE", &names), Ok(vec![true; 3]));
        assert_eq!(parse_subscribe(b"SUBSCRIBE b", &names), Ok(vec![false, true, false]));
        assert_eq!(parse_subscribe(b"SUBSCRIBE a, c d ,a", &names), Ok(vec![true, false, true]));
        assert!(parse_subscribe(b"SUBSCRIBE x", &names).unwrap_err().contains("unknown stream"));
        assert!(parse_subscribe(b"SUBSCRIBEa", &names).is_err());
        assert!(parse_subscribe(b"GET a", &names).is_err());
        assert!(parse_subscribe(b"SUBSCRIBE \xff", &names).is_err());
    }
}
