//! Raft messages between nodes over TCP: one connection per peer pair, length-prefixed
//! frames, every group's messages multiplexed on it.
//!
//! Not for: client requests, or deciding what to send (the node does). Raft tolerates lost
//! messages, so this layer never blocks the node: a full send queue or a missing connection
//! drops the message (counted) and Raft retries on its own schedule.
//!
//! Connection: the node with the lower id dials the higher one and introduces itself with
//! `MAGIC: u32`, `node_id: u64`; the acceptor keeps the newest connection per peer. The
//! dialer redials every `REDIAL_MS` while the connection is down. A node added by a membership
//! change joins the peer map at run time (`add_peer`, its address from the conf change). There is no authentication
//! yet: the raft port must only be reachable from the cluster's nodes (a host that can reach
//! it can impersonate a peer).
//! Frame: `len: u32 LE` (of what follows), `group: u64 LE`, protobuf `eraftpb::Message`.
//!
//! Threads: an acceptor (each hello read on a short-lived thread, at most `HANDSHAKES_MAX`),
//! a dialer per higher-id peer, and a reader plus a writer per live connection (blocking I/O on a handful of sockets; the raft core itself is the node's
//! single loop, so moving this to a mio loop later changes only this module).

use protobuf::Message as PbMessage;
use raft::eraftpb::Message;
use std::collections::BTreeMap;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

/// Largest frame accepted (a snapshot of a whole tenant travels as one message).
pub const FRAME_BYTES_MAX: usize = 256 << 20;
/// Messages queued per peer connection before new ones are dropped.
pub const SEND_QUEUE_FRAMES_MAX: usize = 4096;
const MAGIC: u32 = 0x534c_5250; // "SLRP"
const REDIAL_MS: u64 = 50;
const CONNECT_TIMEOUT_MS: u64 = 200;
/// How long an accepted connection may take to introduce itself.
const HELLO_TIMEOUT_MS: u64 = 1000;
/// Accepted connections that may be introducing themselves at once.
const HANDSHAKES_MAX: u64 = 16;

/// A raft message that arrived from `from` for group `group`.
pub struct Incoming {
    pub from: u64,
    pub group: u64,
    pub msg: Message,
    /// The frame's size on the wire (charged to the group's tenant).
    pub frame_bytes: u64,
}

/// Where received messages go; false = the receiver is gone (the reader stops). May block
/// (back-pressure on the connection).
pub type Deliver = Arc<dyn Fn(Incoming) -> bool + Send + Sync>;

/// Counters of the transport (what the metrics endpoint will report).
#[derive(Default, Debug)]
pub struct TransportStats {
    pub frames_sent: AtomicU64,
    pub frames_received: AtomicU64,
    /// Dropped because the peer was not connected or its queue was full.
    pub frames_dropped: AtomicU64,
    /// Frames that failed to decode (the connection is closed).
    pub frames_bad: AtomicU64,
    pub connects: AtomicU64,
}

struct Link {
    /// Generation of the current connection (to tell a stale reader's exit from a new link).
    generation: u64,
    out: Option<SyncSender<Vec<u8>>>,
    stream: Option<TcpStream>,
    /// Fault injection ([`Transport::mute_sends_to`]): frames for this peer are dropped.
    muted: bool,
}

struct Shared {
    node_id: u64,
    /// One per peer; grows when a membership change adds a node (`add_peer`).
    links: RwLock<BTreeMap<u64, Arc<Mutex<Link>>>>,
    stopped: AtomicBool,
    deliver: Deliver,
    stats: TransportStats,
}

