"""The client's side of ``localcluster.dask``: registering the plugins (dask_nanny.py), and
turning dask's ``KilledWorker`` into one that says why each worker died.

The scheduler gives a task up (``KilledWorker``, through the dropped stream) usually
*before* the nanny has learnt the exit code. So the client's handler of ``task-erred``
does not hand the error on at once: it waits, on the client's loop and without blocking it,
for the nannies' death events of the workers the task died on (``wait`` seconds at most),
then hands on a ``DaskKilledWorker``: still a ``distributed.KilledWorker``, with
localcluster's text and ``.deaths``. A nanny that never speaks (its machine died) is named
as such, never guessed at.
"""
from __future__ import annotations

import asyncio
import dataclasses
import weakref
from typing import Any

import distributed
from distributed.core import clean_exception

from ..death import KilledWorker, WorkerDeath
from ..wire.serialize import keep_file_names_in_cloudpickle
from .dask_nanny import (NANNY_METHODS, TOPIC_DEATH, TOPIC_REMOVED, DeathRecorder, FaultHandler, RemovalRecorder,
                         from_event, require, task_keys)

__all__ = ["DaskKilledWorker", "install", "deaths", "DASK_ADVICE"]

# localcluster's advice, in a dask cluster's terms where they differ
DASK_ADVICE = {
    **KilledWorker.ADVICE,
    "memory-limit": "Give each worker more memory (dask worker --memory-limit, or your cluster manager's "
                    "memory_limit), run fewer worker processes per machine, or make the task's pieces smaller.",
    "oom-killer": "The worker ran out of memory, on its machine or under a memory cgroup's limit (a container's, "
                  "a job's); the death says which. Set the workers' --memory-limit below that room so that their "
                  "nanny stops them first, run fewer worker processes per machine, or make the task's pieces "
                  "smaller.",
    "signal": "Something outside dask killed the worker (kill, a job scheduler, a container limit). The task "
              "may not be at fault.",
    "requested": "Nothing to do: dask asked for this (close, retire, restart).",
}


class _Text(KilledWorker):
    """localcluster's KilledWorker text, in dask's terms."""
    ADVICE = DASK_ADVICE
    REPLAY: dict = {}         # dask's recreate_error_locally would run the crash in your own process
    KEPT = "Each death is in KilledWorker.deaths and localcluster.dask.deaths(client)."


class DaskKilledWorker(distributed.KilledWorker):
    """dask's KilledWorker (``except KilledWorker`` still catches it) that says why each worker
    died: ``deaths``, the nannies' records; ``unheard``, (worker, seconds) of the workers whose
    nanny said nothing in that time."""

    def __init__(self, task, last_worker, allowed_failures: int, deaths: tuple = (), unheard: tuple = ()):
        super().__init__(task, last_worker, allowed_failures)
        self.deaths = tuple(deaths)
        self.unheard = tuple(unheard)

    def __str__(self) -> str:
        last = getattr(self.last_worker, "address", self.last_worker)
        return str(_Text(self.task, last, self.deaths, self.allowed_failures, unheard=self.unheard))

    def __reduce__(self):
        return (DaskKilledWorker, (self.task, self.last_worker, self.allowed_failures, self.deaths, self.unheard))


def _join(death: WorkerDeath, removed: dict) -> WorkerDeath:
    tasks = removed.get(death.worker, ())
    return dataclasses.replace(death, tasks=tasks).explained(replay_hint=False, advice=DASK_ADVICE) if tasks \
        else death.explained(replay_hint=False, advice=DASK_ADVICE)


