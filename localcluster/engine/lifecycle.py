"""The cluster's one shutdown state: a phase, the table of allowed moves, and the error
every later call raises.

::

    STARTING ──► RUNNING ──► CLOSING ──► STOPPED ──► CLOSED
        │           │           ▲ │         ▲
        │           ▼           │ ▼         │
        ├──────► REFUSED ───────┤ BROKEN ───┘
        └─────────────────────► BROKEN
    (any phase but CLOSED) ──► FORKED

- ``REFUSED``: the cluster said no to its user (workers that cannot start, a memory
  limit too small for one): every later call raises that error, and close() still
  cleans up. Nothing is wrong with localcluster itself.
- ``BROKEN``: localcluster failed (an exception out of the scheduler, a stuck scheduler
  thread): every pending future and every later call fails with ``ClusterBroken``.
- ``STOPPED``: the scheduler thread has ended; commands handed to it fail at once.
- ``CLOSED``: the processes, pipes and the directory are released (straight from
  ``CLOSING`` only when the scheduler thread would not stop: what it holds is left to
  the process's exit).
- ``FORKED``: this process is a fork of the owner; its threads and workers stayed there.

Threads: any thread moves the phase (the user's close, the scheduler thread's end, the
watchdog's break); a move is atomic under this object's own lock, and a move the table
does not allow is refused (``to`` returns False) rather than applied. Readers read
``phase`` without the lock: one attribute read.
"""
from __future__ import annotations

import enum
import threading
from typing import Optional

__all__ = ["Phase", "Lifecycle", "MOVES"]


class Phase(enum.Enum):
    STARTING = "starting"
    RUNNING = "running"
    REFUSED = "refused"
    BROKEN = "broken"
    CLOSING = "closing"
    STOPPED = "stopped"
    CLOSED = "closed"
    FORKED = "forked"


_P = Phase
MOVES: dict[Phase, frozenset] = {
    _P.STARTING: frozenset({_P.RUNNING, _P.REFUSED, _P.BROKEN, _P.CLOSING, _P.FORKED}),
    _P.RUNNING: frozenset({_P.REFUSED, _P.BROKEN, _P.CLOSING, _P.FORKED}),
    _P.REFUSED: frozenset({_P.BROKEN, _P.CLOSING, _P.FORKED}),
    _P.BROKEN: frozenset({_P.CLOSING, _P.STOPPED, _P.FORKED}),
    _P.CLOSING: frozenset({_P.BROKEN, _P.STOPPED, _P.CLOSED, _P.FORKED}),
    _P.STOPPED: frozenset({_P.CLOSED, _P.FORKED}),
    _P.CLOSED: frozenset(),
    _P.FORKED: frozenset(),
}


class Lifecycle:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.phase = Phase.STARTING            #: moved only by to(), under _lock; read by anyone
        self.error: Optional[BaseException] = None   #: what REFUSED or BROKEN raises; kept after
        self.passed: set = {Phase.STARTING}    #: every phase entered so far (was it ever broken?)

    def to(self, phase: Phase, error: Optional[BaseException] = None) -> bool:
        """Move to ``phase`` if the table allows it from here; ``error`` (for REFUSED and
        BROKEN) is what every later call raises. False, and nothing changed, otherwise."""
        assert (error is not None) == (phase in (Phase.REFUSED, Phase.BROKEN)), (phase, error)
        with self._lock:
            if phase not in MOVES[self.phase]:
                return False
            if error is not None:
                self.error = error
            self.passed.add(phase)
            self.phase = phase
            return True

    def forked(self) -> None:
        """In a child forked from the owner: a thread of the parent may have held the lock
        at the fork, and it stays held here, so this move takes a new one."""
        self._lock = threading.Lock()
        if self.phase is not Phase.CLOSED:
            self.passed.add(Phase.FORKED)
            self.phase = Phase.FORKED

    @property
    def open(self) -> bool:
        """Taking work: starting or running, neither refused nor broken nor closing."""
        phase = self.phase      # not ``in`` a set: an Enum hashes in Python, and every dropped Future asks
        return phase is _P.RUNNING or phase is _P.STARTING

    @property
    def broken(self) -> bool:
        """localcluster itself failed, now or before the close that followed."""
        return Phase.BROKEN in self.passed

    @property
    def thread_ended(self) -> bool:
        return self.phase in (Phase.STOPPED, Phase.CLOSED)

    def __repr__(self) -> str:
        return f"<Lifecycle {self.phase.value}{f': {self.error!r}' if self.error is not None else ''}>"
