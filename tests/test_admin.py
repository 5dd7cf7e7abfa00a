"""Black-box tests of the admin HTTP endpoint (issue 13 item 3, issue 14 item 6): idle and slow
clients must not starve `/healthz`, idle connections are closed after the documented header
timeout, `/metrics` is valid Prometheus text with `# HELP` and `# TYPE` for every family, and
malformed or oversized requests get a 4xx without hurting the daemon.

For: the endpoint's robustness and exposition format, speaking raw bytes to the real binary.
Not for: the tenants API's semantics (tests/test_tenancy.py) or the cache protocols.

Every socket has a timeout and every loop a bound or a deadline.
"""

import re
import resource
import select
import socket
import time

import pytest

import mcwire
import tenantlib as tl

HOST = mcwire.HOST
# crates/server/src/admin: HEADER_READ_TIMEOUT_MS (a connection's request head must be complete
# this long after accept, else it is closed) and CONNECTIONS_MAX (connections held at once).
HEADER_READ_TIMEOUT_S = 2.0
CONNECTIONS_MAX = 1024
# What an orchestrator's liveness probe may wait.
HEALTHZ_BOUND_S = 1.0
# Slack for a loaded 2-core machine when checking when the server closes a connection.
CLOSE_SLACK_S = 1.5


@pytest.fixture
def daemon():
    """A single-tenant daemon with the admin endpoint and a token; killed at teardown."""
    if not mcwire.slipstream_available():
        pytest.skip("slipstream binary not built: %s" % mcwire.SLIPSTREAM_BIN)
    d = tl.TenantDaemon([], shaping=None, plain_port=True)
    try:
        yield d.start()
    finally:
        d.stop()


