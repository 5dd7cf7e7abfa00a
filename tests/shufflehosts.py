"""Two shuffle daemons on two hosts for the black-box tests and benchmarks of the cross-host
path: A in this network namespace, B in a namespace of its own made here, joined by a veth pair
(A 10.79.0.1, B 10.79.0.2), each naming the other in `[shuffle] peers`.

For: the topology and its clean-up (namespace, link and daemons go on the way out, also on
failure; every wait bounded), and a Spark standalone cluster with a worker on each host. Used by tests/test_shuffle_peers.py (the daemons' protocol),
tests/test_shuffle_two_hosts.py (a Spark application across the two hosts) and
bench/shuffle_peer_bench.py. Not for: traffic or assertions. Needs root and iproute2.
"""

import collections
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import daemonlib
import mcwire

A_IP, B_IP = "10.79.0.1", "10.79.0.2"
START_TIMEOUT_S = 20
SPARK_START_S = 120  # a JVM start takes seconds on a quiet machine, a minute on a starved one


def root_and_ip():
    return os.geteuid() == 0 and shutil.which("ip") is not None and mcwire.slipstream_available()


def sh(*args):
    r = subprocess.run(list(args), capture_output=True, text=True, timeout=20)
    if r.returncode != 0:
        raise RuntimeError("%s: %s" % (" ".join(args), r.stderr.strip()))


class Host:
    """One shuffle daemon: here (`ns` None) or inside namespace `ns`, reached at `ip` and
    listening on `listen` (default `ip`; "0.0.0.0" lets the host's own processes reach it on
    127.0.0.1 too, as Spark executors do), with a pool of `memory_mb` in blocks of `block_kb`
    (the benchmark sizes them up)."""

    def __init__(self, name, ip, ns, port, peer, memory_mb=4, block_kb=64, listen=None, extra=""):
        self.name, self.ip, self.ns, self.port = name, ip, ns, port
        self.link = None  # its end of the veth pair (two_hosts sets it)
        self.admin_port = port + 1
        self.dir = tempfile.mkdtemp(prefix="slipstream-shuffle-%s-" % name, dir="/dev/shm")
        fd, self.config = tempfile.mkstemp(prefix="slipstream-shuffle-%s-" % name, suffix=".toml")
        with os.fdopen(fd, "w") as f:
            f.write('[server]\nadmin = "%s:%d"\n[shuffle]\nlisten = "%s"\ntcp_port = %d\nmemory_mb = %d\n'
                    'block_kb = %d\ndir = "%s"\npeers = ["%s"]\npeer_timeout_ms = 3000\n'
                    % (ip, self.admin_port, listen or ip, port, memory_mb, block_kb, self.dir, peer) + extra)
        self.log = self.config[:-5] + ".log"
        self.proc = None

    def start(self):
        prefix = ["ip", "netns", "exec", self.ns] if self.ns else []
        kv = str(mcwire.free_port()) if not self.ns else "11211"  # B's own loopback
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                prefix + [mcwire.SLIPSTREAM_BIN, "serve", "-l", "127.0.0.1", "-p", kv, "--config", self.config],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert self.proc.poll() is None, "%s exited: %s" % (self.name, open(self.log).read()[-2000:])
            try:
                socket.create_connection((self.ip, self.port), timeout=0.5).close()
                return self
            except OSError:
                assert time.monotonic() < deadline, "%s not accepting" % self.name
                time.sleep(0.05)

    def stop(self):
        daemonlib.stop_group(self.proc)

    def cleanup(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
        for p in (self.config, self.log):
            if os.path.exists(p):
                os.unlink(p)

    def metric(self, name):
        url = "http://%s:%d/metrics" % (self.ip, self.admin_port)
        with urllib.request.urlopen(url, timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " "):
                    return int(float(line.split()[1]))
        raise AssertionError("no metric %s" % name)

    def block_bytes(self, block, offset, length):
        with open(os.path.join(self.dir, "blk-%d" % block), "rb") as f:
            f.seek(offset)
            return f.read(length)


@contextlib.contextmanager
def two_hosts(memory_mb=4, block_kb=64, listen=None, extra=""):
    """Daemon A here and B in a fresh namespace over a veth pair, each the other's peer (`extra`:
    more `[shuffle]` lines for both); yields (a, b, namespace name), each host's end of the veth
    in its `link`; the namespace, link and daemons are removed on the way out, also on failure."""
    tag = "%d" % (os.getpid() % 100000)
    ns, here, there = "shfb" + tag, "sha" + tag, "shb" + tag
    made_ns = made_link = False
    a = b = None
    try:
        sh("ip", "netns", "add", ns)
        made_ns = True
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "link", "add", here, "type", "veth", "peer", "name", there, "netns", ns)
        made_link = True
        sh("ip", "addr", "add", A_IP + "/24", "dev", here)
        sh("ip", "link", "set", here, "up")
        sh("ip", "-n", ns, "addr", "add", B_IP + "/24", "dev", there)
        sh("ip", "-n", ns, "link", "set", there, "up")
        port = 17300 + int(tag) % 1000 * 2
        a = Host("a", A_IP, None, port, "%s:%d" % (B_IP, port), memory_mb, block_kb, listen, extra)
        b = Host("b", B_IP, ns, port, "%s:%d" % (A_IP, port), memory_mb, block_kb, listen, extra)
        a.link, b.link = here, there
        a.start()
        b.start()
        yield a, b, ns
    finally:
        for h in (a, b):
            if h is not None:
                h.cleanup()
        if made_link:
            subprocess.run(["ip", "link", "del", here], capture_output=True, timeout=20)
        if made_ns:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)


