"""The arguments of the Client API's calls, read and checked the same way by both its
implementations: the :class:`Client` of the user's process (client/client.py) and the
:class:`TaskClient` of a task (worker/client.py, ``get_client()`` in a task).

Each call's own keywords (``pure``, ``retries``, ``timeout``, ``priority``, ``workers``,
``allow_other_workers``, ``resources``, ``key``) and dask's scheduling keywords (dropped as
hints, or refused) are read here once, and a task's key made here (``pure_key``, ``fresh_key``), so that a call that a Client refuses is refused in a
task with the same error, and one it takes is taken there with the same meaning.

It lives beside the task's client because a worker loads it (for that client, on a task's
first ``get_client()``, never as it starts); the Client of the user's process imports it from
here (the client side sits above the worker's).
"""
from __future__ import annotations

import hashlib
import itertools
import os
from concurrent.futures import CancelledError
from typing import Any, Callable, Iterable, Iterator, Optional

from ..config import check_int, check_seconds
from ..wire import serialize

__all__ = ["dask_keywords", "check_submit_options", "check_options", "worker_names", "check_call", "check_key",
           "map_keys", "prefixed", "HINTS", "check_errors", "shown_workers", "walk", "rebuild", "check_run", "run_results", "name_of", "fresh_key",
           "fresh_keys", "hash_function", "pure_key", "PREFIX"]

# dask's scheduling keywords of submit and map: as in dask, never passed on to the function.
# Hints are dropped; what localcluster cannot honour is refused rather than given to ``fn``.
HINTS = {"submit": ("fifo_timeout",), "map": ("fifo_timeout", "batch_size")}
_DASK_REFUSED = {"actor": "actors", "actors": "actors"}


def dask_keywords(call: str, kwargs: dict, hints: tuple) -> None:
    """Take dask's scheduling keywords out of ``kwargs``: ``hints`` dropped, the others refused."""
    for name in hints:
        kwargs.pop(name, None)
    for name, what in _DASK_REFUSED.items():
        if kwargs.pop(name, None):
            raise NotImplementedError(f"{call}({name}=...) is dask's {what}, which localcluster does not have")


def check_submit_options(retries: Any, timeout: Any, priority: Any) -> None:
    check_int(retries, "", "retries")
    check_seconds(timeout, "", "timeout")
    check_int(priority, "", "priority", lo=None)


def check_options(retries: Any, timeout: Any, priority: Any, allow_other_workers: Any) -> None:
    """Check submit's options but ``workers`` and ``resources`` (a clear error naming the bad one)."""
    check_submit_options(retries, timeout, priority)
    if not isinstance(allow_other_workers, bool):
        raise TypeError(f"allow_other_workers={allow_other_workers!r}: expected True or False")


def worker_names(workers: Any, running: Optional[Callable[[], Iterable[str]]]) -> frozenset:
    """``workers=`` as a set of worker names, or a clear error. ``running`` is given when each
    name must be a running worker's (no ``allow_other_workers``): it returns their names."""
    names = (workers,) if isinstance(workers, str) else workers
    try:
        names = frozenset(names)
    except TypeError:
        raise TypeError(f"workers={workers!r}: expected a worker name or a list of names "
                        f"(as in cluster.workers)") from None
    if not names or not all(isinstance(n, str) for n in names):
        raise TypeError(f"workers={workers!r}: expected a worker name or a non-empty list of names "
                        f"(as in cluster.workers)")
    if running is not None:
        known = set(running())
        unknown = sorted(names - known)
        if unknown:
            raise ValueError(f"workers={sorted(names)!r}: no running worker is called "
                             f"{', '.join(map(repr, unknown))}; the workers are {sorted(known)!r}")
    return names


def check_call(call: str, fn: Any, iterables: Optional[tuple] = None) -> None:
    """``fn`` is callable, and (``map``) there is an iterable."""
    if not callable(fn):
        raise TypeError(f"{call}() needs a callable first, got {serialize.describe(fn)}")
    if iterables is not None and not iterables:
        raise TypeError(f"{call}() needs at least one iterable")


def check_key(key: Any) -> None:
    if key is not None and not isinstance(key, str):
        raise TypeError(f"key must be a string, got {type(key).__name__}")


def map_keys(key: Any, n: int) -> list:
    """``map(key=...)``'s key of each of ``n`` tasks: a list of keys, one a task; None or a
    string prefix (``prefixed``): each task's own key."""
    if isinstance(key, (list, tuple)):
        if len(key) != n:
            raise ValueError(f"map(key=...) got {len(key)} keys for {n} tasks")
        return list(key)
    if key is None or isinstance(key, str):
        return [None] * n
    raise TypeError("map(key=...) takes a list of keys, or a string prefix")


