"""The chaos soak (examples/soak.py) for about 30 s, from a fresh seed each run (printed):
thousands of tasks with 1-20 MB values moving between workers, scatters and replicas, and a
worker SIGKILLed about every 0.75 s. Every result is right, nothing hangs, every kill is a recorded death with
cause "signal", and nothing is left behind (the no_leaks fixture: processes, threads,
descriptors, so memfds too, and /dev/shm; and the cluster's directory, spill files
included)."""
from __future__ import annotations

import importlib.util
import os

import pytest

pytest.importorskip("numpy")

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples", "soak.py")


# The long case soaks 30 s (LOCALCLUSTER_SOAK_SECONDS), the short one a few seconds, enough
# for kills in the middle of data in flight, with the least it must have done scaled down.
# Each run draws a fresh seed: runs differ by their plan, not only by the kills' timing.
@pytest.mark.timeout(240)
@pytest.mark.parametrize("seconds,least", [
    pytest.param(float(os.environ.get("LOCALCLUSTER_SOAK_SECONDS", "30")), dict(rounds=5, tasks=200, kills=10),
                 marks=pytest.mark.slow, id="long"),
    pytest.param(3.0, dict(rounds=1, tasks=20, kills=2), id="short")])
@pytest.mark.slow
def test_soak_with_random_sigkills_and_data_in_flight(seconds, least, seed):
    spec = importlib.util.spec_from_file_location("soak_example", EXAMPLE)
    soak = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(soak)
    lines: list = []
    report = soak.soak(seconds, seed=seed, log=lines.append)
    print(lines[-1])
    assert report["rounds"] >= least["rounds"] and report["tasks"] >= least["tasks"], report
    assert report["kills"] >= least["kills"], report
    assert report["wrong_causes"] == [] and report["kills_not_recorded"] == [], report
    assert report["deaths"] == report["kills"], report
    assert not report["directory_left"]
