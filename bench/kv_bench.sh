#!/usr/bin/env bash
# kv_bench.sh — Slipstream vs memcached, same load, same machine, one after the other.
#
# What it does: builds the workspace in release mode (default target dir), then for each
# server thread count in THREADS_LIST starts memcached, loads it with slipstream-loadgen,
# stops it, starts Slipstream, loads it identically, stops it. The loadgen samples, at the
# exact edges of the measured window: the server's CPU time (/proc/PID/stat fields 14+15,
# utime+stime, divided by `getconf CLK_TCK`), its own CPU time, and /proc/stat (machine and
# per-CPU busy %). This script also samples the server's CPU over the whole loadgen run as
# a cross-check. Output: a markdown table (bench/results/kv.md) and raw JSON
# (bench/results/kv.json).
#
# Not for: comparing figures across machines or across runs on a busy machine; it measures
# loopback TCP only (UDP: `slipstream-loadgen --udp`, by hand).
#
# Pinning (PIN=1, the default): for 1 server thread, the server runs on core 0 and the
# loadgen on core 1 (`taskset -c`, inherited by all threads), so client and server never
# share a core. With more server threads nothing is pinned: on a 2-core box client and
# server then compete for the same cores, and the "limit" column says so.
# Note: on loopback, the kernel work of delivering a segment runs in the sender's context,
# so each side's CPU time includes part of the other side's receive path.
#
# Environment knobs (defaults in brackets):
#   THREADS_LIST ["1 2"]  DURATION_S [10]  WARMUP_S [2]  CONNS [50]  PIPELINE [16]
#   VALUE_BYTES [100]  KEYS [10000]  RATIO [1:1]  LOADGEN_THREADS [1]  PIN [1]
#   REPEATS [1]        runs per (server, threads); ratios use the median ops/s run
#   STANDIN [0]        1: if target/release/slipstream is missing or lacks `serve`, load a
#                      second memcached in its place (validates the tooling only)
#   SKIP_BUILD [0]     1: use the binaries already in target/release
#   RESULTS_DIR [bench/results]
#   CARGO_TARGET_DIR [target]  where cargo builds and where the binaries are taken from
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
THREADS_LIST=${THREADS_LIST:-"1 2"}
DURATION_S=${DURATION_S:-10}
WARMUP_S=${WARMUP_S:-2}
CONNS=${CONNS:-50}
PIPELINE=${PIPELINE:-16}
VALUE_BYTES=${VALUE_BYTES:-100}
KEYS=${KEYS:-10000}
RATIO=${RATIO:-1:1}
LOADGEN_THREADS=${LOADGEN_THREADS:-1}
PIN=${PIN:-1}
REPEATS=${REPEATS:-1}
STANDIN=${STANDIN:-0}
SKIP_BUILD=${SKIP_BUILD:-0}
RESULTS_DIR=${RESULTS_DIR:-$ROOT/bench/results}
BUILD_TIMEOUT_S=${BUILD_TIMEOUT_S:-1800}

MEMCACHED=/usr/bin/memcached
# Cargo's default target dir unless CARGO_TARGET_DIR says otherwise (cargo honours it too).
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
SLIPSTREAM=$TARGET_DIR/release/slipstream
LOADGEN=$TARGET_DIR/release/slipstream-loadgen
CLK_TCK=$(getconf CLK_TCK)
NCPU=$(nproc)

log() { echo "[kv_bench] $*" >&2; }
die() { log "error: $*"; exit 1; }

