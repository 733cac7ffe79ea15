"""What a cluster did, kept for the pictures: the task stream and every worker's memory
over time, the dead workers' included.

The scheduler thread writes (the dispatcher adds a task as its worker reports it, the
supervisor a memory sample per tick and the tasks a death took with it); readers on any
thread take copies (``tasks()``, ``memory()``), which CPython makes whole under the GIL.
Both are bounded, so a cluster that runs for days holds a fixed amount: the task stream
keeps the newest ``TASKS`` records; a memory series halves its resolution when full,
keeping the larger sample of each pair, so the climb to a memory kill is never smoothed away.

The task stream is kept in columns (``Runs``: lists of keys, workers and statuses, arrays
of threads and times) and hands out ``TaskRecord``s made on demand: a tuple and its floats
a record would cost several times what a column's entries do, for each of the ``TASKS`` newest
runs, and no object per record is left for the cyclic collector to traverse.
"""
from __future__ import annotations

import time
from array import array
from collections import Counter, deque
from itertools import starmap
from typing import Callable, NamedTuple, Optional

TASKS = 100_000          # task records kept per cluster
KINDS = 1024             # (worker, status, thread) tuples Runs keeps shared at a time
POINTS = 2_000           # memory samples kept per worker (before halving)
DEAD_WORKERS = 64        # dead workers whose memory series are kept


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


