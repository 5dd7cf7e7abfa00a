#!/usr/bin/env bash
# shuffle_bench.sh — issue 17's first measurement: Spark's GroupByTest shape (NetSpark's GroupBy)
# with Spark's built-in sort shuffle vs io.slipstream.spark.shuffle.SlipstreamShuffleManager over
# the daemon's [shuffle] pool, same JVM run, same data, same machine.
#
# Driver: connectors/spark/.../bench/ShuffleBench.java (Spark local[2], one SparkSession per
# manager, one warm-up round then RUNS measured rounds each). Figures: map stage (shuffle write),
# reduce stage (shuffle read + group), job (wall ms), and the stages' summed task CPU ms
# (Spark's executorCpuTime: steadier than wall time on a shared machine); medians of the
# measured rounds.
# Local path only (executors and the daemon on one host); the sort shuffle compresses (lz4,
# Spark's default), Slipstream does not.
#
# Output: RESULTS_DIR (default bench/results/shuffle-<UTC timestamp>/): shuffle.jsonl, summary.md.
# Knobs: RECORDS [1000000], MAPS [8], REDUCES [8], VALUE_BYTES [100], RUNS [3], MEMORY_MB [4096],
#   SKIP_BUILD [0], SLIPSTREAM_BIN [target/release/slipstream].
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${SLIPSTREAM_BIN:-$ROOT/target/release/slipstream}"
RECORDS="${RECORDS:-1000000}" MAPS="${MAPS:-8}" REDUCES="${REDUCES:-8}" VALUE_BYTES="${VALUE_BYTES:-100}"
RUNS="${RUNS:-3}" MEMORY_MB="${MEMORY_MB:-4096}"
OUT="${RESULTS_DIR:-$ROOT/bench/results/shuffle-$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$OUT"
if [[ "${SKIP_BUILD:-0}" != 1 ]]; then
    (cd "$ROOT" && cargo build --release -p slipstream)
fi
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
KV_PORT=$(free_port); PORT=$(free_port)
DIR=$(mktemp -d /dev/shm/slipstream-shuffle-bench-XXXXXX)
CONF="$OUT/daemon.toml"
printf '[shuffle]\ntcp_port = %s\nmemory_mb = %s\ndir = "%s"\n' "$PORT" "$MEMORY_MB" "$DIR" > "$CONF"
"$BIN" serve -p "$KV_PORT" -l 127.0.0.1 --config "$CONF" > "$OUT/daemon.log" 2>&1 &
DAEMON=$!
cleanup() { kill "$DAEMON" 2>/dev/null || true; wait "$DAEMON" 2>/dev/null || true; rm -rf "$DIR"; }
trap cleanup EXIT
for _ in $(seq 100); do
    (exec 3<>/dev/tcp/127.0.0.1/"$PORT") 2>/dev/null && break
    sleep 0.1
done
SPARK_JAVA_OPTS="${SPARK_JAVA_OPTS:--Xmx4g}" bash "$ROOT/connectors/spark/bin/run-java.sh" io.slipstream.spark.bench.ShuffleBench \
    endpoint=127.0.0.1:"$PORT" records="$RECORDS" maps="$MAPS" reduces="$REDUCES" value_bytes="$VALUE_BYTES" runs="$RUNS" \
    | grep '^{' | tee "$OUT/shuffle.jsonl"
python3 - "$OUT" <<'PY'
import json, statistics, sys, os
out = sys.argv[1]
rows = [json.loads(l) for l in open(os.path.join(out, "shuffle.jsonl")) if l.strip()]
lines = ["| manager | records | maps x reduces | value bytes | map stage ms | reduce stage ms | job ms | map task CPU ms | reduce task CPU ms | reduce stage ms per round |",
         "|---|---|---|---|---|---|---|---|---|---|"]
med = {}
for m in ("sort", "slipstream"):
    r = [x for x in rows if x["manager"] == m and not x["warmup"]]
    if not r:
        continue
    med[m] = {k: statistics.median(x[k] for x in r) for k in ("map_stage_ms", "reduce_stage_ms", "job_ms", "map_cpu_ms", "reduce_cpu_ms")}
    x = r[0]
    lines.append("| %s | %d | %dx%d | %d | %.0f | %.0f | %.0f | %.0f | %.0f | %s |" % (
        m, x["records"], x["maps"], x["reduces"], x["value_bytes"], med[m]["map_stage_ms"],
        med[m]["reduce_stage_ms"], med[m]["job_ms"], med[m]["map_cpu_ms"], med[m]["reduce_cpu_ms"],
        ", ".join(str(y["reduce_stage_ms"]) for y in r)))
if len(med) == 2:
    for k in ("map_stage_ms", "reduce_stage_ms", "job_ms", "map_cpu_ms", "reduce_cpu_ms"):
        lines.append("")
        lines.append("%s: slipstream / sort = %.2f" % (k, med["slipstream"][k] / med["sort"][k]))
text = "\n".join(lines) + "\n"
open(os.path.join(out, "summary.md"), "w").write(text)
print(text)
PY
