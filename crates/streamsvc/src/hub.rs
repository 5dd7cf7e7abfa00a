//! hub: the results TCP listener and subscriber fan-out, one mio event loop on its own thread.
//!
//! What it is for: taking the result bytes the ingest threads publish (per-stream queues,
//! swapped out under a lock held only to append/swap), stamping each line with its stream's
//! sequence number, keeping it in the stream's retention ring, and copying it into the bounded
//! buffer of every subscriber that wants that stream, then writing non-blocking. A line that
//! does not fit a live subscriber's buffer is dropped for that subscriber only and counted; the
//! next line it does get is preceded by one `dropped` line per stream that lost lines. The hub
//! also emits each stream's periodic `stats` line.
//!
//! Latency: an ingest thread that publishes wakes the hub (eventfd, once per burst thanks to a
//! pending flag); the hub drains every queue and writes in the same loop turn, and subscriber
//! sockets have TCP_NODELAY, so an alert is on the wire one event-loop turn after its datagram
//! was parsed.
//!
//! Sequence numbers and retention (what makes exact, replayable reads possible, e.g. for the
//! Spark source in connectors/spark): every operator result line gets `"seq":N` as its first
//! field, N counting from 0 per stream per daemon run. Each daemon run has an `epoch` (16 hex
//! digits, random), so a client holding `(epoch, seq)` can tell a restarted daemon (new epoch,
//! seqs start again at 0) from the same one. Each stream keeps its newest lines in a ring of
//! about [`RETAIN_BYTES_MAX`] bytes (whole chunks of lines evicted oldest first). Lines the
//! hub queue lost (see `HUB_QUEUE_BYTES_MAX`) still consume their seqs, so a gap in seq is a
//! loss the reader can see. `stats`, `dropped`, `hello`, `info` and `error` lines carry no seq.
//!
//! Subscriber protocol: optionally one line within [`SUBSCRIBE_WAIT_NS`] of connecting (no line
//! = all streams, live). Lines:
//! - `SUBSCRIBE a,b` / `SUBSCRIBE *` / `SUBSCRIBE`: live lines of those streams, starting with
//!   the first line stamped after the connection was accepted: the lines produced while the
//!   request was pending are copied from the retention ring when it settles, so a subscriber
//!   that sends its line late (or none) misses nothing (what does not fit its buffer is counted
//!   as dropped, as for live lines).
//! - `SUBSCRIBE name FROM S [UNTIL U] [EPOCH E]` (one stream; S a seq, `EARLIEST` or
//!   `LATEST`): first one `hello` line (same body as `info`), then the retained lines with
//!   seq >= S, then live lines; with UNTIL, only seqs < U, and the connection is closed after
//!   the line before U (waiting for it if it is not produced yet). EPOCH E: refuse unless E is
//!   this run's epoch. Such a subscriber reads from the ring at its own pace (its buffer never
//!   drops lines); if it falls so far behind that its next line was evicted it gets a
//!   `data_loss` error line and is closed.
//! - `INFO`: one `info` line, then the connection is closed:
//!   `{"stream":"*","type":"info","epoch":"…","retain_bytes_max":N,"streams":[{"name":…,
//!   "operator":…,"first_seq":F,"next_seq":X,"retained_bytes":B},…]}`; `first_seq` is the
//!   oldest seq still retained, `next_seq` the seq the next line will get.
//!
//! A bad line, an unknown stream name or a range that cannot be served gets one
//! `{"stream":"*","type":"error","code":C,"error":...}` line and the connection is closed;
//! codes: `bad_request`, `unknown_stream`, `epoch` (with `epoch`), `data_loss` and
//! `out_of_range` (both with `first_seq` / `next_seq`). Anything read after the request is
//! discarded; end of file removes the subscriber.
//!
//! What it is not for: parsing datagrams or running operators (ingest).

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};
use slipstream_stream::{json, result};

use crate::{clock_monotonic_ns, Shared};

