"""A joblib backend: ``joblib.Parallel`` (and so scikit-learn's ``n_jobs``) on the cluster.

    import joblib
    import localcluster.joblib            # registers the "localcluster" backend

    with joblib.parallel_config(backend="localcluster"):
        joblib.Parallel()(joblib.delayed(f)(x) for x in xs)
        GridSearchCV(model, grid, n_jobs=-1).fit(X, y)

Which cluster: ``parallel_config(backend="localcluster", client=client)`` names a Client;
without it, the most recently created running Client (``Client.current()``); with none,
each ``Parallel`` call starts a ``Client(set_as_default=False)`` of its own (never the
current client, so that no other call takes it for yours) and closes it when the call ends
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
on its worker thread, even when it names "localcluster". ``initializer``/``initargs`` (of
``Parallel`` or ``parallel_config``) run once per worker process. When joblib gives up on a
call, what has not started is cancelled, and running batches stop (README, "joblib: what
differs from loky", says how far).
"""
from __future__ import annotations

import functools
import hashlib
import os
import threading
import traceback
from concurrent.futures import CancelledError
from typing import TYPE_CHECKING, Any, Callable, Optional

import cloudpickle
import joblib
from joblib.parallel import AutoBatchingMixin, FallbackToBackend, ParallelBackendBase, SequentialBackend

from .. import config
from ..death import RemoteTraceback, TaskError
from ..system.machine import usable_cpus
from ..worker.context import cancelled, in_worker

if TYPE_CHECKING:       # imported where used: a worker that unpickles a batch loads this
    from ..client.client import Client     # module, and must not load the parent's machinery with it

__all__ = ["LocalClusterBackend"]

_initialized: set = set()            # the initializers run in this (worker) process, by token
_initializing = threading.Lock()     # a worker's threads start batches at once


class LocalClusterBackend(AutoBatchingMixin, ParallelBackendBase):
    # results come through our futures' done-callbacks (joblib derives supports_timeout
    # and supports_return_generator from this)
    supports_retrieve_callback = True
    default_n_jobs = -1

    def __init__(self, client: Optional[Client] = None, nesting_level: Optional[int] = None,
                 inner_max_num_threads: Optional[int] = None, initializer: Optional[Callable] = None,
                 initargs: tuple = (), **submit_kwargs: Any):
        if client is not None and not _is_client(client):
            raise TypeError(f"the localcluster joblib backend takes client=localcluster.Client, "
                            f"got {type(client).__name__}")
        super().__init__(nesting_level=nesting_level, inner_max_num_threads=inner_max_num_threads)
        self._given = client
        # joblib's name for a backend's pool (joblib's tests read it): the Client() this
        # backend started, if it did
        self._workers: Optional[Client] = None
        self._in_use: Optional[Client] = None    # the client of the Parallel call under way
        self.submit_kwargs = submit_kwargs
        self._init = Initializer.make(initializer, initargs)   # parallel_config(initializer=)
        self._call_init = self._init                            # the call's: Parallel(initializer=)
        self._pending: set = set()

    @property
    def client(self) -> Optional[Client]:
        """The client the work goes to: the given one, else the current one; None if there is
        none yet (a Parallel call then starts one of its own)."""
        from ..client.client import Client
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
        if in_worker():
            return 1
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
        if in_worker():
            # A task's own Parallel call runs in its thread, as joblib's nested calls do: a
            # cluster started inside a worker would oversubscribe the machine.
            raise FallbackToBackend(SequentialBackend(nesting_level=self.nesting_level))
        self.parallel = parallel
        if "initializer" in backend_kwargs:
            self._call_init = Initializer.make(backend_kwargs["initializer"], backend_kwargs.get("initargs", ()))
        if n_jobs == 0:      # before a cluster starts: a refused call must leave none running
            self.effective_n_jobs(n_jobs)
        client = self.client
        if client is None:
            from ..client.client import Client
            # Not the process's current client: another Parallel call made meanwhile (a
            # second generator) would take it for the user's, and lose its work when this
            # call ends and closes it.
            client = self._workers = Client(set_as_default=False)
        self._in_use = client
        try:
            return self.effective_n_jobs(n_jobs)
        except BaseException:
            self.terminate()
            raise

    def submit(self, func: Any, callback: Any = None) -> Any:
        """One batch of calls (joblib's BatchedCalls) as one task."""
        if self._in_use is None:         # used without configure(): as a Parallel call would
            self.configure()
        # The batch is the task's argument, never its function: a function is pickled in the
        # stream (a large array copied, hashed and framed with it), and each worker that runs it
        # keeps it for good, as it keeps every function; each batch would be a function of its
        # own. As an argument, its arrays travel out of band as client.submit(f, array) sends
        # them, and go with the task. joblib's dask backend passes its calls so too.
        future = self._in_use.submit(_run_batch, Batch(func, self._call_init),
                                     key=f"{_batch_name(func)}-{os.urandom(8).hex()}", **self.submit_kwargs)
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
        if isinstance(exc, TaskError) and exc.original is not None:
            # A KeyboardInterrupt or SystemExit raised by a call: joblib (loky) raises it as
            # itself out of Parallel, which is where the user asked for it.
            exc.original.__cause__ = RemoteTraceback(exc.traceback_text)
            raise exc.original
        if exc.__traceback__ is not None:
            # A task's own exception, with its worker-side frames. joblib sets __traceback__
            # to None before raising it: keep them as the cause, as loky does.
            text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            exc.__cause__ = RemoteTraceback(text)
        raise exc

    def abort_everything(self, ensure_ready: bool = True) -> None:
        """joblib gave up (a task failed, a timeout, a generator dropped): cancel what has not
        finished. On a cluster this backend started, stop it at once, running batches with it,
        and start a fresh one if joblib goes on (``with Parallel()``): what loky does with its
        workers. On your own cluster, whose workers may run other work, a running batch stops
        before its next call; a call under way runs to its end."""
        pending = [f for f in list(self._pending) if not f.done()]
        self._pending.clear()
        if pending and self._in_use is not None and self._in_use.status == "running":
            self._in_use.cancel(pending)
        owned, self._workers = self._workers, None
        if owned is None:
            return
        self._in_use = None
        owned.close()
        if ensure_ready:
            self.configure(n_jobs=self.parallel.n_jobs, parallel=self.parallel)

    def terminate(self) -> None:
        """The end of a Parallel call: close the client we started, if we did; the next call
        starts from joblib's default batch size again."""
        self._in_use = None
        self._pending.clear()
        self._call_init = self._init
        self.reset_batch_stats()
        owned, self._workers = self._workers, None
        if owned is not None:
            owned.close()

    def get_nested_backend(self) -> Any:
        return SequentialBackend(nesting_level=(self.nesting_level or 0) + 1), None

    def __reduce__(self) -> Any:
        # never pickle a Client: a backend sent to a worker is a fresh, unconfigured one
        return (LocalClusterBackend, ())


