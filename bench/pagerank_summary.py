#!/usr/bin/env python3
"""Summary of `PAGERANK=1 bench/shuffle_bench.sh`'s rounds (RESULTS_DIR/pagerank.jsonl) into
summary.md: per manager the median over all measured rounds (warm-up rounds left out) of each
round's per-iteration time (the median of iterations 1..n-1: iteration 0 also builds the initial
rank graph), iteration 0, the whole PageRank call, the iteration jobs' task CPU, shuffle write and
fetch wait per iteration, and host CPU-seconds per run over all JVMs plus the daemon; then each
manager against the sort shuffle and the tuned sort shuffle, the per-iteration time paired by
invocation (same driver run), and whether every round's ranks matched the first one's.

Usage: pagerank_summary.py RESULTS_DIR
"""

import json
import os
import statistics
import sys

from shuffle_summary import MANAGERS, invocation_table


def per_round(r):
    """The round's figures: per-iteration ms (iterations 1..), iteration 0, whole call, per-iteration means."""
    it = r["iter_ms"]
    n = max(1, len(it))
    return {
        "iter_ms": statistics.median(it[1:]) if len(it) > 1 else float("nan"),
        "iter0_ms": it[0] if it else float("nan"),
        "pagerank_ms": r["pagerank_ms"],
        "iter_cpu_ms": sum(r["iter_cpu_ms"][1:]) / max(1, n - 1),
        "iter_write_mb": sum(r["iter_shuffle_write_bytes"][1:]) / max(1, n - 1) / 1e6,
        "iter_fetch_wait_ms": sum(r["iter_fetch_wait_ms"][1:]) / max(1, n - 1),
        "host_cpu_s": r["host_cpu_s"],
    }


KEYS = ("iter_ms", "iter0_ms", "pagerank_ms", "iter_cpu_ms", "iter_write_mb", "iter_fetch_wait_ms", "host_cpu_s")


def main(out):
    rows = [json.loads(line) for line in open(os.path.join(out, "pagerank.jsonl")) if line.strip()]
    at = [r for r in rows if not r["warmup"]]
    if not at:
        print("no measured rounds")
        return
    g = at[0]
    lines = ["### PageRank, %d iterations, %d vertices, %d edges, %d partitions (logNormalGraph mu %s sigma %s, "
             "in-degree skew %s, seed %d, kryo %s), %s" % (g["iterations"], g["vertices"], g["edges"], g["parts"],
                                                            g["mu"], g["sigma"], g["skew"], g["seed"], g["kryo"],
                                                            g["master"]), "",
             "| manager | rounds | per-iteration ms (median of iterations 1..) | iteration 0 ms | PageRank call ms "
             "| task CPU ms per iteration | shuffle write MB per iteration | fetch wait ms per iteration "
             "| host CPU-s per run | per-iteration ms, every round |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    med = {}
    for m in MANAGERS:
        rs = [per_round(x) for x in at if x["manager"] == m]
        if not rs:
            continue
        med[m] = {k: statistics.median(x[k] for x in rs) for k in KEYS}
        lines.append("| %s | %d | %.0f | %.0f | %.0f | %.0f | %.1f | %.0f | %.1f | %s |" % (
            m, len(rs), med[m]["iter_ms"], med[m]["iter0_ms"], med[m]["pagerank_ms"], med[m]["iter_cpu_ms"],
            med[m]["iter_write_mb"], med[m]["iter_fetch_wait_ms"], med[m]["host_cpu_s"],
            ", ".join("%.0f" % x["iter_ms"] for x in rs)))
    lines.append("")
    for a, b in (("slipstream", "sort"), ("slipstream", "tuned"), ("tuned", "sort")):
        if a in med and b in med:
            lines.append("%s / %s: " % (a, b) + ", ".join(
                "%s %.2f" % (k, med[a][k] / med[b][k]) for k in KEYS if med[b][k] > 0) + "  ")
    # Where an iteration's time goes: its job's stages that ran (map sides of the two shuffles,
    # then the result stage), median per position over iterations 1.. of every measured round.
    lines += ["", "| manager | iteration stages' wall ms (median per stage, in stage order) |", "|---|---|"]
    for m in MANAGERS:
        lists = [st for x in at if x["manager"] == m for st in x.get("iter_stage_ms", [])[1:]]
        width = statistics.mode(len(st) for st in lists) if lists else 0
        lists = [st for st in lists if len(st) == width]
        if lists:
            lines.append("| %s | %s |" % (m, " + ".join("%.0f" % statistics.median(st[i] for st in lists)
                                                          for i in range(width))))
    lines += invocation_table(at, "per-iteration ms", lambda x: per_round(x)["iter_ms"])
    bad = [r for r in rows if not r["ranks_match"]]
    # Each driver run compares with its own first round; across runs the sums and top vertices.
    sums = [r["rank_sum"] for r in rows]
    spread = (max(sums) - min(sums)) / max(1.0, abs(max(sums)))
    tops = {tuple(r["top_ids"]) for r in rows}
    lines += ["", "ranks: %d of %d rounds (warm-up included) match the first round's sum, fixed vertices and top 5 "
              "within 1e-9 relative (largest difference %.1e); rank sum %.6f, top vertices %s" % (
                  len(rows) - len(bad), len(rows), max(r["max_rel_diff"] for r in rows), g["rank_sum"], g["top_ids"]),
              "across invocations: rank sums within %.1e relative, %s" % (
                  spread, "one top-5 list" if len(tops) == 1 else "top-5 lists DIFFER: %s" % sorted(tops)), ""]
    text = "\n".join(lines) + "\n"
    open(os.path.join(out, "summary.md"), "w").write(text)
    print(text)


if __name__ == "__main__":
    main(sys.argv[1])
