//! The replication node: one thread that drives every Raft group of this node — tick every
//! `tick_ms`, step incoming messages, and handle each group's Ready (persist, send, apply,
//! advance) — and hands proposals back as completions once applied.
//!
//! Not for: client connections. A caller (the server's executor, later) proposes a
//! [`Mutation`] for a group and waits on the returned [`Completion`]; it answers the client
//! from the [`Applied`] result. Only the leader accepts proposals; elsewhere the caller gets
//! [`ProposeError::NotLeader`] with the leader's id (forwarding is the next step).
//!
//! One turn of the loop: take the events that arrived (bounded), tick if due (and check each
//! follower's connection to its leader: see `notice_leader_loss`), propose each group's
//! proposals of the turn as one raft-rs proposal of many entries, then for every group with a
//! Ready: send the leader's messages, install a snapshot, apply committed
//! entries, append new entries and the hard state; then sync every group written this turn
//! (group commit for `fsync = batch`), then send the messages that needed persistence and
//! advance. A group whose log grew past `log_entries_max` entries beyond its snapshot, and
//! whose log is at least twice the snapshot's size (so a snapshot's cost stays proportional to
//! the bytes written) and at least `compact_log_bytes_min` or a `compact_interval_ms` past its
//! last compaction (so a small store under a high write rate is not copied every few thousand
//! writes, and a restarted node re-applies at most about an interval of writes), is
//! compacted: its store's contents become the new snapshot (what a lagging follower gets).
//! Every frame a group sends or receives is told to its [`GroupTraffic`] (the server charges
//! its tenant's buckets).
//!
//! Pacing: a group's appends and snapshots (the messages that carry its tenant's data) are
//! sent only while [`GroupTraffic::send_wait_ns`] says 0 (the server: the tenant's egress
//! bucket is not in debt, the rule its clients' replies follow); otherwise they wait in the
//! group, in order, and go once the bucket has refilled (the node thread wakes for it), each
//! send charged and possibly leaving a debt the next one waits out. So a tenant's replication
//! leaves the node at its share, not only bills it. Held time is told to
//! [`GroupTraffic::paced`]. Liveness: heartbeats, votes, pre-votes, leadership transfer and
//! every response are never held (a few dozen bytes each, still charged), so a follower hears
//! its leader every heartbeat and never starts an election because its tenant is over its
//! share, and ReadIndex rounds keep going; held entries only delay commits of that tenant
//! (its proposals wait, as its clients would at the gate). An empty append goes behind held
//! ones (per peer order). What is held is bounded by raft-rs's in-flight window
//! (`max_inflight_msgs` appends per follower, one snapshot), and the messages share their
//! entries' bytes with the log. A group that loses leadership drops what it held (raft-rs
//! resends from the followers' answers). Incoming frames and forwarded proposals are charged,
//! not held: one connection per peer carries every group's frames, and holding one tenant's
//! would hold the others'.
//!
//! Completions: a proposal carries an id in its entry's context. On the leader the index Raft
//! gives it is remembered: when that index is applied with the same id, the client gets the
//! result; if another entry lands at that index (the proposal was lost to a leader change),
//! the client gets `Dropped`. A proposal whose entry commits under a later leader still
//! completes (every replica applies the same entry).
//!
//! Forwarding: on a follower that knows its leader, raft-rs forwards the proposal to the
//! leader itself (`MsgPropose`, proposal forwarding is on); the follower remembers the id and
//! completes the caller when it applies the entry carrying that id — with its own apply's
//! result, which is the leader's (the same entry on the same state). While no leader is known
//! a proposal or read waits in the group, retried every turn, until its deadline. Every
//! waiter has a deadline: past it the caller gets `NoLeader` (never proposed: nothing
//! happened) or `Timeout` (proposed or forwarded: it may still be applied — the caller must
//! say so), so a caller always hears back within its wait plus one tick.
//!
//! Reads: `read_index` is raft-rs's ReadIndex (`ReadOnlyOption::Safe`: the leader confirms
//! its leadership with a heartbeat round before answering; a follower asks the leader). The
//! caller is completed with `ReadBarrier` once this replica has applied up to the index the
//! leader returned, so a read of the local store after it is linearizable.

use crate::cluster::Timing;
use crate::machine::{Applied, CommandOutcome, Recalled, TenantMachine};
use crate::mutation::{Decoded, Mutation};
use crate::storage::{FsyncMode, GroupStorage, StorageFault};
use crate::transport::{Deliver, Incoming, Transport};
use protobuf::Message as PbMessage;
use raft::eraftpb::{ConfChange, ConfChangeType, ConfChangeV2, Entry, EntryType, Message, MessageType, Snapshot};
use raft::{RawNode, SnapshotStatus, StateRole};
use slipstream_store::Store;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Events queued for the node thread before proposals are refused with `Busy` (and incoming
/// raft messages wait on their connection).
pub const INBOX_EVENTS_MAX: usize = 65536;
/// How long a raft message waits between looks at a full inbox (back-pressure on its
/// connection; the node thread empties up to `EVENTS_PER_TURN_MAX` events a turn).
const INBOX_FULL_WAIT: Duration = Duration::from_millis(1);
/// Proposals and reads of one group waiting (for a leader, a commit or an apply) before new
/// ones get `Busy`.
pub const PENDING_PROPOSALS_MAX: usize = 65536;
/// How long `propose` (the blocking API) lets a proposal wait before `Timeout`/`NoLeader`.
pub const PROPOSAL_WAIT_DEFAULT: Duration = Duration::from_secs(10);
/// Events handled per loop turn before the groups' Readies are processed.
const EVENTS_PER_TURN_MAX: usize = 4096;
/// Longest the node thread sleeps while a group has held messages (a bucket whose rate was
/// set to 0 answers "forever"; an admin change may reopen it).
const PACING_LOOK: Duration = Duration::from_millis(10);

/// Configuration of one node.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    pub node_id: u64,
    /// Every node of the cluster, this one included: id → raft address.
    pub peers: BTreeMap<u64, SocketAddr>,
    /// Each group keeps `<data_dir>/group-<id>/raft.log`.
    pub data_dir: PathBuf,
    pub fsync: FsyncMode,
    pub tick_ms: u64,
    /// Election timeout in ticks (randomized in [election_ticks, 2 * election_ticks)).
    pub election_ticks: usize,
    pub heartbeat_ticks: usize,
    /// Compact a group's log once this many applied entries follow its snapshot.
    pub log_entries_max: u64,
    /// ... and not before its log holds this many bytes (a small store's snapshot is cheap
    /// to take but taken very often under a high write rate: each one copies the whole
    /// store, rewrites the file and syncs it; the log is held in memory up to about this).
    pub compact_log_bytes_min: u64,
    /// ... unless the group's last compaction (or the node's start) is this long ago: the
    /// committed log since the snapshot is what a restarted node re-applies before it serves
    /// (on the cores its neighbours serve from), so it is kept to about this much time of
    /// writes (and `log_entries_max`, and twice the snapshot) rather than the byte floor.
    pub compact_interval_ms: u64,
}

/// Default of [`NodeConfig::compact_interval_ms`].
pub const COMPACT_INTERVAL_MS_DEFAULT: u64 = 1000;

/// Default of [`NodeConfig::compact_log_bytes_min`].
pub const COMPACT_LOG_BYTES_MIN_DEFAULT: u64 = 8 << 20;

impl NodeConfig {
    /// Defaults for a node: [`Timing::default`], fsync always.
    pub fn new(node_id: u64, peers: BTreeMap<u64, SocketAddr>, data_dir: PathBuf) -> NodeConfig {
        NodeConfig {
            node_id,
            peers,
            data_dir,
            fsync: FsyncMode::Always,
            tick_ms: Timing::default().tick_ms,
            election_ticks: Timing::default().election_ticks,
            heartbeat_ticks: Timing::default().heartbeat_ticks,
            log_entries_max: 10_000,
            compact_log_bytes_min: COMPACT_LOG_BYTES_MIN_DEFAULT,
            compact_interval_ms: COMPACT_INTERVAL_MS_DEFAULT,
        }
    }
}

