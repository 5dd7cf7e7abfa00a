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

    /// Check a tenant's `replicas` (1 = unreplicated) and `preferred_leader` against this
    /// cluster (`None` = no `[cluster]` section).
    pub fn check_tenant(
        cluster: Option<&ClusterSpec>,
        replicas: u64,
        preferred_leader: Option<u64>,
    ) -> Result<(), String> {
        let nodes = cluster.map_or(1, |c| c.peers.len());
        if replicas == 0 || replicas as usize > nodes {
            let hint = if cluster.is_none() { " (more than 1 needs a [cluster] section)" } else { "" };
            return Err(format!("replicas {replicas}: must be 1..={nodes}{hint}"));
        }
        if let Some(l) = preferred_leader {
            if replicas == 1 {
                return Err("preferred_leader needs replicas > 1".into());
            }
            if !cluster.is_some_and(|c| c.peers.contains_key(&l)) {
                return Err(format!("preferred_leader {l} is not a node of [cluster] peers"));
            }
        }
        Ok(())
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
        assert_eq!(ClusterSpec::check_tenant(Some(&c), 3, Some(1)), Ok(()));
        assert_eq!(ClusterSpec::check_tenant(None, 1, None), Ok(()));
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
        assert!(ClusterSpec::check_tenant(Some(&c), 3, None).unwrap_err().contains("1..=2"));
        assert!(ClusterSpec::check_tenant(Some(&c), 0, None).is_err());
        assert!(ClusterSpec::check_tenant(Some(&c), 2, Some(9)).unwrap_err().contains("preferred_leader"));
        assert!(ClusterSpec::check_tenant(None, 3, None).unwrap_err().contains("[cluster]"));
        assert!(ClusterSpec::check_tenant(Some(&c), 1, Some(1)).is_err());
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
