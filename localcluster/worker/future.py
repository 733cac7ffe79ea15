"""A future of a key, whichever client holds it: the one state machine of a key's futures
(:class:`FutureState`) and the ``concurrent.futures.Future`` over it (:class:`Future`).

    the cluster's answers ──conclude(status, value)──▶ FutureState ◀──reads── Future
                                                          │   (result, done, status ...)
                                     its Holder ◀─────────┘
      (the Client's FutureTable, client/future.py | a task's TaskTable, worker/client.py):
          waits, fetches, asks, lets the key go

- :class:`FutureState`: concurrent.futures' fields (state, result, exception), shared by every
  future of one key in one client, and how many of those futures live. ``conclude`` is its one
  door for how the task ended; the user's process is told by the cluster, a task asks.
- :class:`Future`: what a user holds, the Client's and a task's alike: ``result``,
  ``exception``, ``done``, ``status``, ``cancel``, ``release``, pickling, and
  concurrent.futures' fields, so that its ``wait`` and ``as_completed`` work on it.
- :class:`Holder`: what a future asks of the client that holds its key, the one thing that
  differs between the user's process and a task: how to wait for the key, fetch its value,
  say why it is late, and let it go.

Below client/ and the journal (a worker imports it): a result kept elsewhere until asked for
(the Client's data left on a worker, or an entry of the journal) is a :class:`Later` here.
"""
from __future__ import annotations

import concurrent.futures as cf
import itertools
import logging
import threading
import time
import weakref
from typing import Any, Callable, Iterable, Iterator, Optional, Protocol

from ..wire import protocol as P, remote

__all__ = ["Future", "FutureState", "Holder", "Later", "ON_WORKER"]


class Later:
    """A finished task's result kept elsewhere until ``result()`` asks for it (its holder's
    ``materialize`` reads it): the journal's entries are ones."""
    __slots__ = ()


class _OnWorker(Later):
    __slots__ = ()

    def __repr__(self) -> str:
        return "<data on a worker>"


#: what a finished future holds while its data stays on a worker, until ``result()`` fetches it
ON_WORKER = _OnWorker()


class _Boxed:
    """A result that is itself a Payload or a Later, unpickled: not to be taken for a stored one."""
    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value


def stored(result: Any) -> bool:
    """Whether a finished future's ``result`` is still to be unpickled, fetched or read."""
    return type(result) is P.Payload or isinstance(result, Later)


def boxed(value: Any) -> Any:
    """``value`` as a finished future keeps it once unpickled."""
    return _Boxed(value) if stored(value) else value


# Guards the first making of a state's Condition, and an ending that finds none.
_MAKING = threading.Lock()
# concurrent.futures' own state values (stable since 3.2; the conformance tests hold us to them).
PENDING, FINISHED = "PENDING", "FINISHED"
CANCELLED, NOTIFIED = "CANCELLED", "CANCELLED_AND_NOTIFIED"
ENDED = (CANCELLED, NOTIFIED, FINISHED)

_LOGGER = logging.getLogger("concurrent.futures")     # where concurrent.futures logs a failed callback


class Holder(Protocol):
    """What a future asks of the client that holds its key (the Client's FutureTable; a task's
    TaskTable). Its methods are called by the future's thread, ``let_go`` from inside the
    garbage collector too."""

    @property
    def client(self) -> Any:
        """The client the futures belong to."""

    def wait_here(self, state: "FutureState", deadline: Optional[float]) -> None:
        """``result()`` of a pending key is about to wait: a chance to read its reply on this
        thread. Returns when the key ended, or when the caller is to wait as usual."""

    def wait(self, state: "FutureState", timeout: Optional[float]) -> bool:
        """Whether the key ended within ``timeout`` seconds (None: as long as it takes)."""

    def ended(self, state: "FutureState") -> bool:
        """Whether the pending key has ended by now, as far as this client can learn at once
        (the Client's is told: False; a task's asks the scheduler)."""

    def watched(self, state: "FutureState") -> None:
        """Somebody waits on the key or calls back from it through concurrent.futures: it is
        to be concluded without a call of the future's."""

    def why_pending(self, key: str) -> str:
        """Why ``key`` is not done: for the TimeoutError of a wait for it."""

    def materialize(self, state: "FutureState", kept: Any, deadline: Optional[float],
                    timeout: Optional[float]) -> Any:
        """The value of the finished key once ``kept`` (a Payload or a Later) is unpickled,
        fetched or read, by ``deadline``; kept once (``state.swap``)."""

    def let_go(self, key: str) -> Any:
        """A future of ``key`` is gone (garbage-collected or released): never blocks."""

    def reduce(self, key: str) -> tuple:
        """What a future of ``key`` pickles as."""


