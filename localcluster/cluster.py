"""LocalCluster: what a user calls. It resolves the configuration and builds the parts,
bottom up, each handed its collaborators by name; the round trip of a task through them
is ARCHITECTURE.md.

- ``Lifecycle`` (engine/lifecycle.py): the one shutdown state, shared by every part.
- ``EventLoop`` (engine/loop.py): the scheduler thread's selector, wake-up pipe and commands.
- ``Dispatcher`` (engine/dispatch.py): scheduler events in under the lock; Send queued on
  the worker's Outlet and flushed after the lock is let go (or corked behind a backlog).
- ``Supervisor`` (supervision/supervisor.py): the worker processes, their ticks, deaths
  and respawns, through the pure ``Policy``.
- ``Scheduler`` (scheduler/state.py): the pure state machine, guarded by the cluster's lock.
- ``StallWatch``, ``CallbackThread``, ``Watchdog``: the stall warning, users' callbacks
  off the scheduler thread, the stuck-thread alarm.
- ``Gateway`` (gateway.py): what each Client holds (``connect``): the internal protocol.

The scheduler thread is ``_run``: ``EventLoop.run`` with the chores of each wake-up and
tick. Every process is spawned from it, because Linux's parent-death signal follows the
thread that forked, and that thread lives exactly as long as the cluster.
"""
from __future__ import annotations

import atexit
import errno
import os
import shutil
import tempfile
import threading
import traceback
import weakref
from typing import Any, Callable, Optional

from . import config as _config
from .scheduler import events as E, state as S
from .engine.callbacks import CallbackThread
from .engine.plugins import SchedulerPlugins, SchedulerView
from .config import check_duration, check_int, check_seconds, format_bytes
from .death import ClusterClosed, ClusterRestarted, WorkerDeath
from .engine.dispatch import Dispatcher, Listener
from .gateway import Gateway
from .engine.history import History
from .engine.lifecycle import Lifecycle, Phase
from .engine.loop import EventLoop
from .system.machine import available_memory, make_cluster_directory, purge_stale_directories, usable_cpus
from .supervision import capacity
from .supervision.nanny import logger
from .supervision.policy import Adapt
from .supervision.stallwatch import StallWatch
from .supervision.supervisor import Supervisor, WorkerInfo, WorkerSettings
from .engine.watchdog import Watchdog
from .runs import RunRecorder, tell_previous
from .journal import Journal, open_journal

__all__ = ["LocalCluster", "WorkerInfo"]

# Every cluster of this process not yet closed, with its lifecycle (a fork marks them all).
_live_clusters: "weakref.WeakKeyDictionary[LocalCluster, Lifecycle]" = weakref.WeakKeyDictionary()
_watchers: list = []      # callables told of each new cluster (localcluster.report)


def live_clusters() -> list:
    """The clusters of this process that are not closed."""
    return list(_live_clusters)


def watch(callback: Callable[["LocalCluster"], None]) -> Callable[[], None]:
    """Call ``callback(cluster)`` for every cluster made from now on; returns the undo."""
    _watchers.append(callback)
    return lambda: _watchers.remove(callback) if callback in _watchers else None


def _per_worker(limit: Any, n_workers: int) -> Optional[int]:
    """A worker's memory limit in bytes from the setting: "auto" shares the memory available
    among the workers, a float is dask's share of it (each worker's own)."""
    if limit == "auto":
        return available_memory() // max(1, n_workers)
    if isinstance(limit, float):
        return int(available_memory() * limit)
    return limit


