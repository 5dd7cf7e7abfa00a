#!/usr/bin/env bash
# stream_rx_profile.sh — profile the receive CPU during one bench/stream_cpu.sh run (issue 12):
# `perf record -C RX_CPU -g -e cpu-clock` for PERF_S seconds from the start, a /proc/kallsyms
# snapshot of the BPF images once the daemon's XDP program (slipstream_xdp) is attached, and
# the xlated dump with source lines, then bench/stream_rx_profile.py on them.
# Usage (root): [PERF_S=75] [OUT=dir] bash bench/stream_rx_profile.sh   plus stream_cpu.sh's
# knobs in the environment (default here: GEN=xdp WC_RATE=10000 PARTS=wc SETUPS=xdp RUNS=3).
# Output: OUT (default /tmp/stream-rx-profile-<UTC>): perf.data, kallsyms, xlated.txt,
# profile.txt, the stream_cpu.sh results under OUT/run.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-/tmp/stream-rx-profile-$(date -u +%Y%m%dT%H%M%SZ)}"
PERF_S="${PERF_S:-75}"
mkdir -p "$OUT"
command -v perf >/dev/null || { echo "stream_rx_profile: needs perf" >&2; exit 1; }
export GEN="${GEN:-xdp}" WC_RATE="${WC_RATE:-10000}" PARTS="${PARTS:-wc}" SETUPS="${SETUPS:-xdp}" RUNS="${RUNS:-3}"
export STEP_S="${STEP_S:-10}" IDLE_S="${IDLE_S:-5}" RESULTS_DIR="$OUT/run"
perf record -C "${RX_CPU:-0}" -g -e cpu-clock -o "$OUT/perf.data" -- sleep "$PERF_S" >"$OUT/perf.log" 2>&1 &
PERF_PID=$!
(
    # Bounded: up to 120 s for the program to be attached.
    for _ in $(seq 1 120); do
        id=$(bpftool prog show 2>/dev/null | awk -F: '/ name slipstream_xdp / {print $1; exit}')
        if [[ -n "$id" ]]; then
            sleep 2
            grep bpf_prog_ /proc/kallsyms >"$OUT/kallsyms"
            bpftool prog dump xlated id "$id" linum >"$OUT/xlated.txt" 2>&1 || true
            exit 0
        fi
        sleep 1
    done
) &
SNAP_PID=$!
bash "$ROOT/bench/stream_cpu.sh" >"$OUT/stream_cpu.out" 2>&1 || echo "stream_cpu.sh failed: see $OUT/stream_cpu.out"
wait "$SNAP_PID" || true
wait "$PERF_PID" || true
python3 "$ROOT/bench/stream_rx_profile.py" "$OUT/perf.data" "$OUT/kallsyms" | tee "$OUT/profile.txt"
echo "profile: $OUT"
