#!/usr/bin/env python3
"""cpugroups.py — three "machines" on one box for the replication benchmarks (issue 15):
cgroup v1 cpu groups, one per node with an equal CFS quota, one for the load generators.

The one home of this rule for bench/replication_bench.sh (through the command line below),
bench/failover_bench.py and bench/isolation_bench.py (through `Groups`). Layout, under
/sys/fs/cgroup/cpu/<name> (and the same names under /sys/fs/cgroup/cpuacct to count CPU time):

    <name>            cpu.shares = SHARES (default 1024; common.md allows 65536 for a short
                      timed run, so that other sessions' builds yield to it)
    <name>/node1..N   cpu.cfs_quota_us = NODE_CPU x period: each daemon at most NODE_CPU cores
    <name>/clients    cpu.cfs_quota_us = CLIENT_CPU x period: the bench script and everything it
                      starts (load generators, writers) other than the daemons

With node_cpu = None only <name> is made (no quotas): the same shares, so a run with and a run
without the emulation differ only in the quotas. With node_cpu = "max" the node and clients'
groups are made without quotas (the same shares): each node's CPU time is counted, nothing
is limited (the plain runs of bench/repl_emulation_ab.sh, so per-node CPU is known in both). Daemons join `node<n>` as they start
(`preexec_fn`, or scripts/cluster.sh's CLUSTER_CGROUPS), so a restarted node rejoins its group.

What the emulation is: each node gets at most NODE_CPU cores of CPU time per CFS period (10 ms
by default, so a throttled node waits at most the rest of that period), whatever the other
nodes and the clients do, and the clients cannot take the nodes' CPU time — as if each node
were a machine of NODE_CPU cores. What it is not: the nodes still share the disk (fsync of
every node goes to the same device and journal), the L3 cache and memory bandwidth, the
kernel's loopback (softirq work is charged to whichever task runs when it happens), and the
same two physical cores (a node's threads can run on both at once within the quota), so it
emulates CPU capacity, not a network or separate caches.

Command line (for shell scripts): `cpugroups.py setup NAME NODES NODE_CPU CLIENT_CPU SHARES`
prints the directories to use (CLUSTER_CGROUPS for scripts/cluster.sh, then the clients'
cgroup.procs files); `cpugroups.py report NAME` prints a JSON line of each group's CPU seconds
and throttling; `cpugroups.py remove NAME` moves any task left to the root and removes the
groups (safe to call twice). Needs root and cgroup v1.
Not for: measuring (the benchmark scripts do) or tests.
"""

import json
import os
import sys

CPU = "/sys/fs/cgroup/cpu"
ACCT = "/sys/fs/cgroup/cpuacct"
PERIOD_US = 10000
# Real-time budget of the clients' group (isolation_bench.py runs t0's client under chrt -f);
# a cpu group with RT_GROUP_SCHED refuses real-time tasks unless it has one.
RT_RUNTIME_US = 100000


def _write(path, value):
    with open(path, "w") as fh:
        fh.write(str(value))


def _read(path):
    with open(path) as fh:
        return fh.read()


