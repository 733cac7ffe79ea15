"""Future: the result of a task (``wait`` and ``as_completed`` are in waiting.py).

A :class:`Future` is a ``concurrent.futures.Future``: ``concurrent.futures.wait``,
``as_completed`` and ``asyncio.wrap_future`` work on it. It becomes done when its
task ends; a small result arrived with it and is unpickled on the first
``result()``, a large one stays on its worker until ``result()`` fetches it.
When the last Future of a key is garbage-collected, the key is released and its
data freed on the workers.

A Future is a handle: what it stands for is its ``FutureState``, which every Future of the
same key of one client shares (dask's FutureState), kept by that client's
:class:`FutureTable` (key -> state; the cluster tells the table how tasks end). The state
machine and what every future does with it are worker/future.py's, the same for a task's
futures; here is what only the user's process adds: the table as the futures' Holder
(waiting with the Gateway, fetching data left on a worker, reading the journal), and the
Future's dask extras (callbacks off the scheduler thread, ``await``, ``retry``, ``type``).
The protocol between the client, its futures and the cluster lives on the table and on the
functions here (``table_of``, ``gateway_of``), never on the Future or the Client a user
holds. The client is typed by :class:`Owner`, declared here, so this module never imports
client.py (which sits above it).
"""
from __future__ import annotations

import concurrent.futures as cf
import contextvars
import functools
import os
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Optional, Protocol, cast

import weakref

from ..death import LostDataError, TransferError
from ..engine.lifecycle import Phase
from ..journal import InJournal
from ..wire import serialize
from ..worker import api as _api, arguments as _arguments, future as _future
from ..worker.future import FutureState
from ..worker.holding import KeyTable

__all__ = ["Future", "fire_and_forget"]

if TYPE_CHECKING:
    from ..gateway import Gateway


class Owner(Protocol):
    """What this module uses of the Client a table belongs to (``client.Client`` is one):
    declared here, below client.py, so that this module never imports it."""
    @property
    def id(self) -> str: ...

    @property
    def status(self) -> str: ...        # running, closed, or forked

    @property
    def set_as_default(self) -> bool: ...   # False: never the current client

    def retry(self, futures: Any, asynchronous: Any = None) -> None: ...

    def submit(self, fn: Callable, /, *args: Any, **kwargs: Any) -> "Future": ...

    def cancel(self, futures: Any, force: bool = False) -> None: ...


# Each client's table by the client's id: a Future pickled in this process names its
# client, and comes back to it; the protocol between a client, its futures and its cluster
# is found here, never on the Client or the Future a user holds.
_tables: "weakref.WeakValueDictionary[str, FutureTable]" = weakref.WeakValueDictionary()


def table_of(client: Any) -> "FutureTable":
    """The futures table of ``client`` (a Client of this process, or its id).

    Raises:
        ValueError: no Client of this process has that id (any more).
    """
    table = _tables.get(client if isinstance(client, str) else client.id)
    if table is None:
        raise ValueError(f"{client!r} is not a Client of this process (a task's client has no futures table)")
    return table


def state_of(fut: "Future") -> "Optional[FutureState]":
    """The state ``fut`` shares with the other Futures of its key, as its client's table
    holds it (None once the key is released)."""
    table = _tables.get(fut.client.id)
    return None if table is None else table.state_of(fut)


def gateway_of(client: Any) -> Gateway:
    """The cluster's internal protocol (gateway.py) as ``client`` (a Client of this process) holds it."""
    return table_of(client).gateway


# True in a child forked from this process: every client here is then inert, and a wait on
# one of its pending futures would never end (_refuse_in_fork).
_in_forked_child = False


def _after_fork_in_child() -> None:
    global _in_forked_child
    _in_forked_child = True
    for table in list(_tables.values()):      # kept: each says, through its gateway, what a fork means
        table.after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def client_by_id(client_id: str) -> Optional[Owner]:
    """The client of this process with that id, if it is still alive."""
    table = _tables.get(client_id)
    return None if table is None else table.client


# Client.as_current(): the client that is current in this context, whichever was made last
_as_current: "contextvars.ContextVar[Optional[Owner]]" = contextvars.ContextVar("localcluster_current", default=None)


def as_current(client: Optional[Owner], token: Any = None) -> Any:
    """Client.as_current: make ``client`` current here (returns the token to undo it), or
    (``token``) undo it."""
    if token is not None:
        _as_current.reset(token)
        return None
    return _as_current.set(client)


def latest_client() -> Optional[Owner]:
    """The client made current by ``Client.as_current()`` here, else the most recently created
    Client of this process that is still running and may be the default one, if any."""
    chosen = _as_current.get()
    if chosen is not None and chosen.status == "running":
        return chosen
    for table in reversed(list(_tables.values())):
        client = table.client
        if client.set_as_default and client.status == "running":
            return client
    return None


