"""Zipf scans with 5% writes over k-fold overlapping ranges (issue 16's benchmark): hit ratio,
throughput and memory (bytes cached) of the all-row, each-row and adaptive strategies for
k = 1, 2, 4, 8.

The workload (crates/rangecache/examples/thrift_load --op zipf): 100-row scans as happybase does
them (scannerOpenWithStop + scannerGetList + scannerClose), range starts every 100/k rows so each
row lies in k ranges, range popularity Zipf(0.99) over a seeded shuffle, and 5% of operations a
mutateRow through Slipstream of one row of a range drawn the same way. Every strategy gets the
*same* seeded sequence (`--ops`, not a duration): a warm-up of WARM_OPS operations, then OPS
measured ones; hit ratio = hits / (hits + misses) over the measured part (daemon metrics),
memory = slipstream_hbase_cache_bytes after it (rows and their pre-encoded replies). One mini
cluster (started and killed here), a fresh daemon per (k, strategy), 512 MB cache each.
Memory for k-fold overlaps, fairly (MEMORY=1, the default): the Zipf runs above do not hold all
k copies in all-row (only the ranges drawn are cached, and writes drop some), so the memory
figure is also taken from a *sweep*: a fresh daemon per (k, strategy), a cache large enough for
every copy (MEMORY_MB, 1024), every range [i*100/k, i*100/k + 100) of the table scanned once
with happybase (no writes): all-row then holds each row k times, each-row once. Reported: the
bytes the cache accounts (slipstream_hbase_cache_bytes) and the daemon's RSS growth over the
sweep (VmRSS after minus before; jemalloc keeps what it mapped, so this is an upper bound of
what the cache uses).
Usage: SLIPSTREAM_BIN=target/release/slipstream python3 bench/hbase_zipf_bench.py
(build first: cargo build --release -p slipstream && cargo build --release -p slipstream-rangecache --examples)
Knobs (environment): KEYS, CONNS, DEPTH (operations in flight per connection), OPS, WARM_OPS,
WRITE_PCT, KS (e.g. "1,2,4,8"), PLOT_OUT, THRIFT_LOAD.
"""

import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

import hbaselib  # noqa: E402

LOAD = os.environ.get("THRIFT_LOAD", os.path.join(ROOT, "target", "release", "examples", "thrift_load"))
KEYS = int(os.environ.get("KEYS", "20000"))
CONNS = int(os.environ.get("CONNS", "4"))
DEPTH = int(os.environ.get("DEPTH", "4"))
OPS = int(os.environ.get("OPS", "20000"))
WARM_OPS = int(os.environ.get("WARM_OPS", "10000"))
WRITE_PCT = float(os.environ.get("WRITE_PCT", "5"))
KS = [int(k) for k in os.environ.get("KS", "1,2,4,8").split(",")]
MEMORY = os.environ.get("MEMORY", "1") == "1"
MEMORY_MB = int(os.environ.get("MEMORY_MB", "1024"))
ZIPF = os.environ.get("ZIPF", "1") == "1"
STRATEGIES = ("all-row", "each-row", "adaptive")


def load_run(addr, *args, timeout=600):
    cmd = [LOAD, "--addr", addr, "--conns", str(CONNS), "--keys", str(KEYS), "--secs", "600"] + list(args)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError("%s: %s" % (" ".join(cmd), out.stderr[-2000:]))
    line = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
    return dict(kv.split("=", 1) for kv in line.split())


def counters(d):
    tot = {"hits": 0.0, "misses": 0.0, "bytes": 0.0, "all-row": 0.0, "each-row": 0.0}
    for line in d.metrics().splitlines():
        if line.startswith("slipstream_hbase_strategy_chosen_total{"):
            tot[line.split('strategy="')[1].split('"')[0]] += float(line.split()[-1])
        if line.startswith("slipstream_hbase_all_row_hits_total{") or line.startswith("slipstream_hbase_each_row_hits_total{"):
            tot["hits"] += float(line.split()[-1])
        elif line.startswith("slipstream_hbase_misses_total{"):
            tot["misses"] += float(line.split()[-1])
        elif line.startswith("slipstream_hbase_cache_bytes "):
            tot["bytes"] = float(line.split()[-1])
    return tot


def one(m, k, strategy):
    d = hbaselib.HbaseDaemon(m.sidecar_port, strategy=strategy, memory_mb=512).start()
    try:
        addr = "127.0.0.1:%d" % d.thrift_port
        zipf = ["--op", "zipf", "--rows", "100", "--overlap", str(k), "--write-pct", str(WRITE_PCT), "--depth", str(DEPTH)]
        load_run(addr, *zipf, "--ops", str(WARM_OPS), "--seed", "1")
        c0 = counters(d)
        r = load_run(addr, *zipf, "--ops", str(OPS), "--seed", "2")
        c1 = counters(d)
    finally:
        d.stop()
    hits, misses = c1["hits"] - c0["hits"], c1["misses"] - c0["misses"]
    return {
        "scans_per_s": float(r["ops_per_s"]),
        "writes": int(r["writes"]),
        "hit_ratio": hits / max(1.0, hits + misses),
        "cache_mb": c1["bytes"] / 1e6,
        "p50_us": int(r["p50_us"]),
        "p99_us": int(r["p99_us"]),
        # Queries decided for each kind of entry in the measured part (adaptive: crate::adaptive).
        "chosen_all_row": int(c1["all-row"] - c0["all-row"]),
        "chosen_each_row": int(c1["each-row"] - c0["each-row"]),
    }


