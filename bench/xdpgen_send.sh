#!/usr/bin/env bash
# xdpgen_send.sh — `slipstream send --kind words|numbers` for the benchmark drivers, played by
# the live-frame generator (`slipstream-loadgen xdp-gen --word-templates` / `--number-templates`,
# bpf/xdp_gen.c), so
# datagrams reach the server veth as frames from a NIC would (xdp_frames into its XDP hook),
# not as socket sends the veth must turn into skbs and back (bench/stream_cpu.sh, GEN=xdp).
#
# Usage: xdpgen_send.sh IFACE DST_MAC SRC_IP LOADGEN  SEND-OPTIONS...
#   IFACE DST_MAC SRC_IP: the client veth (this namespace), the server veth's MAC, our IPv4.
#   SEND-OPTIONS: what SparkBench passes to `send`: --to HOST:PORT --kind words|numbers
#   --rate-per-s R --duration-s S --records-per-datagram K --seed N; words: --expect-counts
#   FILE; numbers: --mean M --stddev D --decimals N --step-at-ms T --step-by X (--batch B
#   ignored: the live-frame flush size is XDPGEN_BATCH).
# The words: XDPGEN_TEMPLATES [256] datagrams, the first that `send` builds with the same seed
# and options, sent round-robin (a bounded sample of the Zipf stream, exact multiset in FILE).
# The numbers: XDPGEN_NUMBER_TEMPLATES [128] datagrams of send's series, and with a step as
# many more shifted by X from frame ceil(R x T / 1000) on (the first datagram `send` would
# shift at that rate); the JSON line carries step_sent_mono_ns as send's does.
# Exactly R x S datagrams, in bursts of XDPGEN_BURST [32] (under the veth's 256-frame ring).
# Prints one JSON line with send's fields (datagrams, records, elapsed_s, rate_per_s) and
# xdp-gen's own.
set -euo pipefail
[[ $# -ge 4 ]] || { echo "usage: $0 IFACE DST_MAC SRC_IP LOADGEN SEND-OPTIONS..." >&2; exit 2; }
IFACE=$1 MAC=$2 SRC=$3 LOADGEN=$4
shift 4
to="" kind="" rate="" dur="" k="" seed=1 expect="" step_ms="" step_by=""
num_args=()
while [[ $# -gt 0 ]]; do
    [[ $# -ge 2 ]] || { echo "xdpgen_send: $1 needs a value" >&2; exit 2; }
    case "$1" in
        --to) to=$2 ;;
        --kind) kind=$2 ;;
        --rate-per-s) rate=$2 ;;
        --duration-s) dur=$2 ;;
        --records-per-datagram) k=$2 ;;
        --seed) seed=$2 ;;
        --expect-counts) expect=$2 ;;
        --mean | --stddev | --decimals) num_args+=("$1" "$2") ;;
        --step-at-ms) step_ms=$2 ;;
        --step-by) step_by=$2 ;;
        --batch) ;;
        *) echo "xdpgen_send: option $1 not supported" >&2; exit 2 ;;
    esac
    shift 2
done
[[ -n "$to" && -n "$rate" && -n "$dur" && "$rate" -gt 0 ]] || { echo "xdpgen_send: needs --to, --rate-per-s > 0, --duration-s" >&2; exit 2; }
count=$(python3 -c "print(int(round($rate * $dur)))")
case "$kind" in
    words)
        tpl_args=(--word-templates "${XDPGEN_TEMPLATES:-256}" --records-per-datagram "${k:-16}")
        [[ -n "$expect" ]] && tpl_args+=(--expect-counts "$expect")
        ;;
    numbers)
        tpl_args=(--number-templates "${XDPGEN_NUMBER_TEMPLATES:-128}" --records-per-datagram "${k:-1}" "${num_args[@]}")
        if [[ -n "$step_ms" ]]; then
            tpl_args+=(--step-at-frame "$(python3 -c "import math; print(math.ceil($rate * $step_ms / 1000))")" --step-by "$step_by")
        fi
        ;;
    *) echo "xdpgen_send: --kind words or numbers (got '$kind')" >&2; exit 2 ;;
esac
out=$("$LOADGEN" xdp-gen --iface "$IFACE" --dst-mac "$MAC" --src "$SRC" --dst "${to%:*}" --dport "${to##*:}" \
    "${tpl_args[@]}" --seed "$seed" \
    --rate-per-s "$rate" --count "$count" --burst "${XDPGEN_BURST:-32}" --batch "${XDPGEN_BATCH:-64}" \
    --warmup-s 0 --duration-s "$(python3 -c "print($dur + 60)")")
python3 -c '
import json, sys
g = json.loads(sys.argv[1])
e = g["elapsed_s"]
g.update(kind=sys.argv[2], datagrams=g["sent_total"], rate_per_s=g["sent_total"] / e if e > 0 else 0.0, send_errors=0)
print(json.dumps(g))' "$out" "$kind"
