"""When a worker's main thread takes its turn at reading the channel.

The channel needs a reader while every executor runs a task: Cancel, Export (another
worker waits for data held here) and the answers to a task's own requests come that way.
Waking the main thread each time an executor starts a run would cost every round trip a
futex wake and the main thread and the executor contending for the GIL, more than a
no-op run takes. So the main thread is called only once nobody has read
for ``DELAY``: the executor that leaves the channel unread arms the turn (due ``DELAY``
later), whoever takes the reader role back disarms it.

Arming and disarming make no system call while a kernel timer is set already: setting and
clearing a timer for every run would cost two ``timerfd_settime`` (through ctypes) a
round trip. The timer set for the first run fires ``DELAY``
later whatever came since; the main thread, woken, reads only if the turn is ``due`` (armed,
and its moment passed), and otherwise sets the timer again for the moment of the run now
armed (``reset_timer``), if any. A stream of short runs thus costs a timer and a look every
``DELAY``, not two system calls a run.

A timerfd, not SIGALRM: a timer signal would have to be kept off the executor threads
(their system calls, and those of the C code a task calls), and a blocked signal is
inherited by every program a task starts. The main thread waits in ``select`` on the
timerfd and on a pipe (``call_now``: a task waiting for an answer calls it at once).
``os.timerfd_create`` is 3.13's; before, libc's through ctypes. Where there is no
timerfd (not Linux), ``arm`` calls the main thread at once.
"""
from __future__ import annotations

import os
import select
import time
from typing import Callable, Optional

__all__ = ["MainTurn", "DELAY"]

DELAY = 0.002       # seconds a busy worker's channel may go unread before the main thread reads it


def _timerfd() -> tuple[int, Optional[Callable[[float], None]]]:
    """(a non-blocking CLOCK_MONOTONIC timerfd, a function setting it: seconds, 0 to stop),
    or (-1, None) where there is none."""
    flags = os.O_NONBLOCK | os.O_CLOEXEC            # TFD_NONBLOCK, TFD_CLOEXEC
    if hasattr(os, "timerfd_create"):                # 3.13
        fd = os.timerfd_create(time.CLOCK_MONOTONIC, flags=flags)
        return fd, lambda seconds: os.timerfd_settime(fd, initial=seconds)  # type: ignore[attr-defined]  # 3.13's
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        create, settime = libc.timerfd_create, libc.timerfd_settime
    except (OSError, AttributeError):
        return -1, None

    class Timespec(ctypes.Structure):
        _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]

    class Itimerspec(ctypes.Structure):
        _fields_ = [("it_interval", Timespec), ("it_value", Timespec)]

    create.argtypes, create.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(Itimerspec), ctypes.c_void_p]
    settime.restype = ctypes.c_int
    fd = create(time.CLOCK_MONOTONIC, flags)
    if fd < 0:
        return -1, None
    spec = Itimerspec()
    at = ctypes.pointer(spec)

    def set_(seconds: float) -> None:
        spec.it_value.tv_sec, spec.it_value.tv_nsec = int(seconds), int(seconds % 1 * 1e9)
        if settime(fd, 0, at, None) < 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return fd, set_


class MainTurn:
    """The main thread's call to the channel (see the module docstring). ``arm``, ``disarm``,
    ``call_now``, ``reset_timer`` and ``due`` run under the worker's lock; ``wait`` on the main thread,
    outside it."""

    def __init__(self, delay: float = DELAY):
        self.delay = delay
        self.armed = False          #: nobody reads, and the main thread is due at _due; under the worker's lock
        self._due = 0.0             #: monotonic moment the armed turn is due; under the worker's lock
        self._timer_on = False      #: a kernel timer is set and not yet seen to fire; under the worker's lock
        self._called = False        #: call_now() called the main thread; under the worker's lock
        self._fired = False         #: the main thread's own: wait() saw the timer fire
        self._tfd, self._set = _timerfd()
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)

    @property
    def timed(self) -> bool:
        """A kernel timer calls the main thread (else ``arm`` calls it at once)."""
        return self._set is not None

    def arm(self) -> None:
        """Nobody reads the channel now: the main thread is due in ``delay`` unless someone
        reads again first. Armed already: the first moment stands (a stream of short runs
        must not put the reader off for ever)."""
        if self.armed:
            return
        self.armed = True
        self._due = time.monotonic() + self.delay
        if self._set is None:
            self.call_now()
        elif not self._timer_on:    # one set already fires no later than this moment
            self._set(self.delay)
            self._timer_on = True

    def disarm(self) -> None:
        """Someone reads the channel again (or the main thread took its turn). No system
        call: a timer still set fires, and the main thread finds its turn not due."""
        self.armed = self._called = False

    def call_now(self) -> None:
        """Call the main thread at once (a task waits for an answer that only a reader brings)."""
        self._called = True
        try:
            os.write(self._w, b"\0")
        except BlockingIOError:     # a call is already waiting in the pipe
            pass

    def due(self) -> bool:
        """Whether the main thread is to take the reader role (if nobody holds it): called
        at once, or armed and its moment passed."""
        return self._called or (self.armed and time.monotonic() >= self._due)

    def reset_timer(self) -> None:
        """The main thread, after a wait: a timer that fired is off; set one again for the
        turn armed meanwhile, if it is not due yet."""
        if self._fired:
            self._fired = False
            self._timer_on = False
        if self.armed and not self._timer_on and self._set is not None:
            left = self._due - time.monotonic()
            if left > 0:
                self._set(left)
                self._timer_on = True

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Main thread: until called (the caller checks again why). False if ``timeout``
        passed first."""
        fds = [self._r] if self._tfd < 0 else [self._r, self._tfd]
        ready = select.select(fds, [], [], timeout)[0]
        for fd in ready:
            try:
                while os.read(fd, 512 if fd == self._r else 8):
                    if fd == self._tfd:
                        self._fired = True
            except BlockingIOError:     # the timer was set again meanwhile: it did not fire
                pass
        return bool(ready)

    def close(self) -> None:
        for fd in (self._r, self._w, self._tfd):
            if fd >= 0:
                os.close(fd)
