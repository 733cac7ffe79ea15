"""The chaos soak (examples/soak.py) for about 45 s: thousands of tasks with 1-20 MB
values moving between workers, scatters and replicas, and a worker SIGKILLed about
every 0.75 s. Every result is right, nothing hangs, every kill is a recorded death with
cause "signal", and nothing is left behind (the no_leaks fixture: processes, threads,
descriptors, so memfds too, and /dev/shm; and the cluster's directory, spill files
included)."""
from __future__ import annotations

import importlib.util
import os

import pytest

pytest.importorskip("numpy")

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "soak.py")


@pytest.mark.timeout(240)
def test_soak_with_random_sigkills_and_data_in_flight():
    spec = importlib.util.spec_from_file_location("soak_example", EXAMPLE)
    soak = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(soak)
    lines: list = []
    report = soak.soak(float(os.environ.get("LOCALCLUSTER_SOAK_SECONDS", "45")), seed=0, log=lines.append)
    print(lines[-1])
    assert report["rounds"] >= 5 and report["tasks"] >= 200, report
    assert report["kills"] >= 10, report
    assert report["wrong_causes"] == [] and report["kills_not_recorded"] == [], report
    assert report["deaths"] == report["kills"], report
    assert not report["directory_left"]
