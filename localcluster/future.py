"""Future: the result of a task (``wait`` and ``as_completed`` are in waiting.py).

A :class:`Future` is a ``concurrent.futures.Future``: ``concurrent.futures.wait``,
``as_completed`` and ``asyncio.wrap_future`` work on it. It becomes done when its
task ends; a small result arrived with it and is unpickled on the first
``result()``, a large one stays on its worker until ``result()`` fetches it.
When the last Future of a key is garbage-collected, the key is released and its
data freed on the workers (``Client.untrack``).

The client ends its futures through their own methods (``settle``, ``Future.fail_all``)
and reads what they hold the same way (``stored_error``, ``needs_fetch``, ``prefill``):
nothing outside a Future touches its fields. Its client is typed by :class:`Owner`,
declared here, so this module never imports client.py (which sits above it).
"""
from __future__ import annotations

import concurrent.futures as cf
import contextvars
import functools
import os
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional, Protocol

import weakref

from .death import TransferError
from .journal import InJournal
from .wire import protocol as P, remote, serialize

__all__ = ["Future", "fire_and_forget"]

if TYPE_CHECKING:
    from .gateway import Gateway


class Owner(Protocol):
    """What a Future and this module use of the client that made it (``client.Client`` is
    one): declared here, below client.py, so that this module never imports it."""
    @property
    def id(self) -> str: ...

    @property
    def status(self) -> str: ...        # running, closed, or forked

    @property
    def set_as_default(self) -> bool: ...   # False: never the current client

    @property
    def gateway(self) -> Gateway: ...

    def track(self, fut: "Future") -> bool: ...

    def retry(self, futures: Any, asynchronous: Any = None) -> None: ...

    def submit(self, fn: Callable, /, *args: Any, **kwargs: Any) -> "Future": ...

    def adopt(self, key: str) -> "tuple[Future, bool]": ...

    def untrack(self, key: str) -> None: ...

    def cancel(self, futures: Any, force: bool = False) -> None: ...

    def after_fork(self) -> None: ...


# Clients by id: a Future pickled in this process names its client, and comes back to it.
_clients: "weakref.WeakValueDictionary[str, Owner]" = weakref.WeakValueDictionary()


def register_client(client: Owner) -> None:
    _clients[client.id] = client


def unregister_client(client: Owner) -> None:
    _clients.pop(client.id, None)


# True in a child forked from this process: every client here is then inert, and a wait on
# one of its pending futures would never end (_refuse_in_fork).
_in_forked_child = False


def _after_fork_in_child() -> None:
    global _in_forked_child
    _in_forked_child = True
    for client in list(_clients.values()):
        client.after_fork()
    _clients.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def client_by_id(client_id: str) -> Optional[Owner]:
    """The client of this process with that id, if it is still alive."""
    return _clients.get(client_id)


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
    for client in reversed(list(_clients.values())):
        if client.set_as_default and client.status == "running":
            return client
    return None


# What a finished Future holds in ``_result`` until ``result()`` unpickles it: the Payload
# itself (no box: 40 bytes a finished task), or ON_WORKER while the data stays on a worker.
# The rare result that is itself a Payload is kept boxed once unpickled.
ON_WORKER = type("OnWorker", (), {"__repr__": lambda self: "<data on a worker>", "__slots__": ()})()


class _Boxed:
    """A result that is itself a Payload, unpickled: not to be taken for a pickled one."""
    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value


def _stored(result: Any) -> bool:
    """Whether ``_result`` is still to be unpickled (or fetched, or read from the journal)."""
    return type(result) is P.Payload or result is ON_WORKER or type(result) is InJournal


# Guards the first making of a Future's Condition, and a resolution that finds none.
_MAKING = threading.Lock()
# concurrent.futures' own state values (stable since 3.2; the conformance tests hold us to them).
_PENDING, _FINISHED = "PENDING", "FINISHED"
_CANCELLED, _NOTIFIED = "CANCELLED", "CANCELLED_AND_NOTIFIED"
_ENDED = (_CANCELLED, _NOTIFIED, _FINISHED)


class _Sync:
    """What a Future needs only once somebody waits on it, calls back from it or reads its
    reply: concurrent.futures' Condition with its lists of waiters and callbacks (only ever
    added to under it), and a borrower's bell (Gateway.wait_here: what wakes the thread
    reading the reply when another thread ends the future; set and cleared by that thread).
    One attribute on the Future instead of four: every attribute name any Future was given
    costs each Future 8 bytes (CPython's shared-key instance dicts)."""
    __slots__ = ("cond", "waiters", "callbacks", "bell")

    def __init__(self) -> None:
        self.cond: Optional[threading.Condition] = None
        self.waiters: list = []
        self.callbacks: list = []
        self.bell: Optional[Callable[[], None]] = None


