//! A 3-node cluster in one process on loopback: elections, replicated writes, a leader
//! killed (its node dropped), a node restarted from its data_dir catching up by snapshot,
//! and identical contents on every replica. Seeded (SLIPSTREAM_TEST_SEED), the seed printed.

// Test code: unwrap() in test set-up is the clearest failure.
#![allow(clippy::unwrap_used)]

use slipstream_replication::machine::CommandOutcome;
use slipstream_replication::node::GroupTraffic;
use slipstream_replication::storage::FsyncMode;
use slipstream_replication::{Applied, GroupSpec, Mutation, NodeConfig, ProposeError, ReplicationNode, StateRole};
use slipstream_store::{ArithResult, DeleteResult, GetOpts, SetMode, Store, StoreConfig, StoreResult};
use slipstream_tenancy::{Direction, TenantShaper};
use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// Counts a group's raft bytes on one node (what the server charges to the tenant's buckets);
/// once given a shaper, charges its egress bucket and paces the group by it, as the server's
/// `TenantTraffic` does.
#[derive(Default)]
struct Meter {
    sent: AtomicU64,
    received: AtomicU64,
    paced_ns: AtomicU64,
    shaper: OnceLock<Arc<TenantShaper>>,
}

impl GroupTraffic for Meter {
    fn sent(&self, bytes: u64) {
        self.sent.fetch_add(bytes, Ordering::Relaxed);
        if let Some(s) = self.shaper.get() {
            s.charge_transfer(Direction::Out, bytes);
        }
    }
    fn received(&self, bytes: u64) {
        self.received.fetch_add(bytes, Ordering::Relaxed);
    }
    fn send_wait_ns(&self) -> u64 {
        self.shaper.get().map_or(0, |s| s.transfer_wait_ns(Direction::Out, slipstream_tenancy::since_start_ns()))
    }
    fn paced(&self, ns: u64) {
        self.paced_ns.fetch_add(ns, Ordering::Relaxed);
    }
}

const GROUPS: [u64; 3] = [1, 2, 3];
const NODES: [u64; 3] = [1, 2, 3];

/// xorshift64*: enough for choosing keys and victims, reproducible from the seed.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn seed() -> u64 {
    let s = std::env::var("SLIPSTREAM_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1)
    });
    eprintln!("seed: SLIPSTREAM_TEST_SEED={s}");
    s | 1
}

struct Cluster {
    dir: PathBuf,
    peers: BTreeMap<u64, SocketAddr>,
    nodes: BTreeMap<u64, ReplicationNode>,
    fsync: FsyncMode,
    log_entries_max: u64,
    /// Group g prefers node g as its leader.
    preferred: bool,
    /// (node, group) → its raft traffic, kept across restarts.
    meters: BTreeMap<(u64, u64), Arc<Meter>>,
    /// Election timeout in 20 ms ticks (randomized up to twice that).
    election_ticks: usize,
    /// NodeConfig::compact_log_bytes_min of nodes started from now on.
    compact_log_bytes_min: u64,
    /// NodeConfig::compact_interval_ms of nodes started from now on.
    compact_interval_ms: u64,
    /// Group → the nodes holding it (its voters); a node starts only the groups it holds.
    placement: BTreeMap<u64, Vec<u64>>,
}

impl Cluster {
    fn new(name: &str, fsync: FsyncMode, log_entries_max: u64) -> Cluster {
        Cluster::build(name, fsync, log_entries_max, false)
    }

    fn build(name: &str, fsync: FsyncMode, log_entries_max: u64, preferred: bool) -> Cluster {
        Cluster::build_timed(name, fsync, log_entries_max, preferred, 10)
    }

    fn build_timed(
        name: &str,
        fsync: FsyncMode,
        log_entries_max: u64,
        preferred: bool,
        election_ticks: usize,
    ) -> Cluster {
        let placement = GROUPS.iter().map(|&g| (g, NODES.to_vec())).collect();
        Cluster::build_placed(name, fsync, log_entries_max, preferred, election_ticks, &NODES, placement)
    }

