"""memcached's log stream (`watch`), the LRU crawler's `lru_crawler crawl` and a streamed
`lru_crawler metadump`, against the real binaries.

For: issue 18's `watch` (replies, event lines in memcached 1.6.18's format with ts/gid/cfd
masked, the watcher limit, a slow watcher's `skipped=N` and bounded buffer, `-W`), a crawl that
really frees expired items and counts them as memcached does, and a metadump that a client
which does not read cannot turn into unbounded server memory.
Not for: the other admin replies (test_memcached_cli.py).
"""

import re
import socket
import time

import pytest

import mcwire
from mcwire import talk

pytestmark = pytest.mark.skipif(not mcwire.slipstream_available(), reason="slipstream not built")
need_memcached = pytest.mark.skipif(not mcwire.memcached_available(), reason="memcached not installed")

KINDS = ["slipstream", "memcached"]


@pytest.fixture
def servers():
    started = []

    def make(kind, extra=(), **kw):
        if kind == "memcached" and not mcwire.memcached_available():
            pytest.skip("memcached not installed")
        s = mcwire.Server(kind, extra=extra, **kw).start()
        started.append(s)
        return s

    yield make
    mcwire.kill_quietly(started)


def stats_of(srv, which=b""):
    s = srv.connect()
    try:
        return mcwire.stat_map(s, which)
    finally:
        s.close()


def watcher(srv, cmd=b"watch fetchers mutations\r\n"):
    """A connection that sent `cmd` and got memcached's OK."""
    w = srv.connect()
    w.sendall(cmd)
    got = w.recv(4)
    while len(got) < 4 and got:
        got += w.recv(4 - len(got))
    assert got == b"OK\r\n", got
    return w


def watched_lines(w, count, max_s=5.0):
    """The next `count` or more whole log lines from watcher `w` (fewer if they do not come in
    time). A read can end inside the line after them: that part is left out, not returned as a
    cut line."""
    data = mcwire.read_until(w, max_s=max_s, stop=lambda b: b.count(b"\n") >= count)
    return data[: data.rfind(b"\n") + 1].decode().splitlines()


def masked(line):
    """A log line with what differs between runs masked: ts, gid, cfd, rport."""
    line = re.sub(r"^ts=\d+\.\d+ gid=\d+ ", "", line)
    return re.sub(r"\b(cfd|rport)=\d+", r"\1=N", line)


# ------------------------------------------------------------------ replies

# A refused `watch` leaves its reply waiting: a `watch` after it in the same read is refused
# as pipelined, as memcached does.
WATCH_SESSIONS = [
    b"watch bogus\r\nwatch\r\n",
    b"watch fetchers bogus\r\nwatch fetchers\r\n",
    b"watch noreply\r\n",
    b"version\r\nwatch\r\n",
    b"watch fetchers mutations extra\r\nwatch mutations\r\n",
]


@need_memcached
@pytest.mark.parametrize("session", WATCH_SESSIONS, ids=[s.decode().strip().replace("\r\n", "; ") for s in WATCH_SESSIONS])
def test_watch_refusals_like_memcached(servers, session):
    replies = []
    for kind in KINDS:
        r = talk(servers(kind), session)
        replies.append((re.sub(rb"VERSION \S+", b"VERSION", bytes(r.data)), r.closed))
    assert replies[0] == replies[1], replies


@need_memcached
def test_disable_watch_flag_like_memcached(servers):
    replies = [bytes(talk(servers(kind, extra=["-W"]), b"watch\r\nwatch fetchers\r\n").data) for kind in KINDS]
    assert replies[0] == replies[1] == b"CLIENT_ERROR watch commands not allowed\r\n" * 2, replies


@pytest.mark.parametrize("kind", KINDS)
def test_watch_every_class_memcached_knows(servers, kind):
    srv = servers(kind)
    for classes in [b"", b" fetchers", b" mutations", b" evictions", b" connevents", b" sysevents", b" rawcmds",
                    b" proxyreqs", b" proxyevents", b" proxyuser", b" fetchers mutations evictions connevents"]:
        w = watcher(srv, b"watch" + classes + b"\r\n")
        w.close()


