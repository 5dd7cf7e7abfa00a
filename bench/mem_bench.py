#!/usr/bin/env python3
"""mem_bench.py — peak RSS of Slipstream vs memcached under the three misbehaving-client loads
of issue 13 (tests/memload.py), each on a fresh server at -m 64 -t 4.

What it does: for each load and each server (memcached, then Slipstream; REPEATS times each),
starts the server on a free loopback port, runs the load, reads the server's VmHWM (peak RSS)
from /proc/PID/status, stops it. Prints a markdown table (also written to
bench/results/mem.md) with the median peak per cell and Slipstream's documented bound.

Not for: throughput (bench/kv_bench.sh) or comparing figures across machines.

Environment knobs (defaults in brackets):
  SLIPSTREAM_BIN [target/release/slipstream]   MEMCACHED_BIN [/usr/bin/memcached]
  REPEATS [1]   MIXED_MB [2048]   LOADS ["a b c"]   RESULTS_DIR [bench/results]
"""

import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

import mcwire  # noqa: E402
import memload  # noqa: E402
import test_memory_bound as bound  # noqa: E402  (the documented bound, one home)

REPEATS = int(os.environ.get("REPEATS", "1"))
MIXED_MB = int(os.environ.get("MIXED_MB", "2048"))
LOADS = os.environ.get("LOADS", "a b c").split()
RESULTS_DIR = os.environ.get("RESULTS_DIR", os.path.join(ROOT, "bench", "results"))

NAMES = {
    "a": "(a) 60 clients, get of 32 x 1 MB values, never read",
    "b": "(b) 500 clients, each a half-sent 1 MB set",
    "c": "(c) %d MB of sets, values 1 KB-500 KB, 16 connections" % MIXED_MB,
}
CONNS = {"a": 62, "b": 501, "c": 16}


def run(kind, load):
    srv = mcwire.Server(kind, threads=bound.THREADS, mem_mb=bound.MEM_MB).start()
    socks = []
    try:
        t0 = time.monotonic()
        if load == "a":
            socks, _ = memload.nonreading_gets(srv)
        elif load == "b":
            socks = memload.half_sent_sets(srv)
        else:
            memload.mixed_sets(srv, total_bytes=MIXED_MB * memload.MB, conns=16, seed=12345)
        peak = memload.peak_rss_mb(srv.pid())
        print("%-10s %s: peak RSS %.1f MB (%.1f s)" % (kind, load, peak, time.monotonic() - t0), flush=True)
        return peak
    finally:
        memload.close_all(socks)
        srv.stop()


def main():
    rows = []
    for load in LOADS:
        cells = {}
        for kind in ("memcached", "slipstream"):
            cells[kind] = statistics.median(run(kind, load) for _ in range(REPEATS))
        rows.append((load, cells))
    lines = [
        "| load (-m %d -t %d) | memcached peak RSS | Slipstream peak RSS | Slipstream bound |" % (bound.MEM_MB, bound.THREADS),
        "|---|---|---|---|",
    ]
    for load, cells in rows:
        lines.append("| %s | %.1f MB | %.1f MB | %.1f MB |" % (
            NAMES[load], cells["memcached"], cells["slipstream"], bound.bound_mb(CONNS[load])))
    table = "\n".join(lines)
    print(table)
    os.makedirs(RESULTS_DIR, exist_ok=True)
    with open(os.path.join(RESULTS_DIR, "mem.md"), "w") as f:
        f.write(table + "\n")


if __name__ == "__main__":
    main()
