"""How a worker's threads share its channel: whoever is idle reads, a run queued wakes one
idle executor, and the main thread reads only while every executor is busy, called once
nobody has read for a while (worker/turn.py)."""
from __future__ import annotations

import os
import socket
import threading

import pytest

from localcluster import Client, LocalCluster
from localcluster.wire import protocol as P
from localcluster.wire import serialize
from localcluster.wire.board import Board
from localcluster.worker.process import Worker

from _util import block_until, release, wait_for
from localcluster.client.future import gateway_of

pytestmark = pytest.mark.timeout(90)


def blocker(path, i):
    block_until(path)
    return i


def marks(path):
    open(path, "w").close()
    return path


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.slow
def test_a_worker_whose_every_thread_is_busy_still_sends_data_and_takes_cancels(tmp_path, threads):
    """The parent fetches a large result and cancels a queued run while every executor of
    the worker runs a long task: only the main thread is left to read the channel."""
    go = tmp_path / "go"
    with LocalCluster(n_workers=1, threads_per_worker=threads, forward_logs=False) as c, Client(c) as cl:
        big = cl.submit(bytes, 1 << 20, pure=False)      # > INLINE_RESULT: stays on the worker
        cl.gather([cl.submit(len, big)])     # done there; the parent holds no copy yet
        busy = [cl.submit(blocker, str(go), i, pure=False) for i in range(threads)]
        wait_for(lambda: all(f.key in gateway_of(cl).running_tasks() for f in busy))
        queued = cl.submit(marks, str(tmp_path / "ran"), pure=False)
        assert big.result(30) == bytes(1 << 20)          # an Export read, and its Data sent back
        cl.cancel([queued])
        assert queued.cancelled()
        release(go)
        assert cl.gather(busy) == list(range(threads))
        assert cl.submit(len, big).result(30) == 1 << 20     # the worker serves on
        assert not (tmp_path / "ran").exists(), "the cancelled run was executed"


class _Turn:
    """The main thread's turn, recorded: what arm, disarm and call_now were asked (no timer)."""

    def __init__(self):
        self.calls: list = []
        self.armed = False

    def arm(self):
        self.calls.append("arm")
        self.armed = True

    def disarm(self):
        self.calls.append("disarm")
        self.armed = False

    def call_now(self):
        self.calls.append("call_now")


class _Counting(threading.Condition):
    """Records how many waiters each notify asked for (notify_all asks for all of them)."""

    def __init__(self, lock):
        super().__init__(lock)
        self.calls: list = []

    def notify(self, n=1):
        self.calls.append(n)
        super().notify(n)


@pytest.fixture
def worker():
    """A Worker object in this process, with no thread started: the test plays its executors."""
    mine, theirs = socket.socketpair()
    board = Board(4)
    w = Worker({"name": "w", "nthreads": 4, "board_fd": os.dup(board.fd), "sock_fd": theirs.detach()})
    real = w.turn
    w._work, w.turn = _Counting(w._lock), _Turn()
    yield w
    real.close()
    w.chan.close()
    w.board.close()
    board.close()
    os.close(w._nudge_r)
    os.close(w._nudge_w)
    mine.close()


def _run(seq):
    return P.Run(seq, f"k{seq}", 1, None, serialize.dumps(((), {})), ())


def test_a_run_queued_wakes_one_idle_executor_and_the_main_thread_only_when_nobody_is_left_to_read(worker):
    w = worker
    assert w._next_run(1) is None and w._reader == 1       # an idle executor takes the reader role
    got: dict = {}
    waiters = [threading.Thread(target=lambda row=row: got.__setitem__(row, w._next_run(row))) for row in (2, 3, 4)]
    for t in waiters:
        t.start()
    try:
        _hand_offs(w, got)
    finally:        # a failed assertion must not leave an executor waiting
        for seq in range(100, 100 + sum(t.is_alive() for t in waiters)):
            w._queue(_run(seq))
        for t in waiters:
            t.join(5)


def _hand_offs(w, got):
    wait_for(lambda: w._idle == 3)
    w._queue(_run(1))           # read by executor 1
    assert w._work.calls == [1]     # one of the three idle executors, not all of them
    wait_for(lambda: len(got) == 1)
    taker = next(iter(got))
    assert got[taker].seq == 1 and w._idle == 2
    # Executor 1 lets go of the role and finds the queue empty: it reads again, no one is woken.
    with w._lock:
        w._reader = None
    assert w._next_run(1) is None and w._reader == 1
    assert w._work.calls == [1] and not w.turn.armed
    # Two runs: the two idle executors take them; the reader takes none. Still not the main thread.
    w._queue(_run(2))
    w._queue(_run(3))
    wait_for(lambda: len(got) == 3)
    assert sorted(r.seq for r in got.values()) == [1, 2, 3] and w._idle == 0
    assert w._work.calls == [1, 1, 1] and "arm" not in w.turn.calls
    # The reader takes a run while every other executor is busy: nobody reads now, so the main
    # thread's turn is armed (not a wake-up: it is called only if the run outlasts the delay).
    w._queue(_run(4))
    with w._lock:
        w._reader = None
    assert w._next_run(1).seq == 4
    assert w.turn.calls[-1] == "arm" and w.turn.armed
    # One more run taken while the channel is still unread: the first moment stands.
    w._queue(_run(5))
    with w._lock:
        w._busy -= 1        # as if another executor had ended its run
    assert w._next_run(2, ran=False).seq == 5
    assert w.turn.calls.count("arm") == 2 and w.turn.armed
    # A run ends and its executor takes the reader role back: the main thread is not called.
    with w._lock:
        w._busy -= 1
    assert w._next_run(1, ran=True) is None and w._reader == 1
    assert w.turn.calls[-1] == "disarm" and not w.turn.armed
