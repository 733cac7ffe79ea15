"""When a worker's main thread takes its turn at reading the channel.

The channel needs a reader while every executor runs a task: Cancel, Export (another
worker waits for data held here) and the answers to a task's own requests come that way.
Waking the main thread each time an executor starts a run cost a round trip 20-50 µs
(a futex wake, then the main thread and the executor contending for the GIL), for a
no-op run that is over in a few. So the main thread is called only once nobody has read
for ``DELAY``: the executor that leaves the channel unread arms a kernel timer (one
``setitimer`` call, no wake-up); whoever takes the reader role back first disarms it. A
run that ends sooner costs two system calls; a longer one gets its reader ``DELAY`` late.

The timer's SIGALRM reaches the main thread through ``signal.set_wakeup_fd``: the C-level
handler writes a byte into this object's pipe, whichever thread the kernel gave the
signal to, and the main thread waits in ``select`` on that pipe. The worker's other
threads start with SIGALRM blocked (``quiet``), so that their system calls, and those
of the C code a task calls, are never interrupted by it.

A worker whose initializer set its own SIGALRM handler keeps it: then ``arm`` wakes the
main thread at once, as before this module. Tasks run on executor threads and cannot set
signal handlers; a task that calls ``signal.alarm`` or ``setitimer`` itself shares the
process's one ITIMER_REAL with this timer.
"""
from __future__ import annotations

import contextlib
import os
import select
import signal
from typing import Iterator

__all__ = ["MainTurn", "DELAY", "quiet"]

DELAY = 0.002       # seconds a busy worker's channel may go unread before the main thread reads it


def _ignore(_signum: int, _frame: object) -> None:
    """The wakeup fd does the work; the Python-level handler only replaces the default
    action of SIGALRM, which ends the process."""


class MainTurn:
    """The main thread's call to the channel (see the module docstring). ``arm``, ``disarm``
    and ``now`` run under the worker's lock; ``wait`` on the main thread, outside it."""

    def __init__(self, delay: float = DELAY):
        self.delay = delay
        self.armed = False          #: the timer runs; under the worker's lock
        self.timed = False          #: SIGALRM is ours (install); else arm() wakes at once
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)

    def install(self) -> None:
        """On the main thread, before the worker's other threads start: take SIGALRM, unless
        the initializer set a handler of its own."""
        if not hasattr(signal, "setitimer") or signal.getsignal(signal.SIGALRM) not in (signal.SIG_DFL, None):
            return
        signal.signal(signal.SIGALRM, _ignore)
        signal.set_wakeup_fd(self._w, warn_on_full_buffer=False)
        self.timed = True

    def arm(self) -> None:
        """Nobody reads the channel now: call the main thread in ``delay`` unless someone
        reads again first. Armed already: the first moment stands (a stream of short runs
        must not put the reader off for ever)."""
        if self.armed:
            return
        self.armed = True
        if self.timed:
            signal.setitimer(signal.ITIMER_REAL, self.delay)
        else:
            self.now()

    def disarm(self) -> None:
        """Someone reads the channel again."""
        if self.armed:
            self.armed = False
            if self.timed:
                signal.setitimer(signal.ITIMER_REAL, 0)

    def now(self) -> None:
        """Call the main thread at once (a task waits for an answer that only a reader brings)."""
        try:
            os.write(self._w, b"\0")
        except BlockingIOError:     # a call is already waiting in the pipe
            pass

    def wait(self, timeout: "float | None" = None) -> bool:
        """Main thread: until called (or woken by any other signal: the caller checks again).
        False if ``timeout`` passed first."""
        if not select.select([self._r], [], [], timeout)[0]:
            return False
        try:
            while os.read(self._r, 512):
                pass
        except BlockingIOError:
            pass
        return True

    def close(self) -> None:
        os.close(self._r)
        os.close(self._w)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Threads started inside inherit SIGALRM blocked (a thread starts with its starter's mask)."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
