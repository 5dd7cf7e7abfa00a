#!/usr/bin/env bash
# tenant_bench.sh — multi-tenant shaping benchmarks (issue 4): scale-up, shares, latency
# isolation, shaping overhead, work-conserving sharing. Loopback TCP only, 127.0.0.1 only.
#
# What it does: builds the daemon and the loadgen in release mode (default target dir), then
# per experiment writes a TOML config (temp dir), starts `slipstream serve --config FILE`
# with its [[tenant]]s, prefills every tenant it will load (slipstream-loadgen --prefill),
# and runs one loadgen process per busy tenant, in parallel, all started on the same
# wall-clock instant (--start-at-unix-ms) so their measured windows coincide. Egress is
# measured two ways over the window: from the daemon's admin /metrics
# (slipstream_tenant_bytes_out_total deltas between two scrapes inside the window, divided
# by the time between the scrapes; one scrape covers all tenants at once, so shares are
# exact relative to each other) and from each loadgen (bytes it read in its window).
#
#   a) scale-up:  8 tenants x 12.5%, work_conserving=false; k = 1..8 of them busy (read-only,
#                 closed loop, pipelined): aggregate egress vs k, ideal = min(cap, k x 12.5%).
#   b) shares:    T0 = 50% and the others 12.5% (SHARES_B), tenants made busy one by one
#                 (T0 first): per-tenant share of the capacity vs allocation (pp) at every
#                 step, total vs capacity. The issue's "seven others at 12.5%" sums to 137.5%,
#                 which the config contract refuses (shares must sum to <= 1), so by default
#                 four others at 12.5% (sum 100%); the paper (Fig. 6) also reaches capacity
#                 with five tenants busy.
#   c) isolation: the 8 x 12.5% daemon of (a); T0 open loop (--rate-per-s) at ISO_LOAD_PCT % of
#                 its egress share, latency from each request's scheduled time; once with the
#                 seven others idle, once with them saturating: p50/p99/p99.9.
#   d) overhead:  one tenant with share 1 and a capacity far above the machine (shaping
#                 code on, never limiting) vs plain `serve -p` (no [[tenant]]) vs memcached
#                 1.6 with the same thread count: same closed-loop load, one after another,
#                 D_REPEATS times, interleaved; medians. Server pinned to core 0 and loadgen
#                 to core 1 when D_THREADS=1 (PIN=1).
#   e) work-conserving: 4 tenants at 0.4/0.3/0.2/0.1, only the 0.3 and 0.1 ones busy;
#                 work_conserving=false (expected: 30% and 10% of the capacity) then true
#                 (expected: the whole capacity split 3:1, 75% and 25%).
#
# The capacity (CAPACITY, egress and ingress bytes/s) is 40 MB/s by default with ~1000-byte
# values: a 2-core machine serves far more (over 500 MB/s of 1000-byte get replies from
# plain `serve -p` on loopback), so the shapers, not the machine, set the figures in a-c, e.
#
# Output: RESULTS_DIR (default bench/results/tenants-<UTC timestamp>/) gets one JSON file per
# run (<experiment>-<label>-r<repeat>.json: per-tenant /metrics deltas, every loadgen's JSON
# line and exit status), summary.md + summary.json (bench/tenant_plot.py summary) and PNG
# plots (bench/tenant_plot.py plot; matplotlib is installed in the setup step if missing).
#
# Environment knobs (defaults in brackets):
#   EXPERIMENTS ["a b c d e"]  which to run
#   DURATION_S [5] WARMUP_S [1]   measured window and warm-up per run (a, b, e)
#   ISO_DURATION_S [10]           window for (c) (more samples for p99/p99.9)
#   REPEATS [1]                   runs per step in a, b, c, e
#   CAPACITY [40000000]           bytes/s of the node (egress and ingress) in a, b, c, e
#   VALUE_BYTES [1000] KEYS [4000]  values and keys per tenant (all prefilled)
#   CONNS [4] PIPELINE [8]        per busy tenant's loadgen (closed loop)
#   THREADS [2]                   daemon worker threads in a, b, c, e
#   BURST_BYTES [65536] MAX_OUTSTANDING [64] MEMORY_MB [64]   per tenant
#   SHARES_B ["0.5 0.125 0.125 0.125 0.125"]  tenants of (b), T0 first
#   ISO_LOAD_PCT [30] ISO_CONNS [4]  (c): T0's open-loop rate, % of its egress share
#   ISO_CLIENT_RT [1]             (c): run T0's loadgen with chrt -f 10 (see below)
#   ISO_OTHERS_NICE [0]           closed-loop generators at this nice level (see below)
#   ISO_OTHERS_SCHED []           "idle": closed-loop generators under SCHED_IDLE (see below)
#   D_THREADS [1] D_CONNS [50] D_PIPELINE [16] D_VALUE_BYTES [100] D_KEYS [10000]
#   D_RATIO [1:1] D_DURATION_S [5] D_REPEATS [3] PIN [1]   (d)
#   TENANTS_REQUIRED [1]  0: if the daemon refuses [[tenant]] configs, skip a, b, c, e and
#                         the tenant leg of d instead of failing (tests the tooling only)
#   SKIP_BUILD [0]        1: use the binaries already built
#   SLIPSTREAM [target/release/slipstream]  LOADGEN [target/release/slipstream-loadgen]
#   RESULTS_DIR [bench/results/tenants-<timestamp>]
#   CARGO_TARGET_DIR [target]
#
# Not for: comparing figures across machines, or across runs on a busy machine (each run
# records how busy the machine was just before it). Every wait and every process has a
# time limit; the EXIT trap kills every process this script started. Total with the
# defaults: about 4 minutes after the build.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
EXPERIMENTS=${EXPERIMENTS:-"a b c d e"}
DURATION_S=${DURATION_S:-5}
WARMUP_S=${WARMUP_S:-1}
ISO_DURATION_S=${ISO_DURATION_S:-10}
REPEATS=${REPEATS:-1}
CAPACITY=${CAPACITY:-40000000}
VALUE_BYTES=${VALUE_BYTES:-1000}
KEYS=${KEYS:-4000}
CONNS=${CONNS:-4}
PIPELINE=${PIPELINE:-8}
THREADS=${THREADS:-2}
BURST_BYTES=${BURST_BYTES:-65536}
MAX_OUTSTANDING=${MAX_OUTSTANDING:-64}
MEMORY_MB=${MEMORY_MB:-64}
SHARES_B=${SHARES_B:-"0.5 0.125 0.125 0.125 0.125"}
ISO_LOAD_PCT=${ISO_LOAD_PCT:-30}
ISO_CONNS=${ISO_CONNS:-4}
# The measuring client of (c) runs with real-time priority (chrt -f 10) when ISO_CLIENT_RT=1, so
# the figure is the daemon's isolation, not the OS scheduling of 9 client and server processes
# on 2 cores (on a real deployment clients are other machines). The daemon keeps normal priority.
ISO_CLIENT_RT=${ISO_CLIENT_RT:-1}
ISO_CLIENT_PRIO=()
# ISO_OTHERS_NICE=N runs the closed-loop (saturating) generators at nice N, emulating clients on
# other machines that take no CPU from the daemon (default 0: same priority as everything).
ISO_OTHERS_NICE=${ISO_OTHERS_NICE:-0}
# ISO_OTHERS_SCHED=idle runs them under SCHED_IDLE instead (chrt -i 0): they get a core only
# when nothing else wants it, the closest a shared 2-core box gets to clients on other machines.
ISO_OTHERS_SCHED=${ISO_OTHERS_SCHED:-}
OTHERS_PRIO=()
if [[ "$ISO_OTHERS_SCHED" == idle ]]; then
    OTHERS_PRIO=(chrt -i 0)
