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
# LAYOUTS ("spread one"), RUNS ("leader follower spread unrepl" of the spread layout; the
# one-leader layout always runs oneleader), NO_BUILD=1 skips the cargo build.
# NODE_CPU (cores, e.g. 0.5): emulated machines (bench/cpugroups.py) — each daemon in its own
# cgroup v1 cpu group with that CFS quota, this script and its load generators in a clients'
# group with CLIENT_CPU cores (0.5); CPU_SHARES (e.g. 65536) the groups' cpu.shares (alone: one
# group at those shares, no quotas). The groups are removed on exit, failure or not. Each JSON
# line then carries "cpu_groups" (CPU seconds and throttling per group over that run).
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
RUNS=${RUNS:-leader follower spread unrepl}
DIR=$(mktemp -d /tmp/slipstream-replbench.XXXXXX)
CPID=
CG=
stop_cluster() {
    if [ -n "$CPID" ]; then kill "$CPID" 2>/dev/null || true; wait "$CPID" 2>/dev/null || true; fi
    CPID=
}
cleanup() {
    stop_cluster
    [ -z "$CG" ] || python3 bench/cpugroups.py remove "$CG"
    rm -rf "$DIR"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
CLUSTER_CGROUPS=
CG_DESC="no emulation"
if [ -n "${NODE_CPU:-}${CPU_SHARES:-}" ]; then
    CG=slipstream-replbench-$$
    mapfile -t cg_out < <(python3 bench/cpugroups.py setup "$CG" 3 "${NODE_CPU:-}" "${CLIENT_CPU-0.5}" "${CPU_SHARES:-1024}")
    [ ${#cg_out[@]} = 3 ] || { echo "cpugroups setup failed" >&2; exit 1; }
    CLUSTER_CGROUPS=${cg_out[0]}
    for f in ${cg_out[1]}; do echo $$ > "$f"; done
    CG_DESC=${cg_out[2]}
fi
echo "# $CG_DESC" >&2

start_cluster() { # leaders of t0 t1 t2, e.g. "1 2 3"
    local leaders=($1) sub="$DIR/cluster-${1// /}"
    mkdir -p "$sub"
    CLUSTER_CGROUPS=$CLUSTER_CGROUPS CLUSTER_DIR=$sub CLUSTER_BASE_PORT=$BASE CLUSTER_FSYNC=$FSYNC CLUSTER_UNREPLICATED=1 CLUSTER_LEADERS="$1" \
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
    local pids=() i=0 cg_before='{}' cg_after='{}'
    [ -z "$CG" ] || cg_before=$(python3 bench/cpugroups.py report "$CG")
    for s in "$@"; do
        $LOADGEN --server "$s" --ratio 1:0 --value-bytes "$VALUE_BYTES" --conns "$CONNS" --pipeline "$PIPELINE" \
            --duration-s "$DURATION_S" --warmup-s 1 --keys 10000 --seed $((7 + i)) > "$DIR/$label-$i.json" &
        pids+=($!); i=$((i + 1))
    done
    for p in "${pids[@]}"; do wait "$p" || true; done
    [ -z "$CG" ] || cg_after=$(python3 bench/cpugroups.py report "$CG")
    local cg_delta
    cg_delta=$(python3 -c 'import json,sys; a,b=json.loads(sys.argv[1]),json.loads(sys.argv[2]); print(json.dumps({g:{k:round(v-a.get(g,{}).get(k,0),3) for k,v in d.items()} for g,d in b.items()}))' "$cg_before" "$cg_after")
    for f in "$DIR/$label"-*.json; do
        echo "{\"run\":\"$label\",\"fsync\":\"$FSYNC\",\"value_bytes\":$VALUE_BYTES,\"node_cpu\":\"${NODE_CPU:-}\",\"cpu_shares\":\"${CPU_SHARES:-}\",\"load1\":$(cut -d' ' -f1 /proc/loadavg),\"cpu_groups\":$cg_delta,\"result\":$(cat "$f")}"
    done
}

for layout in $LAYOUTS; do
    case $layout in
        spread)
            start_cluster "1 2 3"
            for r in $RUNS; do
                case $r in
                    leader) run leader "127.0.0.1:$((BASE + 100))" ;;
                    follower) run follower "127.0.0.1:$((BASE + 200))" ;;
                    spread) run spread "127.0.0.1:$((BASE + 100))" "127.0.0.1:$((BASE + 201))" "127.0.0.1:$((BASE + 302))" ;;
                    unrepl) run unrepl "127.0.0.1:$((BASE + 103))" ;;
                    *) echo "unknown run $r" >&2; exit 2 ;;
                esac
            done
            ;;
        one)
            start_cluster "1 1 1"
            run oneleader "127.0.0.1:$((BASE + 100))" "127.0.0.1:$((BASE + 101))" "127.0.0.1:$((BASE + 102))"
            ;;
        *) echo "unknown layout $layout" >&2; exit 2 ;;
    esac
    stop_cluster
done
