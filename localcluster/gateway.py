"""The gateway: the cluster as its Clients and their Futures see it (the internal protocol).

``LocalCluster`` offers what a user calls; everything a Client and its Futures need
besides (hand over tasks, release and re-acquire keys, fetch data, say why a future is
late) is here, on one object the cluster makes and ``cluster.connect`` hands to
each Client. It holds its parts by name and only calls down into them:

- ``Dispatcher``: every event (submit, scatter, cancel, acquire, fetch, replicate);
- ``Supervisor``: worker names, the boards (what runs now), versions;
- ``StallWatch``: why the whole cluster is stuck, for a TimeoutError;
- ``CallbackThread``: users' done-callbacks, kept off the scheduler thread;
- ``Lifecycle``: whether the cluster takes work (``check_open``).

Threads: any thread (user threads, the garbage collector for ``release``).
"""
from __future__ import annotations

import concurrent.futures as cf
import logging
import os
import threading
import time
from typing import Any, Callable, Optional

from .scheduler import events as E, state as S
from .wire import serialize
from .worker import arguments
from .engine.callbacks import CallbackThread
from .engine.dispatch import Dispatcher, Listener
from .engine.lifecycle import Lifecycle, Phase
from .engine.loop import EventLoop
from .engine.plugins import SchedulerPlugins
from .scheduler.records import Spec
from .journal import Keeper
from .supervision.stall import Stall
from .supervision.stallwatch import StallWatch
from .supervision.supervisor import Supervisor

logger = logging.getLogger("localcluster")


