#!/bin/bash
# Quiet-machine runs after CI (session 17), from the CI clone; each logged with uptime.
set -u
cd "${CLONE:?set CLONE to the CI clone}"
R=bench/results/quiet-s17; mkdir -p $R
stamp() { echo "=== $1 $(date -u +%H:%M:%S) $(uptime | sed 's/.*load/load/')"; }
stamp shuffle
for m in sort slipstream slipstream sort; do SKIP_BUILD=1 RECORDS=4000000 SHAPES=200x200 MANAGERS=$m WARMUPS=4 RUNS=3 bash bench/shuffle_bench.sh; done > $R/shuffle_pair.log 2>&1
stamp stream
for p in "" 1; do APP_CPUS=$p GEN=xdp PARTS=wc WC_WORDS=16 WC_RATE=10000 RUNS=3 STEP_S=10 IDLE_S=5 SKIP_BUILD=1 SLIP_TRIGGER_MS=10000 RESULTS_DIR=$R/w16-app${p:-all} bash bench/stream_cpu.sh; done > $R/stream.log 2>&1
for k in 1 2; do
  stamp failover-$k
  SIGNAL=KILL KILLS=20 TIMINGS=50/6/2 SLIPSTREAM_BIN=$PWD/target/release/slipstream OUT=$R/kill$k.json python3 bench/failover_bench.py > $R/kill$k.txt 2>&1
done
stamp restart-cpu
SLIPSTREAM_BIN=$PWD/target/release/slipstream python3 bench/repl_restart_cpu.py > $R/restart_cpu.txt 2>&1
stamp walk-official
PERF=1 WALK=3 SECS=3 SLIPSTREAM_BIN=target/release/slipstream PLOT_OUT=/tmp/ignore.png python3 bench/hbase_load_bench.py > $R/walk_official.txt 2>&1
stamp kv
bash bench/kv_bench.sh > $R/kv.txt 2>&1
stamp done
