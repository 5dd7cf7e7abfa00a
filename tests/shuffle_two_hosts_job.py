"""The driver of tests/test_shuffle_two_hosts.py: one Spark application on a standalone cluster
whose two workers sit on two hosts, with Slipstream's shuffle manager, each executor talking to
its own host's daemon at 127.0.0.1 (the same `spark.slipstream.shuffle.endpoint` everywhere, as
on real hosts). Runs three shuffling jobs (a SQL aggregation, a SQL shuffle join, an RDD
reduceByKey), computes what each must return from the inputs' definitions, and prints one JSON
line: the answers compared, the executors' hosts, the application id.

For: being run as a subprocess (its own JVM, its own exit). Not for: timing.
Usage: shuffle_two_hosts_job.py MASTER_URL DRIVER_HOST JAR ENDPOINT
"""

import json
import operator
import sys
import time

from pyspark.sql import SparkSession

EXECUTORS_WAIT_S = 60
ROWS = 200_000
GROUPS = 1009


def session(master, driver_host, jar, endpoint):
    return (SparkSession.builder.master(master).appName("slipstream-two-hosts")
            .config("spark.ui.enabled", "false")
            .config("spark.driver.host", driver_host)
            .config("spark.driver.bindAddress", driver_host)
            .config("spark.jars", jar)
            .config("spark.executor.memory", "768m")
            .config("spark.executor.extraJavaOptions", "-XX:+UseSerialGC")
            .config("spark.serializer", "org.apache.spark.serializer.KryoSerializer")
            .config("spark.sql.shuffle.partitions", "6")
            .config("spark.sql.adaptive.enabled", "false")  # keep the 6 reduce partitions
            .config("spark.sql.autoBroadcastJoinThreshold", "-1")  # a shuffle join, not a broadcast
            .config("spark.shuffle.manager", "io.slipstream.spark.shuffle.SlipstreamShuffleManager")
            .config("spark.slipstream.shuffle.endpoint", endpoint)
            .getOrCreate())


def wait_for_executors(sc, n):
    """Both hosts' executors registered, so every job's tasks spread over both."""
    deadline = time.monotonic() + EXECUTORS_WAIT_S
    while True:
        hosts = [e.host() for e in sc._jsc.sc().statusTracker().getExecutorInfos()]
        if len(hosts) >= n + 1:  # the driver is listed too
            return sorted(hosts)
        if time.monotonic() > deadline:
            raise SystemExit("executors not registered in %d s: %s" % (EXECUTORS_WAIT_S, hosts))
        time.sleep(0.2)


def aggregation(spark):
    rows = (spark.range(0, ROWS, 1, 8).selectExpr("id %% %d AS k" % GROUPS, "id AS v")
            .groupBy("k").agg({"v": "sum", "*": "count"}).collect())
    got = {r["k"]: (r["count(1)"], r["sum(v)"]) for r in rows}
    want = {}
    for i in range(ROWS):
        c, s = want.get(i % GROUPS, (0, 0))
        want[i % GROUPS] = (c + 1, s + i)
    return got == want, len(got)


def join(spark):
    left = spark.range(0, 50_000, 1, 8).selectExpr("id % 5000 AS k", "id AS a")
    right = spark.range(0, 20_000, 1, 5).selectExpr("id % 5000 AS k", "id * 2 AS b")
    r = left.join(right, "k").selectExpr("count(*) AS n", "sum(a + b) AS s").collect()[0]
    n = s = 0
    rights = {}
    for j in range(20_000):
        rights.setdefault(j % 5000, []).append(j * 2)
    for i in range(50_000):
        for b in rights.get(i % 5000, ()):
            n += 1
            s += i + b
    return (r["n"], r["s"]) == (n, s), n


def reduce_by_key(sc):
    got = dict(sc.parallelize(range(100_000), 8).map(lambda i: (i % 101, i)).reduceByKey(operator.add, 5).collect())
    want = {}
    for i in range(100_000):
        want[i % 101] = want.get(i % 101, 0) + i
    return got == want, len(got)


def main():
    master, driver_host, jar, endpoint = sys.argv[1:5]
    spark = session(master, driver_host, jar, endpoint)
    sc = spark.sparkContext
    sc.setLogLevel("WARN")
    try:
        hosts = wait_for_executors(sc, 2)
        out = {"app": sc.applicationId, "hosts": hosts}
        for name, run in (("aggregation", lambda: aggregation(spark)), ("join", lambda: join(spark)),
                          ("reduce_by_key", lambda: reduce_by_key(sc))):
            same, size = run()
            out[name] = {"same": same, "size": size}
        print(json.dumps(out), flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
