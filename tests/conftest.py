"""Pytest fixtures for the black-box suite: servers on free loopback ports.

For: starting memcached (the reference) and Slipstream (the candidate) with
identical memcached-style flags, and killing them on teardown, failure or not.
Not for: protocol assertions (see the test_*.py files).

Environment:
  SLIPSTREAM_BIN   path of the slipstream binary (default target/release/slipstream)
  MC_CANDIDATE     'slipstream' (default) or 'memcached': the server compared
                   against memcached. 'memcached' proves the harness itself
                   (memcached vs memcached must pass).
  MC_QUIET_MS      quiet period that ends a reply read (default 150)
  MC_TEST_ALARM_S  hard per-test limit in seconds (default 120)
"""

import os
import signal
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import mcwire  # noqa: E402

CANDIDATE = os.environ.get("MC_CANDIDATE", "slipstream")
ALARM_S = int(os.environ.get("MC_TEST_ALARM_S", "120"))


class TestTimeout(Exception):
    pass


@pytest.fixture(autouse=True)
def _hard_time_limit():
    """Fail (not hang) any test that runs past ALARM_S seconds."""

    def on_alarm(_signum, _frame):
        raise TestTimeout("test exceeded %ds hard limit" % ALARM_S)

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(ALARM_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def require_kind(kind):
    if kind == "slipstream" and not mcwire.slipstream_available():
        pytest.skip("slipstream binary not built: %s" % mcwire.SLIPSTREAM_BIN)
    if kind == "memcached" and not mcwire.memcached_available():
        pytest.skip("memcached not installed: %s" % mcwire.MEMCACHED_BIN)


@pytest.fixture
def server_factory():
    """Call factory(kind, **settings) -> started mcwire.Server; all killed at teardown."""
    started = []

    def factory(kind, **settings):
        require_kind(kind)
        srv = mcwire.Server(kind, **settings)
        started.append(srv)
        return srv.start()

    try:
        yield factory
    finally:
        mcwire.kill_quietly(started)


@pytest.fixture
def candidate_kind():
    """The implementation under test ('slipstream' unless MC_CANDIDATE says otherwise)."""
    require_kind(CANDIDATE)
    require_kind("memcached")
    return CANDIDATE


@pytest.fixture(params=["memcached", "slipstream"])
def server_kind(request):
    """Parametrises a test over both servers (the same assertions must hold on each)."""
    require_kind(request.param)
    return request.param


@pytest.fixture
def server(server_factory, server_kind):
    """One server of each kind with default settings (TCP + UDP on the same port)."""
    return server_factory(server_kind, udp=True)
