"""localcluster: a cluster on one machine that tells you why a worker died.

The public names are loaded on first use (PEP 562): a worker process imports only
``localcluster.worker.boot`` and what it needs, not the client and the parent's machinery,
so every worker starts sooner.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .version import __version__

# public name -> the module that defines it
_WHERE = {
    "LocalCluster": "cluster", "WorkerInfo": "cluster",
    "Client": "client.client", "Future": "client.future", "wait": "client.waiting",
    "as_completed": "client.waiting", "fire_and_forget": "client.future", "futures_of": "client.future",
    "get_client": "worker.client", "worker_client": "worker.client", "secede": "worker.client",
    "rejoin": "worker.client", "get_worker": "worker.client",
    "Lock": "coordination", "Semaphore": "coordination", "Event": "coordination", "Queue": "coordination",
    "Variable": "coordination",
    "KilledWorker": "death", "WorkerDeath": "death", "TaskTimeoutError": "death", "LostDataError": "death",
    "TaskError": "death", "WorkerStartupError": "death", "ClusterRestarted": "death", "ClusterClosed": "death",
    "ClusterBroken": "death", "TransferError": "death", "RemoteTraceback": "death",
    "ReplayedDeath": "integrations.replay", "StoreError": "worker.store", "progress": "views.progress",
    "report": "views.report", "live": "views.live", "previous_runs": "runs",
    "get_task_stream": "client.dask_calls", "WorkerPlugin": "worker.setup",
    "JournalError": "journal",
}

__all__ = [
    "LocalCluster", "Client", "Future", "KilledWorker", "WorkerDeath", "TaskTimeoutError",
    "LostDataError", "TaskError", "WorkerStartupError", "ReplayedDeath", "ClusterRestarted", "ClusterClosed",
    "ClusterBroken", "TransferError", "RemoteTraceback", "StoreError", "WorkerInfo",
    "wait", "as_completed", "fire_and_forget", "futures_of", "progress", "report", "live", "config", "__version__",
    "get_client", "worker_client", "secede", "rejoin", "get_worker",
    "Lock", "Semaphore", "Event", "Queue", "Variable", "previous_runs", "get_task_stream",
    "WorkerPlugin", "JournalError",
]


def __getattr__(name: str) -> Any:
    if name == "config":
        value: Any = importlib.import_module(".config", __name__)
    elif name in _WHERE:
        value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    else:
        raise AttributeError(f"module 'localcluster' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:   # for type checkers and IDEs: the same names, eagerly
    from . import config
    from .client.client import Client
    from .client.future import Future, fire_and_forget, futures_of
    from .client.waiting import as_completed, wait
    from .worker.client import get_client, get_worker, rejoin, secede, worker_client
    from .cluster import LocalCluster, WorkerInfo
    from .coordination import Event, Lock, Queue, Semaphore, Variable
    from .death import (ClusterBroken, ClusterClosed, ClusterRestarted, KilledWorker, LostDataError, RemoteTraceback,
                        TaskError, TaskTimeoutError, TransferError, WorkerDeath, WorkerStartupError)
    from .views.progress import progress
    from .views.report import report
    from .views.live import live
    from .runs import previous_runs
    from .client.dask_calls import get_task_stream
    from .worker.setup import WorkerPlugin
    from .integrations.replay import ReplayedDeath
    from .worker.store import StoreError