/// One group this node is a member of (one replicated tenant).
#[derive(Clone)]
pub struct GroupSpec {
    pub group_id: u64,
    /// Node ids holding a replica (used only when the group is created on disk).
    pub voters: Vec<u64>,
    /// The tenant's store; must start empty (it is rebuilt from the snapshot and the log).
    pub store: Arc<Store>,
    /// Node that should lead while it is up and caught up (leaders spread across nodes); a
    /// leader elsewhere hands leadership back to it.
    pub preferred_leader: Option<u64>,
    /// Runs command entries ([`Mutation::Command`]); None = such entries answer an error.
    pub exec: Option<Arc<dyn crate::machine::CommandExec>>,
    /// Told the wire size of every raft message of the group this node sends or receives
    /// (the server charges them to the tenant's egress/ingress buckets); None = not counted.
    pub traffic: Option<Arc<dyn GroupTraffic>>,
}

/// Where a group's raft traffic is accounted and paced (its tenant's token buckets:
/// replication takes the tenant's own share of the node's capacity, no side path around it).
/// Called on the node thread: keep it to a few atomic operations.
pub trait GroupTraffic: Send + Sync {
    /// A frame of `bytes` was queued for a peer.
    fn sent(&self, bytes: u64);
    /// A frame of `bytes` arrived from a peer.
    fn received(&self, bytes: u64);
    /// 0 when the group's next append or snapshot may be sent now, else how long to wait
    /// (nanoseconds; the tenant's egress bucket is in debt). Default: never wait.
    fn send_wait_ns(&self) -> u64 {
        0
    }
    /// The group had appends or snapshots held back for another `ns` nanoseconds.
    fn paced(&self, _ns: u64) {}
}

/// Why a node could not start.
#[derive(Debug)]
pub enum NodeError {
    Storage(u64, StorageFault),
    Raft(u64, raft::Error),
    /// The snapshot on disk does not decode.
    Snapshot(u64, String),
    Io(std::io::Error),
    NoAddress(u64),
}

impl std::fmt::Display for NodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NodeError::Storage(g, e) => write!(f, "group {g}: {e}"),
            NodeError::Raft(g, e) => write!(f, "group {g}: raft: {e}"),
            NodeError::Snapshot(g, e) => write!(f, "group {g}: snapshot: {e}"),
            NodeError::Io(e) => write!(f, "replication transport: {e}"),
            NodeError::NoAddress(id) => write!(f, "node {id} has no address in peers"),
        }
    }
}

impl std::error::Error for NodeError {}

/// Why a proposal did not complete.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProposeError {
    /// This node is not the group's leader; the leader's id if known.
    NotLeader(Option<u64>),
    /// The entry was replaced by another after a leader change: not applied; retry.
    Dropped,
    /// Too many proposals waiting.
    Busy,
    UnknownGroup,
    /// The node stopped before the entry was applied (it may still be applied elsewhere).
    Stopped,
    /// The committed entry did not decode (applied as a no-op on every replica).
    Corrupt,
    /// No leader was known until the deadline: never proposed, nothing happened.
    NoLeader,
    /// Proposed (or forwarded) but not applied here by the deadline: it may still be.
    Timeout,
}

/// Called once with a proposal's or read's outcome, on the node thread (keep it short:
/// hand the result to the waiting thread and wake it).
pub type Done = Box<dyn FnOnce(Result<Applied, ProposeError>) + Send>;

/// Waits for one proposal's result.
pub struct Completion(Receiver<Result<Applied, ProposeError>>);

impl Completion {
    /// Wait up to `timeout`; `None` if it is not applied by then (it may still be later).
    pub fn wait(&self, timeout: Duration) -> Option<Result<Applied, ProposeError>> {
        match self.0.recv_timeout(timeout) {
            Ok(r) => Some(r),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => Some(Err(ProposeError::Stopped)),
        }
    }
}

/// A group's state as last published by the node thread (for metrics and tests).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupStatus {
    pub role: StateRole,
    /// 0 = no known leader.
    pub leader_id: u64,
    pub term: u64,
    pub commit_index: u64,
    pub applied_index: u64,
    pub snapshot_index: u64,
    pub log_bytes: u64,
    /// Times this node became leader of the group.
    pub elections_won: u64,
    /// Snapshots received from a leader and installed.
    pub snapshots_installed: u64,
    /// Elections this node started at once because its connection to the leader dropped
    /// (not after an election timeout).
    pub leader_loss_elections: u64,
    /// Proposals made on this node while it was a follower (raft-rs sent them to the leader).
    pub forwarded: u64,
    /// The group's voters as this node last applied them (0 = unused slot).
    pub voters: [u64; crate::cluster::NODES_MAX],
    /// The group's preferred leader as this node knows it (0 = none).
    pub preferred_leader: u64,
}

enum Event {
    Raft(Incoming),
    Propose { group: u64, data: Vec<u8>, deadline: Instant, done: Done },
    ReadIndex { group: u64, deadline: Instant, done: Done },
    TransferLeader { group: u64, to: u64 },
    Admin { group: u64, op: AdminOp, done: mpsc::Sender<Result<(), AdminError>> },
    Stop,
}

type Reply = Done;

/// A caller waiting for an outcome.
struct Waiter {
    id: u64,
    deadline: Instant,
    done: Done,
    /// The term in which it was forwarded to the leader (0: not forwarded).
    term: u64,
}

/// Waiting for a leader to be known: a proposal (its entry data) or a read (None).
struct Unsent {
    data: Option<Vec<u8>>,
    waiter: Waiter,
}

struct Group {
    raw: RawNode<GroupStorage>,
    machine: TenantMachine,
    traffic: Option<Arc<dyn GroupTraffic>>,
    /// Proposed here as leader: index → waiter.
    pending: BTreeMap<u64, Waiter>,
    /// Proposed here as follower (forwarded by raft-rs): id → waiter.
    forwarded: HashMap<u64, Waiter>,
    /// Waiting for a known leader (retried every turn).
    unsent: std::collections::VecDeque<Unsent>,
    /// Proposals that arrived this turn, proposed together at its end (one raft-rs proposal
    /// of many entries: one append per follower, or one forwarded message, not one each).
    batch: Vec<(Vec<u8>, Waiter)>,
    /// ReadIndex asked: id → waiter.
    reads_asked: HashMap<u64, Waiter>,
    /// When each asked read was last sent (a ReadIndex lost to a leader change is asked again:
    /// reads are idempotent).
    reads_sent_at: HashMap<u64, Instant>,
    /// ReadIndex answered: (index to apply up to, waiter).
    reads_ready: Vec<(u64, Waiter)>,
    forwarded_total: u64,
    /// Results decided this turn, sent after the status is published (so a client that got
    /// its answer sees a status with the entry applied).
    replies: Vec<(Reply, Result<Applied, ProposeError>)>,
    log_entries_max: u64,
    compact_log_bytes_min: u64,
    compact_interval: Duration,
    /// When this group last compacted (its node's start before the first).
    compacted_at: Instant,
    elections_won: u64,
    snapshots_installed: u64,
    was_leader: bool,
    preferred_leader: Option<u64>,
    /// Ticks since this node last checked whether to hand leadership to the preferred node.
    ticks_since_transfer_check: usize,
    /// The preferred leader was just changed (admin): check every tick, not once per timeout.
    transfer_soon: bool,
    /// Peers that a membership change applied this turn brought in (their addresses go to
    /// the transport).
    learned_peers: Vec<(u64, SocketAddr)>,
    /// A node was added: compact now, so it starts from a snapshot (which carries the voter
    /// set) and never replays the log from index 1 with an empty configuration.
    compact_soon: bool,
    election_ticks: usize,
    /// Ticks left in which a pre-vote (started because the leader's connection dropped or
    /// the election timeout ran out) is asked again while unanswered: a peer still inside
    /// the leader's lease ignores it, and is out of it a tick or two later (both stopped
    /// hearing the leader at the same moment), not a whole randomized timeout later.
    loss_campaign_ticks: usize,
    /// Elections this node started because the leader's connection dropped.
    loss_campaigns: u64,
    /// Appends and snapshots waiting for the tenant's egress bucket (see `Pacing` in the
    /// module doc), in the order raft-rs made them.
    held: std::collections::VecDeque<Message>,
    /// Held time is counted up to here (None: nothing held).
    held_counted_to: Option<Instant>,
}

/// A running node (see the module doc). Dropping it stops the thread and closes every
/// connection: to the rest of the cluster it is a crashed node (its data_dir stays).
pub struct ReplicationNode {
    tx: Inbox,
    thread: Option<JoinHandle<()>>,
    transport: Arc<Transport>,
    status: Arc<Mutex<HashMap<u64, GroupStatus>>>,
    stores: HashMap<u64, TenantMachine>,
}

