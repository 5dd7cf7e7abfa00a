#!/usr/bin/env bash
# replication_bench.sh — replicated sets/s on a 3-node loopback cluster (issue 15; the paper's
# Fig. 8: all leaders on one node vs leaders spread).
#
# Starts scripts/cluster.sh (3 daemons, tenants t0/t1/t2 replicated on all three, plus an
# unreplicated tenant u0 on each node: CLUSTER_UNREPLICATED=1) with data in a temporary
# directory, twice: leaders spread (t0 on node 1, t1 on node 2, t2 on node 3) and all leaders
# on node 1. Then runs slipstream-loadgen, one run after another, closed loop, sets only
# (--ratio 1:0), VALUE_BYTES values, CONNS connections with PIPELINE requests in flight each
# (a replicated connection pipelines its writes):
#   spread layout:
#     leader:     t0 through node 1 (its leader), alone
#     follower:   t0 through node 2 (every set forwarded to node 1), alone
#     spread:     t0 via node 1, t1 via node 2, t2 via node 3 at once (each via its leader; summed)
#     unrepl:     u0 on node 1 (replicas = 1: same daemon, same path, no group)
#   one-leader layout:
#     oneleader:  t0, t1, t2 via node 1 at once (it leads all three; summed)
# Prints one JSON line per loadgen run. Everything is on this machine (the three daemons and the
# load generator share its cores), so this measures the software path, not a network.
# Env: FSYNC (batch), VALUE_BYTES (64), CONNS (50), PIPELINE (16), DURATION_S (5), BASE (21000, below the ephemeral port range),
# LAYOUTS ("spread one"), NO_BUILD=1 skips the cargo build.
set -euo pipefail
cd "$(dirname "$0")/.."
FSYNC=${FSYNC:-batch}
VALUE_BYTES=${VALUE_BYTES:-64}
CONNS=${CONNS:-50}
PIPELINE=${PIPELINE:-16}
DURATION_S=${DURATION_S:-5}
BASE=${BASE:-21000}
LAYOUTS=${LAYOUTS:-spread one}
LOADGEN=target/release/slipstream-loadgen
[ "${NO_BUILD:-0}" = 1 ] || cargo build --release -p slipstream -p slipstream-loadgen
DIR=$(mktemp -d /tmp/slipstream-replbench.XXXXXX)
CPID=
stop_cluster() {
    if [ -n "$CPID" ]; then kill "$CPID" 2>/dev/null || true; wait "$CPID" 2>/dev/null || true; fi
    CPID=
}
cleanup() { stop_cluster; rm -rf "$DIR"; }
trap cleanup EXIT

start_cluster() { # leaders of t0 t1 t2, e.g. "1 2 3"
    local leaders=($1) sub="$DIR/cluster-${1// /}"
    mkdir -p "$sub"
    CLUSTER_DIR=$sub CLUSTER_BASE_PORT=$BASE CLUSTER_FSYNC=$FSYNC CLUSTER_UNREPLICATED=1 CLUSTER_LEADERS="$1" \
        bash scripts/cluster.sh >"$sub/cluster.out" 2>&1 &
    CPID=$!
    # Wait (bounded) until each tenant's preferred leader leads, as node 1 sees it.
    local ok=0
    for _ in $(seq 1 150); do
        ok=1
        for k in 0 1 2; do
            lead=$(curl -s "127.0.0.1:$((BASE + 190))/metrics" | grep "^slipstream_replica_leader_id{tenant=\"t$k\"}" | awk '{print $2}' || true)
            [ "$lead" = "${leaders[$k]}" ] || ok=0
        done
        [ $ok = 1 ] && break
        sleep 0.2
    done
    [ $ok = 1 ] || { echo "leaders not in place; see $sub" >&2; cat "$sub/cluster.out" >&2; exit 1; }
}

run() { # label server...
    local label=$1; shift
    local pids=() i=0
    for s in "$@"; do
        $LOADGEN --server "$s" --ratio 1:0 --value-bytes "$VALUE_BYTES" --conns "$CONNS" --pipeline "$PIPELINE" \
            --duration-s "$DURATION_S" --warmup-s 1 --keys 10000 --seed $((7 + i)) > "$DIR/$label-$i.json" &
        pids+=($!); i=$((i + 1))
    done
    for p in "${pids[@]}"; do wait "$p" || true; done
    for f in "$DIR/$label"-*.json; do
        echo "{\"run\":\"$label\",\"fsync\":\"$FSYNC\",\"value_bytes\":$VALUE_BYTES,\"load1\":$(cut -d' ' -f1 /proc/loadavg),\"result\":$(cat "$f")}"
    done
}

for layout in $LAYOUTS; do
    case $layout in
        spread)
            start_cluster "1 2 3"
            run leader "127.0.0.1:$((BASE + 100))"
            run follower "127.0.0.1:$((BASE + 200))"
            run spread "127.0.0.1:$((BASE + 100))" "127.0.0.1:$((BASE + 201))" "127.0.0.1:$((BASE + 302))"
            run unrepl "127.0.0.1:$((BASE + 103))"
            ;;
        one)
            start_cluster "1 1 1"
            run oneleader "127.0.0.1:$((BASE + 100))" "127.0.0.1:$((BASE + 101))" "127.0.0.1:$((BASE + 102))"
            ;;
        *) echo "unknown layout $layout" >&2; exit 2 ;;
    esac
    stop_cluster
done
