"""Replicated tenants' data path (issue 15), black-box: three real `slipstream serve --config`
daemons on loopback with one `[cluster]` and four replicated tenants.

For: pipelining (many writes of one connection in flight, replies in request order, through
the leader and through a forwarding follower, an over-size set in the middle); a full
replicated tenant refusing writes with memcached's `SERVER_ERROR out of memory storing object`
identically on every replica (never evicting), even when one replica's clients met expired
items the others did not; a tenant's raft traffic charged to its own token buckets (its
replicated write rate is bounded by its own egress share, another tenant's traffic is not
counted in it) and paced by them (a heavy tenant's appends wait for its egress bucket, the
held time in its metrics, with no election and another tenant's write p99 within a bound). Nodes 2 and 3 run `reads = "local"`, so a read there shows that node's store.
Not for: elections, failover, Raft itself (tests/test_replication.py, crates/replication).

Randomized values are seeded (REPL_SEED or the clock), the seed printed. Every daemon is
SIGKILLed at teardown; every wait is bounded.
"""

import os
import socket
import threading
import time

import pytest

import mcwire
import replcluster
import tenantlib as tl

HOST = mcwire.HOST
NODES = (1, 2, 3)
LEADER_S = 15.0
OOM_LINE = b"SERVER_ERROR out of memory storing object\r\n"
# [shaping]: 20 MB/s each way; the tenants' shares below divide it (no work conserving, so a
# tenant gets its own share only).
CAPACITY = 20_000_000
SLOW_SHARE = 0.02  # s0: 400 kB/s each way
FAST_SHARE = 0.3  # s1: 6 MB/s
BURST = 65536
# name, preferred leader, memory_mb, share
TENANTS = (
    ("p0", 1, 16, 0.3),
    ("f0", 2, 1, 0.2),
    ("s0", 3, 16, SLOW_SHARE),
    ("s1", 3, 16, FAST_SHARE),
)


class Cluster(replcluster.Daemons):
    def __init__(self, root):
        super().__init__(root)
        fresh = self.fresh_port

        self.raft = {n: fresh() for n in NODES}
        self.ports = {n: {t[0]: fresh() for t in TENANTS} for n in NODES}
        self.admin = {n: fresh() for n in NODES}
        peers = ", ".join('"%d=%s:%d"' % (n, HOST, self.raft[n]) for n in NODES)
        for n in NODES:
            lines = [
                "[server]", 'listen = "%s"' % HOST, "threads = 2", "port = %d" % fresh(),
                'admin = "%s:%d"' % (HOST, self.admin[n]), "",
                "[shaping]", "egress_bytes_per_s = %d" % CAPACITY, "ingress_bytes_per_s = %d" % CAPACITY,
                "work_conserving = false", "",
                "[cluster]", "node_id = %d" % n, "peers = [%s]" % peers,
                'data_dir = "%s"' % os.path.join(root, "node%d" % n), 'fsync = "batch"',
                'reads = "%s"' % ("linearizable" if n == 1 else "local"), "wait_ms = 3000",
            ]
            for name, lead, mem, share in TENANTS:
                lines += ["", "[[tenant]]", 'name = "%s"' % name, "tcp_port = %d" % self.ports[n][name],
                          "memory_mb = %d" % mem, "share = %s" % share, "burst_bytes = %d" % BURST,
                          "max_outstanding = 1024", "replicas = 3", "preferred_leader = %d" % lead]
            with open(self.config(n), "w") as f:
                f.write("\n".join(lines) + "\n")

    def metric(self, n, name, tenant):
        r = tl.http_request(self.admin[n], "GET", "/metrics")
        return tl.metric_value(r.body.decode(), name, tenant)

    def wait_leader(self, tenant, want, within_s=LEADER_S):
        """Wait (bounded) until every node agrees `want` leads `tenant` (preferred leaders)."""
        deadline = time.monotonic() + within_s
        seen = None
        while time.monotonic() < deadline:
            try:
                seen = {self.metric(n, "slipstream_replica_leader_id", tenant) for n in NODES}
            except OSError:
                seen = None
            if seen == {float(want)}:
                return
            time.sleep(0.1)
        raise AssertionError("%s: leader not %d within %.0fs (seen %r)" % (tenant, want, within_s, seen))

    def wait_converged(self, tenant, within_s=10.0):
        deadline = time.monotonic() + within_s
        a = None
        while time.monotonic() < deadline:
            a = [self.metric(n, "slipstream_replica_applied_index", tenant) for n in NODES]
            c = [self.metric(n, "slipstream_replica_commit_index", tenant) for n in NODES]
            if len(set(a)) == 1 and set(a) == set(c):
                return
            time.sleep(0.1)
        raise AssertionError("%s: replicas did not converge: applied %r" % (tenant, a))

    def conn(self, n, tenant):
        s = socket.create_connection((HOST, self.ports[n][tenant]), timeout=10)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return s