impl ReplicationNode {
    /// Open every group's storage (restoring its store from the snapshot on disk), start the
    /// transport and the node thread.
    pub fn start(cfg: NodeConfig, groups: Vec<GroupSpec>) -> Result<ReplicationNode, NodeError> {
        let listen = *cfg.peers.get(&cfg.node_id).ok_or(NodeError::NoAddress(cfg.node_id))?;
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let mut built = BTreeMap::new();
        let mut stores = HashMap::new();
        for g in groups {
            let id = g.group_id;
            let dir = cfg.data_dir.join(format!("group-{id}"));
            let storage = GroupStorage::open(&dir, cfg.fsync, &g.voters).map_err(|e| NodeError::Storage(id, e))?;
            let machine = TenantMachine::with_exec(g.store.clone(), g.exec.clone());
            let snap = storage.latest_snapshot();
            let applied = snap.get_metadata().index;
            if applied > 0 {
                machine.restore(&snap.data).map_err(|e| NodeError::Snapshot(id, e.to_string()))?;
            }
            let rc = raft::Config {
                id: cfg.node_id,
                election_tick: cfg.election_ticks,
                heartbeat_tick: cfg.heartbeat_ticks,
                applied,
                max_size_per_msg: 1 << 20,
                max_inflight_msgs: 256,
                check_quorum: true,
                pre_vote: true,
                ..raft::Config::default()
            };
            let raw = RawNode::new(&rc, storage, &logger).map_err(|e| NodeError::Raft(id, e))?;
            stores.insert(id, machine.clone());
            built.insert(
                id,
                Group {
                    raw,
                    machine,
                    traffic: g.traffic.clone(),
                    pending: BTreeMap::new(),
                    forwarded: HashMap::new(),
                    unsent: Default::default(),
                    batch: Vec::new(),
                    reads_asked: HashMap::new(),
                    reads_sent_at: HashMap::new(),
                    reads_ready: Vec::new(),
                    forwarded_total: 0,
                    replies: Vec::new(),
                    log_entries_max: cfg.log_entries_max.max(1),
                    compact_log_bytes_min: cfg.compact_log_bytes_min,
                    compact_interval: Duration::from_millis(cfg.compact_interval_ms),
                    compacted_at: Instant::now(),
                    elections_won: 0,
                    snapshots_installed: 0,
                    was_leader: false,
                    preferred_leader: g.preferred_leader,
                    ticks_since_transfer_check: 0,
                    transfer_soon: false,
                    learned_peers: Vec::new(),
                    compact_soon: false,
                    election_ticks: cfg.election_ticks,
                    loss_campaign_ticks: 0,
                    loss_campaigns: 0,
                    held: Default::default(),
                    held_counted_to: None,
                },
            );
        }
        let (tx, rx) = Inbox::new();
        let deliver_tx = tx.clone();
        let deliver: Deliver = Arc::new(move |m| deliver_tx.send_waiting(Event::Raft(m)));
        let transport = Arc::new(Transport::start(cfg.node_id, listen, &cfg.peers, deliver).map_err(NodeError::Io)?);
        let status: Arc<Mutex<HashMap<u64, GroupStatus>>> = Arc::new(Mutex::new(HashMap::new()));
        let known = status.clone();
        transport.answer_leader_queries(Arc::new(move |g| {
            known.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(&g).map_or(0, |st| st.leader_id)
        }));
        // Proposal ids must not repeat across restarts (an old entry replayed during catch-up
        // must not complete a new caller): start from the clock in nanoseconds, below the node id.
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        let next_id = (cfg.node_id << 56) | (nanos & ((1 << 56) - 1));
        let mut lp = Loop { groups: built, transport: transport.clone(), status: status.clone(), next_id };
        lp.publish();
        let tick = Duration::from_millis(cfg.tick_ms.max(1));
        let thread = std::thread::Builder::new()
            .name(format!("raft-node-{}", cfg.node_id))
            .spawn(move || lp.run(rx, tick))
            .map_err(NodeError::Io)?;
        Ok(ReplicationNode { tx, thread: Some(thread), transport, status, stores })
    }

    /// Propose `m` for `group`. The completion reports the applied result, or why not.
    pub fn propose(&self, group: u64, m: &Mutation) -> Completion {
        let (reply, rx) = mpsc::channel();
        self.propose_then(
            group,
            m,
            PROPOSAL_WAIT_DEFAULT,
            Box::new(move |r| {
                let _ = reply.send(r);
            }),
        );
        Completion(rx)
    }

    /// Propose `m` for `group` (forwarded to the leader from a follower); `done` is called
    /// exactly once, on the node thread, within about `wait` plus one tick.
    pub fn propose_then(&self, group: u64, m: &Mutation, wait: Duration, done: Done) {
        let deadline = Instant::now() + wait;
        self.send_event(Event::Propose { group, data: m.encode(), deadline, done });
    }

    /// A read barrier for `group` (ReadIndex): `done` gets `ReadBarrier` once a local read
    /// is linearizable, or an error by about `wait` plus one tick.
    pub fn read_index_then(&self, group: u64, wait: Duration, done: Done) {
        let deadline = Instant::now() + wait;
        self.send_event(Event::ReadIndex { group, deadline, done });
    }

    fn send_event(&self, ev: Event) {
        let (err, ev) = match self.tx.try_send(ev) {
            Ok(()) => return,
            Err(TrySendError::Full(ev)) => (ProposeError::Busy, ev),
            Err(TrySendError::Disconnected(ev)) => (ProposeError::Stopped, ev),
        };
        if let Event::Propose { done, .. } | Event::ReadIndex { done, .. } = ev {
            done(Err(err));
        }
    }

    /// Ask the group's leader (if it is this node) to hand leadership to `to`.
    pub fn transfer_leader(&self, group: u64, to: u64) {
        let _ = self.tx.try_send(Event::TransferLeader { group, to });
    }

