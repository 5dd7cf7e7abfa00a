#!/bin/bash
# Session 18, issue 17 item 1: is the second Slipstream invocation slower because of the daemon's
# state across applications? ONE daemon (hand-started, ports 22100/22101, admin 22102) serving
# three ShuffleBench invocations back to back (4M 200x200, slipstream only, 4 warm-ups + 3
# rounds), then three invocations of bench/shuffle_bench.sh (a fresh daemon each). Executors log
# G1 (-Xlog:gc) into gc/<mode>-<n>/. After each one-daemon invocation: the daemon's metrics and
# the files in its pool directory.
set -u
cd /work/wt/shuffle
R=$PWD/bench/results/shuffle-s18-second
stamp() { echo "=== $1 $(date -u +%H:%M:%S) $(cat /proc/loadavg)"; }
ARGS="records=4000000 maps=200 reduces=200 value_bytes=100 runs=3 warmups=4 master=local-cluster[2,1,1024] jar=$PWD/connectors/spark/target/slipstream-spark-0.1.0.jar managers=slipstream kryo=1 clean=0"
export SPARK_HOME=$(python3 -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))') SPARK_SCALA_VERSION=2.13
gcopt() { mkdir -p "$R/gc/$1"; echo "-Xmx4g -Dspark.executor.extraJavaOptions=-Xlog:gc:file=$R/gc/$1/%p.log:uptime"; }
DIR=$(mktemp -d /dev/shm/slipstream-s18-second-XXXXXX)
printf '[shuffle]\ntcp_port = 22101\nmemory_mb = 4096\ndir = "%s"\n' "$DIR" > $R/daemon.toml
target/release/slipstream serve -p 22100 -l 127.0.0.1 --admin=127.0.0.1:22102 --config $R/daemon.toml > $R/daemon.log 2>&1 &
D=$!
sleep 2
for i in 1 2 3; do
  stamp one-daemon-$i
  SPARK_JAVA_OPTS="$(gcopt one-$i)" SKIP_COMPILE=1 bash connectors/spark/bin/run-java.sh io.slipstream.spark.bench.ShuffleBench \
     endpoint=127.0.0.1:22101 $ARGS daemon_pid=$D | grep '^{' | sed "s/^{/{\"mode\":\"one-$i\",/" >> $R/shuffle.jsonl
  sleep 2
  echo "after one-$i: files $(ls $DIR | grep -c blk-) shm_mb $(du -sm $DIR | cut -f1)"
  curl -s 127.0.0.1:22102/metrics | grep -E '^slipstream_shuffle_(blocks_in_use|blocks_free|shuffles|connections) '
done
kill $D; wait $D; rm -rf "$DIR"
for i in 1 2 3; do
  stamp fresh-$i
  SPARK_JAVA_OPTS="$(gcopt fresh-$i)" SKIP_BUILD=1 RECORDS=4000000 SHAPES=200x200 MANAGERS=slipstream WARMUPS=4 RUNS=3 \
     RESULTS_DIR=$R/fresh-$i bash bench/shuffle_bench.sh 2>/dev/null | grep '^{' | sed "s/^{/{\"mode\":\"fresh-$i\",/" >> $R/shuffle.jsonl
done
stamp done
