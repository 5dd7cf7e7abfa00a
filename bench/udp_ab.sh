#!/usr/bin/env bash
# udp_ab.sh OLD_BIN NEW_BIN — the user-space UDP GET path of two daemon builds, side by side.
#
# Why: a before/after check of a change to the request path on a shared 2-core machine, where
# separate benchmark runs minutes apart differ by more than the change. Here the two builds
# alternate ROUNDS times with the same generator and the same settings, so drift hits both;
# compare the medians and the per-round ratios, not single runs.
#
# What it does, per round and build: starts `BIN serve -t 1` on loopback (TCP for the prefill,
# UDP for the load) pinned to SERVER_CPU, prefills KEYS keys, and runs `slipstream-loadgen
# --udp` pinned to CLIENT_CPU for DURATION_S after a 1 s warm-up, reading the server's CPU time
# over the window (--server-pid). Output: one JSON line per run (loadgen's line plus round, build
# and load average) in RESULTS, and a summary table on stdout (medians and per-round ratios).
# Loopback only. Knobs [defaults]: ROUNDS [6] DURATION_S [4] KEYS [10000] VALUE_BYTES [32]
#   CONNS [8] PIPELINE [16] SERVER_CPU [0] CLIENT_CPU [1] BASE_PORT [23000]
#   LOADGEN [target/release/slipstream-loadgen] RESULTS [/tmp/udp_ab.jsonl]
# Not for: absolute figures (bench/xdp_bench.sh) or TCP (bench/kv_bench.sh with CARGO_TARGET_DIR).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OLD=${1:?usage: udp_ab.sh OLD_BIN NEW_BIN}
NEW=${2:?usage: udp_ab.sh OLD_BIN NEW_BIN}
ROUNDS=${ROUNDS:-6}; DURATION_S=${DURATION_S:-4}; KEYS=${KEYS:-10000}; VALUE_BYTES=${VALUE_BYTES:-32}
CONNS=${CONNS:-8}; PIPELINE=${PIPELINE:-16}; SERVER_CPU=${SERVER_CPU:-0}; CLIENT_CPU=${CLIENT_CPU:-1}
BASE_PORT=${BASE_PORT:-23000}; LOADGEN=${LOADGEN:-$ROOT/target/release/slipstream-loadgen}
RESULTS=${RESULTS:-/tmp/udp_ab.jsonl}
SERVER_PID=""
cleanup() { [[ -n "$SERVER_PID" ]] && kill "$SERVER_PID" 2>/dev/null || true; }
trap cleanup EXIT
: > "$RESULTS"

wait_tcp() { # port: up to 5 s for the daemon to listen
    local i
    for i in $(seq 50); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done
    echo "udp_ab: daemon on port $1 did not start" >&2; return 1
}

one_run() { # round label bin port
    local round=$1 label=$2 bin=$3 port=$4 res
    taskset -c "$SERVER_CPU" "$bin" serve -l 127.0.0.1 -p "$port" -U "$port" -t 1 -m 256 >/dev/null 2>&1 &
    SERVER_PID=$!
    wait_tcp "$port"
    res=$(timeout $((DURATION_S + 60)) taskset -c "$CLIENT_CPU" "$LOADGEN" --udp --server "127.0.0.1:$port" \
        --conns "$CONNS" --pipeline "$PIPELINE" --keys "$KEYS" --value-bytes "$VALUE_BYTES" --prefill \
        --duration-s "$DURATION_S" --warmup-s 1 --server-pid "$SERVER_PID" | tail -n1)
    kill "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null || true; SERVER_PID=""
    printf '{"round":%d,"build":"%s","load1":%s,"res":%s}\n' "$round" "$label" \
        "$(cut -d' ' -f1 /proc/loadavg)" "$res" >> "$RESULTS"
}

for r in $(seq 1 "$ROUNDS"); do
    one_run "$r" old "$OLD" $((BASE_PORT + 2 * r))
    one_run "$r" new "$NEW" $((BASE_PORT + 2 * r + 1))
done

python3 - "$RESULTS" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {"old": [], "new": []}
for r in rows:
    by[r["build"]].append(r["res"])
print("| build | replies/s per round | median | replies per server CPU-s (median) | lost |")
print("|---|---|---:|---:|---:|")
for b in ("old", "new"):
    ops = [x["ops_per_s"] for x in by[b]]
    per = [x["ops_per_server_cpu_s"] for x in by[b]]
    print(f"| {b} | {' · '.join(f'{v:,.0f}' for v in ops)} | {statistics.median(ops):,.0f} "
          f"| {statistics.median(per):,.0f} | {sum(x['lost'] for x in by[b])} |")
pairs = list(zip(by["old"], by["new"]))
print("new/old per round, replies/s:", " ".join(f"{n['ops_per_s'] / o['ops_per_s']:.2f}" for o, n in pairs))
print("new/old per round, per server CPU-s:",
      " ".join(f"{n['ops_per_server_cpu_s'] / o['ops_per_server_cpu_s']:.2f}" for o, n in pairs))
PY
