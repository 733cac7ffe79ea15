"""The dispatcher without processes: a stand-in scheduler records what it is asked to
release, or sends a message over a real socket pair."""
from __future__ import annotations

import socket
import threading

import pytest

from localcluster import protocol as P
from localcluster.channel import BlockingChannel, Channel
from localcluster.dispatch import Dispatcher
from localcluster.nanny import Nanny
from localcluster.records import Send

pytestmark = pytest.mark.timeout(30)


class Recording:
    def __init__(self) -> None:
        self.calls: list[list] = []

    def release_many(self, keys: list) -> list:
        self.calls.append(list(keys))
        return []


def dispatcher(scheduler: Recording) -> Dispatcher:
    lock = threading.Lock()
    return Dispatcher(lock, threading.Condition(lock), scheduler, loop=None, history=None)


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
    d = dispatcher(s)
    for i in range(10_000):
        d.release(f"k-{i}")
    d.stop_releasing()
    d.release("late")
    d.free_released()
    assert s.calls == []


class Sending:
    """A stand-in scheduler whose one event sends a message to worker ``w``."""

    def __init__(self) -> None:
        self.workers: dict = {}

    def ping(self) -> list:
        return [Send("w", P.Free(("k",)))]


class Workers:
    def __init__(self, nanny: Nanny) -> None:
        self.n = nanny

    def nanny(self, name: str) -> Nanny:
        return self.n


class Loop:
    def on_loop(self) -> bool:
        return False

    def run_soon(self, fn) -> None:
        raise AssertionError("nothing is left for the scheduler thread here")


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
    n = Nanny("w", 1, None, {}, None, None, False, 10)
    n.chan = Checking(here)
    peer = BlockingChannel(there)
    try:
        s = Sending()
        d = Dispatcher(lock, threading.Condition(lock), s, loop=Loop(), history=None)
        d.bind(Workers(n))
        d.event(s.ping)
        assert held_at_flush == [False]
        assert peer.recv_all() == [P.Free(("k",))]
    finally:
        n.chan.close()
        peer.close()