class FutureTable(KeyTable[FutureState]):
    """A client's futures by key (dask's futures table): the one state the Futures of a key
    share, and how many there are (worker/holding.py's KeyTable, as a task's client keeps
    its own). The cluster tells it how tasks end (``resolve``, ``fail_pending``: the
    Dispatcher's Listener); the last Future of a key to go releases the key. Its client
    finds it by ``table_of``; a user never reaches it."""

    def __init__(self, client: Owner, gateway: Gateway):
        super().__init__(FutureState)
        self.client = client
        self.gateway = gateway
        #: the client's submit with the function's arguments passed explicitly, for wrappers
        #: (the Executor) whose callers may use keywords such as ``key`` or ``timeout`` for it
        self.submit_call: Optional[Callable[..., Future]] = None
        _tables[client.id] = self

    def hold(self, key: str) -> tuple["Future", bool]:
        """A new Future of ``key``, and whether this client held no future of the key until now."""
        state, first = self.take(key)
        return Future(key, state=state), first

    def hold_many(self, keys: Iterable[str]) -> tuple[list, dict]:
        """New Futures of ``keys`` under one lock (a whole ``map``), and {key: how many of them}
        for those whose key this client held already (or held by one made before them here):
        the scheduler counts a client once a key, as the client lets a key go once, when its
        last future goes."""
        return self.take_many(keys, Future)

    def state_of(self, fut: "Future") -> Optional[FutureState]:
        """The state ``fut`` shares with the other Futures of its key (None: not this client's,
        or released)."""
        return self.states.get(fut.key) if fut.client is self.client else None

    def let_go(self, key: str) -> bool:
        """A Future of ``key`` was garbage-collected or released; the last one releases the key
        (True). Runs inside the garbage collector, on any thread: hand the key off, never block."""
        if self.gateway.phase is Phase.FORKED:      # the parent's client holds the key
            return False
        last = super().let_go(key)
        if last:
            self.gateway.release(key)
        return last

    def resolve(self, key: str, status: str, value: Any) -> None:
        """The cluster says how ``key``'s task ended: finished (value: the payload, or None
        while the data stays on a worker), error or lost (value: the exception), cancelled;
        or that a failed task runs again (retrying: its futures are pending again)."""
        state = self.states.get(key)
        if state is None or (status != "retrying" and state.state in _future.ENDED):
            return
        if status in ("error", "lost"):
            value = serialize.as_exception(value, key)
        state.conclude(status, value)

    def fail_pending(self, exc: BaseException) -> None:
        """Fail every pending future of this client with ``exc`` (restart, close, the cluster
        broke), taking the lock once for all those that nobody watches."""
        with self.lock:
            states = list(self.states.values())
        _future.fail_all(states, exc)

    def after_fork(self) -> None:
        """In a child forked from this process: inert (its cluster is in Phase.FORKED; lifecycle.py).
        The lock is new: a thread of the parent may have held it at the fork."""
        self.lock = threading.RLock()

    # --- what a Future asks of its client (worker/future.py's Holder) ----------------------

    def wait_here(self, state: FutureState, deadline: Optional[float]) -> None:
        if not _in_forked_child:
            self.gateway.wait_here(state.key, state.done, state.watch, deadline)

    def wait(self, state: FutureState, timeout: Optional[float]) -> bool:
        if _in_forked_child and self.client.status == "forked":
            self.gateway.check_open()       # raises, saying why: the parent's client never ends it here
        return state.wait(timeout)

    def ended(self, state: FutureState) -> bool:
        return False        # the cluster tells this table (resolve): nothing to ask

    def watched(self, state: FutureState) -> None:
        """Nothing to do: the cluster ends every key this table holds."""

    def why_pending(self, key: str) -> str:
        return self.gateway.why_pending(key)

    def materialize(self, state: FutureState, kept: Any, deadline: Optional[float],
                    timeout: Optional[float]) -> Any:
        """The value of the finished key, unpickled once (fetched first if its data is on a
        worker, read if it is in the journal), by ``deadline``; ``timeout``: the caller's,
        for the message."""
        if state.result is not kept:      # another thread got there first
            return state.result
        payload = kept
        if payload is _future.ON_WORKER:
            payload = self._fetch(state, deadline, timeout)
        if type(payload) is InJournal:     # read here; computed again if its entry is damaged
            value = payload.load()
        else:
            value = self._unpickled(state.key, payload)
        return state.swap(kept, value)

    def _fetch(self, state: FutureState, deadline: Optional[float], timeout: Optional[float]) -> Any:
        fetching = None
        try:
            fetching = self.gateway.fetch([state.key])[0]
            return fetching.result(None if deadline is None else max(0.0, deadline - time.monotonic()))
        except cf.TimeoutError:
            if fetching is None or fetching.done():
                raise
            raise cf.TimeoutError(f"result(timeout={timeout:g}) timed out: task {state.key!r} is done, but "
                                  f"fetching its data from the worker took longer") from None
        except LostDataError as e:
            state.lost = e
            raise

    @staticmethod
    def _unpickled(key: str, payload: Any) -> Any:
        try:
            return serialize.loads(payload)
        except TransferError as e:      # checked as it landed here: a bug of this process's
            raise TransferError(key, "kept for the client", e.detail) from None
        except Exception as e:
            step = f"unpickling the result of task {key!r} in the client failed"
            raise serialize.serialization_error(e, step) from None

    def reduce(self, key: str) -> tuple:
        return serialize.future_reduce(key, self.client.id)


