"""The shuffle service (crates/shuffle) black-box: raw protocol lines to the real binary with a
[shuffle] table. A map output committed into pool blocks is found by LOOKUP with its bytes in
the block file; the first attempt wins and a retry is idempotent; bad input gets CLIENT_ERROR
and the connection (or the daemon) carries on; the memory limit answers SERVER_ERROR; a
connection that ends frees its uncommitted blocks; the metrics have HELP lines.
"""

import os
import shutil
import socket
import tempfile
import time
import urllib.request

import pytest

import daemonlib
import mcwire

HOST = mcwire.HOST
BLOCK = 64 * 1024


class ShuffleDaemon(daemonlib.ConfigDaemon):
    what = "slipstream with [shuffle]"
    file_prefix = "slipstream-shuffle-"

    def __init__(self, memory_mb):
        super().__init__()
        self.memory_mb = memory_mb
        self.dir = tempfile.mkdtemp(prefix="slipstream-shuffle-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)

    def remove(self):
        """Stops the daemon and removes its config, log and pool directory (every test's teardown)."""
        self.stop()
        self.remove_files()
        shutil.rmtree(self.dir, ignore_errors=True)

    #: The control port when it must be known before the start (peers name it); else a free one.
    fixed_port = None

    def _pick_ports(self):
        self.kv_port = mcwire.free_port()
        self.port = self.fixed_port or mcwire.free_port()
        self.admin_port = mcwire.free_port()
        return (
            '[server]\nadmin = "%s:%d"\n[shuffle]\ntcp_port = %d\nmemory_mb = %d\nblock_kb = 64\ndir = "%s"\n'
            % (HOST, self.admin_port, self.port, self.memory_mb, self.dir)
        )

    def _serve_args(self):
        return ["-p", str(self.kv_port), "-l", HOST]

    def _ready_ports(self):
        return [self.kv_port, self.port, self.admin_port]

    def stop(self):
        daemonlib.stop_group(self.proc)
        self.proc = None

    def metrics(self):
        with urllib.request.urlopen("http://%s:%d/metrics" % (HOST, self.admin_port), timeout=5) as r:
            return r.read().decode()


class Conn:
    def __init__(self, port):
        self.s = socket.create_connection((HOST, port), timeout=5)
        self.f = self.s.makefile("rb")

    def send(self, text):
        self.s.sendall(text.encode())

    def line(self):
        return self.f.readline().decode().rstrip("\r\n")

    def ask(self, text):
        self.send(text)
        return self.line()

    def until_end(self, head):
        lines = [head]
        while lines[-1] != "END" and not lines[-1].startswith(("CLIENT_ERROR", "SERVER_ERROR")):
            lines.append(self.line())
        return lines

    def close(self):
        self.f.close()  # the socket stays open while its file object does
        self.s.close()


def one_daemon(cls):
    """A `cls` daemon of 1 MiB (16 blocks of 64 KiB) for one test, stopped and removed after
    it: the body of this file's and test_shuffle_driver.py's `daemon` fixtures."""
    if not mcwire.slipstream_available():
        pytest.skip("slipstream binary not built: %s" % mcwire.SLIPSTREAM_BIN)
    d = cls(memory_mb=1).start()
    yield d
    d.remove()


@pytest.fixture
def daemon():
    yield from one_daemon(ShuffleDaemon)


def test_commit_lookup_first_attempt_wins(daemon):
    c = Conn(daemon.port)
    head = c.ask("HELLO\r\n").split(" ")
    assert head[:3] == ["OK", "1", str(BLOCK)] and head[3] == daemon.dir
    assert c.ask("REGISTER app-1 0 3\r\n") == "OK"
    blk = int(c.ask("ALLOC app-1 0\r\n").split()[1])
    path = os.path.join(daemon.dir, "blk-%d" % blk)
    assert os.path.getsize(path) == BLOCK
    with open(path, "r+b") as f:  # what a map task's mapping does
        f.write(b"hello-partition-2")
    c.send("COMMIT app-1 0 4 100 1\r\n2 %d 0 17\r\n" % blk)
    assert c.until_end(c.line()) == ["COMMITTED 100 1", "2 %d 0 17" % blk, "END"]
    # A second attempt of map 4 on another connection loses: told attempt 100 won.
    d = Conn(daemon.port)
    assert d.ask("REGISTER app-1 0 3\r\n") == "OK"
    other = int(d.ask("ALLOC app-1 0\r\n").split()[1])
    d.send("COMMIT app-1 0 4 101 1\r\n0 %d 0 5\r\n" % other)
    assert d.until_end(d.line())[0] == "COMMITTED 100 1"
    # The retry of attempt 100 gets the same answer.
    c.send("COMMIT app-1 0 4 100 1\r\n2 %d 0 17\r\n" % blk)
    assert c.until_end(c.line()) == ["COMMITTED 100 1", "2 %d 0 17" % blk, "END"]
    r = Conn(daemon.port)
    got = r.until_end(r.ask("LOOKUP app-1 0 2\r\n"))
    assert got[0] == "SEGMENTS 1" and got[2] == "END", got
    # <map> <attempt> <block> <offset> <length> <file id>: the file id names the block's file.
    seg = got[1].split(" ")
    assert seg[:5] == ["4", "100", str(blk), "0", "17"] and int(seg[5]) > 0, got
    assert r.until_end(r.ask("LOOKUP app-1 0 0\r\n")) == ["SEGMENTS 0", "END"]
    with open(path, "rb") as f:
        assert f.read(17) == b"hello-partition-2"
    # Several blocks per RELEASE: one not pinned is named, the pinned one is released all the same.
    assert r.ask("RELEASE 424242 %d\r\n" % blk).startswith("CLIENT_ERROR unknown block 424242")
    assert r.ask("RELEASE %d\r\n" % blk).startswith("CLIENT_ERROR"), "released by the line before"
    m = daemon.metrics()
    assert "# HELP slipstream_shuffle_blocks_in_use " in m
    assert "slipstream_shuffle_blocks_in_use 1\n" in m  # the loser's block went back
    assert "slipstream_shuffle_commits_lost_race_total 1\n" in m
    assert "slipstream_shuffle_lookups_total 2\n" in m
    assert c.ask("UNREGISTER_APP app-1\r\n") == "OK"
    assert "slipstream_shuffle_blocks_in_use 0\n" in daemon.metrics()
    for x in (c, d, r):
        x.close()


def test_bad_input_is_a_client_error_and_the_daemon_carries_on(daemon):
    c = Conn(daemon.port)
    for bad in ["NOPE\r\n", "ALLOC\r\n", "REGISTER a 1 0\r\n", "REGISTER a\xe9 1 1\r\n", "LOOKUP a 1 1\r\n",
                "REGISTER %s 1 1\r\n" % ("x" * 65), "RELEASE 99\r\n", "ALLOC nope 7\r\n"]:
        assert c.ask(bad).startswith("CLIENT_ERROR "), bad
    assert c.ask("REGISTER a 1 2\r\n") == "OK"
    assert c.ask("REGISTER a 1 3\r\n").startswith("CLIENT_ERROR shuffle registered with 2 partitions")
    blk = int(c.ask("ALLOC a 1\r\n").split()[1])
    assert c.ask("COMMIT a 1 0 1 1\r\n5 %d 0 1\r\n" % blk).startswith("CLIENT_ERROR bad segment")
    assert c.ask("COMMIT a 1 0 1 1\r\n0 %d %d 2\r\n" % (blk, BLOCK - 1)).startswith("CLIENT_ERROR bad segment")
    assert c.ask("COMMIT a 1 0 1 1\r\n0 %d 0 1\r\n" % (blk + 1)).startswith("CLIENT_ERROR block")
    # A segment line that cannot be parsed: error, then the connection closes (unframeable).
    assert c.ask("COMMIT a 1 0 1 1\r\nnot a segment\r\n").startswith("CLIENT_ERROR")
    assert c.f.readline() == b""
    # An over-long line closes that connection only.
    d = Conn(daemon.port)
    d.send("A" * 5000 + "\r\n")
    assert d.line().startswith("CLIENT_ERROR")
    e = Conn(daemon.port)
    assert e.ask("HELLO\r\n").startswith("OK 1 ")
    # c's uncommitted block was freed when it closed.
    assert "slipstream_shuffle_blocks_in_use 0\n" in daemon.metrics()
    assert daemon.alive()


def test_memory_limit_is_a_server_error(daemon):
    c = Conn(daemon.port)
    assert c.ask("REGISTER a 0 1\r\n") == "OK"
    got = [c.ask("ALLOC a 0\r\n") for _ in range(17)]
    assert all(g.startswith("BLOCK ") for g in got[:16])
    assert got[16].startswith("SERVER_ERROR shuffle pool full: all 16 blocks of 65536 bytes are in use"), got[16]
    assert "slipstream_shuffle_alloc_refused_total 1\n" in daemon.metrics()
    c.close()  # the map task died: its blocks go back
    d = Conn(daemon.port)
    for _ in range(50):
        if "slipstream_shuffle_blocks_in_use 0\n" in daemon.metrics():
            break
        time.sleep(0.02)
    assert d.ask("REGISTER a 0 1\r\n") == "OK"
    assert d.ask("ALLOC a 0\r\n").startswith("BLOCK ")
