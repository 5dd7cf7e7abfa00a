//! Raft messages between nodes over TCP: one connection per peer pair, every group's messages
//! multiplexed on it, each group (tenant) with its own send queue.
//!
//! Not for: client requests, or deciding what to send (the node does). Raft tolerates lost
//! messages, so this layer never blocks the node: a full send queue or a missing connection
//! drops the message (counted) and Raft retries on its own schedule.
//!
//! Fair sharing of a connection: a group's messages wait in that group's own queue (bounded
//! in frames and bytes per group, so one group's backlog never makes another's messages be
//! dropped); the writer serves the groups with something queued round-robin, at most
//! `QUANTUM_BYTES` of one group per visit, cutting a larger message (a catch-up append, a
//! snapshot) into chunks of that size. So one tenant's catch-up traffic delays another
//! tenant's heartbeat or append by at most one chunk per busy group, not by its whole backlog
//! (`a_groups_big_message_does_not_hold_up_another_groups_small_one`). Within a group messages
//! keep their order (a snapshot still arrives before the appends that follow it).
//!
//! Connection: the node with the lower id dials the higher one and introduces itself with
//! `MAGIC: u32`, `node_id: u64`; the acceptor keeps the newest connection per peer. The
//! dialer redials every `REDIAL_MS` while the connection is down. A node added by a membership
//! change joins the peer map at run time (`add_peer`, its address from the conf change). There is no authentication
//! yet: the raft port must only be reachable from the cluster's nodes (a host that can reach
//! it can impersonate a peer).
//! Chunk: `len: u32 LE` (of what follows; bit 31 set = more chunks of this message follow),
//! `group: u64 LE`, then bytes of a protobuf `eraftpb::Message`; a message is the concatenation
//! of its group's chunks up to one with bit 31 clear (a message of at most `QUANTUM_BYTES` is
//! one chunk). Chunks of different groups interleave; a group's next message starts only after
//! its previous one ended.
//!
//! Threads: an acceptor (each hello read on a short-lived thread, at most `HANDSHAKES_MAX`),
//! a dialer per higher-id peer, and a reader plus a writer per live connection (blocking I/O on a handful of sockets; the raft core itself is the node's
//! single loop, so moving this to a mio loop later changes only this module).