class _Sync:
    """What a key's futures need only once somebody waits on one, calls back from one or
    reads its reply: concurrent.futures' Condition with its waiters and callbacks (only ever
    added to under it), each kept with the Future it was added on, and a borrower's bell
    (what wakes the thread reading the reply when another thread ends the key; set and
    cleared by that thread)."""
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


class FutureState:
    """How the task of one key stands for the futures of one client: concurrent.futures'
    fields, shared by every future of the key that client holds (dask's FutureState), and
    the count of those futures. Its holder ends it (``conclude``); a future reads it; a user
    never reaches it."""
    __slots__ = ("table", "key", "state", "result", "exception", "lost", "sync", "holders")

    def __init__(self, table: Holder, key: str):
        self.table = table
        self.key = key
        self.state = PENDING
        # a finished task's Payload (unpickled on the first result()), a Later, or the value
        # once unpickled
        self.result: Any = None
        # the task's exception; a cancelled key's CancelledError saying who cancelled it
        self.exception: Optional[BaseException] = None
        self.lost: Optional[BaseException] = None      # why its data was lost, once it was
        self.sync: Optional[_Sync] = None               # made once somebody waits or calls back
        self.holders = 1                                # live futures of the key (under the table's lock)

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
        return self.state in ENDED

    def cancelled(self) -> bool:
        return self.state in (CANCELLED, NOTIFIED)

    def status(self) -> str:
        """``pending``, ``finished``, ``error``, ``lost`` or ``cancelled`` (dask's), as known here."""
        if self.lost is not None:
            return "lost"
        if self.state not in ENDED:
            return "pending"
        if self.cancelled():
            return "cancelled"
        return "error" if self.exception is not None else "finished"

    def wait(self, timeout: Optional[float]) -> bool:
        """Whether the key ended within ``timeout`` seconds (None: as long as it takes)."""
        if self.state in ENDED:
            return True
        cond = self.condition()
        with cond:
            if self.state not in ENDED:
                cond.wait(timeout)
            return self.state in ENDED

    def watch(self, bell: Optional[Callable[[], None]]) -> None:
        """``bell()`` is called once this key ends (None: no longer): set by a thread that
        waits for it while reading its reply itself."""
        if bell is not None or self.sync is not None:
            self.synced().bell = bell

    def ring(self) -> None:
        """Wake the thread reading this key's reply, if one is (its bell)."""
        sync = self.sync
        if sync is not None and sync.bell is not None:
            sync.bell()

    def conclude(self, status: str, value: Any) -> None:
        """End the key as its task ended: ``"finished"`` (``value``: the pickled result, None
        while the data stays on a worker, or a Later), ``"error"`` or ``"lost"`` (``value``:
        the exception), ``"retrying"`` (a failed task runs again: pending again), else
        cancelled (``value``: the CancelledError saying by whom, or None). A key already ended
        (a racing cancel or restart) stays as it was."""
        if status == "retrying":
            self._reopen()
            return
        if status == "finished":
            self.end(FINISHED, ON_WORKER if value is None else value, None)
        elif status in ("error", "lost"):
            if status == "lost":
                self.lost = value
            self.end(FINISHED, None, value)
        else:
            self.end(NOTIFIED, None, value if isinstance(value, cf.CancelledError) else cf.CancelledError(
                f"Task {self.key!r} was cancelled, and its data is let go of: submit it again to compute it."))
        self.ring()

    def _reopen(self) -> None:
        """Pending again after a failure: its task runs again (Client.retry)."""
        with self.condition():
            if self.state == FINISHED and self.exception is not None and self.lost is None:
                self.state, self.result, self.exception = PENDING, None, None

    def end(self, state: str, result: Any, exception: Optional[BaseException]) -> bool:
        """End the key (False: it had ended already). Without a Condition nobody waits on it
        and no callback is registered (both are only ever added under it): the fields are set
        and that is all; with one, its waiters are woken and its callbacks run, as
        concurrent.futures does."""
        with _MAKING:
            sync = self.sync
            if sync is None or sync.cond is None:
                return self.end_unwatched(state, result, exception)
        with sync.cond:
            if not self.end_unwatched(state, result, exception):
                return False
            for waiter, ref in sync.waiters:
                fut = ref()
                if fut is None:         # a waiter holds its futures: never so
                    continue
                if state == NOTIFIED:
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

    def end_unwatched(self, state: str, result: Any, exception: Optional[BaseException]) -> bool:
        """End the key at once (False: it had ended already): under ``_MAKING`` with no
        Condition made, or under the Condition, as ``end`` does before waking anyone."""
        if self.state != PENDING:
            return False
        self.result = result
        if exception is not None:
            self.exception = exception
        self.state = state              # last: a lock-free reader sees the state after the rest
        return True

    def watched(self) -> bool:
        """Whether somebody waits on the key or calls back from it (it has a Condition)."""
        sync = self.sync
        return sync is not None and sync.cond is not None

    def stored_error(self) -> Optional[BaseException]:
        """What ``result()`` raises if the key ended in error or was cancelled, else None.
        A task's exception comes with its worker's frames only: concurrent.futures' frames
        and ours, and those that every earlier raise of it added, are left out, so that the
        caller raising it shows its own frames, one of ours, then the task's."""
        if self.cancelled():      # a fresh one each time: raising one adds to its traceback
            why = self.exception
            return cf.CancelledError(*why.args) if why is not None else cf.CancelledError()
        exc = self.exception if self.state in ENDED else None
        return None if exc is None else exc.with_traceback(remote.task_frames(exc))

    def needs_fetch(self) -> bool:
        """Finished, with its data still on a worker (``result()`` would fetch it)."""
        return self.state == FINISHED and self.exception is None and self.result is ON_WORKER

    def later(self) -> Optional[Later]:
        """What ``result()`` would read from elsewhere (the journal), if it would."""
        result = self.result
        return result if isinstance(result, Later) and result is not ON_WORKER and self.state == FINISHED else None

    def prefill(self, payload: Any) -> None:
        """The data ``result()`` would fetch or read, fetched or read ahead (``gather`` fetches
        many at once)."""
        with _MAKING:
            if isinstance(self.result, Later):
                self.result = payload

    def swap(self, kept: Any, value: Any) -> Any:
        """The value of the finished task once ``kept`` (what ``result`` held) is unpickled:
        kept once, whichever thread got there first."""
        boxed = _Boxed(value) if type(value) is P.Payload or isinstance(value, Later) else value
        with _MAKING:     # finished: only this swap writes result now; the lock makes it once
            if self.result is kept:
                self.result = boxed
            return self.result


