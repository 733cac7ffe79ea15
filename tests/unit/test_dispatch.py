"""The dispatcher without processes: a stand-in scheduler records what it is asked to
release, or sends a message over a real socket pair."""
from __future__ import annotations

import select
import socket
import threading
import time
import types

import pytest

from localcluster.wire import protocol as P
from localcluster.wire.channel import BlockingChannel, Channel
from localcluster.engine import dispatch
from localcluster.engine.dispatch import Dispatcher, Flush
from localcluster.engine.lifecycle import Lifecycle, Phase
from localcluster.scheduler import events as E, state as S
from localcluster.scheduler.records import Retire, Send, Spec
from localcluster.wire.serialize import dumps

pytestmark = pytest.mark.timeout(30)


class Recording:
    def __init__(self) -> None:
        self.calls: list[list] = []

    def handle(self, *events) -> list:
        self.calls += [list(e.keys) for e in events if type(e) is E.Drop]
        return []


def dispatcher(scheduler, loop=None, life=None, lock=None) -> Dispatcher:
    lock = lock or threading.Lock()
    return Dispatcher(lock, threading.Condition(lock), scheduler, loop=loop or Loop(), history=None, life=life or Lifecycle())


def test_released_keys_are_let_go_in_order_in_bounded_chunks():
    """200,000 keys dropped at once (a big map's futures) are let go a few thousand at a
    time, so that the lock is never held for all of them."""
    s = Recording()
    d = dispatcher(s)
    keys = [f"k-{i}" for i in range(12_345)]
    for k in keys:
        d.release(k)
    d.free_released()
    assert [k for call in s.calls for k in call] == keys
    assert len(s.calls) >= 3 and max(len(c) for c in s.calls) <= 5000


def test_keys_released_while_the_cluster_closes_are_not_let_go_one_by_one():
    """close() does not wait for the scheduler thread to release, key by key, what goes
    with everything else (close() with 200,000 queued after a map of as many was dropped)."""
    s = Recording()
    life = Lifecycle()
    d = dispatcher(s, life=life)
    for i in range(10_000):
        d.release(f"k-{i}")
    d.stop_releasing()
    life.to(Phase.CLOSING)
    d.release("late")
    d.free_released()
    assert s.calls == []


PING = E.CancelKeys(["k"])          # a stand-in's event: a message to worker ``w``
LET_GO = E.HandOff("w")         # a stand-in's event: worker ``w`` retired


class Sending:
    """A stand-in scheduler whose events send a message to worker ``w`` (PING) or retire
    it (LET_GO)."""

    def handle(self, *events) -> list:
        return [Retire("w") if e == LET_GO else Send("w", P.Free(("k",))) for e in events]

    def backlogged(self, worker: str) -> bool:
        return False


class Loop:
    def __init__(self) -> None:
        self.woken = 0

    def on_loop(self) -> bool:
        return False

    def run_soon(self, fn) -> None:
        raise AssertionError("nothing is left for the scheduler thread here")

    def wake(self) -> None:
        self.woken += 1


def test_a_message_is_queued_under_the_lock_and_sent_after_it():
    """The sendmsg syscall (and the worker's wake-up) is not made under the lock that the
    other thread, submitting or handling results, may be waiting for."""
    lock = threading.Lock()
    held_at_flush: list = []

    class Checking(Channel):
        def flush(self) -> bool:
            held_at_flush.append(lock.locked())
            return super().flush()
    here, there = socket.socketpair()
    chan = Checking(here)
    peer = BlockingChannel(there)
    try:
        s = Sending()
        d = dispatcher(s, loop=Loop(), lock=lock)
        with lock:
            d.connect("w", chan)
            post = d.apply(s.handle(PING))
        assert [type(a) for a in post] == [Flush] and held_at_flush == []    # queued, not sent
        d.post(post)
        assert held_at_flush == [False]
        assert peer.recv_all() == [P.Free(("k",))]
        d.event(PING)                    # the same, as one event
        assert held_at_flush == [False, False]
        assert peer.recv_all() == [P.Free(("k",))]
    finally:
        chan.close()
        peer.close()


def test_a_retire_from_a_user_thread_is_left_for_the_scheduler_thread():
    """A cancel on the user's thread that lets a worker go makes no syscall to it there:
    the supervisor takes the retirement on the scheduler thread, woken for it."""
    loop = Loop()
    s = Sending()
    d = dispatcher(s, loop=loop)
    d.event(LET_GO)
    assert loop.woken == 1
    assert d.take_retired() == ["w"] and d.take_retired() == []


def test_a_landed_is_never_corked_behind_a_backlog():
    """Sends to a worker with a backlog wait for the scheduler thread's next tick, but not a
    Landed: the worker holds back all it reads behind the value it waits for (up to 50 ms a
    large argument, measured). It goes at once, in a frame of its own, ahead of what was corked
    (in one frame with a Run whose buffers land too, the worker held the Landed behind the
    value it lets go: a map of large arrays hung, issue 53)."""
    class Backlogged(Sending):
        def backlogged(self, worker: str) -> bool:
            return True
    here, there = socket.socketpair()
    chan, peer = Channel(here), BlockingChannel(there)
    try:
        s = Backlogged()
        lock = threading.Lock()
        d = dispatcher(s, loop=Loop(), lock=lock)
        with lock:
            d.connect("w", chan)
        d.event(PING)
        assert select.select([there], [], [], 0)[0] == []      # corked: nothing sent yet
        d.drive(also=[Send("w", P.Landed((5,)))])
        assert select.select([there], [], [], 5)[0] == [there], "the Landed was corked"
        got = peer.recv_all()
        if len(got) < 2:
            got += peer.recv_all()
        assert got == [P.Landed((5,)), P.Free(("k",))]
    finally:
        chan.close()
        peer.close()


