"""Lock, Semaphore, Event, Queue and Variable: dask's coordination primitives, kept by the
cluster's scheduler (scheduler/coordination.py).

Each is named: two objects of one name, in the user's process or in any task, are the same
lock, event or queue. They work from the user's threads (through the current Client) and
from tasks (through the worker's channel, ``get_client()``), and pickle by name, so they can
be passed to tasks as arguments.

Differences from dask, on purpose:

- A lease is never timed out. dask expires a lease its holder has not refreshed for 30 s
  (``locks.lease-timeout``), so a long task can lose its Lock to another (dask's own warning:
  "lease overbooking"). Here the scheduler sees every death: a lease taken by a task is given
  back when its worker dies, and the death's message names it. A lease taken by a task that
  ends without releasing it stays taken, as in dask (another task may release it).
- Values of a Queue or a Variable are any picklable object (dask: msgpack-encodable data or a
  Future); the futures inside them, at any depth, are kept alive while the value is there.
  Values travel through the user's process: large data belongs in ``scatter`` and a future.
- A timeout is a number of seconds, a string such as "200ms", or a timedelta, as in dask.
"""
from __future__ import annotations

import datetime
import uuid
from collections import deque
from typing import Any, Callable, Optional

from .config import check_duration, check_int, check_seconds
from .wire import protocol as P
from .wire import serialize
from .worker import client as task_client

__all__ = ["Lock", "Semaphore", "Event", "Queue", "Variable"]


def _timeout(value: Any, call: str) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    if isinstance(value, str):
        return check_duration(value, call, "timeout")
    return check_seconds(value, call, zero=True)


class _Named:
    """What the five share: a name, the client that carries their requests (the one given,
    else the current one: ``get_client()``, which in a task is the worker's), and pickling by name."""

    _prefix = "object"

    def __init__(self, name: Optional[str], client: Any):
        if name is not None and not isinstance(name, str):
            raise TypeError(f"{type(self).__name__}(name={name!r}): expected a str, or None for a new unique name")
        self.name = name or f"{self._prefix}-{uuid.uuid4().hex}"
        self._client = client

    def _carrier(self) -> Any:
        return self._client if self._client is not None else _current(type(self).__name__)

    def _ask(self, body: Any, timeout: Optional[float] = None, undo: Optional[Callable[[Any], Any]] = None,
             client: Any = None) -> Any:
        """The scheduler's answer to ``body``; once ``timeout`` s have passed, what a timeout
        means for it. ``undo(answer)``: for an answer that comes after an interrupt."""
        client = client if client is not None else self._carrier()
        if isinstance(client, task_client.TaskClient):
            answer = task_client.channel_of(client).coordinate(body, timeout)
        else:
            from .client.future import gateway_of     # the user's process: a worker never gets here
            answer = gateway_of(client).coordinate(body, timeout, undo)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def __repr__(self) -> str:
        return f"<{type(self).__name__}: {self.name}>"


def _current(what: str) -> Any:
    try:
        return task_client.get_client()
    except ValueError:
        raise RuntimeError(f"a {what} needs a running cluster: create a localcluster Client first (or pass "
                           f"client=...); in a task, it uses the worker's") from None


class Semaphore(_Named):
    """At most ``max_leases`` holders at once, across the user's threads and every task.
    ``acquire(timeout=None)`` -> bool, ``release()``, ``get_value()`` (leases held now), and
    ``with sem:``. Each acquire takes a lease of its own; ``release`` gives back this object's
    oldest. A lease taken by a task is given back if its worker dies.

    Args:
        max_leases: how many holders at once.
        name: objects of one name are one semaphore, in your process and in every task (they
            pickle by name); None: a new unique name.
        client: the Client that keeps it; by default the current one, or in a task the worker's.

    Raises:
        TypeError: a name that is not a string.
        RuntimeError: used with no running Client to keep it (create one first).
        scheduler_rpc: dask's; no meaning here.
        loop: dask's; no meaning here.

    Example:
        >>> from localcluster import Client, Semaphore
        >>> with Client(n_workers=1) as client:
        ...     sem = Semaphore(max_leases=2, name="db")
        ...     with sem:
        ...         sem.get_value()
        1
    """

    _prefix = "semaphore"
    _kind = "semaphore"

    def __init__(self, max_leases: int = 1, name: Optional[str] = None,
                 scheduler_rpc: Any = None, loop: Any = None, client: Any = None):
        self.max_leases = check_int(max_leases, type(self).__name__, "max_leases", lo=1)
        super().__init__(name, client)
        self._leases: deque = deque()

    def acquire(self, timeout: Any = None) -> bool:
        """Take a lease, waiting for one at most ``timeout`` seconds (None: as long as it
        takes; 0: only if one is free now). True if taken."""
        return self._acquire(_timeout(timeout, f"{type(self).__name__}.acquire"), True)

    def _acquire(self, timeout: Optional[float], wait: bool) -> bool:
        lease = uuid.uuid4().hex
        body = P.Acquire(self._kind, self.name, lease, self.max_leases, wait and timeout != 0)
        got = self._ask(body, timeout, lambda answer: answer is True and self._ask(
            P.Release(self._kind, self.name, lease)))
        if got:
            self._leases.append(lease)
        return bool(got)

    def release(self) -> bool:
        """Give back this object's oldest lease. RuntimeError if it holds none."""
        if not self._leases:
            raise RuntimeError(f"{type(self).__name__} {self.name!r} released too often: this object holds no "
                               f"lease (each release() needs an acquire() before it, on the same object)")
        return bool(self._ask(P.Release(self._kind, self.name, self._leases.popleft())))

    def get_value(self) -> int:
        """How many leases are held now, by anyone."""
        return int(self._ask(P.Leases(self._kind, self.name)))

    def close(self) -> None:
        """Nothing to close: a semaphore with no lease held takes no room in the scheduler."""

    def __enter__(self) -> "Semaphore":
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __reduce__(self) -> tuple:
        return (type(self), (self.max_leases, self.name))


