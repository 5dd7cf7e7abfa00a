//! The serving side of a replicated tenant (issue 15): which requests go through the tenant's
//! Raft group, the executor every replica runs for them, and how a waiting connection hears
//! back.
//!
//! What it is for: a mutating request (text, meta, binary: set/add/replace/append/prepend/
//! cas/delete/incr/decr/touch/gat/flush_all, ms/md/ma, mg with T or N) is not executed where
//! it arrives. Its bytes, exactly as the client sent them, become a command entry
//! (`slipstream_replication::Mutation::Command`) proposed to the tenant's group — by raft-rs's
//! forwarding when this node is a follower — and every replica runs it through the one dispatch
//! entry (`dispatch::execute_one`) when it is committed, with the proposer's clock for relative
//! exptimes and the entry's log index as the CAS. The reply the client gets is what that apply
//! produced on this node (the same bytes on every replica). A read waits for a ReadIndex barrier
//! unless the tenant opted into local reads. A connection's writes pipeline: each is proposed
//! as it is read and the connection goes on (up to [`CONN_INFLIGHT_MAX`] in flight); outcomes
//! come back through its worker's [`ReplInbox`] and leave in request order (tcp.rs keeps the
//! queue). Anything else waits until the writes before it answered: the connection is *parked*
//! (tcp.rs reads and executes nothing more on it) until then. [`TenantTraffic`] charges the
//! tenant's raft frames to its own buckets.
//!
//! What it is not for: Raft (slipstream-replication), sockets (net/), protocol rules (the
//! executors; `route` only asks the parsers what the request is and how long it is).

use crate::dispatch::execute_one;
use crate::exec::{ConnState, Ctx, Protocol, Settings, Transport};
use crate::memcache_text::text_limits_of;
use crate::stats::{ServerInfo, ThreadStats};
use mio::Waker;
use slipstream_proto::binary::{self, Command, Header};
use slipstream_proto::meta::{self, MetaCommand};
use slipstream_proto::text::{self, Request};
use slipstream_proto::Parsed;
use slipstream_replication::machine::{CommandExec, CommandOutcome};
use slipstream_replication::node::GroupTraffic;
use slipstream_replication::{Applied, Mutation, ProposeError, ReplicationNode};
use slipstream_store::Store;
use slipstream_tenancy::{Direction, TenantShaper};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// `Mutation::Command` protocol byte: text and meta requests.
pub const PROTOCOL_TEXT: u8 = 1;
/// `Mutation::Command` protocol byte: binary requests.
pub const PROTOCOL_BINARY: u8 = 2;
/// Proposals and read barriers in flight per replicated tenant on this node; past it a
/// request is answered `SERVER_ERROR replication busy` at once.
pub const TENANT_INFLIGHT_MAX: usize = 4096;
/// Writes one connection may have proposed and not yet answered (pipelined); past it the
/// connection reads and executes nothing more until the oldest answers.
pub const CONN_INFLIGHT_MAX: usize = 128;
/// How long a request waits for its group (a leader, the commit, the apply) before the
/// client gets a `SERVER_ERROR` (see `fail_line`).
pub const WAIT_DEFAULT: Duration = Duration::from_secs(3);

/// memcached's binary status "Temporary failure" (PROTOCOL_BINARY_RESPONSE_ETMPFAIL).
const BINARY_ETMPFAIL: u16 = 0x86;

/// How the request at the front of a replicated tenant's connection is served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Not a store access, not whole yet, or bad input: the executor handles it here.
    Local,
    /// A mutation: these first bytes of the input are proposed as one command entry; more
    /// writes may be proposed behind it before it answers (pipelined).
    Write(usize),
    /// A mutation whose apply may tell the connection to swallow the data block still
    /// arriving (an over-size storage command): proposed alone, nothing behind it until it
    /// answers (the bytes after it are not known to be requests yet).
    WriteAlone(usize),
    /// A read of the store, this many bytes long: needs a read barrier first (unless local
    /// reads).
    Read(usize),
}

/// What a parked connection is told.
#[derive(Debug)]
pub enum Outcome {
    /// The applied command's reply (and data bytes to swallow).
    Reply(CommandOutcome),
    /// The read barrier holds: the buffered reads may run.
    ReadReady,
    /// The group could not serve it in time: answer this error.
    Failed(Fail),
}

