#!/usr/bin/env bash
# Session 20, issue 12 on the quiet machine: plain Spark at its best placement (default: every
# CPU; pinned to one CPU it is not exact at 20,000/s, session 19) against Slipstream XDP -> Spark
# at its best (APP_CPUS=1: the daemon and the JVM off the receive core), same offered rate
# (20,000 datagrams/s x 16 words, plain Spark's highest exact rate here), A B B A, RUNS=3 each
# (the first two warm the JVMs' JIT; the third is reported). OUT: where the runs go (session 21
# wrote its pairs to bench/results/stream-cpu-s21 with this same driver).
cd "$(dirname "$0")/../../.."
common=(GEN=xdp PARTS=wc WC_WORDS=16 WC_RATE=20000 RUNS=3 STEP_S=10 IDLE_S=5 SKIP_BUILD=1 SLIP_TRIGGER_MS=10000)
n=${START:-1}
for what in ${ORDER:-plain xdp1 xdp1 plain}; do
  out=${OUT:-bench/results/stream-cpu-s20}/$n-$what
  echo "== $n $what $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  case $what in
    plain) env "${common[@]}" SETUPS=plain RESULTS_DIR=$PWD/$out bash bench/stream_cpu.sh > /tmp/s20-stream-$n.log 2>&1 ;;
    xdp1) env "${common[@]}" SETUPS=xdp APP_CPUS=1 RESULTS_DIR=$PWD/$out bash bench/stream_cpu.sh > /tmp/s20-stream-$n.log 2>&1 ;;
    xdp) env "${common[@]}" SETUPS=xdp RESULTS_DIR=$PWD/$out bash bench/stream_cpu.sh > /tmp/s20-stream-$n.log 2>&1 ;;
  esac
  echo "== end $n rc=$? $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  grep -E "^\| (plain|Slipstream)" $out/summary.md | head -2 | cut -d'|' -f2,5,6,13,14
  n=$((n+1))
done
