"""Replicated tenants (issue 15), black-box: three real `slipstream serve --config` daemons on
loopback, one `[cluster]`, two tenants replicated on all three nodes (t0's preferred leader on
node 1, t1's on node 2).

For: what a memcached client sees — a write acknowledged through any node (the leader, or a
follower that forwards it) is on every node's store with the same CAS; a SIGKILLed leader
loses no acknowledged write and a new leader takes writes; the killed node restarts from its
data_dir and catches up; with no quorum the client gets the documented SERVER_ERROR line
after the bounded wait. Node 3 runs with `reads = "local"`, so reading it shows its own
store as it is (the others read linearizably, through ReadIndex).
Not for: Raft itself (crates/replication/tests/cluster.rs) or throughput (docs/benchmarks.md).

Randomized values are seeded (REPL_SEED or the clock) and the seed is printed. Every daemon
this module starts is SIGKILLed at teardown, failure or not; every wait is bounded.
"""

import os
import socket
import time

import pytest

import mcwire
import replcluster
import tenantlib as tl

HOST = mcwire.HOST
NODES = (1, 2, 3)
TENANTS = ("t0", "t1")
WAIT_MS = 1500  # [cluster] wait_ms: the bounded wait before SERVER_ERROR
LEADER_S = 15.0
NO_LEADER_LINE = b"SERVER_ERROR no leader for this tenant\r\n"
TIMEOUT_LINE = b"SERVER_ERROR replication timeout, outcome unknown\r\n"


class Cluster(replcluster.Daemons):
    """Three daemons; node n: tenant ports, admin port, raft port, its own data_dir."""

    def __init__(self, root):
        super().__init__(root)
        fresh = self.fresh_port

        self.raft = {n: fresh() for n in NODES}
        self.ports = {n: {t: fresh() for t in TENANTS} for n in NODES}
        self.admin = {n: fresh() for n in NODES}
        self.server_port = {n: fresh() for n in NODES}
        peers = ", ".join('"%d=%s:%d"' % (n, HOST, self.raft[n]) for n in NODES)
        for n in NODES:
            lines = [
                "[server]",
                'listen = "%s"' % HOST,
                "threads = 2",
                "port = %d" % self.server_port[n],
                'admin = "%s:%d"' % (HOST, self.admin[n]),
                "",
                "[cluster]",
                "node_id = %d" % n,
                "peers = [%s]" % peers,
                'data_dir = "%s"' % os.path.join(root, "node%d" % n),
                'fsync = "batch"',
                'reads = "%s"' % ("local" if n == 3 else "linearizable"),
                "wait_ms = %d" % WAIT_MS,
            ]
            for k, t in enumerate(TENANTS):
                lines += ["", "[[tenant]]", 'name = "%s"' % t, "tcp_port = %d" % self.ports[n][t],
                          "memory_mb = 16", "share = 0.4", "replicas = 3", "preferred_leader = %d" % (k + 1)]
            with open(self.config(n), "w") as f:
                f.write("\n".join(lines) + "\n")

    def metric(self, n, name, tenant):
        r = tl.http_request(self.admin[n], "GET", "/metrics")
        return tl.metric_value(r.body.decode(), name, tenant)

    def leader(self, tenant, among=NODES, within_s=LEADER_S):
        """The node all of `among` agree leads `tenant` (waits, bounded)."""
        return self.agreed_leader(tenant, among, within_s)

    def conn(self, n, tenant):
        s = socket.create_connection((HOST, self.ports[n][tenant]), timeout=10)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return s


@pytest.fixture
def cluster():
    with replcluster.running(Cluster, "slipstream-repl-", NODES) as c:
        yield c


@pytest.fixture
def rng():
    return replcluster.seeded_rng("test_replication")


def ask(sock, data, suffix=b"\r\n", max_s=10.0):
    return tl.ask(sock, data, suffix, max_s=max_s)


