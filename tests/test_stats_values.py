"""`stats` values that memcached 1.6.18 counts, compared with memcached on the wire.

For: the values (not only the names) of `get_expired`, `reclaimed`, `expired_unfetched`,
`curr_items`, `total_items` around already-expired stores; `total_malloced` under replacement;
`stats conns` listing the UDP sockets as memcached does.
Not for: the stats names and the deterministic counters of ordinary sessions
(test_differential.py compares those).

memcached's LRU maintainer thread reclaims expired items in the background at times of its
own choosing (Slipstream's too, `crates/server/src/maintainer.rs`), so the differential sessions
here run both with `-o no_lru_maintainer`: then they reclaim only when an allocation pulls its
LRU tail (memcached) or a store pulls its shard's (Slipstream).
Each scenario leaves the cache empty, so the LRU tail is the same item on both servers
(Slipstream's LRUs are per shard, memcached's per slab class).
"""

import re
import socket
import struct
import time

import pytest

import mcwire

pytestmark = [
    pytest.mark.skipif(not mcwire.slipstream_available(), reason="slipstream not built"),
    pytest.mark.skipif(not mcwire.memcached_available(), reason="memcached not installed"),
]

NO_MAINTAINER = ("-o", "no_lru_maintainer")


def L(*lines):
    return b"".join(x + b"\r\n" for x in lines)


@pytest.fixture
def pair():
    started = []

    def make(extra=(), **kw):
        m = mcwire.Server("memcached", extra=extra, **kw).start()
        started.append(m)
        s = mcwire.Server("slipstream", extra=extra, **kw).start()
        started.append(s)
        return m, s

    yield make
    mcwire.kill_quietly(started)


def exchange(sock, data, quiet_s=0.15):
    r = mcwire.Reply()
    mcwire.send_all(sock, data, r)
    mcwire.read_quiet(sock, r, quiet_s=quiet_s)
    return bytes(r.data)


COUNTED = ("get_expired", "get_flushed", "get_misses", "get_hits", "cmd_get", "curr_items", "total_items",
           "reclaimed", "expired_unfetched", "touch_misses", "cmd_touch", "delete_misses")

# (name, request bytes): run in order on one connection; `stats` after each, compared.
EXPIRED_STEPS = [
    # A negative exptime stores an item that is already expired: linked and counted until the
    # next access meets it (get_expired), not silently dropped.
    ("set_negative", L(b"set a 0 -1 1", b"x")),
    ("get_it", L(b"get a", b"get a")),
    ("replace_live_with_expired", L(b"set b 0 0 1", b"x", b"set b 0 -1 1", b"y", b"get b", b"gets b")),
    ("meta_T-1", L(b"ms c 1 T-1", b"x", b"mg c v", b"mg c v")),
    ("touch_and_arith_meet_it", L(b"set f 0 -1 1", b"5", b"touch f 10", b"incr f 1", b"get f")),
    # A store pulls the LRU tail first: the expired item there is reclaimed, not met.
    ("store_reclaims_tail", L(b"set d 0 -1 1", b"x", b"set d 0 0 1", b"y", b"get d", b"delete d")),
    ("add_reclaims_tail", L(b"set e 0 -1 1", b"x", b"add e 0 0 1", b"y", b"delete e")),
    ("past_absolute", L(b"set g 0 1000000000 1", b"x", b"get g")),
    ("noreply", L(b"set h 0 -1 1 noreply", b"x", b"mg h v")),
]


def test_already_expired_stores_count_like_memcached(pair):
    ref, cand = pair(extra=NO_MAINTAINER)
    socks = [ref.connect(), cand.connect()]
    try:
        for name, data in EXPIRED_STEPS:
            replies = [exchange(s, data) for s in socks]
            assert replies[0] == replies[1], "%s: replies differ\nmemcached:  %r\nslipstream: %r" % (
                name, replies[0], replies[1])
            stats = [mcwire.stat_map(s) for s in socks]
            want = {k: stats[0][k] for k in COUNTED}
            got = {k: stats[1][k] for k in COUNTED}
            assert got == want, "%s: stats differ (memcached first)\n%r\n%r" % (name, want, got)
    finally:
        for s in socks:
            s.close()
    # The values themselves, so the comparison cannot pass on two wrong servers.
    assert (want["get_expired"], want["reclaimed"]) == ("6", "2"), want


def malloced(sock):
    return int(mcwire.stat_map(sock, b"slabs")["total_malloced"])


def test_total_malloced_flat_under_replacement(pair):
    ref, cand = pair()
    value = b"v" * 20000
    for srv in (ref, cand):
        s = srv.connect()
        try:
            exchange(s, b"set a 0 0 %d\r\n%s\r\n" % (len(value), value))
            first = malloced(s)
            st = mcwire.stat_map(s)
            assert first >= int(st["bytes"]) > 0, (srv, first, st["bytes"])
            for i in range(30):
                # A get in the same batch holds the old value while the set replaces it.
                exchange(s, b"get a\r\nset a 0 0 %d\r\n%s\r\nms a %d\r\n%s\r\n" % (
                    len(value), value, len(value), value), quiet_s=0.05)
                assert malloced(s) == first, (srv, i)
            exchange(s, b"delete a\r\n")
            # The item's memory is given back, the slabs that held it are kept (memcached
            # keeps its pages): never reported as nothing while memory is still held.
            assert 0 < malloced(s) <= first, srv
        finally:
            s.close()


