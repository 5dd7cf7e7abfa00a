"""HBase range cache in front of a cluster whose region servers are other JVMs (issue 16, "never
stale" on a real cluster): the mini cluster (2 region servers, InvalidationObserver reporting over
TCP as on a real cluster: `--observer-port 0`) in one JVM, the sidecar alone in ANOTHER JVM
pointed at the mini cluster's ZooKeeper (it finds every region server and its observer there and
subscribes to each), Slipstream in front of that sidecar. Direct writes come from the native HBase
client inside the mini cluster's JVM (its own sidecar, spoken to directly), i.e. from a process
Slipstream's sidecar never sees.

Checked: the randomized mixed-writers stale-read workload (seed printed) sees 0 stale reads while
the cache serves hits; regions split and move between the region servers during that workload
(mini cluster stdin commands `split`, `move`): 0 stale reads, the cache serves between moves; a
region server joining and leaving during that workload (leaving suspends and flushes the cache)
still gives no stale read; a frozen sidecar (SIGSTOP) holds a direct write until the region
server's observer has dropped it and its lease has run out, after which Slipstream serves the new
value, never the cached old one. A second module fixture puts a region server in its own JVM
inside a network namespace (veth pair) joined to a second mini cluster: the move workload
between the two "hosts" is never stale either (needs root and iproute2, else skipped).

Needs `make hbase-build`. One mini cluster + sidecar serve the module; all JVMs are killed and
the namespace removed at the end, also on failure.
"""

import os
import random
import shutil
import signal
import subprocess
import threading
import time

import pytest

import hbaselib
import mcwire

happybase = pytest.importorskip("happybase")

pytestmark = pytest.mark.skipif(not hbaselib.mini_available(),
                                reason="connectors/hbase not built (make hbase-build)")

#: How long a test waits for the sidecar to cover every region server again.
COVERED_WAIT_S = 60


@pytest.fixture(scope="module")
def cluster():
    mini = hbaselib.MiniHBase(extra=["--region-servers", "2", "--observer-port", "0"]).start()
    try:
        side = hbaselib.SidecarJvm(mini.info["zk"]).start()
        try:
            yield mini, side
        finally:
            print("sidecar log tail:\n" + side.log_tail(1500))
            side.stop()
    finally:
        mini.stop()


@pytest.fixture
def daemon(cluster):
    # A generous call timeout: creating a table on a just-started mini cluster under load can
    # take longer than the default 5 s (timeouts are tested in test_hbase.py).
    d = hbaselib.HbaseDaemon(cluster[1].sidecar_port, timeout_ms=30000).start()
    try:
        yield d
    finally:
        d.stop()


def connect(d):
    return happybase.Connection(mcwire.HOST, d.thrift_port, timeout=30000)


_seq = [0]


def fresh_table(conn):
    _seq[0] += 1
    name = ("c%d_%d" % (os.getpid(), _seq[0])).encode()
    conn.create_table(name, {"cf1": dict(max_versions=3)})
    return name


