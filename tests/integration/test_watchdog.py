"""The scheduler thread's watchdog: when that thread gets stuck while tasks are pending,
every waiter fails at once with ClusterBroken carrying the stuck thread's stack, instead
of waiting forever. The thread is made stuck for real, inside its handling of a finished
task, on a real cluster."""
from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from _util import block_until, released_once_reading, wait_for
import localcluster
from localcluster import Client, ClusterBroken, LocalCluster
from localcluster.engine import dispatch
from localcluster.scheduler import events as E
from localcluster.scheduler import state as S


def inc(x):
    return x + 1


def test_a_stuck_scheduler_thread_breaks_the_cluster_with_its_stack(monkeypatch):
    release = threading.Event()
    handle = S.Scheduler.handle

    def stuck_in_handling(self, *events):
        if any(type(e) is E.Reported for e in events):
            release.wait(30)             # what a deadlock inside the scheduler looks like
        return handle(self, *events)

    with LocalCluster(n_workers=1, forward_logs=False, scheduler_watchdog=0.5) as c, Client(c) as cl:
        assert cl.submit(inc, 1).result(30) == 2
        monkeypatch.setattr(S.Scheduler, "handle", stuck_in_handling)
        fut = cl.submit(inc, 2)
        try:
            # wait() leaves the reply to the scheduler thread (result() would read it itself:
            # the next test)
            done, _ = localcluster.wait([fut], timeout=20)
            assert fut in done
            with pytest.raises(ClusterBroken) as info:
                fut.result()
            text = str(info.value)
            assert "scheduler_watchdog=0.5" in text and "stuck_in_handling" in text and "release.wait" in text
            with pytest.raises(ClusterBroken):
                cl.submit(inc, 3)
        finally:
            release.set()


def test_a_thread_stuck_handling_what_it_read_for_its_future_fails_every_other_waiter(monkeypatch, tmp_path):
    """The main thread reads its own reply (result()) and gets stuck in the scheduler's
    handling of it: it is the waiter and stays stuck, but every other waiter fails at once
    with that thread's stack."""
    release = threading.Event()
    handle = S.Scheduler.handle

    def stuck_in_handling(self, *events):
        if threading.current_thread() is threading.main_thread() and any(type(e) is E.Reported for e in events):
            release.wait(30)
        return handle(self, *events)

    with LocalCluster(n_workers=1, threads_per_worker=2, forward_logs=False, scheduler_watchdog=0.5) as c, \
            Client(c) as cl:
        bystander = cl.submit(block_until, str(tmp_path / "never"), pure=False)
        assert cl.submit(inc, 1).result(30) == 2
        seen: list = []

        def other_waiter() -> None:
            try:
                localcluster.wait([bystander], timeout=20)
                seen.append(bystander.exception(0))
            except BaseException as e:      # not broken in time: the assertion below says so
                seen.append(e)
            finally:
                release.set()
        helper = threading.Thread(target=other_waiter)
        monkeypatch.setattr(S.Scheduler, "handle", stuck_in_handling)
        # its reply comes once this thread reads the channel itself: under load, a task that
        # ends at once may be read by the scheduler thread before result() is called
        fut, releaser = released_once_reading(cl, tmp_path)
        helper.start()
        try:
            with pytest.raises(ClusterBroken):
                fut.result(30)
        finally:
            release.set()
            helper.join(30)
            releaser.join(30)
        assert isinstance(seen[0], ClusterBroken), seen
        text = str(seen[0])
        assert "'MainThread', handling results it read while waiting for a future" in text
        assert "scheduler_watchdog=0.5" in text and "stuck_in_handling" in text and "release.wait" in text


@pytest.mark.slow
def test_an_idle_scheduler_or_a_long_task_is_not_a_stall():
    with LocalCluster(n_workers=1, forward_logs=False, scheduler_watchdog=0.3) as c, Client(c) as cl:
        slow = cl.submit(time.sleep, 1.5)              # the thread waits in select meanwhile
        assert slow.result(30) is None
        assert cl.submit(inc, 1).result(30) == 2


@pytest.mark.slow
def test_keys_let_go_at_once_are_freed_in_turns_not_taken_for_a_stall(monkeypatch):
    handle = S.Scheduler.handle

    def slow_release(self, *events):
        if any(type(e) is E.Drop for e in events):
            time.sleep(0.2)          # one chunk of keys as slow as 5,000 are on a loaded machine
        return handle(self, *events)

    monkeypatch.setattr(dispatch, "_RELEASE_CHUNK", 5)
    # a limit five times a chunk's 0.2 s: a loaded machine woke a thread from that sleep late
    # enough for one chunk to outlast a limit of 0.5 s
    with LocalCluster(n_workers=1, forward_logs=False, scheduler_watchdog=1.0) as c, Client(c) as cl:
        futures = cl.map(inc, range(100))
        assert cl.gather(futures) == list(range(1, 101))
        monkeypatch.setattr(S.Scheduler, "handle", slow_release)
        del futures                  # 20 chunks of 0.2 s: 4 s, four times the watchdog's limit
        wait_for(lambda: not c.scheduler.tasks, timeout=30)
        assert cl.submit(inc, 1).result(30) == 2        # the cluster is not broken


_READ_FRAMES_WHILE_COLLECTING = """
import gc, sys, threading
from localcluster.system.machine import frame_of
read = frame_of if sys.argv[1] == "frame_of" else (lambda ident: sys._current_frames().get(ident))
gc.set_threshold(1)            # every allocation may collect: the one inside the read too
for _ in range(200):
    garbage = [threading.local()]      # a local's teardown takes the thread-list lock
    garbage.append(garbage)
    del garbage
    assert read(threading.get_ident()) is not None
print("read")
"""


@pytest.mark.parametrize("read", ["frame_of", pytest.param("sys._current_frames", marks=[pytest.mark.slow, pytest.mark.skipif(
    sys.version_info >= (3, 12), reason="CPython 3.12 fixed gh-106883: the bare call no longer hangs")])])
def test_reading_a_threads_frame_while_the_collector_frees_a_thread_local_never_hangs(read):
    """What the watchdog reads a stuck thread's stack with: before 3.12, sys._current_frames()
    hangs the process when a collection it sets off frees a thread-local (gh-106883); the bare
    call is shown hanging, so that the check of frame_of can fail."""
    try:
        done = subprocess.run([sys.executable, "-c", _READ_FRAMES_WHILE_COLLECTING, read],
                              capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired:
        assert read != "frame_of", "frame_of hung, as sys._current_frames() does during a collection"
        return
    if read != "frame_of":
        pytest.skip(f"this Python's sys._current_frames() does not hang here ({sys.version.split()[0]})")
    assert done.returncode == 0 and done.stdout.strip() == "read", done.stderr