class Groups:
    def __init__(self, name, nodes, node_cpu=None, client_cpu=None, shares=1024):
        """node_cpu / client_cpu: cores (float) or None (no quota: groups for the shares only);
        node_cpu "max": a group per node and for the clients, no quotas (counting only)."""
        self.name = name
        self.nodes = list(nodes)
        self.node_cpu = node_cpu
        self.client_cpu = client_cpu
        self.shares = shares
        self.made = []

    def dirs(self, hier):
        top = os.path.join(hier, self.name)
        if self.node_cpu is None:
            return top, {}, top
        return top, {n: os.path.join(top, "node%d" % n) for n in self.nodes}, os.path.join(top, "clients")

    def setup(self):
        try:
            for hier in (CPU, ACCT):
                top, nodes, clients = self.dirs(hier)
                for d in [top] + list(nodes.values()) + ([clients] if clients != top else []):
                    os.makedirs(d, exist_ok=True)
                    self.made.append(d)
            top, nodes, clients = self.dirs(CPU)
            _write(os.path.join(top, "cpu.shares"), self.shares)
            for d in nodes.values():
                _write(os.path.join(d, "cpu.cfs_period_us"), PERIOD_US)
                if not self.counting_only():
                    _write(os.path.join(d, "cpu.cfs_quota_us"), int(self.node_cpu * PERIOD_US))
            if clients != top:
                _write(os.path.join(clients, "cpu.cfs_period_us"), PERIOD_US)
                if self.client_cpu is not None and not self.counting_only():
                    _write(os.path.join(clients, "cpu.cfs_quota_us"), int(self.client_cpu * PERIOD_US))
            for d in (top, clients) if clients != top else (top,):
                if os.path.exists(os.path.join(d, "cpu.rt_runtime_us")):
                    try:
                        _write(os.path.join(d, "cpu.rt_runtime_us"), RT_RUNTIME_US)
                    except OSError:
                        pass  # then chrt -f fails inside and the benches run without it (they say so)
        except BaseException:
            self.remove()
            raise
        return self

    def counting_only(self):
        return self.node_cpu == "max"

    def node_procs(self, n):
        """cgroup.procs files node n's daemon joins (none without the emulation)."""
        return [os.path.join(self.dirs(h)[1][n], "cgroup.procs") for h in (CPU, ACCT) if self.dirs(h)[1]]

    def client_procs(self):
        return [os.path.join(self.dirs(h)[2], "cgroup.procs") for h in (CPU, ACCT)]

    def join_clients(self, pid=None):
        """Moves `pid` (default: this process; its later children follow) into the clients' group."""
        for f in self.client_procs():
            _write(f, pid or os.getpid())

    def joiner(self, n):
        """A preexec_fn that moves the child into node n's group before it execs."""
        files = self.node_procs(n)

        def join():
            for f in files:
                _write(f, os.getpid())
        return join

    def report(self):
        """{group: {cpu_s, throttled_periods, throttled_s}} since setup."""
        out = {}
        top, nodes, clients = self.dirs(CPU)
        atop, anodes, aclients = self.dirs(ACCT)
        groups = [("all", top, atop)] + [("node%d" % n, nodes[n], anodes[n]) for n in nodes]
        if clients != top:
            groups.append(("clients", clients, aclients))
        for label, c, a in groups:
            try:
                st = dict(line.split() for line in _read(os.path.join(c, "cpu.stat")).splitlines() if line.strip())
                out[label] = {"cpu_s": round(int(_read(os.path.join(a, "cpuacct.usage"))) / 1e9, 3),
                              "throttled_periods": int(st.get("nr_throttled", 0)),
                              "throttled_s": round(int(st.get("throttled_time", 0)) / 1e9, 3)}
            except OSError:
                pass
        return out

    def describe(self):
        if self.node_cpu is None:
            return "no emulation (bench processes in one cpu group, cpu.shares %d)" % self.shares
        if self.counting_only():
            return ("no emulation (each daemon and the clients in their own cpu group without a quota, "
                    "for counting; cpu.shares %d over the groups)" % self.shares)
        return ("emulated machines: each node's daemon in its own cpu cgroup with %.2f cores (CFS quota %d us / "
                "%d us), clients %s, cpu.shares %d over the groups" %
                (self.node_cpu, int(self.node_cpu * PERIOD_US), PERIOD_US,
                 "%.2f cores" % self.client_cpu if self.client_cpu is not None else "no quota", self.shares))

    def remove(self):
        """Moves every task left in the groups to the root, then removes them (children first)."""
        for hier in (CPU, ACCT):
            top = os.path.join(hier, self.name)
            if not os.path.isdir(top):
                continue
            subs = sorted((os.path.join(top, d) for d in os.listdir(top) if os.path.isdir(os.path.join(top, d))),
                          reverse=True)
            for d in subs + [top]:
                for _ in range(20):  # bounded: tasks exiting or forking while we move them
                    try:
                        pids = _read(os.path.join(d, "cgroup.procs")).split()
                    except OSError:
                        break
                    if not pids:
                        break
                    for p in pids:
                        try:
                            _write(os.path.join(hier, "cgroup.procs"), p)
                        except OSError:
                            pass
                try:
                    os.rmdir(d)
                except OSError as e:
                    print("cpugroups: could not remove %s: %s" % (d, e), file=sys.stderr)


def from_env(name, nodes):
    """The benches' settings: NODE_CPU (cores per node; "max" = a group per node without a quota,
    for counting; unset or empty = no emulation), CLIENT_CPU
    (cores for the clients, default 0.5: 3 x 0.5 + 0.5 = the two cores; 0.3 throttled the load
    generators' bursts and set the figures), CPU_SHARES (default 1024). None when neither NODE_CPU nor CPU_SHARES is set."""
    node_cpu = os.environ.get("NODE_CPU", "")
    shares = os.environ.get("CPU_SHARES", "")
    if not node_cpu and not shares:
        return None
    client = os.environ.get("CLIENT_CPU", "0.5")
    return Groups(name, nodes, _cores(node_cpu), float(client) if client else None, int(shares or 1024))


def _cores(s):
    """NODE_CPU's spelling: cores, "max" (counting only) or empty (no groups per node)."""
    if not s:
        return None
    return "max" if s == "max" else float(s)


def main(argv):
    cmd = argv[1] if len(argv) > 1 else ""
    if cmd == "setup" and len(argv) == 7:
        name, nodes, node_cpu, client_cpu, shares = argv[2:]
        g = Groups(name, range(1, int(nodes) + 1), _cores(node_cpu),
                   float(client_cpu) if client_cpu else None, int(shares)).setup()
        # Line 1: the parent dirs scripts/cluster.sh puts node n under (<dir>/node<n>); empty
        # without the emulation. Line 2: the files the script writes its own pid to.
        print(" ".join(os.path.join(h, name) for h in (CPU, ACCT)) if g.node_cpu is not None else "")
        print(" ".join(g.client_procs()))
        print(g.describe())
    elif cmd == "report" and len(argv) == 3:
        print(json.dumps(Groups(argv[2], range(1, 65), 1.0).report()))
    elif cmd == "remove" and len(argv) == 3:
        Groups(argv[2], []).remove()
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
