"""Future: the result of a task (``wait`` and ``as_completed`` are in waiting.py).

A :class:`Future` is a ``concurrent.futures.Future``: ``concurrent.futures.wait``,
``as_completed`` and ``asyncio.wrap_future`` work on it. It becomes done when its
task ends; a small result arrived with it and is unpickled on the first
``result()``, a large one stays on its worker until ``result()`` fetches it.
When the last Future of a key is garbage-collected, the key is released and its
data freed on the workers.

A Future is a handle: what it stands for is its :class:`FutureState`, which every Future
of the same key of one client shares (dask's FutureState), kept by that client's
:class:`FutureTable` (key -> state; the cluster tells the table how tasks end). The
protocol between the client, its futures and the cluster lives on those two and on the
functions here (``table_of``, ``gateway_of``), never on the Future or the Client a user
holds. The client is typed by :class:`Owner`, declared here, so this module never
imports client.py (which sits above it).
"""
from __future__ import annotations

import concurrent.futures as cf
import contextvars
import functools
import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Optional, Protocol

import weakref

from ..death import TransferError
from ..engine.lifecycle import Phase
from ..journal import InJournal
from ..wire import protocol as P, remote, serialize
from ..worker import arguments as _arguments
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


# What a finished Future holds in ``_result`` until ``result()`` unpickles it: the Payload
# itself (no box: a finished task costs no object more), or ON_WORKER while the data stays on a worker.
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
    """What a key's futures need only once somebody waits on one, calls back from one or
    reads its reply: concurrent.futures' Condition with its waiters and callbacks (only ever
    added to under it), each kept with the Future it was added on, and a borrower's bell
    (Gateway.wait_here: what wakes the thread reading the reply when another thread ends the
    key; set and cleared by that thread)."""
    __slots__ = ("cond", "waiters", "callbacks", "bell")

    def __init__(self) -> None:
        self.cond: Optional[threading.Condition] = None
        # [(concurrent.futures' waiter, a weakref to the Future it waits on)]
        self.waiters: list = []
        # [(fn, a weakref to the Future it is called with)]: a callback does not keep its
        # Future alive, as it did not when the Future held it
        self.callbacks: list = []
        self.bell: Optional[Callable[[], None]] = None


class _Pairs:
    """One Future's view of its key's waiters or callbacks: concurrent.futures adds and
    removes them on the Future it holds (``f._waiters.append(waiter)``), while the state every
    Future of the key shares wakes each with the Future it was added on."""
    __slots__ = ("pairs", "fut")

    def __init__(self, pairs: list, fut: "Future"):
        self.pairs, self.fut = pairs, fut

    def append(self, item: Any) -> None:
        self.pairs.append((item, weakref.ref(self.fut)))

    def remove(self, item: Any) -> None:
        for i, (x, ref) in enumerate(self.pairs):
            if x is item and ref() is self.fut:
                del self.pairs[i]
                return
        raise ValueError(f"{item!r} is not in the list")

    def __iter__(self) -> Iterator[Any]:
        return iter([x for x, ref in self.pairs if ref() is self.fut])

    def __len__(self) -> int:
        return sum(1 for _, ref in self.pairs if ref() is self.fut)


_LOGGER = logging.getLogger("concurrent.futures")     # where concurrent.futures logs a failed callback