def conns_rows(sock):
    sock.sendall(b"stats conns\r\n")
    data = mcwire.read_until(sock, b"END\r\n", max_s=5.0)
    rows = []
    for line in data.split(b"\r\n"):
        m = re.match(rb"^STAT (\d+):(\S+) (.*)$", line)
        if m:
            rows.append((int(m.group(1)), m.group(2).decode(), m.group(3).decode()))
    return rows


def conns_shape(rows, port):
    """Groups in fd order with the fd numbers, client ports and times abstracted."""
    groups = []
    for fd, field, value in rows:
        if not groups or groups[-1][0] != fd:
            groups.append((fd, []))
        value = value.replace(":%d" % port, ":<port>")
        value = re.sub(r"^(tcp|udp):127\.0\.0\.1:\d+$", r"\1:127.0.0.1:<client>", value)
        if field == "secs_since_last_cmd":
            value = "<secs>"
        groups[-1][1].append((field, value))
    return [tuple(g[1]) for g in groups]


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_stats_conns_lists_udp_sockets_like_memcached(pair, threads):
    ref, cand = pair(udp=True, threads=threads)
    shapes = []
    for srv in (ref, cand):
        s = srv.connect()
        try:
            shapes.append(conns_shape(conns_rows(s), srv.port))
        finally:
            s.close()
    assert shapes[0] == shapes[1], "memcached:\n%s\nslipstream:\n%s" % (shapes[0], shapes[1])
    udp = [g for g in shapes[0] if ("UDP", "UDP") in g]
    assert len(udp) == threads, shapes[0]


def test_stats_conns_udp_socket_rows(pair):
    """The rows of an idle UDP socket, exactly: `UDP UDP`, the bound address, conn_read."""
    _, cand = pair(udp=True, threads=1)
    s = cand.connect()
    try:
        rows = conns_rows(s)
    finally:
        s.close()
    udp_fds = {fd for fd, field, _ in rows if field == "UDP"}
    assert len(udp_fds) == 1, rows
    fd = udp_fds.pop()
    got = [(f, v) for d, f, v in rows if d == fd]
    assert got[:3] == [("UDP", "UDP"), ("addr", "udp:127.0.0.1:%d" % cand.port), ("state", "conn_read")], got
    assert got[3][0] == "secs_since_last_cmd" and len(got) == 4, got


def udp_ask(port, req_id, payload, datagrams_max=50):
    """One request over UDP (memcached's frame); the reply payloads joined."""
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.settimeout(2.0)
    try:
        u.sendto(struct.pack(">HHHH", req_id, 0, 1, 0) + payload, (mcwire.HOST, port))
        parts = {}
        total = None
        while total is None or len(parts) < total:
            data, _ = u.recvfrom(65536)
            rid, seq, total, _ = struct.unpack(">HHHH", data[:8])
            if rid == req_id:
                parts[seq] = data[8:]
            if len(parts) >= datagrams_max:
                break
        return b"".join(parts[k] for k in sorted(parts)), u.getsockname()[1]
    finally:
        u.close()


def udp_shape(data, port, client_port):
    text = data.decode().replace(":%d" % client_port, ":<udpclient>")
    rows = []
    for line in text.split("\r\n"):
        m = re.match(r"^STAT (\d+):(\S+) (.*)$", line)
        if m:
            rows.append((int(m.group(1)), m.group(2), m.group(3)))
    return conns_shape(rows, port)


def test_stats_conns_after_udp_traffic_like_memcached(pair):
    """After a UDP request the UDP socket's `secs_since_last_cmd` starts again from 0; `stats
    conns` asked over UDP shows that socket serving the asker (its address, the socket's own as
    `listen_addr`, `conn_parse_cmd`); an idle TCP connection is `conn_new_cmd` before its first
    request and `conn_read` after it, as in memcached."""
    ref, cand = pair(udp=True, threads=1)
    got = []
    for srv in (ref, cand):
        time.sleep(0.3)  # the start-up probe's connection is closed by then (its fd reused)
        fresh, used, s = srv.connect(), srv.connect(), srv.connect()
        try:
            exchange(used, b"version\r\n")
            time.sleep(2.2)
            udp_ask(srv.port, 1, b"get nothing\r\n")
            rows = conns_rows(s)
            udp_fd = [fd for fd, field, _ in rows if field == "UDP"][0]
            secs = [v for fd, field, v in rows if fd == udp_fd and field == "secs_since_last_cmd"]
            listener_secs = [v for fd, field, v in rows if field == "secs_since_last_cmd"][0]
            over_udp, client_port = udp_ask(srv.port, 2, b"stats conns\r\n")
            # Sorted: which fd the kernel hands each client differs between the servers.
            got.append((sorted(conns_shape(rows, srv.port)), secs, int(listener_secs) >= 2,
                        sorted(udp_shape(over_udp, srv.port, client_port))))
        finally:
            for c in (fresh, used, s):
                c.close()
    assert got[0] == got[1], "memcached:\n%s\nslipstream:\n%s" % (got[0], got[1])
    shape, secs, _, over_udp = got[1]
    assert secs == ["0"], got[1]
    asking_udp = [g for g in over_udp if ("UDP", "UDP") in g]
    assert asking_udp == [(("UDP", "UDP"), ("addr", "udp:127.0.0.1:<udpclient>"), ("listen_addr", "udp:127.0.0.1:<port>"),
                           ("state", "conn_parse_cmd"), ("secs_since_last_cmd", "<secs>"))], over_udp
    states = sorted(dict(g).get("state") for g in shape)
    assert states == ["conn_listening", "conn_new_cmd", "conn_parse_cmd", "conn_read", "conn_read"], shape
