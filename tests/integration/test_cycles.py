"""50 start / submit / close cycles in one fresh interpreter, each moving 10 MB between
two workers: descriptors, threads, child processes, memory maps and RSS come back to
the baseline taken after the first cycles (imports and caches warm).

    python tests/integration/test_cycles.py [cycles]    prints the figures (the test asserts them)
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("numpy")

# What the cycles after the baseline may add in all. Descriptors, threads and processes: none,
# so one leaked per cycle fails after any count. Maps and RSS move a little without a leak
# (malloc's arenas, the allocator's free lists): a leak of one map in every 9 cycles, or of
# 200 kB a cycle, goes past these over the 45 cycles of the full run.
TOLERANCE = {"fds": 0, "threads": 0, "children": 0, "maps": 4, "rss_mb": 8.0}


def measure() -> dict:
    import psutil
    me = psutil.Process()
    with open("/proc/self/maps") as f:
        maps = sum(1 for _ in f)
    return {"fds": len(os.listdir("/proc/self/fd")), "threads": me.num_threads(),
            "children": len(me.children(recursive=True)), "maps": maps,
            "rss_mb": round(me.memory_info().rss / 2**20, 1)}


def cycles(n: int) -> dict:
    import gc

    import numpy as np

    from localcluster import Client, LocalCluster

    def one() -> None:
        with LocalCluster(n_workers=2, forward_logs=False) as c, Client(c) as cl:
            a, b = c.workers
            big = cl.submit(np.ones, 10 * 2**20 // 8, workers=a)
            total = cl.submit(np.sum, big, workers=b)           # 10 MB from a to b
            assert total.result(30) == 10 * 2**20 // 8
            assert cl.gather(big).nbytes == 10 * 2**20

    warm = 5
    for _ in range(warm):
        one()
    gc.collect()
    baseline = measure()
    for _ in range(n - warm):
        one()
    gc.collect()
    after = measure()
    return {"cycles": n, "baseline": baseline, "after": after}


# The full run's 50 cycles find a slow leak; the quick tier's 7 (2 after the baseline) run the
# same path and checks, and find a leak of one descriptor, thread or process per cycle.
@pytest.mark.timeout(300)      # the child's own limit is 240 s
@pytest.mark.parametrize("n", [pytest.param(50, marks=pytest.mark.slow), 7])
def test_cycles_come_back_to_the_baseline(n):
    proc = subprocess.run([sys.executable, __file__, str(n)], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    before, after = report["baseline"], report["after"]
    grown = {k: round(after[k] - before[k], 1) for k in before}
    assert all(grown[k] <= TOLERANCE[k] for k in grown), (grown, report)
    assert after["children"] == 0


if __name__ == "__main__":
    print(json.dumps(cycles(int(sys.argv[1]) if len(sys.argv) > 1 else 50)))