class Future(_future.Future):
    """The result of a task, computed on the cluster."""

    def __init__(self, key: str, client: Any = None, state: Optional[FutureState] = None):
        # ``Future(key, client)``: one more Future of a key the client holds
        if state is None:
            if client is None:
                raise TypeError("Future(key, client): a Future belongs to a Client")
            state = table_of(client).take(key)[0]
        # the two fields of worker/future.py's Future, set here: a map makes one Future a task
        self.key = key
        self._s = state

    @property
    def _gateway(self) -> Gateway:
        """The cluster as a future sees it: callbacks, fetch."""
        return cast(FutureTable, self._s.table).gateway     # a Client's Future is held by its FutureTable

    def add_done_callback(self, fn: Callable) -> None:
        """As concurrent.futures, except that a callback is never run on the scheduler
        thread: there, a ``result()`` that must fetch data from a worker would wait on the
        very thread that delivers it.

        Args:
            fn: called with this Future once it ends (at once if it has ended already).
        """
        gateway = self._gateway

        def call(fut: Any) -> None:     # this Future
            _called_back.discard(fut)
            if gateway.on_scheduler_thread():
                gateway.run_callback(fn, fut)
            else:
                fn(fut)
        if not self.done():     # kept until it ends, as an executor keeps its futures
            _called_back.add(self)
        super().add_done_callback(call)

    def __await__(self) -> Any:
        """``await future`` inside a running event loop: its result, or its exception raised.
        The loop is never blocked: data left on a worker is fetched on a thread. Cancelling
        the awaiting task does not cancel the cluster's task (dask's meaning); ``await
        asyncio.wrap_future(future)`` does, asyncio's meaning."""
        return self._awaited().__await__()

    async def _awaited(self) -> Any:
        import asyncio
        loop = asyncio.get_running_loop()
        if not self.done():
            waiter = loop.create_future()

            def wake(_fut: cf.Future) -> None:   # on the scheduler thread: hand over, never block
                try:
                    loop.call_soon_threadsafe(lambda: waiter.done() or waiter.set_result(None))
                except RuntimeError:     # the loop is closed: nobody is waiting any more
                    pass
            cf.Future.add_done_callback(self, wake)
            await waiter
        if self._s.needs_fetch():
            return await loop.run_in_executor(None, self.result)
        # raised here, not in result(): one frame of ours above the task's, not two
        error = self._s.stored_error()
        if error is not None:
            raise error
        return self.result()

    def retry(self, **kwargs: Any) -> None:
        """Run this future's task again if it failed (and first the failed inputs it failed
        with): the future is pending again until the new run ends (dask's ``Future.retry``).
        A future that did not fail is left as it is.

        Args:
            **kwargs: dask's; accepted and ignored.

        Raises:
            RuntimeError: its client, or the cluster, is closed.
        """
        self.client.retry([self])

    @property
    def type(self) -> Any:
        """The type of the task's result once it finished, else None (dask's ``Future.type``).
        A result left on its worker is not fetched for it: its type is read there."""
        if self.status != "finished":
            return None
        if self._s.needs_fetch():
            return self.client.submit(type, self).result()
        return type(self.result())

    @property
    def executor(self) -> Owner:
        """The client that runs this future's task (dask's name for it, as concurrent.futures')."""
        return self.client

    def bind_client(self, client: Any) -> None:
        """dask.distributed's ``Future.bind_client``, which has no counterpart here.

        Raises:
            NotImplementedError: always; a Future is bound to its client from the start.
        """
        raise NotImplementedError("Future.bind_client is dask.distributed's: a localcluster Future is bound to "
                                  "its client from the start, and one unpickled in this process comes back to "
                                  "its client by itself (docs/dask-api.md lists every name).")

    def substitute(self, subs: dict, key: Any = None) -> Any:
        """dask's graph machinery (a Future as a TaskRef), which has no counterpart here.

        Raises:
            NotImplementedError: always; ``client.compute`` / ``persist`` take Futures in graphs.
        """
        raise NotImplementedError("Future.substitute is dask's graph machinery (a Future as a TaskRef): a "
                                  "localcluster Future in a dask graph is handled by client.compute / persist "
                                  "(docs/dask-api.md lists every name).")

    def _repr_html_(self) -> str:
        from ..views.render import future_view
        status = self.status
        detail = ""
        if status in ("error", "lost"):
            exc = self.exception()
            detail = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return future_view(self.key, status, detail)


