"""HBase for the black-box tests: the in-process mini cluster (connectors/hbase, one JVM with
ZooKeeper + master + region servers + the sidecar), a sidecar alone in its own JVM (as in front of
a real cluster), a small client of the sidecar protocol (docs/hbase-sidecar-protocol.md) used as
the native-client oracle and for direct writes, a Slipstream daemon with an `[hbase]` table in
front of it, and the randomized mixed-writers workload the stale-read tests run.

For: starting/stopping those processes (the JVMs are always killed at teardown), reading HBase
directly, running workloads and reporting what they saw. Not for: assertions
(tests/test_hbase.py, tests/test_hbase_cluster.py).
"""

import os
import queue
import random
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
import time

import mcwire
import tenantlib
from daemonlib import ConfigDaemon, stop_group

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN_SH = os.path.join(ROOT, "connectors", "hbase", "bin", "run.sh")
MINI_START_TIMEOUT_S = float(os.environ.get("HBASE_START_TIMEOUT_S", "180"))
TS_LATEST = (1 << 63) - 1


def mini_available():
    return os.path.exists(os.path.join(ROOT, "connectors", "hbase", "target", "classpath.txt"))


class MiniHBase:
    """`run.sh mini`: prints READY sidecar=PORT zk=... start_ms=... heap_used_mb=... pid=...
    `extra` adds arguments (e.g. `--region-servers 2 --observer-port 0`); `command()` sends one
    of the mini cluster's stdin commands (`rs-start`, `rs-stop`) and returns its answer line."""

    mode = "mini"
    what = "HBase mini cluster"

    #: Prefix of the command line (e.g. `ip netns exec NS` to run the JVM in a network namespace).
    wrap = ()

    def __init__(self, sidecar_port=0, extra=()):
        self.proc = None
        self.dir = None
        self.info = {}
        self.log_path = None
        self.want_port = sidecar_port
        self.extra = list(extra)
        self.lines = queue.Queue()

    def _args(self):
        return ["--sidecar-port", str(self.want_port), "--dir", os.path.join(self.dir, "data")] + self.extra

    def start(self):
        self.dir = tempfile.mkdtemp(prefix="slipstream-hbase-")
        self.log_path = os.path.join(self.dir, "jvm.log")
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            list(self.wrap) + [RUN_SH, self.mode] + self._args(),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, start_new_session=True,
        )
        log.close()
        line = [None]
        ready = threading.Event()

        def reader():
            for raw in self.proc.stdout:
                if raw.startswith(b"READY ") and line[0] is None:
                    line[0] = raw.decode().split()
                    ready.set()
                else:
                    self.lines.put(raw.decode("utf-8", "replace").strip())
            ready.set()

        threading.Thread(target=reader, daemon=True).start()
        ready.wait(MINI_START_TIMEOUT_S)
        if line[0] is None:
            tail = self.log_tail()
            self.stop()
            raise RuntimeError("%s did not start in %.0fs:\n%s" % (self.what, MINI_START_TIMEOUT_S, tail))
        self.info = dict(kv.split("=", 1) for kv in line[0][1:])
        self.sidecar_port = int(self.info["sidecar"])
        return self

    def command(self, cmd, timeout_s=120):
        self.proc.stdin.write(cmd.encode() + b"\n")
        self.proc.stdin.flush()
        answer = self.lines.get(timeout=timeout_s)
        if not answer.startswith("OK "):
            raise RuntimeError("%s: %s" % (cmd, answer))
        return answer

    def log_tail(self, n=3000):
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-n:].decode("utf-8", "replace")
        except OSError:
            return ""

    def rss_mb(self):
        try:
            with open("/proc/%d/status" % int(self.info["pid"])) as f:
                for l in f:
                    if l.startswith("VmRSS:"):
                        return int(l.split()[1]) // 1024
        except (OSError, KeyError, ValueError):
            pass
        return None

    def stop(self):
        stop_group(self.proc, term_wait_s=20)
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


class SidecarJvm(MiniHBase):
    """`run.sh sidecar --zk ZK`: the sidecar alone in its own JVM, in front of the cluster whose
    ZooKeeper is ZK (it finds the region servers' observers there), as on a real cluster."""

    mode = "sidecar"
    what = "HBase sidecar"

    def __init__(self, zk, extra=()):
        super().__init__(0, extra)
        self.zk = zk

    def _args(self):
        return ["--zk", self.zk, "--port", "0"] + self.extra


