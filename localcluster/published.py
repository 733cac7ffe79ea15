"""Datasets and events (dask's ``publish_dataset`` and ``log_event`` families), for the Client
and for a task's client (``get_client()`` on a worker), kept by the scheduler
(scheduler/coordination.py): every client of the cluster, and every task, sees the same.

``Published`` carries the requests through its client's way of asking the scheduler
(``ask(body, timeout)``) and gives back the references to futures that come with a value
(``give_back(keys)``): the Client's gateway, or the worker's channel. ``Subscription`` is a
thread of the user's process that waits for a topic's next events and hands each to a handler.
"""
from __future__ import annotations

import inspect
import threading
import time
from collections.abc import MutableMapping
from typing import Any, Callable, Iterator, Optional

from .wire import protocol as P
from .wire import serialize

NO_DEFAULT = object()       # get_dataset without a default: a KeyError if there is none


class Published:
    # Used by any thread of its client; no state of its own.
    def __init__(self, ask: Callable[[Any, Optional[float]], Any], give_back: Callable[[tuple], None],
                 loads: Callable[[Any], Any] = serialize.loads):
        self._ask = ask                # the scheduler's answer to a body, waiting at most the timeout
        self._give_back = give_back    # one reference less to each key (handed over with a value)
        self._loads = loads            # a Payload unpickled, its futures the client's own

    def publish(self, args: tuple, name: Any, override: bool, named: dict) -> None:
        if name is not None:
            if len(args) != 1:
                raise ValueError(f"publish_dataset(..., name={name!r}) takes one value to publish under that "
                                 f"name, got {len(args)}: publish_dataset(df, name='ds')")
            named = {**named, name: args[0]}
        elif args:
            raise ValueError("publish_dataset() names each dataset: publish_dataset(ds=df), or "
                             "publish_dataset(df, name='ds')")
        for key, value in named.items():
            _check_name(key, "publish_dataset")
            try:
                payload, found = serialize.dumps_collecting(((value,), {}))
            except Exception as e:
                raise TypeError(f"publish_dataset({key!r}): could not pickle {serialize.describe(value)}: "
                                f"{type(e).__name__}: {e}") from e
            if not self._ask(P.PublishDataset(key, payload, tuple(found), bool(override)), None):
                raise KeyError(f"Dataset {key!r} already exists: unpublish_dataset({key!r}) first, or "
                               f"publish_dataset(..., override=True) to replace it")

    def get(self, name: Any, default: Any = NO_DEFAULT) -> Any:
        _check_name(name, "get_dataset")
        answer = self._ask(P.GetDataset(name), None)
        if answer is None:
            if default is NO_DEFAULT:
                raise KeyError(f"Dataset {name!r} not found: the datasets published are {self.names()!r}")
            return default
        payload, keys = answer
        try:
            return self._loads(payload)[0][0]
        finally:
            if keys:
                self._give_back(keys)

    def names(self) -> list:
        return sorted(self._ask(P.ListDatasets(), None), key=str)

    def unpublish(self, name: Any) -> None:
        _check_name(name, "unpublish_dataset")
        self._ask(P.UnpublishDataset(name), None)

    def log_event(self, topic: Any, msg: Any) -> None:
        topics = (topic,) if isinstance(topic, str) else tuple(topic) if isinstance(topic, (list, tuple)) else ()
        if not topics or not all(isinstance(t, str) for t in topics):
            raise TypeError(f"log_event(topic={topic!r}): expected a topic name (a str), or a list of them")
        try:
            payload = serialize.dumps(msg)
        except Exception as e:
            raise TypeError(f"log_event({topic!r}): could not pickle the message {serialize.describe(msg)}: "
                            f"{type(e).__name__}: {e}") from e
        self._ask(P.LogEvent(topics, time.time(), payload), None)

    def get_events(self, topic: Optional[str] = None) -> Any:
        if topic is not None and not isinstance(topic, str):
            raise TypeError(f"get_events(topic={topic!r}): expected a topic name (a str), or None for every topic")
        answer = self._ask(P.GetEvents(topic), None)
        if topic is None:
            return {name: _events(entries) for name, entries in answer.items()}
        return _events(answer)

    def next_events(self, topic: str, seen: int, timeout: Optional[float]) -> Optional[tuple]:
        """(events ever logged of ``topic``, those after the first ``seen``), waiting at most
        ``timeout`` s for one; None if none came. ``seen`` -1: at once, with none."""
        answer = self._ask(P.NextEvents(topic, seen), timeout)
        return None if answer is None else (answer[0], _events(answer[1]))


def _events(entries: tuple) -> tuple:
    return tuple((stamp, serialize.loads(payload)) for stamp, payload in entries)


def _check_name(name: Any, call: str) -> None:
    if not isinstance(name, (str, int, float, tuple)):
        raise TypeError(f"{call}: a dataset's name is a str, a number or a tuple of them (as a dask key), "
                        f"got {serialize.describe(name)}")


class Datasets(MutableMapping):
    """``client.datasets``: the datasets published on the cluster as a dict (dask's): reading
    gets one, assigning publishes (replacing), ``del`` unpublishes."""
    __slots__ = ("_published",)

    def __init__(self, published: Published):
        self._published = published

    def __getitem__(self, name: Any) -> Any:
        return self._published.get(name)

    def __setitem__(self, name: Any, value: Any) -> None:
        self._published.publish((value,), name, True, {})

    def __delitem__(self, name: Any) -> None:
        if name not in self._published.names():
            raise KeyError(f"Dataset {name!r} not found")
        self._published.unpublish(name)

    def __iter__(self) -> Iterator:
        return iter(self._published.names())

    def __len__(self) -> int:
        return len(self._published.names())

    def __contains__(self, name: object) -> bool:
        return name in self._published.names()


#: how long a subscription waits for events before it looks whether it should stop
_POLL = 0.25


class Subscription:
    """The user's handler of one topic (``subscribe_topic``), called on a thread of its own with
    each event logged from now on, ``(time, msg)``, in order; an async handler is run to its end."""

    def __init__(self, published: Published, topic: str, handler: Callable[[tuple], Any]):
        self._published = published
        self.topic = topic
        self._handler = handler
        self._stop = threading.Event()
        logged = published.next_events(topic, -1, None)       # answered at once: how many were logged before
        self._seen = logged[0] if logged is not None else 0
        self._thread = threading.Thread(target=self._run, name=f"localcluster-topic-{topic}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import logging
        while not self._stop.is_set():
            try:
                answer = self._published.next_events(self.topic, self._seen, _POLL)
            except Exception:  # noqa: BLE001 - the cluster closed: nothing more will come
                return
            if answer is None or self._stop.is_set():
                continue
            self._seen, events = answer
            for event in events:
                try:
                    result = self._handler(event)
                    if inspect.isawaitable(result):
                        import asyncio

                        async def run(awaited: Any = result) -> Any:
                            return await awaited
                        asyncio.run(run())
                except Exception:  # noqa: BLE001 - one handler's error must not end the subscription
                    logging.getLogger("localcluster").exception(
                        "localcluster: the handler of topic %r raised on event %r", self.topic, event)

    def stop(self) -> None:
        """No more calls of the handler once this returns (unless from the handler itself)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