@pytest.mark.parametrize("kind", KINDS)
def test_at_most_twenty_watchers(servers, kind):
    srv = servers(kind)
    ws = [watcher(srv) for _ in range(20)]
    try:
        assert talk(srv, b"watch\r\n").data == b"WATCHER_TOO_MANY log watcher limit reached\r\n"
    finally:
        for w in ws:
            w.close()


# ------------------------------------------------------------------ event lines

# Each request's lines are deterministic once ts, gid and cfd are masked.
EVENT_SESSION = [
    b"set a 0 0 1\r\nx\r\n",
    b"get a\r\n",
    b"get b\r\n",
    b"add a 0 0 1\r\ny\r\n",
    b"append a 0 0 1\r\nz\r\n",
    b"cas a 0 0 1 1\r\nq\r\n",
    b"gets a\r\n",
    b"incr a 1\r\n",
    b"touch a 10\r\n",
    b"delete a\r\n",
    b"touch a 10\r\n",
    b"replace nope 0 0 1\r\nx\r\n",
    b"set t 3 100 2\r\nhi\r\n",
    b"gat 10 t\r\n",
    b"get t nope t\r\n",
    b"mg t v\r\n",
    b"mg nope v\r\n",
    b"ms m 2 T100\r\nhi\r\n",
    b"set a%b/c 0 0 3\r\nabc\r\n",
]


@need_memcached
def test_fetchers_and_mutations_lines_like_memcached(servers):
    out = []
    for kind in KINDS:
        srv = servers(kind)
        w = watcher(srv)
        c = srv.connect()
        lines = []
        try:
            for req in EVENT_SESSION:
                c.sendall(req)
                mcwire.read_quiet(c, mcwire.Reply(), quiet_s=0.05, max_s=1.0)
            # Every request above logs one or two lines; read them all.
            lines = watched_lines(w, 31, max_s=5.0)
        finally:
            c.close()
            w.close()
        for line in lines:
            assert re.match(r"ts=\d+\.\d+ gid=\d+ type=", line), line
        gids = [int(re.search(r"gid=(\d+)", l).group(1)) for l in lines]
        assert gids == sorted(gids) and len(set(gids)) == len(gids), lines
        out.append([masked(l) for l in lines])
    assert out[0] == out[1], "\n".join("%-80s | %s" % p for p in zip(out[0], out[1]))
    assert "type=item_store key=a%25b%2Fc status=stored cmd=set ttl=0 clsid=1 cfd=N size=3" in out[0]


@need_memcached
def test_watch_without_classes_is_fetchers_only(servers):
    out = []
    for kind in KINDS:
        srv = servers(kind)
        w = watcher(srv, b"watch\r\n")
        talk(srv, b"set k 0 0 1\r\nv\r\nget k\r\n")
        out.append([masked(l) for l in watched_lines(w, 2, max_s=3.0)])
        w.close()
    assert out[0] == out[1] == [
        "type=item_get key=k status=not_found clsid=0 cfd=N size=0",
        "type=item_get key=k status=found clsid=1 cfd=N size=1",
    ], out


def conn_event_lines(srv, use):
    """Open a client connection next to a `watch connevents` watcher, let `use(conn)` have it
    (the client closes it afterwards), and return the watcher's lines about this client's
    port, masked. Both servers may also report the start-up probe's connection: skipped."""
    w = watcher(srv, b"watch connevents\r\n")
    c = srv.connect()
    port = c.getsockname()[1]
    try:
        use(c)
    finally:
        c.close()
    data = mcwire.read_until(w, max_s=3.0, stop=lambda b: b"rport=%d transport=tcp reason" % port in b)
    w.close()
    return [masked(l) for l in data.decode().splitlines() if "rport=%d " % port in l]


@need_memcached
def test_connevents_like_memcached(servers):
    def use(c):
        c.sendall(b"version\r\n")
        mcwire.read_until(c, b"\r\n", max_s=2.0)

    out = [conn_event_lines(servers(kind), use) for kind in KINDS]
    assert out[0] == out[1] == [
        "type=conn_new rip=127.0.0.1 rport=N transport=tcp cfd=N",
        "type=conn_close rip=127.0.0.1 rport=N transport=tcp reason=normal cfd=N",
    ], out


