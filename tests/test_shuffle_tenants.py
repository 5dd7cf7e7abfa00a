"""The shuffle service with tenants (issue 17: a Spark application is a tenant), black-box: a
daemon with [shuffle], [shaping] and two [[tenant]] entries with a shuffle_mb share, raw protocol
lines as the connector sends them (HELLO/REGISTER name the tenant: spark.slipstream.shuffle.tenant).

- one tenant filling its share gets the clear SERVER_ERROR, the other tenant's shuffle goes on
  byte for byte; an unknown or missing tenant is a CLIENT_ERROR naming the tenants;
- shuffle bytes are charged to the tenant's own token buckets, the ones its KV traffic pays
  from: after a map output is committed the tenant's KV `set` waits for the ingress debt, its
  next ALLOC waits, a LOOKUP's bytes make the next LOOKUP wait on egress; the other tenant is
  never held back; the per-tenant metrics count the bytes exactly.
"""

import os
import socket
import time

import pytest

import mcwire
from test_shuffle import BLOCK, Conn, ShuffleDaemon

HOST = mcwire.HOST
# Each tenant's buckets refill at 0.5 x 2 MB/s = 1 MB/s each way (burst 64 KiB).
CAPACITY_BYTES_PER_S = 2_000_000


class TenantShuffleDaemon(ShuffleDaemon):
    """test_shuffle's daemon (its stop and metrics) in tenant mode."""

    what = "slipstream with [shuffle] and [[tenant]]"
    file_prefix = "slipstream-shuffle-tenants-"

    def __init__(self):
        super().__init__(memory_mb=4)

    def _pick_ports(self):
        self.port = mcwire.free_port()
        self.admin_port = mcwire.free_port()
        self.kv = {"etl": mcwire.free_port(), "adhoc": mcwire.free_port()}
        text = '[server]\nadmin = "%s:%d"\n[shuffle]\ntcp_port = %d\nmemory_mb = %d\nblock_kb = 64\ndir = "%s"\n' % (
            HOST, self.admin_port, self.port, self.memory_mb, self.dir)
        text += "[shaping]\ningress_bytes_per_s = %d\negress_bytes_per_s = %d\n" % (
            CAPACITY_BYTES_PER_S, CAPACITY_BYTES_PER_S)
        # etl: 2 MiB of blocks (32 of 64 KiB) out of its 8 MiB; adhoc: 1 MiB (16 blocks).
        for name, shuffle_mb in (("etl", 2), ("adhoc", 1)):
            text += ('[[tenant]]\nname = "%s"\ntcp_port = %d\nshare = 0.5\nmemory_mb = 8\nshuffle_mb = %d\n'
                     "burst_bytes = 65536\n" % (name, self.kv[name], shuffle_mb))
        return text

    def _serve_args(self):
        return ["-l", HOST]

    def _ready_ports(self):
        return [self.port, self.admin_port] + list(self.kv.values())

    def metric(self, name, tenant):
        key = '%s{tenant="%s"} ' % (name, tenant)
        for line in self.metrics().splitlines():
            if line.startswith(key):
                return float(line[len(key):])
        raise AssertionError("no metric %s" % key)


@pytest.fixture
def daemon():
    if not mcwire.slipstream_available():
        pytest.skip("slipstream binary not built: %s" % mcwire.SLIPSTREAM_BIN)
    d = TenantShuffleDaemon().start()
    yield d
    d.remove()


def alloc_and_commit(c, app, map_id, blocks):
    """ALLOCs `blocks` blocks, commits one full-block segment each to partition 0; bytes committed."""
    ids = [int(c.ask("ALLOC %s 0\r\n" % app).split()[1]) for _ in range(blocks)]
    lines = "".join("0 %d 0 %d\r\n" % (b, BLOCK) for b in ids)
    c.send("COMMIT %s 0 %d 1 %d\r\n%s" % (app, map_id, len(ids), lines))
    assert c.until_end(c.line())[0] == "COMMITTED 1 %d" % len(ids)
    return len(ids) * BLOCK


def timed(f):
    t0 = time.monotonic()
    out = f()
    return out, time.monotonic() - t0


