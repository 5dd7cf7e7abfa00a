"""Helpers for the multi-tenant black-box tests (tests/test_tenancy.py).

For: writing a `slipstream serve --config FILE` with `[shaping]` and `[[tenant]]` tables on free
loopback ports, starting it and waiting until every port answers, killing it; raw memcached
bytes per tenant port (TCP and UDP); the admin HTTP endpoint; measuring a tenant's reply rate
with a pipelined get load ("hammer").
Not for: assertions about tenancy (the tests make those) or traffic outside 127.0.0.1.

Every socket has a timeout and every loop a bound or a deadline, so a hung server fails a test
instead of hanging the suite.
"""

import http.client
import json
import os
import re
import select
import signal
import socket
import struct
import subprocess
import threading
import time

import daemonlib
import mcwire

HOST = mcwire.HOST
ADMIN_TOKEN = "tenancy-test-token"
HTTP_TIMEOUT_S = 5.0
READ_BYTES_MAX = 64 * 1024 * 1024

UDP_HDR = struct.Struct(">HHHH")


# ------------------------------------------------------------------ config


def toml_value(v):
    """One TOML scalar. bool before int: bool is an int in Python."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        r = repr(v)
        return r if ("." in r or "e" in r) else r + ".0"
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid TOML basic string for our ASCII names
    raise TypeError("no TOML for %r" % (v,))


def render_config(server, shaping, tenants):
    """TOML text: [server] table, optional [shaping], one [[tenant]] per dict (keys in order)."""
    lines = ["[server]"]
    for k, v in server.items():
        lines.append("%s = %s" % (k, toml_value(v)))
    if shaping is not None:
        lines.append("")
        lines.append("[shaping]")
        for k, v in shaping.items():
            lines.append("%s = %s" % (k, toml_value(v)))
    for t in tenants:
        lines.append("")
        lines.append("[[tenant]]")
        for k, v in t.items():
            lines.append("%s = %s" % (k, toml_value(v)))
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ the daemon


class TenantDaemon(daemonlib.ConfigDaemon):
    """`slipstream serve --config FILE` with tenants on free ports.

    tenants: list of dicts, each a [[tenant]] table minus the ports; the key "udp": True asks
    for a udp_port (the same number as the tcp_port). Ports are picked here.
    shaping: the [shaping] table (None leaves it out).
    admin: start the admin endpoint on a free port; token: its admin_token (None leaves it out).
    plain_port: for a config without tenants, the [server] port (picked here when True).
    """

    what = "slipstream with tenants"
    file_prefix = "slipstream-tenancy-"

    def __init__(self, tenants, shaping=None, admin=True, token=ADMIN_TOKEN, threads=2,
                 plain_port=False, server_extra=None, args=None):
        super().__init__()
        self.args = list(args or [])  # command-line flags before --config (e.g. memcached's -M)
        self.tenant_args = [dict(t) for t in tenants]
        self.shaping = shaping
        self.admin_enabled = admin
        self.token = token
        self.threads = threads
        self.plain_port_wanted = plain_port
        self.server_extra = dict(server_extra or {})
        self.ports = {}       # tenant name -> tcp port
        self.udp_ports = {}   # tenant name -> udp port
        self.admin_port = None
        self.server_port = None

    # ---- start / stop (daemonlib.ConfigDaemon starts it)

    def _serve_args(self):
        return self.args

    def _pick_ports(self):
        self.ports, self.udp_ports = {}, {}
        taken = set()

        def fresh(both):
            for _ in range(100):
                p = mcwire.free_tcp_udp_port() if both else mcwire.free_port()
                if p not in taken:
                    taken.add(p)
                    return p
            raise RuntimeError("no free port")

        tenants = []
        for t in self.tenant_args:
            t = dict(t)
            want_udp = t.pop("udp", False)
            port = fresh(want_udp)
            spec = {"name": t.pop("name"), "tcp_port": port}
            if want_udp:
                spec["udp_port"] = port
                self.udp_ports[spec["name"]] = port
            spec.update(t)
            self.ports[spec["name"]] = port
            tenants.append(spec)
        self.admin_port = fresh(False) if self.admin_enabled else None
        # [server] port: a real free port, so a daemon that wrongly also listens on it does not
        # collide with anything (and the tests can check it stays closed with tenants).
        self.server_port = fresh(False)
        self.free_port_extra = fresh(False)  # a spare free port for tests that add a tenant
        server = {"listen": HOST, "threads": self.threads, "port": self.server_port}
        if self.admin_enabled:
            server["admin"] = "%s:%d" % (HOST, self.admin_port)
            if self.token is not None:
                server["admin_token"] = self.token
        server.update(self.server_extra)
        return render_config(server, self.shaping, tenants)

    def _log_path(self):
        log_dir = os.environ.get("MC_LOG_DIR", "/tmp")
        return os.path.join(log_dir, "mctest-tenancy-%d.log" % self.server_port)

    def _ready_ports(self):
        if self.ports:
            out = list(self.ports.values())
        else:
            out = [self.server_port]
        if self.admin_port:
            out.append(self.admin_port)
        return out

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self.remove_files()

    # ---- memcached side

    def connect(self, name_or_port, timeout=3.0):
        port = self.ports[name_or_port] if isinstance(name_or_port, str) else name_or_port
        s = socket.create_connection((HOST, port), timeout=timeout)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.settimeout(timeout)
        return s

    # ---- admin side

    def http(self, method, path, body=None, token="default", headers=None):
        """One admin request. token: "default" = this daemon's token, None = no header, or a
        string sent as the bearer token. Returns an HttpReply."""
        return http_request(self.admin_port, method, path, body=body,
                            token=self.token if token == "default" else token, headers=headers)

    def tenants_raw(self):
        r = self.http("GET", "/tenants")
        assert r.status == 200, "GET /tenants: %s %r" % (r.status, r.body[:300])
        return r.body

    def quiet_tenants_raw(self, max_s=5.0):
        """GET /tenants once no tenant has requests in flight. `outstanding` is a live gauge: a
        worker lowers it just after its write returns, so a client that has its reply can still
        see the old value for a moment."""
        deadline = time.monotonic() + max_s
        while True:
            body = self.tenants_raw()
            if all(v.get("outstanding", 0) == 0 for v in json.loads(body)) or time.monotonic() > deadline:
                return body
            time.sleep(0.02)

    def tenants(self):
        """name -> view dict."""
        views = json.loads(self.tenants_raw())
        assert isinstance(views, list), views
        return {v["name"]: v for v in views}

    def metrics(self):
        r = self.http("GET", "/metrics")
        assert r.status == 200, "GET /metrics: %s %r" % (r.status, r.body[:300])
        return r.body.decode("utf-8", "replace")


# ------------------------------------------------------------------ HTTP


class HttpReply:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers  # lower-case name -> value
        self.body = body

    def json(self):
        return json.loads(self.body)

    def __repr__(self):
        return "HttpReply(%d, %r)" % (self.status, self.body[:300])


def http_request(port, method, path, body=None, token=None, headers=None):
    hdrs = {}
    if token is not None:
        hdrs["Authorization"] = "Bearer %s" % token
    if body is not None:
        if not isinstance(body, (bytes, bytearray)):
            body = json.dumps(body).encode()
        hdrs["Content-Type"] = "application/json"
    hdrs.update(headers or {})
    conn = http.client.HTTPConnection(HOST, port, timeout=HTTP_TIMEOUT_S)
    try:
        conn.request(method, path, body=body, headers=hdrs)
        resp = conn.getresponse()
        data = resp.read(READ_BYTES_MAX)
        return HttpReply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, data)
    finally:
        conn.close()


def http_raw(port, raw, max_s=HTTP_TIMEOUT_S):
    """Send raw request bytes; return (status or None, whole response bytes). Bounded."""
    with socket.create_connection((HOST, port), timeout=max_s) as s:
        s.sendall(raw)
        buf = bytearray()
        deadline = time.monotonic() + max_s
        while time.monotonic() < deadline and len(buf) < 1 << 20:
            s.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            except ConnectionResetError:
                break
            if not chunk:
                break
            buf += chunk
    m = re.match(rb"HTTP/1\.[01] (\d{3})", bytes(buf))
    return (int(m.group(1)) if m else None), bytes(buf)


# ------------------------------------------------------------------ metrics

METRIC_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def metric_value(text, name, tenant):
    """The value of `name{...tenant="tenant"...}` in Prometheus text, or None."""
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = METRIC_LINE.match(line)
        if not m or m.group(1) != name:
            continue
        labels = dict(LABEL.findall(m.group(2) or ""))
        if labels.get("tenant") == tenant:
            return float(m.group(3))
    return None


# ------------------------------------------------------------------ memcached bytes


def read_until(sock, suffix, max_s=10.0, bytes_max=READ_BYTES_MAX):
    """mcwire.read_until with this module's defaults."""
    return mcwire.read_until(sock, suffix, max_s=max_s, bytes_max=bytes_max)