class Future(cf.Future):
    """The result of a task, computed on the cluster."""

    _released = False       # release() let go of its key: garbage collection does not again
    _s: FutureState         # what it stands for, shared with the other Futures of its key

    def __init__(self, key: str, state: FutureState):
        # cf.Future.__init__ is not called: its fields are in ``state``, shared by the
        # futures of the key, which makes its Condition on first use.
        self.key = key
        self._s = state

    @property
    def client(self) -> Any:
        """The client this future belongs to (dask's)."""
        return self._s.table.client

    # concurrent.futures' fields, read by its wait() and as_completed() on any Future
    @property
    def _condition(self) -> threading.Condition:  # type: ignore[override]
        return self._s.condition()

    @property
    def _state(self) -> str:  # type: ignore[override]
        return self._s.state

    @property
    def _waiters(self) -> _Pairs:  # type: ignore[override]
        s = self._s
        if s.state == PENDING:
            s.table.watched(s)
        return _Pairs(s.synced().waiters, self)

    @property
    def _done_callbacks(self) -> _Pairs:
        s = self._s
        if s.state == PENDING:
            s.table.watched(s)
        return _Pairs(s.synced().callbacks, self)

    def done(self) -> bool:
        """True once the task finished, failed or was cancelled."""
        s = self._s
        return s.state in ENDED or s.table.ended(s)       # no lock, and no Condition made for it

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
        if not self._s.end(FINISHED, boxed(result), None):
            raise cf.InvalidStateError(f"{self!r} has ended already")

    def set_exception(self, exception: Optional[BaseException]) -> None:
        """concurrent.futures' call for executors: end this future (and every Future of its
        key) with ``exception``, as if its task had raised it.

        Raises:
            InvalidStateError: it has ended already.
        """
        if not self._s.end(FINISHED, None, exception):
            raise cf.InvalidStateError(f"{self!r} has ended already")

    @property
    def status(self) -> str:
        """``pending``, ``finished``, ``error``, ``lost`` or ``cancelled`` (dask's)."""
        s = self._s
        if s.state not in ENDED:
            s.table.ended(s)
        return s.status()

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
        if s.state == PENDING and timeout != 0:
            s.table.wait_here(s, deadline)
            if deadline is not None:        # what is left of it, for the wait below
                left = max(0.0, deadline - time.monotonic())
        if s.state != FINISHED or s.exception is not None:
            self._within("result", left, timeout)
            error = s.stored_error()
            if error is not None:
                raise error
        value = s.result            # set before the state: no lock, no Condition made
        # stored(value), inlined: this line is run once a result; again if another thread
        # swapped it meanwhile (prefill)
        while type(value) is P.Payload or isinstance(value, Later):
            value = s.table.materialize(s, value, deadline, timeout)
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
        s = self._s
        if s.state in ENDED or s.table.wait(s, left):
            return
        try:
            why = s.table.why_pending(self.key)
        except Exception:  # noqa: BLE001 - the timeout is the error to report, not this
            why = f"task {self.key!r} is not done"
        raise cf.TimeoutError(f"{call}(timeout={timeout:g}) timed out: {why}")

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

    def release(self) -> None:
        """Let go of this future's hold on its task now, rather than when it is garbage-collected
        (dask's ``Future.release``): once no future holds the key, its data is freed."""
        if not self._released:
            self._released = True
            self._s.table.let_go(self.key)

    def cancel(self) -> bool:
        """Cancel the task for every holder of its key (as ``Client.cancel``).

        Returns:
            True once cancelled; False if the task had ended already (nothing is done then).
        """
        if self.done():
            return False
        self.client.cancel([self])
        return self.cancelled()

    def __reduce__(self) -> tuple:
        return self._s.table.reduce(self.key)

    def __repr__(self) -> str:
        state = self.__dict__.get("_s")      # None: __init__ failed before it
        return f"<Future: {'pending' if state is None else state.status()}, key: {self.key}>"

    def __del__(self) -> None:
        state = self.__dict__.get("_s")     # None if __init__ failed
        if state is not None and not self._released:
            state.table.let_go(self.key)


