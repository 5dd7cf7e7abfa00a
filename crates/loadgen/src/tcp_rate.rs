//! TCP open-loop load (`--rate-per-s`): requests leave at their scheduled times (see
//! pace.rs), whatever the server's speed, with at most `--pipeline` requests in flight per
//! connection. A request due while its connection's window is full waits client-side (it
//! is counted `behind`, and its latency still starts at its scheduled time); more than
//! `--backlog-max` due requests on one connection and the oldest are shed (`dropped`, never
//! sent). Not the closed-loop generator (tcp.rs).

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::TcpStream as StdTcpStream;
use std::time::{Duration, Instant};

use mio::net::TcpStream;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};

use crate::hist::Histogram;
use crate::pace::{Pacer, Timer};
use crate::wire::{parse_reply, Op, Outcome, Reply, Templates};
use crate::{Config, Counts, Rng, ThreadResult, Window};

/// Unanswered this long at the end of the run, a connection counts as stalled.
const STALL_AFTER: Duration = Duration::from_secs(1);
/// Longest single sleep in the event loop (the timer normally wakes it sooner).
const POLL_MAX: Duration = Duration::from_millis(5);
const TIMER_TOKEN: Token = Token(usize::MAX);

struct InFlight {
    op: Op,
    key: u32,
    scheduled: Instant,
    sent: Instant,
}

struct Conn {
    stream: TcpStream,
    alive: bool,
    out: Vec<u8>,
    out_pos: usize,
    inbuf: Box<[u8]>,
    in_start: usize,
    in_end: usize,
    inflight: VecDeque<InFlight>,
    pacer: Pacer,
    /// Requests scheduled at or before this instant found the window full when due.
    behind_until: Option<Instant>,
    rng: Rng,
}

struct Shared<'a> {
    cfg: &'a Config,
    templates: &'a Templates,
    value: &'a [u8],
    window: Window,
    hist: Histogram,
    counts: Counts,
}

impl Conn {
    fn fail(&mut self, sh: &mut Shared) {
        if self.alive {
            self.alive = false;
            sh.counts.conn_failures += 1;
            sh.counts.errors += self.inflight.len() as u64;
            self.inflight.clear();
        }
    }

    /// Queue every request that is due and fits the window, then write.
    fn issue(&mut self, now: Instant, sh: &mut Shared) {
        if !self.alive || now >= sh.window.end {
            return;
        }
        let shed = self.pacer.shed(now);
        if shed > 0 && sh.window.contains(now) {
            sh.counts.dropped += shed;
        }
        let cap = sh.cfg.pipeline;
        let due = self.pacer.due_count(now);
        let room = cap.saturating_sub(self.inflight.len()) as u64;
        let n = due.min(room);
        if n > 0 && self.out_pos > 0 {
            // Keep only the unsent tail, so the buffer stays within one window of requests.
            self.out.drain(..self.out_pos.min(self.out.len()));
            self.out_pos = 0;
        }
        let cfg = sh.cfg;
        let ratio_sum = u64::from(cfg.ratio_set) + u64::from(cfg.ratio_get);
        for _ in 0..n {
            let scheduled = self.pacer.take();
            let op = if self.rng.u64(..ratio_sum.max(1)) < u64::from(cfg.ratio_set) { Op::Set } else { Op::Get };
            let key = self.rng.u32(..cfg.keys.max(1));
            sh.templates.append(&mut self.out, op, key);
            if sh.window.contains(scheduled) {
                sh.counts.sent += 1;
                if self.behind_until.is_some_and(|b| scheduled <= b) {
                    sh.counts.behind += 1;
                }
            }
            self.inflight.push_back(InFlight { op, key, scheduled, sent: now });
        }
        let still_due = due - n;
        if still_due > 0 {
            // The window is full: these wait for replies before they can go.
            let last = self.pacer.due_at_ahead(still_due - 1);
            self.behind_until = Some(self.behind_until.map_or(last, |b| b.max(last)));
            sh.counts.backlog_peak = sh.counts.backlog_peak.max(still_due);
        }
        if n > 0 {
            self.flush(sh);
        }
    }

