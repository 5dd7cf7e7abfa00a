#!/bin/bash
# Quiet-machine runs after CI (session 18), from the CI clone; each logged with uptime.
set -u
cd "${CLONE:?set CLONE to the CI clone}"
R=bench/results/quiet-s18; mkdir -p $R
stamp() { echo "=== $1 $(date -u +%H:%M:%S) $(uptime | sed 's/.*load/load/')" | tee -a $R/timeline.txt; }
stamp xdp-kv
THREADS_LIST=1 SERVERS="xdp memcached" REPEATS=2 SKIP_BUILD=1 RESULTS_DIR=$R/xdp bash bench/xdp_bench.sh > $R/xdp.log 2>&1
stamp shuffle-16m
i=0; for m in sort slipstream slipstream sort; do i=$((i+1)); SKIP_BUILD=1 RECORDS=16000000 SHAPES=200x200 WARMUPS=1 RUNS=2 MANAGERS=$m MASTER='local-cluster[2,1,3072]' MEMORY_MB=6144 CLEAN=1 RESULTS_DIR=$PWD/$R/shuffle16m-$i-$m bash bench/shuffle_bench.sh; done > $R/shuffle16m.log 2>&1
stamp done