class Lock(Semaphore):
    """A named lock across the user's threads and every task: ``acquire(blocking=True,
    timeout=None)`` -> bool, ``release()``, ``locked()``, and ``with lock:``. Held by a task
    whose worker dies, it is released, and the death's message says so.

    Args:
        name: objects of one name are one lock, in your process and in every task (they
            pickle by name); None: a new unique name.
        client: the Client that keeps it; by default the current one, or in a task the worker's.

    Raises:
        TypeError: a name that is not a string.
        RuntimeError: used with no running Client to keep it (create one first).

    Example:
        >>> from localcluster import Client, Lock
        >>> with Client(n_workers=1) as client:
        ...     with Lock("db") as lock:
        ...         Lock("db").locked()
        True
    """

    _prefix = "lock"
    _kind = "lock"

    def __init__(self, name: Optional[str] = None, client: Any = None, scheduler_rpc: Any = None, loop: Any = None):
        super().__init__(1, name, client=client)

    def acquire(self, blocking: bool = True, timeout: Any = None) -> bool:  # type: ignore[override]
        """Take the lock: wait at most ``timeout`` seconds (None: as long as it takes), or not
        at all when ``blocking`` is False. True if taken."""
        if not blocking and timeout is not None:
            raise ValueError("Lock.acquire(blocking=False, timeout=...): a non-blocking call takes no timeout")
        return self._acquire(_timeout(timeout, "Lock.acquire"), blocking)

    def locked(self) -> bool:
        """True if anyone holds the lock now."""
        return self.get_value() == 1

    def __reduce__(self) -> tuple:
        return (type(self), (self.name,))


class Event(_Named):
    """A named flag: ``set()``, ``clear()``, ``is_set()``, ``wait(timeout=None)`` -> bool.

    Args:
        name: objects of one name are one event, in your process and in every task (they
            pickle by name); None: a new unique name.
        client: the Client that keeps it; by default the current one, or in a task the worker's.

    Raises:
        TypeError: a name that is not a string.
        RuntimeError: used with no running Client to keep it (create one first).
    """

    _prefix = "event"

    def __init__(self, name: Optional[str] = None, client: Any = None):
        super().__init__(name, client)

    def set(self) -> None:
        """Raise the flag: every waiter goes on."""
        self._ask(P.SetEvent(self.name, True))

    def clear(self) -> None:
        """Lower the flag: waiters wait again."""
        self._ask(P.SetEvent(self.name, False))

    def is_set(self) -> bool:
        """True if the event is set."""
        return bool(self._ask(P.WaitEvent(self.name, False)))

    def wait(self, timeout: Any = None) -> bool:
        """Wait until the flag is up, at most ``timeout`` seconds. True if it is."""
        t = _timeout(timeout, "Event.wait")
        return bool(self._ask(P.WaitEvent(self.name, t != 0), t))

    def __reduce__(self) -> tuple:
        return (type(self), (self.name,))


def _pack(value: Any, what: str) -> tuple:
    """``value`` pickled, and the keys of the futures inside it (which the scheduler holds)."""
    try:
        payload, found = serialize.dumps_collecting(((value,), {}))
    except Exception as e:
        raise TypeError(f"{what}: could not pickle {serialize.describe(value)}: {type(e).__name__}: {e}") from e
    return payload, tuple(found)


def _unpack(client: Any, payload: Any, keys: tuple) -> Any:
    """A value from a queue or a variable, with its own futures; then the reference to
    each key that came with it (held for us while we made them) is given back."""
    try:
        return serialize.loads(payload)[0][0]
    finally:
        if keys:
            _give_back(client, keys)


