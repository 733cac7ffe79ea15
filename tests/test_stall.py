"""localcluster/stall.py on its own: the diagnosis of a cluster that finishes nothing, and
the clock that says a stall once. Plain data in, plain asserts; no process."""
from __future__ import annotations

from localcluster.stall import (BUSY_FACTOR, ClusterView, QueuedTask, RunningTask, Stall, StallClock, WorkerView,
                                diagnose, unexplained)

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
