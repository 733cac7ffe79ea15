"""The tests on a machine booted a minute ago, for real: a time namespace whose clocks read so.

A fresh CI machine's ``time.monotonic()`` (seconds since boot) is small. Code that takes a
clock's origin for "long ago" (a last submit at 0.0 counted as within a burst) passes on a
machine up for hours and fails on one booted minutes before. Linux's time namespaces
(``unshare --time``, kernel 5.6) give the processes inside, the workers included, a
monotonic and a boot clock offset as we choose: the same tests run there, on a machine that
is, for them, a minute old.
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600),
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="time namespaces are Linux's")]

ROOT = Path(__file__).resolve().parents[2]
AGE = 60        # seconds the machine has been up, as the namespace's processes read it
# The unit tier (the dispatcher's burst among it), and the integration tests whose timing
# rests on the burst and on the clocks' values.
TESTS = ["tests/unit", "tests/integration/test_submit_burst.py", "tests/integration/test_broken.py"]


def _host_clocks() -> dict:
    """The machine's monotonic and boot clocks, in seconds: what this process reads less its own
    namespace's offsets (a run of the suite may itself be in a young namespace, and a new
    namespace's offsets count from the machine's clocks, not from its parent's)."""
    offsets = {}
    with open("/proc/self/timens_offsets") as f:
        for line in f:
            name, secs, nsecs = line.split()
            offsets[name] = int(secs) + int(nsecs) / 1e9
    return {"monotonic": time.clock_gettime(time.CLOCK_MONOTONIC) - offsets.get("monotonic", 0),
            "boottime": time.clock_gettime(time.CLOCK_BOOTTIME) - offsets.get("boottime", 0)}


def _young(argv: list) -> list:
    """``argv`` run in a time namespace whose clocks read a machine booted ``AGE`` seconds ago."""
    clocks = _host_clocks()
    return ["unshare", "--time", "--monotonic", str(int(AGE - clocks["monotonic"])),
            "--boottime", str(int(AGE - clocks["boottime"])), *argv]


def _monotonic_when_young() -> float:
    """What ``time.monotonic()`` reads in the namespace (skips where none may be made)."""
    probe = subprocess.run(_young([sys.executable, "-c", "import time; print(time.monotonic())"]),
                           capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        pytest.skip(f"this process may not make a time namespace (root and Linux 5.6 are needed): "
                    f"{probe.stderr.strip()}")
    return float(probe.stdout)


def test_the_clocks_of_the_namespace_read_a_young_machine():
    assert _monotonic_when_young() < AGE + 30


def test_the_unit_tier_and_the_burst_tests_pass_on_a_machine_booted_a_minute_ago():
    _monotonic_when_young()
    done = subprocess.run(_young([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TESTS]),
                          cwd=ROOT, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, (f"the tests fail on a machine booted {AGE} s ago (a time namespace):\n"
                                  + "\n".join(done.stdout.splitlines()[-40:]) + done.stderr[-2000:])
    assert " passed" in done.stdout.splitlines()[-1]