/// Why a replicated request failed (each has one line, see `fail_line`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fail {
    /// No leader known until the deadline: the write was never proposed.
    NoLeader,
    /// Proposed but not applied here by the deadline: it may or may not be applied.
    Timeout,
    /// The entry was overwritten after a leader change: not applied.
    Lost,
    /// Too many requests in flight for the tenant.
    Busy,
}

/// The text-protocol line of a failure (binary connections get the same words with status
/// "Temporary failure"; README, "Replicated tenants").
pub fn fail_line(f: Fail) -> &'static [u8] {
    match f {
        Fail::NoLeader => b"SERVER_ERROR no leader for this tenant\r\n",
        Fail::Timeout => b"SERVER_ERROR replication timeout, outcome unknown\r\n",
        Fail::Lost => b"SERVER_ERROR replication lost the write to a leader change, not applied\r\n",
        Fail::Busy => b"SERVER_ERROR replication busy\r\n",
    }
}

/// Append the failure reply for a request of `protocol` whose first bytes were `head` (the
/// binary header, for its opcode and opaque); nothing for a text request with `noreply`.
pub fn compose_fail(out: &mut Vec<u8>, protocol: u8, head: &[u8], f: Fail) {
    let line = fail_line(f);
    if protocol == PROTOCOL_BINARY {
        if let Some(h) = Header::decode(head) {
            let text = line.strip_prefix(b"SERVER_ERROR ").unwrap_or(line);
            binary::compose_error_text(out, &h, BINARY_ETMPFAIL, text.strip_suffix(b"\r\n").unwrap_or(text));
        }
        return;
    }
    let first_line = head.split(|&b| b == b'\n').next().unwrap_or(head);
    let noreply = first_line.split(|b| b.is_ascii_whitespace()).rev().find(|t| !t.is_empty()) == Some(b"noreply");
    if !noreply {
        out.extend_from_slice(line);
    }
}

/// The line a write over UDP to a replicated tenant gets (it is not applied).
pub const UDP_WRITE_REFUSED: &[u8] = b"SERVER_ERROR replicated tenant: writes over TCP only\r\n";

/// Append the refusal of a UDP write (`UDP_WRITE_REFUSED`, in the request's protocol).
pub fn compose_udp_refusal(out: &mut Vec<u8>, protocol: u8, head: &[u8]) {
    if protocol == PROTOCOL_BINARY {
        if let Some(h) = Header::decode(head) {
            binary::compose_error_text(out, &h, BINARY_ETMPFAIL, b"replicated tenant: writes over TCP only");
        }
    } else {
        out.extend_from_slice(UDP_WRITE_REFUSED);
    }
}

/// The protocol byte a connection speaks (deciding it from the first byte, as dispatch does).
pub fn protocol_of(conn: &ConnState, input: &[u8]) -> u8 {
    let binary = match conn.protocol {
        Protocol::Binary => true,
        Protocol::Text => false,
        Protocol::Undecided => input.first() == Some(&binary::REQUEST_MAGIC),
    };
    if binary {
        PROTOCOL_BINARY
    } else {
        PROTOCOL_TEXT
    }
}

/// Classify the request at the front of `input` (see [`Route`]).
pub fn route(store: &Store, settings: &Settings, conn: &ConnState, input: &[u8]) -> Route {
    if conn.swallow_bytes > 0 || input.is_empty() {
        return Route::Local;
    }
    if protocol_of(conn, input) == PROTOCOL_BINARY {
        return match binary::parse(input, &store.config().item_limits()) {
            Parsed::Complete { request, consumed } => match request.command {
                Command::Oversize { .. } => Route::WriteAlone(consumed),
                Command::Store { .. }
                | Command::Concat { .. }
                | Command::Delete { .. }
                | Command::Arith { .. }
                | Command::Flush { .. }
                | Command::Touch { .. }
                | Command::Gat { .. } => Route::Write(consumed),
                Command::Get { .. } => Route::Read(consumed),
                _ => Route::Local,
            },
            _ => Route::Local,
        };
    }
    match text::parse(input, &text_limits_of(store, settings)) {
        Parsed::Complete { request, consumed } => match request {
            Request::StoreTooLarge { .. } => Route::WriteAlone(consumed),
            Request::Store { .. }
            | Request::Delete { .. }
            | Request::Arith { .. }
            | Request::Touch { .. }
            | Request::FlushAll { .. } => Route::Write(consumed),
            Request::Get { touch_exptime: Some(_), .. } => Route::Write(consumed),
            Request::Get { .. } => Route::Read(consumed),
            Request::Meta => route_meta(store, input),
            _ => Route::Local,
        },
        _ => Route::Local,
    }
}

