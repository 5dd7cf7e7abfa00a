#!/usr/bin/env python3
"""Per-iteration time of every measured PageRank round, one line per round, coloured by shuffle
manager, from a `PAGERANK=1 bench/shuffle_bench.sh` results directory (its pagerank.jsonl).
Iteration 0 (graph loading and the first shuffles) is left out, as in the summary's median.

Usage: pagerank_plot.py RESULTS_DIR OUT.png
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"sort": "tab:red", "tuned": "tab:orange", "slipstream": "tab:blue"}


def main():
    d, out = sys.argv[1], sys.argv[2]
    rounds = [json.loads(line) for line in open(f"{d}/pagerank.jsonl") if line.startswith("{")]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    seen = set()
    for r in rounds:
        if r.get("warmup"):
            continue
        m = r["manager"]
        its = r["iter_ms"][1:]
        ax.plot(range(1, len(its) + 1), its, color=COLORS.get(m, "gray"), alpha=0.7,
                label=None if m in seen else m)
        seen.add(m)
    ax.set_xlabel("iteration")
    ax.set_ylabel("iteration wall time (ms)")
    ax.set_ylim(bottom=0)
    ax.set_title("GraphX PageRank per iteration, every measured round (%s)" % d.rstrip("/").split("/")[-1])
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)


if __name__ == "__main__":
    main()
