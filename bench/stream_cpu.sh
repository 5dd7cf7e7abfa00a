#!/usr/bin/env bash
# stream_cpu.sh — what the stream offload saves the host (issue 12): host CPU-seconds per
# million input words (word count) and per million input values (change point), for
#   plain-spark          plain Spark receiving the raw UDP datagrams itself (baseline/UdpReceiver;
#                        word count: countByValue, change point: baseline/ChangePointRule), 1 s batches
#   slipstream-user-spark  the daemon's user-space engine -> the `slipstream` Spark source
#   slipstream-xdp-spark   the daemon's XDP engine (--xdp on the server veth) -> the same source
# at the same offered rate, below plain Spark's maximum so all three are exact, in one run.
#
# Topology (bench/netns.sh): a server and a client network namespace joined by a veth pair.
# The generator (`slipstream send`, started by the Spark driver SparkBench for every run, same
# seeds) runs in the client namespace pinned to GEN_CPU; the daemon and the Spark JVM (local[2])
# run in the server namespace, not pinned. The server veth always has an XDP program (the
# daemon's for the XDP setup, the do-nothing xdp_pass otherwise: a veth only has a NAPI
# instance with one) and receives in threaded-NAPI mode with its kthread pinned to RX_CPU, so
# the whole receive path of every setup (veth, IP/UDP stack and socket enqueue, or the XDP
# program) is one kernel thread's CPU time.
#
# Why not the /proc/stat softirq column alone: this kernel has tick-based accounting
# (CONFIG_IRQ_TIME_ACCOUNTING off), which charges a softirq tick both to the softirq column and
# to the task it interrupted, so adding the column to process times would count twice; with
# threaded NAPI the receive path is charged once, to the NAPI kthread. The softirq column (all
# CPUs, what is left: loopback TCP from the daemon to the JVM, timers) is still measured and
# added, minus the idle baseline measured first (IDLE_S with nothing of ours running); that
# overlap, if any, counts against every setup.
#
# Per measured window (from right before the generator starts to when the results have settled;
# the driver calls bench/cpu_sample.py at both edges):
#   daemon   utime+stime of the daemon process (all threads), /proc/PID/stat
#   jvm      utime+stime of the Spark JVM (all threads)
#   napi     utime+stime of the server veth's NAPI kthread(s) (receive path; contains xdp)
#   xdp      XDP programs' run_time_ns (bpftool; kernel.bpf_stats_enabled=1 during the run,
#            restored on exit) — a part of napi, shown, not added again
#   softirq  /proc/stat softirq on every CPU (and RX_CPU's own), minus the idle baseline
#   ksoftirqd utime+stime of the ksoftirqd threads (shown; their work is in the softirq column)
#   jvmkids  the JVM's reaped children (cutime+cstime) minus the generator and the sampler:
#            processes the JVM started for its own work (Hadoop's shell commands)
#   host     daemon + jvm + jvmkids + napi + softirq  -> CPU-s per million input records
#   gen      the generator's own CPU, from bash's `times` around it (reported, NOT host work:
#            it stands for the senders)
#   machine  every CPU's busy time - gen - idle baseline: a whole-machine cross-check
# Exactness per run: word count — the Spark job's per-word totals equal the generator's
# --expect-counts multiset and the daemon's socket_drops did not grow; change point — the plain
# job windowed every value sent / the daemon's records counter grew by every value sent, no
# socket drops, the step alerted and nothing alerted before it.
# RUNS runs per setup (the first is a warm-up for the JVM's JIT; the last one is reported).
# After the first run, one window of STEP_S seconds with no input measures each setup's idle
# cost (Spark's batches and timers, the daemon's ticks); the report shows it and the cost per
# million records above idle ("marginal"), so fixed and per-record costs can be told apart.
#
# Output: RESULTS_DIR (default bench/results/stream-cpu-<UTC timestamp>/): samples/*.jsonl (raw
# snapshots), driver.jsonl (the driver's lines), cpu.json and summary.md (table, ratios).
# Needs root (namespaces, XDP, bpf stats). About 4 minutes with the defaults.
#
# Knobs [defaults]: WC_RATE [20000] datagrams/s (30000 lost datagrams at the veth ring on the
#   loaded machine in plain Spark's setup) of WC_WORDS [16] words; CP_RATE [10000]
#   datagrams/s of CP_VALUES [16] values; STEP_S [10] seconds per run; RUNS [2]; IDLE_S [10];
#   WC_WINDOW_MS [1000] (the daemon's word-count window) and SLIP_TRIGGER_MS [1000] (the
#   Slipstream setups' trigger interval): 1 s like plain Spark's batches (PLAIN_BATCH_MS
#   [1000]), so every setup delivers counts per second; WC_TRIGGER [continuous]: the Slipstream word-count query runs in
#   Spark's continuous mode (one long-running read task, epochs every SLIP_TRIGGER_MS, rows summed
#   by a ForeachWriter: no micro-batch to plan per second; at-least-once on failure; rows reach
#   the writer as the daemon sends them, so with WC_WINDOW_MS=1000 counts still arrive every
#   second whatever SLIP_TRIGGER_MS, which then only sets how often offsets are committed), or micro:
#   micro-batches with SLIP_SINK [collect]: each batch's rows (per-word counts the daemon made)
#   collected and summed in the driver; groupby: Spark sums them per word first (a shuffle per
#   batch); foreach: a ForeachWriter; CP_TRIGGER [micro] (or continuous);
#   RX_DEFER_US [0]: receive moderation on the server veth (gro_flush_timeout, with
#   napi_defer_hard_irqs = RX_DEFER_IRQS [1]): 0 = off, the NAPI thread is woken per frame burst;
#   SETUPS ["plain user xdp"]; PARTS ["wc cp"]; GEN_CPU [1]; RX_CPU [0]; SKIP_BUILD [0];
#   APP_CPUS [unset: every CPU]: pin the daemon and the Spark JVM of every setup to these CPUs
#   (taskset list), e.g. 1 to keep them off the receive core RX_CPU; RX_SPIN [0]: 1 = a
#   SCHED_IDLE busy loop on RX_CPU during the runs (diagnostic, see below; not counted);
#   GEN [socket]: socket = `slipstream send` (its datagrams cross the veth as skbs: the veth's
#   NAPI thread converts them to xdp_frames for an XDP program and back, work a NIC-fed host
#   does not do); xdp = the live-frame generator (bench/xdpgen_send.sh, `slipstream-loadgen
#   xdp-gen --word-templates`): frames reach the server veth as xdp_frames, as from a NIC, for
#   all three setups; the words are XDPGEN_TEMPLATES [256] datagrams of send's Zipf stream (same
#   seed) sent round-robin, an exact multiset; the change-point series is
#   XDPGEN_NUMBER_TEMPLATES [128] datagrams of send's series and as many shifted by the step,
#   switched at the frame `send` would first shift (its send time reported back the same way);
#   SLIPSTREAM_BIN [target/release/slipstream]; RESULTS_DIR.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BIN="${SLIPSTREAM_BIN:-$ROOT/target/release/slipstream}"
STAMP="$(date -u +%Y%m%dT%H%M%SZ)"
RESULTS_DIR="${RESULTS_DIR:-$ROOT/bench/results/stream-cpu-$STAMP}"
WC_RATE="${WC_RATE:-20000}"
WC_WORDS="${WC_WORDS:-16}"
CP_RATE="${CP_RATE:-10000}"
CP_VALUES="${CP_VALUES:-16}"
STEP_S="${STEP_S:-10}"
WC_WINDOW_MS="${WC_WINDOW_MS:-1000}"
SLIP_TRIGGER_MS="${SLIP_TRIGGER_MS:-1000}"
PLAIN_BATCH_MS="${PLAIN_BATCH_MS:-1000}"
CP_TRIGGER="${CP_TRIGGER:-micro}"
SLIP_SINK="${SLIP_SINK:-collect}"
WC_TRIGGER="${WC_TRIGGER:-continuous}"
RUNS="${RUNS:-2}"
IDLE_S="${IDLE_S:-10}"
SETUPS="${SETUPS:-plain user xdp}"
GEN="${GEN:-socket}"
PARTS="${PARTS:-wc cp}"
case "$GEN" in socket | xdp) ;; *) echo "GEN must be socket or xdp" >&2; exit 2 ;; esac
GEN_CPU="${GEN_CPU:-1}"
RX_CPU="${RX_CPU:-0}"
RX_DEFER_US="${RX_DEFER_US:-0}"
APP_CPUS="${APP_CPUS:-}"
# The daemon and the Spark JVM of every setup alike (plain Spark's JVM too), pinned to APP_CPUS
# when set: the placement of a host whose receive core (RX_CPU) is kept for the NIC's receive
# path, as a user does with IRQ affinity; unset, both run on every CPU as before.
APP_PIN=()
[[ -n "$APP_CPUS" ]] && APP_PIN=(taskset -c "$APP_CPUS")
# Diagnostic only (not a deployment): RX_SPIN=1 keeps a SCHED_IDLE busy loop on RX_CPU after the
# idle baseline, so that CPU never idles between bursts (it yields to every other task at once).
# Tells "the receive core's caches go cold because the idle vCPU halts" from "because other
# work runs there". Its CPU is no setup's and is not counted (the machine column then is).
RX_SPIN="${RX_SPIN:-0}"
SPIN_PID=""
RX_DEFER_IRQS="${RX_DEFER_IRQS:-1}"

