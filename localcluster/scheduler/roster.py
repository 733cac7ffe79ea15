"""The workers as the scheduler gives them work: whether any could ever run what a task asks
(``unsatisfiable``), and when a closing worker may go (``maybe_retire``).

A part of the Scheduler (composition: same thread, same lock, no I/O). It owns no state: it
walks the scheduler's workers and looks tasks up through narrow accessors, and asks
``Transfers`` to relay what only a closing worker holds before that worker is let go.
"""
from __future__ import annotations

from typing import Callable, Iterable, Optional

from .records import Retire, Task, WorkerState
from .transfers import Transfers


class Roster:
    # Used by whichever thread brings the scheduler an event, under the cluster's lock.
    def __init__(self, task: Callable[[str], Task], workers: Callable[[], Iterable[WorkerState]],
                 transfers: Transfers, resources: dict):
        self._task = task              # the scheduler's tasks.__getitem__ (a worker's data is always known)
        self._workers = workers        # the scheduler's workers.values
        self._transfers = transfers    # relays a closing worker's data; knows what is on the move
        self._resources = resources    # what each worker the cluster starts declares (read only)

    def unsatisfiable(self, key: str, need: tuple) -> Optional[ValueError]:
        """The error for a task ``key`` asking ``need`` (Spec.resources) that no worker can
        ever run, or None when one can: measured against the running workers, or with none
        running, against what each worker the cluster starts declares. For a ValueError at
        submit, where dask's task would pend forever without a word."""
        live = [ws for ws in self._workers() if not ws.closing]
        if any(ws.could_fit(need) for ws in live) or (not live and WorkerState("", 1, self._resources).could_fit(need)):
            return None
        if live:
            has = "the workers have: " + ", ".join(f"{ws.name} {_amounts(ws.resources)}"
                                                   for ws in sorted(live, key=lambda w: w.name))
        else:
            has = f"no worker runs now, and each worker this cluster starts has {_amounts(self._resources)}"
        return ValueError(f"task {key!r} asks for resources={_amounts(dict(need))}, which no worker can ever "
                          f"give: {has}. A worker runs a task only while the resources it declares "
                          f"(LocalCluster(resources=...)) cover those of its runs. Ask for at most what one "
                          f"worker has, or start the cluster with more.")

    def maybe_retire(self, ws: WorkerState) -> list:
        """Retire a closing worker once it runs nothing and holds no needed data alone
        (that data is relayed to another worker first)."""
        if not ws.closing or ws.processing:
            return []
        transfers = self._transfers
        if transfers.awaits_data_from(ws.name):
            return []
        others = [w for w in self._workers() if not w.closing]
        out: list = []
        if others:
            for key in sorted(ws.has):
                ts = self._task(key)
                if ts.who_has == {ws.name} and ts.data is None and (ts.wanted or ts.dependents):
                    target = min(others, key=lambda w: (len(w.has), w.name))
                    out += transfers.relay(ts, target)
        if out or transfers.awaits_data_from(ws.name):
            return out
        return [Retire(ws.name)]


def _amounts(resources: dict) -> str:
    """{'GPU': 1, 'MEM': 2} as the user wrote it (no resources: '{}')."""
    return "{" + ", ".join(f"{name!r}: {amount:g}" for name, amount in sorted(resources.items())) + "}"
