#!/usr/bin/env bash
# A B B A oneleader runs at 1 KiB: A = /tmp/h15-base-slipstream, B = $NEWBIN
cd /work/wt/repl
OUT=$1; shift
mkdir -p $OUT
for v in "$@"; do
  bin=/tmp/h15-$v-slipstream
  echo "$v $(date -u +%H:%M:%S) load $(cat /proc/loadavg)" >> $OUT/log
  SLIPSTREAM_BIN=$bin NO_BUILD=1 VALUE_BYTES=1024 RUNS=spread LAYOUTS=one NODE_CPU=${NODE_CPU:-max} CPU_SHARES=65536 \
    DURATION_S=5 BASE=24000 CLUSTER_RAFT_BASE=24500 bash bench/replication_bench.sh >> $OUT/$v.jsonl 2>>$OUT/err
  echo "$v end $(date -u +%H:%M:%S) load $(cat /proc/loadavg)" >> $OUT/log
done