class Future(cf.Future):
    """The result of a task, computed on the cluster."""

    # Class-level until needed, so that a Future has five attributes of its own (~103 bytes
    # with its object, 152 with the nine it had): concurrent.futures' ``_exception`` and a
    # loss are set only on a future that ends so (a cancelled one keeps its CancelledError in
    # ``_exception``); ``_sync`` once one is waited on.
    _sync: Optional[_Sync] = None
    _exception: Optional[BaseException] = None
    _lost: Optional[BaseException] = None
    _released = False       # release() let go of its key: garbage collection does not again

    def __init__(self, key: str, client: Owner, track: bool = True):
        # cf.Future.__init__ less its Condition: an RLock, a deque and seven bound methods,
        # memory that most futures never use (nobody waits before they finish). It is
        # made on first use (``_condition``), with the lists of waiters and callbacks, which
        # are only ever added to under it: a future resolved while it has none has neither to wake.
        self._state = _PENDING
        self._result: Any = None
        self.key = key
        self.client = client
        if track:           # else the client tracks a batch at once (Client.track_many)
            client.track(self)

    @property
    def _gateway(self) -> Gateway:
        """The cluster as a future sees it: why late, fetch, callbacks."""
        return self.client.gateway

    def _synced(self) -> _Sync:
        sync = self._sync
        if sync is None:
            with _MAKING:
                sync = self._sync
                if sync is None:
                    sync = self._sync = _Sync()
        return sync

    @property
    def _cond(self) -> Optional[threading.Condition]:
        sync = self._sync
        return None if sync is None else sync.cond

    @property   # concurrent.futures' attribute, made on first use: most futures are never waited on
    def _condition(self) -> threading.Condition:  # type: ignore[override]
        sync = self._synced()
        cond = sync.cond
        if cond is None:
            with _MAKING:
                cond = sync.cond
                if cond is None:
                    cond = sync.cond = threading.Condition()
        return cond

    # concurrent.futures reads these and adds to them under the Condition only.
    @property
    def _waiters(self) -> "list | tuple":  # type: ignore[override]  # likewise
        sync = self._sync
        return () if sync is None else sync.waiters

    @property
    def _done_callbacks(self) -> "list | tuple":
        sync = self._sync
        return () if sync is None else sync.callbacks

    @property
    def _bell(self) -> Optional[Callable[[], None]]:
        sync = self._sync
        return None if sync is None else sync.bell

    def done(self) -> bool:
        """True once the task finished, failed or was cancelled."""
        return self._state in _ENDED       # one read: no lock, and no Condition made for it

    def cancelled(self) -> bool:
        """True if the task was cancelled."""
        return self._state in (_CANCELLED, _NOTIFIED)

    @property
    def status(self) -> str:
        """``pending``, ``finished``, ``error``, ``lost`` or ``cancelled`` (dask's)."""
        if self._lost is not None:
            return "lost"
        if not self.done():
            return "pending"
        if self.cancelled():
            return "cancelled"
        return "error" if super().exception() is not None else "finished"

    def result(self, timeout: Optional[float] = None) -> Any:
        """The task's result, waiting at most ``timeout`` seconds (None: as long as it takes).

        Returns:
            The value the task returned, fetched from its worker if large.

        Raises:
            Exception: the task's own exception, with its type and its worker's frames.
            KilledWorker: the task was running in more than ``allowed_failures`` worker deaths.
            TaskTimeoutError: the task ran past its ``timeout=``.
            TimeoutError: not done within ``timeout``, saying why.
            CancelledError: the future was cancelled (saying by whom).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        left = timeout
        if self._state == _PENDING and timeout != 0 and not _in_forked_child:
            self._gateway.wait_here(self, deadline)
            if deadline is not None:        # what is left of it, for the wait below
                left = max(0.0, deadline - time.monotonic())
        if self._state == _FINISHED and self._exception is None:
            value = self._result         # set before the state: no lock, no Condition made
        else:
            try:
                value = self._within(super().result, left, timeout)
            except (Exception, cf.CancelledError) as e:
                error = self.stored_error()
                if error is None or (error is not e and not isinstance(e, cf.CancelledError)):
                    raise               # not the task's own error: a timeout, say
            else:
                error = None
            if error is not None:       # out of the except: no "During handling" context
                raise error
        while _stored(value):       # again if another thread swapped it meanwhile (prefill)
            value = self._materialize(value, deadline, timeout)
        return value.value if type(value) is _Boxed else value

    def exception(self, timeout: Optional[float] = None) -> Optional[BaseException]:
        """The task's exception (None if it succeeded), waiting at most ``timeout`` seconds.

        Args:
            timeout: seconds (None: as long as it takes).

        Returns:
            The exception ``result()`` would raise (KilledWorker, TaskTimeoutError, the task's
            own...); for a lost future, why it was lost; None if the task succeeded.

        Raises:
            TimeoutError: not done within ``timeout``, saying why.
            CancelledError: the future was cancelled (saying by whom).
        """
        try:
            exc = self._within(super().exception, timeout, timeout)
        except cf.CancelledError:
            raise self.stored_error() from None  # type: ignore[misc]  # cancelled: it says who did
        if exc is None and self._lost is not None:
            return self._lost
        return exc

    def _within(self, wait: Callable, left: Optional[float], timeout: Optional[float]) -> Any:
        """``wait(left)``; a timeout says why the task is not done (running where, waiting for
        what, or queued with no worker) instead of an empty TimeoutError, quoting ``timeout``:
        the caller's, of which ``left`` is what remains."""
        if _in_forked_child:
            _refuse_in_fork(self)
        try:
            return wait(left)
        except cf.TimeoutError:
            if self.done():     # the task's own TimeoutError (TaskTimeoutError is one)
                raise
            try:
                why = self._gateway.why_pending(self.key)
            except Exception:  # noqa: BLE001 - the timeout is the error to report, not this
                why = f"task {self.key!r} is not done"
            raise cf.TimeoutError(f"{wait.__name__}(timeout={timeout:g}) timed out: {why}") from None

    def _materialize(self, stored: Any, deadline: Optional[float], timeout: Optional[float]) -> Any:
        """The value of the finished task, unpickled once (fetched first if its data is on a
        worker), by ``deadline``; ``timeout``: the caller's, for the message."""
        if self._result is not stored:      # another thread got there first
            return self._result
        payload = stored
        if payload is ON_WORKER:
            fetching = None
            try:
                fetching = self._gateway.fetch([self.key])[0]
                payload = fetching.result(None if deadline is None else max(0.0, deadline - time.monotonic()))
            except cf.TimeoutError:
                if fetching is None or fetching.done():
                    raise
                raise cf.TimeoutError(f"result(timeout={timeout:g}) timed out: task {self.key!r} is done, but "
                                      f"fetching its data from the worker took longer") from None
            except BaseException as e:
                from .death import LostDataError
                if isinstance(e, LostDataError):
                    self._lost = e
                raise
        if type(payload) is InJournal:     # read here; computed again if its entry is damaged
            value = payload.load()
        else:
            value = self._unpickled(payload)
        with _MAKING:     # finished: only this swap writes _result now; the lock makes it once
            if self._result is stored:
                self._result = _Boxed(value) if _stored(value) else value
            return self._result

    def _unpickled(self, payload: Any) -> Any:
        try:
            return serialize.loads(payload)
        except TransferError as e:      # checked as it landed here: a bug of this process's
            raise TransferError(self.key, "kept for the client", e.detail) from None
        except Exception as e:
            step = f"unpickling the result of task {self.key!r} in the client failed"
            raise serialize.serialization_error(e, step) from None

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
        if self.needs_fetch():
            return await loop.run_in_executor(None, self.result)
        # raised here, not in result(): one frame of ours above the task's, not two
        error = self.stored_error()
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

    def traceback(self, timeout: Optional[float] = None, **kwargs: Any) -> Any:
        """The traceback of the task's exception, its frames on the worker (dask's: for
        ``traceback.format_tb``); None if it did not fail. Waits for the task to end.

        Args:
            timeout: seconds to wait for the task to end (None: as long as it takes).
            **kwargs: dask's; accepted and ignored.

        Raises:
            TimeoutError: not done within ``timeout``.
            CancelledError: the future was cancelled.
        """
        if self.exception(timeout) is None:
            return None
        error = self.stored_error()
        return None if error is None else error.__traceback__

    @property
    def type(self) -> Any:
        """The type of the task's result once it finished, else None (dask's ``Future.type``).
        A result left on its worker is not fetched for it: its type is read there."""
        if self.status != "finished":
            return None
        if self.needs_fetch():
            return self.client.submit(type, self).result()
        return type(self.result())

    def release(self) -> None:
        """Let go of this future's hold on its task now, rather than when it is garbage-collected
        (dask's ``Future.release``): once no future holds the key, its data is freed."""
        if not self._released:
            self._released = True
            self.client.untrack(self.key)

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

    def cancel(self) -> bool:
        """Cancel the task for every holder of its key (as ``Client.cancel``).

        Returns:
            True once cancelled; False if the task had ended already (nothing is done then).
        """
        if self.done():
            return False
        self.client.cancel([self])
        return self.cancelled()

    def __reduce__(self):
        return serialize.future_reduce(self.key, self.client.id)

    def __repr__(self) -> str:
        return f"<Future: {self.status}, key: {self.key}>"

    def _repr_html_(self) -> str:
        from .views.render import future_view
        status = self.status
        detail = ""
        if status in ("error", "lost"):
            exc = self.exception()
            detail = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return future_view(self.key, status, detail)

    def __del__(self) -> None:
        client = getattr(self, "client", None)     # not __dict__: reading it makes the dict
        if client is not None and not self._released:
            client.untrack(self.key)

    # --- the client's side: how Client.resolve ends a Future, and what gather reads -------

    def watch(self, bell: Optional[Callable[[], None]]) -> None:
        """``bell()`` is called once this future ends (None: no longer): set by a thread
        that waits for it while reading its reply itself."""
        if bell is not None or self._sync is not None:
            self._synced().bell = bell

    def _rang(self) -> None:
        bell = self._bell
        if bell is not None:
            bell()

    def settle(self, status: str, value: Any) -> None:
        """End this future as the cluster says its task ended (``Client.resolve``):
        ``"finished"`` (``value``: the pickled result, or None while the data stays on a
        worker), ``"error"`` or ``"lost"`` (``value``: the exception), ``"retrying"`` (a
        failed task runs again: pending again), else cancelled.
        A future already ended (a racing cancel or restart) stays as it was."""
        if status == "retrying":
            self._reopen()
            return
        if status == "finished":
            stored = ON_WORKER if value is None else value
            if not self._ended_unwatched(_FINISHED, stored, None):
                self._end_watched(self.set_result, stored)
        elif status in ("error", "lost"):
            if status == "lost":
                self._lost = value
            if not self._ended_unwatched(_FINISHED, None, value):
                self._end_watched(self.set_exception, value)
        else:
            self._cancel_with(value if isinstance(value, cf.CancelledError) else cf.CancelledError(
                f"Task {self.key!r} was cancelled, and its data is let go of: submit it again to compute it."))
        self._rang()

    def _reopen(self) -> None:
        """Pending again after a failure: its task runs again (Client.retry)."""
        with self._condition:
            if self._state == _FINISHED and self._exception is not None and self._lost is None:
                self._state, self._result, self._exception = _PENDING, None, None

    def _cancel_with(self, error: cf.CancelledError) -> None:
        """Cancelled, ``error`` kept in ``_exception`` (concurrent.futures leaves it unused in
        a cancelled future) for ``result()`` to raise: who cancelled it, not an empty error."""
        if self._ended_unwatched(_NOTIFIED, None, error):
            return
        with self._condition:
            if self._state == _PENDING:
                self._exception = error
        if super().cancel():
            self.set_running_or_notify_cancel()
        elif self._exception is error:      # finished meanwhile by another thread: not cancelled
            self._exception = None

    @staticmethod
    def fail_all(futures: list, exc: BaseException) -> None:
        """End every pending one of ``futures`` with ``exc`` (restart, close, a broken
        cluster), taking the lock once for all those that nobody watches."""
        with _MAKING:
            watched = [fut for fut in futures if not fut.fail_unwatched(exc)]
        for fut in watched:
            fut.settle("error", exc)

    def fail_unwatched(self, exc: BaseException) -> bool:
        """For ``fail_all``, which holds ``_MAKING``: fail this future at once if it has no
        Condition (nobody waits on it, no callback); False if it has one."""
        sync = self._sync       # read once, not through properties: a close fails 200,000 at once
        if sync is not None and sync.cond is not None:
            return False
        if self._state == _PENDING:
            self._result, self._exception = None, exc
            self._state = _FINISHED     # last: a lock-free reader sees the state after the rest
            if sync is not None and sync.bell is not None:
                sync.bell()
        return True

    def _ended_unwatched(self, state: str, result: Any, exception: Any) -> bool:
        """End this future without its Condition when it has none: then nobody waits on it
        and no callback is registered (both are only ever added under it). False: it has one."""
        with _MAKING:
            if self._cond is not None:
                return False
            if self._state == _PENDING:     # else already ended (a racing cancel or restart)
                self._result = result
                if exception is not None:
                    self._exception = exception
                self._state = state         # last: a lock-free reader sees the state after the rest
            return True

    @staticmethod
    def _end_watched(setter: Callable, value: Any) -> None:
        """concurrent.futures' own way, which wakes the waiters and runs the callbacks."""
        try:
            setter(value)
        except cf.InvalidStateError:       # already ended (a racing cancel or restart)
            pass

    def stored_error(self) -> Optional[BaseException]:
        """What ``result()`` raises if this future ended in error or was cancelled, else None.
        A task's exception comes with its worker's frames only: concurrent.futures' frames
        and ours, and those that every earlier raise of it added, are left out, so that the
        caller raising it shows its own frames, one of ours, then the task's."""
        if self.cancelled():      # a fresh one each time: raising one adds to its traceback
            why = self._exception
            return cf.CancelledError(*why.args) if why is not None else cf.CancelledError()
        exc = self._exception if self.done() else None
        return None if exc is None else exc.with_traceback(remote.task_frames(exc))

    def needs_fetch(self) -> bool:
        """Finished, with its data still on a worker (``result()`` would fetch it)."""
        if not self.done() or self.cancelled() or self._exception is not None:
            return False
        return self._result is ON_WORKER

    def prefill(self, payload: Any) -> None:
        """The data ``result()`` would fetch, fetched ahead (``gather`` fetches many at once),
        or read ahead from the journal."""
        with _MAKING:
            if self._result is ON_WORKER or type(self._result) is InJournal:
                self._result = payload

    def in_journal(self) -> Optional[InJournal]:
        """What ``result()`` would read from the journal, if it would."""
        result = self._result
        return result if type(result) is InJournal and self._state == _FINISHED else None


