"""The shuffle service's cross-host path (crates/shuffle/src/peer.rs) black-box, over a real
network path: daemon A here, daemon B in a network namespace the test creates, joined by a veth
pair (A 10.79.0.1, B 10.79.0.2), each naming the other in `[shuffle] peers`. Map outputs are
committed to the daemon of the host where their map task ran; a reducer asks only its own
daemon, which fetches the other host's segments (FETCH: sendfile on the sender, splice on the
receiver) into blocks of its own pool.

Checks: every byte of every remote segment arrives (seeded random sizes, several blocks, the
seed printed), local and remote segments come back in map order, copy blocks are freed at
RELEASE, both daemons count the bytes; a map committed on both hosts is taken once (the local
copy); with the peer gone the lookup answers at once with the local maps only and counts a
fetch error (the reader's FetchFailed then makes Spark recompute); lookups reuse one kept
connection to the peer, and a peer restarted under it is reconnected without a fetch error. Needs root (namespaces);
skipped otherwise. Every wait is bounded; the namespace, veth and daemons go even on failure
(tests/shufflehosts.py).
"""

import os
import random
import socket
import time

import pytest

import shufflehosts

BLOCK = 64 * 1024


class Conn:
    def __init__(self, host):
        self.s = socket.create_connection((host.ip, host.port), timeout=10)
        self.f = self.s.makefile("rb")

    def ask(self, text):
        self.s.sendall(text.encode())
        return self.f.readline().decode().rstrip("\r\n")

    def lines_to_end(self, head):
        out = [head]
        while out[-1] != "END" and not out[-1].startswith(("CLIENT_ERROR", "SERVER_ERROR")):
            out.append(self.f.readline().decode().rstrip("\r\n"))
        return out

    def close(self):
        self.f.close()
        self.s.close()


def commit_map(host, conn, app, map_id, parts):
    """Writes map `map_id`'s partitions {partition: bytes} into fresh blocks of `host` (as a
    map task's mapping would) and commits them; each partition's bytes in one block."""
    segs = []
    block, used = None, BLOCK
    for p, data in sorted(parts.items()):
        if used + len(data) > BLOCK:
            block, used = int(conn.ask("ALLOC %s 0\r\n" % app).split()[1]), 0
        with open(os.path.join(host.dir, "blk-%d" % block), "r+b") as f:
            f.seek(used)
            f.write(data)
        segs.append("%d %d %d %d\r\n" % (p, block, used, len(data)))
        used += len(data)
    head = conn.ask("COMMIT %s 0 %d 1 %d\r\n%s" % (app, map_id, len(segs), "".join(segs)))
    assert conn.lines_to_end(head)[0] == "COMMITTED 1 %d" % len(segs)


@pytest.fixture
def hosts():
    if not shufflehosts.root_and_ip():
        pytest.skip("needs root, iproute2 and the slipstream binary")
    with shufflehosts.two_hosts() as (a, b, _ns):
        yield a, b


