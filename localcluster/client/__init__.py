"""The user's side of the cluster: the Client and its futures.

- ``client.py``: :class:`Client`, the class users hold; it keeps each of dask's calls where
  users call it and hands the work to the parts below: the calls a task's client has too
  (submit, map, gather, scatter, cancel, run, who_has, scheduler_info) to the one
  implementation of them, worker/api.py, over this client's transport.
- ``transport.py``: that transport in the user's process (the cluster's Gateway, the
  client's FutureTable), and what only this process has: the journal, workers= and
  resources= checked against the live cluster, actors made.
- ``dask_calls.py``: the calls of dask's Client that only the user's process has
  (compute, persist, plugins, uploads, the workers' keys...).
- ``specs.py``: Specs of tasks made in bulk (a plain ``map``, the journal's) and functions pickled once.
- ``future.py``: :class:`Future`, a handle on the ``FutureState`` every Future of its key
  shares, and the client's ``FutureTable`` (key -> state) that the cluster tells how
  tasks end.
- ``waiting.py``: ``wait`` and ``as_completed``, for this process's futures and a task's.

Datasets and events (``localcluster/published.py``) stay outside: a task's client in a
worker uses them too, and a worker loads nothing of this package. ``from
localcluster.client import Client`` (and ``Future``, ``wait``, ``as_completed``) loads
``client.py`` on first use, not with the package.
"""
from __future__ import annotations

from typing import Any

__all__ = ["Client", "Future", "wait", "as_completed"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import client
        return getattr(client, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