pub(crate) const WAKER: Token = Token(usize::MAX);
const LISTENER: Token = Token(usize::MAX - 1);
/// Most connected subscribers (pending or active); further connections are closed at once.
pub const SUBSCRIBERS_MAX: usize = 256;
/// Longest SUBSCRIBE line, bytes including `\n`.
pub const SUBSCRIBE_LINE_BYTES_MAX: usize = 4096;
/// How long a new connection may take to send its SUBSCRIBE line.
pub const SUBSCRIBE_WAIT_NS: u64 = 100_000_000;
/// Result bytes each stream keeps for replay (`SUBSCRIBE … FROM`); beyond it the oldest chunk
/// of lines is evicted. The ring may exceed this by at most one chunk (one line if larger).
pub const RETAIN_BYTES_MAX: usize = 16 << 20;
/// Lines are retained in chunks of about this size (eviction unit; bounds per-line overhead).
const RETAIN_CHUNK_BYTES: usize = 256 << 10;
/// An emptied subscriber buffer keeps at most this much capacity.
const IDLE_BUF_BYTES: usize = 64 * 1024;
const READ_CHUNK_BYTES: usize = 4096;
const EVENTS_MAX: usize = 512;

/// Consecutive seq-stamped lines: `data` holds them back to back, `ends[i]` is where line
/// `first_seq + i` ends.
struct Chunk {
    first_seq: u64,
    data: Vec<u8>,
    ends: Vec<usize>,
}

impl Chunk {
    fn next_seq(&self) -> u64 {
        self.first_seq + self.ends.len() as u64
    }
}

/// One stream's retention ring and seq counter.
#[derive(Default)]
pub(crate) struct Ring {
    chunks: VecDeque<Chunk>,
    bytes: usize,
    next_seq: u64,
}

impl Ring {
    /// Oldest seq still retained (`next_seq` when nothing is).
    pub(crate) fn first_seq(&self) -> u64 {
        self.chunks.front().map(|c| c.first_seq).unwrap_or(self.next_seq)
    }

    /// `n` lines were lost before reaching the hub: their seqs are skipped.
    fn skip(&mut self, n: u64) {
        self.next_seq = self.next_seq.saturating_add(n);
    }

    /// Stamps each complete line of `lines` with the next seq, retains it, and appends the
    /// stamped bytes to `out` (what live subscribers get).
    pub(crate) fn append(&mut self, lines: &[u8], out: &mut Vec<u8>) {
        for line in lines.split_inclusive(|&b| b == b'\n') {
            if line.last() != Some(&b'\n') {
                continue; // publishers hand over complete lines only; never stamp a fragment
            }
            let seq = self.next_seq;
            let start = out.len();
            match line.split_first() {
                Some((b'{', rest)) => {
                    out.extend_from_slice(b"{\"seq\":");
                    json::push_u64(out, seq);
                    if rest.first() != Some(&b'}') {
                        out.push(b',');
                    }
                    out.extend_from_slice(rest);
                }
                _ => out.extend_from_slice(line),
            }
            let stamped = out.get(start..).unwrap_or(&[]);
            let fits_last = matches!(self.chunks.back(),
                Some(c) if c.next_seq() == seq && c.data.len() < RETAIN_CHUNK_BYTES);
            if !fits_last {
                self.chunks.push_back(Chunk { first_seq: seq, data: Vec::new(), ends: Vec::new() });
            }
            if let Some(c) = self.chunks.back_mut() {
                c.data.extend_from_slice(stamped);
                c.ends.push(c.data.len());
            }
            self.bytes += stamped.len();
            self.next_seq += 1;
        }
        while self.bytes > RETAIN_BYTES_MAX && self.chunks.len() > 1 {
            if let Some(c) = self.chunks.pop_front() {
                self.bytes = self.bytes.saturating_sub(c.data.len());
            }
        }
    }

    /// Copies retained lines with seq in `[from, until)` into `out`, whole lines only, while
    /// `out` stays within `budget` bytes (at least one line is copied if any is due, so a line
    /// larger than the budget still gets through). Returns the seq to continue from.
    pub(crate) fn copy(&self, from: u64, until: u64, out: &mut Vec<u8>, budget: usize) -> u64 {
        let mut seq = from.max(self.first_seq());
        let start = self.chunks.partition_point(|c| c.next_seq() <= seq);
        for c in self.chunks.iter().skip(start) {
            if seq >= until {
                break;
            }
            seq = seq.max(c.first_seq);
            let first = (seq - c.first_seq) as usize;
            let last = (until.min(c.next_seq()) - c.first_seq) as usize;
            let begin = if first == 0 { 0 } else { c.ends.get(first - 1).copied().unwrap_or(0) };
            // Lines first..last, as many as fit.
            let mut end_idx = first;
            while end_idx < last {
                let end = c.ends.get(end_idx).copied().unwrap_or(begin);
                if out.len() + (end - begin) > budget && (end_idx > first || !out.is_empty()) {
                    break;
                }
                end_idx += 1;
            }
            if end_idx > first {
                let end = c.ends.get(end_idx - 1).copied().unwrap_or(begin);
                out.extend_from_slice(c.data.get(begin..end).unwrap_or(&[]));
            }
            seq = c.first_seq + end_idx as u64;
            if end_idx < last {
                break; // budget reached
            }
        }
        seq
    }
}

