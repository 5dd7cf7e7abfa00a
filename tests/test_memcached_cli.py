"""memcached's command line and its dump/crawler commands, against the real binaries.

For: every memcached flag Slipstream accepts (issue 18): that a memcached command line starts
it, that each flag with a meaning does what memcached's does (checked on the wire, and against
memcached 1.6.18 where the two can be compared), that the rest are accepted with one notice;
and the replies of `lru_crawler`, `lru` and `stats cachedump` compared with memcached's.
Not for: the protocol commands in general (test_differential.py).
"""

import os
import re
import signal
import socket
import struct
import subprocess
import tempfile
import time

import pytest

import mcwire
from mcwire import HOST, MEMCACHED_BIN, SLIPSTREAM_BIN, talk

pytestmark = pytest.mark.skipif(not mcwire.slipstream_available(), reason="slipstream not built")
need_memcached = pytest.mark.skipif(not mcwire.memcached_available(), reason="memcached not installed")

KINDS = ["slipstream", "memcached"]


def start(kind, extra=(), **kw):
    if kind == "memcached" and not mcwire.memcached_available():
        pytest.skip("memcached not installed")
    return mcwire.Server(kind, extra=extra, **kw).start()


@pytest.fixture
def servers():
    started = []

    def make(kind, extra=(), **kw):
        s = start(kind, extra, **kw)
        started.append(s)
        return s

    yield make
    mcwire.kill_quietly(started)


def settings_of(srv):
    s = srv.connect()
    try:
        return mcwire.stat_map(s, b"settings")
    finally:
        s.close()


def stats_of(srv):
    s = srv.connect()
    try:
        return mcwire.stat_map(s)
    finally:
        s.close()


def log_of(srv):
    with open(srv.log_path, "rb") as f:
        return f.read().decode("utf-8", "replace")


# ------------------------------------------------------------------ start-up

# Command lines taken from memcached deployments; each must start the server.
COMMAND_LINES = [
    ["-o", "modern"],
    ["-o", "modern,no_lru_crawler,slab_reassign,slab_automove=1,hash_algorithm=murmur3"],
    ["-o", "lru_maintainer,lru_crawler,hot_lru_pct=20,warm_lru_pct=40,temporary_ttl=61"],
    ["-o", "idle_timeout=600", "-o", "read_buf_mem_limit=64"],
    ["-M", "-R", "40", "-B", "auto", "-b", "2048"],
    ["-f", "1.5", "-n", "96", "-L", "-k", "-r"],
    ["-D", ":", "-X", "-W"],
    ["--disable-evictions", "--max-reqs-per-event=10", "--protocol=ascii", "--listen-backlog=512"],
]


@pytest.mark.parametrize("extra", COMMAND_LINES, ids=[" ".join(c) for c in COMMAND_LINES])
def test_memcached_command_lines_start(servers, extra):
    srv = servers("slipstream", extra=extra)
    assert talk(srv, b"version\r\n").data.startswith(b"VERSION ")


def test_no_effect_flags_get_one_notice(servers):
    srv = servers("slipstream", extra=["-o", "modern,slab_reassign", "-f", "1.5", "-L"])
    log = log_of(srv)
    notes = [l for l in log.splitlines() if "no effect" in l]
    assert len(notes) == 1, log
    for name in ("-o modern", "-o slab_reassign", "-f", "-L"):
        assert name in notes[0], notes[0]


def test_bad_memcached_values_are_refused():
    for extra, why in [(["-R", "0"], "greater than 0"), (["-B", "udp"], "auto, binary, or ascii"),
                       (["-o", "nonsense"], "-o"), (["-o", "idle_timeout"], "idle_timeout"),
                       (["-f", "1.0"], "greater than 1")]:
        p = subprocess.run([SLIPSTREAM_BIN, "-p", "0", "-U", "0"] + extra, capture_output=True, timeout=10)
        assert p.returncode != 0 and why in p.stderr.decode(), (extra, p.stderr)


