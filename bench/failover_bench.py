#!/usr/bin/env python3
"""failover_bench.py — leader-kill failover of replicated tenants (issue 15), `make bench`.

Three daemons on loopback (tests/replcluster.py's launcher), tenants t0/t1/t2 replicated on
all three, preferred leaders spread (t0 on node 1, t1 on node 2, t2 on node 3), fsync batch.
One writer process per tenant sends `set` requests one at a time, paced (WRITE_RATE per
second), each with a client timeout (CLIENT_TIMEOUT_MS: an unanswered request is abandoned,
the connection dropped and a new one opened, as a memcached client does), and logs
send/answer times (CLOCK_MONOTONIC, shared by the processes).

Each of KILLS rounds: the round's tenant k = round % 3; its writer is pointed at a node that
does not lead it (it survives: its writes are forwarded), the others at their leaders; after
QUIET_S of quiet (the baseline window) the leader of tenant k is SIGKILLed (SIGNAL=KILL, the
default: its sockets close at once) or SIGSTOPped (SIGNAL=STOP: a hung process whose sockets
stay open, found only by the election timeout); the failover time is from the signal to the
answer of the first write sent after it that is acknowledged (`STORED`: committed by the new
leader and applied). Then the killed node is restarted (a stopped one gets SIGCONT), the
round waits until every node has applied the same index for every tenant and the preferred
leaders are back (the disturbed window ends there). Writes of the tenants whose leader was not
killed: latency in the disturbed windows vs in the quiet windows (paired: the quiet window just
before each kill).

Runs once per TIMINGS entry ("tick_ms/election_ticks/heartbeat_ticks", raft's clock, the
`[cluster]` keys), so a before/after of a tuning is one run. Writes JSON to OUT
(bench/results/failover-<date>.json) and a plot (docs/img/failover.png) and prints a summary.

Env: KILLS (20), SIGNAL (KILL or STOP), TIMINGS ("100/10/3 50/8/2"), WRITE_RATE (100 per writer per s),
CLIENT_TIMEOUT_MS (200), QUIET_S (2), WAIT_MS (daemon wait_ms, 3000), FSYNC (batch),
SLIPSTREAM_BIN; NODE_CPU / CLIENT_CPU / CPU_SHARES: emulated machines (bench/cpugroups.py:
each daemon in its own cpu cgroup with NODE_CPU cores, this script and its writers in a clients'
group), removed at the end.
Every daemon is SIGKILLed and every writer stopped at the end, failure or not; waits bounded.
Not for: correctness under faults (replication_linearizable.rs, test_replication_faults.py).
"""

import json
import os
import select
import shutil
import signal
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
NODES = (1, 2, 3)
ROUND_S_MAX = 60.0  # one round (kill, new leader, restart, catch-up) must end within this
FSYNC = os.environ.get("FSYNC", "batch")
SIGNAL = os.environ.get("SIGNAL", "KILL")  # KILL (process dies) or STOP (process hangs)


def pct(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100.0 * len(xs)))]


# ---------------------------------------------------------------- writer process


def writer(args):
    """`failover_bench.py writer TENANT PORT1,PORT2,PORT3 NODE OUT RATE TIMEOUT_MS MAX_S`:
    write until stdin closes (or MAX_S); stdin lines `node N` switch the node."""
    tenant, ports, node, out, rate, timeout_ms, max_s = args
    ports = [int(p) for p in ports.split(",")]
    node, rate, timeout_s, max_s = int(node), float(rate), int(timeout_ms) / 1000.0, float(max_s)
    value = b"v" * 16
    sock = None
    interval = 1.0 / rate
    end = time.monotonic() + max_s
    nxt = time.monotonic()
    i = 0
    with open(out, "w", buffering=1) as log:
        while time.monotonic() < end:
            r, _, _ = select.select([sys.stdin], [], [], 0)
            if r:
                line = sys.stdin.readline()
                if not line:
                    break
                if line.startswith("node "):
                    node = int(line.split()[1])
                    if sock is not None:
                        sock.close()
                        sock = None
            now = time.monotonic()
            if now < nxt:
                time.sleep(nxt - now)
            nxt = max(nxt + interval, time.monotonic())
            if sock is None:
                try:
                    sock = socket.create_connection(("127.0.0.1", ports[node - 1]), timeout=timeout_s)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                except OSError:
                    sock = None
                    log.write("%d %d conn %d\n" % (time.monotonic_ns(), time.monotonic_ns(), node))
                    continue
            i += 1
            req = b"set %s-%d 0 0 %d\r\n%s\r\n" % (tenant.encode(), i % 1000, len(value), value)
            t0 = time.monotonic_ns()
            status = "err"
            try:
                sock.settimeout(timeout_s)
                sock.sendall(req)
                buf = b""
                deadline = time.monotonic() + timeout_s
                while not buf.endswith(b"\r\n"):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise socket.timeout()
                    sock.settimeout(left)
                    chunk = sock.recv(4096)
                    if not chunk:
                        raise ConnectionError("closed")
                    buf += chunk
                status = "ok" if buf == b"STORED\r\n" else "err"
            except socket.timeout:
                status = "timeout"
                sock.close()
                sock = None
            except OSError:
                status = "conn"
                sock.close()
                sock = None
            log.write("%d %d %s %d\n" % (t0, time.monotonic_ns(), status, node))


