"""The dispatcher's handling of released keys, without processes: a stand-in scheduler
records what it is asked to release."""
from __future__ import annotations

import threading

import pytest

from localcluster.dispatch import Dispatcher

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
