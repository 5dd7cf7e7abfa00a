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
fetch error (the reader's FetchFailed then makes Spark recompute). Needs root (namespaces);
skipped otherwise. Every wait is bounded; the namespace, veth and daemons go even on failure.
"""

import contextlib
import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request

import pytest

import daemonlib
import mcwire

BLOCK = 64 * 1024
A_IP, B_IP = "10.79.0.1", "10.79.0.2"
START_TIMEOUT_S = 20


def _root_and_ip():
    return os.geteuid() == 0 and shutil.which("ip") is not None and mcwire.slipstream_available()


def sh(*args):
    r = subprocess.run(list(args), capture_output=True, text=True, timeout=20)
    if r.returncode != 0:
        raise RuntimeError("%s: %s" % (" ".join(args), r.stderr.strip()))


class Host:
    """One shuffle daemon: here (`ns` None) or inside namespace `ns`, listening on `ip`, with a
    pool of `memory_mb` in blocks of `block_kb` (the benchmark sizes them up)."""

    def __init__(self, name, ip, ns, port, peer, memory_mb=4, block_kb=64):
        self.name, self.ip, self.ns, self.port = name, ip, ns, port
        self.admin_port = port + 1
        self.dir = tempfile.mkdtemp(prefix="slipstream-shuffle-%s-" % name, dir="/dev/shm")
        fd, self.config = tempfile.mkstemp(prefix="slipstream-shuffle-%s-" % name, suffix=".toml")
        with os.fdopen(fd, "w") as f:
            f.write('[server]\nadmin = "%s:%d"\n[shuffle]\nlisten = "%s"\ntcp_port = %d\nmemory_mb = %d\n'
                    'block_kb = %d\ndir = "%s"\npeers = ["%s"]\npeer_timeout_ms = 3000\n'
                    % (ip, self.admin_port, ip, port, memory_mb, block_kb, self.dir, peer))
        self.log = self.config[:-5] + ".log"
        self.proc = None

    def start(self):
        prefix = ["ip", "netns", "exec", self.ns] if self.ns else []
        kv = str(mcwire.free_port()) if not self.ns else "11211"  # B's own loopback
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                prefix + [mcwire.SLIPSTREAM_BIN, "serve", "-l", "127.0.0.1", "-p", kv, "--config", self.config],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert self.proc.poll() is None, "%s exited: %s" % (self.name, open(self.log).read()[-2000:])
            try:
                socket.create_connection((self.ip, self.port), timeout=0.5).close()
                return self
            except OSError:
                assert time.monotonic() < deadline, "%s not accepting" % self.name
                time.sleep(0.05)

    def stop(self):
        daemonlib.stop_group(self.proc)

    def cleanup(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
        for p in (self.config, self.log):
            if os.path.exists(p):
                os.unlink(p)

    def metric(self, name):
        url = "http://%s:%d/metrics" % (self.ip, self.admin_port)
        with urllib.request.urlopen(url, timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " "):
                    return int(float(line.split()[1]))
        raise AssertionError("no metric %s" % name)

    def block_bytes(self, block, offset, length):
        with open(os.path.join(self.dir, "blk-%d" % block), "rb") as f:
            f.seek(offset)
            return f.read(length)


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


@contextlib.contextmanager
def two_hosts(memory_mb=4, block_kb=64):
    """Daemon A here and B in a fresh namespace over a veth pair, each the other's peer; the
    namespace, link and daemons are removed on the way out, also on failure."""
    tag = "%d" % (os.getpid() % 100000)
    ns, here, there = "shfb" + tag, "sha" + tag, "shb" + tag
    made_ns = made_link = False
    a = b = None
    try:
        sh("ip", "netns", "add", ns)
        made_ns = True
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "link", "add", here, "type", "veth", "peer", "name", there, "netns", ns)
        made_link = True
        sh("ip", "addr", "add", A_IP + "/24", "dev", here)
        sh("ip", "link", "set", here, "up")
        sh("ip", "-n", ns, "addr", "add", B_IP + "/24", "dev", there)
        sh("ip", "-n", ns, "link", "set", there, "up")
        port = 17300 + int(tag) % 1000 * 2
        a = Host("a", A_IP, None, port, "%s:%d" % (B_IP, port), memory_mb, block_kb)
        b = Host("b", B_IP, ns, port, "%s:%d" % (A_IP, port), memory_mb, block_kb)
        a.start()
        b.start()
        yield a, b
    finally:
        for h in (a, b):
            if h is not None:
                h.cleanup()
        if made_link:
            subprocess.run(["ip", "link", "del", here], capture_output=True, timeout=20)
        if made_ns:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)


@pytest.fixture
def hosts():
    if not _root_and_ip():
        pytest.skip("needs root, iproute2 and the slipstream binary")
    with two_hosts() as pair:
        yield pair


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
    for m, attempt, block, offset, length in rows:
        assert attempt == 1 and b.block_bytes(block, offset, length) == want[(m, 2)], "map %d" % m
        remote += length if m < 4 else 0
    assert b.metric("slipstream_shuffle_peer_bytes_received_total") == remote
    assert a.metric("slipstream_shuffle_peer_bytes_sent_total") - sent_before == remote
    copies = {r[2] for r in rows if r[0] < 4}
    assert b.metric("slipstream_shuffle_blocks_in_use") == in_use_b + len(copies)
    for blk in copies:
        assert reader.ask("RELEASE %d\r\n" % blk) == "OK"
    assert b.metric("slipstream_shuffle_blocks_in_use") == in_use_b, "copy blocks freed at RELEASE"
    # The other way: A's reducer gets B's maps 4 and 5.
    ra = Conn(a)
    got = ra.lines_to_end(ra.ask("LOOKUP %s 0 0\r\n" % app))
    rows = [tuple(int(x) for x in line.split()) for line in got[1:-1]]
    assert [r[0] for r in rows] == list(range(6))
    for m, _, block, offset, length in rows:
        assert a.block_bytes(block, offset, length) == want[(m, 0)], "map %d" % m
    # A map committed on both hosts (a speculative copy) is listed once: the local one.
    commit_map(b, cb, app, 0, {1: b"speculative"})
    got = reader.lines_to_end(reader.ask("LOOKUP %s 0 1\r\n" % app))
    rows = [tuple(int(x) for x in line.split()) for line in got[1:-1]]
    assert [r[0] for r in rows] == list(range(6))
    assert b.block_bytes(*rows[0][2:]) == b"speculative"
    for c in (ca, cb, reader, ra):
        c.close()


def test_a_peer_gone_leaves_its_maps_out_at_once(hosts):
    a, b = hosts
    ca, cb = Conn(a), Conn(b)
    for c in (ca, cb):
        assert c.ask("REGISTER app-y 0 1\r\n") == "OK"
    commit_map(a, ca, "app-y", 0, {0: b"from-a"})
    commit_map(b, cb, "app-y", 1, {0: b"from-b"})
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
