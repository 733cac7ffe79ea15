"""Data in flight: relays between workers, fetches for the client, and replicas.

A part of the Scheduler (composition: same thread, same lock, no I/O). It looks up the
scheduler's tasks and workers (narrow accessors; it changes no task's state) and owns the
bookkeeping of data on the move:

- ``exports``: request id -> Export, data asked of a holder for a worker or a client;
- ``relaying``: (key, target) -> the request id of the relay under way;
- ``replicas``: replicate request -> the (key, target) copies not yet stored;
- ``unacked``: ack id of a Put -> (key, target), until the worker answers Stored;
- ``waiting``: per holder, the Exports not sent yet, in order: a holder is asked for at most
  ``EXPORT_WINDOW`` bytes at once (always one value). A spilled value is read back into memory
  to be sent, and held there until the parent has copied it: a gather of all of a worker's
  spilled results once read them all back together and the worker died of it.

A dependency on another worker is relayed through the parent: the holder gets
``Export``; its ``Data`` reply (or the bytes the parent copied out after ``Located``)
becomes a ``Put`` to the worker that needs it. Small
values are kept in the parent (``Task.data``) and put directly, with no round trip.
"""
from __future__ import annotations

import itertools
from concurrent.futures import CancelledError
from collections import OrderedDict
from typing import Any, Callable, Iterable, Optional

from ..wire import protocol as P
from .records import Deliver, Export, Send, Task, WorkerState, copy_stored

#: bytes of values one holder is asked to send at once (a value larger than this goes alone)
EXPORT_WINDOW = 64 << 20


