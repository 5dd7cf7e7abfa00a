//! Start-up of this node's replication (issue 15): one Raft group per replicated tenant
//! this node holds (`replicas > 1`, this node among its placement: `ClusterSpec::placement`),
//! its store the tenant's own, its command executor the server's
//! (`slipstream_server::replicated`), then each tenant handed its group before the workers
//! serve it; a replicated tenant placed on other nodes only gets a `Relay` to them.
//!
//! Not for: Raft (slipstream-replication) or the request path (slipstream-server).

use crate::config::Config;
use slipstream_replication::cluster::ClusterSpec;
use slipstream_replication::{GroupSpec, NodeConfig, ReplicationNode};
use slipstream_server::admin::MetricsFn;
use slipstream_server::relay::{Member, Relay};
use slipstream_server::replicated::{ApplyExec, Replica, TenantTraffic};
use slipstream_server::tenants::TenantTable;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// A tenant's group id on every node: derived from its name (FNV-1a), so the nodes agree
/// without another key; never 0.
pub fn group_id(tenant: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in tenant.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h.max(1)
}

/// Start the node for the replicated tenants of `cfg` (None when there are none) and give
/// each such tenant of `table` its `Replica`.
pub fn start(cfg: &Config, table: &TenantTable) -> Result<Option<Arc<ReplicationNode>>, String> {
    let Some(c) = cfg.cluster.as_ref() else { return Ok(None) };
    let tenants = table.snapshot();
    let mut groups = Vec::new();
    for spec in &cfg.tenants {
        let placed = ClusterSpec::placement(Some(c), spec.replicas, spec.nodes.as_deref(), spec.preferred_leader)?;
        if placed.is_empty() {
            continue;
        }
        let t =
            tenants.iter().find(|t| t.name == spec.name).ok_or_else(|| format!("tenant {:?} missing", spec.name))?;
        if !placed.contains(&c.node_id) {
            // Not a member: its port relays to the members, the current leader first (asked
            // on their raft ports), else the preferred leader first.
            let mut order = placed.clone();
            order.sort_by_key(|&n| Some(n) != spec.preferred_leader);
            let members = order
                .iter()
                .map(|n| Member { node: *n, client: SocketAddr::new(c.peers[n].ip(), spec.tcp_port), raft: c.peers[n] })
                .collect();
            let _ = t.relay.set(Arc::new(Relay::new(group_id(&spec.name), members)));
            continue;
        }
        let exec = Arc::new(ApplyExec::new(table.settings.clone(), t.info.clone()));
        // Full, it refuses writes the same way on every replica instead of evicting by its
        // own LRU order (docs/replication.md, "Memory").
        t.store.set_deterministic_memory(true);
        let traffic = Arc::new(TenantTraffic::new(t.shaper.clone()));
        groups.push((
            t.clone(),
            traffic.clone(),
            GroupSpec {
                group_id: group_id(&spec.name),
                // A joining node learns its groups' voters from the leader (log or snapshot).
                voters: if cfg.replica_opts.join { Vec::new() } else { placed },
                store: t.store.clone(),
                preferred_leader: spec.preferred_leader,
                exec: Some(exec),
                traffic: Some(traffic),
            },
        ));
    }
    if groups.is_empty() {
        return Ok(None);
    }
    let mut nc = NodeConfig::new(c.node_id, c.peers.clone(), c.data_dir.clone());
    nc.fsync = c.fsync;
    nc.tick_ms = c.timing.tick_ms;
    nc.election_ticks = c.timing.election_ticks;
    nc.heartbeat_ticks = c.timing.heartbeat_ticks;
    let specs = groups.iter().map(|(_, _, g)| g.clone()).collect();
    let node = Arc::new(ReplicationNode::start(nc, specs).map_err(|e| format!("replication: {e}"))?);
    let wait = Duration::from_millis(cfg.replica_opts.wait_ms);
    for (t, traffic, g) in groups {
        let r = Replica::new(node.clone(), g.group_id, cfg.replica_opts.local_reads, wait, traffic);
        let _ = t.replica.set(Arc::new(r));
    }
    Ok(Some(node))
}

/// Prometheus lines for every replicated tenant (role, term, indexes, log bytes, elections,
/// forwarded proposals, requests sent to the group and failures), for the admin endpoint.
pub fn metrics(table: &Arc<TenantTable>) -> Option<MetricsFn> {
    if !table.snapshot().iter().any(|t| t.replica.get().is_some() || t.relay.get().is_some()) {
        return None;
    }
    let table = table.clone();
    Some(Arc::new(move |out: &mut String| render(&table, out)))
}

