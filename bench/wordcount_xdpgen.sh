#!/usr/bin/env bash
# wordcount_xdpgen.sh — the XDP word-count engine's highest exact datagram rate, offered by the
# live-frame generator (`slipstream-loadgen xdp-gen`, bpf/xdp_gen.c) instead of a socket sender.
#
# Why: the stream and Spark benchmarks' socket generator tops out near 200k datagrams/s on this
# 2-core machine, below what the XDP engine takes, so their XDP figures are lower bounds. This
# one sends real frames from one core at up to a few million per second.
#
# What it does: a server and a client namespace joined by a veth pair; the daemon runs in the
# server namespace with one wordcount stream (engine = "xdp", WINDOW_MS windows) on the server
# veth; its NAPI kthread is pinned to CPU 0, the generator to CPU 1. For each rate in RATES
# (0 = as fast as the generator goes) the generator sends exactly COUNT_S x rate datagrams of
# the same WORDS distinct words; a subscriber sums every window's counts. A rate is exact when
# every word's count equals the datagrams sent and no other word appears. Prints one line per
# rate and writes RESULTS_DIR/wordcount_xdpgen.json.
#
# Needs root. Not for: the Spark side (bench/spark_bench.sh) or change-point latency.
# Knobs [defaults]: RATES ["100000 150000 200000 300000 0"] COUNT_S [3] WORDS [16]
#   WINDOW_MS [100] SKIP_BUILD [0] RESULTS_DIR [bench/results] CARGO_TARGET_DIR [target]
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RATES=${RATES:-"100000 150000 200000 300000 0"}
COUNT_S=${COUNT_S:-3}
WORDS=${WORDS:-16}
WINDOW_MS=${WINDOW_MS:-100}
SKIP_BUILD=${SKIP_BUILD:-0}
RESULTS_DIR=${RESULTS_DIR:-$ROOT/bench/results}
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
SLIPSTREAM=$TARGET_DIR/release/slipstream
LOADGEN=$TARGET_DIR/release/slipstream-loadgen
TAG=$$
SRV=wgsrv$TAG
CLI=wgcli$TAG
VS=wgs$TAG
VC=wgc$TAG
V4S=10.207.0.1
V4C=10.207.0.2
UDP_PORT=23400
RES_PORT=23401
KV_PORT=23402

log() { echo "[wordcount_xdpgen] $*" >&2; }
die() { log "error: $*"; exit 1; }
if [ "$(id -u)" != 0 ]; then echo "SKIP: bench/wordcount_xdpgen.sh needs root"; exit 0; fi

if [ "$SKIP_BUILD" != 1 ]; then
    (cd "$ROOT" && timeout 1800 cargo build --release --quiet -p slipstream -p slipstream-loadgen)
fi
PASS_OBJ=$(ls -t "$TARGET_DIR"/release/build/slipstream-fastpath-*/out/xdp_pass.o 2>/dev/null | head -n1)
[ -n "$PASS_OBJ" ] || die "no xdp_pass.o (build slipstream-fastpath)"

