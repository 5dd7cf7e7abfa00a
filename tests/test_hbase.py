"""HBase range cache, black box: a real HBase (in-process mini cluster, connectors/hbase) behind
the sidecar, Slipstream's `[hbase]` Thrift1 front end in front, and happybase (the usual Python
client, unchanged) talking to Slipstream. The sidecar spoken to directly is the native-client
oracle: every answer through Slipstream must equal it, on the first (miss) and the second
(cached) read, for both strategies; writes through Slipstream are never followed by a stale
read; malformed Thrift input closes only that connection; a missing HBase is an IOError.

Needs `make hbase-build` (Java 17 + Maven). One mini cluster serves the whole module (it takes
~20-40 s to start) and is killed at the end.
"""

import os
import signal
import random
import socket
import struct
import threading
import time

import pytest

import hbaselib
import mcwire

happybase = pytest.importorskip("happybase")

pytestmark = pytest.mark.skipif(not hbaselib.mini_available(),
                                reason="connectors/hbase not built (make hbase-build)")


@pytest.fixture(scope="module")
def hbase():
    m = hbaselib.MiniHBase().start()
    print("mini cluster: start_ms=%s rss_mb=%s" % (m.info.get("start_ms"), m.rss_mb()))
    try:
        yield m
    finally:
        m.stop()


@pytest.fixture(scope="module")
def oracle(hbase):
    s = hbaselib.Sidecar(hbase.sidecar_port)
    yield s
    s.close()


@pytest.fixture(params=["all-row", "each-row", "adaptive"])
def daemon(request, hbase):
    d = hbaselib.HbaseDaemon(hbase.sidecar_port, strategy=request.param).start()
    try:
        yield d
    finally:
        d.stop()


def connect(d, **kw):
    return happybase.Connection(mcwire.HOST, d.thrift_port, timeout=30000, **kw)


_table_seq = [0]


def fresh_table(conn, families=None):
    _table_seq[0] += 1
    name = ("t%d_%d" % (os.getpid(), _table_seq[0])).encode()
    conn.create_table(name, families or {"cf1": dict(max_versions=3), "cf2": dict()})
    return name


def oracle_scan_rows(oracle, table, start=b"", stop=b"", columns=()):
    return [(r, hbaselib.as_happybase_row(c)) for r, c in oracle.scan(table, start, stop, columns)]


def test_happybase_answers_equal_the_native_client(daemon, oracle):
    seed = int(os.environ.get("HBASE_TEST_SEED", random.randrange(1 << 30)))
    print("seed", seed)
    rnd = random.Random(seed)
    conn = connect(daemon)
    name = fresh_table(conn)
    t = conn.table(name)
    assert name in conn.tables()
    assert set(t.families()) == {b"cf1", b"cf2"}
    assert t.families()[b"cf1"]["max_versions"] == 3
    keys = sorted({b"row%03d" % rnd.randrange(200) for _ in range(60)})
    cols = [b"cf1:a", b"cf1:b", b"cf2:x", b"cf2:y"]
    with t.batch() as b:
        for k in keys:
            b.put(k, {c: b"%s-%d" % (c, rnd.randrange(1000)) for c in rnd.sample(cols, rnd.randint(1, 4))})
    for k in rnd.sample(keys, 5):  # extra versions
        t.put(k, {b"cf1:a": b"v2-" + k})
    for k in rnd.sample(keys, 5):
        t.delete(k, columns=[rnd.choice(cols)])
    gone = rnd.choice(keys)
    t.delete(gone)

    for _round in range(2):  # the second round is served from the cache
        for k in rnd.sample(keys, 10) + [b"absent", gone]:
            want = {c: v for r, cells in oracle.get(name, [k]) for c, v in hbaselib.as_happybase_row(cells).items()}
            assert t.row(k) == want, k
            assert t.row(k, columns=[b"cf2"]) == {c: v for c, v in want.items() if c.startswith(b"cf2:")}
            got_ts = t.row(k, include_timestamp=True)
            assert {c: v for c, (v, _ts) in got_ts.items()} == want
        few = rnd.sample(keys, 4)
        assert dict(t.rows(few)) == {r: hbaselib.as_happybase_row(c) for r, c in oracle.get(name, few) if c}
        k = rnd.choice(keys)
        want_versions = [v for _r, cells in oracle.get(name, [k], [b"cf1:a"], versions=3) for (_f, _q, _ts, v) in cells]
        assert t.cells(k, b"cf1:a", versions=3) == want_versions
        assert list(t.scan()) == oracle_scan_rows(oracle, name)
        for _ in range(5):
            a, b2 = sorted(rnd.sample(keys, 2))
            assert list(t.scan(row_start=a, row_stop=b2)) == oracle_scan_rows(oracle, name, a, b2)
            assert list(t.scan(row_start=a, row_stop=b2, columns=[b"cf1:a", b"cf2"])) == \
                oracle_scan_rows(oracle, name, a, b2, [b"cf1:a", b"cf2"])
        pre = b"row0%d" % rnd.randrange(2)
        assert list(t.scan(row_prefix=pre)) == [(r, d) for r, d in oracle_scan_rows(oracle, name) if r.startswith(pre)]
        # Scanner batching: each row split into chunks of 1 cell, as HBase's setBatch does.
        chunks = [(r, {c: v}) for r, d in oracle_scan_rows(oracle, name) for c, v in sorted(d.items())]
        assert list(t.scan(scan_batching=1, batch_size=7)) == chunks
        assert list(t.scan(limit=3)) == oracle_scan_rows(oracle, name)[:3]
    # A family the table lacks is HBase's error, also once the rows are cached.
    for _ in range(2):
        with pytest.raises(Exception) as e:
            t.row(keys[0], columns=[b"nofam:x"])
        assert type(e.value).__name__ == "IOError"
        with pytest.raises(Exception) as e:
            list(t.scan(columns=[b"nofam"]))
        assert type(e.value).__name__ == "IOError"
    assert t.counter_inc(b"cnt", b"cf1:n") == 1
    assert t.counter_inc(b"cnt", b"cf1:n", 5) == 6
    assert t.counter_get(b"cnt", b"cf1:n") == 6
    m = daemon.metrics()
    assert "slipstream_hbase_misses_total" in m
    hits = sum(float(l.split()[-1]) for l in m.splitlines()
               if l.startswith(("slipstream_hbase_all_row_hits_total{", "slipstream_hbase_each_row_hits_total{")))
    assert hits > 0
    conn.delete_table(name, disable=True)
    assert name not in conn.tables()
    conn.close()