fn route_meta(store: &Store, input: &[u8]) -> Route {
    match meta::parse_with(input, &store.config().item_limits()) {
        Parsed::Complete { request, consumed } => match request.command {
            MetaCommand::Set if request.too_large => Route::WriteAlone(consumed),
            MetaCommand::Set | MetaCommand::Delete | MetaCommand::Arith => Route::Write(consumed),
            // mg with T (touch) or N (create on miss) writes.
            MetaCommand::Get if request.flags.has(b'T') || request.flags.has(b'N') => Route::Write(consumed),
            MetaCommand::Get | MetaCommand::Debug => Route::Read(consumed),
            MetaCommand::Noop => Route::Local,
        },
        _ => Route::Local,
    }
}

/// The executor every replica of a tenant runs for its command entries: the tenant's own
/// dispatch path on a fresh connection state, values copied into the reply (no budget, no
/// by-reference values: the reply crosses threads), counted in the tenant's `stats` under the
/// replication thread's own counters.
pub struct ApplyExec {
    settings: Arc<Settings>,
    info: Arc<ServerInfo>,
    own_stats: ThreadStats,
}

impl ApplyExec {
    pub fn new(settings: Arc<Settings>, info: Arc<ServerInfo>) -> ApplyExec {
        ApplyExec { settings, info, own_stats: ThreadStats::default() }
    }
}

impl CommandExec for ApplyExec {
    fn execute(&self, store: &Arc<Store>, protocol: u8, now_unix_s: i64, request: &[u8]) -> CommandOutcome {
        // UDP's rules for reply room: copy values, never charge the connection budget.
        let mut conn = ConnState::new(Transport::Udp);
        conn.protocol = if protocol == PROTOCOL_BINARY { Protocol::Binary } else { Protocol::Text };
        conn.authenticated = true;
        // The entry after the workers' ones in `per_thread` is the replication thread's
        // (tenants.rs); only this thread writes it.
        let stats = match self.info.per_thread.get(self.info.threads) {
            Some(s) => &**s,
            None => &self.own_stats,
        };
        let mut ctx = Ctx { store, stats, settings: &self.settings, server: &self.info, conn: &mut conn };
        let mut out = Vec::new();
        slipstream_store::with_proposer_now(now_unix_s, || execute_one(&mut ctx, request, &mut out));
        CommandOutcome { reply: out, swallow_bytes: conn.swallow_bytes as u64 }
    }
}

/// A replicated tenant's raft traffic on this node, charged to and paced by the tenant's own
/// buckets: messages sent to its egress bucket, received to its ingress bucket (Multes IV-D:
/// the replication of a tenant travels through its own share, no side path). The tenancy rule
/// for transfers outside the serving loops (as the shuffle service's): before sending an
/// append or snapshot the node asks `TenantShaper::transfer_wait_ns` (the node thread holds
/// the group's appends and snapshots while the egress bucket is in debt; heartbeats, votes and
/// responses are never held: see `Pacing` in slipstream_replication::node), and charges what
/// it sent with `charge_transfer`. The debt also holds back the tenant's own client batches
/// at the gate (`net/gate.rs`), so its replication cannot take another tenant's share.
/// Received frames are charged, not held (one connection per peer carries every group's).
pub struct TenantTraffic {
    shaper: Option<Arc<TenantShaper>>,
    pub sent_bytes: AtomicU64,
    pub received_bytes: AtomicU64,
    /// Time this tenant's appends and snapshots waited for its egress bucket (ns).
    pub paced_ns: AtomicU64,
}

