"""HBase range cache with a fast client (issue 16's benchmark, cached figures): the Rust
closed-loop load generator (crates/rangecache/examples/thrift_load/, N connections, HDR
p50/p99) against

  direct     the JVM sidecar straight (HBase's native client; no Slipstream, no Thrift, no cache)
  miss       Slipstream, scans starting anywhere (all-row: nearly every query new)
  hit        Slipstream, 64 fixed scan starts / 256 fixed Get rows, warmed first
             for the strategies all-row, each-row and adaptive
  sweep      hits vs scan range 1..100 rows, all-row and each-row (the paper's Fig. 11)

Same mini cluster, same data (KEYS rows x 4 columns x 32 B), same Thrift calls as happybase
(scannerOpenWithStop + scannerGetList + scannerClose; getRow). Prints a table and, if matplotlib
is installed, writes docs/img/hbase_scan_range.png. Starts and kills its own mini cluster.
Usage: SLIPSTREAM_BIN=target/release/slipstream python3 bench/hbase_load_bench.py
(build first: cargo build --release -p slipstream -p slipstream-rangecache --examples)
Knobs (environment): KEYS, CONNS (client connections), CLIENT (raw | crate), DEPTH (operations
in flight per connection, raw client), SECS (per figure), THRIFT_LOAD (the load
generator binary), PLOT_OUT (where the PNG goes), ONLY_HITS=1 (skip direct and miss runs),
PERF=1 (`perf stat` on the daemon: context switches and IPIs sent per operation), PAIRED=N (after the table:
N rounds of cached 100-row scans and Gets against the three strategies' daemons alternated
A B C C B A, SECS each, one line per run plus each strategy's median), WALK=N (only: N rounds of
the each-row run walk vs all-row hits and both vs scan range, see walk_rounds). Every row also gives the
CPU each process used during the run and CPU microseconds per operation (daemon, client, JVM),
which say which side saturates and stay meaningful on a shared machine.
"""

import os
import re
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

import hbaselib  # noqa: E402

LOAD = os.environ.get("THRIFT_LOAD", os.path.join(ROOT, "target", "release", "examples", "thrift_load"))
KEYS = int(os.environ.get("KEYS", "20000"))
CONNS = int(os.environ.get("CONNS", "4"))
# The Thrift client: "raw" (framed, DEPTH operations in flight per connection, replies skimmed:
# row counts, not rows) or "crate" (the thrift crate's client, every row decoded; sessions 7-8).
CLIENT = os.environ.get("CLIENT", "raw")
DEPTH = int(os.environ.get("DEPTH", "4"))
SECS = float(os.environ.get("SECS", "4"))
SWEEP = [1, 10, 25, 50, 100]
PERF = os.environ.get("PERF") == "1"
ONLY_HITS = os.environ.get("ONLY_HITS") == "1"  # skip direct and miss runs (A/B of the hit path)
PAIRED = int(os.environ.get("PAIRED", "0"))  # rounds of alternated strategy runs (A B C C B A)
WALK = int(os.environ.get("WALK", "0"))  # rounds of the each-row run walk vs all-row hits (only that)
# The walk's scans start among the first WALK_KEYS rows (all-row's 64 ranges hold 6,400 rows:
# WALK_KEYS=6500 gives the walk a working set of that size, the rest of the gap is the walk's).
WALK_KEYS = os.environ.get("WALK_KEYS", str(KEYS))


def proc_cpu_s(pid):
    """utime + stime of a process (all its threads), in seconds."""
    if pid is None:
        return 0.0
    try:
        f = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


CPU_PIDS = {}  # name -> pid, sampled around every measured run ("cpu" in the result)


