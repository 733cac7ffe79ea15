"""localcluster's death diagnosis on a dask.distributed cluster (several machines).

``install(client)`` once, and a task given up after its workers died raises a
``distributed.KilledWorker`` (existing ``except`` clauses keep working) whose text says why each
worker died, as localcluster's own does: the cause, the signal, the memory against the limit,
the crashing frames, and what to do; it carries ``.deaths``. ``deaths(client)`` lists every
worker death the cluster's nannies recorded, tasks or not.

Nothing is needed on the machines beyond localcluster being importable there. Needs the
``[dask]`` extra (distributed); ``import localcluster`` never imports it.
"""
from __future__ import annotations

__all__ = ["install", "deaths", "DaskKilledWorker"]  # noqa: F822 - loaded on first use (__getattr__)


def __getattr__(name: str):
    """``DaskKilledWorker`` (a ``distributed.KilledWorker`` with ``.deaths``) loads distributed:
    only when asked for."""
    if name == "DaskKilledWorker":
        from .integrations.dask_client import DaskKilledWorker
        return DaskKilledWorker
    raise AttributeError(f"module 'localcluster.dask' has no attribute {name!r}")


def install(client, wait: float = 5.0) -> None:
    """Install the diagnosis on the cluster ``client`` is connected to (its scheduler, every
    nanny and every worker, present and future) and in this client.

    ``wait``: how long a given-up task's error waits for the nannies' word on its workers'
    deaths (it usually comes within a second of the scheduler's decision); past it, the error
    says which nanny was not heard from (its machine may have died). Raises RuntimeError where
    this distributed lacks what localcluster wraps, naming what is missing.
    """
    from .integrations.dask_client import install as _install
    _install(client, wait)


def deaths(client) -> list:
    """Every worker death the cluster's nannies recorded since ``install`` (``WorkerDeath``,
    oldest first), those that killed no task too (an idle worker OOM-killed by a neighbour)."""
    from .integrations.dask_client import deaths as _deaths
    return _deaths(client)
