//! A TCP connection's buffers: the read buffer (grown for one large request within the
//! connection-buffer budget, shrunk back when drained) and the reply buffer (written with one
//! `write`/`writev` per batch, values sent by reference spliced in by `outq`).
//!
//! What it is for: the read and flush steps of a round, and the buffer bookkeeping around them.
//! What it is not for: deciding how much may be read (the gate), running requests (tcp.rs).

use super::gate::ConnGate;
use crate::bufbudget::{BufBudget, REPLY_BYTES_FREE};
use crate::exec::{ConnState, Protocol, Settings, Transport};
use crate::outq;
use crate::stats::ThreadStats;
use crate::transport::Stream;
use crate::watch::{CloseReason, Peer};
use std::io::{self, Read};
use std::sync::Arc;

/// Read buffer a connection starts with (and shrinks back to when idle).
pub const READ_BUF_BYTES_INITIAL: usize = 16 * 1024;
/// Once this many reply bytes are waiting for the socket, stop executing requests from this
/// connection until the client reads (back-pressure instead of unbounded output).
pub const WRITE_BUF_BYTES_HIGH: usize = 4 * 1024 * 1024;

pub(super) struct Conn {
    /// Plain TCP, unix (`-s`) or TLS (`-Z`).
    pub stream: Stream,
    pub rbuf: Vec<u8>,
    /// Unconsumed input is rbuf[rstart..rend].
    pub rstart: usize,
    pub rend: usize,
    pub wbuf: Vec<u8>,
    /// Bytes of wbuf already written.
    pub wstart: usize,
    /// Bytes of the connection-buffer budget `rbuf` holds beyond `READ_BUF_BYTES_INITIAL`
    /// (the replies' share is `state.reply_charged_bytes`).
    pub rbuf_charged: usize,
    /// `rbuf` is full with one incomplete request at its front: the next read may grow it.
    /// (A full buffer that still holds complete requests is executed first, not grown.)
    pub needs_grow: bool,
    /// The budget refused to grow `rbuf` for the request at its front: the executor refuses
    /// that request the way memcached refuses one it cannot allocate for.
    pub grow_refused: bool,
    pub state: ConnState,
    /// Waiting for the socket to drain (write interest registered).
    pub blocked_on_write: bool,
    pub close_after_flush: bool,
    /// Why it closes, for watchers' `conn_close` line: `error` unless a quit, the client's
    /// end of stream or `shutdown` says otherwise (memcached's default close reason).
    pub close_reason: CloseReason,
    /// Its round budget ran out with work left; the worker comes back to it after this poll.
    pub needs_revisit: bool,
    /// Key in `ServerInfo::conns` (the socket's fd, as memcached numbers connections).
    pub fd: i32,
    /// When this connection last sent requests (shared with its `stats conns` entry).
    pub last_cmd: Arc<crate::stats::LastCmd>,
    /// Its tenant's shaping state (unused without a shaper).
    pub gate: ConnGate,
    /// Who is on the other end, as `watch connevents` lines name it.
    pub peer: Peer,
    /// Replicated tenants only (see `crate::replicated`).
    pub repl: ReplConn,
}

/// A connection's state toward its tenant's replication group.
#[derive(Default)]
pub(super) struct ReplConn {
    /// Nothing more is read or executed until the requests in flight answer (a request that
    /// must wait for them is at the front, a read barrier is out, or the per-connection cap
    /// is reached).
    pub parked: bool,
    /// Identity for outcomes (0 until the connection first proposes).
    pub serial: u64,
    /// Requests proposed (or barriers asked) and not yet answered to the client, oldest
    /// first: replies leave in request order (at most `CONN_INFLIGHT_MAX`).
    pub inflight: std::collections::VecDeque<InFlight>,
    /// Sequence number of the next request put in flight.
    pub next_seq: u64,
    /// Bytes at the front of the input a finished read barrier covers (they arrived before it
    /// was asked for, so reading them locally now is linearizable).
    pub covered_bytes: usize,
}

/// One request of a connection in flight to its tenant's group.
pub(super) struct InFlight {
    pub seq: u64,
    /// The request's protocol and first bytes, to answer a failure in kind.
    pub protocol: u8,
    pub head: Vec<u8>,
    /// A read barrier for the read of this many bytes at the front of the input (0: a write).
    pub read_bytes: usize,
    /// A write whose apply may ask to swallow input: nothing is proposed behind it.
    pub alone: bool,
    /// Arrived, waiting for the ones before it.
    pub outcome: Option<crate::replicated::Outcome>,
}

/// What a round's reads found.
#[derive(Default)]
pub(super) struct ReadEnd {
    pub bytes: u64,
    /// The peer closed its side.
    pub eof: bool,
    /// The socket may still hold unread bytes (the buffer or the budget filled first).
    pub more: bool,
    /// The socket failed: close.
    pub failed: bool,
}