if [[ "$(id -u)" != 0 ]]; then
    echo "SKIP: bench/stream_cpu.sh needs root (network namespaces, XDP, bpf stats)"
    exit 0
fi
command -v bpftool >/dev/null || { echo "stream_cpu: needs bpftool (scripts/setup.sh installs it)" >&2; exit 1; }

TAG=$$
SRV="scpus$TAG"; CLI="scpuc$TAG"; VS="scpv$TAG"; VC="scpw$TAG"
V4S=10.211.0.1; V4C=10.211.0.2
KV_PORT=23501; RES_PORT=23502; ADM_PORT=23503; WC_PORT=23504; CP_PORT=23505; PLAIN_PORT=23506
TMP="$(mktemp -d /tmp/stream-cpu.XXXXXX)"
DAEMON_PID=""
JAVA_PID=""
NS_UP=0
STATS_BEFORE="$(sysctl -n kernel.bpf_stats_enabled)"
RCU_BEFORE="$(cat /sys/kernel/rcu_expedited 2>/dev/null || echo "")"
cleanup() {
    # Only what this script started.
    for p in "$JAVA_PID" "$DAEMON_PID" "$SPIN_PID"; do
        if [[ -n "$p" ]] && kill -0 "$p" 2>/dev/null; then
            kill -TERM "$p" 2>/dev/null || true
            for _ in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
            kill -KILL "$p" 2>/dev/null || true
        fi
    done
    if [[ "$NS_UP" == 1 ]]; then
        ip netns del "$SRV" 2>/dev/null || true
        ip netns del "$CLI" 2>/dev/null || true
    fi
    sysctl -qw kernel.bpf_stats_enabled="$STATS_BEFORE" || true
    if [[ "$GEN" == xdp && -n "$RCU_BEFORE" ]]; then echo "$RCU_BEFORE" >/sys/kernel/rcu_expedited 2>/dev/null || true; fi
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [[ "${SKIP_BUILD:-0}" != 1 ]]; then
    cargo build --release -p slipstream -p slipstream-fastpath -p slipstream-loadgen
fi
(cd connectors/spark && mvn -B -ntp -q compile dependency:build-classpath -Dmdep.outputFile=target/classpath.txt >/dev/null)
PASS_OBJ=$(ls -t "$ROOT"/target/release/build/slipstream-fastpath-*/out/xdp_pass.o 2>/dev/null | head -n1)
[[ -n "$PASS_OBJ" ]] || { echo "stream_cpu: no xdp_pass.o (build slipstream-fastpath)" >&2; exit 1; }
mkdir -p "$RESULTS_DIR/samples"
: >"$RESULTS_DIR/driver.jsonl"

. "$ROOT/bench/netns.sh"
NS_UP=1
veth_namespaces "$SRV" "$CLI" "$VS" "$VC" "$V4S" "$V4C"
sysctl -qw kernel.bpf_stats_enabled=1
SEND_CMD=()
if [[ "$GEN" == xdp ]]; then
    # See bench/xdp_bench.sh: without this every generator call sleeps through an RCU grace period.
    echo 1 >/sys/kernel/rcu_expedited
    SRV_MAC=$(ip netns exec "$SRV" cat "/sys/class/net/$VS/address")
    SEND_CMD=("send_cmd=$ROOT/bench/xdpgen_send.sh $VC $SRV_MAC $V4C $(dirname "$BIN")/slipstream-loadgen")
fi

cat >"$TMP/daemon.toml" <<EOF
[results]
tcp_port = $RES_PORT

[[stream]]
name = "wc"
udp_port = $WC_PORT
operator = "wordcount"
window_ms = $WC_WINDOW_MS

[[stream]]
name = "cp"
udp_port = $CP_PORT
operator = "changepoint"
window_ms = 10
reference_windows = 4
threshold = 7.0
history = 64
EOF

# Receive path in the server veth's NAPI kthread, pinned to RX_CPU, at SCHED_FIFO: softirq
# receive preempts tasks, and so does this thread (otherwise a busy JVM starves it and the
# veth's 256-slot ring overflows).
steer_rx() {
    ip netns exec "$SRV" sh -c "echo 1 > /sys/class/net/$VS/threaded"
    # Receive-side moderation, as a NIC's (ethtool rx-usecs): after a poll that found frames,
    # the veth does not wake its NAPI thread per frame but polls again RX_DEFER_US later.
    ip netns exec "$SRV" sh -c "echo $((RX_DEFER_US * 1000)) > /sys/class/net/$VS/gro_flush_timeout; \
        echo $RX_DEFER_IRQS > /sys/class/net/$VS/napi_defer_hard_irqs"
    local p
    for p in $(ps -eo pid=,comm= | awk -v d="napi/$VS-" 'index($2, d) == 1 {print $1}'); do
        taskset -pc "$RX_CPU" "$p" >/dev/null
        chrt -f -p 10 "$p"
    done
}
pass_prog() { # on|off: the do-nothing XDP program on the server veth
    ip -n "$SRV" link set dev "$VS" xdpdrv off 2>/dev/null || true
    if [[ "$1" == on ]]; then ip -n "$SRV" link set dev "$VS" xdpdrv obj "$PASS_OBJ" sec xdp; fi
}

start_daemon() { # user|xdp
    local xdp=()
    [[ "$1" == xdp ]] && xdp=(--xdp "$VS")
    ip netns exec "$SRV" "${APP_PIN[@]}" "$BIN" serve -p "$KV_PORT" -l "$V4S" --admin "$V4S:$ADM_PORT" \
        --config "$TMP/daemon.toml" "${xdp[@]}" >"$RESULTS_DIR/daemon-$1.log" 2>&1 &
    DAEMON_PID=$!
    for _ in $(seq 1 100); do
        local answer
        answer=$(printf 'INFO\n' | timeout 1 ip netns exec "$SRV" nc -q1 "$V4S" "$RES_PORT" 2>/dev/null || true)
        if [[ "$answer" == *'"type":"info"'* ]]; then return 0; fi
        sleep 0.1
    done
    echo "daemon did not start:"; cat "$RESULTS_DIR/daemon-$1.log"; exit 1
}
stop_daemon() {
    [[ -n "$DAEMON_PID" ]] || return 0
    kill -TERM "$DAEMON_PID" 2>/dev/null || true
    wait "$DAEMON_PID" 2>/dev/null || true
    DAEMON_PID=""
}

SAMPLER=(python3 "$ROOT/bench/cpu_sample.py" "thread=napi/$VS-" "thread=ksoftirqd/" "link=$SRV:$VS" "link=$CLI:$VC"
    "xdp_dev=$SRV:$VS")
run_java() { # SETUP PART MODE ARGS...: the driver in the server namespace, one JVM
    local setup=$1 part=$2 mode=$3
    shift 3
    local metrics="" dpid=""
    if [[ -n "$DAEMON_PID" ]]; then metrics="metrics=$V4S:$ADM_PORT"; dpid="daemon=$DAEMON_PID"; fi
    local out="$RESULTS_DIR/samples/$part-$setup.jsonl"
    : >"$out"
    SKIP_COMPILE=1 SPARK_JAVA_OPTS="-Xmx4g" ip netns exec "$SRV" "${APP_PIN[@]}" connectors/spark/bin/run-java.sh \
        io.slipstream.spark.bench.SparkBench "$mode" "$@" bin="$BIN" send_host="$V4S" idle_s="$STEP_S" \
        "send_prefix=ip netns exec $CLI taskset -c $GEN_CPU" setup="$setup" \
        "sample_cmd=${SAMPLER[*]} out=$out $dpid $metrics" "${SEND_CMD[@]}" \
        >"$TMP/java.out" 2>"$TMP/java.err" &
    JAVA_PID=$!
    wait "$JAVA_PID" || { echo "SparkBench $mode ($setup) failed:"; grep -v "^\s*at " "$TMP/java.err" | tail -60; }
    JAVA_PID=""
    grep '^{' "$TMP/java.out" | python3 -c '
import json, sys
for line in sys.stdin:
    d = json.loads(line); d["part"] = sys.argv[1]; d["setup"] = sys.argv[2]
    print(json.dumps(d))' "$part" "$setup" | tee -a "$RESULTS_DIR/driver.jsonl" | cut -c1-240
}

rates() { local r=$1 out=$1; for _ in $(seq 2 "$RUNS"); do out="$out,$r"; done; echo "$out"; }

echo "== idle baseline ($IDLE_S s, nothing of ours running; load: $(cut -d' ' -f1-3 /proc/loadavg))"
pass_prog on
steer_rx
"${SAMPLER[@]}" out="$RESULTS_DIR/samples/idle.jsonl" label=idle-begin
sleep "$IDLE_S"
"${SAMPLER[@]}" out="$RESULTS_DIR/samples/idle.jsonl" label=idle-end
if [[ "$RX_SPIN" == 1 ]]; then
    chrt -i 0 taskset -c "$RX_CPU" bash -c 'while :; do :; done' &
    SPIN_PID=$!
fi

for setup in $SETUPS; do
    case "$setup" in
        plain)
            pass_prog on; steer_rx
            if [[ " $PARTS " == *" wc "* ]]; then
                echo "== word count: plain spark"
                run_java plain-spark wc wc-plain udp="$PLAIN_PORT" bind="$V4S" rates="$(rates "$WC_RATE")" \
                    step_s="$STEP_S" words="$WC_WORDS" batch_ms="$PLAIN_BATCH_MS" stop_on_inexact=false
            fi
            if [[ " $PARTS " == *" cp "* ]]; then
                echo "== change point: plain spark"
                run_java plain-spark cp cp-plain measure=rate udp="$PLAIN_PORT" bind="$V4S" rate="$CP_RATE" \
                    values="$CP_VALUES" step_s="$STEP_S" runs="$RUNS" batch_ms="$PLAIN_BATCH_MS" window_ms=10 n=4 threshold=7
            fi
            ;;
        user | xdp)
            if [[ "$setup" == xdp ]]; then pass_prog off; else pass_prog on; fi
            start_daemon "$setup"
            steer_rx
            grep -i "engine\|xdp" "$RESULTS_DIR/daemon-$setup.log" | head -3 || true
            label="slipstream-$setup-spark"
            if [[ " $PARTS " == *" wc "* ]]; then
                echo "== word count: $label"
                run_java "$label" wc wc-slip endpoint="$V4S:$RES_PORT" stream=wc udp="$WC_PORT" \
                    rates="$(rates "$WC_RATE")" step_s="$STEP_S" words="$WC_WORDS" daemon_pid="$DAEMON_PID" \
                    trigger_ms="$SLIP_TRIGGER_MS" stop_on_inexact=false sink="$SLIP_SINK" trigger="$WC_TRIGGER"
            fi
            if [[ " $PARTS " == *" cp "* ]]; then
                echo "== change point: $label ($CP_TRIGGER trigger)"
                run_java "$label" cp cp-spark measure=rate endpoint="$V4S:$RES_PORT" stream=cp udp="$CP_PORT" \
                    rate="$CP_RATE" values="$CP_VALUES" step_s="$STEP_S" runs="$RUNS" trigger="$CP_TRIGGER" \
                    trigger_ms="$SLIP_TRIGGER_MS" daemon_pid="$DAEMON_PID"
            fi
            stop_daemon
            ;;
        *) echo "unknown setup $setup" >&2; exit 2 ;;
    esac
