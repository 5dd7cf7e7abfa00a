#!/usr/bin/env bash
# shuffle_bench.sh — issue 17's GroupBy measurement: Spark's GroupByTest shape (NetSpark's GroupBy)
# with Spark's built-in sort shuffle vs io.slipstream.spark.shuffle.SlipstreamShuffleManager over
# the daemon's [shuffle] pool, same driver run, same data, same machine.
#
# Driver: connectors/spark/.../bench/ShuffleBench.java (one SparkSession per manager, one warm-up
# round then RUNS measured rounds each). By default on MASTER=local-cluster[2,1,1024]: a
# standalone master and two workers in the driver JVM, two executor JVMs (1 core, 1 GiB each)
# started from pip's pyspark 4.0.1 SPARK_HOME (scripts/setup.sh installs it), the jar in
# spark.jars as users pass it; the sort shuffle then fetches half of each reducer's blocks from
# the other executor over Spark's Netty transport (loopback). MASTER=local[2] gives the one-JVM
# shape of the first figures. The script runs the driver twice, managers in the order
# sort,slipstream then slipstream,sort, so neither always goes first on a drifting machine.
# Three managers: Spark's sort shuffle with its defaults (`sort`), the sort shuffle tuned for one
# host (`tuned`: the serialized writer, bypassMergeThreshold=1, and 1 MiB shuffle file buffers;
# ShuffleBench.TUNED, the sweeps in docs/benchmarks.md) and
# Slipstream. The invocations alternate the order (sort,tuned,slipstream then the reverse).
# Figures: map stage (shuffle write), reduce stage (shuffle read + group), fetch wait, job (wall
# ms), the stages' summed task CPU ms (Spark's executorCpuTime: steadier than wall time on a
# shared machine), and host CPU-seconds per GB of record payload (records x (value + 4-byte key),
# the same denominator for every manager) over all JVMs (driver, executors) plus the daemon, read
# from /proc; medians over all measured rounds of both invocations. SHAPES lists maps x reduces.
# PROFILE=1: the executors record JFR (profile settings) into RESULTS_DIR/jfr/<manager>/, and
# bench/shuffle_profile.py summarises the reduce stages' task-thread samples.
# Local path only (executors and the daemon on one host); the sort shuffle compresses (lz4,
# Spark's default), Slipstream does not.
# PAGERANK=1: issue 17's GraphX PageRank instead of GroupBy (connectors/spark/.../bench/PageRankBench.java: GraphX's
# PageRank.run, ITERATIONS iterations on a generated power-law graph of VERTICES vertices in PARTS
# partitions, per-iteration job times from Spark's listener, ranks compared across managers; the
# driver exits 1 when they differ), summary by bench/pagerank_summary.py. Knobs: VERTICES
# [200000], PARTS [8], MU [2.0], SIGMA [1.3] (log-normal out-degrees), SKEW [3] (in-degree power
# law), SEED [17], ITERATIONS [10], KRYO [1]; RUNS as above.
#
# Output: RESULTS_DIR (default bench/results/shuffle-<UTC timestamp>/, pagerank-... with PAGERANK=1):
# shuffle.jsonl (pagerank.jsonl), summary.md,
# uptime.txt (load before/after), executor-logs/.
# Knobs: RECORDS [1000000], SHAPES ["8x8"; e.g. "8x8 200x200"], VALUE_BYTES [100], RUNS [5, per invocation
#   and manager: 2 x RUNS measured rounds each], WARMUPS [1: warm-up rounds per invocation and manager,
#   dropped from the figures; more take the executors' JIT compilation out of the measured rounds], MEMORY_MB [4096], MASTER [local-cluster[2,1,1024]],
#   SKIP_BUILD [0], SLIPSTREAM_BIN [target/release/slipstream], SPARK_JAR [connectors/spark/target/
#   slipstream-spark-0.1.0.jar: the jar the executors load the manager from; another build's jar
#   for an old-vs-new A/B], MANAGERS [sort,tuned,slipstream],
#   PROFILE [0], TUNED_CONF ["k=v;k=v" replaces the tuned settings], KRYO [1: every manager
#   serializes with Kryo, so Slipstream aggregates by merging (HashMerge); 0: Java serialization],
#   CLEAN [0; 1: a driver GC and 3 s pause before each round, so the previous round's shuffle is
#   cleaned first (16M records: two rounds' shuffles do not fit the pool)], EXECUTOR_MEMORY [unset:
#   Spark's default 1g; e.g. 3g: spark.executor.memory for every manager. local-cluster's third
#   number is the worker's memory, not the executor's heap: MASTER='local-cluster[2,1,3072]' alone
#   still gives 1 GiB executors].
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${SLIPSTREAM_BIN:-$ROOT/target/release/slipstream}"
RECORDS="${RECORDS:-1000000}" SHAPES="${SHAPES:-8x8}" VALUE_BYTES="${VALUE_BYTES:-100}"
MANAGERS="${MANAGERS:-sort,tuned,slipstream}"
RUNS="${RUNS:-5}" MEMORY_MB="${MEMORY_MB:-4096}" MASTER="${MASTER:-local-cluster[2,1,1024]}"
PAGERANK="${PAGERANK:-0}"
DRIVER_OPTS="${SPARK_JAVA_OPTS:--Xmx4g}"
[[ -n "${EXECUTOR_MEMORY:-}" ]] && DRIVER_OPTS+=" -Dspark.executor.memory=$EXECUTOR_MEMORY"
KIND=shuffle; [[ "$PAGERANK" == 1 ]] && KIND=pagerank
OUT="$(realpath -m "${RESULTS_DIR:-$ROOT/bench/results/$KIND-$(date -u +%Y%m%dT%H%M%SZ)}")"  # absolute: executors run elsewhere
mkdir -p "$OUT"
JAR="${SPARK_JAR:-$ROOT/connectors/spark/target/slipstream-spark-0.1.0.jar}"
if [[ "${SKIP_BUILD:-0}" != 1 ]]; then
    (cd "$ROOT" && cargo build --release -p slipstream)
    (cd "$ROOT/connectors/spark" && mvn -B -ntp -q -DskipTests package)