elif [[ "$ISO_OTHERS_NICE" != 0 ]]; then
    OTHERS_PRIO=(nice -n "$ISO_OTHERS_NICE")
fi
if [[ "$ISO_CLIENT_RT" == 1 ]] && command -v chrt >/dev/null && chrt -f 10 true 2>/dev/null; then
    ISO_CLIENT_PRIO=(chrt -f 10)
fi
D_THREADS=${D_THREADS:-1}
D_CONNS=${D_CONNS:-50}
D_PIPELINE=${D_PIPELINE:-16}
D_VALUE_BYTES=${D_VALUE_BYTES:-100}
D_KEYS=${D_KEYS:-10000}
D_RATIO=${D_RATIO:-1:1}
D_DURATION_S=${D_DURATION_S:-5}
D_REPEATS=${D_REPEATS:-3}
PIN=${PIN:-1}
TENANTS_REQUIRED=${TENANTS_REQUIRED:-1}
SKIP_BUILD=${SKIP_BUILD:-0}
BUILD_TIMEOUT_S=${BUILD_TIMEOUT_S:-1800}
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
RESULTS_DIR=${RESULTS_DIR:-$ROOT/bench/results/tenants-$STAMP}
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
SLIPSTREAM=${SLIPSTREAM:-$TARGET_DIR/release/slipstream}
LOADGEN=${LOADGEN:-$TARGET_DIR/release/slipstream-loadgen}
MEMCACHED=/usr/bin/memcached
PLOT=$ROOT/bench/tenant_plot.py
NCPU=$(nproc)

# Limits on every wait (seconds).
START_TIMEOUT_S=10      # daemon: ports open
PREFILL_TIMEOUT_S=120   # one tenant's prefill (shaped by its ingress share)
LEAD_MS=1500            # loadgens are told to start this far ahead, so all have connected

log() { echo "[tenant_bench] $*" >&2; }
die() { log "error: $*"; exit 1; }

