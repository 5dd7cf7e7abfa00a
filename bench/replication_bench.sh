#!/usr/bin/env bash
# replication_bench.sh — replicated sets/s on a 3-node loopback cluster (issue 15, first figure).
#
# Starts scripts/cluster.sh (3 daemons, tenants t0/t1/t2 replicated on all three, leaders on
# nodes 1/2/3, plus an unreplicated tenant u0 on each node: CLUSTER_UNREPLICATED=1) with data in
# a temporary directory, then runs slipstream-loadgen, one run after another, closed loop, sets
# only (--ratio 1:0), VALUE_BYTES values:
#   leader:     t0 through node 1 (its leader)
#   follower:   t0 through node 2 (every set forwarded to node 1)
#   spread:     t0 via node 1, t1 via node 2, t2 via node 3 at once (leaders spread; summed)
#   unrepl:     u0 on node 1 (replicas = 1: same daemon, same path, no group)
# Prints one JSON line per loadgen run. Everything is on this machine (the three daemons and the
# load generator share its cores), so this measures the software path, not a network.
# Env: FSYNC (batch), VALUE_BYTES (64), CONNS (50), PIPELINE (16), DURATION_S (5), BASE (31000), NO_BUILD=1 skips the cargo build.
set -euo pipefail
cd "$(dirname "$0")/.."
FSYNC=${FSYNC:-batch}
VALUE_BYTES=${VALUE_BYTES:-64}
CONNS=${CONNS:-50}
PIPELINE=${PIPELINE:-16}
DURATION_S=${DURATION_S:-5}
BASE=${BASE:-31000}
LOADGEN=target/release/slipstream-loadgen
[ "${NO_BUILD:-0}" = 1 ] || cargo build --release -p slipstream -p slipstream-loadgen
DIR=$(mktemp -d /tmp/slipstream-replbench.XXXXXX)
CLUSTER_DIR=$DIR CLUSTER_BASE_PORT=$BASE CLUSTER_FSYNC=$FSYNC CLUSTER_UNREPLICATED=1 bash scripts/cluster.sh >"$DIR/cluster.out" 2>&1 &
CPID=$!
cleanup() { kill "$CPID" 2>/dev/null || true; wait "$CPID" 2>/dev/null || true; rm -rf "$DIR"; }
trap cleanup EXIT
# Wait (bounded) until each tenant's preferred leader leads.
for _ in $(seq 1 100); do
    ok=1
    for n in 1 2 3; do
        lead=$(curl -s "127.0.0.1:$((BASE + 100 * n + 90))/metrics" | grep "^slipstream_replica_leader_id{tenant=\"t$((n - 1))\"}" | awk '{print $2}' || true)
        [ "$lead" = "$n" ] || ok=0
    done
    [ $ok = 1 ] && break
    sleep 0.2
done
[ $ok = 1 ] || { echo "leaders not in place; see $DIR" >&2; cat "$DIR/cluster.out" >&2; exit 1; }
run() { # label server...
    local label=$1; shift
    local pids=() i=0
    for s in "$@"; do
        $LOADGEN --server "$s" --ratio 1:0 --value-bytes "$VALUE_BYTES" --conns "$CONNS" --pipeline "$PIPELINE" \
            --duration-s "$DURATION_S" --warmup-s 1 --keys 10000 --seed $((7 + i)) > "$DIR/$label-$i.json" &
        pids+=($!); i=$((i + 1))
    done
    for p in "${pids[@]}"; do wait "$p" || true; done
    for f in "$DIR/$label"-*.json; do echo "{\"run\":\"$label\",\"fsync\":\"$FSYNC\",\"value_bytes\":$VALUE_BYTES,\"result\":$(cat "$f")}"; done
}
run leader "127.0.0.1:$((BASE + 100))"
run follower "127.0.0.1:$((BASE + 200))"
run spread "127.0.0.1:$((BASE + 100))" "127.0.0.1:$((BASE + 201))" "127.0.0.1:$((BASE + 302))"
run unrepl "127.0.0.1:$((BASE + 103))"