/// The transport of one node (see the module doc). Dropping it closes every connection and
/// the listener.
pub struct Transport {
    shared: Arc<Shared>,
    listen: SocketAddr,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Transport {
    /// Listen on `listen` and connect to `peers` (id → address, self excluded); messages
    /// received are passed to `deliver` (blocking when it is full: back-pressure on TCP).
    pub fn start(
        node_id: u64,
        listen: SocketAddr,
        peers: &BTreeMap<u64, SocketAddr>,
        deliver: Deliver,
    ) -> io::Result<Transport> {
        let listener = TcpListener::bind(listen)?;
        let links = peers.keys().filter(|&&p| p != node_id).map(|&p| (p, new_link())).collect();
        let shared = Arc::new(Shared {
            node_id,
            links: RwLock::new(links),
            stopped: AtomicBool::new(false),
            deliver,
            stats: TransportStats::default(),
        });
        let mut threads = Vec::new();
        let s = shared.clone();
        threads.push(spawn("raft-accept", move || accept_loop(s, listener))?);
        for (&p, &addr) in peers.iter().filter(|(&p, _)| p > node_id) {
            let s = shared.clone();
            threads.push(spawn("raft-dial", move || dial_loop(s, p, addr))?);
        }
        Ok(Transport { shared, listen, threads: Mutex::new(threads) })
    }

    /// Learn a peer added by a membership change (its address came in the conf change): a
    /// link for it, dialed if its id is higher. A known peer is left as it is.
    pub fn add_peer(&self, peer: u64, addr: SocketAddr) {
        if peer == self.shared.node_id {
            return;
        }
        {
            let mut links = self.shared.links.write().unwrap_or_else(std::sync::PoisonError::into_inner);
            if links.contains_key(&peer) {
                return;
            }
            links.insert(peer, new_link());
        }
        if peer > self.shared.node_id {
            let s = self.shared.clone();
            if let Ok(t) = spawn("raft-dial", move || dial_loop(s, peer, addr)) {
                self.threads.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(t);
            }
        }
    }

    /// Queue `msg` of `group` for its destination; false if it was dropped.
    pub fn send(&self, group: u64, msg: &Message) -> bool {
        self.send_sized(group, msg).is_some()
    }

    /// [`Transport::send`], telling the frame's size on the wire when it was queued.
    pub fn send_sized(&self, group: u64, msg: &Message) -> Option<u64> {
        let st = &self.shared.stats;
        let Some(link) = self.shared.link(msg.to) else {
            st.frames_dropped.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        let Ok(body) = msg.write_to_bytes() else {
            st.frames_dropped.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        if body.len() + 8 > FRAME_BYTES_MAX {
            st.frames_dropped.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let frame_bytes = (12 + body.len()) as u64;
        let mut frame = Vec::with_capacity(12 + body.len());
        frame.extend_from_slice(&((body.len() + 8) as u32).to_le_bytes());
        frame.extend_from_slice(&group.to_le_bytes());
        frame.extend_from_slice(&body);
        let l = lock(&link);
        let ok = match &l.out {
            Some(_) if l.muted => false,
            Some(tx) => match tx.try_send(frame) {
                Ok(()) => true,
                Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => false,
            },
            None => false,
        };
        let c = if ok { &st.frames_sent } else { &st.frames_dropped };
        c.fetch_add(1, Ordering::Relaxed);
        ok.then_some(frame_bytes)
    }

    /// Fault injection (tests): while `muted`, every frame for `peer` is dropped as if its
    /// queue were full (counted in `frames_dropped`, raft-rs told it was unreachable), while
    /// the connection stays up and frames from `peer` still arrive — a one-way loss, which
    /// no process kill or partition of the whole link produces.
    pub fn mute_sends_to(&self, peer: u64, muted: bool) {
        if let Some(link) = self.shared.link(peer) {
            lock(&link).muted = muted;
        }
    }

    /// Whether a connection to `peer` is up now.
    pub fn connected(&self, peer: u64) -> bool {
        self.shared.link(peer).is_some_and(|l| lock(&l).out.is_some())
    }

    pub fn stats(&self) -> &TransportStats {
        &self.shared.stats
    }
}

impl Drop for Transport {
    fn drop(&mut self) {
        self.shared.stopped.store(true, Ordering::SeqCst);
        for link in self.shared.all_links() {
            close(&mut lock(&link));
        }
        // Wake the acceptor so it sees `stopped` and drops the listener.
        let _ = TcpStream::connect_timeout(&self.listen, Duration::from_millis(CONNECT_TIMEOUT_MS));
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        for t in threads {
            let _ = t.join();
        }
    }
}

fn new_link() -> Arc<Mutex<Link>> {
    Arc::new(Mutex::new(Link { generation: 0, out: None, stream: None, muted: false }))
}

impl Shared {
    fn link(&self, peer: u64) -> Option<Arc<Mutex<Link>>> {
        self.links.read().unwrap_or_else(std::sync::PoisonError::into_inner).get(&peer).cloned()
    }

    fn all_links(&self) -> Vec<Arc<Mutex<Link>>> {
        self.links.read().unwrap_or_else(std::sync::PoisonError::into_inner).values().cloned().collect()
    }
}

fn lock(l: &Mutex<Link>) -> std::sync::MutexGuard<'_, Link> {
    l.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn close(l: &mut Link) {
    l.out = None; // the writer's recv fails and it exits
    if let Some(s) = l.stream.take() {
        let _ = s.shutdown(Shutdown::Both); // the reader's read fails and it exits
    }
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> io::Result<JoinHandle<()>> {
    std::thread::Builder::new().name(name.into()).spawn(f)
}

fn accept_loop(s: Arc<Shared>, listener: TcpListener) {
    let handshakes = Arc::new(AtomicU64::new(0));
    for conn in listener.incoming() {
        if s.stopped.load(Ordering::SeqCst) {
            return;
        }
        let Ok(stream) = conn else { continue };
        // Each hello is read on its own short-lived thread, so a silent connection cannot
        // hold up a real peer's; at most HANDSHAKES_MAX at a time (more are closed).
        if handshakes.fetch_add(1, Ordering::SeqCst) >= HANDSHAKES_MAX {
            handshakes.fetch_sub(1, Ordering::SeqCst);
            continue;
        }
        let (s2, h2) = (s.clone(), handshakes.clone());
        let spawned = spawn("raft-hello", move || {
            handshake(&s2, stream);
            h2.fetch_sub(1, Ordering::SeqCst);
        });
        if spawned.is_err() {
            handshakes.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

fn handshake(s: &Arc<Shared>, mut stream: TcpStream) {
    let _ = stream.set_read_timeout(Some(Duration::from_millis(HELLO_TIMEOUT_MS)));
    let mut hello = [0u8; 12];
    if stream.read_exact(&mut hello).is_err() {
        return;
    }
    let magic = u32::from_le_bytes([hello[0], hello[1], hello[2], hello[3]]);
    let mut id = [0u8; 8];
    id.copy_from_slice(&hello[4..]);
    let peer = u64::from_le_bytes(id);
    // Only lower ids dial us; anything else is not a peer of this cluster.
    if magic != MAGIC || peer >= s.node_id || s.link(peer).is_none() || s.stopped.load(Ordering::SeqCst) {
        return;
    }
    let _ = stream.set_read_timeout(None);
    install(s, peer, stream);
}

fn dial_loop(s: Arc<Shared>, peer: u64, addr: SocketAddr) {
    let Some(link) = s.link(peer) else { return };
    while !s.stopped.load(Ordering::SeqCst) {
        if lock(&link).out.is_none() {
            if let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(CONNECT_TIMEOUT_MS)) {
                let mut hello = MAGIC.to_le_bytes().to_vec();
                hello.extend_from_slice(&s.node_id.to_le_bytes());
                if stream.write_all(&hello).is_ok() {
                    install(&s, peer, stream);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(REDIAL_MS));
    }
}

/// Make `stream` the connection to `peer`, replacing any older one.
fn install(s: &Arc<Shared>, peer: u64, stream: TcpStream) {
    let Some(link) = s.link(peer) else { return };
    let _ = stream.set_nodelay(true);
    let (Ok(rd), Ok(wr), Ok(keep)) = (stream.try_clone(), stream.try_clone(), stream.try_clone()) else { return };
    let (tx, rx) = sync_channel(SEND_QUEUE_FRAMES_MAX);
    let generation = {
        let mut l = lock(&link);
        if s.stopped.load(Ordering::SeqCst) {
            let _ = stream.shutdown(Shutdown::Both);
            return;
        }
        close(&mut l);
        l.generation += 1;
        l.out = Some(tx);
        l.stream = Some(keep);
        l.generation
    };
    s.stats.connects.fetch_add(1, Ordering::Relaxed);
    let _ = spawn("raft-write", move || write_loop(wr, rx));
    let s2 = s.clone();
    let _ = spawn("raft-read", move || {
        read_loop(&s2, peer, rd);
        if let Some(link) = s2.link(peer) {
            let mut l = lock(&link);
            if l.generation == generation {
                close(&mut l);
            }
        }
    });
}

fn write_loop(stream: TcpStream, rx: Receiver<Vec<u8>>) {
    let mut w = BufWriter::with_capacity(64 << 10, &stream);
    while let Ok(frame) = rx.recv() {
        if w.write_all(&frame).is_err() {
            break;
        }
        // Batch what is already queued into one write, then flush.
        let mut ok = true;
        while let Ok(f) = rx.try_recv() {
            if w.write_all(&f).is_err() {
                ok = false;
                break;
            }
        }
        if !ok || w.flush().is_err() {
            break;
        }
    }
    let _ = stream.shutdown(Shutdown::Both);
}

fn read_loop(s: &Shared, peer: u64, stream: TcpStream) {
    let mut r = BufReader::with_capacity(64 << 10, stream);
    loop {
        let mut head = [0u8; 4];
        if r.read_exact(&mut head).is_err() {
            return;
        }
        let len = u32::from_le_bytes(head) as usize;
        if !(8..=FRAME_BYTES_MAX).contains(&len) {
            s.stats.frames_bad.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let mut body = vec![0u8; len];
        if r.read_exact(&mut body).is_err() {
            return;
        }
        let mut g = [0u8; 8];
        g.copy_from_slice(&body[..8]);
        // Parsed in place: each entry's data and context are slices of the frame (shared, not
        // copied), so a follower pays no allocation and copy per entry here; the frame lives
        // as long as any of its entries does (in the log until compaction).
        let Ok(msg) = Message::parse_from_carllerche_bytes(&bytes::Bytes::from(body).slice(8..)) else {
            s.stats.frames_bad.fetch_add(1, Ordering::Relaxed);
            return;
        };
        // A peer may only speak for itself.
        if msg.from != peer || msg.to != s.node_id {
            s.stats.frames_bad.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        s.stats.frames_received.fetch_add(1, Ordering::Relaxed);
        let frame_bytes = (len + 4) as u64;
        if !(s.deliver)(Incoming { from: peer, group: u64::from_le_bytes(g), msg, frame_bytes }) {
            return;
        }
    }
}
