"""Replicated tenants on fewer nodes than the cluster has (issue 15, `replicas` < nodes),
black-box: five real `slipstream serve --config` daemons, node n on its own loopback address
127.0.0.n (so a tenant's port is the same number on every node, as on real hosts).

- `s3`: `nodes = [1, 2, 3]`, preferred leader 1: nodes 4 and 5 hold no replica and relay
  connections on its port to a member (crates/server/src/relay.rs).
- `w3`: `replicas = 3`, `preferred_leader = 4`: placed by the rule (the 3 peers from the
  preferred leader on, by id, wrapping): nodes 4, 5, 1; nodes 2 and 3 relay.

For: writes through a non-member node are acknowledged only once the group has them; after
the group leader is SIGKILLed every acknowledged write is on every member, the members end
with identical contents (value and CAS of every key, item counts), and the non-members'
stores and data dirs hold nothing of the tenant; a bad `nodes` key stops the daemon with a
clear error. Not for: Raft itself (crates/replication/tests/cluster.rs).

Randomized values are seeded (REPL_SEED or the clock) and the seed is printed. Every daemon
is SIGKILLed at teardown, failure or not; every wait is bounded.
"""

import http.client
import json
import os
import socket
import subprocess
import time

import pytest

import mcwire
import replcluster
import tenantlib as tl

NODES = (1, 2, 3, 4, 5)
PLACED = {"s3": (1, 2, 3), "w3": (4, 5, 1)}
WAIT_MS = 1500
LEADER_S = 15.0
RETRY_LINES = (b"SERVER_ERROR no leader for this tenant\r\n",
               b"SERVER_ERROR replication timeout, outcome unknown\r\n",
               b"SERVER_ERROR no node of this tenant's group is reachable\r\n")
TOKEN = "repl-subset-admin-token-0123456789"


def host(n):
    return "127.0.0.%d" % n


class Cluster(replcluster.Daemons):
    def __init__(self, root):
        super().__init__(root)
        fresh = self.fresh_port
        self.raft = {n: fresh() for n in NODES}
        self.admin = {n: fresh() for n in NODES}
        port = {t: fresh() for t in PLACED}
        # The same tenant port on every node, each node on its own address.
        self.ports = {n: dict(port) for n in NODES}
        self.host = {n: host(n) for n in NODES}
        peers = ", ".join('"%d=%s:%d"' % (n, host(n), self.raft[n]) for n in NODES)
        for n in NODES:
            lines = [
                "[server]", 'listen = "%s"' % host(n), "threads = 2", "port = %d" % fresh(),
                'admin = "%s:%d"' % (host(n), self.admin[n]), 'admin_token = "%s"' % TOKEN, "",
                "[cluster]", "node_id = %d" % n, "peers = [%s]" % peers,
                'data_dir = "%s"' % self.data_dir(n), 'fsync = "batch"', "wait_ms = %d" % WAIT_MS, "",
                "[[tenant]]", 'name = "s3"', "tcp_port = %d" % port["s3"], "memory_mb = 16", "share = 0.3",
                "nodes = [1, 2, 3]", "preferred_leader = 1", "",
                "[[tenant]]", 'name = "w3"', "tcp_port = %d" % port["w3"], "memory_mb = 16", "share = 0.3",
                "replicas = 3", "preferred_leader = 4",
            ]
            with open(self.config(n), "w") as f:
                f.write("\n".join(lines) + "\n")

    def http(self, n, method, path, body=None):
        conn = http.client.HTTPConnection(host(n), self.admin[n], timeout=10)
        try:
            hdrs = {"Authorization": "Bearer " + TOKEN}
            if body is not None:
                hdrs["Content-Type"] = "application/json"
            conn.request(method, path, body=None if body is None else json.dumps(body).encode(), headers=hdrs)
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def metric(self, n, name, tenant):
        _, body = self.http(n, "GET", "/metrics")
        return tl.metric_value(body.decode(), name, tenant)

    def leader(self, tenant, among, within_s=LEADER_S):
        return self.agreed_leader(tenant, among, within_s)

    def conn(self, n, tenant):
        s = socket.create_connection((host(n), self.ports[n][tenant]), timeout=10)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return s


