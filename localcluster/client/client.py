"""Client: the user's side of the cluster (Future lives in future.py; wait and as_completed in waiting.py).

A :class:`Future` is a ``concurrent.futures.Future``: ``concurrent.futures.wait``,
``as_completed`` and ``asyncio.wrap_future`` work on it. It becomes done when
its task ends; a small result arrived with it and is unpickled on the first
``result()``, a large one stays on its worker until ``result()`` fetches it.
When the last Future of a key is garbage-collected, the key is released and
its data freed on the workers.
"""
from __future__ import annotations

import concurrent.futures as cf
import contextlib
import itertools
import time
import weakref
from typing import Any, Callable, Iterable, Iterator, Optional

from .. import cluster as _cluster
from . import future as _future
from ..cluster import LocalCluster
from ..config import check_int
from .dask_calls import DaskCalls, become_default, release_default
from .specs import PREFIX
from .transport import GatewayTransport
from ..engine.lifecycle import Phase
from .future import Future
from ..published import NO_DEFAULT, Datasets
from .future import walk as _walk
from . import waiting as _waiting
from .waiting import as_completed, wait  # noqa: F401 - re-exported
from ..worker import actors as _actors
from ..worker import arguments as _arguments
from ..worker.api import ClientApi
from ..worker.future import first_error
from ..worker import client as _in_tasks

__all__ = ["Client", "Future", "wait", "as_completed"]  # the last three re-exported (future.py, waiting.py)

_client_numbers = itertools.count()
def _lookup(client_id: Optional[str]) -> Optional["Client"]:
    """The Client of this process with that id (None: the current one), for worker/client.py."""
    if client_id is None:
        return Client.current(allow_none=True)
    client = _future.client_by_id(client_id)
    return client if isinstance(client, Client) else None


