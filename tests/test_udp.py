"""UDP tests: memcached's 8-byte frame header (request id, seq, total, reserved).

For: single-datagram requests, multi-datagram replies (seq/total numbering,
1400-byte datagrams), and malformed frames, on both servers, plus a
differential table comparing reply datagrams byte for byte.
Not for: TCP behaviour (test_differential.py).
"""

import socket
import struct
import threading

import pytest

import mcwire
from normalize import normalize

HDR = struct.Struct(">HHHH")
UDP_DATAGRAM_BYTES_MAX = 1400  # memcached's UDP_MAX_PAYLOAD_SIZE, header included
RECV_QUIET_S = 0.3
DATAGRAMS_MAX = 500


def frame(req_id, payload, seq=0, total=1, reserved=0):
    return HDR.pack(req_id, seq, total, reserved) + payload


def udp_exchange(port, packet, quiet_s=RECV_QUIET_S):
    """Send one datagram, return every datagram received until quiet (bounded)."""
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        u.settimeout(quiet_s)
        u.sendto(packet, (mcwire.HOST, port))
        out = []
        for _ in range(DATAGRAMS_MAX):
            try:
                d, _ = u.recvfrom(65536)
            except socket.timeout:
                break
            out.append(d)
        return out
    finally:
        u.close()


def reassemble(datagrams, req_id):
    """Check header fields and return the payload in seq order."""
    assert datagrams, "no reply datagram"
    heads = [HDR.unpack(d[:8]) for d in datagrams]
    totals = {h[2] for h in heads}
    assert len(totals) == 1, "inconsistent totals %r" % heads
    total = totals.pop()
    assert total == len(datagrams), "total=%d but got %d datagrams" % (total, len(datagrams))
    assert sorted(h[1] for h in heads) == list(range(total)), "seq numbers %r" % [h[1] for h in heads]
    for h in heads:
        assert h[0] == req_id, "request id echoed wrongly: %r" % (h,)
        assert h[3] == 0, "reserved field not zero: %r" % (h,)
    for d in datagrams:
        assert len(d) <= UDP_DATAGRAM_BYTES_MAX, "datagram of %d bytes" % len(d)
    parts = sorted(zip((h[1] for h in heads), (d[8:] for d in datagrams)))
    return b"".join(p for _, p in parts)


@pytest.fixture
def udp_server(server_factory, server_kind):
    return server_factory(server_kind, udp=True)


def test_udp_set_get(udp_server):
    port = udp_server.udp_port
    r = udp_exchange(port, frame(7, b"set a 5 0 3\r\nabc\r\n"))
    assert r == [frame(7, b"STORED\r\n")]
    r = udp_exchange(port, frame(8, b"get a\r\n"))
    assert r == [frame(8, b"VALUE a 5 3\r\nabc\r\nEND\r\n")]
    r = udp_exchange(port, frame(9, b"get missing\r\n"))
    assert r == [frame(9, b"END\r\n")]
    # the value is visible over TCP too: one store behind both transports
    with udp_server.connect() as s:
        s.sendall(b"get a\r\n")
        rep = mcwire.read_quiet(s, mcwire.Reply())
    assert bytes(rep.data) == b"VALUE a 5 3\r\nabc\r\nEND\r\n"


def test_udp_large_value_multi_datagram(udp_server):
    port = udp_server.udp_port
    value = bytes((i * 7) % 251 for i in range(5000)).replace(b"\r", b"r")
    with udp_server.connect() as s:
        s.sendall(b"set big 3 0 5000\r\n" + value + b"\r\n")
        rep = mcwire.read_quiet(s, mcwire.Reply())
    assert bytes(rep.data) == b"STORED\r\n"
    dgs = udp_exchange(port, frame(0xBEEF, b"get big\r\n"))
    payload = reassemble(dgs, 0xBEEF)
    assert payload == b"VALUE big 3 5000\r\n" + value + b"\r\nEND\r\n"
    assert len(dgs) >= 4, "5 KB reply must span several 1400-byte datagrams, got %d" % len(dgs)