# How a client's connection ends → the close reason memcached logs: its default is `error`;
# only end of stream, `quit` (text or binary), idle timeouts and shutdown set another.
CLOSINGS = [
    (b"version\r\nquit\r\n", "normal"),
    (b"\x80\x07" + b"\x00" * 22, "normal"),  # binary QUIT
    (b"GET / HTTP/1.1\r\n", "error"),
    (b"\x80\x0a" + b"\x00" * 22 + b"\x81\x0a" + b"\x00" * 22, "error"),  # NOOP, then a bad magic
]


@need_memcached
@pytest.mark.parametrize("data,reason", CLOSINGS, ids=["quit", "binary quit", "http", "bad magic"])
def test_close_reasons_like_memcached(servers, data, reason):
    def use(c):
        c.sendall(data)
        mcwire.read_until(c, max_s=3.0)  # the server closes: read to its end of stream (bounded)

    out = [[l for l in conn_event_lines(servers(kind), use) if "conn_close" in l] for kind in KINDS]
    assert out[0] == out[1] == ["type=conn_close rip=127.0.0.1 rport=N transport=tcp reason=%s cfd=N" % reason], out


# memcached's LRU maintainer may reclaim an expired item before the get meets it: off on both.
NO_MAINTAINER = ["-o", "no_lru_maintainer"]


@need_memcached
def test_expired_and_flushed_lookups_like_memcached(servers):
    """A read that meets an expired item logs `status=expired`, one that meets an item
    `flush_all` invalidated `status=flushed` (memcached's do_item_get), the next one
    `not_found`; the lookups before a store, delete and touch log the same. (A store is left
    out after the flush: memcached's allocation for it may reclaim the flushed item at its LRU
    tail before the lookup, which then logs `not_found`.)"""
    out = []
    for kind in KINDS:
        srv = servers(kind, extra=NO_MAINTAINER)
        w = watcher(srv, b"watch fetchers\r\n")
        c = srv.connect()
        try:
            for req in [b"set e1 0 1 1\r\nx\r\n", b"set e2 0 1 1\r\nx\r\n", b"set e3 0 1 1\r\nx\r\n",
                        b"set e4 0 1 1\r\nx\r\n"]:
                c.sendall(req)
                mcwire.read_quiet(c, mcwire.Reply(), quiet_s=0.05, max_s=1.0)
            time.sleep(2.2)
            for req in [b"get e1\r\n", b"get e1\r\n", b"mg e2 v\r\n", b"delete e3\r\n", b"touch e4 10\r\n",
                        b"set f1 0 0 1\r\nx\r\n", b"set f2 0 0 1\r\nx\r\n", b"flush_all\r\n", b"gets f1\r\n",
                        b"get f1\r\n", b"delete f2\r\n"]:
                c.sendall(req)
                mcwire.read_quiet(c, mcwire.Reply(), quiet_s=0.05, max_s=1.0)
            lines = watched_lines(w, 14, max_s=5.0)
        finally:
            c.close()
            w.close()
        out.append([masked(l) for l in lines])
    assert out[0] == out[1], "\n".join("%-80s | %s" % p for p in zip(out[0], out[1]))
    assert out[0][4:] == [
        "type=item_get key=e1 status=expired clsid=0 cfd=N size=0",
        "type=item_get key=e1 status=not_found clsid=0 cfd=N size=0",
        "type=item_get key=e2 status=expired clsid=0 cfd=N size=0",
        "type=item_get key=e3 status=expired clsid=0 cfd=N size=0",
        "type=item_get key=e4 status=expired clsid=0 cfd=N size=0",
        "type=item_get key=f1 status=not_found clsid=0 cfd=N size=0",
        "type=item_get key=f2 status=not_found clsid=0 cfd=N size=0",
        "type=item_get key=f1 status=flushed clsid=0 cfd=N size=0",
        "type=item_get key=f1 status=not_found clsid=0 cfd=N size=0",
        "type=item_get key=f2 status=flushed clsid=0 cfd=N size=0",
    ], out[0]


