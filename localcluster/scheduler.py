"""The scheduler's decisions: a state machine with no I/O.

Events come in as method calls (task submitted, run finished, worker died, ...);
each returns a list of actions for the caller to carry out (:class:`Send` a
message to a worker, :class:`Resolve` a key's futures, :class:`Deliver` a fetched
value, :class:`Retire` a worker). Nothing here touches a process, a socket, a
clock or a thread, so it is tested with plain asserts (tests/test_scheduler.py).

Task states::

    waiting -> ready -> processing -> memory          (results stay on workers)
                           |   \\-> erred             (user error, KilledWorker, timeout)
                           \\-> ready (worker died; blamed runs count towards KilledWorker)
    memory -> waiting/ready   all copies lost with workers and still needed: recompute
    memory -> lost            scattered data whose only copy died (LostDataError)

A dependency on another worker is relayed through the parent: the holder gets
:class:`Export`, the reply becomes a :class:`Put` to the worker that needs it.
Small results travel with their ``Finished`` message and are kept here, so
relaying them, and answering ``result()``, costs no extra round trip.
"""
from __future__ import annotations

import heapq
import itertools
from typing import Any, Optional

from . import protocol as P
from .death import KilledWorker, LostDataError, TaskTimeoutError, WorkerDeath
from .records import Deliver, Export, Resolve, Retire, Send, Spec, Task, Whereabouts, WorkerState



