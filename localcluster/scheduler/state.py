"""The scheduler's decisions: a state machine with no I/O.

Events come in as method calls (task submitted, run finished, worker died, ...);
each returns a list of actions for the caller to carry out (:class:`Send` a
message to a worker, :class:`Resolve` a key's futures, :class:`Deliver` a fetched
value, :class:`Retire` a worker). Nothing here touches a process, a socket, a
clock or a thread, so it is tested with plain asserts (tests/test_scheduler.py).

Task states. A task is made ``released`` and moved on in the same event; from then on
``Transitions.apply`` (records.py) is the only writer of its state, and it refuses a change
that ``records.TRANSITIONS`` does not list. The list below is that table, one line a
transition (tests/test_scheduler_machine.py checks that the two agree)::

    released   -> waiting      submitted, or needed again by a dependent: inputs not in memory yet
    released   -> ready        submitted with every input in memory
    released   -> memory       scattered
    released   -> erred        submitted with an input that failed, was lost or forgotten
    waiting    -> ready        its last input is in memory
    waiting    -> erred        an input failed; a recompute's input is gone for good
    waiting    -> released     the client let go of it (release, cancel)
    ready      -> processing   sent to a worker (placement.py)
    ready      -> waiting      an input was lost with its worker
    ready      -> erred        no worker it may run on is left; an input failed
    ready      -> released     the client let go of it
    processing -> memory       finished
    processing -> ready        given back by its worker (steal, pause); failed, retries left
    processing -> waiting      its worker died (run again, or blamed below allowed_failures);
                               an input was lost before the worker got it
    processing -> erred        failed (no retries left), timed out, KilledWorker, an input failed
    processing -> released     the client let go of it: the run is taken back (Cancel)
    memory     -> waiting      every copy died with workers and it is still needed: recompute
    memory     -> lost         scattered data whose only copy died (LostDataError)
    memory     -> released     the client let go of it, or its copies died and nothing needs it
    erred      -> released     the client let go of it
    lost       -> released     the client let go of it

A released task is forgotten (dropped from ``tasks``) unless a dependent still links to it.
Each transition is recorded with the event that caused it in a ring of the last 16,384 of
all keys: ``story(key)`` prints a key's, and a broken invariant is reported with it.

Data on the move (relays between workers, fetches for the client, replicas) is the
business of its part ``Transfers`` (transfers.py). Small results travel with their
``Finished`` message and are kept here, so relaying them, and answering ``result()``,
costs no extra round trip. Letting go of keys (release, cancel, and freeing what cancelled
runs left on workers) is the business of ``Forgetting`` (forgetting.py).

Every public event runs placement (``_assign``) once at its end; a frame of worker
messages goes through ``handle_messages``, which runs placement once for all of them.
``validate()`` checks every invariant (invariants.py); the tests call it after each event.
"""
from __future__ import annotations

import functools
import itertools
import sys
from typing import Any, Callable, Optional

from ..wire import protocol as P
from ..death import KilledWorker, LostDataError, TaskTimeoutError, WorkerDeath, blamed_runs
from .asking import Asking
from .coordination import Asker, Coordination
from .forgetting import PENDING, Forgetting
from .invariants import check
from .placement import Placement
from .records import EMPTY, Deliver, FailAll, Resolve, Retire, Send, Spec, Task, Transitions, Whereabouts, WorkerState
from .transfers import Transfers, gone as _gone

ENDED = frozenset({"memory", "erred", "lost"})               # its futures are done
FAILED = frozenset({"erred", "lost"})


def _placing(event: Callable) -> Callable:
    """A public event: placement runs once at its end (or at the end of the batch)."""
    @functools.wraps(event)
    def run(self: "Scheduler", *args: Any, **kwargs: Any) -> list:
        out = event(self, *args, **kwargs)
        # inline _assign: in a frame of worker messages, skipped once a message
        return out if self._deferring else out + self.placement.assign()
    return run