def rss_kb(pid):
    for line in open("/proc/%d/status" % pid):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def sweep(m, k, strategy):
    """Every k-fold overlapping 100-row range scanned once (see the module doc)."""
    import happybase

    d = hbaselib.HbaseDaemon(m.sidecar_port, strategy=strategy, memory_mb=MEMORY_MB).start()
    try:
        conn = happybase.Connection("127.0.0.1", d.thrift_port, timeout=60000)
        t = conn.table(b"bench")
        list(t.scan(row_start=b"row0000000", row_stop=b"row0000001"))  # connection and table warm
        rss0 = rss_kb(d.proc.pid)
        stride = 100 // k
        n = 0
        for s0 in range(0, KEYS - 100 + 1, stride):
            rows = list(t.scan(row_start=b"row%07d" % s0, row_stop=b"row%07d" % (s0 + 100), batch_size=100))
            assert len(rows) == 100, (s0, len(rows))
            n += 1
        conn.close()
        c = counters(d)
        rss1 = rss_kb(d.proc.pid)
        ev = sum(float(l.split()[-1]) for l in d.metrics().splitlines()
                 if l.startswith("slipstream_hbase_evictions_total{"))
    finally:
        d.stop()
    return {"scans": n, "cache_mb": c["bytes"] / 1e6, "rss_mb": (rss1 - rss0) / 1e3, "evictions": int(ev)}


def plot(res):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib not installed: no plot)")
        return
    fig, ax = plt.subplots(1, 3, figsize=(13, 3.8))
    for s in STRATEGIES:
        ax[0].plot(KS, [res[(k, s)]["hit_ratio"] for k in KS], marker="o", label=s)
        ax[1].plot(KS, [res[(k, s)]["cache_mb"] for k in KS], marker="o", label=s)
        ax[2].plot(KS, [res[(k, s)]["scans_per_s"] for k in KS], marker="o", label=s)
    for a, t in zip(ax, ("hit ratio", "MB cached", "scans / s (reads; writes not counted)")):
        a.set_xlabel("k (each row in k overlapping 100-row ranges)")
        a.set_xscale("log", base=2)
        a.set_xticks(KS)
        a.set_xticklabels([str(k) for k in KS])
        a.set_title(t)
        a.grid(True, alpha=0.3)
    ax[0].legend()
    fig.suptitle("Zipf(0.99) 100-row scans, %g%% writes: strategies vs range overlap" % WRITE_PCT)
    out = os.environ.get("PLOT_OUT", os.path.join(ROOT, "docs", "img", "hbase_zipf_overlap.png"))
    os.makedirs(os.path.dirname(out), exist_ok=True)
    fig.savefig(out, dpi=100, bbox_inches="tight")
    print("plot:", out)


def main():
    m = hbaselib.MiniHBase().start()
    print("mini cluster: start %.1f s; load average %s" % (int(m.info["start_ms"]) / 1000, open("/proc/loadavg").read().split()[:3]))
    res = {}
    try:
        d = hbaselib.HbaseDaemon(m.sidecar_port).start()
        try:
            t0 = time.time()
            load_run("127.0.0.1:%d" % d.thrift_port, "--load", "--secs", "0")
            print("loaded %d rows in %.1f s" % (KEYS, time.time() - t0))
        finally:
            d.stop()
        for k in KS if ZIPF else []:
            for s in STRATEGIES:
                res[(k, s)] = one(m, k, s)
                print("k=%d %s: %s" % (k, s, res[(k, s)]), flush=True)
        mem = {}
        for k in KS if MEMORY else []:
            for s in STRATEGIES:
                mem[(k, s)] = sweep(m, k, s)
                print("sweep k=%d %s: %s" % (k, s, mem[(k, s)]), flush=True)
    finally:
        m.stop()
    if mem:
        print("load average after the sweeps: %s" % open("/proc/loadavg").read().split()[:3])
        print("| k | strategy | scans | MB accounted | vs all-row | RSS growth MB | vs all-row | evictions |")
        print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for k in KS:
            base = mem[(k, "all-row")]
            for s in STRATEGIES:
                r = mem[(k, s)]
                print("| %d | %s | %d | %.1f | %.2f | %.1f | %.2f | %d |" % (
                    k, s, r["scans"], r["cache_mb"], r["cache_mb"] / max(base["cache_mb"], 1e-9), r["rss_mb"],
                    r["rss_mb"] / max(base["rss_mb"], 1e-9), r["evictions"]))
    if not res:
        return
    print("load average at the end: %s" % open("/proc/loadavg").read().split()[:3])
    print("| k | strategy | hit ratio | MB cached | MB vs all-row | scans/s | p50 / p99 µs | writes | chosen all-row / each-row |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for k in KS:
        base = res[(k, "all-row")]["cache_mb"]
        for s in STRATEGIES:
            r = res[(k, s)]
            print("| %d | %s | %.3f | %.1f | %.2f | %.0f | %d / %d | %d | %d / %d |" % (
                k, s, r["hit_ratio"], r["cache_mb"], r["cache_mb"] / max(base, 1e-9), r["scans_per_s"],
                r["p50_us"], r["p99_us"], r["writes"], r["chosen_all_row"], r["chosen_each_row"]))
    plot(res)


if __name__ == "__main__":
    main()
