cd /work/main
common=(GEN=xdp PARTS=wc WC_WORDS=16 WC_RATE=20000 RUNS=2 STEP_S=10 IDLE_S=5 SKIP_BUILD=1 SLIP_TRIGGER_MS=10000 SETUPS=xdp APP_CPUS=1)
n=1
for s in 0 1 1 0; do
  out=bench/results/stream-cpu-s22/spin-$n-rx$s
  echo "== $n spin=$s $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  env "${common[@]}" RX_SPIN=$s RESULTS_DIR=$PWD/$out bash bench/stream_cpu.sh > /tmp/s22-spin-$n.log 2>&1
  echo "== end rc=$? $(date -u +%T)"
  grep -E "^\| (plain|Slipstream)" $out/summary.md | head -2
  grep -iE "ns per datagram|program" $out/summary.md | head -3
  n=$((n+1))
done
