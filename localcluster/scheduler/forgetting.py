"""Letting go: keys the client released or cancelled, and what their runs left behind.

A part of the Scheduler (composition: same thread, same lock, no I/O). It reaches the
scheduler's tasks and workers through narrow accessors (look up, drop a forgotten task),
moves tasks to ``released`` through the scheduler's one writer of states, and owns
``cancelled_runs`` (seq -> key): runs taken back from a worker that has not yet answered.
Their worker slot stays busy (``WorkerState.taken_back``: its seq maps to None) until the answer, so
a cancelled task that runs on (Python cannot interrupt it) still counts against its
worker's threads.

A task is forgotten (dropped from ``tasks``) once it is released and no dependent links
to it; forgetting a task may forget the inputs only it still needed, and so on down.
Whatever workers hold of a forgotten key is freed (``Free``), except where a newer run of
the key is on that worker: the Free could arrive after that run stored, and drop it.
"""
from __future__ import annotations

from concurrent.futures import CancelledError
from typing import Callable, Iterable, Optional

from ..wire import protocol as P
from .records import Deliver, Resolve, Send, Task, WorkerState, copies_dropped
from .transfers import gone as _gone

PENDING = frozenset({"waiting", "ready", "processing"})      # its futures are not done yet


class Forgetting:
    # Used by whichever thread brings the scheduler an event, under the cluster's lock.
    def __init__(self, task: Callable[[str], Optional[Task]], drop: Callable[..., Optional[Task]],
                 worker: Callable[[Optional[str]], Optional[WorkerState]], workers: Callable[[], Iterable[WorkerState]],
                 unassigned: Callable[[int], None], maybe_retire: Callable[..., list],
                 transition: Callable[[Task, str, str], None], references_dropped: Callable[[str], None]):
        self._task = task                    # the scheduler's tasks.get
        self._drop = drop                    # the scheduler's tasks.pop: a forgotten task leaves
        self._worker = worker                # the scheduler's workers.get; ``has`` and ``processing`` are written here
        self._workers = workers              # the scheduler's workers.values
        self._unassigned = unassigned        # Placement.unassigned: a run taken back no longer runs its task
        self._maybe_retire = maybe_retire    # the scheduler's: a closing worker may be done now
        self._to = transition                # the scheduler's one writer of Task.state
        self._references_dropped = references_dropped   # Asking.cancelled: tasks' references go with a cancel
        #: seq -> key of each run taken back (cancelled, released, inputs lost) that its worker has
        #: not answered; the worker's ``processing[seq]`` is None meanwhile, and the seq is in no run
        self.cancelled_runs: dict[int, str] = {}

    def needed_by_dependents(self, ts: Task) -> bool:
        if not ts.dependents:           # most tasks: no generator to make
            return False
        task = self._task
        return any((dts := task(d)) is not None and dts.state in PENDING for d in ts.dependents)

    def answered(self, seq: int) -> None:
        """The cancelled run ``seq`` is over for its worker (it answered, or died)."""
        self.cancelled_runs.pop(seq, None)

    def clear(self) -> None:
        self.cancelled_runs.clear()

    def release_key(self, key: str) -> list:
        """The client dropped its last future of ``key``."""
        ts = self._task(key)
        if ts is None:
            return []
        ts.let_go()
        if ts.wanted or self.needed_by_dependents(ts):
            return []
        return self.release(ts)

    def release(self, ts: Task, why: str = "released") -> list:
        # A fetch still waiting for the result (recreate_error_locally fetches inputs whose
        # futures the user may drop meanwhile) is answered now: nothing will come.
        out: list = [Deliver(req, ts.key, error=_gone(ts.key)) for req in ts.fetchers]
        ts.fetchers = ()
        if ts.state == "processing":
            out += self.unassign(ts)
        if ts.state != "released":
            ts.stop_waiting()
            self._to(ts, "released", why)
        out += self.forget(ts)
        return out

    def forget(self, ts: Task) -> list:
        out: list = []
        for name in copies_dropped(ts, self._worker):
            if self._worker(name) is not None:
                out.append(Send(name, P.Free((ts.key,))))
        ts.data = None
        if not ts.dependents or all(self._task(d) is None for d in ts.dependents):
            self._drop(ts.key, None)
            for d in ts.deps:
                out += self._unlink(d, ts.key)
        for ws in self._workers():
            if ws.closing:
                out += self._maybe_retire(ws)
        return out

    def _unlink(self, d: str, dependent: str) -> list:
        """``dependent`` is forgotten: its input ``d`` goes too if nothing else keeps it."""
        dts = self._task(d)
        if dts is None:
            return []
        dts.drop_dependent(dependent)
        if dts.state == "released":
            return self.forget(dts)
        if not dts.wanted and not self.needed_by_dependents(dts) and dts.state != "processing":
            return self.release(dts, "its last dependent forgotten")     # a fetch waiting on it is answered too
        return []

    def cancel(self, keys: list, by: str) -> list:
        """Cancel the pending tasks of ``keys`` and their pending dependents; ``by``: who
        cancelled them, for the CancelledError of their futures ("by Client.cancel ...")."""
        out: list = []
        for key in keys:
            ts = self._task(key)
            if ts is not None and ts.state in PENDING:
                out += self._cancel(ts, key, by)
        return out

    def _cancel(self, ts: Task, cancelled: str, by: str) -> list:
        """``ts`` goes with ``cancelled`` (itself, or an input it needs, directly or not)."""
        why = (f"was cancelled {by}" if ts.key == cancelled else
               f"was cancelled with {cancelled!r}, an input it needs (directly or not), cancelled {by}")
        error = CancelledError(f"Task {ts.key!r} {why}, and its data is let go of: submit it again to compute it.")
        out: list = [Resolve(ts.key, "cancelled", error)]
        for req in ts.fetchers:
            out.append(Deliver(req, ts.key, error=error))
        ts.fetchers = ()
        for dkey in sorted(ts.dependents):
            dts = self._task(dkey)
            if dts is not None and dts.state in PENDING:
                out += self._cancel(dts, cancelled, by)
        ts.let_go_all()                 # every reference: the clients', the tasks' (Asking), the values' (Coordination)
        ts.cancels += 1
        self._references_dropped(ts.key)
        out += self.release(ts)
        return out

    def unassign(self, ts: Task) -> list:
        """Take a run back from its worker (Cancel); its slot stays busy until the worker answers."""
        ws = self._worker(ts.worker)
        ts.worker = None
        self._unassigned(ts.seq)
        if ws is None:
            return []
        ws.taken_back(ts.seq)
        self.cancelled_runs[ts.seq] = ts.key
        return [Send(ws.name, P.Cancel((ts.seq,)))]

    def orphan(self, worker: str, seq: int) -> list:
        """A run we no longer care about (cancelled, released) ended: free what it left."""
        key = self.cancelled_runs.pop(seq, None)
        ws = self._worker(worker)
        if ws is None:
            return []
        out: list = []
        if key is not None and key not in ws.has and not self._running_again(key, worker):
            out.append(Send(worker, P.Free((key,))))
        return out + self._maybe_retire(ws)

    def _running_again(self, key: str, worker: str) -> bool:
        """A newer run of ``key`` is on ``worker``: a Free sent now could arrive after that run
        stored its result, and drop it (the worker then no longer holds what we think it does).
        The newer result replaces the stale one anyway."""
        ts = self._task(key)
        return ts is not None and ts.state == "processing" and ts.worker == worker