def test_a_tenant_filling_its_share_does_not_stop_the_other(daemon):
    c = Conn(daemon.port)
    # Unknown and missing tenants are refused with the names this daemon has.
    assert c.ask("HELLO nope\r\n").startswith('CLIENT_ERROR unknown tenant "nope" (tenants with a shuffle_mb share here: etl, adhoc)')
    assert c.ask("HELLO etl\r\n").startswith("OK 1 %d " % BLOCK)
    assert c.ask("REGISTER app-e 0 2\r\n").startswith("CLIENT_ERROR this daemon charges shuffles to tenants: set spark.slipstream.shuffle.tenant")
    assert c.ask("REGISTER app-e 0 2 etl\r\n") == "OK"
    assert c.ask("REGISTER app-e 1 2 adhoc\r\n").startswith('CLIENT_ERROR application app-e is registered under tenant "etl"')
    got = [c.ask("ALLOC app-e 0\r\n") for _ in range(33)]
    assert all(g.startswith("BLOCK ") for g in got[:32]), got
    assert got[32].startswith('SERVER_ERROR shuffle pool full for tenant "etl": all 32 blocks of 65536 bytes of its share'), got[32]
    # The pool still has 32 blocks; adhoc's share (16) is whole: its map output goes through.
    a = Conn(daemon.port)
    assert a.ask("HELLO adhoc\r\n").startswith("OK 1 ")
    assert a.ask("REGISTER app-a 0 1 adhoc\r\n") == "OK"
    blk = int(a.ask("ALLOC app-a 0\r\n").split()[1])
    payload = os.urandom(1000)
    with open(os.path.join(daemon.dir, "blk-%d" % blk), "r+b") as f:
        f.write(payload)
    a.send("COMMIT app-a 0 0 1 1\r\n0 %d 0 1000\r\n" % blk)
    assert a.until_end(a.line())[0] == "COMMITTED 1 1"
    r = Conn(daemon.port)
    got = r.until_end(r.ask("LOOKUP app-a 0 0\r\n"))
    assert got[0] == "SEGMENTS 1" and got[2] == "END" and got[1].split(" ")[:5] == ["0", "1", str(blk), "0", "1000"], got
    with open(os.path.join(daemon.dir, "blk-%d" % blk), "rb") as f:
        assert f.read(1000) == payload
    assert r.ask("RELEASE %d\r\n" % blk) == "OK"
    more = [a.ask("ALLOC app-a 0\r\n") for _ in range(16)]
    assert all(g.startswith("BLOCK ") for g in more[:15]) and more[15].startswith("SERVER_ERROR shuffle pool full for tenant \"adhoc\"")
    assert daemon.metric("slipstream_shuffle_tenant_blocks_in_use", "etl") == 32
    assert daemon.metric("slipstream_shuffle_tenant_blocks_in_use", "adhoc") == 16
    assert daemon.metric("slipstream_shuffle_tenant_alloc_refused_total", "etl") == 1
    assert daemon.metric("slipstream_shuffle_tenant_bytes_in_total", "adhoc") == 1000
    assert daemon.metric("slipstream_shuffle_tenant_bytes_out_total", "adhoc") == 1000
    # The share comes out of the tenant's memory: its store keeps 8 - 2 MiB.
    assert daemon.metric("slipstream_tenant_memory_limit_bytes", "etl") == 6 << 20
    # etl's map task dies: its blocks go back to its share, and it can allocate again.
    c.close()
    for _ in range(100):
        if daemon.metric("slipstream_shuffle_tenant_blocks_in_use", "etl") == 0:
            break
        time.sleep(0.02)
    d = Conn(daemon.port)
    assert d.ask("ALLOC app-e 0\r\n").startswith("BLOCK ")
    for x in (a, r, d):
        x.close()
    assert daemon.alive()


def test_shuffle_bytes_pay_from_the_tenants_buckets(daemon):
    c = Conn(daemon.port)
    assert c.ask("REGISTER app-e 0 1 etl\r\n") == "OK"
    a = Conn(daemon.port)
    assert a.ask("REGISTER app-a 0 1 adhoc\r\n") == "OK"
    # 768 KiB of etl map output: its ingress bucket (1 MB/s, 64 KiB burst) owes ~0.72 s.
    committed = alloc_and_commit(c, "app-e", 0, 12)
    # Its KV traffic pays from the same bucket: a set waits for the debt.
    kv = socket.create_connection((HOST, daemon.kv["etl"]), timeout=10)
    kv_f = kv.makefile("rb")
    kv.sendall(b"set k 0 0 5\r\nhello\r\n")
    line, waited = timed(kv_f.readline)
    assert line == b"STORED\r\n"
    assert waited >= 0.3, "etl's KV set did not wait for the shuffle's ingress debt (%.3f s)" % waited
    # ... while adhoc's KV and shuffle traffic is not held back.
    other = socket.create_connection((HOST, daemon.kv["adhoc"]), timeout=10)
    other.sendall(b"set k 0 0 5\r\nhello\r\n")
    assert other.makefile("rb").readline() == b"STORED\r\n"
    committed_a = alloc_and_commit(a, "app-a", 0, 4)
    # Another 768 KiB: etl's next ALLOC waits for its own bucket.
    committed += alloc_and_commit(c, "app-e", 1, 12)
    blk, waited = timed(lambda: c.ask("ALLOC app-e 0\r\n"))
    assert blk.startswith("BLOCK "), blk
    assert waited >= 0.3, "etl's ALLOC did not wait for its ingress debt (%.3f s)" % waited
    assert daemon.metric("slipstream_shuffle_tenant_throttled_total", "etl") >= 1
    # Egress: a LOOKUP hands out 1.5 MiB, so etl's next LOOKUP waits for its egress bucket.
    r = Conn(daemon.port)
    found = r.until_end(r.ask("LOOKUP app-e 0 0\r\n"))
    assert found[0] == "SEGMENTS 24"
    again, waited = timed(lambda: r.until_end(r.ask("LOOKUP app-e 0 0\r\n")))
    assert again[0] == "SEGMENTS 24"
    assert waited >= 0.3, "etl's LOOKUP did not wait for its egress debt (%.3f s)" % waited
    assert daemon.metric("slipstream_shuffle_tenant_bytes_in_total", "etl") == committed
    assert daemon.metric("slipstream_shuffle_tenant_bytes_out_total", "etl") == 2 * committed
    assert daemon.metric("slipstream_shuffle_tenant_bytes_in_total", "adhoc") == committed_a
    assert daemon.metric("slipstream_shuffle_tenant_throttled_seconds_total", "etl") >= 0.3
    assert daemon.metric("slipstream_shuffle_tenant_throttled_total", "adhoc") == 0
    assert daemon.metric("slipstream_tenant_throttled_total", "adhoc") == 0
    assert daemon.metric("slipstream_tenant_throttled_total", "etl") >= 1
    for x in (c, a, r):
        x.close()
    kv_f.close()
    kv.close()
    other.close()