SERVER_PID=""
WORK=$(mktemp -d /tmp/kv_bench.XXXXXX)
cleanup() {
    if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill "$SERVER_PID" 2>/dev/null || true
        sleep 0.2
        kill -9 "$SERVER_PID" 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- build --------------------------------------------------------------------------
cd "$ROOT"
if [[ "$SKIP_BUILD" != 1 ]]; then
    log "cargo build --release (timeout ${BUILD_TIMEOUT_S}s)"
    if ! timeout "$BUILD_TIMEOUT_S" cargo build --release >&2; then
        [[ "$STANDIN" == 1 ]] || die "release build failed"
        log "workspace build failed; STANDIN=1: building the loadgen alone"
        timeout "$BUILD_TIMEOUT_S" cargo build --release -p slipstream-loadgen >&2 || die "loadgen build failed"
    fi
fi
[[ -x "$LOADGEN" ]] || die "no loadgen at $LOADGEN"
[[ -x "$MEMCACHED" ]] || die "no memcached at $MEMCACHED"

SLIP_LABEL=slipstream
if [[ -x "$SLIPSTREAM" ]] && timeout 10 "$SLIPSTREAM" serve --help >/dev/null 2>&1; then
    SLIP_BIN=$SLIPSTREAM
else
    [[ "$STANDIN" == 1 ]] || die "$SLIPSTREAM serve --help failed (set STANDIN=1 to validate the tooling with memcached in its place)"
    log "Slipstream not available: a second memcached stands in for it"
    SLIP_BIN=$MEMCACHED
    SLIP_LABEL="memcached-standin"
fi

# ---- helpers ------------------------------------------------------------------------
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# utime+stime of a process in clock ticks (fields 14 and 15, counted after the ")").
cpu_ticks() {
    local rest
    rest=$(sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null) || { echo 0; return; }
    awk '{print $12 + $13}' <<<"$rest"
}

# Machine busy % over one second (aggregate /proc/stat line): other work on the box before
# a run makes its figures suspect, so it is recorded with each run.
busy_1s() {
    local a b
    a=$(head -1 /proc/stat); sleep 1; b=$(head -1 /proc/stat)
    awk -v a="$a" -v b="$b" 'BEGIN {
        n = split(a, x, " "); split(b, y, " "); t = 0; idle = 0
        for (i = 2; i <= 9 && i <= n; i++) t += y[i] - x[i]
        idle = (y[5] - x[5]) + (y[6] - x[6])
        printf "%.1f\n", (t > 0) ? (100 * (t - idle) / t) : 0 }'
}

wait_port() { # port timeout_s
    local deadline=$((SECONDS + $2))
    while ((SECONDS < deadline)); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
        sleep 0.05
    done
    return 1
}

start_server() { # kind threads port pin_prefix...
    local kind=$1 threads=$2 port=$3; shift 3
    local bin
    if [[ "$kind" == memcached ]]; then
        "$@" "$MEMCACHED" -u root -U 0 -l 127.0.0.1 -p "$port" -t "$threads" -m 1024 -c 4096 \
            >"$WORK/server.log" 2>&1 &
    elif [[ "$SLIP_BIN" == "$MEMCACHED" ]]; then
        "$@" "$MEMCACHED" -u root -U 0 -l 127.0.0.1 -p "$port" -t "$threads" -m 1024 -c 4096 \
            >"$WORK/server.log" 2>&1 &
    else
        "$@" "$SLIP_BIN" serve -l 127.0.0.1 -p "$port" -U 0 -t "$threads" -m 1024 -c 4096 \
            >"$WORK/server.log" 2>&1 &
    fi
    SERVER_PID=$!
    wait_port "$port" 10 || { cat "$WORK/server.log" >&2; die "$kind did not listen on $port"; }
}

stop_server() {
    [[ -n "$SERVER_PID" ]] || return 0
    kill "$SERVER_PID" 2>/dev/null || true
    local i
    for i in $(seq 50); do
        kill -0 "$SERVER_PID" 2>/dev/null || break
        sleep 0.1
    done
    kill -9 "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=""
}

# ---- runs ---------------------------------------------------------------------------
RUNS="$WORK/runs.jsonl"
: >"$RUNS"
LOADGEN_TIMEOUT_S=$(python3 -c "import math; print(math.ceil($WARMUP_S + $DURATION_S) + 60)")

for threads in $THREADS_LIST; do
    server_pin=(); client_pin=(); pinned=false
    if [[ "$PIN" == 1 && "$threads" == 1 && "$NCPU" -ge 2 ]]; then
        server_pin=(taskset -c 0); client_pin=(taskset -c 1); pinned=true
    fi
    for rep in $(seq "$REPEATS"); do
        for kind in memcached slipstream; do
            label=$kind; [[ "$kind" == slipstream ]] && label=$SLIP_LABEL
            port=$(free_port)
            background=$(busy_1s)
            start_server "$kind" "$threads" "$port" "${server_pin[@]}"
            log "$label -t $threads (pinned=$pinned, rep $rep): pid $SERVER_PID port $port (machine ${background}% busy before)"
            t0=$(cpu_ticks "$SERVER_PID")
            set +e
            out=$(timeout "$LOADGEN_TIMEOUT_S" "${client_pin[@]}" "$LOADGEN" \
                --server "127.0.0.1:$port" --conns "$CONNS" --threads "$LOADGEN_THREADS" \
                --pipeline "$PIPELINE" --ratio "$RATIO" --value-bytes "$VALUE_BYTES" \
                --keys "$KEYS" --duration-s "$DURATION_S" --warmup-s "$WARMUP_S" --prefill \
                --seed "$rep" --server-pid "$SERVER_PID" 2>"$WORK/loadgen.err")
            rc=$?
            set -e
            t1=$(cpu_ticks "$SERVER_PID")
            alive=true; kill -0 "$SERVER_PID" 2>/dev/null || alive=false
            stop_server
            [[ -s "$WORK/loadgen.err" ]] && sed 's/^/[loadgen] /' "$WORK/loadgen.err" >&2
            [[ -n "$out" ]] || out=null
            python3 - "$label" "$threads" "$pinned" "$rep" "$rc" "$alive" "$t0" "$t1" "$CLK_TCK" "$background" "$out" >>"$RUNS" <<'PY'
