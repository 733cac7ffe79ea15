"""A call made a task: the ``Spec`` of ``Client.submit`` and ``map``, with its key.

``Specs`` (one per Client) pickles a task's function once and caches it, weakly where the
callable allows it (a cached bound method must not keep its object alive, nor a closure its
data); and makes the Specs of a plain ``map`` in one loop. worker/api.py makes every other
task, for a task's client too.
"""
from __future__ import annotations

import itertools
import weakref
from collections import OrderedDict
from typing import Any, Callable, Optional

from ..wire import serialize
from ..scheduler.records import Spec, Terms
from ..worker.api import DEFAULT_OPTIONS, Function, Options
from ..worker.arguments import PREFIX, fresh_key, fresh_keys, hash_function, name_of, pure_key

__all__ = ["Specs", "terms_of", "new_fn_id", "PREFIX", "fresh_key", "name_of"]

_fn_ids = itertools.count(1)         # function ids of this process, for every Client
FN_CACHE = 512                       # functions each Client keeps pickled

def new_fn_id() -> int:
    """A function id never given before in this process (a task function wrapped anew)."""
    return next(_fn_ids)


class Specs:
    # Used by the user threads that submit through its Client, without a lock.
    def __init__(self) -> None:
        #: id(fn) -> (ref to fn, fn_id, fn_bytes, the default Terms), least recently used
        #: first; at most FN_CACHE
        self._fn_cache: OrderedDict = OrderedDict()

    def function(self, fn: Callable) -> tuple[int, bytes]:
        """(id, pickled bytes) of a task's function, pickled once while it is cached."""
        return self._function(fn)[1:3]

    def _function(self, fn: Callable) -> tuple:
        entry = self._fn_cache.get(id(fn))
        if entry is not None and entry[0]() is fn:
            self._fn_cache.move_to_end(id(fn))
            return entry
        try:
            data = serialize.pickle_function(fn)
        except Exception as e:
            raise TypeError(f"could not pickle the function {serialize.describe(fn)}: "
                            f"{type(e).__name__}: {e}") from e
        fn_id = next(_fn_ids)
        try:
            ref: Callable = weakref.ref(fn)
        except TypeError:          # builtins, callable instances without __weakref__
            ref = _Strong(fn)
        entry = self._fn_cache[id(fn)] = (ref, fn_id, data, Terms(fn_id, data))
        if len(self._fn_cache) > FN_CACHE:
            self._fn_cache.popitem(last=False)
        return entry

    def many(self, argss: list, opts: Options, how: Function) -> Optional[list]:
        """The Specs of a ``map`` whose tasks take plain positional arguments only (numbers,
        strings: ``range(n)`` and its kind), as worker/api.py's ``ClientApi`` makes each, in
        one loop: half its time a task. None if any argument is not plain (then one by one)."""
        # no pure key to hash: kept unpickled until sent, where they may be
        payloads = None if opts.pure else serialize.plain_args_many(argss)
        if payloads is None:
            payloads = serialize.dumps_plain_many(argss)
        if payloads is None:
            return None
        terms, share = terms_of(how, opts), Spec.sharing
        if opts.pure:
            keys = [pure_key(how.name, how.hashed, p) for p in payloads]
        else:
            keys = fresh_keys(how.name, len(payloads))
        return [share(k, p, (), terms) for k, p in zip(keys, payloads)]

    def how(self, fn: Callable, pure: bool) -> Function:
        _, fn_id, fn_bytes, terms = self._function(fn)
        hashed = hash_function(fn_bytes) if pure else None
        return Function(fn_id, fn_bytes, name_of(fn), hashed, terms)


def terms_of(how: Function, opts: Options) -> Terms:
    """The Terms of ``how``'s tasks under ``opts``: the function's own for the defaults."""
    if opts is DEFAULT_OPTIONS[opts.pure]:
        return how.terms
    return Terms(how.fn_id, how.fn_bytes, opts.priority, opts.retries, opts.timeout, opts.workers,
                 opts.loose, opts.resources)


class _Strong:
    """A strong stand-in for ``weakref.ref`` (callables that cannot be weakly referenced)."""
    __slots__ = ("obj",)

    def __init__(self, obj: Any):
        self.obj = obj

    def __call__(self) -> Any:
        return self.obj
