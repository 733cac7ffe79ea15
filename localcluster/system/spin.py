"""Poll a little before sleeping, while no task on the machine waits for a CPU.

A thread that waits for a reply soon to come (the worker's reader after it answered a run,
the user's thread in ``result()``) first polls its descriptors for up to ``window`` seconds,
and only then sleeps in ``select``. Waking a sleeping thread is the dearest step of a short
round trip: a futex or socket wake-up, a context switch and, on a VM whose idle vCPUs halt,
an exit through the hypervisor (15-40 µs each time on the machine of benchmarks/README.md,
two of them a round trip). A thread still polling when the reply comes pays none of it.

Polling takes a CPU, so it is only done while the machine is calm: the kernel's pressure
stall information (``/proc/pressure/cpu``, "some": the time in which at least one runnable
task waited for a CPU) grew by less than ``CALM`` of the wall time since the last look. A
thread that spins on a busy machine would keep from the CPU the very process it waits for;
there the waits sleep at once, as without spinning. Where there is no PSI (not Linux, or a
kernel without it), and on a single CPU, never.

Any thread; each process keeps its own view of the pressure, looked at, at most, every
``LOOK`` seconds (one open, read and close of the file, ~10 µs).
"""
from __future__ import annotations

import os
import select
import time
from typing import Optional

__all__ = ["calm", "poll_for", "CALM", "LOOK"]

CALM = 0.05         # the share of wall time tasks may have waited for a CPU, and polling still be done
LOOK = 0.02         # seconds between two looks at the pressure
BACK_OFF = 0.5      # seconds without polling after a look that found the machine busy

_PSI = "/proc/pressure/cpu"
#: (monotonic time of the last look, the "some" total in µs then, whether polling is on, until
#: when it stays off). One tuple, replaced whole: two threads looking at once both read the
#: file, and either's view is right (no lock, which a fork could inherit held).
_last: tuple = (0.0, None, False, 0.0)


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):       # pragma: no cover - not Linux
        return os.cpu_count() or 1


#: one CPU: whoever polls keeps from it the very process it waits for
_ALONE = _cpus() < 2


def _stalled_us() -> Optional[int]:
    try:
        with open(_PSI, "rb") as f:
            line = f.readline()             # some avg10=.. avg60=.. avg300=.. total=<µs>
        return int(line.rsplit(b"total=", 1)[1])
    except (OSError, ValueError, IndexError):
        return None


def calm(now: Optional[float] = None) -> bool:
    """Whether no task waited for a CPU, or hardly, since the last look. The first look, one
    after a second without any, and every look for ``BACK_OFF`` seconds after one that found
    the machine busy say no: polling that makes the machine busy stops, and stays stopped
    long enough not to start again every other look."""
    global _last
    now = time.monotonic() if now is None else now
    then, before, was_calm, off_until = _last
    elapsed = now - then
    if elapsed < LOOK or _ALONE:
        return was_calm
    stalled = _stalled_us()
    measured = stalled is not None and before is not None and elapsed < 1.0
    quiet = measured and (stalled - before) * 1e-6 < CALM * elapsed
    if measured and not quiet:
        off_until = now + BACK_OFF
    _last = (now, stalled, quiet and now >= off_until, off_until)
    return _last[2]


def poll_for(poller: "select.poll", window: float) -> list:
    """What ``poller`` (a ``select.poll`` with its descriptors registered) has ready within
    ``window`` seconds of polling, without sleeping; [] at once when the machine is not calm,
    or when nothing came in time (the caller then sleeps in its own wait)."""
    if window <= 0 or not calm():
        return []
    end = time.perf_counter() + window
    while True:
        ready = poller.poll(0)
        if ready or time.perf_counter() >= end:
            return ready
