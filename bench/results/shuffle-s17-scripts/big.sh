#!/usr/bin/env bash
# 16M 200x200: tuned built-in (serialized writer, 1 MiB buffers) vs Slipstream, 1 warm-up + 2 rounds each, from the snapshot tree.
cd /tmp/s17-17/tree
B=/tmp/s17-17/bin
R=/work/wt/shuffle/bench/results/shuffle-s17-16m-tuned
mkdir -p $R
T='spark.shuffle.sort.bypassMergeThreshold=1;spark.shuffle.file.buffer=1m;spark.shuffle.unsafe.file.output.buffer=1m'
run() { name=$1; shift; rm -rf $R/$name; echo "== $name $(date -u +%T) $(uptime)"; env SKIP_BUILD=1 RECORDS=16000000 SHAPES=200x200 WARMUPS=1 RUNS=2 MASTER='local-cluster[2,1,3072]' MEMORY_MB=6144 CLEAN=1 SPARK_JAR=$B/base.jar SLIPSTREAM_BIN=$B/slipstream RESULTS_DIR=$R/$name "$@" bash bench/shuffle_bench.sh > $R/$name.log 2>&1; echo "rc=$? $(date -u +%T) $(uptime)"; }
for x in "$@"; do
  case $x in
    tuned*) run $x MANAGERS=tuned TUNED_CONF="$T";;
    slip*) run $x MANAGERS=slipstream;;
  esac
done
