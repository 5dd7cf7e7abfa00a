#!/usr/bin/env bash
# repl_emulation_ab.sh — leaders spread vs all on one node (bench/replication_bench.sh's spread
# and oneleader runs), with and without emulated machines (bench/cpugroups.py: each daemon in
# its own cpu cgroup with NODE_CPU cores, the load generators in a clients' group), in
# alternated pairs: for each value size, REPEATS times: emulated, then plain (the order of the
# two layouts alternates too). Both kinds run at the same CPU_SHARES, so the only difference is
# the quotas. Raw JSON lines to OUT_DIR/<size>.jsonl (each carries "node_cpu", load1 and the
# groups' CPU seconds), a table on stdout (bench/repl_emulation_table.py).
# Env: SIZES ("16 64 1024"), REPEATS (3), NODE_CPU (0.5), CLIENT_CPU (0.5), CPU_SHARES (65536),
# DURATION_S (5), FSYNC (batch), OUT_DIR (bench/results/repl-emulation-<date>), SLIPSTREAM_BIN.
set -euo pipefail
cd "$(dirname "$0")/.."
SIZES=${SIZES:-16 64 1024}
REPEATS=${REPEATS:-3}
OUT_DIR=${OUT_DIR:-bench/results/repl-emulation-$(date -u +%Y%m%dT%H%MZ)}
mkdir -p "$OUT_DIR"
i=0
for size in $SIZES; do
    for r in $(seq 1 "$REPEATS"); do
        for emu in "${NODE_CPU:-0.5}" ""; do
            if [ $((i % 2)) = 0 ]; then layouts="spread one"; else layouts="one spread"; fi
            i=$((i + 1))
            echo "size $size repeat $r node_cpu '${emu}' layouts '$layouts' $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
            NO_BUILD=1 VALUE_BYTES=$size RUNS=spread LAYOUTS=$layouts NODE_CPU=$emu CLIENT_CPU=${CLIENT_CPU:-0.5} \
                CPU_SHARES=${CPU_SHARES:-65536} DURATION_S=${DURATION_S:-5} bash bench/replication_bench.sh >> "$OUT_DIR/$size.jsonl"
        done
    done
done
python3 bench/repl_emulation_table.py "$OUT_DIR"/*.jsonl