class Gateway:
    def __init__(self, life: Lifecycle, lock: threading.Lock, scheduler: S.Scheduler, dispatch: Dispatcher,
                 supervisor: Supervisor, stall: StallWatch, callbacks: CallbackThread, loop: EventLoop,
                 journal: Optional[Keeper] = None, plugins: Optional[SchedulerPlugins] = None):
        self._life = life
        self._lock = lock
        self._scheduler = scheduler
        self._dispatch = dispatch
        self._supervisor = supervisor
        self._stall = stall
        self._callbacks = callbacks
        self._loop = loop
        self._owner_pid = os.getpid()          # a forked child sees another pid
        self._said_no_worker = False           #: the no-worker warning is given (submit); any thread
        self.started = time.time()             #: when the cluster was made (scheduler_info)
        self.journal = journal                 #: the cluster's journal (journal.py), or None
        self.scheduler_plugins = plugins       #: the cluster's scheduler plugins (engine/plugins.py)

    @property
    def phase(self) -> Phase:
        return self._life.phase

    def reset_no_worker_warning(self) -> None:
        """scale() was called: a new period with no worker is said again."""
        self._said_no_worker = False

    def check_worker_names(self, workers: Any, strict: bool = True) -> frozenset:
        """``workers=`` as a set of names of this cluster's workers; a clear error otherwise.
        ``strict=False`` (a mere preference: allow_other_workers) accepts names no longer running."""
        return arguments.worker_names(workers, self._running_names if strict else None)

    def _running_names(self) -> list:
        with self._lock:
            return list(self._supervisor.nannies)

    def check_resources(self, key: str, need: tuple) -> None:
        """A ValueError now for a task asking resources (Spec.resources) no worker can ever
        give (dask would leave it pending forever without a word)."""
        with self._lock:
            error = self._scheduler.unsatisfiable(key, need)
        if error is not None:
            raise error

    def check_open(self) -> None:
        """Raise if the cluster is closed or broken, or this process is a fork of its owner."""
        life = self._life
        if life.phase is Phase.RUNNING:     # every submit asks: the answer, without hashing a Phase
            return
        if life.phase is Phase.FORKED:
            raise RuntimeError(
                f"this LocalCluster belongs to process {self._owner_pid}, and this process "
                f"({os.getpid()}) is a fork of it: its scheduler thread and workers stayed in the "
                f"parent. Create a new LocalCluster in the child, or start children with the "
                f"'spawn' or 'forkserver' method of multiprocessing.")
        if Phase.CLOSING in life.passed or life.phase is Phase.CLOSED:
            raise RuntimeError("this LocalCluster is closed; create a new one")
        if life.error is not None:
            raise life.error

    def attach(self, listener: Listener) -> None:
        """``listener`` (a Client's futures table) hears how tasks end and is failed if the cluster breaks."""
        self._dispatch.attach(listener)

    def submit(self, specs: list, track: Callable[[], Any], again: Optional[dict] = None) -> Any:
        """Hand tasks (Specs) to the scheduler; ``track()`` makes their futures first, and
        fills ``again`` (events.Submit) with the keys its client held already."""
        if self._supervisor.nannies or self._supervisor.target or self._supervisor.adapting:
            self._said_no_worker = False
        elif self._life.phase is Phase.RUNNING and specs and not self._said_no_worker:
            # Legitimate (scale up later), but a silent wait is the worst way to find out.
            # Said once while no worker runs: a loop of submits must not flood the log.
            # Not while one is due (target > 0): between a death and its replacement's
            # spawn, on the next tick, no worker runs, yet nothing needs the user's hand.
            self._said_no_worker = True
            logger.warning("localcluster: %s submitted while the cluster has no worker; %s until "
                           "cluster.scale(n) starts one (said once until a worker runs)",
                           f"{len(specs)} tasks" if len(specs) > 1 else f"task {specs[0].key!r}",
                           "they wait" if len(specs) > 1 else "it waits")
        return self._dispatch.submit(specs, again, track)

    def scatter(self, items: list, track: Callable[[], Any], workers: Optional[frozenset] = None,
                broadcast: bool = False) -> Any:
        """Place ``[(key, Payload)]`` on workers (the scheduler chooses which)."""
        return self._dispatch.event(E.Scatter(items, workers, broadcast), before=track)

    def cancel(self, keys: list) -> None:
        self._dispatch.event(E.CancelKeys(keys))

    def retry(self, keys: list) -> None:
        """Run these erred tasks again (Client.retry); their futures were reopened first."""
        self._dispatch.event(E.Retry(keys))

    def release(self, key: str) -> None:
        """The last Future of ``key`` is gone (any thread, even inside the garbage collector)."""
        if self._life.open:
            self._dispatch.release(key)

    def acquire(self, key: str, make: Callable[[], tuple]) -> Any:
        """One more Future of ``key`` (one unpickled in this process), made by ``make()``
        under the lock (the Future, and whether its client held no future of the key until
        now: Client.adopt), resolved at once if the task has ended; None if the key is gone."""
        def make_if_known() -> tuple:
            if not self._scheduler.knows(key):
                return None, ()
            fut, counted = make()
            return fut, (E.Hold(key, counted),)
        return self._dispatch.drive(make=make_if_known)

    def replicate(self, keys: list, n: Optional[int], timeout: Optional[float]) -> None:
        """Copies of these keys' data on ``n`` workers; returns when they have arrived."""
        fut = self._dispatch.request(E.Replicate(keys, n))
        try:
            fut.result(timeout)
        except cf.TimeoutError:
            raise TimeoutError(f"replicate() did not finish within {timeout:g} s") from None

    def rebalance(self, keys: Optional[list], names: Optional[frozenset], timeout: Optional[float]) -> None:
        """Spread these keys' data evenly over these workers (events.Rebalance); returns once moved."""
        moves: list = []
        fut = self._dispatch.request(E.Rebalance(keys, names, moves))
        try:
            fut.result(timeout)
        except cf.TimeoutError:
            raise TimeoutError(f"rebalance() did not finish within {timeout:g} s") from None
        self._dispatch.event(E.DropCopies(moves))

    def fetch(self, keys: list) -> list[cf.Future]:
        """Futures for the data (Payloads) of ``keys``, however far away it is."""
        return [self._dispatch.request(E.Fetch(key)) for key in keys]

    def run(self, fn: bytes, args: Any, workers: Optional[frozenset], what: str,
            queue: str = "") -> dict[str, cf.Future]:
        """``Client.run``: a Future per worker (each running one, or those named) for the
        Payload of ``fn``'s result there, or its error (KilledWorker if the worker dies first).
        The calls of one ``queue`` run one at a time there, in the order made."""
        with self._lock:
            names = sorted(workers) if workers is not None else self._scheduler.open_workers()
        return {name: self._dispatch.request(E.Call(name, fn, args, f"{what} on {name!r}", queue)) for name in names}

    def actor_call(self, fn: Callable, args: tuple, key: str, worker: str, what: str) -> Any:
        """An actor's method call or attribute read: ``fn(*args)`` on ``worker``, outside the task
        slots, as an ActorFuture (KilledWorker, naming the death, once the worker has died)."""
        from .worker.actors import ActorFuture
        payload, _found = serialize.dumps_collecting((args, {}))
        # one queue an actor: its calls run in the order they were made (dask's run in the
        # order they arrive, which for calls made at once is not always the same)
        answers = self.run(serialize.pickle_function(fn), payload, frozenset([worker]), f"actor {key!r}: {what}",
                           queue=key)
        return ActorFuture(answers[worker], serialize.loads, what)

    def coordinate(self, body: Any, timeout: Optional[float], undo: Optional[Callable[[Any], Any]] = None) -> Any:
        """A Lock, Event, Queue ... request of this process's threads (coordination.py): the
        scheduler's answer; once ``timeout`` s have passed, what a timeout means for it. The
        request is withdrawn then, and its answer (now, or already on its way) is awaited.
        Interrupted (Ctrl-C), it is withdrawn too, and ``undo`` gets an answer that came anyway
        (a lease granted to nobody would block everyone)."""
        request, fut = self._dispatch.open(E.Coordinate(body))
        try:
            return fut.result(timeout)
        except cf.TimeoutError:
            self._dispatch.event(E.Withdraw(request))
            return fut.result()
        except BaseException:
            if not fut.done():
                self._dispatch.event(E.Withdraw(request))
            if undo is not None and fut.done() and fut.exception() is None:
                undo(fut.result())
            raise

    def validate(self) -> None:
        """Check the scheduler's invariants (AssertionError naming the first broken one)."""
        with self._dispatch.locked():
            self._scheduler.validate()

    def task_spec(self, key: str) -> Optional[Spec]:
        """The Spec ``key`` was submitted with, while the cluster still knows it."""
        with self._dispatch.locked():
            return self._scheduler.spec_of(key)

    def who_has(self, keys: Optional[list] = None) -> dict[str, tuple]:
        """Key -> the names of the workers holding its data (``keys``, or every key known)."""
        with self._dispatch.locked():
            return self._scheduler.who_has(keys)

    def story(self, keys: list) -> list[tuple]:
        """``Client.story``: [("scheduler", key, start, finish, event)] of these keys, from the
        scheduler's ring of recent transitions, each key's oldest first."""
        with self._dispatch.locked():
            return [("scheduler", key, old, new, event) for key in keys
                    for old, new, event in self._scheduler.transitions_of(key)]

    def nbytes(self, keys: Optional[list] = None) -> dict[str, int]:
        """Key -> the size of its result, for the keys in memory (of ``keys``, or every one)."""
        with self._dispatch.locked():
            return self._scheduler.nbytes(keys)

    def tasks_dump(self) -> tuple[dict, list]:
        """Every task the scheduler knows, as plain data (dump_cluster_state), and the
        transitions it keeps of all keys, oldest first: [(key, start, finish, event)]."""
        with self._dispatch.locked():
            return self._scheduler.dump()

    def task_state(self, key: str) -> str:
        """The scheduler's state of ``key`` (waiting, ready, processing, memory, erred, ...)."""
        with self._dispatch.locked():
            return self._scheduler.whereabouts(key).state

    def running_tasks(self) -> dict[str, str]:
        """Key -> worker, for the tasks whose function is running now (from the workers' boards)."""
        with self._lock:
            return self._supervisor.running_keys()

    def why_pending(self, key: str) -> str:
        """Why ``key``'s future is not done yet, in words (for a TimeoutError); when the whole
        cluster is stuck (every worker paused, no worker ...), why it is (stall.py)."""
        return self._why_pending(key, self._stall.diagnosis())

    def why_not_done(self, keys: list) -> str:
        """Why these futures are not done (for the TimeoutError of wait and gather): why the
        cluster is stuck if it is, else what the first of them waits for."""
        stall = self._stall.diagnosis()
        if stall is not None and stall.stuck:
            return str(stall)
        return self._why_pending(keys[0], stall) if keys else "they are not done"

    def _why_pending(self, key: str, stall: Optional[Stall]) -> str:
        with self._dispatch.locked():
            where = self._scheduler.whereabouts(key)
            started = self._supervisor.running_since(where.worker, where.seq)
        why = _why(key, where, started)
        if stall is None or not stall.stuck or where.state not in ("waiting", "ready", "processing"):
            return why
        return f"task {key!r} is queued: {stall}" if where.state == "ready" else f"{why}; {stall}"

    def retire(self, names: frozenset, timeout: float) -> None:
        """retire_workers: these workers hand their data on, then exit; returns once they are gone."""
        names = sorted(names)
        self._loop.call(lambda: self._supervisor.retire(names)).result()
        self._supervisor.wait_gone(names, timeout)

    def restart_workers(self, names: frozenset, timeout: float) -> None:
        """restart_workers: these workers exit and as many fresh ones start; returns once they are up."""
        names = sorted(names)
        self._loop.call(lambda: self._supervisor.restart_some(names)).result()
        self._supervisor.wait_gone(names, timeout)
        self._supervisor.wait_for(self._supervisor.target, timeout)

    def worker_versions(self) -> dict[str, dict]:
        return self._supervisor.versions()

    def wait_here(self, key: str, done: Callable[[], bool], watch: Callable[[Any], None],
                  deadline: Optional[float]) -> None:
        """``key`` is pending and this thread waits for it: read the reply here when its task
        runs on a worker whose channel is free to lend (Supervisor.read_for). Returns when
        ``done()``, or when the caller is to wait as usual; ``watch(bell)``: ring ``bell``
        once the key ends (FutureState.watch)."""
        self._dispatch.end_burst()
        worker = self._scheduler.worker_of(key)
        if worker is not None and self._life.error is None and not self._loop.on_loop():
            self._supervisor.read_for(worker, done, watch, deadline)

    def on_scheduler_thread(self) -> bool:
        """Whether this thread delivers results (the scheduler thread, or a thread reading for
        its future): what it runs must never wait for a result."""
        return self._loop.on_loop() or self._supervisor.reads_here()

    def run_callback(self, fn: Callable, fut: Any) -> None:
        """Run a user's done-callback on the callbacks thread, not the scheduler thread."""
        self._callbacks.run(fn, fut)


