"""An application's end reaches every host's daemon, and a driver's host that goes silent is
noticed (crates/shuffle: forward.rs, and the DRIVER connection's TCP keepalive in server.rs),
black-box on the real binary.

- Two daemons naming each other in `[shuffle] peers` (on loopback) plus a peer that is not
  there: UNREGISTER, UNREGISTER_APP and a driver connection's end, said to one daemon, free the
  application's blocks on both; the answer does not wait for the dead peer; the daemon that got
  the lines marked PEER passes nothing on (no bouncing between peers).
- A driver connection from a second "host" (a network namespace behind a veth pair, the
  daemon here) whose link then goes down: no FIN or RST ever arrives, and keepalive
  (`driver_keepalive_s = 1`, 2 probes: 3 s) ends the connection and frees the application;
  before that, a healthy idle driver link outlives several keepalive periods. Needs root.
- A refused DRIVER keeps the connection's idle timeout; an accepted one lifts it.

Every wait is bounded; daemons, the namespace and the veth go even on failure.
"""

import socket
import subprocess
import sys
import time

import pytest

import mcwire
import shufflehosts
from test_shuffle import Conn
from test_shuffle_driver import NoKeepShuffleDaemon, blocks_in_use_becomes, commit, gauge

#: Longest a PEER line may take to be applied on a live peer (s).
FORWARD_WAIT_S = 10.0
#: The driver keepalive of the namespace test: 1 s of silence, then 2 probes 1 s apart.
KEEPALIVE = "driver_keepalive_s = 1\ndriver_keepalive_probes = 2\n"
KEEPALIVE_DEAD_AFTER_S = 3.0


class PeerDaemon(NoKeepShuffleDaemon):
    """A daemon on a port chosen before it starts, naming `peers` (ports on loopback)."""

    def __init__(self, port, peers, extra=""):
        super().__init__(memory_mb=1)
        self.fixed_port, self.peers, self.extra = port, peers, extra

    def _pick_ports(self):
        peers = ", ".join('"%s:%d"' % (mcwire.HOST, p) for p in self.peers)
        return super()._pick_ports() + "peers = [%s]\npeer_timeout_ms = 2000\n%s" % (peers, self.extra)


def becomes(read, want, wait_s=FORWARD_WAIT_S):
    """Polls `read()` (bounded) until it returns `want`; returns the last value read."""
    deadline = time.monotonic() + wait_s
    got = read()
    while got != want and time.monotonic() < deadline:
        time.sleep(0.02)
        got = read()
    return got


@pytest.fixture
def peers():
    if not mcwire.slipstream_available():
        pytest.skip("slipstream binary not built: %s" % mcwire.SLIPSTREAM_BIN)
    pa, pb, dead = mcwire.free_port(), mcwire.free_port(), mcwire.free_port()
    a, b = PeerDaemon(pa, [pb, dead]), PeerDaemon(pb, [pa])
    try:
        a.start()
        b.start()
        yield a, b
    finally:
        for d in (a, b):
            d.remove()


def commit_on_both(ea, eb, app, shuffle):
    """Map 0 of (app, shuffle) committed on host A, map 1 on host B (each host's executor)."""
    for e in (ea, eb):
        assert e.ask("REGISTER %s %d 2\r\n" % (app, shuffle)) == "OK"
    commit(ea, app, shuffle, 0)
    commit(eb, app, shuffle, 1)