class Client:
    """Submit work to a LocalCluster, and get Futures back.

    Args:
        cluster: the cluster to use; None: the client starts its own ``LocalCluster(**kwargs)``
            and closes it with itself.
        set_as_default: whether this client may be ``Client.current()`` (joblib, the pytest
            plugin and ``get_client()`` outside a task use it) and dask's default scheduler
            while it is open.
        **kwargs: ``LocalCluster`` keywords, when no cluster is given.

    Raises:
        TypeError: both a cluster and LocalCluster keywords.

    Example:
        >>> from localcluster import Client
        >>> with Client(n_workers=1) as client:
        ...     client.gather(client.map(abs, [-1, -2]))
        [1, 2]
    """

    def __new__(cls, cluster: Optional[LocalCluster] = None, *, set_as_default: bool = True, **kwargs: Any) -> Any:
        # In a task, Client() is the worker's client (get_client()), not a cluster started
        # inside the worker: what dask gives a task whose code makes a Client.
        if cluster is None and _in_tasks.in_worker():
            if kwargs:
                raise RuntimeError(
                    f"Client({', '.join(f'{k}=...' for k in kwargs)}) inside a task would start a new cluster "
                    f"inside this worker. Use localcluster.get_client() (or worker_client()) to submit to the "
                    f"cluster that runs the task.")
            return _in_tasks.get_client()
        return super().__new__(cls)

    def __init__(self, cluster: Optional[LocalCluster] = None, *, set_as_default: bool = True, **kwargs: Any):
        if not isinstance(set_as_default, bool):
            raise TypeError(f"Client(set_as_default=...) takes True or False, got {set_as_default!r}")
        if cluster is not None and not isinstance(cluster, LocalCluster):
            raise TypeError(f"Client(cluster=...) takes a LocalCluster, got {type(cluster).__name__}")
        if cluster is not None and kwargs:
            raise TypeError("pass either a LocalCluster or LocalCluster keyword arguments, not both")
        self._owns_cluster = cluster is None
        #: whether Client.current() (and so joblib, the pytest plugin, get_client outside a
        #: task) may return this client: dask's keyword. Set once, before it is registered.
        self.set_as_default = set_as_default
        self.cluster = cluster if cluster is not None else LocalCluster(**kwargs)
        self.id = f"client-{PREFIX}-{next(_client_numbers)}"
        self._closed = False
        self._gateway = _cluster.connect(self.cluster)     # the cluster's internal protocol
        # key -> the state its futures share; told by the cluster how tasks end
        self._table = _future.FutureTable(self, self._gateway)
        self._table.submit_call = self._submit_call   # for wrappers (the Executor): table_of(client)
        self._gateway.attach(self._table)
        # the Client API's calls, written once for this client and a task's (worker/api.py)
        self._api = ClientApi(GatewayTransport(self, self._gateway, self._table, self._check))
        self._dask = DaskCalls(self, self._gateway, self._check, self._api.options)   # the calls only we have
        if set_as_default:      # dask's default scheduler while open, as distributed's Client
            become_default()
            # one garbage-collected without close() gives dask's settings back too
            weakref.finalize(self, release_default)

    @property
    def status(self) -> str:
        """running, closed, or forked (this process is a fork of the cluster's owner)."""
        if self._closed:
            return "closed"
        return "forked" if self._gateway.phase is Phase.FORKED else "running"

    @classmethod
    def current(cls, allow_none: bool = False) -> Optional["Client"]:
        """The most recently created Client of this process that is still running and was
        not made with ``set_as_default=False`` (dask's ``Client.current()``); integrations
        (joblib, the pytest plugin) use it by default.

        Args:
            allow_none: return None rather than raise when there is none.

        Raises:
            ValueError: there is no such Client (and ``allow_none`` is False).
        """
        client = _future.latest_client()
        if client is None and not allow_none:
            raise ValueError("no running localcluster Client in this process: create one with Client()")
        return client  # type: ignore[return-value]  # the Owner a Client of this process registered: itself

    @contextlib.contextmanager
    def as_current(self) -> Iterator["Client"]:
        """Within the block (this thread, this asyncio task), this client is the current one:
        ``get_client()``, ``Client.current()`` and dask's default scheduler use it."""
        token = _future.as_current(self)
        try:
            yield self
        finally:
            _future.as_current(None, token)

    asynchronous = False        #: dask's: this client's calls block and return values, never awaitables

    @property
    def dashboard_link(self) -> None:
        """None: there is no dashboard server (nothing outside the process tree can connect);
        ``cluster.dashboard()`` shows one in Jupyter, ``localcluster.report()`` writes a page."""
        return None

    def futures_of(self, futures: Any) -> list:
        """The Futures in ``futures``: localcluster.futures_of.

        Args:
            futures: a Future, or lists, tuples, sets and dicts of them (nested), or a persisted
                dask collection (its graph's futures).

        Returns:
            A list of the Futures found, each once, in the order met."""
        return _future.futures_of(futures)

    def start(self, **kwargs: Any) -> None:
        """Nothing to do: a Client runs from its creation (dask's asynchronous start)."""

    def register_worker_callbacks(self, setup: Optional[Callable] = None) -> dict:
        """Run ``setup()`` on every worker and every worker started later (dask's older form of
        register_plugin; a ``dask_worker`` parameter is given the worker).

        Args:
            setup: the function; None: nothing is done.

        Returns:
            As ``register_plugin``: ``{worker name: {"status": "OK"}}`` ({} for None).
        """
        if setup is None:
            return {}
        from ..worker.setup import CallbackPlugin
        return self.register_plugin(CallbackPlugin(setup))

    # --- submitting -------------------------------------------------------------------

    def _check(self) -> None:
        if self._closed:
            raise RuntimeError("this Client is closed")
        self._gateway.check_open()           # says what a fork means, or that the cluster is closed

    def submit(self, fn: Callable, /, *args: Any, key: Optional[str] = None, pure: bool = True, retries: int = 0,
               timeout: Optional[float] = None, priority: int = 0, workers: Any = None,
               allow_other_workers: bool = False, resources: Optional[dict] = None, **kwargs: Any) -> Future:
        """Run ``fn(*args, **kwargs)`` on a worker. Futures among the arguments (at any depth of
        lists, tuples and dicts) are replaced by their values, on the worker.

        Args:
            fn: the function; it and its arguments are pickled with cloudpickle.
            key: the task's key; by default the function's name and a hash of the call
                (``pure=True``) or a random token.
            pure: whether the same call gives the same key, so that it runs once.
            retries: how many times the task runs again after it raised.
            timeout: seconds one run may take; past it the worker is stopped and the future
                fails with TaskTimeoutError, saying where the task was.
            priority: higher runs first among the tasks ready.
            workers: a worker name or names the task must run on (dask's meaning).
            allow_other_workers: with ``workers``, they are only preferred.
            resources: what one run holds on its worker, ``{"MEM": 1}``, out of what each
                worker declares (``LocalCluster(resources=)``).
            **kwargs: the function's keyword arguments (dask's ``fifo_timeout`` and ``actor``
                are taken as dask's and never passed to ``fn``).

        Returns:
            The Future of the task.

        Raises:
            TypeError: ``fn`` is not callable, or ``key`` is not a string.
            ValueError: ``resources`` that no worker could ever hold, or unknown ``workers``.

        Example:
            >>> from localcluster import Client
            >>> with Client(n_workers=1) as client:
            ...     client.submit(pow, 2, 10).result()
            1024
        """
        return self._api.submit(fn, args, kwargs, key, pure, retries, timeout, priority, workers,
                                allow_other_workers, resources)

    def _submit_call(self, fn: Callable, args: tuple = (), kwargs: Optional[dict] = None, *,
                    key: Optional[str] = None, pure: bool = True, retries: int = 0,
                    timeout: Optional[float] = None, priority: int = 0, workers: Any = None,
                    allow_other_workers: bool = False, resources: Optional[dict] = None) -> Future:
        """``submit`` with the function's arguments passed explicitly, for wrappers (the
        Executor) whose callers may use keywords such as ``key`` or ``timeout`` for ``fn``."""
        return self._api.submit_call(fn, tuple(args), dict(kwargs or {}), key, pure, retries, timeout, priority,
                                     workers, allow_other_workers, resources)

    def map(self, fn: Callable, /, *iterables: Iterable, key: Any = None, pure: bool = True, retries: int = 0,
            timeout: Optional[float] = None, priority: int = 0, workers: Any = None,
            allow_other_workers: bool = False, resources: Optional[dict] = None, **kwargs: Any) -> list[Future]:
        """``[submit(fn, *args, **kwargs) for args in zip(*iterables)]``, sent in batches.

        Takes ``submit``'s keywords, for every task (``key``: a list of keys, one a task).

        Returns:
            A list of Futures, in the order of the iterables.

        Raises:
            TypeError: ``fn`` is not callable, or no iterable is given.
        """
        return self._api.map(fn, iterables, kwargs, key, pure, retries, timeout, priority, workers,
                             allow_other_workers, resources)

    def scatter(self, data: Any, broadcast: bool = False, workers: Any = None,
                allow_other_workers: bool = False, direct: Any = None, hash: bool = True) -> Any:
        """Put data on the workers, to pass to tasks by its Future.

        Args:
            data: a value, or a list, tuple, set or dict of values (each its own Future).
            broadcast: a copy on each of ``workers`` (or on every worker).
            workers: the worker names to place it on.
            allow_other_workers: any worker when none of ``workers`` is running.
            direct: dask's; accepted: data always goes straight to the workers.
            hash: dask's; accepted: every call makes new keys (equal data is not shared).

        Returns:
            A Future for a value; a list, tuple or dict of Futures for a container.
        """
        return self._api.scatter(data, broadcast, workers, allow_other_workers)

    def gather(self, futures: Any, errors: str = "raise", asynchronous: bool = False,
               timeout: Optional[float] = None) -> Any:
        """The results of futures, in the same nesting of lists, tuples and dicts.

        Args:
            futures: a Future, or (nested) lists, tuples and dicts of them.
            errors: ``"raise"``: the first failed future's exception is raised; ``"skip"``:
                failed ones are left out.
            asynchronous: a coroutine instead, for ``await client.gather(fs,
                asynchronous=True)`` in a running event loop (which it never blocks).
            timeout: seconds for the whole gather.

        Returns:
            The results, nested as ``futures`` were.

        Raises:
            TimeoutError: past ``timeout``, saying how many are not done and why.
            KilledWorker: a task was running in more than ``allowed_failures`` worker deaths.
        """
        _arguments.check_errors("gather", errors)
        if not isinstance(asynchronous, bool):
            raise TypeError(f"gather(asynchronous={asynchronous!r}): expected True or False")
        _waiting.check_timeout("gather", timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        if asynchronous:
            return self._gather_async(futures, errors, timeout, deadline)
        return self._api.gather(futures, errors, timeout, deadline)

    async def _gather_async(self, futures: Any, errors: str, timeout: Optional[float],
                            deadline: Optional[float]) -> Any:
        import asyncio
        loop = asyncio.get_running_loop()
        flat = [f for f in _walk(futures) if isinstance(f, Future)]
        for f in flat:
            if not f.done():
                try:
                    if deadline is None:
                        await f
                    else:
                        await asyncio.wait_for(f, max(0.0, deadline - time.monotonic()))
                except BaseException:  # noqa: BLE001 - gather below raises it, or skips it
                    if not f.done() and deadline is not None and time.monotonic() >= deadline:
                        # why it is late takes the cluster's lock: not on the event loop's thread
                        raise await loop.run_in_executor(None, _waiting.timed_out, "gather", flat, timeout) \
                            from None
                    if not f.done():
                        raise       # this coroutine was cancelled
        if errors == "raise":      # here rather than on the executor's thread: no frames of asyncio's
            error = first_error([s for s in map(self._table.state_of, flat) if s is not None])
            if error is not None:
                raise error
        return await loop.run_in_executor(None, lambda: self._api.gather(futures, errors, timeout, deadline))

    def retry(self, futures: Any, asynchronous: Any = None) -> None:
        """Run these futures' failed tasks again (and first the failed inputs they failed
        with); every future of those keys is pending until its new run ends (dask's ``retry``).
        Futures that did not fail are left as they are.

        Args:
            futures: a Future, or (nested) lists, tuples and dicts of them.
            asynchronous: dask's; accepted and ignored (this call returns at once anyway).

        Raises:
            RuntimeError: this client, or its cluster, is closed.
        """
        self._check()
        keys = [f.key for f in _walk(futures) if isinstance(f, Future) and f.status == "error"]
        if keys:
            self._gateway.retry(list(dict.fromkeys(keys)))

    def replicate(self, futures: Any, n: Optional[int] = None, timeout: Optional[float] = 60.0) -> None:
        """Keep copies of these futures' data on ``n`` workers; returns when they exist.

        Args:
            futures: a Future, or (nested) lists, tuples and dicts of them; waited for first.
            n: how many workers hold a copy (at least 1); None: every worker.
            timeout: seconds to wait for the copies (None: no limit).

        Raises:
            TimeoutError: the copies were not made within ``timeout``.
            RuntimeError: this client, or its cluster, is closed.
        """
        check_int(n, "replicate", "n", lo=1, none="for every worker")
        self._check()
        fs = [f for f in _walk(futures) if isinstance(f, Future)]
        cf.wait(fs, timeout)
        self._gateway.replicate([f.key for f in fs], n, timeout)

    def cancel(self, futures: Any, force: bool = False) -> None:
        """Cancel these futures' tasks and release their data. Always what dask calls
        ``force=True``: the keys are cancelled for every client that holds them.

        Args:
            futures: a Future, or (nested) lists, tuples and dicts of them.
            force: dask's; accepted and ignored (always ``True`` here).
        """
        self._api.cancel(futures)

    def restart(self, timeout: float = 60.0, wait_for_workers: bool = True) -> "Client":
        """Stop every worker, forget every task (pending futures fail with ClusterRestarted),
        and return when fresh workers are up (also with dask's ``wait_for_workers=False``).

        Args:
            timeout: seconds to wait for the fresh workers.
            wait_for_workers: dask's; accepted and ignored (this call always waits).

        Returns:
            This client.

        Raises:
            TimeoutError: the fresh workers were not up within ``timeout``.
            RuntimeError: this client, or its cluster, is closed.
        """
        self._check()
        self.cluster.restart(timeout)
        return self

    def wait_for_workers(self, n_workers: Optional[int] = None, timeout: Optional[float] = 60.0) -> None:
        """Return when at least ``n_workers`` workers are up (dask's name and meaning).

        Args:
            n_workers: how many; None: as many as the cluster keeps.
            timeout: seconds (None: no limit).

        Raises:
            TimeoutError: fewer workers were up after ``timeout`` seconds.
            RuntimeError: this client, or its cluster, is closed.
        """
        self._check()
        self.cluster.wait_for_workers(n_workers, timeout)

    def get_versions(self, check: bool = False) -> dict:
        """The versions of Python and of localcluster's packages here and on each worker.

        Args:
            check: compare them (numpy only where both sides have it).

        Returns:
            ``{"client": {package: version}, "workers": {worker name: {package: version}}}``.

        Raises:
            ValueError: with ``check=True``, a version differs; the message lists each one.
        """
        return self._dask.get_versions(check)

    def run(self, function: Callable, /, *args: Any, workers: Any = None, wait: bool = True, nanny: bool = False,
            on_error: str = "raise", **kwargs: Any) -> Optional[dict]:
        """Call ``function(*args, **kwargs)`` on every worker (or those named by ``workers``)
        now, outside the task slots: a worker whose threads are all busy answers at once.
        Returns ``{worker name: result}``. A worker's error is raised as itself (``on_error=
        "raise"``), put in the dict (``"return"``), or left out (``"ignore"``); a worker that
        dies meanwhile gives KilledWorker, naming the death. An async function is run to its
        end there. ``wait=False``: return None at once, the calls go on (dask's meaning).

        Args:
            function: what to call; its arguments may not hold Futures.
            workers: a worker name or a list of names (as in ``cluster.workers``); None: all.
            wait: wait for the results (else return None at once).
            nanny: dask's; ``True`` raises NotImplementedError (the nanny is no process here).
            on_error: ``"raise"``, ``"return"`` or ``"ignore"``, as above.

        Raises:
            ValueError: ``on_error`` is none of the three, or ``workers`` names no running worker.
            TypeError: ``function`` is not callable, or its arguments hold Futures.
            KilledWorker: a worker died during the call (with ``on_error="raise"``).

        Example:
            >>> import os
            >>> from localcluster import LocalCluster, Client
            >>> with LocalCluster(n_workers=1) as cluster, Client(cluster) as client:
            ...     pids = client.run(os.getpid)
            >>> list(pids)
            ['worker-0']
        """
        return self._api.run(function, args, kwargs, workers, wait, nanny, on_error)

    def who_has(self, futures: Any = None, **kwargs: Any) -> dict[str, tuple]:
        """The workers holding each future's data: key -> tuple of worker names (every key
        the cluster knows when ``futures`` is None), as dask's ``who_has``.

        Args:
            futures: Futures (or lists, dicts, persisted collections of them); None: every key.

        Returns:
            ``{key: (worker name, ...)}``; an empty tuple while no worker holds the data.
        """
        return self._api.who_has(futures)

    def scheduler_info(self, n_workers: int = -1, **kwargs: Any) -> dict:
        """dask's ``scheduler_info()``: the cluster and each worker, keyed by worker name.
        ``n_workers``: at most that many workers (-1: all).

        Raises:
            ValueError: ``n_workers`` is not an int of -1 or more.
            RuntimeError: this client, or its cluster, is closed.
        """
        return self._api.scheduler_info(n_workers)

    def nthreads(self, workers: Any = None, **kwargs: Any) -> dict[str, int]:
        """The task threads of each worker: {worker name: threads} (dask's, keyed by address);
        ``workers``: only these names.

        Raises:
            ValueError: ``workers`` names no running worker.
        """
        return self._dask.nthreads(workers)

    ncores = nthreads       # dask's older name

    def has_what(self, workers: Any = None, **kwargs: Any) -> dict[str, tuple]:
        """The keys whose data each worker holds: {worker name: tuple of keys} (dask's ``has_what``);
        ``workers``: only these names.

        Raises:
            ValueError: ``workers`` names no running worker.
        """
        return self._dask.has_what(workers)

    def processing(self, workers: Any = None) -> dict[str, tuple]:
        """The keys each worker is given to run now: {worker name: tuple of keys} (dask's
        ``processing``); ``workers``: only these names.

        Raises:
            ValueError: ``workers`` names no running worker.
        """
        return self._dask.processing(workers)

    def run_on_scheduler(self, function: Callable, /, *args: Any, **kwargs: Any) -> Any:
        """``function(*args, **kwargs)`` on the scheduler, and its result: here the scheduler is this
        process, so it runs in the calling thread (an async function is run to its end). dask's
        ``dask_scheduler=`` argument is not filled in: there is no dask Scheduler object here.

        Raises:
            TypeError: ``function`` is not callable.
            RuntimeError: an async ``function`` called from a thread that runs an event loop
                already (await it there instead).
            Exception: whatever ``function`` raises, as itself.
        """
        return self._dask.run_on_scheduler(function, args, kwargs)

    def story(self, *keys: Any, on_error: str = "raise") -> list[tuple]:
        """The transitions the scheduler still keeps of these keys (or Futures), oldest first:
        ``[("scheduler", key, start, finish, event)]``: dask's first four fields (dask adds each
        worker's own transitions, recommendations, stimulus ids and times; ours names the event
        that caused each). ``on_error`` is dask's (for asking workers, which here never fails).

        Raises:
            TypeError: a key is neither a str nor a Future.
        """
        return self._dask.story(keys)

    def shutdown(self) -> None:
        """Close this client and its cluster, whether it made the cluster or was given it (dask's
        meaning): every worker stops, and every other client of the cluster can no longer submit.
        Pending futures of every client fail with ClusterClosed. Calling it again is harmless."""
        try:
            self.close()
        finally:
            self.cluster.close()

    # --- datasets and events: shared by every client of the cluster and its tasks -------------

    def publish_dataset(self, *args: Any, name: Any = None, override: bool = False, **kwargs: Any) -> None:
        """Publish values (futures, persisted collections, any picklable object) by name for
        every client of the cluster and every task: ``publish_dataset(ds=df)`` or
        ``publish_dataset(df, name="ds")``. The futures inside stay alive while published.

        Args:
            *args: one value, with ``name``.
            name: the name of the one value in ``args``.
            override: replace a dataset of the same name.
            **kwargs: datasets by name (``ds=df``).

        Raises:
            KeyError: the name is taken and ``override`` is False.
            ValueError: ``name`` with other than one value, or a value without a name.
            TypeError: a value cannot be pickled.
        """
        self._dask.published.publish(args, name, override, kwargs)

    def get_dataset(self, name: Any, default: Any = NO_DEFAULT, **kwargs: Any) -> Any:
        """The dataset published as ``name`` (its futures are this client's).

        Args:
            name: the name it was published under.
            default: returned when there is no such dataset (else a KeyError).

        Raises:
            KeyError: no dataset ``name``, and no ``default`` given; the message lists the names.
        """
        return self._dask.published.get(name, default)

    def list_datasets(self, **kwargs: Any) -> list:
        """The names of the datasets published on the cluster, by any of its clients or tasks.

        Returns:
            A sorted list of names."""
        return self._dask.published.names()

    def unpublish_dataset(self, name: Any, **kwargs: Any) -> None:
        """Forget the dataset ``name``; its futures are let go of unless held elsewhere.

        Args:
            name: the dataset's name (a str, a number or a tuple of them). A name that is not
                published is no error.

        Raises:
            TypeError: ``name`` is of another type."""
        self._dask.published.unpublish(name)

    @property
    def datasets(self) -> Datasets:
        """The published datasets as a dict: read, assign (publish, replacing), ``del``."""
        return Datasets(self._dask.published)

    def log_event(self, topic: Any, msg: Any) -> None:
        """Log ``msg`` (any picklable object) under ``topic`` (or each of a list of topics),
        with the time; every client and task reads it (``get_events``). Worker deaths are
        logged under "all" and the worker's name, with their cause.

        Raises:
            TypeError: ``topic`` is not a str or a list of them, or ``msg`` cannot be pickled.
        """
        self._dask.published.log_event(topic, msg)

    def get_events(self, topic: Optional[str] = None) -> Any:
        """The events logged under a topic (``log_event``, worker deaths), oldest first.

        Args:
            topic: a topic name; None for every topic.

        Returns:
            ``((time, msg), ...)`` for one topic (``time`` in seconds since the epoch); with no
            topic, a dict of those by topic name.

        Raises:
            TypeError: ``topic`` is neither a str nor None."""
        return self._dask.published.get_events(topic)

    def subscribe_topic(self, topic: str, handler: Callable[[tuple], Any]) -> None:
        """Call ``handler((time, msg))`` for each event logged under ``topic`` from now on, in
        order, on a thread of this client's (an async handler is run to its end). One handler
        a topic: a second replaces the first.

        Args:
            topic: the topic's name.
            handler: called with ``(time, msg)`` of each new event.

        Raises:
            TypeError: ``topic`` is not a str, or ``handler`` is not callable.
        """
        self._dask.subscribe_topic(topic, handler)

    def unsubscribe_topic(self, topic: str) -> None:
        """No more calls of ``topic``'s handler once this returns.

        Args:
            topic: the name given to ``subscribe_topic``; a topic with no subscription is no error."""
        self._dask.unsubscribe_topic(topic)

    def get_task_stream(self, start: Any = None, stop: Any = None, count: Optional[int] = None, plot: Any = False,
                        filename: str = "task-stream.html", bokeh_resources: Any = None) -> list:
        """dask's task stream records, one a run the cluster's history keeps (the newest 100,000):
        ``key``, ``worker`` (its name), ``thread``, ``status`` ("OK", "error", or "lost": its worker
        died under it), ``startstops`` (one "compute" span, unix times) and ``nbytes`` while the
        result is in memory. ``start``/``stop``: unix times, or how long ago ("60s"); ``count``:
        the last so many. ``plot`` has no Bokeh figure here: ``localcluster.report`` draws it.

        Args:
            start: only runs ended at or after it; None: from the oldest kept.
            stop: only runs ended at or before it; None: up to now.
            count: at most the last so many runs; None: all.
            plot: must be False.
            filename: dask's (for ``plot``); ignored.
            bokeh_resources: dask's (for ``plot``); ignored.

        Raises:
            NotImplementedError: ``plot`` is true.
            ValueError: ``start``, ``stop`` or ``count`` is not of the kinds above.
        """
        return self._dask.get_task_stream(start, stop, count, plot)

    def nbytes(self, keys: Any = None, summary: bool = True, **kwargs: Any) -> dict:
        """The size of each result in memory: {key: bytes} (``keys``: keys or futures; all when
        None); ``summary=True`` sums them by key prefix (the function's name), as dask's.

        Args:
            keys: a key or Future, or a list of them; None: every result held.
            summary: sum by prefix (the key up to its last ``-``) rather than by key.

        Returns:
            ``{key or prefix: bytes}``.

        Raises:
            RuntimeError: this client, or its cluster, is closed.
        """
        self._check()
        names = None if keys is None else [getattr(k, "key", k) for k in (
            [keys] if isinstance(keys, (str, Future)) else keys)]
        sizes = self._gateway.nbytes(names)
        if not summary:
            return sizes
        totals: dict = {}
        for key, n in sizes.items():
            prefix = key.rsplit("-", 1)[0] if "-" in key else key
            totals[prefix] = totals.get(prefix, 0) + n
        return totals

    def dump_cluster_state(self, filename: str = "dask-cluster-dump", write_from_scheduler: Any = None,
                           exclude: Any = (), format: str = "json", **storage_options: Any) -> str:
        """Write what a post-mortem needs to ``filename`` + ".json" (or ".yaml", or ".msgpack.gz"
        with ``format``): the cluster and its settings, each worker, every task the scheduler
        knows (state, where, inputs, size, error), its recent transitions, every death (cause,
        signal, memory, stack, log tail, message), the newest runs of the task stream, the events
        and each worker's last log lines; ``exclude``: sections to leave out. The format is in
        docs/dask-api.md. Returns the file's path. ``write_from_scheduler`` and
        ``storage_options`` are dask's (a remote scheduler, fsspec): here it is a local file.

        Raises:
            ValueError: ``format`` is not one of those, or ``exclude`` names an unknown section
                (the message lists them).
        """
        return self._dask.dump_cluster_state(filename, exclude, format)

    # --- what every worker runs, those started later too ------------------------------------

    def upload_file(self, filename: str, load: bool = True) -> None:
        """Send a ``.py``, ``.egg``, ``.zip``, ``.whl`` or ``.pyz`` file to every worker, and every
        worker started later, and (``load``) import its modules there; uploading a module again
        replaces it (reloaded), so tasks see the new version.

        Args:
            filename: the file's path here.
            load: import its modules on the workers now (else only make them importable).

        Raises:
            ValueError: the file is of none of those kinds.
            OSError: the file cannot be read.
        """
        self._dask.upload_file(filename, load)

    def register_plugin(self, plugin: Any, name: Optional[str] = None) -> Any:
        """Run a worker plugin (dask's ``WorkerPlugin`` protocol: ``setup(worker)``,
        ``teardown(worker)``, ``transition(key, start, finish)``) on every worker and every worker
        started later, a replacement of a dead one included. ``name`` (else ``plugin.name``):
        a plugin of that name is torn down and replaced. A ``setup`` that raises here raises; at a
        new worker's start it is that worker's start-up failure, told with its traceback.

        A scheduler plugin (dask's ``SchedulerPlugin`` protocol: ``start(scheduler)``,
        ``transition(key, start, finish, stimulus_id=...)``, ``add_worker``, ``remove_worker``,
        ``close()``) runs in this process, where the scheduler is, told in order on the callbacks
        thread (never under the cluster's lock); returns "OK".

        Args:
            plugin: a worker plugin (a ``localcluster.WorkerPlugin``, say) or a scheduler plugin.
            name: the plugin's name; None: ``plugin.name``, or one made up.

        Returns:
            For a worker plugin, ``{worker name: {"status": "OK"}}`` for each worker it was set
            up on now; for a scheduler plugin, ``"OK"``.

        Raises:
            TypeError: ``name`` is not a str, ``plugin`` has none of those methods, or it
                cannot be pickled.
            NotImplementedError: a NannyPlugin (the message says why).
        """
        return self._dask.register_plugin(plugin, name)

    def unregister_worker_plugin(self, name: str, nanny: Any = None) -> dict:
        """Tear the plugin ``name`` down on every worker; workers started later no longer run it.

        Args:
            name: the name it was registered under.
            nanny: dask's; accepted and ignored.

        Returns:
            ``{worker name: {"status": "OK"}}`` for each worker it was torn down on.

        Raises:
            ValueError: no worker plugin of that name is registered.
        """
        return self._dask.unregister_worker_plugin(name)

    def rebalance(self, futures: Any = None, workers: Any = None, **kwargs: Any) -> None:
        """Move data between workers so that each holds about as many bytes of it: these futures'
        (every result held on a worker when None), over these workers (names; all when None).
        Each value moves whole (copied, then the original let go of); returns once moved.
        Useful where a worker nears its own memory_limit while others have room.

        Args:
            futures: Futures (or lists, dicts, persisted collections of them), waited for first.
            workers: a worker name or a list of names; None: every worker.
            **kwargs: ``timeout`` (seconds, default 60); dask's other keywords are ignored.

        Raises:
            TimeoutError: the moves did not finish within ``timeout``.
            ValueError: ``workers`` names no running worker.
            RuntimeError: this client, or its cluster, is closed.
        """
        self._check()
        keys = None if futures is None else list(dict.fromkeys(f.key for f in _future.futures_of(futures)))
        names = None if workers is None else self._gateway.check_worker_names(workers)
        fs = [f for f in _walk(futures) if isinstance(f, Future)] if futures is not None else []
        cf.wait(fs, kwargs.get("timeout"))
        self._gateway.rebalance(keys, names, kwargs.get("timeout", 60.0))

    def retire_workers(self, workers: Optional[list] = None, close_workers: bool = True, **kwargs: Any) -> dict:
        """Let these workers go (names, as in cluster.workers): each takes no new task, finishes
        what it runs, hands the data only it holds to the others (nothing is computed again),
        then exits; the cluster is that much smaller. Returns {name: its scheduler_info entry}
        once they are gone.

        Args:
            workers: a worker name or a list of names (as in ``cluster.workers``); required.
            close_workers: must be True (a worker kept without work has no use here).
            **kwargs: ``timeout`` (seconds, default 60); dask's other keywords are ignored.

        Raises:
            ValueError: ``workers`` is None, or names no running worker.
            NotImplementedError: ``close_workers=False``.
        """
        return self._dask.retire_workers(workers, close_workers, kwargs)

    def restart_workers(self, workers: list, timeout: Any = 60.0, raise_for_error: bool = True) -> dict:
        """Restart these workers: each exits now and a fresh one (a new name: names are never
        reused) takes its place; what it held is computed again where needed, as after a death,
        with no blame. Returns {old name: "OK"} once the new ones are up.

        Args:
            workers: a worker name or a list of names (as in ``cluster.workers``).
            timeout: seconds (or a duration such as ``"30s"``) to wait for the new workers.
            raise_for_error: dask's; accepted and ignored.

        Raises:
            ValueError: ``workers`` names no running worker.
        """
        return self._dask.restart_workers(workers, timeout)

    def get_worker_logs(self, n: Optional[int] = None, workers: Any = None) -> dict[str, list]:
        """Each worker's last ``n`` log lines, dead workers included; ``workers``: only these names.

        Args:
            n: how many lines of each worker; None: all kept.
            workers: a worker name or a list of names; None: every worker. Unknown names are
                left out (a dead worker's name is known).

        Returns:
            ``{worker name: [line, ...]}``, oldest line first.
        """
        return self._dask.get_worker_logs(n, workers)

    def dump_stacks(self, worker: Optional[str] = None) -> dict[str, str]:
        """Live stacks of every thread of every worker (or one), without stopping them.

        Args:
            worker: one worker's name; None: every worker.

        Returns:
            ``{worker name: text}``, as ``LocalCluster.dump_stacks``.
        """
        return self.cluster.dump_stacks(worker)

    def recreate_error_locally(self, future: Future) -> Any:
        """Run the task of a failed ``future`` again in this process, with the same arguments, so that
        a debugger can step into it; a task that crashed its worker runs in a throwaway process
        instead, and its death is raised as ReplayedDeath.

        Args:
            future: a Future; waited for if still pending.

        Returns:
            What the task returns this time, run here (None from a throwaway process); mostly
            it raises its error again instead.

        Raises:
            ValueError: ``future`` did not fail.
            ReplayedDeath: the task killed (or outlasted) the throwaway process too.
        """
        from ..integrations.replay import recreate_error_locally
        return recreate_error_locally(self, future)

    def get(self, dsk: Any, keys: Any, **kwargs: Any) -> Any:
        """Run a dask task graph and return the values of ``keys`` (nested as given):
        ``dask.compute(x, scheduler=client.get)`` or ``dask.config.set(scheduler=client.get)``.

        Args:
            dsk: the graph: a dict, a HighLevelGraph, or anything with ``__dask_graph__``.
            keys: a key, or (nested) lists of keys.
            **kwargs: ``retries``, ``timeout``, ``priority``, ``workers`` and
                ``allow_other_workers`` apply to every task (as in ``submit``); others are ignored.

        Raises:
            Exception: a task's exception, as itself.
            KilledWorker: a task was given up after its workers died.
        """
        from ..integrations.daskgraph import get
        return get(self, dsk, keys, **kwargs)

    def compute(self, collections: Any, sync: bool = False, optimize_graph: bool = True, workers: Any = None,
                allow_other_workers: bool = False, retries: int = 0, priority: int = 0, traverse: bool = True,
                **kwargs: Any) -> Any:
        """dask collections (delayed, array, bag, dataframe) computed on the cluster: a Future
        for each (a list for a list), or their values with ``sync=True``. ``traverse``: lists,
        tuples, sets and dicts are wrapped in ``dask.delayed`` (dask's meaning); ``kwargs`` go
        to dask's graph optimizations, as in dask.

        Args:
            collections: a dask collection, or a list of them.
            sync: return the values rather than Futures.
            optimize_graph: run dask's graph optimizations first.
            workers: worker names to run on (as in ``submit``).
            allow_other_workers: any worker when none of ``workers`` is running.
            retries: runs again of a task that raised (as in ``submit``).
            priority: higher runs first (as in ``submit``).
            traverse: look inside lists, tuples, sets and dicts for collections.
        """
        options = dict(workers=workers, allow_other_workers=allow_other_workers, retries=retries, priority=priority)
        return self._dask.compute(collections, sync, optimize_graph, options, traverse, kwargs)

    def persist(self, collections: Any, optimize_graph: bool = True, workers: Any = None,
                allow_other_workers: bool = False, retries: int = 0, priority: int = 0, **kwargs: Any) -> Any:
        """dask collections computing on the cluster in the background: each the same collection,
        now backed by Futures of its keys (a list for a list); its data stays on the workers
        for as long as it lives. ``kwargs`` go to dask's graph optimizations, as in dask.

        Args:
            collections: a dask collection, or a list of them.
            optimize_graph: run dask's graph optimizations first.
            workers: worker names to run on (as in ``submit``).
            allow_other_workers: any worker when none of ``workers`` is running.
            retries: runs again of a task that raised (as in ``submit``).
            priority: higher runs first (as in ``submit``).
        """
        options = dict(workers=workers, allow_other_workers=allow_other_workers, retries=retries, priority=priority)
        return self._dask.persist(collections, optimize_graph, options, kwargs)

    def get_executor(self, **submit_kwargs: Any) -> Any:
        """A ``concurrent.futures.Executor`` whose ``submit`` and ``map`` run on this cluster;
        ``submit_kwargs`` (``workers``, ``resources``, ``retries``, ...) apply to every task.

        Example:
            >>> from localcluster import LocalCluster, Client
            >>> with LocalCluster(n_workers=1) as cluster, Client(cluster) as client:
            ...     with client.get_executor() as executor:
            ...         print(list(executor.map(abs, [-1, -2])))
            [1, 2]
        """
        from ..integrations.executor import ClusterExecutor
        return ClusterExecutor(self, **submit_kwargs)

    # --- dask's calls that have no meaning on one machine: each says what to use instead ------

    @property
    def amm(self) -> Any:
        """dask.distributed's ``amm``, which has no counterpart here.

        Raises:
            NotImplementedError: always; the message says what to use instead.
        """
        raise _not_here("Client.amm", "there is no Active Memory Manager: each worker spills to disk past "
                        "memory_target and the cluster replaces a worker killed for memory; client.replicate() "
                        "keeps copies, retire_workers() hands data on")

    @property
    def loop(self) -> Any:
        """dask.distributed's ``loop``, which has no counterpart here.

        Raises:
            NotImplementedError: always; the message says what to use instead.
        """
        raise _not_here("Client.loop", "this client runs no event loop: its calls block, and a Future is "
                        "awaitable in any asyncio loop (await future)")

    def sync(self, func: Callable, *args: Any, asynchronous: Any = None, callback_timeout: Any = None,
             **kwargs: Any) -> Any:
        """dask.distributed's ``sync``, which has no counterpart here.

        Raises:
            NotImplementedError: always; the message says what to use instead.
        """
        raise _not_here("Client.sync", "there is no event loop of the client's to run a coroutine on: call the "
                        "function yourself (asyncio.run for a coroutine)")

    def benchmark_hardware(self) -> dict:
        """dask.distributed's ``benchmark_hardware``, which has no counterpart here.

        Raises:
            NotImplementedError: always; the message says what to use instead.
        """
        raise _not_here("Client.benchmark_hardware", "every worker shares this machine's memory, disk and no "
                        "network: time your own code with cluster.insights() or localcluster.report()")

    def call_stack(self, futures: Any = None, keys: Any = None) -> dict:
        """dask.distributed's ``call_stack``, which has no counterpart here.

        Raises:
            NotImplementedError: always; the message says what to use instead.
        """
        raise _not_here("Client.call_stack", "client.dump_stacks() gives every thread's live stack on each "
                        "worker, client.processing() the keys each one runs")

    def profile(self, key: Any = None, start: Any = None, stop: Any = None, workers: Any = None,
                merge_workers: bool = True, plot: Any = False, filename: Any = None, server: bool = False,
                scheduler: bool = False) -> Any:
        """dask.distributed's ``profile``, which has no counterpart here.

        Raises:
            NotImplementedError: always; the message says what to use instead.
        """
        raise _not_here("Client.profile", "there is no sampling profiler: cluster.insights() tells where each "
                        "worker's time went and the slowest tasks; run a task under cProfile in it for more")

    def forward_logging(self, logger_name: Any = None, level: int = 0) -> None:
        """dask.distributed's ``forward_logging``, which has no counterpart here.

        Raises:
            NotImplementedError: always; the message says what to use instead.
        """
        raise _not_here("Client.forward_logging", "the workers' log records are forwarded already, to the "
                        "'localcluster.worker' logger here (LocalCluster(forward_logs=...), silence_logs=)")

    def unforward_logging(self, logger_name: Any = None) -> None:
        """dask.distributed's ``unforward_logging``, which has no counterpart here.

        Raises:
            NotImplementedError: always; the message says what to use instead.
        """
        raise _not_here("Client.unforward_logging", "LocalCluster(forward_logs=False) forwards nothing")

    def get_scheduler_logs(self, n: Optional[int] = None) -> list:
        """dask.distributed's ``get_scheduler_logs``, which has no counterpart here.

        Raises:
            NotImplementedError: always; the message says what to use instead.
        """
        raise _not_here("Client.get_scheduler_logs", "the scheduler is this process: it logs to the "
                        "'localcluster' logger here; client.story(key) tells what happened to a task")

    def get_metadata(self, keys: Any, default: Any = None) -> Any:
        """dask.distributed's ``get_metadata``, which has no counterpart here.

        Raises:
            NotImplementedError: always; the message says what to use instead.
        """
        raise _not_here("Client.get_metadata", "use publish_dataset / get_dataset, or a localcluster.Variable, "
                        "which every client and task of the cluster sees")

    def set_metadata(self, key: Any, value: Any) -> None:
        """dask.distributed's ``set_metadata``, which has no counterpart here.

        Raises:
            NotImplementedError: always; the message says what to use instead.
        """
        raise _not_here("Client.set_metadata", "use publish_dataset / get_dataset, or a localcluster.Variable, "
                        "which every client and task of the cluster sees")

    def normalize_collection(self, collection: Any) -> Any:
        """dask.distributed's ``normalize_collection``, which has no counterpart here.

        Raises:
            NotImplementedError: always; the message says what to use instead.
        """
        raise _not_here("Client.normalize_collection", "persist() the collection and use what it returns: its "
                        "graph is the futures of the keys computed")

    def unregister_scheduler_plugin(self, name: str) -> None:
        """Remove the scheduler plugin ``name`` (its ``close()`` runs).

        Raises:
            ValueError: no scheduler plugin of that name is registered.
        """
        self._dask.unregister_scheduler_plugin(name)

    def write_scheduler_file(self, scheduler_file: str) -> None:
        """dask.distributed's ``write_scheduler_file``, which has no counterpart here.

        Raises:
            NotImplementedError: always; the message says what to use instead.
        """
        raise _not_here("Client.write_scheduler_file", "no process outside this one can connect to the "
                        "scheduler (it listens on no socket): pass the Client, or submit from tasks with "
                        "get_client()")

    def close(self) -> None:
        """Let go of every future of this client; a cluster the client started is closed with it.
        Closing twice is harmless."""
        if self._closed:
            return
        self._closed = True
        self._dask.close()
        if self.set_as_default:      # the previous Client is dask's default again, or dask's own setting
            release_default()
        if self._owns_cluster:
            self.cluster.close()

    def __copy__(self) -> "Client":
        return self

    def __reduce__(self) -> tuple:
        """A Client pickled into a task is that worker's client there (get_client()), as in
        dask; unpickled in this process, it is itself again."""
        return (_in_tasks.client_in_task, (self.id,))

    def __deepcopy__(self, memo: dict) -> "Client":
        """A Client is a handle on a live cluster: a copy is itself. ``copy.deepcopy(dask.config)``
        then works with ``scheduler=client.get`` set (a bound method deep-copies its object)."""
        return self

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Client {self.status} cluster={self.cluster!r}>"

    def _repr_html_(self) -> str:
        head = f'<div style="font-weight:600">Client {self.id} ({self.status})</div>'
        return head + self.cluster._repr_html_()

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> Optional[dict]:
        """In a Jupyter kernel with ipywidgets: the cluster's live dashboard."""
        return self.cluster._repr_mimebundle_(include, exclude)


def _not_here(call: str, why: str) -> NotImplementedError:
    return NotImplementedError(f"{call} is dask.distributed's and has no localcluster counterpart: {why} "
                               f"(docs/dask-api.md lists every name).")


def _actor_call(client: Client, fn: Callable, args: tuple, key: str, worker: str, what: str) -> Any:
    """An actor's call through ``client``'s cluster (worker/actors.py)."""
    return _future.gateway_of(client).actor_call(fn, args, key, worker, what)


_in_tasks.install_parent(_lookup)
_actors.install_parent(_actor_call)      # get_client() outside a task, and a Client unpickled here
