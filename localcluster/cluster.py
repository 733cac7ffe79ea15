"""LocalCluster: the public facade, built from parts that each own one thing.

Data flow::

    user threads ──submit/scatter/fetch──► Dispatcher.event ─► Scheduler (pure, under the lock)
         ▲                                        │                       │ actions
         │ Client.resolve, outside the lock       │          Send: the worker's channel, at once
         │                                        ▼                       ▼
    scheduler thread: EventLoop.run ── select([channels, pidfds, output pipes, wake-up pipe])
         │   channel readable  -> Supervisor: Ready/Fatal; task messages -> Dispatcher
         │   pidfd readable    -> Supervisor: reap -> classify -> WorkerDeath -> Scheduler.worker_died
         │   output readable   -> OutputStream.read (the bounded log; forwarded to the same stream)
         │   wake-up pipe      -> commands (spawn, scale, restart, close), released keys
         └── Supervisor.tick: memory -> pause / terminate; timeouts; heartbeats; stop escalation

The parts, each handed its dependencies by name:

- ``EventLoop`` (loop.py): the scheduler thread's selector, wake-up pipe and commands.
- ``Dispatcher`` (dispatch.py): scheduler events in, actions carried out; owns the
  clients, the request futures and the broken state.
- ``Supervisor`` (supervisor.py): the worker processes, their ticks, deaths and respawns.
- ``Scheduler`` (scheduler.py): the pure state machine, guarded by the cluster's lock.
- ``CallbackThread`` (callbacks.py): done-callbacks kept off the scheduler thread.

``LocalCluster`` itself only resolves the configuration, builds the parts and offers the
public methods. User threads run the state machine themselves under the lock and write
to the worker's socket directly, so a submit costs no thread hop. Every process is
spawned from the scheduler thread, because Linux's parent-death signal follows the
thread that forked, and that thread lives exactly as long as the cluster.
"""
from __future__ import annotations

import atexit
import concurrent.futures as cf
import os
import shutil
import tempfile
import threading
import time
import traceback
import weakref
from typing import Any, Callable, Optional

from . import config as _config
from . import scheduler as S
from .callbacks import CallbackThread
from .config import check_int, check_seconds, format_bytes
from .death import ClusterBroken, ClusterClosed, ClusterRestarted, WorkerDeath
from .dispatch import Dispatcher
from .history import History
from .loop import EventLoop
from .machine import available_memory, make_cluster_directory, purge_stale_directories, usable_cpus
from .nanny import logger
from .records import Spec
from .stall import Stall
from .stallwatch import StallWatch
from .supervisor import Supervisor, WorkerInfo, WorkerSettings
from .watchdog import Watchdog

__all__ = ["LocalCluster", "WorkerInfo"]

_live_clusters: "weakref.WeakSet[LocalCluster]" = weakref.WeakSet()
_watchers: list = []      # callables told of each new cluster (localcluster.report)


def live_clusters() -> list:
    """The clusters of this process that are not closed."""
    return list(_live_clusters)


def watch(callback: Callable[["LocalCluster"], None]) -> Callable[[], None]:
    """Call ``callback(cluster)`` for every cluster made from now on; returns the undo."""
    _watchers.append(callback)
    return lambda: _watchers.remove(callback) if callback in _watchers else None


