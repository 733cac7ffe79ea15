"""A call made a task: the ``Spec`` of ``Client.submit`` and ``map``, with its key.

``Specs`` (one per Client) pickles a task's function once and caches it, weakly where the
callable allows it (a cached bound method must not keep its object alive, nor a closure its
data); pickles the arguments, naming the one that cannot be pickled; and makes the key: the
function's name and a hash of the function and arguments for a pure task, a fresh name
otherwise (worker/arguments.py makes both, for a task's client too). ``Options`` are submit's checked options, the same for every task of a ``map``.
"""
from __future__ import annotations

import dataclasses
import itertools
import weakref
from collections import OrderedDict
from typing import Any, Callable, NamedTuple, Optional

from ..wire import serialize
from ..scheduler.records import Spec, Terms
from ..worker.arguments import PREFIX, fresh_key, fresh_keys, hash_function, name_of, pure_key

__all__ = ["Specs", "Function", "Options", "DEFAULT_OPTIONS", "terms_of", "new_fn_id", "PREFIX", "fresh_key",
           "name_of"]

_fn_ids = itertools.count(1)         # function ids of this process, for every Client
FN_CACHE = 512                       # functions each Client keeps pickled

def new_fn_id() -> int:
    """A function id never given before in this process (a task function wrapped anew)."""
    return next(_fn_ids)


class Function(NamedTuple):
    """A task function as ``Specs.spec`` needs it: its id and bytes, its name for keys, the
    sha1 of its bytes for pure keys (copied, then fed each task's arguments), and the Terms
    its tasks share when submitted with the default options (one for every such task)."""
    fn_id: int
    fn_bytes: bytes
    name: str
    hashed: Any
    terms: Terms


@dataclasses.dataclass(frozen=True)
class Options:
    pure: bool
    retries: int
    timeout: Optional[float]
    priority: int
    workers: Optional[frozenset]
    loose: bool
    resources: Optional[tuple] = None      # config.check_resources: ((name, amount), ...)


#: submit's and map's options when none is given, pure or not: their tasks share Terms
DEFAULT_OPTIONS = {flag: Options(flag, 0, None, 0, None, False, None) for flag in (False, True)}


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

    def pickle_args(self, fn: Callable, args: tuple, kwargs: dict) -> tuple:
        """(payload, {future key: its client id}) of ``fn``'s arguments; a TypeError naming the
        argument that cannot be pickled."""
        try:
            return serialize.dumps_collecting((args, kwargs))
        except Exception as e:
            where = "the arguments"
            for i, a in enumerate(args):
                try:
                    serialize.dumps(a)
                except Exception:
                    where = f"argument {i} ({serialize.describe(a)})"
                    break
            else:
                for k, a in kwargs.items():
                    try:
                        serialize.dumps(a)
                    except Exception:
                        where = f"keyword argument {k!r} ({serialize.describe(a)})"
                        break
            raise TypeError(f"could not pickle {where} of {name_of(fn)}(): {type(e).__name__}: {e}. "
                            f"Pass something picklable, or create it inside the task.") from e

    def spec(self, fn: Callable, args: tuple, kwargs: dict, key: Optional[str], opts: Options,
             how: Optional[Function] = None) -> Spec:
        """The task of ``fn(*args, **kwargs)``. ``how``: the function pickled, named and hashed
        once, for a whole ``map``."""
        how = how or self.how(fn, opts.pure)
        # no pure key to hash: small immutable arguments are kept as they are, pickled when sent
        payload = serialize.plain_args(args) if not opts.pure and not kwargs and key is None else None
        found = {}
        if payload is None:
            payload, found = self.pickle_args(fn, args, kwargs)
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
