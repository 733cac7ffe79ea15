"""Large receive buffers kept warm for the next copy into this process (vmcopy.py).

Why: a copy into fresh memory pays for the kernel's page faults and the zeroing of every page
before the bytes move: the floor that bench.py measures (``a.copy()``). A buffer that has
been written once keeps its pages, and a copy into it is a plain memcpy, faster than the
floor itself (benchmarks/README.md has the figures). A pool of pre-faulted segments, of
private huge-page memory rather than memfds.

How a buffer comes back: never by a call. Every buffer lent keeps its mmap in a slot here, and
whatever uses the memory holds a reference to that mmap (a memoryview over it, a PickleBuffer,
the numpy array unpickled over it: each export's ``obj`` is the mmap). When the slot's
reference is the only one left (``sys.getrefcount``, calibrated below), nothing can reach the
memory and it is lent again. A value still held (a user's result, a key in the store, a pinned
payload) is never lent twice.

A buffer is lent for a value of at least half its size, and the pages past the value's last
huge page are given back first (``MADV_DONTNEED``): a worker's RSS grows by what it holds, as
the memory accounting says (test_datapath.py), not by the buffer it happens to get.

Bounds: the buffers held, lent or free, stay within ``budget`` bytes (past it a copy gets fresh
memory that is not kept); a free buffer is let go (munmap) once ``idle`` seconds have passed
since it was last lent (a value held longer goes back at the first trim after it is dropped),
and all of them at once by ``trim(everything=True)`` (a worker over its spill target, a cluster
that closes). So the memory costs at most ``budget`` more than the values held, for at most
``idle`` seconds after they are dropped. Any thread (a lock).
"""
from __future__ import annotations

import mmap
import sys
import threading
import time
from typing import Any, Callable

from . import vmcopy

__all__ = ["Recycler"]

_ROUND = vmcopy.HUGE        # sizes kept: multiples of a huge page, from one huge page up


class _Slot:
    __slots__ = ("m", "size", "since")

    def __init__(self, m: Any, size: int) -> None:
        self.m = m                  # the mmap; the slot's reference is the one that remains when unused
        self.size = size
        self.since = 0.0            # monotonic time it was last lent


def _refs(slot: _Slot) -> int:
    return sys.getrefcount(slot.m)


_ALONE = _refs(_Slot(object(), 0))      # the count when only the slot refers to it (interpreters differ)


def _unused(slot: _Slot) -> bool:
    return _refs(slot) <= _ALONE


class Recycler:
    def __init__(self, budget: int, idle: float = 1.0, clock: Callable[[], float] = time.monotonic):
        self._budget = budget
        self._idle = idle
        self._clock = clock
        self._lock = threading.Lock()
        self._slots: list[_Slot] = []      #: every buffer lent and kept; under _lock
        self._held = 0                     #: bytes of those; under _lock

    def take(self, n: int) -> Any:
        """A writable buffer of exactly ``n`` bytes: a warm one whose last user is gone when
        there is one of about that size, else fresh memory (:func:`vmcopy.fresh`)."""
        size = -(-n // _ROUND) * _ROUND
        if n < _ROUND or size > self._budget:
            return vmcopy.fresh(n)
        with self._lock:
            best = None
            for slot in self._slots:
                if size <= slot.size <= 2 * size and (best is None or slot.size < best.size) and _unused(slot):
                    best = slot
            if best is None:
                if self._held + size > self._budget:     # make room: close the free ones, and stop
                    self._let_go(lambda slot: True, forget=True)    # keeping those in use
                if self._held + size > self._budget:
                    return vmcopy.fresh(n)
                best = _Slot(vmcopy.fresh(size), size)
                self._slots.append(best)
                self._held += size
            if best.size > size:        # the pages past what this value needs go back: RSS stays exact
                best.m.madvise(mmap.MADV_DONTNEED, size, best.size - size)
            best.since = self._clock()
            return memoryview(best.m)[:n]

    def trim(self, everything: bool = False) -> int:
        """Let go of the free buffers last lent ``idle`` seconds ago or more (all free ones:
        ``everything``); the bytes let go."""
        cut = self._clock() - self._idle
        with self._lock:
            return self._let_go((lambda slot: True) if everything else (lambda slot: slot.since <= cut))

    def cached(self) -> int:
        """Bytes held in free buffers: memory this process keeps that no value uses."""
        with self._lock:
            return sum(slot.size for slot in self._slots if _unused(slot))

    def _let_go(self, which: Callable[[_Slot], bool], forget: bool = False) -> int:
        """Close the free buffers ``which`` picks; ``forget``: also stop keeping the picked ones
        in use (their memory goes when their last user lets go, as any other)."""
        kept, freed = [], 0
        for slot in self._slots:
            if not which(slot):
                kept.append(slot)
            elif _unused(slot):
                slot.m.close()
                freed += slot.size
            elif forget:
                freed += slot.size
            else:
                kept.append(slot)
        self._slots = kept
        self._held -= freed
        return freed