def test_udp_set_large_value_in_one_datagram(udp_server):
    port = udp_server.udp_port
    value = b"v" * 5000
    r = udp_exchange(port, frame(3, b"set big 0 0 5000\r\n" + value + b"\r\n"))
    assert r == [frame(3, b"STORED\r\n")]
    payload = reassemble(udp_exchange(port, frame(4, b"get big\r\n")), 4)
    assert payload == b"VALUE big 0 5000\r\n" + value + b"\r\nEND\r\n"


@pytest.mark.parametrize("packet", [
    b"",  # empty datagram
    b"\x00\x01",  # shorter than the header
    b"\x00\x01\x00\x00\x00\x01\x00",  # 7 bytes
    frame(5, b"get a\r\n", total=2),  # multi-datagram requests are not supported
], ids=["empty", "short2", "short7", "total2"])
def test_udp_bad_frame_dropped(udp_server, packet):
    port = udp_server.udp_port
    assert udp_exchange(port, packet) == []
    # the server is still fine afterwards
    assert udp_exchange(port, frame(6, b"version\r\n"))[0][:8] == HDR.pack(6, 0, 1, 0)


# Differential: same datagram to memcached and to the candidate, datagrams compared.
UDP_CASES = [
    ("set_get", [b"set a 0 0 1\r\nx\r\n", b"get a\r\n", b"gets a\r\n"]),
    ("miss", [b"get nope\r\n", b"mg nope v\r\n"]),
    ("meta", [b"ms m 2 T0\r\nhi\r\n", b"mg m v s f\r\n", b"md m\r\n", b"mn\r\n"]),
    ("error", [b"bogus\r\n", b"set a 0 0 x\r\n", b"get " + b"k" * 251 + b"\r\n"]),
    ("two_cmds_one_datagram", [b"set c 0 0 1\r\nx\r\nget c\r\n"]),
    ("incr", [b"set n 0 0 1\r\n5\r\n", b"incr n 3\r\n", b"decr n 100\r\n"]),
    ("noreply", [b"set q 0 0 1 noreply\r\nx\r\n", b"get q\r\n"]),
    ("no_newline", [b"get a"]),
    ("seq_nonzero", [("hdr", 1, 1, 0, b"version\r\n")]),
    ("reserved_nonzero", [("hdr", 0, 1, 9, b"version\r\n")]),
    ("quit", [b"quit\r\n", b"version\r\n"]),
]


def _udp_run(port, steps):
    out = []
    for i, st in enumerate(steps):
        if isinstance(st, tuple):
            _, seq, total, reserved, payload = st
            pkt = frame(100 + i, payload, seq=seq, total=total, reserved=reserved)
        else:
            pkt = frame(100 + i, st)
        out.append(udp_exchange(port, pkt))
    return out


def _norm_dgs(all_dgs):
    res = []
    for dgs in all_dgs:
        res.append([(d[:8], normalize(d[8:])) for d in dgs])
    return res


@pytest.mark.parametrize("name,steps", UDP_CASES, ids=[c[0] for c in UDP_CASES])
def test_udp_differential(name, steps, server_factory, candidate_kind):
    ref = server_factory("memcached", udp=True)
    cand = server_factory(candidate_kind, udp=True)
    results = {}

    def go(key, srv):
        results[key] = _udp_run(srv.udp_port, steps)

    ts = [threading.Thread(target=go, args=("ref", ref), daemon=True),
          threading.Thread(target=go, args=("cand", cand), daemon=True)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=30)
    assert "ref" in results and "cand" in results, "UDP exchange did not finish"
    r, c = _norm_dgs(results["ref"]), _norm_dgs(results["cand"])
    if r != c:
        pytest.fail("UDP session %s differs:\n  memcached: %r\n  candidate: %r" % (
            name, results["ref"], results["cand"]), pytrace=False)