def walk(obj: Any) -> Iterator[Future]:
    """The Futures in (nested lists, tuples, sets and dicts of) ``obj``."""
    return _arguments.walk(obj, Future)


def futures_of(obj: Any) -> list:
    """The Futures in ``obj``: a Future, nested lists, tuples, sets and dicts of them, or a
    dask collection persisted on the cluster (its graph's Futures), without repeats. In a
    task, the futures of its client (``get_client()``) too, as dask's does."""
    return _api.futures_in(obj, _future.Future)


# Futures handed to fire_and_forget and not done yet: held here, so that dropping every
# other reference does not release (and so cancel) their tasks. Each lets go when it ends.
_forgotten: set = set()
# Futures with a done-callback, not done yet: dropping the future must not release its
# task before the callback runs (``client.submit(f).add_done_callback(log)``).
_called_back: set = set()


def fire_and_forget(obj: Any) -> None:
    """Run these futures' tasks to completion even when the caller drops every reference to
    them (dask's ``fire_and_forget``): for tasks run for their side effects. ``obj``: a
    Future, a collection of them, or a persisted dask collection. Their results are not
    kept once they end, unless another Future still holds them.

    Raises:
        NotImplementedError: for a future made in a task (``get_client()`` there), which its
            task's client cannot keep past the task.
    """
    futures = futures_of(obj)
    made_in_a_task = [f.key for f in futures if not isinstance(f, Future)]
    if made_in_a_task:
        raise NotImplementedError(
            f"fire_and_forget() in a task, of {made_in_a_task[0]!r}: a future made in a task is "
            f"held by the task only. Return it from the task (your Client then holds it, and can "
            f"fire_and_forget it), or wait for it before the task ends")
    for fut in futures:
        if fut.done():
            continue
        _forgotten.add(fut)
        cf.Future.add_done_callback(fut, _forgotten.discard)    # set.discard: cheap on the scheduler thread


_adopting = threading.local()        # .table: the table of the client that unpickles futures on this thread


def loads_for(client: Any, payload: Any) -> Any:
    """``payload`` unpickled with every Future in it made a Future of ``client``, whichever
    client pickled it (a dataset published by another client, closed since, is this one's)."""
    _adopting.table = table_of(client)
    try:
        return serialize.loads(payload)
    finally:
        _adopting.table = None


def _from_pickle(key: str, client_id: Optional[str]) -> Future:
    """A Future unpickled in this process (pickled by the user): back to its client, which
    holds the key once more for it."""
    table = getattr(_adopting, "table", None) or (_tables.get(client_id) if client_id else None)
    fut = None
    if table is not None and table.client.status == "running":
        fut = table.gateway.acquire(key, functools.partial(table.hold, key))
    elif client_id is None or client_id.startswith("task-client-"):
        # made in a task (get_client on a worker: no Client of this process made it): the
        # Future of the key of a running Client whose cluster knows it, the latest first
        for table in reversed(list(_tables.values())):
            if table.client.status == "running":
                fut = table.gateway.acquire(key, functools.partial(table.hold, key))
                if fut is not None:
                    break
    if fut is None:
        raise ValueError(f"future {key!r} is not known to a running Client (its client "
                         f"{client_id!r} is closed, or the key was released)")
    return fut


serialize.install_futures(Future, _from_pickle)


def _refuse_in_fork(fut: cf.Future) -> None:
    """In a forked child, a pending future of the parent's client is never resolved: say why."""
    if isinstance(fut, Future) and not fut.done() and fut.client.status == "forked":
        gateway_of(fut.client).check_open()


def refuse_in_fork(fs: Iterable) -> None:
    """A wait for ``fs`` in a child forked from this process: a pending future of the parent's
    client would never be resolved there, so the wait raises at once, saying why (waiting.py)."""
    if _in_forked_child:
        for f in fs:
            _refuse_in_fork(f)
