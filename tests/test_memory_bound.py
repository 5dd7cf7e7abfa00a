"""Memory bound under misbehaving clients (issue 13, item 2) and the get-line segmentation rule
(issue 13, item 4).

For: the README's promise (section "How it serves (and the limits it keeps)"):
    peak RSS <= 1.25 x -m  +  conn_buf budget  +  BASE_MB  +  CONN_BASE_KB per open connection
checked on the real binary's VmHWM (/proc/PID/status) under the three loads of tests/memload.py
at -m 64 -t 4; that large values go out by reference (60 clients reading 1 MB gets and a
32 x 1 MB multi-get all served with the default budget; 60 non-reading clients asking for the
same 32 x 1 MB keep the daemon near -m); and that a long get line gets the same answer whether it arrives in one write or
in two writes 100 ms apart (memcached buffers get lines whatever their length).
Not for: byte-exact replies in normal operation (test_differential.py) or the limits memcached
shares (test_limits.py).

Each load runs in well under a minute; the mixed-size load prints its seed.
"""

import os
import socket
import time

import pytest

import mcwire
import memload

MEM_MB = 64
THREADS = 4
# The documented bound (README "How it serves"); keep these equal to the README's figures.
RSS_FACTOR = 1.25
CONN_BUF_MB = 16  # bufbudget::CONN_BUF_BYTES_MAX_DEFAULT
BASE_MB = 8  # binary, -t 4 thread stacks, hash index, allocator metadata
CONN_BASE_KB = 40  # 16 KiB read + 16 KiB write buffer, connection state, slack


def bound_mb(conns):
    return RSS_FACTOR * MEM_MB + CONN_BUF_MB + BASE_MB + CONN_BASE_KB * conns / 1024.0


@pytest.fixture
def slipstream(server_factory):
    if not mcwire.slipstream_available():
        pytest.skip("slipstream binary not built: %s" % mcwire.SLIPSTREAM_BIN)
    return server_factory("slipstream", threads=THREADS, mem_mb=MEM_MB)


def check(srv, load, conns):
    peak = memload.peak_rss_mb(srv.pid())
    limit = bound_mb(conns)
    print("%s: peak RSS %.1f MB, bound %.1f MB (-m %d, %d connections)" % (load, peak, limit, MEM_MB, conns))
    assert srv.alive(), srv.log_tail()
    assert peak <= limit, "%s: peak RSS %.1f MB over the documented bound %.1f MB" % (load, peak, limit)


def still_serves(srv):
    with srv.connect() as s:
        s.sendall(b"set after 0 0 2\r\nok\r\nget after\r\n")
        r = mcwire.Reply()
        mcwire.read_quiet(s, r, quiet_s=0.2, max_s=5)
        assert bytes(r.data) == b"STORED\r\nVALUE after 0 2\r\nok\r\nEND\r\n", r


def test_nonreading_multiget_clients(slipstream):
    conns = 60
    socks, first = memload.nonreading_gets(slipstream, conns=conns)
    try:
        # Served while the budget lasts, then memcached's line for a reply it cannot allocate.
        assert first.startswith(b"VALUE big:0 ") or first.startswith(b"SERVER_ERROR out of memory writing get response\r\n"), first
        check(slipstream, "non-reading multi-get clients", conns + 2)
        still_serves(slipstream)
    finally:
        memload.close_all(socks)


def test_half_sent_sets(slipstream):
    conns = 500
    socks = memload.half_sent_sets(slipstream, conns=conns)
    try:
        check(slipstream, "half-sent 1 MB sets", conns + 1)
        still_serves(slipstream)
        # A refused set was answered as memcached answers a set it cannot allocate for.
        socks[-1].settimeout(2)
        assert socks[-1].recv(100) == b"SERVER_ERROR out of memory storing object\r\n"
    finally:
        memload.close_all(socks)


def test_mixed_value_sizes(slipstream):
    seed = int(os.environ.get("MEM_SEED", "0")) or None
    seed, written, errors = memload.mixed_sets(slipstream, total_bytes=2 * 1024 * memload.MB, conns=16, seed=seed)
    print("mixed sizes: seed %d, %d MB written" % (seed, written >> 20))
    assert written >= 1024 * memload.MB, "only %d MB written in time" % (written >> 20)
    for line in errors.split(b"\r\n"):
        assert line == b"" or line.startswith(b"SERVER_ERROR out of memory"), line[:200]
    check(slipstream, "mixed value sizes (seed %d)" % seed, 17)
    still_serves(slipstream)


# ------------------------------------------------------------------ large values by reference

LARGE_KEYS = 32


