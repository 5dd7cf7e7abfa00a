#!/usr/bin/env bash
# xdp_bench.sh — UDP GET throughput and server-side CPU per request across a veth pair:
# Slipstream with the XDP fast path vs Slipstream user-space UDP vs memcached UDP (-U).
#
# What it does: creates a server and a client network namespace joined by a veth pair (the
# client veth gets a do-nothing XDP_PASS program, needed for XDP_TX frames to arrive), then for
# each server thread count in THREADS_LIST and each server it: starts the server in the server
# namespace, prefills 95% of the key space over TCP (so gets hit 95% of the time), runs
# `slipstream-loadgen --udp` from the client namespace and records its JSON (ops/s, latency,
# per-CPU busy % of the measured window from /proc/stat, server process CPU), then stops it.
# Finally it times the XDP program per packet with BPF_PROG_TEST_RUN (crates/fastpath example
# `prog_cost`). Output: bench/results/xdp.md (table) and bench/results/xdp.json (raw).
#
# Where the work runs (why per-core figures are meaningful on a 2-core box): on a veth, the
# receive work of a frame runs in the *sender's* context unless moved. This script moves it:
#  - server veth: with XDP attached it has a NAPI instance; NAPI is switched to threaded mode
#    and its kthread pinned to SERVER_CPU. Without XDP (user-space and memcached runs) veth
#    delivers through the backlog; RPS steers that to SERVER_CPU.
#  - client veth (XDP_PASS attached, so NAPI): threaded, kthread pinned to CLIENT_CPU.
#  - 1 server thread: server on SERVER_CPU, loadgen on CLIENT_CPU (taskset). So SERVER_CPU's
#    busy time (user + system + softirq + irq, /proc/stat) is the whole server side: process,
#    network stack and XDP; CLIENT_CPU's is the whole client side.
#  - 2 server threads: there are only two cores, so server threads, loadgen and stack work
#    share both; the table gives ops/s and whole-machine CPU per request, and says so.
# Server CPU per request = SERVER_CPU busy fraction x window / requests answered.
#
# Needs root (namespaces, XDP). Not for: NIC figures (veth native XDP is not a NIC driver).
#
# Environment knobs [defaults]:
#   THREADS_LIST ["1 2"]  DURATION_S [10]  WARMUP_S [2]  CONNS [8]  PIPELINE [16]
#   LOADGEN_THREADS [1]  VALUE_BYTES [32]  KEYS [10000]  HIT_PCT [95]
#   SERVERS ["xdp user memcached"]  SKIP_BUILD [0]  RESULTS_DIR [bench/results]
#   SERVER_CPU [0]  CLIENT_CPU [1]  CARGO_TARGET_DIR [target]
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
THREADS_LIST=${THREADS_LIST:-"1 2"}
DURATION_S=${DURATION_S:-10}
WARMUP_S=${WARMUP_S:-2}
CONNS=${CONNS:-8}
PIPELINE=${PIPELINE:-16}
LOADGEN_THREADS=${LOADGEN_THREADS:-1}
VALUE_BYTES=${VALUE_BYTES:-32}
KEYS=${KEYS:-10000}
HIT_PCT=${HIT_PCT:-95}
SERVERS=${SERVERS:-"xdp user memcached"}
SKIP_BUILD=${SKIP_BUILD:-0}
RESULTS_DIR=${RESULTS_DIR:-$ROOT/bench/results}
SERVER_CPU=${SERVER_CPU:-0}
CLIENT_CPU=${CLIENT_CPU:-1}
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
SLIPSTREAM=$TARGET_DIR/release/slipstream
LOADGEN=$TARGET_DIR/release/slipstream-loadgen
MEMCACHED=/usr/bin/memcached
PORT=22311
TAG=$$
SRV=xbsrv$TAG
CLI=xbcli$TAG
VS=xbs$TAG
VC=xbc$TAG
V4S=10.205.0.1
V4C=10.205.0.2

log() { echo "[xdp_bench] $*" >&2; }
die() { log "error: $*"; exit 1; }

if [ "$(id -u)" != 0 ]; then
    echo "SKIP: bench/xdp_bench.sh needs root (network namespaces, XDP)"
    exit 0