fi
[[ -f "$JAR" ]] || { echo "shuffle_bench: $JAR missing (make spark-build)" >&2; exit 1; }
# local-cluster's workers start executors from a Spark installation: pip's pyspark.
SPARK_HOME="${SPARK_HOME:-$(python3 -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')}"
export SPARK_HOME SPARK_SCALA_VERSION=2.13
mkdir -p "$SPARK_HOME/work"
WORK_BEFORE=$(ls "$SPARK_HOME/work")
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
KV_PORT=$(free_port); PORT=$(free_port)
DIR=$(mktemp -d /dev/shm/slipstream-shuffle-bench-XXXXXX)
CONF="$OUT/daemon.toml"
printf '[shuffle]\ntcp_port = %s\nmemory_mb = %s\ndir = "%s"\n' "$PORT" "$MEMORY_MB" "$DIR" > "$CONF"
"$BIN" serve -p "$KV_PORT" -l 127.0.0.1 --config "$CONF" > "$OUT/daemon.log" 2>&1 &
DAEMON=$!
cleanup() {
    kill "$DAEMON" 2>/dev/null || true; wait "$DAEMON" 2>/dev/null || true; rm -rf "$DIR"
    # The workers' per-application directories (executor logs, a copy of the jar) move here.
    for app in $(ls "$SPARK_HOME/work"); do
        grep -qx "$app" <<<"$WORK_BEFORE" && continue
        mkdir -p "$OUT/executor-logs/$app"
        for f in "$SPARK_HOME/work/$app"/*/std*; do
            [[ -f "$f" ]] && cp "$f" "$OUT/executor-logs/$app/$(basename "$(dirname "$f")")-$(basename "$f")"
        done
        rm -rf "${SPARK_HOME:?}/work/$app"
    done
}
trap cleanup EXIT
for _ in $(seq 100); do
    (exec 3<>/dev/tcp/127.0.0.1/"$PORT") 2>/dev/null && break
    sleep 0.1
done
uptime > "$OUT/uptime.txt"
REVERSED=$(tr ',' '\n' <<<"$MANAGERS" | tac | paste -sd,)
EXTRA=()
[[ "${PROFILE:-0}" == 1 ]] && { mkdir -p "$OUT/jfr"; EXTRA+=(jfr_dir="$OUT/jfr"); }
[[ -n "${TUNED_CONF:-}" ]] && EXTRA+=(tuned_conf="$TUNED_CONF")
if [[ "$PAGERANK" == 1 ]]; then
    RC=0
    for order in "$MANAGERS" "$REVERSED"; do
        # The driver exits 1 when the managers' ranks differ: its rounds are still kept, then fail.
        SPARK_JAVA_OPTS="$DRIVER_OPTS" SKIP_COMPILE=1 bash "$ROOT/connectors/spark/bin/run-java.sh" \
            io.slipstream.spark.bench.PageRankBench endpoint=127.0.0.1:"$PORT" vertices="${VERTICES:-200000}" \
            parts="${PARTS:-8}" mu="${MU:-2.0}" sigma="${SIGMA:-1.3}" skew="${SKEW:-3}" seed="${SEED:-17}" \
            iterations="${ITERATIONS:-10}" kryo="${KRYO:-1}" runs="$RUNS" master="$MASTER" jar="$JAR" \
            managers="$order" daemon_pid="$DAEMON" "${EXTRA[@]}" > "$OUT/driver-$order.out" || RC=$?
        grep '^{' "$OUT/driver-$order.out" | tee -a "$OUT/pagerank.jsonl"
        uptime >> "$OUT/uptime.txt"
        if [[ "$MANAGERS" == "$REVERSED" ]]; then break; fi
    done
    python3 "$ROOT/bench/pagerank_summary.py" "$OUT"
    exit "$RC"
fi
for shape in $SHAPES; do
    MAPS=${shape%x*} REDUCES=${shape#*x}
    for order in "$MANAGERS" "$REVERSED"; do
        SPARK_JAVA_OPTS="$DRIVER_OPTS" SKIP_COMPILE=1 bash "$ROOT/connectors/spark/bin/run-java.sh" \
            io.slipstream.spark.bench.ShuffleBench endpoint=127.0.0.1:"$PORT" records="$RECORDS" maps="$MAPS" \
            reduces="$REDUCES" value_bytes="$VALUE_BYTES" runs="$RUNS" warmups="${WARMUPS:-1}" master="$MASTER" jar="$JAR" managers="$order" kryo="${KRYO:-1}" clean="${CLEAN:-0}" \
            daemon_pid="$DAEMON" "${EXTRA[@]}" | grep '^{' | tee -a "$OUT/shuffle.jsonl"
        uptime >> "$OUT/uptime.txt"
        if [[ "$MANAGERS" == "$REVERSED" ]]; then break; fi
    done
done
python3 "$ROOT/bench/shuffle_summary.py" "$OUT"