impl TenantTraffic {
    pub fn new(shaper: Option<Arc<TenantShaper>>) -> TenantTraffic {
        TenantTraffic {
            shaper,
            sent_bytes: AtomicU64::new(0),
            received_bytes: AtomicU64::new(0),
            paced_ns: AtomicU64::new(0),
        }
    }
}

impl GroupTraffic for TenantTraffic {
    fn sent(&self, bytes: u64) {
        self.sent_bytes.fetch_add(bytes, Ordering::Relaxed);
        if let Some(s) = &self.shaper {
            s.charge_transfer(Direction::Out, bytes);
        }
    }

    fn received(&self, bytes: u64) {
        self.received_bytes.fetch_add(bytes, Ordering::Relaxed);
        if let Some(s) = &self.shaper {
            s.charge_transfer(Direction::In, bytes);
        }
    }

    fn send_wait_ns(&self) -> u64 {
        self.shaper.as_ref().map_or(0, |s| s.transfer_wait_ns(Direction::Out, slipstream_tenancy::since_start_ns()))
    }

    fn paced(&self, ns: u64) {
        self.paced_ns.fetch_add(ns, Ordering::Relaxed);
    }
}

/// A replicated tenant's handle on its group, shared by the workers.
pub struct Replica {
    node: Arc<ReplicationNode>,
    pub group: u64,
    /// Reads served from the local store without a barrier (may be stale on a follower).
    pub local_reads: bool,
    /// How long a request waits for its group before `SERVER_ERROR`.
    pub wait: Duration,
    inflight: Arc<AtomicUsize>,
    /// Writes proposed from this node / read barriers asked (for metrics).
    pub writes: AtomicU64,
    pub barriers: AtomicU64,
    pub failures: AtomicU64,
    /// Its raft bytes on this node (for metrics; charged to its buckets as they pass).
    pub traffic: Arc<TenantTraffic>,
}

impl Replica {
    pub fn new(
        node: Arc<ReplicationNode>,
        group: u64,
        local_reads: bool,
        wait: Duration,
        traffic: Arc<TenantTraffic>,
    ) -> Replica {
        Replica {
            node,
            group,
            local_reads,
            wait,
            traffic,
            inflight: Arc::new(AtomicUsize::new(0)),
            writes: AtomicU64::new(0),
            barriers: AtomicU64::new(0),
            failures: AtomicU64::new(0),
        }
    }

    pub fn node(&self) -> &ReplicationNode {
        &self.node
    }

    /// Propose `request` (a whole request of `protocol`); `done` hears the outcome once.
    /// False = over the tenant's in-flight cap (nothing proposed, `done` dropped).
    pub fn propose(&self, protocol: u8, request: Vec<u8>, done: impl FnOnce(Outcome) + Send + 'static) -> bool {
        let Some(release) = self.admit() else { return false };
        self.writes.fetch_add(1, Ordering::Relaxed);
        let m = Mutation::Command { protocol, now_unix_s: unix_now_s(), request };
        self.node.propose_then(
            self.group,
            &m,
            self.wait,
            Box::new(move |r| {
                drop(release);
                done(match r {
                    Ok(Applied::Command(o)) => Outcome::Reply(o),
                    Ok(_) => Outcome::Failed(Fail::Timeout),
                    Err(e) => Outcome::Failed(fail_of(e)),
                })
            }),
        );
        true
    }

    /// Ask for a read barrier; `done` hears `ReadReady` or a failure. False = over the cap.
    pub fn read_barrier(&self, done: impl FnOnce(Outcome) + Send + 'static) -> bool {
        let Some(release) = self.admit() else { return false };
        self.barriers.fetch_add(1, Ordering::Relaxed);
        self.node.read_index_then(
            self.group,
            self.wait,
            Box::new(move |r| {
                drop(release);
                done(match r {
                    Ok(_) => Outcome::ReadReady,
                    Err(e) => Outcome::Failed(fail_of(e)),
                })
            }),
        );
        true
    }

    fn admit(&self) -> Option<InflightGuard> {
        let n = self.inflight.fetch_add(1, Ordering::AcqRel);
        let guard = InflightGuard(self.inflight.clone());
        (n < TENANT_INFLIGHT_MAX).then_some(guard)
    }
}

