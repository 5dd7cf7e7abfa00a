#!/usr/bin/env python3
"""shuffle_ab_table.py DIR NAME... — alternated invocations of bench/shuffle_bench.sh side by side.

Each NAME is one invocation's RESULTS_DIR under DIR (one manager and jar per invocation, e.g.
A1 B1 B2 A2 for an A/B in the order A B B A, or S1 T1 N1 N2 T2 S2 for a pairing). Prints every
measured round's reduce stage ms, reduce task CPU ms (Spark's executorCpuTime summed over the
stage) and job ms per invocation, then the medians per label (the NAME without its trailing
digits) over all of that label's rounds. Warm-up rounds are left out. Not for: one invocation's
summary (bench/shuffle_summary.py writes it into each RESULTS_DIR).
"""
import json
import os
import statistics
import sys


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    base = sys.argv[1]
    labels = {}
    for name in sys.argv[2:]:
        with open(os.path.join(base, name, "shuffle.jsonl")) as f:
            rows = [r for r in (json.loads(line) for line in f if line.startswith("{")) if not r.get("warmup")]
        if not rows:
            sys.exit(f"{name}: no measured round")
        stage = [r["reduce_stage_ms"] for r in rows]
        cpu = [r["reduce_cpu_ms"] for r in rows]
        job = [r["job_ms"] for r in rows]
        groups = sorted({r.get("groups") for r in rows})
        print(f"{name} {rows[0]['manager']}: reduce stage {stage} task CPU {cpu} job {job} groups {groups}")
        acc = labels.setdefault(name.rstrip("0123456789"), {"stage": [], "cpu": [], "job": []})
        acc["stage"] += stage
        acc["cpu"] += cpu
        acc["job"] += job
    for label, acc in labels.items():
        print(f"{label}: {len(acc['stage'])} rounds, median reduce stage {statistics.median(acc['stage']):.1f} ms, "
              f"task CPU {statistics.median(acc['cpu']):.1f} ms, job {statistics.median(acc['job']):.1f} ms")


if __name__ == "__main__":
    main()
