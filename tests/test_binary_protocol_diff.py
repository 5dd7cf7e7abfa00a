"""The binary protocol's differential sessions (tests/binary_diff.py) as part of the suite:
the same binary sessions go to real memcached 1.6.18 and to Slipstream, started here with the
same settings, and the replies must match byte for byte (CAS values mapped to ordinals, version
text and volatile stat values masked, as binary_diff.py documents). Run with default flags and
again with -F -C (flush disabled, no CAS)."""

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.parametrize("extra", [[], ["-F", "-C"]], ids=["defaults", "no-flush-no-cas"])
def test_binary_sessions_match_memcached(server_factory, candidate_kind, extra):
    reference = server_factory("memcached", extra=extra)
    candidate = server_factory(candidate_kind, extra=extra)
    proc = subprocess.run(
        [sys.executable, os.path.join(HERE, "binary_diff.py"), str(reference.port), str(candidate.port)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, "binary sessions differ:\n" + proc.stdout[-8000:] + proc.stderr[-2000:]
