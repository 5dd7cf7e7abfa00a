#!/usr/bin/env python3
"""Summary of bench/shuffle_bench.sh's rounds (RESULTS_DIR/shuffle.jsonl) into summary.md:
per shape (maps x reduces) and manager the median of every measured round (warm-up rounds
left out) — map stage, reduce stage, fetch wait, job, task CPU, host CPU-seconds per GB of
record payload over all JVMs plus the daemon — then each manager against the sort shuffle and
the tuned sort shuffle, and the reduce stage paired by invocation (same driver run).

Usage: shuffle_summary.py RESULTS_DIR
"""

import json
import os
import statistics
import sys

KEYS = ("map_stage_ms", "reduce_stage_ms", "fetch_wait_ms", "job_ms", "map_cpu_ms", "reduce_cpu_ms", "cpu_s_per_gb")
MANAGERS = ("sort", "tuned", "slipstream")


def invocation_table(rounds, what, value):
    """Markdown lines: the median of `value(round)` per driver invocation (its manager order) and
    manager, so a figure can be compared within one invocation (also used by pagerank_summary)."""
    lines = ["", "| invocation (order) | " + " | ".join("%s %s" % (m, what) for m in MANAGERS) + " |",
             "|---|" + "---:|" * len(MANAGERS)]
    for o in sorted({x.get("order", "") for x in rounds}):
        cells = []
        for m in MANAGERS:
            r = [value(x) for x in rounds if x["manager"] == m and x.get("order", "") == o]
            cells.append("%.0f" % statistics.median(r) if r else "-")
        lines.append("| %s | %s |" % (o, " | ".join(cells)))
    return lines


def main(out):
    rows = [json.loads(line) for line in open(os.path.join(out, "shuffle.jsonl")) if line.strip()]
    for r in rows:
        r["cpu_s_per_gb"] = r["host_cpu_s"] / (r["payload_bytes"] / 1e9) if r.get("payload_bytes") else float("nan")
    lines = []
    for shape in sorted({(r["maps"], r["reduces"]) for r in rows}):
        at = [r for r in rows if (r["maps"], r["reduces"]) == shape and not r["warmup"]]
        lines += ["### %d x %d, %d records, %d-byte values, %s" % (shape[0], shape[1], at[0]["records"],
                                                                  at[0]["value_bytes"], at[0]["master"]), "",
                  "| manager | rounds | map stage ms | reduce stage ms | fetch wait ms | job ms | map task CPU ms "
                  "| reduce task CPU ms | host CPU-s per GB | shuffle write MB | reduce stage ms, every round |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        med = {}
        for m in MANAGERS:
            r = [x for x in at if x["manager"] == m]
            if not r:
                continue
            med[m] = {k: statistics.median(x[k] for x in r) for k in KEYS}
            wb = statistics.median(x["shuffle_write_bytes"] for x in r) / 1e6
            lines.append("| %s | %d | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.2f | %.0f | %s |" % (
                m, len(r), med[m]["map_stage_ms"], med[m]["reduce_stage_ms"], med[m]["fetch_wait_ms"],
                med[m]["job_ms"], med[m]["map_cpu_ms"], med[m]["reduce_cpu_ms"], med[m]["cpu_s_per_gb"], wb,
                ", ".join(str(x["reduce_stage_ms"]) for x in r)))
        lines.append("")
        for base in ("sort", "tuned"):
            if "slipstream" in med and base in med:
                lines.append("slipstream / %s: " % base + ", ".join(
                    "%s %.2f" % (k, med["slipstream"][k] / med[base][k]) for k in KEYS if med[base][k] > 0) + "  ")
        if "tuned" in med and "sort" in med:
            lines.append("tuned / sort: " + ", ".join(
                "%s %.2f" % (k, med["tuned"][k] / med["sort"][k]) for k in KEYS if med["sort"][k] > 0) + "  ")
        lines += invocation_table(at, "reduce stage ms", lambda x: x["reduce_stage_ms"])
        lines.append("")
    text = "\n".join(lines) + "\n"
    open(os.path.join(out, "summary.md"), "w").write(text)
    print(text)


if __name__ == "__main__":
    main(sys.argv[1])