class Initializer:
    """``initializer(*initargs)``, pickled once in the parent, run once per worker process
    before its first batch of a call that names it (as loky runs it once per worker)."""

    def __init__(self, payload: bytes):
        self.payload = payload
        self.token = hashlib.sha256(payload).hexdigest()

    @classmethod
    def make(cls, initializer: Optional[Callable], initargs: tuple) -> Optional["Initializer"]:
        if initializer is None:
            return None
        if not callable(initializer):
            raise TypeError(f"initializer must be callable, got {initializer!r}")
        return cls(cloudpickle.dumps((initializer, tuple(initargs))))

    def run_once(self) -> None:
        with _initializing:
            if self.token in _initialized:
                return
            fn, args = cloudpickle.loads(self.payload)
            fn(*args)
            _initialized.add(self.token)


class Batch:
    """One joblib batch, the argument of its task (pickled by reference: unpickling it registers
    the backend in the worker, so a call inside it may name "localcluster"). It runs the call's
    initializer first, and stops between its calls once joblib has given up on it."""

    def __init__(self, calls: Any, init: Optional[Initializer]):
        self.calls = calls
        self.init = init

    def __call__(self) -> Any:
        if self.init is not None:
            self.init.run_once()
        calls = self.calls
        calls.items = [(UnlessCancelled(fn), args, kwargs) for fn, args, kwargs in calls.items]
        return calls()


def _run_batch(batch: Batch) -> Any:
    """The function of every batch's task (``submit`` says why the batch is its argument)."""
    return batch()


class UnlessCancelled:
    """A call of a batch, skipped once the batch's task is cancelled (joblib aborted)."""

    def __init__(self, fn: Callable):
        self.fn = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if cancelled():
            raise CancelledError("joblib gave up on this Parallel call: the rest of the batch is skipped")
        return self.fn(*args, **kwargs)


def _is_client(obj: object) -> bool:
    from ..client.client import Client
    return isinstance(obj, Client)


def _batch_name(batch: Any) -> str:
    """The task name of a batch: its first function's (``fit_and_score``, not
    ``BatchedCalls``), so a KilledWorker says which work died."""
    items = getattr(batch, "items", None)
    fn = items[0][0] if items else batch
    while isinstance(fn, functools.partial):
        fn = fn.func
    return str(getattr(fn, "__name__", "joblib")).replace("<", "").replace(">", "") or "joblib"


joblib.register_parallel_backend("localcluster", LocalClusterBackend)