/// One unit of a tenant's in-flight count, given back when dropped.
struct InflightGuard(Arc<AtomicUsize>);

impl Drop for InflightGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

fn fail_of(e: ProposeError) -> Fail {
    match e {
        ProposeError::NoLeader | ProposeError::NotLeader(_) | ProposeError::UnknownGroup => Fail::NoLeader,
        ProposeError::Dropped | ProposeError::Corrupt => Fail::Lost,
        ProposeError::Busy => Fail::Busy,
        ProposeError::Timeout | ProposeError::Stopped => Fail::Timeout,
    }
}

fn unix_now_s() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

/// An outcome for connection `idx` (checked against its `serial`: the slot may have been
/// reused by the time it arrives).
pub struct Delivery {
    pub idx: usize,
    pub serial: u64,
    /// Which of the connection's requests in flight it answers.
    pub seq: u64,
    pub outcome: Outcome,
}

/// Where the replication thread leaves outcomes for one worker, and the waker of its poll.
pub struct ReplInbox {
    queue: Mutex<Vec<Delivery>>,
    waker: Arc<Waker>,
}

impl ReplInbox {
    pub fn new(waker: Arc<Waker>) -> ReplInbox {
        ReplInbox { queue: Mutex::new(Vec::new()), waker }
    }

    pub fn deliver(&self, d: Delivery) {
        let was_empty = {
            let mut q = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
            q.push(d);
            q.len() == 1
        };
        // The worker takes the whole queue at once: one wake per batch of deliveries is
        // enough (a delivery after its take finds the queue empty and wakes it again).
        if was_empty {
            let _ = self.waker.wake();
        }
    }

