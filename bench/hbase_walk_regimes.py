"""Regimes of the each-row first walk over daemon starts (issue 16, session 15): one mini cluster,
one all-row daemon (64 fixed starts, every scan a hit) kept for the whole run, and STARTS each-row
daemons per variant started one after another (variants interleaved), each warmed with
random-start 100-row scans until a random-start second has no miss, then ROUNDS runs of SECS s of
first walks (`--starts 0`), each next to an all-row run. Prints one line per daemon start: scans/s
and daemon CPU us per scan of the walk and of the all-row run beside it.
VARIANTS: `name=command prefix;...` (e.g. `plain=;noaslr=setarch -R`), the prefix run before the
binary (a wrapper script per variant execs it, so the daemon keeps its pid); after a `|`, a
prefix for the load generator in that variant's runs (e.g. `split=taskset -c 0|taskset -c 1`); a
daemon prefix `taskset -c CPUS` also moves the all-row daemon to CPUS for that variant's runs. BIN: the binary
(default target/release/slipstream); a variant `name@/path/bin=prefix` uses that binary.
Usage: VARIANTS='plain=;noaslr=setarch -R' STARTS=6 ROUNDS=2 SECS=2 python3 bench/hbase_walk_regimes.py"""
import os, sys, time, stat, signal, subprocess
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.join(ROOT, "tests"))
os.environ.setdefault("PLOT_OUT", "/tmp/ignore.png")
import mcwire, hbaselib
import hbase_load_bench as B

BIN = os.path.abspath(os.environ.get("BIN", os.path.join(ROOT, "target", "release", "slipstream")))
STARTS = int(os.environ.get("STARTS", "6"))
ROUNDS = int(os.environ.get("ROUNDS", "2"))
SECS = float(os.environ.get("SECS", "2"))
# Re-warms per start: every row rewritten through the daemon (dropped), warmed and measured again.
REWARM = int(os.environ.get("REWARM", "0"))
# EVENTS: `perf stat` events counted on the daemon during each run, printed per scan.
EVENTS = os.environ.get("EVENTS", "")
# PROFILE=1: `perf record -g` on each each-row daemon's first walk run (/tmp/perf-regime-NAME-START.data).
PROFILE = os.environ.get("PROFILE") == "1"
variants = []
for v in os.environ.get("VARIANTS", "plain=").split(";"):
    name, prefix = v.split("=", 1)
    prefix, cprefix = (prefix.split("|", 1) + [""])[:2]
    binary = BIN
    if "@" in name:
        name, binary = name.split("@", 1)
    w = "/tmp/slip-wrap-%d-%s.sh" % (os.getpid(), name)
    with open(w, "w") as f:
        f.write("#!/bin/sh\nexec %s %s \"$@\"\n" % (prefix, binary))
    os.chmod(w, os.stat(w).st_mode | stat.S_IEXEC)
    cw = B.LOAD
    if cprefix:
        cw = "/tmp/slip-wrap-%d-%s-client.sh" % (os.getpid(), name)
        with open(cw, "w") as f:
            f.write("#!/bin/sh\nexec %s %s \"$@\"\n" % (cprefix, B.LOAD))
        os.chmod(cw, os.stat(cw).st_mode | stat.S_IEXEC)
    cpus = prefix.split()[2] if prefix.startswith("taskset -c ") else "0-%d" % (os.cpu_count() - 1)
    variants.append((name, w, cw, cpus))


def user_sys(pid):
    """(user, system) CPU seconds of a process so far."""
    try:
        f = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0, 0.0
    return int(f[11]) / os.sysconf("SC_CLK_TCK"), int(f[12]) / os.sysconf("SC_CLK_TCK")


def minflt(pid):
    """Minor page faults of a process so far (all its threads)."""
    try:
        return int(open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()[7])
    except OSError:
        return 0


def smaps_huge(pid):
    try:
        for line in open("/proc/%d/smaps_rollup" % pid):
            if line.startswith("AnonHugePages"):
                return int(line.split()[1]) // 1024
    except OSError:
        pass
    return -1


