"""A user thread that waits for one future reads its worker's channel itself, so that the
reply wakes one thread instead of two (the scheduler thread's, then the waiter's).

    Future.result ─► Gateway.wait_here ─► Supervisor.read_for ─► LentReading.read_for
        EventLoop.lend: the channel leaves the scheduler thread's selector
        select(channel, the nanny's Doorbell) ◄── Finished / Failed
        one frame at a time, under Nanny.reading (taken before the cluster's lock):
            task results ─► Dispatcher.on_worker_messages on this thread
            anything else (OWN, Ask) ─► Nanny.left_for_loop, for the scheduler thread (in order)
        EventLoop.give_back: the channel returns to the selector

The bell rings when another thread ends the future (a death, a cancel, a rerun elsewhere,
the cluster closing) or queues a backlog on the lent channel. While a frame is handled on
the main thread, SIGINT's handler only records the signal (``hold_interrupts``): a Ctrl-C
lands after the state change, not inside it. A failure while handling a frame breaks the
cluster, as on the scheduler thread; ``EventLoop.lent_busy`` lets the watchdog see a thread
stuck in one.

Owns: the idents of the threads reading (any thread adds and removes its own).
"""
from __future__ import annotations

import select
import threading
import time
import traceback
from typing import Any, Callable, Optional

from ..engine.dispatch import Dispatcher
from ..engine.loop import EventLoop
from ..system.machine import hold_interrupts, release_interrupts
from ..system.spin import poll_for
from ..wire import protocol as P
from .nanny import Nanny

__all__ = ["LentReading", "OWN"]

#: the messages only the scheduler thread handles (the supervisor's own)
OWN = (P.Ready, P.Fatal, P.Log, P.Pressure)


class LentReading:
    def __init__(self, loop: EventLoop, dispatch: Dispatcher, handle_left: Callable[[Nanny], None],
                 spin_wait: float = 0.0):
        self._loop = loop
        self._dispatch = dispatch
        self._handle_left = handle_left    # the supervisor's: the scheduler thread handles a frame left for it
        self._spin_wait = spin_wait     # seconds of polling before the first select sleeps (spin.py)
        self._readers: set = set()      #: idents of the threads reading a lent channel; each adds and removes its own

    def read_for(self, n: Nanny, done: Callable[[], bool], watch: Callable[[Optional[Callable[[], None]]], None],
                 deadline: Optional[float]) -> None:
        """Read ``n``'s channel on this thread until ``done()`` (or ``deadline``, monotonic),
        instead of the scheduler thread reading it and then waking this one. ``watch(ring)``
        hands the future what wakes this thread when another thread ends it, ``watch(None)``
        takes it back. Returns at once when the channel is lent to another thread already or
        its worker is gone, and early when a frame carries more than task results (the
        scheduler thread takes that frame next, in order) or the worker goes: the caller
        then waits as usual. Never blocks the scheduler thread: it only waits for
        ``reading`` while one frame is handled here."""
        chan = n.chan
        if chan is None or not self._loop.lend(chan, n.bell.ring):
            return
        me = threading.get_ident()
        bell = n.bell

        def ring() -> None:                 # on the thread that ends the future
            if threading.get_ident() != me:
                bell.ring()
        self._readers.add(me)
        try:
            fd, wake = chan.fileno(), bell.fileno()
            if fd < 0 or wake < 0:
                return
            watch(ring)
            spin = self._spin_wait
            while not done():
                timeout = None
                if deadline is not None:
                    timeout = deadline - time.monotonic()
                    if timeout <= 0:
                        return
                if spin:                    # once: the reply of a short task comes while polling
                    spin = 0.0
                    poller = select.poll()
                    poller.register(fd, select.POLLIN)
                    poller.register(wake, select.POLLIN)
                    ready = poll_for(poller, self._spin_wait if timeout is None else min(timeout, self._spin_wait))
                    if ready == [(fd, select.POLLIN)] and not chan.wants_write():
                        # the reply alone: read it now, without asking select what poll said
                        if not self._read_lent(n, chan):
                            return
                        continue
                try:
                    readable, writable, _ = select.select([fd, wake], [fd] if chan.wants_write() else [], [], timeout)
                except (OSError, ValueError):       # closed under us: its worker is gone
                    return
                if wake in readable:
                    bell.quiet()
                if writable:
                    chan.flush()
                if fd in readable and not self._read_lent(n, chan):
                    return
        finally:
            watch(None)
            self._readers.discard(me)
            self._loop.give_back(chan)

    def reads_here(self) -> bool:
        return threading.get_ident() in self._readers

    def _read_lent(self, n: Nanny, chan: Any) -> bool:
        """One frame of a lent channel, read and handled on this thread; False: stop reading
        (the channel is closed, or the frame is left for the scheduler thread)."""
        with n.reading:
            held = hold_interrupts()        # a Ctrl-C lands after the state change, not inside it
            try:
                if n.left_for_loop or chan.closed:
                    return False
                try:
                    msgs = chan.receive()
                except (EOFError, OSError):     # the scheduler thread sees it once given back
                    return False
                except Exception:   # a frame that does not decode: as on the scheduler thread
                    raise self._dispatch.break_("channel reader, on a thread reading for its future",
                                                traceback.format_exc()) from None
                tasks: list = []
                for m in msgs:
                    for one in (m.messages if type(m) is P.Batch else (m,)):
                        t = type(one)
                        if t in OWN or t is P.Ask:
                            n.left_for_loop.append(msgs)
                            self._loop.run_soon(lambda: self._handle_left(n))
                            return False
                        tasks.append(one)
                if tasks:
                    self._handle(n, tasks)
                return True
            finally:
                release_interrupts(held)

    def _handle(self, n: Nanny, tasks: list) -> None:
        busy = self._loop.lent_busy
        me = threading.get_ident()
        busy[me] = time.monotonic()        # the watchdog watches this thread meanwhile
        try:
            self._dispatch.on_worker_messages(n.name, tasks)
        except Exception:   # as on the scheduler thread: a bug here breaks the cluster
            raise self._dispatch.break_("scheduler, on a thread reading for its future",
                                        traceback.format_exc()) from None
        finally:
            busy.pop(me, None)
