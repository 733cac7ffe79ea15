"""Actors (dask's ``submit(Cls, actor=True)``): an object that lives on one worker, whose
methods run there on the live object and whose attributes are read from it.

The actor's task (``make``) builds the object on the worker that runs it and keeps it in this
process's ``_actors``; its result is an :class:`Actor`, a handle naming the key, the worker
and the class, which is what the Future's ``result()`` gives. A method call is a call outside
the task slots (the channel's ``Call``, as ``Client.run``), one at a time on each actor (a lock
of its own: dask runs an actor's calls one by one too), and returns an :class:`ActorFuture`;
reading an attribute waits for its value. When the actor's worker dies, every call fails with
KilledWorker naming that death (its cause, signal, memory): the object is gone with it.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Optional

from . import context

_actors: dict = {}      # key -> (the object, the lock its calls take), on the worker that made it
# client.py installs it: (a Client of this process, fn, args, key, worker, what) -> an
# ActorFuture of the call made through that client's cluster (this module sits below it)
_parent_call: Optional[Callable[..., Any]] = None


def install_parent(call: Callable[..., Any]) -> None:
    global _parent_call
    _parent_call = call


def make(cls: Any, args: tuple, kwargs: dict, client_id: Optional[str]) -> "Actor":
    """The actor's task: the object, made and kept here; its handle goes back."""
    worker, run = context.current()
    obj = cls(*args, **kwargs)
    _actors[run.key] = (obj, threading.Lock())
    return Actor(cls, run.key, worker.name, client_id)


def call(key: str, name: str, args: tuple, kwargs: dict) -> Any:
    """On the actor's worker: ``name(*args, **kwargs)`` on the live object, one call at a time."""
    obj, lock = _held(key)
    with lock:
        result = getattr(obj, name)(*args, **kwargs)
    if hasattr(result, "__await__"):      # an async method is run to its end, as dask's
        import asyncio

        async def run() -> Any:
            return await result
        return asyncio.run(run())
    return result


def read(key: str, name: str) -> Any:
    """On the actor's worker: the attribute ``name`` of the live object."""
    obj, lock = _held(key)
    with lock:
        return getattr(obj, name)


def _held(key: str) -> tuple:
    try:
        return _actors[key]
    except KeyError:
        raise LookupError(f"actor {key!r} is not on this worker any more (it was restarted: the worker that "
                          f"made it held its state)") from None


class ActorFuture:
    """The result of an actor's method call (dask's ``ActorFuture``): ``result(timeout)``, ``done()``."""

    def __init__(self, answer: Any, loads: Any, what: str):
        self._answer = answer       # a concurrent.futures.Future of the pickled result
        self._loads = loads
        self._what = what

    def result(self, timeout: Optional[float] = None) -> Any:
        return self._loads(self._answer.result(timeout))

    def done(self) -> bool:
        return self._answer.done()

    def __await__(self) -> Any:
        import asyncio
        return asyncio.get_running_loop().run_in_executor(None, self.result).__await__()

    def __repr__(self) -> str:
        return f"<ActorFuture: {self._what}>"


class Actor:
    """An object living on a worker (dask's ``Actor``): ``actor.method(...)`` returns an
    ActorFuture, ``actor.attribute`` reads the attribute there."""

    def __init__(self, cls: Any, key: str, worker: str, client_id: Optional[str] = None):
        self._cls, self._key, self._worker, self._client_id = cls, key, worker, client_id

    def __reduce__(self) -> tuple:
        return (Actor, (self._cls, self._key, self._worker, self._client_id))

    def __repr__(self) -> str:
        return f"<Actor: {getattr(self._cls, '__name__', self._cls)}, key={self._key}, on {self._worker}>"

    def __dir__(self) -> list:
        return sorted(set(dir(self._cls)) | set(object.__dir__(self)))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if callable(getattr(self._cls, name, None)):
            def method(*args: Any, **kwargs: Any) -> ActorFuture:
                return self._ask(call, (self._key, name, args, kwargs), f"{name}()")
            method.__name__ = name
            return method
        return self._ask(read, (self._key, name), name).result()

    def _ask(self, fn: Any, args: tuple, what: str) -> ActorFuture:
        from .client import TaskClient, actor_call, get_client
        client = get_client()
        if isinstance(client, TaskClient):      # a task's client: the call, answered at once
            return ActorFuture(_Done(actor_call(client, fn, args, self._worker)), lambda v: v, what)
        assert _parent_call is not None     # installed when client.py is imported, which made ``client``
        return _parent_call(client, fn, args, self._key, self._worker, what)


class _Done:
    """A concurrent.futures.Future's reading of a value at hand."""

    def __init__(self, value: Any):
        self._value = value

    def result(self, timeout: Optional[float] = None) -> Any:
        return self._value

    def done(self) -> bool:
        return True
