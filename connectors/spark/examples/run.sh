#!/usr/bin/env bash
# run.sh wordcount|changepoint: the example jobs end to end on this host: a Slipstream daemon
# (examples/*.toml, loopback ports), the generator (`slipstream send`), and the Spark job in
# local mode (local[2]) printing its results to the console for RUN_S seconds (default 20).
# Everything started here is stopped on exit. Not for benchmarks (bench/spark_bench.sh).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"
BIN="${SLIPSTREAM_BIN:-$ROOT/target/release/slipstream}"
RUN_S="${RUN_S:-20}"
JOB="${1:-}"
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do
        kill -TERM "$p" 2>/dev/null || true
    done
    wait 2>/dev/null || true
}
trap cleanup EXIT INT TERM

case "$JOB" in
    wordcount)
        CONF="$HERE/wordcount.toml"; CLASS=io.slipstream.spark.examples.WordCountJob; STREAM=words
        GEN=(--to 127.0.0.1:7201 --kind words --rate-per-s 2000 --duration-s "$RUN_S" --vocabulary 1000)
        EXTRA=() ;;
    changepoint)
        CONF="$HERE/changepoint.toml"; CLASS=io.slipstream.spark.examples.ChangePointAlertJob; STREAM=sensor
        # A level shift of +20 five seconds in (the generator makes one step per run).
        GEN=(--to 127.0.0.1:7202 --kind numbers --rate-per-s 1000 --duration-s "$RUN_S" --mean 10 --stddev 1
             --step-at-ms 5000 --step-by 20)
        EXTRA=("${CONTINUOUS:-}") ;;
    *) echo "usage: run.sh wordcount|changepoint" >&2; exit 2 ;;
esac

"$BIN" serve -p 7210 -l 127.0.0.1 --config "$CONF" &
PIDS+=($!)
sleep 1
# The job first (it reads from `latest`), then the generator once Spark is up.
SPARK_JAVA_OPTS="-Xmx2g" "$ROOT/connectors/spark/bin/run-java.sh" "$CLASS" 127.0.0.1:7200 "$STREAM" "$((RUN_S + 8))" "local[2]" "${EXTRA[@]}" &
PIDS+=($!)
sleep 6
"$BIN" send "${GEN[@]}" &
PIDS+=($!)
wait "${PIDS[1]}"
