"""A/B of builds on the each-row run walk (issue 16): one mini cluster, an all-row daemon (the
first binary in BINS) and one each-row daemon per binary in BINS (comma list of slipstream
binaries), loaded once; each each-row daemon warmed with random-start 100-row scans until a
random-start second has no miss; then ROUNDS rounds of SECS-second runs alternated (all-row at
64 fixed starts, each-row at random starts: nearly every scan a first walk), order reversed every
other round. Prints ops/s, CPU us/op (integer, from bench/hbase_load_bench.py) and the daemon's
CPU us/op to two decimals, load, p99. EXTRA: more load-generator arguments for the each-row runs
(`--keys 6500`: starts among the first 6,500 rows, all-row's working set). PROFILE=1: `perf
record` on each daemon in the first round (/tmp/perf-NAME.data; CG = call-graph mode).
Usage: BINS=/tmp/old,/tmp/new ROUNDS=4 SECS=3 python3 bench/hbase_walk_ab.py"""
import os, sys, time, subprocess
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.join(ROOT, "tests"))
os.environ.setdefault("PLOT_OUT", "/tmp/ignore.png")
import mcwire, hbaselib
import hbase_load_bench as B
bins = os.environ["BINS"].split(",")
rounds = int(os.environ.get("ROUNDS", "3"))
secs = float(os.environ.get("SECS", "3"))
extra = os.environ.get("EXTRA", "").split()
m = hbaselib.MiniHBase().start()
ds = {}
try:
    def start(name, binary, strategy):
        mcwire.SLIPSTREAM_BIN = binary
        d = hbaselib.HbaseDaemon(m.sidecar_port, strategy=strategy, memory_mb=512).start()
        ds[name] = d; B.CPU_PIDS[name] = d.proc.pid
        return "127.0.0.1:%d" % d.thrift_port
    addr = {"all-row": start("all-row", bins[0], "all-row")}
    for i, b in enumerate(bins):
        addr["each%d" % i] = start("each%d" % i, b, "each-row")
    B.run(addr["all-row"], "--load", secs=0)
    for n, a in addr.items():
        if n == "all-row":
            B.run(a, "--op", "scan", "--starts", "64", secs=1); continue
        for _ in range(8):
            B.run(a, "--op", "scan", "--starts", "0", secs=2)
            h0, m0 = B.counts(ds[n]); B.run(a, "--op", "scan", "--starts", "0", secs=1); h1, m1 = B.counts(ds[n])
            if m1 == m0: break
        print(n, "warm: misses in a random second", m1 - m0, flush=True)
    order = list(addr)
    res = {}
    for r in range(rounds):
        o = order if r % 2 == 0 else order[::-1]
        for n in o:
            starts = "64" if n == "all-row" else "0"
            prof = None
            if os.environ.get("PROFILE") and r == 0:
                prof = subprocess.Popen(["perf", "record", "-F", "2000", "--call-graph", os.environ.get("CG", "fp"), "-o", "/tmp/perf-%s.data" % n, "-p", str(ds[n].proc.pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            ex = extra if n != "all-row" else []
            c0 = B.proc_cpu_s(ds[n].proc.pid); t0 = time.time()
            x = B.run(addr[n], "--op", "scan", "--starts", starts, *ex, secs=secs, daemon=n)
            c1 = B.proc_cpu_s(ds[n].proc.pid); t1 = time.time()
            x["cpu_per_op"] += " | daemon %.2f us/op" % ((c1 - c0) * 1e6 / (float(x["ops_per_s"]) * (t1 - t0)))
            if prof:
                prof.send_signal(2); prof.wait()
            load = open("/proc/loadavg").read().split()[0]
            res.setdefault(n, []).append((float(x["ops_per_s"]), x["cpu_per_op"], load, x["p99_us"]))
            print(n, res[n][-1], flush=True)
    for n, v in res.items():
        rates = sorted(a[0] for a in v)
        print("%s median %.0f  runs %s" % (n, rates[len(rates)//2], [int(a[0]) for a in v]))
finally:
    for d in ds.values(): d.stop()
    m.stop()