class LocalCluster:
    """A pool of worker processes on this machine, each watched by a nanny (a thread of this
    process), with the scheduler on a thread of this process too. Every keyword not named below
    is a setting (see the Configuration page): ``LocalCluster(memory_target=0.5)``.

    Args:
        n_workers: how many workers; None: the CPUs this process may use. 0 is fine: tasks
            wait until ``scale(n)``, or start workers under ``adapt()``.
        threads_per_worker: the threads each worker runs tasks on.
        memory_limit: per worker: ``"auto"`` (the memory this process may use, shared), a
            float in (0, 1] (that share), bytes (``"2GiB"``), or None for no limit.
        allowed_failures: deaths a task may be running in before it fails with KilledWorker.
        local_directory: where the cluster's folder is made (spilled data); None: TMPDIR.
        forward_logs: workers' output on your console (True), also faulthandler's dumps
            (``"all"``), or nothing (False).
        initializer: called with ``initargs`` once in each worker process, before its first task.
        initargs: the arguments of ``initializer``.
        dashboard_address: dask's; accepted, and means nothing (there is no server:
            ``dashboard()`` in Jupyter, ``localcluster.live()`` in a terminal).
        processes: dask's; True is accepted, False is refused (every worker is a process).
        silence_logs: worker log records below this level are not handed to your logging
            (they stay in ``Client.get_worker_logs()``); False or None: all are.
        **settings: any other setting of ``localcluster.config``.

    Raises:
        ValueError: a setting it cannot take, or more workers than the machine can hold (the
            message gives the figures and the most that fit).
        WorkerStartupError: a worker could not start (with the child's stderr).

    Example:
        >>> from localcluster import Client, LocalCluster
        >>> with LocalCluster(n_workers=2) as cluster, Client(cluster) as client:
        ...     client.submit(sum, [1, 2]).result()
        3
    """

    def __init__(self, n_workers: Any = ..., threads_per_worker: Any = ..., memory_limit: Any = ...,
                 allowed_failures: Any = ..., local_directory: Any = ..., forward_logs: Any = ...,
                 *, initializer: Optional[Callable] = None, initargs: tuple = (), dashboard_address: Any = None,
                 processes: Any = True, silence_logs: Any = False, **settings: Any):
        cfg = _config.resolve(n_workers=n_workers, threads_per_worker=threads_per_worker,
                              memory_limit=memory_limit, allowed_failures=allowed_failures,
                              local_directory=local_directory, forward_logs=forward_logs, **settings)
        if initializer is not None and not callable(initializer):
            raise TypeError(f"initializer must be callable, got {initializer!r}")
        _check_processes(processes)
        cfg["silence_logs"] = _silence_level(silence_logs)     # dask's keyword; not a config.set key
        self.config = cfg
        self.n_workers = usable_cpus() if cfg["n_workers"] is None else cfg["n_workers"]
        self.threads_per_worker = cfg["threads_per_worker"]
        limit = _per_worker(cfg["memory_limit"], self.n_workers)
        self.memory_limit: Optional[int] = limit
        # before anything is made: a number of workers that cannot fit is refused with the figures
        self._refuse_beyond(f"LocalCluster(n_workers={self.n_workers})", self.n_workers, 0,
                            "auto" if cfg["memory_limit"] == "auto" else limit)
        self._keeper, (self.local_directory, self._directory_lock, removed) = _journal_and_directory(cfg)
        # Built bottom up, each part handed what it calls by name; nothing is bound later.
        self._life = life = Lifecycle()
        self.scheduler = S.Scheduler(cfg["allowed_failures"], cfg["resources"])
        self._lock = threading.Lock()                  # guards the scheduler, the nannies and the outlets
        self._changed = threading.Condition(self._lock)
        self._loop = EventLoop(life, on_wake=self._chores)
        self.history = History()
        self._dispatch = Dispatcher(self._lock, self._changed, self.scheduler, self._loop, self.history, life)
        runs = _run_recorder(self._progress, cfg["run_registry"], self._keeper)
        settings_ = WorkerSettings(self.threads_per_worker, self.memory_limit, cfg, _pickled(
            initializer, initargs, self.local_directory), self.local_directory, getattr(runs, "end_note", None))
        self._supervisor = Supervisor(settings_, self._lock, self._changed, self.scheduler, self._dispatch,
                                      self._loop, self.history, life)
        self._stall = StallWatch(self._lock, self.scheduler, self._supervisor, self.history, cfg, self.memory_limit)
        self._callbacks = CallbackThread()
        sched = self.scheduler
        view = SchedulerView(self._lock, lambda: {k: ts.state for k, ts in sched.tasks.items()},
                             lambda: sorted(sched.workers))
        self._plugins = SchedulerPlugins(self._lock, sched.transitions, lambda: sorted(sched.workers),
                                         self._callbacks, view)
        #: the journal of finished work (``journal=``), or None
        self.journal: Optional[Journal] = Journal(self._keeper) if self._keeper is not None else None
        self._gateway = _register(self, Gateway(life, self._lock, self.scheduler, self._dispatch, self._supervisor,
                                                self._stall, self._callbacks, self._loop, self._keeper, self._plugins))
        self._runs = self._record_run(runs, cfg["run_registry"], removed)
        self._loop.start(self._run)
        self._watchdog: Optional[Watchdog] = None
        if cfg["scheduler_watchdog"]:
            self._watchdog = Watchdog(self._loop, cfg["scheduler_watchdog"], pending=self.scheduler.has_tasks,
                                      on_stall=self._stalled)
            self._watchdog.start()
        _live_clusters[self] = life
        for callback in list(_watchers):
            callback(self)
        try:
            self.scale(self.n_workers)
        except BaseException:
            self.close()
            raise
        life.to(Phase.RUNNING)     # a limit too small for a new worker is a failed start from now on

    def _chores(self) -> None:
        """On every wake-up of the scheduler thread, before its commands: submits deferred
        in a burst, keys released lock-free, and workers retired by another thread's event."""
        self._dispatch.admit()
        if self._dispatch.free_released():
            self._loop.wake()             # the rest on the next turn, after the workers' messages
        self._supervisor.retire_pending()

    def _run(self) -> None:
        """The scheduler thread."""
        # Timeouts, heartbeats and stop escalation are checked at least every 50 ms even
        # when memory is sampled less often.
        interval = min(self.config["memory_sample_interval"], 0.05)
        def tick(now: float) -> None:
            # the dispatcher's chores (keys released lock-free, messages corked behind a
            # backlog), then the supervisor's (memory, timeouts, heartbeats, respawns)
            self._chores()
            self._dispatch.uncork()
            self._dispatch.trim()
            self._supervisor.tick(now)
            self._stall.tick(now)      # a stall_warning with no task ending: one WARNING saying why
            self._plugins.tick()       # scheduler plugins: what happened, told on the callbacks thread
            if self._runs is not None:
                self._runs.tick(now)       # the run's record: at most once a second
        try:
            self._loop.run(tick, interval, self._supervisor.keep_going)
        except BaseException:  # a bug here must be loud and fail everyone at once, never hang
            self._dispatch.break_("scheduler thread", traceback.format_exc())
            self._supervisor.reap_all()
        finally:
            self._dispatch.trim(everything=True)
            self._life.to(Phase.STOPPED)   # from CLOSING or BROKEN: the only ways out of the loop
            self._loop.fail_pending()     # after the move: a command handed over later fails at once

    def _record_run(self, runs: Optional[RunRecorder], registry: bool, removed: list) -> Optional[RunRecorder]:
        """This run's record ``runs`` (None: neither the registry nor a journal keeps it)
        started, after telling how the last runs ended: the journal's run, in a line of its
        own; the others in the registry's one line (the first cluster of this process); and for
        the folders of dead clusters just removed that neither told of, a line each."""
        keeper = self._keeper
        folders = {pid: _what_was_lost(held) for _path, pid, held in removed}
        told = keeper.tell_previous(folders) if keeper is not None else frozenset()
        told = tell_previous(folders, told) if registry else told
        for path, pid, held in removed:
            if pid not in told:
                logger.warning("localcluster: removed %s, the folder of a cluster whose process (pid %d) ended "
                               "without closing it (killed, or crashed): %s", path, pid, _what_was_lost(held))
        if runs is not None:
            runs.start()
        return runs

    def _progress(self) -> tuple[int, int, int]:
        """(tasks finished, tasks pending, bytes of results in memory) for the run's record, on
        the scheduler thread, without the lock: a copy of the task table, as the dashboard reads."""
        pending, held = self.scheduler.progress()
        return self.history.done, pending, held

    def _stalled(self, seconds: float, stack: str, who: str) -> None:
        """On the watchdog thread: the scheduler thread (or a thread handling what it read for
        its future: ``who``) has been stuck for ``seconds``."""
        limit = self.config["scheduler_watchdog"]
        self._dispatch.break_(f"{who} (busy {seconds:.1f} s without returning, past "
                              f"scheduler_watchdog={limit:g} s, while tasks were pending)",
                              f"the {who.rstrip(',')}'s stack when it was found stuck:\n{stack}"
                              f"RuntimeError: the {who.rstrip(',')} made no progress for {seconds:.1f} s")
        self._supervisor.kill_all()     # it cannot stop them itself

    # --- public -------------------------------------------------------------------------------

    @property
    def workers(self) -> dict[str, WorkerInfo]:
        """Each worker by name (``worker-0``, ...): its pid, status, threads, RSS, managed, unmanaged,
        spilled and reusable bytes, and its memory history (WorkerInfo)."""
        return self._supervisor.snapshot()

    @property
    def deaths(self) -> list[WorkerDeath]:
        """Every worker death since start, oldest first."""
        return self._supervisor.deaths

    @property
    def reusable(self) -> int:
        """Bytes this process keeps warm for the next large result out of a worker, used by
        no value (results you dropped): given back within ~2 s, and at close. A worker's own
        is ``workers[name].reusable``."""
        return self._dispatch.reusable()

    @property
    def status(self) -> str:
        """starting, running, closing, closed (or refused, broken, stopped, forked)."""
        return self._life.phase.value

    def insights(self, slowest: int = 10) -> Any:
        """Per worker: tasks run, seconds busy, idle, (un)pickling, moving data, its start-up
        and the time its death cut short; and the ``slowest`` slowest tasks with their arguments. ``str()``
        is a text table; in a notebook, an HTML one (views/insights.py).

        Args:
            slowest: how many of the slowest tasks to list.
        """
        from .views.insights import insights, summarize_args

        def args_of(key: str) -> str:
            return summarize_args(self.scheduler.args_of(key))
        history = self.history
        return insights(history.tasks(), history.startups(), self.deaths, self.threads_per_worker, args_of,
                        slowest=slowest, transfers=history.transfers())

    def dashboard(self, interval: float = 1.0) -> Any:
        """A live view for Jupyter: an ipywidgets widget redrawn every ``interval`` seconds by
        a thread of its own (workers, memory, what runs, deaths, progress, task stream,
        insights). Without ipywidgets, the static view (views/dashboard.py).

        Args:
            interval: seconds between redraws.
        """
        from .views.dashboard import dashboard
        return dashboard(self, interval)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> Optional[dict]:
        """In a Jupyter kernel with ipywidgets: the live dashboard, with the static HTML beside it."""
        from .views.dashboard import mimebundle
        return mimebundle(self, include, exclude)

    def scale(self, n: int, timeout: float = 60.0) -> None:
        """Grow or shrink to ``n`` workers; returns when they are up (or gone). Stops adapt().

        Args:
            n: how many workers (0 or more).
            timeout: seconds to wait for them.

        Raises:
            ValueError: ``n`` is not an int of 0 or more, or ``n`` workers cannot fit on this
                machine (memory, processes, file descriptors: the message says which).
            TimeoutError: they were not up (or gone) within ``timeout``.
            RuntimeError: the cluster is closed.
        """
        check_int(n, "scale", "n")
        self._gateway.check_open()
        self._refuse_beyond(f"scale({n})", n)
        self._gateway.reset_no_worker_warning()
        self._loop.call(lambda: self._supervisor.scale(n)).result()
        self._supervisor.wait_for(n, timeout)

    def adapt(self, minimum: int = 0, maximum: Optional[int] = None, wait_count: int = 3,
              interval: Any = None) -> None:
        """Let the work set the size, between ``minimum`` and ``maximum`` workers (None: the
        CPUs this process may use), dask's meaning: tasks waiting for a thread start workers at
        once; a worker is let go once ``wait_count`` looks, ``interval`` apart (seconds or
        "500ms"; None: the ``adapt_interval`` setting), found the work needing fewer workers,
        its data handed to the others first. Returns at once; adapt() again replaces the bounds,
        scale(n) stops adapting.

        Args:
            minimum: the fewest workers kept.
            maximum: the most workers started; None: the CPUs this process may use.
            wait_count: looks in a row that find too many workers before one is let go.
            interval: seconds between looks, or a duration such as ``"500ms"``.

        Raises:
            ValueError: a bound is not an int of 0 or more, ``minimum`` is above ``maximum``,
                ``maximum`` workers cannot fit on this machine, or ``interval`` is not a duration.
            RuntimeError: the cluster is closed.
        """
        minimum = check_int(minimum, "adapt", "minimum")
        maximum = check_int(maximum, "adapt", "maximum", none="for the CPUs this process may use")
        if maximum is None:
            maximum = max(usable_cpus(), minimum)
        if minimum > maximum:
            raise ValueError(f"adapt(minimum={minimum}, maximum={maximum}): minimum is above maximum; "
                             f"give a minimum no larger than the maximum")
        wait_count = check_int(wait_count, "adapt", "wait_count", lo=1)
        every = self.config["adapt_interval"] if interval is None else check_duration(interval, "adapt", "interval")
        self._gateway.check_open()
        self._refuse_beyond(f"adapt(maximum={maximum})", maximum)
        self._gateway.reset_no_worker_warning()
        self._loop.call(lambda: self._supervisor.adapt(Adapt(minimum, maximum, wait_count * every))).result()

    def _refuse_beyond(self, call: str, total: int, running: Optional[int] = None, limit: Any = ...) -> None:
        """ValueError if ``total`` workers (``running`` of them up now; None: those the cluster
        has) cannot fit on this machine: memory, pids, file descriptors (supervision/capacity.py)."""
        if running is None:
            running = len(self._supervisor.nannies)
        why = capacity.refusal(call, total - running, total, self.threads_per_worker,
                               self.memory_limit if limit is ... else limit, self.config)
        if why:
            raise ValueError(why)

    def wait_for_workers(self, n_workers: Optional[int] = None, timeout: Optional[float] = 60.0) -> None:
        """Return when at least ``n_workers`` workers (by default, as many as the cluster
        keeps) are up and ready for tasks.

        Args:
            n_workers: how many; None: as many as the cluster keeps.
            timeout: seconds (None: no limit).

        Raises:
            TimeoutError: fewer were up after ``timeout`` seconds.
            ValueError: ``n_workers`` or ``timeout`` is not a number of the right kind.
            RuntimeError: the cluster is closed.
        """
        check_int(n_workers, "wait_for_workers", "n_workers", none="for as many as the cluster keeps")
        check_seconds(timeout, "wait_for_workers")
        self._gateway.check_open()
        self._supervisor.wait_for(self._supervisor.target if n_workers is None else n_workers,
                                  float("inf") if timeout is None else timeout, at_least=True)

    def restart(self, timeout: float = 60.0) -> None:
        """Stop every worker, forget every task (pending futures get ClusterRestarted), and
        return when as many fresh workers are up.

        Args:
            timeout: seconds to wait for the fresh workers.

        Raises:
            TimeoutError: the fresh workers were not up within ``timeout``.
            RuntimeError: the cluster is closed.
        """
        self._gateway.check_open()

        def begin() -> None:
            error = ClusterRestarted("the cluster was restarted (client.restart()); submit the task again")
            # the workers are told to stop first: nothing is placed on them once the tasks are gone
            self._supervisor.stop_all()
            self._dispatch.drive((E.Clear(error),))
            self._dispatch.fail_requests(ClusterRestarted("the cluster was restarted"))
            self._supervisor.refill()     # every old one is leaving; adapting, if on, goes on
        self._loop.call(begin).result()
        self._supervisor.wait_for(self._supervisor.target, timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Stop every worker and the scheduler, and remove the cluster's folder; pending futures fail
        with ClusterClosed. Waits up to ``timeout`` seconds for the workers to exit, then kills
        them. Closing twice is harmless; ``with LocalCluster() as cluster:`` closes it at the end.

        Args:
            timeout: seconds the workers get to exit before they are killed.
        """
        life = self._life
        if life.phase in (Phase.CLOSED, Phase.FORKED):     # forked: the workers are the parent's to stop
            return
        life.to(Phase.CLOSING)       # not from STOPPED: the scheduler thread ended after a break
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
                life.to(Phase.CLOSED)
                return
        self._finish_close(timeout)

    def _finish_close(self, timeout: float) -> None:
        """After the scheduler thread has ended: fail what is pending, release the rest."""
        if not self._life.broken:                 # broken: the futures failed already
            self._dispatch.drive((E.Clear(ClusterClosed("the cluster was closed")),))
        self._dispatch.fail_requests(ClusterClosed("the cluster was closed"))
        self._supervisor.reap_all()
        if self._plugins:           # the last transitions told, then each plugin's close(), in that order
            self._plugins.tick()
            self._callbacks.run(lambda _: self._plugins.close(), None)
        self._callbacks.close(timeout)
        self._loop.close()
        shutil.rmtree(self.local_directory, ignore_errors=True)
        if self._runs is not None:
            self._runs.closed()
        if self._keeper is not None:
            self._keeper.close()
        os.close(self._directory_lock)          # after the removal: nobody else may purge it half-way
        _live_clusters.pop(self, None)
        self._life.to(Phase.CLOSED)

    def __enter__(self) -> "LocalCluster":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        workers, threads = len(self._supervisor.nannies), self.threads_per_worker
        return (f"<LocalCluster {self._life.phase.value}: {workers} worker{'s' if workers != 1 else ''}, {threads} "
                f"thread{'s' if threads != 1 else ''} each, "
                f"memory_limit={format_bytes(self.memory_limit) if self.memory_limit else None}>")

    def _repr_html_(self) -> str:
        from .views.render import cluster_view
        cfg = self.config
        fractions = {k: cfg[k] for k in ("memory_target", "memory_pause", "memory_terminate")}
        title = repr(self).strip("<>")
        return cluster_view(title, self.workers.values(), fractions, self.history.memory(), self.deaths,
                            self.memory_limit)

    def get_logs(self, n: Optional[int] = None) -> dict[str, list]:
        """The last ``n`` (default: all kept, ``log_lines``) lines of output and log records of each
        worker, by name, dead workers included.

        Args:
            n: how many lines of each worker; None: all kept.

        Returns:
            ``{worker name: [line, ...]}``, oldest line first.
        """
        return self._supervisor.logs(n)

    def dump_stacks(self, worker: Optional[str] = None, timeout: float = 2.0) -> dict[str, str]:
        """The live stacks of every thread of each worker, written by faulthandler on a thread
        of the worker's own while it holds the GIL (so each is whole, and costs the worker
        nothing but the pause).

        Args:
            worker: one worker's name; None: every worker.
            timeout: seconds to wait for the stacks; a worker that has not answered by then is
                left out (one whose task holds the GIL in C code the whole time: its hang is
                diagnosed by the stacks dumped before it is killed).

        Returns:
            ``{worker name: text}``, each thread labelled with the task it runs; a worker not
            yet ready, or not named so, is left out.
        """
        return self._supervisor.dump_stacks(worker, timeout)



# Each cluster's gateway: what its Clients hold, found here rather than on the LocalCluster a
# user holds, which carries dask's names and the documented extras only. A weak reference both
# ways: the gateway reaches back to its cluster, and a value held strongly by a
# WeakKeyDictionary keeps its key alive (every cluster would outlive its user's last reference).
_gateways: "weakref.WeakKeyDictionary[LocalCluster, weakref.ref[Gateway]]" = weakref.WeakKeyDictionary()


def _register(cluster: LocalCluster, gateway: Gateway) -> Gateway:
    _gateways[cluster] = weakref.ref(gateway)
    return gateway


def _gateway_of(cluster: LocalCluster) -> Gateway:
    gateway = _gateways[cluster]()
    assert gateway is not None, "a live cluster holds its gateway"
    return gateway


def connect(cluster: LocalCluster, listener: Optional[Listener] = None) -> Gateway:
    """The cluster's internal protocol (gateway.py) for a Client, with ``listener`` (its
    futures table) told how its tasks end."""
    gateway = _gateway_of(cluster)
    if listener is not None:
        gateway.attach(listener)
    return gateway


def validate(cluster: LocalCluster) -> None:
    """Check the cluster's scheduler's invariants (AssertionError naming the first broken one)."""
    _gateway_of(cluster).validate()


def _check_processes(processes: Any) -> None:
    """dask's ``processes``: True (or None) is what localcluster always does."""
    if processes is None or processes is True:
        return
    if processes is False:
        raise ValueError("LocalCluster(processes=False): localcluster runs every worker in a process of its own, "
                         "never as threads of yours: that is how it stops a task that hangs or leaks and tells why a "
                         "worker died. Leave processes out (or True); for tasks on threads of this process, use "
                         "concurrent.futures.ThreadPoolExecutor or dask's scheduler=\"threads\".")
    raise ValueError(f"LocalCluster(processes={processes!r}): expected True (dask's meaning; False is not "
                     f"supported: every worker is a process)")