def test_reads_after_writes_through_slipstream_are_never_stale(daemon, oracle):
    """A writer and a reader on two connections: once a write is acknowledged, no later read
    (Get or a scan over an overlapping range) returns an older value, although the reader keeps
    filling the cache while the writes race its fills. The writer mixes single puts (mutateRows),
    multi-row batches, whole-row deletes (deleteAllRow) and counter increments; each put carries a
    number larger than every earlier operation's, so "older" is a smaller number."""
    seed = int(os.environ.get("HBASE_TEST_SEED", random.randrange(1 << 30)))
    print("seed", seed)
    rnd = random.Random(seed)
    wrnd = random.Random(seed + 1)
    wconn, rconn = connect(daemon), connect(daemon)
    name = fresh_table(wconn)
    wt, rt = wconn.table(name), rconn.table(name)
    rows = [b"k%02d" % i for i in range(10)]
    # Per row: number of the last acknowledged op, whether it was a delete, deletes issued.
    acked = {r: (-1, True) for r in rows}
    del_issued = {r: 0 for r in rows}
    del_acked = {r: 0 for r in rows}
    stop = threading.Event()
    errors = []

    def writer():
        n = 0
        while not stop.is_set() and n < 400:
            n += 1
            op = wrnd.random()
            if op < 0.55:
                r = wrnd.choice(rows)
                wt.put(r, {b"cf1:v": b"%08d" % n})
                acked[r] = (n, False)
            elif op < 0.7:
                batch_rows = wrnd.sample(rows, 3)
                with wt.batch() as b:
                    for r in batch_rows:
                        b.put(r, {b"cf1:v": b"%08d" % n})
                for r in batch_rows:
                    acked[r] = (n, False)
            elif op < 0.85:
                r = wrnd.choice(rows)
                del_issued[r] += 1
                wt.delete(r)
                acked[r] = (n, True)
                del_acked[r] += 1
                # HBase semantics, not the cache: a put given the same millisecond timestamp as
                # an earlier delete of its row is masked by the delete marker (HBase itself then
                # shows the row absent after the put is acknowledged). Seen once writes got fast
                # enough: a delete and the next put landed in one millisecond.
                time.sleep(0.003)
            else:
                wt.counter_inc(wrnd.choice(rows), b"cf2:c")

    th = threading.Thread(target=writer)
    th.start()
    reads = 0
    deadline = time.monotonic() + 8
    try:
        while time.monotonic() < deadline and th.is_alive():
            r = rnd.choice(rows)
            floor = dict(acked)
            dels_before = dict(del_acked)
            if rnd.random() < 0.5:
                got = rt.row(r, columns=[b"cf1"])
                seen = {r: int(got[b"cf1:v"])} if got else {}
                covered = [r]
            else:
                i = rows.index(r)
                lo, hi = max(0, i - 3), i + 3  # overlapping ranges; past the end = to the table's end
                stop_row = rows[hi] if hi < len(rows) else None
                seen = {k: int(d[b"cf1:v"]) for k, d in rt.scan(row_start=rows[lo], row_stop=stop_row, columns=[b"cf1"])}
                covered = rows[lo:hi]
            for k in covered:
                n, was_delete = floor[k]
                if k in seen:
                    if seen[k] < n:
                        errors.append((k, seen[k], floor[k]))
                elif not was_delete and del_issued[k] == dels_before[k]:
                    errors.append((k, None, floor[k]))  # absent, yet no delete could explain it
            reads += 1
    finally:
        stop.set()
        th.join(30)
    print("reads", reads)
    assert not errors, "stale reads (row, seen, acknowledged): %r" % errors[:5]
    # And at rest the cache agrees with HBase.
    assert list(rt.scan()) == oracle_scan_rows(oracle, name)
    wconn.delete_table(name, disable=True)