class Diagnosis:
    """One client's view of the cluster's deaths, fed by its event subscriptions."""

    def __init__(self, client, wait: float):
        self.wait = wait          # (the client is not kept: it keeps this, in its handlers)
        self.by_worker: dict = {}          # worker address -> its latest WorkerDeath
        self.removed: dict = {}            # worker address -> the tasks it was running when removed
        self.waiters: list = []
        self.pending: set = set()          # the enrichments under way (held against garbage collection)
        handlers = getattr(client, "_stream_handlers")    # distributed's internals: checked by install()
        self.original = handlers["task-erred"]
        handlers["task-erred"] = self.on_task_erred

    def feed(self, topic: str, event) -> None:
        _stamp, msg = event
        if topic == TOPIC_DEATH:
            death = from_event(msg)
            self.by_worker[death.worker] = death
        else:
            self.removed[msg["worker"]] = task_keys(msg["tasks"])
        for waiter in self.waiters:
            if not waiter.done():
                waiter.set_result(None)
        self.waiters.clear()

    def on_task_erred(self, key=None, exception=None, traceback=None, **kwargs):
        try:
            _, exc, tb = clean_exception(exception, traceback)
        except Exception:
            exc = None
        if not isinstance(exc, distributed.KilledWorker) or isinstance(exc, DaskKilledWorker):
            return self.original(key=key, exception=exception, traceback=traceback, **kwargs)
        # Not awaited here: the report loop that called us must go on reading, the events we
        # wait for come through it.
        task = asyncio.ensure_future(self.explain(key, exc, tb, kwargs))
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)
        return None

    def workers_of(self, key, exc) -> list:
        last = getattr(exc.last_worker, "address", exc.last_worker)
        earlier = [w for w, tasks in self.removed.items() if key in tasks and w != last]
        return earlier + [last]

    async def explain(self, key, exc, tb, kwargs) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait
        workers = self.workers_of(key, exc)
        while any(w not in self.by_worker for w in workers) and loop.time() < deadline:
            waiter = loop.create_future()
            self.waiters.append(waiter)
            try:
                await asyncio.wait_for(waiter, deadline - loop.time())
            except asyncio.TimeoutError:
                break
            workers = self.workers_of(key, exc)
        known = tuple(_join(self.by_worker[w], self.removed) for w in workers if w in self.by_worker)
        unheard = tuple((w, self.wait) for w in workers if w not in self.by_worker)
        enriched = DaskKilledWorker(exc.task, exc.last_worker, exc.allowed_failures, known, unheard)
        self.original(key=key, exception=enriched, traceback=tb, **kwargs)


_INSTALLED: "weakref.WeakKeyDictionary[Any, Diagnosis]" = weakref.WeakKeyDictionary()


def install(client, wait: float = 5.0) -> None:
    """See ``localcluster.dask.install``."""
    if client.asynchronous:
        raise TypeError("localcluster.dask.install takes a synchronous Client (Client(address)), not an "
                        "asynchronous one")
    require(distributed.Nanny, NANNY_METHODS, "Nanny")
    if "task-erred" not in getattr(client, "_stream_handlers", {}):   # distributed's internals, wrapped
        raise RuntimeError(f"localcluster.dask.install: distributed {distributed.__version__}'s Client has no "
                           f"'task-erred' stream handler to wrap; it cannot explain KilledWorker on this version.")
    client.register_plugin(RemovalRecorder())
    client.register_plugin(DeathRecorder())
    client.register_plugin(FaultHandler())
    keep_file_names_in_cloudpickle()        # a crash's frames name the script's file, not "<dynamic-code>"
    if client in _INSTALLED:
        return
    diagnosis = _INSTALLED[client] = Diagnosis(client, wait)
    for topic in (TOPIC_REMOVED, TOPIC_DEATH):
        client.subscribe_topic(topic, lambda event, topic=topic: diagnosis.feed(topic, event))
    # what happened before the subscription (an event twice is the same record twice: harmless)
    for topic in (TOPIC_REMOVED, TOPIC_DEATH):
        for event in client.get_events(topic):
            client.loop.add_callback(diagnosis.feed, topic, event)


def deaths(client) -> list:
    """See ``localcluster.dask.deaths``."""
    removed = {}
    for _stamp, msg in client.get_events(TOPIC_REMOVED):
        removed[msg["worker"]] = task_keys(msg["tasks"])
    found = [_join(from_event(msg), removed) for _stamp, msg in client.get_events(TOPIC_DEATH)]
    return sorted(found, key=lambda d: d.time)
