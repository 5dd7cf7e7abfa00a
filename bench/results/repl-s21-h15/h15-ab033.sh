#!/usr/bin/env bash
cd /work/wt/repl
OUT=$1; shift
mkdir -p $OUT
i=0
for v in "$@"; do
  if [ $((i % 2)) = 0 ]; then layouts="spread one"; else layouts="one spread"; fi; i=$((i+1))
  echo "$v $layouts $(date -u +%H:%M:%S) load $(cat /proc/loadavg)" >> $OUT/log
  SLIPSTREAM_BIN=/tmp/h15-$v-slipstream NO_BUILD=1 VALUE_BYTES=${VB:-1024} RUNS=spread LAYOUTS="$layouts" NODE_CPU=0.33 CLIENT_CPU=0.5 CPU_SHARES=65536 \
    DURATION_S=5 BASE=24000 CLUSTER_RAFT_BASE=24500 bash bench/replication_bench.sh >> $OUT/$v.jsonl 2>>$OUT/err
done
echo "end $(date -u +%H:%M:%S) load $(cat /proc/loadavg)" >> $OUT/log