class FutureState:
    """How the task of one key stands for the Futures of one client: concurrent.futures'
    fields, shared by every Future of the key that client holds (dask's FutureState), and
    the count of those Futures. The client's :class:`FutureTable` ends it (``conclude``); a
    Future reads it; a user never reaches it."""
    __slots__ = ("table", "key", "state", "result", "exception", "lost", "sync", "holders")

    def __init__(self, table: "FutureTable", key: str):
        self.table = table
        self.key = key
        self.state = _PENDING
        # a finished task's Payload (unpickled on the first result()), ON_WORKER, an
        # InJournal, or the value once unpickled
        self.result: Any = None
        # the task's exception; a cancelled key's CancelledError saying who cancelled it
        self.exception: Optional[BaseException] = None
        self.lost: Optional[BaseException] = None      # why its data was lost, once it was
        self.sync: Optional[_Sync] = None               # made once somebody waits or calls back
        self.holders = 1                                # live Futures of the key (under the table's lock)

    def synced(self) -> _Sync:
        sync = self.sync
        if sync is None:
            with _MAKING:
                sync = self.sync
                if sync is None:
                    sync = self.sync = _Sync()
        return sync

    def condition(self) -> threading.Condition:
        """concurrent.futures' Condition, made on first use: most keys are never waited on."""
        sync = self.synced()
        cond = sync.cond
        if cond is None:
            with _MAKING:
                cond = sync.cond
                if cond is None:
                    cond = sync.cond = threading.Condition()
        return cond

    def done(self) -> bool:
        return self.state in _ENDED

    def cancelled(self) -> bool:
        return self.state in (_CANCELLED, _NOTIFIED)

    def wait(self, timeout: Optional[float]) -> bool:
        """Whether the key ended within ``timeout`` seconds (None: as long as it takes)."""
        if self.state in _ENDED:
            return True
        cond = self.condition()
        with cond:
            if self.state not in _ENDED:
                cond.wait(timeout)
            return self.state in _ENDED

    def watch(self, bell: Optional[Callable[[], None]]) -> None:
        """``bell()`` is called once this key ends (None: no longer): set by a thread that
        waits for it while reading its reply itself."""
        if bell is not None or self.sync is not None:
            self.synced().bell = bell

    def _rang(self) -> None:
        sync = self.sync
        if sync is not None and sync.bell is not None:
            sync.bell()

    def conclude(self, status: str, value: Any) -> None:
        """End the key as the cluster says its task ended (FutureTable.resolve): ``"finished"``
        (``value``: the pickled result, None while the data stays on a worker, or an InJournal),
        ``"error"`` or ``"lost"`` (``value``: the exception), ``"retrying"`` (a failed task
        runs again: pending again), else cancelled. A key already ended (a racing cancel or
        restart) stays as it was."""
        if status == "retrying":
            self._reopen()
            return
        if status == "finished":
            self.end(_FINISHED, ON_WORKER if value is None else value, None)
        elif status in ("error", "lost"):
            if status == "lost":
                self.lost = value
            self.end(_FINISHED, None, value)
        else:
            self.end(_NOTIFIED, None, value if isinstance(value, cf.CancelledError) else cf.CancelledError(
                f"Task {self.key!r} was cancelled, and its data is let go of: submit it again to compute it."))
        self._rang()

    def _reopen(self) -> None:
        """Pending again after a failure: its task runs again (Client.retry)."""
        with self.condition():
            if self.state == _FINISHED and self.exception is not None and self.lost is None:
                self.state, self.result, self.exception = _PENDING, None, None

    def end(self, state: str, result: Any, exception: Optional[BaseException]) -> bool:
        """End the key (False: it had ended already). Without a Condition nobody waits on it
        and no callback is registered (both are only ever added under it): the fields are set
        and that is all; with one, its waiters are woken and its callbacks run, as
        concurrent.futures does."""
        with _MAKING:
            sync = self.sync
            if sync is None or sync.cond is None:
                return self.fail_unwatched(state, result, exception)
        with sync.cond:
            if not self.fail_unwatched(state, result, exception):
                return False
            for waiter, ref in sync.waiters:
                fut = ref()
                if fut is None:         # a waiter holds its futures: never so
                    continue
                if state == _NOTIFIED:
                    waiter.add_cancelled(fut)
                elif exception is not None:
                    waiter.add_exception(fut)
                else:
                    waiter.add_result(fut)
            sync.cond.notify_all()
            # none is added once it has ended (the state is read under the Condition)
            callbacks, sync.callbacks = sync.callbacks, []
        for fn, ref in callbacks:
            fut = ref()
            if fut is None:             # dropped before its key ended: as its own callbacks went with it
                continue
            try:
                fn(fut)
            except Exception:
                _LOGGER.exception("exception calling callback for %r", fut)
        return True

    def fail_unwatched(self, state: str, result: Any, exception: Optional[BaseException]) -> bool:
        """End the key at once (False: it had ended already): under ``_MAKING`` with no
        Condition made, or under the Condition, as ``conclude`` does before waking anyone."""
        if self.state != _PENDING:
            return False
        self.result = result
        if exception is not None:
            self.exception = exception
        self.state = state              # last: a lock-free reader sees the state after the rest
        return True

    def stored_error(self) -> Optional[BaseException]:
        """What ``result()`` raises if the key ended in error or was cancelled, else None.
        A task's exception comes with its worker's frames only: concurrent.futures' frames
        and ours, and those that every earlier raise of it added, are left out, so that the
        caller raising it shows its own frames, one of ours, then the task's."""
        if self.cancelled():      # a fresh one each time: raising one adds to its traceback
            why = self.exception
            return cf.CancelledError(*why.args) if why is not None else cf.CancelledError()
        exc = self.exception if self.state in _ENDED else None
        return None if exc is None else exc.with_traceback(remote.task_frames(exc))

    def needs_fetch(self) -> bool:
        """Finished, with its data still on a worker (``result()`` would fetch it)."""
        return self.state == _FINISHED and self.exception is None and self.result is ON_WORKER

    def prefill(self, payload: Any) -> None:
        """The data ``result()`` would fetch, fetched ahead (``gather`` fetches many at once),
        or read ahead from the journal."""
        with _MAKING:
            if self.result is ON_WORKER or type(self.result) is InJournal:
                self.result = payload

    def in_journal(self) -> Optional[InJournal]:
        """What ``result()`` would read from the journal, if it would."""
        result = self.result
        return result if type(result) is InJournal and self.state == _FINISHED else None

    def swap(self, stored: Any, value: Any) -> Any:
        """The value of the finished task once ``stored`` (what ``result`` held) is unpickled:
        kept once, whichever thread got there first."""
        with _MAKING:     # finished: only this swap writes result now; the lock makes it once
            if self.result is stored:
                self.result = _Boxed(value) if _stored(value) else value
            return self.result


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
        if state is None or (status != "retrying" and state.state in _ENDED):
            return
        if status in ("error", "lost"):
            value = serialize.as_exception(value, key)
        state.conclude(status, value)

    def fail_pending(self, exc: BaseException) -> None:
        """Fail every pending future of this client with ``exc`` (restart, close, the cluster
        broke), taking the lock once for all those that nobody watches."""
        with self.lock:
            states = list(self.states.values())
        with _MAKING:
            watched = [s for s in states if s.state == _PENDING and s.sync is not None and s.sync.cond is not None]
            for s in states:
                if s.sync is None or s.sync.cond is None:
                    s.fail_unwatched(_FINISHED, None, exc)
        for s in states:
            if s.sync is not None and s.sync.bell is not None:
                s.sync.bell()
        for s in watched:
            s.conclude("error", exc)

    def after_fork(self) -> None:
        """In a child forked from this process: inert (its cluster is in Phase.FORKED; lifecycle.py).
        The lock is new: a thread of the parent may have held it at the fork."""
        self.lock = threading.RLock()


