"""The scheduler thread's watchdog.

The scheduler thread spends its life in ``select``; it is busy only while it handles
what woke it. ``EventLoop.busy_since`` says since when it has been busy. If that lasts
longer than ``scheduler_watchdog`` seconds while tasks are pending, the thread is stuck
(a bug in localcluster, or a lock taken by something it calls), and every pending future
would wait forever. The watchdog then captures the thread's stack and hands it to
``on_stall``, which breaks the cluster with ClusterBroken: every waiter gets an error
that carries the stack, at once.

It is the one timer here that is not an event: a stuck thread sends no event. It wakes
four times per limit, reads two attributes and sleeps again.
"""
from __future__ import annotations

import sys
import threading
import time
import traceback
from typing import Callable, Optional

from .loop import EventLoop
from ..system.machine import block_interrupts

__all__ = ["Watchdog"]


class Watchdog:
    def __init__(self, loop: EventLoop, limit: float, pending: Callable[[], bool],
                 on_stall: Callable[[float, str], None]):
        self._loop = loop               # read only: busy_since and thread
        self._limit = limit
        self._pending = pending
        self._on_stall = on_stall
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="localcluster-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        block_interrupts()
        while not self._stop.wait(self._limit / 4):
            since = self._loop.busy_since
            if since is None:
                continue
            stalled = time.monotonic() - since
            if stalled > self._limit and self._pending():
                self._on_stall(stalled, _stack_of(self._loop.thread))
                return


def _stack_of(thread: Optional[threading.Thread]) -> str:
    frame = sys._current_frames().get(thread.ident) if thread is not None and thread.ident else None
    if frame is None:
        return "(the scheduler thread's stack could not be read)\n"
    return "".join(traceback.format_stack(frame))
