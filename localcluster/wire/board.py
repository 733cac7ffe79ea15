"""A worker's status board: a few int64 slots in shared memory that the worker
writes and the parent reads, with no message and no syscall.

Row 0 is the worker's: heartbeat (monotonic ns), managed bytes, spilled bytes,
spilled keys, and a version that makes the three store figures one consistent read (a
seqlock: odd while the worker writes them; a spill moves bytes from managed to spilled,
and a reader must never see them gone from both); then the nanoseconds it has spent
moving data for other workers and the client (serving an Export, storing a Put), written
by the thread reading its channel, one at a time; and the bytes of memory the worker keeps
warm for the next large value (wire/recycle.py: neither a result nor the tasks' own),
written by its heartbeat thread. Row i >= 1 belongs to executor thread i: its thread ident, the
``seq`` of the run it is executing (0 when idle) and when that run started.

This is how a death is blamed on the right task without an acknowledgement
message per task: the board survives the process, so after a crash the parent
reads which run was on which thread, and faulthandler names the crashing thread.
"""
from __future__ import annotations

import mmap
import os
import time

from .basics import thread_ident

_COLS = 7


class Board:
    def __init__(self, nthreads: int, fd: int | None = None):
        self.size = (nthreads + 1) * _COLS * 8
        self.nthreads = nthreads
        if fd is None:
            fd = os.memfd_create("localcluster-board", os.MFD_CLOEXEC) if hasattr(os, "memfd_create") else _tmpfile()
            os.ftruncate(fd, self.size)
        self.fd = fd
        self._mm = mmap.mmap(fd, self.size)
        self.slots = memoryview(self._mm).cast("q")

    # worker side
    def beat(self) -> None:
        self.slots[0] = time.monotonic_ns()

    def set_store(self, managed: int, spilled: int, nkeys: int) -> None:
        """Called with the store's lock held: one writer at a time."""
        s = self.slots
        s[4] += 1
        s[1], s[2], s[3] = managed, spilled, nkeys
        s[4] += 1

    def moved(self, ns: int) -> None:
        """``ns`` more nanoseconds spent moving data (the channel's reader: one writer)."""
        self.slots[5] += ns

    def set_reusable(self, nbytes: int) -> None:
        """Bytes kept for reuse, free now (the heartbeat thread: one writer)."""
        self.slots[6] = nbytes

    def start(self, row: int, ident: int, seq: int) -> None:
        base = row * _COLS
        s = self.slots
        s[base], s[base + 2], s[base + 1] = thread_ident(ident), time.monotonic_ns(), seq

    def stop(self, row: int) -> None:
        self.slots[row * _COLS + 1] = 0

    # parent side
    def heartbeat(self) -> int:
        return self.slots[0]

    def store(self) -> tuple[int, int, int]:
        s = self.slots
        for _ in range(10_000):    # bounded: a worker killed mid-write leaves the version odd
            version = s[4]
            figures = s[1], s[2], s[3]
            if version % 2 == 0 and s[4] == version:
                break
        return figures

    def moving(self) -> float:
        """Seconds the worker has spent moving data (serving Exports, storing Puts)."""
        return self.slots[5] / 1e9

    def reusable(self) -> int:
        """Bytes the worker keeps warm for the next large value, as last written."""
        return self.slots[6]

    def running(self) -> dict[int, tuple[int, float]]:
        """seq -> (thread ident, start time in monotonic seconds)."""
        out = {}
        s = self.slots
        for row in range(1, self.nthreads + 1):
            base = row * _COLS
            seq = s[base + 1]
            if seq:
                out[seq] = (s[base], s[base + 2] / 1e9)
        return out

    def rows(self) -> dict[int, int]:
        """seq -> the executor row (1..n) running it."""
        s = self.slots
        return {s[row * _COLS + 1]: row for row in range(1, self.nthreads + 1) if s[row * _COLS + 1]}

    def close(self) -> None:
        try:
            self.slots.release()
            self._mm.close()
        except BufferError:  # pragma: no cover - a view still exported
            pass
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _tmpfile() -> int:  # pragma: no cover - systems without memfd
    import tempfile
    fd, path = tempfile.mkstemp(prefix="localcluster-board-")
    os.unlink(path)
    return fd
