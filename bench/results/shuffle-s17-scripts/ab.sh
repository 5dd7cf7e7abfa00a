#!/usr/bin/env bash
# ab.sh OUTDIR name:manager:jar ... : 4M 200x200 invocations in the order given, 4 warm-ups + 3 rounds each, from the snapshot tree.
cd /tmp/s17-17/tree
B=/tmp/s17-17/bin
R=$1; shift; mkdir -p $R
T='spark.shuffle.sort.bypassMergeThreshold=1;spark.shuffle.file.buffer=1m;spark.shuffle.unsafe.file.output.buffer=1m'
for x in "$@"; do
  IFS=: read name m jar <<<"$x"
  rm -rf $R/$name; echo "== $name $m $jar $(date -u +%T) $(uptime)"
  if [[ $m == tuned ]]; then export TUNED_CONF="$T"; else unset TUNED_CONF; fi
  env SKIP_BUILD=1 RECORDS=4000000 SHAPES=200x200 WARMUPS=4 RUNS=3 MANAGERS=$m SPARK_JAR=$B/$jar SLIPSTREAM_BIN=$B/slipstream RESULTS_DIR=$R/$name bash bench/shuffle_bench.sh > $R/$name.log 2>&1
  echo "rc=$? $(date -u +%T) $(uptime)"
done
