"""A call made a task: the ``Spec`` of ``Client.submit`` and ``map``, with its key.

``Specs`` (one per Client) pickles a task's function once and caches it, weakly where the
callable allows it (a cached bound method must not keep its object alive, nor a closure its
data); and makes the Specs of a plain ``map`` in one loop, and those of the journal's tasks
(client/transport.py). worker/api.py makes every other task, for a task's client too.
"""
from __future__ import annotations

import itertools
import weakref
from collections import OrderedDict
from typing import Any, Callable, Optional

from ..wire import serialize
from ..scheduler.records import Spec, Terms
from ..worker.api import DEFAULT_OPTIONS, Function, Options, pickle_args
from ..worker.arguments import PREFIX, fresh_key, fresh_keys, hash_function, name_of, pure_key

__all__ = ["Specs", "terms_of", "new_fn_id", "PREFIX", "fresh_key", "name_of"]

_fn_ids = itertools.count(1)         # function ids of this process, for every Client
FN_CACHE = 512                       # functions each Client keeps pickled

def new_fn_id() -> int:
    """A function id never given before in this process (a task function wrapped anew)."""
    return next(_fn_ids)


class Specs:
    # Used by the user threads that submit through its Client, without a lock.
    def __init__(self, client_id: str):
        self._client_id = client_id    # futures among the arguments must be this client's
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

    def spec(self, fn: Callable, args: tuple, kwargs: dict, key: Optional[str], opts: Options,
             how: Optional[Function] = None) -> Spec:
        """The task of ``fn(*args, **kwargs)``. ``how``: the function pickled, named and hashed
        once, for a whole ``map``."""
        how = how or self.how(fn, opts.pure)
        # no pure key to hash: small immutable arguments are kept as they are, pickled when sent
        payload = serialize.plain_args(args) if not opts.pure and not kwargs and key is None else None
        found = {}
        if payload is None:
            payload, found = pickle_args(how.name, args, kwargs)
        if found:
            foreign = [k for k, owner in found.items() if owner != self._client_id]
            if foreign:
                raise ValueError(f"the arguments of {how.name}() hold future {foreign[0]!r} of another "
                                 f"Client (closed or not this one): its data is not on this cluster. "
                                 f"Pass its result() instead, or submit from the client that made it.")
        deps = tuple(found)
        if key is None:
            if opts.pure:
                key = pure_key(how.name, how.hashed, payload)
            else:
                key = fresh_key(how.name)
        return Spec.sharing(key, payload, deps, terms_of(how, opts))

    def many(self, argss: list, opts: Options, how: Function) -> Optional[list]:
        """The Specs of a ``map`` whose tasks take plain positional arguments only (numbers,
        strings: ``range(n)`` and its kind), as ``spec`` makes them, in one loop: half its
        time a task. None if any argument is not plain (then ``spec`` for each)."""
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