def test_framed_transport(hbase):
    d = hbaselib.HbaseDaemon(hbase.sidecar_port).start()
    try:
        conn = connect(d, transport="framed")
        name = fresh_table(conn)
        t = conn.table(name)
        t.put(b"a", {b"cf1:q": b"1"})
        assert t.row(b"a") == {b"cf1:q": b"1"}
        assert list(t.scan()) == [(b"a", {b"cf1:q": b"1"})]
        conn.delete_table(name, disable=True)
    finally:
        d.stop()


def _msg(name, seq, body=b"\x00"):
    return struct.pack(">HBBI", 0x8001, 0, 1, len(name)) + name + struct.pack(">i", seq) + body


def _recv_some(s, timeout=5.0):
    s.settimeout(timeout)
    try:
        return s.recv(65536)
    except socket.timeout:
        return None


def test_malformed_input_closes_only_that_connection(hbase):
    d = hbaselib.HbaseDaemon(hbase.sidecar_port).start()
    try:
        good = connect(d)
        good.tables()
        hostile = [
            # A binary field claiming 2 GiB.
            _msg(b"getRow", 1, b"\x0b\x00\x01\x7f\xff\xff\xff"),
            # A negative list size.
            _msg(b"getRows", 1, b"\x0b\x00\x01\x00\x00\x00\x01t\x0f\x00\x02\x0b\xff\xff\xff\xff"),
            # Not a strict binary message at all, framed: a 2 GiB frame.
            b"\x7f\xff\xff\xff" + b"x" * 16,
            # A framed message whose content is garbage.
            struct.pack(">i", 8) + b"\x00" * 8,
        ]
        for payload in hostile:
            s = socket.create_connection((mcwire.HOST, d.thrift_port), timeout=5)
            s.sendall(payload)
            got = b""
            for _ in range(10):
                chunk = _recv_some(s)
                assert chunk is not None, "connection left open after %r" % payload
                if not chunk:
                    break
                got += chunk
            # Closed, after at most an exception reply (message type 3) naming the problem.
            assert got == b"" or got[:4] == b"\x80\x01\x00\x03", (payload, got)
            s.close()
        # An unknown method gets TApplicationException and the connection stays usable.
        s = socket.create_connection((mcwire.HOST, d.thrift_port), timeout=5)
        s.sendall(_msg(b"getRegionInfo", 7, b"\x0b\x00\x01\x00\x00\x00\x01x\x00"))
        reply = _recv_some(s)
        assert reply[:4] == b"\x80\x01\x00\x03" and b"getRegionInfo" in reply  # type 3 = exception
        s.sendall(_msg(b"getTableNames", 8))
        reply = _recv_some(s)
        assert reply[:4] == b"\x80\x01\x00\x02"  # type 2 = reply
        s.close()
        assert d.alive()
        good.tables()
        good.close()
    finally:
        d.stop()


def test_invalid_scanner_is_illegal_argument(hbase):
    d = hbaselib.HbaseDaemon(hbase.sidecar_port).start()
    try:
        conn = connect(d)
        with pytest.raises(Exception) as e:
            conn.client.scannerGet(123456)
        assert type(e.value).__name__ == "IllegalArgument"
        with pytest.raises(Exception) as e:
            conn.client.scannerClose(123456)
        assert type(e.value).__name__ == "IllegalArgument"
        conn.close()
    finally:
        d.stop()


def test_missing_hbase_is_an_ioerror_not_a_hang():
    dead = mcwire.free_port()
    d = hbaselib.HbaseDaemon(dead, timeout_ms=1000).start()
    try:
        conn = connect(d)
        t0 = time.monotonic()
        for call in (lambda: conn.tables(), lambda: conn.table(b"x").row(b"r"), lambda: list(conn.table(b"x").scan())):
            with pytest.raises(Exception) as e:
                call()
            assert type(e.value).__name__ == "IOError"
        assert time.monotonic() - t0 < 10
        assert d.alive()
    finally:
        d.stop()