def _silence_level(value: Any) -> int:
    """dask's ``silence_logs``: a logging level (``logging.WARNING``, "warning", 30), below which
    the workers' log records are not handed to the ``localcluster.worker`` logger; False or
    None: every record is (0); True: WARNING, dask's default."""
    import logging
    if value is None or value is False:
        return 0
    if value is True:
        return logging.WARNING
    if isinstance(value, str) and isinstance(logging.getLevelName(value.strip().upper()), int):
        return logging.getLevelName(value.strip().upper())
    if isinstance(value, int) and value >= 0:
        return value
    raise ValueError(f"LocalCluster(silence_logs={value!r}): expected a logging level (logging.WARNING, "
                     f"'warning', 30), or False or None to hand every worker log record to your logging")


def _make_directory(parent: Optional[str]) -> tuple[str, int, list]:
    """A private directory for this cluster's spill files (and the descriptor of the lock
    that marks it as ours), after removing those of clusters whose owner is gone: (path,
    descriptor, [(removed path, its pid, what it held)])."""
    base = parent or tempfile.gettempdir()
    try:
        if parent:
            os.makedirs(parent, exist_ok=True)
        removed = purge_stale_directories(base)
        made = make_cluster_directory(base)
    except OSError as e:
        raise _unusable_directory(e, parent, base) from None
    return (*made, removed)


