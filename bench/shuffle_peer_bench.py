#!/usr/bin/env python3
"""The shuffle service's cross-host path measured over a veth pair (root; part of `make bench`).

Daemon A here, daemon B in a namespace (tests/shufflehosts.py's topology and launcher, the one
tests/test_shuffle_peers.py uses): MAPS map outputs of BLOCK_KB-sized segments are committed on A, then a
reducer on B looks up the partition ROUNDS times; each LOOKUP makes B fetch every segment from A
(sendfile on A, splice on B) into copy blocks, released after. Reports GB/s of segment bytes
and both daemons' CPU-seconds per GB (from /proc/<pid>/stat, their whole processes).

Knobs (environment): MAPS [64], BLOCK_KB [2048], ROUNDS [5].
"""

import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
os.environ.setdefault("SLIPSTREAM_BIN", os.path.join(ROOT, "target/release/slipstream"))

import shufflehosts  # noqa: E402
import test_shuffle_peers as tp  # noqa: E402

MAPS = int(os.environ.get("MAPS", "64"))
BLOCK_KB = int(os.environ.get("BLOCK_KB", "2048"))
ROUNDS = int(os.environ.get("ROUNDS", "5"))


def cpu_s(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main():
    tp.BLOCK = BLOCK_KB * 1024
    memory_mb = 2 * MAPS * BLOCK_KB // 1024 + 64
    if not shufflehosts.root_and_ip():
        sys.exit("needs root, iproute2 and the slipstream binary")
    with shufflehosts.two_hosts(memory_mb, BLOCK_KB) as (a, b, _ns):
        ca, reader = tp.Conn(a), tp.Conn(b)
        for c in (ca, tp.Conn(b)):
            assert c.ask("REGISTER bench 0 1\r\n") == "OK"
        seg = tp.BLOCK - 64
        payload = os.urandom(seg)
        for m in range(MAPS):
            tp.commit_map(a, ca, "bench", m, {0: payload})
        total = seg * MAPS
        rows = []
        for _ in range(ROUNDS):
            ca0, cb0, t0 = cpu_s(a.proc.pid), cpu_s(b.proc.pid), time.monotonic()
            got = reader.lines_to_end(reader.ask("LOOKUP bench 0 0\r\n"))
            dt = time.monotonic() - t0
            assert got[0] == "SEGMENTS %d" % MAPS, got[:2]
            ca1, cb1 = cpu_s(a.proc.pid), cpu_s(b.proc.pid)
            for blk in {line.split()[2] for line in got[1:-1]}:
                assert reader.ask("RELEASE %s\r\n" % blk) == "OK"
            gb = total / 1e9
            rows.append((gb / dt, (ca1 - ca0) / gb, (cb1 - cb0) / gb))
        print("segments: %d x %d bytes = %.1f MB per lookup; load %s" % (MAPS, seg, total / 1e6,
              open("/proc/loadavg").read().split()[:3]))
        print("| round | GB/s | sender CPU-s/GB | receiver CPU-s/GB |\n|---|---:|---:|---:|")
        for i, (rate, sa, sb) in enumerate(rows):
            print("| %d | %.2f | %.2f | %.2f |" % (i + 1, rate, sa, sb))
        med = sorted(rows)[len(rows) // 2]
        print("median GB/s %.2f" % med[0])


if __name__ == "__main__":
    main()