WORK=$(mktemp -d /tmp/tenant_bench.XXXXXX)
PIDS=()
cleanup() {
    local p
    for p in "${PIDS[@]}" $(jobs -p); do
        kill "$p" 2>/dev/null || true
    done
    sleep 0.3
    for p in "${PIDS[@]}" $(jobs -p); do
        kill -9 "$p" 2>/dev/null || true
    done
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

is_num() { [[ "$1" =~ ^[0-9]+([.][0-9]+)?$ ]]; }
for v in DURATION_S WARMUP_S ISO_DURATION_S REPEATS CAPACITY VALUE_BYTES KEYS CONNS PIPELINE THREADS \
    BURST_BYTES MAX_OUTSTANDING MEMORY_MB ISO_LOAD_PCT ISO_CONNS D_THREADS D_CONNS D_PIPELINE \
    D_VALUE_BYTES D_KEYS D_DURATION_S D_REPEATS; do
    is_num "${!v}" || die "$v=${!v} is not a number"
done
((REPEATS >= 1 && REPEATS <= 20 && D_REPEATS >= 1 && D_REPEATS <= 20)) || die "REPEATS and D_REPEATS must be 1..20"
for s in $SHARES_B; do is_num "$s" || die "SHARES_B: $s is not a number"; done

want() { [[ " $EXPERIMENTS " == *" $1 "* ]]; }

# ---- setup: build, tools, plotting -------------------------------------------------
cd "$ROOT"
if [[ "$SKIP_BUILD" != 1 ]]; then
    log "cargo build --release -p slipstream -p slipstream-loadgen (timeout ${BUILD_TIMEOUT_S}s)"
    timeout "$BUILD_TIMEOUT_S" cargo build --release -p slipstream -p slipstream-loadgen >&2 || die "release build failed"
fi
[[ -x "$SLIPSTREAM" ]] || die "no daemon at $SLIPSTREAM"
[[ -x "$LOADGEN" ]] || die "no loadgen at $LOADGEN"
"$LOADGEN" --help | grep -q -- --rate-per-s || die "$LOADGEN has no --rate-per-s (rebuild it)"
if want d; then [[ -x "$MEMCACHED" ]] || die "no memcached at $MEMCACHED (needed by experiment d)"; fi
if ! python3 -c 'import matplotlib' 2>/dev/null; then
    # pip first: the python3 on PATH may not be the system one (pyenv), which apt's
    # python3-matplotlib would not reach; the system python refuses pip installs, apt then.
    log "matplotlib missing: installing matplotlib (pip), else python3-matplotlib (apt)"
    timeout 600 python3 -m pip install --quiet matplotlib >&2 || true
    if ! python3 -c 'import matplotlib' 2>/dev/null && command -v apt-get >/dev/null && [[ $(id -u) == 0 ]]; then
        timeout 600 apt-get update -qq >&2 || true
        DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq python3-matplotlib >&2 || true
    fi
    python3 -c 'import matplotlib' 2>/dev/null \
        || log "WARNING: no matplotlib; the summary is still written, the plots are not"
fi
mkdir -p "$RESULTS_DIR"
log "results in $RESULTS_DIR"

# ---- helpers -------------------------------------------------------------------------
# N distinct free loopback ports, held open together while chosen so none repeats.
free_ports() {
    python3 - "$1" <<'PY'
import socket, sys
held = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); held.append(s)
print(" ".join(str(s.getsockname()[1]) for s in held))
for s in held: s.close()
PY
}

wait_port() { # port timeout_s pid
    local deadline=$((SECONDS + $2))
    while ((SECONDS < deadline)); do
        kill -0 "$3" 2>/dev/null || return 1
        if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
        sleep 0.05
    done
    return 1
}

# Machine busy % over half a second: other work on the box makes a run's figures suspect.
busy_half_s() {
    local a b
    a=$(head -1 /proc/stat); sleep 0.5; b=$(head -1 /proc/stat)
    awk -v a="$a" -v b="$b" 'BEGIN { n = split(a, x, " "); split(b, y, " "); t = 0
        for (i = 2; i <= 9 && i <= n; i++) t += y[i] - x[i]
        idle = (y[5] - x[5]) + (y[6] - x[6]); printf "%.1f\n", (t > 0) ? (100 * (t - idle) / t) : 0 }'
}

now_ms() { date +%s%3N; }