    pub fn take(&self) -> Vec<Delivery> {
        std::mem::take(&mut *self.queue.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// A fresh identity for a connection that parks (never 0).
pub fn next_serial() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use slipstream_store::StoreConfig;

    fn route_of(input: &[u8]) -> Route {
        let store = Store::new(StoreConfig::default());
        route(&store, &Settings::default(), &ConnState::new(Transport::Tcp), input)
    }

    #[test]
    fn mutations_are_proposed_whole_and_reads_need_a_barrier() {
        assert_eq!(route_of(b"set a 0 0 1\r\nx\r\nget a\r\n"), Route::Write(16));
        assert_eq!(route_of(b"incr a 1\r\n"), Route::Write(10));
        assert_eq!(route_of(b"gat 10 a\r\n"), Route::Write(10));
        assert_eq!(route_of(b"flush_all\r\n"), Route::Write(11));
        assert_eq!(route_of(b"ms a 1 T0\r\nx\r\n"), Route::Write(14));
        assert_eq!(route_of(b"mg a v T30\r\n"), Route::Write(12));
        assert_eq!(route_of(b"get a b\r\n"), Route::Read(9));
        assert_eq!(route_of(b"mg a v\r\n"), Route::Read(8));
        assert_eq!(route_of(b"version\r\n"), Route::Local);
        assert_eq!(route_of(b"set a 0 0 1\r\n"), Route::Local); // incomplete
        assert_eq!(route_of(b"bogus\r\n"), Route::Local);
        // Binary SETQ with key "k", value "v".
        let mut setq = vec![0x80, 0x11, 0, 1, 8, 0, 0, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        setq.extend_from_slice(&[0; 8]);
        setq.extend_from_slice(b"kv");
        assert_eq!(route_of(&setq), Route::Write(34));
    }

    #[test]
    fn the_apply_executor_answers_like_the_server_and_uses_the_proposers_clock() {
        let settings = Arc::new(Settings::default());
        let info = Arc::new(ServerInfo::detached(vec![Arc::new(ThreadStats::default())], 1 << 20));
        let x = ApplyExec::new(settings, info);
        let store = Arc::new(Store::new(StoreConfig::default()));
        let now = store.clock().now_unix_s();
        let o = x.execute(&store, PROTOCOL_TEXT, now + 1000, b"set a 0 100 1\r\nx\r\n");
        assert_eq!(o.reply, b"STORED\r\n");
        let o = x.execute(&store, PROTOCOL_TEXT, now, b"mg a t\r\n");
        // The item expires 100 s after the proposer's "now", 1000 s from here.
        assert!(String::from_utf8_lossy(&o.reply).starts_with("HD t11"), "{:?}", String::from_utf8_lossy(&o.reply));
        let o = x.execute(&store, PROTOCOL_TEXT, now, b"incr a 1\r\n");
        assert_eq!(o.reply, b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n");
        let o = x.execute(&store, PROTOCOL_TEXT, now, b"set big 0 0 5000000\r\n");
        assert!(o.reply.starts_with(b"SERVER_ERROR object too large"));
        assert_eq!(o.swallow_bytes, 5_000_002);
    }

    /// A mirror that holds what it was offered and drops what it is told to.
    #[derive(Default)]
    struct Mirror(Mutex<std::collections::HashMap<Vec<u8>, Vec<u8>>>);

    impl slipstream_store::KernelCache for Mirror {
        fn fill(
            &self,
            key: &[u8],
            _flags: u32,
            _cas: u64,
            value: &[u8],
            _expires_at: Option<std::time::Instant>,
        ) -> slipstream_store::KernelFill {
            self.0.lock().unwrap().insert(key.to_vec(), value.to_vec());
            slipstream_store::KernelFill::Cached
        }
        fn invalidate(&self, key: &[u8]) {
            self.0.lock().unwrap().remove(key);
        }
        fn flush_all(&self) {
            self.0.lock().unwrap().clear();
        }
    }

    /// XDP coherence on a replicated tenant: an applied entry changes the store through its
    /// write path, which drops the kernel's copy before the item changes, as for any write.
    #[test]
    fn an_applied_write_invalidates_the_kernel_copy_first() {
        let x = ApplyExec::new(
            Arc::new(Settings::default()),
            Arc::new(ServerInfo::detached(vec![Arc::new(ThreadStats::default())], 1 << 20)),
        );
        let store = Arc::new(Store::new(StoreConfig::default()));
        let mirror = Arc::new(Mirror::default());
        store.set_kernel_cache(mirror.clone());
        let now = store.clock().now_unix_s();
        assert_eq!(x.execute(&store, PROTOCOL_TEXT, now, b"set k 0 0 1\r\nx\r\n").reply, b"STORED\r\n");
        // A local get offers the item to the mirror (what the fast path then serves).
        let mut conn = ConnState::new(Transport::Tcp);
        let info = ServerInfo::detached(vec![Arc::new(ThreadStats::default())], 1 << 20);
        let stats = ThreadStats::default();
        let settings = Settings::default();
        let mut ctx = Ctx { store: &store, stats: &stats, settings: &settings, server: &info, conn: &mut conn };
        let mut out = Vec::new();
        execute_one(&mut ctx, b"get k\r\n", &mut out);
        assert_eq!(mirror.0.lock().unwrap().get(&b"k"[..]).map(Vec::as_slice), Some(&b"x"[..]));
        for write in [&b"set k 0 0 1\r\n7\r\n"[..], b"incr k 1\r\n", b"touch k 10\r\n", b"delete k\r\n"] {
            execute_one(&mut ctx, b"get k\r\n", &mut out);
            x.execute(&store, PROTOCOL_TEXT, now, write);
            assert!(mirror.0.lock().unwrap().get(&b"k"[..]).is_none(), "{:?}", String::from_utf8_lossy(write));
        }
    }

    #[test]
    fn failures_have_one_line_and_noreply_silences_them() {
        let mut out = Vec::new();
        compose_fail(&mut out, PROTOCOL_TEXT, b"set a 0 0 1\r\n", Fail::NoLeader);
        assert_eq!(out, b"SERVER_ERROR no leader for this tenant\r\n");
        out.clear();
        compose_fail(&mut out, PROTOCOL_TEXT, b"set a 0 0 1 noreply\r\n", Fail::Timeout);
        assert!(out.is_empty());
        let head = [0x80, 0x01, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0];
        compose_fail(&mut out, PROTOCOL_BINARY, &head, Fail::Busy);
        assert_eq!(out[0], 0x81);
        assert_eq!(&out[6..8], &[0, 0x86]);
        assert_eq!(&out[12..16], &[0, 0, 0, 9]);
    }
}