const METRICS: [(&str, &str); 16] = [
    (
        "slipstream_replica_role",
        "gauge|This node's role in the tenant's group: 0 follower, 1 candidate, 2 leader, 3 pre-candidate",
    ),
    ("slipstream_replica_leader_id", "gauge|The group's leader as this node knows it (0 = none)"),
    ("slipstream_replica_term", "gauge|Raft term"),
    ("slipstream_replica_commit_index", "gauge|Highest log index known committed"),
    ("slipstream_replica_applied_index", "gauge|Highest log index applied to the tenant's store here"),
    ("slipstream_replica_lag_entries", "gauge|Committed entries not applied here yet"),
    ("slipstream_replica_log_bytes", "gauge|Bytes of the group's log on disk"),
    ("slipstream_replica_elections_won_total", "counter|Times this node became the group's leader"),
    (
        "slipstream_replica_leader_loss_elections_total",
        "counter|Elections this node started at once because its connection to the leader dropped",
    ),
    ("slipstream_replica_forwarded_total", "counter|Proposals made here as a follower and forwarded to the leader"),
    ("slipstream_replica_writes_total", "counter|Client writes proposed from this node"),
    ("slipstream_replica_read_barriers_total", "counter|ReadIndex barriers asked for client reads"),
    (
        "slipstream_replica_failures_total",
        "counter|Replicated requests answered SERVER_ERROR (no leader, timeout, lost, busy)",
    ),
    (
        "slipstream_replica_raft_sent_bytes_total",
        "counter|Bytes of the tenant's raft messages this node sent, charged to the tenant's egress bucket",
    ),
    (
        "slipstream_replica_raft_received_bytes_total",
        "counter|Bytes of the tenant's raft messages this node received, charged to the tenant's ingress bucket",
    ),
    (
        "slipstream_replica_raft_paced_ns_total",
        "counter|Nanoseconds the tenant's raft appends and snapshots waited on this node for its egress bucket (heartbeats and votes never wait)",
    ),
];

/// A relay metric: (name, "kind|help", its value for one relay).
type RelayMetric = (&'static str, &'static str, fn(&Relay) -> u64);

/// Relayed tenants (held by other nodes).
const RELAY_METRICS: [RelayMetric; 4] = [
    (
        "slipstream_tenant_relayed_connections_total",
        "counter|Connections on the tenant's port relayed to a node of its group (this node holds no replica)",
        |r| r.relayed.load(Ordering::Relaxed),
    ),
    (
        "slipstream_tenant_relayed_to_leader_total",
        "counter|Of the relayed connections, those relayed to the node a member named the group's leader",
        |r| r.to_leader.load(Ordering::Relaxed),
    ),
    (
        "slipstream_tenant_relay_unreachable_total",
        "counter|Connections on the tenant's port closed because no node of its group accepted one",
        |r| r.unreachable.load(Ordering::Relaxed),
    ),
    ("slipstream_tenant_relays_open", "gauge|Relayed connections open now", |r| r.open.load(Ordering::Relaxed) as u64),
];

fn render(table: &TenantTable, out: &mut String) {
    use std::fmt::Write;
    let relays: Vec<_> =
        table.snapshot().into_iter().filter_map(|t| t.relay.get().map(|r| (t.name.clone(), r.clone()))).collect();
    if !relays.is_empty() {
        for (name, help, value) in RELAY_METRICS {
            let (kind, help) = help.split_once('|').unwrap_or(("gauge", help));
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (tenant, r) in &relays {
                let _ = writeln!(out, "{name}{{tenant=\"{tenant}\"}} {}", value(r));
            }
        }
    }
    let tenants: Vec<_> =
        table.snapshot().into_iter().filter_map(|t| t.replica.get().map(|r| (t.name.clone(), r.clone()))).collect();
    for (name, help) in METRICS {
        let (kind, help) = help.split_once('|').unwrap_or(("gauge", help));
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (tenant, r) in &tenants {
            let Some(st) = r.node().status(r.group) else { continue };
            let v = match name {
                "slipstream_replica_role" => st.role as u64,
                "slipstream_replica_leader_id" => st.leader_id,
                "slipstream_replica_term" => st.term,
                "slipstream_replica_commit_index" => st.commit_index,
                "slipstream_replica_applied_index" => st.applied_index,
                "slipstream_replica_lag_entries" => st.commit_index.saturating_sub(st.applied_index),
                "slipstream_replica_log_bytes" => st.log_bytes,
                "slipstream_replica_elections_won_total" => st.elections_won,
                "slipstream_replica_leader_loss_elections_total" => st.leader_loss_elections,
                "slipstream_replica_forwarded_total" => st.forwarded,
                "slipstream_replica_writes_total" => r.writes.load(Ordering::Relaxed),
                "slipstream_replica_read_barriers_total" => r.barriers.load(Ordering::Relaxed),
                "slipstream_replica_raft_sent_bytes_total" => r.traffic.sent_bytes.load(Ordering::Relaxed),
                "slipstream_replica_raft_received_bytes_total" => r.traffic.received_bytes.load(Ordering::Relaxed),
                "slipstream_replica_raft_paced_ns_total" => r.traffic.paced_ns.load(Ordering::Relaxed),
                _ => r.failures.load(Ordering::Relaxed),
            };
            let _ = writeln!(out, "{name}{{tenant=\"{tenant}\"}} {v}");
        }
    }
    // Node-wide: the transport carries every group's frames on one connection per peer.
    if let Some((_, r)) = tenants.first() {
        let st = r.node().transport().stats();
        for (name, help, v) in [
            ("slipstream_raft_frames_sent_total", "Raft frames queued for peers", &st.frames_sent),
            (
                "slipstream_raft_frames_dropped_total",
                "Raft frames dropped (peer not connected or its send queue full; Raft resends)",
                &st.frames_dropped,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}", v.load(Ordering::Relaxed));
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn group_ids_are_stable_and_distinct() {
        assert_eq!(super::group_id("t0"), super::group_id("t0"));
        assert_ne!(super::group_id("t0"), super::group_id("t1"));
        assert_ne!(super::group_id(""), 0);
    }
}