# The scraper: two /metrics scrapes inside the window, per-tenant deltas as JSON.
cat >"$WORK/scrape.py" <<'PY'
import json, re, sys, time, urllib.request
admin, token, start_ms, warmup_s, duration_s = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
MARGIN_S = min(0.2, duration_s / 10)
LINE = re.compile(r'^(slipstream_tenant_[a-z_]+)\{([^}]*)\}\s+([0-9.eE+-]+)\s*$')
def scrape():
    req = urllib.request.Request(f"http://{admin}/metrics", headers={"Authorization": f"Bearer {token}"})
    t = time.monotonic()
    with urllib.request.urlopen(req, timeout=5) as r:
        body = r.read(4 << 20).decode("utf-8", "replace")
    t = (t + time.monotonic()) / 2
    out = {}
    for line in body.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2)))
        name = labels.get("tenant")
        if name is not None:
            out.setdefault(name, {})[m.group(1)] = float(m.group(3))
    return t, out
def sleep_until_wall(t_s):
    d = t_s - time.time()
    if 0 < d < 600:
        time.sleep(d)
result = {"ok": False}
try:
    sleep_until_wall(start_ms / 1000 + warmup_s + MARGIN_S)
    t0, m0 = scrape()
    sleep_until_wall(start_ms / 1000 + warmup_s + duration_s - MARGIN_S)
    t1, m1 = scrape()
    COUNTERS = {"bytes_out": "slipstream_tenant_bytes_out_total", "bytes_in": "slipstream_tenant_bytes_in_total",
                "requests": "slipstream_tenant_requests_total", "throttled": "slipstream_tenant_throttled_total",
                "dropped": "slipstream_tenant_dropped_total"}
    GAUGES = {"egress_rate": "slipstream_tenant_egress_rate_bytes_per_s",
              "ingress_rate": "slipstream_tenant_ingress_rate_bytes_per_s",
              "memory_bytes": "slipstream_tenant_memory_bytes"}
    tenants = {}
    for name in sorted(set(m0) | set(m1)):
        a, b = m0.get(name, {}), m1.get(name, {})
        row = {k: (b[v] - a[v]) if (v in a and v in b) else None for k, v in COUNTERS.items()}
        row.update({k: b.get(v) for k, v in GAUGES.items()})
        tenants[name] = row
    result = {"ok": True, "elapsed_s": t1 - t0, "tenants": tenants}
except Exception as e:  # recorded in the run's JSON; the report flags the run
    result = {"ok": False, "error": f"{type(e).__name__}: {e}"}
print(json.dumps(result))
PY

# Assemble one run's JSON from the pieces in $WORK/run/.
cat >"$WORK/assemble.py" <<'PY'
import json, os, sys
run_dir, out_path, meta_json = sys.argv[1], sys.argv[2], sys.argv[3]
doc = json.loads(meta_json)
def load(path):
    try:
        with open(path) as fh:
            text = fh.read().strip()
        return json.loads(text) if text else None
    except (OSError, ValueError):
        return None
doc["metrics"] = load(os.path.join(run_dir, "metrics.json"))
doc["loadgen"] = {}
for name in doc["tenants"]:
    lg = load(os.path.join(run_dir, f"lg-{name}.json"))
    try:
        rc = int(open(os.path.join(run_dir, f"lg-{name}.rc")).read().strip())
    except (OSError, ValueError):
        rc = None
    if lg is None and rc is None:
        continue
    err = ""
    try:
        err = open(os.path.join(run_dir, f"lg-{name}.err")).read()[-2000:]
    except OSError:
        pass
    doc["loadgen"][name] = {"exit": rc, "json": lg, "stderr_tail": err}
with open(out_path, "w") as fh:
    json.dump(doc, fh, indent=1)
    fh.write("\n")
PY

DAEMON_PID=""
THREADS_NOW=$THREADS
ADMIN=""
TOKEN=""
declare -A TPORT=()   # tenant name -> tcp port of the running daemon