    fn flush(&mut self, sh: &mut Shared) {
        while self.alive && self.out_pos < self.out.len() {
            match self.stream.write(&self.out[self.out_pos..]) {
                Ok(0) => self.fail(sh),
                Ok(n) => {
                    self.out_pos += n;
                    if sh.window.contains(Instant::now()) {
                        sh.counts.writes += 1;
                        sh.counts.tx_bytes += n as u64;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => self.fail(sh),
            }
        }
        if self.out_pos == self.out.len() {
            self.out.clear();
            self.out_pos = 0;
        }
    }

    fn on_readable(&mut self, sh: &mut Shared) {
        while self.alive {
            if self.in_end == self.inbuf.len() {
                self.inbuf.copy_within(self.in_start..self.in_end, 0);
                self.in_end -= self.in_start;
                self.in_start = 0;
                if self.in_end == self.inbuf.len() {
                    self.fail(sh); // a reply larger than our buffer: cannot be ours
                    return;
                }
            }
            match self.stream.read(&mut self.inbuf[self.in_end..]) {
                Ok(0) => {
                    self.fail(sh);
                    return;
                }
                Ok(n) => {
                    self.in_end += n;
                    let now = Instant::now();
                    if sh.window.contains(now) {
                        sh.counts.reads += 1;
                        sh.counts.rx_bytes += n as u64;
                    }
                    self.parse(sh, now);
                    if self.alive && self.inflight.is_empty() {
                        if self.in_start < self.in_end {
                            // Bytes nobody asked for: the server answered more than we sent.
                            sh.counts.errors += 1;
                            self.fail(sh);
                            return;
                        }
                        self.in_start = 0;
                        self.in_end = 0;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.fail(sh);
                    return;
                }
            }
        }
    }

    fn parse(&mut self, sh: &mut Shared, now: Instant) {
        let measuring = sh.window.contains(now);
        while let Some(front) = self.inflight.front() {
            let buf = &self.inbuf[self.in_start..self.in_end];
            match parse_reply(buf, front.op, front.key, sh.value) {
                Reply::Incomplete => return,
                Reply::Desync => {
                    self.fail(sh);
                    return;
                }
                Reply::Done { outcome, consumed } => {
                    self.in_start += consumed;
                    // Coordinated-omission-free: from when the request was due, not sent.
                    let latency_ns = now.saturating_duration_since(front.scheduled).as_nanos() as u64;
                    let op = front.op;
                    self.inflight.pop_front();
                    if measuring {
                        sh.hist.record(latency_ns);
                        sh.counts.record(op, outcome);
                    } else if outcome == Outcome::Error {
                        sh.counts.errors_outside_window += 1;
                    }
                }
            }
        }
    }
}

/// Run one worker thread's connections open-loop until the window ends.
/// `thread_index`: connection j of this thread is connection `j * threads + thread_index`
/// of the whole run (the order in which main.rs hands them out).
pub fn run_thread(
    cfg: &Config,
    rate_per_s: f64,
    streams: Vec<StdTcpStream>,
    seed: u64,
    window: Window,
    thread_index: usize,
) -> io::Result<ThreadResult> {
    let value = crate::wire::value_pattern(cfg.value_bytes);
    let templates = Templates::new(&value);
    let mut sh =
        Shared { cfg, templates: &templates, value: &value, window, hist: Histogram::new(), counts: Counts::default() };
    let mut poll = Poll::new()?;
    let timer = Timer::new()?;
    let timer_fd = timer.raw_fd();
    poll.registry().register(&mut SourceFd(&timer_fd), TIMER_TOKEN, Interest::READABLE)?;
    let mut conns = Vec::with_capacity(streams.len());
    let reply_max = cfg.value_bytes + 64;
    for (j, s) in streams.into_iter().enumerate() {
        s.set_nodelay(true)?;
        s.set_nonblocking(true)?;
        let global = (j * cfg.threads + thread_index) as u64;
        let mut c = Conn {
            stream: TcpStream::from_std(s),
            alive: true,
            out: Vec::with_capacity(cfg.pipeline * (cfg.value_bytes + 48)),
            out_pos: 0,
            inbuf: vec![0u8; (cfg.pipeline * reply_max * 2).max(64 * 1024)].into_boxed_slice(),
            in_start: 0,
            in_end: 0,
            inflight: VecDeque::with_capacity(cfg.pipeline),
            pacer: Pacer::new(window.load_start, rate_per_s, cfg.conns as u64, global, cfg.backlog_max),
            behind_until: None,
            rng: Rng::with_seed(seed ^ (j as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)),
        };
        poll.registry().register(&mut c.stream, Token(j), Interest::READABLE | Interest::WRITABLE)?;
        conns.push(c);
    }
    let mut events = Events::with_capacity(1024);
    loop {
        let now = Instant::now();
        if now >= window.end {
            break;
        }
        let mut wake = window.end;
        for c in conns.iter_mut() {
            c.issue(now, &mut sh);
            if c.alive && c.inflight.len() < cfg.pipeline {
                wake = wake.min(c.pacer.due_at());
            }
        }
        timer.arm(wake.saturating_duration_since(Instant::now()))?;
        match poll.poll(&mut events, Some(POLL_MAX)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        for ev in events.iter() {
            if ev.token() == TIMER_TOKEN {
                timer.clear();
                continue;
            }
            let Some(c) = conns.get_mut(ev.token().0) else { continue };
            if ev.is_writable() {
                c.flush(&mut sh);
            }
            if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                c.on_readable(&mut sh);
            }
        }
        if conns.iter().all(|c| !c.alive) {
            break;
        }
    }
    for c in conns.iter() {
        sh.counts.unsent += c.pacer.untaken_in(window.start, window.end);
    }
    let now = Instant::now();
    for c in conns.iter() {
        if c.alive && c.inflight.front().is_some_and(|f| now.saturating_duration_since(f.sent) >= STALL_AFTER) {
            sh.counts.stalled_conns += 1;
        }
    }
    Ok(ThreadResult { hist: sh.hist, counts: sh.counts })
}