def perf_start(pid):
    """PERF=1: `perf stat` on the daemon for the run (context switches and IPIs per operation)."""
    if not PERF or pid is None:
        return None
    return subprocess.Popen(["perf", "stat", "-x", ",", "-e", "task-clock,context-switches,cpu-migrations,ipi:ipi_send_cpu", "-p", str(pid)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def perf_end(p):
    if p is None:
        return {}
    p.send_signal(signal.SIGINT)
    err = p.communicate(timeout=30)[1]
    got = {}
    for line in err.splitlines():
        f = line.split(",")
        if len(f) > 2 and f[2] in ("task-clock", "context-switches", "cpu-migrations", "ipi:ipi_send_cpu"):
            try:
                got[f[2]] = float(f[0])
            except ValueError:
                pass
    return got


def run(addr, *args, secs=SECS, daemon=None):
    cmd = [LOAD, "--addr", addr, "--conns", str(CONNS), "--secs", str(secs), "--keys", str(KEYS),
           "--client", CLIENT, "--depth", str(DEPTH)] + list(args)
    perf = perf_start(CPU_PIDS.get(daemon)) if secs > 0 else None
    before = {n: proc_cpu_s(p) for n, p in CPU_PIDS.items()}
    child0 = os.times()
    t0 = time.time()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=secs + 120)
    wall = time.time() - t0
    child1 = os.times()
    perf = perf_end(perf)
    if out.returncode != 0:
        raise RuntimeError("%s: %s" % (" ".join(cmd), out.stderr[-2000:]))
    if secs <= 0:
        return {}
    line = out.stdout.strip().splitlines()[-1]
    r = dict(kv.split("=", 1) for kv in line.split())
    # CPU cores each side used during the run (1.0 = one core busy the whole time).
    cpu = {n: (proc_cpu_s(p) - before[n]) / wall for n, p in CPU_PIDS.items()}
    cpu["client"] = (child1.children_user + child1.children_system - child0.children_user - child0.children_system) / wall
    r["cpu"] = " ".join("%s %.2f" % (n, v) for n, v in sorted(cpu.items()) if v >= 0.005)
    # CPU microseconds per operation: the daemon serving the run, the client, the HBase JVM.
    ops = max(1.0, float(r["ops_per_s"]) * wall)
    per_op = [("daemon", cpu.get(daemon, 0.0))] if daemon else []
    per_op += [("client", cpu["client"]), ("jvm", cpu.get("hbase-jvm", 0.0))]
    r["cpu_per_op"] = ", ".join("%s %.0f" % (n, v * wall / ops * 1e6) for n, v in per_op)
    if perf:
        r["cpu_per_op"] += "; daemon ctx switches/op %.1f" % (perf.get("context-switches", 0) / ops)
        # IPIs the daemon sent per op: wake-ups of a client on an idle vCPU, ~5 us each on this
        # VM (the each-row walk's "slow regime", docs/benchmarks.md session 15).
        r["cpu_per_op"] += ", IPIs/op %.2f" % (perf.get("ipi:ipi_send_cpu", 0) / ops)
    return r


def hit_ratio(d):
    m = d.metrics()
    tot = {}
    for name in ("all_row_hits_total", "each_row_hits_total", "misses_total"):
        tot[name] = sum(float(l.split()[-1]) for l in m.splitlines() if l.startswith("slipstream_hbase_%s{" % name))
    hits = tot["all_row_hits_total"] + tot["each_row_hits_total"]
    return hits / max(1.0, hits + tot["misses_total"])


def fmt(name, r, extra=""):
    return "| %s | %s | %s | %s | %s | %s | %s | %s |" % (
        name, r["ops_per_s"], r["rows_per_op"], r["p50_us"], r["p99_us"], r["cpu"], r["cpu_per_op"], extra)


STRATEGIES = ("all-row", "each-row", "adaptive")


def paired_rounds(thrift):
    """PAIRED=N: cached scans then Gets, the strategies alternated A B C C B A per round, so each
    strategy sees the same share of the machine's busy and quiet moments (the box is shared).
    Returns {(op, strategy): [(ops/s, daemon CPU us/op, load average), ...]}."""
    out = {}
    for _ in range(PAIRED):
        for op, starts in (("scan", "64"), ("get", "256")):
            for s in STRATEGIES + tuple(reversed(STRATEGIES)):
                r = run(thrift[s], "--op", op, "--starts", starts, daemon=s)
                cpu = float(r["cpu_per_op"].split(",")[0].split()[1])
                load = float(open("/proc/loadavg").read().split()[0])
                out.setdefault((op, s), []).append((float(r["ops_per_s"]), cpu, load, r["p99_us"]))
    return out


def print_paired(paired):
    if not paired:
        return
    print("paired runs (A B C C B A per round, %.0f s each): ops/s (daemon CPU us/op, load, p99 us)" % SECS)
    for (op, s), runs in sorted(paired.items()):
        rates = sorted(r[0] for r in runs)
        cpus = sorted(r[1] for r in runs)
        print("%s %s: %s; median %.0f/s, daemon %.1f us/op" % (
            op, s, " ".join("%.0f (%.0f, %.1f, %s)" % r for r in runs), rates[len(rates) // 2], cpus[len(cpus) // 2]))
    for op in ("scan", "get"):
        base = sorted(r[0] for r in paired[(op, "all-row")])
        for s in ("each-row", "adaptive"):
            mine = sorted(r[0] for r in paired[(op, s)])
            print("%s %s / all-row (medians): %.2f" % (op, s, mine[len(mine) // 2] / max(1.0, base[len(base) // 2])))
    print()


def counts(d):
    """(hits, misses) of a daemon so far."""
    m = d.metrics()
    get = lambda n: sum(float(l.split()[-1]) for l in m.splitlines() if l.startswith("slipstream_hbase_%s{" % n))
    return get("all_row_hits_total") + get("each_row_hits_total"), get("misses_total")


def walk_rounds(thrift, daemons):
    """WALK=N: the each-row *run walk* (its rows gathered from the runs; before session 14's
    removal of result memos, a scan's first hit) against all-row hits. The each-row daemon is
    warmed with uniformly random 100-row scans until its table is one complete interval; its
    measured scans start anywhere (`--starts 0`: 20,000 possible starts), the all-row daemon's
    at 64 fixed starts (every scan a hit).
    N rounds alternated all-row, each-row, each-row, all-row at 100 rows, SECS each; then
    both vs scan range (SWEEP rows, 2 s each). Hit ratios are per run (daemon counters)."""
    each, allr = thrift["each-row"], thrift["all-row"]
    for _ in range(6):
        run(each, "--op", "scan", "--starts", "0", secs=3)
        h0, m0 = counts(daemons["each-row"])
        run(each, "--op", "scan", "--starts", "0", secs=1)
        h1, m1 = counts(daemons["each-row"])
        print("each-row warm-up: hit ratio of a random-start second %.4f" % ((h1 - h0) / max(1.0, h1 - h0 + m1 - m0)))
        if m1 == m0:
            break
    run(allr, "--op", "scan", "--starts", "64", secs=1)
    out = {}
    for _ in range(WALK):
        for s, starts in (("all-row", "64"), ("each-row", "0"), ("each-row", "0"), ("all-row", "64")):
            h0, m0 = counts(daemons[s])
            keys = ["--keys", WALK_KEYS] if s == "each-row" else []
            r = run(thrift[s], "--op", "scan", "--starts", starts, *keys, daemon=s)
            h1, m1 = counts(daemons[s])
            load = float(open("/proc/loadavg").read().split()[0])
            cpu = float(r["cpu_per_op"].split(",")[0].split()[1])
            ipis = re.search(r"IPIs/op ([0-9.]+)", r["cpu_per_op"])
            out.setdefault(s, []).append((float(r["ops_per_s"]), cpu, load, r["p99_us"], (h1 - h0) / max(1.0, h1 - h0 + m1 - m0),
                                          ", IPIs/op " + ipis.group(1) if ipis else ""))
    print("walk rounds (all-row 64 fixed starts vs each-row walk from random starts among the first %s rows; "
          "A B B A, %.0f s each): ops/s (daemon CPU us/op, load, p99 us, hit ratio)" % (WALK_KEYS, SECS))
    med = {}
    for s, runs in out.items():
        rates = sorted(r[0] for r in runs)
        med[s] = rates[len(rates) // 2]
        print("%s: %s; median %.0f/s" % (s, " ".join("%.0f (%.1f, %.1f, %s, %.4f%s)" % r for r in runs), med[s]))
    print("each-row walk / all-row hits (medians): %.3f" % (med["each-row"] / max(1.0, med["all-row"])))
    sweep = {}
    for rows in SWEEP:
        for s, starts in (("all-row", "64"), ("each-row", "0")):
            keys = ["--keys", WALK_KEYS] if s == "each-row" else []
            run(thrift[s], "--op", "scan", "--starts", starts, "--rows", str(rows), *keys, secs=0.5)
            h0, m0 = counts(daemons[s])
            r = run(thrift[s], "--op", "scan", "--starts", starts, "--rows", str(rows), *keys, secs=2)
            h1, m1 = counts(daemons[s])
            sweep[(s, rows)] = (float(r["ops_per_s"]), (h1 - h0) / max(1.0, h1 - h0 + m1 - m0))
    print("| scan rows | " + " | ".join(str(r) for r in SWEEP) + " |")
    print("| --- |" + " ---: |" * len(SWEEP))
    for s, what in (("all-row", "all-row hits (64 starts)"), ("each-row", "each-row walk (random starts)")):
        print("| %s scans/s (hit ratio) | " % what + " | ".join("%.0f (%.3f)" % sweep[(s, r)] for r in SWEEP) + " |")
    return sweep


def main():
    m = hbaselib.MiniHBase().start()
    print("mini cluster: start %.1f s, RSS %s MB; %d CPUs, load average %s" % (
        int(m.info["start_ms"]) / 1000, m.rss_mb(), os.cpu_count(), open("/proc/loadavg").read().split()[:3]))
    daemons = {}
    lines = []
    sweep = {}
    try:
        for s in STRATEGIES:
            daemons[s] = hbaselib.HbaseDaemon(m.sidecar_port, strategy=s, memory_mb=512).start()
            CPU_PIDS[s] = daemons[s].proc.pid
        CPU_PIDS["hbase-jvm"] = m.proc.pid
        side = "127.0.0.1:%d" % m.sidecar_port
        thrift = {s: "127.0.0.1:%d" % d.thrift_port for s, d in daemons.items()}
        t0 = time.time()
        run(thrift["all-row"], "--load", secs=0)
        print("loaded %d rows in %.1f s" % (KEYS, time.time() - t0))
        if WALK:
            walk_sweep = walk_rounds(thrift, daemons)
            sweep = {k: v[0] for k, v in walk_sweep.items()}
            lines = paired = None
        if not WALK:
            run(side, "--target", "sidecar", "--op", "scan", "--starts", "64", secs=2)  # warm the JVM
            run(side, "--target", "sidecar", "--op", "get", "--starts", "256", secs=1)
            if not ONLY_HITS:
                lines.append(fmt("scan100 HBase direct (sidecar, native client)", run(side, "--target", "sidecar", "--op", "scan", "--starts", "64")))
                lines.append(fmt("get HBase direct (sidecar, native client)", run(side, "--target", "sidecar", "--op", "get", "--starts", "256")))
            for s, addr in thrift.items():
                d = daemons[s]
                if not ONLY_HITS:
                    r = run(addr, "--op", "scan", "--starts", "0", daemon=s)
                    lines.append(fmt("scan100 Slipstream miss path (%s, random starts)" % s, r, "hit ratio %.2f" % hit_ratio(d)))
                run(addr, "--op", "scan", "--starts", "64", secs=1)  # warm
                lines.append(fmt("scan100 Slipstream hits (%s, 64 starts)" % s, run(addr, "--op", "scan", "--starts", "64", daemon=s), "hit ratio %.2f" % hit_ratio(d)))
                run(addr, "--op", "get", "--starts", "256", secs=1)
                lines.append(fmt("get Slipstream hits (%s, 256 rows)" % s, run(addr, "--op", "get", "--starts", "256", daemon=s)))
            for s in ("all-row", "each-row"):
                for rows in SWEEP:
                    run(thrift[s], "--op", "scan", "--starts", "64", "--rows", str(rows), secs=0.5)
                    r = run(thrift[s], "--op", "scan", "--starts", "64", "--rows", str(rows), secs=2)
                    sweep[(s, rows)] = float(r["ops_per_s"])
            paired = paired_rounds(thrift)
            # What adaptive chose here (crate::adaptive: fixed starts, no writes -> all-row scans).
            chosen = [l for l in daemons["adaptive"].metrics().splitlines()
                      if l.startswith(("slipstream_hbase_strategy_chosen_total{", "slipstream_hbase_adaptive_shapes{"))]
            print("adaptive daemon: " + "; ".join(chosen))
    finally:
        for d in daemons.values():
            d.stop()
        m.stop()
    print("load average at the end: %s" % open("/proc/loadavg").read().split()[:3])
    if WALK:
        plot(sweep, "each-row walk (random starts)", "all-row hits (64 starts)")
        return
    print("| what | ops/s | rows/op | p50 µs | p99 µs | CPU cores used (client = load generator) | CPU µs per op | note |")
    print("| --- | ---: | ---: | ---: | ---: | --- | --- | --- |")
    for l in lines:
        print(l)
    print()
    print_paired(paired)
    print("| scan rows | " + " | ".join(str(r) for r in SWEEP) + " |")
    print("| --- |" + " ---: |" * len(SWEEP))
    for s in ("all-row", "each-row"):
        print("| %s scans/s | " % s + " | ".join("%.0f" % sweep[(s, r)] for r in SWEEP) + " |")
    plot(sweep, "each-row", "all-row")


def plot(sweep, each_label, all_label):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib not installed: no plot)")
        return
    os.makedirs(os.path.join(ROOT, "docs", "img"), exist_ok=True)  # PLOT_OUT=... writes elsewhere
    plt.figure(figsize=(6, 4))
    for s, label in (("all-row", all_label), ("each-row", each_label)):
        plt.plot(SWEEP, [sweep[(s, r)] for r in SWEEP], marker="o", label=label)
    plt.xlabel("rows per scan")
    plt.ylabel("cached scans / s (%d connections)" % CONNS)
    plt.title("Slipstream HBase cache: throughput vs scan range")
    plt.legend()
    plt.grid(True, alpha=0.3)
    out = os.environ.get("PLOT_OUT", os.path.join(ROOT, "docs", "img", "hbase_scan_range.png"))
    plt.savefig(out, dpi=100, bbox_inches="tight")
    print("plot:", out)

if __name__ == "__main__":
    main()
