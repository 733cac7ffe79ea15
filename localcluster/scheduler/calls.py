"""``Client.run``'s calls: a function run on a worker now, outside the task slots.

A part of the Scheduler (composition: same thread, same lock, no I/O). It owns ``calls``:
request id -> (worker, what was called) of each Call sent and not answered yet. A call is
answered by a ``Deliver`` of the same request id: the result or the function's error
(``called``), KilledWorker naming the death if the worker dies first (``worker_died``), the
cluster's error if everything is forgotten (``clear``). Request ids come from the scheduler's
one counter, shared with fetches and replicas.
"""
from __future__ import annotations

from typing import Callable, Iterator, Optional

from ..wire import protocol as P
from ..death import KilledWorker, WorkerDeath
from .records import Deliver, Send, WorkerState


class Calls:
    # Used by whichever thread brings the scheduler an event, under the cluster's lock.
    def __init__(self, ids: Iterator[int], worker: Callable[[str], Optional[WorkerState]],
                 gone: Callable[[str], bool]):
        self._ids = ids                # request ids, shared with the scheduler's fetches and Transfers
        self._worker = worker          # the scheduler's workers.get
        self._gone = gone              # whether a worker of that name died (the scheduler's ``gone``)
        #: request id -> (worker, what was called) of each Call sent and not answered; an entry
        #: leaves with its answer, its worker's death or ``clear``
        self.calls: dict[int, tuple] = {}
        #: worker name -> its death, for a call to a worker that died (an actor's): KilledWorker naming it
        self.dead: dict[str, WorkerDeath] = {}

    def call(self, worker: str, fn: bytes, args: P.Payload, what: str, queue: str = "") -> tuple[int, list]:
        """Run a function on ``worker`` now (``Client.run``): (request id, actions). The answer
        is a Deliver: the result, the function's error, or KilledWorker if the worker dies first.
        The calls of one ``queue`` run in the order they are made here."""
        req = next(self._ids)
        ws = self._worker(worker)
        if ws is None and worker in self.dead:
            return req, [Deliver(req, what, error=KilledWorker(what, worker, (self.dead[worker],), 0))]
        if ws is None or ws.closing:
            why = "died" if self._gone(worker) else "is closing" if ws is not None else "is not running"
            return req, [Deliver(req, what, error=RuntimeError(
                f"{what} could not run on {worker!r}: the worker {why}. cluster.workers lists those running."))]
        self.calls[req] = (worker, what)
        return req, [Send(worker, P.Call(req, fn, args, queue))]

    def called(self, request: int, data: Optional[P.Payload], error: Optional[bytes]) -> list:
        """A worker answered a Call."""
        entry = self.calls.pop(request, None)
        return [Deliver(request, entry[1], data, error)] if entry is not None else []

    def worker_died(self, death: WorkerDeath) -> list:
        """The calls a dead worker never answered fail with KilledWorker, naming the death."""
        self.dead[death.worker] = death
        out: list = []
        for req, (worker, what) in list(self.calls.items()):
            if worker == death.worker:
                del self.calls[req]
                out.append(Deliver(req, what, error=KilledWorker(what, worker, (death,), 0)))
        return out

    def clear(self, error: BaseException) -> list:
        """Everything is forgotten (restart, close): every call waiting gets ``error``."""
        out = [Deliver(req, what, error=error) for req, (_w, what) in self.calls.items()]
        self.calls.clear()
        return out
