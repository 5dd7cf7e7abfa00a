#!/usr/bin/env bash
# main's binary (/tmp/h15s20-base, eb76763) under bench/repl_emulation_ab.sh at NODE_CPU 0.4 and
# 0.5 alternated (ORDER, default 0.4 0.5 0.5 0.4; runs 13-18 used ORDER="0.33 0.4 0.4 0.33 0.33 0.4", runs 19-24 ORDER="0.33 0.5 0.5 0.33 0.33 0.5"):
# does the spread layout get its quota when the quotas
# leave the 2-core machine headroom (3 x 0.4 + 0.5 clients = 1.7 cores)?
cd /work/wt/repl
export BASE=21000 CLUSTER_RAFT_BASE=21500 SIZES=64 REPEATS=1
n=${START:-1}
for q in ${ORDER:-0.4 0.5 0.5 0.4}; do
  out=bench/results/repl-s20/quota-$n-$q
  echo "== run $n node_cpu $q $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  NODE_CPU=$q SLIPSTREAM_BIN=/tmp/h15s20-base/slipstream OUT_DIR=$out PNG=/tmp/h15s20-q$n.png bash bench/repl_emulation_ab.sh 2>&1 | grep -E "B emulated|B plain"
  echo "== end $n $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  n=$((n+1))
done
