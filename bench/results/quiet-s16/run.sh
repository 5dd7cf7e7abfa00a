#!/bin/bash
# Quiet-machine runs after CI (session 16), from the CI clone; each logged with uptime.
set -u
cd /work/ci7
R=bench/results/quiet-s16; mkdir -p $R
stamp() { echo "=== $1 $(date -u +%H:%M:%S) $(uptime | sed 's/.*load/load/')"; }
stamp walk-regimes
VARIANTS='plain=;cpu0=taskset -c 0|taskset -c 0' EVENTS=ipi:ipi_send_cpu STARTS=3 ROUNDS=2 SECS=2 BIN=target/release/slipstream python3 bench/hbase_walk_regimes.py > $R/walk_regimes.txt 2>&1
stamp walk-official
PERF=1 WALK=3 SECS=3 SLIPSTREAM_BIN=target/release/slipstream PLOT_OUT=/tmp/ignore.png python3 bench/hbase_load_bench.py > $R/walk_official.txt 2>&1
for k in 1 2; do
  stamp failover-$k
  SIGNAL=KILL KILLS=20 TIMINGS=50/6/2 SLIPSTREAM_BIN=$PWD/target/release/slipstream OUT=$R/kill$k.json python3 bench/failover_bench.py > $R/kill$k.txt 2>&1
done
stamp restart-cpu
SLIPSTREAM_BIN=$PWD/target/release/slipstream python3 bench/repl_restart_cpu.py > $R/restart_cpu.txt 2>&1
stamp shuffle
for m in sort slipstream slipstream sort; do SKIP_BUILD=1 RECORDS=4000000 SHAPES=200x200 MANAGERS=$m WARMUPS=4 RUNS=3 bash bench/shuffle_bench.sh; done > $R/shuffle_pair.log 2>&1
stamp stream
for t in 1000 10000; do GEN=xdp PARTS=wc WC_WORDS=16 WC_RATE=10000 RUNS=3 STEP_S=10 IDLE_S=5 SKIP_BUILD=1 SLIP_TRIGGER_MS=$t RESULTS_DIR=$R/w16-t$t bash bench/stream_cpu.sh; done > $R/stream.log 2>&1
stamp kv
bash bench/kv_bench.sh > $R/kv.txt 2>&1
stamp done
