"""What a cluster did, kept for the pictures: the task stream and every worker's memory
over time, the dead workers' included.

The scheduler thread writes (the dispatcher adds a task as its worker reports it, the
supervisor a memory sample per tick and the tasks a death took with it); readers on any
thread take copies (``tasks()``, ``memory()``), which CPython makes whole under the GIL.
Both are bounded, so a cluster that runs for days holds a fixed amount: the task stream
keeps the newest ``TASKS`` records; a memory series halves its resolution when full,
keeping the larger sample of each pair, so the climb to a memory kill is never smoothed away.

The task stream holds plain tuples and hands out ``TaskRecord``s: a tuple of strings and
numbers is one the cyclic collector stops tracking after its first pass, while a NamedTuple
stays tracked, and 100,000 kept records were traversed by every full collection of the
user's process for as long as the cluster lived.
"""
from __future__ import annotations

import time
from collections import Counter, deque
from itertools import islice, starmap
from operator import itemgetter
from typing import Callable, NamedTuple, Optional

TASKS = 100_000          # task records kept per cluster
POINTS = 2_000           # memory samples kept per worker (before halving)
DEAD_WORKERS = 64        # dead workers whose memory series are kept


_STATUS = itemgetter(5)      # a record's status

class TaskRecord(NamedTuple):
    """One run of a task: where, on which executor thread (1..n), when (unix seconds), how it
    ended, and the task that submitted it from a worker (get_client in a task), if one did."""
    key: str
    worker: str
    thread: int
    start: float
    stop: float
    status: str          # "finished", "error", or "lost" (its worker died under it)
    serde: float = 0.0   # seconds of the run spent (un)pickling the function, arguments and result
    submitter: Optional[str] = None


class Series:
    """A bounded (unix time, value) series: when full, every pair of samples becomes the
    larger of the two and the stride between kept samples doubles."""
    __slots__ = ("points", "_stride", "_skipped", "_held")

    def __init__(self) -> None:
        self.points: list = []
        self._stride = 1
        self._skipped = 0
        self._held: Optional[tuple] = None     # the largest sample since the last kept one

    def append(self, t: float, value: int) -> None:
        held = self._held
        if held is None or value >= held[1]:
            self._held = held = (t, value)
        self._skipped += 1
        if self._skipped < self._stride:
            return
        self.points.append(held)
        self._held = None
        self._skipped = 0
        if len(self.points) >= POINTS:
            pts = self.points
            self.points = [max(pts[i], pts[i + 1], key=lambda p: p[1]) if i + 1 < len(pts) else pts[i]
                           for i in range(0, len(pts), 2)]
            self._stride *= 2

    def copy(self) -> list:
        pts = list(self.points)
        held = self._held
        return pts + [held] if held is not None else pts


class History:
    """The task stream and memory series of one cluster (see the module docstring)."""

    def __init__(self) -> None:
        self.started = time.time()
        self._tasks: deque = deque(maxlen=TASKS)
        self._memory: dict[str, Series] = {}      # worker name -> series; insertion order = spawn order
        self._dead: deque = deque()               # names of dead workers, oldest first
        self.ended = 0                            # runs that finished or failed (not lost): progress
        # Tasks, not runs, for the live views' counts (read without a lock: ints). Written by
        # the thread that records runs, which the scheduler tells whether a run counts.
        self.done = 0                             # tasks finished (a task run again counts once)
        self.failed = 0                           # tasks failed for good (not a failure retried)
        self._startups: deque = deque(maxlen=DEAD_WORKERS * 4)   # (worker, ready at, seconds from spawn)
        self._moving: dict[str, float] = {}      # worker name -> seconds it spent moving data, last seen

    def task(self, key: str, worker: str, thread: int, start: float, stop: float, status: str,
             serde: float = 0.0, submitter: Optional[str] = None, counts: bool = True) -> None:
        """One run ended (the fields of ``TaskRecord``). A run no task submitted keeps no
        field for it (most runs: 8 bytes each of 100,000 kept). ``counts``: its task is
        counted done (its first finish) or failed (no retry left) by this run."""
        self._tasks.append((key, worker, thread, start, stop, status, serde) if submitter is None
                           else (key, worker, thread, start, stop, status, serde, submitter))
        if status != "lost":
            self.ended += 1
            if counts:
                if status == "finished":
                    self.done += 1
                else:
                    self.failed += 1

    @property
    def capacity(self) -> int:
        """How many task records are kept (the newest)."""
        return self._tasks.maxlen

    def up(self, worker: str, t: float, seconds: float) -> None:
        """``worker`` became ready at unix time ``t``, ``seconds`` after it was spawned."""
        self._startups.append((worker, t, seconds))

    def startups(self) -> list:
        """[(worker, unix time it became ready, seconds from spawn to ready)], oldest first."""
        return list(self._startups)

    def moving(self, worker: str, seconds: float) -> None:
        """``worker`` has spent ``seconds`` moving data so far (its status board says)."""
        self._moving[worker] = seconds

    def transfers(self) -> dict:
        """worker name -> seconds it spent moving data (serving and storing it), last seen."""
        return dict(self._moving)

    def sample(self, worker: str, t: float, rss: int) -> None:
        series = self._memory.get(worker)
        if series is None:
            series = self._memory[worker] = Series()
        series.append(t, rss)

    def died(self, worker: str) -> None:
        self._dead.append(worker)
        while len(self._dead) > DEAD_WORKERS:
            gone = self._dead.popleft()
            self._memory.pop(gone, None)
            self._moving.pop(gone, None)

    def most_run(self, worker: str, group: "Callable[[str], str]") -> Optional[tuple]:
        """(name, count): the function that ran most often on ``worker`` among the kept
        records, by ``group(key)``; None if it ran nothing."""
        counts = Counter(group(r[0]) for r in list(self._tasks) if r[1] == worker)
        return counts.most_common(1)[0] if counts else None

    def tasks(self) -> list:
        """Every kept TaskRecord, in the order their ends were seen."""
        return list(starmap(TaskRecord, list(self._tasks)))

    def tail(self, ended: int, raw: bool = False) -> list:
        """The newest TaskRecords, back to the ``ended``-th newest run that finished or failed
        (lost runs among them come too): what a live view has not read yet. Only the tail's
        references are copied, newest first and then turned round (a live view reads ~10,000
        of 100,000 kept, once a second); records are made only for the tail (``raw``: plain
        tuples)."""
        if ended <= 0:
            return []
        kept = self._tasks
        n = min(ended, len(kept))
        while True:
            try:
                got = list(islice(reversed(kept), n))
            except RuntimeError:        # appended to while copied (a finalizer let the scheduler thread in)
                continue
            # lost runs are rare: counted in C, then as many more taken, until the tail holds
            # ``ended`` others (no Python step per record)
            short = ended - (len(got) - list(map(_STATUS, got)).count("lost"))
            if short <= 0 or n >= len(kept):
                break
            n = min(len(kept), n + short)
        got.reverse()
        return got if raw else list(starmap(TaskRecord, got))

    def memory(self) -> dict[str, list]:
        """Worker name -> [(unix time, rss bytes)], for live and recently dead workers."""
        return {name: series.copy() for name, series in list(self._memory.items())}