def _run_recorder(progress: Callable[[], tuple], registry: bool, keeper: Any) -> Optional[RunRecorder]:
    """This run's record, not written yet (None: neither the registry nor a journal keeps it)."""
    if not registry and keeper is None:
        return None
    return RunRecorder(progress, registry, keeper.write_run if keeper is not None else None,
                       keeper.path if keeper is not None else None)


def _journal_and_directory(cfg: dict) -> tuple:
    """(the journal's Keeper or None, ``_make_directory``'s answer): the journal first, so that
    a journal= that is refused leaves no folder behind."""
    keeper = open_journal(cfg["journal"], os.urandom(8).hex()) if cfg["journal"] else None
    try:
        return keeper, _make_directory(cfg["local_directory"])
    except BaseException:
        if keeper is not None:
            keeper.close()
        raise


def _what_was_lost(held: dict) -> str:
    """In words, what a removed cluster folder held (``machine.contents``)."""
    spilled = {name: figures for name, figures in held.items()
               if name not in ("initializer.pkl", "setup.pkl", "uploads")}     # not results: the user's own
    files, size = sum(f for f, _ in spilled.values()), sum(b for _, b in spilled.values())
    if not files:
        return "it held no spilled data."
    each = ", ".join(f"{name}: {f} file{'s' if f != 1 else ''}, {format_bytes(b)}"
                     for name, (f, b) in sorted(spilled.items()) if f)
    return (f"it held {format_bytes(size)} of results its workers had spilled to disk ({each}), lost with that "
            f"process. Close a cluster (a with block, or close()) so that it removes its folder itself.")


