#!/usr/bin/env bash
# one live XDP word-count run (RUNS=2), prints the XDP ns/datagram line
cd /work/main
OUT=${OUT:-/tmp/s21p/one}; rm -rf $OUT; mkdir -p $OUT
env GEN=xdp PARTS=wc WC_WORDS=${WC_WORDS:-16} WC_RATE=${WC_RATE:-20000} RUNS=${RUNS:-2} STEP_S=10 IDLE_S=2 SKIP_BUILD=1 SLIP_TRIGGER_MS=10000 SETUPS=xdp APP_CPUS=1 \
  SLIPSTREAM_BIN=${BIN:-/work/main/target/release/slipstream} RESULTS_DIR=$OUT bash bench/stream_cpu.sh > $OUT/run.log 2>&1
grep -o "slept [0-9]* times ([0-9.]* datagrams per wake-up); XDP [^;]*" $OUT/run.log; grep "Slipstream XDP" $OUT/summary.md | head -1 | cut -d'|' -f6-14