# --- a burst of submits, deferred ------------------------------------------------------------

class Batches(S.Scheduler):
    """The real scheduler, counting how submits reach it."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list = []

    def handle(self, *events):
        keys = [s.key for e in events if type(e) is E.Submit for s in e.specs]
        if keys:
            self.events.append(keys)
        return super().handle(*events)


def spec(key: str) -> Spec:
    return Spec(key, 1, b"fn", dumps(((), {})), ())


@pytest.fixture
def burst(monkeypatch):
    """Every submit in a test counts as part of a burst, however slow the machine."""
    monkeypatch.setattr(dispatch, "BURST", 3600.0)


def test_a_burst_of_submits_reaches_the_scheduler_once_in_order_and_wakes_the_loop_once(burst):
    s, loop = Batches(), Loop()
    s.handle(E.AddWorker("w", 1))
    d = dispatcher(s, loop=loop)
    made = [d.submit([spec(f"k{i}")], None, lambda i=i: f"future {i}") for i in range(5)]
    assert made == [f"future {i}" for i in range(5)]        # track()'s futures, at once
    assert s.events == [["k0"]]                             # the first went straight; four wait
    assert loop.woken == 1                                  # the scheduler thread, for them
    assert sorted(s.tasks) == ["k0"]
    with d.locked():                                          # a reader of the state sees every one
        assert sorted(s.tasks) == [f"k{i}" for i in range(5)]
    assert s.events == [["k0"], ["k1", "k2", "k3", "k4"]]
    assert [s.tasks[f"k{i}"].order for i in range(5)] == sorted(s.tasks[f"k{i}"].order for i in range(5))
    d.submit([spec("k5")], None, list)                      # a new burst: one more wake-up
    assert loop.woken == 2


def test_a_deferred_submit_comes_before_any_other_event_and_before_its_key_is_let_go(burst):
    s = Batches()
    d = dispatcher(s, loop=Loop())
    d.submit([spec("a")], None, list)
    d.submit([spec("b")], None, list)                       # deferred
    d.event(E.CancelKeys(["b"]))                                # comes after b's submit
    assert s.events == [["a"], ["b"]] and "b" not in s.tasks
    d.submit([spec("c")], None, list)                       # deferred, then let go
    d.release("c")
    d.free_released()
    assert "c" not in s.tasks and s.events[-1] == ["c"]     # submitted, then released: no task left behind


def test_a_wait_ends_the_burst_and_the_scheduler_thread_never_defers(burst):
    s, loop = Batches(), Loop()
    d = dispatcher(s, loop=loop)
    d.submit([spec("a")], None, list)
    d.submit([spec("b")], None, list)
    d.end_burst()                                              # about to wait: b goes now
    d.submit([spec("c")], None, list)                       # and the next goes straight
    assert s.events == [["a"], ["b"], ["c"]]
    loop.on_loop = lambda: True
    d.submit([spec("d")], None, list)
    assert s.events[-1] == ["d"]


@pytest.mark.parametrize("since_boot", [0.0, 5.0, 1200.0, 1e7])
def test_the_first_submit_after_construction_is_never_a_burst_whatever_the_clock_reads(burst, monkeypatch,
                                                                                      since_boot):
    """time.monotonic() counts from boot: on a machine up for less than BURST (an hour here)
    a first submit measured against a last one "at 0.0" was taken for part of a burst."""
    clock = types.SimpleNamespace(**{name: getattr(time, name) for name in dir(time) if not name.startswith("_")})
    clock.monotonic = lambda: since_boot
    monkeypatch.setattr(dispatch, "time", clock)
    s, loop = Batches(), Loop()
    d = dispatcher(s, loop=loop)
    d.submit([spec("a")], None, list)
    assert s.events == [["a"]] and loop.woken == 0           # straight to the scheduler, nothing deferred
    d.submit([spec("b")], None, list)                        # the second, at once: a burst
    assert s.events == [["a"]] and loop.woken == 1
    d.end_burst()                                               # a wait ends the burst: the next goes straight
    d.submit([spec("c")], None, list)
    assert s.events == [["a"], ["b"], ["c"]]


def test_submits_more_than_the_burst_apart_are_never_deferred(monkeypatch):
    monkeypatch.setattr(dispatch, "BURST", 0.0)
    s, loop = Batches(), Loop()
    d = dispatcher(s, loop=loop)
    for i in range(3):
        d.submit([spec(f"k{i}")], None, list)
    assert s.events == [["k0"], ["k1"], ["k2"]] and loop.woken == 0


def test_a_long_burst_is_admitted_by_the_submitting_thread_a_batch_at_a_time(burst, monkeypatch):
    """What a deferred batch holds (its specs, then its runs and frame) stays small: the
    first-round memory of 1,000 queued no-ops rose ~150 bytes a task with batches unbounded."""
    monkeypatch.setattr(dispatch, "BATCH", 3)
    s, loop = Batches(), Loop()
    d = dispatcher(s, loop=loop)
    for i in range(8):
        d.submit([spec(f"k{i}")], None, list)
    assert s.events == [["k0"], ["k1", "k2", "k3"], ["k4", "k5", "k6"]]
    d.end_burst()
    assert s.events[-1] == ["k7"]