fi
command -v ip >/dev/null || die "needs iproute2 (ip)"
command -v taskset >/dev/null || die "needs taskset (util-linux)"
command -v python3 >/dev/null || die "needs python3 (JSON summary)"

if [ "$SKIP_BUILD" != 1 ]; then
    log "building (release)"
    (cd "$ROOT" && timeout 1800 cargo build --release --quiet -p slipstream -p slipstream-loadgen \
        && timeout 1800 cargo build --release --quiet -p slipstream-fastpath --example prog_cost)
fi
[ -x "$SLIPSTREAM" ] || die "no $SLIPSTREAM"
[ -x "$LOADGEN" ] || die "no $LOADGEN"
PROG_COST=$TARGET_DIR/release/examples/prog_cost
PASS_OBJ=$(ls -t "$TARGET_DIR"/release/build/slipstream-fastpath-*/out/xdp_pass.o 2>/dev/null | head -n1)
[ -n "$PASS_OBJ" ] || die "no xdp_pass.o under $TARGET_DIR/release/build (build slipstream-fastpath)"

SERVER_PID=""
cleanup() {
    if [ -n "$SERVER_PID" ]; then kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; fi
    ip netns del "$SRV" 2>/dev/null || true
    ip netns del "$CLI" 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

. "$ROOT/bench/netns.sh"
setup() {
    veth_namespaces "$SRV" "$CLI" "$VS" "$VC" "$V4S" "$V4C"
    ip -n "$CLI" link set dev "$VC" xdpdrv obj "$PASS_OBJ" sec xdp
    # Client-side receive (the replies) in a NAPI kthread on the client core.
    ip netns exec "$CLI" sh -c "echo 1 > /sys/class/net/$VC/threaded"
    pin_napi "$VC" "$CLIENT_CPU"
}

# Pin the threaded-NAPI kthread(s) of device $1 to CPU $2.
pin_napi() {
    local pids
    pids=$(ps -eo pid=,comm= | awk -v d="napi/$1-" 'index($2, d) == 1 {print $1}')
    for p in $pids; do taskset -pc "$2" "$p" >/dev/null; done
}

# Steer the server veth's receive work to SERVER_CPU: threaded NAPI when XDP gave it NAPI,
# else RPS on the backlog.
steer_server_rx() {
    local mask
    mask=$(printf '%x' $((1 << SERVER_CPU)))
    if ip netns exec "$SRV" sh -c "echo 1 > /sys/class/net/$VS/threaded" 2>/dev/null; then
        pin_napi "$VS" "$SERVER_CPU"
        echo "threaded-napi"
    else
        ip netns exec "$SRV" sh -c "echo $mask > /sys/class/net/$VS/queues/rx-0/rps_cpus"
        echo "rps"
    fi
}

wait_tcp() {
    for _ in $(seq 1 100); do
        if ip netns exec "$CLI" bash -c "exec 3<>/dev/tcp/$V4S/$PORT" 2>/dev/null; then return 0; fi
        sleep 0.1
    done
    return 1
}

start_server() { # $1 kind, $2 threads
    local pin=""
    [ "$2" = 1 ] && pin="taskset -c $SERVER_CPU"
    case "$1" in
        xdp) ip netns exec "$SRV" $pin "$SLIPSTREAM" serve -l 0.0.0.0 -p $PORT -U $PORT -t "$2" -m 256 --xdp "$VS" \
                > "$WORK/server.out" 2>&1 & ;;
        user) ip netns exec "$SRV" $pin "$SLIPSTREAM" serve -l 0.0.0.0 -p $PORT -U $PORT -t "$2" -m 256 \
                > "$WORK/server.out" 2>&1 & ;;
        memcached) ip netns exec "$SRV" $pin "$MEMCACHED" -u root -l 0.0.0.0 -p $PORT -U $PORT -t "$2" -m 256 \
                > "$WORK/server.out" 2>&1 & ;;
    esac
    SERVER_PID=$!
    wait_tcp || die "$1 did not start: $(cat "$WORK/server.out")"
    if [ "$1" = xdp ]; then
        sleep 0.3
        grep -q "kernel fast path on" "$WORK/server.out" || die "fast path did not attach: $(cat "$WORK/server.out")"
    fi
}

