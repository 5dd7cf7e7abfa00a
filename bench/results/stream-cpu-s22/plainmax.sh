cd /work/main
common=(GEN=xdp PARTS=wc WC_WORDS=16 RUNS=2 STEP_S=10 IDLE_S=5 SKIP_BUILD=1 SLIP_TRIGGER_MS=10000 SETUPS=plain)
for r in ${RATES:-25000}; do
  out=bench/results/stream-cpu-s22/plainmax-$r-$(date -u +%H%M%S)
  echo "== plain $r $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  env "${common[@]}" WC_RATE=$r RESULTS_DIR=$PWD/$out bash bench/stream_cpu.sh > /tmp/s22-plainmax-$r.log 2>&1
  echo "== end rc=$? $(date -u +%T)"
  grep -E "^\| (plain|Slipstream)" $out/summary.md | head -2
done
