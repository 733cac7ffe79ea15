"""The stall watch: a cluster that finishes nothing is never silent.

On the scheduler thread's tick (cluster.py ``_run``), at most every ``CHECK`` seconds, it
reads a progress token: the runs ended so far (the task stream's counter), the runs sent
so far (placement's), and the runs going on now (the workers' status boards). Runs sent
count as progress: a submit so large that the parent takes longer than ``stall_warning`` to
admit it (a million tasks on a loaded machine) is no stall once its first runs go out. A
token unchanged for ``stall_warning`` seconds while tasks are pending makes it look at the cluster (``view``) and ask stall.py why;
the answer goes out as one WARNING on the ``localcluster`` logger, once per stall.

The timeouts of ``wait``, ``gather`` and ``result`` ask ``diagnosis()`` from user threads.

Reads, under the cluster's lock: the scheduler's tasks and the supervisor's nannies (through
their public readers). Owns nothing but its clock.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import Optional

from ..scheduler.state import Scheduler
from ..engine.history import History
from .supervisor import Supervisor
from .stall import ClusterView, QueuedTask, RunningTask, Stall, StallClock, WorkerView, diagnose, unexplained

logger = logging.getLogger("localcluster")

CHECK = 1.0     # the longest gap between two reads of the progress token (shorter for a short stall_warning)


class StallWatch:
    def __init__(self, lock: threading.Lock, scheduler: Scheduler, supervisor: Supervisor, history: History, config: dict,
                 memory_limit: Optional[int]):
        self._lock = lock
        self._scheduler = scheduler
        self._supervisor = supervisor
        self._history = history
        self._memory_limit = memory_limit
        self._memory_pause = config["memory_pause"]
        after = config["stall_warning"]
        self._clock = StallClock(after) if after else None
        self._interval = min(CHECK, after / 4) if after else CHECK
        self._next_check = 0.0

    def tick(self, now: float) -> None:
        """On the scheduler thread: one WARNING when the cluster has made no progress for
        ``stall_warning`` seconds while tasks are pending."""
        clock = self._clock
        if clock is None or now < self._next_check:
            return
        self._next_check = now + self._interval
        with self._lock:
            token = (self._history.ended, self._scheduler.runs_sent(), frozenset(self._supervisor.running_keys()))
        quiet = clock.quiet_for(now, token)
        if quiet is None:
            return
        view = self.view()
        if not view.total:
            clock.idle(now)
            return
        stall = diagnose(view) or Stall("unknown", unexplained(view))
        if not clock.should_say(quiet, stall):
            clock.look_later(now, clock.after)
            return
        clock.said()
        total = view.total
        logger.warning("localcluster: no task has finished for %s s and %d %s pending: %s (said once per "
                       "stall; stall_warning=%g)", f"{quiet:.0f}" if quiet >= 10 else f"{quiet:.1f}", total,
                       "is" if total == 1 else "are", stall.reason, clock.after)

    def diagnosis(self) -> Optional[Stall]:
        """Why the pending work cannot progress now, or None (any thread)."""
        return diagnose(self.view())

    def view(self) -> ClusterView:
        """The plain data stall.py reads. Takes the lock: never call it holding it."""
        snapshot = self._supervisor.snapshot()
        now = time.monotonic()
        with self._lock:
            running_on = self._supervisor.running_keys()
            pending, oldest = self._scheduler.oldest_pending(running_on)
            queued = QueuedTask(*oldest) if oldest is not None else None
            running = []
            for key, worker in running_on.items():
                started = self._supervisor.running_since(worker, self._scheduler.whereabouts(key).seq)
                running.append(RunningTask(key, worker, now - started if started is not None else 0.0))
        running.sort(key=lambda r: -r.seconds)
        per_worker = Counter(running_on.values())
        workers = tuple(WorkerView(i.name, i.status, i.memory, i.managed, i.nthreads, per_worker[i.name])
                        for i in snapshot.values())
        alive = sum(i.status != "closing" for i in snapshot.values())
        return ClusterView(dict(pending), workers, self._memory_limit, self._memory_pause,
                           max(0, self._supervisor.target - alive), queued, tuple(running))