def spark_home():
    """pip's pyspark 4.0.1 is the Spark installation here (scripts/setup.sh)."""
    import pyspark

    return os.path.dirname(pyspark.__file__)


def spark_env(ip):
    """The environment of a Spark process on the host at `ip` (driver, master, worker; a worker's
    executors inherit it, so they bind to their own host's address)."""
    return dict(os.environ, SPARK_HOME=spark_home(), SPARK_SCALA_VERSION="2.13", SPARK_LOCAL_IP=ip,
                SPARK_NO_DAEMONIZE="1", PYSPARK_PYTHON=sys.executable)


class SparkProc:
    """A Spark daemon (master or worker) started with spark-class, in namespace `ns` or here,
    its output in `log_dir`/`name`.log."""

    def __init__(self, ns, ip, log_dir, name, *args):
        prefix = ["ip", "netns", "exec", ns] if ns else []
        self.log = os.path.join(log_dir, name + ".log")
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(prefix + [os.path.join(spark_home(), "bin/spark-class")] + list(args),
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=spark_env(ip),
                                         start_new_session=True)

    def wait_for(self, text, deadline):
        while True:
            assert self.proc.poll() is None, "exited: %s" % self.tail()
            with open(self.log, errors="replace") as f:
                if text in f.read():
                    return
            assert time.monotonic() < deadline, "no %r in %s: %s" % (text, self.log, self.tail())
            time.sleep(0.2)

    def tail(self):
        with open(self.log, errors="replace") as f:
            return f.read()[-3000:]

    def stop(self):
        """The worker's executors are in its process group: they go with it."""
        daemonlib.stop_group(self.proc)


Standalone = collections.namedtuple("Standalone", "url pids")


@contextlib.contextmanager
def standalone(ns, worker_memory="1g", work=None):
    """A Spark standalone cluster over the two hosts: the master and worker A here, worker B in
    namespace `ns`, one core each; yields a Standalone (the master URL; the pids of the master
    and workers, the roots of the process trees whose CPU a benchmark counts). Every process
    (executors too) is stopped on the way out, also on failure; the work directory (executor
    logs) is removed unless the caller passed one."""
    own = work is None
    work = work or tempfile.mkdtemp(prefix="slipstream-two-hosts-")
    os.makedirs(work, exist_ok=True)
    procs = []
    try:
        port = mcwire.free_port()
        master = SparkProc(None, A_IP, work, "master", "org.apache.spark.deploy.master.Master",
                           "--host", A_IP, "--port", str(port), "--webui-port", "0")
        procs.append(master)
        deadline = time.monotonic() + SPARK_START_S
        master.wait_for("I have been elected leader", deadline)
        url = "spark://%s:%d" % (A_IP, port)
        for name, nsname, ip in (("worker-a", None, A_IP), ("worker-b", ns, B_IP)):
            wdir = os.path.join(work, name)
            os.makedirs(wdir, exist_ok=True)
            procs.append(SparkProc(nsname, ip, work, name, "org.apache.spark.deploy.worker.Worker", "--host", ip,
                                   "--webui-port", "0", "--cores", "1", "--memory", worker_memory,
                                   "--work-dir", wdir, url))
        for w in procs[1:]:
            w.wait_for("Successfully registered with master", deadline)
        yield Standalone(url, [p.proc.pid for p in procs])
    finally:
        for p in reversed(procs):  # before the namespace the worker runs in goes
            p.stop()
        if own:
            shutil.rmtree(work, ignore_errors=True)
