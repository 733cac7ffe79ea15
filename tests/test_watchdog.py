"""The scheduler thread's watchdog: when that thread gets stuck while tasks are pending,
every waiter fails at once with ClusterBroken carrying the stuck thread's stack, instead
of waiting forever. The thread is made stuck for real, inside its handling of a finished
task, on a real cluster."""
from __future__ import annotations

import threading
import time

import pytest

from _util import wait_for
from localcluster import Client, ClusterBroken, LocalCluster
from localcluster.engine import dispatch
from localcluster.scheduler import state as S


def inc(x):
    return x + 1


def test_a_stuck_scheduler_thread_breaks_the_cluster_with_its_stack(monkeypatch):
    release = threading.Event()
    handle = S.Scheduler.handle_messages

    def stuck_in_handling(self, worker, msgs):
        release.wait(30)             # what a deadlock inside the scheduler looks like
        return handle(self, worker, msgs)

    with LocalCluster(n_workers=1, forward_logs=False, scheduler_watchdog=0.5) as c, Client(c) as cl:
        assert cl.submit(inc, 1).result(30) == 2
        monkeypatch.setattr(S.Scheduler, "handle_messages", stuck_in_handling)
        fut = cl.submit(inc, 2)
        try:
            with pytest.raises(ClusterBroken) as info:
                fut.result(20)
            text = str(info.value)
            assert "scheduler_watchdog=0.5" in text and "stuck_in_handling" in text and "release.wait" in text
            with pytest.raises(ClusterBroken):
                cl.submit(inc, 3)
        finally:
            release.set()


@pytest.mark.slow
def test_an_idle_scheduler_or_a_long_task_is_not_a_stall():
    with LocalCluster(n_workers=1, forward_logs=False, scheduler_watchdog=0.3) as c, Client(c) as cl:
        slow = cl.submit(time.sleep, 1.5)              # the thread waits in select meanwhile
        assert slow.result(30) is None
        assert cl.submit(inc, 1).result(30) == 2


@pytest.mark.slow
def test_keys_let_go_at_once_are_freed_in_turns_not_taken_for_a_stall(monkeypatch):
    release_many = S.Scheduler.release_many

    def slow_release(self, keys):
        time.sleep(0.2)              # one chunk of keys as slow as 5,000 are on a loaded machine
        return release_many(self, keys)

    monkeypatch.setattr(dispatch, "_RELEASE_CHUNK", 10)
    with LocalCluster(n_workers=1, forward_logs=False, scheduler_watchdog=0.5) as c, Client(c) as cl:
        futures = cl.map(inc, range(100))
        assert cl.gather(futures) == list(range(1, 101))
        monkeypatch.setattr(S.Scheduler, "release_many", slow_release)
        del futures                  # 10 chunks of 0.2 s: 2 s, four times the watchdog's limit
        wait_for(lambda: not c.scheduler.tasks, timeout=30)
        assert cl.submit(inc, 1).result(30) == 2        # the cluster is not broken
