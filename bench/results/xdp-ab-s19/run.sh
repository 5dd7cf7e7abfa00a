#!/bin/bash
# Session 19: the kernel fast path before (OLD_TARGET: d85a23c built in a worktree) and after the
# reuse gate (NEW_TARGET: main), one server core, max offered rate, A B B A x 3, a fresh daemon
# per run; bpf_stats on, the programs' counters sampled every second (table.py reads them).
# From the repository root, as root.
set -u
R=${R:-bench/results/xdp-ab-s19}; mkdir -p $R
sysctl -qw kernel.bpf_stats_enabled=1
trap 'sysctl -qw kernel.bpf_stats_enabled=0' EXIT
stamp() { echo "=== $1 $(date -u +%H:%M:%S) $(cat /proc/loadavg)" | tee -a $R/timeline.txt; }
i=0
for round in 1 2 3; do
  for v in old new new old; do
    i=$((i+1))
    if [ $v = old ]; then T=${OLD_TARGET:?}; else T=${NEW_TARGET:-target}; fi
    stamp "$i-$v"
    ( while sleep 1; do echo "$(date +%s) $(bpftool -j prog show 2>/dev/null)"; done > $R/$i-$v.bpf ) &
    SAMPLER=$!
    CARGO_TARGET_DIR=$T THREADS_LIST=1 SERVERS=xdp REPEATS=1 RATES_XDP=0 DURATION_S=5 SKIP_BUILD=1 \
      RESULTS_DIR=$R/$i-$v bash bench/xdp_bench.sh > $R/$i-$v.log 2>&1
    kill $SAMPLER
  done
done
stamp done