class Future(cf.Future):
    """The result of a task, computed on the cluster."""

    _released = False       # release() let go of its key: garbage collection does not again
    _s: FutureState         # what it stands for, shared with the other Futures of its key

    def __init__(self, key: str, client: Any = None, state: Optional[FutureState] = None):
        # cf.Future.__init__ is not called: its fields are in ``state``, shared by the
        # Futures of the key, which makes its Condition on first use. ``Future(key,
        # client)``: one more Future of a key the client holds.
        if state is None:
            if client is None:
                raise TypeError("Future(key, client): a Future belongs to a Client")
            state = table_of(client).take(key)[0]
        self.key = key
        self._s = state

    @property
    def client(self) -> Owner:
        """The Client this future belongs to (dask's)."""
        return self._s.table.client

    @property
    def _gateway(self) -> Gateway:
        """The cluster as a future sees it: why late, fetch, callbacks."""
        return self._s.table.gateway

    # concurrent.futures' fields, read by its wait() and as_completed() on any Future
    @property
    def _condition(self) -> threading.Condition:  # type: ignore[override]
        return self._s.condition()

    @property
    def _state(self) -> str:  # type: ignore[override]
        return self._s.state

    @property
    def _waiters(self) -> _Pairs:  # type: ignore[override]
        return _Pairs(self._s.synced().waiters, self)

    @property
    def _done_callbacks(self) -> _Pairs:
        return _Pairs(self._s.synced().callbacks, self)

    def done(self) -> bool:
        """True once the task finished, failed or was cancelled."""
        return self._s.state in _ENDED       # one read: no lock, and no Condition made for it

    def cancelled(self) -> bool:
        """True if the task was cancelled."""
        return self._s.cancelled()

    def running(self) -> bool:
        """False: concurrent.futures' RUNNING is not a state of a cluster's task here
        (``status`` says pending until it ends)."""
        return False

    def set_running_or_notify_cancel(self) -> bool:
        """concurrent.futures' call for executors: False if cancelled, else True (the task's
        state is the cluster's: nothing changes)."""
        return not self.cancelled()

    def set_result(self, result: Any) -> None:
        """concurrent.futures' call for executors: end this future (and every Future of its
        key) with ``result``, as if its task had returned it.

        Raises:
            InvalidStateError: it has ended already.
        """
        if not self._s.end(_FINISHED, _Boxed(result) if _stored(result) else result, None):
            raise cf.InvalidStateError(f"{self!r} has ended already")

    def set_exception(self, exception: Optional[BaseException]) -> None:
        """concurrent.futures' call for executors: end this future (and every Future of its
        key) with ``exception``, as if its task had raised it.

        Raises:
            InvalidStateError: it has ended already.
        """
        if not self._s.end(_FINISHED, None, exception):
            raise cf.InvalidStateError(f"{self!r} has ended already")

    @property
    def status(self) -> str:
        """``pending``, ``finished``, ``error``, ``lost`` or ``cancelled`` (dask's)."""
        s = self._s
        if s.lost is not None:
            return "lost"
        if s.state not in _ENDED:
            return "pending"
        if s.cancelled():
            return "cancelled"
        return "error" if s.exception is not None else "finished"

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
        s = self._s
        deadline = None if timeout is None else time.monotonic() + timeout
        left = timeout
        if s.state == _PENDING and timeout != 0 and not _in_forked_child:
            self._gateway.wait_here(self.key, s.done, s.watch, deadline)
            if deadline is not None:        # what is left of it, for the wait below
                left = max(0.0, deadline - time.monotonic())
        if s.state != _FINISHED or s.exception is not None:
            self._within("result", left, timeout)
            error = s.stored_error()
            if error is not None:
                raise error
        value = s.result            # set before the state: no lock, no Condition made
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
        s = self._s
        self._within("exception", timeout, timeout)
        if s.cancelled():
            raise s.stored_error() from None  # type: ignore[misc]  # cancelled: it says who did
        if s.exception is None and s.lost is not None:
            return s.lost
        return s.exception

    def _within(self, call: str, left: Optional[float], timeout: Optional[float]) -> None:
        """Wait ``left`` seconds for the task to end; a timeout says why it is not done
        (running where, waiting for what, or queued with no worker) instead of an empty
        TimeoutError, quoting ``timeout``: the caller's, of which ``left`` is what remains."""
        if _in_forked_child:
            _refuse_in_fork(self)
        if self._s.wait(left):
            return
        try:
            why = self._gateway.why_pending(self.key)
        except Exception:  # noqa: BLE001 - the timeout is the error to report, not this
            why = f"task {self.key!r} is not done"
        raise cf.TimeoutError(f"{call}(timeout={timeout:g}) timed out: {why}")

    def _materialize(self, stored: Any, deadline: Optional[float], timeout: Optional[float]) -> Any:
        """The value of the finished task, unpickled once (fetched first if its data is on a
        worker), by ``deadline``; ``timeout``: the caller's, for the message."""
        s = self._s
        if s.result is not stored:      # another thread got there first
            return s.result
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
                from ..death import LostDataError
                if isinstance(e, LostDataError):
                    s.lost = e
                raise
        if type(payload) is InJournal:     # read here; computed again if its entry is damaged
            value = payload.load()
        else:
            value = self._unpickled(payload)
        return s.swap(stored, value)

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
        error = self._s.stored_error()
        return None if error is None else error.__traceback__

    @property
    def type(self) -> Any:
        """The type of the task's result once it finished, else None (dask's ``Future.type``).
        A result left on its worker is not fetched for it: its type is read there."""
        if self.status != "finished":
            return None
        if self._s.needs_fetch():
            return self.client.submit(type, self).result()
        return type(self.result())

    def release(self) -> None:
        """Let go of this future's hold on its task now, rather than when it is garbage-collected
        (dask's ``Future.release``): once no future holds the key, its data is freed."""
        if not self._released:
            self._released = True
            self._s.table.let_go(self.key)

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
        from ..views.render import future_view
        status = self.status
        detail = ""
        if status in ("error", "lost"):
            exc = self.exception()
            detail = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return future_view(self.key, status, detail)

    def __del__(self) -> None:
        state = getattr(self, "_s", None)     # None if __init__ failed
        if state is not None and not self._released:
            state.table.let_go(self.key)


def walk(obj: Any) -> Iterator[Future]:
    """The Futures in (nested lists, tuples, sets and dicts of) ``obj``."""
    return _arguments.walk(obj, Future)


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