@need_memcached
def test_watcher_is_a_connection_until_it_hangs_up_like_memcached(servers):
    """A watcher still counts in `curr_connections` and shows in `stats conns` as `conn_watch`;
    when it hangs up, connevents watchers get its `conn_close` (reason `error`, memcached's
    close from the logger thread) and the count drops."""
    out = []
    for kind in KINDS:
        srv = servers(kind)
        ev = watcher(srv, b"watch connevents\r\n")
        w = watcher(srv, b"watch fetchers\r\n")
        port = w.getsockname()[1]
        c = srv.connect()
        try:
            st = mcwire.stat_map(c)
            c.sendall(b"stats conns\r\n")
            conns = mcwire.read_until(c, b"END\r\n", max_s=5.0).decode()
            fds = re.findall(r"STAT (\d+):addr tcp:127\.0\.0\.1:%d\r\n" % port, conns)
            assert len(fds) == 1, conns
            state = re.search(r"STAT %s:state (\S+)" % fds[0], conns).group(1)
            w.close()
            data = mcwire.read_until(ev, max_s=3.0, stop=lambda b: b"rport=%d transport=tcp reason" % port in b)
            closes = [masked(l) for l in data.decode().splitlines() if "type=conn_close" in l and "rport=%d " % port in l]
            deadline = time.monotonic() + 3.0
            after = mcwire.stat_map(c)
            while after["curr_connections"] != str(int(st["curr_connections"]) - 1) and time.monotonic() < deadline:
                time.sleep(0.05)
                after = mcwire.stat_map(c)
        finally:
            c.close()
            ev.close()
        out.append((state, closes, int(st["curr_connections"]) - int(after["curr_connections"]), st["log_watchers"]))
    assert out[0] == out[1], out
    assert out[0] == ("conn_watch", ["type=conn_close rip=127.0.0.1 rport=N transport=tcp reason=error cfd=N"], 1,
                      "2"), out[0]


