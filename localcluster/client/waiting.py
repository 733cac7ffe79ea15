"""Waiting for many futures: ``wait`` and ``as_completed`` (``concurrent.futures``' and dask's
meanings), and the TimeoutError of a wait that says why the futures are not done.

A wait for all of a big map's futures waits on one pending future at a time (``wait_all``):
``concurrent.futures.wait`` would make a Condition for every one. In a child forked from the
cluster's owner, a wait for the parent's pending futures raises at once
(``future.refuse_in_fork``) instead of hanging. Futures are read through their public
methods only (future.py).
"""
from __future__ import annotations

import collections
import concurrent.futures as cf
import threading
import time
from typing import Any, Iterable, Iterator, Optional

from ..config import check_seconds
from .future import Future, futures_of, gateway_of, refuse_in_fork
from ..worker import client as _in_tasks

__all__ = ["wait", "as_completed", "wait_all", "check_timeout", "timed_out"]


def _only_futures(what: str, fs: Any) -> list:
    try:
        items = list(fs)
    except TypeError:
        raise TypeError(f"{what}(fs={fs!r}): expected a Future, an iterable of Futures or a persisted "
                        f"dask collection") from None
    fs = []
    for i, f in enumerate(items):
        if isinstance(f, cf.Future):
            fs.append(f)
        elif _collection(f):
            fs += futures_of(f)
        else:
            raise TypeError(f"{what}(fs=...): item {i} is {type(f).__name__} {f!r:.60}, not a Future "
                            f"(nor a persisted dask collection)")
    return fs


def _collection(obj: Any) -> bool:
    """A dask collection (an array, a bag, a delayed ...): persisted, its graph holds Futures."""
    return callable(getattr(obj, "__dask_graph__", None)) and not isinstance(obj, type)


def wait(fs: Any, timeout: Optional[float] = None, return_when: str = cf.ALL_COMPLETED) -> Any:
    """``concurrent.futures.wait`` for our futures.

    Args:
        fs: a Future, an iterable of them, or (as in dask) a persisted collection
            (``client.persist(x)``) or a list of them, standing for the Futures in its graph.
        timeout: seconds to wait at most; None: as long as it takes.
        return_when: ``ALL_COMPLETED``, ``FIRST_COMPLETED`` or ``FIRST_EXCEPTION``.

    Returns:
        A named tuple ``(done, not_done)`` of sets of futures, as ``concurrent.futures.wait``'s.

    Raises:
        TimeoutError: past ``timeout`` with ``ALL_COMPLETED``, saying how many are not done
            and why (every worker paused, no worker, what the first one waits for).
    """
    if isinstance(fs, cf.Future):        # one: the Client's, or (in a task) its client's
        fs = [fs]
    elif _collection(fs):
        fs = futures_of(fs)
    if return_when not in (cf.ALL_COMPLETED, cf.FIRST_COMPLETED, cf.FIRST_EXCEPTION):
        raise ValueError(f"wait(return_when={return_when!r}): expected ALL_COMPLETED, FIRST_COMPLETED "
                         f"or FIRST_EXCEPTION")
    fs = _only_futures("wait", fs)
    if fs and all(isinstance(f, _in_tasks.TaskFuture) for f in fs):       # in a task, its client's futures
        return _DoneAndNotDone(*_in_tasks.wait(fs, timeout, return_when))
    if return_when == cf.ALL_COMPLETED:
        return wait_all(fs, timeout)
    refuse_in_fork(fs)
    return cf.wait(fs, timeout, return_when)


def wait_all(fs: list, timeout: Optional[float], what: str = "", stated: Optional[float] = None) -> Any:
    """(done, not_done) once every future of ``fs`` is done; past ``timeout``, the TimeoutError
    of ``timed_out`` (``what``: the caller's name, such as gather, and ``stated`` its timeout,
    of which ``timeout`` is what is left, for the message)."""
    refuse_in_fork(fs)
    result = _wait_all(fs, timeout)
    if result.not_done and not all(f.done() for f in result.not_done):     # not just done meanwhile
        raise timed_out(what, fs, timeout if stated is None else stated)
    return _DoneAndNotDone(set(fs), set()) if result.not_done else result