@pytest.fixture(scope="module")
def cluster():
    def leaders_in_place(c):
        for name, lead, _, _ in TENANTS:
            c.wait_leader(name, lead)

    with replcluster.running(Cluster, "slipstream-repldata-", NODES, leaders_in_place) as c:
        yield c


@pytest.fixture
def rng():
    return replcluster.seeded_rng("test_replication_data")


def exchange(sock, data, want_bytes, max_s=20.0):
    """Send `data` whole, read until `want_bytes` reply bytes arrived (or the time is up)."""
    sender = threading.Thread(target=sock.sendall, args=(data,), daemon=True)
    sender.start()
    got = tl.read_exact(sock, want_bytes, max_s=max_s)
    sender.join(timeout=max_s)
    return got


@pytest.mark.parametrize("via", ["leader", "follower"])
def test_a_connection_pipelines_writes_and_replies_keep_request_order(cluster, rng, via):
    c = cluster
    node = 1 if via == "leader" else 2
    pre = b"%s%d-" % (via.encode(), rng.getrandbits(20))
    with c.conn(node, "p0") as s:
        assert tl.ask(s, b"set %sc 0 0 1\r\n0\r\n" % pre, b"\r\n") == b"STORED\r\n"
        req, want = [], []
        values = {}
        for i in range(400):
            key = b"%sk%d" % (pre, i)
            value = b"%x" % rng.getrandbits(8 * rng.randint(1, 40))
            values[key] = value
            req.append(tl.set_cmd(key, value))
            want.append(b"STORED\r\n")
            if i % 40 == 7:
                # A write the group answers with a number, then an add that is refused, then
                # a read of the connection's own write (it waits for the writes before it).
                req.append(b"incr %sc 2\r\n" % pre)
                want.append(b"%d\r\n" % (2 * (i // 40 + 1)))
                req.append(b"add %s 0 0 1\r\nz\r\n" % key)
                want.append(b"NOT_STORED\r\n")
                req.append(b"get %s\r\n" % key)
                want.append(tl.get_reply(key, value))
            if i == 200:
                # Over-size: refused, its data swallowed; the writes behind it go on.
                big = 2 * 1024 * 1024
                req.append(b"set %sbig 0 0 %d\r\n" % (pre, big) + b"x" * big + b"\r\n")
                want.append(b"SERVER_ERROR object too large for cache\r\n")
            if i == 300:
                req.append(b"set %sq 0 0 1 noreply\r\nQ\r\n" % pre)
        req.append(b"mn\r\n")
        want.append(b"MN\r\n")
        expect = b"".join(want)
        got = exchange(s, b"".join(req), len(expect))
        assert got == expect, "first difference at byte %d: %r" % (
            next((i for i, (a, b) in enumerate(zip(got, expect)) if a != b), min(len(got), len(expect))),
            got[-200:],
        )
        # Nothing more is pending on the connection.
        assert tl.ask(s, b"version\r\n", b"\r\n").startswith(b"VERSION ")
    c.wait_converged("p0")
    # Node 3 reads its own store: every pipelined write is there.
    with c.conn(3, "p0") as s:
        for key in list(values)[::37]:
            assert tl.ask(s, b"get %s\r\n" % key, b"END\r\n") == tl.get_reply(key, values[key])
        assert tl.ask(s, b"get %sq\r\n" % pre, b"END\r\n") == tl.get_reply(pre + b"q", b"Q")


def test_a_full_replicated_tenant_refuses_writes_identically_on_every_replica(cluster, rng):
    c = cluster
    lead = 2  # f0's preferred leader; memory_mb = 1
    value = b"v" * 4000
    written = []
    outcomes = []
    with c.conn(lead, "f0") as s:
        # Items that expire in 6 s first, then live ones until the tenant is full.
        started = time.monotonic()
        for i in range(20):
            key = b"e%d" % i
            assert tl.ask(s, b"set %s 0 6 %d\r\n%s\r\n" % (key, len(value), value), b"\r\n") == b"STORED\r\n"
            written.append(key)
        refused = 0
        for i in range(600):
            key = b"k%d" % i
            r = tl.ask(s, tl.set_cmd(key, value), b"\r\n")
            assert r in (b"STORED\r\n", OOM_LINE), r
            outcomes.append(r)
            written.append(key)
            refused += r == OOM_LINE
            if refused >= 5:
                break
        assert refused >= 5, "1 MB tenant never full after %d sets" % len(outcomes)
        stored_before = outcomes.count(b"STORED\r\n")
        filled_in_time = time.monotonic() - started < 5.0
        # The items expire; only node 3's clients meet them (its local reads free them there).
        time.sleep(max(0.0, started + 7.2 - time.monotonic()))
        with c.conn(3, "f0") as r3:
            for i in range(20):
                assert tl.ask(r3, b"get e%d\r\n" % i, b"END\r\n") == b"END\r\n"
        # Later writes: the first entry of a new second sweeps what expired on every replica,
        # so about the 20 expired items' room is free again, the same on all three.
        after = []
        for i in range(40):
            key = b"n%d" % i
            r = tl.ask(s, tl.set_cmd(key, value), b"\r\n")
            assert r in (b"STORED\r\n", OOM_LINE), r
            after.append(r)
            written.append(key)
    assert after.count(b"STORED\r\n") <= 25, after
    if filled_in_time:
        assert after.count(b"STORED\r\n") >= 10, after
    assert stored_before > 100, stored_before
    stored = [k for k, r in zip([w for w in written if not w.startswith(b"e")], outcomes + after)
              if r == b"STORED\r\n"]
    c.wait_converged("f0")
    # Every replica holds the same items with the same CAS; nothing was evicted anywhere.
    contents = {}
    for n in NODES:
        with c.conn(n, "f0") as s:
            contents[n] = {k: tl.gets(s, k) for k in written}
            st = tl.stats(c.ports[n]["f0"])
            assert st.get("evictions") == "0", (n, st.get("evictions"))
    present = {n: sum(v is not None for v in contents[n].values()) for n in NODES}
    assert contents[1] == contents[2] == contents[3], present
    assert all(contents[1][b"e%d" % i] is None for i in range(20))
    # No eviction: every acknowledged item is still there.
    assert all(contents[1][k] is not None for k in stored), [k for k in stored if contents[1][k] is None][:5]


def hammer(c, node, tenant, value_bytes, seconds, depth=8):
    """Pipelined sets (`depth` in flight) for `seconds`; the number acknowledged STORED."""
    value = b"w" * value_bytes
    acked = 0
    deadline = time.monotonic() + seconds
    with c.conn(node, tenant) as s:
        s.settimeout(1.0)
        inflight = 0
        buf = b""
        i = 0
        while True:
            now = time.monotonic()
            while inflight < depth and now < deadline:
                s.sendall(tl.set_cmd(b"h%d" % (i % 64), value))
                i += 1
                inflight += 1
            if inflight == 0:
                break
            if now > deadline + 10:
                break
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                continue
            if not chunk:
                break
            buf += chunk
            while b"\r\n" in buf:
                line, buf = buf.split(b"\r\n", 1)
                inflight -= 1
                if line == b"STORED" and time.monotonic() <= deadline:
                    acked += 1
    return acked


def test_a_tenants_raft_traffic_is_charged_to_its_own_buckets(cluster):
    c = cluster
    lead = 3  # s0 and s1 are both led by node 3
    value_bytes = 16384
    seconds = 3.0
    sent0 = c.metric(lead, "slipstream_replica_raft_sent_bytes_total", "s0")
    sent1 = c.metric(lead, "slipstream_replica_raft_sent_bytes_total", "s1")
    got = {}
    threads = [threading.Thread(target=lambda t=t: got.__setitem__(t, hammer(c, lead, t, value_bytes, seconds)))
               for t in ("s0", "s1")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=seconds + 30)
    slow, fast = got["s0"], got["s1"]
    d0 = c.metric(lead, "slipstream_replica_raft_sent_bytes_total", "s0") - sent0
    d1 = c.metric(lead, "slipstream_replica_raft_sent_bytes_total", "s1") - sent1
    print("s0 (share %.2f): %d writes, %d raft bytes sent; s1 (share %.2f): %d writes, %d raft bytes"
          % (SLOW_SHARE, slow, d0, FAST_SHARE, fast, d1))
    # Each write of s0 leaves its leader twice (to both followers): its own egress bucket
    # (SLOW_SHARE of CAPACITY, plus the burst) bounds how many it gets acknowledged. Without
    # the raft charge only its ingress bucket (half that cost per write) would bound it.
    rate = SLOW_SHARE * CAPACITY
    bound = (rate * seconds * 1.2 + 2 * BURST) / (2 * value_bytes)
    assert 3 <= slow <= bound, (slow, bound)
    # The other tenant's replication is not in s0's account, and it is not held to s0's share.
    assert d0 >= 2 * value_bytes * slow
    assert d0 <= 2 * (value_bytes + 512) * (slow + 16) + 200_000, (d0, slow)
    assert d1 >= 2 * value_bytes * fast
    assert fast >= 2 * slow, (fast, slow)


def set_latencies(c, node, tenant, seconds, value_bytes=64):
    """Sequential sets on one connection for `seconds`: each one's latency (s)."""
    value = b"l" * value_bytes
    out = []
    deadline = time.monotonic() + seconds
    with c.conn(node, tenant) as s:
        i = 0
        while time.monotonic() < deadline:
            t = time.monotonic()
            r = tl.ask(s, tl.set_cmd(b"lat%d" % (i % 32), value), b"\r\n", max_s=10.0)
            out.append(time.monotonic() - t)
            assert r == b"STORED\r\n", r
            i += 1
    return out


def p99(xs):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * 0.99))]


