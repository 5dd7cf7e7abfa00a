"""Harness for the black-box tests: start memcached-compatible servers, talk raw bytes.

For: starting `memcached` or `slipstream` on free loopback ports with identical
settings, sending byte sessions (whole or split), reading replies until the
server goes quiet, and killing every process we started.
Not for: protocol knowledge (that lives in the test tables) or any traffic
outside 127.0.0.1.

Every socket operation has a timeout and every loop has a bound, so a hung
server fails a test instead of hanging the suite.
"""

import os
import shutil
import signal
import socket
import struct
import subprocess
import time

HOST = "127.0.0.1"
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MEMCACHED_BIN = os.environ.get("MEMCACHED_BIN", "/usr/bin/memcached")
SLIPSTREAM_BIN = os.environ.get(
    "SLIPSTREAM_BIN", os.path.join(REPO_ROOT, "target", "release", "slipstream")
)

# Reading: a reply is complete when no new byte arrives for QUIET_S, or after
# READ_MAX_S in total, or on EOF.
QUIET_S = float(os.environ.get("MC_QUIET_MS", "150")) / 1000.0
READ_MAX_S = 2.0
START_TIMEOUT_S = 10.0
RECV_CHUNK_BYTES = 65536
READ_TOTAL_BYTES_MAX = 64 * 1024 * 1024

# memcached's binary protocol header: magic, opcode, key length, extras length, data type,
# vbucket/status, body length, opaque, cas.
BIN_HDR = struct.Struct(">BBHBBHIIQ")
BIN_REQUEST_MAGIC = 0x80
BIN_SET = 0x01


def free_port(kind=socket.SOCK_STREAM):
    """A loopback port that was free a moment ago (bind port 0, read it, close)."""
    s = socket.socket(socket.AF_INET, kind)
    try:
        s.bind((HOST, 0))
        return s.getsockname()[1]
    finally:
        s.close()


def free_tcp_udp_port():
    """A port free for both TCP and UDP (bounded tries)."""
    for _ in range(50):
        p = free_port(socket.SOCK_STREAM)
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            u.bind((HOST, p))
            return p
        except OSError:
            continue
        finally:
            u.close()
    raise RuntimeError("no port free for both TCP and UDP")


def slipstream_available():
    return os.path.isfile(SLIPSTREAM_BIN) and os.access(SLIPSTREAM_BIN, os.X_OK)


def memcached_available():
    return os.path.isfile(MEMCACHED_BIN) and os.access(MEMCACHED_BIN, os.X_OK)


class Server:
    """One running server process. `kind` is 'memcached' or 'slipstream'."""

    def __init__(self, kind, threads=2, mem_mb=64, conns=1024, item_size=None,
                 udp=False, extra=()):
        self.kind = kind
        self.threads = threads
        self.mem_mb = mem_mb
        self.conns = conns
        self.item_size = item_size
        self.udp = udp
        self.extra = list(extra)
        self.proc = None
        self.port = None
        self.udp_port = 0
        self.log_path = None

    def argv(self):
        common = [
            "-p", str(self.port),
            "-U", str(self.udp_port),
            "-l", HOST,
            "-t", str(self.threads),
            "-m", str(self.mem_mb),
            "-c", str(self.conns),
        ]
        if self.item_size is not None:
            common += ["-I", str(self.item_size)]
        if self.kind == "memcached":
            argv = [MEMCACHED_BIN] + common
            if os.geteuid() == 0:
                argv += ["-u", "root"]
            return argv + self.extra
        if self.kind == "slipstream":
            return [SLIPSTREAM_BIN, "serve"] + common + self.extra
        raise ValueError("unknown server kind %r" % self.kind)

    def start(self):
        last_err = None
        for _attempt in range(5):  # a port can be taken between probe and bind
            if self.udp:
                self.port = free_tcp_udp_port()
                self.udp_port = self.port
            else:
                self.port = free_port()
                self.udp_port = 0
            log_dir = os.environ.get("MC_LOG_DIR", "/tmp")
            self.log_path = os.path.join(log_dir, "mctest-%s-%d.log" % (self.kind, self.port))
            log = open(self.log_path, "wb")
            try:
                self.proc = subprocess.Popen(
                    self.argv(), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                    start_new_session=True,
                )
            finally:
                log.close()
            try:
                self._wait_accepting()
                return self
            except RuntimeError as e:
                last_err = e
                self.stop()
        raise RuntimeError("server %s did not start: %s\n%s" % (self.kind, last_err, self.log_tail()))

    def _wait_accepting(self):
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("exited with %s" % self.proc.returncode)
            try:
                s = socket.create_connection((HOST, self.port), timeout=0.5)
                s.close()
                return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError("not accepting after %.0fs" % START_TIMEOUT_S)

    def log_tail(self, n_bytes=2000):
        try:
            with open(self.log_path, "rb") as f:
                data = f.read()
            return data[-n_bytes:].decode("utf-8", "replace")
        except OSError:
            return ""

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def pid(self):
        return self.proc.pid

    def stop(self):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        try:
            if self.log_path and os.path.exists(self.log_path):
                os.unlink(self.log_path)
        except OSError:
            pass

    def connect(self, timeout=2.0):
        s = socket.create_connection((HOST, self.port), timeout=timeout)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.settimeout(timeout)
        return s

    def __repr__(self):
        return "<%s port=%s>" % (self.kind, self.port)


