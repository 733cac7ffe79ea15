"""The tasks' way in: submitted (a ``Spec``), scattered (data from the client), or held by
one more Future (``acquire``). A part of the Scheduler (composition: same thread, same lock,
no I/O), and the only one that adds tasks to the scheduler's ``tasks``; it owns the order of
submission (``Task.order``).

A key submitted again while it is pending or done is only wanted once more (its Future is
resolved at once if it ended): pure keys are identities. A released key kept for its
dependents is made anew, and they stay linked to it. A task whose input is forgotten fails
at once, linked to no input. Scattered data goes to the open worker holding the fewest keys
(or to every one, ``broadcast``); a small value, or one scattered while no worker runs, is
also kept here and sent to a worker when a task needs it.
"""
from __future__ import annotations

import itertools
from typing import Callable, Iterable, Optional

from ..wire import protocol as P
from .records import Resolve, Send, Task, WorkerState, copy_stored
from .transfers import gone as _gone

ENDED = frozenset({"memory", "erred", "lost"})               # its futures are done


class Admission:
    # Used by whichever thread brings the scheduler an event, under the cluster's lock.
    def __init__(self, task: Callable[[str], Optional[Task]], add: Callable[[str, Task], None],
                 workers: Callable[[], Iterable[WorkerState]], forget: Callable[[Task], list],
                 make_ready_or_wait: Callable[[Task], list], transition: Callable[[Task, str, str], None]):
        self._task = task                    # the scheduler's tasks.get
        self._add = add                      # the scheduler's tasks.__setitem__: only here are tasks added
        self._workers = workers              # the scheduler's workers.values; ``has`` is written here
        self._forget = forget                # Forgetting.forget: an input no longer linked goes
        self._make_ready_or_wait = make_ready_or_wait    # Readiness's: a new task waits, is ready, or fails
        self._to = transition                # the scheduler's one writer of Task.state
        #: submission order of tasks (Task.order): placement's tie-break, and the order of recomputes
        self._order = itertools.count()

    def acquire(self, key: str, counted: bool = True) -> list:
        """One more Future of ``key`` (one unpickled in the parent) holds it like any other,
        unless its client held the key already (``counted`` False: a client counts once a
        key); if its task has ended, the new Future is resolved at once."""
        ts = self._task(key)
        if ts is None:
            return []
        if counted:
            ts.hold()
        return [resolution(ts)] if ts.state in ENDED else []

    def submit(self, specs: list, again: Optional[dict] = None) -> list:
        """``again``: {key: n}: n of ``specs`` are of a key their client holds already
        (Client.track_many). A client counts once in a key's ``wanted``, as it releases a key
        once, when its last future goes: those do not add to a task that is there, and a
        task made anew counts its client once, whichever of its specs made it."""
        out: list = []
        task = self._task
        for spec in specs:
            ts = task(spec.key)
            if ts is not None and ts.state != "released":
                if again and again.get(spec.key):
                    again[spec.key] -= 1
                else:
                    ts.hold()
                if ts.state in ENDED:
                    out.append(resolution(ts))
                continue
            if ts is not None:
                # Released but kept for its dependents, which stay linked to the new
                # run. The new spec may name other dependencies (a finished one now
                # travels as a value), so the old links go before the new are made.
                for d in set(ts.deps).difference(spec.deps):
                    dts = task(d)
                    if dts is not None:
                        dts.drop_dependent(spec.key)
                        if dts.state == "released":
                            out += self._forget(dts)
            kept = ts.dependents if ts is not None else None
            ts = Task(spec.key, spec, next(self._order), 1)       # its client's reference
            self._add(spec.key, ts)
            if kept:
                ts.dependents = kept
            missing = [d for d in spec.deps if task(d) is None] if spec.deps else None
            if missing:
                ts.error = _gone(missing[0])
                # never linked to its inputs, so it lists none: an input submitted again later
                # must not be taken for one of its inputs (it would not list it as a dependent)
                ts.deps = ()
                self._to(ts, "erred", "submit: an input is forgotten")
                out.append(resolution(ts))
                continue
            for d in spec.deps:
                task(d).add_dependent(spec.key)
            out += self._make_ready_or_wait(ts)
        return out

    def scatter(self, items: list, workers: Optional[frozenset] = None, broadcast: bool = False) -> list:
        """Data from the client: ``items`` is [(key, Payload)]. Each goes to the open worker
        (among ``workers``, if given) holding the fewest keys, or to all of them with
        ``broadcast``. Small values also stay here, and so does anything scattered while
        no worker runs: it is sent to a worker when a task needs it."""
        targets = sorted((w for w in self._workers() if not w.closing
                          and (workers is None or w.name in workers)), key=lambda w: (len(w.has), w.name))
        out: list = []
        for i, (key, data) in enumerate(items):
            ts = self._task(key)
            if ts is None or ts.state == "released":
                ts = Task(key, None, next(self._order))
                self._add(key, ts)
            ts.hold()
            if ts.state == "memory":
                continue
            self._to(ts, "memory", "scatter")
            ts.nbytes = data.nbytes
            ts.data = data if data.nbytes <= P.INLINE_RESULT or not targets else None
            for ws in (targets if broadcast or not targets else [targets[i % len(targets)]]):
                copy_stored(ts, ws)
                out.append(Send(ws.name, P.Put(key, data, 0, "the client (scatter)")))
            out.append(Resolve(key, "finished", ts.data))
        return out


def resolution(ts: Task) -> Resolve:
    """How an ended task's futures are resolved."""
    if ts.state == "memory":
        return Resolve(ts.key, "finished", ts.data)
    return Resolve(ts.key, "lost" if ts.state == "lost" else "error", ts.error)