    /// Make an admin change to `group` (through its log, from any node: a follower forwards
    /// it) and wait up to `wait` until this node sees the effect: `to` leads, the voter is in
    /// or out of the group's configuration. One membership change at a time (raft-rs ignores
    /// a second one while the first is not applied; it then times out here). A proposal the
    /// leader dropped or that found no leader (a leadership transfer in progress, e.g. the
    /// preferred leader being restored, or an election) is proposed again until `wait` is
    /// over: a dropped proposal never reached the log, so proposing it again cannot apply it
    /// twice, and the effect is checked first (an earlier proposal may have taken effect).
    pub fn admin(&self, group: u64, op: AdminOp, wait: Duration) -> Result<(), AdminError> {
        let deadline = Instant::now() + wait;
        loop {
            match self.propose_admin_once(group, &op, deadline) {
                Err(AdminError::Group(ProposeError::NotLeader(_) | ProposeError::NoLeader))
                    if Instant::now() + ADMIN_RETRY_PAUSE < deadline =>
                {
                    std::thread::sleep(ADMIN_RETRY_PAUSE);
                    if self.status(group).is_some_and(|st| op.seen_in(&st)) {
                        return Ok(());
                    }
                }
                r => break r?,
            }
        }
        loop {
            if self.status(group).is_some_and(|st| op.seen_in(&st)) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(AdminError::Group(ProposeError::Timeout));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Hand `op` to the node thread once and wait (until `deadline`) for its proposal's fate.
    fn propose_admin_once(&self, group: u64, op: &AdminOp, deadline: Instant) -> Result<(), AdminError> {
        let (tx, rx) = mpsc::channel();
        self.tx.try_send(Event::Admin { group, op: op.clone(), done: tx }).map_err(|e| {
            AdminError::Group(match e {
                TrySendError::Full(_) => ProposeError::Busy,
                TrySendError::Disconnected(_) => ProposeError::Stopped,
            })
        })?;
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(r) => r,
            Err(_) => Err(AdminError::Group(ProposeError::Timeout)),
        }
    }

    pub fn status(&self, group: u64) -> Option<GroupStatus> {
        self.status.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(&group).copied()
    }

    /// The group's state machine (its store) on this node.
    pub fn machine(&self, group: u64) -> Option<&TenantMachine> {
        self.stores.get(&group)
    }

    pub fn transport(&self) -> &Transport {
        &self.transport
    }
}

impl Drop for ReplicationNode {
    fn drop(&mut self) {
        self.tx.send_stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The node thread's inbox: a channel bounded by a count of what is queued, not a
/// preallocated ring. (`mpsc::sync_channel(INBOX_EVENTS_MAX)` allocated and wrote all 65,536
/// slots of a raft message's size — ~16 MiB — at every start: about 6 ms of page faults of a
/// restarting node, on the cores the running nodes serve from, for a queue that holds a few
/// events in practice. An unbounded channel allocates its blocks as they fill.)
#[derive(Clone)]
struct Inbox {
    tx: Sender<Event>,
    shared: Arc<InboxShared>,
}

struct InboxShared {
    /// Events sent and not yet taken by the node thread.
    queued: AtomicUsize,
    /// The node thread is gone: nothing will be taken again.
    closed: AtomicBool,
}

/// The node thread's end of the inbox; dropping it closes the inbox.
struct InboxRx {
    rx: Receiver<Event>,
    shared: Arc<InboxShared>,
}

impl Inbox {
    fn new() -> (Inbox, InboxRx) {
        let (tx, rx) = mpsc::channel();
        let shared = Arc::new(InboxShared { queued: AtomicUsize::new(0), closed: AtomicBool::new(false) });
        (Inbox { tx, shared: shared.clone() }, InboxRx { rx, shared })
    }

    /// Queue `ev` unless `INBOX_EVENTS_MAX` events wait already (`Full`) or the node thread
    /// is gone (`Disconnected`).
    // The refused event goes back whole (as std's `TrySendError`): its `done` must still be
    // called by the sender.
    #[allow(clippy::result_large_err)]
    fn try_send(&self, ev: Event) -> Result<(), TrySendError<Event>> {
        if self.shared.closed.load(Ordering::Acquire) {
            return Err(TrySendError::Disconnected(ev));
        }
        if self.shared.queued.fetch_add(1, Ordering::AcqRel) >= INBOX_EVENTS_MAX {
            self.shared.queued.fetch_sub(1, Ordering::AcqRel);
            return Err(TrySendError::Full(ev));
        }
        self.tx.send(ev).map_err(|e| {
            self.shared.queued.fetch_sub(1, Ordering::AcqRel);
            TrySendError::Disconnected(e.0)
        })
    }

    /// Queue `ev`, waiting while the inbox is full (back-pressure on a raft connection);
    /// false = the node thread is gone.
    fn send_waiting(&self, mut ev: Event) -> bool {
        loop {
            match self.try_send(ev) {
                Ok(()) => return true,
                Err(TrySendError::Disconnected(_)) => return false,
                Err(TrySendError::Full(back)) => {
                    ev = back;
                    std::thread::sleep(INBOX_FULL_WAIT);
                }
            }
        }
    }

    /// Tell the node thread to stop, whatever the bound (it must hear it).
    fn send_stop(&self) {
        self.shared.queued.fetch_add(1, Ordering::AcqRel);
        let _ = self.tx.send(Event::Stop);
    }
}

impl InboxRx {
    fn taken(&self, ev: Event) -> Event {
        self.shared.queued.fetch_sub(1, Ordering::AcqRel);
        ev
    }

    fn recv_timeout(&self, wait: Duration) -> Result<Event, RecvTimeoutError> {
        self.rx.recv_timeout(wait).map(|ev| self.taken(ev))
    }

    fn try_recv(&self) -> Option<Event> {
        self.rx.try_recv().ok().map(|ev| self.taken(ev))
    }
}

impl Drop for InboxRx {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Release);
    }
}

struct Loop {
    groups: BTreeMap<u64, Group>,
    transport: Arc<Transport>,
    status: Arc<Mutex<HashMap<u64, GroupStatus>>>,
    next_id: u64,
}

impl Loop {
    fn run(&mut self, rx: InboxRx, tick: Duration) {
        let mut next_tick = Instant::now() + tick;
        let mut next_release: Option<Instant> = None;
        loop {
            let wake = next_release.map_or(next_tick, |r| r.min(next_tick));
            let wait = wake.saturating_duration_since(Instant::now());
            let mut first = match rx.recv_timeout(wait) {
                Ok(ev) => Some(ev),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => return,
            };
            let mut handled = 0;
            while let Some(ev) =
                first.take().or_else(|| if handled < EVENTS_PER_TURN_MAX { rx.try_recv() } else { None })
            {
                handled += 1;
                if !self.handle(ev) {
                    self.fail_all_pending();
                    return;
                }
            }
            if Instant::now() >= next_tick {
                let now = Instant::now();
                for g in self.groups.values_mut() {
                    let before = g.raw.raft.state;
                    g.raw.tick();
                    notice_leader_loss(g, &self.transport);
                    if before != StateRole::PreCandidate && g.raw.raft.state == StateRole::PreCandidate {
                        // The election timeout ran out (a hung leader): ask again every tick,
                        // as after a dropped connection (see `notice_leader_loss`).
                        g.loss_campaign_ticks = g.election_ticks;
                    }
                    restore_preferred_leader(g, &self.transport);
                    expire(g, now);
                    resend_reads(g, now);
                }
                next_tick += tick;
                if next_tick < Instant::now() {
                    next_tick = Instant::now() + tick; // fell behind (loaded machine): no burst
                }
            }
            self.retry_unsent();
            self.propose_batches();
            if let Err((gid, e)) = self.handle_readies() {
                // A storage failure leaves the group inoperable (raft-rs's contract); stop
                // the node rather than acknowledge anything not on disk.
                eprintln!("slipstream-replication: group {gid}: {e}; node stops");
                self.fail_all_pending();
                return;
            }
            next_release = self.release_held();
            self.publish();
            for g in self.groups.values_mut() {
                for (done, r) in g.replies.drain(..) {
                    done(r);
                }
            }
        }
    }

    /// False = stop.
    fn handle(&mut self, ev: Event) -> bool {
        match ev {
            Event::Raft(m) => {
                if let Some(g) = self.groups.get_mut(&m.group) {
                    if let Some(t) = &g.traffic {
                        t.received(m.frame_bytes);
                    }
                    // Errors here are stale or foreign messages; raft-rs ignores them safely.
                    let _ = g.raw.step(m.msg);
                }
            }
            Event::Propose { group, data, deadline, done } => self.propose(group, data, deadline, done),
            Event::ReadIndex { group, deadline, done } => self.read_index(group, deadline, done),
            Event::TransferLeader { group, to } => {
                if let Some(g) = self.groups.get_mut(&group) {
                    g.raw.transfer_leader(to);
                }
            }
            Event::Admin { group, op, done } => {
                let r = match self.groups.get_mut(&group) {
                    Some(g) => propose_admin(g, op),
                    None => Err(AdminError::Group(ProposeError::UnknownGroup)),
                };
                let _ = done.send(r);
            }
            Event::Stop => return false,
        }
        true
    }

    fn propose(&mut self, group: u64, data: Vec<u8>, deadline: Instant, done: Done) {
        let Some(g) = self.groups.get_mut(&group) else {
            done(Err(ProposeError::UnknownGroup));
            return;
        };
        if waiting(g) >= PENDING_PROPOSALS_MAX {
            done(Err(ProposeError::Busy));
            return;
        }
        self.next_id += 1;
        g.batch.push((data, Waiter { id: self.next_id, deadline, done, term: 0 }));
    }

    /// Propose every group's proposals of this turn (see `Group::batch`).
    fn propose_batches(&mut self) {
        for g in self.groups.values_mut() {
            if !g.batch.is_empty() {
                let batch = std::mem::take(&mut g.batch);
                propose_batch(g, batch, &self.transport);
            }
        }
    }

    fn read_index(&mut self, group: u64, deadline: Instant, done: Done) {
        let Some(g) = self.groups.get_mut(&group) else {
            done(Err(ProposeError::UnknownGroup));
            return;
        };
        if waiting(g) >= PENDING_PROPOSALS_MAX {
            done(Err(ProposeError::Busy));
            return;
        }
        self.next_id += 1;
        let waiter = Waiter { id: self.next_id, deadline, done, term: 0 };
        if let Some(u) = try_read_index(g, waiter, &self.transport) {
            g.unsent.push_back(u);
        }
    }