# stats settings: the keys these flags change, compared with memcached started the same way.
SETTINGS_FLAGS = ["-M", "-R", "7", "-B", "ascii", "-b", "77", "-D", "|", "-X", "-f", "1.5", "-n", "64",
                  "-o", "idle_timeout=30,read_buf_mem_limit=3,no_lru_crawler,no_slab_reassign,hashpower=20,"
                        "lru_crawler_tocrawl=5,slab_automove=2,no_maxconns_fast"]
SETTINGS_KEYS = ["evictions", "reqs_per_event", "binding_protocol", "tcp_backlog", "stat_key_prefix",
                 "detail_enabled", "dump_enabled", "growth_factor", "chunk_size", "idle_timeout",
                 "read_buf_mem_limit", "lru_crawler", "slab_reassign", "hashpower_init",
                 "lru_crawler_tocrawl", "slab_automove", "maxconns_fast"]


@need_memcached
def test_stats_settings_reflect_flags_like_memcached(servers):
    ref = settings_of(servers("memcached", extra=SETTINGS_FLAGS))
    cand = settings_of(servers("slipstream", extra=SETTINGS_FLAGS))
    for k in SETTINGS_KEYS:
        assert cand.get(k) == ref.get(k), (k, cand.get(k), ref.get(k))


# ------------------------------------------------------------------ -M

def fill_until_refused(srv, value_bytes=100 * 1024, count_max=200):
    s = srv.connect()
    try:
        v = b"v" * value_bytes
        for i in range(count_max):
            s.sendall(b"set k%d 0 0 %d\r\n%s\r\n" % (i, len(v), v))
            line = mcwire.read_until(s, b"\r\n", max_s=5)
            if line != b"STORED\r\n":
                return i, line
        return count_max, b""
    finally:
        s.close()


@pytest.mark.parametrize("kind", KINDS)
def test_disable_evictions_refuses_instead_of_evicting(servers, kind):
    srv = servers(kind, extra=["-M"], mem_mb=4)
    stored, line = fill_until_refused(srv)
    assert line == b"SERVER_ERROR out of memory storing object\r\n", (stored, line)
    st = stats_of(srv)
    assert st["evictions"] == "0"
    # The first item is still there (nothing was evicted for the refused ones).
    assert talk(srv, b"mg k0 s\r\n").data.startswith(b"HD s")
    # meta and binary set are refused the same way.
    r = talk(srv, b"ms big %d\r\n%s\r\n" % (100 * 1024, b"x" * 100 * 1024)).data
    assert r == b"SERVER_ERROR out of memory storing object\r\n", r
    key, val = b"bk", b"y" * 100 * 1024
    hdr = struct.pack(">BBHBBHIIQ", 0x80, 0x01, len(key), 8, 0, 0, 8 + len(key) + len(val), 0, 0)
    r = talk(srv, hdr + struct.pack(">II", 0, 0) + key + val).data
    assert len(r) >= 24 and struct.unpack(">H", r[6:8])[0] == 0x82, r[:40]


def test_evictions_by_default(servers):
    srv = servers("slipstream", mem_mb=4)
    stored, line = fill_until_refused(srv, count_max=80)
    assert line == b"" and stored == 80
    assert int(stats_of(srv)["evictions"]) > 0


# ------------------------------------------------------------------ -R

@pytest.mark.parametrize("kind", KINDS)
def test_reqs_per_event_yields(servers, kind):
    srv = servers(kind, extra=["-R", "2"])
    reqs = b"".join(b"set k%d 0 0 1\r\nx\r\n" % i for i in range(20)) + b"get k19\r\n"
    r = talk(srv, reqs)
    assert bytes(r.data) == b"STORED\r\n" * 20 + b"VALUE k19 0 1\r\nx\r\nEND\r\n"
    assert int(stats_of(srv)["conn_yields"]) >= 1


# ------------------------------------------------------------------ -B

BIN_VERSION = struct.pack(">BBHBBHIIQ", 0x80, 0x0b, 0, 0, 0, 0, 0, 0, 0)


