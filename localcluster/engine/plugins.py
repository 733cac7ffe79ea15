"""Scheduler plugins: dask's ``SchedulerPlugin`` protocol, run in the user's process, where
the scheduler is.

A plugin is told what the scheduler did, in order, but never on the scheduler thread and
never under the cluster's lock: a plugin may be slow, or call the client. On each tick of
the scheduler thread while a plugin is registered, ``SchedulerPlugins.tick`` takes, under the
lock, the transitions made since its last look (the scheduler's story ring:
``Transitions.since``) and the names of the workers running now, and hands them to the
callbacks thread (callbacks.py), which calls every plugin: ``add_worker`` and
``remove_worker`` for the workers that came and went, then ``transition(key, start, finish,
stimulus_id=...)`` for each transition. ``start(scheduler)`` runs as the plugin is
registered, and ``close()`` when it is replaced or removed, or the cluster closes. Each
method is optional; a coroutine function's result is run to its end. A plugin that raises
is logged (once per plugin and method) and goes on being told.

``scheduler`` is a :class:`SchedulerView`: the scheduler's tasks and workers by name, read
when asked, not a dask Scheduler (there is none here).

Threads: ``add``, ``remove`` and ``close`` from any thread; ``tick`` on the scheduler thread;
the plugins' calls on the callbacks thread (and ``start``/``close`` on the caller's).
"""
from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from typing import Any, Callable, Optional

from ..scheduler.records import Transitions
from .callbacks import CallbackThread

__all__ = ["SchedulerPlugins", "SchedulerView", "is_scheduler_plugin"]

logger = logging.getLogger("localcluster")

_HOOKS = ("start", "close", "transition", "add_worker", "remove_worker", "update_graph", "restart")


def is_scheduler_plugin(plugin: Any) -> bool:
    """A dask SchedulerPlugin (distributed's subclasses, or one written to its protocol without
    a worker plugin's ``setup``/``teardown``)."""
    import sys
    mod = sys.modules.get("distributed.diagnostics.plugin")
    if mod is not None and isinstance(plugin, mod.SchedulerPlugin):
        return True
    has = [m for m in _HOOKS if callable(getattr(plugin, m, None))]
    return bool(has) and not any(callable(getattr(plugin, m, None)) for m in ("setup", "teardown")) \
        and set(has) != {"transition"}


class SchedulerView:
    """What a scheduler plugin is given as ``scheduler``: this cluster's scheduler, read when
    asked (under the cluster's lock): ``tasks`` (key -> state) and ``workers`` (names)."""

    def __init__(self, lock: Any, tasks: Callable[[], dict], workers: Callable[[], list]):
        self._lock, self._tasks, self._workers = lock, tasks, workers
        self.address = None             # no server: there is nothing to connect to

    @property
    def tasks(self) -> dict:
        with self._lock:
            return self._tasks()

    @property
    def workers(self) -> list:
        with self._lock:
            return self._workers()


class SchedulerPlugins:
    def __init__(self, lock: Any, transitions: Transitions, workers: Callable[[], list],
                 callbacks: CallbackThread, view: SchedulerView):
        self._lock = lock                   # the cluster's
        self._transitions = transitions
        self._workers_now = workers         # the scheduler's running workers' names, under the lock
        self._callbacks = callbacks
        self.view = view
        self._guard = threading.Lock()      # the plugins' table and the marks below
        self._plugins: dict[str, Any] = {}  #: name -> plugin; under _guard
        self._mark: Optional[int] = None    #: the story ring's mark of the last look; scheduler thread
        self._known: frozenset = frozenset()    #: workers told so far; scheduler thread
        self._failed: set = set()           #: (name, method) already logged; callbacks thread

    def __bool__(self) -> bool:
        return bool(self._plugins)

    def add(self, name: str, plugin: Any) -> None:
        """Register ``plugin`` as ``name`` (replacing, and closing, one of that name); its
        ``start(scheduler)`` runs now, on this thread."""
        with self._guard:
            old = self._plugins.get(name)
            if not self._plugins:           # from now on: nothing before the first plugin is told
                with self._lock:
                    self._mark = self._transitions.since(None)[1]
                    self._known = frozenset(self._workers_now())
            self._plugins[name] = plugin
        if old is not None and old is not plugin:
            self._call(name, old, "close")
        self._call(name, plugin, "start", self.view)

    def remove(self, name: str) -> bool:
        with self._guard:
            plugin = self._plugins.pop(name, None)
        if plugin is not None:
            self._call(name, plugin, "close")
        return plugin is not None

    def tick(self) -> None:
        """Scheduler thread: what happened since the last look, handed to the callbacks thread."""
        if not self._plugins:
            return
        with self._lock:
            events, self._mark, lost = self._transitions.since(self._mark)
            workers = frozenset(self._workers_now())
        came, went = sorted(workers - self._known), sorted(self._known - workers)
        self._known = workers
        if lost:
            logger.warning("localcluster: scheduler plugins were not told %d transitions (more were made between "
                           "two looks than the scheduler keeps)", lost)
        if events or came or went:
            self._callbacks.run(self._tell, (events, came, went))

    def close(self) -> None:
        """The cluster closes: each plugin's ``close()``, on this thread."""
        with self._guard:
            plugins, self._plugins = dict(self._plugins), {}
        for name, plugin in plugins.items():
            self._call(name, plugin, "close")

    def _tell(self, batch: tuple) -> None:
        events, came, went = batch
        with self._guard:
            plugins = list(self._plugins.items())
        for name, plugin in plugins:
            for worker in came:
                self._call(name, plugin, "add_worker", scheduler=self.view, worker=worker)
            for worker in went:
                self._call(name, plugin, "remove_worker", scheduler=self.view, worker=worker,
                           stimulus_id="worker-gone")
            if callable(getattr(plugin, "transition", None)):
                for key, start, finish, event in events:
                    self._call(name, plugin, "transition", key, start, finish, stimulus_id=event)

    def _call(self, name: str, plugin: Any, method: str, *args: Any, **kwargs: Any) -> None:
        fn = getattr(plugin, method, None)
        if not callable(fn):
            return
        try:
            result = fn(*args, **kwargs)
            if inspect.isawaitable(result):
                _finish(result)
        except Exception:  # noqa: BLE001 - a plugin's failure is the plugin's: logged, never ours
            if (name, method) not in self._failed:
                self._failed.add((name, method))
                logger.exception("localcluster: scheduler plugin %r raised in %s() (logged once; it goes on "
                                 "being told)", name, method)


def _finish(awaitable: Any) -> None:
    """Run a plugin's coroutine to its end, on a thread of its own (this one may be in a loop)."""
    failed: list = []

    def run() -> None:
        try:
            asyncio.run(_wrap(awaitable))
        except BaseException as e:  # noqa: BLE001 - raised again on the caller's thread
            failed.append(e)
    thread = threading.Thread(target=run, daemon=True, name="localcluster-plugin")
    thread.start()
    thread.join()
    if failed:
        raise failed[0]


async def _wrap(awaitable: Any) -> Any:
    return await awaitable
