"""The three misbehaving-client loads of issue 13 (item 2), shared by tests/test_memory_bound.py
and bench/mem_bench.py, and the RSS readings they are judged by.

For: driving a running memcached-compatible server (mcwire.Server) with
  (a) `nonreading_gets`: clients that send multi-gets of 1 MB values and never read;
  (b) `half_sent_sets`: clients that each leave a 1 MB `set` half-sent;
  (c) `mixed_sets`: GBs of sets of mixed sizes (1 KB..500 KB) through a small -m;
and reading the server's peak (VmHWM) and current (VmRSS) resident set from /proc.
Not for: asserting anything (the callers hold the bounds) or any traffic off 127.0.0.1.

Every loop is bounded in count and time; every socket has a timeout.
"""

import random
import socket
import threading
import time

import mcwire

MB = 1024 * 1024
VALUE_1MB_BYTES = 1000 * 1000


def proc_status_kb(pid, field):
    """A `Vm*:` field of /proc/PID/status in KiB (VmHWM = peak RSS, VmRSS = now)."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def peak_rss_mb(pid):
    return proc_status_kb(pid, "VmHWM") / 1024.0


def rss_mb(pid):
    return proc_status_kb(pid, "VmRSS") / 1024.0


_read_until = mcwire.read_until


def _fill(srv, keys, value):
    with srv.connect(timeout=10) as s:
        for k in keys:
            s.sendall(b"set %s 0 0 %d noreply\r\n" % (k, len(value)) + value + b"\r\n")
        s.sendall(b"mn\r\n")
        got = _read_until(s, b"MN\r\n")
        if not got.endswith(b"MN\r\n"):
            raise RuntimeError("fill did not finish: %r" % got[:200])


def _small_rcvbuf_connect(srv):
    # A small receive buffer on the client keeps the kernel from soaking up the replies: the
    # server's own buffers are what this load measures.
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(5)
    s.connect((mcwire.HOST, srv.port))
    return s


def nonreading_gets(srv, conns=60, keys=32, lines=2, hold_s=2.0):
    """(a) `keys` items of 1 MB, then `conns` clients each send `lines` get lines naming all of
    them and never read. Returns (sockets still open, first bytes one client could read)."""
    value = b"v" * VALUE_1MB_BYTES
    names = [b"big:%d" % j for j in range(keys)]
    _fill(srv, names, value)
    line = b"get " + b" ".join(names) + b"\r\n"
    socks = []
    for _ in range(conns):
        s = _small_rcvbuf_connect(srv)
        s.sendall(line * lines)
        socks.append(s)
    time.sleep(hold_s)
    # What the last client would see first (a VALUE line or memcached's out-of-memory line).
    socks[-1].settimeout(2)
    try:
        first = socks[-1].recv(64)
    except socket.timeout:
        first = b""
    return socks, first


def half_sent_sets(srv, conns=500, hold_s=2.0):
    """(b) `conns` clients each send a `set` of a 1 MB value and half of its data, then wait.
    Returns the open sockets."""
    half = b"h" * (VALUE_1MB_BYTES // 2)
    socks = []
    for j in range(conns):
        s = socket.create_connection((mcwire.HOST, srv.port), timeout=5)
        s.sendall(b"set half:%d 0 0 %d\r\n" % (j, VALUE_1MB_BYTES) + half)
        socks.append(s)
    time.sleep(hold_s)
    return socks


def _size_uniform(rnd):
    return rnd.randrange(1024, 500 * 1024)




def mixed_sets(srv, total_bytes=2 * 1024 * MB, conns=2, seed=None, time_max_s=40.0):
    """(c) `total_bytes` of `set ... noreply` with value sizes drawn from 1 KB..500 KB
    (uniform, seeded), over `conns` connections in parallel, keys cycling over a space
    several times -m. Returns (seed, bytes written, replies that were not empty)."""
    if seed is None:
        seed = random.randrange(1 << 30)
    pool = random.Random(seed).randbytes(512 * 1024)
    written = [0] * conns
    errors = [b""] * conns

    def worker(c):
        rnd = random.Random(seed * 31 + c)
        deadline = time.monotonic() + time_max_s
        with srv.connect(timeout=10) as s:
            batch = []
            batch_bytes = 0
            i = 0
            while written[c] < total_bytes // conns and time.monotonic() < deadline:
                size = _size_uniform(rnd)
                off = rnd.randrange(len(pool) - size)
                batch.append(b"set mix:%d:%d 0 0 %d noreply\r\n" % (c, i % 20000, size))
                batch.append(pool[off:off + size])
                batch.append(b"\r\n")
                batch_bytes += size
                i += 1
                if batch_bytes >= 4 * MB:
                    s.sendall(b"".join(batch))
                    written[c] += batch_bytes
                    batch, batch_bytes = [], 0
            s.sendall(b"".join(batch) + b"mn\r\n")
            written[c] += batch_bytes
            got = _read_until(s, b"MN\r\n", max_s=30)
            errors[c] = got[:-4] if got.endswith(b"MN\r\n") else got

    threads = [threading.Thread(target=worker, args=(c,)) for c in range(conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(time_max_s + 40)
    return seed, sum(written), b"".join(errors)


def close_all(socks):
    for s in socks:
        try:
            s.close()
        except OSError:
            pass
