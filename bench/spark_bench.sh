#!/usr/bin/env bash
# spark_bench.sh — the issue-6 head-to-head: Slipstream feeding Spark vs plain Spark receiving
# the raw UDP datagrams itself, on this machine, same generator (`slipstream send`), same data.
#
# What it measures (driver: connectors/spark/.../bench/SparkBench.java, one JVM per setup,
# Spark local[2]):
#   a) Word count, highest datagram rate with exact counts (16 Zipf words per datagram,
#      WC_STEP_S seconds per rate, rates stepped up until the first inexact run):
#      - slipstream-spark: daemon `wordcount` stream (user space) -> the "slipstream" source
#        -> foreachBatch summing counts per word;
#      - plain-spark: a DStream custom UDP receiver (baseline/UdpReceiver) + countByValue,
#        1 s batches.
#      Exact = the summed counts equal the generator's --expect-counts multiset.
#   b) Change-point latency, CP_TRIALS trials (level alternating 10/30, step +-20, 5000
#      values/s, window 10 ms, 4 reference windows, threshold 5): alert seen (CLOCK_MONOTONIC)
#      minus the generator's step_sent_mono_ns, mean/p50/p99:
#      - plain-spark at 500 / 1000 / 2000 ms batches (baseline/ChangePointRule);
#      - slipstream-subscriber: a plain TCP subscriber;
#      - slipstream-spark-micro: alert rows of the source in a query with
#        Trigger.ProcessingTime(0), seen in a ForeachWriter;
#      - slipstream-spark-continuous: the same with Trigger.Continuous.
#   c) Host CPU per million input records: utime+stime (/proc/PID/stat) of the Spark JVM plus,
#      for Slipstream setups, the daemon, over the runs above (not the generator's).
# XDP column (root only; XDP=0 skips it): the word count again as slipstream-xdp-spark, with the
# daemon started with `--xdp` on a veth in a server network namespace (its streams run in the
# XDP engine), the Spark JVM in that namespace too, and the generator in a client namespace
# sending over the veth pair (as bench/stream_bench.sh's XDP column). Namespaces are removed on
# exit, also on failure.
#
# Output: RESULTS_DIR (default bench/results/spark-<UTC timestamp>/): spark.jsonl (every
# measurement), summary.md, wordcount_rate.png, changepoint_latency.png, cpu.png.
# Run time: about 10-12 minutes with the defaults.
#
# Knobs: SKIP_BUILD [0], SLIPSTREAM_BIN [target/release/slipstream], WC_STEP_S [3],
#   WC_SLIP_RATES ["20000,50000,100000,150000,200000,300000,0"],
#   WC_PLAIN_RATES ["5000,10000,20000,30000,40000,60000,80000"], CP_TRIALS [100],
#   CP_BATCHES_MS ["500 1000 2000"], CP_WARMUP_TRIALS [10] (change-point trials run first and not
#   counted, so a JVM's first-run costs (class loading, JIT) are not in the figures),
#   PARTS ["wc-slip wc-xdp wc-plain cp-sub cp-micro cp-continuous cp-plain"] (which setups run).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BIN="${SLIPSTREAM_BIN:-$ROOT/target/release/slipstream}"
STAMP="$(date -u +%Y%m%dT%H%M%SZ)"
RESULTS_DIR="${RESULTS_DIR:-$ROOT/bench/results/spark-$STAMP}"
WC_STEP_S="${WC_STEP_S:-3}"
WC_SLIP_RATES="${WC_SLIP_RATES:-20000,50000,100000,150000,200000,300000,0}"
WC_PLAIN_RATES="${WC_PLAIN_RATES:-5000,10000,20000,30000,40000,60000,80000}"
CP_TRIALS="${CP_TRIALS:-100}"
CP_BATCHES_MS="${CP_BATCHES_MS:-500 1000 2000}"
CP_WARMUP_TRIALS="${CP_WARMUP_TRIALS:-10}"
PARTS="${PARTS:-wc-slip wc-xdp wc-plain cp-sub cp-micro cp-continuous cp-plain}"
want() { [[ " $PARTS " == *" $1 "* ]]; }
TMP="$(mktemp -d /tmp/spark-bench.XXXXXX)"
DAEMON_PID=""
JAVA_PID=""

