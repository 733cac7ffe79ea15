"""How runs end, as their workers report them: finished, failed, skipped (a cancelled run
dropped before it started), given back (``Unqueued``, the answer to a steal).

A part of the Scheduler (composition: same thread, same lock, no I/O). It owns only
``small``, the one Payload kept for each small result many tasks share. A run's end frees
its worker slot (and the resources it claimed, and a secession's extra slot), then moves
its task on: to memory (its dependents may become ready, its inputs nobody else needs are
let go of), to ready again (retries left, given back), or to erred. A run the scheduler no
longer cares about (cancelled, released, superseded) leaves only a ``Free`` of what it stored
(``Forgetting.orphan``). A closing worker is retired once its last run ends.

The Scheduler's events of the same names call these (placement runs once at their end),
and so does ``Scheduler.handle`` for a frame of them (a ``Reported`` event).
"""
from __future__ import annotations

import sys
from typing import Callable, Optional

from ..wire import protocol as P
from .asking import Asking
from .forgetting import Forgetting
from .placement import Placement
from .readiness import Readiness
from .records import Resolve, Task, WorkerState, copy_stored
from .transfers import Transfers


class Outcomes:
    # Used by whichever thread brings the scheduler an event, under the cluster's lock.
    def __init__(self, task: Callable[[str], Optional[Task]], worker: Callable[[str], Optional[WorkerState]],
                 placement: Placement, transfers: Transfers, forgetting: Forgetting, readiness: Readiness,
                 asking: Asking, orphans_settled: Callable[[], list], maybe_retire: Callable[[WorkerState], list],
                 transition: Callable[[Task, str, str], None]):
        self._task = task                        # the scheduler's tasks.get
        self._worker = worker                    # the scheduler's workers.get (``has``, ``processing`` written)
        self._placement = placement              # a run's end frees its slot there; a given-back run is kept
        self._transfers = transfers              # client fetches waiting for a result are answered
        self._forgetting = forgetting            # what nobody needs is let go of; orphaned runs freed
        self._readiness = readiness              # dependents made ready; a failure fails them
        self._asking = asking                    # seceded runs rejoin as they end; orphans of a rerun
        self._orphans_settled = orphans_settled  # the scheduler's: what dead workers held for ended tasks
        self._maybe_retire = maybe_retire        # the scheduler's: a closing worker may be done now
        self._to = transition                    # the scheduler's one writer of Task.state
        #: pickled small result -> the one Payload kept for it (protocol.shared); only grows
        #: with distinct small results, each shared by every task that returns it
        self.small: dict = {}

    def finished(self, worker: str, seq: int, nbytes: int, type_name: str,
                 data: Optional[P.Payload], duration: float = 0.0) -> list:
        ts = self._take_run(worker, seq)
        if ts is None:
            return self._forgetting.orphan(worker, seq)
        self._placement.finished(duration)
        ws = self._worker(worker)
        # each message brings its own copy of a name and a small value that most tasks share
        data = P.shared(data, self.small)
        self._to(ts, "memory", "finished")
        ts.nbytes, ts.type_name, ts.data = nbytes, sys.intern(type_name), data
        copy_stored(ts, ws)
        out: list = [Resolve(ts.key, "finished", data)]
        if ts.rare is not None:     # else no earlier run's error, no fetch waiting: no property read
            ts.error = None
            for req in ts.fetchers:
                out += self._transfers.fetch(ts, req)
            ts.fetchers = ()
        task = self._task
        for dkey in (sorted(ts.dependents, key=lambda k: t.order if (t := task(k)) is not None else 0)
                     if ts.dependents else ()):      # most tasks have none: no sort, no closure
            dts = task(dkey)
            if dts is not None and dts.state == "waiting":
                dts.arrived(ts.key)
                if not dts.waiting_on:
                    out += self._readiness.make_ready_or_wait(dts)
        if not ts.wanted and not self._forgetting.needed_by_dependents(ts):
            out += self._forgetting.release(ts)
        if ts.deps:                                  # most tasks of a map have none: no call
            out += self._release_inputs(ts)
        if self._asking.orphans:                     # a rerun after a death held its children
            out += self._orphans_settled()
        return out + self._maybe_retire(ws) if ws.closing else out     # most finish on an open worker

    def _release_inputs(self, ts: Task) -> list:
        """Inputs the client already let go of are freed once their last dependent is done."""
        out: list = []
        for d in ts.deps:
            dts = self._task(d)
            if (dts is not None and dts.state == "memory" and not dts.wanted
                    and not self._forgetting.needed_by_dependents(dts)):
                out += self._forgetting.release(dts)
        return out

    def failed(self, worker: str, seq: int, error: bytes) -> list:
        ts = self._take_run(worker, seq)
        if ts is None:
            return self._forgetting.orphan(worker, seq)
        if ts.retries > 0:
            ts.retries -= 1
            out = self._readiness.make_ready_or_wait(ts)
        else:
            out = self._readiness.fail(ts, error, "failed") + self._release_inputs(ts)
        if self._asking.orphans:
            out += self._orphans_settled()
        return out + self._maybe_retire(self._worker(worker))

    def take_back(self, worker: str, seq: int) -> Optional[Task]:
        """A run that could not start (its inputs arrived damaged): its slot is free, and its
        task, still processing, is the caller's to place again or fail. None when nobody
        waits for that run any more (its orphan was freed)."""
        return self._take_run(worker, seq)

    def _take_run(self, worker: str, seq: int) -> Optional[Task]:
        ws = self._worker(worker)
        if ws is None:
            return None
        key = ws.answered(seq)
        if self._asking.seceded or self._asking.offboard:     # most clusters: no task ever seceded, no call
            self._asking.ended(seq, ws)
        self._placement.ended(seq)
        ts = self._task(key) if key is not None else None
        if ts is None or ts.seq != seq or ts.state != "processing":
            return None
        ts.worker = None
        return ts

    def skipped(self, worker: str, seq: int) -> list:
        """The worker dropped a cancelled run before starting it."""
        self._take_run(worker, seq)
        return self._forgetting.orphan(worker, seq)

    def unqueued(self, worker: str, asked: tuple, taken: tuple) -> list:
        """The answer to a steal: the runs ``taken`` back before they started are placed again."""
        for seq in asked:
            if seq not in taken:
                self._placement.kept(seq)
        out: list = []
        for seq in taken:
            ts = self._take_run(worker, seq)
            if ts is None:              # cancelled or released meanwhile
                out += self._forgetting.orphan(worker, seq)
            else:
                self._to(ts, "ready", "unqueued: given back")
                out += self._readiness.push_ready(ts)
        ws = self._worker(worker)
        return out + (self._maybe_retire(ws) if ws is not None else [])
