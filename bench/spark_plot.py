#!/usr/bin/env python3
"""spark_plot.py RESULTS_DIR: turns spark_bench.sh's spark.jsonl into summary.md and PNGs
(wordcount_rate.png, changepoint_latency.png, cpu.png). Not for measuring anything."""

import json
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(d):
    rows = []
    with open(os.path.join(d, "spark.jsonl")) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                rows.append(json.loads(line))
    return rows


def fnum(v, fmt="%.1f"):
    if v is None or (isinstance(v, float) and math.isnan(v)) or v == "NaN":
        return "n/a"
    return fmt % v


def main():
    d = sys.argv[1]
    rows = load(d)
    wc = [r for r in rows if r["bench"] == "wordcount"]
    cp = [r for r in rows if r["bench"] == "changepoint"]
    env = open(os.path.join(d, "env.txt")).read().strip() if os.path.exists(os.path.join(d, "env.txt")) else ""
    out = ["# Spark head-to-head (issue 6)", "", "```", env, "```", ""]

    # ---- word count
    out += ["## Word count: highest datagram rate with exact counts", "",
            "16 words per datagram; each rate runs a fixed number of seconds; exact = summed counts equal the "
            "generator's multiset. Stepping stops at the first inexact rate.", "",
            "| setup | offered/s | achieved datagrams/s | records | counted | exact | CPU s per 1M records |",
            "|---|---|---|---|---|---|---|"]
    best = {}
    for r in wc:
        out.append("| %s | %s | %.0f | %d | %d | %s | %.2f |" % (
            r["setup"], "max" if r["rate_per_s"] == 0 else r["rate_per_s"], r["achieved_rate_per_s"], r["records"],
            r["counted"], "yes" if r["exact"] else "**no**", r["cpu_s_per_million_records"]))
        if r["exact"]:
            best[r["setup"]] = max(best.get(r["setup"], 0), r["achieved_rate_per_s"])
    out.append("")
    for s, v in sorted(best.items()):
        out.append("- **%s**: highest exact rate %.0f datagrams/s (%.0f words/s)" % (s, v, v * 16))
    for setup in ("slipstream-spark", "slipstream-xdp-spark"):
        gen_max = [r for r in wc if r["setup"] == setup and r["rate_per_s"] == 0]
        if gen_max and gen_max[0]["exact"]:
            out.append("- %s was still exact at the generator's own maximum (%.0f datagrams/s, "
                       "`--rate-per-s 0`): its limit here is the generator sharing the host's cores, so its "
                       "ratio below is a lower bound" % (setup, gen_max[0]["achieved_rate_per_s"]))
        if best.get(setup) and best.get("plain-spark"):
            out.append("- ratio %s / plain-spark: **%.1fx**" % (setup, best[setup] / best["plain-spark"]))
    out.append("")

    # ---- change point
    out += ["## Change-point detection latency", "",
            "Step sent (generator's CLOCK_MONOTONIC) to alert seen; trials each.", "",
            "| setup | trials | detected | missed | false alarms | mean ms | p50 ms | p99 ms | max ms | CPU s per 1M records |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for r in cp:
        out.append("| %s | %d | %d | %d | %d | %s | %s | %s | %s | %.1f |" % (
            r["setup"], r["trials"], r["detected"], r["missed"], r["false_alarms"], fnum(r["mean_ms"], "%.3f"),
            fnum(r["p50_ms"], "%.3f"), fnum(r["p99_ms"], "%.3f"), fnum(r["max_ms"], "%.3f"),
            r["cpu_s_per_million_records"]))
    out += ["", "Paper (Spark Streaming at 0.5/1/2 s: 457/817/1249 ms; FPGA: 48 ms).", "",
            "## CPU", "",
            "utime+stime of the Spark JVM, plus the daemon for Slipstream setups, over the runs above "
            "(the generator is not counted), per million input records. Word count: see the table "
            "(lower rates include more idle JVM time per record).", "",
            "XDP column: slipstream-xdp-spark (daemon with `--xdp` on a veth, generator in a client namespace).", ""]
    with open(os.path.join(d, "summary.md"), "w") as f:
        f.write("\n".join(out) + "\n")

    # ---- plots
    fig, ax = plt.subplots(figsize=(7, 4))
    for setup in sorted({r["setup"] for r in wc}):
        pts = [r for r in wc if r["setup"] == setup]
        ax.plot([r["achieved_rate_per_s"] for r in pts], [100.0 * r["counted"] / max(1, r["records"]) for r in pts],
                marker="o", label=setup)
    ax.set_xscale("log")
    ax.set_xlabel("datagrams/s (16 words each)")
    ax.set_ylabel("words counted / words sent (%)")
    ax.set_title("Word count exactness vs rate")
    ax.legend()
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(d, "wordcount_rate.png"), dpi=120)

    fig, ax = plt.subplots(figsize=(8, 4))
    names = [r["setup"] for r in cp if r["latencies_ms"]]
    data = [r["latencies_ms"] for r in cp if r["latencies_ms"]]
    if data:
        ax.boxplot(data, whis=(1, 99), showfliers=False)
        ax.set_xticks(range(1, len(names) + 1))
        ax.set_xticklabels(names, rotation=20, ha="right", fontsize=8)
        ax.set_yscale("log")
    ax.set_ylabel("latency ms (log)")
    ax.set_title("Change-point latency (whiskers p1-p99)")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(d, "changepoint_latency.png"), dpi=120)

    fig, ax = plt.subplots(figsize=(8, 4))
    labels, vals = [], []
    for r in cp:
        labels.append(r["setup"])
        vals.append(r["cpu_s_per_million_records"])
    for setup, v in sorted(best.items()):
        top = max((r for r in wc if r["setup"] == setup and r["exact"]), key=lambda r: r["achieved_rate_per_s"])
        labels.append("wordcount " + setup)
        vals.append(top["cpu_s_per_million_records"])
    ax.bar(range(len(vals)), vals)
    ax.set_xticks(range(len(vals)))
    ax.set_xticklabels(labels, rotation=25, ha="right", fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("CPU s per 1M records (log)")
    ax.set_title("Host CPU per million input records")
    fig.tight_layout()
    fig.savefig(os.path.join(d, "cpu.png"), dpi=120)


if __name__ == "__main__":
    main()
