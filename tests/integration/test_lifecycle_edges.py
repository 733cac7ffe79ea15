"""Edges of the lifecycle: closing while a worker ignores Stop, slow sampling."""
from __future__ import annotations

import os
import time

import pytest

from _util import wait_for

from localcluster import Client, LocalCluster, TaskTimeoutError


def hold_gil(seconds, marker):
    """libc system() with the GIL held (PyDLL): its shell makes the marker the test waits
    for while this thread already waits inside the call, so the worker can read no Stop
    once the marker is there. (Made before the C call, the marker left a gap: on a loaded
    machine the worker read Stop in it and exited 0.) The shell is the worker's child: its
    nanny kills it with the worker's process group."""
    import ctypes
    ctypes.PyDLL(None).system(f"touch '{marker}' && exec sleep {int(seconds)}".encode())


@pytest.mark.slow
def test_close_with_a_short_timeout_while_a_worker_ignores_stop(tmp_path):
    marker = str(tmp_path / "holding")
    cluster = LocalCluster(n_workers=1, forward_logs=False)
    client = Client(cluster)
    fut = client.submit(hold_gil, 600, marker)
    wait_for(lambda: os.path.exists(marker))
    client.close()
    cluster.close(timeout=0.5)      # returns by killing it (a wait of 600 s would trip the test's timeout)
    assert [(d.cause, d.exitcode) for d in cluster.deaths] == [("requested", -9)]
    assert fut.done()


def test_timeouts_are_enforced_even_when_memory_is_sampled_rarely():
    # sampled every 10 minutes: a timeout enforced only when memory is sampled would not
    # fire before result()'s own 60 s, and result() would raise TimeoutError instead
    with LocalCluster(n_workers=1, memory_sample_interval=600.0, forward_logs=False) as c, Client(c) as cl:
        with pytest.raises(TaskTimeoutError):
            cl.submit(time.sleep, 900, timeout=0.3).result(60)


@pytest.mark.slow
def test_scale_down_returns_when_the_worker_is_gone_not_at_its_timeout(monkeypatch):
    """scale(n) waits for the policy's slots to number n. A requested exit frees its slot in
    a policy event that asks for nothing; that event must still wake the waiter, or scale()
    slept until its timeout whenever it woke (at the reap) before the slot was freed: 60 s
    on a loaded machine. A pause in the event opens that window every time."""
    from localcluster.supervision.policy import Policy
    exited = Policy.exited

    def late_exited(self, *args, **kwargs):
        time.sleep(0.3)                 # the scale() caller, woken by the reap, waits again meanwhile
        return exited(self, *args, **kwargs)
    monkeypatch.setattr(Policy, "exited", late_exited)
    with LocalCluster(n_workers=2, forward_logs=False) as c:
        start = time.monotonic()
        c.scale(1, timeout=20)
        took = time.monotonic() - start
        assert len(c.workers) == 1
    assert took < 10, f"scale(1) took {took:.1f} s: it waited for its timeout, not for the worker"
