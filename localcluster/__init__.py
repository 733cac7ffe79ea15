"""localcluster: a cluster on one machine that tells you why a worker died."""
from __future__ import annotations

__version__ = "0.1.0"

from . import config
from .client import Client, Future, as_completed, wait
from .cluster import LocalCluster, WorkerInfo
from .death import (ClusterBroken, ClusterClosed, ClusterRestarted, KilledWorker, LostDataError, TaskError,
                    TaskTimeoutError, WorkerDeath, WorkerStartupError)
from .replay import ReplayedDeath
from .diagnostics.progress import progress
from .store import StoreError

__all__ = [
    "LocalCluster", "Client", "Future", "KilledWorker", "WorkerDeath", "TaskTimeoutError",
    "LostDataError", "TaskError", "WorkerStartupError", "ReplayedDeath", "ClusterRestarted", "ClusterClosed",
    "ClusterBroken", "StoreError", "WorkerInfo",
    "wait", "as_completed", "progress", "config", "__version__",
]