class Scheduler:
    def __init__(self, allowed_failures: int = 3):
        self.allowed_failures = allowed_failures
        self.tasks: dict[str, Task] = {}
        self.workers: dict[str, WorkerState] = {}
        self._ready: list = []                      # heap of ready tasks any worker may run
        self._ready_on: dict[str, list] = {}        # worker -> heap of ready tasks restricted to it
        self.gone: set = set()                      # names of workers that died (names are never reused)
        self._seq = itertools.count(1)
        self._order = itertools.count()
        self._request = itertools.count(1)
        self.runs: dict[int, tuple[str, str]] = {}   # seq -> (key, worker)
        self.cancelled_runs: dict[int, str] = {}    # seq -> key, until the worker answers
        # request id -> (key, holder worker, target worker or None for a client fetch, client request)
        self.exports: dict[int, Export] = {}
        self.relaying: dict[tuple, int] = {}       # (key, target) -> request id
        self.replicas: dict[int, set] = {}         # replicate request -> {(key, target)} not yet stored
        self.unacked: dict[int, tuple] = {}        # ack id of a Put -> (key, target), until Stored
        self.avg_duration: Optional[float] = None
        self._deferring = False

    # --- queries ------------------------------------------------------------------------

    def key_of(self, seq: int) -> Optional[str]:
        run = self.runs.get(seq)
        return run[0] if run else None

    def knows(self, key: str) -> bool:
        return key in self.tasks

    def spec_of(self, key: str) -> Optional[Spec]:
        ts = self.tasks.get(key)
        return ts.spec if ts is not None else None

    def acquire(self, key: str) -> list:
        """One more Future of ``key`` (one unpickled in the parent) holds it like any other;
        if its task has ended, the new Future is resolved at once."""
        ts = self.tasks.get(key)
        if ts is None:
            return []
        ts.wanted += 1
        return [self._resolution(ts)] if ts.state in ("memory", "erred", "lost") else []

    def timeout_of(self, seq: int) -> Optional[float]:
        run = self.runs.get(seq)
        if run is None:
            return None
        ts = self.tasks.get(run[0])
        return ts.spec.timeout if ts is not None and ts.spec is not None else None

    def whereabouts(self, key: str) -> Whereabouts:
        ts = self.tasks.get(key)
        if ts is None:
            return Whereabouts("unknown")
        live = [ws for ws in self.workers.values() if not ws.closing]
        return Whereabouts(ts.state, ts.worker if ts.state == "processing" else None,
                           ts.seq if ts.state == "processing" else 0, tuple(sorted(ts.waiting_on)),
                           len(live), sum(ws.paused for ws in live),
                           ts.spec.workers if ts.spec is not None and not ts.spec.loose else None)

    def _capacity(self, ws: WorkerState) -> int:
        """Runs a worker may hold: its threads plus a prefetch sized by how short tasks are,
        so a map of tiny tasks travels in large batches while long tasks are not hoarded."""
        if self.avg_duration is None:
            prefetch = 2
        else:
            prefetch = max(1, min(256, int(0.01 / max(self.avg_duration, 1e-6))))
        return ws.nthreads + prefetch * ws.nthreads

    # --- workers ------------------------------------------------------------------------

    def add_worker(self, name: str, nthreads: int) -> list:
        self.workers[name] = WorkerState(name, nthreads)
        return self._assign()

    def set_paused(self, name: str, paused: bool) -> list:
        ws = self.workers.get(name)
        if ws is None or ws.paused == paused:
            return []
        ws.paused = paused
        return [] if paused else self._assign()

    def retire(self, name: str) -> list:
        """Stop giving ``name`` work; move data only it holds elsewhere; then Retire it."""
        ws = self.workers.get(name)
        if ws is None or ws.closing:
            return []
        ws.closing = True
        return self._maybe_retire(ws)

    def _maybe_retire(self, ws: WorkerState) -> list:
        """Retire a closing worker once it runs nothing and holds no needed data alone
        (that data is relayed to another worker first)."""
        if not ws.closing or ws.processing:
            return []
        if any(e.holder == ws.name for e in self.exports.values()):
            return []
        others = [w for w in self.workers.values() if not w.closing]
        out: list = []
        if others:
            for key in sorted(ws.has):
                ts = self.tasks[key]
                if ts.who_has == {ws.name} and ts.data is None and (ts.wanted or ts.dependents):
                    target = min(others, key=lambda w: (len(w.has), w.name))
                    out += self._relay(ts, target)
        if out or any(e.holder == ws.name for e in self.exports.values()):
            return out
        return [Retire(ws.name)]

    def worker_died(self, death: WorkerDeath, running: dict, crashed_seq: Optional[int] = None,
                    timed_out: Optional[tuple] = None) -> list:
        """``running``: seq -> started (from the worker's status board). The blame rules
        of the taxonomy pick which runs count towards KilledWorker.

        Order matters: first every copy on the dead worker is forgotten and the lost keys
        are marked, and only then is any task's readiness decided, so nothing is sent to
        run before an input it needs exists again."""
        ws = self.workers.pop(death.worker, None)
        if ws is None:
            return []
        self.gone.add(death.worker)
        out: list = self._orphaned_restrictions(death.worker)
        for ack, (key, target) in list(self.unacked.items()):
            if target == death.worker:
                del self.unacked[ack]
                out += self._relay_done(key, target)
        lost: list = []
        for key in ws.has:
            ts = self.tasks.get(key)
            if ts is None:
                continue
            ts.who_has.discard(death.worker)
            if ts.state == "memory" and not ts.who_has and ts.data is None:
                lost.append(ts)
        recompute: list = []
        for ts in sorted(lost, key=lambda t: t.order):
            if ts.spec is None:
                out += self._lost_for_good(ts, death)
            elif ts.wanted or self._needed_by_dependents(ts):
                ts.state = "waiting"
                recompute.append(ts)
            else:
                ts.state = "released"
                out += self._forget(ts)
        blamed = blamed_runs(death.cause, running, crashed_seq, timed_out[0] if timed_out else None)
        for seq, key in sorted(ws.processing.items()):
            self.runs.pop(seq, None)
            self.cancelled_runs.pop(seq, None)
            ts = self.tasks.get(key) if key is not None else None
            if ts is None or ts.seq != seq or ts.state != "processing":
                continue
            ts.worker = None
            if timed_out and seq == timed_out[0]:
                out += self._fail(ts, TaskTimeoutError(key, ts.spec.timeout, timed_out[1], death.worker,
                                                             death.stack))
                continue
            if seq in blamed:
                ts.suspicious += 1
                ts.deaths.append(death)
                if ts.suspicious > self.allowed_failures:
                    out += self._fail(ts, KilledWorker(key, death.worker, tuple(ts.deaths), self.allowed_failures))
                    continue
            ts.state = "waiting"
            recompute.append(ts)
        for ts in lost:
            out += self._pull_back_dependents(ts)
        for ts in sorted(recompute, key=lambda t: t.order):
            if ts.state == "waiting":
                out += self._make_ready_or_wait(ts)
        # relays and fetches that depended on it
        for req, export in list(self.exports.items()):
            key, holder, target, client = export.key, export.holder, export.target, export.client_request
            if target == death.worker:
                del self.exports[req]
                self.relaying.pop((key, target), None)
                out += self._relay_done(key, target)
            elif holder == death.worker:
                del self.exports[req]
                ts = self.tasks.get(key)
                if target is not None:
                    self.relaying.pop((key, target), None)
                    if ts is not None and ts.state == "memory" and target in self.workers:
                        out += self._relay(ts, self.workers[target])
                    if (key, target) not in self.relaying:
                        out += self._relay_done(key, target)
                elif ts is not None and ts.state == "memory":
                    out += self._fetch(ts, client)
                elif ts is not None and ts.state in ("waiting", "ready", "processing"):
                    ts.fetchers.append(client)
                elif ts is not None and ts.state == "lost":
                    out.append(Deliver(client, key, error=ts.error))
                else:
                    out.append(Deliver(client, key, error=_gone(key)))
        for other in list(self.workers.values()):
            out += self._maybe_retire(other)
        return out + self._assign()

    def _lost_for_good(self, ts: Task, death: WorkerDeath) -> list:
        """Scattered data whose last copy died: it cannot be recomputed."""
        ts.state = "lost"
        ts.error = LostDataError(ts.key, death.worker, death.cause)
        out: list = [Resolve(ts.key, "lost", ts.error)]
        for req in ts.fetchers:
            out.append(Deliver(req, ts.key, error=ts.error))
        ts.fetchers = []
        return out + self._fail_dependents(ts, ts.error)

    def _pull_back_dependents(self, ts: Task) -> list:
        """Dependents that were ready, or sent to a worker to wait for data that is gone:
        take them back until the data exists again."""
        out: list = []
        for dkey in ts.dependents:
            dts = self.tasks.get(dkey)
            if dts is None:
                continue
            if dts.state == "ready":
                dts.state = "waiting"
                dts.waiting_on.add(ts.key)
            elif dts.state == "processing":
                ws = self.workers.get(dts.worker)
                if ws is not None and ts.key not in ws.has:
                    out += self._unassign(dts)
                    dts.state = "waiting"
                    dts.waiting_on.add(ts.key)
            elif dts.state == "waiting":
                dts.waiting_on.add(ts.key)
        return out

    # --- tasks --------------------------------------------------------------------------

    def submit(self, specs: list) -> list:
        out: list = []
        for spec in specs:
            ts = self.tasks.get(spec.key)
            if ts is not None and ts.state != "released":
                ts.wanted += 1
                if ts.state in ("memory", "erred", "lost"):
                    out.append(self._resolution(ts))
                continue
            ts = self.tasks[spec.key] = Task(spec.key, spec, next(self._order))
            ts.wanted = 1
            missing = [d for d in spec.deps if d not in self.tasks]
            if missing:
                ts.state = "erred"
                ts.error = _gone(missing[0])
                out.append(self._resolution(ts))
                continue
            for d in spec.deps:
                self.tasks[d].dependents.add(spec.key)
            out += self._make_ready_or_wait(ts)
        return out + self._assign()

    def scatter(self, items: list, workers: Optional[frozenset] = None, broadcast: bool = False) -> list:
        """Data from the client: ``items`` is [(key, Payload)]. Each goes to the open worker
        (among ``workers``, if given) holding the fewest keys, or to all of them with
        ``broadcast``. Small values also stay here, and so does anything scattered while
        no worker runs: it is sent to a worker when a task needs it."""
        targets = sorted((w for w in self.workers.values() if not w.closing
                          and (workers is None or w.name in workers)), key=lambda w: (len(w.has), w.name))
        out: list = []
        for i, (key, data) in enumerate(items):
            ts = self.tasks.get(key)
            if ts is None or ts.state == "released":
                ts = self.tasks[key] = Task(key, None, next(self._order))
            ts.wanted += 1
            if ts.state == "memory":
                continue
            ts.state = "memory"
            ts.nbytes = data.nbytes
            ts.data = data if data.nbytes <= P.INLINE_RESULT or not targets else None
            for ws in (targets if broadcast or not targets else [targets[i % len(targets)]]):
                ts.who_has.add(ws.name)
                ws.has.add(key)
                out.append(Send(ws.name, P.Put(key, data)))
            out.append(Resolve(key, "finished", ts.data))
        return out

    def replicate(self, keys: list, n: Optional[int]) -> tuple[int, list]:
        """Copies of each key's data on ``n`` open workers (all when None): (request id,
        actions). The request is answered by a Deliver once every copy has arrived."""
        req = next(self._request)
        workers = sorted((w for w in self.workers.values() if not w.closing), key=lambda w: (len(w.has), w.name))
        want = len(workers) if n is None else min(n, len(workers))
        out: list = []
        pending = self.replicas[req] = set()    # registered first: _relay asks for acks for these
        for key in keys:
            ts = self.tasks.get(key)
            if ts is None or ts.state != "memory":
                continue
            copies = len(ts.who_has) + sum(1 for (k, _t) in self.relaying if k == key)
            for ws in workers:
                if copies >= want:
                    break
                if ws.name in ts.who_has or (key, ws.name) in self.relaying:
                    continue
                pending.add((key, ws.name))
                out += self._relay(ts, ws)
                copies += 1
        if not pending:
            del self.replicas[req]
            out.append(Deliver(req, ""))
        return req, out

    def stored(self, ack: int) -> list:
        """A worker acknowledged a Put: a copy that ``replicate`` waits for exists."""
        entry = self.unacked.pop(ack, None)
        return self._relay_done(*entry) if entry else []

    def _put(self, key: str, target: str, data: P.Payload) -> Send:
        """Put data on a worker, asking for an acknowledgement when a replicate waits for it."""
        ack = 0
        if any((key, target) in pending for pending in self.replicas.values()):
            ack = next(self._request)
            self.unacked[ack] = (key, target)
        return Send(target, P.Put(key, data, ack))

    def _relay_done(self, key: str, target: str, error: Any = None) -> list:
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

    def _make_ready_or_wait(self, ts: Task) -> list:
        out: list = []
        ts.waiting_on = {d for d in ts.deps if self.tasks[d].state != "memory"}
        for d in list(ts.waiting_on):
            dts = self.tasks[d]
            if dts.state in ("erred", "lost"):
                return self._fail(ts, dts.error)
            if dts.state == "released":   # needed again: bring it back
                if dts.spec is None:       # scattered data cannot be recomputed
                    return self._fail(ts, _gone(d))
                dts.state = "waiting"
                out += self._make_ready_or_wait(dts)
        if ts.waiting_on:
            ts.state = "waiting"
            return out
        ts.state = "ready"
        return out + self._push_ready(ts)

    def _push_ready(self, ts: Task) -> list:
        """Queue a ready task: on its workers' own queues when ``workers=`` restricts it,
        else (or when a preference's workers are all gone) on the shared queue."""
        entry = (-ts.spec.priority, ts.order, ts.key)
        if ts.spec.workers:
            live = [w for w in ts.spec.workers if w not in self.gone]
            if live:
                for w in live:
                    heapq.heappush(self._ready_on.setdefault(w, []), entry)
                return []
            if not ts.spec.loose:
                return self._fail(ts, _unplaceable(ts.key, ts.spec.workers))
        heapq.heappush(self._ready, entry)
        return []

    def _orphaned_restrictions(self, name: str) -> list:
        """Ready tasks restricted to a worker that is gone: requeue those with no live worker left."""
        out: list = []
        for _p, _o, key in self._ready_on.pop(name, ()):
            ts = self.tasks.get(key)
            if ts is not None and ts.state == "ready" and all(w in self.gone for w in ts.spec.workers):
                out += self._push_ready(ts)
        return out

    def batch(self) -> "_Batch":
        """``with scheduler.batch() as b: ...; actions += b.actions``: placement runs once
        for a whole frame of worker messages instead of once per message."""
        return _Batch(self)

    def _assign(self) -> list:
        out: list = []
        if self._deferring or not (self._ready or self._ready_on):
            return out
        open_workers = [w for w in self.workers.values() if not w.paused and not w.closing]
        if not open_workers:
            return out
        caps = {w.name: self._capacity(w) - len(w.processing) for w in open_workers}
        for ws in open_workers:
            heap = self._ready_on.get(ws.name)
            while heap and caps[ws.name] > 0:
                _prio, _order, key = heapq.heappop(heap)
                ts = self.tasks.get(key)
                if ts is not None and ts.state == "ready" and ts.spec.workers and ws.name in ts.spec.workers:
                    caps[ws.name] -= 1
                    out += self._run(ts, ws)
        while self._ready:
            _prio, _order, key = self._ready[0]
            ts = self.tasks.get(key)
            if ts is None or ts.state != "ready" or (ts.spec.workers and not ts.spec.loose):
                heapq.heappop(self._ready)
                continue
            ws = self._pick(ts, open_workers, caps)
            if ws is None:
                break
            heapq.heappop(self._ready)
            caps[ws.name] -= 1
            out += self._run(ts, ws)
        return out

    def _pick(self, ts: Task, workers: list, caps: dict) -> Optional[WorkerState]:
        best, best_score = None, None
        for ws in workers:
            if caps[ws.name] <= 0:
                continue
            local = sum(self.tasks[d].nbytes for d in ts.deps if d in ws.has) if ts.deps else 0
            score = (-local, len(ws.processing) / ws.nthreads, ws.name)
            if best_score is None or score < best_score:
                best, best_score = ws, score
        return best

    def _run(self, ts: Task, ws: WorkerState) -> list:
        out: list = []
        for d in ts.deps:
            if d not in ws.has:
                out += self._relay(self.tasks[d], ws)
        seq = next(self._seq)
        ts.seq, ts.worker, ts.state = seq, ws.name, "processing"
        ws.processing[seq] = ts.key
        self.runs[seq] = (ts.key, ws.name)
        spec = ts.spec
        fn = None
        if spec.fn_id not in ws.fns:
            ws.fns.add(spec.fn_id)
            fn = spec.fn
        out.append(Send(ws.name, P.Run(seq, ts.key, spec.fn_id, fn, spec.args, spec.deps)))
        return out

    def _relay(self, ts: Task, target: WorkerState) -> list:
        if ts.data is not None:
            ts.who_has.add(target.name)
            target.has.add(ts.key)
            return [self._put(ts.key, target.name, ts.data)]
        if (ts.key, target.name) in self.relaying or not ts.who_has:
            return []
        holder = min(ts.who_has, key=lambda w: len(self.workers[w].processing) if w in self.workers else 0)
        req = next(self._request)
        self.exports[req] = Export(ts.key, holder, target.name, None)
        self.relaying[(ts.key, target.name)] = req
        return [Send(holder, P.Export(ts.key, req))]

    def finished(self, worker: str, seq: int, nbytes: int, type_name: str,
                 data: Optional[P.Payload], duration: float = 0.0) -> list:
        ts = self._take_run(worker, seq)
        if ts is None:
            return self._orphan(worker, seq)
        self.avg_duration = duration if self.avg_duration is None else 0.8 * self.avg_duration + 0.2 * duration
        ws = self.workers[worker]
        ts.state, ts.nbytes, ts.type_name, ts.data = "memory", nbytes, type_name, data
        ts.who_has.add(worker)
        ws.has.add(ts.key)
        ts.error = None
        out: list = [Resolve(ts.key, "finished", data)]
        for req in ts.fetchers:
            out += self._fetch(ts, req)
        ts.fetchers = []
        for dkey in sorted(ts.dependents, key=lambda k: self.tasks[k].order if k in self.tasks else 0):
            dts = self.tasks.get(dkey)
            if dts is not None and dts.state == "waiting":
                dts.waiting_on.discard(ts.key)
                if not dts.waiting_on:
                    out += self._make_ready_or_wait(dts)
        if not ts.wanted and not self._needed_by_dependents(ts):
            out += self._release(ts)
        out += self._release_inputs(ts)
        out += self._maybe_retire(ws)
        return out + self._assign()

    def _release_inputs(self, ts: Task) -> list:
        """Inputs the client already let go of are freed once their last dependent is done."""
        out: list = []
        for d in ts.deps:
            dts = self.tasks.get(d)
            if (dts is not None and dts.state == "memory" and not dts.wanted
                    and not self._needed_by_dependents(dts)):
                out += self._release(dts)
        return out

    def failed(self, worker: str, seq: int, error: bytes) -> list:
        ts = self._take_run(worker, seq)
        if ts is None:
            return self._orphan(worker, seq)
        if ts.retries > 0:
            ts.retries -= 1
            out = self._make_ready_or_wait(ts)
        else:
            out = self._fail(ts, error) + self._release_inputs(ts)
        return out + self._maybe_retire(self.workers[worker]) + self._assign()

    def _take_run(self, worker: str, seq: int) -> Optional[Task]:
        ws = self.workers.get(worker)
        if ws is None:
            return None
        key = ws.processing.pop(seq, None)
        self.runs.pop(seq, None)
        ts = self.tasks.get(key) if key is not None else None
        if ts is None or ts.seq != seq or ts.state != "processing":
            return None
        ts.worker = None
        return ts

    def skipped(self, worker: str, seq: int) -> list:
        """The worker dropped a cancelled run before starting it."""
        self._take_run(worker, seq)
        return self._orphan(worker, seq)

    def _orphan(self, worker: str, seq: int) -> list:
        """A run we no longer care about (cancelled, released) ended: free what it left."""
        key = self.cancelled_runs.pop(seq, None)
        ws = self.workers.get(worker)
        if ws is None:
            return []
        out: list = []
        if key is not None and key not in ws.has:
            out.append(Send(worker, P.Free((key,))))
        return out + self._maybe_retire(ws) + self._assign()

    def _fail(self, ts: Task, error: Any) -> list:
        ts.state, ts.error = "erred", error
        out: list = [Resolve(ts.key, "error", error)]
        for req in ts.fetchers:
            out.append(Deliver(req, ts.key, error=error))
        ts.fetchers = []
        return out + self._fail_dependents(ts, error)

    def _fail_dependents(self, ts: Task, error: Any) -> list:
        out: list = []
        for dkey in sorted(ts.dependents):
            dts = self.tasks.get(dkey)
            if dts is None or dts.state in ("erred", "memory", "released", "lost"):
                continue
            if dts.state == "processing":
                out += self._unassign(dts)
            out += self._fail(dts, error)
        return out

    def _unassign(self, ts: Task) -> list:
        ws = self.workers.get(ts.worker)
        ts.worker = None
        self.runs.pop(ts.seq, None)
        if ws is None:
            return []
        ws.processing[ts.seq] = None     # the slot is busy until the worker answers
        self.cancelled_runs[ts.seq] = ts.key
        return [Send(ws.name, P.Cancel((ts.seq,)))]

    def _resolution(self, ts: Task) -> Resolve:
        if ts.state == "memory":
            return Resolve(ts.key, "finished", ts.data)
        return Resolve(ts.key, "lost" if ts.state == "lost" else "error", ts.error)

    # --- data for the client ------------------------------------------------------------

    def fetch(self, key: str) -> tuple[int, list]:
        """The client wants the data of ``key``: (request id, actions). The answer is a Deliver."""
        req = next(self._request)
        ts = self.tasks.get(key)
        if ts is None or ts.state == "released":
            return req, [Deliver(req, key, error=_gone(key))]
        if ts.state in ("erred", "lost"):
            return req, [Deliver(req, key, error=ts.error)]
        if ts.state != "memory":
            ts.fetchers.append(req)
            return req, []
        return req, self._fetch(ts, req)

    def _fetch(self, ts: Task, req: int) -> list:
        if ts.data is not None:
            return [Deliver(req, ts.key, ts.data)]
        holder = min(ts.who_has, key=lambda w: len(self.workers[w].processing))
        self.exports[req] = Export(ts.key, holder, None, req)
        return [Send(holder, P.Export(ts.key, req))]

    def data(self, worker: str, request: int, key: str, payload: Optional[P.Payload],
             error: Optional[bytes]) -> list:
        entry = self.exports.pop(request, None)
        if entry is None:
            return []
        holder, target, client = entry.holder, entry.target, entry.client_request
        out: list = []
        ts = self.tasks.get(key)
        if target is None:
            out.append(Deliver(client, key, payload, error))
        else:
            self.relaying.pop((key, target), None)
            tws = self.workers.get(target)
            if payload is None or tws is None or ts is None:
                out += self._relay_done(key, target, error)
            if tws is not None and ts is not None:
                if payload is not None:
                    ts.who_has.add(target)
                    tws.has.add(key)
                    out.append(self._put(key, target, payload))
                else:
                    for dkey in list(ts.dependents):
                        dts = self.tasks.get(dkey)
                        if dts is not None and dts.state == "processing" and dts.worker == target:
                            out += self._unassign(dts) + self._fail(dts, error)
                out += self._maybe_retire(tws)
        ws = self.workers.get(holder)
        if ws is not None:
            out += self._maybe_retire(ws)
        return out

    # --- forgetting ---------------------------------------------------------------------

    def release(self, key: str) -> list:
        """The client dropped its last future of ``key``."""
        ts = self.tasks.get(key)
        if ts is None:
            return []
        ts.wanted = max(0, ts.wanted - 1)
        if ts.wanted or self._needed_by_dependents(ts):
            return []
        return self._release(ts) + self._assign()

    def _needed_by_dependents(self, ts: Task) -> bool:
        return any(self.tasks[d].state in ("waiting", "ready", "processing")
                   for d in ts.dependents if d in self.tasks)

    def _release(self, ts: Task) -> list:
        out: list = []
        if ts.state == "processing":
            out += self._unassign(ts)
        ts.state = "released"
        out += self._forget(ts)
        return out

    def _forget(self, ts: Task) -> list:
        out: list = []
        for name in sorted(ts.who_has):
            ws = self.workers.get(name)
            if ws is not None:
                ws.has.discard(ts.key)
                out.append(Send(name, P.Free((ts.key,))))
        ts.who_has.clear()
        ts.data = None
        if not ts.dependents or all(d not in self.tasks for d in ts.dependents):
            self.tasks.pop(ts.key, None)
            for d in ts.deps:
                dts = self.tasks.get(d)
                if dts is not None:
                    dts.dependents.discard(ts.key)
                    if dts.state == "released" or (not dts.wanted and not self._needed_by_dependents(dts)
                                                   and dts.state != "processing"):
                        if dts.state != "released" or dts.key in self.tasks:
                            dts.state = "released"
                            out += self._forget(dts)
        for ws in self.workers.values():
            out += self._maybe_retire(ws) if ws.closing else []
        return out

    def cancel(self, keys: list) -> list:
        out: list = []
        for key in keys:
            ts = self.tasks.get(key)
            if ts is None or ts.state in ("memory", "erred", "lost", "released"):
                continue
            out += self._cancel(ts)
        return out + self._assign()

    def _cancel(self, ts: Task) -> list:
        out: list = [Resolve(ts.key, "cancelled")]
        for req in ts.fetchers:
            out.append(Deliver(req, ts.key, error=_gone(ts.key)))
        ts.fetchers = []
        for dkey in sorted(ts.dependents):
            dts = self.tasks.get(dkey)
            if dts is not None and dts.state in ("waiting", "ready", "processing"):
                out += self._cancel(dts)
        ts.wanted = 0
        out += self._release(ts)
        return out

    def clear(self, error: BaseException) -> list:
        """Everything is forgotten (restart, close): every unfinished future gets ``error``."""
        out: list = []
        for ts in self.tasks.values():
            if ts.state in ("waiting", "ready", "processing"):
                out.append(Resolve(ts.key, "error", error))
            for req in ts.fetchers:
                out.append(Deliver(req, ts.key, error=error))
        for req, entry in self.exports.items():
            if entry.client_request is not None:
                out.append(Deliver(req, entry.key, error=error))
        for req in self.replicas:
            out.append(Deliver(req, "", error=error))
        self.tasks.clear()
        self._ready.clear()
        self._ready_on.clear()
        self.replicas.clear()
        self.unacked.clear()
        self.runs.clear()
        self.cancelled_runs.clear()
        self.exports.clear()
        self.relaying.clear()
        for ws in self.workers.values():
            ws.processing.clear()
            ws.has.clear()
        return out


