#!/usr/bin/env bash
# one live XDP word-count run with perf on the receive CPU
cd /work/main
OUT=${OUT:-/tmp/s21p/live}
mkdir -p $OUT
env GEN=xdp PARTS=wc WC_WORDS=16 WC_RATE=20000 RUNS=2 STEP_S=10 IDLE_S=2 SKIP_BUILD=1 SLIP_TRIGGER_MS=10000 SETUPS=xdp APP_CPUS=1 \
  SLIPSTREAM_BIN=${BIN:-/work/main/target/release/slipstream} RESULTS_DIR=$OUT bash bench/stream_cpu.sh > $OUT/run.log 2>&1 &
B=$!
for i in $(seq 1 600); do
  if pgrep -f "slipstream-loadgen xdp-gen" >/dev/null; then break; fi
  sleep 0.2
done
sleep 1
perf record -C 0 -g --all-kernel -o $OUT/rx.perf -- sleep 6 > $OUT/perf.log 2>&1
wait $B
echo rc=$?