import json, sys
label, threads, pinned, rep, rc, alive, t0, t1, tck, background, out = sys.argv[1:]
print(json.dumps({
    "machine_busy_pct_before": float(background),
    "server": label, "server_threads": int(threads), "pinned": pinned == "true",
    "repeat": int(rep), "loadgen_exit": int(rc), "server_alive_after": alive == "true",
    "server_cpu_s_whole_run": (int(t1) - int(t0)) / float(tck),
    "loadgen": json.loads(out),
}))
PY
            case $rc in
                0) ;;
                3) log "WARNING: loadgen saw errors against $label (recorded in the JSON)";;
                *) log "WARNING: loadgen exited $rc against $label (recorded in the JSON)";;
            esac
        done
    done
done

# ---- report -------------------------------------------------------------------------
mkdir -p "$RESULTS_DIR"
MC_VERSION=$("$MEMCACHED" -V 2>/dev/null || echo unknown)
python3 - "$RUNS" "$RESULTS_DIR" "$SLIP_LABEL" "$MC_VERSION" "$NCPU" <<'PY'
import json, os, platform, statistics, sys, time
runs_path, out_dir, slip_label, mc_version, ncpu = sys.argv[1:]
runs = [json.loads(l) for l in open(runs_path) if l.strip()]
cpu_model = "unknown"
try:
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            cpu_model = line.split(":", 1)[1].strip(); break
except OSError:
    pass
first = next((r["loadgen"] for r in runs if r["loadgen"]), {})
meta = {
    "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    "kernel": platform.release(), "cpu_model": cpu_model, "ncpu": int(ncpu),
    "memcached_version": mc_version, "slipstream_label": slip_label,
    "load": {k: first.get(k) for k in ["conns", "threads", "pipeline", "ratio", "value_bytes",
                                       "keys", "warmup_s", "duration_s"]},
}

def limit(r):
    text = limit_facts(r)
    bg = r.get("machine_busy_pct_before", 0.0)
    if bg > 10:
        text += f"; WARNING: machine {bg:.0f}% busy before the run (other work)"
    return text

def limit_facts(r):
    lg = r["loadgen"]
    if not lg:
        return "run failed"
    d = lg["duration_s"] or 1.0
    srv = (lg.get("server_cpu_s") or 0.0) / d
    cli = (lg.get("client_cpu_s") or 0.0) / d
    busy = lg.get("machine_busy_pct") or 0.0
    per = lg.get("per_cpu_busy_pct") or []
    # Busy time no process of ours was charged for: softirq (loopback delivery) and any
    # other work on the box. Large values mean interference.
    other = busy / 100.0 * len(per) - srv - cli if per else 0.0
    facts = (f"server {srv:.2f} cores, client {cli:.2f} cores, other {other:.2f} cores, "
             f"machine {busy:.0f}% busy")
    if r["pinned"] and len(per) >= 2:
        facts += f" (core0 {per[0]:.0f}%, core1 {per[1]:.0f}%)"
        if per[0] >= 95 and per[1] < 95:
            return "server core saturated; " + facts
        if per[1] >= 95 and per[0] < 95:
            return "client core saturated; " + facts
        if per[0] >= 95 and per[1] >= 95:
            return "both cores saturated; " + facts
        return "no core saturated (latency-bound); " + facts
    if busy >= 95:
        return "machine saturated (client and server share cores); " + facts
    if srv >= 0.9 * r["server_threads"]:
        return "server threads saturated; " + facts
    if cli >= 0.9 * lg["threads"]:
        return "client saturated; " + facts
    return "nothing saturated (latency-bound); " + facts

def us(ns):
    return f"{ns / 1000:.0f}"