def large_value(j):
    return b"%07d|" % j * (memload.VALUE_1MB_BYTES // 8)


def fill_large(srv):
    with srv.connect(timeout=10) as s:
        for j in range(LARGE_KEYS):
            v = large_value(j)
            s.sendall(b"set big:%d 0 0 %d noreply\r\n" % (j, len(v)) + v + b"\r\n")
        s.sendall(b"mn\r\n")
        assert memload._read_until(s, b"MN\r\n").endswith(b"MN\r\n")


def large_reply(keys):
    return b"".join(b"VALUE big:%d 0 %d\r\n" % (j, memload.VALUE_1MB_BYTES) + large_value(j) + b"\r\n" for j in keys) + b"END\r\n"


def read_reply(sock, want_bytes, max_s=20.0):
    """Read until `want_bytes` arrived, the server closed, or an error line is complete."""
    error_line = lambda b: b.startswith(b"SERVER_ERROR") and b.endswith(b"\r\n")
    return mcwire.read_until(sock, None, max_s=max_s, bytes_max=want_bytes, stop=error_line)


def test_concurrent_large_gets_that_read_are_all_served(slipstream):
    """60 clients each ask for a 1 MB value, and one for 32 of them in one multi-get, all
    before anyone reads (small receive buffers keep the replies in the server); then they read.
    memcached serves every one (item memory goes out by reference); so must we, with the
    default connection-buffer budget: values this large are not copied or charged to it."""
    fill_large(slipstream)
    multi = memload._small_rcvbuf_connect(slipstream)
    multi.sendall(b"get " + b" ".join(b"big:%d" % j for j in range(LARGE_KEYS)) + b"\r\n")
    socks = []
    try:
        for i in range(60):
            s = memload._small_rcvbuf_connect(slipstream)
            s.sendall(b"get big:%d\r\n" % (i % LARGE_KEYS))
            socks.append(s)
        time.sleep(0.5)
        for i, s in enumerate(socks):
            want = large_reply([i % LARGE_KEYS])
            got = read_reply(s, len(want))
            assert got == want, "client %d: %r... (%d bytes)" % (i, got[:80], len(got))
        want = large_reply(range(LARGE_KEYS))
        got = read_reply(multi, len(want), max_s=40)
        assert got == want, "multi-get: %r... (%d bytes)" % (got[:80], len(got))
        check(slipstream, "concurrent large gets", 62)
    finally:
        memload.close_all(socks + [multi])


def test_nonreading_clients_share_large_values(slipstream):
    """60 clients that never read ask for the same 32 x 1 MB: every reply holds the stored
    values by reference, so the daemon stays near -m instead of 60 x 32 MB of copies, and
    every client is served rather than refused."""
    conns = 60
    socks, first = memload.nonreading_gets(slipstream, conns=conns, lines=1)
    try:
        assert first.startswith(b"VALUE big:0 "), first
        peak = memload.peak_rss_mb(slipstream.pid())
        # Not even the connection-buffer budget's share: the values are the store's memory.
        limit = RSS_FACTOR * MEM_MB + BASE_MB + CONN_BASE_KB * (conns + 2) / 1024.0
        print("60 non-reading clients x 32 x 1 MB: peak RSS %.1f MB, bound %.1f MB" % (peak, limit))
        assert peak <= limit, "peak RSS %.1f MB over %.1f MB" % (peak, limit)
        s = socks[0]
        s.settimeout(5)
        value = b"v" * memload.VALUE_1MB_BYTES
        want = b"".join(b"VALUE big:%d 0 %d\r\n" % (j, len(value)) + value + b"\r\n" for j in range(32)) + b"END\r\n"
        got = read_reply(s, len(want), max_s=40)
        assert got == want, "%r... (%d bytes)" % (got[:80], len(got))
        still_serves(slipstream)
    finally:
        memload.close_all(socks)


# ------------------------------------------------------------------ segmentation

def long_get_line(nkeys):
    return b"get " + b" ".join(b"seg%07d" % j for j in range(nkeys)) + b"\r\n"


def send_get_line(srv, line, split_at=None, pause_s=0.1):
    with srv.connect(timeout=5) as s:
        r = mcwire.Reply()
        if split_at is None:
            mcwire.send_all(s, line, r)
        else:
            mcwire.send_all(s, line[:split_at], r)
            time.sleep(pause_s)
            mcwire.send_all(s, line[split_at:], r)
        # memcached takes a moment over 100 000 keys: wait for a full second of quiet.
        mcwire.read_quiet(s, r, quiet_s=1.0, max_s=10)
        return bytes(r.data), r.closed


@pytest.mark.parametrize("kind", ["memcached", "slipstream"])
def test_long_get_line_answer_does_not_depend_on_segmentation(kind, server_factory):
    srv = server_factory(kind, threads=2)
    with srv.connect() as s:
        s.sendall(b"set seg0000007 0 0 3\r\nabc\r\n")
        assert s.recv(100) == b"STORED\r\n"
    line = long_get_line(100 * 1000)  # 1.1 MB
    assert len(line) > 1100 * 1000
    want = b"VALUE seg0000007 0 3\r\nabc\r\nEND\r\n"
    one = send_get_line(srv, line)
    two = send_get_line(srv, line, split_at=len(line) - 1000)
    assert one == (want, False), one
    assert two == one, "one write %r, two writes %r" % (one, two)
