"""Warm receive buffers (wire/recycle.py): lent again only once nothing refers to them, kept
within a budget and let go when idle. In-process; the worker's use is in test_vmcopy.py."""
from __future__ import annotations

import pickle

import pytest

from localcluster.wire import vmcopy
from localcluster.wire.recycle import Recycler

pytestmark = pytest.mark.timeout(30)

MiB = 1 << 20


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def where(buf) -> int:
    return vmcopy.address(buf)[0]


def test_a_buffer_nobody_holds_is_lent_again_warm():
    r = Recycler(64 * MiB)
    a = r.take(5 * MiB)
    assert len(a) == 5 * MiB and not a.readonly
    a[:3] = b"abc"
    first = where(a)
    del a
    b = r.take(5 * MiB + 100)           # the same 6 MiB slot fits
    assert where(b) == first and bytes(b[:3]) == b"abc"     # warm: the same pages, not zeroed
    assert len(b) == 5 * MiB + 100


@pytest.mark.parametrize("holder", ["view", "slice of a view", "PickleBuffer", "numpy array", "unpickled array"])
def test_a_buffer_still_reachable_is_never_lent_twice(holder):
    r = Recycler(64 * MiB)
    a = r.take(4 * MiB)
    first = where(a)
    if holder == "view":
        held = memoryview(a)
    elif holder == "slice of a view":
        held = memoryview(a)[10:20]      # shares the managed buffer, not ``a``
    elif holder == "PickleBuffer":
        held = pickle.PickleBuffer(a)
    else:
        np = pytest.importorskip("numpy")
        if holder == "numpy array":
            held = np.frombuffer(a, dtype=np.uint8)[::2]
        else:
            buffers = []
            dumped = pickle.dumps(np.ones(4 * MiB // 8), protocol=5, buffer_callback=buffers.append)
            a[:] = buffers[0].raw()
            held = pickle.loads(dumped, buffers=[pickle.PickleBuffer(a)])
            assert held.sum() == 4 * MiB // 8
    del a
    b = r.take(4 * MiB)
    assert where(b) != first
    assert r.cached() == 0
    del held, b
    assert r.cached() == 8 * MiB
    assert where(r.take(4 * MiB)) == first


def test_a_larger_buffer_lent_for_a_smaller_value_gives_back_the_pages_past_it():
    """RSS grows by what a value needs: the tail of a larger warm buffer is let go (it reads
    as zeros again), the value's own pages stay warm."""
    import ctypes
    r = Recycler(64 * MiB)
    a = r.take(8 * MiB)
    a[:] = b"\xab" * len(a)
    first = where(a)
    del a
    b = r.take(3 * MiB)                 # a 4 MiB need: the 8 MiB buffer, its last 4 MiB let go
    assert where(b) == first and bytes(b[:2]) == b"\xab\xab"
    assert ctypes.string_at(first + 4 * MiB - 4, 4) == b"\xab" * 4         # kept up to 4 MiB
    assert ctypes.string_at(first + 6 * MiB, 4) == bytes(4)                 # given back


def test_sizes_far_apart_do_not_share_a_buffer():
    """A 2 MiB copy does not pin a 64 MiB buffer, nor does a small one take any."""
    r = Recycler(256 * MiB)
    big = r.take(64 * MiB)
    first = where(big)
    del big
    assert where(r.take(3 * MiB)) != first
    small = r.take(4096)
    assert isinstance(small, (bytearray, memoryview)) or len(small) == 4096
    assert r.cached() >= 64 * MiB


def test_the_budget_bounds_what_is_kept_and_past_it_memory_is_fresh():
    r = Recycler(10 * MiB)
    a = r.take(8 * MiB)                 # kept: 8 of 10 MiB
    b = r.take(8 * MiB)                 # room made: ``a``, in use, is no longer kept; ``b`` is
    del a
    assert r.cached() == 0              # ``a``'s memory went with its last user
    del b
    assert r.cached() == 8 * MiB
    c = r.take(10 * MiB)                # the free 8 MiB is let go to make room for 10
    del c
    assert r.cached() == 10 * MiB
    d = r.take(12 * MiB)                # larger than the budget: fresh, never kept
    del d
    assert r.cached() == 10 * MiB


def test_free_buffers_are_let_go_after_being_idle_and_all_at_close():
    clock = Clock()
    r = Recycler(64 * MiB, idle=1.0, clock=clock)
    a, b = r.take(4 * MiB), r.take(4 * MiB)
    del a
    clock.now += 0.5
    assert r.trim() == 0                # not idle long enough
    clock.now += 0.6
    assert r.trim() == 4 * MiB          # the free one; ``b`` is in use
    assert r.cached() == 0
    del b
    assert r.trim(everything=True) == 4 * MiB
    assert r.cached() == 0