def test_a_heavy_tenants_raft_traffic_waits_for_its_own_share(cluster):
    """s0 (a 2% share) written hard through its leader, node 3, on four connections: its raft
    appends wait for its egress bucket (the held time shows in
    slipstream_replica_raft_paced_ns_total, its raft bytes stay at its share), no election
    happens, and s1 (led by the same node, a 30% share) keeps its write p99 within a bound of
    its p99 without s0's load (4x + 50 ms; measured before and after, the larger taken)."""
    c = cluster
    lead, seconds, value_bytes = 3, 3.0, 16384
    names = [t[0] for t in TENANTS]

    def counters(name):
        return {(n, t): c.metric(n, name, t) for n in NODES for t in names}

    quiet = [p99(set_latencies(c, lead, "s1", 1.5))]
    paced0 = counters("slipstream_replica_raft_paced_ns_total")
    elections0 = counters("slipstream_replica_elections_won_total")
    sent0 = c.metric(lead, "slipstream_replica_raft_sent_bytes_total", "s0")
    got = {}
    heavy = [threading.Thread(target=lambda k=k: got.__setitem__(k, hammer(c, lead, "s0", value_bytes, seconds)))
             for k in range(4)]
    t0 = time.monotonic()
    for t in heavy:
        t.start()
    time.sleep(0.3)  # s0's burst spent: its appends are held from here on
    loaded = set_latencies(c, lead, "s1", seconds - 0.6)
    for t in heavy:
        t.join(timeout=seconds + 30)
    secs = time.monotonic() - t0
    sent = c.metric(lead, "slipstream_replica_raft_sent_bytes_total", "s0") - sent0
    paced = counters("slipstream_replica_raft_paced_ns_total")
    elections = counters("slipstream_replica_elections_won_total")
    quiet.append(p99(set_latencies(c, lead, "s1", 1.5)))
    held_s0 = (paced[(lead, "s0")] - paced0[(lead, "s0")]) / 1e9
    held_s1 = (paced[(lead, "s1")] - paced0[(lead, "s1")]) / 1e9
    print("s0: %d writes, %d raft bytes in %.2f s (share %.0f B/s), held %.2f s; s1 write p99 quiet %s, "
          "loaded %.2f ms (%d writes), s1 held %.3f s"
          % (sum(got.values()), sent, secs, SLOW_SHARE * CAPACITY, held_s0,
             ["%.2f ms" % (q * 1e3) for q in quiet], p99(loaded) * 1e3, len(loaded), held_s1))
    assert held_s0 >= 0.5 * seconds, "s0's appends were not held for its bucket (%.2f s)" % held_s0
    # s1 writes within its share here (a debt left by an earlier test may hold it briefly).
    assert held_s1 <= 0.1, "s1 (within its share) was held %.3f s" % held_s1
    # Its raft bytes leave at its share (both followers' appends, plus its burst and one
    # overshooting batch per follower).
    assert sent <= SLOW_SHARE * CAPACITY * secs * 1.2 + 2 * BURST + 2 * 8 * (value_bytes + 512) * 4, sent
    changed = {k: (elections0[k], v) for k, v in elections.items() if v != elections0[k]}
    assert not changed, "elections while s0 was paced: %r" % changed
    # A gross-regression bound: on this shared 2-core box at load ~20 the loaded p99 was
    # 0.3-3.5x the quiet one (noise: the client threads of this process, the other daemons).
    bound = 4 * max(quiet) + 0.05
    assert p99(loaded) <= bound, "s1's p99 %.2f ms over %.2f ms" % (p99(loaded) * 1e3, bound * 1e3)