def conclude_all(states: list, endings: Iterable[tuple]) -> None:
    """``state.conclude(status, value)`` for each of ``states`` and its (status, value) of
    ``endings``, under one lock for all those that finished or failed and that nobody
    watches: a batch of answers, or every key at once."""
    rest = []
    with _MAKING:
        for s, (status, value) in zip(states, endings):
            sync = s.sync
            if sync is not None and sync.cond is not None:
                rest.append((s, status, value))
            elif status == "finished":
                s.end_unwatched(FINISHED, ON_WORKER if value is None else value, None)
            elif status == "error":
                s.end_unwatched(FINISHED, None, value)
            else:
                rest.append((s, status, value))
    for s in states:
        s.ring()
    for s, status, value in rest:
        s.conclude(status, value)


def fail_all(states: list, exc: BaseException) -> None:
    """End every pending one of ``states`` with ``exc`` (a restart, a close, the cluster broke)."""
    conclude_all(states, itertools.repeat(("error", exc)))


def first_error(states: Iterable[FutureState]) -> Optional[BaseException]:
    """What ``result()`` raises for the first of ``states`` that failed or was cancelled, or
    None; the caller raises it, a frame fewer."""
    for state in states:
        if state.state == FINISHED and state.exception is None:     # most of a gather's: no call
            continue
        error = state.stored_error()
        if error is not None:
            return error
    return None