DAEMON=""
WORK=$(mktemp -d)
RCU_BEFORE=$(cat /sys/kernel/rcu_expedited 2>/dev/null || echo "")
cleanup() {
    if [ -n "$DAEMON" ]; then kill "$DAEMON" 2>/dev/null || true; wait "$DAEMON" 2>/dev/null || true; fi
    ip netns del "$SRV" 2>/dev/null || true
    ip netns del "$CLI" 2>/dev/null || true
    if [ -n "$RCU_BEFORE" ]; then echo "$RCU_BEFORE" > /sys/kernel/rcu_expedited 2>/dev/null || true; fi
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

. "$ROOT/bench/netns.sh"
veth_namespaces "$SRV" "$CLI" "$VS" "$VC" "$V4S" "$V4C"
# See bench/xdp_bench.sh: without this every generator call sleeps through an RCU grace period.
echo 1 > /sys/kernel/rcu_expedited
ip -n "$CLI" link set dev "$VC" xdpdrv obj "$PASS_OBJ" sec xdp
cat > "$WORK/stream.toml" <<EOF
[results]
tcp_port = $RES_PORT

[[stream]]
name = "words"
udp_port = $UDP_PORT
operator = "wordcount"
window_ms = $WINDOW_MS
engine = "xdp"
EOF
ip netns exec "$SRV" taskset -c 0 "$SLIPSTREAM" serve -l 0.0.0.0 -p $KV_PORT --config "$WORK/stream.toml" --xdp "$VS" \
    > "$WORK/daemon.log" 2>&1 &
DAEMON=$!
for _ in $(seq 1 100); do
    ip netns exec "$SRV" bash -c "exec 3<>/dev/tcp/127.0.0.1/$RES_PORT" 2>/dev/null && break
    sleep 0.1
done
grep -q "kernel fast path on" "$WORK/daemon.log" || log "daemon log: $(cat "$WORK/daemon.log")"
ip netns exec "$SRV" sh -c "echo 1 > /sys/class/net/$VS/threaded"
for p in $(ps -eo pid=,comm= | awk -v d="napi/$VS-" 'index($2, d) == 1 {print $1}'); do taskset -pc 0 "$p" >/dev/null; done
SRV_MAC=$(ip netns exec "$SRV" cat "/sys/class/net/$VS/address")
PAYLOAD=$(python3 -c "print(' '.join('word%02d' % i for i in range($WORDS)))")

: > "$WORK/rows.jsonl"
for rate in $RATES; do
    if [ "$rate" = 0 ]; then count=$((3000000 * COUNT_S)); else count=$((rate * COUNT_S)); fi
    # Subscriber in the server namespace; it sums counts until WINDOW_MS x 20 pass with no news.
    ip netns exec "$SRV" python3 - "$RES_PORT" "$WORK/sub.json" <<'PYEOF' &
import json, socket, sys, time
port, out = int(sys.argv[1]), sys.argv[2]
s = socket.create_connection(("127.0.0.1", port), timeout=5)
s.sendall(b"SUBSCRIBE words FROM LATEST\n")
s.settimeout(0.2)
counts, buf, last, start = {}, b"", time.monotonic(), time.monotonic()
while time.monotonic() - start < 120:
    try:
        chunk = s.recv(1 << 20)
    except socket.timeout:
        chunk = None
    if chunk:
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            try:
                l = json.loads(line)
            except ValueError:
                continue
            if l.get("type") == "wordcount":
                last = time.monotonic()
                for w, n in l["counts"].items():
                    counts[w] = counts.get(w, 0) + n
    if counts and time.monotonic() - last > 2.0:
        break
    if chunk == b"":
        break
json.dump(counts, open(out, "w"))
PYEOF
    SUB=$!
    sleep 0.5
    gen=$(ip netns exec "$CLI" taskset -c 1 "$LOADGEN" xdp-gen --iface "$VC" --dst-mac "$SRV_MAC" --src $V4C \
        --dst $V4S --dport $UDP_PORT --payload "$PAYLOAD" --rate-per-s "$rate" --count "$count" \
        --burst 128 --duration-s 600 --warmup-s 0) || die "generator failed"
    wait "$SUB" || true
    python3 - "$gen" "$WORK/sub.json" "$WORDS" "$rate" "$count" >> "$WORK/rows.jsonl" <<'PYEOF'
import json, sys
gen, counts, words, rate, count = json.loads(sys.argv[1]), json.load(open(sys.argv[2])), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
want = {"word%02d" % i: gen["sent_total"] for i in range(words)}
exact = counts == want
row = {"offered_rate_per_s": rate, "sent": gen["sent_total"], "sent_per_s": gen["sent_per_s"],
       "exact": exact, "min_count": min(counts.values()) if counts else 0, "words_seen": len(counts),
       "lost_datagrams": gen["sent_total"] - (min(counts.values()) if counts else 0)}
print(json.dumps(row))
PYEOF
    log "$(tail -n1 "$WORK/rows.jsonl") veth: $(ip -n "$SRV" -s link show dev "$VS" | awk '/RX:/{getline; print "rx " $2 " dropped " $4}')"
done
mkdir -p "$RESULTS_DIR"
python3 -c "
import json, sys
rows = [json.loads(l) for l in open('$WORK/rows.jsonl') if l.strip()]
best = max([r['sent_per_s'] for r in rows if r['exact']] or [0])
json.dump({'rows': rows, 'highest_exact_sent_per_s': best, 'words_per_datagram': $WORDS, 'window_ms': $WINDOW_MS},
          open('$RESULTS_DIR/wordcount_xdpgen.json', 'w'), indent=1)
print('highest exact rate: %.0f datagrams/s (%d words each)' % (best, $WORDS))
"
