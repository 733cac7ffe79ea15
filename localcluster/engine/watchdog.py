"""The scheduler thread's watchdog.

The scheduler thread spends its life in ``select``; it is busy only while it handles
what woke it. ``EventLoop.busy_since`` says since when it has been busy. If that lasts
longer than ``scheduler_watchdog`` seconds while tasks are pending, the thread is stuck
(a bug in localcluster, or a lock taken by something it calls), and every pending future
would wait forever. The watchdog then captures the thread's stack and hands it to
``on_stall``, which breaks the cluster with ClusterBroken: every waiter gets an error
that carries the stack, at once.

A user thread that reads its worker's channel while it waits for a future (supervisor.py,
``read_for``) handles what it read as the scheduler thread would: ``EventLoop.lent_busy``
says since when, and the watchdog watches those threads too. Such a thread stuck in our
code is itself the waiter and stays stuck; every other waiter fails at once.

It is the one timer here that is not an event: a stuck thread sends no event. It wakes
four times per limit, reads two attributes and sleeps again.
"""
from __future__ import annotations

import threading
import time
import traceback
from typing import Callable, Optional

from .loop import EventLoop
from ..system.machine import block_interrupts, frame_of

__all__ = ["Watchdog"]


class Watchdog:
    def __init__(self, loop: EventLoop, limit: float, pending: Callable[[], bool],
                 on_stall: Callable[[float, str, str], None]):
        self._loop = loop               # read only: busy_since, lent_busy and thread
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
            now = time.monotonic()
            thread = self._loop.thread
            stuck = [(now - t, reader) for reader, t in list(self._loop.lent_busy.items()) if now - t > self._limit]
            since = self._loop.busy_since
            if since is not None and now - since > self._limit and thread is not None:
                # last: while a reading thread is stuck holding the cluster's lock, the
                # scheduler thread waits for it, and that thread is the one to name
                stuck.append((now - since, thread.ident))
            if not stuck or not self._pending():
                continue
            names = {t.ident: t.name for t in threading.enumerate()}

            def who(ident: Optional[int]) -> str:
                if thread is not None and ident == thread.ident:
                    return "scheduler thread"
                return f"thread {names.get(ident, ident)!r}, handling results it read while waiting for a future,"
            stalled, first = stuck[0]
            stacks = _stack_of(first, who(first)) + "".join(
                f"also stuck for {s:.1f} s, the {who(ident).rstrip(',')}:\n{_stack_of(ident, who(ident))}"
                for s, ident in stuck[1:])
            self._on_stall(stalled, stacks, who(first))
            return


def _stack_of(ident: Optional[int], who: str) -> str:
    frame = frame_of(ident) if ident else None
    if frame is None:
        return f"(the stack of the {who} could not be read)\n"
    return "".join(traceback.format_stack(frame))
