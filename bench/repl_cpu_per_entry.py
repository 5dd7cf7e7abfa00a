#!/usr/bin/env python3
"""repl_cpu_per_entry.py — CPU per replicated entry of the one-leader layout (issue 15), from
bench/replication_bench.sh's JSON lines (run with NODE_CPU set, so each line carries the node
groups' CPU seconds): per oneleader run, L = node 1's CPU seconds / the run's sets (the leader
of all three groups) and F = the mean of nodes 2 and 3 / the sets (followers), in µs, and
3L/(L+2F), the spread/one-leader ratio that CPU alone allows. The method of
bench/results/repl-s20-quiet/summary.txt (the CPU seconds span the warm-up too, so L and F
are comparable with each other and with that file, not absolute).

Usage: repl_cpu_per_entry.py <label> <file.jsonl>... ; one line per oneleader run.
Not for: running anything (bench/repl_emulation_ab.sh, bench/replication_bench.sh)."""

import json
import sys


def main(label, paths):
    for path in paths:
        lines = [json.loads(x) for x in open(path) if x.startswith("{")]
        runs = [lines[i:i + 3] for i in range(0, len(lines) - 2, 3)]
        for g in runs:
            if g[0]["run"] != "oneleader" or not g[0].get("cpu_groups"):
                continue
            sets = sum(x["result"]["sets"] for x in g)
            cg = g[0]["cpu_groups"]
            lead = cg["node1"]["cpu_s"] / sets * 1e6
            fol = (cg["node2"]["cpu_s"] + cg["node3"]["cpu_s"]) / 2 / sets * 1e6
            print("%-6s %5d B node_cpu %-4s sets/s %7.0f | L %6.2f F %6.2f F/L %.3f 3L/(L+2F) %.2f | load1 %.2f errors %d"
                  % (label, g[0]["value_bytes"], g[0]["node_cpu"], sum(x["result"]["ops_per_s"] for x in g),
                     lead, fol, fol / lead, 3 * lead / (lead + 2 * fol), g[0]["load1"],
                     sum(x["result"]["errors"] for x in g)))


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2:])