def test_hbase_going_away_and_back():
    """HBase (with its sidecar) stops and a fresh, empty one starts on the same port: while it
    is away calls are IOErrors, and afterwards nothing cached from the old one is served."""
    port = mcwire.free_port()
    m = hbaselib.MiniHBase(sidecar_port=port).start()
    d = hbaselib.HbaseDaemon(port, timeout_ms=3000).start()
    try:
        conn = connect(d)
        name = fresh_table(conn)
        t = conn.table(name)
        t.put(b"a", {b"cf1:q": b"1"})
        assert t.row(b"a") == {b"cf1:q": b"1"}
        assert t.row(b"a") == {b"cf1:q": b"1"}  # now cached
        m.stop()
        time.sleep(0.5)  # the daemon's sidecar connection sees the loss
        with pytest.raises(Exception) as e:
            t.row(b"b")
        assert type(e.value).__name__ == "IOError"
        m = hbaselib.MiniHBase(sidecar_port=port).start()
        # The new HBase has no such table: HBase's error, not the old cached row.
        with pytest.raises(Exception) as e:
            t.row(b"a")
        assert type(e.value).__name__ == "IOError"
        name2 = fresh_table(conn)
        t2 = conn.table(name2)
        t2.put(b"x", {b"cf2:y": b"2"})
        assert t2.row(b"x") == {b"cf2:y": b"2"}
        assert d.alive()
    finally:
        d.stop()
        m.stop()


# --- writes that bypass Slipstream (the RegionObserver's notices) ---

def _cached_twice(t, row, start, stop):
    """Reads a row and a scan through Slipstream twice, so both are cached."""
    for _ in range(2):
        got_row = t.row(row)
        got_scan = list(t.scan(row_start=start, row_stop=stop))
    return got_row, got_scan


def test_direct_writes_of_every_kind_are_seen_at_once(daemon, oracle):
    """Each kind of write made straight to HBase (the sidecar's native client; no Slipstream) is
    visible through Slipstream on the very next read, although the row and a scan over it were
    cached just before: put, multi-row batch, column delete, row delete, increment."""
    conn = connect(daemon)
    name = fresh_table(conn)
    t = conn.table(name)
    for k in (b"a", b"b", b"c", b"d"):
        t.put(k, {b"cf1:q": b"0-" + k})
    direct = [
        ("put", lambda: oracle.put(name, b"b", {b"cf1:q": b"1"})),
        ("batch", lambda: oracle.mutate_rows(name, {b"a": {b"cf1:q": b"2"}, b"b": {b"cf2:z": b"2"}})),
        ("delete column", lambda: oracle.delete_column(name, b"b", b"cf1:q")),
        ("increment", lambda: oracle.increment(name, b"b", b"cf2:n", 3)),
        ("delete row", lambda: oracle.delete_row(name, b"b")),
        ("put after delete", lambda: oracle.put(name, b"b", {b"cf1:q": b"3"})),
    ]
    for what, write in direct:
        _cached_twice(t, b"b", b"a", b"d")
        write()
        want_row = {c: v for _r, cells in oracle.get(name, [b"b"]) for c, v in hbaselib.as_happybase_row(cells).items()}
        assert t.row(b"b") == want_row, what
        assert list(t.scan(row_start=b"a", row_stop=b"d")) == oracle_scan_rows(oracle, name, b"a", b"d"), what
    notices = sum(float(l.split()[-1]) for l in daemon.metrics().splitlines()
                  if l.startswith("slipstream_hbase_notices_total{"))
    assert notices >= len(direct)
    assert "slipstream_hbase_observer_loaded 1" in daemon.metrics()
    conn.delete_table(name, disable=True)
    conn.close()


def test_mixed_direct_and_slipstream_writes_are_never_stale(daemon, hbase, oracle):
    """Randomized (seed printed): hbaselib.mixed_writers (a writer through Slipstream, one
    straight to HBase through the native client, a reader of Gets and overlapping scans through
    Slipstream): no read begun after a write was acknowledged shows the row older than it."""
    seed = int(os.environ.get("HBASE_TEST_SEED", random.randrange(1 << 30)))
    print("seed", seed)
    sconn, rconn = connect(daemon), connect(daemon)
    direct = hbaselib.Sidecar(hbase.sidecar_port)
    name = fresh_table(sconn)
    rt = rconn.table(name)
    rows = [b"k%02d" % i for i in range(12)]
    stale, counts, reads = hbaselib.mixed_writers(sconn.table(name), rt, direct, name, rows, seed)
    print("reads", reads, "writes", counts)
    assert not counts["errors"], counts["errors"]
    assert not stale, "stale reads (row, seen, acknowledged): %r" % stale[:5]
    assert counts["direct"] > 20 and counts["slipstream"] > 20 and reads > 50
    # At rest the cache agrees with HBase.
    assert list(rt.scan()) == oracle_scan_rows(oracle, name)
    direct.close()
    sconn.delete_table(name, disable=True)