    fn build_placed(
        name: &str,
        fsync: FsyncMode,
        log_entries_max: u64,
        preferred: bool,
        election_ticks: usize,
        node_ids: &[u64],
        placement: BTreeMap<u64, Vec<u64>>,
    ) -> Cluster {
        let dir = std::env::temp_dir().join(format!("slipstream-cluster-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        // Hold all listeners at once so the ports differ, then free them for the nodes.
        let ls: Vec<TcpListener> = node_ids.iter().map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
        let peers = node_ids.iter().zip(&ls).map(|(&id, l)| (id, l.local_addr().unwrap())).collect();
        drop(ls);
        let mut c = Cluster {
            dir,
            peers,
            nodes: BTreeMap::new(),
            fsync,
            log_entries_max,
            preferred,
            meters: BTreeMap::new(),
            election_ticks,
            compact_log_bytes_min: 0, // the tests' small logs must compact too
            compact_interval_ms: slipstream_replication::node::COMPACT_INTERVAL_MS_DEFAULT,
            placement,
        };
        for &id in node_ids {
            c.start(id);
        }
        c
    }

    fn start(&mut self, id: u64) {
        let mut cfg = NodeConfig::new(id, self.peers.clone(), self.dir.join(format!("node-{id}")));
        cfg.fsync = self.fsync;
        cfg.tick_ms = 20;
        cfg.election_ticks = self.election_ticks;
        cfg.heartbeat_ticks = 2;
        cfg.log_entries_max = self.log_entries_max;
        cfg.compact_log_bytes_min = self.compact_log_bytes_min;
        cfg.compact_interval_ms = self.compact_interval_ms;
        let groups: Vec<GroupSpec> = self
            .placement
            .iter()
            .filter(|(_, voters)| voters.contains(&id))
            .map(|(&g, voters)| GroupSpec {
                group_id: g,
                voters: voters.clone(),
                store: Arc::new(Store::new(StoreConfig { shards: 4, ..StoreConfig::default() })),
                preferred_leader: self.preferred.then_some(g),
                exec: None,
                traffic: Some(self.meters.entry((id, g)).or_default().clone()),
            })
            .collect();
        // The port was just freed by the previous incarnation; retry binding briefly.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match ReplicationNode::start(cfg.clone(), groups_clone(&groups)) {
                Ok(n) => {
                    self.nodes.insert(id, n);
                    return;
                }
                Err(e) if Instant::now() < deadline => {
                    eprintln!("node {id} start: {e}; retrying");
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => panic!("node {id} start: {e}"),
            }
        }
    }

    fn kill(&mut self, id: u64) {
        drop(self.nodes.remove(&id));
    }

    /// The live node that is leader of `group` with the highest term.
    fn leader(&self, group: u64) -> Option<u64> {
        self.nodes
            .iter()
            .filter_map(|(&id, n)| n.status(group).filter(|s| s.role == StateRole::Leader).map(|s| (s.term, id)))
            .max()
            .map(|(_, id)| id)
    }

    fn wait_leader(&self, group: u64, within: Duration) -> u64 {
        let deadline = Instant::now() + within;
        loop {
            if let Some(l) = self.leader(group) {
                return l;
            }
            assert!(Instant::now() < deadline, "no leader for group {group} within {within:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Propose until acknowledged (retrying on leader changes), within `within`.
    fn write(&self, group: u64, m: &Mutation, within: Duration) -> Applied {
        let deadline = Instant::now() + within;
        loop {
            assert!(Instant::now() < deadline, "write to group {group} not acknowledged within {within:?}");
            let Some(l) = self.leader(group) else {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            };
            match self.nodes[&l].propose(group, m).wait(Duration::from_secs(2)) {
                Some(Ok(a)) => return a,
                Some(Err(
                    ProposeError::NotLeader(_) | ProposeError::Dropped | ProposeError::Busy | ProposeError::Stopped,
                ))
                | None => std::thread::sleep(Duration::from_millis(10)),
                Some(Err(e)) => panic!("write failed: {e:?}"),
            }
        }
    }

    /// Wait until every live replica of `group` applied the same index, and return it.
    fn wait_converged(&self, group: u64, within: Duration) -> u64 {
        let deadline = Instant::now() + within;
        loop {
            let l = self.leader(group);
            let commit = l.and_then(|l| self.nodes[&l].status(group)).map(|s| s.commit_index);
            let applied: Vec<u64> =
                self.nodes.values().filter_map(|n| n.status(group)).map(|s| s.applied_index).collect();
            let members = self.nodes.keys().filter(|n| self.placement[&group].contains(n)).count();
            if let Some(c) = commit {
                if applied.len() == members && applied.iter().all(|&a| a == c) {
                    return c;
                }
            }
            assert!(Instant::now() < deadline, "group {group} did not converge: commit {commit:?} applied {applied:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn hashes(&self, group: u64) -> Vec<u64> {
        let h: Vec<u64> = self.nodes.values().filter_map(|n| n.machine(group)).map(|m| m.content_hash()).collect();
        if h.iter().any(|&x| x != h[0]) {
            for (id, n) in self.nodes.iter().filter(|(_, n)| n.machine(group).is_some()) {
                let mut items = Vec::new();
                n.machine(group).unwrap().store().export(|i| {
                    items.push(format!(
                        "{}={:?} f{} c{} e{} s{}",
                        String::from_utf8_lossy(i.key),
                        String::from_utf8_lossy(i.value),
                        i.flags,
                        i.cas,
                        i.exptime_unix_s,
                        i.stale
                    ))
                });
                items.sort();
                eprintln!("node {id} group {group} status {:?}: {items:?}", n.status(group));
            }
            std::thread::sleep(Duration::from_millis(500));
            for (id, n) in self.nodes.iter().filter(|(_, n)| n.machine(group).is_some()) {
                eprintln!(
                    "later: node {id} status {:?} hash {}",
                    n.status(group),
                    n.machine(group).unwrap().content_hash()
                );
            }
        }
        h
    }

    fn value_on(&self, node: u64, group: u64, key: &str) -> Option<String> {
        self.nodes[&node].machine(group).unwrap().store().get(key.as_bytes(), GetOpts::default(), |o| {
            o.item.map(|i| String::from_utf8_lossy(i.value).trim_end().to_string())
        })
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.nodes.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn groups_clone(g: &[GroupSpec]) -> Vec<GroupSpec> {
    g.iter()
        .map(|s| GroupSpec {
            group_id: s.group_id,
            voters: s.voters.clone(),
            store: Arc::new(Store::new(s.store.config().clone())),
            preferred_leader: s.preferred_leader,
            exec: s.exec.clone(),
            traffic: s.traffic.clone(),
        })
        .collect()
}

fn set(key: &str, value: &str) -> Mutation {
    Mutation::Store {
        mode: SetMode::Set,
        key: key.into(),
        value: value.into(),
        flags: 0,
        exptime: 0,
        cas: None,
        explicit_cas: None,
        invalidate: false,
        vivify_exptime: None,
        key_binary: false,
    }
}

/// One random write against the model of acknowledged state (key → value), applied to the
/// model only once the cluster acknowledged it.
fn random_write(c: &Cluster, rng: &mut Rng, group: u64, model: &mut BTreeMap<String, String>, seq: u64) {
    let key = format!("k{}", rng.below(20));
    let w = Duration::from_secs(10);
    match rng.below(10) {
        0..=5 => {
            let v = format!("v{seq}");
            assert!(matches!(c.write(group, &set(&key, &v), w), Applied::Store(StoreResult::Stored(_))));
            model.insert(key, v);
        }
        6..=7 => {
            let m = Mutation::Arith {
                key: key.clone().into(),
                incr: true,
                delta: 3,
                vivify: Some((7, 0)),
                cas: None,
                touch_exptime: None,
            };
            match c.write(group, &m, w) {
                Applied::Arith(ArithResult::Ok { value, .. }) => {
                    model.insert(key, value.to_string());
                }
                Applied::Arith(ArithResult::NonNumeric) => assert!(model[&key].starts_with('v')),
                other => panic!("incr: {other:?}"),
            }
        }
        _ => {
            let m =
                Mutation::Delete { key: key.clone().into(), cas: None, invalidate: false, invalidate_exptime: None };
            match c.write(group, &m, w) {
                Applied::Delete(DeleteResult::Deleted) => {
                    assert!(model.remove(&key).is_some(), "deleted {key} unknown to model")
                }
                Applied::Delete(DeleteResult::NotFound) => assert!(!model.contains_key(&key), "{key} lost"),
                other => panic!("delete: {other:?}"),
            }
        }
    }
}

fn check_model(c: &Cluster, group: u64, model: &BTreeMap<String, String>) {
    for &n in c.nodes.keys().filter(|n| c.placement[&group].contains(n)) {
        for i in 0..20 {
            let k = format!("k{i}");
            assert_eq!(c.value_on(n, group, &k).as_ref(), model.get(&k), "node {n} group {group} key {k}");
        }
    }
}

#[test]
fn three_nodes_fail_over_and_restarted_node_catches_up_by_snapshot() {
    let t0 = Instant::now();
    let mut rng = Rng(seed());
    let mut c = Cluster::new("failover", FsyncMode::Batch, 40);
    let mut models: BTreeMap<u64, BTreeMap<String, String>> = GROUPS.iter().map(|&g| (g, BTreeMap::new())).collect();
    for g in GROUPS {
        let l = c.wait_leader(g, Duration::from_secs(10));
        eprintln!("group {g}: leader {l}");
    }
    let mut seq = 0;
    for _ in 0..150 {
        seq += 1;
        let g = GROUPS[rng.below(3) as usize];
        random_write(&c, &mut rng, g, models.get_mut(&g).unwrap(), seq);
    }
    // Kill the leader of a random group.
    let victim_group = GROUPS[rng.below(3) as usize];
    let victim = c.wait_leader(victim_group, Duration::from_secs(5));
    let old_term = c.nodes[&victim].status(victim_group).unwrap().term;
    // Writes in flight at the kill: those acknowledged must survive, the rest may or may not.
    let inflight: Vec<_> = (0..20)
        .map(|i| c.nodes[&victim].propose(victim_group, &set(&format!("inflight{i}"), &format!("w{i}"))))
        .collect();
    std::thread::sleep(Duration::from_millis(rng.below(30)));
    let killed_at = Instant::now();
    c.kill(victim);
    let acked: Vec<usize> = inflight
        .iter()
        .enumerate()
        .filter(|(_, p)| matches!(p.wait(Duration::from_millis(100)), Some(Ok(Applied::Store(StoreResult::Stored(_))))))
        .map(|(i, _)| i)
        .collect();
    let new_leader = c.wait_leader(victim_group, Duration::from_secs(10));
    let failover = killed_at.elapsed();
    assert_ne!(new_leader, victim);
    assert!(c.nodes[&new_leader].status(victim_group).unwrap().term > old_term);
    eprintln!("killed node {victim} (leader of group {victim_group}); node {new_leader} leads after {failover:?}");
    eprintln!("{} of 20 writes in flight at the kill were acknowledged", acked.len());
    // Every acknowledged write is on the survivors.
    for g in GROUPS {
        c.wait_converged(g, Duration::from_secs(10));
        check_model(&c, g, &models[&g]);
    }
    for &n in c.nodes.keys() {
        for &i in &acked {
            assert_eq!(
                c.value_on(n, victim_group, &format!("inflight{i}")),
                Some(format!("w{i}")),
                "node {n}: acknowledged inflight{i} lost"
            );
        }
    }
    // Keep writing while the node is down: the leaders compact their logs past it.
    for _ in 0..150 {
        seq += 1;
        let g = GROUPS[rng.below(3) as usize];
        random_write(&c, &mut rng, g, models.get_mut(&g).unwrap(), seq);
    }
    c.start(victim);
    for g in GROUPS {
        c.wait_converged(g, Duration::from_secs(15));
        check_model(&c, g, &models[&g]);
        let h = c.hashes(g);
        assert!(h.iter().all(|&x| x == h[0]), "group {g}: replica hashes differ: {h:?}");
    }
    let snaps: u64 = GROUPS.iter().map(|&g| c.nodes[&victim].status(g).unwrap().snapshots_installed).sum();
    assert!(snaps > 0, "the restarted node should have caught up by snapshot");
    eprintln!("restarted node {victim} installed {snaps} snapshot(s); test took {:?}", t0.elapsed());
}

#[test]
fn all_nodes_restart_with_acknowledged_writes() {
    let mut rng = Rng(seed());
    let mut c = Cluster::new("restart", FsyncMode::Always, 30);
    let mut model = BTreeMap::new();
    c.wait_leader(1, Duration::from_secs(10));
    for seq in 0..60 {
        random_write(&c, &mut rng, 1, &mut model, seq);
    }
    let before = c.wait_converged(1, Duration::from_secs(10));
    for id in NODES {
        c.kill(id);
    }
    for id in NODES {
        c.start(id);
    }
    c.wait_leader(1, Duration::from_secs(10));
    // A new leader commits an entry of its term, then everything before it is applied.
    let after = c.write(1, &set("after", "restart"), Duration::from_secs(10));
    assert!(matches!(after, Applied::Store(StoreResult::Stored(cas)) if cas > before));
    model.insert("after".into(), "restart".into());
    c.wait_converged(1, Duration::from_secs(10));
    check_model(&c, 1, &model);
    let h = c.hashes(1);
    assert!(h.iter().all(|&x| x == h[0]), "replica hashes differ: {h:?}");
}

/// Every raft message of a group is accounted to that group alone, on both ends (what the
/// server charges to the tenant's own egress/ingress buckets): 40 writes of 8 KiB to group 1
/// show up as at least 2 x 320 KiB sent by its leader and 320 KiB received by each follower;
/// groups 2 and 3 (idle) carry only heartbeats.
#[test]
fn raft_traffic_is_accounted_to_its_own_group() {
    let c = Cluster::new("traffic", FsyncMode::Never, 10_000);
    for g in GROUPS {
        c.wait_leader(g, Duration::from_secs(10));
    }
    let value = "v".repeat(8192);
    let before: BTreeMap<(u64, u64), (u64, u64)> = c
        .meters
        .iter()
        .map(|(&k, m)| (k, (m.sent.load(Ordering::Relaxed), m.received.load(Ordering::Relaxed))))
        .collect();
    let t0 = Instant::now();
    for i in 0..40 {
        c.write(1, &set(&format!("k{i}"), &value), Duration::from_secs(10));
    }
    c.wait_converged(1, Duration::from_secs(10));
    let secs = t0.elapsed().as_secs_f64().max(0.001);
    let leader = c.wait_leader(1, Duration::from_secs(10));
    let delta = |node: u64, g: u64| {
        let m = &c.meters[&(node, g)];
        let (s0, r0) = before[&(node, g)];
        (m.sent.load(Ordering::Relaxed) - s0, m.received.load(Ordering::Relaxed) - r0)
    };
    let payload = 40 * 8192u64;
    assert!(delta(leader, 1).0 >= 2 * payload, "leader sent {:?}", delta(leader, 1));
    for n in NODES.iter().filter(|&&n| n != leader) {
        assert!(delta(*n, 1).1 >= payload, "node {n} received {:?}", delta(*n, 1));
    }
    // Idle groups: heartbeats only (well under 1 KiB per 100 ms on each node here).
    let idle_max = (20_000.0 * secs) as u64 + 20_000;
    for n in NODES {
        for g in [2, 3] {
            let (s, r) = delta(n, g);
            assert!(s < idle_max && r < idle_max, "node {n} group {g}: sent {s} received {r} in {secs:.2}s");
        }
    }
}

/// Pacing: group 1's egress bucket on every node gets a small rate; its leader, written hard
/// (32 proposals of 2 KiB always in flight), sends the group's raft bytes at that rate over a
/// 3 s window (not above: appends wait for the bucket; not far below: held messages go as it
/// refills), while heartbeats keep flowing: no group changes term or leader, and group 2
/// (led elsewhere, unpaced) commits meanwhile. The held time is reported.
#[test]
fn a_groups_raft_bytes_leave_at_its_egress_rate_without_an_election() {
    const RATE_BYTES_PER_S: u64 = 256 << 10;
    const BURST_BYTES: u64 = 32 << 10;
    const IN_FLIGHT: usize = 32;
    let c = Cluster::build("paced", FsyncMode::Never, 10_000, true);
    let wait_for_preferred = |g: u64| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while c.leader(g) != Some(g) {
            assert!(Instant::now() < deadline, "group {g}: leader {:?}, want {g}", c.leader(g));
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    for g in GROUPS {
        wait_for_preferred(g);
    }
    for n in NODES {
        let s = TenantShaper::new(
            u64::MAX >> 24,
            RATE_BYTES_PER_S,
            BURST_BYTES,
            64,
            1.0,
            slipstream_tenancy::since_start_ns(),
        );
        assert!(c.meters[&(n, 1)].shaper.set(Arc::new(s)).is_ok());
    }
    let terms = |c: &Cluster| -> Vec<(u64, u64, u64)> {
        let mut v = Vec::new();
        for (&n, node) in &c.nodes {
            for g in GROUPS {
                let st = node.status(g).unwrap();
                v.push((n * 10 + g, st.term, st.leader_id));
            }
        }
        v
    };
    let value = "p".repeat(2048);
    let leader = &c.nodes[&1];
    let meter = &c.meters[&(1, 1)];
    let mut pending = std::collections::VecDeque::new();
    let mut acked = 0u64;
    let mut write_until = |end: Instant, acked: &mut u64| {
        let mut i = 0u64;
        while Instant::now() < end {
            pending.push_back(leader.propose(1, &set(&format!("k{}", i % 500), &value)));
            i += 1;
            if pending.len() >= IN_FLIGHT {
                let r = pending.pop_front().unwrap().wait(Duration::from_secs(10));
                assert!(matches!(r, Some(Ok(_))), "a paced write failed: {r:?}");
                *acked += 1;
            }
        }
    };
    // Warm-up: spend the burst, so the window starts from a bucket at about zero.
    write_until(Instant::now() + Duration::from_millis(500), &mut acked);
    let before = terms(&c);
    let sent0 = meter.sent.load(Ordering::Relaxed);
    let paced0 = meter.paced_ns.load(Ordering::Relaxed);
    let t0 = Instant::now();
    let acked0 = acked;
    write_until(t0 + Duration::from_millis(1500), &mut acked);
    let other = Instant::now();
    c.write(2, &set("beside", "paced"), Duration::from_secs(2));
    let other = other.elapsed();
    write_until(t0 + Duration::from_secs(3), &mut acked);
    let secs = t0.elapsed().as_secs_f64();
    let sent = meter.sent.load(Ordering::Relaxed) - sent0;
    let paced_ms = (meter.paced_ns.load(Ordering::Relaxed) - paced0) / 1_000_000;
    let after = terms(&c);
    let rate = sent as f64 / secs;
    eprintln!(
        "group 1 sent {sent} B in {secs:.2} s = {rate:.0} B/s (rate {RATE_BYTES_PER_S}), {} writes acked, held {paced_ms} ms; group 2 write {other:?}",
        acked - acked0
    );
    // One append may overshoot the balance (a batch of IN_FLIGHT entries, ~70 KiB per follower).
    let slack = BURST_BYTES + 2 * (IN_FLIGHT as u64 * 2200);
    assert!(sent <= (RATE_BYTES_PER_S as f64 * secs) as u64 + slack, "sent {sent} B in {secs:.2} s: not paced");
    assert!(rate >= 0.7 * RATE_BYTES_PER_S as f64, "sent only {rate:.0} B/s: held too long");
    assert!(paced_ms >= 500, "held only {paced_ms} ms of {secs:.2} s");
    assert_eq!(before, after, "a term or leader changed while group 1 was paced");
    for p in pending {
        assert!(matches!(p.wait(Duration::from_secs(10)), Some(Ok(_))));
    }
    c.wait_converged(1, Duration::from_secs(10));
    let h = c.hashes(1);
    assert!(h.iter().all(|&x| x == h[0]), "replicas differ: {h:?}");
}

/// Throughput of replicated writes in this process (3 nodes, one group, one leader), with
/// many proposals in flight. Run explicitly: `cargo test --release -p slipstream-replication
/// --test cluster -- --ignored --nocapture`.
#[test]
#[ignore]
fn replicated_writes_per_second() {
    for fsync in [FsyncMode::Never, FsyncMode::Batch, FsyncMode::Always] {
        let c = Cluster::new(&format!("rate-{fsync:?}"), fsync, 10_000);
        let l = c.wait_leader(1, Duration::from_secs(10));
        let n = 20_000;
        let value = "x".repeat(64);
        let t = Instant::now();
        let mut pending = std::collections::VecDeque::new();
        let mut ok = 0;
        for i in 0..n {
            pending.push_back(c.nodes[&l].propose(1, &set(&format!("key{}", i % 1000), &value)));
            if pending.len() >= 512 {
                if let Some(Some(Ok(_))) = pending.pop_front().map(|p| p.wait(Duration::from_secs(10))) {
                    ok += 1;
                }
            }
        }
        for p in pending {
            if let Some(Ok(_)) = p.wait(Duration::from_secs(10)) {
                ok += 1;
            }
        }
        let s = t.elapsed().as_secs_f64();
        eprintln!(
            "fsync {fsync:?}: {ok}/{n} acknowledged in {s:.2} s = {:.0} replicated writes/s (64 B values)",
            ok as f64 / s
        );
    }
}

/// Garbage on the raft port (no hello, a bad hello, a hello from a non-peer id followed by a
/// bad frame) is dropped; the cluster keeps committing and converging.
#[test]
fn junk_on_the_raft_port_does_not_stop_the_cluster() {
    use std::io::Write;
    let mut rng = Rng(seed());
    let c = Cluster::new("junk", FsyncMode::Never, 1000);
    c.wait_leader(1, Duration::from_secs(10));
    let mut conns = Vec::new();
    for addr in c.peers.values() {
        let junk: Vec<u8> = (0..1 + rng.below(4096)).map(|_| rng.next() as u8).collect();
        let mut not_a_peer = 0x534c_5250u32.to_le_bytes().to_vec();
        not_a_peer.extend_from_slice(&99u64.to_le_bytes());
        not_a_peer.extend_from_slice(&u32::MAX.to_le_bytes());
        for bytes in [junk, not_a_peer, vec![]] {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            let _ = s.write_all(&bytes);
            conns.push(s);
        }
    }
    let mut model = BTreeMap::new();
    for seq in 0..30 {
        random_write(&c, &mut rng, 1, &mut model, seq);
    }
    c.wait_converged(1, Duration::from_secs(10));
    check_model(&c, 1, &model);
    let h = c.hashes(1);
    assert!(h.iter().all(|&x| x == h[0]), "replica hashes differ: {h:?}");
}

/// Leaders spread: group g prefers node g. Each group ends up led by its preferred node; when
/// that node dies another leads; when it comes back (caught up) leadership returns to it.
#[test]
fn preferred_leaders_spread_and_are_restored_after_a_failover() {
    let mut c = Cluster::build("preferred", FsyncMode::Never, 1000, true);
    let wait_for = |c: &Cluster, g: u64, want: u64, within: Duration| {
        let deadline = Instant::now() + within;
        while c.leader(g) != Some(want) {
            assert!(Instant::now() < deadline, "group {g}: leader {:?}, want {want}", c.leader(g));
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    for g in GROUPS {
        wait_for(&c, g, g, Duration::from_secs(10));
        c.write(g, &set("k", "v"), Duration::from_secs(10));
    }
    c.kill(1);
    let other = c.wait_leader(1, Duration::from_secs(10));
    assert_ne!(other, 1);
    c.write(1, &set("k", "during"), Duration::from_secs(10));
    let t = Instant::now();
    c.start(1);
    wait_for(&c, 1, 1, Duration::from_secs(10));
    eprintln!("group 1 led by node {other} during the failover; back on node 1 {:?} after its restart", t.elapsed());
    for g in GROUPS {
        wait_for(&c, g, g, Duration::from_secs(10));
        c.write(g, &set("k2", "after"), Duration::from_secs(10));
        c.wait_converged(g, Duration::from_secs(10));
    }
    assert_eq!(
        c.value_on(1, 1, "k").as_deref(),
        Some("during"),
        "node 1 caught up with the write made while it was down"
    );
}

/// A follower's proposal is forwarded by raft-rs and completes on the follower with the
/// replicated result (counted); a follower's ReadIndex barrier completes once it has applied
/// the leader's commit; with no quorum a proposal hears back within its wait (never silence).
#[test]
fn followers_forward_proposals_and_read_barriers_and_waits_are_bounded() {
    let mut c = Cluster::new("forward", FsyncMode::Never, 10_000);
    let l = c.wait_leader(1, Duration::from_secs(10));
    c.write(1, &set("warm", "0"), Duration::from_secs(5));
    let f = NODES.into_iter().find(|&n| n != l).unwrap();
    let r = c.nodes[&f].propose(1, &set("via-follower", "v")).wait(Duration::from_secs(5));
    let Some(Ok(Applied::Store(StoreResult::Stored(cas)))) = r else { panic!("forwarded write: {r:?}") };
    assert_eq!(c.nodes[&f].status(1).unwrap().forwarded, 1);
    // Every replica gives the item the same CAS (the entry's index).
    c.wait_converged(1, Duration::from_secs(5));
    for n in NODES {
        let got =
            c.nodes[&n].machine(1).unwrap().store().get(b"via-follower", GetOpts::default(), |o| o.item.map(|i| i.cas));
        assert_eq!(got, Some(cas), "node {n}");
    }
    let (tx, rx) = std::sync::mpsc::channel();
    c.nodes[&f].read_index_then(
        1,
        Duration::from_secs(5),
        Box::new(move |r| {
            let _ = tx.send(r);
        }),
    );
    assert_eq!(rx.recv_timeout(Duration::from_secs(6)).unwrap(), Ok(Applied::ReadBarrier));
    assert!(c.nodes[&f].status(1).unwrap().applied_index >= cas);
    // Only one node left: a proposal there is answered NoLeader or Timeout within its wait.
    for n in NODES.into_iter().filter(|&n| n != f) {
        c.kill(n);
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let t = Instant::now();
    c.nodes[&f].propose_then(
        1,
        &set("alone", "x"),
        Duration::from_millis(500),
        Box::new(move |r| {
            let _ = tx.send(r);
        }),
    );
    let r = rx.recv_timeout(Duration::from_secs(3)).unwrap();
    assert!(matches!(r, Err(ProposeError::NoLeader | ProposeError::Timeout)), "{r:?}");
    assert!(t.elapsed() < Duration::from_millis(1500), "{:?}", t.elapsed());
}

/// A killed leader's sockets close at once: its followers act on that within a tick, not
/// after the election timeout (here 2-4 s). A survivor starts the election at once (counted),
/// a successor leads well before the shortest election timeout, and a write forwarded to the
/// dead leader hears back at once (applied, or `Timeout`: outcome unknown), not at its wait.
#[test]
fn a_dead_leaders_connection_drop_starts_the_election_at_once() {
    const ELECTION_TICKS: usize = 100; // 20 ms ticks: 2 s at least
    let mut c = Cluster::build_timed("leaderloss", FsyncMode::Batch, 10_000, false, ELECTION_TICKS);
    let l = c.wait_leader(1, Duration::from_secs(15));
    c.write(1, &set("warm", "0"), Duration::from_secs(5));
    let f = NODES.into_iter().find(|&n| n != l).unwrap();
    // Forwarded to the leader just before it dies: the entry may or may not be committed.
    let inflight = c.nodes[&f].propose(1, &set("inflight", "x"));
    let killed_at = Instant::now();
    c.kill(l);
    let r = inflight.wait(Duration::from_secs(1));
    eprintln!("write forwarded to the dying leader: {r:?} after {:?}", killed_at.elapsed());
    assert!(
        matches!(r, Some(Ok(Applied::Store(StoreResult::Stored(_)))) | Some(Err(ProposeError::Timeout))),
        "forwarded write not answered within 1 s of the leader's death: {r:?}"
    );
    let new_leader = c.wait_leader(1, Duration::from_secs(10));
    let took = killed_at.elapsed();
    eprintln!("node {new_leader} leads {took:?} after node {l} was killed");
    assert_ne!(new_leader, l);
    assert!(took < Duration::from_millis(20 * ELECTION_TICKS as u64 / 2), "new leader only after {took:?}");
    let started: u64 = c.nodes.values().map(|n| n.status(1).unwrap().leader_loss_elections).sum();
    assert!(started >= 1, "no survivor started an election on the connection drop");
    // A write through the other survivor is acknowledged by the new leader.
    let r = c.nodes[&f].propose(1, &set("after", "y")).wait(Duration::from_secs(5));
    assert!(matches!(r, Some(Ok(Applied::Store(StoreResult::Stored(_))))), "{r:?}");
}

/// A log shorter than `compact_log_bytes_min` is not compacted within `compact_interval_ms` of
/// the last compaction, however many entries it has past `log_entries_max` (a small store
/// under a high write rate is not copied every few thousand writes); the failover test above
/// shows that with 0 it is, the next test that it is once the interval has passed.
#[test]
fn a_log_below_its_byte_floor_is_not_compacted() {
    let mut c = Cluster::new("bytefloor", FsyncMode::Never, 40);
    for n in NODES {
        c.kill(n);
    }
    c.compact_log_bytes_min = 1 << 30;
    c.compact_interval_ms = 3_600_000;
    for n in NODES {
        c.start(n);
    }
    let snap_before: Vec<u64> = NODES.iter().map(|n| c.nodes[n].status(1).unwrap().snapshot_index).collect();
    for i in 0..200 {
        c.write(1, &set(&format!("k{i}"), "v"), Duration::from_secs(10));
    }
    let applied = c.wait_converged(1, Duration::from_secs(10));
    assert!(applied >= 200);
    for (i, n) in NODES.iter().enumerate() {
        let st = c.nodes[n].status(1).unwrap();
        assert_eq!(st.snapshot_index, snap_before[i], "node {n} compacted a log of {} bytes", st.log_bytes);
    }
}

/// Below the byte floor a log is still compacted once `compact_interval_ms` has passed since
/// the last compaction, so what a restarted node re-applies stays about an interval of
/// writes; the restarted node comes back with the same contents.
#[test]
fn a_log_below_its_byte_floor_is_compacted_once_its_interval_has_passed() {
    let mut c = Cluster::new("interval", FsyncMode::Never, 40);
    for n in NODES {
        c.kill(n);
    }
    c.compact_log_bytes_min = 1 << 30;
    c.compact_interval_ms = 200;
    for n in NODES {
        c.start(n);
    }
    for i in 0..100 {
        c.write(1, &set(&format!("a{i}"), "v"), Duration::from_secs(10));
    }
    std::thread::sleep(Duration::from_millis(300));
    for i in 0..100 {
        c.write(1, &set(&format!("b{i}"), "v"), Duration::from_secs(10));
    }
    let applied = c.wait_converged(1, Duration::from_secs(10));
    for n in NODES {
        let st = c.nodes[&n].status(1).unwrap();
        assert!(st.snapshot_index >= 100, "node {n}: no compaction below the floor: {st:?}");
        assert!(
            applied - st.snapshot_index <= 120,
            "node {n}: {} entries after the snapshot",
            applied - st.snapshot_index
        );
    }
    let h = c.hashes(1)[0];
    c.kill(3);
    c.start(3);
    c.wait_converged(1, Duration::from_secs(10));
    assert_eq!(c.hashes(1), vec![h; 3]);
}

/// Proposals that reach the node thread together are proposed together (one raft-rs
/// proposal of many entries): each still completes with its own result, on the leader and
/// when forwarded by a follower, and their entries carry consecutive indexes (the CAS).
#[test]
fn proposals_of_one_turn_complete_each_with_its_own_result() {
    let c = Cluster::new("batch", FsyncMode::Batch, 10_000);
    let l = c.wait_leader(1, Duration::from_secs(10));
    c.write(1, &set("warm", "0"), Duration::from_secs(5));
    let f = NODES.into_iter().find(|&n| n != l).unwrap();
    for (node, label) in [(l, "leader"), (f, "follower")] {
        let before = c.nodes[&f].status(1).unwrap().forwarded;
        let waits: Vec<_> =
            (0..200).map(|i| c.nodes[&node].propose(1, &set(&format!("{label}{i}"), &format!("v{i}")))).collect();
        let mut cas = Vec::new();
        for (i, w) in waits.iter().enumerate() {
            match w.wait(Duration::from_secs(10)) {
                Some(Ok(Applied::Store(StoreResult::Stored(c)))) => cas.push(c),
                r => panic!("{label} proposal {i}: {r:?}"),
            }
        }
        cas.sort_unstable();
        cas.dedup();
        assert_eq!(cas.len(), 200, "{label}: every proposal its own entry");
        let forwarded = c.nodes[&f].status(1).unwrap().forwarded - before;
        assert_eq!(forwarded, if node == f { 200 } else { 0 }, "{label}");
        c.wait_converged(1, Duration::from_secs(5));
        for i in [0, 199] {
            assert_eq!(c.value_on(l, 1, &format!("{label}{i}")), Some(format!("v{i}")));
        }
    }
}

/// A follower's forwarded write whose entry reaches that follower only inside a snapshot (it
/// lagged past the leader's log compaction) is answered with its result, as the other
/// replicas applied it, when the snapshot is installed — not `Timeout` at its wait (30 s here):
/// the snapshot carries recent proposals' results.
///
/// How f lags: the leader's frames to f are dropped (one-way loss: `mute_sends_to`) while f's
/// frames still reach the leader, so f forwards the write, the leader commits it with the
/// third node b and compacts its log past it; then the loss ends and the leader sends f a
/// snapshot.
#[test]
fn a_forwarded_write_that_arrives_in_a_snapshot_gets_its_result() {
    let c = Cluster::new("fwd-snapshot", FsyncMode::Never, 20);
    let l = c.wait_leader(1, Duration::from_secs(10));
    c.write(1, &set("warm", "0"), Duration::from_secs(5));
    c.wait_converged(1, Duration::from_secs(5));
    let f = NODES.into_iter().find(|&n| n != l).unwrap();
    let b = NODES.into_iter().find(|&n| n != l && n != f).unwrap();
    let command = |key: &str| Mutation::Command {
        protocol: 0,
        now_unix_s: 1_700_000_000,
        request: format!("{key:<2000}").into_bytes(),
    };
    let before = c.nodes[&b].status(1).unwrap().applied_index;
    let installed = c.nodes[&f].status(1).unwrap().snapshots_installed;
    c.nodes[&l].transport().mute_sends_to(f, true);
    let (tx, rx) = std::sync::mpsc::channel();
    let t = Instant::now();
    c.nodes[&f].propose_then(
        1,
        &command("forwarded"),
        Duration::from_secs(30),
        Box::new(move |r| {
            let _ = tx.send(r);
        }),
    );
    // The leader and b commit it (f hears nothing from the leader).
    let deadline = Instant::now() + Duration::from_secs(5);
    while c.nodes[&b].status(1).unwrap().applied_index <= before {
        assert!(Instant::now() < deadline, "the forwarded write was not committed: {:?}", c.nodes[&l].status(1));
        std::thread::sleep(Duration::from_millis(1));
    }
    let index = c.nodes[&b].status(1).unwrap().applied_index;
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut i = 0;
    while c.nodes[&l].status(1).unwrap().snapshot_index < index + 10 {
        assert!(Instant::now() < deadline, "the leader did not compact: {:?}", c.nodes[&l].status(1));
        let r = c.nodes[&l].propose(1, &command(&format!("k{}", i % 4))).wait(Duration::from_secs(5));
        assert!(matches!(r, Some(Ok(_))), "{r:?}");
        i += 1;
    }
    assert!(rx.try_recv().is_err(), "answered before f could know the outcome");
    let released = Instant::now();
    c.nodes[&l].transport().mute_sends_to(f, false);
    let r = rx
        .recv_timeout(Duration::from_secs(10))
        .unwrap_or_else(|_| panic!("no answer within 10 s of the release ({:?} after the proposal)", t.elapsed()));
    eprintln!("forwarded write answered {:?} after the leader's frames reach f again", released.elapsed());
    let want = CommandOutcome { reply: b"SERVER_ERROR no executor\r\n".to_vec(), swallow_bytes: 0 };
    assert_eq!(r, Ok(Applied::Command(want)));
    // (f publishes its status at the end of the loop turn that answered.)
    let deadline = Instant::now() + Duration::from_secs(5);
    while c.nodes[&f].status(1).unwrap().snapshots_installed <= installed {
        assert!(Instant::now() < deadline, "f did not install a snapshot: {:?}", c.nodes[&f].status(1));
        std::thread::sleep(Duration::from_millis(5));
    }
    c.wait_converged(1, Duration::from_secs(10));
}

/// A group on three of five nodes (and another on three others, overlapping on node 3): only
/// its members hold it (store, log, raft traffic); a leader killed, writes go on among the
/// other two members; the killed member restarts and catches up; members end identical.
#[test]
fn a_group_on_three_of_five_nodes_lives_on_its_members_only() {
    let t0 = Instant::now();
    let mut rng = Rng(seed());
    let placement: BTreeMap<u64, Vec<u64>> = [(1, vec![1, 2, 3]), (2, vec![3, 4, 5])].into_iter().collect();
    let mut c = Cluster::build_placed("subset", FsyncMode::Never, 50, true, 10, &[1, 2, 3, 4, 5], placement);
    let w = Duration::from_secs(10);
    let mut models: BTreeMap<u64, BTreeMap<String, String>> = BTreeMap::new();
    for g in [1, 2] {
        let l = c.wait_leader(g, w);
        assert!(c.placement[&g].contains(&l), "group {g} led by non-member {l}");
        for seq in 0..60 {
            random_write(&c, &mut rng, g, models.entry(g).or_default(), seq);
        }
    }
    let lead = c.wait_leader(1, w);
    c.kill(lead);
    for seq in 60..160 {
        random_write(&c, &mut rng, 1, models.get_mut(&1).unwrap(), seq);
    }
    let new_lead = c.wait_leader(1, w);
    assert!(new_lead != lead && c.placement[&1].contains(&new_lead));
    c.start(lead);
    for g in [1, 2] {
        c.wait_converged(g, Duration::from_secs(20));
        check_model(&c, g, &models[&g]);
        let h = c.hashes(g);
        assert_eq!(h.len(), 3, "group {g}: three members hold it");
        assert!(h.iter().all(|&x| x == h[0]), "group {g}: members differ");
    }
    // Non-members: no group, no log on disk, not one raft byte of it.
    for (g, outside) in [(1, [4, 5]), (2, [1, 2])] {
        for n in outside {
            assert!(c.nodes[&n].machine(g).is_none() && c.nodes[&n].status(g).is_none());
            assert!(!c.dir.join(format!("node-{n}/group-{g}")).exists(), "node {n} has group {g} on disk");
            assert!(!c.meters.contains_key(&(n, g)));
        }
        for &n in &c.placement[&g] {
            assert!(c.meters[&(n, g)].received.load(Ordering::Relaxed) > 0, "member {n} of {g} got no raft bytes");
        }
    }
    eprintln!("subset cluster test: {:?}", t0.elapsed());
}
