#!/usr/bin/env python3
"""isolation_bench.py — replicated writes of one tenant while seven others read at their
share (issue 15; the paper's Fig. 7), `make bench`.

Three daemons on loopback (bench/replbench.py): tenant t0 replicated on all three (leader on
node 1, fsync batch), tenants r1..r7 unreplicated on node 1 only; eight shares of 0.125 of a
CAPACITY bytes/s egress and ingress (token buckets, default bursts), so each reader may take
CAPACITY/8. t0's client sends sets open loop (slipstream-loadgen --rate-per-s T0_RATE, 4
connections, 100-byte values, latency from each request's scheduled time) to node 1, at
real-time priority when `chrt -f` works (as bench/tenant_bench.sh's isolation run: the figure
is the daemons', not how Linux schedules the clients); readers r1..rk run closed loop gets of
1000-byte values (prefilled: every get hits), 4 connections x pipeline 8 each, far above their
share, all starting on the same instant as t0's client. k = 0..7 (the figure's x axis), in the
order POINTS (0..7 then 7..0) REPEATS times, DURATION_S windows. Per point: t0's set latency p50/p99
(a set is answered once committed by a majority and applied), the readers' MB/s.

READERS_SCHED=idle runs the readers' generators under SCHED_IDLE (chrt -i 0): on this 2-core
box they otherwise take the cores from the daemons, which remote clients would not.

Writes JSON (bench/results/isolation-<date>.json) and docs/img/isolation.png; prints a table.
Env: CAPACITY (40000000), T0_RATE (1000), DURATION_S (8), REPEATS (1), POINTS (the reader
counts in order, default "0 1 2 3 4 5 6 7 7 6 5 4 3 2 1 0"; e.g. "0 7 0 7" for paired runs of the
two ends), READERS_SCHED ("" or idle), SLIPSTREAM_BIN, LOADGEN; NODE_CPU / CLIENT_CPU / CPU_SHARES: emulated machines
(bench/cpugroups.py: each daemon in its own cpu cgroup with NODE_CPU cores, the load generators
in a clients' group), removed at the end. Daemons are SIGKILLed at the end, failure or not.
Not for: shaping accuracy (bench/tenant_bench.sh) or failover (bench/failover_bench.py).
"""

import json
import statistics
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import cpugroups  # noqa: E402
from replbench import Cluster, Tenant  # noqa: E402

REPO = os.path.abspath(os.path.join(HERE, ".."))
LOADGEN = os.environ.get("LOADGEN", os.path.join(REPO, "target", "release", "slipstream-loadgen"))
NODES = (1, 2, 3)
READERS = ["r%d" % i for i in range(1, 8)]
KEYS = 4000
VALUE_BYTES = 1000
RUN_TIMEOUT_S = 120  # one loadgen run (warmup + window + slack) must end within this


def chrt_ok(args):
    return subprocess.run(["chrt"] + args + ["true"], capture_output=True).returncode == 0