def check_timeout(what: str, timeout: Any) -> None:
    check_seconds(timeout, what, zero=True)


def timed_out(what: str, fs: list, timeout: Optional[float]) -> TimeoutError:
    """The TimeoutError of a wait for ``fs``: how many are not done, and why (the cluster is
    stuck: every worker paused, no worker ...; else what the first pending one waits for)."""
    pending = [f for f in fs if not f.done()]
    distinct = len(set(fs))
    text = (f"{what}(timeout={timeout:g}): " if what else "") + \
        f"{len(set(pending))} of {distinct} futures were not done after {timeout:g} s"
    ours = [f for f in pending if isinstance(f, Future)]
    if not ours:
        return TimeoutError(text)
    gateway = gateway_of(ours[0].client)
    try:
        why = gateway.why_not_done([f.key for f in ours if f.client is ours[0].client])
    except Exception:  # noqa: BLE001 - the timeout is the error to report, not this
        return TimeoutError(text)
    return TimeoutError(f"{text}: {why}")


# What cf.wait returns (a namedtuple of that name and those fields).
_DoneAndNotDone = collections.namedtuple("DoneAndNotDoneFutures", "done not_done")  # type: ignore[name-match]


def _wait_all(fs: list, timeout: Optional[float]) -> Any:
    """``cf.wait(fs, timeout)`` for ALL_COMPLETED, waiting on one pending future at a time.
    cf.wait takes every future's Condition, and so makes one (an RLock and more) for each of a big
    map's futures; waiting in turn makes one only for a future not done when its turn
    comes, and results arrive in batches, so most are."""
    deadline = None if timeout is None else time.monotonic() + timeout
    for f in fs:
        if f.done():
            continue
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            break
        cf.wait((f,), left)
    done = {f for f in fs if f.done()}
    return _DoneAndNotDone(done, set(fs) - done)