done

{
    echo "date: $(date -u +%FT%TZ)"
    echo "machine: $(nproc) cores, $(uname -r), $(java -version 2>&1 | head -1)"
    echo "load before the report: $(cat /proc/loadavg)"
    echo "knobs: GEN=$GEN XDPGEN_TEMPLATES=${XDPGEN_TEMPLATES:-256} XDPGEN_NUMBER_TEMPLATES=${XDPGEN_NUMBER_TEMPLATES:-128} XDPGEN_BURST=${XDPGEN_BURST:-32} WC_TRIGGER=$WC_TRIGGER SLIP_SINK=$SLIP_SINK RX_DEFER_US=$RX_DEFER_US WC_RATE=$WC_RATE WC_WORDS=$WC_WORDS CP_RATE=$CP_RATE CP_VALUES=$CP_VALUES STEP_S=$STEP_S RUNS=$RUNS IDLE_S=$IDLE_S GEN_CPU=$GEN_CPU RX_CPU=$RX_CPU APP_CPUS=${APP_CPUS:-all} RX_SPIN=$RX_SPIN"
    echo "commit: $(git rev-parse --short HEAD)$(git diff --quiet || echo '+dirty')"
} >"$RESULTS_DIR/env.txt"
python3 bench/stream_cpu_report.py "$RESULTS_DIR" "$RX_CPU"
echo "results: $RESULTS_DIR"