@need_memcached
@pytest.mark.parametrize("proto,payload", [
    ("ascii", BIN_VERSION + b"\r\n"),
    ("ascii", b"version\r\n"),
    ("binary", BIN_VERSION),
    ("binary", b"version\r\nversion\r\nversion\r\n"),
    ("auto", BIN_VERSION),
])
def test_binding_protocol_like_memcached(servers, proto, payload):
    replies = []
    for kind in ("memcached", "slipstream"):
        srv = servers(kind, extra=["-B", proto])
        r = talk(srv, payload)
        data = re.sub(rb"1\.6\.18\S*", b"V", bytes(r.data))
        replies.append((data.replace(b"\x00\x00\x00\x01V", b"\x00\x00\x00\x01V"), r.closed))
    # Binary version replies differ only in the version text's length field.
    norm = [(re.sub(rb"^(\x81\x0b.{6})....", rb"\1LLLL", d, flags=re.S), c) for d, c in replies]
    assert norm[0] == norm[1], replies


# ------------------------------------------------------------------ -b

def listen_backlog(port):
    out = subprocess.run(["ss", "-ltnH", "sport = :%d" % port], capture_output=True, timeout=10).stdout.decode()
    rows = [l.split() for l in out.splitlines() if l.strip()]
    return {int(r[2]) for r in rows}


def test_listen_backlog(servers):
    srv = servers("slipstream", extra=["-b", "37"])
    assert listen_backlog(srv.port) == {37}
    assert settings_of(srv)["tcp_backlog"] == "37"


# ------------------------------------------------------------------ -d, -P, ephemeral ports

def wait_file(path, s=10.0):
    end = time.monotonic() + s
    while time.monotonic() < end:
        if os.path.exists(path):
            return True
        time.sleep(0.02)
    return False


def test_daemonize_and_pid_file():
    with tempfile.TemporaryDirectory() as d:
        pid_path = os.path.join(d, "mc.pid")
        port = mcwire.free_port()
        p = subprocess.run([SLIPSTREAM_BIN, "-p", str(port), "-U", "0", "-l", HOST, "-t", "1", "-d", "-P", pid_path],
                           capture_output=True, timeout=20)
        assert p.returncode == 0, p.stderr
        assert wait_file(pid_path)
        pid = int(open(pid_path).read().strip())
        try:
            assert pid != os.getpid()
            os.kill(pid, 0)
            s = socket.create_connection((HOST, port), timeout=2)
            s.sendall(b"version\r\n")
            assert mcwire.read_until(s, b"\r\n", max_s=5).startswith(b"VERSION")
            s.close()
        finally:
            os.kill(pid, 15)
        end = time.monotonic() + 10
        while os.path.exists(pid_path) and time.monotonic() < end:
            time.sleep(0.05)
        assert not os.path.exists(pid_path), "a daemon removes its pid file at exit"


def test_daemonize_reports_a_failed_start():
    blocker = socket.socket()
    blocker.bind((HOST, 0))
    blocker.listen(1)
    try:
        port = blocker.getsockname()[1]
        p = subprocess.run([SLIPSTREAM_BIN, "-p", str(port), "-U", "0", "-l", HOST, "-d"], capture_output=True, timeout=20)
        assert p.returncode != 0 and b"Address already in use" in p.stderr, p
    finally:
        blocker.close()