def write_retrying(c, node, tenant, data, suffix=b"\r\n", within_s=LEADER_S):
    """Send a write until it is not a no-leader refusal (a fresh connection each try)."""
    deadline = time.monotonic() + within_s
    while True:
        with c.conn(node, tenant) as s:
            r = ask(s, data, suffix)
        if r not in (NO_LEADER_LINE, TIMEOUT_LINE) or time.monotonic() > deadline:
            return r
        time.sleep(0.1)


def local_store_has(c, n, tenant, expect, within_s=5.0):
    """Node 3 reads locally: wait (bounded) until its store shows every key as expected."""
    deadline = time.monotonic() + within_s
    missing = None
    while time.monotonic() < deadline:
        with c.conn(n, tenant) as s:
            missing = {k: v for k, v in expect.items() if tl.gets(s, k) != v}
        if not missing:
            return
        time.sleep(0.1)
    raise AssertionError("node %d %s: not applied in %.0fs: %r" % (n, tenant, within_s, list(missing)[:5]))


def test_writes_through_any_node_reach_every_replica_with_one_cas(cluster, rng):
    c = cluster
    lead = c.leader("t0")
    follower = next(n for n in (1, 2) if n != lead)
    expect = {}
    with c.conn(lead, "t0") as via_leader, c.conn(follower, "t0") as via_follower:
        for i in range(40):
            s = via_leader if i % 2 == 0 else via_follower
            key = b"k%d" % i
            value = b"%x" % rng.getrandbits(64)
            assert ask(s, tl.set_cmd(key, value)) == b"STORED\r\n"
            expect[key] = value
        # The replies are the replicated outcome: NOT_STORED, numbers, EXISTS, meta flags.
        assert ask(via_follower, b"add k0 0 0 1\r\nz\r\n") == b"NOT_STORED\r\n"
        assert ask(via_follower, b"set n 0 0 2\r\n40\r\n") == b"STORED\r\n"
        assert ask(via_follower, b"incr n 2\r\n") == b"42\r\n"
        assert ask(via_leader, b"append n 0 0 1\r\n7\r\n") == b"STORED\r\n"
        value, cas = tl.gets(via_follower, b"n")
        assert value == b"427"
        assert ask(via_leader, b"cas n 0 0 1 %d\r\n9\r\n" % (cas + 1000)) == b"EXISTS\r\n"
        assert ask(via_follower, b"cas n 0 0 1 %d\r\n9\r\n" % cas) == b"STORED\r\n"
        assert ask(via_follower, b"delete k39\r\n") == b"DELETED\r\n"
        del expect[b"k39"]
        expect[b"n"] = b"9"
        r = ask(via_follower, b"ms m 2 T0 c\r\nhi\r\n")
        assert r.startswith(b"HD c"), r
        expect[b"m"] = b"hi"
        # noreply: the next reply is the get's, in order.
        assert ask(via_follower, b"set q 0 0 1 noreply\r\nQ\r\nget q\r\n", b"END\r\n") == tl.get_reply(b"q", b"Q")
        expect[b"q"] = b"Q"
    # A binary SET through the follower (a connection's first byte picks its protocol):
    # status 0, a CAS, the same on every node below.
    with c.conn(follower, "t0") as s:
        s.sendall(mcwire.bin_set(b"b", b"bin", 77))
        h = mcwire.BIN_HDR.unpack(tl.read_exact(s, 24))
        assert (h[0], h[1], h[5], h[7]) == (0x81, 0x01, 0, 77), h
        assert h[8] > 0
        expect[b"b"] = b"bin"
    # Every node's store: the same values and CAS. Node 3 reads its local store as it is.
    with c.conn(lead, "t0") as s:
        want = {k: tl.gets(s, k) for k in expect}
    assert all(want[k][0] == v for k, v in expect.items()), want
    local_store_has(c, 3, "t0", want)
    with c.conn(follower, "t0") as s:
        assert {k: tl.gets(s, k) for k in expect} == want
    # The follower forwarded; the other tenant's group is separate.
    assert c.metric(follower, "slipstream_replica_forwarded_total", "t0") >= 20
    with c.conn(follower, "t1") as s:
        assert ask(s, b"get k0\r\n", b"END\r\n") == b"END\r\n"