stop_server() {
    kill "$SERVER_PID" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=""
}

WORK=$(mktemp -d)
mkdir -p "$RESULTS_DIR"
setup
RAW=$WORK/raw.jsonl
: > "$RAW"
PREFILL_KEYS=$((KEYS * HIT_PCT / 100))

for threads in $THREADS_LIST; do
    for kind in $SERVERS; do
        log "$kind, $threads server thread(s)"
        start_server "$kind" "$threads"
        steer=$(steer_server_rx)
        # Keys 0..PREFILL_KEYS-1 exist, the rest miss: HIT_PCT% hits. The prefill run's own gets
        # also warm the kernel cache for the XDP server (as any read does).
        timeout 120 ip netns exec "$CLI" "$LOADGEN" --udp --server $V4S:$PORT --keys $PREFILL_KEYS \
            --value-bytes "$VALUE_BYTES" --prefill --conns 4 --pipeline 8 --duration-s 1 --warmup-s 0 \
            > "$WORK/prefill.json" || die "prefill failed"
        lg_pin=""
        [ "$threads" = 1 ] && lg_pin="taskset -c $CLIENT_CPU"
        idle_before=$(python3 - <<'EOF'
import time
def rd():
    v=[int(x) for x in open('/proc/stat').readline().split()[1:9]]
    return sum(v), v[3]+v[4]
a=rd(); time.sleep(1); b=rd()
print(round(100*(1-(b[1]-a[1])/max(1,b[0]-a[0])),1))
EOF
)
        out=$(timeout $((DURATION_S + WARMUP_S + 60)) ip netns exec "$CLI" $lg_pin "$LOADGEN" --udp \
            --server $V4S:$PORT --keys "$KEYS" --value-bytes "$VALUE_BYTES" --conns "$CONNS" \
            --pipeline "$PIPELINE" --threads "$LOADGEN_THREADS" --duration-s "$DURATION_S" \
            --warmup-s "$WARMUP_S" --server-pid "$SERVER_PID") || log "loadgen exit $? (see JSON)"
        fp=""
        if [ "$kind" = xdp ]; then
            fp=$(ip netns exec "$CLI" python3 -c "
import socket
s=socket.create_connection(('$V4S',$PORT),timeout=5); s.sendall(b'stats\r\n'); d=b''
while not d.endswith(b'END\r\n'): d+=s.recv(65536)
print(' '.join(l.split()[1]+'='+l.split()[2] for l in d.decode().splitlines() if l.startswith('STAT fastpath_')))")
        fi
        echo "{\"server\":\"$kind\",\"threads\":$threads,\"steer\":\"$steer\",\"busy_before_pct\":$idle_before,\"fastpath\":\"$fp\",\"loadgen\":$out}" >> "$RAW"
        stop_server
    done
done

COST=""
if [ -x "$PROG_COST" ]; then
    log "XDP program cost (BPF_PROG_TEST_RUN)"
    COST=$("$PROG_COST" 2>&1) || log "prog_cost failed: $COST"
fi

python3 - "$RAW" "$RESULTS_DIR" "$SERVER_CPU" "$CLIENT_CPU" "$COST" "$DURATION_S" "$CONNS" "$PIPELINE" "$VALUE_BYTES" "$KEYS" "$HIT_PCT" <<'EOF'
import json, sys, platform, os, datetime
raw, outdir, scpu, ccpu, cost, dur, conns, pipe, vb, keys, hit = sys.argv[1:12]
scpu, ccpu, dur = int(scpu), int(ccpu), float(dur)
rows = [json.loads(l) for l in open(raw) if l.strip()]
names = {"xdp": "Slipstream + XDP", "user": "Slipstream user-space UDP", "memcached": "memcached 1.6 UDP"}
lines = []
lines.append("# UDP GET across a veth pair: XDP fast path vs user space vs memcached\n")
lines.append(f"Generated by `bench/xdp_bench.sh` on {datetime.datetime.now().isoformat(timespec='seconds')}, "
             f"kernel {platform.release()}, {os.cpu_count()} CPUs. Load: `slipstream-loadgen --udp`, {conns} sockets x "
             f"{pipe} in flight, {vb}-byte values, {keys} keys of which {hit}% exist (so ~{hit}% hits), "
             f"{dur:.0f} s measured after warmup. Raw JSON: `xdp.json`.\n")
lines.append(f"1 server thread: server pinned to CPU {scpu}, loadgen to CPU {ccpu}; the server veth's receive work "
             f"(threaded NAPI with XDP, RPS without) on CPU {scpu}, the client veth's on CPU {ccpu}. "
             f"**server CPU-us/req** = CPU {scpu} busy time (user+sys+softirq+irq, /proc/stat) / requests; "
             f"**req/s per server core** = requests / CPU {scpu} busy seconds. 2 server threads: everything shares the "
             f"two cores; CPU per request is then the whole machine's (client included).\n")
lines.append("| server | threads | req/s | hit % | lost | p50 us | p99 us | server CPU % | client CPU % | server CPU-us/req | req/s per server core | XDP hits / misses | limit | busy before |")
lines.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
per_core = {}
for r in rows:
    lg = r["loadgen"]
    ops = lg["ops"]; ops_s = lg["ops_per_s"]
    hits = lg["hits"]; gets = max(1, lg["gets"])
    busy = lg.get("per_cpu_busy_pct", [])
    t = r["threads"]
    if t == 1 and len(busy) > max(scpu, ccpu):
        sb, cb = busy[scpu], busy[ccpu]
        cpu_s = sb / 100 * dur
        us_req = cpu_s / max(1, ops) * 1e6
        per = ops / cpu_s if cpu_s > 0 else 0
        limit = "server core" if sb > 95 else ("client core (generator)" if cb > 95 else "neither core saturated")
    else:
        sb = lg.get("machine_busy_pct") or 0
        cb = float("nan")
        cpu_s = sb / 100 * dur * len(busy)
        us_req = cpu_s / max(1, ops) * 1e6
        per = ops / cpu_s if cpu_s > 0 else 0
        limit = "both cores shared (machine %.0f%% busy)" % sb
    per_core[(r["server"], t)] = per
    fp = r.get("fastpath", "")
    fpd = dict(kv.split("=") for kv in fp.split()) if fp else {}
    fps = f"{fpd.get('fastpath_hits','-')} / {fpd.get('fastpath_misses','-')}" if fpd else "-"
    lat = lg["lat_ns"]
    lines.append(f"| {names.get(r['server'], r['server'])} | {t} | {ops_s:,.0f} | {100*hits/gets:.1f} | {lg.get('lost',0)} | "
                 f"{lat['p50']/1000:.1f} | {lat['p99']/1000:.1f} | {sb:.0f} | {'' if cb != cb else f'{cb:.0f}'} | {us_req:.2f} | {per:,.0f} | {fps} | {limit} | {r['busy_before_pct']}% |")
lines.append("")
for t in sorted({k[1] for k in per_core}):
    m = per_core.get(("memcached", t)); x = per_core.get(("xdp", t)); u = per_core.get(("user", t))
    if m:
        parts = []
        if x: parts.append(f"XDP {x/m:.1f}x")
        if u: parts.append(f"user-space UDP {u/m:.1f}x")
        what = "server CPU-second" if t == 1 else "CPU-second of the whole machine (client included: the cores are shared)"
        lines.append(f"- {t} thread(s), requests per {what} relative to memcached: " + ", ".join(parts))
lines.append("")
if cost:
    lines.append("## XDP program cost per packet (BPF_PROG_TEST_RUN)\n")
    lines.append("```")
    lines.append(cost.strip())
    lines.append("```")
open(os.path.join(outdir, "xdp.md"), "w").write("\n".join(lines) + "\n")
json.dump({"runs": rows, "prog_cost": cost, "kernel": platform.release(), "cpus": os.cpu_count()},
          open(os.path.join(outdir, "xdp.json"), "w"), indent=1)
print("\n".join(lines))
EOF
