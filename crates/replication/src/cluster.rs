//! The `[cluster]` settings of a node and the replication keys of a tenant, checked: the one
//! home of these rules (the daemon's config file parser hands the raw values here).
//!
//! Not for: reading files or TOML (the daemon's config module does that).

use crate::storage::FsyncMode;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

/// Most nodes in a cluster (and replicas of a tenant): Raft's quorum traffic grows with it.
pub const NODES_MAX: usize = 7;

/// A checked `[cluster]` section.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterSpec {
    pub node_id: u64,
    /// Every node, this one included: id → raft address.
    pub peers: BTreeMap<u64, SocketAddr>,
    pub data_dir: PathBuf,
    pub fsync: FsyncMode,
    /// Raft timing (`tick_ms`, `election_ticks`, `heartbeat_ticks`; see [`Timing`]).
    pub timing: Timing,
}

/// Raft's clock of a node: one tick every `tick_ms`; a follower that hears no leader for a
/// randomized `[election_ticks, 2 * election_ticks)` ticks starts a (pre-)vote; a leader
/// sends heartbeats every `heartbeat_ticks`. The election timeout bounds the failover time of
/// a hung leader (a killed one is noticed at once, by its dropped connection); too short a one
/// on a loaded host causes needless elections (pre-vote and check-quorum keep a starved
/// follower from disturbing a healthy leader; a leader that hears no majority for one timeout
/// steps down). Safe at any setting: reads are ReadIndex (`ReadOnlyOption::Safe`: a heartbeat
/// round per read batch), not lease reads, so no clock bound rests on these values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    pub tick_ms: u64,
    pub election_ticks: usize,
    pub heartbeat_ticks: usize,
}

/// Longest tick: past it failover takes many seconds, which no setting here wants.
pub const TICK_MS_MAX: u64 = 1000;
/// Most ticks in an election timeout or heartbeat interval.
pub const TICKS_MAX: usize = 1000;

impl Default for Timing {
    /// 50 ms ticks, 0.3-0.6 s election timeout, 100 ms heartbeats: a hung (SIGSTOPped)
    /// leader is replaced well within 1 s (docs/benchmarks.md, "Failover"); the ratio of
    /// election timeout to heartbeat (3-6) is raft-rs's default one (10 / 3).
    fn default() -> Timing {
        Timing { tick_ms: 50, election_ticks: 6, heartbeat_ticks: 2 }
    }
}

impl Timing {
    /// Check the raw values: `tick_ms` 1..=TICK_MS_MAX, heartbeats more often than elections
    /// (raft-rs requires `election_ticks > heartbeat_ticks >= 1`).
    pub fn parse(tick_ms: u64, election_ticks: usize, heartbeat_ticks: usize) -> Result<Timing, String> {
        if tick_ms == 0 || tick_ms > TICK_MS_MAX {
            return Err(format!("tick_ms {tick_ms}: must be 1..={TICK_MS_MAX}"));
        }
        if heartbeat_ticks == 0 || election_ticks > TICKS_MAX || election_ticks <= heartbeat_ticks {
            return Err(format!(
                "election_ticks {election_ticks}, heartbeat_ticks {heartbeat_ticks}: need \
                 {TICKS_MAX} >= election_ticks > heartbeat_ticks >= 1"
            ));
        }
        Ok(Timing { tick_ms, election_ticks, heartbeat_ticks })
    }
}

impl ClusterSpec {
    /// Check the raw values: `peers` as `"<id>=<ip>:<port>"`, ids 1.. and unique, addresses
    /// unique, this node among them, `fsync` one of always/batch/never, `data_dir` non-empty.
    pub fn parse(node_id: u64, peers: &[String], data_dir: &str, fsync: &str) -> Result<ClusterSpec, String> {
        if node_id == 0 {
            return Err("node_id must be 1 or more".into());
        }
        if peers.is_empty() || peers.len() > NODES_MAX {
            return Err(format!("peers: {} given, 1..={NODES_MAX} allowed", peers.len()));
        }
        let mut map = BTreeMap::new();
        for p in peers {
            let (id, addr) = p.split_once('=').ok_or_else(|| format!("peers: {p:?} is not \"<id>=<ip>:<port>\""))?;
            let id: u64 = id.trim().parse().map_err(|_| format!("peers: {p:?}: bad node id"))?;
            if id == 0 {
                return Err(format!("peers: {p:?}: node ids start at 1"));
            }
            let addr: SocketAddr =
                addr.trim().parse().map_err(|_| format!("peers: {p:?}: bad address (want ip:port)"))?;
            if addr.port() == 0 {
                return Err(format!("peers: {p:?}: port 0"));
            }
            if map.values().any(|a| *a == addr) {
                return Err(format!("peers: address {addr} given twice"));
            }
            if map.insert(id, addr).is_some() {
                return Err(format!("peers: node id {id} given twice"));
            }
        }
        if !map.contains_key(&node_id) {
            return Err(format!("node_id {node_id} is not in peers"));
        }
        if data_dir.is_empty() {
            return Err("data_dir must be set".into());
        }
        let fsync =
            FsyncMode::parse(fsync).ok_or_else(|| format!("fsync {fsync:?}: expected always, batch or never"))?;
        Ok(ClusterSpec { node_id, peers: map, data_dir: PathBuf::from(data_dir), fsync, timing: Timing::default() })
    }