class Scheduler:
    # Every field is used by whichever thread brings an event, always under the cluster's lock
    # (dispatch.py); the parts below are the scheduler's own, used under the same lock.
    def __init__(self, allowed_failures: int = 3, resources: Optional[dict] = None):
        #: deaths a task may be blamed for before it fails with KilledWorker
        self.allowed_failures = allowed_failures
        #: the abstract resources a worker declares unless ``add_worker`` says otherwise
        #: (LocalCluster(resources=)); what ``unsatisfiable`` measures against with no worker
        self.resources: dict = dict(resources or {})
        #: key -> Task: every key a future, a dependent or a run still needs; only this class adds
        #: tasks, and Forgetting drops them (``drop``) once released with no dependent linked
        self.tasks: dict[str, Task] = {}
        #: name -> WorkerState of each worker running now (closing ones too, until they die)
        self.workers: dict[str, WorkerState] = {}
        #: names of workers that died; never in ``workers`` again (names are never reused)
        self.gone: set = set()
        #: the only writer of ``Task.state`` (records.TRANSITIONS) and the story of each key
        self.transitions = Transitions()
        self._to = self.transitions.apply           # the writer itself, handed to the parts too
        #: submission order of tasks (Task.order)
        self._order = itertools.count()
        #: request ids of fetches and replicates, and ack ids of Puts (shared with Transfers)
        self._request = itertools.count(1)
        tasks, workers = self.tasks, self.workers
        #: data on the move (relays, fetches, replicas); looks tasks and workers up, writes no Task.state
        self.transfers = Transfers(tasks.get, workers.get, workers.values, self._request)
        #: ready queues and runs (seq -> (key, worker)); moves tasks ready -> processing
        self.placement = Placement(tasks.get, workers.values, self.transfers.relay, self._to)
        #: letting go: release, cancel, and the cancelled runs (seq -> key) until their worker answers
        self.forgetting = Forgetting(tasks.get, tasks.pop, workers.get, workers.values, self.placement.unassigned,
                                     self._maybe_retire, self._to)
        #: inside handle_messages: placement waits for the end of the frame
        self._deferring = False
        #: pickled small result -> the one Payload kept for it (protocol.shared)
        self._small: dict = {}
        #: Client.run's calls not answered yet: request id -> (worker, what was called)
        self.calls: dict[int, tuple] = {}
        #: the clients of tasks (get_client; the part below): futures held on workers,
        #: runs that seceded, and the function ids of what tasks submit
        self.asking = Asking()
        #: Lock, Semaphore, Event, Queue and Variable (coordination.py): what is held, set,
        #: queued, and who waits for it
        self.coordination = Coordination(self._hold, self._let_go_held, self._hand_over)

    def validate(self) -> None:
        """Raise AssertionError naming the first broken invariant, with the story of the key
        concerned (tests call it after every event)."""
        check(self)
        tasks = self.tasks
        self.coordination.validate(lambda ts: tasks.get(ts.key) is not ts or ts.wanted > 0)

    def story(self, key: str) -> str:
        """The last transitions of ``key`` (what happened to it), for an error about it."""
        return self.transitions.story(key)

    @property
    def ready_keys(self) -> set:
        """Keys queued as ready (entries are deleted lazily: some may no longer be ready)."""
        return self.placement.keys()

    # --- queries ------------------------------------------------------------------------

    def key_of(self, seq: int) -> Optional[str]:
        run = self.placement.run_of(seq)
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
        return [self._resolution(ts)] if ts.state in ENDED else []

    def who_has(self, keys: Optional[list] = None) -> dict[str, tuple]:
        """Key -> the names of the workers holding its data (sorted; empty while it has none),
        for ``keys`` or every task known (dask's ``who_has``)."""
        tasks = self.tasks
        return {k: tuple(sorted(tasks[k].who_has)) if k in tasks else () for k in (tasks if keys is None else keys)}

    def demand(self, cap: int) -> int:
        """Task slots the work at hand could fill now, counted up to ``cap`` (cluster.adapt):
        the runs sent to workers and not answered (those prefetched behind busy threads
        too) plus the ready tasks no worker has taken. Read only."""
        runs = sum(len(ws.processing) for ws in self.workers.values())
        return cap if runs >= cap else runs + self.placement.waiting(cap - runs)

    def holding(self) -> bool:
        """Whether a worker holds data that a future or a pending task still needs and that
        the parent does not keep (a large result): letting every worker go would lose it
        (cluster.adapt keeps one). Read only; walks the data held, so asked rarely."""
        tasks = self.tasks
        return any(ts.data is None and (ts.wanted or ts.dependents)
                   for ws in self.workers.values() for ts in map(tasks.__getitem__, ws.has))

    def timeout_of(self, seq: int) -> Optional[float]:
        run = self.placement.run_of(seq)
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
                           ts.spec.workers if ts.spec is not None and not ts.spec.loose else None,
                           ts.spec.resources if ts.spec is not None else None)

    # --- workers ------------------------------------------------------------------------

    def unsatisfiable(self, key: str, need: tuple) -> Optional[ValueError]:
        """The error for a task ``key`` asking ``need`` (Spec.resources) that no worker can
        ever run, or None when one can: measured against the running workers, or with none
        running, against what each worker the cluster starts declares. For a ValueError at
        submit, where dask's task would pend forever without a word."""
        live = [ws for ws in self.workers.values() if not ws.closing]
        if any(ws.could_fit(need) for ws in live) or (not live and WorkerState("", 1, self.resources).could_fit(need)):
            return None
        if live:
            has = "the workers have: " + ", ".join(f"{ws.name} {_amounts(ws.resources)}"
                                                   for ws in sorted(live, key=lambda w: w.name))
        else:
            has = f"no worker runs now, and each worker this cluster starts has {_amounts(self.resources)}"
        return ValueError(f"task {key!r} asks for resources={_amounts(dict(need))}, which no worker can ever "
                          f"give: {has}. A worker runs a task only while the resources it declares "
                          f"(LocalCluster(resources=...)) cover those of its runs. Ask for at most what one "
                          f"worker has, or start the cluster with more.")

    @_placing
    def add_worker(self, name: str, nthreads: int, resources: Optional[dict] = None) -> list:
        """``resources``: what it declares (None: the scheduler's ``resources``)."""
        self.workers[name] = WorkerState(name, nthreads, self.resources if resources is None else resources)
        return []

    @_placing
    def set_paused(self, name: str, paused: bool) -> list:
        ws = self.workers.get(name)
        if ws is None or ws.paused == paused:
            return []
        ws.paused = paused
        return self.placement.take_back(ws) if paused else []

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
        if self.transfers.holding(ws.name):
            return []
        others = [w for w in self.workers.values() if not w.closing]
        out: list = []
        if others:
            for key in sorted(ws.has):
                ts = self.tasks[key]
                if ts.who_has == {ws.name} and ts.data is None and (ts.wanted or ts.dependents):
                    target = min(others, key=lambda w: (len(w.has), w.name))
                    out += self.transfers.relay(ts, target)
        if out or self.transfers.holding(ws.name):
            return out
        return [Retire(ws.name)]

    def blame(self, cause: str, running: dict, crashed_seq: Optional[int], timed_out_seq: Optional[int]) -> tuple:
        """The keys a death is blamed on (the taxonomy's rules: ``blamed_runs``)."""
        return tuple(k for k in (self.key_of(s) for s in sorted(blamed_runs(cause, running, crashed_seq,
                                                                              timed_out_seq))) if k)

    @_placing
    def worker_died(self, death: WorkerDeath, timed_out: Optional[tuple] = None) -> list:
        """``death.blamed`` (from ``blame``) names the runs that count towards KilledWorker;
        ``timed_out`` is (seq, elapsed) of a run past its timeout.

        Order matters: first every copy on the dead worker is forgotten and the lost keys
        are marked, and only then is any task's readiness decided, so nothing is sent to
        run before an input it needs exists again."""
        ws = self.workers.pop(death.worker, None)
        if ws is None:
            return []
        self.gone.add(death.worker)
        self.placement.worker_gone(death.worker)
        out: list = self._orphaned_restrictions(death.worker) + self._calls_died(death)
        lost = self._copies_lost(ws)
        recompute: list = []
        for ts in sorted(lost, key=lambda t: t.order):
            if ts.spec is None:
                out += self._lost_for_good(ts, death)
            elif ts.wanted or self.forgetting.needed_by_dependents(ts):
                self._to(ts, "waiting", "worker-died: recompute lost data")
                recompute.append(ts)
            else:
                self._to(ts, "released", "worker-died: lost data nobody needs")
                out += self.forgetting.forget(ts)
        out += self._runs_interrupted(ws, death, timed_out, recompute)
        if self.asking.seceded or self.asking.offboard or self.asking.holds:
            out += self._holds_died(death.worker)
        for ts in lost:
            out += self._pull_back_dependents(ts)
        for ts in sorted(recompute, key=lambda t: t.order):
            if ts.state == "waiting":
                out += self._make_ready_or_wait(ts)
        out += self.transfers.worker_died(death.worker)
        out += self.coordination.worker_gone(death.worker)
        for other in list(self.workers.values()):
            out += self._maybe_retire(other)
        return out

    def _copies_lost(self, ws: WorkerState) -> list:
        """Forget the dead worker's copies; the tasks whose last copy it held."""
        lost = []
        for key in ws.has:
            ts = self.tasks.get(key)
            if ts is None:
                continue
            ts.drop_holder(ws.name)
            if ts.state == "memory" and not ts.who_has and ts.data is None:
                lost.append(ts)
        return lost

    def _runs_interrupted(self, ws: WorkerState, death: WorkerDeath, timed_out: Optional[tuple],
                          recompute: list) -> list:
        """Runs the dead worker had: the late one fails, blamed ones count towards
        KilledWorker, the rest run again (appended to ``recompute``)."""
        out: list = []
        for seq, key in sorted(ws.processing.items()):
            self.placement.unassigned(seq)
            self.forgetting.answered(seq)
            ts = self.tasks.get(key) if key is not None else None
            if ts is None or ts.seq != seq or ts.state != "processing":
                continue
            ts.worker = None
            if timed_out and seq == timed_out[0]:
                out += self._fail(ts, TaskTimeoutError(key, ts.spec.timeout, timed_out[1], death.worker,
                                                       death.stack), "worker-died: timed out")
                continue
            if key in death.blamed:
                ts.suspicious += 1
                ts.deaths += (death,)
                if ts.suspicious > self.allowed_failures:
                    out += self._fail(ts, KilledWorker(key, death.worker, tuple(ts.deaths), self.allowed_failures,
                                                       ts.spec.submitter),
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
                self._to(dts, "waiting", "worker-died: an input lost")
                dts.wait_for(ts.key)
            elif dts.state == "processing":
                ws = self.workers.get(dts.worker)
                if ws is not None and ts.key not in ws.has:
                    out += self.forgetting.unassign(dts)
                    self._to(dts, "waiting", "worker-died: an input lost")
                    dts.wait_for(ts.key)
            elif dts.state == "waiting":
                dts.wait_for(ts.key)
        return out

    # --- tasks --------------------------------------------------------------------------

    @_placing
    def submit(self, specs: list) -> list:
        out: list = []
        for spec in specs:
            ts = self.tasks.get(spec.key)
            if ts is not None and ts.state != "released":
                ts.wanted += 1
                if ts.state in ENDED:
                    out.append(self._resolution(ts))
                continue
            if ts is not None:
                # Released but kept for its dependents, which stay linked to the new
                # run. The new spec may name other dependencies (a finished one now
                # travels as a value), so the old links go before the new are made.
                for d in set(ts.deps).difference(spec.deps):
                    dts = self.tasks.get(d)
                    if dts is not None:
                        dts.drop_dependent(spec.key)
                        if dts.state == "released":
                            out += self.forgetting.forget(dts)
            kept = ts.dependents if ts is not None else None
            ts = self.tasks[spec.key] = Task(spec.key, spec, next(self._order))
            if kept:
                ts.dependents = kept
            ts.wanted = 1
            missing = [d for d in spec.deps if d not in self.tasks] if spec.deps else None
            if missing:
                ts.error = _gone(missing[0])
                # never linked to its inputs, so it lists none: an input submitted again later
                # must not be taken for one of its inputs (it would not list it as a dependent)
                ts.deps = ()
                self._to(ts, "erred", "submit: an input is forgotten")
                out.append(self._resolution(ts))
                continue
            for d in spec.deps:
                self.tasks[d].add_dependent(spec.key)
            out += self._make_ready_or_wait(ts)
        return out

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
            self._to(ts, "memory", "scatter")
            ts.nbytes = data.nbytes
            ts.data = data if data.nbytes <= P.INLINE_RESULT or not targets else None
            for ws in (targets if broadcast or not targets else [targets[i % len(targets)]]):
                ts.add_holder(ws.name)
                ws.has.add(key)
                out.append(Send(ws.name, P.Put(key, data)))
            out.append(Resolve(key, "finished", ts.data))
        return out

    def replicate(self, keys: list, n: Optional[int]) -> tuple[int, list]:
        """Copies of each key's data on ``n`` open workers (all when None): (request id,
        actions). The request is answered by a Deliver once every copy is stored."""
        return self.transfers.replicate(keys, n)

    def stored(self, ack: int) -> list:
        """A worker acknowledged a Put: a copy that ``replicate`` waits for exists."""
        return self.transfers.stored(ack)

    def _make_ready_or_wait(self, ts: Task) -> list:
        if not ts.deps and not ts.spec.workers:      # most tasks of a big map: ready at once
            self._to(ts, "ready", "inputs in memory")
            self.placement.push(ts, ())
            return []
        out: list = []
        ts.waiting_on = {d for d in ts.deps if self.tasks[d].state != "memory"} or EMPTY
        for d in list(ts.waiting_on):
            dts = self.tasks[d]
            if dts.state in FAILED:
                return self._fail(ts, dts.error, "an input failed")
            if dts.state == "released":   # needed again: bring it back
                if dts.spec is None:       # scattered data cannot be recomputed
                    return self._fail(ts, _gone(d), "an input is forgotten")
                self._to(dts, "waiting", "needed again by a dependent")
                out += self._make_ready_or_wait(dts)
        if ts.waiting_on:
            if ts.state != "waiting":
                self._to(ts, "waiting", "inputs not in memory")
            return out
        self._to(ts, "ready", "inputs in memory")
        return out + self._push_ready(ts)

    def _push_ready(self, ts: Task) -> list:
        """Queue a ready task; one whose ``workers=`` are all gone fails, unless they were
        only a preference."""
        # A preference (loose) for a worker that does not run now is no preference: a name
        # that never ran would otherwise hold the task on a queue nobody serves.
        live = [w for w in ts.spec.workers if w not in self.gone and (not ts.spec.loose or w in self.workers)] \
            if ts.spec.workers else []
        if ts.spec.workers and not live and not ts.spec.loose:
            return self._fail(ts, _unplaceable(ts.key, ts.spec.workers), "no allowed worker left")
        self.placement.push(ts, live)
        return []

    def _orphaned_restrictions(self, name: str) -> list:
        """Ready tasks restricted to a worker that is gone: requeue those with no live worker left."""
        out: list = []
        for key in self.placement.drop_worker(name):
            ts = self.tasks.get(key)
            # entries are deleted lazily: the key may have been submitted again since, unrestricted
            if ts is not None and ts.state == "ready" and ts.spec.workers \
                    and all(w in self.gone for w in ts.spec.workers):
                out += self._push_ready(ts)
        return out

    def handle_messages(self, worker: str, msgs: list) -> list:
        """A frame of task messages from one worker (Finished, Failed, Skipped, Unqueued,
        Data, Stored, Called), with placement run once for all of them (the events skip it meanwhile)."""
        out: list = []
        self._deferring = True
        try:
            for m in msgs:
                t = type(m)
                if t is P.Finished:
                    out += self.finished(worker, m.seq, m.nbytes, m.type_name, m.data, m.duration)
                elif t is P.Failed:
                    out += self.failed(worker, m.seq, m.error)
                elif t is P.Skipped:
                    out += self.skipped(worker, m.seq)
                elif t is P.Unqueued:
                    out += self.unqueued(worker, m.asked, m.taken)
                elif t is P.Data:
                    out += self.data(worker, m.request, m.key, m.data, m.error)
                elif t is P.Stored:
                    out += self.stored(m.ack)
                elif t is P.Called:
                    out += self.called(m.request, m.data, m.error)
                else:
                    raise TypeError(f"not a task message: {m!r}")
        finally:
            self._deferring = False
        return out + self._assign()

    def _assign(self) -> list:
        return [] if self._deferring else self.placement.assign()

    @_placing
    def finished(self, worker: str, seq: int, nbytes: int, type_name: str,
                 data: Optional[P.Payload], duration: float = 0.0) -> list:
        ts = self._take_run(worker, seq)
        if ts is None:
            return self.forgetting.orphan(worker, seq)
        self.placement.finished(duration)
        ws = self.workers[worker]
        # each message brings its own copy of a name and a small value that most tasks share
        data = P.shared(data, self._small)
        self._to(ts, "memory", "finished")
        ts.nbytes, ts.type_name, ts.data = nbytes, sys.intern(type_name), data
        ts.add_holder(worker)
        ws.has.add(ts.key)
        ts.error = None
        out: list = [Resolve(ts.key, "finished", data)]
        for req in ts.fetchers:
            out += self.transfers.fetch(ts, req)
        ts.fetchers = ()
        for dkey in (sorted(ts.dependents, key=lambda k: self.tasks[k].order if k in self.tasks else 0)
                     if ts.dependents else ()):      # most tasks have none: no sort, no closure
            dts = self.tasks.get(dkey)
            if dts is not None and dts.state == "waiting":
                dts.arrived(ts.key)
                if not dts.waiting_on:
                    out += self._make_ready_or_wait(dts)
        if not ts.wanted and not self.forgetting.needed_by_dependents(ts):
            out += self.forgetting.release(ts)
        if ts.deps:                                  # most tasks of a map have none: no call
            out += self._release_inputs(ts)
        if self.asking.orphans:                      # a rerun after a death held its children
            out += self._orphans_settled()
        return out + self._maybe_retire(ws) if ws.closing else out     # most finish on an open worker

    def _release_inputs(self, ts: Task) -> list:
        """Inputs the client already let go of are freed once their last dependent is done."""
        out: list = []
        for d in ts.deps:
            dts = self.tasks.get(d)
            if (dts is not None and dts.state == "memory" and not dts.wanted
                    and not self.forgetting.needed_by_dependents(dts)):
                out += self.forgetting.release(dts)
        return out

    @_placing
    def failed(self, worker: str, seq: int, error: bytes) -> list:
        ts = self._take_run(worker, seq)
        if ts is None:
            return self.forgetting.orphan(worker, seq)
        if ts.retries > 0:
            ts.retries -= 1
            out = self._make_ready_or_wait(ts)
        else:
            out = self._fail(ts, error, "failed") + self._release_inputs(ts)
        if self.asking.orphans:
            out += self._orphans_settled()
        return out + self._maybe_retire(self.workers[worker])

    def _take_run(self, worker: str, seq: int) -> Optional[Task]:
        ws = self.workers.get(worker)
        if ws is None:
            return None
        key = ws.processing.pop(seq, None)
        if ws.claims:                   # most workers: no run holds resources, no call
            ws.release(seq)
        if self.asking.seceded or self.asking.offboard:     # most clusters: no task ever seceded, no call
            self.asking.ended(seq, ws)
        self.placement.ended(seq)
        ts = self.tasks.get(key) if key is not None else None
        if ts is None or ts.seq != seq or ts.state != "processing":
            return None
        ts.worker = None
        return ts

    @_placing
    def skipped(self, worker: str, seq: int) -> list:
        """The worker dropped a cancelled run before starting it."""
        self._take_run(worker, seq)
        return self.forgetting.orphan(worker, seq)

    @_placing
    def unqueued(self, worker: str, asked: tuple, taken: tuple) -> list:
        """The answer to a steal: the runs ``taken`` back before they started are placed again."""
        for seq in asked:
            if seq not in taken:
                self.placement.kept(seq)
        out: list = []
        for seq in taken:
            ts = self._take_run(worker, seq)
            if ts is None:              # cancelled or released meanwhile
                out += self.forgetting.orphan(worker, seq)
            else:
                self._to(ts, "ready", "unqueued: given back")
                out += self._push_ready(ts)
        ws = self.workers.get(worker)
        return out + (self._maybe_retire(ws) if ws is not None else [])

    def _fail(self, ts: Task, error: Any, why: str) -> list:
        ts.error = error
        self._to(ts, "erred", why)
        out: list = [Resolve(ts.key, "error", error)]
        for req in ts.fetchers:
            out.append(Deliver(req, ts.key, error=error))
        ts.fetchers = ()
        return out + self._fail_dependents(ts, error)

    def _fail_dependents(self, ts: Task, error: Any) -> list:
        out: list = []
        for dkey in sorted(ts.dependents):
            dts = self.tasks.get(dkey)
            if dts is None or dts.state not in PENDING:
                continue
            if dts.state == "processing":
                out += self.forgetting.unassign(dts)
            out += self._fail(dts, error, "an input failed")
        return out

    def _resolution(self, ts: Task) -> Resolve:
        if ts.state == "memory":
            return Resolve(ts.key, "finished", ts.data)
        return Resolve(ts.key, "lost" if ts.state == "lost" else "error", ts.error)

    # --- Client.run: a function on a worker, outside the tasks ---------------------------

    def call(self, worker: str, fn: bytes, args: P.Payload, what: str) -> tuple[int, list]:
        """Run a function on ``worker`` now (``Client.run``): (request id, actions). The answer
        is a Deliver: the result, the function's error, or KilledWorker if the worker dies first."""
        req = next(self._request)
        ws = self.workers.get(worker)
        if ws is None or ws.closing:
            why = "died" if worker in self.gone else "is closing" if ws is not None else "is not running"
            return req, [Deliver(req, what, error=RuntimeError(
                f"{what} could not run on {worker!r}: the worker {why}. cluster.workers lists those running."))]
        self.calls[req] = (worker, what)
        return req, [Send(worker, P.Call(req, fn, args))]

    def called(self, request: int, data: Optional[P.Payload], error: Optional[bytes]) -> list:
        """A worker answered a Call."""
        entry = self.calls.pop(request, None)
        out = [Deliver(request, entry[1], data, error)] if entry is not None else []
        return self.asking.answering(out) if self.asking.calls else out      # a task's run: its Answer

    def _calls_died(self, death: WorkerDeath) -> list:
        """The calls a dead worker never answered fail with KilledWorker, naming the death."""
        out: list = []
        for req, (worker, what) in list(self.calls.items()):
            if worker == death.worker:
                del self.calls[req]
                out.append(Deliver(req, what, error=KilledWorker(what, worker, (death,), 0)))
        return self.asking.answering(out, death.worker) if self.asking.calls else out

    # --- tasks that submit tasks (get_client on a worker; asking.py keeps the books) ------

    def asked(self, worker: str, asks: list) -> list:
        """Requests from tasks on ``worker`` (Ask): submit, scatter, hold and drop futures,
        secede, rejoin, states; cancel, run, who_has, scheduler_info. ``Results`` waits on
        fetches: the dispatcher's (dispatch.py). Placement runs once for them all."""
        out: list = []
        self._deferring = True
        try:
            for ask in asks:
                out += self._asked(worker, ask)
        finally:
            self._deferring = False
        return out + self._assign()

    def _asked(self, worker: str, ask: P.Ask) -> list:
        body, t = ask.body, type(ask.body)
        books = self.asking
        if t is P.Submit:
            owner = self.key_of(ask.seq)
            specs = [Spec(n.key, books.fn_id(n.fn), n.fn, n.args, n.deps, n.priority, n.retries, n.timeout,
                          n.workers, n.loose, n.resources, owner) for n in body.tasks]
            out = self.submit.__wrapped__(self, specs)
            books.held(worker, [n.key for n in body.tasks], owner)
            return out
        if t is P.Drop:
            return self.release_many(books.dropped(worker, body.keys))
        if t is P.Hold:
            known = [k for k in body.keys if k in self.tasks and self.tasks[k].state != "released"]
            for k in known:
                self.tasks[k].wanted += 1
            books.held(worker, known, self.key_of(ask.seq))
            return []
        if t is P.Scatter:
            out = self.scatter(list(body.items), None, body.broadcast)
            books.held(worker, [k for k, _ in body.items], self.key_of(ask.seq))
            return out
        if t is P.Secede:
            books.seceded_on(ask.seq, self.workers.get(worker), body.thread, body.started)
            # a word back: an executor reading the channel since before the secession wakes,
            # and reads from then on with an ear for the worker's own nudges (process.py)
            return [Send(worker, P.Answer(0, None))]
        if t is P.Rejoin:
            books.rejoined(ask.seq, self.workers.get(worker))
            return []
        if t is P.States:
            return [Send(worker, P.Answer(ask.request, tuple(self.whereabouts(k).state for k in body.keys)))]
        if t is P.Results:
            return []
        # --- cancel, run, who_has, scheduler_info from a task (asking.py gathers run's calls)
        if t is P.CancelKeys:
            out = self.forgetting.cancel(list(body.keys))
            return out + self._orphans_settled() if books.orphans else out
        if t is P.RunOn:
            return books.run_asked(worker, ask.request, body, self.key_of(ask.seq), self.workers.__contains__,
                                   sorted(w for w, ws in self.workers.items() if not ws.closing),
                                   lambda name, what: self.call(name, body.fn, body.args, what))
        if t is P.WhoHas:
            return [Send(worker, P.Answer(ask.request, self.who_has(None if body.keys is None else list(body.keys))))]
        if t is P.Info:
            return [Send(worker, P.Answer(ask.request, books.workers_info(list(self.workers.values()))))]
        if t in P.COORDINATION:
            return self.coordination.asked(Asker(worker, ask.request, ask.seq), body)
        raise TypeError(f"not a request a task can make: {body!r}")

    # --- Lock, Semaphore, Event, Queue, Variable from the parent (coordination.py) ----------

    def coordinate(self, body: Any) -> tuple[int, list]:
        """A coordination request from a thread of the parent: (request id, actions); the
        answer is a Reply to that request, now or later."""
        req = next(self._request)
        return req, self.coordination.asked(Asker(None, req), body)

    def withdraw(self, request: int) -> list:
        """The parent's thread stopped waiting for ``request``: answered now if still waiting."""
        return self.coordination.withdraw(Asker(None, request))

    def _hold(self, keys: tuple) -> tuple:
        """One more reference to each known key: its Task is the token (coordination.py)."""
        held = []
        for key in keys:
            ts = self.tasks.get(key)
            if ts is not None and ts.state != "released":
                ts.wanted += 1
                held.append(ts)
        return tuple(held)

    def _let_go_held(self, held: list) -> list:
        """Release the references ``_hold`` took, of tasks still known as they were (a task
        cancelled meanwhile dropped every reference; one submitted again is another)."""
        return self.release_many([ts.key for ts in held if self.tasks.get(ts.key) is ts])

    def _hand_over(self, asker: Asker, held: tuple, again: bool) -> tuple:
        """The references ``held`` (``again``: one more of each) are ``asker``'s now: a task's
        worker keeps them in the books until it drops them. Returns their keys."""
        keys = [ts.key for ts in held if self.tasks.get(ts.key) is ts]
        if again:
            for key in keys:
                self.tasks[key].wanted += 1
        if asker.worker is not None and keys:
            self.asking.held(asker.worker, keys, self.key_of(asker.seq))
        return tuple(keys)

    def _holds_died(self, worker: str) -> list:
        """The futures tasks held on a dead worker: those of a task that runs again are kept
        for its rerun (it submits the same pure keys, and finds them done or under way);
        the others are let go."""
        let_go = self.asking.worker_gone(worker, lambda owner: (ts := self.tasks.get(owner)) is not None
                                         and ts.state in PENDING)
        return self.release_many(let_go) if let_go else []

    def _orphans_settled(self) -> list:
        """Let go of what dead workers held for tasks that have now ended."""
        keys = self.asking.settled(lambda owner: (ts := self.tasks.get(owner)) is not None and ts.state in PENDING)
        return self.release_many(keys) if keys else []

    def lineage(self, worker: str) -> Optional[str]:
        """Which task submitted which among the runs on ``worker``, for its death's message."""
        ws = self.workers.get(worker)
        if ws is None:
            return None
        parts = []
        for seq, key in sorted(ws.processing.items()):
            ts = self.tasks.get(key) if key is not None else None
            if ts is None or ts.spec is None:
                continue
            if ts.spec.submitter:
                parts.append(f"{key!r} was submitted by task {ts.spec.submitter!r}")
            if self.asking.seceded.get(seq) == worker:
                parts.append(f"{key!r} was waiting for the tasks it submitted (seceded)")
        if not parts:
            return None
        return "Tasks that submit tasks: " + "; ".join(parts) + "; a task that runs again finds its children " \
            "done or under way when their keys are pure."

    # --- data for the client ------------------------------------------------------------

    def fetch(self, key: str) -> tuple[int, list]:
        """The client wants the data of ``key``: (request id, actions). The answer is a Deliver."""
        req = next(self._request)
        ts = self.tasks.get(key)
        if ts is None or ts.state == "released":
            return req, [Deliver(req, key, error=_gone(key))]
        if ts.state in FAILED:
            return req, [Deliver(req, key, error=ts.error)]
        if ts.state != "memory":
            ts.fetchers += (req,)
            return req, []
        return req, self.transfers.fetch(ts, req)

    @_placing
    def data(self, worker: str, request: int, key: str, payload: Optional[P.Payload],
             error: Optional[bytes]) -> list:
        """A holder answered an Export: the data (or why not) for a relay or a client fetch."""
        entry = self.transfers.answered(request)
        if entry is None:
            return []
        holder, target, client = entry.holder, entry.target, entry.client_request
        out: list = []
        ts = self.tasks.get(key)
        if target is None:
            out.append(Deliver(client, key, payload, error))
        else:
            tws = self.workers.get(target)
            # A relay that answers after its key was released (and maybe submitted again and
            # running) carries a copy nobody may count: it is dropped.
            current = ts is not None and ts.state == "memory"
            if payload is None or tws is None or not current:
                out += self.transfers.done(key, target, error)
            if tws is not None and current:
                if payload is not None:
                    ts.add_holder(target)
                    tws.has.add(key)
                    out.append(self.transfers.put(key, target, payload))
                else:
                    for dkey in list(ts.dependents):
                        dts = self.tasks.get(dkey)
                        if dts is not None and dts.state == "processing" and dts.worker == target:
                            out += self.forgetting.unassign(dts) + self._fail(dts, error, "an input's relay failed")
                out += self._maybe_retire(tws)
        ws = self.workers.get(holder)
        if ws is not None:
            out += self._maybe_retire(ws)
        return out

    # --- forgetting (forgetting.py) ---------------------------------------------------

    def release(self, key: str) -> list:
        """The client dropped its last future of ``key``."""
        return self.release_many([key])

    def release_many(self, keys: list) -> list:
        """``release`` for many keys (a map's futures dropped at once): placement runs once,
        not once a key, and each worker gets one Free for all its keys."""
        out: list = []
        for key in keys:
            out += self.forgetting.release_key(key)
        frees: dict[str, list] = {}
        kept = []
        for a in out:
            if type(a) is Send and type(a.msg) is P.Free:
                frees.setdefault(a.worker, []).extend(a.msg.keys)
            else:
                kept.append(a)
        if self.asking.orphans:
            kept += self._orphans_settled()
        return kept + [Send(w, P.Free(tuple(ks))) for w, ks in frees.items()] + self._assign()

    @_placing
    def cancel(self, keys: list) -> list:
        out = self.forgetting.cancel(keys)
        return out + self._orphans_settled() if self.asking.orphans else out

    def clear(self, error: BaseException) -> list:
        """Everything is forgotten (restart, close): every unfinished future gets ``error``."""
        out: list = [FailAll(error)] if any(ts.state in PENDING for ts in self.tasks.values()) else []
        for ts in self.tasks.values():
            for req in ts.fetchers:
                out.append(Deliver(req, ts.key, error=error))
        out += self.transfers.clear(error)
        out += [Deliver(req, what, error=error) for req, (_w, what) in self.calls.items()]
        self.calls.clear()
        self.tasks.clear()
        self.placement.clear()
        self.forgetting.clear()
        self.asking.clear(self.workers.get)
        out += self.coordination.clear()
        for ws in self.workers.values():
            ws.processing.clear()
            ws.release_all()
            ws.has.clear()
        return out


def _amounts(resources: dict) -> str:
    """{'GPU': 1, 'MEM': 2} as the user wrote it (no resources: '{}')."""
    return "{" + ", ".join(f"{name!r}: {amount:g}" for name, amount in sorted(resources.items())) + "}"


def _unplaceable(key: str, workers: frozenset) -> Exception:
    names = ", ".join(sorted(workers))
    return RuntimeError(f"task {key!r} may run only on {names} (workers=...), and no such worker is left: it "
                        f"died or was retired, and worker names are never reused. Submit it again with "
                        f"workers= naming a running worker (cluster.workers), or allow_other_workers=True "
                        f"to treat workers= as a preference.")