# ---------------------------------------------------------------- cluster


def proc_cpu_ms(pid):
    """CPU time (user + system, ms) a process has used so far; None if it is gone."""
    try:
        f = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(f[11]) + int(f[12])) * 1000.0 / os.sysconf("SC_CLK_TCK")


def read_log(path):
    rows = []
    with open(path) as fh:
        for line in fh:
            p = line.split()
            if len(p) == 4:
                rows.append((int(p[0]), int(p[1]), p[2], int(p[3])))
    return rows


class Tail:
    """Reads a writer's log from where it left off (polling must not cost the box much:
    it runs while the other tenants' latency is measured)."""

    def __init__(self, path):
        self.fh = open(path)
        self.part = ""

    def first_ack_after(self, t_kill):
        chunk = self.part + self.fh.read()
        lines = chunk.split("\n")
        self.part = lines.pop()
        for line in lines:
            p = line.split()
            if len(p) == 4 and p[2] == "ok" and int(p[0]) >= t_kill:
                return int(p[1])
        return None


def run_timing(timing, kills, rate, client_timeout_ms, quiet_s, wait_ms, root, groups=None):
    tenants = [Tenant(t, replicas=3, preferred_leader=k + 1, share=0.3) for k, t in enumerate(TENANTS)]
    c = Cluster(root, NODES, tenants, timing=timing, wait_ms=wait_ms, fsync=FSYNC, groups=groups)
    writers = {}
    rounds = []
    try:
        for n in NODES:
            c.start(n)
        c.wait(c.settled, 60, "leaders spread and logs equal")
        logs = {t: os.path.join(root, "writer-%s.log" % t) for t in TENANTS}
        for k, t in enumerate(TENANTS):
            ports = ",".join(str(c.ports[n][t]) for n in NODES)
            writers[t] = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "writer", t, ports, str(k + 1), logs[t],
                 str(rate), str(client_timeout_ms), str(kills * ROUND_S_MAX + 120)],
                stdin=subprocess.PIPE, text=True)
        # Each writer has written (Python starts slowly on a loaded box).
        c.wait(lambda: all(os.path.exists(p) and os.path.getsize(p) > 0 for p in logs.values()), 60,
               "the writers' first writes")
        tails = {t: Tail(logs[t]) for t in TENANTS}
        for r in range(kills):
            k = r % len(TENANTS)
            victim_t = TENANTS[k]
            tails[victim_t].first_ack_after(time.monotonic_ns() + 10**12)  # skip to the end
            lead = c.leaders(NODES)
            victim = lead[victim_t]
            if victim == 0:
                raise RuntimeError("round %d: no agreed leader of %s" % (r, victim_t))
            # The killed tenant's writer goes through a surviving follower; the others through
            # their leaders (surviving too while the leaders are spread).
            for t in TENANTS:
                via = lead[t] if t != victim_t else victim % len(NODES) + 1
                if via == victim:
                    via = victim % len(NODES) + 1
                writers[t].stdin.write("node %d\n" % via)
                writers[t].stdin.flush()
            time.sleep(0.3)
            t_quiet = time.monotonic_ns()
            time.sleep(quiet_s)
            others = [t for t in TENANTS if lead[t] != victim]
            t_kill = time.monotonic_ns()
            stopped = None
            if SIGNAL == "STOP":
                stopped = c.procs[victim]
                stopped.send_signal(signal.SIGSTOP)
            else:
                c.kill(victim)
            # Bounded: the first acknowledged write sent after the kill.
            deadline = time.monotonic() + ROUND_S_MAX / 2
            ack = None
            while time.monotonic() < deadline:
                ack = tails[victim_t].first_ack_after(t_kill)
                if ack is not None:
                    break
                time.sleep(0.02)
            if ack is None:
                if stopped is not None:
                    stopped.send_signal(signal.SIGCONT)
                raise RuntimeError("round %d: no write acknowledged after killing node %d" % (r, victim))
            new_lead = c.leaders([n for n in NODES if n != victim])[victim_t]
            time.sleep(0.3)
            t_restart = time.monotonic_ns()
            if stopped is not None:
                stopped.send_signal(signal.SIGCONT)
            else:
                c.start(victim)
            t_open = time.monotonic_ns()  # the restarted daemon's ports answer (process start, replay)
            cpu_open = proc_cpu_ms(c.procs[victim].pid)
            c.wait(c.caught_up, ROUND_S_MAX, "round %d: restarted node %d caught up" % (r, victim))
            t_caught = time.monotonic_ns()  # every node applied the same index (leaders may still move)
            c.wait(c.settled, ROUND_S_MAX, "round %d: restarted node %d caught up" % (r, victim))
            t_end = time.monotonic_ns()
            cpu_end = proc_cpu_ms(c.procs[victim].pid)
            rounds.append({"round": r, "tenant": victim_t, "killed_node": victim, "new_leader": new_lead,
                           "signal": SIGNAL, "failover_ms": (ack - t_kill) / 1e6, "quiet_ns": [t_quiet, t_kill],
                           "disturbed_ns": [t_kill, t_end], "down_ns": [t_kill, t_restart],
                           "catchup_ns": [t_restart, t_end], "start_ns": [t_restart, t_open],
                           "restarted_cpu_ms": [cpu_open, cpu_end], "replay_ns": [t_open, t_caught], "back_ns": [t_caught, t_end], "others": others})
            print("  round %2d: %s node %d (leader of %s) -> new leader %s, first ack after %.0f ms, "
                  "settled after %.1f s" % (r, "stopped" if stopped else "killed", victim, victim_t, new_lead,
                                             (ack - t_kill) / 1e6,
                                             (t_end - t_kill) / 1e9), flush=True)
        elections = {n: sum(m.get(("slipstream_replica_elections_won_total", t), 0) for t in TENANTS)
                     for n, m in c.view(NODES).items()}
    finally:
        for w in writers.values():
            try:
                w.stdin.close()
            except OSError:
                pass
        for w in writers.values():
            try:
                w.wait(timeout=10)
            except subprocess.TimeoutExpired:
                w.kill()
                w.wait()
        c.stop_all()
    # Latency of the tenants whose leader was not killed: quiet vs disturbed windows.
    # catchup = start (restart to the ports answering) + replay (to every node at the same
    # applied index) + back (to the preferred leaders back)
    windows = ("quiet", "disturbed", "down", "catchup", "start", "replay", "back")
    samples = {w: [] for w in windows}
    errors = {w: 0 for w in windows}
    error_kinds = {w: {} for w in windows}  # status (err = a reply other than STORED, timeout, conn) -> count
    offsets = []  # (ms after the kill, latency ms) of the disturbed windows' writes
    restart_offsets = []  # (ms after the restart, latency ms) of the catch-up windows' writes
    for t in TENANTS:
        rows = read_log(logs[t])
        for rd in rounds:
            if t not in rd["others"]:
                continue
            for w in windows:
                a, b = rd[w + "_ns"]
                for send, ans, status, _ in rows:
                    if a <= send < b:
                        if status == "ok":
                            samples[w].append((ans - send) / 1e6)
                            if w == "disturbed":
                                offsets.append(((send - a) / 1e6, (ans - send) / 1e6))
                            if w == "catchup":
                                restart_offsets.append(((send - a) / 1e6, (ans - send) / 1e6))
                        else:
                            errors[w] += 1
                            error_kinds[w][status] = error_kinds[w].get(status, 0) + 1
    fo = [rd["failover_ms"] for rd in rounds]
    # Where the slow writes fall: the disturbed windows' writes slower than the quiet p99, by
    # their time after the kill (what part of a failover hurts the others).
    q99 = pct(samples["quiet"], 99) or 0
    slow = [o for o, lat in offsets if lat > q99]
    bins = [0, 100, 300, 1000, 2000, 5000, 10**9]
    slow_by_offset = {"%d-%s ms" % (lo, hi if hi < 10**9 else "end"): sum(1 for o in slow if lo <= o < hi)
                      for lo, hi in zip(bins, bins[1:])}
    all_by_offset = {"%d-%s ms" % (lo, hi if hi < 10**9 else "end"): sum(1 for o, _ in offsets if lo <= o < hi)
                     for lo, hi in zip(bins, bins[1:])}
    rbins = [0, 50, 100, 200, 400, 700, 1000, 2000, 10**9]
    slow_after_restart = {"%d-%s ms" % (lo, hi if hi < 10**9 else "end"):
                          [sum(1 for o, lat in restart_offsets if lo <= o < hi and lat > q99),
                           sum(1 for o, _ in restart_offsets if lo <= o < hi)]
                          for lo, hi in zip(rbins, rbins[1:])}
    cpu = [rd["restarted_cpu_ms"] for rd in rounds if None not in rd["restarted_cpu_ms"]]
    restarted_cpu = {"to_ports_open_p50": pct([a for a, _ in cpu], 50), "to_settled_p50": pct([b for _, b in cpu], 50)}
    phase_ms = {w: pct([(rd[w + "_ns"][1] - rd[w + "_ns"][0]) / 1e6 for rd in rounds], 50)
                for w in ("down", "start", "replay", "back")}
    return {
        "slow_after_restart": slow_after_restart,
        "phase_ms_p50": phase_ms,
        "restarted_cpu_ms": restarted_cpu,
        "slow_after_kill": {"slower_than_quiet_p99": slow_by_offset, "all": all_by_offset},
        "timing": {"tick_ms": timing[0], "election_ticks": timing[1], "heartbeat_ticks": timing[2]},
        "rounds": rounds,
        "failover_ms": {"p50": pct(fo, 50), "p99": pct(fo, 99), "max": max(fo), "min": min(fo), "n": len(fo)},
        # disturbed = down (kill to restart) + catchup (restart to settled)
        "others_latency_ms": {w: {"p50": pct(samples[w], 50), "p99": pct(samples[w], 99), "n": len(samples[w]),
                                  "errors": errors[w], "error_kinds": error_kinds[w]} for w in windows},
        "others_samples_ms": {"quiet": samples["quiet"], "disturbed": samples["disturbed"]},
        "elections_won_by_node": elections,
    }