enum State {
    /// No request yet. `from_seqs[i]`: stream i's next seq when the connection was accepted,
    /// where a live subscription starts (so nothing produced while pending is lost).
    Pending {
        deadline_ns: u64,
        line: Vec<u8>,
        from_seqs: Vec<u64>,
    },
    Active,
    /// Write what is queued, then close (after `INFO`, an error, or the end of a range).
    Closing,
}

/// Where an active subscriber's lines come from.
enum Mode {
    /// Fan-out of new lines, with per-subscriber drops.
    Live,
    /// Read from stream `stream`'s ring at its own pace: next seq to copy, exclusive end.
    Replay { stream: usize, next: u64, until: u64 },
}

struct Sub {
    sock: TcpStream,
    state: State,
    mode: Mode,
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

    fn live(&self) -> bool {
        matches!(self.state, State::Active) && matches!(self.mode, Mode::Live)
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

/// Where a `FROM` starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Start {
    Seq(u64),
    Earliest,
    Latest,
}

/// A parsed request line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Request {
    Live(Vec<bool>),
    Replay { stream: usize, from: Start, until: Option<u64>, epoch: Option<String> },
    Info,
}

/// Why a request was refused: the error line's `code` and text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub code: &'static str,
    pub msg: String,
}

fn bad(msg: impl Into<String>) -> Refusal {
    Refusal { code: "bad_request", msg: msg.into() }
}

/// A per-run id: 64 random bits (the kernel's), hex. Falls back to clock and pid bits, which
/// still differ between runs.
fn new_epoch() -> String {
    let mut b = [0u8; 8];
    let ok = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)).is_ok();
    let v = if ok {
        u64::from_le_bytes(b)
    } else {
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        wall ^ clock_monotonic_ns().rotate_left(17) ^ u64::from(std::process::id()).rotate_left(40)
    };
    format!("{v:016x}")
}