class Reply:
    """What a connection produced: the bytes, and whether the server closed it."""

    def __init__(self):
        self.data = bytearray()
        self.closed = False

    def __repr__(self):
        return "Reply(%r, closed=%s)" % (bytes(self.data), self.closed)


def read_until(sock, suffix=None, max_s=20.0, bytes_max=256 * 1024 * 1024, stop=None):
    """Read until the data ends with `suffix` (or `stop(data)` is true), `bytes_max` bytes
    arrived, the peer closed or reset, or `max_s` passed. Each recv waits at most 1 s (the
    socket's own timeout is restored afterwards), so the loop is bounded in time."""
    buf = bytearray()
    deadline = time.monotonic() + max_s
    old_timeout = sock.gettimeout()
    try:
        while time.monotonic() < deadline and len(buf) < bytes_max:
            if suffix is not None and buf.endswith(suffix):
                break
            if stop is not None and stop(buf):
                break
            sock.settimeout(max(0.01, min(1.0, deadline - time.monotonic())))
            try:
                chunk = sock.recv(1 << 20)
            except socket.timeout:
                continue
            except (ConnectionResetError, BrokenPipeError):
                break
            if not chunk:
                break
            buf += chunk
    finally:
        sock.settimeout(old_timeout)
    return bytes(buf)


def parse_stats(data):
    """A `stats` reply's STAT lines -> dict of str -> str."""
    out = {}
    for line in data.split(b"\r\n"):
        if line.startswith(b"STAT "):
            parts = line.split(b" ", 2)
            if len(parts) == 3:
                out[parts[1].decode()] = parts[2].decode()
    return out


def stat_map(sock, which=b"", max_s=5.0):
    """Sends `stats [which]` on sock and returns its STAT lines as a dict."""
    sock.sendall(b"stats" + (b" " + which if which else b"") + b"\r\n")
    return parse_stats(read_until(sock, b"END\r\n", max_s=max_s))


def talk(server, data, quiet_s=0.3, max_s=3.0):
    """One fresh connection to `server`: send `data`, read until quiet; the Reply."""
    s = server.connect()
    try:
        s.sendall(data)
        r = Reply()
        read_quiet(s, r, quiet_s=quiet_s, max_s=max_s)
        return r
    finally:
        s.close()