def test_lost_notice_channel_flushes_and_holds_writes(hbase, oracle):
    """Slipstream stops answering notices (SIGSTOP): a direct write waits for its ACK
    (--notify-timeout-ms, 2 s), the sidecar drops the connection and holds the write until the
    daemon's lease (2 s) has run out, then applies it. When Slipstream runs again it serves the
    new value (lease expired, connection lost: cache flushed), never the cached old one; then
    caching resumes."""
    d = hbaselib.HbaseDaemon(hbase.sidecar_port).start()
    try:
        conn = connect(d)
        name = fresh_table(conn)
        t = conn.table(name)
        t.put(b"r", {b"cf1:q": b"old"})
        assert t.row(b"r") == {b"cf1:q": b"old"}
        assert t.row(b"r") == {b"cf1:q": b"old"}  # cached
        os.kill(d.proc.pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            oracle.put(name, b"r", {b"cf1:q": b"new"})
            held = time.monotonic() - t0
        finally:
            os.kill(d.proc.pid, signal.SIGCONT)
        print("direct write held %.2f s" % held)
        assert held >= 3.5, held  # ACK timeout + lease
        assert t.row(b"r") == {b"cf1:q": b"new"}
        assert list(t.scan()) == [(b"r", {b"cf1:q": b"new"})]
        # Caching resumes on the new connection, and notices flow again.
        assert t.row(b"r") == {b"cf1:q": b"new"}
        oracle.put(name, b"r", {b"cf1:q": b"newer"})
        assert t.row(b"r") == {b"cf1:q": b"newer"}
        m = d.metrics()
        assert "slipstream_hbase_notify_channel_up 1" in m
        conn.delete_table(name, disable=True)
        conn.close()
    finally:
        d.stop()


def _per_strategy(d, metric, table):
    """slipstream_hbase_<metric>{table,strategy} of one table, by strategy."""
    out = {}
    for l in d.metrics().splitlines():
        if l.startswith("slipstream_hbase_%s{" % metric) and ('table="%s"' % table.decode()) in l:
            out[l.split('strategy="')[1].split('"')[0]] = float(l.split()[-1])
    return out


def _chosen(d, table):
    return _per_strategy(d, "strategy_chosen_total", table)


def table_with_rows(d, n, values):
    """A connection to `d`, a fresh table and rows r0000.. r<n-1> holding values(i)."""
    conn = connect(d)
    name = fresh_table(conn)
    t = conn.table(name)
    with t.batch() as b:
        for i in range(n):
            b.put(b"r%04d" % i, values(i))
    return conn, name, t


def test_adaptive_chooses_per_query_shape(hbase, oracle):
    """strategy = "adaptive": each-row for every query shape each-row can serve (Gets, scans with
    and without columns, prefix and open-ended scans), all-row only where it cannot (a filter, a
    time range, several versions); answers equal the native client's; the per-table metric
    counts each choice."""
    d = hbaselib.HbaseDaemon(hbase.sidecar_port, strategy="adaptive").start()
    try:
        conn, name, t = table_with_rows(d, 300, lambda i: {b"cf1:a": b"x%d" % i, b"cf2:b": b"y"})
        shapes = [
            ("each-row", "get", lambda: t.row(b"r0001")),
            ("each-row", "get columns", lambda: t.row(b"r0002", columns=[b"cf1:a"])),
            ("each-row", "scan", lambda: list(t.scan(row_start=b"r0000", row_stop=b"r0020"))),
            ("each-row", "scan columns", lambda: list(t.scan(row_start=b"r0100", row_stop=b"r0120", columns=[b"cf2"]))),
            ("each-row", "prefix scan", lambda: list(t.scan(row_prefix=b"r02"))),
            ("each-row", "open-ended scan", lambda: list(t.scan(row_start=b"r0290"))),
            ("all-row", "filter scan", lambda: list(t.scan(row_start=b"r0000", row_stop=b"r0020",
                                                           filter=b"KeyOnlyFilter()"))),
            ("all-row", "time-range scan", lambda: list(t.scan(row_start=b"r0000", row_stop=b"r0020",
                                                               timestamp=(1 << 62)))),
            ("all-row", "versions", lambda: t.cells(b"r0003", b"cf1:a", versions=3)),
            ("all-row", "time-range get", lambda: t.row(b"r0004", timestamp=(1 << 62))),
        ]
        for want, what, run in shapes:
            before = _chosen(d, name)
            first, again = run(), run()
            assert first == again, what
            after = _chosen(d, name)
            delta = {k: after.get(k, 0) - before.get(k, 0) for k in ("all-row", "each-row")}
            other = "all-row" if want == "each-row" else "each-row"
            assert delta[want] >= 2 and delta[other] == 0, (what, delta)
        assert dict(t.scan(row_start=b"r0100", row_stop=b"r0120", columns=[b"cf2"])) == \
            dict(oracle_scan_rows(oracle, name, b"r0100", b"r0120", [b"cf2"]))
        assert 'slipstream_hbase_strategy{strategy="adaptive"} 1' in d.metrics()
        conn.delete_table(name, disable=True)
        conn.close()
    finally:
        d.stop()


def _shapes(d, table):
    return _per_strategy(d, "adaptive_shapes", table)


def test_adaptive_gives_two_shapes_different_strategies_from_their_statistics(hbase, oracle):
    """strategy = "adaptive", one table, two scan shapes: columns cf1 repeating four disjoint
    ranges (no writes, small results) goes all-row after four windows of 64 scans; columns cf2 with
    sliding overlapping ranges stays each-row; a write through Slipstream into a cf1 range sends
    that shape back to each-row. Answers equal the native client's throughout."""
    window = 64  # crate::adaptive::WINDOW
    d = hbaselib.HbaseDaemon(hbase.sidecar_port, strategy="adaptive").start()
    try:
        conn, name, t = table_with_rows(d, 400, lambda i: {b"cf1:a": b"x%d" % i, b"cf2:b": b"y%d" % i})

        def a(i):  # shape A: four disjoint 20-row ranges, repeated
            s = 100 * (i % 4)
            return list(t.scan(row_start=b"r%04d" % s, row_stop=b"r%04d" % (s + 20), columns=[b"cf1"]))

        def b(i):  # shape B: 20-row ranges sliding by 3 rows
            return list(t.scan(row_start=b"r%04d" % (3 * i % 360), row_stop=b"r%04d" % (3 * i % 360 + 20),
                               columns=[b"cf2"]))

        for i in range(5 * window):  # each-row -> all-row after 4 windows in a row say so
            a(i)
            b(i)
        assert _shapes(d, name) == {"all-row": 1, "each-row": 1}, _shapes(d, name)
        for shape, run, want in (("A", a, "all-row"), ("B", b, "each-row")):
            before = _chosen(d, name)
            for i in range(8):
                run(i)
            after = _chosen(d, name)
            delta = {k: after.get(k, 0) - before.get(k, 0) for k in ("all-row", "each-row")}
            assert delta[want] == 8 and sum(delta.values()) == 8, (shape, delta)
        assert a(1) == oracle_scan_rows(oracle, name, b"r0100", b"r0120", [b"cf1"])
        assert b(5) == oracle_scan_rows(oracle, name, b"r0015", b"r0035", [b"cf2"])
        t.put(b"r0105", {b"cf1:a": b"new"})
        for i in range(window):
            got = a(i)
        assert _shapes(d, name) == {"all-row": 0, "each-row": 2}, _shapes(d, name)
        assert dict(a(1))[b"r0105"] == {b"cf1:a": b"new"}
        assert a(1) == oracle_scan_rows(oracle, name, b"r0100", b"r0120", [b"cf1"]), got
        conn.delete_table(name, disable=True)
        conn.close()
    finally:
        d.stop()


@pytest.mark.parametrize("writer", ["slipstream", "direct"])
def test_each_row_rows_are_refilled_after_a_write(hbase, oracle, writer):
    """each-row: a write takes its rows out of the cached interval — through Slipstream, or by
    another HBase client (the native client, reported by the RegionObserver) —; once it is
    acknowledged (visible, for the direct write) the rows are re-read in the background with
    the same version check (refills_total), so the next scan over them is a hit and shows the
    written values (never stale)."""
    d = hbaselib.HbaseDaemon(hbase.sidecar_port, strategy="each-row").start()
    try:
        conn, name, t = table_with_rows(d, 50, lambda i: {b"cf1:a": b"old%d" % i})

        def scan():
            return list(t.scan(row_start=b"r0000", row_stop=b"r0050"))

        assert len(scan()) == 50
        misses = hbaselib.counter(d, "misses_total", name)
        assert len(scan()) == 50 and hbaselib.counter(d, "misses_total", name) == misses, "second scan is a hit"
        fills = hbaselib.counter(d, "fills_total", name)
        written = {b"r0010": {b"cf1:a": b"new10"}, b"r0020": {b"cf1:a": b"new20"}}
        if writer == "slipstream":
            with t.batch() as b:
                for row, values in written.items():
                    b.put(row, values)
        else:
            oracle.mutate_rows(name, written)
        deadline = time.time() + 10
        while hbaselib.counter(d, "refills_total") < 2 and time.time() < deadline:
            time.sleep(0.05)
        assert hbaselib.counter(d, "refills_total") >= 2, "the written rows were re-read"
        while hbaselib.counter(d, "fills_total", name) < fills + 2 and time.time() < deadline:
            time.sleep(0.05)
        misses = hbaselib.counter(d, "misses_total", name)
        rows = dict(scan())
        assert {r: rows[r] for r in written} == written
        assert rows == dict(oracle_scan_rows(oracle, name, b"r0000", b"r0050"))
        assert hbaselib.counter(d, "misses_total", name) == misses, "scan over the written rows is a hit"
        conn.delete_table(name, disable=True)
        conn.close()
    finally:
        d.stop()


def _scan_loop(conn, table, seconds, stop=b"r0100"):
    """Scans r0000..stop over and over for `seconds`: (scans done, elapsed s, last result)."""
    t = conn.table(table)
    t0 = time.monotonic()
    n, rows = 0, None
    while time.monotonic() - t0 < seconds and n < 100000:
        rows = list(t.scan(row_start=b"r0000", row_stop=stop))
        n += 1
    return n, time.monotonic() - t0, rows


def test_tenants_own_thrift_ports_shaped_and_charged(hbase, oracle):
    """[[tenant]] thrift_port: each tenant's Thrift port is shaped by that tenant's own buckets
    (a tenant over its egress rate is held back, another tenant's port is not), its cache is
    half the tenant's memory_mb (the store has the other half; eviction keeps the cache inside
    it) or `thrift_cache_mb` of it, metrics carry the tenant, and the admin API resizes (memory_mb,
    thrift_cache_mb, checked against each other), adds and removes such ports."""
    import tenantlib
    slow_rate = 100_000  # bytes/s: share 0.001 of 100 MB/s
    d = hbaselib.TenantHbaseDaemon(hbase.sidecar_port, [
        dict(name="slow", share=0.001, burst_bytes=16384, memory_mb=4, thrift=True, thrift_cache_mb=3),
        dict(name="fast", share=0.9, burst_bytes=1 << 20, memory_mb=2, thrift=True),
    ], shaping=dict(ingress_bytes_per_s=100_000_000, egress_bytes_per_s=100_000_000)).start()
    try:
        fast = happybase.Connection(mcwire.HOST, d.thrift_ports["fast"], timeout=30000)
        slow = happybase.Connection(mcwire.HOST, d.thrift_ports["slow"], timeout=30000)
        name = fresh_table(fast)
        with fast.table(name).batch() as b:
            for i in range(100):
                b.put(b"r%04d" % i, {b"cf1:a": b"v" * 100})
        n_slow, t_slow, rows_slow = _scan_loop(slow, name, 2.0)
        n_fast, t_fast, rows_fast = _scan_loop(fast, name, 2.0)
        print("scans: slow %d in %.2fs, fast %d in %.2fs" % (n_slow, t_slow, n_fast, t_fast))
        assert rows_slow == rows_fast == oracle_scan_rows(oracle, name, b"r0000", b"r0100")
        # Every scan's reply holds at least 100 values of 100 bytes; the slow tenant may send
        # its rate for the time plus one burst plus one reply (the debt rule) at most.
        assert n_slow * 100 * 100 <= slow_rate * t_slow + 16384 + 20000, n_slow
        assert n_fast >= 5 * n_slow, (n_fast, n_slow)
        m = d.metrics()
        assert tenantlib.metric_value(m, "slipstream_tenant_throttled_total", "slow") > 0
        assert tenantlib.metric_value(m, "slipstream_tenant_throttled_total", "fast") == 0

        # Memory: fast's cache is half its 2 MB; 1.5 MB of rows read twice stay inside it.
        mib = 1 << 20
        assert tenantlib.metric_value(m, "slipstream_hbase_cache_limit_bytes", "fast") == mib
        assert tenantlib.metric_value(m, "slipstream_tenant_memory_limit_bytes", "fast") == mib
        assert tenantlib.metric_value(m, "slipstream_hbase_cache_limit_bytes", "slow") == 3 * mib
        assert tenantlib.metric_value(m, "slipstream_tenant_memory_limit_bytes", "slow") == mib
        big = fresh_table(fast)
        with fast.table(big).batch(batch_size=100) as b:
            for i in range(1500):
                b.put(b"r%04d" % i, {b"cf1:a": b"x" * 1000})
        for _ in range(2):
            for c in range(15):
                got = list(fast.table(big).scan(row_start=b"r%04d" % (c * 100), row_stop=b"r%04d" % (c * 100 + 100)))
                assert len(got) == 100
        m = d.metrics()
        used = tenantlib.metric_value(m, "slipstream_hbase_cache_bytes", "fast")
        assert 0 < used <= mib, used
        evicted = [l for l in m.splitlines() if l.startswith("slipstream_hbase_evictions_total{tenant=\"fast\",table=\"%s\"" % big.decode())]
        assert evicted and float(evicted[0].split()[-1]) > 0, evicted
        slow_big = [l for l in m.splitlines()
                    if l.startswith("slipstream_hbase_table_cache_bytes{tenant=\"slow\",table=\"%s\"" % big.decode())]
        assert all(float(l.split()[-1]) == 0 for l in slow_big), ("slow never read it", slow_big)

        # Admin: memory_mb resizes the cache; a tenant added with a thrift_port serves it; a
        # removed one's port closes.
        r = d.http("PUT", "/tenants/fast", {"memory_mb": 4})
        assert r.status == 200, r
        m = d.metrics()
        assert tenantlib.metric_value(m, "slipstream_hbase_cache_limit_bytes", "fast") == 2 * mib
        assert tenantlib.metric_value(m, "slipstream_tenant_memory_limit_bytes", "fast") == 2 * mib
        r = d.http("PUT", "/tenants/fast", {"thrift_cache_mb": 3})
        assert r.status == 200, r
        m = d.metrics()
        assert tenantlib.metric_value(m, "slipstream_hbase_cache_limit_bytes", "fast") == 3 * mib
        assert tenantlib.metric_value(m, "slipstream_tenant_memory_limit_bytes", "fast") == mib
        for bad in ({"thrift_cache_mb": 4}, {"memory_mb": 3}):  # nothing left for the KV store
            r = d.http("PUT", "/tenants/fast", bad)
            assert r.status == 400, (bad, r)
        assert tenantlib.metric_value(d.metrics(), "slipstream_hbase_cache_limit_bytes", "fast") == 3 * mib
        extra_port = mcwire.free_port()
        r = d.http("PUT", "/tenants/extra", {"name": "extra", "tcp_port": d.free_port_extra, "share": 0.05,
                                              "thrift_port": extra_port})
        assert r.status == 201, r
        assert d.tenants()["extra"]["thrift_port"] == extra_port
        extra = happybase.Connection(mcwire.HOST, extra_port, timeout=30000)
        assert name in extra.tables()
        extra.close()
        r = d.http("PUT", "/tenants/clash", {"name": "clash", "tcp_port": mcwire.free_port(), "share": 0.01,
                                              "thrift_port": d.thrift_ports["slow"]})
        assert r.status == 409, r
        r = d.http("DELETE", "/tenants/extra")
        assert r.status in (200, 204), r
        assert tenantlib.port_refuses(extra_port, max_s=5.0)
        assert tenantlib.metric_value(d.metrics(), "slipstream_hbase_cache_bytes", "extra") is None
        for t in (name, big):
            fast.delete_table(t, disable=True)
        fast.close()
        slow.close()
    finally:
        d.stop()


def _recv_frames(s, count):
    """`count` framed replies (each with its 4-byte length), read whole."""
    got, frames = b"", []
    deadline = time.monotonic() + 10
    while len(frames) < count and time.monotonic() < deadline:
        chunk = _recv_some(s)
        assert chunk, "connection ended after %d of %d replies" % (len(frames), count)
        got += chunk
        while len(got) >= 4 and len(got) >= 4 + struct.unpack(">i", got[:4])[0]:
            n = 4 + struct.unpack(">i", got[:4])[0]
            frames.append(got[:n])
            got = got[n:]
    assert len(frames) == count and not got, (len(frames), count, got)
    return frames


def test_tenant_request_metrics_count_its_thrift_port_too(hbase):
    """One pipeline, one metrics endpoint: a tenant's Thrift messages and their bytes are in its
    `slipstream_tenant_{requests,bytes_in,bytes_out}_total` (framed: with the 4-byte length),
    beside its memcached requests, and not in another tenant's; checked exactly against what
    the client sent and received."""
    import tenantlib
    d = hbaselib.TenantHbaseDaemon(hbase.sidecar_port, [
        dict(name="a", share=0.4, memory_mb=4, thrift=True),
        dict(name="b", share=0.4, memory_mb=4, thrift=True),
    ]).start()
    try:
        families = ("slipstream_tenant_requests_total", "slipstream_tenant_bytes_in_total",
                    "slipstream_tenant_bytes_out_total")

        def counts(tenant):
            m = d.metrics()
            return [tenantlib.metric_value(m, f, tenant) for f in families]

        a0, b0 = counts("a"), counts("b")
        sent = received = 0
        # Framed, pipelined: 20 getTableNames in one send; each reply is read by its frame length.
        s = socket.create_connection((mcwire.HOST, d.thrift_ports["a"]), timeout=5)
        burst = b"".join(struct.pack(">i", len(m)) + m for m in (_msg(b"getTableNames", i) for i in range(20)))
        s.sendall(burst)
        sent += len(burst)
        for f in _recv_frames(s, 20):
            assert f[4:8] == b"\x80\x01\x00\x02", f  # a reply
            received += len(f)
        s.close()
        # Buffered, one at a time: an unknown method (an exception reply) then getTableNames.
        s = socket.create_connection((mcwire.HOST, d.thrift_ports["a"]), timeout=5)
        for m in (_msg(b"getRegionInfo", 1, b"\x0b\x00\x01\x00\x00\x00\x01x\x00"), _msg(b"getTableNames", 2)):
            s.sendall(m)
            sent += len(m)
            reply = _recv_some(s)
            assert reply and reply[:2] == b"\x80\x01", reply
            received += len(reply)
        s.close()
        # And one memcached request on the tenant's KV port: the same three series.
        k = socket.create_connection((mcwire.HOST, d.ports["a"]), timeout=5)
        k.sendall(b"version\r\n")
        kv_reply = _recv_some(k)
        assert kv_reply.startswith(b"VERSION "), kv_reply
        k.close()
        # The KV path counts a reply's bytes once its write returns, which can be just after the
        # client has read it: wait (bounded) for the counters to settle.
        want_out = a0[2] + received + len(kv_reply)
        deadline = time.monotonic() + 2.0
        a1 = counts("a")
        while a1[2] < want_out and time.monotonic() < deadline:
            time.sleep(0.02)
            a1 = counts("a")
        b1 = counts("b")
        print("tenant a before", a0, "after", a1, "; thrift sent", sent, "received", received)
        assert a1[0] - a0[0] == 22 + 1
        assert a1[1] - a0[1] == sent + len(b"version\r\n")
        assert a1[2] - a0[2] == received + len(kv_reply)
        assert b1 == b0, (b0, b1)
    finally:
        d.stop()