def prefixed(prefix: Optional[str], key: str) -> str:
    """A task's key under ``map(key="prefix")``: the prefix, then its own key's token."""
    return key if prefix is None else f"{prefix}-{key.rsplit('-', 1)[-1]}"


# --- futures nested in the arguments: gather's walk and rebuild ------------------------------

def check_errors(call: str, errors: Any) -> None:
    if errors not in ("raise", "skip"):
        raise ValueError(f"{call}(errors={errors!r}): expected 'raise' or 'skip'")


def shown_workers(workers: list, n_workers: Any) -> list:
    """``scheduler_info(n_workers=...)``'s workers: at most ``n_workers`` of them (-1: all)."""
    check_int(n_workers, "scheduler_info", "n_workers", lo=-1)
    return workers if n_workers == -1 else workers[:n_workers]


def walk(obj: Any, kind: type) -> Iterator[Any]:
    """The futures (instances of ``kind``) in (nested lists, tuples, sets and dicts of) ``obj``."""
    if isinstance(obj, kind):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from walk(v, kind)
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for v in obj:
            yield from walk(v, kind)


_SKIP = object()


def rebuild(obj: Any, kind: type, value: Callable[[Any], Any], errors: str) -> Any:
    """``obj`` with each future (an instance of ``kind``) replaced by ``value(future)``, nested
    as it was; ``errors="skip"``: a future whose value raises is left out."""
    if isinstance(obj, kind):
        try:
            return value(obj)
        except (Exception, CancelledError):
            if errors == "skip":
                return _SKIP
            raise
    if isinstance(obj, dict):
        out = {k: rebuild(v, kind, value, errors) for k, v in obj.items()}
        return {k: v for k, v in out.items() if v is not _SKIP}
    if isinstance(obj, (list, tuple, set, frozenset)):
        items = [x for x in (rebuild(v, kind, value, errors) for v in obj) if x is not _SKIP]
        return items if isinstance(obj, list) else type(obj)(items)
    return obj


# --- run: a function on every worker ----------------------------------------------------------

def check_run(function: Any, nanny: Any, on_error: Any, here: str) -> None:
    """``run``'s arguments; ``here``: where a nanny's thread runs (for the message)."""
    if on_error not in ("raise", "return", "ignore"):
        raise ValueError(f"run(on_error={on_error!r}): expected 'raise', 'return' or 'ignore'")
    check_call("run", function)
    if nanny:
        raise NotImplementedError(f"run(nanny=True): a localcluster nanny is a thread of {here}, not a "
                                  f"process of its own; call the function in {here} instead")


def run_results(answers: Iterator[tuple], on_error: str) -> dict:
    """{worker name: result} of ``run``, from (name, a call that gives that worker's result or
    raises its error): an error raised, kept, or left out as ``on_error`` says."""
    out: dict = {}
    for name, result in answers:
        try:
            out[name] = result()
        except Exception as e:
            if on_error == "raise":
                raise
            if on_error == "return":
                out[name] = e
    return out


# --- keys: the same call makes the same key in the user's process and in a task -------------

_unique = itertools.count()          # the numbers of fresh keys (impure tasks, scattered data)
PREFIX = os.urandom(4).hex()         # this process's part of every fresh key and Client id


def name_of(fn: Any) -> str:
    """A function's name, for its tasks' keys and for messages."""
    name = getattr(fn, "__name__", None) or type(fn).__name__
    return "lambda" if name == "<lambda>" else name


def fresh_key(name: str) -> str:
    """A key never made before in any process: ``name``, this process's prefix, a number."""
    return f"{name}-{PREFIX}{next(_unique):x}"


def fresh_keys(name: str, n: int) -> list:
    """``n`` keys of ``fresh_key(name)``, in one loop (an impure ``map``)."""
    base, numbers = f"{name}-{PREFIX}", _unique
    return [f"{base}{next(numbers):x}" for _ in range(n)]


def hash_function(fn_bytes: bytes) -> Any:
    """The hash a pure key starts from: of the pickled function, copied for each task."""
    # sha1 runs on the CPU's SHA instructions, faster than blake2b where they exist. A
    # key is an identity, not a security boundary.
    return hashlib.sha1(fn_bytes, usedforsecurity=False)


def pure_key(name: str, hashed: Any, payload: Any) -> str:
    """A pure task's key: its function's name and the hash of the function (``hashed``, of
    ``hash_function``) and of its pickled arguments (a serialize.Payload)."""
    h = hashed.copy()
    meta = payload.meta
    h.update(meta.raw() if not isinstance(meta, bytes) else meta)
    for b in payload.buffers:
        h.update(b.raw())
    return f"{name}-{h.hexdigest()}"
