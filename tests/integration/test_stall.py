"""localcluster/supervision/stall.py on its own (plain data in, plain asserts): the diagnosis of a cluster
that finishes nothing, and the clock that says a stall once. Then through real workers
(stallwatch.py): every worker paused for real, no worker, a long task: the one WARNING, and
the TimeoutErrors of wait, gather, as_completed and result saying why."""
from __future__ import annotations

import asyncio
import concurrent.futures as cf
import logging
import os
import re
import threading

import pytest
from _util import block_until, release, wait_for, wait_running

from localcluster import Client, LocalCluster, as_completed, wait
from localcluster.scheduler import events as E
from localcluster.supervision.stall import (BUSY_FACTOR, ClusterView, QueuedTask, RunningTask, Stall, StallClock,
                                      WorkerView, diagnose, unexplained)

MiB = 2 ** 20


def view(pending=None, workers=(), **kw):
    return ClusterView(pending={"ready": 85} if pending is None else pending, workers=tuple(workers), **kw)


def w(name, status="running", memory=100 * MiB, managed=0, nthreads=1, running=0):
    return WorkerView(name, status, memory, managed, nthreads, running)


def test_nothing_pending_is_no_stall():
    assert diagnose(view({}, [w("worker-0", "paused")])) is None
    assert diagnose(view({"ready": 0, "waiting": 0}, [])) is None


def test_work_that_can_start_is_no_stall():
    assert diagnose(view({"ready": 3}, [w("worker-0"), w("worker-1", "paused")])) is None
    # a free thread and a task for it: placement is about to send it
    running = (RunningTask("slow-1", "worker-0", 50.0),)
    assert diagnose(view({"ready": 3, "processing": 1}, [w("worker-0", nthreads=2, running=1)],
                         running=running)) is None


def test_both_workers_paused_with_their_memory_and_nothing_to_spill():
    stall = diagnose(view({"ready": 80, "processing": 5},
                          [w("worker-0", "paused", 440 * MiB), w("worker-1", "paused", 426 * MiB)],
                          memory_limit=500 * MiB, memory_pause=0.8))
    assert stall.kind == "paused" and stall.stuck
    assert stall.reason.startswith("both workers are paused: worker-0 440.00 MiB, worker-1 426.00 MiB of "
                                   "500.00 MiB limit, above memory_pause=80%; nothing is left to spill"), stall
    assert "client.restart()" in stall.reason and "memory_limit" in stall.reason
    assert str(stall) == stall.reason


def test_paused_workers_holding_results_are_told_to_release_them():
    stall = diagnose(view({"waiting": 2}, [w("worker-0", "paused", 300 * MiB, managed=120 * MiB), w("worker-1", "closing")],
                          memory_limit=350 * MiB, memory_pause=0.8))
    assert stall.kind == "paused"
    assert stall.reason.startswith("the worker is paused: worker-0 300.00 MiB of 350.00 MiB limit")
    assert "120.00 MiB of it is results still in memory" in stall.reason and "nothing is left" not in stall.reason
    three = diagnose(view({"ready": 1}, [w(f"worker-{i}", "paused") for i in range(3)] + [w("worker-9", "starting")]))
    assert three.reason.startswith("all 3 workers are paused: ") and "1 more starting" in three.reason


def test_no_worker_says_scale():
    stall = diagnose(view({"ready": 1}, []))
    assert stall.kind == "no-worker" and "no worker is running" in stall.reason and "cluster.scale(n)" in stall.reason
    assert diagnose(view({"ready": 1}, [w("worker-0", "closing")])).kind == "closing"


def test_workers_starting_or_about_to_be_respawned():
    assert diagnose(view({"ready": 1}, [w("worker-0", "starting")])).kind == "starting"
    stall = diagnose(view({"ready": 1}, [], respawns=2))
    assert stall.kind == "starting" and "2 are starting" in stall.reason


def test_a_dependency_that_erred_or_was_lost():
    oldest = QueuedTask("sum-1", "waiting", {"load-1": "memory", "load-2": "erred"})
    stall = diagnose(view({"waiting": 1, "processing": 1}, [w("worker-0", running=1)], oldest=oldest,
                          running=(RunningTask("x", "worker-0", 1.0),)))
    assert stall.kind == "dependency" and "'sum-1' waits for 'load-2', which failed" in stall.reason
    lost = QueuedTask("sum-1", "waiting", {"data-1": "lost"})
    assert "was lost with its worker" in diagnose(view({"waiting": 1}, [w("worker-0")], oldest=lost)).reason
    fine = QueuedTask("sum-1", "waiting", {"load-1": "processing"})
    assert diagnose(view({"waiting": 1, "processing": 1}, [w("worker-0", running=1)], oldest=fine,
                         running=(RunningTask("load-1", "worker-0", 3.0),))).kind == "busy"