class RegionServerJvm(MiniHBase):
    """`run.sh rs`: one region server alone in its own JVM (in network namespace `netns` if
    given), joining the mini cluster `mini` (started with `--advertise-host`) through ZooKeeper
    at `zk`; named by and listening on `host`, its observer reporting over TCP on `host`."""

    mode = "rs"
    what = "HBase region server"

    def __init__(self, mini, zk, host, netns=None):
        super().__init__(0, ())
        self.mini, self.zk, self.host = mini, zk, host
        if netns:
            self.wrap = ("ip", "netns", "exec", netns)

    def _args(self):
        args = ["--zk", self.zk, "--rootdir", self.mini.info["rootdir"], "--advertise-host", self.host,
                "--observer-port", "0"]
        if "waldir" in self.mini.info:
            args += ["--waldir", self.mini.info["waldir"]]
        return args


# --- the sidecar protocol, client side (one request at a time) ---

OP = dict(PING=1, LIST_TABLES=2, DESCRIBE=3, CREATE_TABLE=4, DELETE_TABLE=5, ENABLE_TABLE=6,
          DISABLE_TABLE=7, IS_ENABLED=8, GET=0x10, SCAN=0x11, MUTATE=0x12, DELETE=0x13, INCREMENT=0x14)


class SidecarError(Exception):
    def __init__(self, status, message):
        super().__init__("status %d: %s" % (status, message))
        self.status = status


def _b(v):
    return struct.pack(">I", len(v)) + v


def _blist(vs):
    return struct.pack(">I", len(vs)) + b"".join(_b(v) for v in vs)


def _spec(columns=(), ts_min=0, ts_max=TS_LATEST, versions=1):
    return _blist(list(columns)) + struct.pack(">qqi", ts_min, ts_max, versions)


class _Dec:
    def __init__(self, b):
        self.b, self.i = b, 0

    def take(self, n):
        v = self.b[self.i:self.i + n]
        self.i += n
        return v

    def u32(self):
        return struct.unpack(">I", self.take(4))[0]

    def i64(self):
        return struct.unpack(">q", self.take(8))[0]

    def bytes(self):
        return self.take(self.u32())

    def rows(self):
        out = []
        for _ in range(self.u32()):
            row = self.bytes()
            cells = []
            for _ in range(self.u32()):
                fam, qual, ts, val = self.bytes(), self.bytes(), self.i64(), self.bytes()
                cells.append((fam, qual, ts, val))
            out.append((row, cells))
        return out


class Sidecar:
    """Talks to the sidecar directly: the "native client" oracle and the bypassing writer."""

    def __init__(self, port):
        self.sock = socket.create_connection((mcwire.HOST, port), timeout=30)
        self.next_id = 1

    def close(self):
        self.sock.close()

    def call(self, op, payload=b""):
        rid = self.next_id
        self.next_id += 1
        body = struct.pack(">IB", rid, OP[op]) + payload
        self.sock.sendall(struct.pack(">I", len(body)) + body)
        hdr = self._read(4)
        body = self._read(struct.unpack(">I", hdr)[0])
        got_id, status = struct.unpack(">IB", body[:5])
        assert got_id == rid
        if status != 0:
            raise SidecarError(status, _Dec(body[5:]).bytes().decode("utf-8", "replace"))
        return _Dec(body[5:])

    def _read(self, n):
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("sidecar closed")
            buf += chunk
        return buf

    def get(self, table, rows, columns=(), versions=1, ts_max=TS_LATEST):
        return self.call("GET", _b(table) + _blist(rows) + _spec(columns, 0, ts_max, versions)).rows()

    def scan(self, table, start=b"", stop=b"", columns=(), ts_max=TS_LATEST, filter=b""):
        out, start_key = [], start
        for _ in range(10_000):
            d = self.call("SCAN", _b(table) + _b(start_key) + _b(stop) + _spec(columns, 0, ts_max) + _b(filter)
                          + struct.pack(">ii", 1000, 4 << 20))
            page = d.rows()
            more = d.take(1) == b"\x01"
            out.extend(page)
            if not more:
                return out
            start_key = page[-1][0] + b"\x00"
        raise RuntimeError("scan did not end")

    def put(self, table, row, values, ts=TS_LATEST):
        muts = b"".join(struct.pack(">B", 0) + _b(c) + _b(v) + b"\x01" for c, v in values.items())
        payload = _b(table) + struct.pack(">I", 1) + _b(row) + struct.pack(">I", len(values)) + muts
        self.call("MUTATE", payload + struct.pack(">qB", ts, 0))

    def mutate_rows(self, table, rows, ts=TS_LATEST):
        """One MUTATE of several rows ({row: {column: value or None (= delete)}}), puts first."""
        payload = _b(table) + struct.pack(">I", len(rows))
        for row, values in rows.items():
            payload += _b(row) + struct.pack(">I", len(values))
            for c, v in values.items():
                payload += struct.pack(">B", 1 if v is None else 0) + _b(c) + _b(v or b"") + b"\x01"
        self.call("MUTATE", payload + struct.pack(">qB", ts, 1))

    def delete_row(self, table, row, ts=TS_LATEST):
        self.call("DELETE", _b(table) + _b(row) + _b(b"") + struct.pack(">q", ts))

    def delete_column(self, table, row, column, ts=TS_LATEST):
        self.call("DELETE", _b(table) + _b(row) + _b(column) + struct.pack(">q", ts))

    def increment(self, table, row, column, amount=1):
        return self.call("INCREMENT", _b(table) + _b(row) + _b(column) + struct.pack(">q", amount)).i64()