    /// Proposals and reads that waited for a leader, now that one may be known: a read asks
    /// again; a proposal joins this turn's batch ahead of the turn's new ones (it is older), so
    /// that `propose_batch` alone proposes (and puts it back in `unsent` if there is still no
    /// leader to take it).
    fn retry_unsent(&mut self) {
        for g in self.groups.values_mut() {
            if g.unsent.is_empty() || g.raw.raft.leader_id == 0 {
                continue;
            }
            let mut waited = Vec::new();
            for u in std::mem::take(&mut g.unsent) {
                match u.data {
                    Some(data) => waited.push((data, u.waiter)),
                    None => {
                        if let Some(u) = try_read_index(g, u.waiter, &self.transport) {
                            g.unsent.push_back(u);
                        }
                    }
                }
            }
            if !waited.is_empty() {
                waited.append(&mut g.batch);
                g.batch = waited;
            }
        }
    }

    fn fail_all_pending(&mut self) {
        for g in self.groups.values_mut() {
            for (done, r) in g.replies.drain(..) {
                done(r);
            }
            let waiters = std::mem::take(&mut g.pending)
                .into_values()
                .chain(std::mem::take(&mut g.forwarded).into_values())
                .chain(std::mem::take(&mut g.unsent).into_iter().map(|u| u.waiter))
                .chain(std::mem::take(&mut g.batch).into_iter().map(|(_, w)| w))
                .chain(std::mem::take(&mut g.reads_asked).into_values())
                .chain(std::mem::take(&mut g.reads_ready).into_iter().map(|(_, w)| w));
            for w in waiters {
                (w.done)(Err(ProposeError::Stopped));
            }
        }
    }

    fn handle_readies(&mut self) -> Result<(), (u64, String)> {
        let transport = self.transport.clone();
        let mut readied = Vec::new();
        for (&gid, g) in self.groups.iter_mut() {
            if !g.raw.has_ready() {
                continue;
            }
            let mut rd = g.raw.ready();
            send_all(&transport, gid, g, rd.take_messages());
            for rs in rd.take_read_states() {
                let id = id_of(&rs.request_ctx);
                if let Some(id) = id {
                    g.reads_sent_at.remove(&id);
                }
                if let Some(w) = id.and_then(|id| g.reads_asked.remove(&id)) {
                    g.reads_ready.push((rs.index, w));
                }
            }
            if !rd.snapshot().is_empty() {
                let snap: Snapshot = rd.snapshot().clone();
                let term = snap.get_metadata().term;
                g.machine.restore(&snap.data).map_err(|e| (gid, e.to_string()))?;
                g.raw.mut_store().apply_snapshot(snap).map_err(|e| (gid, e.to_string()))?;
                let idx = g.raw.store().snapshot_index();
                g.snapshots_installed += 1;
                complete_from_snapshot(g, idx);
                answer_lost_forwards(g, term);
            }
            apply_entries(gid, g, rd.take_committed_entries())?;
            if !rd.entries().is_empty() {
                g.raw.mut_store().append(rd.entries()).map_err(|e| (gid, e.to_string()))?;
            }
            if let Some(hs) = rd.hs() {
                g.raw.mut_store().set_hard_state(hs).map_err(|e| (gid, e.to_string()))?;
            }
            readied.push((gid, rd));
        }
        // Group commit point: everything written this turn reaches the disk before any
        // message that depends on it leaves and before Raft counts it persisted.
        for (gid, _) in &readied {
            if let Some(g) = self.groups.get_mut(gid) {
                g.raw.mut_store().sync().map_err(|e| (*gid, e.to_string()))?;
            }
        }
        for (gid, mut rd) in readied {
            let Some(g) = self.groups.get_mut(&gid) else { continue };
            send_all(&transport, gid, g, rd.take_persisted_messages());
            let mut light = g.raw.advance(rd);
            if let Some(c) = light.commit_index() {
                g.raw.mut_store().set_commit(c).map_err(|e| (gid, e.to_string()))?;
            }
            send_all(&transport, gid, g, light.take_messages());
            apply_entries(gid, g, light.take_committed_entries())?;
            g.raw.advance_apply();
            maybe_compact(g).map_err(|e| (gid, e.to_string()))?;
            for (peer, addr) in g.learned_peers.drain(..) {
                transport.add_peer(peer, addr);
            }
        }
        for g in self.groups.values_mut() {
            release_reads(g);
        }
        Ok(())
    }

    /// Send what the groups' buckets allow of their held messages; the earliest time a group
    /// with messages still held should look again.
    fn release_held(&mut self) -> Option<Instant> {
        let now = Instant::now();
        let mut next = None;
        for (&gid, g) in self.groups.iter_mut() {
            if g.held.is_empty() {
                continue;
            }
            if let Some(at) = release_held(&self.transport, gid, g, now) {
                next = Some(next.map_or(at, |n: Instant| n.min(at)));
            }
        }
        next
    }

