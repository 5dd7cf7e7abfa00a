"""The daemons of one replication test cluster: config/log/data paths, start (waits until
every client and admin port accepts), kill, stop, log tail. Each test file's `Cluster`
subclasses it and writes its own configs (tenants, shaping, fsync differ per file); it sets
`ports[n]` (tenant -> client port) and `admin[n]`, optionally `host[n]` (default
mcwire.HOST), `netns[n]` (run node n inside that network namespace) and `preexec[n]` (run in
node n's child before it execs: bench/cpugroups.py's joiner puts it in its cgroup).

`running()` and `seeded_rng()` are the test files' fixtures' bodies (one copy, here).

Not for: talking to the daemons (mcwire, tenantlib) or checking what they hold."""

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pytest

import mcwire


def seeded_rng(test_name):
    """A Random seeded from REPL_SEED or the clock; the seed is printed to repeat a run."""
    seed = int(os.environ.get("REPL_SEED", str(time.time_ns() % 1_000_000_007)))
    print("%s seed %d (REPL_SEED=%d to repeat)" % (test_name, seed, seed))
    return random.Random(seed)


@contextlib.contextmanager
def running(make_cluster, prefix, nodes, ready=None):
    """A cluster from `make_cluster(root)` in a fresh temporary root, `nodes` started (and
    `ready(cluster)` called); every daemon stopped and the root removed however the test
    ends. Skips when the binary is not built."""
    if not mcwire.slipstream_available():
        pytest.skip("slipstream binary not built: %s" % mcwire.SLIPSTREAM_BIN)
    root = tempfile.mkdtemp(prefix=prefix)
    c = None
    try:
        c = make_cluster(root)
        for n in nodes:
            c.start(n)
        if ready is not None:
            ready(c)
        yield c
    finally:
        if c is not None:
            c.stop_all()
        shutil.rmtree(root, ignore_errors=True)


class Daemons:
    start_s = 10.0  # a daemon's ports must accept within this

    def __init__(self, root):
        self.root = root
        self.procs = {}
        self.host = {}
        self.netns = {}
        self.preexec = {}
        self._taken = set()

    def fresh_port(self):
        """A free loopback port not handed out before by this cluster."""
        for _ in range(100):
            p = mcwire.free_port()
            if p not in self._taken:
                self._taken.add(p)
                return p
        raise RuntimeError("no free port")

    def config(self, n):
        return os.path.join(self.root, "node%d.toml" % n)

    def log(self, n):
        return os.path.join(self.root, "node%d.log" % n)

    def data_dir(self, n):
        return os.path.join(self.root, "node%d" % n)

    def log_tail(self, n, size=2000):
        try:
            with open(self.log(n), "rb") as f:
                return f.read()[-size:].decode("utf-8", "replace")
        except OSError:
            return ""

    def start(self, n):
        cmd = [mcwire.SLIPSTREAM_BIN, "serve", "--config", self.config(n)]
        if n in self.netns:
            cmd = ["ip", "netns", "exec", self.netns[n]] + cmd
        with open(self.log(n), "ab") as log:
            self.procs[n] = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                             start_new_session=True, preexec_fn=self.preexec.get(n))
        host = self.host.get(n, mcwire.HOST)
        deadline = time.monotonic() + self.start_s
        for port in list(self.ports[n].values()) + [self.admin[n]]:
            while True:
                if self.procs[n].poll() is not None:
                    raise RuntimeError("node %d exited: %s" % (n, self.log_tail(n)))
                try:
                    socket.create_connection((host, port), timeout=0.5).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError("node %d port %d not open: %s" % (n, port, self.log_tail(n)))
                    time.sleep(0.05)

    def agreed_leader(self, tenant, among, within_s):
        """The node all of `among` agree leads `tenant` (waits, bounded); needs the subclass's
        `metric(n, name, tenant)`."""
        deadline = time.monotonic() + within_s
        seen = None
        while time.monotonic() < deadline:
            try:
                seen = {self.metric(n, "slipstream_replica_leader_id", tenant) for n in among}
            except OSError:
                seen = set()
            if len(seen) == 1 and None not in seen and 0 not in seen and int(next(iter(seen))) in among:
                return int(seen.pop())
            time.sleep(0.1)
        raise AssertionError("no agreed leader for %s among %r (saw %r)" % (tenant, among, seen))

    def kill(self, n, sig=signal.SIGKILL):
        p = self.procs.pop(n, None)
        if p is not None and p.poll() is None:
            p.send_signal(sig)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)

    def stop_all(self):
        for n in list(self.procs):
            self.kill(n)