class LocalCluster:
    """A pool of worker processes on this machine, each watched by a nanny.

    >>> with LocalCluster(n_workers=2) as cluster, Client(cluster) as client:
    ...     client.submit(sum, [1, 2]).result()
    3
    """

    def __init__(self, n_workers: Any = ..., threads_per_worker: Any = ..., memory_limit: Any = ...,
                 allowed_failures: Any = ..., local_directory: Any = ..., forward_logs: Any = ...,
                 *, initializer: Optional[Callable] = None, initargs: tuple = (), **settings: Any):
        cfg = _config.resolve(n_workers=n_workers, threads_per_worker=threads_per_worker,
                              memory_limit=memory_limit, allowed_failures=allowed_failures,
                              local_directory=local_directory, forward_logs=forward_logs, **settings)
        if initializer is not None and not callable(initializer):
            raise TypeError(f"initializer must be callable, got {initializer!r}")
        self.config = cfg
        self.n_workers = usable_cpus() if cfg["n_workers"] is None else cfg["n_workers"]
        self.threads_per_worker = cfg["threads_per_worker"]
        limit = cfg["memory_limit"]
        if limit == "auto":
            limit = available_memory() // max(1, self.n_workers)
        elif isinstance(limit, float):      # dask's share of the memory, each worker's own
            limit = int(available_memory() * limit)
        self.memory_limit: Optional[int] = limit
        self.local_directory, self._directory_lock = _make_directory(cfg["local_directory"])
        self._status = "starting"
        self._owner_pid = os.getpid()                  # a forked child sees another pid (_after_fork)
        self._said_no_worker = False                   # the no-worker warning is given (submit)
        self.scheduler = S.Scheduler(cfg["allowed_failures"])
        self._lock = threading.Lock()                  # guards the scheduler and the nannies
        self._changed = threading.Condition(self._lock)
        self._loop = EventLoop(on_wake=lambda: self._dispatch.free_released())
        self.history = History()
        self._dispatch = Dispatcher(self._lock, self._changed, self.scheduler, self._loop, self.history)
        settings_ = WorkerSettings(self.threads_per_worker, self.memory_limit, cfg, _pickled(initializer, initargs),
                                   self.local_directory)
        self._supervisor = Supervisor(settings_, self._lock, self._changed, self.scheduler, self._dispatch,
                                      self._loop, self.history)
        self._dispatch.bind(self._supervisor)
        self._stall = StallWatch(self._lock, self.scheduler, self._supervisor, self.history, cfg, self.memory_limit)
        self._callbacks = CallbackThread()
        self._loop.start(self._run)
        self._watchdog: Optional[Watchdog] = None
        if cfg["scheduler_watchdog"]:
            self._watchdog = Watchdog(self._loop, cfg["scheduler_watchdog"], pending=lambda: bool(self.scheduler.tasks),
                                      on_stall=self._stalled)
            self._watchdog.start()
        _live_clusters.add(self)
        for callback in list(_watchers):
            callback(self)
        try:
            self.scale(self.n_workers)
        except BaseException:
            self.close()
            raise
        self._status = "running"
        self._supervisor.started()

    def _run(self) -> None:
        """The scheduler thread."""
        # Timeouts, heartbeats and stop escalation are checked at least every 50 ms even
        # when memory is sampled less often.
        interval = min(self.config["memory_sample_interval"], 0.05)
        def tick(now: float) -> None:
            # the dispatcher's chores (keys released lock-free, messages corked behind a
            # backlog), then the supervisor's (memory, timeouts, heartbeats, respawns)
            self._dispatch.free_released()
            self._dispatch.uncork(list(self._supervisor.nannies.values()))
            self._supervisor.tick(now)
            self._stall.tick(now)      # a stall_warning with no task ending: one WARNING saying why
        try:
            self._loop.run(tick, interval, self._supervisor.keep_going)
        except BaseException:  # a bug here must be loud and fail everyone at once, never hang
            self._dispatch.break_("scheduler thread", traceback.format_exc())
            self._supervisor.reap_all()

    def _stalled(self, seconds: float, stack: str) -> None:
        """On the watchdog thread: the scheduler thread has been stuck for ``seconds``."""
        limit = self.config["scheduler_watchdog"]
        self._dispatch.break_(f"scheduler thread (busy {seconds:.1f} s without returning, past "
                              f"scheduler_watchdog={limit:g} s, while tasks were pending)",
                              f"the scheduler thread's stack when it was found stuck:\n{stack}"
                              f"RuntimeError: the scheduler thread made no progress for {seconds:.1f} s")
        self._supervisor.kill_all()     # it cannot stop them itself

    # --- public -------------------------------------------------------------------------------

    @property
    def workers(self) -> dict[str, WorkerInfo]:
        return self._supervisor.snapshot()

    @property
    def deaths(self) -> list[WorkerDeath]:
        """Every worker death since start, oldest first."""
        return self._supervisor.deaths

    def check_worker_names(self, workers: Any, strict: bool = True) -> frozenset:
        """``workers=`` as a set of names of this cluster's workers; a clear error otherwise.
        ``strict=False`` (a mere preference: allow_other_workers) accepts names no longer running."""
        names = (workers,) if isinstance(workers, str) else workers
        try:
            names = frozenset(names)
        except TypeError:
            raise TypeError(f"workers={workers!r}: expected a worker name or a list of names "
                            f"(as in cluster.workers)") from None
        if not names or not all(isinstance(n, str) for n in names):
            raise TypeError(f"workers={workers!r}: expected a worker name or a non-empty list of names "
                            f"(as in cluster.workers)")
        with self._lock:
            known = set(self._supervisor.nannies)
        unknown = sorted(names - known)
        if unknown and strict:
            raise ValueError(f"workers={sorted(names)!r}: no running worker is called "
                             f"{', '.join(map(repr, unknown))}; the workers are {sorted(known)!r}")
        return names

    def scale(self, n: int, timeout: float = 60.0) -> None:
        """Grow or shrink to ``n`` workers; returns when they are up (or gone)."""
        check_int(n, "scale", "n")
        self.check_open()
        self._said_no_worker = False
        self._loop.call(lambda: self._supervisor.scale(n)).result()
        self._supervisor.wait_for(n, timeout)

    def wait_for_workers(self, n_workers: Optional[int] = None, timeout: Optional[float] = 60.0) -> None:
        """Return when at least ``n_workers`` workers (by default, as many as the cluster
        keeps) are up and ready for tasks; TimeoutError after ``timeout`` seconds."""
        check_int(n_workers, "wait_for_workers", "n_workers", none="for as many as the cluster keeps")
        check_seconds(timeout, "wait_for_workers")
        self.check_open()
        self._supervisor.wait_for(self._supervisor.target if n_workers is None else n_workers,
                                  float("inf") if timeout is None else timeout, at_least=True)

    def restart(self, timeout: float = 60.0) -> None:
        """Stop every worker, forget every task (pending futures get ClusterRestarted), and
        return when as many fresh workers are up."""
        self.check_open()

        def begin() -> None:
            error = ClusterRestarted("the cluster was restarted (client.restart()); submit the task again")
            with self._lock:
                post = self._dispatch.apply(self.scheduler.clear(error))
            self._supervisor.stop_all()
            self._dispatch.post(post)
            self._dispatch.fail_requests(ClusterRestarted("the cluster was restarted"))
            self._supervisor.scale(self._supervisor.target)     # every old one is leaving
        self._loop.call(begin).result()
        self._supervisor.wait_for(self._supervisor.target, timeout)

    def close(self, timeout: float = 10.0) -> None:
        if self._status in ("closed", "forked"):     # forked: the workers are the parent's to stop
            return
        self._status = "closing"
        self._dispatch.stop_releasing()
        if self._watchdog is not None:
            self._watchdog.stop()
        thread = self._loop.thread
        if thread is not None and thread.is_alive() and not self._loop.on_loop():
            try:
                self._loop.call(self._supervisor.begin_close).result(timeout)
            except Exception:  # pragma: no cover - the loop is gone; clean up below
                pass
            thread.join(timeout)
            if thread.is_alive():
                # Workers ignored Stop (a C call holding the GIL): kill them now. The scheduler
                # thread reaps them and returns; nothing is torn down under its feet.
                self._supervisor.kill_all()
                thread.join(30)
            if thread.is_alive():  # pragma: no cover - never seen; leave resources to the OS
                logger.error("localcluster scheduler thread did not stop; resources left to process exit")
                self._status = "closed"
                return
        self._status = "closed"
        self._finish_close(timeout)

    def _finish_close(self, timeout: float) -> None:
        if not isinstance(self._dispatch.broken, ClusterBroken):   # broken: futures already failed
            with self._lock:
                post = self._dispatch.apply(self.scheduler.clear(ClusterClosed("the cluster was closed")))
            self._dispatch.post(post)
        self._dispatch.fail_requests(ClusterClosed("the cluster was closed"))
        self._supervisor.reap_all()
        self._callbacks.close(timeout)
        self._loop.close()
        shutil.rmtree(self.local_directory, ignore_errors=True)
        os.close(self._directory_lock)          # after the removal: nobody else may purge it half-way
        _live_clusters.discard(self)

    def __enter__(self) -> "LocalCluster":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        workers, threads = len(self._supervisor.nannies), self.threads_per_worker
        return (f"<LocalCluster {self._status}: {workers} worker{'s' if workers != 1 else ''}, {threads} "
                f"thread{'s' if threads != 1 else ''} each, "
                f"memory_limit={format_bytes(self.memory_limit) if self.memory_limit else None}>")

    def _repr_html_(self) -> str:
        from .render import cluster_view
        cfg = self.config
        fractions = {k: cfg[k] for k in ("memory_target", "memory_pause", "memory_terminate")}
        title = repr(self).strip("<>")
        return cluster_view(title, self.workers.values(), fractions, self.history.memory(), self.deaths,
                            self.memory_limit)

    def validate(self) -> None:
        """Check the scheduler's invariants (AssertionError naming the first broken one)."""
        with self._lock:
            self.scheduler.validate()

    def get_logs(self, n: Optional[int] = None) -> dict[str, list]:
        return self._supervisor.logs(n)

    def dump_stacks(self, worker: Optional[str] = None, timeout: float = 2.0) -> dict[str, str]:
        """The live stacks of every thread of each worker (faulthandler, via SIGUSR1)."""
        return self._supervisor.dump_stacks(worker, timeout)

    # --- for the client and its futures ------------------------------------------------------

    def check_open(self) -> None:
        """Raise if the cluster is closed or broken, or this process is a fork of its owner."""
        if self._status == "forked":
            raise RuntimeError(
                f"this LocalCluster belongs to process {self._owner_pid}, and this process "
                f"({os.getpid()}) is a fork of it: its scheduler thread and workers stayed in the "
                f"parent. Create a new LocalCluster in the child, or start children with the "
                f"'spawn' or 'forkserver' method of multiprocessing.")
        if self._status in ("closing", "closed"):
            raise RuntimeError("this LocalCluster is closed; create a new one")
        if self._dispatch.broken is not None:
            raise self._dispatch.broken

    def attach(self, client: Any) -> None:
        """``client`` hears how tasks end (``client.resolve``) and is failed if the cluster breaks."""
        self._dispatch.attach(client)

    def submit(self, specs: list, track: Callable[[], Any]) -> Any:
        """Hand tasks (Specs) to the scheduler; ``track()`` makes their futures first."""
        if self._supervisor.nannies or self._supervisor.target:
            self._said_no_worker = False
        elif self._status == "running" and specs and not self._said_no_worker:
            # Legitimate (scale up later), but a silent wait is the worst way to find out.
            # Said once while no worker runs: a loop of submits must not flood the log.
            # Not while one is due (target > 0): between a death and its replacement's
            # spawn, on the next tick, no worker runs, yet nothing needs the user's hand.
            self._said_no_worker = True
            logger.warning("localcluster: %s submitted while the cluster has no worker; %s until "
                           "cluster.scale(n) starts one (said once until a worker runs)",
                           f"{len(specs)} tasks" if len(specs) > 1 else f"task {specs[0].key!r}",
                           "they wait" if len(specs) > 1 else "it waits")
        return self._dispatch.event(self.scheduler.submit, specs, before=track)

    def scatter(self, items: list, track: Callable[[], Any], workers: Optional[frozenset] = None,
                broadcast: bool = False) -> Any:
        """Place ``[(key, Payload)]`` on workers (the scheduler chooses which)."""
        return self._dispatch.event(self.scheduler.scatter, items, workers, broadcast, before=track)

    def cancel(self, keys: list) -> None:
        self._dispatch.event(self.scheduler.cancel, keys)

    def mark_forked(self) -> None:
        """In a child forked from the owner: inert from now on. Locks other threads held at
        the fork stay held here, so nothing may take them: every entry point checks this
        state first, and close() leaves the workers and the directory to the parent."""
        self._status = "forked"

    def release(self, key: str) -> None:
        """The last Future of ``key`` is gone (any thread, even inside the garbage collector)."""
        if self._status in ("running", "starting"):
            self._dispatch.release(key)

    def acquire(self, key: str, make: Callable[[], Any]) -> Any:
        """One more Future of ``key`` (one unpickled in this process), made by ``make()``
        under the lock and resolved at once if the task has ended; None if the key is gone."""
        made: list = []

        def make_if_known() -> None:
            if self.scheduler.knows(key):
                made.append(make())
        self._dispatch.event(lambda: self.scheduler.acquire(key) if made else [], before=make_if_known)
        return made[0] if made else None

    def replicate(self, keys: list, n: Optional[int], timeout: Optional[float]) -> None:
        """Copies of these keys' data on ``n`` workers; returns when they have arrived."""
        fut = self._dispatch.request(lambda: self.scheduler.replicate(keys, n))
        try:
            fut.result(timeout)
        except cf.TimeoutError:
            raise TimeoutError(f"replicate() did not finish within {timeout:g} s") from None

    def fetch(self, keys: list) -> list[cf.Future]:
        """Futures for the data (Payloads) of ``keys``, however far away it is."""
        return [self._dispatch.request(lambda key=key: self.scheduler.fetch(key)) for key in keys]

    def task_spec(self, key: str) -> Optional[Spec]:
        """The Spec ``key`` was submitted with, while the cluster still knows it."""
        with self._lock:
            return self.scheduler.spec_of(key)

    def task_state(self, key: str) -> str:
        """The scheduler's state of ``key`` (waiting, ready, processing, memory, erred, ...)."""
        with self._lock:
            return self.scheduler.whereabouts(key).state

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
        with self._lock:
            where = self.scheduler.whereabouts(key)
            started = self._supervisor.running_since(where.worker, where.seq)
        why = _why(key, where, started)
        if stall is None or not stall.stuck or where.state not in ("waiting", "ready", "processing"):
            return why
        return f"task {key!r} is queued: {stall}" if where.state == "ready" else f"{why}; {stall}"

    def worker_versions(self) -> dict[str, dict]:
        return self._supervisor.versions()

    def on_scheduler_thread(self) -> bool:
        return self._loop.on_loop()

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
    if where.state == "ready" and where.restricted_to is not None:
        return f"{task} is queued for workers {sorted(where.restricted_to)}, which are busy"
    if where.state == "ready":
        return f"{task} is queued: every worker thread is busy with earlier tasks"
    return f"{task} is {where.state}"


def _make_directory(parent: Optional[str]) -> tuple[str, int]:
    """A private directory for this cluster's spill files (and the descriptor of the lock
    that marks it as ours), after removing those of clusters whose owner is gone."""
    if parent:
        os.makedirs(parent, exist_ok=True)
    base = parent or tempfile.gettempdir()
    purge_stale_directories(base)
    return make_cluster_directory(base)


def _pickled(initializer: Optional[Callable], initargs: tuple) -> Optional[str]:
    if initializer is None:
        return None
    import cloudpickle
    return cloudpickle.dumps((initializer, tuple(initargs))).hex()


def _after_fork_in_child() -> None:
    for cluster in list(_live_clusters):
        cluster.mark_forked()
    _live_clusters.clear()       # so the child's atexit closes (and kills) nothing


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


@atexit.register
def _close_all() -> None:
    for cluster in list(_live_clusters):
        try:
            cluster.close(timeout=5)
        except Exception:  # pragma: no cover
            pass