def _give_back(client: Any, keys: tuple) -> None:
    if isinstance(client, task_client.TaskClient):
        task_client.channel_of(client).give_back(keys)
    else:
        from .client.future import gateway_of     # the user's process: a worker never gets here
        gateway = gateway_of(client)
        for key in keys:
            gateway.release(key)


class Queue(_Named):
    """A named first-in first-out queue across the user's threads and every task:
    ``put(value, timeout=None)``, ``get(timeout=None, batch=False)``, ``qsize()``. ``maxsize``
    > 0 bounds it (a put waits for room). Futures in a value stay alive while it is queued.

    Args:
        name: objects of one name are one queue, in your process and in every task (they
            pickle by name); None: a new unique name.
        client: the Client that keeps it; by default the current one, or in a task the worker's.
        maxsize: how many values it holds at most; 0: no bound.

    Raises:
        TypeError: a name that is not a string.
        RuntimeError: used with no running Client to keep it (create one first).
    """

    _prefix = "queue"

    def __init__(self, name: Optional[str] = None, client: Any = None, maxsize: int = 0):
        self.maxsize = check_int(maxsize, "Queue", "maxsize", lo=0)
        super().__init__(name, client)

    def put(self, value: Any, timeout: Any = None, **kwargs: Any) -> None:
        """Add ``value`` at the end, waiting at most ``timeout`` seconds for room
        (TimeoutError then)."""
        t = _timeout(timeout, "Queue.put")
        payload, keys = _pack(value, "Queue.put")
        if not self._ask(P.QueuePut(self.name, payload, keys, self.maxsize), t):
            raise TimeoutError(f"Queue {self.name!r} stayed full (maxsize={self.maxsize}) for {t:g} s: the put "
                               f"did not happen")

    def get(self, timeout: Any = None, batch: Any = False, **kwargs: Any) -> Any:
        """The first value, waiting at most ``timeout`` seconds (TimeoutError then).
        ``batch=True``: a list of every value there now (maybe empty; never waits);
        ``batch=n``: a list of the next ``n``, once there are ``n``."""
        t = _timeout(timeout, "Queue.get")
        if batch is True:
            n = -1
        elif batch is False:
            n = 0
        else:
            n = check_int(batch, "Queue.get", "batch", lo=1)
        client = self._carrier()
        items = self._ask(P.QueueGet(self.name, n), t, lambda got: got and [_give_back(client, k) for _p, k in got],
                          client)
        if items is None:
            want = f"{n} values" if n > 0 else "a value"
            raise TimeoutError(f"Queue {self.name!r} had not {want} within {t:g} s")
        values = [_unpack(client, payload, keys) for payload, keys in items]
        return values if n else values[0]

    def qsize(self, **kwargs: Any) -> int:
        """How many values are queued now."""
        return int(self._ask(P.QueueSize(self.name)))

    def close(self) -> None:
        """Nothing to close: an empty queue takes no room in the scheduler."""

    def __reduce__(self) -> tuple:
        return (type(self), (self.name, None, self.maxsize))


class Variable(_Named):
    """A named value across the user's threads and every task: ``set(value)``,
    ``get(timeout=None)`` (waits until set), ``delete()``. Futures in the value stay alive
    while it is set.

    Args:
        name: objects of one name are one variable, in your process and in every task (they
            pickle by name); None: a new unique name.
        client: the Client that keeps it; by default the current one, or in a task the worker's.

    Raises:
        TypeError: a name that is not a string.
        RuntimeError: used with no running Client to keep it (create one first).
    """

    _prefix = "variable"

    def __init__(self, name: Optional[str] = None, client: Any = None):
        super().__init__(name, client)

    def set(self, value: Any, timeout: Any = None, **kwargs: Any) -> None:
        """Set the value (any picklable object; the futures inside it stay alive while it is set)."""
        payload, keys = _pack(value, "Variable.set")
        self._ask(P.SetVariable(self.name, payload, keys))

    def get(self, timeout: Any = None, **kwargs: Any) -> Any:
        """The value, waiting at most ``timeout`` seconds for one to be set (TimeoutError then)."""
        t = _timeout(timeout, "Variable.get")
        client = self._carrier()
        answer = self._ask(P.GetVariable(self.name), t, lambda v: v and _give_back(client, v[1]), client)
        if answer is None:
            raise TimeoutError(f"Variable {self.name!r} was not set within {t:g} s")
        return _unpack(client, *answer)

    def delete(self) -> None:
        """Unset it (for everyone); its futures are let go."""
        self._ask(P.SetVariable(self.name, None))

    def __reduce__(self) -> tuple:
        return (type(self), (self.name,))