# write_config FILE WC "name:share ..."  (uses CAPACITY, BURST_BYTES, MAX_OUTSTANDING, MEMORY_MB)
write_config() {
    local file=$1 wc=$2 spec=$3 cap=${4:-$CAPACITY} burst=${5:-$BURST_BYTES} mo=${6:-$MAX_OUTSTANDING} mem=${7:-$MEMORY_MB}
    local n ports i=0 t name share
    n=$(wc -w <<<"$spec")
    read -r -a ports <<<"$(free_ports $((n + 1)))"
    ADMIN="127.0.0.1:${ports[$n]}"
    TOKEN="bench-$RANDOM$RANDOM"
    TPORT=()
    {
        printf '[server]\nlisten = "127.0.0.1"\nthreads = %s\nadmin = "%s"\nadmin_token = "%s"\n\n' "$THREADS_NOW" "$ADMIN" "$TOKEN"
        printf '[shaping]\negress_bytes_per_s = %s\ningress_bytes_per_s = %s\nwork_conserving = %s\n' "$cap" "$cap" "$wc"
        for t in $spec; do
            name=${t%%:*}; share=${t#*:}
            TPORT[$name]=${ports[$i]}
            printf '\n[[tenant]]\nname = "%s"\ntcp_port = %s\nmemory_mb = %s\nshare = %s\nburst_bytes = %s\nmax_outstanding = %s\n' \
                "$name" "${ports[$i]}" "$mem" "$share" "$burst" "$mo"
            i=$((i + 1))
        done
    } >"$file"
}

tenant_hint="the daemon does not (yet) accept the [[tenant]]/[shaping] config of .work/TENANT_CONTRACT.md"

# start_daemon CONFIG [pin...]: start, wait for every tenant port and the admin endpoint.
start_daemon() {
    local cfg=$1; shift
    "$@" "$SLIPSTREAM" serve --config "$cfg" >"$WORK/daemon.log" 2>&1 &
    DAEMON_PID=$!
    PIDS+=("$DAEMON_PID")
    local name
    for name in "${!TPORT[@]}"; do
        if ! wait_port "${TPORT[$name]}" "$START_TIMEOUT_S" "$DAEMON_PID"; then
            log "daemon log:"; sed 's/^/  /' "$WORK/daemon.log" >&2 || true
            log "config:"; sed 's/^/  /' "$cfg" >&2
            return 1
        fi
    done
    if ! wait_port "${ADMIN##*:}" "$START_TIMEOUT_S" "$DAEMON_PID"; then
        log "daemon log:"; sed 's/^/  /' "$WORK/daemon.log" >&2 || true
        return 1
    fi
    local m
    m=$(curl -s --max-time 5 -H "Authorization: Bearer $TOKEN" "http://$ADMIN/metrics" || true)
    if ! grep -q '^slipstream_tenant_bytes_out_total{' <<<"$m"; then
        log "admin /metrics has no slipstream_tenant_bytes_out_total{tenant=...} series"
        return 1
    fi
    return 0
}

stop_pid() { # pid: TERM, up to 5 s, then KILL
    local p=$1 i
    [[ -n "$p" ]] || return 0
    kill "$p" 2>/dev/null || true
    for i in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
}

stop_daemon() { stop_pid "$DAEMON_PID"; DAEMON_PID=""; }

# prefill NAME... : set every key of each named tenant (in parallel), fail on errors.
prefill() {
    local name pids=() names=() rc=0 i
    for name in "$@"; do
        timeout "$PREFILL_TIMEOUT_S" "$LOADGEN" --server "127.0.0.1:${TPORT[$name]}" --conns 1 --prefill \
            --value-bytes "$VALUE_BYTES" --keys "$KEYS" --ratio 0:1 --duration-s 0 --warmup-s 0 \
            >"$WORK/prefill-$name.json" 2>"$WORK/prefill-$name.err" &
        pids+=($!); names+=("$name"); PIDS+=($!)
    done
    for i in "${!pids[@]}"; do
        if ! wait "${pids[$i]}"; then
            log "prefill of tenant ${names[$i]} failed:"; sed 's/^/  /' "$WORK/prefill-${names[$i]}.err" >&2
            rc=1
        fi
    done
    return $rc
}

TENANTS_OK=1
# Up front: does this daemon take the tenant config at all?
check_tenant_support() {
    THREADS_NOW=1
    write_config "$WORK/probe.toml" false "probe0:0.5 probe1:0.5"
    if start_daemon "$WORK/probe.toml"; then
        # A tenant port must speak memcached.
        local reply
        reply=$(python3 - "${TPORT[probe0]}" <<'PY'
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=3)
s.sendall(b"set probe 0 0 1\r\nx\r\nget probe\r\n")
buf = b""
while not buf.endswith(b"END\r\n") and len(buf) < 4096:
    d = s.recv(4096)
    if not d:
        break
    buf += d
print(buf.decode("latin-1").replace("\r\n", "|"))
PY
        ) || reply=""
        stop_daemon
        [[ "$reply" == "STORED|VALUE probe 0 1|x|END|" ]] && return 0
        log "tenant port answered ${reply:-nothing} to set+get"
    else
        stop_daemon
    fi
    if [[ "$TENANTS_REQUIRED" == 1 ]]; then
        die "$tenant_hint (daemon: $SLIPSTREAM). Experiments a, b, c, e and the tenant leg of d need it; TENANTS_REQUIRED=0 skips them."
    fi
    log "WARNING: $tenant_hint; TENANTS_REQUIRED=0: skipping a, b, c, e and the tenant leg of d"
    TENANTS_OK=0
}