def test_lookup_brings_the_other_hosts_segments_byte_for_byte(hosts):
    a, b = hosts
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = random.Random(seed)
    app, parts = "app-x", 3
    ca, cb = Conn(a), Conn(b)
    for c in (ca, cb):
        assert c.ask("REGISTER %s 0 %d\r\n" % (app, parts)) == "OK"
    want = {}  # (map, partition) -> bytes
    for m in range(6):  # maps 0..3 ran on A, 4..5 on B
        out = {p: rng.randbytes(rng.choice([1, 100, 5000, 30000, BLOCK - 7])) for p in range(parts)}
        want.update({(m, p): d for p, d in out.items()})
        commit_map(a if m < 4 else b, ca if m < 4 else cb, app, m, out)
    sent_before = a.metric("slipstream_shuffle_peer_bytes_sent_total")
    in_use_b = b.metric("slipstream_shuffle_blocks_in_use")
    reader = Conn(b)
    got = reader.lines_to_end(reader.ask("LOOKUP %s 0 2\r\n" % app))
    assert got[0] == "SEGMENTS 6" and got[-1] == "END", got
    rows = [tuple(int(x) for x in line.split()) for line in got[1:-1]]
    assert [r[0] for r in rows] == list(range(6)), "map order"
    remote = 0
    for m, attempt, block, offset, length, file_id in rows:
        assert attempt == 1 and b.block_bytes(block, offset, length) == want[(m, 2)], "map %d" % m
        assert file_id > 0, "copies and local blocks alike name their file"
        remote += length if m < 4 else 0
    assert b.metric("slipstream_shuffle_peer_bytes_received_total") == remote
    assert a.metric("slipstream_shuffle_peer_bytes_sent_total") - sent_before == remote
    copies = {r[2] for r in rows if r[0] < 4}
    assert b.metric("slipstream_shuffle_blocks_in_use") == in_use_b + len(copies)
    assert reader.ask("RELEASE %s\r\n" % " ".join(str(blk) for blk in copies)) == "OK"  # all in one line
    assert b.metric("slipstream_shuffle_blocks_in_use") == in_use_b, "copy blocks freed at RELEASE"
    # The other way: A's reducer gets B's maps 4 and 5.
    ra = Conn(a)
    got = ra.lines_to_end(ra.ask("LOOKUP %s 0 0\r\n" % app))
    rows = [tuple(int(x) for x in line.split()) for line in got[1:-1]]
    assert [r[0] for r in rows] == list(range(6))
    for m, _, block, offset, length, _ in rows:
        assert a.block_bytes(block, offset, length) == want[(m, 0)], "map %d" % m
    # A map committed on both hosts (a speculative copy) is listed once: the local one.
    commit_map(b, cb, app, 0, {1: b"speculative"})
    got = reader.lines_to_end(reader.ask("LOOKUP %s 0 1\r\n" % app))
    rows = [tuple(int(x) for x in line.split()) for line in got[1:-1]]
    assert [r[0] for r in rows] == list(range(6))
    assert b.block_bytes(*rows[0][2:5]) == b"speculative"
    for c in (ca, cb, reader, ra):
        c.close()


def one_map_per_host(a, b, app):
    """Registers `app` (one partition) on both hosts and commits map 0 on A, map 1 on B;
    returns the two committing connections."""
    ca, cb = Conn(a), Conn(b)
    for c in (ca, cb):
        assert c.ask("REGISTER %s 0 1\r\n" % app) == "OK"
    commit_map(a, ca, app, 0, {0: b"from-a"})
    commit_map(b, cb, app, 1, {0: b"from-b"})
    return ca, cb


def test_a_peer_gone_leaves_its_maps_out_at_once(hosts):
    a, b = hosts
    ca, cb = one_map_per_host(a, b, "app-y")
    ca.close()
    a.stop()
    errors = b.metric("slipstream_shuffle_peer_fetch_errors_total")
    reader = Conn(b)
    t0 = time.monotonic()
    got = reader.lines_to_end(reader.ask("LOOKUP app-y 0 0\r\n"))
    assert time.monotonic() - t0 < 5
    assert got[0] == "SEGMENTS 1" and got[1].split()[0] == "1", got
    assert b.metric("slipstream_shuffle_peer_fetch_errors_total") == errors + 1
    reader.close()
    cb.close()


def test_lookups_reuse_one_connection_to_the_peer_and_reconnect_after_its_restart(hosts):
    a, b = hosts
    ca, cb = one_map_per_host(a, b, "app-z")
    opened = b.metric("slipstream_shuffle_peer_connections_opened_total")
    reader = Conn(b)
    for _ in range(5):
        got = reader.lines_to_end(reader.ask("LOOKUP app-z 0 0\r\n"))
        assert got[0] == "SEGMENTS 2", got
        assert reader.ask("RELEASE %s\r\n" % got[1].split()[2]) == "OK"  # the copy of A's map
    # One connection for the five FETCHes, still open on A (beside ca) for the next.
    assert b.metric("slipstream_shuffle_peer_connections_opened_total") == opened + 1
    assert a.metric("slipstream_shuffle_connections") == 2
    # A restarts (its map outputs gone): B's kept connection is dead; the FETCH is asked again
    # on a new one and A answers that it has nothing, which is not a fetch error.
    ca.close()
    a.stop()
    a.start()
    errors = b.metric("slipstream_shuffle_peer_fetch_errors_total")
    got = reader.lines_to_end(reader.ask("LOOKUP app-z 0 0\r\n"))
    assert got[0] == "SEGMENTS 1" and got[1].split()[0] == "1", got
    assert b.metric("slipstream_shuffle_peer_fetch_errors_total") == errors
    assert b.metric("slipstream_shuffle_peer_connections_opened_total") == opened + 2
    reader.close()
    cb.close()