def test_tasks_restricted_to_workers_that_are_gone_or_paused():
    oldest = QueuedTask("f-1", "ready", restricted_to=frozenset({"worker-3", "worker-1"}))
    stall = diagnose(view({"ready": 1}, [w("worker-0"), w("worker-1", "paused")], oldest=oldest))
    assert stall.kind == "restricted"
    assert "may run only on worker-1, worker-3 (workers=...)" in stall.reason
    assert "worker-1 is paused, worker-3 is gone" in stall.reason and "allow_other_workers=True" in stall.reason
    ok = QueuedTask("f-1", "ready", restricted_to=frozenset({"worker-0"}))
    assert diagnose(view({"ready": 1}, [w("worker-0"), w("worker-1", "paused")], oldest=ok)) is None


def test_every_thread_busy_names_the_longest_running_task_and_is_not_stuck():
    running = (RunningTask("train-7", "worker-1", 754.2), RunningTask("train-9", "worker-0", 12.0))
    stall = diagnose(view({"ready": 10, "processing": 2}, [w("worker-0", running=1), w("worker-1", running=1)],
                          running=running))
    assert stall == Stall("busy", "every worker thread is busy: the longest running task, 'train-7', has run "
                                  "754 s on worker-1")
    assert not stall.stuck
    # one long task, a free thread, and nothing else that could start: still only slow
    alone = diagnose(view({"processing": 1, "waiting": 4}, [w("worker-0", running=1), w("worker-1")],
                          running=running[:1]))
    assert alone.kind == "busy" and "before the running task ends" in alone.reason


def test_the_unexplained_stall_still_says_something():
    text = unexplained(view({"ready": 2}, [w("worker-0", nthreads=2)], oldest=QueuedTask("f-1", "ready")))
    assert "the oldest, 'f-1', is ready, and 2 worker threads are free" in text


def test_the_clock_says_a_stall_once_and_again_only_after_progress():
    clock = StallClock(30)
    paused = Stall("paused", "...")
    assert clock.quiet_for(0, token=(5, ())) is None           # the first token starts the count
    assert clock.quiet_for(29.9, token=(5, ())) is None
    quiet = clock.quiet_for(30.0, token=(5, ()))
    assert quiet == 30.0 and clock.should_say(quiet, paused)
    clock.said()
    assert clock.quiet_for(31, (5, ())) is None and clock.quiet_for(300, (5, ())) is None   # once per stall
    assert clock.quiet_for(301, (6, ())) is None                # progress: a new stall may begin
    assert clock.quiet_for(330, (6, ())) is None
    assert clock.quiet_for(331.5, (6, ())) == 30.5


def test_the_clock_waits_longer_for_busy_and_puts_off_its_looks():
    clock = StallClock(30)
    busy = Stall("busy", "...")
    clock.quiet_for(0, (1, ("k",)))
    quiet = clock.quiet_for(30, (1, ("k",)))
    assert not clock.should_say(quiet, busy)
    clock.look_later(30, 30)
    assert clock.quiet_for(45, (1, ("k",))) is None             # put off
    assert clock.quiet_for(60, (1, ("k",))) == 60
    assert clock.should_say(30 * BUSY_FACTOR, busy)
    clock.idle(60)                                               # nothing pending: the count restarts
    assert clock.quiet_for(80, (1, ("k",))) is None and clock.quiet_for(90, (1, ("k",))) == 30


# --- through real workers: a cluster stuck for real says so ----------------------------------

