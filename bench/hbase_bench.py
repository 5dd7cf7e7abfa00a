"""HBase range cache, first figures (issue 16; not yet the issue's full benchmark): one Python
client, same data, 100-row scans and single-row Gets:

  direct      the sidecar's native HBase client, spoken to straight (no Slipstream, no Thrift)
  miss        happybase -> Slipstream -> sidecar -> HBase, every query new (cache misses)
  all-row hit happybase -> Slipstream, repeated queries answered by all-row entries
  each-row hit the same with the each-row strategy

The client is single-threaded Python (happybase/thriftpy2), so hit rates are bounded by the
client; figures are per second over DURATION_S each. Starts its own mini cluster; kills it.
Usage: SLIPSTREAM_BIN=target/release/slipstream python3 bench/hbase_bench.py
"""

import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import happybase  # noqa: E402
import hbaselib  # noqa: E402
import mcwire  # noqa: E402

ROWS = int(os.environ.get("ROWS", "10000"))
SCAN_ROWS = 100
DURATION_S = float(os.environ.get("DURATION_S", "4"))
SEED = int(os.environ.get("SEED", "1"))


def rate(fn, duration=DURATION_S, count_max=10**7):
    n, t0 = 0, time.perf_counter()
    while n < count_max:
        fn()
        n += 1
        if n % 16 == 0 and time.perf_counter() - t0 >= duration:
            break
    return n / (time.perf_counter() - t0)


def key(i):
    return b"row%06d" % i


def main():
    rnd = random.Random(SEED)
    print("seed", SEED)
    m = hbaselib.MiniHBase().start()
    print("mini cluster: start %.1f s, RSS %s MB" % (int(m.info["start_ms"]) / 1000, m.rss_mb()))
    daemons = []
    try:
        direct = hbaselib.Sidecar(m.sidecar_port)
        for strategy in ("all-row", "each-row"):
            d = hbaselib.HbaseDaemon(m.sidecar_port, strategy=strategy, memory_mb=512).start()
            daemons.append(d)
        conn = happybase.Connection(mcwire.HOST, daemons[0].thrift_port, timeout=60000)
        conn.create_table("bench", {"cf": dict(max_versions=1)})
        t = conn.table("bench")
        t0 = time.perf_counter()
        with t.batch(batch_size=500) as b:
            for i in range(ROWS):
                b.put(key(i), {b"cf:c%d" % j: b"%032d" % (i * 4 + j) for j in range(4)})
        print("loaded %d rows x 4 columns x 32 B in %.1f s" % (ROWS, time.perf_counter() - t0))
        starts = [key(rnd.randrange(ROWS - SCAN_ROWS)) for _ in range(64)]
        gets = [key(rnd.randrange(ROWS)) for _ in range(256)]
        res = {}
        res["get direct"] = rate(lambda: direct.get(b"bench", [rnd.choice(gets)]))
        res["scan100 direct"] = rate(lambda: direct.call(
            "SCAN", hbaselib._b(b"bench") + hbaselib._b(rnd.choice(starts)) + hbaselib._b(b"")
            + hbaselib._spec() + hbaselib._b(b"") + b"\x00\x00\x00\x64\x00\x40\x00\x00"))
        for d in daemons:
            c = happybase.Connection(mcwire.HOST, d.thrift_port, timeout=60000)
            tb = c.table("bench")
            # Miss path: non-overlapping ranges, each scanned once.
            seq = iter(range(0, ROWS - SCAN_ROWS, SCAN_ROWS))
            n, t0 = 0, time.perf_counter()
            for i in seq:
                list(tb.scan(row_start=key(i), limit=SCAN_ROWS))
                n += 1
            res["scan100 miss (%s)" % d.strategy] = n / (time.perf_counter() - t0)
            for s in starts:  # warm
                list(tb.scan(row_start=s, limit=SCAN_ROWS))
            for g in gets:
                tb.row(g)
            res["scan100 hit (%s)" % d.strategy] = rate(lambda: list(tb.scan(row_start=rnd.choice(starts), limit=SCAN_ROWS)))
            res["get hit (%s)" % d.strategy] = rate(lambda: tb.row(rnd.choice(gets)))
            c.close()
        for k, v in res.items():
            print("%-26s %9.0f /s" % (k, v))
        conn.close()
        direct.close()
    finally:
        for d in daemons:
            d.stop()
        m.stop()


if __name__ == "__main__":
    main()