@pytest.fixture
def cluster():
    if not mcwire.slipstream_available():
        pytest.skip("slipstream binary not built: %s" % mcwire.SLIPSTREAM_BIN)
    try:
        socket.create_server((host(5), 0)).close()
    except OSError:
        pytest.skip("cannot bind 127.0.0.5")
    with replcluster.running(Cluster, "slipstream-subset-", NODES) as c:
        yield c


@pytest.fixture
def rng():
    return replcluster.seeded_rng("test_replication_subset")


def ask(sock, data, suffix=b"\r\n"):
    return tl.ask(sock, data, suffix, max_s=10.0)


def write_retrying(c, node, tenant, data, within_s=LEADER_S):
    """Send a write on a fresh connection until it is not a retryable refusal (bounded)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            with c.conn(node, tenant) as s:
                r = ask(s, data)
        except OSError as e:
            r = repr(e).encode()
        if r == b"STORED\r\n" or time.monotonic() > deadline:
            return r
        time.sleep(0.1)


def contents(c, n, tenant, keys, within_s=10.0):
    """{key: (value, cas)} read through member n (linearizable: ReadIndex + its own store)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            with c.conn(n, tenant) as s:
                return {k: tl.gets(s, k) for k in keys}
        except (OSError, AssertionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_a_tenant_on_three_of_five_nodes_is_served_by_every_node_and_stored_on_its_three(cluster, rng):
    c = cluster
    members, outsiders = PLACED["s3"], (4, 5)
    lead = c.leader("s3", members)
    assert c.leader("w3", PLACED["w3"]) in PLACED["w3"]
    acked = {}
    # Through the non-members: text, meta and binary, each acknowledged by the group.
    for n in outsiders:
        with c.conn(n, "s3") as s:
            for i in range(30):
                key, value = b"n%d-%d" % (n, i), b"%x" % rng.getrandbits(48)
                assert ask(s, tl.set_cmd(key, value)) == b"STORED\r\n"
                acked[key] = value
            assert ask(s, b"set ctr 0 0 1\r\n5\r\n") == b"STORED\r\n"
            assert ask(s, b"incr ctr 10\r\n") == b"15\r\n"
            acked[b"ctr"] = b"15"
            r = ask(s, b"ms m%d 2 T0\r\nhi\r\n" % n)
            assert r.startswith(b"HD"), r
            acked[b"m%d" % n] = b"hi"
    with c.conn(5, "s3") as s:
        s.sendall(mcwire.bin_set(b"bin", b"BIN", 9))
        h = mcwire.BIN_HDR.unpack(tl.read_exact(s, 24))
        assert (h[0], h[1], h[5], h[7]) == (0x81, 0x01, 0, 9), h
        acked[b"bin"] = b"BIN"
    # Leader SIGKILLed; writes through a non-member continue once a new leader is elected
    # (the relay tries the preferred leader first, then the other members).
    c.kill(lead)
    killed_at = time.monotonic()
    survivors = tuple(n for n in members if n != lead)
    r = write_retrying(c, 4, "s3", tl.set_cmd(b"after", b"kill"))
    assert r == b"STORED\r\n", r
    print("s3 leader %d killed: first write through node 4 acknowledged %.2fs later"
          % (lead, time.monotonic() - killed_at))
    acked[b"after"] = b"kill"
    with c.conn(5, "s3") as s:
        for i in range(20):
            key = b"down%d" % i
            assert ask(s, tl.set_cmd(key, b"d%d" % i)) == b"STORED\r\n"
            acked[key] = b"d%d" % i
    assert c.leader("s3", survivors) in survivors
    # The killed member restarts from its data_dir and catches up.
    c.start(lead)
    want = contents(c, survivors[0], "s3", acked)
    lost = [k for k, v in acked.items() if want[k] is None or want[k][0] != v]
    assert not lost, "acknowledged writes lost: %r" % lost[:5]
    for n in members:
        deadline = time.monotonic() + 15.0
        while True:
            got = contents(c, n, "s3", acked)
            if got == want or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert got == want, "member %d differs: %r" % (n, [k for k in want if got.get(k) != want[k]][:5])
    deadline = time.monotonic() + 10.0
    while True:
        items = {n: c.metric(n, "slipstream_tenant_items", "s3") for n in members}
        if len(set(items.values())) == 1 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert set(items.values()) == {float(len(acked))}, items
    # Nothing of s3 on the non-members: an empty store, no group on disk, no raft state.
    for n in outsiders:
        assert c.metric(n, "slipstream_tenant_items", "s3") == 0.0
        assert c.metric(n, "slipstream_replica_applied_index", "s3") is None
        assert c.metric(n, "slipstream_tenant_relayed_connections_total", "s3") >= 1
        assert c.metric(n, "slipstream_tenant_requests_total", "s3") == 0.0
    # w3 (placed by the rule on 4, 5, 1): written through node 2, held by 4, 5 and 1 only.
    assert write_retrying(c, 2, "w3", tl.set_cmd(b"w", b"rule")) == b"STORED\r\n"
    got = {n: contents(c, n, "w3", [b"w"])[b"w"] for n in (1, 3, 4, 5)}
    assert len(set(got.values())) == 1 and got[4][0] == b"rule", got
    for n in (2, 3):
        assert c.metric(n, "slipstream_tenant_items", "w3") == 0.0
    for n in NODES:
        dirs = set(os.listdir(c.data_dir(n))) if os.path.isdir(c.data_dir(n)) else set()
        assert len(dirs) == sum(n in PLACED[t] for t in PLACED), (n, dirs)


def test_a_bad_placement_stops_the_daemon_with_a_clear_error(tmp_path):
    if not mcwire.slipstream_available():
        pytest.skip("slipstream binary not built: %s" % mcwire.SLIPSTREAM_BIN)
    base = ['[cluster]', 'node_id = 1', 'peers = ["1=127.0.0.1:1", "2=127.0.0.1:2", "3=127.0.0.1:3"]',
            'data_dir = "%s"' % tmp_path, '', '[[tenant]]', 'name = "t"', 'tcp_port = %d' % mcwire.free_port(),
            'share = 0.5']
    for extra, says in ((["nodes = [1, 9]"], "node 9 is not in [cluster] peers"),
                        (["nodes = [1, 2]", "replicas = 3"], "replicas 3 but nodes [1, 2] has 2"),
                        (["nodes = [2, 3]", "preferred_leader = 1"], "preferred_leader 1 is not one of"),
                        (["replicas = 2", "udp_port = %d" % mcwire.free_port(socket.SOCK_DGRAM)], "udp_port")):
        cfg = tmp_path / "bad.toml"
        cfg.write_text("\n".join(base + extra) + "\n")
        p = subprocess.run([mcwire.SLIPSTREAM_BIN, "serve", "--config", str(cfg)], capture_output=True, timeout=20)
        assert p.returncode != 0
        assert says in p.stderr.decode(), p.stderr.decode()


def test_a_non_member_relays_to_the_current_leader_not_the_preferred_one(cluster):
    """s3's leadership moves from its preferred node 1 to node 3 (admin API); a non-member's
    relay asks a member who leads and goes there: its writes reach the leader in one hop,
    none is forwarded by a follower (before, the relay tried node 1 first, which forwarded
    every write)."""
    c = cluster
    members = PLACED["s3"]
    c.leader("s3", members)
    status, body = c.http(1, "PUT", "/tenants/s3", {"leader": 3})
    assert status == 200, (status, body)
    assert c.leader("s3", members, within_s=10) == 3
    time.sleep(1.2)  # past the relay's leader-hint lifetime (LEADER_HINT_TTL_MS)
    forwarded = {n: c.metric(n, "slipstream_replica_forwarded_total", "s3") for n in members}
    writes = {n: c.metric(n, "slipstream_replica_writes_total", "s3") for n in members}
    with c.conn(4, "s3") as s:
        for i in range(20):
            assert ask(s, tl.set_cmd(b"lead%d" % i, b"v%d" % i)) == b"STORED\r\n"
    assert c.leader("s3", members, within_s=1) == 3, "leadership moved during the test"
    after = {n: c.metric(n, "slipstream_replica_forwarded_total", "s3") for n in members}
    assert after == forwarded, "writes relayed to a follower and forwarded: %r -> %r" % (forwarded, after)
    assert c.metric(4, "slipstream_tenant_relayed_to_leader_total", "s3") >= 1
    print("writes on the members before/after: %r / %r" %
          (writes, {n: c.metric(n, "slipstream_replica_writes_total", "s3") for n in members}))