RUN_SEQ=0
# run_window EXP LABEL REPEAT DURATION PARAMS_JSON SPEC...
#   SPEC = name:closed | name:rate:R | name:idle   (idle tenants are listed, not loaded)
run_window() {
    local exp=$1 label=$2 rep=$3 dur=$4 params=$5; shift 5
    local rd="$WORK/run" spec name mode rate pids=() names=() start_ms background tenants_json="{" first=1
    rm -rf "$rd"; mkdir -p "$rd"
    RUN_SEQ=$((RUN_SEQ + 1))
    background=$(busy_half_s)
    start_ms=$(($(now_ms) + LEAD_MS))
    local lg_timeout
    lg_timeout=$(python3 -c "import math; print(math.ceil($WARMUP_S + $dur + $LEAD_MS / 1000) + 30)")
    timeout "$lg_timeout" python3 "$WORK/scrape.py" "$ADMIN" "$TOKEN" "$start_ms" "$WARMUP_S" "$dur" >"$rd/metrics.json" 2>"$rd/metrics.err" &
    local scraper=$!; PIDS+=("$scraper")
    for spec in "$@"; do
        name=${spec%%:*}; mode=${spec#*:}; rate=null
        [[ $first == 1 ]] || tenants_json+=","
        first=0
        case $mode in
            idle) tenants_json+="\"$name\":{\"mode\":\"idle\",\"rate_per_s\":null}"; continue ;;
            closed) extra=(--conns "$CONNS" --pipeline "$PIPELINE"); prio=("${OTHERS_PRIO[@]}") ;;
            rate:*) rate=${mode#rate:}; extra=(--conns "$ISO_CONNS" --pipeline 16 --rate-per-s "$rate"); prio=("${ISO_CLIENT_PRIO[@]}") ;;
            *) die "bad spec $spec" ;;
        esac
        tenants_json+="\"$name\":{\"mode\":\"${mode%%:*}\",\"rate_per_s\":$rate}"
        "${prio[@]}" timeout "$lg_timeout" "$LOADGEN" --server "127.0.0.1:${TPORT[$name]}" "${extra[@]}" --ratio 0:1 \
            --value-bytes "$VALUE_BYTES" --keys "$KEYS" --duration-s "$dur" --warmup-s "$WARMUP_S" \
            --seed "$((RUN_SEQ * 100 + ${#pids[@]}))" --server-pid "$DAEMON_PID" --start-at-unix-ms "$start_ms" \
            >"$rd/lg-$name.json" 2>"$rd/lg-$name.err" &
        pids+=($!); names+=("$name"); PIDS+=($!)
    done
    tenants_json+="}"
    local i rc
    for i in "${!pids[@]}"; do
        rc=0; wait "${pids[$i]}" || rc=$?
        echo "$rc" >"$rd/lg-${names[$i]}.rc"
        [[ $rc == 0 ]] || log "WARNING: loadgen for ${names[$i]} exited $rc ($exp $label): $(tail -c 300 "$rd/lg-${names[$i]}.err")"
    done
    wait "$scraper" || log "WARNING: /metrics scraper failed ($exp $label): $(tail -c 300 "$rd/metrics.err")"
    grep -q '"ok": true' "$rd/metrics.json" 2>/dev/null || log "WARNING: no /metrics deltas for $exp $label: $(cat "$rd/metrics.json" 2>/dev/null)"
    kill -0 "$DAEMON_PID" 2>/dev/null || die "the daemon died during $exp $label (log: $(tail -c 500 "$WORK/daemon.log"))"
    local meta
    meta=$(printf '{"experiment":"%s","label":"%s","repeat":%s,"duration_s":%s,"warmup_s":%s,"machine_busy_pct_before":%s,"params":%s,"tenants":%s}' \
        "$exp" "$label" "$rep" "$dur" "$WARMUP_S" "$background" "$params" "$tenants_json")
    python3 "$WORK/assemble.py" "$rd" "$RESULTS_DIR/$exp-$label-r$rep.json" "$meta"
    log "$exp $label r$rep done (machine ${background}% busy before)"
}

