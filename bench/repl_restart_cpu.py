#!/usr/bin/env python3
"""repl_restart_cpu.py — where a restarted replica's CPU goes, by thread (issue 15).

Three daemons on loopback (bench/replbench.py's cluster: tenants t0/t1/t2 replicated on all
three, leaders spread, fsync batch, 50/6/2 raft clock), each tenant's log filled with FILL
sets (16-byte values, 1000 keys, pipelined 100 at a time), then ROUNDS times: node VICTIM is
SIGKILLed, restarted after 0.4 s, and every thread of the new process is sampled
(/proc/<pid>/task/*/schedstat: CPU ns per thread, threads that exit still counted at their
last sample; sampled every ~5 ms, so a thread's last few ms may be missed) until WINDOW_S
seconds after its first tenant port accepted (at most 20 s). Prints per round the CPU by thread name in that window and when the first tenant
port accepted. Lower-cost than failover_bench.py's latency figures, and not swamped by a
loaded box's latency noise: it counts the CPU a restart takes from the cores the running
nodes serve from.

Env: SLIPSTREAM_BIN, FILL (8000 per tenant), ROUNDS (3), VICTIM (3), WINDOW_S (1.5);
CPU_SHARES: this script and the daemons in a cpu group at those shares (bench/cpugroups.py),
removed at the end. Every daemon is killed at the end, failure or not. Not for: latency (failover_bench.py).
"""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import cpugroups  # noqa: E402
from replbench import Cluster, Tenant  # noqa: E402

TENANTS = ("t0", "t1", "t2")


def fill(port, tenant, n):
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    try:
        sent = 0
        while sent < n:
            k = min(100, n - sent)
            s.sendall(b"".join(b"set %s-%d 0 0 16\r\nvvvvvvvvvvvvvvvv\r\n" % (tenant.encode(), (sent + i) % 1000)
                               for i in range(k)))
            buf = b""
            while buf.count(b"STORED\r\n") < k:
                c = s.recv(65536)
                if not c:
                    raise RuntimeError("%s: connection closed while filling" % tenant)
                buf += c
            sent += k
    finally:
        s.close()


def threads(pid):
    """{tid: (name, CPU ns)} of the process's live threads."""
    out = {}
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return out
    for tid in tids:
        try:
            name = open("/proc/%d/task/%s/comm" % (pid, tid)).read().strip()
            ns = int(open("/proc/%d/task/%s/schedstat" % (pid, tid)).read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        out[tid] = (name, ns)
    return out


def main():
    n = int(os.environ.get("FILL", "8000"))
    rounds = int(os.environ.get("ROUNDS", "3"))
    victim = int(os.environ.get("VICTIM", "3"))
    window_s = float(os.environ.get("WINDOW_S", "1.5"))
    groups = cpugroups.from_env("slipstream-restart-cpu-%d" % os.getpid(), (1, 2, 3))
    if groups is not None:
        groups.setup()
        groups.join_clients()
    try:
        run(n, rounds, victim, window_s)
    finally:
        if groups is not None:
            groups.remove()


def run(n, rounds, victim, window_s):
    root = tempfile.mkdtemp(prefix="slipstream-restart-cpu-")
    tenants = [Tenant(t, replicas=3, preferred_leader=k + 1, share=0.3) for k, t in enumerate(TENANTS)]
    c = Cluster(root, (1, 2, 3), tenants, timing=(50, 6, 2), wait_ms=3000, fsync="batch")
    print("# %s, FILL %d per tenant, load %s" % (os.environ.get("SLIPSTREAM_BIN", "?"), n,
                                                  open("/proc/loadavg").read().split()[0]), flush=True)
    try:
        for node in (1, 2, 3):
            c.start(node)
        c.wait(c.settled, 60, "leaders spread and logs equal")
        for k, t in enumerate(TENANTS):
            fill(c.ports[k + 1][t], t, n)
        c.wait(c.caught_up, 60, "every node caught up after the fill")
        port = list(c.ports[victim].values())[0]
        for r in range(rounds):
            c.kill(victim)
            time.sleep(0.4)
            t0 = time.monotonic()
            with open(c.log(victim), "ab") as log:
                p = subprocess.Popen([os.environ.get("SLIPSTREAM_BIN", "target/release/slipstream"), "serve",
                                      "--config", c.config(victim)], stdin=subprocess.DEVNULL, stdout=log,
                                     stderr=log, start_new_session=True)
            c.procs[victim] = p
            seen, opened = {}, None
            while time.monotonic() - t0 < 20 and (opened is None or time.monotonic() - t0 < opened + window_s):
                seen.update(threads(p.pid))
                if opened is None:
                    try:
                        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                        opened = time.monotonic() - t0
                    except OSError:
                        pass
                time.sleep(0.005)
            c.wait(c.settled, 30, "round %d: node %d back" % (r, victim))
            by_name = {}
            for name, ns in seen.values():
                by_name[name] = by_name.get(name, 0) + ns
            print("round %d: port open after %.0f ms; CPU until %.1f s later %.1f ms: %s" % (
                r, (opened or -1) * 1000, window_s, sum(by_name.values()) / 1e6,
                ", ".join("%s %.1f" % (k, v / 1e6) for k, v in sorted(by_name.items(), key=lambda x: -x[1]))),
                flush=True)
    finally:
        c.stop_all()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
