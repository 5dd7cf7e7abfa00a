#!/usr/bin/env python3
"""relay_bench.py — what a relayed connection costs (issue 15, `replicas` < nodes).

Five daemons (tests/test_replication_subset.py's cluster: node n on 127.0.0.n, tenant `s3` on
nodes 1-3, preferred leader 1). One client sends `set` requests one at a time (64-byte
values) over one connection for SETS requests per path, paths alternated for ROUNDS rounds:
- leader: to the group's leader directly;
- follower: to a member that follows (it forwards to the leader);
- relay: to node 4, which holds no replica and relays the connection to node 1 (the leader).
With LEADER=n (2 or 3) leadership is first moved to member n through the admin API (the
preferred leader stays node 1 in the config): the relay must find the current leader (asked
of a member) or go to node 1, which forwards every write. Prints per path the median over
rounds of p50/p99 latency (µs) and sets/s, and the members' forwarded writes.

Env: SETS (2000), ROUNDS (3), LEADER (none), SLIPSTREAM_BIN. Not for: throughput under load (replbench.py).
"""

import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import tenantlib as tl  # noqa: E402
import test_replication_subset as ts  # noqa: E402

SETS = int(os.environ.get("SETS", "2000"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))


def run_path(c, node, tag):
    lat = []
    value = b"v" * 64
    with c.conn(node, "s3") as s:
        t_start = time.monotonic()
        for i in range(SETS):
            t0 = time.monotonic_ns()
            r = tl.ask(s, tl.set_cmd(b"%s-%d" % (tag, i), value), b"\r\n", max_s=10.0)
            lat.append(time.monotonic_ns() - t0)
            if r != b"STORED\r\n":
                errors.append((node, r))  # a leader change on the loaded box: counted, printed
        elapsed = time.monotonic() - t_start
    lat.sort()
    return lat[len(lat) // 2] / 1000, lat[int(len(lat) * 0.99)] / 1000, SETS / elapsed


errors = []


def settled_leader(c, want, within_s=20.0):
    """Wait (bounded) until the preferred leader leads, so no transfer happens mid-run."""
    deadline = time.monotonic() + within_s
    while True:
        lead = c.leader("s3", ts.PLACED["s3"])
        if lead == want or time.monotonic() > deadline:
            return lead
        time.sleep(0.2)


def main():
    root = tempfile.mkdtemp(prefix="slipstream-relaybench-")
    c = ts.Cluster(root)
    try:
        for n in ts.NODES:
            c.start(n)
        lead = settled_leader(c, 1)
        move = int(os.environ.get("LEADER", "0"))
        if move:
            status, body = c.http(1, "PUT", "/tenants/s3", {"leader": move})
            if status != 200:
                raise SystemExit("moving the leader: %d %r" % (status, body))
            lead = settled_leader(c, move)
            time.sleep(1.2)  # past the relay's leader-hint lifetime
        follower = next(n for n in ts.PLACED["s3"] if n != lead)
        paths = {"leader": lead, "follower": follower, "relay": 4}
        res = {p: [] for p in paths}
        for r in range(ROUNDS):
            for p, node in paths.items():
                res[p].append(run_path(c, node, b"%s%d" % (p.encode(), r)))
        print("load: %s" % open("/proc/loadavg").read().strip())
        print("s3 leader node %d, follower node %d, relay node 4; %d sets x %d rounds" % (lead, follower, SETS, ROUNDS))
        for p in paths:
            p50 = statistics.median(x[0] for x in res[p])
            p99 = statistics.median(x[1] for x in res[p])
            rate = statistics.median(x[2] for x in res[p])
            print("%-8s p50 %7.0f us  p99 %7.0f us  %7.0f sets/s  (rounds: %s)" % (
                p, p50, p99, rate, ", ".join("%.0f/%.0f" % (x[0], x[1]) for x in res[p])))
        print("errors: %d %r" % (len(errors), errors[:3]))
        print("forwarded writes by member: %s" % {
            n: c.metric(n, "slipstream_replica_forwarded_total", "s3") for n in ts.PLACED["s3"]})
    finally:
        c.stop_all()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
