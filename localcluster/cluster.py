"""LocalCluster: configuration, lifecycle, and the scheduler thread.

Data flow::

    user threads ──submit/map/gather──► Cluster._lock ─► Scheduler (pure) ─► actions
         ▲                                     │                              │
         │ futures resolved outside the lock   │                   Send: Channel.send (non-blocking)
         │                                     ▼                              ▼
    scheduler thread: selector.select([channels, pidfds, log pipes, wake-up pipe], tick)
         │   channel readable  -> worker messages -> Scheduler events
         │   pidfd readable    -> Nanny.reap -> classify -> WorkerDeath -> Scheduler.worker_died
         │   output pipe readable -> OutputStream.read (into the bounded log; stdout and
         │                           stderr forwarded to the same stream, crash dumps held back)
         │   wake-up pipe      -> commands (spawn, scale, restart, close), released keys
         └── tick (memory_sample_interval): memory samples -> pause / terminate,
             task timeouts and heartbeats read from each worker's status board

User threads run the state machine themselves under one lock and write to the
worker's socket directly, so a submit costs no thread hop; only what the socket
cannot take at once is left for the scheduler thread to flush. Every process is
spawned from the scheduler thread, because Linux's parent-death signal follows
the thread that forked, and that thread lives exactly as long as the cluster.

A persistent epoll selector is used instead of ``multiprocessing.connection.wait``
(which builds a new poller on every call) and because it can also wait for a
socket to become writable.
"""
from __future__ import annotations

import atexit
import concurrent.futures as cf
import itertools
import os
import queue
import selectors
import shutil
import tempfile
import threading
import time
import traceback
import weakref
from collections import deque
from concurrent.futures import Future as _CfFuture
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from . import config as _config
from . import protocol as P
from . import scheduler as S
from .config import format_bytes
from .death import ClusterBroken, ClusterClosed, ClusterRestarted, WorkerDeath
from .machine import available_memory, purge_stale_directories, usable_cpus
from .nanny import Nanny, logger
from .records import Spec
from .supervision import Supervision
_live_clusters: "weakref.WeakSet[LocalCluster]" = weakref.WeakSet()


@dataclass
class WorkerInfo:
    """A snapshot of one worker, as ``cluster.workers[name]``."""
    name: str
    pid: int
    status: str                    # starting, running, paused, closing
    memory: Optional[int]          # RSS of the worker and its children, bytes
    peak_memory: Optional[int]
    memory_limit: Optional[int]
    managed: int                   # bytes of results held in memory
    spilled: int                   # bytes of results spilled to disk
    processing: tuple              # keys assigned to it
    nthreads: int
    memory_history: list = field(repr=False, default_factory=list)   # [(unix time, rss)]


