"""Readiness: a task's way to ``ready`` once its inputs are in memory, or to ``erred``.

A part of the Scheduler (composition: same thread, same lock, no I/O). It owns no state:
it decides, for a task whose inputs may have changed, whether it waits (for which inputs),
is ready (queued on ``Placement``), or fails; a failure fails the pending dependents with
it. It looks tasks up through the scheduler's narrow accessors, moves them through the
scheduler's one writer of states, and asks ``Placement`` to queue and ``Forgetting`` to take
a run back.

A task restricted to workers (``workers=``) that are all gone fails, unless they were only
a preference (``allow_other_workers``): worker names are never reused.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from ..death import LostDataError
from .forgetting import PENDING
from .records import Deliver, Resolve, Task

FAILED = frozenset({"erred", "lost"})


class Readiness:
    # Used by whichever thread brings the scheduler an event, under the cluster's lock.
    def __init__(self, task: Callable[[str], Optional[Task]], running: Callable[[str], bool],
                 gone: Callable[[str], bool], push: Callable[[Task, list], None],
                 drop_worker: Callable[[str], list], unassign: Callable[[Task], list],
                 transition: Callable[[Task, str, str], None]):
        self._task = task                # the scheduler's tasks.get (a task's inputs are always there)
        self._running = running          # whether a worker of that name runs now (in the scheduler's workers)
        self._gone = gone                # whether a worker of that name died (the scheduler's ``gone``)
        self._push = push                # Placement.push: queue a ready task (on these workers, if any)
        self._drop_worker = drop_worker  # Placement.drop_worker: a dead worker's queue, emptied
        self._unassign = unassign        # Forgetting.unassign: take a run back from its worker
        self._to = transition            # the scheduler's one writer of Task.state

    def make_ready_or_wait(self, ts: Task) -> list:
        """``ts`` waits for the inputs not in memory (bringing back released ones), is queued
        ready if none is missing, or fails if one failed or is gone for good."""
        if not ts.deps and not ts.terms.workers:      # most tasks of a big map: ready at once
            self._to(ts, "ready", "inputs in memory")
            self._push(ts, ())
            return []
        out: list = []
        task = self._task
        ts.wait_on(d for d in ts.deps if task(d).state != "memory")
        for d in list(ts.waiting_on):
            dts = task(d)
            if dts.state in FAILED:
                return self.fail(ts, dts.error, "an input failed")
            if dts.state == "released":   # needed again: bring it back
                if dts.terms is None:       # scattered data cannot be recomputed: lost, or let go of
                    error = dts.error if dts.error is not None else LostDataError(d, needed_by=ts.key)
                    return self.fail(ts, error, "an input is forgotten")
                self._to(dts, "waiting", "needed again by a dependent")
                out += self.make_ready_or_wait(dts)
                if ts.state in FAILED:      # that input failed, and this task with it
                    return out
                if dts.state in FAILED:     # failed at once, sparing this task (not pending yet: a submit, a retry)
                    return out + self.fail(ts, dts.error, "an input failed")
        if ts.waiting_on:
            if ts.state != "waiting":
                self._to(ts, "waiting", "inputs not in memory")
            return out
        self._to(ts, "ready", "inputs in memory")
        return out + self.push_ready(ts)

    def push_ready(self, ts: Task) -> list:
        """Queue a ready task; one whose ``workers=`` are all gone fails, unless they were
        only a preference."""
        # A preference (loose) for a worker that does not run now is no preference: a name
        # that never ran would otherwise hold the task on a queue nobody serves.
        live = [w for w in ts.terms.workers if not self._gone(w) and (not ts.terms.loose or self._running(w))] \
            if ts.terms.workers else []
        if ts.terms.workers and not live and not ts.terms.loose:
            return self.fail(ts, _unplaceable(ts.key, ts.terms.workers), "no allowed worker left")
        self._push(ts, live)
        return []

    def worker_gone(self, name: str) -> list:
        """Ready tasks restricted to a worker that is gone: requeue those with no live worker left."""
        out: list = []
        for key in self._drop_worker(name):
            ts = self._task(key)
            # entries are deleted lazily: the key may have been submitted again since, unrestricted
            if ts is not None and ts.state == "ready" and ts.terms.workers \
                    and all(self._gone(w) for w in ts.terms.workers):
                out += self.push_ready(ts)
        return out

    def fail(self, ts: Task, error: Any, why: str) -> list:
        """``ts`` ends with ``error``: its futures and fetches get it, and so do its pending dependents."""
        ts.error = error
        ts.stop_waiting()
        self._to(ts, "erred", why)
        out: list = [Resolve(ts.key, "error", error)]
        for req in ts.fetchers:
            out.append(Deliver(req, ts.key, error=error))
        ts.fetchers = ()
        return out + self.fail_dependents(ts, error)

    def fail_dependents(self, ts: Task, error: Any) -> list:
        out: list = []
        for dkey in sorted(ts.dependents):
            dts = self._task(dkey)
            if dts is None or dts.state not in PENDING:
                continue
            if dts.state == "processing":
                out += self._unassign(dts)
            out += self.fail(dts, error, "an input failed")
        return out


def _unplaceable(key: str, workers: frozenset) -> Exception:
    names = ", ".join(sorted(workers))
    return RuntimeError(f"task {key!r} may run only on {names} (workers=...), and no such worker is left: it "
                        f"died or was retired, and worker names are never reused. Submit it again with "
                        f"workers= naming a running worker (cluster.workers), or allow_other_workers=True "
                        f"to treat workers= as a preference.")
