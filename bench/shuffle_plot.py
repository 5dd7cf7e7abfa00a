#!/usr/bin/env python3
"""shuffle_plot.py OUT.png LABEL=RESULTS_DIR...: one PNG of bench/shuffle_bench.sh rounds, per
round in run order: the reduce stage (ms, top) and the JIT compiler threads' CPU inside it
(reduce_jit_cpu_ms, bottom), one line per (label, manager), warm-up rounds hollow. It shows when
the executors' compilation settles and what the measured rounds are. Several RESULTS_DIRs with
the same label (e.g. two invocations of one build) are drawn as separate lines, numbered.
Not for measuring anything (the figures are in each RESULTS_DIR's summary.md)."""

import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def rounds(d):
    """The rounds of one RESULTS_DIR, by manager, in run order."""
    by = {}
    with open(os.path.join(d, "shuffle.jsonl")) as f:
        for line in f:
            if line.startswith("{"):
                r = json.loads(line)
                by.setdefault(r["manager"], []).append(r)
    return by


def main(argv):
    if len(argv) < 3 or any("=" not in a for a in argv[2:]):
        sys.exit(__doc__)
    out = argv[1]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True, gridspec_kw={"height_ratios": [2, 1]})
    seen = {}
    for arg in argv[2:]:
        label, d = arg.split("=", 1)
        for manager, rs in sorted(rounds(d).items()):
            name = "%s %s" % (label, manager) if label != manager else manager
            seen[name] = seen.get(name, 0) + 1
            if seen[name] > 1:
                name += " (%d)" % seen[name]
            x = list(range(len(rs)))
            for ax, key in ((top, "reduce_stage_ms"), (bottom, "reduce_jit_cpu_ms")):
                y = [r.get(key, -1) for r in rs]
                (line,) = ax.plot(x, y, "-", label=name if ax is top else None)
                c = line.get_color()
                for xi, yi, r in zip(x, y, rs):
                    ax.plot([xi], [yi], "o", color=c, mfc="none" if r["warmup"] else c)
    top.set_ylabel("reduce stage ms")
    top.set_ylim(bottom=0)
    top.legend(fontsize=8)
    top.set_title("GroupBy 200x200 reduce stage per round (hollow: warm-up rounds)", fontsize=10)
    bottom.set_ylabel("JIT CPU ms in the stage")
    bottom.set_xlabel("round (in run order, per invocation)")
    bottom.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(out, dpi=100)


if __name__ == "__main__":
    main(sys.argv)
