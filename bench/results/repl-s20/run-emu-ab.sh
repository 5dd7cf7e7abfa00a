#!/usr/bin/env bash
# A B B A runs of bench/repl_emulation_ab.sh (64 B, 1 repeat: emulated 0.5 core/node + plain),
# base = main's binary (/tmp/h15s20-base, main eb76763), new = s20-15 (/tmp/h15s20-new).
cd /work/wt/repl
export BASE=21000 CLUSTER_RAFT_BASE=21500 SIZES=64 REPEATS=1
n=${START:-1}
for b in ${ORDER:-base new new base}; do
  bin=/tmp/h15s20-base/slipstream; [ $b = new ] && bin=/tmp/h15s20-new/slipstream
  out=bench/results/repl-s20/emu-$n-$b
  echo "== run $n $b $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  SLIPSTREAM_BIN=$bin OUT_DIR=$out PNG=/tmp/h15s20-$n.png bash bench/repl_emulation_ab.sh 2>&1 | tail -12
  echo "== end $n $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  n=$((n+1))
done