use protobuf::Message as PbMessage;
use raft::eraftpb::Message;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::{self, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

/// Largest message accepted (a snapshot of a whole tenant travels as one message).
pub const FRAME_BYTES_MAX: usize = 256 << 20;
/// Messages of one group queued per peer connection before the group's new ones are dropped.
pub const SEND_QUEUE_FRAMES_MAX: usize = 4096;
/// Bytes of one group queued per peer connection before the group's new messages are dropped
/// (a single message larger than this, a big snapshot, is still queued when the group's queue
/// is empty).
pub const SEND_QUEUE_BYTES_MAX: usize = 64 << 20;
/// Bytes of one group written per round-robin visit (the chunk size of a larger message).
pub const QUANTUM_BYTES: usize = 64 << 10;
/// Bytes gathered from the queues into one socket write.
const WRITE_BYTES_MAX: usize = 256 << 10;
/// Bit 31 of a chunk's length: more chunks of this message follow.
const MORE: u32 = 1 << 31;
/// "SLRQ": chunked per-group framing (was "SLRP", one frame per message, before it): a node of
/// the other framing is refused at the hello instead of misreading chunks.
const MAGIC: u32 = 0x534c_5251;
const REDIAL_MS: u64 = 50;
const CONNECT_TIMEOUT_MS: u64 = 200;
/// How long an accepted connection may take to introduce itself.
const HELLO_TIMEOUT_MS: u64 = 1000;
/// Accepted connections that may be introducing themselves at once.
const HANDSHAKES_MAX: u64 = 16;

/// Hello of a leader query (a node that relays a tenant's clients without holding a replica
/// asks a member which node leads the group): `magic: u32`, `group: u64 LE`; answered with
/// `leader: u64 LE` (0 = not known there) and closed. Reveals only a node id.
const LEADER_QUERY_MAGIC: u32 = 0x534c_524c; // "SLRL"

/// The leader this node knows for a group (0 = none), for leader queries.
pub type LeaderLookup = Arc<dyn Fn(u64) -> u64 + Send + Sync>;

/// Ask the node whose raft port is `raft` which node leads `group` (0 = it does not know);
/// bounded by `timeout` for the connect and again for the answer.
pub fn ask_leader(raft: SocketAddr, group: u64, timeout: Duration) -> io::Result<u64> {
    let mut s = TcpStream::connect_timeout(&raft, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    let mut hello = LEADER_QUERY_MAGIC.to_le_bytes().to_vec();
    hello.extend_from_slice(&group.to_le_bytes());
    s.write_all(&hello)?;
    let mut leader = [0u8; 8];
    s.read_exact(&mut leader)?;
    Ok(u64::from_le_bytes(leader))
}

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
    /// Dropped because the peer was not connected or the group's queue to it was full.
    pub frames_dropped: AtomicU64,
    /// Frames that failed to decode (the connection is closed).
    pub frames_bad: AtomicU64,
    pub connects: AtomicU64,
}

/// The messages waiting for one peer connection's writer, per group (see the module doc).
#[derive(Default)]
struct Queues {
    groups: HashMap<u64, GroupQueue>,
    /// Groups with something queued, in the order the writer serves them.
    turn: VecDeque<u64>,
    /// The writer is gone (the connection failed): sends fail.
    closed: bool,
}

#[derive(Default)]
struct GroupQueue {
    /// Encoded messages (protobuf only; chunk headers are added by the writer).
    msgs: VecDeque<Vec<u8>>,
    bytes: usize,
    /// Bytes of the first message already written (it is being sent in chunks).
    head_sent: usize,
}

#[derive(Default)]
struct SendQueue {
    q: Mutex<Queues>,
    ready: Condvar,
}

impl SendQueue {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queues> {
        self.q.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Queue `body` of `group`; false if the group's queue is full or the writer is gone.
    fn push(&self, group: u64, body: Vec<u8>) -> bool {
        let mut q = self.lock();
        if q.closed {
            return false;
        }
        let gq = q.groups.entry(group).or_default();
        let fits = gq.msgs.is_empty()
            || (gq.msgs.len() < SEND_QUEUE_FRAMES_MAX && gq.bytes + body.len() <= SEND_QUEUE_BYTES_MAX);
        if !fits {
            return false;
        }
        let was_idle = gq.msgs.is_empty();
        gq.bytes += body.len();
        gq.msgs.push_back(body);
        if was_idle {
            q.turn.push_back(group);
        }
        drop(q);
        self.ready.notify_one();
        true
    }

    fn close(&self) {
        let mut q = self.lock();
        q.closed = true;
        q.groups.clear();
        q.turn.clear();
        drop(q);
        self.ready.notify_all();
    }

    /// Wait for queued messages and gather the next write into `wire` (emptied first): the
    /// groups round-robin, at most `QUANTUM_BYTES` of one group per visit, until about
    /// `WRITE_BYTES_MAX`. False = closed.
    fn next_write(&self, wire: &mut Vec<u8>) -> bool {
        wire.clear();
        let mut q = self.lock();
        while q.turn.is_empty() && !q.closed {
            q = self.ready.wait(q).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        if q.closed {
            return false;
        }
        while wire.len() < WRITE_BYTES_MAX {
            let Some(group) = q.turn.pop_front() else { break };
            let Some(gq) = q.groups.get_mut(&group) else { continue };
            let mut budget = QUANTUM_BYTES;
            while budget > 0 {
                let Some(head) = gq.msgs.front() else { break };
                let left = head.len() - gq.head_sent;
                let take = left.min(budget);
                let more = take < left;
                let len = (8 + take) as u32 | if more { MORE } else { 0 };
                wire.extend_from_slice(&len.to_le_bytes());
                wire.extend_from_slice(&group.to_le_bytes());
                wire.extend_from_slice(&head[gq.head_sent..gq.head_sent + take]);
                budget -= take;
                if more {
                    gq.head_sent += take;
                } else {
                    gq.head_sent = 0;
                    gq.bytes -= head.len();
                    gq.msgs.pop_front();
                }
            }
            if gq.msgs.is_empty() {
                q.groups.remove(&group);
            } else {
                q.turn.push_back(group);
            }
        }
        true
    }
}

struct Link {
    /// Generation of the current connection (to tell a stale reader's exit from a new link).
    generation: u64,
    out: Option<Arc<SendQueue>>,
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
    leader_of: RwLock<Option<LeaderLookup>>,
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
            leader_of: RwLock::new(None),
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
        // Charged as one frame (the chunk headers of a message cut into chunks are not).
        let frame_bytes = (12 + body.len()) as u64;
        let out = {
            let l = lock(&link);
            if l.muted {
                None
            } else {
                l.out.clone()
            }
        };
        let ok = out.is_some_and(|q| q.push(group, body));
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

    /// Answer leader queries ([`ask_leader`]) from `lookup` (until then: 0, not known).
    pub fn answer_leader_queries(&self, lookup: LeaderLookup) {
        *self.shared.leader_of.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(lookup);
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
    if let Some(q) = l.out.take() {
        q.close(); // the writer wakes and exits
    }
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
    if magic == LEADER_QUERY_MAGIC {
        let lookup = s.leader_of.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        let leader = lookup.map_or(0, |f| f(peer)); // here `peer` is the group asked about
        let _ = stream.write_all(&leader.to_le_bytes());
        return;
    }
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
    let queue = Arc::new(SendQueue::default());
    let tx = queue.clone();
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
    let _ = spawn("raft-write", move || write_loop(wr, &queue));
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

fn write_loop(mut stream: TcpStream, queue: &SendQueue) {
    let mut wire = Vec::with_capacity(WRITE_BYTES_MAX + QUANTUM_BYTES + 64);
    while queue.next_write(&mut wire) {
        if stream.write_all(&wire).is_err() {
            break;
        }
    }
    queue.close(); // later sends fail (counted as dropped) until the link is replaced
    let _ = stream.shutdown(Shutdown::Both);
}

fn read_loop(s: &Shared, peer: u64, stream: TcpStream) {
    let mut r = BufReader::with_capacity(64 << 10, stream);
    // Messages of each group whose chunks have begun to arrive (at most one per group).
    let mut partial: HashMap<u64, Vec<u8>> = HashMap::new();
    loop {
        let mut head = [0u8; 12];
        if r.read_exact(&mut head).is_err() {
            return;
        }
        let word = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
        let (more, len) = (word & MORE != 0, (word & !MORE) as usize);
        let group = u64::from_le_bytes([head[4], head[5], head[6], head[7], head[8], head[9], head[10], head[11]]);
        let begun = partial.get(&group).map_or(0, Vec::len);
        let pending: usize = partial.values().map(Vec::len).sum();
        // One message at most FRAME_BYTES_MAX, and all of a connection's unfinished messages
        // together at most twice that.
        if len < 8 || begun + len - 8 > FRAME_BYTES_MAX || pending + len - 8 > 2 * FRAME_BYTES_MAX {
            s.stats.frames_bad.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let body = if more || begun > 0 {
            let buf = partial.entry(group).or_default();
            let at = buf.len();
            buf.resize(at + len - 8, 0);
            if r.read_exact(&mut buf[at..]).is_err() {
                return;
            }
            if more {
                continue;
            }
            partial.remove(&group).unwrap_or_default()
        } else {
            let mut body = vec![0u8; len - 8];
            if r.read_exact(&mut body).is_err() {
                return;
            }
            body
        };
        let len = body.len() + 8;
        // Parsed in place: each entry's data and context are slices of the message (shared,
        // not copied), so a follower pays no allocation and copy per entry here; the message
        // lives as long as any of its entries does (in the log until compaction).
        let Ok(msg) = Message::parse_from_carllerche_bytes(&bytes::Bytes::from(body)) else {
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
        if !(s.deliver)(Incoming { from: peer, group, msg, frame_bytes }) {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use raft::eraftpb::{Entry, MessageType};
    use std::time::Instant;

    fn free_addr() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    }

    /// Node 2 (receiving into `deliver`) and node 1 (sending), connected (bounded wait).
    fn connected_pair(deliver: Deliver) -> (Transport, Transport) {
        let peers: BTreeMap<u64, SocketAddr> = [(1, free_addr()), (2, free_addr())].into_iter().collect();
        let receiver = Transport::start(2, peers[&2], &peers, deliver).unwrap();
        let sender = Transport::start(1, peers[&1], &peers, Arc::new(|_| true)).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !sender.connected(2) {
            assert!(Instant::now() < deadline, "no connection");
            std::thread::sleep(Duration::from_millis(5));
        }
        (receiver, sender)
    }

    /// Group 7 (a tenant catching a follower up) queues a 48 MiB append for node 2, then group
    /// 8 (another tenant) a heartbeat: the heartbeat must arrive first. With one queue per
    /// connection (the old transport) it waited behind all 48 MiB.
    #[test]
    fn a_groups_big_message_does_not_hold_up_another_groups_small_one() {
        let arrived = Arc::new(Mutex::new(Vec::new()));
        let seen = arrived.clone();
        let deliver: Deliver = Arc::new(move |m: Incoming| {
            seen.lock().unwrap().push((m.group, m.msg.get_msg_type(), m.frame_bytes));
            true
        });
        let (receiver, sender) = connected_pair(deliver);
        let mut big = Message { from: 1, to: 2, ..Default::default() };
        big.set_msg_type(MessageType::MsgAppend);
        big.set_entries(
            vec![Entry { data: vec![7u8; 48 << 20].into(), index: 1, term: 1, ..Default::default() }].into(),
        );
        let mut beat = Message { from: 1, to: 2, ..Default::default() };
        beat.set_msg_type(MessageType::MsgHeartbeat);
        let big_bytes = sender.send_sized(7, &big).expect("queued");
        assert!(sender.send(8, &beat));
        let deadline = Instant::now() + Duration::from_secs(20);
        while arrived.lock().unwrap().len() < 2 {
            assert!(Instant::now() < deadline, "not delivered: {:?}", arrived.lock().unwrap());
            std::thread::sleep(Duration::from_millis(5));
        }
        let got = arrived.lock().unwrap().clone();
        assert_eq!(got[0].0, 8, "the heartbeat came after the other group's big append: {got:?}");
        assert_eq!(got[0].1, MessageType::MsgHeartbeat);
        assert_eq!((got[1].0, got[1].1, got[1].2), (7, MessageType::MsgAppend, big_bytes), "whole, reassembled");
        assert_eq!(receiver.stats().frames_bad.load(Ordering::Relaxed), 0);
        drop(sender);
        drop(receiver);
    }

    /// A group's messages keep their order, whether cut into chunks or not, while other
    /// groups' chunks interleave with them.
    #[test]
    fn each_groups_messages_arrive_whole_and_in_order() {
        let arrived = Arc::new(Mutex::new(Vec::new()));
        let seen = arrived.clone();
        let deliver: Deliver = Arc::new(move |m: Incoming| {
            let e = &m.msg.entries[0];
            assert!(e.data.iter().all(|&b| b == e.index as u8), "a message's bytes were mixed up");
            seen.lock().unwrap().push((m.group, e.index, e.data.len()));
            true
        });
        let (receiver, sender) = connected_pair(deliver);
        // Sizes around the chunk size, for three groups in turn.
        let sizes = [10, QUANTUM_BYTES - 40, QUANTUM_BYTES, 3 * QUANTUM_BYTES + 5, 100, 1 << 20];
        let mut sent = 0;
        for (i, &size) in sizes.iter().cycle().take(30).enumerate() {
            let index = (i / 3 + 1) as u64;
            let mut m = Message { from: 1, to: 2, ..Default::default() };
            m.set_msg_type(MessageType::MsgAppend);
            m.set_entries(vec![Entry { data: vec![index as u8; size].into(), index, ..Default::default() }].into());
            assert!(sender.send(100 + (i % 3) as u64, &m));
            sent += 1;
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while arrived.lock().unwrap().len() < sent {
            assert!(Instant::now() < deadline, "not all delivered");
            std::thread::sleep(Duration::from_millis(5));
        }
        let got = arrived.lock().unwrap().clone();
        for g in 100..103 {
            let idx: Vec<u64> = got.iter().filter(|m| m.0 == g).map(|m| m.1).collect();
            assert_eq!(idx, (1..=10).collect::<Vec<_>>(), "group {g}'s order");
        }
        assert_eq!(receiver.stats().frames_bad.load(Ordering::Relaxed), 0);
    }
}
