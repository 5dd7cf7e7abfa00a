//! TCP load: many non-blocking connections per thread on one mio poll, each running a
//! closed loop of pipelined batches (write `pipeline` requests at once, read every reply,
//! repeat). Not the open-loop / rate-limited generator (tcp_rate.rs).

use std::io::{self, Read, Write};
use std::net::TcpStream as StdTcpStream;
use std::time::{Duration, Instant};

use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};

use crate::hist::Histogram;
use crate::wire::{parse_reply, Op, Outcome, Reply, Templates};
use crate::{Config, Counts, Rng, ThreadResult, Window};

struct Conn {
    stream: TcpStream,
    alive: bool,
    out: Vec<u8>,
    out_pos: usize,
    inbuf: Box<[u8]>,
    in_start: usize,
    in_end: usize,
    /// (op, key) of each request of the current batch, in order.
    batch: Vec<(Op, u32)>,
    /// Index in `batch` of the next reply expected.
    next: usize,
    batch_sent: Instant,
    rng: Rng,
}

/// Unanswered this long at the end of the run, a connection counts as stalled.
const STALL_AFTER: Duration = Duration::from_secs(1);

/// Everything a worker thread shares across its connections.
struct Shared<'a> {
    cfg: &'a Config,
    templates: &'a Templates,
    value: &'a [u8],
    window: Window,
    hist: Histogram,
    counts: Counts,
}

impl Shared<'_> {
    #[inline]
    fn in_window(&self, now: Instant) -> bool {
        now >= self.window.start && now < self.window.end
    }
}

impl Conn {
    fn new(stream: StdTcpStream, cfg: &Config, seed: u64) -> io::Result<Conn> {
        stream.set_nodelay(true)?;
        stream.set_nonblocking(true)?;
        // Room for a whole batch of the largest expected reply, so one reply always fits.
        let reply_max = cfg.value_bytes + 64;
        let in_cap = (cfg.pipeline * reply_max * 2).max(64 * 1024);
        Ok(Conn {
            stream: TcpStream::from_std(stream),
            alive: true,
            out: Vec::with_capacity(cfg.pipeline * (cfg.value_bytes + 48)),
            out_pos: 0,
            inbuf: vec![0u8; in_cap].into_boxed_slice(),
            in_start: 0,
            in_end: 0,
            batch: Vec::with_capacity(cfg.pipeline),
            next: 0,
            batch_sent: Instant::now(),
            rng: Rng::with_seed(seed),
        })
    }

    /// The connection is broken or out of sync: every reply still owed is an error.
    fn fail(&mut self, sh: &mut Shared) {
        if self.alive {
            self.alive = false;
            sh.counts.conn_failures += 1;
            sh.counts.errors += (self.batch.len() - self.next) as u64;
            self.next = self.batch.len();
        }
    }

    fn start_batch(&mut self, sh: &mut Shared) {
        self.out.clear();
        self.out_pos = 0;
        self.batch.clear();
        self.next = 0;
        let cfg = sh.cfg;
        let ratio_sum = u64::from(cfg.ratio_set) + u64::from(cfg.ratio_get);
        for _ in 0..cfg.pipeline {
            let op = if self.rng.u64(..ratio_sum.max(1)) < u64::from(cfg.ratio_set) { Op::Set } else { Op::Get };
            let key = self.rng.u32(..cfg.keys.max(1));
            sh.templates.append(&mut self.out, op, key);
            self.batch.push((op, key));
        }
        self.batch_sent = Instant::now();
        self.flush(sh);
    }