rows = []
for r in runs:
    lg = r["loadgen"] or {}
    r["limit"] = limit(r)
    if not lg:
        rows.append(f"| {r['server']} | {r['server_threads']} | {str(r['pinned']).lower()} | failed (exit {r['loadgen_exit']}) |||||||||")
        continue
    lat = lg["lat_ns"]
    err = (lg["errors"] + lg["errors_outside_window"] + lg["conn_failures"] + lg["prefill_errors"]
           + lg.get("stalled_conns", 0))
    rows.append("| {} | {} | {} | {:,.0f} | {} | {} | {} | {:.2f} | {} | {:.2f} | {:.0f} | {}/{}/{} | {} |".format(
        r["server"], r["server_threads"], str(r["pinned"]).lower(), lg["ops_per_s"],
        us(lat["p50"]), us(lat["p99"]), us(lat["p999"]), lg["server_cpu_s"] or 0.0,
        f"{lg['ops_per_server_cpu_s']:,.0f}" if lg.get("ops_per_server_cpu_s") else "n/a",
        lg["client_cpu_s"] or 0.0, lg["machine_busy_pct"] or 0.0,
        lg["hits"], lg["misses"], err, r["limit"]))

def median_run(server, threads):
    rs = [r for r in runs if r["server"] == server and r["server_threads"] == threads and r["loadgen"]]
    if not rs:
        return None
    rs.sort(key=lambda r: r["loadgen"]["ops_per_s"])
    return rs[len(rs) // 2]["loadgen"]

ratios = []
ratio_rows = []
for t in sorted({r["server_threads"] for r in runs}):
    a, b = median_run(slip_label, t), median_run("memcached", t)
    if not a or not b:
        continue
    def q(x, y):
        return (x / y) if (x is not None and y) else None
    entry = {"server_threads": t,
             "ops_per_s": q(a["ops_per_s"], b["ops_per_s"]),
             "p50": q(a["lat_ns"]["p50"], b["lat_ns"]["p50"]),
             "p99": q(a["lat_ns"]["p99"], b["lat_ns"]["p99"]),
             "ops_per_server_cpu_s": q(a.get("ops_per_server_cpu_s"), b.get("ops_per_server_cpu_s"))}
    ratios.append(entry)
    f = lambda v: "n/a" if v is None else f"{v:.2f}"
    ratio_rows.append(f"| {t} | {f(entry['ops_per_s'])} | {f(entry['p50'])} | {f(entry['p99'])} | {f(entry['ops_per_server_cpu_s'])} |")

doc = {"meta": meta, "runs": runs, "ratios_slipstream_over_memcached": ratios}
with open(os.path.join(out_dir, "kv.json"), "w") as fh:
    json.dump(doc, fh, indent=1)
    fh.write("\n")

L = meta["load"]
md = [
    "# KV benchmark: Slipstream vs memcached",
    "",
    f"Generated by `bench/kv_bench.sh` on {meta['date_utc']}: {meta['cpu_model']}, {meta['ncpu']} CPUs, "
    f"kernel {meta['kernel']}, {mc_version}. Loopback TCP, text protocol.",
    "",
    f"Load (slipstream-loadgen, closed loop): {L['conns']} connections, {L['threads']} client thread(s), "
    f"pipeline {L['pipeline']}, set:get {L['ratio']}, {L['value_bytes']}-byte values, {L['keys']} keys "
    f"(prefilled, so gets hit), {L['warmup_s']} s warmup, ~{L['duration_s']} s measured. Latency is per "
    "request, from writing its batch to reading its reply; with 50x16 requests in flight it is "
    "dominated by queueing (Little's law), so compare it between servers, not with single-request latency.",
    "",
    "CPU figures are utime+stime over the measured window (/proc/PID/stat fields 14+15 over CLK_TCK). "
    "On loopback each side's kernel time includes part of the other side's receive path. "
    "1-thread rows are pinned (server core 0, loadgen core 1); other rows are not pinned and client "
    "and server share the cores.",
]
if slip_label != "slipstream":
    md += ["", f"**Slipstream was not available: `{slip_label}` rows are a second memcached "
           "standing in, to validate the tooling. They are not Slipstream figures.**"]
md += [
    "",
    "| server | threads | pinned | ops/s | p50 µs | p99 µs | p99.9 µs | server CPU-s | ops per server CPU-s | client CPU-s | machine busy % | hits/misses/errors | limit (measured) |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    *rows,
    "",
    f"Ratios {slip_label} / memcached (ops/s and ops per CPU-s: higher is better for {slip_label}; latency: lower is better):",
    "",
    "| threads | ops/s | p50 | p99 | ops per server CPU-s |",
    "|---|---|---|---|---|",
    *ratio_rows,
    "",
]
with open(os.path.join(out_dir, "kv.md"), "w") as fh:
    fh.write("\n".join(md))
print("\n".join(md))
PY
log "wrote $RESULTS_DIR/kv.md and $RESULTS_DIR/kv.json"