def wait_covered(d, t, row):
    """Reads `row` until Slipstream serves it from its cache (every region server subscribed
    again); returns the seconds it took."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < COVERED_WAIT_S:
        t.row(row)
        hits = hbaselib.counter(d, "all_row_hits_total")
        t.row(row)
        if hbaselib.counter(d, "all_row_hits_total") > hits:
            return time.monotonic() - t0
        time.sleep(0.2)
    raise AssertionError("the cache never served again within %d s" % COVERED_WAIT_S)


def run_mixed(d, cluster, seconds, during=None, errors_max=0):
    seed = int(os.environ.get("HBASE_TEST_SEED", random.randrange(1 << 30)))
    print("seed", seed)
    sconn, rconn = connect(d), connect(d)
    direct = hbaselib.Sidecar(cluster[0].sidecar_port)
    try:
        name = fresh_table(sconn)
        rt = rconn.table(name)
        rows = [b"k%02d" % i for i in range(12)]
        wait_covered(d, rt, rows[0])
        hits0 = hbaselib.counter(d, "all_row_hits_total", name)
        result = {}
        if during is None:
            result["mixed"] = hbaselib.mixed_writers(sconn.table(name), rt, direct, name, rows, seed, seconds)
        else:
            th = threading.Thread(target=lambda: result.__setitem__(
                "mixed", hbaselib.mixed_writers(sconn.table(name), rt, direct, name, rows, seed, seconds,
                                                writes_each=100_000, errors_max=errors_max)))
            th.start()
            try:
                during(name, th)
            finally:
                th.join(seconds + 60)
        stale, counts, reads = result["mixed"]
        hits = hbaselib.counter(d, "all_row_hits_total", name) - hits0
        notices = hbaselib.counter(d, "notices_total", name)
        print("reads", reads, "writes", counts, "hits", hits, "notices", notices)
        assert not stale, "stale reads (row, seen, acknowledged): %r" % stale[:5]
        assert counts["direct"] > 20 and counts["slipstream"] > 20 and reads > 50
        assert notices >= counts["direct"], "every direct write was reported over the network"
        # At rest the cache agrees with HBase.
        assert list(rt.scan()) == [(r, hbaselib.as_happybase_row(c)) for r, c in direct.scan(name)]
        sconn.delete_table(name, disable=True)
        return counts, hits
    finally:
        direct.close()
        sconn.close()
        rconn.close()


def test_direct_writes_from_another_jvm_are_never_stale(daemon, cluster):
    counts, hits = run_mixed(daemon, cluster, 6)
    assert not counts["errors"], counts["errors"]
    assert hits > 0, "the cache served (else the test proves nothing)"
    assert "slipstream_hbase_observer_loaded 1" in daemon.metrics()


def test_region_servers_joining_and_leaving_flush_and_stay_fresh(daemon, cluster):
    """During the randomized workload a third region server starts (the sidecar subscribes to
    its observer, usually in the same listing turn that finds it; until every sidecar can have
    done so its writes are held by `slipstream.observer.start.hold.ms`), then stops (its
    subscription ends: SUSPEND, the daemon flushes and bypasses its cache, then RESUME once the
    listing no longer has it). No stale read throughout, and the cache serves afterwards."""
    mini = cluster[0]

    def during(_name, _writers):
        time.sleep(2)
        for cmd in ("rs-start", "rs-stop"):
            print(mini.command(cmd))
            time.sleep(3)

    before = cluster[1].log_tail(1 << 20).count("not all subscribed")
    counts, hits = run_mixed(daemon, cluster, 30, during)
    # Writes that raced a region server's stop may fail in the native client; none may be stale.
    print("writer errors", counts["errors"])
    side_log = cluster[1].log_tail(1 << 20)
    assert side_log.count("not all subscribed") >= before + 1, side_log[-2000:]
    assert hits > 0


#: How long the region-move workload runs, and the pause between two rounds of moves.
MOVE_WORKLOAD_S = 24
MOVE_PAUSE_S = 1.5
#: Requests failing while their region is in transition (the sidecar's client retries are few so
#: that a lost HBase gives an IOError within seconds) are tolerated up to this many per thread.
ERRORS_MAX = 50


def move_workload(daemon, cluster):
    """The randomized workload while the table's region is split at its middle row, then every
    region of the table moves to the next region server, round after round; returns the move
    answers. Checks 0 stale reads (run_mixed) and that the cache served between the moves."""
    mini = cluster[0]
    moves = []
    hits_while_moving = []

    def during(name, writers):
        time.sleep(2)
        print(mini.command("split %s k06" % name.decode()))
        t0 = time.monotonic()
        while writers.is_alive() and time.monotonic() - t0 < MOVE_WORKLOAD_S - 6:
            answer = mini.command("move %s" % name.decode())
            print(answer)
            moves.append(answer)
            hits_while_moving.append(hbaselib.counter(daemon, "all_row_hits_total", name))
            time.sleep(MOVE_PAUSE_S)

    counts, hits = run_mixed(daemon, cluster, MOVE_WORKLOAD_S, during, errors_max=ERRORS_MAX)
    moved = [a.count("->") for a in moves]
    print("move rounds", len(moves), "regions moved", sum(moved), "writer errors", len(counts["errors"]),
          "read errors", len(counts["read_errors"]), (counts["errors"] + counts["read_errors"])[:3])
    assert len(moved) >= 2 and min(moved) == 2, "the split table's 2 regions moved, round after round"
    print("hits after each move round", hits_while_moving)
    assert hits_while_moving[-1] > hits_while_moving[0], "the cache served between the moves"
    return moves


def test_regions_moving_and_splitting_between_region_servers_stay_fresh(daemon, cluster):
    """During the randomized workload the table's region is split at the middle row (both
    daughters open on the parent's region server), then every region of the table moves to the
    other region server, round after round (HBase's own move: the source closes the region, the
    destination opens it and loads InvalidationObserver on it before it takes writes, which are
    then reported by the destination's observer, already subscribed). Writers through Slipstream
    and the native client keep writing and the reader keeps reading throughout: 0 stale reads,
    and the cache serves again between moves."""
    move_workload(daemon, cluster)


#: The veth pair's addresses: the mini cluster's side (the host) and the namespace's side.
NETNS_HOST_IP, NETNS_PEER_IP = "10.216.16.1", "10.216.16.2"


def _ip(*args, check=True):
    return subprocess.run(["ip"] + list(args), check=check, capture_output=True, timeout=20)


@pytest.fixture(scope="module")
def netns_cluster():
    """The mini cluster (1 region server, named by and reachable at the veth's host address)
    plus a second region server in its own JVM inside a network namespace, joined over a veth
    pair; the sidecar in a third JVM on the host. The observer of the namespace's region server
    listens on the veth, so its notices cross a real network path (veth, the namespace's own
    stack). Everything is stopped and the namespace and veth removed, also on failure."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 (network namespace)")
    ns, host_if, peer_if = "ss16-%d" % os.getpid(), "s16a%d" % (os.getpid() % 100000), "s16b%d" % (os.getpid() % 100000)
    procs = []
    try:
        _ip("netns", "add", ns)
        _ip("link", "add", host_if, "type", "veth", "peer", "name", peer_if)
        _ip("link", "set", peer_if, "netns", ns)
        _ip("addr", "add", NETNS_HOST_IP + "/24", "dev", host_if)
        _ip("link", "set", host_if, "up")
        _ip("-n", ns, "addr", "add", NETNS_PEER_IP + "/24", "dev", peer_if)
        _ip("-n", ns, "link", "set", peer_if, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        mini = hbaselib.MiniHBase(extra=["--region-servers", "1", "--observer-port", "0",
                                         "--advertise-host", NETNS_HOST_IP]).start()
        procs.append(mini)
        zk_port = mini.info["zk"].rsplit(":", 1)[1]
        rs = hbaselib.RegionServerJvm(mini, "%s:%s" % (NETNS_HOST_IP, zk_port), NETNS_PEER_IP, netns=ns).start()
        procs.append(rs)
        side = hbaselib.SidecarJvm(mini.info["zk"]).start()
        procs.append(side)
        yield mini, side, rs
    finally:
        for p in reversed(procs):
            if isinstance(p, hbaselib.SidecarJvm):
                print("sidecar log tail:\n" + p.log_tail(1500))
            p.stop()
        _ip("link", "del", host_if, check=False)
        _ip("netns", "del", ns, check=False)


def test_regions_moving_to_a_region_server_across_a_network_stay_fresh(netns_cluster):
    """The move workload between the mini cluster's region server and one in a network
    namespace (its observer subscribed by the sidecar across the veth): the regions alternate
    between the two hosts, 0 stale reads, the cache serves between moves."""
    mini, side, rs = netns_cluster
    d = hbaselib.HbaseDaemon(side.sidecar_port, timeout_ms=30000).start()
    try:
        moves = move_workload(d, (mini, side))
    finally:
        d.stop()
    peer = rs.info["server"].split(",")[0]
    assert any(peer + "," in a for a in moves), "regions moved to the namespace's region server"


def test_a_frozen_sidecar_holds_direct_writes_until_its_daemons_stopped_serving(daemon, cluster):
    """SIGSTOP the sidecar: a direct write's BEGIN gets no ACK within the observer's 2 s, the
    observer drops the sidecar and holds the write for the sidecar's lease (2 x the daemons'
    lease), by which time Slipstream's own lease has run out (no answers). When the sidecar runs
    again its subscription is gone: Slipstream serves the new value, never the cached old one."""
    mini, side = cluster
    conn = connect(daemon)
    direct = hbaselib.Sidecar(mini.sidecar_port)
    try:
        name = fresh_table(conn)
        t = conn.table(name)
        t.put(b"r", {b"cf1:q": b"old"})
        wait_covered(daemon, t, b"r")
        assert t.row(b"r") == {b"cf1:q": b"old"}
        os.kill(int(side.info["pid"]), signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            direct.put(name, b"r", {b"cf1:q": b"new"})
            held = time.monotonic() - t0
        finally:
            os.kill(int(side.info["pid"]), signal.SIGCONT)
        print("direct write held %.2f s" % held)
        assert held >= 2.0, held
        assert t.row(b"r") == {b"cf1:q": b"new"}
        wait_covered(daemon, t, b"r")
        assert t.row(b"r") == {b"cf1:q": b"new"}
        direct.put(name, b"r", {b"cf1:q": b"newer"})
        assert t.row(b"r") == {b"cf1:q": b"newer"}
        conn.delete_table(name, disable=True)
    finally:
        direct.close()
        conn.close()