impl Hub {
    pub(crate) fn run(mut self) {
        let nstreams = self.shared.streams.len();
        let epoch = new_epoch();
        let mut rings: Vec<Ring> = (0..nstreams).map(|_| Ring::default()).collect();
        let mut subs: Vec<Option<Sub>> = Vec::new();
        let mut events = Events::with_capacity(EVENTS_MAX);
        let mut next_stats = clock_monotonic_ns().saturating_add(self.stats_interval_ns);
        let mut chunk: Vec<u8> = Vec::new();
        let mut stamped: Vec<u8> = Vec::new();
        let mut scratch: Vec<u8> = Vec::new();
        loop {
            let now = clock_monotonic_ns();
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
                    LISTENER => self.accept(&mut subs, &rings),
                    Token(i) => {
                        let fate = match subs.get_mut(i).and_then(Option::as_mut) {
                            Some(sub) => {
                                let mut fate = Fate::Keep;
                                if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                                    fate = self.read_sub(sub, &rings, &epoch);
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
            let now = clock_monotonic_ns();
            // Subscribers that sent no line in time take every stream.
            for s in subs.iter_mut().flatten() {
                if let State::Pending { deadline_ns, .. } = s.state {
                    if now >= deadline_ns {
                        self.activate_live(s, vec![true; nstreams], &rings);
                    }
                }
            }
            // Clear the flag before draining: a publish after this point wakes us again.
            self.shared.wake_pending.store(false, Ordering::SeqCst);
            for (idx, ring) in rings.iter_mut().enumerate() {
                self.drain(idx, ring, &mut chunk, &mut stamped, &mut subs, &mut scratch);
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
                    Some(sub) => {
                        self.pump(sub, &rings);
                        let mut fate = if sub.queued() > 0 { flush(sub) } else { Fate::Keep };
                        if matches!(sub.state, State::Closing) && sub.queued() == 0 {
                            fate = Fate::Remove;
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

    fn stats_line(&self, idx: usize, now: u64, out: &mut Vec<u8>) {
        let Some(s) = self.shared.streams.get(idx) else { return };
        let c = &s.counters;
        let f = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        result::stats(
            out,
            &s.name,
            now,
            &[
                ("datagrams", f(&c.datagrams)),
                ("records", f(&c.records)),
                ("malformed", f(&c.malformed)),
                ("over_limit", f(&c.over_limit)),
                ("socket_drops", f(&c.socket_drops)),
                ("lines", f(&c.lines)),
                ("subscriber_drops", f(&c.subscriber_drops)),
                ("xdp_datagrams", f(&c.xdp_datagrams)),
                ("xdp_passed", f(&c.xdp_passed)),
                ("xdp_events_lost", f(&c.xdp_events_lost)),
            ],
        );
    }

    /// The `info` / `hello` line body.
    fn info_line(&self, ty: &str, rings: &[Ring], epoch: &str, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"stream\":\"*\",\"type\":");
        json::push_str(out, ty);
        json::push_key(out, "epoch");
        json::push_str(out, epoch);
        json::push_key(out, "retain_bytes_max");
        json::push_u64(out, RETAIN_BYTES_MAX as u64);
        json::push_key(out, "streams");
        out.push(b'[');
        for (i, (s, r)) in self.shared.streams.iter().zip(rings).enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(b"{\"name\":");
            json::push_str(out, &s.name);
            json::push_key(out, "operator");
            json::push_str(out, &s.operator);
            json::push_key(out, "first_seq");
            json::push_u64(out, r.first_seq());
            json::push_key(out, "next_seq");
            json::push_u64(out, r.next_seq);
            json::push_key(out, "retained_bytes");
            json::push_u64(out, r.bytes as u64);
            out.push(b'}');
        }
        out.extend_from_slice(b"]}\n");
    }

    /// Takes stream `idx`'s published bytes, stamps and retains them, and hands them to its
    /// live subscribers (replaying ones read the ring in `pump`).
    fn drain(
        &self,
        idx: usize,
        ring: &mut Ring,
        chunk: &mut Vec<u8>,
        stamped: &mut Vec<u8>,
        subs: &mut [Option<Sub>],
        scratch: &mut Vec<u8>,
    ) {
        let Some(s) = self.shared.streams.get(idx) else { return };
        chunk.clear();
        {
            let mut q = s.queue.lock().unwrap_or_else(|p| p.into_inner());
            std::mem::swap(&mut *q, chunk);
        }
        // Lines the hub queue had no room for: every subscriber of the stream lost them. They
        // were published before what is queued now, so their seqs come first.
        let lost = s.counters.hub_unannounced.swap(0, Ordering::Relaxed);
        if lost > 0 {
            ring.skip(lost);
            for sub in subs.iter_mut().flatten() {
                if sub.live() && sub.wants.get(idx).copied().unwrap_or(false) {
                    if let Some(d) = sub.dropped.get_mut(idx) {
                        *d += lost;
                    }
                }
            }
        }
        if !chunk.is_empty() {
            stamped.clear();
            ring.append(chunk, stamped);
            deliver(&self.shared, subs, idx, stamped, self.buf_bytes_max, scratch);
            // Keep the spare buffers bounded so one burst does not pin memory forever.
            if chunk.capacity() > crate::HUB_QUEUE_BYTES_MAX / 4 {
                *chunk = Vec::new();
            }
            if stamped.capacity() > crate::HUB_QUEUE_BYTES_MAX / 4 {
                *stamped = Vec::new();
            }
        }
    }

    /// Tops up a replaying subscriber's buffer from its stream's ring.
    fn pump(&self, sub: &mut Sub, rings: &[Ring]) {
        if !matches!(sub.state, State::Active) {
            return;
        }
        let Mode::Replay { stream, next, until } = sub.mode else { return };
        let Some(ring) = rings.get(stream) else { return };
        if next < ring.first_seq() {
            let name = self.shared.streams.get(stream).map(|s| s.name.as_str()).unwrap_or("");
            let msg = format!(
                "stream {name:?}: seq {next} is no longer retained (the subscriber fell behind; \
                 first retained {}, next {})",
                ring.first_seq(),
                ring.next_seq
            );
            sub.out.extend_from_slice(&error_line("data_loss", &msg, Some((ring.first_seq(), ring.next_seq)), None));
            sub.state = State::Closing;
            return;
        }
        let mut next = next;
        if next < until && next < ring.next_seq && sub.queued() < self.buf_bytes_max {
            if sub.head > 0 && sub.head == sub.out.len() {
                sub.out.clear();
                sub.head = 0;
            }
            let budget = sub.out.len() + self.buf_bytes_max.saturating_sub(sub.queued());
            next = ring.copy(next, until, &mut sub.out, budget);
        }
        sub.mode = Mode::Replay { stream, next, until };
        if next >= until {
            sub.state = State::Closing;
        }
    }

    fn accept(&mut self, subs: &mut Vec<Option<Sub>>, rings: &[Ring]) {
        let nstreams = rings.len();
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
            if self.poll.registry().register(&mut sock, Token(slot), Interest::READABLE | Interest::WRITABLE).is_err() {
                continue;
            }
            if let Some(e) = subs.get_mut(slot) {
                *e = Some(Sub {
                    sock,
                    state: State::Pending {
                        deadline_ns: clock_monotonic_ns().saturating_add(SUBSCRIBE_WAIT_NS),
                        line: Vec::new(),
                        from_seqs: rings.iter().map(|r| r.next_seq).collect(),
                    },
                    mode: Mode::Live,
                    out: Vec::new(),
                    head: 0,
                    wants: vec![false; nstreams],
                    dropped: vec![0; nstreams],
                });
            }
        }
    }

    fn activate(&self, sub: &mut Sub, wants: Vec<bool>, mode: Mode) {
        for (i, w) in wants.iter().enumerate() {
            if *w {
                if let Some(s) = self.shared.streams.get(i) {
                    s.counters.subscribers.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        sub.wants = wants;
        sub.mode = mode;
        sub.state = State::Active;
    }

    /// Settles a pending subscriber on live lines of `wants`: first the lines of those streams
    /// stamped since it was accepted (from the rings), then fan-out as they come.
    fn activate_live(&self, sub: &mut Sub, wants: Vec<bool>, rings: &[Ring]) {
        let from_seqs = match &mut sub.state {
            State::Pending { from_seqs, .. } => std::mem::take(from_seqs),
            _ => Vec::new(),
        };
        for (idx, (&from, ring)) in from_seqs.iter().zip(rings).enumerate() {
            if wants.get(idx).copied().unwrap_or(false) && from < ring.next_seq {
                self.catch_up(sub, idx, from, ring);
            }
        }
        self.activate(sub, wants, Mode::Live);
    }

    /// Copies stream `idx`'s lines `[from, next_seq)` into `sub`'s buffer within its bound;
    /// lines that were not retained or do not fit are counted as dropped for it.
    fn catch_up(&self, sub: &mut Sub, idx: usize, from: u64, ring: &Ring) {
        let before = sub.out.len();
        let budget = before + self.buf_bytes_max.saturating_sub(sub.queued());
        ring.copy(from, ring.next_seq, &mut sub.out, budget);
        let copied = sub.out.get(before..).unwrap_or(&[]).iter().filter(|&&b| b == b'\n').count() as u64;
        let missing = (ring.next_seq - from).saturating_sub(copied);
        if missing > 0 {
            if let Some(d) = sub.dropped.get_mut(idx) {
                *d += missing;
            }
            if let Some(s) = self.shared.streams.get(idx) {
                s.counters.subscriber_drops.fetch_add(missing, Ordering::Relaxed);
            }
        }
    }

    /// Acts on a complete request line.
    fn handle(&self, sub: &mut Sub, line: &[u8], rings: &[Ring], epoch: &str) -> Fate {
        let nstreams = self.shared.streams.len();
        match parse_request(line, &self.shared.names()) {
            Ok(Request::Live(wants)) => {
                self.activate_live(sub, wants, rings);
                Fate::Keep
            }
            Ok(Request::Info) => {
                let mut out = Vec::new();
                self.info_line("info", rings, epoch, &mut out);
                sub.out.extend_from_slice(&out);
                sub.state = State::Closing;
                drain_input(sub);
                Fate::Keep
            }
            Ok(Request::Replay { stream, from, until, epoch: want_epoch }) => {
                let name = self.shared.streams.get(stream).map(|s| s.name.as_str()).unwrap_or("");
                let Some(ring) = rings.get(stream) else { return self.refuse(sub, &bad("no such stream")) };
                let (first, next) = (ring.first_seq(), ring.next_seq);
                if let Some(e) = want_epoch {
                    if e != epoch {
                        let msg = format!(
                            "epoch {e} is not this Slipstream run's epoch {epoch} (the daemon restarted; \
                             the old run's results are gone)"
                        );
                        return self.refuse_line(sub, error_line("epoch", &msg, Some((first, next)), Some(epoch)));
                    }
                }
                let start = match from {
                    Start::Seq(s) => s,
                    Start::Earliest => first,
                    Start::Latest => next,
                };
                if start > next {
                    let msg = format!("stream {name:?}: seq {start} is beyond the next seq {next}");
                    return self.refuse_line(sub, error_line("out_of_range", &msg, Some((first, next)), None));
                }
                if start < first && !matches!(until, Some(u) if u <= start) {
                    let msg = format!(
                        "stream {name:?}: seq {start} is no longer retained (first retained {first}, next {next}; \
                         retention is {RETAIN_BYTES_MAX} bytes per stream)"
                    );
                    return self.refuse_line(sub, error_line("data_loss", &msg, Some((first, next)), None));
                }
                let until = until.unwrap_or(u64::MAX);
                let mut wants = vec![false; nstreams];
                if let Some(w) = wants.get_mut(stream) {
                    *w = true;
                }
                let mut hello = Vec::new();
                self.info_line("hello", rings, epoch, &mut hello);
                sub.out.extend_from_slice(&hello);
                self.activate(sub, wants, Mode::Replay { stream, next: start, until });
                Fate::Keep
            }
            Err(r) => self.refuse(sub, &r),
        }
    }

    fn remove(&self, subs: &mut [Option<Sub>], i: usize) {
        let Some(slot) = subs.get_mut(i) else { return };
        if let Some(mut sub) = slot.take() {
            let _ = self.poll.registry().deregister(&mut sub.sock);
            // Only an activated subscriber counted itself in (Closing ones have all-false wants
            // unless they were active, in which case they are still counted).
            if !matches!(sub.state, State::Pending { .. }) {
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

    fn read_sub(&self, sub: &mut Sub, rings: &[Ring], epoch: &str) -> Fate {
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
                        return self.handle(sub, l.get(..end).unwrap_or(&[]), rings, epoch);
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
                continue; // active or closing: input is discarded
            };
            let room = SUBSCRIBE_LINE_BYTES_MAX.saturating_sub(line.len());
            let take = data.len().min(room);
            line.extend_from_slice(data.get(..take).unwrap_or(&[]));
            let Some(nl) = line.iter().position(|&b| b == b'\n') else {
                if line.len() >= SUBSCRIBE_LINE_BYTES_MAX {
                    return self.refuse(sub, &bad("SUBSCRIBE line longer than 4096 bytes"));
                }
                continue;
            };
            let l = std::mem::take(line);
            if let Fate::Remove = self.handle(sub, l.get(..nl).unwrap_or(&[]), rings, epoch) {
                return Fate::Remove;
            }
        }
    }

    fn refuse(&self, sub: &mut Sub, r: &Refusal) -> Fate {
        self.refuse_line(sub, error_line(r.code, &r.msg, None, None))
    }

    /// Sends one error line (best effort) and asks for removal.
    fn refuse_line(&self, sub: &mut Sub, line: Vec<u8>) -> Fate {
        // Drain unread input first so closing sends FIN, not RST (which could discard the line).
        drain_input(sub);
        let _ = sub.sock.write(&line);
        Fate::Remove
    }
}

fn drain_input(sub: &mut Sub) {
    let mut buf = [0u8; READ_CHUNK_BYTES];
    for _ in 0..64 {
        match sub.sock.read(&mut buf) {
            Ok(n) if n > 0 => {}
            _ => break,
        }
    }
}

/// `{"stream":"*","type":"error","code":C,"error":M[,"first_seq":F,"next_seq":N][,"epoch":E]}`.
fn error_line(code: &str, msg: &str, range: Option<(u64, u64)>, epoch: Option<&str>) -> Vec<u8> {
    let mut line = Vec::new();
    line.extend_from_slice(b"{\"stream\":\"*\",\"type\":\"error\",\"code\":");
    json::push_str(&mut line, code);
    json::push_key(&mut line, "error");
    json::push_str(&mut line, msg);
    if let Some((first, next)) = range {
        json::push_key(&mut line, "first_seq");
        json::push_u64(&mut line, first);
        json::push_key(&mut line, "next_seq");
        json::push_u64(&mut line, next);
    }
    if let Some(e) = epoch {
        json::push_key(&mut line, "epoch");
        json::push_str(&mut line, e);
    }
    line.extend_from_slice(b"}\n");
    line
}

/// A request line (without `\n`) → what to do. See the module comment for the grammar.
pub(crate) fn parse_request(line: &[u8], names: &[&str]) -> Result<Request, Refusal> {
    let text = std::str::from_utf8(line).map_err(|_| bad("SUBSCRIBE line is not UTF-8"))?;
    let text = text.trim();
    if text == "INFO" {
        return Ok(Request::Info);
    }
    // `FROM` turns the request into a replay of one stream; names may contain spaces, so the
    // keyword is found as a whole word.
    let pos = text
        .match_indices(" FROM")
        .map(|(i, _)| i)
        .find(|&i| text.get(i + 5..).is_some_and(|r| r.is_empty() || r.starts_with([' ', '\t'])));
    let Some(pos) = pos else {
        return parse_subscribe(line, names).map(Request::Live).map_err(|msg| {
            let code = if msg.starts_with("unknown stream") { "unknown_stream" } else { "bad_request" };
            Refusal { code, msg }
        });
    };
    let (head, tail) = text.split_at(pos);
    let name = head
        .strip_prefix("SUBSCRIBE")
        .filter(|r| r.starts_with([' ', '\t']))
        .ok_or_else(|| bad("expected SUBSCRIBE name FROM seq [UNTIL seq] [EPOCH e]"))?
        .trim();
    if name.is_empty() || name == "*" || name.contains(',') {
        return Err(bad("SUBSCRIBE … FROM takes exactly one stream name"));
    }
    let stream = names
        .iter()
        .position(|n| *n == name)
        .ok_or_else(|| Refusal { code: "unknown_stream", msg: format!("unknown stream {name:?}") })?;
    let mut words = tail.split_whitespace();
    let mut from = None;
    let mut until = None;
    let mut epoch = None;
    // At most three keyword/value pairs; a bounded loop over the words.
    for _ in 0..4 {
        let Some(kw) = words.next() else { break };
        let val = words.next().ok_or_else(|| bad(format!("{kw} needs a value")))?;
        let seq = || val.parse::<u64>().map_err(|_| bad(format!("{kw} {val:?}: expected a sequence number")));
        match kw {
            "FROM" if from.is_none() => {
                from = Some(match val {
                    "EARLIEST" => Start::Earliest,
                    "LATEST" => Start::Latest,
                    _ => Start::Seq(seq()?),
                })
            }
            "UNTIL" if until.is_none() => until = Some(seq()?),
            "EPOCH" if epoch.is_none() => {
                if val.is_empty() || val.len() > 64 || !val.bytes().all(|b| b.is_ascii_alphanumeric()) {
                    return Err(bad(format!("EPOCH {val:?}: expected the id from INFO")));
                }
                epoch = Some(val.to_string())
            }
            _ => return Err(bad(format!("unexpected {kw:?}: expected FROM, UNTIL or EPOCH once each"))),
        }
    }
    if words.next().is_some() {
        return Err(bad("trailing words after SUBSCRIBE … FROM"));
    }
    let from = from.ok_or_else(|| bad("FROM needs a value"))?;
    if let (Start::Seq(f), Some(u)) = (from, until) {
        if u < f {
            return Err(bad(format!("UNTIL {u} is before FROM {f}")));
        }
    }
    Ok(Request::Replay { stream, from, until, epoch })
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
        if !sub.live() || !sub.wants.get(idx).copied().unwrap_or(false) {
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
        let now = clock_monotonic_ns();
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

    #[test]
    fn request_lines() {
        let names = ["a", "b c"];
        assert_eq!(parse_request(b"INFO", &names), Ok(Request::Info));
        assert_eq!(parse_request(b"SUBSCRIBE b c", &names), Ok(Request::Live(vec![false, true])));
        assert_eq!(
            parse_request(b"SUBSCRIBE b c FROM 12 UNTIL 20 EPOCH 00ff\r", &names),
            Ok(Request::Replay { stream: 1, from: Start::Seq(12), until: Some(20), epoch: Some("00ff".into()) })
        );
        assert_eq!(
            parse_request(b"SUBSCRIBE a FROM EARLIEST", &names),
            Ok(Request::Replay { stream: 0, from: Start::Earliest, until: None, epoch: None })
        );
        assert_eq!(
            parse_request(b"SUBSCRIBE a FROM LATEST", &names),
            Ok(Request::Replay { stream: 0, from: Start::Latest, until: None, epoch: None })
        );
        assert_eq!(parse_request(b"SUBSCRIBE x FROM 1", &names).unwrap_err().code, "unknown_stream");
        assert_eq!(parse_request(b"SUBSCRIBE x", &names).unwrap_err().code, "unknown_stream");
        for bad_line in [
            &b"SUBSCRIBE a,b c FROM 1"[..],
            b"SUBSCRIBE * FROM 1",
            b"SUBSCRIBE a FROM",
            b"SUBSCRIBE a FROM x",
            b"SUBSCRIBE a FROM 5 UNTIL 4",
            b"SUBSCRIBE a FROM 1 FROM 2",
            b"SUBSCRIBE a FROM 1 UNTIL 2 EPOCH e x",
            b"SUBSCRIBE a FROM 1 EPOCH a-b",
            b"SUBSCRIBE a FROM 1 LIMIT 3",
        ] {
            let r = parse_request(bad_line, &names);
            assert_eq!(r.as_ref().map_err(|e| e.code), Err("bad_request"), "{:?}", String::from_utf8_lossy(bad_line));
        }
    }

    fn lines(n: std::ops::Range<u64>, pad: usize) -> Vec<u8> {
        let mut o = Vec::new();
        for i in n {
            o.extend_from_slice(format!("{{\"stream\":\"s\",\"i\":{i},\"p\":\"{}\"}}\n", "x".repeat(pad)).as_bytes());
        }
        o
    }

    fn seqs(b: &[u8]) -> Vec<u64> {
        let t = std::str::from_utf8(b).unwrap();
        t.lines()
            .map(|l| {
                let (seq, rest) = l.strip_prefix("{\"seq\":").unwrap().split_once(',').unwrap();
                assert!(rest.starts_with("\"stream\":\"s\""), "{l}");
                seq.parse().unwrap()
            })
            .collect()
    }

    #[test]
    fn ring_stamps_retains_and_replays_ranges() {
        let mut r = Ring::default();
        let mut live = Vec::new();
        r.append(&lines(0..10, 0), &mut live);
        assert_eq!(seqs(&live), (0..10).collect::<Vec<_>>());
        let first = std::str::from_utf8(&live).unwrap().lines().next().unwrap().to_string();
        assert_eq!(first, "{\"seq\":0,\"stream\":\"s\",\"i\":0,\"p\":\"\"}");
        r.skip(2); // two lines lost before the hub: seqs 10 and 11 never exist
        live.clear();
        r.append(&lines(0..3, 0), &mut live);
        assert_eq!(seqs(&live), vec![12, 13, 14]);
        let mut o = Vec::new();
        assert_eq!(r.copy(3, 13, &mut o, usize::MAX), 13);
        assert_eq!(seqs(&o), vec![3, 4, 5, 6, 7, 8, 9, 12]);
        o.clear();
        assert_eq!(r.copy(10, u64::MAX, &mut o, usize::MAX), 15);
        assert_eq!(seqs(&o), vec![12, 13, 14]);
        // A budget smaller than one line still yields that line, then stops.
        o.clear();
        assert_eq!(r.copy(0, 15, &mut o, 1), 1);
        assert_eq!(seqs(&o), vec![0]);
        assert_eq!(r.copy(15, u64::MAX, &mut o, usize::MAX), 15);
    }

    #[test]
    fn ring_evicts_oldest_beyond_the_byte_limit() {
        let mut r = Ring::default();
        let mut live = Vec::new();
        // ~1 KiB lines, 40 MiB in all: far beyond RETAIN_BYTES_MAX.
        for k in 0..40u64 {
            live.clear();
            r.append(&lines(k * 1024..(k + 1) * 1024, 1000), &mut live);
        }
        assert_eq!(r.next_seq, 40 * 1024);
        assert!(r.bytes <= RETAIN_BYTES_MAX + RETAIN_CHUNK_BYTES + 2048, "{}", r.bytes);
        assert!(r.bytes >= RETAIN_BYTES_MAX - RETAIN_CHUNK_BYTES - 2048, "{}", r.bytes);
        let first = r.first_seq();
        assert!(first > 0);
        let mut o = Vec::new();
        assert_eq!(r.copy(0, u64::MAX, &mut o, usize::MAX), r.next_seq);
        assert_eq!(seqs(&o), (first..r.next_seq).collect::<Vec<_>>());
    }
}
