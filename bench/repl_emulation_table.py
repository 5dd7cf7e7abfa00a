#!/usr/bin/env python3
"""repl_emulation_table.py — the table of bench/repl_emulation_ab.sh: per value size and kind
(emulated machines or plain), each invocation's summed sets/s of the spread and one-leader
layouts, their ratio, the load average, and the node groups' CPU seconds.

Reads the JSON lines of bench/replication_bench.sh (files given on the command line). With
PNG=<path> also plots each pair's spread/one-leader ratio per value size and kind, with the
issue's 1.5x target.
Not for: running anything."""

import collections
import json
import os
import statistics
import sys


def main(paths):
    points = collections.defaultdict(list)  # (kind, size) -> ratios
    for path in paths:
        # One invocation (RUNS=spread) = a spread run and a oneleader run, 3 loadgen lines each.
        lines = [json.loads(x) for x in open(path) if x.startswith("{")]
        runs = [lines[i:i + 3] for i in range(0, len(lines) - 2, 3)]
        invs = [{g[0]["run"]: {"lines": g, "node_cpu": g[0]["node_cpu"]} for g in runs[i:i + 2]}
                for i in range(0, len(runs) - 1, 2)]
        ratios = collections.defaultdict(list)
        for inv in invs:
            if "spread" not in inv or "oneleader" not in inv:
                continue
            row = {}
            for r in ("spread", "oneleader"):
                ls = inv[r]["lines"]
                row[r] = sum(x["result"]["ops_per_s"] for x in ls)
                row[r + "_p99"] = max(x["result"]["lat_ns"]["p99"] for x in ls) / 1e6
                row[r + "_load"] = ls[0]["load1"]
                row[r + "_err"] = sum(x["result"]["errors"] for x in ls)
                cg = ls[0]["cpu_groups"]
                row[r + "_cg"] = " ".join("%s %.2f/%.2f" % (g, v["cpu_s"], v["throttled_s"]) for g, v in cg.items()
                                          if g.startswith("node"))
            emu = inv["spread"]["node_cpu"] not in ("", "max")  # "max": per-node groups, no quota
            kind = "emulated %s" % inv["spread"]["node_cpu"] if emu else "plain"
            ratio = row["spread"] / row["oneleader"] if row["oneleader"] else float("nan")
            ratios[kind].append(ratio)
            size = inv["spread"]["lines"][0]["value_bytes"]
            points[(kind, size)].append(ratio)
            print("%5d B %-13s spread %8.0f (p99 %5.1f ms, load %s, err %d) one %8.0f (p99 %5.1f ms, load %s, err %d)"
                  "  %.2fx | cpu s/throttled s: spread [%s] one [%s]" %
                  (size, kind, row["spread"], row["spread_p99"], row["spread_load"], row["spread_err"],
                   row["oneleader"], row["oneleader_p99"], row["oneleader_load"], row["oneleader_err"], ratio,
                   row["spread_cg"], row["oneleader_cg"]))
        for kind, rs in ratios.items():
            print("   %s: spread/one %s, median %.2fx" % (kind, " ".join("%.2f" % r for r in rs), statistics.median(rs)))
    if os.environ.get("PNG") and points:
        plot(points, os.environ["PNG"])


def plot(points, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = sorted({k for k, _ in points})
    sizes = sorted({s for _, s in points})
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, kind in enumerate(kinds):
        for j, size in enumerate(sizes):
            rs = points.get((kind, size), [])
            x = j + (i - (len(kinds) - 1) / 2) * 0.25
            ax.scatter([x] * len(rs), rs, color="C%d" % i, alpha=0.6, label=kind if j == 0 else None)
            if rs:
                ax.hlines(statistics.median(rs), x - 0.1, x + 0.1, color="C%d" % i, lw=2)
    ax.axhline(1.5, color="grey", ls="--", lw=0.8)
    ax.axhline(1.0, color="grey", lw=0.5)
    ax.set_xticks(range(len(sizes)))
    ax.set_xticklabels(["%d B" % s for s in sizes])
    ax.set_ylabel("replicated sets/s: leaders spread / one leader")
    ax.set_title("Spread vs one leader (each pair; bar = median; dashed = 1.5x target)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1:])