def plot(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for res in results:
        tm = res["timing"]
        label = "tick %d ms, election %d-%d ticks" % (tm["tick_ms"], tm["election_ticks"], 2 * tm["election_ticks"])
        fo = sorted(rd["failover_ms"] for rd in res["rounds"])
        a.plot(fo, [(i + 1) / len(fo) for i in range(len(fo))], marker=".", label=label)
        for name, style in (("quiet", "--"), ("disturbed", "-")):
            xs = sorted(res["others_samples_ms"][name])
            if xs:
                b.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], style, label="%s: %s" % (label, name))
    a.axvline(1000, color="grey", lw=0.8)
    a.set_xlabel("kill -> first acknowledged write (ms)")
    a.set_ylabel("fraction of kills")
    a.set_title("Failover time (leader SIG%s)" % SIGNAL)
    a.legend(fontsize=8)
    b.set_xscale("log")
    b.set_xlabel("write latency (ms), tenants whose leader was not killed")
    b.set_ylabel("CDF")
    b.set_title("Other tenants: quiet vs during failover")
    b.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "writer":
        writer(sys.argv[2:])
        return
    kills = int(os.environ.get("KILLS", "20"))
    timings = [tuple(int(x) for x in s.split("/")) for s in os.environ.get("TIMINGS", "100/10/3 50/8/2").split()]
    rate = float(os.environ.get("WRITE_RATE", "100"))
    client_timeout_ms = int(os.environ.get("CLIENT_TIMEOUT_MS", "200"))
    quiet_s = float(os.environ.get("QUIET_S", "2"))
    wait_ms = int(os.environ.get("WAIT_MS", "3000"))
    repo = os.path.abspath(os.path.join(HERE, ".."))
    out = os.environ.get("OUT", os.path.join(repo, "bench", "results", "failover-%s.json" % time.strftime("%Y%m%d-%H%M%S")))
    if SIGNAL not in ("KILL", "STOP"):
        raise SystemExit("SIGNAL=%s: KILL or STOP" % SIGNAL)
    png = os.environ.get("PNG", os.path.join(repo, "docs", "img", "failover.png" if SIGNAL == "KILL" else "failover-stop.png"))
    commit = subprocess.run(["git", "-C", repo, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    results = []
    groups = cpugroups.from_env("slipstream-failover-%d" % os.getpid(), NODES)
    if groups is not None:
        groups.setup()
        groups.join_clients()
    print("# %s" % (groups.describe() if groups else "no emulation"), flush=True)
    try:
        run_all(timings, kills, rate, client_timeout_ms, quiet_s, wait_ms, groups, results)
    finally:
        if groups is not None:
            groups.remove()
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as fh:
        json.dump({"commit": commit, "signal": SIGNAL, "fsync": FSYNC, "kills": kills, "write_rate": rate, "client_timeout_ms": client_timeout_ms,
                   "quiet_s": quiet_s, "wait_ms": wait_ms, "cpu_groups": groups.describe() if groups else "none",
                   "results": [{k: v for k, v in r.items() if k != "others_samples_ms"} for r in results]},
                  fh, indent=1)
    os.makedirs(os.path.dirname(png), exist_ok=True)
    plot(results, png)
    print("wrote %s and %s" % (out, png))


def run_all(timings, kills, rate, client_timeout_ms, quiet_s, wait_ms, groups, results):
    for timing in timings:
        root = tempfile.mkdtemp(prefix="slipstream-failover-")
        try:
            load_before = open("/proc/loadavg").read().split()[:3]
            print("timing %s: %d SIG%s rounds, writers %g/s each, client timeout %d ms, load %s" %
                  ("/".join(map(str, timing)), kills, SIGNAL, rate, client_timeout_ms, " ".join(load_before)), flush=True)
            cg_before = groups.report() if groups else {}
            res = run_timing(timing, kills, rate, client_timeout_ms, quiet_s, wait_ms, root, groups)
            if groups:
                cg_after = groups.report()
                res["cpu_groups"] = {g: {k: round(v - cg_before.get(g, {}).get(k, 0), 3) for k, v in d.items()}
                                     for g, d in cg_after.items()}
                print("  cpu groups over the run: %s" % json.dumps(res["cpu_groups"]), flush=True)
            res["load_before"] = load_before
            res["load_after"] = open("/proc/loadavg").read().split()[:3]
            results.append(res)
            f, q = res["failover_ms"], res["others_latency_ms"]
            rise = (q["disturbed"]["p99"] / q["quiet"]["p99"] - 1) * 100 if q["quiet"]["p99"] else float("nan")
            print("  failover p50 %.0f ms p99 %.0f ms (max %.0f, n %d); others' write p99 quiet %.2f ms -> "
                  "during failover %.2f ms (%+.0f%%), p50 %.2f -> %.2f ms; errors %d %s / %d %s; load after %s" %
                  (f["p50"], f["p99"], f["max"], f["n"], q["quiet"]["p99"], q["disturbed"]["p99"], rise,
                   q["quiet"]["p50"], q["disturbed"]["p50"], q["quiet"]["errors"], q["quiet"]["error_kinds"],
                   q["disturbed"]["errors"], q["disturbed"]["error_kinds"], " ".join(res["load_after"])), flush=True)
            print("  others' writes slower than the quiet p99, by time after the kill: %s (of all: %s)" %
                  (res["slow_after_kill"]["slower_than_quiet_p99"], res["slow_after_kill"]["all"]), flush=True)
            print("  phases (p50 ms): %s; others' writes [slower than quiet p99, all] by ms after the restart: %s"
                  % (res["phase_ms_p50"], res["slow_after_restart"]), flush=True)
            print("  restarted daemon's CPU (ms, p50): %s" % res["restarted_cpu_ms"], flush=True)
            print("  others' write p99: start %.2f ms (n %d), replay %.2f ms (n %d), back %.2f ms (n %d)" %
                  (q["start"]["p99"] or 0, q["start"]["n"], q["replay"]["p99"] or 0, q["replay"]["n"],
                   q["back"]["p99"] or 0, q["back"]["n"]), flush=True)
            print("  others' write p50/p99: node down %.2f/%.2f ms (n %d), restart+catch-up %.2f/%.2f ms (n %d)" %
                  (q["down"]["p50"], q["down"]["p99"], q["down"]["n"], q["catchup"]["p50"], q["catchup"]["p99"],
                   q["catchup"]["n"]), flush=True)
        finally:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    main()