def read_exact(sock, n, max_s=10.0):
    buf = bytearray()
    deadline = time.monotonic() + max_s
    while len(buf) < n and time.monotonic() < deadline:
        sock.settimeout(max(0.01, min(1.0, deadline - time.monotonic())))
        try:
            chunk = sock.recv(min(1 << 20, n - len(buf)))
        except socket.timeout:
            continue
        except (ConnectionResetError, BrokenPipeError):
            break
        if not chunk:
            break
        buf += chunk
    return bytes(buf)


def ask(sock, data, suffix, max_s=10.0):
    """Send a request and read its reply up to `suffix`."""
    sock.sendall(data)
    return read_until(sock, suffix, max_s=max_s)


def gets(sock, key, max_s=10.0):
    """(value, cas) or None, with `gets` on this connection."""
    return parse_gets_one(ask(sock, b"gets %s\r\n" % key, b"END\r\n", max_s=max_s))


def get_reply(key, value, flags=0):
    return b"VALUE %s %d %d\r\n%s\r\nEND\r\n" % (key, flags, len(value), value)


def set_cmd(key, value, flags=0, noreply=False):
    return b"set %s %d 0 %d%s\r\n%s\r\n" % (key, flags, len(value), b" noreply" if noreply else b"", value)


def stats(daemon_or_port, name=None, max_s=5.0):
    """`stats` on a tenant port -> dict of str -> str."""
    if isinstance(daemon_or_port, int):
        s = socket.create_connection((HOST, daemon_or_port), timeout=3.0)
    else:
        s = daemon_or_port.connect(name)
    with s:
        data = ask(s, b"stats\r\n", b"END\r\n", max_s=max_s)
    out = mcwire.parse_stats(data)
    assert out, "no stats reply: %r" % data[:200]
    return out


