"""Placement: which ready task runs on which worker, and when.

A part of the Scheduler (composition: same thread, same lock, no I/O). It looks tasks up
by key and walks the workers through the scheduler's narrow accessors, moves a task
ready -> processing through the scheduler's one writer of states, and owns:

- the ready queues: one shared heap, one per worker for tasks that ``workers=``
  restricts, and one per shape of ``resources=`` asked (``needy``; entries are deleted
  lazily: a popped key is checked against its task);
- the run numbers (``seq``) and ``runs`` (seq -> (key, worker)) of what it sent;
- ``avg_duration``, which sizes each worker's prefetch;
- ``stealing`` (seq -> worker): runs asked back from a worker whose queue outlasts its
  threads while another worker has threads idle (a long task, or a cancelled one that
  runs on, would otherwise hold the runs prefetched behind it). The worker gives back
  those not started (``Unqueued``), and they are placed again.

A run goes to the open worker already holding most of its inputs' bytes, then the least
loaded one; inputs it lacks are relayed to it first (``Transfers.relay``).

Resources (dask's abstract ones: ``resources={"MEM": 1}``): a run that asks for some goes
only to a worker where they are ``available``, and claims them there from its assignment
(prefetched runs count) until its seq leaves the worker's ``processing``
(``WorkerState.claim``). Such tasks wait on a heap of their own per shape of request, so a
task that no worker can take now holds up neither the shared queue nor other shapes; the
queues are merged by priority. A task that asks for nothing pays nothing of this.
"""
from __future__ import annotations

import heapq
from typing import Callable, Iterable, Optional

from ..wire import protocol as P
from .records import Send, Task, WorkerState


STEAL_MAX_BYTES = 64 << 20


