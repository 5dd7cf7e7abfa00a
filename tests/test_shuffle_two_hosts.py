"""A Spark application across two hosts with Slipstream's shuffle manager (issue 17's cross-host
path as users run it): a standalone master and worker here, a second worker in a network
namespace the test creates (tests/shufflehosts.py: veth pair, A 10.79.0.1, B 10.79.0.2), one
Slipstream daemon per host naming the other in `[shuffle] peers`. Every executor talks to its
own host's daemon at 127.0.0.1 (one `spark.slipstream.shuffle.endpoint` for the application, as
on real hosts); a reducer's daemon brings the other host's map outputs over the veth (FETCH).

Checks: three shuffling jobs (SQL aggregation, SQL shuffle join, RDD reduceByKey; driver in
tests/shuffle_two_hosts_job.py) return what their inputs' definitions say; executors ran on both
hosts; both daemons took commits; segments crossed the veth both ways (each daemon received
bytes from the other). Needs root (namespaces), Java and pip's pyspark, the connector jar (`make
build`); skipped without root. Every wait is bounded; Spark's processes, the daemons, the
namespace and the veth go even on failure.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

import daemonlib
import mcwire
import shufflehosts

HERE = os.path.dirname(os.path.abspath(__file__))
JAR = os.path.join(os.path.dirname(HERE), "connectors/spark/target/slipstream-spark-0.1.0.jar")
SPARK_START_S = 60
JOB_S = 240


def spark_home():
    import pyspark

    return os.path.dirname(pyspark.__file__)


class SparkProc:
    """A Spark daemon (master or worker) started with spark-class, in namespace `ns` or here."""

    def __init__(self, ns, ip, log_dir, name, *args):
        env = dict(os.environ, SPARK_HOME=spark_home(), SPARK_SCALA_VERSION="2.13", SPARK_LOCAL_IP=ip,
                   SPARK_NO_DAEMONIZE="1", PYSPARK_PYTHON=sys.executable)
        prefix = ["ip", "netns", "exec", ns] if ns else []
        self.log = os.path.join(log_dir, name + ".log")
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(prefix + [os.path.join(spark_home(), "bin/spark-class")] + list(args),
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
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
        daemonlib.stop_group(self.proc)


def test_a_spark_application_across_two_hosts_shuffles_through_both_daemons():
    if not shufflehosts.root_and_ip():
        pytest.skip("needs root, iproute2 and the slipstream binary")
    assert os.path.exists(JAR), "%s missing: make build (spark-build)" % JAR
    assert shutil.which("java"), "java missing: scripts/setup.sh installs it"
    work = tempfile.mkdtemp(prefix="slipstream-two-hosts-")
    procs = []
    try:
        with shufflehosts.two_hosts(memory_mb=128, block_kb=256, listen="0.0.0.0") as (a, b, ns):
            try:
                run_across(a, b, ns, work, procs)
            finally:  # Spark's processes go before the namespace they run in
                for p in reversed(procs):
                    p.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_across(a, b, ns, work, procs):
    """Starts the master and a worker per host (into `procs`), runs the driver, checks."""
    master_port = mcwire.free_port()
    master = SparkProc(None, shufflehosts.A_IP, work, "master", "org.apache.spark.deploy.master.Master",
                       "--host", shufflehosts.A_IP, "--port", str(master_port), "--webui-port", "0")
    procs.append(master)
    deadline = time.monotonic() + SPARK_START_S
    master.wait_for("I have been elected leader", deadline)
    url = "spark://%s:%d" % (shufflehosts.A_IP, master_port)
    for name, nsname, ip in (("worker-a", None, shufflehosts.A_IP), ("worker-b", ns, shufflehosts.B_IP)):
        wdir = os.path.join(work, name)
        os.mkdir(wdir)
        procs.append(SparkProc(nsname, ip, work, name, "org.apache.spark.deploy.worker.Worker", "--host", ip,
                               "--webui-port", "0", "--cores", "1", "--memory", "1g", "--work-dir", wdir, url))
    for w in procs[1:]:
        w.wait_for("Successfully registered with master", deadline)
    env = dict(os.environ, SPARK_HOME=spark_home(), SPARK_SCALA_VERSION="2.13",
               SPARK_LOCAL_IP=shufflehosts.A_IP, PYSPARK_PYTHON=sys.executable)
    job = subprocess.run([sys.executable, os.path.join(HERE, "shuffle_two_hosts_job.py"), url,
                          shufflehosts.A_IP, JAR, "127.0.0.1:%d" % a.port],
                         capture_output=True, text=True, env=env, timeout=JOB_S)
    lines = [line for line in job.stdout.splitlines() if line.startswith("{")]
    assert job.returncode == 0 and lines, "driver failed: %s\n%s" % (job.stdout[-2000:], job.stderr[-4000:])
    out = json.loads(lines[-1])
    print(out)
    for name in ("aggregation", "join", "reduce_by_key"):
        assert out[name]["same"], "%s differs from its definition: %s" % (name, out)
    assert {shufflehosts.A_IP, shufflehosts.B_IP} <= set(out["hosts"]), out["hosts"]
    for h in (a, b):
        assert h.metric("slipstream_shuffle_commits_total") > 0, "no map task committed on %s" % h.name
        assert h.metric("slipstream_shuffle_peer_bytes_received_total") > 0, \
            "%s's reducers read nothing from the other host" % h.name
        assert h.metric("slipstream_shuffle_peer_fetch_errors_total") == 0
