#!/usr/bin/env bash
# repl_spread_perf.sh — one replicated-sets measurement on a fresh 3-node loopback cluster
# (issue 15), optionally with `perf record` on the three daemons: for paired A/B runs of two
# daemon builds (SLIPSTREAM_BIN=... alternated), without replication_bench.sh's other runs.
# Starts scripts/cluster.sh (fsync FSYNC, preferred leaders LEADERS: "1 2 3" spread, "1 1 1"
# one leader), waits for the leaders, runs one slipstream-loadgen per tenant at once through
# the tenant's leader (sets only, VALUE_BYTES [64] B, 50 connections x 16 in flight, DUR s), perf on the
# daemons from 2 s to DUR-1 s when PERF=1 (perf.data in the printed directory), prints each
# loadgen's sets/s and the sum. Env: BASE (21000, below the ephemeral port range), DUR (10), FSYNC (batch), PERF (1), PERF_ARGS (extra `perf record` options, e.g. -g),
# LEADERS ("1 2 3"), SLIPSTREAM_BIN (a file named `slipstream`: the daemons are found by
# `slipstream serve`), CLUSTER_RAFT_BASE (raft ports, scripts/cluster.sh). The cluster is stopped on
# exit; its directory is kept.
set -u
cd "$(dirname "$0")/.."
BASE=${BASE:-21000}; DUR=${DUR:-10}; FSYNC=${FSYNC:-batch}; PERF=${PERF:-1}; LEADERS=${LEADERS:-1 2 3}
DIR=$(mktemp -d /tmp/slipstream-replperf.XXXXXX)
CLUSTER_DIR=$DIR CLUSTER_BASE_PORT=$BASE CLUSTER_FSYNC=$FSYNC CLUSTER_LEADERS="$LEADERS" bash scripts/cluster.sh >$DIR/out 2>&1 &
CPID=$!
trap 'kill $CPID 2>/dev/null; wait $CPID 2>/dev/null' EXIT
read -r -a L <<< "$LEADERS"
for _ in $(seq 1 150); do ok=1
  for k in 0 1 2; do l=$(curl -s 127.0.0.1:$((BASE+190))/metrics | grep "^slipstream_replica_leader_id{tenant=\"t$k\"}" | awk '{print $2}'); [ "$l" = "${L[$k]}" ] || ok=0; done
  [ $ok = 1 ] && break; sleep 0.2; done
PIDS=$(pgrep -f "slipstream serve --config $DIR" | paste -sd,)
uptime
for k in 0 1 2; do n=${L[$k]}; target/release/slipstream-loadgen --server 127.0.0.1:$((BASE+100*n+k)) --ratio 1:0 --value-bytes ${VALUE_BYTES:-64} --conns 50 --pipeline 16 --duration-s $DUR --warmup-s 1 --keys 10000 --seed $k > $DIR/lg$k.json & done
if [ $PERF = 1 ]; then sleep 2; perf record -F 499 ${PERF_ARGS:-} -p $PIDS -o $DIR/perf.data -- sleep $((DUR-3)) 2>/dev/null >/dev/null; fi
wait $(jobs -p | grep -v "^$CPID$") 2>/dev/null
uptime
python3 - $DIR <<'PY'
import json,sys,glob
tot=0
for f in sorted(glob.glob(sys.argv[1]+'/lg*.json')):
    d=json.load(open(f)); tot+=d.get('ops_per_s',0)
    print(f.split('/')[-1], {k:d[k] for k in d if k in ('ops_per_s','errors','p50_us','p99_us','p50_ms','p99_ms')})
print('total sets/s', round(tot))
PY
echo $DIR