class Placement:
    # Used by whichever thread brings the scheduler an event, under the cluster's lock.
    def __init__(self, task: Callable[[str], Optional[Task]], workers: Callable[[], Iterable[WorkerState]],
                 relay: Callable[[Task, WorkerState], list], transition: Callable[[Task, str, str], None]):
        self._task = task              # the scheduler's tasks.get
        self._workers = workers        # the scheduler's live workers; ``processing`` and ``fns`` are written here
        self._relay = relay            # Transfers.relay: an input onto the worker about to run its dependent
        self._to = transition          # the scheduler's one writer of Task.state
        #: heap of (-priority, order, key); entries whose task is no longer ready are dropped when popped
        self._shared: list = []
        #: worker -> heap of the tasks ``workers=`` restricts to it (lazy deletion, as ``_shared``)
        self._on: dict[str, list] = {}
        #: Spec.resources -> heap of the unrestricted tasks asking that (lazy deletion, as ``_shared``)
        self._needy: dict[tuple, list] = {}
        #: runs sent so far; the last one's seq (a run's number is the count when it is sent)
        self.assigned = 0
        #: seq -> the task processing with that seq, for each run sent; a run leaves on its
        #: end (``ended``) or when taken back (``unassigned``). The task, not (key, worker):
        #: its ``worker`` is this run's while it is filed here, and no tuple is made a run
        self.runs: dict[int, Task] = {}
        #: moving average of run durations (None before the first), sizes the prefetch
        self.avg_duration: Optional[float] = None
        #: seq -> worker asked to give the run back, until it answers; the worker holds the seq
        self.stealing: dict[int, str] = {}
        #: seq -> worker that had started it when asked, until it ends; never asked again
        self.started: dict[int, str] = {}

    def __bool__(self) -> bool:
        return bool(self._shared or self._on or self._needy)

    def keys(self) -> set:
        """Keys queued (some may no longer be ready: deletion is lazy)."""
        return {key for heap in (self._shared, *self._on.values(), *self._needy.values()) for _p, _o, key in heap}

    def waiting(self, limit: int) -> int:
        """Ready tasks queued, each once, counted up to ``limit`` (adapt's look on every tick:
        bounded by the answer, not by the queue; entries no longer ready are skipped)."""
        seen: set = set()
        for heap in (self._shared, *self._on.values(), *self._needy.values()):
            for _p, _o, key in heap:
                if len(seen) >= limit:
                    return limit
                if key not in seen:
                    ts = self._task(key)
                    if ts is not None and ts.state == "ready":
                        seen.add(key)
        return len(seen)

    def task_of(self, seq: int) -> Optional[Task]:
        """The task run ``seq`` runs while the task is processing it (its ``worker`` is the
        run's), else None."""
        return self.runs.get(seq)

    def push(self, ts: Task, live: list) -> None:
        """Queue a ready task: on the queues of ``live`` (its restricted workers still
        running), or on the shared queue when it is not restricted or only preferred."""
        entry = (-ts.terms.priority, ts.order, ts.key)
        for w in live:
            heapq.heappush(self._on.setdefault(w, []), entry)
        if not live:
            need = ts.terms.resources
            heapq.heappush(self._shared if need is None else self._needy.setdefault(need, []), entry)

    def drop_worker(self, name: str) -> list:
        """The queue of a worker that is gone: the keys that were on it."""
        return [key for _p, _o, key in self._on.pop(name, ())]

    def finished(self, duration: float) -> None:
        self.avg_duration = duration if self.avg_duration is None else 0.8 * self.avg_duration + 0.2 * duration

    def assign(self) -> list:
        """Send ready tasks to open workers, up to each one's capacity."""
        out: list = []
        if not (self._shared or self._on or self._needy):   # the common case, after most events: nothing queued
            return self._steal()
        open_workers = [w for w in self._workers() if not w.paused and not w.closing]
        if not open_workers:
            return out
        per_thread = 1 + self._prefetch()
        caps = {w.name: w.nthreads * per_thread - len(w.processing) for w in open_workers}
        for ws in open_workers:
            heap = self._on.get(ws.name)
            if heap:
                out += self._assign_restricted(ws, heap, caps)
        if self._needy:
            out += self._assign_merged(open_workers, caps)
            return out + (self._steal() if not self._shared else [])
        while self._shared:
            _prio, _order, key = self._shared[0]
            ts = self._task(key)
            if ts is None or ts.state != "ready" or (ts.terms.workers and not ts.terms.loose):
                heapq.heappop(self._shared)
                continue
            ws = self._pick(ts, open_workers, caps)
            if ws is None:
                break
            heapq.heappop(self._shared)
            caps[ws.name] -= 1
            out += self._run(ts, ws)
        return out + (self._steal() if not self._shared else [])

    def _assign_restricted(self, ws: WorkerState, heap: list, caps: dict) -> list:
        """The tasks ``workers=`` restricts to ``ws``, while it has room; one whose resources
        do not fit now is set aside, not in the way of those behind it."""
        out: list = []
        aside: list = []
        while heap and caps[ws.name] > 0:
            entry = heapq.heappop(heap)
            ts = self._task(entry[2])
            if ts is not None and ts.state == "ready" and ts.terms.workers and ws.name in ts.terms.workers:
                need = ts.terms.resources
                if need is not None and not ws.fits(need):
                    aside.append(entry)
                    continue
                caps[ws.name] -= 1
                out += self._run(ts, ws)
        for entry in aside:
            heapq.heappush(heap, entry)
        return out

    def _assign_merged(self, open_workers: list, caps: dict) -> list:
        """The shared queue and the resource queues by priority, the best head first. A
        shape of request that fits no worker now is passed over until the next event
        (availability only shrinks within one): a step costs one look per shape."""
        out: list = []
        needy = self._needy
        blocked: set = set()
        while True:
            best, heap, need = (self._shared[0], self._shared, None) if self._shared else (None, None, None)
            for shape, queue in needy.items():
                if queue and shape not in blocked and (best is None or queue[0] < best):
                    best, heap, need = queue[0], queue, shape
            if heap is None:
                break
            ts = self._task(best[2])
            # Lazily deleted entries: a key released and submitted again may ask for other
            # resources than when this entry was queued (its own entry is in its shape's queue).
            if ts is None or ts.state != "ready" or (ts.terms.workers and not ts.terms.loose) \
                    or ts.terms.resources != need:
                heapq.heappop(heap)
                continue
            ws = self._pick(ts, open_workers if need is None else [w for w in open_workers if w.fits(need)], caps)
            if ws is None:
                if need is None:        # no worker has room: nothing else goes either
                    break
                blocked.add(need)
                continue
            heapq.heappop(heap)
            caps[ws.name] -= 1
            out += self._run(ts, ws)
        for shape in [shape for shape, queue in needy.items() if not queue]:
            del needy[shape]
        return out

    def _steal(self) -> list:
        """Ask workers whose queued runs outlast their threads to give some back, as many as
        threads stand idle elsewhere, newest first (the likeliest not to have started), each
        run at most once. Not a run whose inputs an idle worker lacks by more than
        ``STEAL_MAX_BYTES``: moving them could cost more than the wait."""
        workers = self._workers()
        if not any(len(w.processing) > w.nthreads for w in workers):
            return []
        thieves = [w for w in workers if not w.paused and not w.closing and len(w.processing) < w.nthreads]
        if not thieves:         # after most events while a queue streams: every thread is busy
            return []
        idle = sum(w.nthreads - len(w.processing) for w in thieves) - len(self.stealing)
        out: list = []
        for victim in sorted(workers, key=lambda w: w.nthreads - len(w.processing)):
            if idle <= 0:
                break
            asked = sum(1 for name in self.stealing.values() if name == victim.name)
            excess = len(victim.processing) - victim.nthreads - asked
            if excess <= 0:
                continue
            seqs: list = []
            for seq in reversed(victim.processing):
                if len(seqs) >= min(excess, idle):
                    break
                ts = self._task(victim.processing[seq])
                if seq not in self.stealing and seq not in self.started and ts is not None and ts.seq == seq \
                        and self._may_move(ts, thieves):
                    seqs.append(seq)
                    self.stealing[seq] = victim.name
            if seqs:
                idle -= len(seqs)
                out.append(Send(victim.name, P.Steal(tuple(seqs))))
        return out

    def take_back(self, ws: WorkerState) -> list:
        """A paused worker starts nothing new: ask back every run it has not started (what it
        had started it keeps, and finishes). Without this, a worker paused for memory would run
        on through its prefetch, up to 256 runs per thread of short tasks, and meet its limit."""
        seqs = []
        for seq, key in ws.processing.items():
            ts = self._task(key) if key is not None else None
            if ts is not None and ts.seq == seq and seq not in self.stealing and seq not in self.started:
                seqs.append(seq)
                self.stealing[seq] = ws.name
        return [Send(ws.name, P.Steal(tuple(seqs)))] if seqs else []

    def _may_move(self, ts: Task, thieves: list) -> bool:
        terms = ts.terms
        for w in thieves:
            if terms.workers and not terms.loose and w.name not in terms.workers:
                continue
            if terms.resources is not None and not w.fits(terms.resources):
                continue
            if not ts.deps or sum(self._task(d).nbytes for d in ts.deps if d not in w.has) <= STEAL_MAX_BYTES:  # type: ignore[misc]
                return True
        return False

    def ended(self, seq: int) -> None:
        """Run ``seq`` ended, or was given back."""
        self.runs.pop(seq, None)
        if self.stealing or self.started:       # on every run's end: most often both are empty
            self.stealing.pop(seq, None)
            self.started.pop(seq, None)

    def unassigned(self, seq: int) -> None:
        """Run ``seq`` no longer runs its task (taken back, or its worker died); what the
        worker answers about it, if anything, is for Forgetting."""
        self.runs.pop(seq, None)

    def kept(self, seq: int) -> None:
        """The worker had started run ``seq`` when asked for it: never ask again."""
        worker = self.stealing.pop(seq, None)
        if worker is not None:
            self.started[seq] = worker

    def worker_gone(self, name: str) -> None:
        for runs in (self.stealing, self.started):
            for seq in [seq for seq, w in runs.items() if w == name]:
                del runs[seq]

    def clear(self) -> None:
        self._shared.clear()
        self._on.clear()
        self._needy.clear()
        self.runs.clear()
        self.stealing.clear()
        self.started.clear()

    def _prefetch(self) -> int:
        """Runs a worker may hold a thread beyond the one it runs: sized by how short tasks
        are, so a map of tiny tasks travels in large batches while long tasks are not hoarded."""
        if self.avg_duration is None:
            return 2
        return max(1, min(256, int(0.01 / max(self.avg_duration, 1e-6))))

    def _pick(self, ts: Task, workers: list, caps: dict) -> Optional[WorkerState]:
        best, best_score = None, None
        for ws in workers:
            if caps[ws.name] <= 0:
                continue
            local = sum(self._task(d).nbytes for d in ts.deps if d in ws.has) if ts.deps else 0  # type: ignore[misc]
            score = (-local, len(ws.processing) / ws.nthreads, ws.name)
            if best_score is None or score < best_score:
                best, best_score = ws, score
        return best

    def _run(self, ts: Task, ws: WorkerState) -> list:
        out: list = []
        for d in ts.deps:
            if d not in ws.has:
                out += self._relay(self._task(d), ws)
        self.assigned += 1
        seq = self.assigned
        ts.seq, ts.worker = seq, ws.name
        self._to(ts, "processing", "assign")
        terms = ts.terms
        ws.sent(seq, ts.key, terms.resources)
        self.runs[seq] = ts
        fn = None
        if terms.fn_id not in ws.fns:
            ws.fns.add(terms.fn_id)
            fn = terms.fn
        out.append(Send(ws.name, P.Run(seq, ts.key, terms.fn_id, fn, ts.args, ts.deps)))
        return out
