"""A joblib backend: ``joblib.Parallel`` (and so scikit-learn's ``n_jobs``) on the cluster.

    import joblib
    import localcluster.joblib            # registers the "localcluster" backend

    with joblib.parallel_config(backend="localcluster"):
        joblib.Parallel()(joblib.delayed(f)(x) for x in xs)
        GridSearchCV(model, grid, n_jobs=-1).fit(X, y)

Which cluster: ``parallel_config(backend="localcluster", client=client)`` names a Client;
without it, the most recently created running Client (``Client.current()``); with none,
each ``Parallel`` call starts a ``Client()`` of its own and closes it when the call ends
(for ``with Parallel(...) as parallel:``, when the block ends), so no worker outlives it.
Other keyword arguments of ``parallel_config`` go to ``client.submit`` (``retries=2``,
``priority=1``, ``workers=[...]``).

``n_jobs=-1`` means every worker thread of the cluster (``n_jobs=-2`` all but one). The
work always runs on the cluster, even at ``n_jobs=1`` or with a single worker thread:
joblib would otherwise run it in your own process, where a segfault would end it.

A worker death raises localcluster's ``KilledWorker`` out of ``Parallel``, with the
cause, signal, memory figures and crashing frames. A task's own exception is raised as
itself, its worker-side traceback attached as its ``__cause__`` (joblib drops an
exception's traceback; loky shows the remote one the same way). Batches are sized by
joblib's auto-batching, as with loky. ``Parallel`` nested inside a task runs sequentially
on its worker thread. When a task fails, the batches not finished yet are cancelled.
"""
from __future__ import annotations

import functools
import os
import traceback
from typing import Any, Optional

import joblib
from joblib.parallel import AutoBatchingMixin, ParallelBackendBase, SequentialBackend

from .. import config
from ..client import Client
from ..death import RemoteTraceback
from ..system.machine import usable_cpus

__all__ = ["LocalClusterBackend"]


class LocalClusterBackend(AutoBatchingMixin, ParallelBackendBase):
    # results come through our futures' done-callbacks (joblib derives supports_timeout
    # and supports_return_generator from this)
    supports_retrieve_callback = True
    default_n_jobs = -1

    def __init__(self, client: Optional[Client] = None, nesting_level: Optional[int] = None,
                 inner_max_num_threads: Optional[int] = None, **submit_kwargs: Any):
        if client is not None and not isinstance(client, Client):
            raise TypeError(f"the localcluster joblib backend takes client=localcluster.Client, "
                            f"got {type(client).__name__}")
        super().__init__(nesting_level=nesting_level, inner_max_num_threads=inner_max_num_threads)
        self._given = client
        self._owned: Optional[Client] = None     # the Client() this backend started, if it did
        self._in_use: Optional[Client] = None    # the client of the Parallel call under way
        self.submit_kwargs = submit_kwargs
        self._pending: set = set()

    @property
    def client(self) -> Optional[Client]:
        """The client the work goes to: the given one, else the current one; None if there is
        none yet (a Parallel call then starts one of its own)."""
        if self._in_use is not None:
            return self._in_use
        if self._given is not None:
            return self._given
        return Client.current(allow_none=True)

    def effective_n_jobs(self, n_jobs: Optional[int]) -> int:
        """The batches to run at once: ``n_jobs``, or for -1 the cluster's threads. Never
        starts a cluster (``joblib.effective_n_jobs()`` may ask outside any Parallel call):
        with no client yet, the threads a ``Client()`` would start."""
        if n_jobs == 0:
            raise ValueError("n_jobs == 0 in Parallel has no meaning")
        n_jobs = -1 if n_jobs is None else n_jobs
        client = self.client
        if client is not None:
            total = sum(w.nthreads for w in client.cluster.workers.values()) or 1
        else:
            n_workers = config.get("n_workers")
            total = (usable_cpus() if n_workers is None else n_workers) * config.get("threads_per_worker")
        wanted = max(total + 1 + n_jobs, 1) if n_jobs < 0 else n_jobs
        # Never 1: joblib runs n_jobs=1 in the calling process, where a crash would take the
        # user's own process down. Two batches in flight on one thread merely queue.
        return max(wanted, 2)

    def configure(self, n_jobs: int = 1, parallel: Any = None, **backend_kwargs: Any) -> int:
        """The start of a Parallel call (or of ``with Parallel()``): choose its client."""
        self.parallel = parallel
        client = self.client
        if client is None:
            client = self._owned = Client()
        self._in_use = client
        return self.effective_n_jobs(n_jobs)

    def submit(self, func: Any, callback: Any = None) -> Any:
        """One batch of calls (joblib's BatchedCalls) as one task."""
        if self._in_use is None:         # used without configure(): as a Parallel call would
            self.configure()
        future = self._in_use.submit(func, key=f"{_batch_name(func)}-{os.urandom(8).hex()}",
                                     **self.submit_kwargs)
        self._pending.add(future)
        future.add_done_callback(self._pending.discard)
        if callback is not None:
            future.add_done_callback(callback)
        return future

    def apply_async(self, func: Any, callback: Any = None) -> Any:
        """``submit`` under the name joblib < 1.5 calls (1.5 renamed it)."""
        return self.submit(func, callback)

    def retrieve_result_callback(self, out: Any) -> Any:
        """The batch's results; or its exception, which joblib raises out of Parallel."""
        exc = out.exception()
        if exc is None:
            return out.result()
        if exc.__traceback__ is not None:
            # A task's own exception, with its worker-side frames. joblib sets __traceback__
            # to None before raising it: keep them as the cause, as loky does.
            text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            exc.__cause__ = RemoteTraceback(text)
        raise exc

    def abort_everything(self, ensure_ready: bool = True) -> None:
        """joblib gave up (a task failed, or a timeout): cancel what has not finished."""
        pending = [f for f in list(self._pending) if not f.done()]
        self._pending.clear()
        if pending and self._in_use is not None and self._in_use.status == "running":
            self._in_use.cancel(pending)

    def terminate(self) -> None:
        """The end of a Parallel call: close the client we started, if we did."""
        self._in_use = None
        self._pending.clear()
        owned, self._owned = self._owned, None
        if owned is not None:
            owned.close()

    def get_nested_backend(self) -> Any:
        return SequentialBackend(nesting_level=(self.nesting_level or 0) + 1), None

    def __reduce__(self) -> Any:
        # never pickle a Client: a backend sent to a worker is a fresh, unconfigured one
        return (LocalClusterBackend, ())


def _batch_name(batch: Any) -> str:
    """The task name of a batch: its first function's (``fit_and_score``, not
    ``BatchedCalls``), so a KilledWorker says which work died."""
    items = getattr(batch, "items", None)
    fn = items[0][0] if items else batch
    while isinstance(fn, functools.partial):
        fn = fn.func
    return str(getattr(fn, "__name__", "joblib")).replace("<", "").replace(">", "") or "joblib"


joblib.register_parallel_backend("localcluster", LocalClusterBackend)