def loadgen(port, extra, prio, start_ms, duration_s):
    cmd = prio + [LOADGEN, "--server", "127.0.0.1:%d" % port, "--duration-s", str(duration_s), "--warmup-s", "1",
                  "--start-at-unix-ms", str(start_ms)] + extra
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def point(c, k, t0_rate, duration_s, t0_prio, readers_prio):
    start_ms = int(time.time() * 1000) + 1500
    t0 = loadgen(c.ports[1]["t0"], ["--ratio", "1:0", "--value-bytes", "100", "--conns", "4", "--pipeline", "16",
                                    "--keys", "1000", "--rate-per-s", str(t0_rate), "--seed", "1"],
                 t0_prio, start_ms, duration_s)
    readers = [loadgen(c.ports[1][r], ["--ratio", "0:1", "--value-bytes", str(VALUE_BYTES), "--conns", "4",
                                       "--pipeline", "8", "--keys", str(KEYS), "--seed", str(i + 2)],
                       readers_prio, start_ms, duration_s) for i, r in enumerate(READERS[:k])]
    out = []
    for p in [t0] + readers:
        try:
            o, e = p.communicate(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            p.kill()
            o, e = p.communicate()
        if not o.strip():
            raise RuntimeError("loadgen failed: %s" % e[-2000:])
        out.append(json.loads(o.strip().splitlines()[-1]))
    return out[0], out[1:]


def main():
    groups = cpugroups.from_env("slipstream-isolation-%d" % os.getpid(), NODES)
    if groups is not None:
        groups.setup()
    try:
        if groups is not None:
            groups.join_clients()
        run(groups)
    finally:
        if groups is not None:
            groups.remove()


def run(groups):
    capacity = int(os.environ.get("CAPACITY", "40000000"))
    t0_rate = float(os.environ.get("T0_RATE", "1000"))
    duration_s = int(os.environ.get("DURATION_S", "8"))
    repeats = int(os.environ.get("REPEATS", "1"))
    readers_sched = os.environ.get("READERS_SCHED", "")
    points = [int(k) for k in os.environ.get("POINTS", "0 1 2 3 4 5 6 7 7 6 5 4 3 2 1 0").split()]
    if not points or any(k < 0 or k > len(READERS) for k in points):
        raise SystemExit("POINTS: reader counts 0..%d" % len(READERS))
    out_path = os.environ.get("OUT", os.path.join(REPO, "bench", "results",
                                                  "isolation-%s.json" % time.strftime("%Y%m%d-%H%M%S")))
    png = os.environ.get("PNG", os.path.join(REPO, "docs", "img", "isolation.png"))
    t0_prio = ["chrt", "-f", "10"] if chrt_ok(["-f", "10"]) else []
    readers_prio = ["chrt", "-i", "0"] if readers_sched == "idle" and chrt_ok(["-i", "0"]) else []
    commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    tenants = [Tenant("t0", replicas=3, preferred_leader=1, share=0.125, memory_mb=64)]
    tenants += [Tenant(r, replicas=1, share=0.125, on=[1], memory_mb=16) for r in READERS]
    shaping = ["egress_bytes_per_s = %d" % capacity, "ingress_bytes_per_s = %d" % capacity]
    root = tempfile.mkdtemp(prefix="slipstream-isolation-")
    c = Cluster(root, NODES, tenants, fsync="batch", shaping=shaping, groups=groups)
    print("# %s" % (groups.describe() if groups else "no emulation"), flush=True)
    rows = []
    try:
        for n in NODES:
            c.start(n)
        c.wait(c.settled, 60, "t0's leader on node 1")
        pre = [subprocess.Popen([LOADGEN, "--server", "127.0.0.1:%d" % c.ports[1][r], "--conns", "1", "--prefill",
                                 "--keys", str(KEYS), "--value-bytes", str(VALUE_BYTES), "--ratio", "0:1",
                                 "--duration-s", "1", "--warmup-s", "0"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for r in READERS]
        for p in pre:
            _, e = p.communicate(timeout=RUN_TIMEOUT_S)
            if p.returncode not in (0, 3):
                raise RuntimeError("prefill failed: %s" % e[-2000:])
        order = []
        for _ in range(repeats):
            order += points
        print("capacity %d B/s, t0 %g sets/s open loop%s, readers %s, %d s windows, commit %s" %
              (capacity, t0_rate, " (chrt -f 10)" if t0_prio else "", "SCHED_IDLE" if readers_prio else "normal",
               duration_s, commit), flush=True)
        for k in order:
            load = open("/proc/loadavg").read().split()[0]
            cg_before = groups.report() if groups else {}
            t0, rd = point(c, k, t0_rate, duration_s, t0_prio, readers_prio)
            cg = {g: {x: round(v - cg_before.get(g, {}).get(x, 0), 3) for x, v in d.items()}
                  for g, d in (groups.report() if groups else {}).items()}
            mbps = sum(r["ops_per_s"] * VALUE_BYTES for r in rd) / 1e6
            row = {"readers": k, "t0_p50_us": t0["lat_ns"]["p50"] / 1e3, "t0_p99_us": t0["lat_ns"]["p99"] / 1e3,
                   "t0_p999_us": t0["lat_ns"]["p999"] / 1e3, "t0_ops_per_s": t0["ops_per_s"],
                   "t0_errors": t0["errors"], "readers_mb_per_s": mbps,
                   "reader_mb_per_s_each": [r["ops_per_s"] * VALUE_BYTES / 1e6 for r in rd], "load1": load,
                   "cpu_groups": cg}
            rows.append(row)
            print("  readers %d: t0 p50 %.0f us p99 %.0f us (%.0f sets/s, %d errors); readers %.2f MB/s "
                  "(share %.2f MB/s each); load %s" % (k, row["t0_p50_us"], row["t0_p99_us"], row["t0_ops_per_s"],
                                                      row["t0_errors"], mbps, capacity / 8e6, load), flush=True)
            if cg:
                print("    cpu s (throttled s): %s" % ", ".join("%s %.2f (%.2f)" % (g, d["cpu_s"], d["throttled_s"])
                                                          for g, d in cg.items()), flush=True)
    finally:
        c.stop_all()
        shutil.rmtree(root, ignore_errors=True)
    summary = {}
    ks = sorted(set(points))
    for k in ks:
        pts = [r for r in rows if r["readers"] == k]
        p50 = sorted(r["t0_p50_us"] for r in pts)
        p99 = sorted(r["t0_p99_us"] for r in pts)
        summary[k] = {"p50_us_median": statistics.median(p50), "p99_us_median": statistics.median(p99),
                      "p50_us": p50, "p99_us": p99,
                      "readers_mb_per_s": statistics.median(r["readers_mb_per_s"] for r in pts)}
    base = summary[ks[0]]
    for k in ks:
        s = summary[k]
        print("  %d readers: t0 p50 %.0f us (%+.0f%%) p99 %.0f us (%+.0f%%), readers %.1f MB/s" %
              (k, s["p50_us_median"], (s["p50_us_median"] / base["p50_us_median"] - 1) * 100, s["p99_us_median"],
               (s["p99_us_median"] / base["p99_us_median"] - 1) * 100, s["readers_mb_per_s"]))
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    with open(out_path, "w") as fh:
        json.dump({"commit": commit, "capacity_bytes_per_s": capacity, "t0_rate": t0_rate, "duration_s": duration_s,
                   "readers_sched": readers_sched or "normal", "t0_rt": bool(t0_prio), "rows": rows,
                   "cpu_groups": groups.describe() if groups else "none",
                   "summary": summary}, fh, indent=1)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for key, label, m in (("t0_p50_us", "p50", "o"), ("t0_p99_us", "p99", "s")):
        ax.scatter([r["readers"] for r in rows], [r[key] for r in rows], marker=m, alpha=0.5)
        ax.plot(ks, [summary[k][key.replace("t0_", "") + "_median"] for k in ks], marker=m,
                label="t0 replicated set latency %s (median of runs)" % label)
    ax.set_xlabel("tenants reading at their share on t0's leader node")
    ax.set_ylabel("latency (us)")
    ax.set_ylim(bottom=0)
    ax.set_title("Isolation: t0 replicated writes vs readers (%s)" % ("readers SCHED_IDLE" if readers_prio else
                                                                      "readers at normal priority"), fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(png), exist_ok=True)
    fig.savefig(png, dpi=110)
    print("wrote %s and %s" % (out_path, png))


if __name__ == "__main__":
    # SIGTERM unwinds like an exception, so the daemons are killed and the cgroups removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    main()