m = hbaselib.MiniHBase().start()
ds = []
try:
    mcwire.SLIPSTREAM_BIN = BIN
    allr = hbaselib.HbaseDaemon(m.sidecar_port, strategy="all-row", memory_mb=512).start()
    ds.append(allr)
    B.CPU_PIDS["all-row"] = allr.proc.pid
    aaddr = "127.0.0.1:%d" % allr.thrift_port
    B.run(aaddr, "--load", secs=0)
    B.run(aaddr, "--op", "scan", "--starts", "64", secs=1)
    res = {}
    for i in range(STARTS):
        for name, w, cw, cpus in variants:
            mcwire.SLIPSTREAM_BIN = w
            B.LOAD = cw
            # The all-row daemon runs on the variant's daemon CPUs too (its threads and the
            # connection threads it starts from now on).
            subprocess.run(["taskset", "-a", "-p", "-c", cpus, str(allr.proc.pid)], stdout=subprocess.DEVNULL, check=True)
            d = hbaselib.HbaseDaemon(m.sidecar_port, strategy="each-row", memory_mb=512).start()
            ds.append(d)
            B.CPU_PIDS["each"] = d.proc.pid
            a = "127.0.0.1:%d" % d.thrift_port
            for k in range(REWARM + 1):
              if k:
                B.run(a, "--load", secs=0)  # rewrites every row: each write drops the cached row
              for _ in range(10):
                B.run(a, "--op", "scan", "--starts", "0", secs=2)
                h0, m0 = B.counts(d)
                B.run(a, "--op", "scan", "--starts", "0", secs=1)
                h1, m1 = B.counts(d)
                if m1 == m0:
                    break
              line = []
              for r in range(ROUNDS):
                for who, addr, starts in (("each", a, "0"), ("all-row", aaddr, "64"))[:: 1 if r % 2 == 0 else -1]:
                    pid = B.CPU_PIDS[who]
                    prof = None
                    if PROFILE and r == 0 and who == "each":
                        prof = subprocess.Popen(["perf", "record", "-F", "2000", "-g", "-o", "/tmp/perf-regime-%s-%d.data" % (name, i),
                                                 "-p", str(pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    ps = None
                    if EVENTS:
                        ps = subprocess.Popen(["perf", "stat", "-x", ",", "-e", EVENTS, "-p", str(pid)],
                                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                    c0 = B.proc_cpu_s(pid); f0 = minflt(pid); u0 = user_sys(pid); t0 = time.time()
                    x = B.run(addr, "--op", "scan", "--starts", starts, secs=SECS, daemon=who)
                    c1 = B.proc_cpu_s(pid); f1 = minflt(pid); u1 = user_sys(pid); t1 = time.time()
                    ev = ""
                    if prof:
                        prof.send_signal(signal.SIGINT)
                        prof.wait(timeout=60)
                    if ps:
                        ps.send_signal(signal.SIGINT)
                        err = ps.communicate(timeout=30)[1]
                        n = float(x["ops_per_s"]) * (t1 - t0)
                        for l in err.splitlines():
                            f = l.split(",")
                            if len(f) > 2 and f[0].replace(".", "").isdigit():
                                ev += " %s=%.2f" % (f[2].split(":")[-1].replace("sys_enter_", ""), float(f[0]) / n)
                    scans = float(x["ops_per_s"]) * (t1 - t0)
                    us = (c1 - c0) * 1e6 / scans
                    res.setdefault((name, who), []).append((float(x["ops_per_s"]), us))
                    line.append("%s %.0f/s %.2fus (user %.2f sys %.2f) %.3fflt%s" % (who, float(x["ops_per_s"]), us, (u1[0] - u0[0]) * 1e6 / scans, (u1[1] - u0[1]) * 1e6 / scans, (f1 - f0) / scans, ev))
              load = open("/proc/loadavg").read().split()[0]
              print("%s start %d.%d pid %d: %s | warm misses %d | AnonHuge %d MB | load %s" % (
                name, i, k, d.proc.pid, "; ".join(line), m1 - m0, smaps_huge(d.proc.pid), load), flush=True)
            d.stop(); ds.remove(d)
    for (name, who), v in sorted(res.items()):
        if who != "each":
            continue
        us = sorted(x[1] for x in v)
        print("%s: walk daemon us/scan %s" % (name, " ".join("%.2f" % u for u in us)))
    v = res.get((variants[0][0], "all-row"), [])
finally:
    for d in ds: d.stop()
    m.stop()