def counter(d, name, table=None):
    """Sum of daemon `d`'s slipstream_hbase_<name> series (of one table if given)."""
    total = 0.0
    for l in d.metrics().splitlines():
        if l.startswith("slipstream_hbase_%s" % name) and l[len("slipstream_hbase_%s" % name)] in " {":
            if table is None or ('table="%s"' % table.decode()) in l:
                total += float(l.split()[-1])
    return total


def as_happybase_row(cells):
    """A sidecar row's cells as happybase's row dict (newest version of each column)."""
    d = {}
    for fam, qual, _ts, val in cells:
        d.setdefault(fam + b":" + qual, val)
    return d


class HbaseDaemon(ConfigDaemon):
    """Slipstream with a memcached port (required) and `[hbase]` in front of `sidecar_port`."""

    what = "slipstream (hbase)"
    file_prefix = "slipstream-hbase-"

    def __init__(self, sidecar_port, strategy="all-row", memory_mb=64, timeout_ms=5000):
        super().__init__()
        self.sidecar_port, self.strategy, self.memory_mb, self.timeout_ms = sidecar_port, strategy, memory_mb, timeout_ms

    def _pick_ports(self):
        self.mc_port = mcwire.free_port()
        self.thrift_port = mcwire.free_port()
        self.admin_port = mcwire.free_port()
        return (
            "[server]\nport = %d\nudp_port = 0\nlisten = \"127.0.0.1\"\nadmin = \"127.0.0.1:%d\"\n"
            "[hbase]\nthrift_port = %d\nsidecar = \"127.0.0.1:%d\"\nstrategy = \"%s\"\nmemory_mb = %d\ntimeout_ms = %d\n"
            % (self.mc_port, self.admin_port, self.thrift_port, self.sidecar_port, self.strategy, self.memory_mb, self.timeout_ms)
        )

    def _ready_ports(self):
        return [self.mc_port, self.thrift_port]

    def metrics(self):
        s = socket.create_connection((mcwire.HOST, self.admin_port), timeout=5)
        s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        buf = b""
        while True:
            c = s.recv(65536)
            if not c:
                break
            buf += c
        s.close()
        return buf.decode("utf-8", "replace")

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.remove_files()


class TenantHbaseDaemon(tenantlib.TenantDaemon):
    """Tenants (tenantlib.TenantDaemon) with `[hbase]` in front of `sidecar_port`; a tenant dict
    with "thrift": True gets a `thrift_port` (picked here, in `thrift_ports[name]`)."""

    what = "slipstream with tenants and [hbase]"

    def __init__(self, sidecar_port, tenants, strategy="all-row", **kw):
        super().__init__(tenants, **kw)
        self.sidecar_port, self.strategy = sidecar_port, strategy
        self.thrift_ports = {}

    def _pick_ports(self):
        self.thrift_ports = {}
        asked = self.tenant_args
        self.tenant_args = []
        for t in asked:
            t = dict(t)
            if t.pop("thrift", False):
                t["thrift_port"] = self.thrift_ports[t["name"]] = mcwire.free_port()
            self.tenant_args.append(t)
        try:
            text = super()._pick_ports()
        finally:
            self.tenant_args = asked
        return text + '\n[hbase]\nsidecar = "127.0.0.1:%d"\nstrategy = "%s"\ntimeout_ms = 5000\n' % (
            self.sidecar_port, self.strategy)

    def _ready_ports(self):
        return super()._ready_ports() + list(self.thrift_ports.values())


