"""The scheduler's decisions: a state machine with no I/O.

One door, as dask's worker state machine: ``Scheduler.handle(*events)`` takes events
(events.py: task submitted, worker reported, worker died, ...) and returns the instructions
for the caller to carry out (:class:`Send` a message to a worker, :class:`Resolve` a key's
futures, :class:`Deliver` a fetched value, :class:`Retire` a worker). ``HANDLERS`` is the
one table from event class to handler; everything else public is a query. Nothing here touches a process, a socket, a
clock or a thread, so it is tested with plain asserts (tests/unit/test_scheduler.py).

Task states. A task is made ``released`` and moved on in the same event; from then on
``Transitions.apply`` (records.py) is the only writer of its state, and it refuses a change
that ``records.TRANSITIONS`` does not list (the table also says what each does). The list below
is that table's pairs with why each happens, one line a
transition (tests/unit/test_scheduler_machine.py checks that the two agree)::

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
    erred      -> released     the client let go of it; Client.retry (then to waiting or ready at once)
    lost       -> released     the client let go of it

A released task is forgotten (dropped from ``tasks``) unless a dependent still links to it.
Each transition is recorded with the event that caused it in a ring of the last 16,384 of
all keys: ``story(key)`` prints a key's, and a broken invariant is reported with it.

The Scheduler takes the events and owns the tasks and workers; each role is a part of it
(composition: the Scheduler makes them, handing each what it needs by name; they talk
through public methods): ``Admission`` (the tasks' way in: submit, scatter), ``Placement``
(which ready task runs where), ``Readiness`` (a task's way to ready, or to erred with its
dependents), ``Outcomes`` (the ends of runs as workers report them), ``Deaths`` (what a
worker's death does to the tasks), ``Transfers`` (data on the move: relays between workers,
fetches for the client, replicas), ``Forgetting`` (letting go: release, cancel, and freeing
what cancelled runs left on workers), ``Roster`` (what workers could run; when a closing one
may go), ``Calls`` (``Client.run``) and ``Asking`` (the books of tasks that submit tasks).
Small results travel with their ``Finished`` message and are kept here, so relaying them,
and answering ``result()``, costs no extra round trip.

``handle`` runs placement once, after its last event, when one of them may have made a task
ready or freed a slot (``HANDLERS`` says which): a frame of worker messages (``Reported``)
or a burst of submits handed in together is placed once.
``validate()`` checks every invariant (invariants.py); the tests call it after each event.
"""
from __future__ import annotations

import itertools
from itertools import compress
from operator import attrgetter
from typing import Any, Callable, Optional

from ..wire import protocol as P, serialize
from ..config import format_bytes
from ..death import TransferError, WorkerDeath, death_event
from . import events as E
from .admission import Admission
from .asking import Asking
from .coordination import Asker, Coordination
from .calls import Calls
from .deaths import Deaths
from .forgetting import PENDING, Forgetting
from .invariants import check
from .outcomes import Outcomes
from .placement import Placement
from .readiness import FAILED, Readiness
from .roster import Roster
from .records import copy_dropped, copy_stored
from .records import (Deliver, FailAll, Resolve, Retire, Send, Spec, Task, Transitions,  # noqa: F401 - the
                      Whereabouts, WorkerState, fetches_waiting)                       # actions, for engine/dispatch
from .transfers import Transfers, gone as _gone


#: copies of one value (or of one run's arguments) that may arrive damaged before what waits for
#: it fails with TransferError: a mix-up that repeats is not mended by a fourth try
MAX_DAMAGES = 3