def walk(obj: Any) -> Any:
    """The Futures in (nested lists, tuples, sets and dicts of) ``obj``."""
    if isinstance(obj, Future):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from walk(v)
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for v in obj:
            yield from walk(v)


def futures_of(obj: Any) -> list:
    """The Futures in ``obj``: a Future, nested lists, tuples, sets and dicts of them, or a
    dask collection persisted on the cluster (its graph's Futures), without repeats."""
    found = list(walk(obj))
    graph = getattr(obj, "__dask_graph__", None)
    if callable(graph) and not isinstance(obj, type):
        for value in (graph() or {}).values():
            found += walk(getattr(value, "value", value))     # a dask DataNode holds it as .value
    return list(dict.fromkeys(found))


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
    kept once they end, unless another Future still holds them."""
    for fut in futures_of(obj):
        if fut.done():
            continue
        _forgotten.add(fut)
        cf.Future.add_done_callback(fut, _forgotten.discard)    # set.discard: cheap on the scheduler thread


_adopting = threading.local()        # .client: the client that unpickles futures on this thread


def loads_for(client: Owner, payload: Any) -> Any:
    """``payload`` unpickled with every Future in it made a Future of ``client``, whichever
    client pickled it (a dataset published by another client, closed since, is this one's)."""
    _adopting.client = client
    try:
        return serialize.loads(payload)
    finally:
        _adopting.client = None


def _from_pickle(key: str, client_id: Optional[str]) -> Future:
    """A Future unpickled in this process (pickled by the user): back to its client, which
    holds the key once more for it."""
    client = getattr(_adopting, "client", None) or (_clients.get(client_id) if client_id else None)
    fut = None
    if client is not None and client.status == "running":
        fut = client.gateway.acquire(key, functools.partial(client.adopt, key))
    elif client_id is None or client_id.startswith("task-client-"):
        # made in a task (get_client on a worker: no Client of this process made it): the
        # Future of the key of a running Client whose cluster knows it, the latest first
        for client in reversed(list(_clients.values())):
            if client.status == "running":
                fut = client.gateway.acquire(key, functools.partial(client.adopt, key))
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
        fut.client.gateway.check_open()


def refuse_in_fork(fs: Iterable) -> None:
    """A wait for ``fs`` in a child forked from this process: a pending future of the parent's
    client would never be resolved there, so the wait raises at once, saying why (waiting.py)."""
    if _in_forked_child:
        for f in fs:
            _refuse_in_fork(f)
