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

import pytest

import shufflehosts

HERE = os.path.dirname(os.path.abspath(__file__))
JAR = os.path.join(os.path.dirname(HERE), "connectors/spark/target/slipstream-spark-0.1.0.jar")
JOB_S = 240


def test_a_spark_application_across_two_hosts_shuffles_through_both_daemons():
    if not shufflehosts.root_and_ip():
        pytest.skip("needs root, iproute2 and the slipstream binary")
    assert os.path.exists(JAR), "%s missing: make build (spark-build)" % JAR
    assert shutil.which("java"), "java missing: scripts/setup.sh installs it"
    with shufflehosts.two_hosts(memory_mb=128, block_kb=256, listen="0.0.0.0") as (a, b, ns):
        with shufflehosts.standalone(ns) as cluster:
            job = subprocess.run([sys.executable, os.path.join(HERE, "shuffle_two_hosts_job.py"), cluster.url,
                                  shufflehosts.A_IP, JAR, "127.0.0.1:%d" % a.port],
                                 capture_output=True, text=True, env=shufflehosts.spark_env(shufflehosts.A_IP),
                                 timeout=JOB_S)
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
