"""Real-client tests: pymemcache doing normal work, and libmemcached's memccapable.

For: proving ordinary clients work unchanged. Each test runs against memcached
too (the same assertions must hold there), which validates the test itself.
Not for: byte-level comparisons (test_differential.py).
"""

import re
import shutil
import subprocess

import pytest
from pymemcache.client.base import Client

import mcwire

MEMCCAPABLE = shutil.which("memccapable")
MEMCCAPABLE_TIMEOUT_S = 60

# memccapable's sub-tests (libmemcached-tools 1.0.18/1.1); one pytest item each.
MEMCCAPABLE_TESTS = [
    "ascii version", "ascii quit", "ascii verbosity", "ascii set", "ascii set noreply",
    "ascii get", "ascii gets", "ascii mget", "ascii flush", "ascii flush noreply",
    "ascii add", "ascii add noreply", "ascii replace", "ascii replace noreply", "ascii cas",
    "ascii cas noreply", "ascii delete", "ascii delete noreply", "ascii incr",
    "ascii incr noreply", "ascii decr", "ascii decr noreply", "ascii append",
    "ascii append noreply", "ascii prepend", "ascii prepend noreply", "ascii stat",
    "binary noop", "binary quit", "binary quitq", "binary set", "binary setq", "binary flush",
    "binary flushq", "binary add", "binary addq", "binary replace", "binary replaceq",
    "binary delete", "binary deleteq", "binary get", "binary getq", "binary getk",
    "binary getkq", "binary incr", "binary incrq", "binary decr", "binary decrq",
    "binary version", "binary append", "binary appendq", "binary prepend", "binary prependq",
    "binary stat",
]


@pytest.fixture
def client(server):
    c = Client((mcwire.HOST, server.port), connect_timeout=2, timeout=2)
    try:
        yield c
    finally:
        c.close()


def test_set_get_delete(client):
    assert client.set("k1", b"v1") is True
    assert client.get("k1") == b"v1"
    assert client.get("missing") is None
    assert client.delete("k1") is True
    assert client.get("k1") is None
    assert client.delete("k1", noreply=False) is False


def test_get_many_and_set_many(client):
    failed = client.set_many({"a": b"1", "b": b"2", "c": b"3"}, noreply=False)
    assert failed == []
    assert client.get_many(["a", "b", "c", "zz"]) == {"a": b"1", "b": b"2", "c": b"3"}
    client.delete_many(["a", "b"])
    assert client.get_many(["a", "b", "c"]) == {"c": b"3"}


def test_incr_decr(client):
    assert client.incr("n", 1) is None
    client.set("n", b"10")
    assert client.incr("n", 5) == 15
    assert client.decr("n", 20) == 0
    assert client.incr("n", 2**64 - 1) == 2**64 - 1
    assert client.incr("n", 1) == 0
    client.set("t", b"text")
    with pytest.raises(Exception):
        client.incr("t", 1)


def test_add_replace_append_prepend(client):
    assert client.add("k", b"a", noreply=False) is True
    assert client.add("k", b"b", noreply=False) is False
    assert client.replace("k", b"c", noreply=False) is True
    assert client.replace("nope", b"c", noreply=False) is False
    assert client.append("k", b"z", noreply=False) is True
    assert client.prepend("k", b"y", noreply=False) is True
    assert client.get("k") == b"ycz"
    assert client.append("nope", b"z", noreply=False) is False


def test_gets_cas(client):
    client.set("k", b"one")
    value, token = client.gets("k")
    assert value == b"one" and token
    assert client.cas("k", b"two", token, noreply=False) is True
    assert client.cas("k", b"three", token, noreply=False) is False
    assert client.get("k") == b"two"
    assert client.cas("absent", b"x", b"1", noreply=False) is None
    v2, t2 = client.gets("k")
    assert v2 == b"two" and t2 != token
    many = client.gets_many(["k", "absent"])
    assert list(many) == ["k"] and many["k"][0] == b"two"


def test_touch_and_expiry_flags(client):
    client.set("k", b"v", expire=100)
    assert client.touch("k", 200, noreply=False) is True
    assert client.touch("absent", 200, noreply=False) is False
    client.set("f", b"v", flags=0)
    assert client.raw_command(b"get f", end_tokens=b"END\r\n") == b"VALUE f 0 1\r\nv\r\n"


def test_flush_all(client):
    client.set("k", b"v")
    assert client.flush_all(noreply=False) is True
    assert client.get("k") is None


def test_stats_version(client):
    st = client.stats()
    for name in (b"curr_items", b"total_items", b"cmd_get", b"get_hits", b"limit_maxbytes", b"pid"):
        assert name in st, "stats missing %r" % name
    client.set("k", b"v")
    client.get("k")
    st2 = client.stats()
    assert st2[b"curr_items"] == 1
    assert st2[b"get_hits"] >= 1
    v = client.version()
    assert re.match(rb"^\d+\.\d+", v), v
    settings = client.stats("settings")
    assert settings[b"maxconns"] == 1024


def test_large_value_and_binary(client):
    big = bytes(range(256)) * 2000  # 512000 bytes incl. \r\n and \0
    assert client.set("big", big, noreply=False) is True
    assert client.get("big") == big


def test_many_keys(client):
    data = {"key:%d" % i: ("val:%d" % i).encode() * 3 for i in range(500)}
    assert client.set_many(data, noreply=False) == []
    got = client.get_many(list(data))
    assert got == data


# ------------------------------------------------------------------ memccapable

_capable_cache = {}


def run_memccapable(port):
    try:
        p = subprocess.run([MEMCCAPABLE, "-h", mcwire.HOST, "-p", str(port), "-t", "5"],
                           stdin=subprocess.DEVNULL, capture_output=True,
                           timeout=MEMCCAPABLE_TIMEOUT_S)
        out = p.stdout.decode("utf-8", "replace") + p.stderr.decode("utf-8", "replace")
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode("utf-8", "replace") + "\n<memccapable timed out>"
    results = {}
    for line in out.splitlines():
        m = re.match(r"^(ascii|binary) (.+?)\s+\[(\w+)\]\s*$", line)
        if m:
            results["%s %s" % (m.group(1), m.group(2))] = m.group(3)
    return results, out


@pytest.fixture(scope="module")
def capable_results():
    """memccapable run once per server kind (it FLUSHes the server it talks to)."""
    servers = []
    try:
        yield _capable_cache, servers
    finally:
        mcwire.kill_quietly(servers)


@pytest.mark.skipif(MEMCCAPABLE is None, reason="memccapable (libmemcached-tools) not installed")
@pytest.mark.parametrize("subtest", MEMCCAPABLE_TESTS)
def test_memccapable(subtest, server_kind, capable_results):
    cache, servers = capable_results
    if server_kind not in cache:
        srv = mcwire.Server(server_kind)
        servers.append(srv)
        srv.start()
        cache[server_kind] = run_memccapable(srv.port)
    results, out = cache[server_kind]
    status = results.get(subtest)
    if status is None:
        pytest.fail("memccapable did not report %r on %s (crashed or timed out?)\n%s"
                    % (subtest, server_kind, out[-3000:]), pytrace=False)
    if status not in ("pass",):
        pytest.fail("memccapable %r on %s: [%s]\n%s" % (subtest, server_kind, status, out[-3000:]),
                    pytrace=False)
