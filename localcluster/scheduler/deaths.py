"""What a worker's death does to the tasks: a part of the Scheduler (composition: same thread,
same lock, no I/O). It owns no state; the scheduler's ``WorkerDied`` event runs its steps in order:

1. ``lost``: every copy the dead worker held is forgotten; a key whose last copy it was is
   computed again if something needs it, let go of if nothing does, or fails with
   LostDataError if it was scattered (data cannot be recomputed);
2. ``runs_interrupted``: the runs it had run again, except the one that timed out (it fails
   with TaskTimeoutError) and those the death is blamed on past ``allowed_failures`` (they
   fail with KilledWorker, naming every death);
3. ``pull_back``: the dependents of lost keys, ready or sent to another worker to wait for
   them, wait again until the data exists.

Only then is any task's readiness decided (by the scheduler), so nothing is sent to run
before an input it needs exists again. ``blame`` names the runs a death counts against,
by the taxonomy's rules (``blamed_runs`` in death.py), before the death reaches the scheduler.
"""
from __future__ import annotations

from typing import Callable, Optional

from ..death import KilledWorker, LostDataError, TaskTimeoutError, WorkerDeath, blamed_runs
from .forgetting import Forgetting
from .readiness import Readiness
from .records import Deliver, Resolve, Task, WorkerState, copies_lost


class Deaths:
    # Used by whichever thread brings the scheduler an event, under the cluster's lock.
    def __init__(self, task: Callable[[str], Optional[Task]], worker: Callable[[Optional[str]], Optional[WorkerState]],
                 task_of: Callable[[int], Optional[Task]], unassigned: Callable[[int], None],
                 forgetting: Forgetting, readiness: Readiness, transition: Callable[[Task, str, str], None],
                 allowed_failures: int):
        self._task = task                # the scheduler's tasks.get
        self._worker = worker            # the scheduler's workers.get (the living ones)
        self._task_of = task_of          # Placement.task_of: seq -> the task a run sent runs
        self._unassigned = unassigned    # Placement.unassigned: a run of the dead worker no longer runs
        self._forgetting = forgetting    # lets go of what nothing needs; takes runs back (Cancel)
        self._readiness = readiness      # fails a task and its pending dependents
        self._to = transition            # the scheduler's one writer of Task.state
        #: deaths a task may be blamed for before it fails with KilledWorker (fixed at construction)
        self._allowed_failures = allowed_failures

    def blame(self, cause: str, running: dict, crashed_seq: Optional[int], timed_out_seq: Optional[int]) -> tuple:
        """The keys a death is blamed on (the taxonomy's rules: ``blamed_runs``)."""
        tasks = (self._task_of(s) for s in sorted(blamed_runs(cause, running, crashed_seq, timed_out_seq)))
        return tuple(ts.key for ts in tasks if ts is not None)

    def lost(self, ws: WorkerState, death: WorkerDeath) -> tuple[list, list, list]:
        """Forget the dead worker's copies. (actions, the tasks whose last copy it held, those
        of them to compute again): scattered ones are lost for good, unneeded ones let go of."""
        lost = [ts for ts in copies_lost(ws, self._task)
                if ts.state == "memory" and not ts.who_has and ts.data is None]
        out: list = []
        recompute: list = []
        for ts in sorted(lost, key=lambda t: t.order):
            if ts.terms is None:
                out += self._lost_for_good(ts, death)
            elif ts.wanted or self._forgetting.needed_by_dependents(ts):
                self._to(ts, "waiting", "worker-died: recompute lost data")
                recompute.append(ts)
            else:
                self._to(ts, "released", "worker-died: lost data nobody needs")
                out += self._forgetting.forget(ts)
        return out, lost, recompute

    def runs_interrupted(self, ws: WorkerState, death: WorkerDeath, timed_out: Optional[tuple],
                         recompute: list) -> list:
        """Runs the dead worker had: the late one fails, blamed ones count towards
        KilledWorker, the rest run again (appended to ``recompute``)."""
        out: list = []
        fail = self._readiness.fail
        for seq, key in sorted(ws.processing.items()):
            self._unassigned(seq)
            self._forgetting.answered(seq)
            ts = self._task(key) if key is not None else None
            if ts is None or ts.seq != seq or ts.state != "processing":
                continue
            ts.worker = None
            if timed_out and seq == timed_out[0]:
                out += fail(ts, TaskTimeoutError(key, ts.terms.timeout, timed_out[1], death.worker, death.stack),
                            "worker-died: timed out")
                continue
            if key in death.blamed:
                ts.suspicious += 1
                ts.deaths += (death,)
                if ts.suspicious > self._allowed_failures:
                    out += fail(ts, KilledWorker(key, death.worker, tuple(ts.deaths), self._allowed_failures,
                                                 ts.terms.submitter),
                                "worker-died: KilledWorker")
                    continue
            self._to(ts, "waiting", "worker-died: run again")
            recompute.append(ts)
        return out

    def _lost_for_good(self, ts: Task, death: WorkerDeath) -> list:
        """Scattered data whose last copy died: it cannot be recomputed."""
        self._to(ts, "lost", "worker-died: scattered data lost")
        ts.error = LostDataError(ts.key, death.worker, death.cause)
        out: list = [Resolve(ts.key, "lost", ts.error)]
        for req in ts.fetchers:
            out.append(Deliver(req, ts.key, error=ts.error))
        ts.fetchers = ()
        return out + self._readiness.fail_dependents(ts, ts.error)

    def pull_back(self, lost: list) -> list:
        """Dependents of the ``lost`` tasks that were ready, or sent to a worker to wait for data
        that is gone: take them back until the data exists again."""
        out: list = []
        for ts in lost:
            for dkey in ts.dependents:
                dts = self._task(dkey)
                if dts is None:
                    continue
                if dts.state == "ready":
                    self._to(dts, "waiting", "worker-died: an input lost")
                    dts.wait_for(ts.key)
                elif dts.state == "processing":
                    ws = self._worker(dts.worker)
                    if ws is not None and ts.key not in ws.has:
                        out += self._forgetting.unassign(dts)
                        self._to(dts, "waiting", "worker-died: an input lost")
                        dts.wait_for(ts.key)
                elif dts.state == "waiting":
                    dts.wait_for(ts.key)
        return out