def read_quiet(sock, reply, quiet_s=None, max_s=READ_MAX_S, want_bytes=None):
    """Append to `reply` until no byte for quiet_s, max_s elapsed, or EOF.

    If want_bytes is given, stop as soon as that many bytes are in reply (then
    wait only a short extra quiet period to catch trailing surplus).
    """
    if quiet_s is None:
        quiet_s = QUIET_S
    if reply.closed:
        return reply
    start = time.monotonic()
    deadline = start + max_s
    last = start
    while True:
        now = time.monotonic()
        if now >= deadline or len(reply.data) > READ_TOTAL_BYTES_MAX:
            return reply
        wait = min(deadline - now, quiet_s - (now - last))
        if wait <= 0:
            return reply
        sock.settimeout(wait)
        try:
            chunk = sock.recv(RECV_CHUNK_BYTES)
        except socket.timeout:
            return reply
        except (ConnectionResetError, BrokenPipeError):
            reply.closed = True
            return reply
        if not chunk:
            reply.closed = True
            return reply
        reply.data += chunk
        last = time.monotonic()
        if want_bytes is not None and len(reply.data) >= want_bytes:
            quiet_s = min(quiet_s, 0.03)


def drain_nonblocking(sock, reply):
    """Take whatever is already readable, without waiting."""
    for _ in range(1000):
        if reply.closed:
            return
        sock.settimeout(0.0)
        try:
            chunk = sock.recv(RECV_CHUNK_BYTES)
        except (BlockingIOError, socket.timeout):
            return
        except (ConnectionResetError, BrokenPipeError):
            reply.closed = True
            return
        finally:
            sock.settimeout(2.0)
        if not chunk:
            reply.closed = True
            return
        reply.data += chunk


def send_all(sock, data, reply):
    """Send; on a closed peer, mark the reply closed instead of raising."""
    if reply.closed:
        return False
    try:
        sock.settimeout(2.0)
        sock.sendall(data)
        return True
    except (BrokenPipeError, ConnectionResetError):
        drain_nonblocking(sock, reply)
        reply.closed = True
        return False
    except socket.timeout:
        # The server stopped reading (e.g. it is closing); record what we have.
        return False


class Sleep:
    """A session step that waits (for expiry tests). Seconds, kept small."""

    def __init__(self, seconds):
        assert 0 <= seconds <= 3
        self.seconds = seconds

    def __repr__(self):
        return "Sleep(%s)" % self.seconds


def run_session(server, steps, split=None, byte_delay_s=0.001, quiet_s=None):
    """Send each step on one connection and collect everything the server says.

    steps: list of bytes, Sleep, or callables taking the reply bytes so far and
    returning the bytes to send (for CAS tokens learnt mid-session). After each
    sending step we read until quiet.
    split: None (each step in one send), 'bytes' (one send per byte), or a
    callable step_bytes -> sorted cut offsets inside that step.
    """
    sock = server.connect()
    reply = Reply()
    try:
        for step in steps:
            if isinstance(step, Sleep):
                time.sleep(step.seconds)
                continue
            if callable(step):
                step = step(bytes(reply.data))
            if split is None:
                send_all(sock, step, reply)
            else:
                if split == "bytes":
                    cuts = list(range(1, len(step)))
                else:
                    cuts = [c for c in split(step) if 0 < c < len(step)]
                prev = 0
                for c in cuts + [len(step)]:
                    if not send_all(sock, step[prev:c], reply):
                        break
                    prev = c
                    if c < len(step):
                        time.sleep(byte_delay_s)
                        drain_nonblocking(sock, reply)
            read_quiet(sock, reply, quiet_s=quiet_s)
            if reply.closed:
                break
    finally:
        sock.close()
    return reply


def kill_quietly(servers):
    for s in servers:
        try:
            s.stop()
        except Exception:  # teardown must not mask the real failure
            pass


def bin_request(opcode, key=b"", extras=b"", value=b"", opaque=0, cas=0):
    """One binary-protocol request's bytes."""
    body = extras + key + value
    return BIN_HDR.pack(BIN_REQUEST_MAGIC, opcode, len(key), len(extras), 0, 0, len(body), opaque, cas) + body


def bin_set(key, value, opaque=0, flags=0, exptime=0):
    return bin_request(BIN_SET, key, struct.pack(">II", flags, exptime), value, opaque)


def which(name):
    return shutil.which(name)
