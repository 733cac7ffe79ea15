"""The user's side of the cluster: the Client and its futures.

- ``client.py``: :class:`Client`, the class users hold; it keeps each of dask's calls where
  users call it and hands the work to the parts below.
- ``dask_calls.py``: the calls of dask's Client beyond submit, map and gather (run,
  who_has, compute, persist, plugins...).
- ``specs.py``: a task's Spec made from a call (functions pickled once, keys, options).
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
