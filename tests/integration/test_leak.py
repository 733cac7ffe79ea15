"""A slow leak in the tasks' own code: never a silent, permanent stall. Real workers, real memory."""
from __future__ import annotations

import logging
import sys
import time

import pytest
from _util import wait_for

from localcluster import Client, LocalCluster

MiB = 2 ** 20
pytestmark = pytest.mark.timeout(120)


def leaky(i, mib=2, seconds=0.0):
    """Keeps ``mib`` MiB per call in the worker for ever, as a module-level cache would."""
    time.sleep(seconds)         # work of its own: a few calls between two memory samples, not hundreds
    kept = sys.__dict__.setdefault("_localcluster_test_leak", [])
    block = bytearray(mib * MiB)
    block[::4096] = b"\1" * len(block[::4096])      # touched: resident, not just reserved
    kept.append(block)
    return i * i


@pytest.mark.slow
def test_a_leak_restarts_the_worker_and_every_task_finishes(caplog):
    caplog.set_level(logging.WARNING, logger="localcluster")
    with LocalCluster(n_workers=2, memory_limit="200MiB", memory_leak_restart=1.0) as cluster, \
            Client(cluster) as client:
        futures = client.map(leaky, range(300))
        assert client.gather(futures) == [i * i for i in range(300)]
        leaks = [d for d in cluster.deaths if d.cause == "memory-leak"]
        assert leaks, [d.cause for d in cluster.deaths]
        d = leaks[0]
        assert d.blamed == () and d.managed is not None and d.unmanaged > 0.6 * 200 * MiB
        assert "unmanaged memory" in d.message and "of 200.00 MiB limit" in d.message
        assert "probably a leak in the tasks' code ('leaky' ran" in d.message
        assert "module-level cache" in d.message            # what to do
        lines = [r.getMessage() for r in caplog.records if "restarted" in r.getMessage()]
        assert any(f"{d.worker} (pid {d.pid}) restarted: unmanaged memory" in line for line in lines), lines
        cluster.scheduler.validate()
        cluster.wait_for_workers(2)


def test_unmanaged_memory_is_shown_for_each_worker():
    with LocalCluster(n_workers=1, memory_limit="1GiB") as cluster, Client(cluster) as client:
        kept = client.submit(bytes, 8 * MiB)        # a result the worker holds: managed
        kept.result(30)
        wait_for(lambda: cluster.workers["worker-0"].managed >= 8 * MiB)
        before = cluster.workers["worker-0"].unmanaged
        client.submit(leaky, 0, 32).result(30)      # memory the task keeps: unmanaged
        wait_for(lambda: cluster.workers["worker-0"].unmanaged >= before + 30 * MiB)
        info = cluster.workers["worker-0"]
        assert info.managed >= 8 * MiB and info.unmanaged == info.memory - info.managed