def multi_get_check(sock, items, chunk_keys=100, max_s=20.0):
    """Fetch every (key, value) with multi-gets; return the keys that were missing or wrong."""
    bad = []
    for i in range(0, len(items), chunk_keys):
        part = items[i:i + chunk_keys]
        data = ask(sock, b"get " + b" ".join(k for k, _ in part) + b"\r\n", b"END\r\n", max_s=max_s)
        got = parse_values(data)
        for k, v in part:
            if got.get(k) != v:
                bad.append(k)
    return bad


def parse_values(data):
    """`VALUE k f n\\r\\n<data>\\r\\n ... END\\r\\n` -> {key: data} (bounded by the input)."""
    out = {}
    pos = 0
    while pos < len(data):
        eol = data.find(b"\r\n", pos)
        if eol < 0:
            break
        line = data[pos:eol]
        if line == b"END":
            break
        parts = line.split(b" ")
        if len(parts) < 4 or parts[0] != b"VALUE":
            break
        n = int(parts[3])
        out[parts[1]] = data[eol + 2:eol + 2 + n]
        pos = eol + 2 + n + 2
    return out


def parse_gets_one(reply):
    """A one-key `gets` reply -> (value, cas), or None for `END` alone; asserts it is one."""
    if reply == b"END\r\n":
        return None
    head, rest = reply.split(b"\r\n", 1)
    parts = head.split()
    assert parts[0] == b"VALUE", reply
    return rest[: int(parts[3])], int(parts[4])


def port_refuses(port, max_s=2.0):
    """True once a TCP connect to port is refused (retried until max_s)."""
    deadline = time.monotonic() + max_s
    while True:
        try:
            s = socket.create_connection((HOST, port), timeout=0.5)
        except ConnectionRefusedError:
            return True
        except OSError:
            return True
        else:
            s.close()
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


# ------------------------------------------------------------------ UDP


def udp_frame(req_id, payload, seq=0, total=1):
    return UDP_HDR.pack(req_id, seq, total, 0) + payload


