#!/usr/bin/env bash
# stream_engine_ab.sh OLD_BIN NEW_BIN — the stream engines' own host CPU per million input
# records, two daemon builds side by side (before/after a change), no Spark.
#
# For each round (ROUNDS, the binaries alternating so drift on a shared machine hits both) and
# each engine (user: the daemon's user-space engine; xdp: its XDP engine on the server veth of
# bench/netns.sh's topology), the daemon runs alone with the word-count and change-point
# streams of bench/stream_cpu.sh, and `slipstream send` (client namespace, pinned to CPU 1)
# offers WC_RATE datagrams/s of 16 words, then CP_RATE datagrams/s of 16 values, DURATION_S
# each. Measured per run: the daemon's utime+stime (/proc), the server veth's threaded-NAPI
# kthread (pinned to CPU 0, SCHED_FIFO; the receive path, XDP included), the XDP programs'
# run_time_ns (bpftool, kernel.bpf_stats_enabled=1 while running), the stream thread's
# wake-ups, and the daemon's record counter (every record sent must be counted).
# Output: one JSON line per run on stdout and in RESULTS (default /tmp/stream_engine_ab.jsonl).
# Needs root. Knobs: ROUNDS [3] DURATION_S [5] WC_RATE [30000] CP_RATE [10000] ENGINES ["user xdp"].
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OLD=${1:?usage: stream_engine_ab.sh OLD_BIN NEW_BIN}
NEW=${2:?usage: stream_engine_ab.sh OLD_BIN NEW_BIN}
ROUNDS=${ROUNDS:-3}
DURATION_S=${DURATION_S:-5}
WC_RATE=${WC_RATE:-30000}
CP_RATE=${CP_RATE:-10000}
ENGINES=${ENGINES:-"user xdp"}
RESULTS=${RESULTS:-/tmp/stream_engine_ab.jsonl}
[[ "$(id -u)" == 0 ]] || { echo "SKIP: needs root"; exit 0; }
PASS_OBJ=$(ls -t "$ROOT"/target/release/build/slipstream-fastpath-*/out/xdp_pass.o 2>/dev/null | head -n1)
TAG=$$; SRV="seas$TAG"; CLI="seac$TAG"; VS="seav$TAG"; VC="seaw$TAG"; V4S=10.212.0.1; V4C=10.212.0.2
DAEMON=""
STATS_BEFORE="$(sysctl -n kernel.bpf_stats_enabled)"
TMP=$(mktemp -d)
cleanup() {
    if [[ -n "$DAEMON" ]]; then kill "$DAEMON" 2>/dev/null || true; wait "$DAEMON" 2>/dev/null || true; fi
    ip netns del "$SRV" 2>/dev/null || true
    ip netns del "$CLI" 2>/dev/null || true
    sysctl -qw kernel.bpf_stats_enabled="$STATS_BEFORE" || true
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
. "$ROOT/bench/netns.sh"
veth_namespaces "$SRV" "$CLI" "$VS" "$VC" "$V4S" "$V4C"
sysctl -qw kernel.bpf_stats_enabled=1
cat >"$TMP/d.toml" <<EOF
[results]
tcp_port = 23702
[[stream]]
name = "wc"
udp_port = 23704
operator = "wordcount"
window_ms = 1000
[[stream]]
name = "cp"
udp_port = 23705
operator = "changepoint"
window_ms = 10
reference_windows = 4
threshold = 7.0
history = 64
EOF
: >"$RESULTS"
jiffies() { awk '{print $14+$15}' "/proc/$1/stat"; }
napi_jiffies() {
    local t=0 p
    for p in $(ps -eo pid=,comm= | awk -v d="napi/$VS-" 'index($2, d) == 1 {print $1}'); do t=$((t + $(jiffies "$p"))); done
    echo "$t"
}
# Run time of the XDP program attached to the server veth only (other XDP programs on the
# machine are not ours).
xdp_ns() {
    local id
    id=$(ip -n "$SRV" -d -j link show dev "$VS" | python3 -c 'import json,sys; print(json.load(sys.stdin)[0].get("xdp",{}).get("prog",{}).get("id",0))')
    bpftool -j prog show id "$id" 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin).get("run_time_ns",0))' 2>/dev/null || echo 0
}
stream_wakeups() { # daemon pid, stream thread index
    local f
    f=$(grep -l "^stream-$2\$" /proc/"$1"/task/*/comm | head -1)
    awk '/^voluntary_ctxt_switches/ {print $2}' "$(dirname "$f")/status"
}
records() { ip netns exec "$SRV" curl -s "http://$V4S:23703/metrics" | awk -v s="slipstream_stream_records_total{stream=\"$1\"}" '$1 == s {print $2}'; }
for round in $(seq 1 "$ROUNDS"); do
    for engine in $ENGINES; do
        for which in old new; do
            bin=$OLD; [[ "$which" == new ]] && bin=$NEW
            ip -n "$SRV" link set dev "$VS" xdpdrv off 2>/dev/null || true
            xdp=()
            if [[ "$engine" == xdp ]]; then xdp=(--xdp "$VS"); else ip -n "$SRV" link set dev "$VS" xdpdrv obj "$PASS_OBJ" sec xdp; fi
            ip netns exec "$SRV" "$bin" serve -p 23701 -l "$V4S" --admin "$V4S:23703" --config "$TMP/d.toml" "${xdp[@]}" >"$TMP/d.log" 2>&1 &
            DAEMON=$!
            for _ in $(seq 1 100); do ip netns exec "$SRV" curl -sf "http://$V4S:23703/metrics" >/dev/null && break; sleep 0.1; done
            ip netns exec "$SRV" sh -c "echo 1 > /sys/class/net/$VS/threaded"
            for p in $(ps -eo pid=,comm= | awk -v d="napi/$VS-" 'index($2, d) == 1 {print $1}'); do taskset -pc 0 "$p" >/dev/null; chrt -f -p 10 "$p"; done
            for part in wc cp; do
                if [[ "$part" == wc ]]; then args=(--kind words --rate-per-s "$WC_RATE" --records-per-datagram 16); port=23704; idx=0
                else args=(--kind numbers --rate-per-s "$CP_RATE" --records-per-datagram 16 --decimals 6 --mean 10); port=23705; idx=1; fi
                r0=$(records "$part"); d0=$(jiffies "$DAEMON"); n0=$(napi_jiffies); x0=$(xdp_ns); w0=$(stream_wakeups "$DAEMON" "$idx")
                sent=$(ip netns exec "$CLI" taskset -c 1 "$bin" send --to "$V4S:$port" "${args[@]}" --duration-s "$DURATION_S" --batch 64 \
                    | python3 -c 'import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])["records"])')
                sleep 2.2 # the last 1 s word-count window closes and drains
                r1=$(records "$part"); d1=$(jiffies "$DAEMON"); n1=$(napi_jiffies); x1=$(xdp_ns); w1=$(stream_wakeups "$DAEMON" "$idx")
                python3 - "$round" "$engine" "$which" "$part" "$sent" "$r0" "$r1" "$d0" "$d1" "$n0" "$n1" "$x0" "$x1" "$w0" "$w1" <<'PY' | tee -a "$RESULTS"
import json, sys
rd, eng, which, part, sent, r0, r1, d0, d1, n0, n1, x0, x1, w0, w1 = sys.argv[1:]
sent = int(sent); counted = int(float(r1) - float(r0))
m = sent / 1e6
print(json.dumps({"round": int(rd), "engine": eng, "binary": which, "part": part, "records": sent,
    "counted": counted, "exact": counted == sent,
    "daemon_s_per_m": (int(d1) - int(d0)) / 100 / m, "napi_s_per_m": (int(n1) - int(n0)) / 100 / m,
    "xdp_s_per_m": (int(x1) - int(x0)) / 1e9 / m, "stream_wakeups": int(w1) - int(w0)}))
PY
            done
            kill "$DAEMON"; wait "$DAEMON" 2>/dev/null || true; DAEMON=""
        done
    done
done
python3 - "$RESULTS" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("| engine | part | binary | daemon CPU-s per 1M | NAPI rx per 1M | XDP per 1M | stream wake-ups per run | exact |")
print("|---|---|---|---:|---:|---:|---:|:---:|")
for eng in ("user", "xdp"):
    for part in ("wc", "cp"):
        for b in ("old", "new"):
            s = [r for r in rows if (r["engine"], r["part"], r["binary"]) == (eng, part, b)]
            if not s:
                continue
            med = lambda k: statistics.median(r[k] for r in s)
            print("| %s | %s | %s | %.3f | %.3f | %.3f | %d | %s |" % (eng, part, b, med("daemon_s_per_m"),
                  med("napi_s_per_m"), med("xdp_s_per_m"), med("stream_wakeups"),
                  "%d/%d" % (sum(r["exact"] for r in s), len(s))))
PY
