"""Self-tests of the harness: the normaliser must hide only what it claims to hide.

For: making sure a passing differential run is not vacuous (a changed byte, a
changed CAS pattern or a changed deterministic stat must still fail).
Not for: server behaviour.
"""

from normalize import normalize


def test_cas_ordinals_keep_pattern():
    a = b"VALUE a 0 1 5\r\nx\r\nVALUE b 0 1 5\r\ny\r\nEND\r\n"
    b = b"VALUE a 0 1 900\r\nx\r\nVALUE b 0 1 900\r\ny\r\nEND\r\n"
    c = b"VALUE a 0 1 900\r\nx\r\nVALUE b 0 1 901\r\ny\r\nEND\r\n"
    assert normalize(a) == normalize(b)
    assert normalize(a) != normalize(c)


def test_meta_cas_and_ttl():
    assert normalize(b"HD c7\r\nVA 1 c7 t30\r\nx\r\n") == normalize(b"HD c1\r\nVA 1 c1 t29\r\nx\r\n")
    assert normalize(b"HD c7\r\nVA 1 c8\r\nx\r\n") != normalize(b"HD c1\r\nVA 1 c1\r\nx\r\n")
    assert normalize(b"VA 1 t-1\r\nx\r\n") != normalize(b"VA 1 t0\r\nx\r\n")
    assert normalize(b"VA 1 t30\r\nx\r\n") != normalize(b"VA 1 t25\r\nx\r\n")


def test_value_payload_is_verbatim():
    assert normalize(b"VALUE a 0 3\r\nabc\r\nEND\r\n") != normalize(b"VALUE a 0 3\r\nabd\r\nEND\r\n")
    # payload that looks like a STAT line or a CAS stays raw
    p = b"VALUE a 0 10\r\nSTAT x 12\r\r\nEND\r\n"
    assert normalize(p) != normalize(p.replace(b"12", b"13"))


def test_stats_rules():
    a = b"STAT pid 1\r\nSTAT curr_items 2\r\nSTAT uptime 5\r\nEND\r\n"
    b = b"STAT uptime 9\r\nSTAT pid 77\r\nSTAT curr_items 2\r\nEND\r\n"
    c = b"STAT pid 1\r\nSTAT curr_items 3\r\nSTAT uptime 5\r\nEND\r\n"
    d = b"STAT pid 1\r\nSTAT curr_items 2\r\nEND\r\n"
    assert normalize(a) == normalize(b)
    assert normalize(a) != normalize(c)
    assert normalize(a) != normalize(d)


def test_version_and_partial():
    assert normalize(b"VERSION 1.6.18\r\n") == normalize(b"VERSION slipstream-0.1\r\n")
    assert normalize(b"END\r\nEN") != normalize(b"END\r\n")
