"""The scheduler thread's event loop: one selector, a wake-up pipe and a command queue.

Thread: ``run()`` is the whole life of the ``localcluster-scheduler`` thread, and every
handler runs on it. ``call``, ``run_soon`` and ``wake`` may be called from any thread.
Whether the thread has ended is the cluster's ``Lifecycle`` (STOPPED): its owner moves
it there as the thread ends, then fails what is left with ``fail_pending``; a command
handed over after that fails at once.

Owns: the selector (each registered file object carries the callable to run when it
is ready), the wake-up pipe (a self-pipe: a write from another thread ends the
current ``select``) and the queue of commands other threads hand to this one. It
knows nothing of workers or tasks.

A channel may be lent to another thread (``lend``, ``give_back``): a user thread that waits
for one future reads that worker's channel itself, and the selector leaves the channel out
meanwhile, so that only one thread wakes for its reply (supervisor.py, ``read_for``).
Registrations change under ``_reg_lock``, from any thread.

A persistent epoll selector is used instead of ``multiprocessing.connection.wait``
(which builds a new poller on every call) and because it can also wait for a socket
to become writable; our own (selector.py), which pauses a lent channel with one system call.
"""
from __future__ import annotations

import os
import selectors
import threading
import time
from collections import deque
from concurrent.futures import Future
from typing import Any, Callable, Optional

from . import selector
from .lifecycle import Lifecycle
from ..system.machine import block_interrupts


class EventLoop:
    def __init__(self, life: Lifecycle, on_wake: Callable[[], None]):
        self._selector = selector.make()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, self._woken)
        #: every change of the selector's registrations (any thread: a lend comes from a user thread)
        self._reg_lock = threading.Lock()
        #: file object -> the wake-up of the thread it is lent to; under _reg_lock
        self._lent: dict = {}
        self._commands: deque = deque()       # (fn, Future or None), appended by any thread
        self._on_wake = on_wake               # runs first on every wake-up (work queued lock-free)
        self.thread: Optional[threading.Thread] = None
        self._life = life
        # Since when the loop thread has been handling what woke it (None: in select).
        # Written by the loop thread only; the watchdog reads it.
        self.busy_since: Optional[float] = None
        #: thread ident -> since when that thread, reading a lent channel, has been handling
        #: one of its frames (what busy_since is for the loop thread). Each thread writes its
        #: own entry; the watchdog reads them.
        self.lent_busy: dict = {}

    def start(self, main: Callable[[], None]) -> None:
        def run() -> None:
            block_interrupts()
            main()
        self.thread = threading.Thread(target=run, name="localcluster-scheduler", daemon=True)
        self.thread.start()

    def on_loop(self) -> bool:
        return threading.current_thread() is self.thread

    # --- any thread -----------------------------------------------------------------------

    def call(self, fn: Callable[[], Any]) -> Future:
        """Run ``fn`` on the loop thread (at once when already there); its result as a Future."""
        fut: Future = Future()
        if self.on_loop():
            fut.set_result(fn())
            return fut
        self._commands.append((fn, fut))
        if self._life.thread_ended:   # nobody will run it (checked after appending: the end drains after moving)
            self.fail_pending()
        else:
            self.wake()
        return fut

    def run_soon(self, fn: Callable[[], Any]) -> None:
        """``fn`` on the loop thread, nobody waiting for it (at once when already there)."""
        if self.on_loop():
            fn()
        else:
            self._commands.append((fn, None))
            self.wake()

    def wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):   # full (a wake-up is pending anyway) or closed
            pass

    # --- the loop thread ------------------------------------------------------------------

    def register(self, fileobj: Any, handler: Callable[[int], None], write: bool = False) -> None:
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if write else 0)
        with self._reg_lock:
            self._selector.register(fileobj, events, handler)

    def want_write(self, fileobj: Any, write: bool) -> None:
        """Select ``fileobj`` for writing too (or no longer), with the handler it has."""
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if write else 0)
        with self._reg_lock:
            try:
                key = self._selector.get_key(fileobj)
            except (KeyError, ValueError):    # already unregistered: its worker is gone
                return
            if key.fileobj is not fileobj:    # a newer registration on a reused fd number
                return
            self._selector.modify(fileobj, events, key.data)    # lent: selected so when given back
            wake = self._lent.get(fileobj)
            if wake is not None and write:
                wake()                        # the borrower flushes it meanwhile

    def unregister(self, fileobj: Any) -> None:
        """No longer selected, nor selected again when given back (its worker is gone)."""
        with self._reg_lock:
            self._lent.pop(fileobj, None)
            try:
                self._selector.unregister(fileobj)
            except (KeyError, ValueError):
                pass

    def lend(self, fileobj: Any, wake: Callable[[], None]) -> bool:
        """Any thread: leave ``fileobj`` out of the selection until :meth:`give_back`, for the
        calling thread to read it (and to write what is queued on it: ``wake()`` is called when
        a writer asks to wait for it to become writable, see :meth:`want_write`). False if it
        is not registered (gone) or lent already. One system call (selector.py)."""
        with self._reg_lock:
            if fileobj in self._lent:
                return False
            try:
                key = self._selector.get_key(fileobj)
            except (KeyError, ValueError):
                return False
            if key.fileobj is not fileobj:       # a newer registration on a reused fd number
                return False
            self._selector.pause(fileobj)
            self._lent[fileobj] = wake
            return True

    def give_back(self, fileobj: Any) -> None:
        """Select a lent ``fileobj`` again, unless it was unregistered meanwhile."""
        with self._reg_lock:
            if self._lent.pop(fileobj, None) is not None:
                self._selector.resume(fileobj)

    def run(self, tick: Callable[[float], None], interval: float, keep_going: Callable[[], bool]) -> None:
        """Select and dispatch until ``keep_going()`` is false; ``tick(now)`` every ``interval``."""
        registered = self._selector.get_map()
        try:
            next_tick = time.monotonic()
            while True:
                now = self.busy_since = time.monotonic()
                if now >= next_tick:
                    tick(now)
                    next_tick = now + interval
                if not keep_going():
                    return
                self.busy_since = None
                ready = self._selector.select(max(0.0, next_tick - time.monotonic()))
                self.busy_since = time.monotonic()
                for key, mask in ready:
                    # A handler earlier in this batch may have unregistered it: a worker's
                    # death closes its channel and sentinel, whose events are in the same
                    # batch, and its fd numbers may already belong to its replacement.
                    if registered.get(key.fd) is key:
                        key.data(mask)
        finally:
            self.busy_since = None

    def fail_pending(self) -> None:
        """The thread has ended (or is ending): fail every command nobody will run."""
        while True:
            try:
                _fn, fut = self._commands.popleft()
            except IndexError:
                return
            if fut is not None and not fut.done():
                fut.set_exception(RuntimeError("the scheduler thread has stopped"))

    def _woken(self, _mask: int) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass
        self._on_wake()
        while self._commands:
            fn, fut = self._commands.popleft()
            try:
                result = fn()
            except BaseException as e:  # noqa: B902 - handed to the caller who waits for it
                if fut is None:
                    raise
                fut.set_exception(e)
            else:
                if fut is not None:
                    fut.set_result(result)

    def close(self) -> None:
        """After the thread has ended."""
        self._selector.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
