"""The shuffle service's driver connections (crates/shuffle, `DRIVER <app>`), black-box: raw
protocol lines to the real binary. When an application's driver connection ends without
UNREGISTER_APP (its driver crashed), the daemon unregisters the application: its blocks go back
to the pool and, with no free files kept, their files are removed. An executor's connection
ending frees nothing committed; a second driver connection of the same application keeps it.
"""

import os
import subprocess
import sys
import time

import pytest

import mcwire
from test_shuffle import Conn, ShuffleDaemon, one_daemon

#: Longest a test waits for the daemon to notice a closed connection (s).
HANG_UP_WAIT_S = 5.0


class NoKeepShuffleDaemon(ShuffleDaemon):
    """Keeps no freed block file for reuse, so a freed block's file is removed at once."""

    def _pick_ports(self):
        return super()._pick_ports() + "free_blocks_keep = 0\n"


@pytest.fixture
def daemon():
    yield from one_daemon(NoKeepShuffleDaemon)


def gauge(daemon, name):
    for line in daemon.metrics().splitlines():
        if line.startswith("slipstream_shuffle_%s " % name):
            return int(line.split()[1])
    raise AssertionError("no metric " + name)


def blocks_in_use_becomes(daemon, n):
    """Waits (bounded) until blocks_in_use is n; the daemon frees when it reads the hang-up."""
    deadline = time.monotonic() + HANG_UP_WAIT_S
    while gauge(daemon, "blocks_in_use") != n and time.monotonic() < deadline:
        time.sleep(0.02)
    return gauge(daemon, "blocks_in_use") == n


def block_files(daemon):
    return sorted(f for f in os.listdir(daemon.dir) if f.startswith("blk-"))


def commit(conn, app, shuffle, map_index):
    blk = int(conn.ask("ALLOC %s %d\r\n" % (app, shuffle)).split()[1])
    conn.send("COMMIT %s %d %d 1 1\r\n0 %d 0 5\r\n" % (app, shuffle, map_index, blk))
    assert conn.until_end(conn.line())[0] == "COMMITTED 1 1"


def test_a_drivers_hang_up_frees_its_application_and_an_executors_does_not(daemon):
    driver = Conn(daemon.port)
    assert driver.ask("HELLO\r\n").startswith("OK 1 ")
    assert driver.ask("DRIVER app-1\r\n") == "OK"
    assert driver.ask("DRIVER bad/id\r\n").startswith("CLIENT_ERROR bad application id")
    assert driver.ask("REGISTER app-1 0 2\r\n") == "OK"
    # Executors: map tasks of app-1 and of app-2 (whose driver never says DRIVER).
    executor = Conn(daemon.port)
    assert executor.ask("REGISTER app-1 0 2\r\n") == "OK"
    assert executor.ask("REGISTER app-2 0 2\r\n") == "OK"
    for m in range(3):
        commit(executor, "app-1", 0, m)
    commit(executor, "app-2", 0, 0)
    executor.close()
    time.sleep(0.2)  # give the daemon the hang-up, then check it freed nothing committed
    assert gauge(daemon, "blocks_in_use") == 4 and gauge(daemon, "shuffles") == 2
    assert len(block_files(daemon)) == 4
    driver.close()  # the driver "crashed": no UNREGISTER_APP
    assert blocks_in_use_becomes(daemon, 1), daemon.metrics()
    assert gauge(daemon, "shuffles") == 1
    assert len(block_files(daemon)) == 1, block_files(daemon)  # app-2's only
    reader = Conn(daemon.port)
    assert reader.until_end(reader.ask("LOOKUP app-2 0 0\r\n"))[0] == "SEGMENTS 1"
    assert reader.ask("LOOKUP app-1 0 0\r\n").startswith("CLIENT_ERROR")
    reader.close()
    assert daemon.alive()


def test_a_second_driver_connection_keeps_the_application_and_unregister_app_ends_it(daemon):
    first, second = Conn(daemon.port), Conn(daemon.port)
    for d in (first, second):
        assert d.ask("DRIVER app-1\r\n") == "OK"
    assert first.ask("REGISTER app-1 0 2\r\n") == "OK"
    executor = Conn(daemon.port)
    commit(executor, "app-1", 0, 0)
    first.close()
    time.sleep(0.2)
    assert gauge(daemon, "blocks_in_use") == 1, "the other driver connection is still open"
    # A clean end: UNREGISTER_APP, then a new application of the same id on another connection;
    # the old driver connection ending afterwards leaves the new one alone.
    assert second.ask("UNREGISTER_APP app-1\r\n") == "OK"
    assert blocks_in_use_becomes(daemon, 0)
    assert executor.ask("REGISTER app-1 1 2\r\n") == "OK"
    commit(executor, "app-1", 1, 0)
    second.close()
    time.sleep(0.2)
    assert gauge(daemon, "blocks_in_use") == 1 and gauge(daemon, "shuffles") == 1
    executor.close()


def test_a_killed_driver_process_frees_its_application(daemon):
    """A real process killed by SIGKILL: the kernel closes its socket, the daemon sees the end."""
    code = (
        "import socket,sys,time\n"
        "s=socket.create_connection(('%s',%d))\n"
        "s.sendall(b'DRIVER app-9\\r\\nREGISTER app-9 0 1\\r\\n')\n"
        "f=s.makefile('rb'); assert f.readline()==b'OK\\r\\n' and f.readline()==b'OK\\r\\n'\n"
        "print('ready',flush=True); time.sleep(60)\n" % (mcwire.HOST, daemon.port)
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"ready\n"
        executor = Conn(daemon.port)
        commit(executor, "app-9", 0, 0)
        commit(executor, "app-9", 0, 1)
        executor.close()
        time.sleep(0.2)
        assert gauge(daemon, "blocks_in_use") == 2
        proc.kill()
        proc.wait(timeout=10)
        assert blocks_in_use_becomes(daemon, 0), daemon.metrics()
        assert block_files(daemon) == []
    finally:
        proc.kill()
        proc.wait(timeout=10)
        proc.stdout.close()