    fn publish(&mut self) {
        let mut st = self.status.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for (&gid, g) in self.groups.iter_mut() {
            let r = &g.raw.raft;
            let leader = r.state == StateRole::Leader;
            if leader && !g.was_leader {
                g.elections_won += 1;
            }
            g.was_leader = leader;
            let mut voters = [0; crate::cluster::NODES_MAX];
            for (slot, &v) in voters.iter_mut().zip(r.raft_log.store.conf_state().voters.iter()) {
                *slot = v;
            }
            st.insert(
                gid,
                GroupStatus {
                    role: r.state,
                    leader_id: r.leader_id,
                    term: r.term,
                    commit_index: r.raft_log.committed,
                    applied_index: r.raft_log.applied,
                    snapshot_index: r.raft_log.store.snapshot_index(),
                    log_bytes: r.raft_log.store.log_bytes(),
                    elections_won: g.elections_won,
                    snapshots_installed: g.snapshots_installed,
                    leader_loss_elections: g.loss_campaigns,
                    forwarded: g.forwarded_total,
                    voters,
                    preferred_leader: g.preferred_leader.unwrap_or(0),
                },
            );
        }
    }
}

/// Send `msgs` of group `gid`, holding back its appends and snapshots while its egress bucket
/// is in debt (see `Pacing` in the module doc).
fn send_all(t: &Transport, gid: u64, g: &mut Group, msgs: Vec<Message>) {
    for m in msgs {
        if paced_kind(&m) && (!g.held.is_empty() || must_wait(g)) {
            if g.held.is_empty() {
                g.held_counted_to = Some(Instant::now());
            }
            g.held.push_back(m);
            continue;
        }
        send_one(t, gid, g, m);
    }
}

/// Whether a message waits for its tenant's egress bucket: appends and snapshots do (they
/// carry the tenant's data; an empty append goes behind held ones, keeping each peer's
/// appends in order); heartbeats, votes and every response never do (liveness).
fn paced_kind(m: &Message) -> bool {
    matches!(m.get_msg_type(), MessageType::MsgAppend | MessageType::MsgSnapshot)
}

fn must_wait(g: &Group) -> bool {
    g.traffic.as_ref().is_some_and(|t| t.send_wait_ns() > 0)
}

fn send_one(t: &Transport, gid: u64, g: &mut Group, m: Message) {
    let snapshot = m.get_msg_type() == MessageType::MsgSnapshot;
    let to = m.to;
    let sent = t.send_sized(gid, &m);
    if let (Some(bytes), Some(tr)) = (sent, &g.traffic) {
        tr.sent(bytes);
    }
    let ok = sent.is_some();
    if snapshot {
        // One ordered connection per peer: once queued, the snapshot arrives before any
        // later append, so the leader may go on probing from it.
        g.raw.report_snapshot(to, if ok { SnapshotStatus::Finish } else { SnapshotStatus::Failure });
    } else if !ok {
        g.raw.report_unreachable(to);
    }
}

/// Send the group's held messages while its egress bucket allows (each send may leave a
/// debt: the next waits); None when nothing is held any more, else when to look again. A
/// group that is no longer the leader of the term its messages were made in drops them
/// (raft-rs resends from the followers' answers; a dropped snapshot is reported failed).
fn release_held(t: &Transport, gid: u64, g: &mut Group, now: Instant) -> Option<Instant> {
    if let (Some(from), Some(tr)) = (g.held_counted_to, &g.traffic) {
        tr.paced(now.saturating_duration_since(from).as_nanos() as u64);
    }
    g.held_counted_to = Some(now);
    let leader_term = (g.raw.raft.state == StateRole::Leader).then_some(g.raw.raft.term);
    while let Some(m) = g.held.pop_front() {
        if Some(m.term) != leader_term {
            if m.get_msg_type() == MessageType::MsgSnapshot {
                g.raw.report_snapshot(m.to, SnapshotStatus::Failure);
            }
            continue;
        }
        let wait_ns = g.traffic.as_ref().map_or(0, |tr| tr.send_wait_ns());
        if wait_ns > 0 {
            g.held.push_front(m);
            // A bucket with no rate answers u64::MAX: look again at least every PACING_LOOK.
            return Some(now + Duration::from_nanos(wait_ns).min(PACING_LOOK));
        }
        send_one(t, gid, g, m);
    }
    g.held_counted_to = None;
    None
}

fn apply_entries(gid: u64, g: &mut Group, entries: Vec<raft::eraftpb::Entry>) -> Result<(), (u64, String)> {
    for e in entries {
        match e.get_entry_type() {
            EntryType::EntryNormal => {
                if e.context[..] == *PREFER_CTX {
                    apply_preference(g, &e.data);
                    complete_up_to(g, e.index, None);
                    continue;
                }
                if e.data.is_empty() {
                    complete_up_to(g, e.index, None); // a new leader's empty entry
                    answer_lost_forwards(g, e.term);
                    continue;
                }
                let result = match Mutation::decode_entry(&e.data) {
                    Ok(Decoded::Command(c)) => Ok(Applied::Command(g.machine.apply_command(e.index, c))),
                    Ok(Decoded::Other(m)) => Ok(g.machine.apply(e.index, &m)),
                    Err(_) => Err(ProposeError::Corrupt),
                };
                let id = id_of(&e.context);
                if let Some(id) = id {
                    // Nobody waits here for most entries (every follower's, and a restarted
                    // node's re-applied log): the result moves into the kept results, no copy.
                    let waited = g.forwarded.contains_key(&id)
                        || g.pending.first_key_value().is_some_and(|(&i, w)| i == e.index && w.id == id);
                    if !waited {
                        let outcome = match result {
                            Ok(Applied::Command(o)) => Some(o),
                            _ => None,
                        };
                        g.machine.remember(e.index, id, outcome);
                        complete_up_to(g, e.index, None);
                        continue;
                    }
                    let outcome = match &result {
                        Ok(Applied::Command(o)) => Some(o.clone()),
                        _ => None,
                    };
                    g.machine.remember(e.index, id, outcome);
                }
                if let Some(w) = id.and_then(|id| g.forwarded.remove(&id)) {
                    g.replies.push((w.done, result.clone()));
                }
                complete_up_to(g, e.index, id.map(|id| (id, result)));
            }
            EntryType::EntryConfChange => {
                let cc = ConfChange::parse_from_bytes(&e.data).map_err(|x| (gid, x.to_string()))?;
                learn_peer(g, &cc);
                let cs = g.raw.apply_conf_change(&cc).map_err(|x| (gid, x.to_string()))?;
                g.raw.mut_store().set_conf_state(cs).map_err(|x| (gid, x.to_string()))?;
                complete_up_to(g, e.index, None);
            }
            EntryType::EntryConfChangeV2 => {
                let cc = ConfChangeV2::parse_from_bytes(&e.data).map_err(|x| (gid, x.to_string()))?;
                let cs = g.raw.apply_conf_change(&cc).map_err(|x| (gid, x.to_string()))?;
                g.raw.mut_store().set_conf_state(cs).map_err(|x| (gid, x.to_string()))?;
                complete_up_to(g, e.index, None);
            }
        }
    }
    Ok(())
}

/// Entry `index` was applied (with `applied` = its proposal id and result, if it had an id):
/// every proposal waiting at a lower index was lost; the one at `index` completes if it is
/// the same proposal, else it was lost too.
fn complete_up_to(g: &mut Group, index: u64, applied: Option<(u64, Result<Applied, ProposeError>)>) {
    while let Some((&i, _)) = g.pending.first_key_value() {
        if i > index {
            break;
        }
        let Some((_, w)) = g.pending.pop_first() else { break };
        let r = match &applied {
            Some((aid, r)) if i == index && *aid == w.id => r.clone(),
            _ => Err(ProposeError::Dropped),
        };
        g.replies.push((w.done, r));
    }
}

/// A snapshot up to `index` was installed: its entries were never applied here one by one,
/// so the callers waiting for them learn their results from the results the snapshot carries
/// (`TenantMachine::recall`). A forwarded proposal found there completes with its result (not
/// found: its entry may still come, it keeps waiting). A proposal this node appended (as
/// leader) at an index the snapshot covers completes with its result if its entry is the one
/// there, is `Dropped` if another entry took that index, and gets `Timeout` (outcome
/// unknown) if the snapshot's results do not reach back to it. (Without the results, the
/// forwarded ones waited until their deadline — `Timeout` although applied — and the appended
/// ones were all `Dropped`, although one may have been committed by the next leader.)
fn complete_from_snapshot(g: &mut Group, index: u64) {
    let result = |outcome: Option<CommandOutcome>| match outcome {
        Some(o) => Ok(Applied::Command(o)),
        // Applied, but only command results are kept.
        None => Err(ProposeError::Timeout),
    };
    let covered = g.pending.first_key_value().is_some_and(|(&i, _)| i <= index);
    if g.forwarded.is_empty() && !covered {
        return;
    }
    let known = g.machine.recall_all();
    if !g.forwarded.is_empty() {
        let ids: Vec<u64> = g.forwarded.keys().copied().collect();
        for id in ids {
            let Recalled::Applied { outcome, .. } = known.get(id) else { continue };
            if let Some(w) = g.forwarded.remove(&id) {
                g.replies.push((w.done, result(outcome)));
            }
        }
    }
    while let Some((&i, _)) = g.pending.first_key_value() {
        if i > index {
            break;
        }
        let Some((_, w)) = g.pending.pop_first() else { break };
        let r = match known.get(w.id) {
            Recalled::Applied { outcome, .. } => result(outcome),
            Recalled::NotSince { from_index } if from_index <= i => Err(ProposeError::Dropped),
            Recalled::NotSince { .. } => Err(ProposeError::Timeout),
        };
        g.replies.push((w.done, r));
    }
}

/// The empty entry a leader of `term` appends first was applied here: every entry of an
/// earlier term that this leader committed lies before it and is applied, so a proposal this
/// node forwarded in an earlier term that has not completed was lost with its leader (a hung
/// leader's socket, a leader transfer that dropped it). Its caller hears `Timeout` (outcome
/// unknown, never "failed": the old leader, once a follower, may still forward it on) now,
/// not at its deadline — with a hung leader that is the failover time the client sees.
fn answer_lost_forwards(g: &mut Group, term: u64) {
    if g.forwarded.values().all(|w| w.term >= term) {
        return;
    }
    let lost: Vec<u64> = g.forwarded.iter().filter(|(_, w)| w.term < term).map(|(&id, _)| id).collect();
    for id in lost {
        if let Some(w) = g.forwarded.remove(&id) {
            g.replies.push((w.done, Err(ProposeError::Timeout)));
        }
    }
}

fn id_of(ctx: &[u8]) -> Option<u64> {
    let a: [u8; 8] = ctx.try_into().ok()?;
    Some(u64::from_le_bytes(a))
}

/// Callers waiting in the group (bounded by `PENDING_PROPOSALS_MAX`).
fn waiting(g: &Group) -> usize {
    g.pending.len() + g.forwarded.len() + g.unsent.len() + g.batch.len() + g.reads_asked.len() + g.reads_ready.len()
}

/// Propose a turn's proposals of one group as one raft-rs proposal of many entries (in
/// order): on the leader they take consecutive indexes (remembered) and go to each follower
/// in one append; on a follower raft-rs forwards them to the leader in one message (ids
/// remembered). With no leader (reachable) yet, or a follower's raft-rs refusing to forward
/// (a candidate), they wait in `unsent` and `retry_unsent` hands them back in a later turn.
fn propose_batch(g: &mut Group, batch: Vec<(Vec<u8>, Waiter)>, t: &Transport) {
    let r = &g.raw.raft;
    if r.leader_id == 0 || r.lead_transferee.is_some() || leader_unreachable(g, t) {
        g.unsent.extend(batch.into_iter().map(|(data, waiter)| Unsent { data: Some(data), waiter }));
        return;
    }
    let leader = r.state == StateRole::Leader;
    let before = r.raft_log.last_index();
    let n = batch.len() as u64;
    let mut waiters = Vec::with_capacity(batch.len());
    let mut entries = Vec::with_capacity(batch.len());
    for (data, w) in batch {
        entries.push(Entry { data: data.into(), context: w.id.to_le_bytes().to_vec().into(), ..Default::default() });
        waiters.push(w);
    }
    // On a follower, the entries' data (shared buffers: no copy) in case raft-rs refuses.
    let kept: Vec<_> = if leader { Vec::new() } else { entries.iter().map(|e| e.data.clone()).collect() };
    let mut m = Message::default();
    m.set_msg_type(MessageType::MsgPropose);
    m.from = r.id;
    m.set_entries(entries.into());
    let res = g.raw.raft.step(m);
    if leader {
        if res.is_ok() && g.raw.raft.raft_log.last_index() == before + n {
            for (i, w) in (before + 1..).zip(waiters) {
                g.pending.insert(i, w);
            }
        } else {
            g.replies.extend(waiters.into_iter().map(|w| (w.done, Err(ProposeError::NotLeader(None)))));
        }
    } else if res.is_ok() {
        g.forwarded_total += n;
        let term = g.raw.raft.term;
        g.forwarded.extend(waiters.into_iter().map(|w| (w.id, Waiter { term, ..w })));
    } else {
        // raft-rs sent nothing (a candidate, or no leader after all): never proposed; it waits
        // for a leader like one that came with none known (its deadline still holds).
        g.unsent.extend(kept.into_iter().zip(waiters).map(|(d, waiter)| Unsent { data: Some(d.to_vec()), waiter }));
    }
}

/// Ask for a ReadIndex; Some = no leader to ask yet.
fn try_read_index(g: &mut Group, w: Waiter, t: &Transport) -> Option<Unsent> {
    if g.raw.raft.leader_id == 0 || leader_unreachable(g, t) {
        return Some(Unsent { data: None, waiter: w });
    }
    g.raw.read_index(w.id.to_le_bytes().to_vec());
    g.reads_sent_at.insert(w.id, Instant::now());
    g.reads_asked.insert(w.id, w);
    None
}

/// This node follows a leader it has no connection to: a proposal or read sent now would be
/// dropped by the transport, so it waits (in `unsent`) for a leader it can reach.
fn leader_unreachable(g: &Group, t: &Transport) -> bool {
    let r = &g.raw.raft;
    r.state != StateRole::Leader && r.leader_id != 0 && !t.connected(r.leader_id)
}

/// Every tick, on a follower: if the connection to the group's leader is down (a killed
/// process's sockets are closed by its kernel at once, so this is seen within a tick, not
/// after an election timeout of silence), act on it now:
/// - proposals forwarded to that leader are answered `Timeout` (outcome unknown: the leader
///   may have replicated them before dying, and a new leader may still commit them), so the
///   client hears back at once instead of at its deadline;
/// - this node leaves the leader's lease (raft-rs's check-quorum refuses votes for an
///   election timeout after hearing from a leader), so it can vote for a successor;
/// - the lowest-id voter still connected (one node, so the two survivors of three do not
///   split the vote) starts a pre-vote election at once and asks again every tick while it
///   gets no answer (a peer that has not yet seen the drop ignores it), for one election
///   timeout; after that the randomized timeout rules as usual.
///
/// Safe whatever the cause of the drop: a pre-vote changes no term, and it wins only if a
/// majority is out of the lease too, i.e. has lost the leader as well; a live leader that
/// still reaches a majority is never disturbed. A hung leader whose sockets stay open is
/// still found by the election timeout.
fn notice_leader_loss(g: &mut Group, t: &Transport) {
    let r = &g.raw.raft;
    if r.state == StateRole::PreCandidate && g.loss_campaign_ticks > 0 {
        g.loss_campaign_ticks -= 1;
        let _ = g.raw.campaign();
        return;
    }
    if r.state != StateRole::PreCandidate {
        g.loss_campaign_ticks = 0;
    }
    let lead = r.leader_id;
    if r.state != StateRole::Follower || lead == 0 || lead == r.id || t.connected(lead) {
        return;
    }
    for (_, w) in g.forwarded.drain() {
        g.replies.push((w.done, Err(ProposeError::Timeout)));
    }
    let lease = r.election_timeout();
    let me = r.id;
    g.raw.raft.election_elapsed = g.raw.raft.election_elapsed.max(lease);
    let first =
        g.raw.store().conf_state().voters.iter().copied().filter(|&v| v != lead && (v == me || t.connected(v))).min();
    if first == Some(me) && g.raw.campaign().is_ok() {
        g.loss_campaigns += 1;
        g.loss_campaign_ticks = g.election_ticks;
    }
}

/// Reads whose index this replica has applied are released.
fn release_reads(g: &mut Group) {
    if g.reads_ready.is_empty() {
        return;
    }
    let applied = g.raw.raft.raft_log.applied;
    let (now, later): (Vec<_>, Vec<_>) =
        std::mem::take(&mut g.reads_ready).into_iter().partition(|(i, _)| *i <= applied);
    g.reads_ready = later;
    for (_, w) in now {
        g.replies.push((w.done, Ok(Applied::ReadBarrier)));
    }
}

/// How long an asked ReadIndex may go unanswered before it is asked again.
const READ_RESEND_AFTER: Duration = Duration::from_millis(300);

/// Ask again for the reads whose ReadIndex went unanswered (lost with a leader change).
fn resend_reads(g: &mut Group, now: Instant) {
    if g.raw.raft.leader_id == 0 {
        return;
    }
    let due: Vec<u64> =
        g.reads_sent_at.iter().filter(|(_, &t)| t + READ_RESEND_AFTER <= now).map(|(&id, _)| id).collect();
    for id in due {
        g.raw.read_index(id.to_le_bytes().to_vec());
        g.reads_sent_at.insert(id, now);
    }
}

/// Callers past their deadline hear why: never proposed (`NoLeader`) or unknown (`Timeout`).
fn expire(g: &mut Group, now: Instant) {
    let due = |w: &Waiter| w.deadline <= now;
    let mut out: Vec<(Done, Result<Applied, ProposeError>)> = Vec::new();
    let (gone, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut g.unsent).into_iter().partition(|u| due(&u.waiter));
    g.unsent = keep.into();
    out.extend(gone.into_iter().map(|u| (u.waiter.done, Err(ProposeError::NoLeader))));
    let late: Vec<u64> = g.pending.iter().filter(|(_, w)| due(w)).map(|(&i, _)| i).collect();
    out.extend(late.into_iter().filter_map(|i| g.pending.remove(&i)).map(|w| (w.done, Err(ProposeError::Timeout))));
    g.reads_sent_at.retain(|id, _| g.reads_asked.get(id).is_some_and(|w| w.deadline > now));
    for map in [&mut g.forwarded, &mut g.reads_asked] {
        let late: Vec<u64> = map.iter().filter(|(_, w)| due(w)).map(|(&i, _)| i).collect();
        out.extend(late.into_iter().filter_map(|i| map.remove(&i)).map(|w| (w.done, Err(ProposeError::Timeout))));
    }
    let (gone, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut g.reads_ready).into_iter().partition(|(_, w)| due(w));
    g.reads_ready = keep;
    out.extend(gone.into_iter().map(|(_, w)| (w.done, Err(ProposeError::Timeout))));
    g.replies.extend(out);
}

/// On the leader, about once per election timeout: if the group's preferred leader is
/// another node that is connected and has the whole log, hand leadership to it (raft-rs
/// leader transfer; it aborts by itself if the target does not take over in time).
fn restore_preferred_leader(g: &mut Group, t: &Transport) {
    g.ticks_since_transfer_check += 1;
    if g.ticks_since_transfer_check < g.election_ticks && !g.transfer_soon {
        return;
    }
    g.ticks_since_transfer_check = 0;
    let Some(p) = g.preferred_leader else { return };
    if g.raw.raft.leader_id == p {
        g.transfer_soon = false;
    }
    let r = &g.raw.raft;
    if r.state != StateRole::Leader || p == r.id || r.lead_transferee.is_some() || !t.connected(p) {
        return;
    }
    let caught_up = r.prs().get(p).is_some_and(|pr| pr.matched == r.raft_log.last_index());
    if caught_up {
        g.raw.transfer_leader(p);
    }
}

fn maybe_compact(g: &mut Group) -> Result<(), StorageFault> {
    let applied = g.raw.raft.raft_log.applied;
    let store = g.raw.store();
    let due = applied.saturating_sub(store.snapshot_index()) > g.log_entries_max;
    if !(due || g.compact_soon && applied > store.snapshot_index()) {
        return Ok(());
    }
    // A snapshot costs the store's size: take one only once the entries since the last one
    // are at least as large as it (the log is then at most about twice the store), so the
    // copying stays proportional to the bytes written, whatever the store's size; below the
    // byte floor, at most one per `compact_interval` (a small store under a high write rate
    // is not copied every few thousand writes, and a restart re-applies at most about an
    // interval of writes). A voter just added (`compact_soon`) needs one at once, whatever
    // its size.
    if !g.compact_soon {
        let snap_bytes = store.latest_snapshot().data.len() as u64;
        let log_bytes = store.log_bytes();
        if log_bytes < snap_bytes.saturating_mul(2)
            || log_bytes < g.compact_log_bytes_min && g.compacted_at.elapsed() < g.compact_interval
        {
            return Ok(());
        }
    }
    g.compact_soon = false;
    g.compacted_at = Instant::now();
    let Ok(term) = g.raw.raft.raft_log.term(applied) else { return Ok(()) };
    // Written into the previous snapshot's buffer when nothing else holds it: a store's size
    // of fresh pages per compaction was most of a raft thread's CPU at 1 KiB values.
    let machine = &g.machine;
    g.raw.mut_store().compact_with(applied, term, |buf| machine.snapshot_data_into(buf))
}

/// A change to a group made through the admin API (`PUT /tenants/{name}`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AdminOp {
    /// Make this node the group's preferred leader on every replica (a log entry, so the
    /// choice outlives the current leader); the leader hands leadership to it (raft-rs leader
    /// transfer) as soon as it is connected and has the whole log.
    PreferLeader(u64),
    /// Add a voter (raft-rs conf change); its raft address travels in the conf change, so
    /// every node learns where it is. The new node starts with an empty group (`join`) and
    /// gets the log or a snapshot from the leader.
    AddVoter(u64, SocketAddr),
    /// Remove a voter (a dead node being replaced).
    RemoveVoter(u64),
}