class Scheduler:
    # Every field is used by whichever thread brings an event, always under the cluster's lock
    # (dispatch.py); the parts below are the scheduler's own, used under the same lock.
    def __init__(self, allowed_failures: int = 3, resources: Optional[dict] = None):
        #: deaths a task may be blamed for before it fails with KilledWorker (read only: Deaths counts them)
        self.allowed_failures = allowed_failures
        #: the abstract resources a worker declares unless ``add_worker`` says otherwise
        #: (LocalCluster(resources=)); what ``unsatisfiable`` measures against with no worker
        self.resources: dict = dict(resources or {})
        #: key -> Task: every key a future, a dependent or a run still needs; only Admission adds
        #: tasks, and Forgetting drops them (``drop``) once released with no dependent linked
        self.tasks: dict[str, Task] = {}
        #: name -> WorkerState of each worker running now (closing ones too, until they die)
        self.workers: dict[str, WorkerState] = {}
        #: names of workers that died; never in ``workers`` again (names are never reused)
        self.gone: set = set()
        #: the only writer of ``Task.state`` (records.TRANSITIONS) and the story of each key
        self.transitions = Transitions()
        self._to = self.transitions.apply           # the writer itself, handed to the parts too
        #: request ids of fetches, replicates and calls, and ack ids of Puts (shared with Transfers, Calls)
        self._request = itertools.count(1)
        tasks, workers = self.tasks, self.workers
        #: data on the move (relays, fetches, replicas); looks tasks and workers up, writes no Task.state
        self.transfers = Transfers(tasks.get, workers.get, workers.values, self._request)
        #: which worker could ever run a task's resources; when a closing worker may go
        self.roster = Roster(tasks.__getitem__, workers.values, self.transfers, self.resources)
        #: ready queues and runs (seq -> (key, worker)); moves tasks ready -> processing
        self.placement = Placement(tasks.get, workers.values, self.transfers.relay, self._to)
        #: letting go: release, cancel, and the cancelled runs (seq -> key) until their worker answers
        #: the clients of tasks (get_client; the part below): futures held on workers,
        #: runs that seceded, and the function ids of what tasks submit
        self.asking = Asking()
        self.forgetting = Forgetting(tasks.get, tasks.pop, workers.get, workers.values, self.placement.unassigned,
                                     self.roster.maybe_retire, self._to, self.asking.cancelled)
        #: a task's way to ready (queued on placement) or to erred, with its pending dependents
        self.readiness = Readiness(tasks.get, workers.__contains__, self.gone.__contains__, self.placement.push,
                                   self.placement.drop_worker, self.forgetting.unassign, self._to)
        #: what a worker's death does to the tasks: copies lost, runs interrupted, dependents pulled back
        self.deaths = Deaths(tasks.get, workers.get, self.placement.task_of, self.placement.unassigned,
                             self.forgetting, self.readiness, self._to, allowed_failures)
        #: the tasks' way in: submitted, scattered, held by one more Future
        self.admission = Admission(tasks.get, tasks.__setitem__, workers.values, self.forgetting.forget,
                                   self.readiness.make_ready_or_wait, self._to)
        #: Client.run's calls not answered yet (request ids from the same counter)
        self.calls = Calls(self._request, workers.get, self.gone.__contains__)
        #: the ends of runs as workers report them (finished, failed, skipped, given back)
        self.outcomes = Outcomes(tasks.get, workers.get, self.placement, self.transfers, self.forgetting,
                                 self.readiness, self.asking, self._orphans_settled, self.roster.maybe_retire,
                                 self._to)
        #: Lock, Semaphore, Event, Queue and Variable (coordination.py): what is held, set,
        #: queued, and who waits for it
        self.coordination = Coordination(tasks.get, self._release, self.asking.hold, self.key_of)

    def handle(self, *events: Any) -> list:
        """The door: every change to the scheduler's state comes in here as events
        (events.py), in order, and goes out as instructions (Send, Resolve, FailAll,
        Deliver, Reply, Retire; an ``Opened`` for an event that opens a request). ``HANDLERS``
        says what handles each; placement runs once, after the last, when one of them
        may have made a task ready or freed a slot. The caller holds the cluster's lock."""
        if len(events) == 1:         # most calls: one event, no list to gather into
            event = events[0]
            handler, places, opens = HANDLERS[type(event)]
            if opens:
                request, out = handler(self, event)
                out.insert(0, E.Opened(request))
            else:
                out = handler(self, event)
            return out + self.placement.assign() if places else out
        out = []
        place = False
        for event in events:
            handler, places, opens = HANDLERS[type(event)]
            if opens:
                request, actions = handler(self, event)
                out.append(E.Opened(request))
                out += actions
            else:
                out += handler(self, event)
            place = place or places
        return out + self.placement.assign() if place else out

    def validate(self) -> None:
        """Raise AssertionError naming the first broken invariant, with the story of the key
        concerned (tests call it after every event)."""
        check(self)
        self.coordination.validate()

    def story(self, key: str) -> str:
        """The last transitions of ``key`` (what happened to it), for an error about it."""
        return self.transitions.story(key)

    @property
    def ready_keys(self) -> set:
        """Keys queued as ready (entries are deleted lazily: some may no longer be ready)."""
        return self.placement.keys()

    # --- queries ------------------------------------------------------------------------

    def key_of(self, seq: int) -> Optional[str]:
        ts = self.placement.task_of(seq)
        return ts.key if ts is not None else None

    def knows(self, key: str) -> bool:
        return key in self.tasks

    def spec_of(self, key: str) -> Optional[Spec]:
        ts = self.tasks.get(key)
        return ts.spec if ts is not None else None

    def run_ending(self, key: str, finished: bool) -> tuple[Optional[str], bool]:
        """What the task stream records of a run of ``key`` that just ended, read before the
        run's end is handled: (the task that submitted it, or None; whether the run counts
        its task among the tasks done, being its first finish, or failed, with no retry left)."""
        ts = self.tasks.get(key)
        if ts is None:
            return None, True
        terms = ts.terms
        return (terms.submitter if terms is not None else None), (not ts.type_name if finished else ts.retries <= 0)

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

    def backlogged(self, worker: str) -> bool:
        """Whether ``worker`` has more than twice as many runs sent as it has threads: it will
        not miss a message held back for a moment (the dispatcher's cork)."""
        ws = self.workers.get(worker)
        return ws is not None and len(ws.processing) > 2 * ws.nthreads

    def data_only_on_workers(self) -> bool:
        """Whether a worker holds data that a future or a pending task still needs and that
        the parent does not keep (a large result): letting every worker go would lose it
        (cluster.adapt keeps one). Read only; walks the data held, so asked rarely."""
        tasks = self.tasks
        return any(ts.data is None and (ts.wanted or ts.dependents)
                   for ws in self.workers.values() for ts in map(tasks.__getitem__, ws.has))

    def timeout_of(self, seq: int) -> Optional[float]:
        ts = self.placement.task_of(seq)
        return ts.terms.timeout if ts is not None and ts.terms is not None else None

    def worker_of(self, key: str) -> Optional[str]:
        """The worker ``key``'s run was sent to, while it is processing. Safe without the lock
        (two reads, each atomic): a hint, which may be stale by the time it is used."""
        ts = self.tasks.get(key)
        return ts.worker if ts is not None else None

    # --- read-only views for the cluster, the dashboard, the stall watch and the gateway.
    # Those marked "without the lock" read a copy of the task table (one C call) and fields
    # that are replaced, never changed in place: a state may be a moment old, never torn.

    def key_states(self) -> tuple[list, list]:
        """(keys, their states) of every task known, in one order. Without the lock."""
        known = list(self.tasks.values())
        return list(map(_KEY, known)), list(map(_STATE, known))

    def progress(self) -> tuple[int, int]:
        """(tasks pending, bytes of results in memory). Without the lock."""
        known = list(self.tasks.values())
        states = list(map(_STATE, known))
        return sum(map(PENDING.__contains__, states)), sum(map(_NBYTES, compress(known, map("memory".__eq__, states))))

    def has_tasks(self) -> bool:
        """Whether any task is known. Without the lock."""
        return bool(self.tasks)

    def args_of(self, key: str) -> Any:
        """The arguments ``key``'s run carries (a Payload or PlainArgs); None for scattered
        data or a key not known. Without the lock."""
        ts = self.tasks.get(key)
        return ts.args if ts is not None and ts.terms is not None else None

    def runs_sent(self) -> int:
        """How many runs were sent to workers so far: it grows while work is placed."""
        return self.placement.assigned

    def oldest_pending(self, running: Any) -> tuple[dict, Optional[tuple]]:
        """(pending state -> how many tasks, the oldest pending task not in ``running`` as
        (key, state, {input: its state, for those it waits for}, the workers it is restricted
        to or None), or None when there is none)."""
        tasks = self.tasks
        pending: dict = {}
        oldest = None
        for ts in tasks.values():
            state = ts.state
            if state not in PENDING:
                continue
            pending[state] = pending.get(state, 0) + 1
            if (state != "processing" or ts.key not in running) and (oldest is None or ts.order < oldest.order):
                oldest = ts
        if oldest is None:
            return pending, None
        terms = oldest.terms
        deps = {d: tasks[d].state if d in tasks else "unknown" for d in oldest.waiting_on}
        return pending, (oldest.key, oldest.state, deps,
                         terms.workers if terms is not None and terms.workers and not terms.loose else None)

    def open_workers(self) -> list:
        """The names of the workers that may be given work (not closing), sorted."""
        return sorted(w for w, ws in self.workers.items() if not ws.closing)

    def transitions_of(self, key: str) -> list:
        """[(start, finish, event)] of ``key`` from the ring of recent transitions, oldest first."""
        return list(self.transitions.of(key))

    def nbytes(self, keys: Optional[list] = None) -> dict[str, int]:
        """Key -> the size of its result, for the keys in memory (of ``keys``, or every one)."""
        tasks = self.tasks
        found = (tasks.get(k) for k in keys) if keys is not None else tasks.values()
        return {ts.key: ts.nbytes for ts in found if ts is not None and ts.state == "memory"}

    def dump(self) -> tuple[dict, list]:
        """Every task known, as plain data (dump_cluster_state), and the transitions kept of
        all keys, oldest first: [[key, start, finish, event]]."""
        tasks = {ts.key: {"state": ts.state, "worker": ts.worker, "who_has": sorted(ts.who_has),
                          "dependencies": list(ts.deps), "dependents": sorted(ts.dependents),
                          "waiting_on": sorted(ts.waiting_on), "nbytes": ts.nbytes, "type": ts.type_name or None,
                          "priority": ts.terms.priority if ts.terms is not None else None,
                          "retries_left": ts.retries, "suspicious": ts.suspicious, "error": ts.error,
                          "scattered": ts.terms is None}
                 for ts in self.tasks.values()}
        return tasks, [list(t) for t in self.transitions.events()]

    def whereabouts(self, key: str) -> Whereabouts:
        ts = self.tasks.get(key)
        if ts is None:
            return Whereabouts("unknown")
        live = [ws for ws in self.workers.values() if not ws.closing]
        return Whereabouts(ts.state, ts.worker if ts.state == "processing" else None,
                           ts.seq if ts.state == "processing" else 0, tuple(sorted(ts.waiting_on)),
                           len(live), sum(ws.paused for ws in live),
                           ts.terms.workers if ts.terms is not None and not ts.terms.loose else None,
                           ts.terms.resources if ts.terms is not None else None)

    # --- workers ------------------------------------------------------------------------

    def unsatisfiable(self, key: str, need: tuple) -> Optional[ValueError]:
        """The error for a task ``key`` asking ``need`` (Spec.resources) that no worker can ever
        run (measured by ``Roster.unsatisfiable``), or None when one can."""
        return self.roster.unsatisfiable(key, need)

    def _add_worker(self, name: str, nthreads: int, resources: Optional[dict] = None) -> list:
        """``resources``: what it declares (None: the scheduler's ``resources``)."""
        self.workers[name] = WorkerState(name, nthreads, self.resources if resources is None else resources)
        return []

    def _set_paused(self, name: str, paused: bool) -> list:
        ws = self.workers.get(name)
        if ws is None or ws.paused == paused:
            return []
        ws.paused = paused
        return self.placement.take_back(ws) if paused else []

    def _hand_off(self, name: str) -> list:
        """Stop giving ``name`` work; move data only it holds elsewhere; then Retire it."""
        ws = self.workers.get(name)
        if ws is None or ws.closing:
            return []
        ws.closing = True
        return self.roster.maybe_retire(ws)

    def blame(self, cause: str, running: dict, crashed_seq: Optional[int], timed_out_seq: Optional[int]) -> tuple:
        """The keys a death is blamed on (the taxonomy's rules: ``blamed_runs``), for ``death.blamed``."""
        return self.deaths.blame(cause, running, crashed_seq, timed_out_seq)

    def _worker_died(self, death: WorkerDeath, timed_out: Optional[tuple] = None) -> list:
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
        out: list = self.readiness.worker_gone(death.worker) + self._calls_died(death)
        forgotten, lost, recompute = self.deaths.lost(ws, death)
        out += forgotten + self.deaths.runs_interrupted(ws, death, timed_out, recompute)
        if self.asking.seceded or self.asking.offboard or self.asking.holds:
            out += self._holds_died(death.worker)
        out += self.deaths.pull_back(lost)
        for ts in sorted(recompute, key=lambda t: t.order):
            if ts.state == "waiting":
                out += self.readiness.make_ready_or_wait(ts)
        out += self.transfers.worker_died(death.worker)
        out += self.coordination.worker_gone(death.worker)
        out += self.coordination.log(("all", death.worker), death.time, serialize.dumps(death_event(death)))
        for other in list(self.workers.values()):
            out += self.roster.maybe_retire(other)
        return out

    # --- tasks --------------------------------------------------------------------------

    def _rebalance(self, keys: Optional[list], names: Optional[frozenset], moves: list) -> tuple[int, list]:
        """``Client.rebalance``: the data of ``keys`` (every key held on workers when None) spread
        over ``names`` (every open worker when None) so that each holds about as many bytes of it:
        each move from the fullest worker to the emptiest, largest values first, while it brings
        both nearer the mean. The moves are appended to ``moves`` as (key, from, to); this copies,
        ``drop_copies`` (once the copies are stored) lets go of the originals."""
        open_ = [ws for ws in self.workers.values() if not ws.closing and (names is None or ws.name in names)]
        found = (self.tasks.get(k) for k in keys) if keys is not None else self.tasks.values()
        held = [ts for ts in found if ts is not None and ts.state == "memory" and ts.data is None
                and len(ts.who_has) == 1 and next(iter(ts.who_has)) in {ws.name for ws in open_}]
        load = {ws.name: 0 for ws in open_}
        for ts in held:
            load[next(iter(ts.who_has))] += ts.nbytes
        mean = sum(load.values()) / max(1, len(load))
        pairs = []
        for ts in sorted(held, key=lambda t: -t.nbytes):
            src = next(iter(ts.who_has))
            dst = min(load, key=lambda w: (load[w], w))
            if load[src] - ts.nbytes >= mean - ts.nbytes / 2 and load[dst] + ts.nbytes <= mean + ts.nbytes / 2 \
                    and dst != src:
                load[src] -= ts.nbytes
                load[dst] += ts.nbytes
                moves.append((ts.key, src, dst))
                pairs.append((ts, self.workers[dst]))
        return self.transfers.copies(pairs)

    def _drop_copies(self, moves: list) -> list:
        """After ``rebalance``'s copies: each original copy let go of, where the new one is stored,
        nothing sent to its worker needs it and no transfer reads it."""
        out: list = []
        for key, src, dst in moves:
            ts, ws = self.tasks.get(key), self.workers.get(src)
            if ts is None or ws is None or dst not in ts.who_has or src not in ts.who_has:
                continue
            if self.transfers.awaits_data_from(src) or any(
                    k is not None and key in self.tasks[k].deps for k in ws.processing.values() if k in self.tasks):
                continue
            copy_dropped(ts, src, ws)
            out.append(Send(src, P.Free((key,))))
        return out

    def _stored(self, ack: int) -> list:
        """A worker acknowledged a Put: a copy that ``replicate`` waits for exists."""
        return self.transfers.stored(ack)

    def _reported(self, worker: str, msgs: list) -> list:
        """A frame of task messages from one worker, each to its handler (``REPORTS``)."""
        out: list = []
        for m in msgs:
            handler = REPORTS.get(type(m))
            if handler is None:
                raise TypeError(f"not a task message: {m!r}")
            out += handler(self, worker, m)
        return out

    # --- the ends of runs (outcomes.py) ------------------------------------------------

    # --- Client.run: a function on a worker, outside the tasks ---------------------------

    def _called(self, request: int, data: Optional[P.Payload], error: Optional[bytes]) -> list:
        """A worker answered a Call; a task's run gathers its answers into one (asking.py)."""
        out = self.calls.called(request, data, error)
        return self.asking.answering(out) if self.asking.calls else out

    def _calls_died(self, death: WorkerDeath) -> list:
        """The calls a dead worker never answered (KilledWorker); a task's run gathers its own."""
        out = self.calls.worker_died(death)
        return self.asking.answering(out, death.worker) if self.asking.calls else out

    # --- tasks that submit tasks (get_client on a worker; asking.py keeps the books) ------

    def _asked_all(self, worker: str, asks: list) -> list:
        """Requests from tasks on ``worker`` (Ask): submit, scatter, hold and drop futures,
        secede, rejoin, states; cancel, run, who_has, scheduler_info. ``Results`` waits on
        fetches: the dispatcher's (dispatch.py)."""
        out: list = []
        for ask in asks:
            out += self._asked(worker, ask)
        return out

    def _scatter_targets(self, body: P.Scatter) -> Optional[frozenset]:
        """Where a task's scatter may place its data, as the Client's may (client/transport.py):
        on the workers named, or on any when none of them runs and ``loose``."""
        if body.workers is None:
            return None
        names = frozenset(body.workers)
        if body.loose and not any(name in self.workers and not self.workers[name].closing for name in names):
            return None
        return names

    def _asked(self, worker: str, ask: P.Ask) -> list:
        body, t = ask.body, type(ask.body)
        books = self.asking
        if t is P.Submit:
            owner = self.key_of(ask.seq)
            specs = [Spec(n.key, books.fn_id(n.fn), n.fn, n.args, n.deps, n.priority, n.retries, n.timeout,
                          n.workers, n.loose, n.resources, owner) for n in body.tasks]
            out = self.admission.submit(specs, None)
            books.hold(worker, [n.key for n in body.tasks], owner)
            return out
        if t is P.Drop:
            return self._release(books.dropped(worker, body.keys))
        if t is P.Hold:
            known = [k for k in body.keys if k in self.tasks and self.tasks[k].state != "released"]
            for k in known:
                self.tasks[k].hold()
            books.hold(worker, known, self.key_of(ask.seq))
            return []
        if t is P.Scatter:
            out = self.admission.scatter(list(body.items), self._scatter_targets(body), body.broadcast)
            books.hold(worker, [k for k, _ in body.items], self.key_of(ask.seq))
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
            by = self.key_of(ask.seq)
            out = self.forgetting.cancel(list(body.keys), f"by task {by!r} on {worker} (cancel in the task)" if by
                                         else f"by a task on {worker}")
            return out + self._orphans_settled() if books.orphans else out
        if t is P.RunOn:
            return books.run_asked(worker, ask.request, body, self.key_of(ask.seq), self.workers.__contains__,
                                   self.open_workers(),
                                   lambda name, what: self.calls.call(name, body.fn, body.args, what))
        if t is P.WhoHas:
            return [Send(worker, P.Answer(ask.request, self.who_has(None if body.keys is None else list(body.keys))))]
        if t is P.Info:
            return [Send(worker, P.Answer(ask.request, books.workers_info(list(self.workers.values()))))]
        if t in P.COORDINATION:
            return self.coordination.asked(Asker(worker, ask.request, ask.seq), body)
        raise TypeError(f"not a request a task can make: {body!r}")

    # --- Lock, Semaphore, Event, Queue, Variable from the parent (coordination.py) ----------

    def _coordinate(self, body: Any) -> tuple[int, list]:
        """A coordination request from a thread of the parent: (request id, actions); the
        answer is a Reply to that request, now or later."""
        req = next(self._request)
        return req, self.coordination.asked(Asker(None, req), body)

    def _withdraw(self, request: int) -> list:
        """The parent's thread stopped waiting for ``request``: answered now if still waiting."""
        return self.coordination.withdraw(Asker(None, request))

    def _holds_died(self, worker: str) -> list:
        """The futures tasks held on a dead worker: those of a task that runs again are kept
        for its rerun (it submits the same pure keys, and finds them done or under way);
        the others are let go."""
        let_go = self.asking.worker_gone(worker, lambda owner: (ts := self.tasks.get(owner)) is not None
                                         and ts.state in PENDING)
        return self._release(let_go) if let_go else []

    def _orphans_settled(self) -> list:
        """Let go of what dead workers held for tasks that have now ended."""
        keys = self.asking.settled(lambda owner: (ts := self.tasks.get(owner)) is not None and ts.state in PENDING)
        return self._release(keys) if keys else []

    def death_notes(self, worker: str) -> list[str]:
        """What the scheduler knows of what ``worker`` was doing, for its death's message: which
        of its runs submitted which, what it was asked to send out, what its tasks held."""
        return [note for note in (self.lineage(worker), self.exporting(worker), self.coordination.held_by(worker))
                if note]

    def seceding(self) -> bool:
        """Whether a run that seceded still runs, off its worker's board. Safe without the lock
        (one dict's truth): most clusters never see one, and skip :meth:`off_board`."""
        return bool(self.asking.offboard)

    def off_board(self, worker: str) -> dict:
        """seq -> (thread ident, start) of the runs on ``worker`` that seceded and run on
        (``Asking.off_board``)."""
        return self.asking.off_board(worker)

    def load(self, worker: str) -> Optional[tuple[int, int]]:
        """(runs sent, keys held) of ``worker``; None when the scheduler does not have it."""
        ws = self.workers.get(worker)
        return None if ws is None else (len(ws.processing), len(ws.has))

    def processing_on(self, worker: str) -> tuple:
        """The keys of the runs sent to ``worker`` and not answered yet."""
        ws = self.workers.get(worker)
        return tuple(k for k in ws.processing.values() if k) if ws is not None else ()

    def died(self, worker: str) -> bool:
        """Whether the scheduler was told ``worker`` died."""
        return worker in self.gone

    def lineage(self, worker: str) -> Optional[str]:
        """Which task submitted which among the runs on ``worker``, for its death's message."""
        ws = self.workers.get(worker)
        if ws is None:
            return None
        parts = []
        for seq, key in sorted(ws.processing.items()):
            ts = self.tasks.get(key) if key is not None else None
            if ts is None or ts.terms is None:
                continue
            if ts.terms.submitter:
                parts.append(f"{key!r} was submitted by task {ts.terms.submitter!r}")
            if self.asking.seceded.get(seq) == worker:
                parts.append(f"{key!r} was waiting for the tasks it submitted (seceded)")
        if not parts:
            return None
        return "Tasks that submit tasks: " + "; ".join(parts) + "; a task that runs again finds its children " \
            "done or under way when their keys are pure."

    def exporting(self, worker: str) -> Optional[str]:
        """What ``worker`` was asked to send out of its memory and had not yet, for its death's
        message: a death during a gather is not the tasks' doing."""
        exports = self.transfers.sending(worker)
        if not exports:
            return None
        total = sum(ts.nbytes for e in exports if (ts := self.tasks.get(e.key)) is not None)
        fetched = sum(1 for e in exports if e.client_request is not None)
        targets = sorted({e.target for e in exports if e.target is not None})
        to = ([f"{fetched} to the client (gather or result())"] if fetched else []) + \
            ([f"{len(exports) - fetched} to {', '.join(map(repr, targets))}"] if targets else [])
        return (f"It was asked to send {len(exports)} value{'s' * (len(exports) > 1)} ({format_bytes(total)}) "
                f"out of its memory: {'; '.join(to)}; a value it had spilled is read back into memory to be sent, "
                f"{format_bytes(self.transfers.window)} at a time.")

    # --- data for the client ------------------------------------------------------------

    def _fetch(self, key: str) -> tuple[int, list]:
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

    def _data(self, worker: str, request: int, key: str, payload: Optional[P.Payload],
             error: Optional[bytes]) -> list:
        """A holder answered an Export: the data (or why not) for a relay or a client fetch."""
        entry, out = self.transfers.answered(request)
        if entry is None:
            return out
        holder, target, client = entry.holder, entry.target, entry.client_request
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
                    copy_stored(ts, tws)
                    out.append(self.transfers.put(key, target, payload, f"worker {holder!r}"))
                else:
                    for dkey in list(ts.dependents):
                        dts = self.tasks.get(dkey)
                        if dts is not None and dts.state == "processing" and dts.worker == target:
                            out += self.forgetting.unassign(dts)
                            out += self.readiness.fail(dts, error, "an input's relay failed")
                out += self.roster.maybe_retire(tws)
        ws = self.workers.get(holder)
        if ws is not None:
            out += self.roster.maybe_retire(ws)
        return out

    # --- a copy that broke its seal (protocol.Damaged) ---------------------------------

    def _damaged(self, worker: str, m: P.Damaged) -> list:
        """A copy on ``worker``, or copied out of it, is not what it was sealed as where it was
        pickled: localcluster's own failure, never the user's. The copy is dropped, and the
        value is got again: from another copy, or computed again from its lineage when it was
        the last (as when a worker dies); a run that could not start for it is placed again.
        After ``MAX_DAMAGES`` damaged copies of one value (or of one run's arguments), what
        waits for it fails with TransferError, naming the key, the workers and what differed."""
        ws = self.workers.get(worker)
        ts = self.tasks.get(m.key) if m.key else None
        export, asks = self.transfers.answered(m.request) if m.request else (None, [])
        run = self.outcomes.take_back(worker, m.seq) if m.seq else None
        blamed = ts if ts is not None else run          # whose count of damaged copies grows
        error = None
        if blamed is not None:
            blamed.damages += 1
            if blamed.damages > MAX_DAMAGES:
                where = (f"that reached worker {worker!r}" if not m.request
                         else f"copied out of worker {worker!r}")
                from_client = ts is None or "the client" in m.detail      # its arguments, or scattered
                error = TransferError(blamed.key, where, m.detail, blamed.damages, from_client)
        out: list = asks
        if ts is not None and ts.state == "memory":
            out += self._drop_damaged_copy(ts, worker, ws, bool(m.seq or m.request), m.detail)
            if ws is not None and not m.seq and not m.request:        # a Put that was not stored
                self.transfers.put_lost(ts.key, worker)
                out += self._needed_again_on(ts, ws, error)
        if export is not None:
            target = self.workers.get(export.target) if export.target is not None else None
            if error is None:
                out += self.transfers.ask_again(export)
            elif export.client_request is not None:
                out.append(Deliver(export.client_request, export.key, error=error))
            elif target is not None and ts is not None:       # the runs there waiting for it fail
                out += self._needed_again_on(ts, target, error)
            else:
                out += self.transfers.done(export.key, export.target, error)
        if run is not None:
            if run.state != "processing":       # failed with the input it needed (its last copy, scattered)
                pass
            elif error is not None:
                out += self.readiness.fail(run, error, "damaged: gave up")
            else:
                out += self.readiness.make_ready_or_wait(run)
        elif m.seq:                     # nobody waits for that run any more
            out += self.forgetting.orphan(worker, m.seq)
        return out + (self.roster.maybe_retire(ws) if ws is not None else [])

    def _drop_damaged_copy(self, ts: Task, worker: str, ws: Optional[WorkerState], stored: bool,
                           detail: str) -> list:
        """Forget ``worker``'s copy of ``ts`` (and have the worker drop it when it stored one);
        when it was the last, ``ts`` is made again if something needs it (as after a death)."""
        out: list = []
        copy_dropped(ts, worker, ws)
        if ws is not None and stored:
            out.append(Send(worker, P.Free((ts.key,))))
        if ts.who_has or ts.data is not None:
            return out
        if ts.terms is None:        # scattered: nothing to make it again from
            self._to(ts, "lost", "damaged: the last copy of scattered data")
            ts.error = TransferError(ts.key, f"on worker {worker!r}", f"{detail}; it was the last copy, and "
                                     f"scattered data cannot be computed again: scatter it again", 1, True)
            out.append(Resolve(ts.key, "lost", ts.error))
            for req in ts.fetchers:
                out.append(Deliver(req, ts.key, error=ts.error))
            ts.fetchers = ()
            return out + self.readiness.fail_dependents(ts, ts.error)
        if ts.wanted or self.forgetting.needed_by_dependents(ts):
            self._to(ts, "waiting", "damaged: compute the last copy again")
            return out + self.deaths.pull_back([ts]) + self.readiness.make_ready_or_wait(ts)
        self._to(ts, "released", "damaged: the last copy, nobody needs it")
        return out + self.forgetting.forget(ts)

    def _needed_again_on(self, ts: Task, ws: WorkerState, error: Optional[TransferError]) -> list:
        """A copy of ``ts`` meant for ``ws`` did not arrive whole: sent again for the runs on ``ws``
        that wait for it and the replicates that asked for it, or those fail with ``error``."""
        out: list = []
        waiting = [dts for dkey in sorted(ts.dependents) if (dts := self.tasks.get(dkey)) is not None
                   and dts.state == "processing" and dts.worker == ws.name]
        replicated = any((ts.key, ws.name) in pending for pending in self.transfers.replicas.values())
        if error is not None:
            for dts in waiting:
                out += self.forgetting.unassign(dts)
                out += self.readiness.fail(dts, error, "damaged: an input's copy, again and again")
            return out + self.transfers.done(ts.key, ws.name, error)
        if (waiting or replicated) and ts.state == "memory":
            out += self.transfers.relay(ts, ws)
        return out

    # --- forgetting (forgetting.py) ---------------------------------------------------

    def _release(self, keys: list) -> list:
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
        return kept + [Send(w, P.Free(tuple(ks))) for w, ks in frees.items()]

    def _retry_keys(self, keys: list) -> list:
        """``Client.retry``: each erred task runs again, and first the erred inputs it failed
        with (dask's meaning); its futures are told (Resolve "retrying"). Other keys stay as they are."""
        out: list = []
        for key in keys:
            out += self._retry(key, set())
        return out

    def _retry(self, key: str, seen: set) -> list:
        ts = self.tasks.get(key)
        if ts is None or key in seen:
            return []
        seen.add(key)
        if ts.state != "erred" or ts.terms is None:
            return []
        out: list = []
        for d in ts.deps:
            dts = self.tasks.get(d)
            if dts is not None and dts.state == "erred":
                out += self._retry(d, seen)
        ts.error, ts.suspicious, ts.deaths, ts.damages = None, 0, (), 0
        ts.retries = ts.terms.retries
        self._to(ts, "released", "retry")
        return out + [Resolve(key, "retrying", None)] + self.readiness.make_ready_or_wait(ts)

    def _cancel(self, keys: list, by: str = "by Client.cancel or Future.cancel in your process") -> list:
        """``by``: who cancelled them, for their futures' CancelledError."""
        out = self.forgetting.cancel(keys, by)
        return out + self._orphans_settled() if self.asking.orphans else out

    def _clear(self, error: BaseException) -> list:
        """Everything is forgotten (restart, close): every unfinished future gets ``error``."""
        out: list = [FailAll(error)] if any(ts.state in PENDING for ts in self.tasks.values()) else []
        for ts, req in fetches_waiting(self.tasks.values()):
            out.append(Deliver(req, ts.key, error=error))
        out += self.transfers.clear(error)
        out += self.calls.clear(error)
        self.tasks.clear()
        self.placement.clear()
        self.forgetting.clear()
        self.asking.clear(self.workers.get)
        out += self.coordination.clear()
        for ws in self.workers.values():
            ws.forget_all()
        return out