XDP_NS_ID="$$"
SRV_NS="spks$XDP_NS_ID"; CLI_NS="spkc$XDP_NS_ID"; VS="spkv$XDP_NS_ID"; VC="spkw$XDP_NS_ID"
XDP_UP=0
cleanup() {
    # Only what this script started.
    for p in "$JAVA_PID" "$DAEMON_PID"; do
        if [[ -n "$p" ]] && kill -0 "$p" 2>/dev/null; then
            kill -TERM "$p" 2>/dev/null || true
            for _ in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
            kill -KILL "$p" 2>/dev/null || true
        fi
    done
    if [[ "$XDP_UP" == 1 ]]; then
        ip netns del "$SRV_NS" 2>/dev/null || true
        ip netns del "$CLI_NS" 2>/dev/null || true
    fi
    rm -rf "$TMP"
}
trap cleanup EXIT INT TERM

if [[ "${SKIP_BUILD:-0}" != 1 ]]; then
    cargo build --release -p slipstream
    (cd connectors/spark && mvn -B -ntp -q -DskipTests package)
fi
mkdir -p "$RESULTS_DIR"
OUT="$RESULTS_DIR/spark.jsonl"
: >"$OUT"

free_port() { # $1 = tcp|udp
    python3 - "$1" <<'PY'
import socket, sys
k = socket.SOCK_STREAM if sys.argv[1] == "tcp" else socket.SOCK_DGRAM
s = socket.socket(socket.AF_INET, k); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()
PY
}

KV_PORT=$(free_port tcp); RES_PORT=$(free_port tcp); WC_PORT=$(free_port udp); CP_PORT=$(free_port udp)
PLAIN_PORT=$(free_port udp)
cat >"$TMP/daemon.toml" <<EOF2
[results]
tcp_port = $RES_PORT

[[stream]]
name = "wc"
udp_port = $WC_PORT
operator = "wordcount"
window_ms = 100

[[stream]]
name = "cp"
udp_port = $CP_PORT
operator = "changepoint"
window_ms = 10
reference_windows = 4
threshold = 5.0
history = 64
EOF2

start_daemon() {
    "$BIN" serve -p "$KV_PORT" -l 127.0.0.1 --config "$TMP/daemon.toml" >"$TMP/daemon.log" 2>&1 &
    DAEMON_PID=$!
    for _ in $(seq 1 100); do
        local answer
        answer=$(printf 'INFO\n' | timeout 1 nc -q1 127.0.0.1 "$RES_PORT" 2>/dev/null || true)
        if [[ "$answer" == *'"type":"info"'* ]]; then
            return 0
        fi
        sleep 0.1
    done
    echo "daemon did not start:"; cat "$TMP/daemon.log"; exit 1
}

JAVA_PREFIX=()
run_java() { # args for SparkBench; appends its JSON lines to $OUT
    SKIP_COMPILE=1 SPARK_JAVA_OPTS="-Xmx4g" "${JAVA_PREFIX[@]}" connectors/spark/bin/run-java.sh io.slipstream.spark.bench.SparkBench \
        "$@" bin="$BIN" >"$TMP/java.out" 2>"$TMP/java.err" &
    JAVA_PID=$!
    wait "$JAVA_PID" || { echo "SparkBench $1 failed:"; tail -30 "$TMP/java.err"; }
    JAVA_PID=""
    grep '^{' "$TMP/java.out" | tee -a "$OUT" | cut -c1-300
}

(cd connectors/spark && mvn -B -ntp -q compile dependency:build-classpath -Dmdep.outputFile=target/classpath.txt >/dev/null)
start_daemon
EP="127.0.0.1:$RES_PORT"
if want wc-slip; then
    echo "== word count: slipstream -> spark"
    run_java wc-slip endpoint="$EP" stream=wc udp="$WC_PORT" rates="$WC_SLIP_RATES" step_s="$WC_STEP_S" daemon_pid="$DAEMON_PID"