impl AdminOp {
    fn seen_in(&self, st: &GroupStatus) -> bool {
        match *self {
            AdminOp::PreferLeader(to) => st.leader_id == to && st.preferred_leader == to,
            AdminOp::AddVoter(id, _) => st.voters.contains(&id),
            AdminOp::RemoveVoter(id) => !st.voters.contains(&id),
        }
    }
}

/// How long an admin change waits before proposing again after its leader dropped it (see
/// `ReplicationNode::admin`): about a tick, the pace at which a transfer or election moves.
const ADMIN_RETRY_PAUSE: Duration = Duration::from_millis(20);

/// Why an admin change was refused or did not take effect in time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdminError {
    NotAVoter(u64),
    AlreadyAVoter(u64),
    /// The group has `NODES_MAX` voters already.
    TooManyVoters,
    /// Removing the last voter would leave the group with none.
    LastVoter,
    /// No leader known, busy, stopped, or not seen applied by the deadline (`Timeout`: the
    /// change may still happen).
    Group(ProposeError),
}

impl std::fmt::Display for AdminError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AdminError::NotAVoter(id) => write!(f, "node {id} is not a voter of this group"),
            AdminError::AlreadyAVoter(id) => write!(f, "node {id} is a voter of this group already"),
            AdminError::TooManyVoters => write!(f, "the group has {} voters already", crate::cluster::NODES_MAX),
            AdminError::LastVoter => write!(f, "cannot remove the group's last voter"),
            AdminError::Group(e) => write!(f, "{e:?}"),
        }
    }
}