class as_completed:
    """Iterate over futures as they finish; ``add()`` more while iterating. As dask's:
    ``count()``, ``is_empty()``, ``has_ready()``, ``next_batch(block=True)``, ``batches()``
    and ``clear()``.

    Args:
        futures: the futures to wait for.
        with_results: yield ``(future, result)`` pairs, not futures.
        raise_errors: with ``with_results``, a failed future's exception is raised (False:
            the exception is yielded as its result).
        timeout: seconds for the whole iteration; past it, a TimeoutError saying why.

    Example:
        >>> from localcluster import Client, as_completed
        >>> with Client(n_workers=1) as client:
        ...     sorted(result for _, result in as_completed(client.map(abs, [-1, -2]), with_results=True))
        [1, 2]
    """

    def __init__(self, futures: Iterable = (), with_results: bool = False, raise_errors: bool = True,
                 timeout: Optional[float] = None):
        """``timeout``: ``next()`` raises TimeoutError, saying why, once that many seconds have
        passed since this call with futures still pending (dask's meaning)."""
        check_timeout("as_completed", timeout)
        self.timeout = timeout
        self._deadline = None if timeout is None else time.monotonic() + timeout
        # Under _cond: the futures added and not done yet (how many times each was added), and
        # those done and not yet yielded. Both hold the futures: garbage collection would
        # release a key whose only Future is in here.
        self._cond = threading.Condition(threading.Lock())
        self._waiting: dict = {}
        self._n_waiting = 0
        self._ready: collections.deque = collections.deque()
        self.with_results = with_results
        self.raise_errors = raise_errors
        for f in futures:
            self.add(f)

    def add(self, future: Future) -> None:
        """Wait for ``future`` too."""
        if not isinstance(future, cf.Future):
            raise TypeError(f"as_completed: {type(future).__name__} {future!r:.60} is not a Future")
        with self._cond:
            self._waiting[future] = self._waiting.get(future, 0) + 1
            self._n_waiting += 1
        if isinstance(future, _in_tasks.TaskFuture):     # it calls nothing back: _next_done asks for it
            if _in_tasks.ended_here(future):
                self._done(future)
        else:
            cf.Future.add_done_callback(future, self._done)   # no result() in it: no hop needed

    def _done(self, future: cf.Future) -> None:
        """A future ended (on the scheduler thread, or here if it had): ready, unless cleared."""
        with self._cond:
            n = self._waiting.get(future)
            if n is None:           # clear() let go of it
                return
            if n == 1:
                del self._waiting[future]
            else:
                self._waiting[future] = n - 1
            self._n_waiting -= 1
            self._ready.append(future)
            self._cond.notify_all()

    def update(self, futures: Iterable) -> None:
        """Wait for each of ``futures`` too."""
        for f in futures:
            self.add(f)

    def count(self) -> int:
        """The futures not yet yielded: those still running and those done but not returned."""
        with self._cond:
            return self._n_waiting + len(self._ready)

    def is_empty(self) -> bool:
        """True when there is nothing left to yield, running or done."""
        return not self.count()

    def has_ready(self) -> bool:
        """True when a done future waits to be yielded (``next()`` would not block)."""
        return bool(self._ready)

    def clear(self) -> None:
        """Forget every future added, done or not: iteration ends."""
        with self._cond:
            self._waiting.clear()
            self._n_waiting = 0
            self._ready.clear()

    def __iter__(self) -> "as_completed":
        return self

    def __next__(self) -> Any:
        return self._yielded(self._next_done())

    next = __next__

    def _next_done(self) -> Any:
        """The next done future, waiting for one; StopIteration when none is left."""
        if not self._ready and self._waiting and isinstance(next(iter(self._waiting)), _in_tasks.TaskFuture):
            self._ask_in_task()
        with self._cond:
            while not self._ready:
                if not self._n_waiting:
                    raise StopIteration
                left = None if self._deadline is None else self._deadline - time.monotonic()
                if left is not None and left <= 0:
                    held = list(self._waiting)
                    break
                self._cond.wait(left)
            else:
                return self._ready.popleft()
        raise timed_out("as_completed", held, self.timeout)     # outside the lock: it asks the cluster why

    def _ask_in_task(self) -> None:
        """In a task: wait (its slot lent) until some of its futures are done, and take those."""
        left = None if self._deadline is None else max(0.0, self._deadline - time.monotonic())
        try:
            done, _ = _in_tasks.wait(list(self._waiting), left, cf.FIRST_COMPLETED)
        except TimeoutError:
            return                  # _next_done says it, as for the cluster's futures
        for f in done:
            for _ in range(self._waiting.get(f, 0)):
                self._done(f)

    def _yielded(self, f: Any) -> Any:
        if not self.with_results:
            return f
        try:
            return f, f.result()
        except BaseException as e:
            if self.raise_errors:
                raise
            return f, e

    def next_batch(self, block: bool = True) -> list:
        """Every future done and not yet yielded, at once; with ``block=True`` (dask's default)
        at least one, waiting for it (StopIteration when none is left). With ``with_results``
        and ``raise_errors``, a batch stops before a failed future: the next call raises it."""
        batch = [self.__next__()] if block else []
        while True:
            with self._cond:
                if not self._ready:
                    return batch
                f = self._ready.popleft()
            if self.with_results and self.raise_errors and _failed(f):
                with self._cond:
                    self._ready.appendleft(f)
                return batch
            batch.append(self._yielded(f))

    def batches(self) -> Iterator[list]:
        """``next_batch()`` until every future is yielded: lists of what finished meanwhile."""
        while True:
            try:
                yield self.next_batch(block=True)
            except StopIteration:
                return

    def __repr__(self) -> str:
        return f"<as_completed: waiting={self._n_waiting} done={len(self._ready)}>"


def _failed(f: cf.Future) -> bool:
    return f.cancelled() or f.exception() is not None