class _Said(logging.Handler):
    """Collects the localcluster logger's stall warnings; ``event`` is set on the first."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: list = []
        self.event = threading.Event()

    def emit(self, record):
        if "no task has finished" in record.getMessage():
            self.lines.append(record.getMessage())
            self.event.set()


@pytest.fixture
def said():
    handler = _Said()
    log = logging.getLogger("localcluster")
    log.addHandler(handler)
    try:
        yield handler
    finally:
        log.removeHandler(handler)


def hold_until(mib, marker):
    """Hold ``mib`` in a module-level place of the worker, outside any task's result (as a
    leak does), until the test creates ``marker``."""
    import builtins
    builtins._held = b"x" * (mib * MiB)

    def free():
        block_until(marker)
        del builtins._held
    threading.Thread(target=free, daemon=True).start()
    return os.getpid()


def inc(x):
    return x + 1


@pytest.mark.slow
def test_every_worker_paused_is_said_once_and_every_timeout_says_why(tmp_path, said):
    marker = str(tmp_path / "free")
    # idle workers take ~20 MiB: 230 more puts each above memory_pause (240 MiB), below terminate (285)
    with LocalCluster(n_workers=2, memory_limit=300 * MiB, stall_warning=1, forward_logs=False) as c, \
            Client(c) as cl:
        names = sorted(c.workers)
        for name in names:
            cl.submit(hold_until, 230, marker, workers=[name], pure=False).result(30)
        wait_for(lambda: all(i.status == "paused" for i in c.workers.values()))
        # On a loaded machine the second hold_until, running while both workers were paused
        # already, may itself outlast stall_warning (1 s): a warning of its own, "1 is pending"
        # (a loaded run saw it). The stall under test starts now.
        said.lines.clear()
        said.event.clear()
        futures = cl.map(inc, range(10))
        assert said.event.wait(15), "no stall warning"
        (line,) = said.lines
        assert re.match(r"localcluster: no task has finished for [\d.]+ s and 10 are pending: both workers are "
                        r"paused: worker-0 ", line), line
        assert "of 300.00 MiB limit, above memory_pause=80%; nothing is left to spill" in line
        paused = r"10 of 10 futures were not done after 0.3 s: both workers are paused: worker-0 [\d.]+ MiB, worker-1"
        with pytest.raises(TimeoutError, match=r"gather\(timeout=0.3\): " + paused):
            cl.gather(futures, timeout=0.3)
        with pytest.raises(TimeoutError, match="^" + paused):
            wait(futures, timeout=0.3)
        with pytest.raises(TimeoutError, match=paused):
            asyncio.run(cl.gather(futures, asynchronous=True, timeout=0.3))
        with pytest.raises(cf.TimeoutError, match=r"is queued: both workers are paused"):
            futures[0].result(timeout=0.1)
        assert len(said.lines) == 1                     # once per stall, however long it lasts
        release(marker)                                 # the memory is let go: both resume
        assert cl.gather(futures, timeout=30) == list(range(1, 11))
        assert len(said.lines) == 1
        assert c.deaths == []


@pytest.mark.slow
def test_no_worker_is_said_and_every_timeout_says_why(said):
    with LocalCluster(n_workers=0, stall_warning=0.5, forward_logs=False) as c, Client(c) as cl:
        fut = cl.submit(inc, 1)
        assert said.event.wait(10), "no stall warning"
        assert re.match(r"localcluster: no task has finished for [\d.]+ s and 1 is pending: no worker is "
                        r"running and none is starting", said.lines[0]), said.lines
        nobody = r"1 of 1 futures were not done after 0.2 s: no worker is running .*call cluster.scale\(n\)"
        with pytest.raises(TimeoutError, match=r"^gather\(timeout=0.2\): " + nobody):
            cl.gather([fut], timeout=0.2)
        with pytest.raises(TimeoutError, match="^" + nobody):
            wait([fut], timeout=0.2)
        with pytest.raises(TimeoutError, match=r"^as_completed\(timeout=0.2\): " + nobody):
            next(iter(as_completed([fut], timeout=0.2)))
        for bad in (-1, "3", True, float("nan")):
            with pytest.raises(ValueError, match=r"gather\(timeout=.*\): expected a number of seconds >= 0"):
                cl.gather([fut], timeout=bad)
        c.scale(1)
        assert cl.gather([fut], timeout=30) == [2]
        assert list(as_completed([fut], timeout=30)) == [fut]
    assert len(said.lines) == 1


@pytest.mark.slow
def test_a_busy_cluster_is_not_said_stuck_and_the_timeout_names_the_running_task(tmp_path, said):
    marker = str(tmp_path / "go")
    with LocalCluster(n_workers=1, stall_warning=0.3, forward_logs=False) as c, Client(c) as cl:
        slow = cl.submit(block_until, marker, pure=False)
        queued = cl.submit(inc, 1)
        wait_running(c, slow)
        with pytest.raises(TimeoutError, match=rf"2 of 2 futures were not done after 0.5 s: task "
                                               rf"{re.escape(repr(slow.key))} is still running on worker-0"):
            wait([slow, queued], timeout=0.5)          # meanwhile a look found it busy, not stuck
        release(marker)
        assert cl.gather([queued], timeout=30) == [2]
    assert said.lines == []


class _NoWorkerRuns:
    """The supervisor as the stall watch reads it: a worker that never starts what it is sent."""
    target = 1

    def snapshot(self) -> dict:
        return {}

    def running_keys(self) -> dict:
        return {}

    def running_since(self, worker, seq):
        return None


def test_runs_sent_are_progress_so_a_submit_longer_than_stall_warning_is_no_stall(caplog):
    # A million-task map on a loaded machine holds the lock longer than stall_warning while
    # the parent admits it: its first runs going out starts the count, not the last finish.
    from localcluster.scheduler.records import Spec
    from localcluster.scheduler.state import Scheduler
    from localcluster.supervision.stallwatch import StallWatch
    from localcluster.engine.history import History
    from localcluster.wire.serialize import dumps
    scheduler = Scheduler()
    scheduler.handle(E.AddWorker("w0", 1))
    watch = StallWatch(threading.Lock(), scheduler, _NoWorkerRuns(), History(),
                       {"stall_warning": 30, "memory_pause": 0.8}, None)
    watch.tick(0.0)                                      # idle
    scheduler.handle(E.Submit([Spec(f"k-{i}", 1, b"fn", dumps(((), {})), ()) for i in range(3)]))
    assert scheduler.placement.assigned >= 1
    with caplog.at_level(logging.WARNING, logger="localcluster"):
        for now in (40.0, 55.0, 69.0):                  # admitted and sent at 40 s
            watch.tick(now)
        assert not caplog.records
        watch.tick(71.0)                                 # sent 31 s ago, and nothing started since
    assert [r.getMessage() for r in caplog.records][0].startswith("localcluster: no task has finished for 31 s")