def held_for_a_watcher_that_does_not_read(srv, lines=20000):
    """Bytes a watcher that does not read is sent before the first line it missed: what the
    sockets hold plus the watcher's buffer."""
    w = srv.connect()
    try:
        w.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        w.sendall(b"watch fetchers\r\n")
        time.sleep(0.2)
        c = srv.connect()
        batch = b"get " + b"k" * 200 + b"\r\n"
        for _ in range(lines // 1000):
            c.sendall(batch * 1000)
            mcwire.read_until(c, b"END\r\n" * 1000, max_s=10.0)
        c.close()
        r = mcwire.Reply()
        mcwire.read_quiet(w, r, quiet_s=1.0, max_s=10.0)
    finally:
        w.close()
    data = bytes(r.data)
    cut = data.find(b"skipped=")
    return len(data) if cut < 0 else cut


@need_memcached
def test_watcher_logbuf_size_sets_each_watchers_buffer(servers):
    """`-o watcher_logbuf_size=N` is in KB (`stats settings` shows N * 1024, as memcached's),
    and is what a watcher that does not read holds on top of the sockets: with 1 KB it is
    sent about 255 KB less than with the default 256 KB before lines are skipped."""
    for kind in KINDS:
        srv = servers(kind, extra=["-o", "watcher_logbuf_size=1"])
        assert stats_of(srv, b"settings")["watcher_logbuf_size"] == "1024", kind
    assert stats_of(servers("memcached"), b"settings")["watcher_logbuf_size"] == "262144"
    default = held_for_a_watcher_that_does_not_read(servers("slipstream"))
    small_srv = servers("slipstream", extra=["-o", "watcher_logbuf_size=1"])
    small = held_for_a_watcher_that_does_not_read(small_srv)
    assert small < default - 128 * 1024, (default, small)
    assert int(stats_of(small_srv)["log_watcher_skipped"]) > 0


@pytest.mark.parametrize("kind", KINDS)
def test_eviction_lines(servers, kind):
    """memcached's `eviction` line for each live item pushed out (memcached's class id is
    its slab class; Slipstream's one class is 1)."""
    srv = servers(kind, mem_mb=8)
    w = watcher(srv, b"watch evictions\r\n")
    c = srv.connect(timeout=10)
    value = b"v" * 10000
    for base in range(0, 2000, 200):
        c.sendall(b"".join(b"set k%d 0 0 10000\r\n%s\r\n" % (i, value) for i in range(base, base + 200)))
        mcwire.read_until(c, b"STORED\r\n" * 200, max_s=10.0)
    c.close()
    lines = watched_lines(w, 10, max_s=5.0)
    w.close()
    assert len(lines) >= 10, lines
    for line in lines:
        assert re.fullmatch(r"ts=\d+\.\d+ gid=\d+ type=eviction key=k\d+ fetch=no ttl=-1 la=\d+ clsid=\d+ size=10000",
                            line), line
    assert int(stats_of(srv)["evictions"]) >= len(lines)


@pytest.mark.parametrize("kind", KINDS)
def test_slow_watcher_skips_lines_with_a_bounded_buffer(servers, kind):
    """A watcher that does not read gets at most its buffer (256 KB) plus what the sockets
    hold, then memcached's `skipped=N` line; the server's memory does not follow the load."""
    srv = servers(kind)
    w = srv.connect()
    w.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    w.sendall(b"watch fetchers\r\n")
    time.sleep(0.2)
    key = b"k" * 200
    c = srv.connect()
    batch = b"get " + key + b"\r\n"
    reqs = 40000  # ~290 bytes of log line each: ~11 MB of lines, far over the buffer
    for _ in range(reqs // 1000):
        c.sendall(batch * 1000)
        mcwire.read_until(c, b"END\r\n" * 1000, max_s=10.0)
    c.close()
    # Drain what the watcher was sent; then one more line, which now fits, comes after
    # memcached's report of what was dropped.
    r = mcwire.Reply()
    mcwire.read_quiet(w, r, quiet_s=1.0, max_s=10.0)
    got = bytes(r.data)
    talk(srv, b"get after\r\n")
    got += mcwire.read_until(w, max_s=3.0, stop=lambda b: b"key=after" in b)
    w.close()
    assert got.startswith(b"OK\r\n")
    lines = got[4:].decode().splitlines()
    skipped = [int(l.split("=")[1]) for l in lines if l.startswith("skipped=")]
    shown = [l for l in lines if "type=item_get" in l]
    assert "key=after" in lines[-1] and skipped, (lines[-1], skipped)
    if kind == "slipstream":
        assert sum(skipped) + len(shown) == reqs + 1, (len(shown), skipped)
    else:
        # memcached may also drop lines before the watcher's buffer (log_worker_dropped).
        assert sum(skipped) + len(shown) <= reqs + 1, (len(shown), skipped)
    # What the watcher got while it did not read: its buffer and what the sockets hold.
    with open("/proc/sys/net/ipv4/tcp_wmem") as f:
        send_buf_max = int(f.read().split()[2])
    assert len(r.data) < send_buf_max + 256 * 1024 + 512 * 1024, len(r.data)
    st = stats_of(srv)
    assert int(st["log_watcher_skipped"]) >= sum(skipped) > 0
    assert int(st["log_watcher_sent"]) >= len(shown)


def test_watcher_hangup_frees_its_place(servers):
    srv = servers("slipstream")
    ws = [watcher(srv) for _ in range(3)]
    assert stats_of(srv)["log_watchers"] == "3"
    for w in ws:
        w.close()
    deadline = time.monotonic() + 5
    while stats_of(srv)["log_watchers"] != "0" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert stats_of(srv)["log_watchers"] == "0"
    # Nobody watches: no line is built.
    talk(srv, b"get x\r\n")
    assert stats_of(srv)["log_worker_written"] == stats_of(srv)["log_worker_written"]
    before = int(stats_of(srv)["log_worker_written"])
    talk(srv, b"set x 0 0 1\r\n1\r\nget x\r\n")
    assert int(stats_of(srv)["log_worker_written"]) == before


# ------------------------------------------------------------------ lru_crawler crawl

def wait_crawler_idle(srv, max_s=10.0):
    deadline = time.monotonic() + max_s
    while time.monotonic() < deadline:
        if stats_of(srv)["lru_crawler_running"] == "0":
            return
        time.sleep(0.05)
    raise AssertionError("crawler still running after %.0fs" % max_s)


@pytest.mark.parametrize("kind", KINDS)
def test_crawl_frees_expired_items(servers, kind):
    srv = servers(kind, extra=["-o", "lru_crawler_sleep=0"])
    sets = b"".join(b"set e%d 0 1 10\r\n0123456789\r\n" % i for i in range(300))
    sets += b"".join(b"set k%d 0 0 10\r\n0123456789\r\n" % i for i in range(100))
    assert talk(srv, sets).data == b"STORED\r\n" * 400
    time.sleep(2.2)
    starts = int(stats_of(srv)["lru_crawler_starts"])
    assert talk(srv, b"lru_crawler crawl all\r\n").data == b"OK\r\n"
    wait_crawler_idle(srv)
    st = stats_of(srv)
    items = stats_of(srv, b"items")
    assert st["curr_items"] == "100", st
    assert int(st["lru_crawler_starts"]) > starts
    if kind == "slipstream":
        # The LRU maintainer (both servers') may free some at the LRU tails first; every
        # expired item is freed exactly once, by one or the other.
        assert int(st["crawler_reclaimed"]) + int(st["reclaimed"]) == 300, st
        assert st["expired_unfetched"] == "300", st
        assert int(st["crawler_items_checked"]) >= int(st["crawler_reclaimed"]) + 100
        assert items["items:1:crawler_reclaimed"] == st["crawler_reclaimed"]
    assert int(st["crawler_reclaimed"]) + int(st["reclaimed"]) >= 300 - 1


def test_crawl_busy_while_one_runs(servers):
    # A crawler that sleeps a second between steps is still running for the second request.
    # (memcached 1.6.18 answers the same BUSY line, but whether its crawl of one item is
    # still running by then is a race, so this is not compared.)
    srv = servers("slipstream", extra=["-o", "lru_crawler_sleep=1000000"])
    talk(srv, b"set a 0 0 1\r\nx\r\n")
    r = talk(srv, b"lru_crawler crawl 1\r\nlru_crawler crawl 1\r\n").data
    assert r == b"OK\r\nBUSY currently processing crawler request\r\n"
    assert stats_of(srv)["lru_crawler_running"] == "1"


# ------------------------------------------------------------------ metadump, streamed

def rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_metadump_to_a_client_that_does_not_read_stays_bounded(servers):
    """60k items with 240-byte keys make a ~20 MB dump; a client that asks for it and does not
    read must not make the server hold it (it used to build the whole reply in memory)."""
    srv = servers("slipstream", mem_mb=256)
    c = srv.connect(timeout=10)
    n = 60000
    for base in range(0, n, 2000):
        c.sendall(b"".join(b"set %s%06d 0 0 1 noreply\r\nv\r\n" % (b"k" * 234, i) for i in range(base, base + 2000)))
    c.sendall(b"version\r\n")
    mcwire.read_until(c, b"\r\n", max_s=20.0)
    c.close()
    before = rss_kb(srv.pid())
    d = srv.connect(timeout=10)
    d.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    d.sendall(b"lru_crawler metadump all\r\n")
    time.sleep(1.5)
    grown_kb = rss_kb(srv.pid()) - before
    # The server still serves others meanwhile.
    assert talk(srv, b"get %s000001\r\n" % (b"k" * 234)).data.startswith(b"VALUE ")
    data = mcwire.read_until(d, b"END\r\n", max_s=30.0)
    d.close()
    assert data.endswith(b"END\r\n")
    lines = data[:-5].split(b"\n")[:-1]
    assert len(lines) == n, len(lines)
    assert len(set(lines)) == n
    assert grown_kb < 8 * 1024, "RSS grew by %d KB while the dump waited" % grown_kb