impl std::error::Error for AdminError {}

/// Context of the log entry that sets a group's preferred leader (its data: the node id, u64
/// LE; 0 = none). Not 8 bytes long, so it is never taken for a proposal id.
const PREFER_CTX: &[u8] = b"slipstream/preferred-leader";

/// Check `op` against the group's configuration and propose it (a follower forwards it).
fn propose_admin(g: &mut Group, op: AdminOp) -> Result<(), AdminError> {
    let voters = g.raw.store().conf_state().voters.clone();
    let leader = g.raw.raft.leader_id;
    if leader == 0 {
        return Err(AdminError::Group(ProposeError::NoLeader));
    }
    let r = match op {
        AdminOp::PreferLeader(to) => {
            if !voters.contains(&to) {
                return Err(AdminError::NotAVoter(to));
            }
            g.raw.propose(PREFER_CTX.to_vec(), to.to_le_bytes().to_vec())
        }
        AdminOp::AddVoter(id, addr) => {
            if voters.contains(&id) {
                return Err(AdminError::AlreadyAVoter(id));
            }
            if voters.len() >= crate::cluster::NODES_MAX {
                return Err(AdminError::TooManyVoters);
            }
            let mut cc =
                ConfChange { node_id: id, context: addr.to_string().into_bytes().into(), ..Default::default() };
            cc.set_change_type(ConfChangeType::AddNode);
            g.raw.propose_conf_change(Vec::new(), cc)
        }
        AdminOp::RemoveVoter(id) => {
            if !voters.contains(&id) {
                return Err(AdminError::NotAVoter(id));
            }
            if voters.len() <= 1 {
                return Err(AdminError::LastVoter);
            }
            let mut cc = ConfChange { node_id: id, ..Default::default() };
            cc.set_change_type(ConfChangeType::RemoveNode);
            g.raw.propose_conf_change(Vec::new(), cc)
        }
    };
    r.map_err(|_| AdminError::Group(ProposeError::NotLeader(Some(leader))))
}

/// A preferred-leader entry was applied: every replica now prefers that node; the leader
/// checks every tick until it leads.
fn apply_preference(g: &mut Group, data: &[u8]) {
    let Ok(id) = <[u8; 8]>::try_from(data) else { return };
    let id = u64::from_le_bytes(id);
    g.preferred_leader = (id != 0).then_some(id);
    g.transfer_soon = true;
}

/// An applied conf change that adds a node carries its raft address: remember it for the
/// transport.
fn learn_peer(g: &mut Group, cc: &ConfChange) {
    let adds = matches!(cc.get_change_type(), ConfChangeType::AddNode | ConfChangeType::AddLearnerNode);
    let addr = std::str::from_utf8(&cc.context).ok().and_then(|a| a.parse::<SocketAddr>().ok());
    if let (true, Some(addr)) = (adds, addr) {
        g.learned_peers.push((cc.node_id, addr));
    }
    g.compact_soon |= adds;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stop_events(n: usize, tx: &Inbox) -> usize {
        (0..n).filter(|_| tx.try_send(Event::Stop).is_ok()).count()
    }

    #[test]
    fn the_inbox_refuses_past_its_bound_and_takes_again_once_emptied() {
        let (tx, rx) = Inbox::new();
        assert_eq!(stop_events(INBOX_EVENTS_MAX + 10, &tx), INBOX_EVENTS_MAX);
        assert!(matches!(tx.try_send(Event::Stop), Err(TrySendError::Full(_))));
        // Stop is heard whatever the bound.
        tx.send_stop();
        let mut taken = 0;
        while rx.try_recv().is_some() {
            taken += 1;
        }
        assert_eq!(taken, INBOX_EVENTS_MAX + 1);
        assert_eq!(stop_events(3, &tx), 3);
        assert!(rx.recv_timeout(Duration::from_millis(10)).is_ok());
    }

    #[test]
    fn a_waiting_sender_goes_on_when_the_node_takes_and_gives_up_when_it_is_gone() {
        let (tx, rx) = Inbox::new();
        assert_eq!(stop_events(INBOX_EVENTS_MAX, &tx), INBOX_EVENTS_MAX);
        let waiting = {
            let tx = tx.clone();
            std::thread::spawn(move || tx.send_waiting(Event::Stop))
        };
        std::thread::sleep(Duration::from_millis(20));
        assert!(!waiting.is_finished(), "the inbox is full: the sender waits");
        assert!(rx.try_recv().is_some());
        assert!(waiting.join().unwrap_or(false), "one event taken: the waiting one is queued");
        drop(rx);
        assert!(!tx.send_waiting(Event::Stop), "the node thread is gone");
        assert!(matches!(tx.try_send(Event::Stop), Err(TrySendError::Disconnected(_))));
    }
}