    fn flush(&mut self, sh: &mut Shared) {
        while self.alive && self.out_pos < self.out.len() {
            match self.stream.write(&self.out[self.out_pos..]) {
                Ok(0) => self.fail(sh),
                Ok(n) => {
                    self.out_pos += n;
                    if sh.in_window(Instant::now()) {
                        sh.counts.writes += 1;
                        sh.counts.tx_bytes += n as u64;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => self.fail(sh),
            }
        }
    }

    /// Drain the socket (edge-triggered), account every complete reply, and start the
    /// next batch whenever the current one is fully answered.
    fn on_readable(&mut self, sh: &mut Shared, stopping: bool) {
        while self.alive {
            if self.in_end == self.inbuf.len() {
                // Move the unparsed tail to the front to make room.
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
                    if sh.in_window(now) {
                        sh.counts.reads += 1;
                        sh.counts.rx_bytes += n as u64;
                    }
                    self.parse(sh, now);
                    if self.alive && self.next == self.batch.len() {
                        if self.in_start < self.in_end {
                            // Bytes nobody asked for: the server answered more than we sent.
                            sh.counts.errors += 1;
                            self.fail(sh);
                            return;
                        }
                        self.in_start = 0;
                        self.in_end = 0;
                        if sh.in_window(now) {
                            sh.counts.batches += 1;
                        }
                        if stopping {
                            return;
                        }
                        self.start_batch(sh);
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
        let measuring = sh.in_window(now);
        let latency_ns = now.saturating_duration_since(self.batch_sent).as_nanos() as u64;
        while let Some(&(op, key)) = self.batch.get(self.next) {
            let buf = &self.inbuf[self.in_start..self.in_end];
            match parse_reply(buf, op, key, sh.value) {
                Reply::Incomplete => return,
                Reply::Desync => {
                    self.fail(sh);
                    return;
                }
                Reply::Done { outcome, consumed } => {
                    self.in_start += consumed;
                    self.next += 1;
                    if measuring {
                        sh.hist.record(latency_ns);
                        sh.counts.record(op, outcome);
                    } else if outcome == Outcome::Error {
                        // Errors outside the window still matter: never drop them.
                        sh.counts.errors_outside_window += 1;
                    }
                }
            }
        }
    }
}

/// Run one worker thread over its share of connections until the window ends.
pub fn run_thread(cfg: &Config, streams: Vec<StdTcpStream>, seed: u64, window: Window) -> io::Result<ThreadResult> {
    let value = crate::wire::value_pattern(cfg.value_bytes);
    let templates = Templates::new(&value);
    let mut sh =
        Shared { cfg, templates: &templates, value: &value, window, hist: Histogram::new(), counts: Counts::default() };
    let poll_timeout = Duration::from_millis(5);
    let mut poll = Poll::new()?;
    let mut conns = Vec::with_capacity(streams.len());
    for (i, s) in streams.into_iter().enumerate() {
        let mut c = Conn::new(s, cfg, seed ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))?;
        poll.registry().register(&mut c.stream, Token(i), Interest::READABLE | Interest::WRITABLE)?;
        conns.push(c);
    }
    for c in conns.iter_mut() {
        c.start_batch(&mut sh);
    }
    let mut events = Events::with_capacity(1024);
    loop {
        let now = Instant::now();
        if now >= window.end {
            break;
        }
        match poll.poll(&mut events, Some(poll_timeout)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        let stopping = Instant::now() >= window.end;
        for ev in events.iter() {
            let Some(c) = conns.get_mut(ev.token().0) else { continue };
            if ev.is_writable() {
                c.flush(&mut sh);
            }
            if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                c.on_readable(&mut sh, stopping);
            }
        }
        if conns.iter().all(|c| !c.alive) {
            break;
        }
    }
    // A connection still waiting on replies long after its batch went out has lost a reply
    // (a server bug, e.g. a pipelined request dropped): lower throughput alone would hide it.
    let now = Instant::now();
    for c in conns.iter() {
        if c.alive && c.next < c.batch.len() && now.saturating_duration_since(c.batch_sent) >= STALL_AFTER {
            sh.counts.stalled_conns += 1;
        }
    }
    Ok(ThreadResult { hist: sh.hist, counts: sh.counts })
}

/// Set every key once over one blocking connection (pipelined), so later gets hit.
/// Returns the number of unexpected replies.
pub fn prefill(cfg: &Config, addr: std::net::SocketAddr) -> io::Result<u64> {
    let value = crate::wire::value_pattern(cfg.value_bytes);
    let templates = Templates::new(&value);
    let mut s = StdTcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    const BATCH: u32 = 100;
    let mut out = Vec::new();
    let mut inbuf = vec![0u8; 64 * 1024];
    let mut errors = 0u64;
    let mut first = 0u32;
    while first < cfg.keys {
        let last = first.saturating_add(BATCH).min(cfg.keys);
        out.clear();
        for k in first..last {
            templates.append(&mut out, Op::Set, k);
        }
        s.write_all(&out)?;
        let (mut start, mut end) = (0usize, 0usize);
        let mut k = first;
        while k < last {
            match parse_reply(&inbuf[start..end], Op::Set, k, &value) {
                Reply::Done { outcome, consumed } => {
                    if outcome != Outcome::Stored {
                        errors += 1;
                    }
                    start += consumed;
                    k += 1;
                }
                Reply::Desync => return Err(io::Error::other("prefill: reply stream out of sync")),
                Reply::Incomplete => {
                    inbuf.copy_within(start..end, 0);
                    end -= start;
                    start = 0;
                    let n = s.read(&mut inbuf[end..])?;
                    if n == 0 {
                        return Err(io::Error::other("prefill: server closed the connection"));
                    }
                    end += n;
                }
            }
        }
        first = last;
    }
    Ok(errors)
}
