#!/usr/bin/env bash
# `make cluster`: a 3-node Slipstream cluster on loopback, three replicated tenants whose
# preferred leaders sit on three different nodes (t0 on node 1, t1 on node 2, t2 on node 3).
# Runs in the foreground; Ctrl-C (or SIGTERM) stops the three daemons. Data (raft logs, hard
# state, snapshots), configs and logs go under $CLUSTER_DIR (default: a fresh temporary
# directory, kept afterwards so a restart can reuse it: CLUSTER_DIR=that-dir make cluster).
#
# Ports (CLUSTER_BASE_PORT, default 12000): node n serves tenant tk on BASE + 100*n + k
# (node 1: 12100 t0, 12101 t1, 12102 t2), its admin endpoint on BASE + 100*n + 90, raft on
# RAFT_BASE + n (RAFT_BASE: CLUSTER_RAFT_BASE, default BASE + 1000: 13001..13003). fsync: CLUSTER_FSYNC (default batch). Shaping capacity:
# CLUSTER_CAPACITY bytes/s each way (default 4e9: never binding).
# CLUSTER_LEADERS: the preferred leaders of t0 t1 t2 (default "1 2 3": spread; "1 1 1" puts
# all three on node 1, the single-leader layout of bench/replication_bench.sh).
# CLUSTER_UNREPLICATED=1 adds a tenant u0 with replicas = 1 on each node (BASE + 100*n + 3),
# the unreplicated baseline of bench/replication_bench.sh.
# CLUSTER_CGROUPS: cgroup v1 directories (space-separated); node n's daemon joins <dir>/node<n>
# of each before it starts (bench/cpugroups.py makes them: one emulated machine per node).
set -euo pipefail

BIN=${SLIPSTREAM_BIN:-$(cd "$(dirname "$0")/.." && pwd)/target/release/slipstream}
BASE=${CLUSTER_BASE_PORT:-12000}
FSYNC=${CLUSTER_FSYNC:-batch}
DIR=${CLUSTER_DIR:-$(mktemp -d /tmp/slipstream-cluster.XXXXXX)}
RAFT_BASE=${CLUSTER_RAFT_BASE:-$((BASE + 1000))}
NODES=3
read -r -a LEADERS <<< "${CLUSTER_LEADERS:-1 2 3}"

[ -x "$BIN" ] || { echo "cluster: $BIN not built (make build)" >&2; exit 1; }
mkdir -p "$DIR"

peers=""
for n in $(seq 1 $NODES); do
    peers="${peers:+$peers, }\"$n=127.0.0.1:$((RAFT_BASE + n))\""
done

config() { # node id -> config text
    local n=$1
    cat <<TOML
[server]
listen = "127.0.0.1"
threads = 2
port = $((BASE + 100 * n + 99))
admin = "127.0.0.1:$((BASE + 100 * n + 90))"

[shaping]
# Far above what loopback on one machine reaches: the shapers never set the figures here.
egress_bytes_per_s = ${CLUSTER_CAPACITY:-4000000000}
ingress_bytes_per_s = ${CLUSTER_CAPACITY:-4000000000}

[cluster]
node_id = $n
peers = [$peers]
data_dir = "$DIR/node$n/data"
fsync = "$FSYNC"
TOML
    for k in 0 1 2; do
        cat <<TOML

[[tenant]]
name = "t$k"
tcp_port = $((BASE + 100 * n + k))
memory_mb = 64
share = 0.3
replicas = $NODES
preferred_leader = ${LEADERS[$k]}
TOML
    done
    if [ "${CLUSTER_UNREPLICATED:-0}" = 1 ]; then
        cat <<TOML

[[tenant]]
name = "u0"
tcp_port = $((BASE + 100 * n + 3))
memory_mb = 64
share = 0.1
replicas = 1
TOML
    fi
}

pids=()
stop_all() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap stop_all EXIT
trap 'exit 130' INT TERM

for n in $(seq 1 $NODES); do
    mkdir -p "$DIR/node$n/data"
    config "$n" > "$DIR/node$n.toml"
    (
        for cg in ${CLUSTER_CGROUPS:-}; do echo "$BASHPID" > "$cg/node$n/cgroup.procs"; done
        exec "$BIN" serve --config "$DIR/node$n.toml"
    ) > "$DIR/node$n.log" 2>&1 &
    pids+=($!)
done

echo "cluster: 3 nodes, data/configs/logs in $DIR"
for n in $(seq 1 $NODES); do
    echo "  node $n (pid ${pids[$((n - 1))]}): t0 127.0.0.1:$((BASE + 100 * n)) t1 :$((BASE + 100 * n + 1)) t2 :$((BASE + 100 * n + 2)), admin http://127.0.0.1:$((BASE + 100 * n + 90))/metrics, raft :$((RAFT_BASE + n))"
done
echo "  preferred leaders: t0 on node ${LEADERS[0]}, t1 on node ${LEADERS[1]}, t2 on node ${LEADERS[2]}. Ctrl-C stops the cluster."
echo "  kill a node to see a failover; restart it by hand with: $BIN serve --config $DIR/node<n>.toml"
# Until every daemon has exited or we are told to stop (a killed node leaves the others up).
wait || true
echo "cluster: every daemon exited; see $DIR/node*.log" >&2