fi
if want wc-xdp && [[ "${XDP:-1}" != 0 && "$(id -u)" == 0 ]]; then
    echo "== word count: slipstream (XDP engine) -> spark"
    XDP_UP=1
    . "$ROOT/bench/netns.sh"
    veth_namespaces "$SRV_NS" "$CLI_NS" "$VS" "$VC" 10.209.1.1 10.209.1.2
    kill -TERM "$DAEMON_PID" 2>/dev/null || true
    wait "$DAEMON_PID" 2>/dev/null || true
    ip netns exec "$SRV_NS" "$BIN" serve -p "$KV_PORT" -l 10.209.1.1 --config "$TMP/daemon.toml" --xdp "$VS" \
        >"$TMP/xdp-daemon.log" 2>&1 &
    DAEMON_PID=$!
    up=0
    for _ in $(seq 1 100); do
        answer=$(printf 'INFO\n' | timeout 1 ip netns exec "$SRV_NS" nc -q1 10.209.1.1 "$RES_PORT" 2>/dev/null || true)
        if [[ "$answer" == *'"type":"info"'* ]]; then up=1; break; fi
        sleep 0.1
    done
    if [[ "$up" != 1 ]]; then echo "XDP daemon did not start:"; cat "$TMP/xdp-daemon.log"; exit 1; fi
    grep -i "xdp\|engine" "$TMP/xdp-daemon.log" | head -5
    JAVA_PREFIX=(ip netns exec "$SRV_NS")
    run_java wc-slip endpoint="10.209.1.1:$RES_PORT" stream=wc udp="$WC_PORT" rates="$WC_SLIP_RATES" \
        step_s="$WC_STEP_S" daemon_pid="$DAEMON_PID" setup=slipstream-xdp-spark send_host=10.209.1.1 \
        "send_prefix=ip netns exec $CLI_NS"
    JAVA_PREFIX=()
    kill -TERM "$DAEMON_PID" 2>/dev/null || true
    wait "$DAEMON_PID" 2>/dev/null || true
    start_daemon
fi
if want wc-plain; then
    echo "== word count: plain spark (UDP receiver, 1 s batches)"
    run_java wc-plain udp="$PLAIN_PORT" rates="$WC_PLAIN_RATES" step_s="$WC_STEP_S" batch_ms=1000
fi
CP=(trials="$CP_TRIALS" warmup_trials="$CP_WARMUP_TRIALS")
if want cp-sub; then
    echo "== change point: slipstream subscriber"
    run_java cp-sub endpoint="$EP" stream=cp udp="$CP_PORT" "${CP[@]}" daemon_pid="$DAEMON_PID"
fi
if want cp-micro; then
    echo "== change point: slipstream -> spark (micro-batch, trigger as fast as possible)"
    run_java cp-spark endpoint="$EP" stream=cp udp="$CP_PORT" "${CP[@]}" trigger=micro daemon_pid="$DAEMON_PID"
fi
if want cp-continuous; then
    echo "== change point: slipstream -> spark (continuous)"
    run_java cp-spark endpoint="$EP" stream=cp udp="$CP_PORT" "${CP[@]}" trigger=continuous daemon_pid="$DAEMON_PID"
fi
if want cp-plain; then
    for b in $CP_BATCHES_MS; do
        echo "== change point: plain spark, $b ms batches"
        PLAIN_PORT=$(free_port udp)
        run_java cp-plain udp="$PLAIN_PORT" batch_ms="$b" "${CP[@]}"
    done
fi

{
    echo "machine: $(nproc) cores, $(uname -r), $(java -version 2>&1 | head -1)"
    echo "spark: $(grep -o '<spark.version>[^<]*' connectors/spark/pom.xml | cut -d'>' -f2), local[2]"
} >"$RESULTS_DIR/env.txt"
python3 bench/spark_plot.py "$RESULTS_DIR"
echo "results: $RESULTS_DIR"
