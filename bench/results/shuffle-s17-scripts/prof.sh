#!/usr/bin/env bash
cd /tmp/s17-17/tree
B=/tmp/s17-17/bin
R=/work/wt/shuffle/bench/results/shuffle-s17-profile
rm -rf $R; echo "== profile $(date -u +%T) $(uptime)"
env PROFILE=1 SKIP_BUILD=1 RECORDS=4000000 SHAPES=200x200 WARMUPS=4 RUNS=3 MANAGERS=slipstream SPARK_JAR=$B/new.jar SLIPSTREAM_BIN=$B/slipstream RESULTS_DIR=$R bash bench/shuffle_bench.sh > $R.log 2>&1
echo "rc=$? $(date -u +%T) $(uptime)"
