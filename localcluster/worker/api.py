"""dask's Client calls written once: ``submit``, ``map``, ``scatter``, ``cancel``, ``who_has``,
``gather``, ``run`` and ``scheduler_info``, for both clients of a cluster: the :class:`Client`
of the user's process and the :class:`TaskClient` of a task (``get_client()`` in a worker).

:class:`ClientApi` reads each call's arguments, makes its keys and options, finds the
futures nested in its arguments, rebuilds its results and raises the errors users see; what
differs between the two clients is a :class:`Transport`'s few primitives: send these tasks
and hold their keys, scatter these values, cancel these futures, who has these keys, run
on workers, the workers' info, wait for these futures, their values. The Client's transport
(client/transport.py) goes through the cluster's Gateway in this process, and also keeps
what only that process has (the journal, workers= checked against the live cluster,
resources checked against the workers, the batched making of a plain ``map``); a task's
(worker/client.py's ``TaskChannel``) goes over the worker's channel to the parent's scheduler.

It lives beside the task's client because a worker loads it (for that client, on a task's
first ``get_client()``, never as it starts); the Client of the user's process imports it
from here (the client side sits above the worker's).
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import threading
from typing import Any, Callable, Iterator, NamedTuple, Optional, Protocol

from ..config import check_resources
from ..wire import serialize
from . import arguments as A
from .future import FutureState, first_error

__all__ = ["ClientApi", "Transport", "Function", "Options", "DEFAULT_OPTIONS", "pickle_args", "futures_in"]


class Function(NamedTuple):
    """A task function pickled once: its id and bytes, its name for keys, the sha1 of its
    bytes for pure keys (copied, then fed each task's arguments; None for an impure call),
    and what its tasks share when submitted with the default options (the Client's Terms;
    None in a task)."""
    fn_id: int
    fn_bytes: bytes
    name: str
    hashed: Any
    terms: Any


@dataclasses.dataclass(frozen=True)
class Options:
    """submit's and map's options, checked: the same for every task of a call."""
    pure: bool
    retries: int
    timeout: Optional[float]
    priority: int
    workers: Optional[frozenset]
    loose: bool
    resources: Optional[tuple] = None      # config.check_resources: ((name, amount), ...)


#: submit's and map's options when none is given, pure or not: their tasks share Terms
DEFAULT_OPTIONS = {flag: Options(flag, 0, None, 0, None, False, None) for flag in (False, True)}


class Transport(Protocol):
    """What differs between the user's process and a task: how calls reach the scheduler,
    and how futures are made, held and resolved there."""

    @property
    def future(self) -> type:
        """The class of this transport's futures: what the calls find in their arguments."""
    #: where ``run(nanny=True)`` would run a nanny's thread, for its message
    here: str
    #: whether an impure task's small plain arguments may travel unpickled
    keeps_plain: bool

    def check(self) -> None:
        """Raise if calls can no longer be made (the client or its cluster closed)."""

    def worker_names(self, workers: Any, strict: bool) -> frozenset:
        """``workers=`` as a set of worker names; ``strict``: each must be running."""

    def function(self, fn: Callable, pure: bool) -> Function:
        """``fn`` pickled once (cached while ``fn`` is), hashed for pure keys when ``pure``."""

    def task(self, how: Function, key: str, payload: Any, found: dict, opts: Options) -> Any:
        """One task of ``how``: its key, its arguments (a Payload, or kept plain), the futures
        found among them ({key: client id}), its options."""

    def many(self, items: list, opts: Options, how: Function) -> Optional[list]:
        """The tasks of a ``map`` of plain positional arguments made in one loop, or None."""

    def from_journal(self, fn: Callable, items: list, kwargs: dict, keys: list, opts: Options,
                     prefix: Optional[str], make: Callable[..., Any]) -> Optional[list]:
        """The futures of pure tasks, through the journal (those it holds finished at once),
        each task made by ``make`` (``ClientApi``'s own making, with the journal's function
        and key); None when there is no journal, or ``fn`` cannot be journaled."""

    def actor(self, fn: Callable, args: tuple, kwargs: dict) -> tuple:
        """(function, args) of the task that makes an actor of ``fn(*args, **kwargs)``."""

    def send(self, tasks: list, opts: Options) -> list:
        """Hand ``tasks`` to the scheduler; their futures, each holding its key."""

    def scatter(self, items: list, workers: Optional[frozenset], broadcast: bool, loose: bool) -> list:
        """Place ``[(key, Payload)]`` on workers (``loose``: any worker, when none of ``workers``
        runs); a future of each, holding its key."""

    def cancel(self, futures: list) -> None:
        """Cancel these futures' keys, for every holder."""

    def who_has(self, keys: Optional[tuple]) -> dict:
        """key -> the names of the workers holding its data (every key known: None)."""

    def run(self, fn_bytes: bytes, payload: Any, workers: Optional[frozenset], name: str,
            wait: bool) -> Optional[Iterator[tuple]]:
        """Call a function on each worker (or those named): (worker name, a call giving its
        result or raising its error) for each, or None at once when not ``wait``."""

    def workers(self) -> tuple:
        """(the scheduler's own fields of scheduler_info, [(name, threads, a call giving
        that worker's entry)] of each open worker)."""

    def wait(self, futures: list, timeout: Optional[float], deadline: Optional[float]) -> None:
        """Return once each future has ended; a TimeoutError past ``timeout`` (``deadline``:
        by time.monotonic, when the caller counts from earlier)."""

    def state_of(self, fut: Any) -> Optional[FutureState]:
        """The state ``fut`` shares with the other futures of its key here (None: not this
        client's, or let go of)."""

    def values(self, futures: list, timeout: Optional[float], deadline: Optional[float]) -> Callable[[Any], Any]:
        """How to read each ended future's value (its error raised), after fetching ahead at
        once what would otherwise take a round trip each."""


def pickle_args(name: str, args: tuple, kwargs: dict) -> tuple:
    """(payload, {future key: its client id}) of a call's arguments; a TypeError naming the
    argument that cannot be pickled."""
    try:
        return serialize.dumps_collecting((args, kwargs))
    except Exception as e:
        where = "the arguments"
        named = [(f"argument {i}", a) for i, a in enumerate(args)] + \
                [(f"keyword argument {k!r}", a) for k, a in kwargs.items()]
        for what, a in named:
            try:
                serialize.dumps(a)
            except Exception:  # noqa: BLE001 - the first that fails is the one to name
                where = f"{what} ({serialize.describe(a)})"
                break
        raise TypeError(f"could not pickle {where} of {name}(): {type(e).__name__}: {e}. "
                        f"Pass something picklable, or create it inside the task.") from e


def futures_in(obj: Any, kind: type) -> list:
    """The futures (``kind``) in ``obj``: a future, nested lists, tuples, sets and dicts of
    them, or a dask collection persisted on the cluster (its graph's futures), without repeats."""
    found = list(A.walk(obj, kind))
    graph = getattr(obj, "__dask_graph__", None)
    if callable(graph) and not isinstance(obj, type):
        for value in (graph() or {}).values():
            found += A.walk(getattr(value, "value", value), kind)     # a dask DataNode holds it as .value
    return list(dict.fromkeys(found))


class ClientApi:
    """The Client API's calls over one transport. Used by any thread of its client; no
    state of its own but the transport."""

    def __init__(self, transport: Transport):
        self._t = transport

    # --- submit and map -------------------------------------------------------------------

    def submit(self, fn: Callable, args: tuple, kwargs: dict, key: Optional[str], pure: Any, retries: Any,
               timeout: Any, priority: Any, workers: Any, allow_other_workers: Any, resources: Any) -> Any:
        """``submit``: dask's actor keywords make an actor; dask's hints are dropped."""
        if kwargs:
            if kwargs.pop("actor", False) | bool(kwargs.pop("actors", False)):
                # dask's actor: the object lives on the worker that makes it; the future's result is its handle
                maker, made = self._t.actor(fn, args, kwargs)
                return self.submit_call(maker, made, {}, key or A.fresh_key(A.name_of(fn)), False, retries, timeout,
                                        priority, workers, allow_other_workers, resources)
            A.dask_keywords("submit", kwargs, A.HINTS["submit"])
        return self.submit_call(fn, args, kwargs, key, pure, retries, timeout, priority, workers,
                                allow_other_workers, resources)

    def submit_call(self, fn: Callable, args: tuple, kwargs: dict, key: Optional[str], pure: Any, retries: Any,
                    timeout: Any, priority: Any, workers: Any, allow_other_workers: Any, resources: Any) -> Any:
        """``submit`` with the function's keyword arguments apart from the call's own."""
        A.check_call("submit", fn)
        A.check_key(key)
        opts = self.options(pure, retries, timeout, priority, workers, allow_other_workers,
                            check_resources(resources, "submit"))
        args = tuple(args)
        if opts.pure:
            journaled = self._t.from_journal(fn, [args], kwargs, [key], opts, None, self.make_task)
            if journaled is not None:
                return journaled[0]
        how = self._t.function(fn, opts.pure)
        return self._t.send([self.make_task(how, args, kwargs, key, opts)], opts)[0]

    def map(self, fn: Callable, iterables: tuple, kwargs: dict, key: Any, pure: Any, retries: Any, timeout: Any,
            priority: Any, workers: Any, allow_other_workers: Any, resources: Any) -> list:
        """``map``: one task a tuple of ``zip(*iterables)``, sent together."""
        A.check_call("map", fn, iterables)
        A.dask_keywords("map", kwargs, A.HINTS["map"])
        opts = self.options(pure, retries, timeout, priority, workers, allow_other_workers,
                            check_resources(resources, "map"))
        prefix = key if isinstance(key, str) else None
        with no_collection():
            items = list(zip(*iterables))
            keys = A.map_keys(key, len(items))
            if opts.pure:
                journaled = self._t.from_journal(fn, items, kwargs, keys, opts, prefix, self.make_task)
                if journaled is not None:
                    return journaled
            how = self._t.function(fn, opts.pure)
            tasks = self._t.many(items, opts, how) if key is None and not kwargs else None
            if tasks is None:
                make = self.make_task
                tasks = [make(how, args, kwargs, k, opts, prefix) for args, k in zip(items, keys)]
            return self._t.send(tasks, opts)

    def options(self, pure: Any, retries: Any, timeout: Any, priority: Any, workers: Any,
                allow_other_workers: Any, resources: Optional[tuple] = None) -> Options:
        """submit's options, checked (``resources``: checked already, by config.check_resources)."""
        if (retries == 0 and type(retries) is int and timeout is None and priority == 0 and type(priority) is int
                and workers is None and allow_other_workers is False and resources is None):
            self._t.check()                 # the defaults (a submit in a loop): nothing else to check
            return DEFAULT_OPTIONS[bool(pure)]
        A.check_options(retries, timeout, priority, allow_other_workers)
        self._t.check()
        names = self._t.worker_names(workers, not allow_other_workers) if workers is not None else None
        return Options(bool(pure), retries, timeout, priority, names, allow_other_workers, resources)

    def make_task(self, how: Function, args: tuple, kwargs: dict, key: Optional[str], opts: Options,
              prefix: Optional[str] = None) -> Any:
        """One task of ``how``: its arguments pickled (or kept plain), its key made unless given."""
        # no pure key to hash: small immutable arguments are kept as they are, pickled when sent
        payload = None
        if not opts.pure and not kwargs and key is None and self._t.keeps_plain:
            payload = serialize.plain_args(args)
        found: dict = {}
        if payload is None:
            payload, found = pickle_args(how.name, args, kwargs)
        if key is None:
            key = A.pure_key(how.name, how.hashed, payload) if opts.pure else A.fresh_key(how.name)
            if prefix is not None:
                key = A.prefixed(prefix, key)
        return self._t.task(how, key, payload, found, opts)

    # --- data ------------------------------------------------------------------------------

    def scatter(self, data: Any, broadcast: Any, workers: Any, allow_other_workers: Any) -> Any:
        """``scatter``: a future of each value (a container's values each their own)."""
        self._t.check()
        for flag, value in (("broadcast", broadcast), ("allow_other_workers", allow_other_workers)):
            if not isinstance(value, bool):
                raise TypeError(f"{flag}={value!r}: expected True or False")
        names = self._t.worker_names(workers, not allow_other_workers) if workers is not None else None
        return self._scatter(data, broadcast, names, allow_other_workers)

    def _scatter(self, data: Any, broadcast: bool, names: Optional[frozenset], loose: bool) -> Any:
        if isinstance(data, dict):
            return dict(zip(data, self._scatter(list(data.values()), broadcast, names, loose)))
        single = not isinstance(data, (list, tuple, set, frozenset))
        values = [data] if single else list(data)
        items = [(A.fresh_key(type(v).__name__), serialize.dumps(v)) for v in values]
        futures = self._t.scatter(items, names, broadcast, loose)
        return futures[0] if single else type(data)(futures) if isinstance(data, (list, tuple)) else futures

    def cancel(self, futures: Any) -> None:
        """``cancel``: these futures' keys, for every holder (dask's ``force=True``)."""
        found = list(dict.fromkeys(A.walk(futures, self._t.future)))
        if found:
            self._t.cancel(found)

    def who_has(self, futures: Any) -> dict:
        self._t.check()
        keys = None if futures is None else tuple(dict.fromkeys(f.key for f in futures_in(futures, self._t.future)))
        return self._t.who_has(keys)

    def gather(self, futures: Any, errors: str, timeout: Optional[float], deadline: Optional[float] = None) -> Any:
        """``gather``: the values of the futures in ``futures``, nested as they were."""
        A.check_errors("gather", errors)
        t = self._t
        flat = list(dict.fromkeys(A.walk(futures, t.future)))
        t.wait(flat, timeout, deadline)
        if errors == "raise":
            # The first error in rebuild's order, raised from here: the caller's traceback then
            # shows two frames of ours above the task's own, not those of rebuild's recursion.
            error = first_error([s for s in map(t.state_of, flat) if s is not None])
            if error is not None:
                raise error
        return A.rebuild(futures, t.future, t.values(flat, timeout, deadline), errors)

    # --- the workers ---------------------------------------------------------------------

    def run(self, function: Callable, args: tuple, kwargs: dict, workers: Any, wait: bool, nanny: Any,
            on_error: Any) -> Optional[dict]:
        """``run``: {worker name: result}, or None at once with ``wait=False``."""
        A.check_run(function, nanny, on_error, self._t.here)
        self._t.check()
        names = self._t.worker_names(workers, True) if workers is not None else None
        how = self._t.function(function, False)
        payload, found = pickle_args(how.name, tuple(args), dict(kwargs))
        if found:
            raise TypeError(f"run({how.name}, ...): its arguments hold futures ({next(iter(found))!r}), which "
                            f"client.run does not resolve; pass their result() instead")
        answers = self._t.run(how.fn_bytes, payload, names, how.name, wait)
        return None if answers is None else A.run_results(answers, on_error)

    def scheduler_info(self, n_workers: Any) -> dict:
        self._t.check()
        fields, workers = self._t.workers()
        shown = A.shown_workers(workers, n_workers)
        return {"type": "Scheduler", **fields, "n_workers": len(workers),
                "total_threads": sum(threads for _, threads, _ in workers),
                "workers": {name: entry() for name, _, entry in shown}}


_collection_paused = 0       # maps under way that paused the cyclic collector (under _collection_lock)
_collection_lock = threading.Lock()


@contextlib.contextmanager
def no_collection() -> Iterator[None]:
    """The cyclic garbage collector paused while a ``map`` makes its tasks: they make many
    objects, none of them garbage, and the collector's passes over them would be much of the
    time ``map`` takes. Nested and concurrent maps count; a collector the user had disabled
    stays disabled."""
    global _collection_paused
    with _collection_lock:
        if _collection_paused == 0 and not gc.isenabled():
            paused = False
        else:
            paused = True
            _collection_paused += 1
            gc.disable()
    try:
        yield
    finally:
        if paused:
            with _collection_lock:
                _collection_paused -= 1
                if _collection_paused == 0:
                    gc.enable()