def test_leader_kill_keeps_acknowledged_writes_and_the_node_catches_up(cluster, rng):
    c = cluster
    lead = c.leader("t0")
    acked = {}
    with c.conn(lead, "t0") as s:
        for i in range(60):
            key, value = b"a%d" % i, b"%x" % rng.getrandbits(48)
            assert ask(s, tl.set_cmd(key, value)) == b"STORED\r\n"
            acked[key] = value
    c.kill(lead)
    survivors = tuple(n for n in NODES if n != lead)
    killed_at = time.monotonic()
    # The first write after the kill, through a survivor, waits for the new leader.
    r = write_retrying(c, survivors[0], "t0", tl.set_cmd(b"after", b"kill"))
    assert r == b"STORED\r\n", r
    print("leader %d killed: first acknowledged write %.2fs later" % (lead, time.monotonic() - killed_at))
    new_lead = c.leader("t0", among=survivors)
    assert new_lead != lead
    acked[b"after"] = b"kill"
    with c.conn(survivors[0], "t0") as s:
        want = {k: tl.gets(s, k) for k in acked}
    lost = [k for k, v in acked.items() if want[k] is None or want[k][0] != v]
    assert not lost, "acknowledged writes lost after the leader kill: %r" % lost[:5]
    with c.conn(survivors[1], "t0") as s:
        assert {k: tl.gets(s, k) for k in acked} == want
    # More writes while the killed node is down; then it restarts from its data_dir.
    with c.conn(survivors[1], "t0") as s:
        for i in range(20):
            assert ask(s, tl.set_cmd(b"b%d" % i, b"down%d" % i)) == b"STORED\r\n"
    c.start(lead)
    with c.conn(survivors[0], "t0") as s:
        want = {k: tl.gets(s, k) for k in list(acked) + [b"b%d" % i for i in range(20)]}
    if lead == 3:
        local_store_has(c, 3, "t0", want, within_s=10.0)
    else:
        # A linearizable read through the restarted node waits until it has applied the
        # leader's commit index: its own store answers.
        deadline = time.monotonic() + 10.0
        while True:
            with c.conn(lead, "t0") as s:
                got = {k: tl.gets(s, k) for k in want}
            if got == want or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert got == want
    # Its applied index reaches the leader's (bounded).
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        a = [c.metric(n, "slipstream_replica_applied_index", "t0") for n in NODES]
        if len(set(a)) == 1:
            break
        time.sleep(0.2)
    assert len(set(a)) == 1, a


def test_without_a_quorum_clients_get_the_documented_error(cluster):
    c = cluster
    lead = c.leader("t1")
    with c.conn(lead, "t1") as s:
        assert ask(s, tl.set_cmd(b"x", b"1")) == b"STORED\r\n"
    others = [n for n in NODES if n != lead]
    for n in others:
        c.kill(n)
    alone = lead
    t = time.monotonic()
    with c.conn(alone, "t1") as s:
        r = ask(s, tl.set_cmd(b"y", b"2"), max_s=WAIT_MS / 1000 + 5)
        took = time.monotonic() - t
        # Proposed while it still thought it led (outcome unknown), or refused for want of a
        # leader once it stepped down: never STORED, never silence.
        assert r in (TIMEOUT_LINE, NO_LEADER_LINE), r
        assert took < WAIT_MS / 1000 + 2.0, took
        if alone != 3:
            # A linearizable read cannot be served either.
            time.sleep(WAIT_MS / 1000)
            r = ask(s, b"get x\r\n", max_s=WAIT_MS / 1000 + 5)
            assert r in (TIMEOUT_LINE, NO_LEADER_LINE), r
        # The connection still serves what needs no group.
        assert ask(s, b"version\r\n").startswith(b"VERSION ")