class Transfers:
    # Used by whichever thread brings the scheduler an event, under the cluster's lock.
    def __init__(self, task: Callable[[str], Optional[Task]], worker: Callable[[str], Optional[WorkerState]],
                 workers: Callable[[], Iterable[WorkerState]], ids: "itertools.count"):
        self._task = task              # the scheduler's tasks.get
        self._worker = worker          # the scheduler's workers.get (a relay target's ``has`` is written here)
        self._workers = workers        # the scheduler's workers.values
        self._ids = ids                # request and ack ids, shared with the scheduler's fetches
        #: request id -> Export asked of a live holder, until it answers or dies
        self.exports: dict[int, Export] = {}
        #: (key, target) -> request id of the relay under way; exactly the exports with a target
        self.relaying: dict[tuple, int] = {}
        #: replicate request -> the (key, target) copies not yet stored; answered when empty
        self.replicas: dict[int, set] = {}
        #: ack id of a Put to a live worker -> (key, target), until the worker answers Stored
        self.unacked: dict[int, tuple] = {}
        #: holder -> bytes of the Exports sent to it and not answered (never above EXPORT_WINDOW
        #: but for a lone value); the requests' sizes, until answered
        self._asked: dict[str, int] = {}
        self._sizes: dict[int, int] = {}
        self.window = EXPORT_WINDOW         #: read only (a test makes it small)
        #: holder -> request id -> (bytes, the Export message) not sent yet, in the order asked
        self.waiting: dict[str, OrderedDict] = {}

    def awaits_data_from(self, worker: str) -> bool:
        """Whether a relay or fetch still waits for data from ``worker``."""
        return any(e.holder == worker for e in self.exports.values())

    def relay(self, ts: Task, target: WorkerState) -> list:
        """Get ``ts``'s data onto ``target``."""
        if ts.data is not None:
            copy_stored(ts, target)
            return [self.put(ts.key, target.name, ts.data, "the parent's copy")]
        if (ts.key, target.name) in self.relaying or not ts.who_has:
            return []
        holder = min(ts.who_has, key=lambda w: len(ws.processing) if (ws := self._worker(w)) is not None else 0)
        req = next(self._ids)
        self.exports[req] = Export(ts.key, holder, target.name, None)
        self.relaying[(ts.key, target.name)] = req
        # locate: the parent copies it out of the holder itself, then into the target (two
        # copies into warm memory are faster than one memfd of small shmem pages: wire/recycle.py)
        return self._ask(holder, req, ts.nbytes, P.Export(ts.key, req, True))

    def fetch(self, ts: Task, req: int) -> list:
        """The client's request ``req`` for the data of ``ts`` (in memory somewhere)."""
        if ts.data is not None:
            return [Deliver(req, ts.key, ts.data)]
        holder = min(ts.who_has, key=lambda w: len(self._worker(w).processing))
        self.exports[req] = Export(ts.key, holder, None, req)
        return self._ask(holder, req, ts.nbytes, P.Export(ts.key, req, True))    # it may copy it out itself

    def _ask(self, holder: str, req: int, nbytes: int, msg: P.Export) -> list:
        """Send ``msg`` to ``holder`` now if its window has room (or nothing is asked of it),
        else when earlier answers have made room (:meth:`answered`)."""
        used = self._asked.get(holder, 0)
        if used and (used + nbytes > self.window or self.waiting.get(holder)):
            self.waiting.setdefault(holder, OrderedDict())[req] = (nbytes, msg)
            return []
        self._asked[holder] = used + nbytes
        self._sizes[req] = nbytes
        return [Send(holder, msg)]

    def sent_sizes(self) -> dict:
        """Request id -> bytes, of the Exports sent and not answered (invariants.py)."""
        return dict(self._sizes)

    def sending(self, holder: str) -> list:
        """The Exports asked of ``holder`` (sent or waiting), for its death's message."""
        return [e for e in self.exports.values() if e.holder == holder]

    def answered(self, request: int) -> tuple[Optional[Export], list]:
        """The holder answered ``request`` (data or an error), or will never (it died): what it
        was for, and the Exports its answer made room for."""
        export = self.exports.pop(request, None)
        if export is None:
            return None, []
        if export.target is not None:
            self.relaying.pop((export.key, export.target), None)
        holder = export.holder
        queue = self.waiting.get(holder)
        if queue and queue.pop(request, None) is not None:     # never sent: it takes no room
            if not queue:
                del self.waiting[holder]
            return export, []
        used = self._asked.get(holder, 0) - self._sizes.pop(request, 0)
        out: list = []
        while queue:
            req, (nbytes, msg) = next(iter(queue.items()))
            if used and used + nbytes > self.window:
                break
            del queue[req]
            used += nbytes
            self._sizes[req] = nbytes
            out.append(Send(holder, msg))
        if queue is not None and not queue:
            del self.waiting[holder]
        if used:
            self._asked[holder] = used
        else:
            self._asked.pop(holder, None)
        return export, out

    def put(self, key: str, target: str, data: P.Payload, origin: str) -> Send:
        """Put data on a worker, asking for an acknowledgement when a replicate waits for it.
        ``origin``: where the bytes come from, for the worker to name if they arrive damaged."""
        ack = 0
        if any((key, target) in pending for pending in self.replicas.values()):
            ack = next(self._ids)
            self.unacked[ack] = (key, target)
        return Send(target, P.Put(key, data, ack, origin))

    def stored(self, ack: int) -> list:
        """A worker acknowledged a Put: a copy that ``replicate`` waits for exists."""
        entry = self.unacked.pop(ack, None)
        return self.done(*entry) if entry else []

    def done(self, key: str, target: str, error: Any = None) -> list:
        """A copy of ``key`` on ``target`` arrived (or failed): answer the replicates waiting for it."""
        out: list = []
        for req, pending in list(self.replicas.items()):
            if (key, target) in pending:
                pending.discard((key, target))
                if error is not None:
                    del self.replicas[req]
                    out.append(Deliver(req, key, error=error))
                elif not pending:
                    del self.replicas[req]
                    out.append(Deliver(req, key))
        return out

    def replicate(self, keys: list, n: Optional[int]) -> tuple[int, list]:
        """Copies of each key's data on ``n`` open workers (all when None): (request id,
        actions). The request is answered by a Deliver once every copy is stored."""
        req = next(self._ids)
        workers = sorted((w for w in self._workers() if not w.closing), key=lambda w: (len(w.has), w.name))
        want = len(workers) if n is None else min(n, len(workers))
        out: list = []
        pending = self.replicas[req] = set()    # registered first: put() asks for acks for these
        for key in keys:
            ts = self._task(key)
            if ts is None or ts.state != "memory":
                continue
            copies = len(ts.who_has) + sum(1 for (k, _t) in self.relaying if k == key)
            for ws in workers:
                if copies >= want:
                    break
                if ws.name in ts.who_has or (key, ws.name) in self.relaying:
                    continue
                pending.add((key, ws.name))
                out += self.relay(ts, ws)
                copies += 1
        if not pending:
            del self.replicas[req]
            out.append(Deliver(req, ""))
        return req, out

    def copies(self, pairs: list) -> tuple[int, list]:
        """A copy of each ``(Task, WorkerState)``'s data on that worker (rebalance): (request id,
        actions), answered by a Deliver once every copy is stored, as ``replicate``."""
        req = next(self._ids)
        out: list = []
        pending = self.replicas[req] = set()
        for ts, ws in pairs:
            if ts.state != "memory" or ws.name in ts.who_has or (ts.key, ws.name) in self.relaying:
                continue
            pending.add((ts.key, ws.name))
            out += self.relay(ts, ws)
        if not pending:
            del self.replicas[req]
            out.append(Deliver(req, ""))
        return req, out

    def worker_died(self, dead: str) -> list:
        """Copies on their way to ``dead`` will not arrive; data asked of it is asked again
        of another holder, or the fetch waits for the recompute, or fails."""
        out: list = []
        for ack, (key, target) in list(self.unacked.items()):
            if target == dead:
                del self.unacked[ack]
                out += self.done(key, target)
        for req, export in list(self.exports.items()):
            if export.target == dead:
                _export, more = self.answered(req)
                out += more + self.done(export.key, dead)
            elif export.holder == dead:
                self.answered(req)
                out += self.ask_again(export)
        self._asked.pop(dead, None)
        return out

    def put_lost(self, key: str, target: str) -> None:
        """A Put of ``key`` to ``target`` was not stored (it arrived damaged): no Stored will
        answer its ack; the relay that sends it again asks for a new one."""
        for ack, entry in list(self.unacked.items()):
            if entry == (key, target):
                del self.unacked[ack]

    def ask_again(self, export: Export) -> list:
        """An Export whose holder cannot answer it (died, or its copy is damaged): asked of
        another holder, or waiting for the value to be made again, or failed."""
        key, target, client = export.key, export.target, export.client_request
        ts = self._task(key)
        if target is not None:
            out: list = []
            tws = self._worker(target)
            if ts is not None and ts.state == "memory" and tws is not None:
                out += self.relay(ts, tws)
            if (key, target) not in self.relaying:
                out += self.done(key, target)
            return out
        if ts is not None and ts.state == "memory":
            return self.fetch(ts, client)
        if ts is not None and ts.state in ("waiting", "ready", "processing"):   # still to come
            ts.fetchers += (client,)
            return []
        if ts is not None and ts.state in ("lost", "erred"):   # erred: its recompute cannot run
            return [Deliver(client, key, error=ts.error)]
        return [Deliver(client, key, error=gone(key))]

    def clear(self, error: BaseException) -> list:
        """Everything is forgotten: every waiting fetch and replicate gets ``error``."""
        out = [Deliver(req, e.key, error=error) for req, e in self.exports.items() if e.client_request is not None]
        out += [Deliver(req, "", error=error) for req in self.replicas]
        self.exports.clear()
        self.relaying.clear()
        self.replicas.clear()
        self.unacked.clear()
        self._asked.clear()
        self._sizes.clear()
        self.waiting.clear()
        return out


def gone(key: str) -> Exception:
    return CancelledError(f"{key!r} was released, cancelled or forgotten by a restart; submit it again")