# Why a folder refuses a cluster's own folder, by errno, beyond the system's words for it.
_DIRECTORY_CAUSES = {
    errno.ENOENT: "it does not let folders be made in it (a virtual filesystem, such as /proc or /sys)",
    errno.ENOTDIR: "a part of the path is a file, not a folder",
    errno.EACCES: "this user may not write there",
    errno.EPERM: "this user may not write there",
    errno.EROFS: "it is on a read-only filesystem",
    errno.ENOSPC: "its disk is full",
    errno.EDQUOT: "this user's disk quota is used up",
}


def _unusable_directory(e: OSError, parent: Optional[str], base: str) -> OSError:
    """The error of a folder the cluster cannot make its own in: which, why, what to do. The
    same OSError subclass, so that ``except PermissionError`` still catches it."""
    where = f"local_directory={parent!r}" if parent else f"the system's temporary folder {base!r} (TMPDIR)"
    cause = _DIRECTORY_CAUSES.get(e.errno or 0)
    if e.errno == errno.ENOENT and not os.path.isdir(base):
        cause = "it does not exist and cannot be made"
    said = f"{e.filename!r}: {e.strerror}" if e.filename and e.strerror else str(e)
    text = (f"{where}: the cluster cannot make its own folder there (for its workers' spilled data): "
            f"{said}{f'; {cause}' if cause else ''}. Give local_directory= a folder this user may write "
            f"to, on a disk with room (LOCALCLUSTER_LOCAL_DIRECTORY works too).")
    try:
        return type(e)(e.errno, text)
    except Exception:  # noqa: BLE001 - an OSError subclass of a library's, built otherwise
        return OSError(e.errno, text)


def _pickled(initializer: Optional[Callable], initargs: tuple, directory: str) -> Optional[str]:
    """The path of (initializer, initargs) pickled into the cluster's private directory (0700,
    the file 0600): its arguments may hold secrets, and a worker's argv is world-readable."""
    if initializer is None:
        return None
    from .wire.serialize import pickle_function
    path = os.path.join(directory, "initializer.pkl")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as f:     # as a task's function: a script's frames keep their file name
        f.write(pickle_function((initializer, tuple(initargs))))
    return path


def _after_fork_in_child() -> None:
    """Every cluster is inert in a forked child. Locks other threads held at the fork stay
    held here, so nothing may take them: every entry point checks the phase first, and
    close() leaves the workers and the directory to the parent."""
    for life in list(_live_clusters.values()):
        life.forked()
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