    /// The nodes holding a tenant's replicas (its group's voters), checked against this
    /// cluster (`None` = no `[cluster]` section); empty = unreplicated (`replicas` 1 or absent,
    /// no `nodes`). The one home of the placement rule:
    /// - `nodes = [..]` given: exactly those (ids of `peers`, unique, 2 or more; `replicas`, if
    ///   given too, must equal their count);
    /// - else `replicas = n` of the `m` peers: n = m means every node; n < m means the n peers
    ///   that follow `preferred_leader` in ascending id order, wrapping around (from the lowest
    ///   id without one), so `preferred_leader = 4` with replicas 3 of nodes 1..=5 is [4, 5, 1]
    ///   and tenants whose leaders are spread are spread too.
    ///
    /// `preferred_leader` must be one of the result.
    pub fn placement(
        cluster: Option<&ClusterSpec>,
        replicas: Option<u64>,
        nodes: Option<&[u64]>,
        preferred_leader: Option<u64>,
    ) -> Result<Vec<u64>, String> {
        let peers: Vec<u64> = cluster.map_or(Vec::new(), |c| c.peers.keys().copied().collect());
        let count = peers.len().max(1);
        let hint = if cluster.is_none() { " (more than 1 needs a [cluster] section)" } else { "" };
        let placed = match nodes {
            Some(list) => {
                if cluster.is_none() {
                    return Err("nodes needs a [cluster] section".into());
                }
                if list.len() < 2 || list.len() > count {
                    return Err(format!(
                        "nodes {list:?}: 2..={count} node ids of [cluster] peers (1 replica = leave nodes out)"
                    ));
                }
                if let Some(bad) = list.iter().find(|n| !peers.contains(n)) {
                    return Err(format!("nodes {list:?}: node {bad} is not in [cluster] peers"));
                }
                let mut sorted = list.to_vec();
                sorted.sort_unstable();
                sorted.dedup();
                if sorted.len() != list.len() {
                    return Err(format!("nodes {list:?}: a node is given twice"));
                }
                if let Some(r) = replicas.filter(|&r| r != list.len() as u64) {
                    return Err(format!("replicas {r} but nodes {list:?} has {}: give one of them", list.len()));
                }
                list.to_vec()
            }
            None => {
                let n = replicas.unwrap_or(1);
                if n == 0 || n as usize > count {
                    return Err(format!("replicas {n}: must be 1..={count}{hint}"));
                }
                if n == 1 {
                    Vec::new()
                } else {
                    let start = preferred_leader.and_then(|l| peers.iter().position(|&p| p == l)).unwrap_or(0);
                    (0..n as usize).map(|i| peers[(start + i) % peers.len()]).collect()
                }
            }
        };
        if let Some(l) = preferred_leader {
            if placed.is_empty() {
                return Err("preferred_leader needs replicas > 1".into());
            }
            if !placed.contains(&l) {
                return Err(format!("preferred_leader {l} is not one of the tenant's nodes {placed:?}"));
            }
        }
        Ok(placed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peers(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_issue_example_parses() {
        let p = peers(&["1=127.0.0.1:13001", "2=127.0.0.1:13002", "3=127.0.0.1:13003"]);
        let c = ClusterSpec::parse(1, &p, "/var/lib/slipstream", "always").unwrap();
        assert_eq!(c.peers.len(), 3);
        assert_eq!(c.peers[&2], "127.0.0.1:13002".parse().unwrap());
        assert_eq!(c.fsync, FsyncMode::Always);
        assert_eq!(ClusterSpec::placement(Some(&c), Some(3), None, Some(1)), Ok(vec![1, 2, 3]));
        assert_eq!(ClusterSpec::placement(None, Some(1), None, None), Ok(vec![]));
    }

    #[test]
    fn bad_values_are_clear_errors() {
        let ok = peers(&["1=127.0.0.1:1", "2=127.0.0.1:2"]);
        let err = |id, p: &[&str], d, f| ClusterSpec::parse(id, &peers(p), d, f).unwrap_err();
        assert!(err(0, &["1=127.0.0.1:1"], "/d", "always").contains("node_id"));
        assert!(err(3, &["1=127.0.0.1:1", "2=127.0.0.1:2"], "/d", "always").contains("not in peers"));
        assert!(err(1, &["1=127.0.0.1:1", "1=127.0.0.1:2"], "/d", "always").contains("given twice"));
        assert!(err(1, &["1=127.0.0.1:1", "2=127.0.0.1:1"], "/d", "always").contains("given twice"));
        assert!(err(1, &["1:127.0.0.1:1"], "/d", "always").contains("<id>="));
        assert!(err(1, &["1=localhost:1"], "/d", "always").contains("bad address"));
        assert!(err(1, &["1=127.0.0.1:1"], "", "always").contains("data_dir"));
        assert!(err(1, &["1=127.0.0.1:1"], "/d", "sometimes").contains("fsync"));
        let c = ClusterSpec::parse(1, &ok, "/d", "batch").unwrap();
        assert!(ClusterSpec::placement(Some(&c), Some(3), None, None).unwrap_err().contains("1..=2"));
        assert!(ClusterSpec::placement(Some(&c), Some(0), None, None).is_err());
        assert!(ClusterSpec::placement(Some(&c), Some(2), None, Some(9)).unwrap_err().contains("preferred_leader"));
        assert!(ClusterSpec::placement(None, Some(3), None, None).unwrap_err().contains("[cluster]"));
        assert!(ClusterSpec::placement(Some(&c), Some(1), None, Some(1)).is_err());
    }

    #[test]
    fn placement_is_explicit_or_follows_the_preferred_leader() {
        let five = peers(&["1=127.0.0.1:1", "2=127.0.0.1:2", "3=127.0.0.1:3", "4=127.0.0.1:4", "5=127.0.0.1:5"]);
        let c = ClusterSpec::parse(1, &five, "/d", "always").unwrap();
        let place = |r, n: Option<&[u64]>, l| ClusterSpec::placement(Some(&c), r, n, l);
        // The rule: `replicas` peers from the preferred leader on, by id, wrapping.
        assert_eq!(place(Some(3), None, Some(4)), Ok(vec![4, 5, 1]));
        assert_eq!(place(Some(3), None, Some(2)), Ok(vec![2, 3, 4]));
        assert_eq!(place(Some(3), None, None), Ok(vec![1, 2, 3]));
        assert_eq!(place(Some(5), None, None), Ok(vec![1, 2, 3, 4, 5]));
        assert_eq!(place(None, None, None), Ok(vec![]));
        // Explicit nodes, in the order given; replicas may be left out.
        assert_eq!(place(None, Some(&[5, 2, 3]), Some(2)), Ok(vec![5, 2, 3]));
        assert_eq!(place(Some(2), Some(&[1, 4]), None), Ok(vec![1, 4]));
        assert!(place(Some(3), Some(&[1, 4]), None).unwrap_err().contains("give one of them"));
        assert!(place(None, Some(&[1, 6, 2]), None).unwrap_err().contains("node 6 is not in [cluster] peers"));
        assert!(place(None, Some(&[1, 1, 2]), None).unwrap_err().contains("twice"));
        assert!(place(None, Some(&[1]), None).unwrap_err().contains("2..=5"));
        assert!(place(None, Some(&[1, 2]), Some(3)).unwrap_err().contains("preferred_leader 3 is not one of"));
        assert!(ClusterSpec::placement(None, None, Some(&[1, 2]), None).unwrap_err().contains("[cluster]"));
    }

    #[test]
    fn timing_needs_heartbeats_inside_the_election_timeout() {
        assert_eq!(Timing::parse(50, 8, 2), Ok(Timing { tick_ms: 50, election_ticks: 8, heartbeat_ticks: 2 }));
        assert!(Timing::parse(0, 8, 2).unwrap_err().contains("tick_ms"));
        assert!(Timing::parse(TICK_MS_MAX + 1, 8, 2).unwrap_err().contains("tick_ms"));
        assert!(Timing::parse(50, 2, 2).unwrap_err().contains("election_ticks > heartbeat_ticks"));
        assert!(Timing::parse(50, 8, 0).is_err());
        assert!(Timing::parse(50, TICKS_MAX + 1, 2).is_err());
        let d = Timing::default();
        assert_eq!(Timing::parse(d.tick_ms, d.election_ticks, d.heartbeat_ticks), Ok(d));
    }
}
