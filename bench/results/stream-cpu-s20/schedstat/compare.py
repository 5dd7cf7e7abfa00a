#!/usr/bin/env python3
"""For each measured window of the stream_cpu runs in DIRS (their samples/*.jsonl, CLOCK_MONOTONIC
t_mono_ns) and the sampler's log (sample.py, time.monotonic(): the same clock), the receive CPU
(cpu0) three ways: its tasks' exact run time (cpuacct, interpolated at the window's edges), the
NAPI thread's exact run time, and /proc/stat's ticks (user+system+softirq, and softirq alone).
Usage: compare.py SAMPLER_LOG DIR..."""
import bisect, glob, json, os, sys

HZ = os.sysconf("SC_CLK_TCK")
log = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
ts = [x["t"] for x in log]

def at(t, f):
    i = min(max(bisect.bisect_left(ts, t), 1), len(ts) - 1)
    a, b = log[i - 1], log[i]
    fa, fb = f(a), f(b)
    if fa is None or fb is None or b["t"] == a["t"]:
        return fb if fa is None else fa
    return fa + (fb - fa) * (t - a["t"]) / (b["t"] - a["t"])

def napi_ns(x):
    v = [n["run_ns"] for n in x["napi"].values()]
    return sum(v) if v else None

for d in sys.argv[2:]:
    for path in sorted(glob.glob(os.path.join(d, "samples", "wc-*.jsonl"))):
        s = {j["label"]: j for j in map(json.loads, open(path))}
        for k in sorted(s):
            if not k.endswith("-begin") or k.startswith("idle"):
                continue
            a, b = s[k], s.get(k.replace("-begin", "-end"))
            if not b:
                continue
            t0, t1 = a["t_mono_ns"] / 1e9, b["t_mono_ns"] / 1e9
            if t0 < ts[0] or t1 > ts[-1]:
                continue
            run = at(t1, lambda x: x["cpus"]["cpu0"]["run_ns"]) - at(t0, lambda x: x["cpus"]["cpu0"]["run_ns"])
            nap = (at(t1, napi_ns) or 0) - (at(t0, napi_ns) or 0)
            tick = lambda f: at(t1, lambda x: x["cpus"]["cpu0"][f]) - at(t0, lambda x: x["cpus"]["cpu0"][f])
            print("%-28s %-10s window %5.1f s | cpu0 tasks exact %.2f s, of it NAPI thread %.2f | cpu0 ticks: user+system %.2f softirq %.2f" % (
                os.path.basename(d), k[:-6], t1 - t0, run / 1e9, nap / 1e9,
                (tick("user") + tick("system")) / HZ, tick("softirq") / HZ))