def test_unregister_and_the_applications_end_free_its_blocks_on_every_peer(peers):
    a, b = peers
    def both():
        return gauge(a, "blocks_in_use"), gauge(b, "blocks_in_use")

    driver, ea, eb = Conn(a.port), Conn(a.port), Conn(b.port)
    assert driver.ask("DRIVER app-1\r\n") == "OK"
    commit_on_both(ea, eb, "app-1", 0)
    commit_on_both(ea, eb, "app-1", 1)
    assert both() == (2, 2)
    t0 = time.monotonic()
    assert driver.ask("UNREGISTER app-1 0\r\n") == "OK"
    assert time.monotonic() - t0 < 1.0, "UNREGISTER waited for a peer"
    assert becomes(both, (1, 1)) == (1, 1), "shuffle 0 is freed on both hosts"
    assert driver.ask("UNREGISTER_APP app-1\r\n") == "OK"
    assert becomes(both, (0, 0)) == (0, 0), "the application is freed on both hosts"
    assert (gauge(a, "shuffles"), gauge(b, "shuffles")) == (0, 0)
    # A driver that ends without UNREGISTER_APP (crashed): both hosts free its application.
    d2 = Conn(a.port)
    assert d2.ask("DRIVER app-2\r\n") == "OK"
    commit_on_both(ea, eb, "app-2", 0)
    assert both() == (1, 1)
    d2.close()
    assert becomes(both, (0, 0)) == (0, 0), "a lost driver's application is freed on both hosts"
    # A passed on 3 lines to B (and gave up on the dead peer for each); B, which got them marked
    # PEER, passed none on.
    def forwards(d):
        return gauge(d, "peer_forwards_total"), gauge(d, "peer_forward_errors_total")

    assert becomes(lambda: forwards(a), (3, 3)) == (3, 3)
    assert forwards(b) == (0, 0)
    for c in (driver, ea, eb):
        c.close()
    assert a.alive() and b.alive()


def test_a_driver_host_gone_silent_frees_its_application_within_the_keepalive_bound():
    if not shufflehosts.root_and_ip():
        pytest.skip("needs root, iproute2 and the slipstream binary")
    with shufflehosts.two_hosts(listen="0.0.0.0", extra=KEEPALIVE) as (a, b, ns):
        code = (
            "import socket,time\n"
            "s=socket.create_connection(('%s',%d))\n"
            "s.sendall(b'DRIVER app-7\\r\\n')\n"
            "f=s.makefile('rb'); assert f.readline()==b'OK\\r\\n'\n"
            "print('ready',flush=True); time.sleep(120)\n" % (shufflehosts.A_IP, a.port)
        )
        driver = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", code], stdout=subprocess.PIPE)
        try:
            assert driver.stdout.readline() == b"ready\n"
            executor = Conn(a.port)
            assert executor.ask("REGISTER app-7 0 2\r\n") == "OK"
            commit(executor, "app-7", 0, 0)
            commit(executor, "app-7", 0, 1)
            executor.close()
            # A healthy idle driver link lives through several keepalive periods (probes answered).
            time.sleep(2 * KEEPALIVE_DEAD_AFTER_S)
            assert a.metric("slipstream_shuffle_blocks_in_use") == 2
            # The driver's host goes silent: its end of the link down, the driver still running.
            shufflehosts.sh("ip", "-n", ns, "link", "set", b.link, "down")
            t0 = time.monotonic()
            left = becomes(lambda: a.metric("slipstream_shuffle_blocks_in_use"), 0, 4 * KEEPALIVE_DEAD_AFTER_S)
            took = time.monotonic() - t0
            assert left == 0, "a silent driver host was not noticed in %.1f s" % took
            assert driver.poll() is None, "the driver process is still there: nothing told the daemon"
            print("freed %.1f s after the link went down (bound %.0f s)" % (took, KEEPALIVE_DEAD_AFTER_S))
        finally:
            driver.kill()
            driver.wait(timeout=10)
            driver.stdout.close()


def closes(conn):
    """Whether the daemon closes `conn` (after its timeout's CLIENT_ERROR line) within Conn's 5 s."""
    try:
        for _ in range(3):
            if conn.line() == "":
                return True
    except socket.timeout:
        pass
    return False


class IdleDaemon(NoKeepShuffleDaemon):
    def _pick_ports(self):
        return super()._pick_ports() + "idle_timeout_s = 1\n"


def test_a_refused_driver_keeps_the_idle_timeout_and_an_accepted_one_lifts_it():
    if not mcwire.slipstream_available():
        pytest.skip("slipstream binary not built: %s" % mcwire.SLIPSTREAM_BIN)
    d = IdleDaemon(memory_mb=1).start()
    try:
        refused, accepted = Conn(d.port), Conn(d.port)
        assert refused.ask("DRIVER bad/id\r\n").startswith("CLIENT_ERROR")
        assert accepted.ask("DRIVER app-1\r\n") == "OK"
        t0 = time.monotonic()
        assert closes(refused), "the refused DRIVER's connection is closed at the idle timeout"
        assert time.monotonic() - t0 < 4.0
        time.sleep(1.5)
        assert accepted.ask("HELLO\r\n").startswith("OK "), "the driver connection outlived the idle timeout"
        refused.close()
        accepted.close()
    finally:
        d.remove()