def healthz(port, max_s=3.0):
    """(status or None, seconds taken) of one `GET /healthz` on a fresh connection."""
    t0 = time.monotonic()
    status, _ = tl.http_raw(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", max_s=max_s)
    return status, time.monotonic() - t0


def open_idle(port, n):
    """n connections that send nothing."""
    socks = []
    try:
        for _ in range(n):
            socks.append(socket.create_connection((HOST, port), timeout=2.0))
    except BaseException:
        close_all(socks)
        raise
    return socks


def close_all(socks):
    for s in socks:
        try:
            s.close()
        except OSError:
            pass


def wait_closed(socks, max_s):
    """Seconds until each socket saw the server close it (EOF or reset; any reply bytes before
    that are read and ignored), None for those still open at the deadline."""
    t0 = time.monotonic()
    deadline = t0 + max_s
    closed_at = {}
    for s in socks:
        s.setblocking(False)
    open_ = {s.fileno(): s for s in socks}
    index = {s.fileno(): i for i, s in enumerate(socks)}
    while open_ and time.monotonic() < deadline:
        ready, _, _ = select.select(list(open_.values()), [], [], min(0.1, max(0.0, deadline - time.monotonic())))
        for s in ready:
            try:
                data = s.recv(65536)
            except BlockingIOError:
                continue
            except OSError:  # reset
                data = b""
            if not data:
                closed_at[index[s.fileno()]] = time.monotonic() - t0
                del open_[s.fileno()]
    return [closed_at.get(i) for i in range(len(socks))]


def readable(sock):
    """True when the server sent something or closed (a read would not block)."""
    r, _, _ = select.select([sock], [], [], 0)
    return bool(r)


def raise_nofile(want):
    """Raise this process's descriptor limit towards `want`; return the soft limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < want:
        target = want if hard == resource.RLIM_INFINITY else min(want, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            pass
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


# ====================================================================== starvation


@pytest.mark.parametrize("n_idle", [16, 100, 500])
def test_healthz_answers_despite_idle_connections(daemon, n_idle):
    t0 = time.monotonic()
    idle = open_idle(daemon.admin_port, n_idle)
    try:
        time.sleep(0.3)  # let the server accept them all
        if time.monotonic() - t0 < HEADER_READ_TIMEOUT_S - 0.5:
            # Under the cap the server holds every idle connection (it neither answers nor
            # closes one before the header timeout), so /healthz below competes with all of them.
            answered = sum(1 for s in idle if readable(s))
            assert answered == 0, "%d of %d idle connections answered or closed early" % (answered, n_idle)
        for _ in range(3):
            status, took = healthz(daemon.admin_port)
            assert status == 200, "/healthz with %d idle connections: %s" % (n_idle, status)
            assert took < HEALTHZ_BOUND_S, "/healthz took %.3fs with %d idle connections" % (took, n_idle)
    finally:
        close_all(idle)
    assert daemon.alive(), daemon.log_tail()


def test_healthz_answers_beyond_the_connection_cap(daemon):
    """More idle connections than the server holds: the oldest idle ones make room."""
    n = CONNECTIONS_MAX + 100
    if raise_nofile(n + 200) < n + 200:
        pytest.skip("descriptor limit too low for %d connections" % n)
    idle = open_idle(daemon.admin_port, n)
    try:
        time.sleep(0.3)
        for _ in range(3):
            status, took = healthz(daemon.admin_port)
            assert status == 200, "/healthz over the cap: %s" % status
            assert took < HEALTHZ_BOUND_S, "/healthz took %.3fs over the cap" % took
    finally:
        close_all(idle)
    assert daemon.alive(), daemon.log_tail()


def test_slowloris_senders_do_not_starve_healthz(daemon):
    """Clients that send their head one byte a second: /healthz stays fast and each of them is
    cut off once the header timeout passes."""
    n_slow = 50
    head = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 64
    slow = open_idle(daemon.admin_port, n_slow)
    try:
        for s in slow:
            s.setblocking(False)
        t0 = time.monotonic()
        sent = 0
        worst = 0.0
        # One byte a second to every slow client for longer than the header timeout, probing
        # /healthz in between.
        while time.monotonic() - t0 < HEADER_READ_TIMEOUT_S + 1.0 and sent < len(head):
            for s in slow:
                try:
                    s.send(head[sent:sent + 1])
                except OSError:
                    pass  # already closed by the server: that is the point
            sent += 1
            status, took = healthz(daemon.admin_port)
            assert status == 200, "/healthz during slowloris: %s" % status
            worst = max(worst, took)
            time.sleep(max(0.0, 1.0 - took))
        assert worst < HEALTHZ_BOUND_S, "/healthz took %.3fs during slowloris" % worst
        for s in slow:
            s.setblocking(True)
        left = HEADER_READ_TIMEOUT_S + CLOSE_SLACK_S - (time.monotonic() - t0)
        closed = wait_closed(slow, max(0.1, left))
        assert all(c is not None for c in closed), \
            "%d slow clients still open after %.1fs" % (closed.count(None), HEADER_READ_TIMEOUT_S + CLOSE_SLACK_S)
    finally:
        close_all(slow)
    assert daemon.alive(), daemon.log_tail()


def test_idle_connections_are_closed_after_header_timeout(daemon):
    n = 20
    idle = open_idle(daemon.admin_port, n)
    try:
        closed = wait_closed(idle, HEADER_READ_TIMEOUT_S + CLOSE_SLACK_S)
    finally:
        close_all(idle)
    assert all(c is not None for c in closed), "still open: %d of %d (%r)" % (closed.count(None), n, closed)
    assert min(closed) >= HEADER_READ_TIMEOUT_S - 0.3, "closed too early: %r" % closed
    status, _ = healthz(daemon.admin_port)
    assert status == 200


# ====================================================================== metrics


def check_exposition(text):
    """Parse with the reference parser and check every family has HELP and TYPE."""
    from prometheus_client.parser import text_string_to_metric_families

    families = list(text_string_to_metric_families(text))
    assert families, text[:500]
    for fam in families:
        assert fam.documentation, "no # HELP for %s" % fam.name
        assert fam.type != "unknown", "no # TYPE for %s" % fam.name
    # The raw text too: every sample's name is announced by a HELP and a TYPE line before it.
    helped, typed = set(), set()
    for line in text.splitlines():
        m = re.match(r"# (HELP|TYPE) (\S+)", line)
        if m:
            (helped if m.group(1) == "HELP" else typed).add(m.group(2))
            continue
        if not line or line.startswith("#"):
            continue
        name = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0)
        assert name in helped, "sample %s has no # HELP line before it" % name
        assert name in typed, "sample %s has no # TYPE line before it" % name
    return {f.name for f in families}


def test_metrics_have_help_and_type_single_tenant(daemon):
    with daemon.connect(daemon.server_port) as s:
        s.sendall(b"set k 0 0 1\r\nv\r\nget k\r\n")
        time.sleep(0.05)
    r = daemon.http("GET", "/metrics")
    assert r.status == 200, r
    assert r.headers.get("content-type", "").startswith("text/plain; version=0.0.4"), r.headers
    names = check_exposition(r.body.decode())
    assert "slipstream_cmd_get" in names and "slipstream_admin_requests" in names, sorted(names)


def test_metrics_have_help_and_type_with_tenants():
    if not mcwire.slipstream_available():
        pytest.skip("slipstream binary not built: %s" % mcwire.SLIPSTREAM_BIN)
    d = tl.TenantDaemon([{"name": "t0", "share": 0.5, "memory_mb": 8}], shaping=None)
    try:
        d.start()
        r = d.http("GET", "/metrics")
        assert r.status == 200, r
        names = check_exposition(r.body.decode())
        assert "slipstream_tenants" in names, sorted(names)
    finally:
        d.stop()


# ====================================================================== bad input


def test_malformed_and_oversized_requests(daemon):
    auth = b"Authorization: Bearer " + tl.ADMIN_TOKEN.encode() + b"\r\n"
    cases = [
        (b"HELLO\r\n\r\n", {400}),
        (b"GET /healthz\r\n\r\n", {400}),
        (b"GET /healthz HTTP/1.1 extra\r\n\r\n", {400}),
        (b"GET healthz HTTP/1.1\r\n\r\n", {400}),
        (b"GET http://x/healthz HTTP/1.1\r\n\r\n", {400}),
        (b"GET /healthz HTTP/1.1\r\nno colon here\r\n\r\n", {400}),
        (b"GET /healthz HTTP/1.1\r\nBad Name: x\r\n\r\n", {400}),
        (b"\xff\xfe\x00garbage\r\n\r\n", {400}),
        (b"GET /healthz HTTP/1.1\r\n" + b"X-Filler: " + b"a" * 16384 + b"\r\n\r\n", {431}),
        (b"PUT /tenants/t0 HTTP/1.1\r\n" + auth + b"Content-Length: 100000\r\n\r\n", {413}),
        (b"PUT /tenants/t0 HTTP/1.1\r\n" + auth + b"Content-Length: 1x\r\n\r\n{}", {400}),
        (b"PUT /tenants/t0 HTTP/1.1\r\n" + auth + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}", {400}),
        (b"PUT /tenants/t0 HTTP/1.1\r\n" + auth + b"\r\n", {411}),
        (b"PUT /tenants/t0 HTTP/1.1\r\n" + auth + b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", {411}),
    ]
    for raw, allowed in cases:
        status, resp = tl.http_raw(daemon.admin_port, raw, max_s=3.0)
        assert status in allowed, "%r -> %r (want %s)" % (raw[:80], resp[:200], allowed)
    # An oversized body actually sent: the 413 arrives whole (no reset destroys it).
    big = b"x" * 200000
    status, resp = tl.http_raw(
        daemon.admin_port,
        b"PUT /tenants/t0 HTTP/1.1\r\n" + auth + b"Content-Length: %d\r\n\r\n" % len(big) + big, max_s=3.0)
    assert status == 413, resp[:200]
    assert b'"error"' in resp, resp[:300]
    status, _ = healthz(daemon.admin_port)
    assert status == 200
    assert daemon.alive(), daemon.log_tail()
