"""``client.get_executor()``: a true ``concurrent.futures.Executor`` over the cluster."""
from __future__ import annotations

import concurrent.futures as cf
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Optional, Protocol

from ..client.future import table_of

if TYPE_CHECKING:
    from ..client.future import Future


class Submitter(Protocol):
    """What the executor uses of its client (``client.Client`` is one): declared here, below
    client.py, so that this module never imports it."""

    def map(self, fn: Callable, /, *iterables: Iterable, key: Any = None, pure: bool = True, retries: int = 0,
            timeout: Optional[float] = None, priority: int = 0, workers: Any = None,
            allow_other_workers: bool = False, **kwargs: Any) -> list[Future]: ...


class ClusterExecutor(cf.Executor):
    """A ``concurrent.futures.Executor`` over the cluster: ``map`` yields results in order and
    honours ``timeout``; ``shutdown`` does not close the cluster."""

    def __init__(self, client: Submitter, **submit_kwargs: Any):
        self._client = client
        # submit with the function's arguments passed explicitly: its keywords are fn's own
        submit_call = table_of(client).submit_call
        assert submit_call is not None      # the Client sets it as it makes its table
        self._submit_call = submit_call
        self._kwargs = {"pure": False, **submit_kwargs}
        self._futures: "weakref.WeakSet[Future]" = weakref.WeakSet()
        self._shutdown = False
        self._lock = threading.Lock()

    def submit(self, fn: Callable, /, *args: Any, **kwargs: Any) -> Future:
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            fut = self._submit_call(fn, args, kwargs, **self._kwargs)
            self._futures.add(fut)
            return fut

    def map(self, fn: Callable, *iterables: Iterable, timeout: Optional[float] = None,
            chunksize: int = 1, **_ignored: Any) -> Iterator:
        end = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            fs = self._client.map(fn, *iterables, **self._kwargs)
            for f in fs:
                self._futures.add(f)

        def results() -> Iterator:
            # No local holds a future or a result across a yield: once the caller drops a
            # result it is freed (CPython's test_free_reference).
            try:
                fs.reverse()
                while fs:
                    yield _result_or_cancel(fs.pop(), None if end is None else end - time.monotonic())
            finally:
                for f in fs:
                    f.cancel()
        return results()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shutdown = True
            futures = list(self._futures)
        if cancel_futures:
            for f in futures:
                f.cancel()
        if wait:
            cf.wait(futures)


def _result_or_cancel(fut: Any, timeout: Optional[float]) -> Any:
    try:
        return fut.result(timeout)
    finally:
        fut.cancel()
        del fut
