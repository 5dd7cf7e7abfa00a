#!/usr/bin/env bash
# A B B A pairs of bench/repl_spread_perf.sh (plain, PERF=0), both layouts per run.
cd /work/wt/repl
for r in $(seq 1 ${PAIRS:-1}); do
for b in base new new base; do
  bin=/tmp/h15b/slipstream; [ $b = new ] && bin=/tmp/h15m/slipstream
  for L in "1 1 1" "1 2 3"; do
    l0=$(cut -d' ' -f1 /proc/loadavg)
    t=$(SLIPSTREAM_BIN=$bin CLUSTER_RAFT_BASE=20500 BASE=20000 LEADERS="$L" DUR=${DUR:-8} PERF=0 $NICE bash bench/repl_spread_perf.sh 2>&1 | grep total | awk '{print $3}')
    l1=$(cut -d' ' -f1 /proc/loadavg)
    echo "$(date -u +%H:%M:%S) $b leaders=${L// /} sets_s=$t load=$l0-$l1"
  done
done
done
