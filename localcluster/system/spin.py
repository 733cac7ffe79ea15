"""Poll a little before sleeping, while the machine's CPUs are not contended.

A thread that waits for a reply soon to come (the worker's reader after it answered a run,
the user's thread in ``result()``) first polls its descriptors for up to ``window`` seconds,
and only then sleeps in ``select``. Waking a sleeping thread is the dearest step of a short
round trip: a futex or socket wake-up, a context switch and, on a VM whose idle vCPUs halt,
an exit through the hypervisor (twice a round trip; benchmarks/README.md has what it costs).
A thread still polling when the reply comes pays none of it.

Polling takes a CPU, so it is only done while the machine is calm: the kernel's pressure
stall information (``/proc/pressure/cpu``, "some": the time in which at least one runnable
task waited for a CPU) grew by less than ``CALM`` of the wall time, on average over the last
looks. A polling thread yields its CPU between two polls to any thread that waits for
one, so its own polling barely moves the figure, while a machine that is really busy moves
it far past ``CALM``. A thread that
spins on a busy machine would keep from the CPU the very process it waits for; there the
waits sleep at once, as without spinning. Where there is no PSI (not Linux, or a
kernel without it), and on a single CPU, never.

Any thread; each process keeps its own view of the pressure, looked at, at most, every
``LOOK`` seconds (one open, read and close of the file). A view starts (and starts
again after a second without a look) from the kernel's own average over the last 10 s
(``avg10``): starting from "fully stalled" instead would keep a new cluster's first round
trips from polling for several calm looks.
"""
from __future__ import annotations

import os
import select
import time
from typing import Optional

from .machine import usable_cpus

__all__ = ["calm", "poll_for", "CALM", "LOOK"]

CALM = 0.25         # the share of wall time tasks may wait for a CPU, on average, and polling still be done
LOOK = 0.05         # seconds between two looks at the pressure
WEIGHT = 0.3        # of the newest look in the average (the older ones fade: a lone burst does not stop polling)

_PSI = "/proc/pressure/cpu"
#: (monotonic time of the last look, the "some" total in µs then, the average share stalled,
#: whether polling is on). One tuple, replaced whole: two threads looking at once both read
#: the file, and either's view is right (no lock, which a fork could inherit held).
_last: tuple = (0.0, None, 1.0, False)


#: one CPU: whoever polls keeps from it the very process it waits for
_ALONE = usable_cpus() < 2


def _pressure() -> tuple[Optional[int], float]:
    """(the "some" total in µs, or None; the kernel's share stalled over the last 10 s, 1.0
    when unknown)."""
    try:
        with open(_PSI, "rb") as f:
            line = f.readline()             # some avg10=.. avg60=.. avg300=.. total=<µs>
        total = int(line.rsplit(b"total=", 1)[1])
    except (OSError, ValueError, IndexError):
        return None, 1.0
    try:
        return total, min(1.0, float(line.split(b"avg10=", 1)[1].split(None, 1)[0]) / 100)
    except (ValueError, IndexError):
        return total, 1.0


def calm(now: Optional[float] = None) -> bool:
    """Whether tasks waited for a CPU less than ``CALM`` of the time, on average over the
    last looks. A first look, and one after a second without any, takes the kernel's average
    over the last 10 s instead (there is no earlier total to compare with)."""
    global _last
    now = time.monotonic() if now is None else now
    then, before, share, on = _last
    elapsed = now - then
    if elapsed < LOOK or _ALONE:
        return on
    stalled, recent = _pressure()
    if stalled is None:
        share = 1.0
    elif before is None or elapsed >= 1.0:
        share = recent
    else:
        share += WEIGHT * (min(1.0, (stalled - before) * 1e-6 / elapsed) - share)
    _last = (now, stalled, share, share < CALM)
    return _last[3]


_yield = getattr(os, "sched_yield", lambda: None)


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
        _yield()            # a thread waiting for this CPU gets it now, not at the next preemption
