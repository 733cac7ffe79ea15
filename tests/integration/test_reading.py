"""A thread waiting in ``result()`` reads its worker's channel itself (Supervisor.read_for):
the reply wakes that thread only, not the scheduler thread and then it. Real workers; each
test checks what must hold whoever reads: callbacks off the reading thread, frames with more
than results left to the scheduler thread in order, the channel given back after a timeout
or a death."""
from __future__ import annotations

import concurrent.futures as cf
import os
import signal
import threading
import time

import pytest
from _util import block_until, release, released_once_reading

import localcluster
from localcluster import KilledWorker

pytestmark = pytest.mark.timeout(60)


def inc(x):
    return x + 1


def held(x, path):
    block_until(path)
    return x


def late(x, seconds=0.3):
    time.sleep(seconds)       # still running when the test's thread starts to wait
    return x


def test_result_reads_its_reply_on_the_waiting_thread(client, tmp_path):
    fut, helper = released_once_reading(client, tmp_path)
    threads: list = []
    cf.Future.add_done_callback(fut, lambda f: threads.append(threading.get_ident()))
    try:
        assert fut.result(timeout=30) == 1
    finally:
        helper.join(30)
    assert threads == [threading.get_ident()], "the reply was handled on another thread"


@pytest.mark.cluster(n_workers=1, threads_per_worker=1)
def test_a_done_callback_never_runs_on_the_reading_thread(client):
    """The callback waits for a later task of the same worker: on the thread that holds the
    worker's channel it would wait forever."""
    first = client.submit(late, 1)
    second = client.submit(inc, 1)       # queued behind it, on the same worker
    seen: list = []
    called = threading.Event()

    def callback(f):
        seen.append((threading.current_thread().name, second.result(timeout=20)))
        called.set()
    first.add_done_callback(callback)
    assert first.result(timeout=30) == 1
    assert called.wait(30)
    assert seen[0][1] == 2
    assert seen[0][0] != threading.current_thread().name


def submits_and_waits(x):
    client = localcluster.get_client()
    return client.submit(inc, x).result(timeout=20) + 1


@pytest.mark.cluster(n_workers=1, threads_per_worker=2)
def test_requests_from_tasks_on_a_lent_channel_go_to_the_scheduler_thread_in_order(client):
    """A task's Ask (get_client, submit, wait) comes on the channel the waiting thread reads:
    it is left to the scheduler thread, ahead of anything read after it."""
    for i in range(10):
        assert client.submit(submits_and_waits, i, pure=False).result(timeout=30) == i + 2


@pytest.mark.cluster(n_workers=1, threads_per_worker=2)
def test_a_timed_out_wait_gives_the_channel_back(client, tmp_path):
    go = str(tmp_path / "go")
    slow = client.submit(held, 1, go)        # runs until the test releases it, not for a fixed time
    with pytest.raises(cf.TimeoutError, match="running on worker"):
        slow.result(timeout=0.05)
    quick = client.submit(inc, 1)
    done, _ = localcluster.wait([quick], timeout=20)     # waits without reading: the scheduler thread reads
    assert quick in done and quick.result() == 2
    assert not slow.done()                   # the quick one came back while the slow one still ran
    release(go)
    assert slow.result(timeout=30) == 1


def killed(x):
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.cluster(n_workers=1, allowed_failures=0)
def test_a_worker_killed_while_the_waiting_thread_reads_its_channel(client):
    fut = client.submit(killed, 1)
    with pytest.raises(KilledWorker, match="SIGKILL"):
        fut.result(timeout=30)
    assert client.submit(inc, 1).result(timeout=30) == 2       # its replacement, read the same way


def test_a_ctrl_c_while_interrupts_are_held_lands_right_after_them():
    """What keeps a Ctrl-C out of the middle of a frame's handling on the main thread, also
    when another thread (pytest-timeout's, here) takes the signal from the kernel."""
    from localcluster.system.machine import hold_interrupts, release_interrupts
    seen: list = []
    old = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    try:
        held = hold_interrupts()
        os.kill(os.getpid(), signal.SIGINT)
        sum(range(10_000))          # bytecodes run: an unheld signal's handler would run by now
        assert seen == []
        release_interrupts(held)
        sum(range(10_000))
        assert seen == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGINT, old)


@pytest.mark.slow
def test_a_timeout_counts_the_time_spent_reading(client, tmp_path):
    """result(timeout) reads for a while, then (the channel given back) waits as usual: the
    two together end at the timeout, not at twice it (CPython's test_map_timeout found it)."""
    go = str(tmp_path / "go")
    slow = client.submit(held, 1, go)          # outlasts the timeout whatever the load: released after it
    t0 = time.monotonic()
    with pytest.raises(cf.TimeoutError):
        slow.result(timeout=2.0)
    assert time.monotonic() - t0 < 3.5         # twice the timeout: 4 s
    assert not slow.done()
    release(go)
    assert slow.result(timeout=30) == 1


@pytest.mark.slow
def test_a_frame_that_does_not_decode_on_the_reading_thread_breaks_the_cluster(client, monkeypatch, tmp_path):
    """As on the scheduler thread: every waiter gets ClusterBroken, not this thread alone a
    raw error."""
    from localcluster import ClusterBroken
    from localcluster.wire.channel import Channel
    receive = Channel.receive

    def garbled(self):
        if threading.current_thread() is threading.main_thread():
            raise ValueError("injected: a frame that does not decode")
        return receive(self)
    fut, helper = released_once_reading(client, tmp_path)
    monkeypatch.setattr(Channel, "receive", garbled)
    try:
        with pytest.raises(ClusterBroken, match="injected"):
            fut.result(30)
    finally:
        helper.join(30)
    with pytest.raises(ClusterBroken):
        client.submit(inc, 1)