def udp_exchange(port, req_id, payload, quiet_s=0.3, datagrams_max=200):
    """One request datagram; the reply datagrams' payloads in seq order (headers checked)."""
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        u.settimeout(quiet_s)
        u.sendto(udp_frame(req_id, payload), (HOST, port))
        got = []
        for _ in range(datagrams_max):
            try:
                d, _ = u.recvfrom(65536)
            except socket.timeout:
                break
            got.append(d)
    finally:
        u.close()
    parts = []
    for d in got:
        assert len(d) >= 8, "short datagram %r" % d
        rid, seq, total, _res = UDP_HDR.unpack(d[:8])
        assert rid == req_id, "request id %d echoed as %d" % (req_id, rid)
        assert total == len(got), "total %d but %d datagrams" % (total, len(got))
        parts.append((seq, d[8:]))
    return b"".join(p for _, p in sorted(parts))


# ------------------------------------------------------------------ load


class GetHammer(threading.Thread):
    """Pipelined `get KEY` on one connection, keeping at most window_bytes of replies
    outstanding, counting reply bytes and checking every byte against the expected reply.

    snapshot() -> (monotonic seconds, reply bytes so far). stop() stops sending, drains what is
    outstanding (bounded) and leaves the connection open in .sock for the caller (then close()).
    """

    def __init__(self, port, key, value, window_bytes=128 * 1024, batch=16, deadline_s=60.0):
        super().__init__(daemon=True)
        self.port = port
        self.key = key
        self.reply = get_reply(key, value)
        self.request = b"get %s\r\n" % key
        self.window_bytes = max(window_bytes, len(self.reply) * batch)
        self.batch = batch
        self.deadline_s = deadline_s
        self.lock = threading.Lock()
        self.received = 0
        self.sent_requests = 0
        self.error = None
        self.drained = False
        self._halt = threading.Event()
        reps = (65536 * 2) // len(self.reply) + 2
        self._cycle = self.reply * reps
        self.sock = socket.create_connection((HOST, port), timeout=3.0)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def snapshot(self):
        with self.lock:
            return time.monotonic(), self.received

    def _check(self, chunk):
        pos = self.received % len(self.reply)
        off = 0
        while off < len(chunk):
            n = min(len(chunk) - off, 65536)
            if chunk[off:off + n] != self._cycle[pos:pos + n]:
                raise AssertionError("reply stream diverges at byte %d: %r"
                                     % (self.received + off, bytes(chunk[off:off + 80])))
            pos = (pos + n) % len(self.reply)
            off += n

    def run(self):
        s = self.sock
        s.setblocking(False)
        out = b""
        deadline = time.monotonic() + self.deadline_s
        batch_bytes = self.request * self.batch
        try:
            while time.monotonic() < deadline:
                stopping = self._halt.is_set()
                outstanding = self.sent_requests * len(self.reply) - self.received
                if stopping and not out and outstanding == 0:
                    self.drained = True
                    return
                if not stopping and not out and outstanding + len(batch_bytes) // len(self.request) * len(self.reply) <= self.window_bytes:
                    out = batch_bytes
                    self.sent_requests += self.batch
                want_w = [s] if out else []
                r, w, _ = select.select([s], want_w, [], 0.05)
                if w and out:
                    try:
                        k = s.send(out)
                        out = out[k:]
                    except BlockingIOError:
                        pass
                if r:
                    try:
                        chunk = s.recv(262144)
                    except BlockingIOError:
                        continue
                    if not chunk:
                        raise ConnectionError("server closed the connection")
                    self._check(chunk)
                    with self.lock:
                        self.received += len(chunk)
            if self._halt.is_set():
                raise TimeoutError("replies not drained before the deadline")
        except Exception as e:  # reported to the test through .error
            self.error = e
        finally:
            try:
                s.setblocking(True)
                s.settimeout(3.0)
            except OSError:
                pass

    def stop(self, max_s=10.0):
        self._halt.set()
        self.join(max_s)
        return self.drained

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def measure_rate(hammer, seconds):
    """Reply bytes/s of a running hammer over the next `seconds`."""
    t0, b0 = hammer.snapshot()
    time.sleep(seconds)
    t1, b1 = hammer.snapshot()
    return (b1 - b0) / (t1 - t0)


def prefill(daemon, name, key, value):
    with daemon.connect(name) as s:
        r = ask(s, set_cmd(key, value), b"\r\n")
        assert r == b"STORED\r\n", "prefill %s on %s: %r" % (key, name, r)
