#!/usr/bin/env bash
# 4M 200x200 sweep of the built-in shuffle's settings: one invocation each, 1 warm-up + 2 rounds.
cd /work/wt/shuffle
B=/tmp/s17-17/bin
R=/work/wt/shuffle/bench/results/shuffle-s17-tuned-sweep
mkdir -p $R
run() { name=$1; shift; echo "== $name $(date -u +%T) $(uptime)"; env SKIP_BUILD=1 RECORDS=4000000 SHAPES=200x200 WARMUPS=1 RUNS=2 SPARK_JAR=$B/base.jar SLIPSTREAM_BIN=$B/slipstream RESULTS_DIR=$R/$name "$@" bash bench/shuffle_bench.sh > $R/$name.log 2>&1; echo "rc=$? $(date -u +%T) $(uptime)"; }
run sort MANAGERS=sort
run t1m MANAGERS=tuned
run unsafe MANAGERS=tuned TUNED_CONF='spark.shuffle.sort.bypassMergeThreshold=1;spark.shuffle.file.buffer=1m;spark.shuffle.unsafe.file.output.buffer=1m'
run unsafe96 MANAGERS=tuned TUNED_CONF='spark.shuffle.sort.bypassMergeThreshold=1;spark.shuffle.file.buffer=1m;spark.shuffle.unsafe.file.output.buffer=1m;spark.reducer.maxSizeInFlight=96m;spark.shuffle.detectCorrupt=false;spark.shuffle.checksum.enabled=false'