class LocalCluster(Supervision):
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
        self.memory_limit: Optional[int] = limit
        self._initializer = None
        if initializer is not None:
            import cloudpickle
            self._initializer = cloudpickle.dumps((initializer, tuple(initargs))).hex()
        if cfg["local_directory"]:
            os.makedirs(cfg["local_directory"], exist_ok=True)
        purge_stale_directories(cfg["local_directory"] or tempfile.gettempdir())
        self.local_directory = tempfile.mkdtemp(prefix=f"localcluster-{os.getpid()}-", dir=cfg["local_directory"])
        os.chmod(self.local_directory, 0o700)

        self.scheduler = S.Scheduler(cfg["allowed_failures"])
        self.deaths: list[WorkerDeath] = []
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._nannies: dict[str, Nanny] = {}
        self._dead_logs: dict[str, list] = {}
        self._names = itertools.count()
        self._target = 0
        self._startup_failures: list[WorkerDeath] = []
        self._broken: Optional[Exception] = None    # WorkerStartupError or ClusterBroken: every call raises it
        self._respawn_at: list[float] = []
        self._clients: "weakref.WeakSet" = weakref.WeakSet()
        self._requests: dict[int, _CfFuture] = {}
        self._released: deque = deque()
        self._commands: deque = deque()
        self._status = "starting"
        self._close_started = False
        self._callback_queue: queue.SimpleQueue = queue.SimpleQueue()
        self._callback_thread: Optional[threading.Thread] = None
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, ("wake", None))
        self._thread = threading.Thread(target=self._loop, name="localcluster-scheduler", daemon=True)
        self._thread.start()
        _live_clusters.add(self)
        try:
            self.scale(self.n_workers)
        except BaseException:
            self.close()
            raise
        self._status = "running"

    # --- public ---------------------------------------------------------------------

    @property
    def workers(self) -> dict[str, WorkerInfo]:
        out = {}
        with self._lock:
            for name, n in self._nannies.items():
                ws = self.scheduler.workers.get(name)
                managed, spilled, _nkeys = n.board.store() if n.board is not None else (0, 0, 0)
                status = ("closing" if n.reason or (ws and ws.closing) else "paused" if n.paused
                          else "running" if n.ready else "starting")
                out[name] = WorkerInfo(
                    name, n.pid, status, n.memory, n.peak_memory, self.memory_limit, managed, spilled,
                    tuple(k for k in ws.processing.values() if k) if ws else (), n.nthreads, list(n.history))
        return out

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
            known = set(self._nannies)
        unknown = sorted(names - known)
        if unknown and strict:
            raise ValueError(f"workers={sorted(names)!r}: no running worker is called "
                             f"{', '.join(map(repr, unknown))}; the workers are {sorted(known)!r}")
        return names

    def scale(self, n: int, timeout: float = 60.0) -> None:
        """Grow or shrink to ``n`` workers; returns when they are up (or gone)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"scale(n={n!r}): n must be an integer >= 0")
        self._check_open()
        self._call(lambda: self._scale(n)).result()
        self._wait_for_workers(n, timeout)

    def close(self, timeout: float = 10.0) -> None:
        if self._status == "closed":
            return
        self._status = "closing"
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            try:
                self._call(self._begin_close).result(timeout)
            except Exception:  # pragma: no cover - the loop is gone; clean up below
                pass
            self._thread.join(timeout)
            if self._thread.is_alive():
                # Workers ignored Stop (a C call holding the GIL): kill them now. The scheduler
                # thread reaps them and returns; nothing is torn down under its feet.
                for n in list(self._nannies.values()):
                    n.kill(None)
                self._thread.join(30)
            if self._thread.is_alive():  # pragma: no cover - never seen; leave resources to the OS
                logger.error("localcluster scheduler thread did not stop; resources left to process exit")
                self._status = "closed"
                return
        self._status = "closed"
        if not isinstance(self._broken, ClusterBroken):   # broken: futures already failed, state suspect
            with self._lock:
                post = self._apply(self.scheduler.clear(ClusterClosed("the cluster was closed")))
            self._post(post)
        for fut in list(self._requests.values()):
            if not fut.done():
                fut.set_exception(ClusterClosed("the cluster was closed"))
        for n in list(self._nannies.values()):
            self._force_reap(n)
        if self._callback_thread is not None:
            self._callback_queue.put(None)
            if threading.current_thread() is not self._callback_thread:
                self._callback_thread.join(timeout)
        self._selector.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
        shutil.rmtree(self.local_directory, ignore_errors=True)
        _live_clusters.discard(self)

    def __enter__(self) -> "LocalCluster":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        workers, threads = len(self._nannies), self.threads_per_worker
        return (f"<LocalCluster {self._status}: {workers} worker{'s' if workers != 1 else ''}, {threads} "
                f"thread{'s' if threads != 1 else ''} each, "
                f"memory_limit={format_bytes(self.memory_limit) if self.memory_limit else None}>")

    def get_logs(self, n: Optional[int] = None) -> dict[str, list]:
        with self._lock:
            logs = dict(self._dead_logs)
            for name, nanny in self._nannies.items():
                logs[name] = list(nanny.log)
        return {name: (lines[-n:] if n else lines) for name, lines in logs.items()}

    def dump_stacks(self, worker: Optional[str] = None, timeout: float = 2.0) -> dict[str, str]:
        """The live stacks of every thread of each worker (faulthandler, via SIGUSR1)."""
        with self._lock:
            targets = [n for name, n in self._nannies.items() if worker in (None, name) and n.ready]
            marks = {n.name: len(n.log) for n in targets}
        for n in targets:
            n.request_stacks()
        deadline = time.monotonic() + timeout
        out: dict[str, str] = {}
        with self._changed:
            while True:
                for n in targets:
                    lines = list(n.log)[marks[n.name]:]
                    # the main thread is dumped last; its outermost frame is the `python -c` line
                    if any(l.strip().startswith('File "<string>"') for l in lines):
                        out[n.name] = self._label_threads(n, "\n".join(lines).strip())
                if len(out) == len(targets) or time.monotonic() > deadline:
                    return out
                self._changed.wait(0.05)

    def _label_threads(self, n: Nanny, text: str) -> str:
        """Say which task each executor thread is running, from the status board."""
        for seq, (ident, _started) in n.board.running().items():
            key = self.scheduler.key_of(seq)
            if key:
                text = text.replace(f"0x{ident:016x} (most recent call first):",
                                    f"0x{ident:016x} (most recent call first) running task {key!r}:")
        return text

    # --- for the client and its futures ------------------------------------------------

    def attach(self, client: Any) -> None:
        """``client`` hears how tasks end (``client.resolve``) and is failed if the cluster breaks."""
        self._clients.add(client)

    def release(self, key: str) -> None:
        """The last Future of ``key`` is gone. Any thread, even inside the garbage collector:
        no lock and no wake-up; the scheduler thread frees released keys on its next tick."""
        if self._status in ("running", "starting"):
            self._released.append(key)

    def acquire(self, key: str, make: Callable[[], Any]) -> Any:
        """One more Future of ``key`` (one unpickled in this process), made by ``make()``
        under the lock and resolved at once if the task has ended; None if the key is gone."""
        with self._lock:
            ts = self.scheduler.tasks.get(key)
            if ts is None:
                return None
            ts.wanted += 1
            fut = make()
            if ts.state == "memory":
                post = [S.Resolve(key, "finished", ts.data)]
            elif ts.state in ("erred", "lost"):
                post = [S.Resolve(key, "lost" if ts.state == "lost" else "error", ts.error)]
            else:
                post = []
        self._post(post)
        return fut

    def task_spec(self, key: str) -> Optional[Spec]:
        """The Spec ``key`` was submitted with, while the cluster still knows it."""
        with self._lock:
            ts = self.scheduler.tasks.get(key)
            return ts.spec if ts is not None else None

    def worker_versions(self) -> dict[str, dict]:
        with self._lock:
            return {n.name: dict(n.versions) for n in self._nannies.values() if n.ready}

    def on_scheduler_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def check_open(self) -> None:
        """Raise if the cluster is closed or broken."""
        self._check_open()

    # --- calls into the scheduler thread ------------------------------------------------

    def _check_open(self) -> None:
        if self._status in ("closing", "closed"):
            raise RuntimeError("this LocalCluster is closed; create a new one")
        if self._broken is not None:
            raise self._broken

    def _call(self, fn: Callable[[], Any]) -> _CfFuture:
        fut: _CfFuture = _CfFuture()
        if threading.current_thread() is self._thread:
            fut.set_result(fn())
            return fut
        self._commands.append((fn, fut))
        self._wake()
        return fut

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass

    def _wait_for_workers(self, n: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                if self._broken is not None:
                    raise self._broken
                ready = sum(1 for x in self._nannies.values() if x.ready and not x.reason)
                alive = len(self._nannies)       # a retiring worker counts until it is gone
                if ready == alive == n:
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{ready} of {n} workers were up after {timeout:g} s")
                self._changed.wait(left)

    # --- actions --------------------------------------------------------------------

    def _apply(self, actions: list) -> list:
        """Carry out Send/Retire under the lock; return Resolve/Deliver for after it."""
        if not actions:
            return actions
        post: list = []
        sends: dict[str, list] = {}
        for a in actions:
            t = type(a)
            if t is S.Send:
                sends.setdefault(a.worker, []).append(a.msg)
            elif t is S.Resolve or t is S.Deliver:
                post.append(a)
            elif t is S.Retire:
                n = self._nannies.get(a.worker)
                if n is not None and n.reason is None:
                    n.stop()
                    self._deadline_kill(n)
        on_loop = threading.current_thread() is self._thread
        for worker, msgs in sends.items():
            n = self._nannies.get(worker)
            if n is None or n.chan is None:
                continue
            ws = self.scheduler.workers.get(worker)
            if not on_loop and ws is not None and len(ws.processing) > 2 * ws.nthreads:
                # The worker has a backlog: it will not miss these for a while. Leave them
                # for the scheduler thread to send in one frame when the worker next reports
                # (or on the next tick), instead of one syscall per submit.
                n.cork.extend(msgs)
                continue
            self._send(n, msgs)
        return post

    def _send(self, n: Nanny, msgs: list) -> None:
        if n.cork:   # order matters: corked messages go first
            msgs, n.cork = n.cork + msgs, []
        if not n.chan.send(msgs[0] if len(msgs) == 1 else P.Batch(tuple(msgs))):
            self._want_write(n)

    def _uncork(self, nannies: Any) -> None:
        nannies = [n for n in nannies if n.cork]
        if not nannies:
            return
        with self._lock:
            for n in nannies:
                if n.cork and n.chan is not None:
                    self._send(n, [])

    def _post(self, post: list) -> None:
        if not post:
            return
        clients = list(self._clients)    # once per batch: iterating a WeakSet is not cheap
        for a in post:
            if type(a) is S.Resolve:
                for client in clients:
                    client.resolve(a.key, a.status, a.value)
            else:
                fut = self._requests.pop(a.request, None)
                if fut is not None and not fut.done():
                    if a.error is not None:
                        fut.set_exception(_as_exception(a.error, a.key))
                    else:
                        fut.set_result(a.data)

    def _event(self, fn: Callable, *args: Any, before: Optional[Callable[[], Any]] = None) -> Any:
        """Run a scheduler event from any thread and carry out its actions. ``before()`` runs
        first under the same lock (futures must exist before any answer can arrive); its
        return value is returned. The scheduler is pure and gets only checked input, so any
        exception here is a bug in localcluster: the cluster breaks, loudly, at once."""
        if self._broken is not None:
            raise self._broken
        try:
            with self._lock:
                ret = before() if before is not None else None
                post = self._apply(fn(*args))
            self._post(post)
        except Exception:
            self._break("scheduler", traceback.format_exc())
            raise self._broken from None
        return ret

    def _break(self, where: str, tb_text: str) -> None:
        """An internal failure: every pending future and every later call fails with
        ClusterBroken; the scheduler thread stops the workers and exits."""
        if isinstance(self._broken, ClusterBroken):
            return
        logger.error("localcluster's %s failed; the cluster is broken:\n%s", where, tb_text)
        self._broken = err = ClusterBroken(where, tb_text)
        # The scheduler's state is suspect: fail the futures directly, not through it.
        for client in list(self._clients):
            client.fail_pending(err)
        for fut in list(self._requests.values()):
            if not fut.done():
                fut.set_exception(err)
        with self._changed:
            self._changed.notify_all()
        self._wake()

    # --- public entry points for the client -------------------------------------------

    def submit(self, specs: list, track: Callable[[], Any]) -> Any:
        """Hand tasks (Specs) to the scheduler; ``track()`` makes their futures first."""
        if not self._nannies and self._status == "running" and specs:
            # legitimate (scale up later), but a silent wait is the worst way to find out
            logger.warning("localcluster: %s submitted while the cluster has no worker; %s until "
                           "cluster.scale(n) starts one", f"{len(specs)} tasks" if len(specs) > 1 else
                           f"task {specs[0].key!r}", "they wait" if len(specs) > 1 else "it waits")
        return self._event(self.scheduler.submit, specs, before=track)

    def why_pending(self, key: str) -> str:
        """Why ``key``'s future is not done yet, in words (for a TimeoutError)."""
        with self._lock:
            where = self.scheduler.whereabouts(key)
            n = self._nannies.get(where.worker) if where.worker else None
            started = n.board.running().get(where.seq) if n is not None and n.board is not None else None
        task = f"task {key!r}"
        if where.state == "processing" and started is not None:
            return f"{task} is still running on {where.worker} (started {time.monotonic() - started[1]:.1f} s ago)"
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

    def scatter(self, items: list, track: Callable[[], Any], workers: Optional[frozenset] = None,
                broadcast: bool = False) -> Any:
        """Place ``[(key, Payload)]`` on workers (the scheduler chooses which)."""
        return self._event(self.scheduler.scatter, items, workers, broadcast, before=track)

    def cancel(self, keys: list) -> None:
        self._event(self.scheduler.cancel, keys)

    def replicate(self, keys: list, n: Optional[int], timeout: Optional[float]) -> None:
        """Copies of these keys' data on ``n`` workers; returns when they have arrived."""
        fut: _CfFuture = _CfFuture()

        def ask() -> list:
            req, actions = self.scheduler.replicate(keys, n)
            self._requests[req] = fut
            return actions
        self._event(ask)
        try:
            fut.result(timeout)
        except cf.TimeoutError:
            raise TimeoutError(f"replicate() did not finish within {timeout:g} s") from None

    def run_callback(self, fn: Callable, fut: Any) -> None:
        """Run a user's done-callback on the callbacks thread (started on first use)."""
        with self._lock:
            if self._callback_thread is None:
                self._callback_thread = threading.Thread(target=self._callback_loop,
                                                         name="localcluster-callbacks", daemon=True)
                self._callback_thread.start()
        self._callback_queue.put((fn, fut))

    def _callback_loop(self) -> None:
        while True:
            item = self._callback_queue.get()
            if item is None:
                return
            fn, fut = item
            try:
                fn(fut)
            except Exception:
                logger.exception("exception calling callback for %r", fut)

    def _want_write(self, n: Nanny) -> None:
        if threading.current_thread() is self._thread:
            self._register(n)
        else:
            self._commands.append((lambda: self._register(n), None))
            self._wake()

    def _register(self, n: Nanny) -> None:
        if n.chan is None or n.chan.closed:
            return
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if n.chan.wants_write() else 0)
        try:
            self._selector.modify(n.chan, events, ("chan", n))
        except (KeyError, ValueError):
            pass

    def fetch(self, keys: list) -> list[_CfFuture]:
        """Futures for the data (Payloads) of ``keys``, however far away it is."""
        futs: list = []

        def ask() -> list:
            actions: list = []
            for key in keys:
                req, acts = self.scheduler.fetch(key)
                fut: _CfFuture = _CfFuture()
                self._requests[req] = fut
                futs.append(fut)
                actions += acts
            return actions
        self._event(ask)
        return futs

    # --- the scheduler thread ---------------------------------------------------------

    def _loop(self) -> None:
        # Timeouts, heartbeats and stop escalation are checked at least every 50 ms even
        # when memory is sampled less often.
        interval = min(self.config["memory_sample_interval"], 0.05)
        next_tick = time.monotonic()
        try:
            while True:
                now = time.monotonic()
                if now >= next_tick:
                    self._tick(now)
                    next_tick = now + interval
                if self._close_started and not self._nannies:
                    return
                if isinstance(self._broken, ClusterBroken):   # broken from a user thread
                    self._stop_all_workers()
                    return
                for key, mask in self._selector.select(max(0.0, next_tick - time.monotonic())):
                    kind, n = key.data
                    if kind == "wake":
                        self._on_wake()
                    elif kind == "chan":
                        if mask & selectors.EVENT_WRITE and n.chan.flush():
                            self._register(n)
                        if mask & selectors.EVENT_READ:
                            self._on_readable(n)
                    elif kind == "log":
                        if not n.read():
                            self._unregister(n.fd)
                        with self._changed:
                            self._changed.notify_all()
                    elif kind == "exit":
                        self._on_exit(n)
        except BaseException:  # a bug here must be loud and fail everyone at once, never hang
            self._break("scheduler thread", traceback.format_exc())
            self._stop_all_workers()

    def _stop_all_workers(self) -> None:
        """After a break: kill and reap every worker; the thread then ends."""
        for n in list(self._nannies.values()):
            try:
                self._force_reap(n)
            except Exception:  # pragma: no cover - best effort: the cluster is already broken
                logger.exception("could not reap %s", n.name)

    def _on_wake(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass
        self._free_released()
        while self._commands:
            fn, fut = self._commands.popleft()
            try:
                result = fn()
            except BaseException as e:
                if fut is not None:
                    fut.set_exception(e)
            else:
                if fut is not None:
                    fut.set_result(result)

    def _free_released(self) -> None:
        released = []
        while self._released:
            released.append(self._released.popleft())
        if released:
            with self._lock:
                actions = []
                for key in released:
                    actions += self.scheduler.release(key)
                post = self._apply(actions)
            self._post(post)

    def _on_readable(self, n: Nanny) -> None:
        try:
            msgs = n.chan.receive()
        except (EOFError, OSError):
            self._unregister(n.chan)
            if n.sentinel is None:   # no pidfd: EOF is our death notice
                self._on_exit(n)
            return
        if msgs:
            self._on_messages(n, msgs)

    def _on_messages(self, n: Nanny, msgs: list) -> None:
        sched = self.scheduler
        flat: list = []
        for m in msgs:
            flat.extend(m.messages if type(m) is P.Batch else (m,))
        with self._lock:
            actions: list = []
            with sched.batch() as batch:
                for m in flat:
                    t = type(m)
                    if t is P.Finished:
                        actions += sched.finished(n.name, m.seq, m.nbytes, m.type_name, m.data, m.duration)
                    elif t is P.Failed:
                        actions += sched.failed(n.name, m.seq, m.error)
                    elif t is P.Skipped:
                        actions += sched.skipped(n.name, m.seq)
                    elif t is P.Data:
                        actions += sched.data(n.name, m.request, m.key, m.data, m.error)
                    elif t is P.Stored:
                        actions += sched.stored(m.ack)
                    elif t is P.Ready:
                        n.ready, n.versions = True, m.versions
                        too_small = self._limit_too_small(n, n.sample(time.monotonic()))
                        if too_small and self._status == "starting":
                            self._broken = ValueError(too_small)    # the constructor raises it
                            n.stop()
                        elif too_small:     # scaling up: a failed start (_maybe_respawn), never a loop
                            n.add_log(f"[nanny] {too_small}")
                            n.kill("memory-limit")
                        else:
                            self._startup_failures.clear()
                        if n.reason is None:
                            actions += sched.add_worker(n.name, n.nthreads)
                        self._changed.notify_all()
                    elif t is P.Fatal:
                        n.fatal = m.traceback
            post = self._apply(actions + batch.actions)
            if n.cork and n.chan is not None:
                self._send(n, [])
        self._post(post)

    def _limit_too_small(self, n: Nanny, rss: Optional[int]) -> Optional[str]:
        """Why ``memory_limit`` cannot work, if a worker that runs nothing yet already
        crosses the pause or terminate fraction of it (it would be paused or killed forever)."""
        limit, cfg = self.memory_limit, self.config
        fraction = min((f for f in (cfg["memory_pause"], cfg["memory_terminate"]) if f), default=None)
        if not limit or not rss or fraction is None or rss <= fraction * limit:
            return None
        return (f"memory_limit={format_bytes(limit)} is too small: an idle worker needs {format_bytes(rss)} "
                f"({n.name}, pid {n.pid}, running no task), above {fraction:.0%} of the limit, where workers "
                f"are paused or killed. Use memory_limit of at least {format_bytes(int(rss / fraction) + 1)} "
                f"plus what the tasks hold, \"auto\", or None for no limit.")

    def _unregister(self, fileobj: Any) -> None:
        try:
            self._selector.unregister(fileobj)
        except (KeyError, ValueError):
            pass

    def _spawn(self) -> None:
        name = f"worker-{next(self._names)}"
        n = Nanny(name, self.threads_per_worker, self.memory_limit, self.config,
                  os.path.join(self.local_directory, name), self._initializer,
                  self.config["forward_logs"], self.config["log_lines"])
        n.spawn()
        with self._lock:
            self._nannies[name] = n
        self._selector.register(n.chan, selectors.EVENT_READ, ("chan", n))
        for stream in n.outputs:
            self._selector.register(stream.fd, selectors.EVENT_READ, ("log", stream))
        if n.sentinel is not None:
            self._selector.register(n.sentinel, selectors.EVENT_READ, ("exit", n))

    def _scale(self, target: int) -> None:
        self._target = target
        with self._lock:
            alive = [n for n in self._nannies.values() if not n.reason and not
                     (n.name in self.scheduler.workers and self.scheduler.workers[n.name].closing)]
        for _ in range(target - len(alive)):
            self._spawn()
        if len(alive) > target:
            def idleness(n: Nanny) -> tuple:
                ws = self.scheduler.workers.get(n.name)
                return (0 if not n.ready else 1, len(ws.processing) if ws else 0, len(ws.has) if ws else 0)
            victims = sorted(alive, key=idleness)[: len(alive) - target]
            with self._lock:
                actions: list = []
                for n in victims:
                    if n.name in self.scheduler.workers:
                        actions += self.scheduler.retire(n.name)
                    else:
                        n.stop()
                        self._deadline_kill(n)
                post = self._apply(actions)
            self._post(post)

    def _begin_close(self) -> None:
        self._close_started = True
        self._target = 0
        with self._lock:
            for n in self._nannies.values():
                n.stop()
                self._deadline_kill(n)

    def restart(self, timeout: float = 60.0) -> None:
        self._check_open()
        def begin() -> None:
            with self._lock:
                post = self._apply(self.scheduler.clear(
                    ClusterRestarted("the cluster was restarted (client.restart()); submit the task again")))
                for n in self._nannies.values():
                    n.stop()
                    self._deadline_kill(n)
            self._post(post)
            for fut in list(self._requests.values()):
                if not fut.done():
                    fut.set_exception(ClusterRestarted("the cluster was restarted"))
            self._requests.clear()
            for _ in range(self._target):
                self._spawn()
        self._call(begin).result()
        self._wait_for_workers(self._target, timeout)

def _as_exception(error: Any, key: Optional[str] = None) -> BaseException:
    if isinstance(error, BaseException):
        return error
    from .serialize import loads_exception
    return loads_exception(error, key)


@atexit.register
def _close_all() -> None:
    for cluster in list(_live_clusters):
        try:
            cluster.close(timeout=5)
        except Exception:  # pragma: no cover
            pass
