"""One `slipstream serve ... --config FILE` process for the black-box tests that need a config
file (tests/tenantlib.py's TenantDaemon, tests/test_stream.py's StreamDaemon).

For: the start-up they share — pick free loopback ports and render the config (the subclass),
write it to a temporary file, start the binary with its output in a log, wait until every port
it should open accepts, retry with fresh ports when one was taken between probe and bind — and
reading the log's tail, checking it is alive, removing its files.
Not for: what goes in the config or any traffic. `stop_group` is the one way the tests stop a
process they started in a session of its own (SIGTERM, then SIGKILL after a bounded wait).
"""

import os
import signal
import socket
import subprocess
import tempfile
import time

import mcwire

HOST = mcwire.HOST
START_TIMEOUT_S = 10.0
START_ATTEMPTS = 3


def stop_group(proc, term_wait_s=5.0):
    """Stops `proc` (started with start_new_session) and its process group: SIGTERM, then
    SIGKILL if it has not exited within `term_wait_s`. A process already gone is fine."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=term_wait_s)
        return
    except (subprocess.TimeoutExpired, ProcessLookupError):
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)


class ConfigDaemon:
    """Subclasses set `what` (for the start-up error) and `file_prefix`, and implement
    `_pick_ports()` (choose ports, return the config text), `_ready_ports()` (ports that must
    accept before the daemon counts as started) and `stop()`; `_serve_args()` adds arguments
    before `--config`, `_log_path()` chooses where the log goes."""

    what = "slipstream"
    file_prefix = "slipstream-"

    def __init__(self):
        self.proc = None
        self.config_text = None
        self.config_path = None
        self.log_path = None

    def _serve_args(self):
        return []

    def _log_path(self):
        return self.config_path[:-5] + ".log"

    def start(self):
        if not mcwire.slipstream_available():
            raise RuntimeError("slipstream binary not built: %s" % mcwire.SLIPSTREAM_BIN)
        last = None
        for _attempt in range(START_ATTEMPTS):  # a port may be taken between probe and bind
            self.config_text = self._pick_ports()
            fd, self.config_path = tempfile.mkstemp(prefix=self.file_prefix, suffix=".toml")
            with os.fdopen(fd, "w") as f:
                f.write(self.config_text)
            self.log_path = self._log_path()
            log = open(self.log_path, "wb")
            try:
                self.proc = subprocess.Popen(
                    [mcwire.SLIPSTREAM_BIN, "serve"] + self._serve_args() + ["--config", self.config_path],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                )
            finally:
                log.close()
            try:
                self._wait_ready()
                return self
            except RuntimeError as e:
                last = "%s\nconfig:\n%s\nlog:\n%s" % (e, self.config_text, self.log_tail())
                self.stop()
        raise RuntimeError("%s did not start: %s" % (self.what, last))

    def _wait_ready(self):
        deadline = time.monotonic() + START_TIMEOUT_S
        pending = list(self._ready_ports())
        while pending:
            if self.proc.poll() is not None:
                raise RuntimeError("exited with %s" % self.proc.returncode)
            if time.monotonic() >= deadline:
                raise RuntimeError("ports %r not accepting after %.0fs" % (pending, START_TIMEOUT_S))
            try:
                s = socket.create_connection((HOST, pending[0]), timeout=0.5)
                s.close()
                pending.pop(0)
            except OSError:
                time.sleep(0.02)

    def log_tail(self, n_bytes=3000):
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-n_bytes:].decode("utf-8", "replace")
        except (OSError, TypeError):
            return ""

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def remove_files(self):
        """The temporary config and log go with the daemon (at teardown: a failure has already
        quoted the log's tail)."""
        for path in (self.config_path, self.log_path):
            if path:
                try:
                    os.unlink(path)
                except OSError:
                    pass
