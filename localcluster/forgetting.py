"""Letting go: keys the client released or cancelled, and what their runs left behind.

A part of the Scheduler (composition: same thread, same lock, no I/O). It reads and
writes the scheduler's tasks and workers, and owns ``cancelled_runs`` (seq -> key): runs
taken back from a worker that has not yet answered. Their worker slot stays busy
(``WorkerState.processing[seq] = None``) until the answer, so a cancelled task that runs
on (Python cannot interrupt it) still counts against its worker's threads.

A task is forgotten (dropped from ``tasks``) once it is released and no dependent links
to it; forgetting a task may forget the inputs only it still needed, and so on down.
Whatever workers hold of a forgotten key is freed (``Free``), except where a newer run of
the key is on that worker: the Free could arrive after that run stored, and drop it.
"""
from __future__ import annotations

from typing import Callable

from . import protocol as P
from .records import Deliver, Resolve, Send, Task
from .transfers import gone as _gone

PENDING = frozenset({"waiting", "ready", "processing"})      # its futures are not done yet


class Forgetting:
    def __init__(self, tasks: dict, workers: dict, runs: dict, maybe_retire: Callable[..., list]):
        self._tasks = tasks                  # the scheduler's; forgotten tasks are deleted here
        self._workers = workers              # the scheduler's; ``has`` and ``processing`` are written here
        self._runs = runs                    # placement's seq -> (key, worker); unassigned runs leave it
        self._maybe_retire = maybe_retire    # the scheduler's: a closing worker may be done now
        self.cancelled_runs: dict[int, str] = {}

    def needed_by_dependents(self, ts: Task) -> bool:
        return any(self._tasks[d].state in PENDING for d in ts.dependents if d in self._tasks)

    def release_key(self, key: str) -> list:
        """The client dropped its last future of ``key``."""
        ts = self._tasks.get(key)
        if ts is None:
            return []
        ts.wanted = max(0, ts.wanted - 1)
        if ts.wanted or self.needed_by_dependents(ts):
            return []
        return self.release(ts)

    def release(self, ts: Task) -> list:
        out: list = []
        if ts.state == "processing":
            out += self.unassign(ts)
        ts.state = "released"
        out += self.forget(ts)
        return out

    def forget(self, ts: Task) -> list:
        out: list = []
        held = ts.who_has
        for name in (held if len(held) < 2 else sorted(held)):     # sorted: Frees go out in one order
            ws = self._workers.get(name)
            if ws is not None:
                ws.has.discard(ts.key)
                out.append(Send(name, P.Free((ts.key,))))
        ts.drop_holders()
        ts.data = None
        if not ts.dependents or all(d not in self._tasks for d in ts.dependents):
            self._tasks.pop(ts.key, None)
            for d in ts.deps:
                out += self._unlink(d, ts.key)
        for ws in self._workers.values():
            if ws.closing:
                out += self._maybe_retire(ws)
        return out

    def _unlink(self, d: str, dependent: str) -> list:
        """``dependent`` is forgotten: its input ``d`` goes too if nothing else keeps it."""
        dts = self._tasks.get(d)
        if dts is None:
            return []
        dts.drop_dependent(dependent)
        if dts.state == "released" or (not dts.wanted and not self.needed_by_dependents(dts)
                                       and dts.state != "processing"):
            if dts.state != "released" or dts.key in self._tasks:
                dts.state = "released"
                return self.forget(dts)
        return []

    def cancel(self, keys: list) -> list:
        out: list = []
        for key in keys:
            ts = self._tasks.get(key)
            if ts is not None and ts.state in PENDING:
                out += self._cancel(ts)
        return out

    def _cancel(self, ts: Task) -> list:
        out: list = [Resolve(ts.key, "cancelled")]
        for req in ts.fetchers:
            out.append(Deliver(req, ts.key, error=_gone(ts.key)))
        ts.fetchers = ()
        for dkey in sorted(ts.dependents):
            dts = self._tasks.get(dkey)
            if dts is not None and dts.state in PENDING:
                out += self._cancel(dts)
        ts.wanted = 0
        out += self.release(ts)
        return out

    def unassign(self, ts: Task) -> list:
        """Take a run back from its worker (Cancel); its slot stays busy until the worker answers."""
        ws = self._workers.get(ts.worker)
        ts.worker = None
        self._runs.pop(ts.seq, None)
        if ws is None:
            return []
        ws.processing[ts.seq] = None
        self.cancelled_runs[ts.seq] = ts.key
        return [Send(ws.name, P.Cancel((ts.seq,)))]

    def orphan(self, worker: str, seq: int) -> list:
        """A run we no longer care about (cancelled, released) ended: free what it left."""
        key = self.cancelled_runs.pop(seq, None)
        ws = self._workers.get(worker)
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
        ts = self._tasks.get(key)
        return ts is not None and ts.state == "processing" and ts.worker == worker