_KEY, _STATE, _NBYTES = attrgetter("key"), attrgetter("state"), attrgetter("nbytes")

#: A frame of task messages: each message's type -> (scheduler, worker, message) -> instructions
#: (each an unbound method of Scheduler, hence ``self``).
REPORTS: dict[type, Callable[[Scheduler, str, Any], list]] = {
    P.Finished: lambda self, w, m: self.outcomes.finished(w, m.seq, m.nbytes, m.type_name, m.data, m.duration),
    P.Failed: lambda self, w, m: self.outcomes.failed(w, m.seq, m.error),
    P.Skipped: lambda self, w, m: self.outcomes.skipped(w, m.seq),         # a cancelled run dropped unstarted
    P.Unqueued: lambda self, w, m: self.outcomes.unqueued(w, m.asked, m.taken),    # the answer to a steal
    P.Data: lambda self, w, m: self._data(w, m.request, m.key, m.data, m.error),
    P.Stored: lambda self, w, m: self._stored(m.ack),
    P.Called: lambda self, w, m: self._called(m.request, m.data, m.error),
    P.Damaged: lambda self, w, m: self._damaged(w, m),
}

#: The one table of the door: event class -> (handler, whether placement runs after it,
#: whether it opens a request, its handler returning (request id, instructions)). Each handler
#: is an unbound method of Scheduler, hence ``self``.
HANDLERS: dict[type, tuple[Callable[[Scheduler, Any], Any], bool, bool]] = {
    E.AddWorker: (lambda self, e: self._add_worker(e.name, e.nthreads, e.resources), True, False),
    E.SetPaused: (lambda self, e: self._set_paused(e.worker, e.paused), True, False),
    E.HandOff: (lambda self, e: self._hand_off(e.worker), False, False),
    E.WorkerDied: (lambda self, e: self._worker_died(e.death, e.timed_out), True, False),
    E.Reported: (lambda self, e: self._reported(e.worker, e.msgs), True, False),
    E.Asked: (lambda self, e: self._asked_all(e.worker, e.asks), True, False),
    E.Submit: (lambda self, e: self.admission.submit(e.specs, e.again), True, False),
    E.Scatter: (lambda self, e: self.admission.scatter(e.items, e.workers, e.broadcast), False, False),
    E.Hold: (lambda self, e: self.admission.acquire(e.key, e.counted), False, False),
    E.Drop: (lambda self, e: self._release(e.keys), True, False),
    E.CancelKeys: (lambda self, e: self._cancel(e.keys, e.by), True, False),
    E.Retry: (lambda self, e: self._retry_keys(e.keys), True, False),
    E.Clear: (lambda self, e: self._clear(e.error), False, False),
    E.Fetch: (lambda self, e: self._fetch(e.key), False, True),
    E.Replicate: (lambda self, e: self.transfers.replicate(e.keys, e.n), False, True),
    E.Rebalance: (lambda self, e: self._rebalance(e.keys, e.names, e.moves), False, True),
    E.DropCopies: (lambda self, e: self._drop_copies(e.moves), False, False),
    E.Call: (lambda self, e: self.calls.call(e.worker, e.fn, e.args, e.what, e.queue), False, True),
    E.Coordinate: (lambda self, e: self._coordinate(e.body), False, True),
    E.Withdraw: (lambda self, e: self._withdraw(e.request), False, False),
}