# Bytes of one get-hit reply: "VALUE key:NNNNNNNN 0 <len>\r\n<value>\r\nEND\r\n".
reply_bytes() { echo $(($1 + 30 + ${#1})); }

common_params() { # extra json fields
    printf '{"capacity_bytes_per_s":%s,"value_bytes":%s,"keys":%s,"conns":%s,"pipeline":%s,"server_threads":%s,"burst_bytes":%s,"max_outstanding":%s,"ncpu":%s%s}' \
        "$CAPACITY" "$VALUE_BYTES" "$KEYS" "$CONNS" "$PIPELINE" "$THREADS" "$BURST_BYTES" "$MAX_OUTSTANDING" "$NCPU" "${1:+,$1}"
}

if want a || want b || want c || want e || want d; then
    check_tenant_support
fi
THREADS_NOW=$THREADS

# ---- (a) scale-up and (c) isolation: one daemon, 8 x 12.5% -------------------------
if [[ $TENANTS_OK == 1 ]] && (want a || want c); then
    spec8=""; all8=()
    for i in $(seq 0 7); do spec8+=" t$i:0.125"; all8+=("t$i"); done
    write_config "$WORK/a.toml" false "$spec8"
    cp "$WORK/a.toml" "$RESULTS_DIR/config-8x12.5.toml"
    start_daemon "$WORK/a.toml" || die "$tenant_hint"
    log "prefilling 8 tenants ($KEYS keys x $VALUE_BYTES bytes each)"
    prefill "${all8[@]}" || die "prefill failed"
    shares='{"t0":0.125,"t1":0.125,"t2":0.125,"t3":0.125,"t4":0.125,"t5":0.125,"t6":0.125,"t7":0.125}'
    if want a; then
        for rep in $(seq "$REPEATS"); do
            for k in $(seq 1 8); do
                specs=()
                for i in $(seq 0 7); do
                    if ((i < k)); then specs+=("t$i:closed"); else specs+=("t$i:idle"); fi
                done
                run_window scaleup "k$k" "$rep" "$DURATION_S" "$(common_params "\"k\":$k,\"work_conserving\":false,\"shares\":$shares")" "${specs[@]}"
            done
        done
    fi
    if want c; then
        rb=$(reply_bytes "$VALUE_BYTES")
        rate=$(python3 -c "print(round($ISO_LOAD_PCT / 100 * 0.125 * $CAPACITY / $rb, 1))")
        log "isolation: t0 open loop at $rate req/s ($ISO_LOAD_PCT% of its egress share, $rb-byte replies)"
        for rep in $(seq "$REPEATS"); do
            idle=("t0:rate:$rate"); busy=("t0:rate:$rate")
            for i in $(seq 1 7); do idle+=("t$i:idle"); busy+=("t$i:closed"); done
            p="$(common_params "\"work_conserving\":false,\"shares\":$shares,\"iso_load_pct\":$ISO_LOAD_PCT,\"t0_rate_per_s\":$rate,\"iso_conns\":$ISO_CONNS")"
            run_window isolation others-idle "$rep" "$ISO_DURATION_S" "$p" "${idle[@]}"
            run_window isolation others-busy "$rep" "$ISO_DURATION_S" "$p" "${busy[@]}"
        done
    fi
    stop_daemon
fi

# ---- (b) shares: T0 = 50%, others 12.5%, tenants made busy one by one ----------------
if [[ $TENANTS_OK == 1 ]] && want b; then
    specb=""; namesb=(); sharesb="{"; i=0
    for s in $SHARES_B; do
        specb+=" t$i:$s"; namesb+=("t$i"); [[ $i == 0 ]] || sharesb+=","; sharesb+="\"t$i\":$s"; i=$((i + 1))
    done
    sharesb+="}"
    write_config "$WORK/b.toml" false "$specb"
    cp "$WORK/b.toml" "$RESULTS_DIR/config-shares.toml"
    start_daemon "$WORK/b.toml" || die "$tenant_hint (or SHARES_B=\"$SHARES_B\" was refused: shares must sum to <= 1)"
    prefill "${namesb[@]}" || die "prefill failed"
    n=${#namesb[@]}
    for rep in $(seq "$REPEATS"); do
        for k in $(seq 1 "$n"); do
            specs=()
            for i in $(seq 0 $((n - 1))); do
                if ((i < k)); then specs+=("t$i:closed"); else specs+=("t$i:idle"); fi
            done
            run_window shares "k$k" "$rep" "$DURATION_S" "$(common_params "\"k\":$k,\"work_conserving\":false,\"shares\":$sharesb")" "${specs[@]}"
        done
    done
    stop_daemon
fi

# ---- (e) work-conserving off / on ----------------------------------------------------
if [[ $TENANTS_OK == 1 ]] && want e; then
    sharese='{"t0":0.4,"t1":0.3,"t2":0.2,"t3":0.1}'
    for wc in false true; do
        write_config "$WORK/e.toml" "$wc" "t0:0.4 t1:0.3 t2:0.2 t3:0.1"
        cp "$WORK/e.toml" "$RESULTS_DIR/config-wc-$wc.toml"
        start_daemon "$WORK/e.toml" || die "$tenant_hint (work_conserving = $wc)"
        prefill t1 t3 || die "prefill failed"
        for rep in $(seq "$REPEATS"); do
            run_window wc "$([[ $wc == true ]] && echo on || echo off)" "$rep" "$DURATION_S" \
                "$(common_params "\"work_conserving\":$wc,\"shares\":$sharese")" t0:idle t1:closed t2:idle t3:closed
        done
        stop_daemon
    done
fi

# ---- (d) overhead: plain vs one unconstrained tenant vs memcached ----------------------
if want d; then
    d_pin_server=(); d_pin_client=(); pinned=false
    if [[ "$PIN" == 1 && "$D_THREADS" == 1 && "$NCPU" -ge 2 ]]; then
        d_pin_server=(taskset -c 0); d_pin_client=(taskset -c 1); pinned=true
    fi
    kinds="plain memcached"
    [[ $TENANTS_OK == 1 ]] && kinds="plain tenant memcached"
    d_timeout=$(python3 -c "import math; print(math.ceil($WARMUP_S + $D_DURATION_S) + 90)")
    for rep in $(seq "$D_REPEATS"); do
        for kind in $kinds; do
            background=$(busy_half_s)
            case $kind in
                plain)
                    port=$(free_ports 1)
                    "${d_pin_server[@]}" "$SLIPSTREAM" serve -l 127.0.0.1 -p "$port" -U 0 -t "$D_THREADS" -m 1024 -c 4096 \
                        >"$WORK/daemon.log" 2>&1 &
                    DAEMON_PID=$!; PIDS+=("$DAEMON_PID")
                    wait_port "$port" "$START_TIMEOUT_S" "$DAEMON_PID" || die "plain daemon did not listen: $(tail -c 500 "$WORK/daemon.log")"
                    ;;
                memcached)
                    port=$(free_ports 1)
                    "${d_pin_server[@]}" "$MEMCACHED" -u root -U 0 -l 127.0.0.1 -p "$port" -t "$D_THREADS" -m 1024 -c 4096 \
                        >"$WORK/daemon.log" 2>&1 &
                    DAEMON_PID=$!; PIDS+=("$DAEMON_PID")
                    wait_port "$port" "$START_TIMEOUT_S" "$DAEMON_PID" || die "memcached did not listen: $(tail -c 500 "$WORK/daemon.log")"
                    ;;
                tenant)
                    # Shaping on but never the limit: capacity 100 GB/s, 64 MiB bursts, room for
                    # every request the load keeps in flight.
                    THREADS_NOW=$D_THREADS
                    write_config "$WORK/d.toml" false "solo:1.0" 100000000000 67108864 4096 1024
                    cp "$WORK/d.toml" "$RESULTS_DIR/config-overhead-tenant.toml"
                    start_daemon "$WORK/d.toml" "${d_pin_server[@]}" || die "$tenant_hint (overhead tenant)"
                    port=${TPORT[solo]}
                    THREADS_NOW=$THREADS
                    ;;
            esac
            log "overhead: $kind r$rep (port $port, pid $DAEMON_PID, pinned=$pinned, machine ${background}% busy before)"
            rc=0
            out=$(timeout "$d_timeout" "${d_pin_client[@]}" "$LOADGEN" --server "127.0.0.1:$port" --conns "$D_CONNS" \
                --pipeline "$D_PIPELINE" --ratio "$D_RATIO" --value-bytes "$D_VALUE_BYTES" --keys "$D_KEYS" \
                --duration-s "$D_DURATION_S" --warmup-s "$WARMUP_S" --prefill --seed "$rep" \
                --server-pid "$DAEMON_PID" 2>"$WORK/d-loadgen.err") || rc=$?
            alive=true; kill -0 "$DAEMON_PID" 2>/dev/null || alive=false
            stop_daemon
            [[ $rc == 0 ]] || log "WARNING: loadgen exited $rc against $kind: $(tail -c 300 "$WORK/d-loadgen.err")"
            [[ -n "$out" ]] || out=null
            python3 - "$RESULTS_DIR/overhead-$kind-r$rep.json" "$kind" "$rep" "$rc" "$alive" "$background" "$pinned" \
                "$D_THREADS" "$D_CONNS" "$D_PIPELINE" "$D_VALUE_BYTES" "$D_KEYS" "$D_RATIO" "$D_DURATION_S" "$out" <<'PY'
