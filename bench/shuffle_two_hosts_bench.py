#!/usr/bin/env python3
"""Issue 17's GroupBy across two hosts (root; part of `make bench`): Spark's built-in shuffle
(Netty fetches over the veth) vs Slipstream's (each host's daemon brings the other host's
segments over the veth: sendfile/splice), same driver, same data, same cluster.

Topology (tests/shufflehosts.py): host A here, host B in a network namespace, a veth pair
between them; one Slipstream daemon per host naming the other in `[shuffle] peers`; a Spark
standalone master and a worker (1 core, 1 GiB executor) on A, a worker on B. The driver is
connectors/spark/.../bench/ShuffleBench.java, on A, run twice with the managers' order reversed;
host CPU counts the driver, both daemons, the master and the workers with their executors.
Both hosts share this machine's two cores and memory: the veth is the only real network
path, and both "hosts" compete for the same CPUs.

Knobs (environment): RECORDS [4000000], SHAPES ["8x8"], VALUE_BYTES [100], RUNS [2 per
invocation], MANAGERS [sort,slipstream], MEMORY_MB [4096 per daemon], BLOCK_KB [2048],
RESULTS_DIR [bench/results/shuffle-2hosts-<UTC>]. Summary: bench/shuffle_summary.py's
summary.md in RESULTS_DIR.
"""

import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
os.environ.setdefault("SLIPSTREAM_BIN", os.path.join(ROOT, "target/release/slipstream"))

import shufflehosts  # noqa: E402

JAR = os.path.join(ROOT, "connectors/spark/target/slipstream-spark-0.1.0.jar")


def env(name, default):
    return os.environ.get(name, default)


def main():
    if not shufflehosts.root_and_ip():
        sys.exit("needs root, iproute2 and the slipstream binary")
    if not os.path.exists(JAR):
        sys.exit("%s missing: make spark-build" % JAR)
    out = os.path.realpath(env("RESULTS_DIR", os.path.join(
        ROOT, "bench/results/shuffle-2hosts-" + time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()))))
    os.makedirs(out, exist_ok=True)
    managers = env("MANAGERS", "sort,slipstream")
    orders = [managers, ",".join(reversed(managers.split(",")))]
    uptime = open(os.path.join(out, "uptime.txt"), "a")
    with shufflehosts.two_hosts(int(env("MEMORY_MB", "4096")), int(env("BLOCK_KB", "2048")),
                                listen="0.0.0.0") as (a, b, ns):
        with shufflehosts.standalone(ns, work=os.path.join(out, "spark-work")) as cluster:
            pids = [a.proc.pid, b.proc.pid] + cluster.pids
            for shape in env("SHAPES", "8x8").split():
                maps, reduces = shape.split("x")
                for order in orders:
                    uptime.write(subprocess.run(["uptime"], capture_output=True, text=True).stdout)
                    args = ["bash", os.path.join(ROOT, "connectors/spark/bin/run-java.sh"),
                            "io.slipstream.spark.bench.ShuffleBench", "endpoint=127.0.0.1:%d" % a.port,
                            "records=" + env("RECORDS", "4000000"), "maps=" + maps, "reduces=" + reduces,
                            "value_bytes=" + env("VALUE_BYTES", "100"), "runs=" + env("RUNS", "2"),
                            "master=" + cluster.url, "jar=" + JAR, "managers=" + order, "kryo=1",
                            "daemon_pid=" + ",".join(str(p) for p in pids)]
                    run_env = dict(shufflehosts.spark_env(shufflehosts.A_IP), SKIP_COMPILE="1",
                                   SPARK_JAVA_OPTS=env("SPARK_JAVA_OPTS", "-Xmx4g"))
                    r = subprocess.run(args, capture_output=True, text=True, env=run_env, timeout=3600)
                    with open(os.path.join(out, "driver-%s-%s.err" % (shape, order)), "w") as f:
                        f.write(r.stderr)
                    lines = [x for x in r.stdout.splitlines() if x.startswith("{")]
                    with open(os.path.join(out, "shuffle.jsonl"), "a") as f:
                        f.writelines(x + "\n" for x in lines)
                    print("\n".join(lines), flush=True)
                    if r.returncode != 0:
                        sys.exit("driver failed (%s): %s" % (order, r.stderr[-3000:]))
            for h in (a, b):
                print("%s: peer bytes received %d, sent %d, fetch errors %d" % (
                    h.name, h.metric("slipstream_shuffle_peer_bytes_received_total"),
                    h.metric("slipstream_shuffle_peer_bytes_sent_total"),
                    h.metric("slipstream_shuffle_peer_fetch_errors_total")), file=uptime)
    uptime.write(subprocess.run(["uptime"], capture_output=True, text=True).stdout)
    uptime.close()
    subprocess.run([sys.executable, os.path.join(ROOT, "bench/shuffle_summary.py"), out], check=True)
    print("results in", out)


if __name__ == "__main__":
    main()