def run_ephemeral(kind, d):
    port_file = os.path.join(d, kind + ".ports")
    argv = ([MEMCACHED_BIN] + (["-u", "root"] if os.geteuid() == 0 else []) if kind == "memcached"
            else [SLIPSTREAM_BIN])
    env = dict(os.environ, MEMCACHED_PORT_FILENAME=port_file)
    proc = subprocess.Popen(argv + ["-p", "-1", "-U", "-1", "-l", HOST, "-t", "2"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    return proc, port_file


@pytest.mark.parametrize("kind", KINDS)
def test_ephemeral_ports_and_port_file(kind):
    if kind == "memcached" and not mcwire.memcached_available():
        pytest.skip("memcached not installed")
    with tempfile.TemporaryDirectory() as d:
        proc, port_file = run_ephemeral(kind, d)
        try:
            assert wait_file(port_file), "no port file"
            text = open(port_file).read()
            m = re.fullmatch(r"TCP INET: (\d+)\nUDP INET: (\d+)\n", text)
            assert m, text
            tcp, udp = int(m.group(1)), int(m.group(2))
            assert tcp > 0 and udp > 0
            s = socket.create_connection((HOST, tcp), timeout=2)
            s.sendall(b"version\r\n")
            assert mcwire.read_until(s, b"\r\n", max_s=5).startswith(b"VERSION")
            s.close()
            u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            u.settimeout(3)
            u.sendto(b"\x00\x01\x00\x00\x00\x01\x00\x00version\r\n", (HOST, udp))
            assert u.recv(2048)[8:].startswith(b"VERSION")
            u.close()
        finally:
            mcwire.kill_quietly([])
            proc.kill()
            proc.wait(timeout=5)


def test_listen_with_port(servers):
    port = mcwire.free_port()
    p = subprocess.Popen([SLIPSTREAM_BIN, "-l", "%s:%d" % (HOST, port), "-U", "0", "-t", "1"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        end = time.monotonic() + 10
        while time.monotonic() < end:
            try:
                socket.create_connection((HOST, port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        else:
            pytest.fail("not listening on -l ADDR:PORT")
    finally:
        p.kill()
        p.wait(timeout=5)


def wait_listening(port, s=10.0, host=HOST):
    end = time.monotonic() + s
    while time.monotonic() < end:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return True
        except OSError:
            time.sleep(0.05)
    return False


@pytest.mark.parametrize("listen", [["-l", "127.0.0.1,127.0.0.2"], ["-l", "127.0.0.1", "-l", "127.0.0.2"],
                                    ["-l", "127.0.0.1;127.0.0.2"]])
def test_listen_on_several_addresses(listen):
    port = mcwire.free_tcp_udp_port()
    p = subprocess.Popen([SLIPSTREAM_BIN, "-p", str(port), "-U", str(port), "-t", "2"] + listen,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        assert wait_listening(port, host="127.0.0.2") and wait_listening(port, host="127.0.0.1")
        # One cache behind both addresses.
        a = socket.create_connection(("127.0.0.1", port), timeout=2)
        a.sendall(b"set k 0 0 1\r\nx\r\n")
        assert mcwire.read_until(a, b"\r\n", max_s=5) == b"STORED\r\n"
        b = socket.create_connection(("127.0.0.2", port), timeout=2)
        b.sendall(b"get k\r\n")
        assert mcwire.read_until(b, b"END\r\n", max_s=5) == b"VALUE k 0 1\r\nx\r\nEND\r\n"
        assert mcwire.stat_map(b, b"settings")["inter"] == "127.0.0.1,127.0.0.2".replace(",", ";" if ";" in listen[1] else ",")
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        u.settimeout(3)
        u.sendto(b"\x00\x01\x00\x00\x00\x01\x00\x00get k\r\n", ("127.0.0.2", port))
        assert u.recv(2048)[8:] == b"VALUE k 0 1\r\nx\r\nEND\r\n"
        a.close(), b.close(), u.close()
    finally:
        p.kill()
        p.wait(timeout=5)


@pytest.mark.parametrize("kind", KINDS)
def test_port_file_lists_every_address(kind):
    if kind == "memcached" and not mcwire.memcached_available():
        pytest.skip("memcached not installed")
    with tempfile.TemporaryDirectory() as d:
        port_file = os.path.join(d, "ports")
        argv = ([MEMCACHED_BIN] + (["-u", "root"] if os.geteuid() == 0 else []) if kind == "memcached"
                else [SLIPSTREAM_BIN])
        env = dict(os.environ, MEMCACHED_PORT_FILENAME=port_file)
        proc = subprocess.Popen(argv + ["-p", "-1", "-U", "0", "-l", "127.0.0.1,127.0.0.2", "-t", "1"], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            assert wait_file(port_file)
            text = open(port_file).read()
            assert re.fullmatch(r"TCP INET: \d+\nTCP INET: \d+\n", text), text
        finally:
            proc.kill()
            proc.wait(timeout=5)


# ------------------------------------------------------------------ -o idle_timeout

def test_idle_timeout_closes_idle_connections(servers):
    srv = servers("slipstream", extra=["-o", "idle_timeout=1"])
    idle = srv.connect(timeout=6)
    busy = srv.connect(timeout=6)
    t0 = time.monotonic()
    closed_after = None
    while time.monotonic() - t0 < 5:
        busy.sendall(b"version\r\n")
        assert mcwire.read_until(busy, b"\r\n", max_s=3).startswith(b"VERSION")
        idle.settimeout(0.3)
        try:
            if idle.recv(16) == b"":
                closed_after = time.monotonic() - t0
                break
        except socket.timeout:
            pass
    assert closed_after is not None and closed_after >= 1.0, closed_after
    st = stats_of(srv)
    assert st["idle_kicks"] == "1"
    assert settings_of(srv)["idle_timeout"] == "1"
    busy.close()


def test_no_idle_kicks_stat_without_idle_timeout(servers):
    assert "idle_kicks" not in stats_of(servers("slipstream"))


# ------------------------------------------------------------------ -D

def test_prefix_delimiter_turns_on_detail(servers):
    srv = servers("slipstream", extra=["-D", "|"])
    r = talk(srv, b"set a|1 0 0 1\r\nx\r\nget a|1\r\nstats detail dump\r\n").data
    assert b"PREFIX a get 1 hit 1 set 1 del 0\r\nEND\r\n" in r, r


# ------------------------------------------------------------------ dump and crawler commands

def metadump_records(data):
    """(key, exp, fetch) per metadump line, exp -1 or 'abs' (absolute times differ by start)."""
    text = bytes(data)
    assert text.endswith(b"END\r\n"), text
    recs = []
    for line in text[:-5].split(b"\n"):
        if not line:
            continue
        m = re.fullmatch(rb"key=(\S+) exp=(-?\d+) la=(\d+) cas=(\d+) fetch=(yes|no) cls=(\d+) size=(\d+)", line)
        assert m, line
        recs.append((m.group(1), m.group(2) if m.group(2) == b"-1" else b"abs", m.group(5)))
    return sorted(recs)


SETUP = (b"set foo 5 0 3\r\nbar\r\nset a%20b/c 0 100 1\r\nx\r\nset gone 0 1 1\r\nz\r\n"
         b"set big 0 0 2000\r\n" + b"y" * 2000 + b"\r\nget foo\r\n")


@need_memcached
def test_metadump_like_memcached(servers):
    out = []
    for kind in KINDS:
        srv = servers(kind)
        talk(srv, SETUP)
        time.sleep(2.1)  # `gone` expires: dumps leave it out
        r = talk(srv, b"lru_crawler metadump all\r\n")
        h = talk(srv, b"lru_crawler metadump hash\r\n")
        out.append((metadump_records(r.data), metadump_records(h.data)))
        assert not r.closed
    assert out[0] == out[1], out
    assert (b"a%2520b%2Fc", b"abs", b"no") in out[1][0]


# Replies that follow from the arguments; compared byte for byte with memcached's.
ADMIN_SESSIONS = [
    b"lru_crawler metadump 0\r\n",
    b"lru_crawler metadump 64\r\n",
    b"lru_crawler metadump keys\r\n",
    b"lru_crawler metadump\r\n",
    b"lru_crawler metadump 2\r\n",
    b"lru_crawler crawl all\r\n",
    b"lru_crawler crawl 1,2\r\n",
    b"lru_crawler crawl 0\r\n",
    b"lru_crawler crawl x\r\n",
    b"version\r\nlru_crawler metadump all\r\n",
    b"lru_crawler sleep 2000000\r\nlru_crawler tocrawl 5\r\nlru_crawler enable\r\n",
    b"lru_crawler disable\r\n",
    b"lru mode flat\r\nlru mode segmented\r\nlru mode x\r\nlru\r\nlru x\r\n",
    b"lru tune 10 10 0.1 2\r\nlru tune 50 50 0.1 2\r\nlru tune 10 10 0 2\r\nlru tune a 10 0.1 2\r\n",
    b"lru temp_ttl 5 noreply\r\nlru temp_ttl x\r\nlru temp_ttl -1\r\n",
    b"stats cachedump 2 0\r\nstats cachedump 63 0\r\nstats cachedump 64 0\r\n",
    b"stats cachedump 1\r\nstats cachedump a 1\r\n",
]


@need_memcached
@pytest.mark.parametrize("session", ADMIN_SESSIONS, ids=[s.decode().strip().replace("\r\n", "; ") for s in ADMIN_SESSIONS])
def test_admin_replies_like_memcached(servers, session):
    replies = []
    for kind in KINDS:
        srv = servers(kind)
        r = talk(srv, session)
        replies.append((re.sub(rb"VERSION \S+", b"VERSION", bytes(r.data)), r.closed))
    assert replies[0] == replies[1], replies


@need_memcached
def test_cachedump_like_memcached(servers):
    out = []
    for kind in KINDS:
        srv = servers(kind)
        talk(srv, b"set foo 5 0 3\r\nbar\r\nset k2 0 100 1\r\nx\r\n")
        r = bytes(talk(srv, b"stats cachedump 1 0\r\nstats cachedump 1 1\r\n").data)
        out.append(r)
    for r in out:
        assert re.fullmatch(rb"(ITEM \S+ \[\d+ b; \d+ s\]\r\n){2}END\r\nITEM \S+ \[\d+ b; \d+ s\]\r\nEND\r\n", r), r
    norm = [sorted(re.findall(rb"ITEM (\S+) \[(\d+) b; (0|\d{6,}) s\]", r)) for r in out]
    norm = [[(k, b, b"0" if t == b"0" else b"abs") for k, b, t in n] for n in norm]
    assert norm[0] == norm[1], out


def crawl_busy_as_ok(data):
    """A crawl asked for right after start (or `lru_crawler enable`) races the crawler
    thread's start in memcached: it answers OK or BUSY from run to run (seen in both), so
    both count as the same reply."""
    return data.replace(b"BUSY currently processing crawler request\r\n", b"OK\r\n")


@need_memcached
@pytest.mark.parametrize("extra", [["-X"], ["-o", "no_lru_crawler"], ["-X", "-o", "no_lru_crawler"]])
def test_dump_and_crawler_switches_like_memcached(servers, extra):
    session = b"lru_crawler metadump all\r\nlru_crawler crawl all\r\nstats cachedump 1 0\r\n"
    replies = [crawl_busy_as_ok(bytes(talk(servers(kind, extra=extra), session).data)) for kind in KINDS]
    assert replies[0] == replies[1], replies
    # A crawler that was off starts on `lru_crawler enable`; `stats settings` follows.
    session = b"lru_crawler enable\r\nlru_crawler crawl 1\r\nlru_crawler enable\r\n"
    replies = []
    for kind in KINDS:
        srv = servers(kind, extra=extra)
        data = crawl_busy_as_ok(bytes(talk(srv, session).data))
        replies.append((data, settings_of(srv)["lru_crawler"]))
    assert replies[0] == replies[1], replies


# ------------------------------------------------------------------ memcached's own test suite's needs
# (memcached 1.6.18's t/*.t run against Slipstream as `memcached-debug`: README, "memcached's own tests")

# -o switches that decide which LRU rows `stats`, `stats items` and `stats settings` list.
LRU_SWITCHES = [[], ["-o", "no_lru_maintainer"], ["-o", "no_lru_crawler"], ["-o", "no_modern"],
                ["-o", "no_modern,lru_crawler"], ["-o", "no_lru_crawler,no_lru_maintainer"]]
LRU_SETTINGS = ["lru_crawler", "lru_maintainer_thread", "maxconns_fast", "slab_reassign", "slab_automove",
                "lru_segmented"]


@need_memcached
@pytest.mark.parametrize("extra", LRU_SWITCHES, ids=[" ".join(e) or "defaults" for e in LRU_SWITCHES])
def test_stats_rows_follow_the_lru_switches_like_memcached(servers, extra):
    got = {}
    for kind in KINDS:
        srv = servers(kind, extra=extra)
        s = srv.connect()
        try:
            s.sendall(b"set a 0 0 1\r\nx\r\n")
            assert mcwire.read_until(s, b"\r\n", max_s=2) == b"STORED\r\n"
            general = set(mcwire.stat_map(s))
            items = set(mcwire.stat_map(s, b"items"))
            settings = mcwire.stat_map(s, b"settings")
        finally:
            s.close()
        got[kind] = (general, items, {k: settings.get(k) for k in LRU_SETTINGS})
    (g1, i1, s1), (g2, i2, s2) = got["slipstream"], got["memcached"]
    assert g1 == g2, (sorted(g1 - g2), sorted(g2 - g1))
    assert i1 == i2, (sorted(i1 - i2), sorted(i2 - i1))
    assert s1 == s2, (s1, s2)


@pytest.mark.parametrize("kind", KINDS)
def test_debugtime_is_an_unknown_command_without_relaxed_privileges(servers, kind):
    srv = servers(kind)
    assert talk(srv, b"debugtime 10\r\ndebugtime p\r\n").data == b"ERROR\r\nERROR\r\n"


def test_debugtime_moves_the_clock_under_relaxed_privileges(servers):
    srv = servers("slipstream", extra=["-o", "relaxed_privileges"])
    s = srv.connect()
    try:
        def say(data):
            s.sendall(data)
            return mcwire.read_until(s, b"\r\n", max_s=2)
        assert say(b"set k 0 100 1\r\nx\r\n") == b"STORED\r\n"
        t0 = int(mcwire.stat_map(s)["time"])
        assert say(b"debugtime 50\r\n") == b"OK\r\n"
        assert say(b"get k\r\n").startswith(b"VALUE k 0 1")
        mcwire.read_until(s, b"END\r\n", max_s=2)
        assert int(mcwire.stat_map(s)["time"]) >= t0 + 50
        assert say(b"debugtime 51\r\n") == b"OK\r\n"
        assert say(b"get k\r\n") == b"END\r\n", "expired 101 s later"
        assert say(b"debugtime p\r\n") == b"OK\r\n"
        t1 = int(mcwire.stat_map(s)["time"])
        time.sleep(1.2)
        assert int(mcwire.stat_map(s)["time"]) == t1, "paused"
        assert say(b"debugtime r\r\n") == b"OK\r\n"
        assert say(b"debugtime soon\r\n") == b"ERROR\r\n"
    finally:
        s.close()


@need_memcached
def test_stats_conns_shows_a_connection_waiting_for_data_like_memcached(servers):
    states = {}
    for kind in KINDS:
        srv = servers(kind)
        waiting = srv.connect()
        waiting.sendall(b"set foo 0 0 6\r\n")
        idle = srv.connect()
        idle.sendall(b"version\r\n")
        mcwire.read_until(idle, b"\r\n", max_s=2)
        time.sleep(0.3)
        s = srv.connect()
        try:
            rows = mcwire.stat_map(s, b"conns")
        finally:
            s.close()
            waiting.close()
            idle.close()
        states[kind] = sorted(v for k, v in rows.items() if k.endswith(":state"))
    assert states["slipstream"] == states["memcached"], states
    assert "conn_nread" in states["slipstream"], states


@need_memcached
def test_stats_slabs_keeps_a_class_after_its_items_are_gone_like_memcached(servers):
    got = {}
    for kind in KINDS:
        srv = servers(kind)
        s = srv.connect()
        try:
            s.sendall(b"set a 0 0 1\r\nx\r\ndelete a\r\n")
            mcwire.read_until(s, b"DELETED\r\n", max_s=2)
            rows = mcwire.stat_map(s, b"slabs")
        finally:
            s.close()
        got[kind] = (rows.get("1:used_chunks"), rows.get("active_slabs"))
    assert got["slipstream"] == got["memcached"] == ("0", "1"), got


def test_help_names_every_memcached_flag_it_takes():
    out = subprocess.run([SLIPSTREAM_BIN, "-h"], capture_output=True, timeout=10).stdout.decode()
    for flag in ["-p", "-U", "-l", "-t", "-m", "-c", "-I", "-C", "-F", "-A", "-v", "-u", "-s", "-a", "-S", "-Y",
                 "-Z", "-M", "-R", "-B", "-b", "-D", "-X", "-W", "-d", "-P", "-V", "-o", "--unix-socket",
                 "--enable-sasl", "--enable-ssl"]:
        assert re.search(r"(^|[ ,])%s\b" % re.escape(flag), out, re.M), flag
    # memcached's test suite reads these names to learn what the binary supports; Slipstream
    # has neither extstore nor the proxy, nor privilege dropping by seccomp.
    for absent in ["ext_path", "proxy_config", "no_drop_privileges"]:
        assert absent not in out, absent
    v = subprocess.run([SLIPSTREAM_BIN, "-V"], capture_output=True, timeout=10).stdout.decode()
    assert v.startswith("slipstream 1.6.18"), v


def graceful_stop(srv, within_s=20.0):
    """SIGUSR1 (memcached's graceful stop) and wait, bounded, for the process to exit."""
    srv.proc.send_signal(signal.SIGUSR1)
    try:
        return srv.proc.wait(timeout=within_s)
    except subprocess.TimeoutExpired:
        srv.proc.kill()
        raise AssertionError("%s did not stop within %.0f s of SIGUSR1" % (srv.kind, within_s))


def gets_all(srv, keys):
    s = srv.connect()
    try:
        s.sendall(b"gets " + b" ".join(keys) + b"\r\n")
        return mcwire.read_until(s, b"END\r\n", max_s=10)
    finally:
        s.close()


@pytest.mark.parametrize("kind", KINDS)
def test_memory_file_keeps_the_cache_across_a_graceful_restart(servers, kind, tmp_path):
    """-e PATH: SIGUSR1 stops gracefully and the next start with the same -e has every live
    item back with its value, flags and CAS (what expired meanwhile is gone); the save is used
    once; an empty metadata file stops the start. The same scenario on memcached 1.6.18."""
    path = str(tmp_path / "memory")
    extra = ("-e", path)
    a = servers(kind, extra)
    s = a.connect()
    try:
        for i in range(50):
            value = b"v%d" % i * (i + 1)
            s.sendall(b"set k%d %d 0 %d\r\n%s\r\n" % (i, i, len(value), value))
            assert mcwire.read_until(s, b"\r\n", max_s=5) == b"STORED\r\n"
        s.sendall(b"set short 0 2 1\r\nx\r\nset long 0 100 1\r\ny\r\n")
        assert mcwire.read_until(s, b"STORED\r\nSTORED\r\n", max_s=5) == b"STORED\r\nSTORED\r\n"
    finally:
        s.close()
    keys = [b"k%d" % i for i in range(50)] + [b"long"]
    before = gets_all(a, keys)
    assert before.count(b"VALUE ") == 51
    assert graceful_stop(a) == 0
    time.sleep(2.5)  # past `short`'s expiry
    b = servers(kind, extra)
    assert gets_all(b, keys) == before
    assert gets_all(b, [b"short"]) == b"END\r\n"
    assert settings_of(b)["memory_file"] == path
    # The save was read once: a start after an ordinary stop is clean.
    b.proc.terminate()
    b.proc.wait(timeout=10)
    c = servers(kind, extra)
    assert gets_all(c, [b"k1"]) == b"END\r\n"
    c.proc.terminate()
    c.proc.wait(timeout=10)
    with open(path + ".meta", "wb"):
        pass
    bad = mcwire.Server(kind, extra=extra)
    with pytest.raises(RuntimeError):
        bad.start()
    mcwire.kill_quietly([bad])