class Runs:
    """The newest ``capacity`` run records, oldest first, in columns: a ring once full.

    A record's (worker, status, thread) is one tuple shared by the records alike: two
    references a record, not four (less memory for a history of many records). The tuples are
    found in a small table, emptied when full, so that it stays small however many workers
    come and go; the records keep theirs.

    Written by one thread at a time (the one that records runs, under the cluster's lock);
    read by any thread without a lock. A record is counted once written whole; a reader
    drops the oldest records of its copy that a write begun meanwhile may have overwritten
    (never more than the writes it raced, and those records were the next to go anyway)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.count = 0                     # records ever written; record i is in slot i % capacity
        self._begun = 0                    # records whose writing has begun (count, or count + 1)
        self._names: list = []             # key, (worker, status, thread) of each slot
        self._kinds: dict = {}             # (worker, status, thread) -> that tuple, shared; emptied when full
        self._numbers = array("d")         # start, stop, serde of each slot
        self._submitters: dict = {}        # slot -> the submitting task, for the few that have one

    def add(self, key: str, worker: str, thread: int, start: float, stop: float, status: str,
            serde: float, submitter: Optional[str]) -> None:
        count = self.count
        self._begun = count + 1
        at = count % self.capacity
        kind = (worker, status, thread)
        shared = self._kinds.get(kind)
        if shared is None:
            if len(self._kinds) >= KINDS:
                self._kinds.clear()
            shared = self._kinds[kind] = kind
        if count < self.capacity:
            self._names.extend((key, shared))
            self._numbers.fromlist([start, stop, serde])
        else:
            names, numbers, i, j = self._names, self._numbers, 2 * at, 3 * at
            names[i], names[i + 1] = key, shared
            numbers[j], numbers[j + 1], numbers[j + 2] = start, stop, serde
            if self._submitters:
                self._submitters.pop(at, None)
        if submitter is not None:
            self._submitters[at] = submitter
        self.count = count + 1

    def newest(self, n: int) -> list:
        """The newest ``n`` records (all if fewer are kept), oldest first, as tuples."""
        end = self.count
        n = min(n, end, self.capacity)
        got = self._rows(end - n, end)
        torn = self._begun - self.capacity - (end - n)    # records before _begun - capacity: maybe overwritten
        return got[torn:] if torn > 0 else got

    def statuses(self, n: int) -> list:
        """The statuses of the newest ``n`` records, oldest first (may race a writer: a hint)."""
        end = self.count
        n = min(n, end, self.capacity)
        return [kind[1] for kind in self._column(self._names, 2, 1, end - n, end)]

    def _column(self, col, width: int, field: int, first: int, end: int):
        """Field ``field`` of records first..end-1 of ``col`` (``width`` fields a slot): a
        new list, or array, in record order."""
        if end - first <= 0:
            return col[:0]
        a, b = first % self.capacity, end % self.capacity or self.capacity
        if a < b:
            return col[width * a + field:width * b:width]
        return col[width * a + field::width] + col[field:width * b:width]

    def _rows(self, first: int, end: int) -> list:
        names, numbers = self._names, self._numbers
        keys, kinds = (self._column(names, 2, f, first, end) for f in range(2))
        workers, statuses, threads = zip(*kinds) if kinds else ((), (), ())
        starts, stops, serdes = (self._column(numbers, 3, f, first, end) for f in range(3))
        rows = list(zip(keys, workers, threads, starts, stops, statuses, serdes))
        if self._submitters:
            for i in range(first, end):
                who = self._submitters.get(i % self.capacity)
                if who is not None:
                    rows[i - first] += (who,)
        return rows


class History:
    """The task stream and memory series of one cluster (see the module docstring)."""

    def __init__(self) -> None:
        self.started = time.time()
        self._tasks = Runs(TASKS)
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
        field for it (most runs: none is kept for them). ``counts``: its task is
        counted done (its first finish) or failed (no retry left) by this run."""
        self._tasks.add(key, worker, thread, start, stop, status, serde, submitter)
        if status != "lost":
            self.ended += 1
            if counts:
                if status == "finished":
                    self.done += 1
                else:
                    self.failed += 1

    def gave_up(self, tasks: int) -> None:
        """``tasks`` whose runs a death cut short (recorded "lost") ended with it, failed for
        good: KilledWorker, or past their timeout."""
        self.failed += tasks

    @property
    def capacity(self) -> int:
        """How many task records are kept (the newest)."""
        return self._tasks.capacity

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
        counts = Counter(group(r[0]) for r in self._tasks.newest(TASKS) if r[1] == worker)
        return counts.most_common(1)[0] if counts else None

    def tasks(self) -> list:
        """Every kept TaskRecord, in the order their ends were seen."""
        return list(starmap(TaskRecord, self._tasks.newest(self._tasks.capacity)))

    @property
    def recorded(self) -> int:
        """Runs ever recorded: ``since(recorded)`` later gives the runs recorded after now."""
        return self._tasks.count

    def since(self, index: int) -> list:
        """The TaskRecords recorded after the first ``index`` runs (those still kept), oldest first."""
        return list(starmap(TaskRecord, self._tasks.newest(max(0, self._tasks.count - index))))

    def tail(self, ended: int, raw: bool = False) -> list:
        """The newest TaskRecords, back to the ``ended``-th newest run that finished or failed
        (lost runs among them come too): what a live view has not read yet. Only the tail is
        copied (a live view reads a small part of what is kept, once a second), oldest first
        (``raw``: plain tuples)."""
        if ended <= 0:
            return []
        kept = self._tasks
        n = ended
        while True:
            # lost runs are rare: counted in C, then as many more taken, until the tail holds
            # ``ended`` others (no Python step per record)
            statuses = kept.statuses(n)
            short = ended - (len(statuses) - statuses.count("lost"))
            if short <= 0 or len(statuses) < n:
                break
            n += short
        got = kept.newest(n)
        return got if raw else list(starmap(TaskRecord, got))

    def memory(self) -> dict[str, list]:
        """Worker name -> [(unix time, rss bytes)], for live and recently dead workers."""
        return {name: series.copy() for name, series in list(self._memory.items())}


def key_group(key: str) -> str:
    """The function a key was made from: ``"sleep-072895ec1"`` -> ``"sleep"``, a dask key
    ``"('sum-aggregate-5f3e...', 0)"`` -> ``"sum-aggregate"``."""
    name = key
    if name.startswith("(") and "'" in name:
        name = name.split("'")[1]
    parts = name.split("-")
    while len(parts) > 1 and (parts[-1].isdigit() or (len(parts[-1]) >= 6 and _hexish(parts[-1]))):
        parts.pop()
    return "-".join(parts)


def _hexish(s: str) -> bool:
    return all(c in "0123456789abcdef" for c in s.lower())