def _why(key: str, where: S.Whereabouts, started: Optional[float]) -> str:
    task = f"task {key!r}"
    if where.state == "processing" and started is not None:
        return f"{task} is still running on {where.worker} (started {time.monotonic() - started:.1f} s ago)"
    if where.state == "processing":
        return f"{task} is sent to {where.worker} and queued there behind the tasks it is running"
    if where.state == "waiting":
        shown = ", ".join(map(repr, where.waiting_for[:3])) + (", ..." if len(where.waiting_for) > 3 else "")
        count = len(where.waiting_for)
        return f"{task} is waiting for {count} {'dependency' if count == 1 else 'dependencies'} ({shown})"
    if where.state == "ready" and where.workers == 0:
        return f"{task} is queued: no worker is running (call cluster.scale(n) to start some)"
    if where.state == "ready" and where.paused == where.workers:
        return f"{task} is queued: every worker is paused because its memory is above memory_pause"
    if where.state == "ready" and where.resources is not None:
        asked = ", ".join(f"{name!r}: {amount:g}" for name, amount in where.resources)
        return (f"{task} is queued for resources={{{asked}}}: what the workers declare is claimed by the "
                f"tasks they run or hold queued")
    if where.state == "ready" and where.restricted_to is not None:
        return f"{task} is queued for workers {sorted(where.restricted_to)}, which are busy"
    if where.state == "ready":
        return f"{task} is queued: every worker thread is busy with earlier tasks"
    return f"{task} is {where.state}"
