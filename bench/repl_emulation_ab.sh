#!/usr/bin/env bash
# repl_emulation_ab.sh — the replication benchmarks with and without emulated machines
# (bench/cpugroups.py: each daemon in its own cpu cgroup with NODE_CPU cores, the load
# generators in a clients' group with CLIENT_CPU cores), in alternated pairs: REPEATS times
# emulated, then plain. Both kinds run at the same CPU_SHARES, so the only difference is the
# quotas. BENCH selects what runs:
#   sets       (default) bench/replication_bench.sh's spread and oneleader runs per value size
#              in SIZES (the order of the two layouts alternates too); raw JSON lines to
#              OUT_DIR/<size>.jsonl, a table on stdout (bench/repl_emulation_table.py)
#   failover   bench/failover_bench.py (KILLS, default 20; TIMINGS, default "100/10/3");
#              output to OUT_DIR/failover-<kind>-<n>.{out,json,png}
#   isolation  bench/isolation_bench.py (POINTS, default "0 7 0 7 0 7"); output to
#              OUT_DIR/isolation-<kind>-<n>.{out,json,png}
# Env: BENCH, SIZES ("16 64 1024"), REPEATS (3 for sets, 2 otherwise), NODE_CPU (0.5),
# CLIENT_CPU (0.5), CPU_SHARES (65536), DURATION_S (5 for sets, 8 for isolation), FSYNC
# (batch), OUT_DIR (bench/results/repl-emulation-<date>), PNG (sets: the ratio plot, default
# OUT_DIR/spread.png), SLIPSTREAM_BIN, PLAIN_NODE_CPU (max:
# the plain runs' daemons in per-node groups without quotas; empty = one group for all).
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH=${BENCH:-sets}
SIZES=${SIZES:-16 64 1024}
OUT_DIR=${OUT_DIR:-bench/results/repl-emulation-$(date -u +%Y%m%dT%H%MZ)}
export CLIENT_CPU=${CLIENT_CPU:-0.5} CPU_SHARES=${CPU_SHARES:-65536}
mkdir -p "$OUT_DIR"
# Plain runs put each daemon in its own cpu group without a quota (NODE_CPU=max: counted,
# not limited), so both kinds report per-node CPU seconds.
kinds=("${NODE_CPU:-0.5}" "${PLAIN_NODE_CPU-max}")
i=0
case $BENCH in
    sets)
        for size in $SIZES; do
            for r in $(seq 1 "${REPEATS:-3}"); do
                for emu in "${kinds[@]}"; do
                    if [ $((i % 2)) = 0 ]; then layouts="spread one"; else layouts="one spread"; fi
                    i=$((i + 1))
                    echo "size $size repeat $r node_cpu '${emu}' layouts '$layouts' $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
                    NO_BUILD=1 VALUE_BYTES=$size RUNS=spread LAYOUTS=$layouts NODE_CPU=$emu \
                        DURATION_S=${DURATION_S:-5} bash bench/replication_bench.sh >> "$OUT_DIR/$size.jsonl"
                done
            done
        done
        PNG=${PNG:-$OUT_DIR/spread.png} python3 bench/repl_emulation_table.py "$OUT_DIR"/*.jsonl
        ;;
    failover | isolation)
        for r in $(seq 1 "${REPEATS:-2}"); do
            for emu in "${kinds[@]}"; do
                kind=plain; [ -z "$emu" ] || [ "$emu" = max ] || kind=emulated
                base=$OUT_DIR/$BENCH-$kind-$r
                echo "$BENCH repeat $r $kind $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
                if [ "$BENCH" = failover ]; then
                    NODE_CPU=$emu KILLS=${KILLS:-20} TIMINGS=${TIMINGS:-100/10/3} OUT=$base.json PNG=$base.png \
                        python3 bench/failover_bench.py > "$base.out" 2>&1 || { tail -20 "$base.out" >&2; exit 1; }
                    grep -E "^#|failover p50|node down" "$base.out" >&2
                else
                    NODE_CPU=$emu POINTS=${POINTS:-0 7 0 7 0 7} DURATION_S=${DURATION_S:-8} OUT=$base.json PNG=$base.png \
                        python3 bench/isolation_bench.py > "$base.out" 2>&1 || { tail -20 "$base.out" >&2; exit 1; }
                    grep -E "^#|readers: t0" "$base.out" >&2
                fi
            done
        done
        ;;
    *) echo "BENCH: sets, failover or isolation" >&2; exit 2 ;;
esac