impl Conn {
    pub fn new(stream: Stream, fd: i32, last_cmd: Arc<crate::stats::LastCmd>, peer: Peer) -> Conn {
        let mut state = ConnState::new(Transport::Tcp);
        state.conn_id = fd;
        Conn {
            stream,
            rbuf: vec![0u8; READ_BUF_BYTES_INITIAL],
            rstart: 0,
            rend: 0,
            wbuf: Vec::with_capacity(READ_BUF_BYTES_INITIAL),
            wstart: 0,
            rbuf_charged: 0,
            needs_grow: false,
            grow_refused: false,
            state,
            blocked_on_write: false,
            close_after_flush: false,
            close_reason: CloseReason::Error,
            needs_revisit: false,
            fd,
            last_cmd,
            gate: ConnGate::default(),
            peer,
            repl: ReplConn::default(),
        }
    }

    /// The read step: read what the socket has, up to `budget` bytes. A short read means the
    /// socket had no more; the edge-triggered poll reports any later arrival, so the extra read
    /// that would only return EAGAIN is skipped — unless the peer has closed (`peer_closed`),
    /// then it reads on to the end-of-file.
    pub fn read_round(
        &mut self,
        budget: usize,
        read_buf_bytes_max: usize,
        conn_buf: &BufBudget,
        peer_closed: bool,
        stats: &ThreadStats,
    ) -> ReadEnd {
        let mut end = ReadEnd::default();
        loop {
            if self.rend == self.rbuf.len() && !self.make_room(read_buf_bytes_max, conn_buf) {
                end.more = true;
                break;
            }
            let left = budget - end.bytes as usize;
            if left == 0 {
                end.more = true;
                break;
            }
            let space = (self.rbuf.len() - self.rend).min(left);
            match self.stream.read(&mut self.rbuf[self.rend..self.rend + space]) {
                Ok(0) => {
                    end.eof = true;
                    break;
                }
                Ok(n) => {
                    self.rend += n;
                    end.bytes += n as u64;
                    ThreadStats::add(&stats.bytes_read, n as u64);
                    ThreadStats::incr(&stats.reads);
                    if n < space && !peer_closed {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    end.failed = true;
                    break;
                }
            }
        }
        end
    }

    /// The read buffer is full: move the unconsumed input to the front, or grow the buffer for
    /// the one incomplete request it holds. False: nothing more may be read now (execute what
    /// is there first, or the budget or the bound refused).
    fn make_room(&mut self, read_buf_bytes_max: usize, conn_buf: &BufBudget) -> bool {
        if self.rstart > 0 {
            self.rbuf.copy_within(self.rstart..self.rend, 0);
            self.rend -= self.rstart;
            self.rstart = 0;
            return true;
        }
        if !self.needs_grow {
            // Execute what the buffer holds before deciding it must grow.
            return false;
        }
        // A get line may outgrow the bound for other requests: memcached buffers it whatever
        // its length; the budget bounds it here.
        if self.rbuf.len() >= read_buf_bytes_max && !self.long_get_line() {
            return false;
        }
        let len = self.rbuf.len();
        let new_len = if len < read_buf_bytes_max { (len * 2).min(read_buf_bytes_max) } else { len * 2 };
        if !conn_buf.try_charge(new_len - len) {
            self.grow_refused = true;
            return false;
        }
        self.rbuf_charged += new_len - len;
        self.rbuf.resize(new_len, 0);
        self.needs_grow = false;
        true
    }

    /// After a batch: an empty buffer starts over at the front, and gives back the memory a
    /// large request needed.
    pub fn settle_read_buf(&mut self, conn_buf: &BufBudget) {
        if self.rstart != self.rend {
            return;
        }
        self.rstart = 0;
        self.rend = 0;
        if self.rbuf.len() > READ_BUF_BYTES_INITIAL {
            self.rbuf.truncate(READ_BUF_BYTES_INITIAL);
            self.rbuf.shrink_to_fit();
            conn_buf.release(std::mem::take(&mut self.rbuf_charged));
        }
    }

    /// Whether the unconsumed input is the start of a text `get`/`gets` line still waiting for
    /// its newline (memcached buffers those whatever their length).
    pub fn long_get_line(&self) -> bool {
        let input = &self.rbuf[self.rstart..self.rend];
        self.state.protocol == Protocol::Text
            && self.state.swallow_bytes == 0
            && !input.contains(&b'\n')
            && slipstream_proto::text::is_multiget_start(input)
    }

    /// The flush step: write pending replies. Ok(true) = all written (then the buffer is back
    /// within its free size and its budget charge is given back).
    pub fn flush(&mut self, stats: &ThreadStats, settings: &Settings) -> io::Result<bool> {
        let done = outq::write_pending(&mut self.stream, &self.wbuf, &mut self.wstart, &mut self.state.shared, |n| {
            ThreadStats::add(&stats.bytes_written, n as u64);
            ThreadStats::incr(&stats.writes);
        })?;
        // [sec hook] TLS records still held count as unwritten (no-op for plain sockets).
        if !done || !self.stream.drain()? {
            return Ok(false);
        }
        self.wbuf.clear();
        self.wstart = 0;
        if self.wbuf.capacity() > REPLY_BYTES_FREE {
            self.wbuf.shrink_to(READ_BUF_BYTES_INITIAL);
        }
        settings.conn_buf.release(std::mem::take(&mut self.state.reply_charged_bytes));
        Ok(true)
    }

    /// Budget bytes this connection's buffers hold (given back when it closes).
    pub fn charged_bytes(&self) -> usize {
        self.rbuf_charged + self.state.reply_charged_bytes
    }
}