import json, sys
(path, kind, rep, rc, alive, bg, pinned, threads, conns, pipeline, vb, keys, ratio, dur, out) = sys.argv[1:]
doc = {"experiment": "overhead", "label": kind, "repeat": int(rep), "duration_s": float(dur),
       "machine_busy_pct_before": float(bg),
       "params": {"server": kind, "server_threads": int(threads), "pinned": pinned == "true", "conns": int(conns),
                  "pipeline": int(pipeline), "value_bytes": int(vb), "keys": int(keys), "ratio": ratio,
                  "tenant_capacity_bytes_per_s": 100000000000 if kind == "tenant" else None},
       "tenants": {"main": {"mode": "closed", "rate_per_s": None}}, "metrics": None,
       "server_alive_after": alive == "true",
       "loadgen": {"main": {"exit": int(rc), "json": json.loads(out)}}}
with open(path, "w") as fh:
    json.dump(doc, fh, indent=1)
    fh.write("\n")
PY
        done
    done
fi

# ---- report ---------------------------------------------------------------------------
"$SLIPSTREAM" --version >"$RESULTS_DIR/versions.txt" 2>&1 || true
"$MEMCACHED" -V >>"$RESULTS_DIR/versions.txt" 2>&1 || true
python3 "$PLOT" summary "$RESULTS_DIR"
if python3 -c 'import matplotlib' 2>/dev/null; then
    python3 "$PLOT" plot "$RESULTS_DIR" || log "WARNING: plotting failed"
fi
log "done: $RESULTS_DIR"
