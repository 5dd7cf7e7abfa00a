#!/usr/bin/env bash
# stream_cpu_curve.sh — host CPU-seconds per million input words as a function of words per
# datagram (issue 12), for all three setups of bench/stream_cpu.sh (plain Spark, Slipstream user
# space -> Spark, Slipstream XDP -> Spark), at one offered WORD rate: for each K in WORDS_LIST
# the datagram rate is WORD_RATE / K (rounded), so every point offers the same words per second
# and only the datagram size changes. A real sender fills its datagrams; the 16-word point is
# the benchmark's usual shape. Every point is one stream_cpu.sh run (word count only, the
# live-frame generator, RUNS runs per setup, the last reported), exactness checked as there.
# Passes alternate the order of the shapes (odd passes ascending, even passes descending) so a
# drift in the machine's load does not line up with the shape.
#
# Usage (root): [WORDS_LIST="16 64 150 256"] [WORD_RATE=160000] [PASSES=1] [OUT=dir]
#   bash bench/stream_cpu_curve.sh      (plus stream_cpu.sh's knobs: RUNS, STEP_S, IDLE_S, SETUPS)
# Output: OUT (default bench/results/stream-cpu-curve-<UTC>/): one stream_cpu.sh result directory
# per point (w<K>-p<pass>/), then curve.md and curve.png from bench/stream_cpu_plot.py.
# About 3.5 minutes per point with the defaults.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORDS_LIST="${WORDS_LIST:-16 64 150 256}"
WORD_RATE="${WORD_RATE:-160000}"
PASSES="${PASSES:-1}"
OUT="${OUT:-$ROOT/bench/results/stream-cpu-curve-$(date -u +%Y%m%dT%H%M%SZ)}"
export GEN=xdp PARTS=wc RUNS="${RUNS:-3}" STEP_S="${STEP_S:-10}" IDLE_S="${IDLE_S:-5}"
mkdir -p "$OUT"
built=0
for pass in $(seq 1 "$PASSES"); do
    ks=$WORDS_LIST
    if ((pass % 2 == 0)); then
        ks=$(echo "$WORDS_LIST" | tr ' ' '\n' | tac | tr '\n' ' ')
    fi
    for k in $ks; do
        rate=$(( (WORD_RATE + k / 2) / k ))
        echo "== pass $pass: $k words per datagram at $rate datagrams/s ($((rate * k)) words/s), $(date -u +%H:%M:%S), load $(cut -d' ' -f1-3 /proc/loadavg)"
        SKIP_BUILD=$([[ $built == 1 ]] && echo 1 || echo "${SKIP_BUILD:-0}") WC_WORDS="$k" WC_RATE="$rate" \
            RESULTS_DIR="$OUT/w$k-p$pass" bash "$ROOT/bench/stream_cpu.sh" >"$OUT/w$k-p$pass.out" 2>&1 ||
            echo "stream_cpu.sh failed for $k words (pass $pass): see $OUT/w$k-p$pass.out"
        built=1
    done
done
python3 "$ROOT/bench/stream_cpu_plot.py" "$OUT"
echo "curve: $OUT"