def mixed_writers(table_s, table_r, direct, name, rows, seed, seconds=6.0, writes_each=600, columns=(b"cf1",),
                  errors_max=0):
    """Randomized (seeded) workload behind the stale-read tests: one writer through Slipstream
    (happybase `table_s`: puts, batches, row deletes), one straight to HBase through the native
    client (`direct`, a `Sidecar`: puts, multi-row batches, row deletes), and a reader (happybase
    `table_r`) doing Gets and scans over overlapping ranges of `rows`, for `seconds`. Every write
    carries timestamp BASE + n for a global op number n, so HBase orders versions by n: after op n
    on a row is acknowledged, no read begun later may show that row older than n. Returns
    (stale, counts, reads): stale reads as (row, seen, acknowledged), writes per writer (and
    writer errors under "errors", reader errors under "read_errors"), reads done. A writer or
    the reader stops at its first error unless `errors_max` allows more each (regions moving: a
    request may fail and the next succeed); a failed write counts as unacknowledged and a failed
    read checks nothing, which can only make the check weaker, never wrong."""
    rnd = random.Random(seed)
    srnd, drnd = random.Random(seed + 1), random.Random(seed + 2)
    base = int(time.time() * 1000)
    lock = threading.Lock()
    seq = [0]
    floor = {r: (-1, True) for r in rows}  # highest acknowledged op per row: (n, was a delete)
    max_del_issued = {r: -1 for r in rows}
    stop = threading.Event()
    stale = []
    counts = {"slipstream": 0, "direct": 0, "errors": [], "read_errors": []}

    def next_n():
        with lock:
            seq[0] += 1
            return seq[0]

    def acked(rs, n, is_delete):
        with lock:
            for r in rs:
                if n > floor[r][0]:
                    floor[r] = (n, is_delete)

    def one_op(rnd_, via_slipstream):
        n = next_n()
        ts, val = base + n, b"%08d" % n
        op = rnd_.random()
        if op < 0.55:
            r = rnd_.choice(rows)
            if via_slipstream:
                table_s.put(r, {b"cf1:v": val}, timestamp=ts)
            else:
                direct.put(name, r, {b"cf1:v": val}, ts=ts)
            acked([r], n, False)
        elif op < 0.8:
            rs = rnd_.sample(rows, 3)
            if via_slipstream:
                with table_s.batch(timestamp=ts) as b:
                    for r in rs:
                        b.put(r, {b"cf1:v": val})
            else:
                direct.mutate_rows(name, {r: {b"cf1:v": val} for r in rs}, ts=ts)
            acked(rs, n, False)
        else:
            r = rnd_.choice(rows)
            with lock:
                max_del_issued[r] = max(max_del_issued[r], n)
            if via_slipstream:
                table_s.delete(r, timestamp=ts)
            else:
                direct.delete_row(name, r, ts=ts)
            acked([r], n, True)

    def writer(rnd_, via_slipstream, key):
        for _ in range(writes_each):
            if stop.is_set():
                return
            try:
                one_op(rnd_, via_slipstream)
                counts[key] += 1
            except Exception as e:  # noqa: BLE001 - reported to the caller
                counts["errors"].append((key, repr(e)))
                if len(counts["errors"]) > errors_max:
                    return

    def one_read(r):
        """A Get or a scan around `r`: (row -> value seen, rows the read covered)."""
        if rnd.random() < 0.4:
            got = table_r.row(r, columns=list(columns))
            return ({r: int(got[b"cf1:v"])} if got else {}), [r]
        i = rows.index(r)
        lo, hi = max(0, i - rnd.randint(1, 4)), i + rnd.randint(1, 4)
        stop_row = rows[hi] if hi < len(rows) else None
        seen = {k: int(d[b"cf1:v"]) for k, d in table_r.scan(row_start=rows[lo], row_stop=stop_row,
                                                               columns=list(columns))}
        return seen, rows[lo:hi]

    threads = [threading.Thread(target=writer, args=(srnd, True, "slipstream")),
               threading.Thread(target=writer, args=(drnd, False, "direct"))]
    for th in threads:
        th.start()
    reads = 0
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline and any(th.is_alive() for th in threads):
            r = rnd.choice(rows)
            with lock:
                before = dict(floor)
            try:
                seen, covered = one_read(r)
            except Exception as e:  # noqa: BLE001 - reported to the caller
                counts["read_errors"].append(repr(e))
                if len(counts["read_errors"]) > errors_max:
                    raise
                continue
            with lock:
                dels = dict(max_del_issued)
            for k in covered:
                n, was_delete = before[k]
                if k in seen:
                    if seen[k] < n:
                        stale.append((k, seen[k], before[k]))
                elif not was_delete and dels[k] <= n:
                    stale.append((k, None, before[k]))  # absent, yet no delete could explain it
            reads += 1
    finally:
        stop.set()
        for th in threads:
            th.join(30)
    return stale, counts, reads
