"""The cluster of the replication benchmarks (bench/failover_bench.py, bench/isolation_bench.py):
three (or more) `slipstream serve --config` daemons on loopback, started and killed through
tests/replcluster.py's launcher, with the configs these benchmarks need (raft timing keys,
shaping, tenants that live on some nodes only), and the few metrics they wait on (leaders,
applied indexes).

Not for: tests (each test file writes its own configs on replcluster.Daemons) or measuring
(the benchmark scripts do that).
"""

import os
import socket
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import replcluster  # noqa: E402


class Tenant:
    """A `[[tenant]]`: replicated on every node (replicas = nodes) or, with replicas = 1, on
    the nodes in `on` only."""

    def __init__(self, name, replicas, share, preferred_leader=None, on=None, memory_mb=16):
        self.name = name
        self.replicas = replicas
        self.share = share
        self.preferred_leader = preferred_leader
        self.on = on
        self.memory_mb = memory_mb


class Cluster(replcluster.Daemons):
    start_s = 20.0

    def __init__(self, root, nodes, tenants, timing=None, wait_ms=3000, fsync="batch", shaping=None, groups=None):
        """timing: (tick_ms, election_ticks, heartbeat_ticks) or None (the daemon's defaults);
        shaping: lines of a `[shaping]` section or None; groups: a set-up bench/cpugroups.py
        `Groups` whose node groups the daemons join (every start, restarts too) or None."""
        super().__init__(root)
        if groups is not None and groups.node_cpu is not None:
            self.preexec = {n: groups.joiner(n) for n in nodes}
        self.nodes = list(nodes)
        self.tenants = list(tenants)
        self.timing = timing
        self.wait_ms = wait_ms
        self.fsync = fsync
        self.shaping = shaping
        f = self.fresh_port
        self.raft = {n: f() for n in self.nodes}
        self.ports = {n: {t.name: f() for t in self.tenants if t.on is None or n in t.on} for n in self.nodes}
        self.admin = {n: f() for n in self.nodes}
        self.server_port = {n: f() for n in self.nodes}
        for n in self.nodes:
            self.write_config(n)

    def replicated(self):
        return [t.name for t in self.tenants if t.replicas > 1]

    def write_config(self, n):
        lines = [
            "[server]", 'listen = "127.0.0.1"', "threads = 2", "port = %d" % self.server_port[n],
            'admin = "127.0.0.1:%d"' % self.admin[n], "",
        ]
        if self.shaping:
            lines += ["[shaping]"] + list(self.shaping) + [""]
        lines += [
            "[cluster]", "node_id = %d" % n,
            "peers = [%s]" % ", ".join('"%d=127.0.0.1:%d"' % (p, self.raft[p]) for p in self.nodes),
            'data_dir = "%s"' % self.data_dir(n), 'fsync = "%s"' % self.fsync, "wait_ms = %d" % self.wait_ms,
        ]
        if self.timing:
            lines += ["tick_ms = %d" % self.timing[0], "election_ticks = %d" % self.timing[1],
                      "heartbeat_ticks = %d" % self.timing[2]]
        for t in self.tenants:
            if t.name not in self.ports[n]:
                continue
            lines += ["", "[[tenant]]", 'name = "%s"' % t.name, "tcp_port = %d" % self.ports[n][t.name],
                      "memory_mb = %d" % t.memory_mb, "share = %s" % t.share, "replicas = %d" % t.replicas]
            if t.preferred_leader:
                lines.append("preferred_leader = %d" % t.preferred_leader)
        with open(self.config(n), "w") as fh:
            fh.write("\n".join(lines) + "\n")

    def metrics(self, n):
        """{(name, tenant): value} of the replica metrics of node n."""
        s = socket.create_connection(("127.0.0.1", self.admin[n]), timeout=2.0)
        try:
            s.sendall(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
            buf = b""
            s.settimeout(2.0)
            while True:
                c = s.recv(65536)
                if not c:
                    break
                buf += c
        finally:
            s.close()
        out = {}
        for line in buf.decode("utf-8", "replace").splitlines():
            if not line.startswith("slipstream_replica_") or "{tenant=" not in line:
                continue
            head, _, value = line.rpartition(" ")
            name, _, rest = head.partition("{tenant=\"")
            tenant = rest.split("\"", 1)[0]
            try:
                out[(name, tenant)] = int(float(value))
            except ValueError:
                pass
        return out

    def view(self, among):
        """{node: metrics} of the nodes of `among` that answer."""
        v = {}
        for n in among:
            try:
                v[n] = self.metrics(n)
            except OSError:
                pass
        return v

    def leaders(self, among):
        """{tenant: leader} where every node of `among` agrees (else 0)."""
        v = self.view(among)
        out = {}
        for t in self.replicated():
            seen = {v[n].get(("slipstream_replica_leader_id", t)) for n in among if n in v}
            out[t] = seen.pop() if len(seen) == 1 and len(v) == len(among) else 0
        return out

    def wait(self, cond, within_s, what):
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            if cond():
                return True
            time.sleep(0.1)
        raise RuntimeError("timed out waiting for %s" % what)

    def caught_up(self):
        """Every node up with the same applied index for every replicated tenant."""
        v = self.view(self.nodes)
        if len(v) != len(self.nodes):
            return False
        return all(len({v[n].get(("slipstream_replica_applied_index", t)) for n in self.nodes}) == 1
                   for t in self.replicated())

    def settled(self):
        """Every node up, leaders on their preferred nodes, the same applied index everywhere."""
        v = self.view(self.nodes)
        if len(v) != len(self.nodes):
            return False
        for t in self.tenants:
            if t.replicas == 1:
                continue
            if t.preferred_leader and {v[n].get(("slipstream_replica_leader_id", t.name)) for n in self.nodes} != {
                    t.preferred_leader}:
                return False
            if len({v[n].get(("slipstream_replica_applied_index", t.name)) for n in self.nodes}) != 1:
                return False
        return True