class _Batch:
    def __init__(self, scheduler: Scheduler):
        self.scheduler = scheduler
        self.actions: list = []

    def __enter__(self) -> "_Batch":
        self.scheduler._deferring = True
        return self

    def __exit__(self, *exc: object) -> None:
        self.scheduler._deferring = False
        self.actions = self.scheduler._assign()


def blamed_runs(cause: str, running: dict, crashed_seq: Optional[int], timed_out_seq: Optional[int]) -> set:
    """Which of the runs that were executing at a death count towards KilledWorker.

    A crash is blamed on the run on the crashing thread alone, when the stack names
    it; a timeout fails only the late task (with TaskTimeoutError, not KilledWorker);
    an exit the cluster asked for, or a failure of localcluster's own code, blames nobody.
    """
    if cause in ("requested", "exception", "timeout"):
        return set()
    if cause == "crash" and crashed_seq is not None:
        return {crashed_seq}
    return set(running)


def _unplaceable(key: str, workers: frozenset) -> Exception:
    names = ", ".join(sorted(workers))
    return RuntimeError(f"task {key!r} may run only on {names} (workers=...), and no such worker is left: it "
                        f"died or was retired, and worker names are never reused. Submit it again with "
                        f"workers= naming a running worker (cluster.workers), or allow_other_workers=True "
                        f"to treat workers= as a preference.")


def _gone(key: str) -> Exception:
    from concurrent.futures import CancelledError
    return CancelledError(f"{key!r} was released, cancelled or forgotten by a restart; submit it again")
