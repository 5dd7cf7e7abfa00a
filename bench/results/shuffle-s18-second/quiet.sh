#!/bin/bash
# For the lead's quiet machine (nothing else running), from the CI clone: issue 17's 4M 200x200
# pairing with three Slipstream invocations in a row and the tuned baseline, every executor JVM
# logging G1 (-Xlog:gc) into $R/gc/<n>-<manager>/, so a slower invocation can be matched with
# its executors' GC (the quiet runs of sessions 16 and 17 showed G1 concurrent-mark CPU,
# "executor GN Conc#N" in reduce_threads_cpu_ms, only in the slower second invocation).
# About 15 min. Each invocation starts its own daemon (bench/shuffle_bench.sh).
set -u
cd "${CLONE:?set CLONE to the CI clone}"
R=bench/results/quiet-s18-shuffle; mkdir -p $R
for name in sort1 slipstream1 slipstream2 slipstream3 tuned1 tuned2 slipstream4 sort2; do
  m=${name%[0-9]}; mkdir -p "$PWD/$R/gc/$name"
  echo "=== $name $(date -u +%H:%M:%S) $(cat /proc/loadavg)"
  SPARK_JAVA_OPTS="-Xmx4g -Dspark.executor.extraJavaOptions=-Xlog:gc:file=$PWD/$R/gc/$name/%p.log:uptime" \
    SKIP_BUILD=1 RECORDS=4000000 SHAPES=200x200 MANAGERS=$m WARMUPS=4 RUNS=3 RESULTS_DIR=$PWD/$R/$name \
    bash bench/shuffle_bench.sh
done > $R/pair.log 2>&1
echo "=== done $(date -u +%H:%M:%S) $(cat /proc/loadavg)" >> $R/pair.log
# Then: python3 bench/shuffle_ab_table.py $R sort1 slipstream1 slipstream2 slipstream3 tuned1 tuned2 slipstream4 sort2; grep -c "Concurrent Mark Cycle [0-9]" $R/gc/*/*.log
