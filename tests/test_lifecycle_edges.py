"""Edges of the lifecycle: closing while a worker ignores Stop, slow sampling."""
from __future__ import annotations

import time

import pytest

from localcluster import Client, LocalCluster, TaskTimeoutError


def hold_gil(seconds):
    import ctypes
    ctypes.PyDLL(None).sleep(seconds)   # libc sleep() with the GIL held: Stop cannot be read


def test_close_with_a_short_timeout_while_a_worker_ignores_stop():
    cluster = LocalCluster(n_workers=1, forward_logs=False)
    client = Client(cluster)
    fut = client.submit(hold_gil, 30)
    deadline = time.monotonic() + 10
    while not any(i.processing for i in cluster.workers.values()) and time.monotonic() < deadline:
        time.sleep(0.01)
    t0 = time.monotonic()
    client.close()
    cluster.close(timeout=0.5)
    assert time.monotonic() - t0 < 10
    assert [d.cause for d in cluster.deaths] == ["requested"]
    assert fut.done()


def test_timeouts_are_enforced_even_when_memory_is_sampled_rarely():
    with LocalCluster(n_workers=1, memory_sample_interval=5.0, forward_logs=False) as c, Client(c) as cl:
        t0 = time.monotonic()
        with pytest.raises(TaskTimeoutError):
            cl.submit(time.sleep, 30, timeout=0.3).result(30)
        assert time.monotonic() - t0 < 2.0
