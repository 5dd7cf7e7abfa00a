"""What the RegionObserver's notice costs a native HBase client's Put (issue 16, session 17).
Variants, each a fresh mini cluster (1 region server), run in the order given by ORDER (pairs
alternated in time, e.g. `none,net,net,none`):
- none: no observer loaded (`--observer false`): the write path without Slipstream;
- injvm: the observer reports to the sidecar in its own JVM (the mini cluster's default mode),
  one Slipstream daemon subscribed;
- net: the observer reports over TCP (`--observer-port 0`) to a sidecar in another JVM (and to the
  mini cluster's own sidecar), one Slipstream daemon subscribed to the other JVM's sidecar: BEGIN
  goes region server -> sidecar -> daemon, the ACKs back, before the Put is acknowledged.
Each run: WARM Puts, then N Puts (16-byte values, random rows of 1000) by the native client in the
mini cluster's JVM (its sidecar spoken to directly, one at a time), timed from this process.
Each run's Puts stop after PUTS_S_MAX seconds (default 60) even if N were not all done (the count
done is printed). Prints p50/p90/p99/mean per run and the median p50 per variant; OUT=path.json
also writes them. `make hbase-bench` runs `ORDER=injvm,net,none,none,net,injvm N=2000 WARM=500`
(about 2-3 minutes). Usage: ORDER=none,net,net,none N=3000 python3 bench/hbase_observer_latency.py
"""
import json
import os
import random
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import hbaselib  # noqa: E402
import happybase  # noqa: E402
import mcwire  # noqa: E402

N = int(os.environ.get("N", "3000"))
WARM = int(os.environ.get("WARM", "500"))
ORDER = os.environ.get("ORDER", "none,net,net,none").split(",")
PUTS_S_MAX = float(os.environ.get("PUTS_S_MAX", "60"))
OUT = os.environ.get("OUT")
BIN = os.environ.get("SLIPSTREAM_BIN", os.path.join(ROOT, "target", "release", "slipstream"))
os.environ["SLIPSTREAM_BIN"] = BIN


def pct(xs, p):
    return xs[min(len(xs) - 1, int(len(xs) * p))]


def wait_channel(d, t):
    for _ in range(300):
        t.row(b"r0000")
        if "slipstream_hbase_notify_channel_up 1" in d.metrics():
            return
        time.sleep(0.2)
    raise RuntimeError("daemon never subscribed covered")


def run(variant):
    extra = {"none": ["--observer", "false"], "injvm": [], "net": ["--observer-port", "0"]}[variant]
    mini = hbaselib.MiniHBase(extra=extra).start()
    side = d = None
    try:
        if variant == "net":
            side = hbaselib.SidecarJvm(mini.info["zk"]).start()
        if variant != "none":
            # A generous call timeout: creating the table on a just-started mini cluster under
            # load can take longer than the default 5 s.
            d = hbaselib.HbaseDaemon((side or mini).sidecar_port, timeout_ms=30000).start()
        direct = hbaselib.Sidecar(mini.sidecar_port)
        name = b"lat"
        conn = happybase.Connection(mcwire.HOST, d.thrift_port, timeout=30000) if d else None
        if conn:
            conn.create_table(name, {"cf1": dict()})
            wait_channel(d, conn.table(name))
        else:
            c = hbaselib.Sidecar(mini.sidecar_port)
            # CREATE_TABLE: one family cf1 (max_versions 1, ttl 0, in memory false, block cache
            # true, compression NONE, bloom ROW).
            fam = (hbaselib._b(b"cf1") + (1).to_bytes(4, "big") + (0).to_bytes(4, "big") + b"\x00\x01"
                   + hbaselib._b(b"NONE") + hbaselib._b(b"ROW"))
            c.call("CREATE_TABLE", hbaselib._b(name) + (1).to_bytes(4, "big") + fam)
            c.close()
        rnd = random.Random(1)
        lat = []
        deadline = time.monotonic() + PUTS_S_MAX
        for i in range(WARM + N):
            if time.monotonic() > deadline:
                break
            row = b"r%04d" % rnd.randrange(1000)
            t0 = time.perf_counter_ns()
            direct.put(name, row, {b"cf1:v": b"%016d" % i})
            if i >= WARM:
                lat.append(time.perf_counter_ns() - t0)
        if not lat:
            raise RuntimeError("no Put measured within PUTS_S_MAX=%s s" % PUTS_S_MAX)
        lat.sort()
        us = [x / 1000 for x in lat]
        res = {"variant": variant, "n": len(us), "p50_us": pct(us, 0.5), "p90_us": pct(us, 0.9),
               "p99_us": pct(us, 0.99), "mean_us": sum(us) / len(us), "load": os.getloadavg()[0],
               "at": time.strftime("%H:%M:%S", time.gmtime())}
        print("%-6s n=%d p50=%.0f p90=%.0f p99=%.0f mean=%.0f us  load=%.1f" % (
            variant, res["n"], res["p50_us"], res["p90_us"], res["p99_us"], res["mean_us"], res["load"]), flush=True)
        direct.close()
        if conn:
            conn.close()
        return res
    finally:
        if d:
            d.stop()
        if side:
            side.stop()
        mini.stop()


if __name__ == "__main__":
    print("bench: N=%d WARM=%d order=%s, uptime: %s" % (N, WARM, ORDER, os.popen("uptime").read().strip()))
    runs = [run(v) for v in ORDER]
    summary = {}
    for v in dict.fromkeys(ORDER):
        p50s = sorted(r["p50_us"] for r in runs if r["variant"] == v)
        summary[v] = p50s[len(p50s) // 2]
        print("%-6s median p50 over %d runs: %.0f us" % (v, len(p50s), summary[v]))
    if OUT:
        os.makedirs(os.path.dirname(os.path.abspath(OUT)), exist_ok=True)
        with open(OUT, "w") as f:
            json.dump({"order": ORDER, "n": N, "warm": WARM, "runs": runs, "median_p50_us": summary}, f, indent=1)
