#!/usr/bin/env bash
# 16M 200x200 with the new jar: tuned, new, new, tuned; 1 warm-up + 2 rounds each, from the snapshot tree.
cd /tmp/s17-17/tree
B=/tmp/s17-17/bin
R=/work/wt/shuffle/bench/results/shuffle-s17-16m-tuned-new
mkdir -p $R
T='spark.shuffle.sort.bypassMergeThreshold=1;spark.shuffle.file.buffer=1m;spark.shuffle.unsafe.file.output.buffer=1m'
run() { name=$1; shift; rm -rf $R/$name; echo "== $name $(date -u +%T) $(uptime)"; env SKIP_BUILD=1 RECORDS=16000000 SHAPES=200x200 WARMUPS=1 RUNS=2 MASTER='local-cluster[2,1,3072]' MEMORY_MB=6144 CLEAN=1 SPARK_JAR=$B/new.jar SLIPSTREAM_BIN=$B/slipstream RESULTS_DIR=$R/$name "$@" bash bench/shuffle_bench.sh > $R/$name.log 2>&1; echo "rc=$? $(date -u +%T) $(uptime)"; }
run T1 MANAGERS=tuned TUNED_CONF="$T"
run N1 MANAGERS=slipstream
run N2 MANAGERS=slipstream
run T2 MANAGERS=tuned TUNED_CONF="$T"
