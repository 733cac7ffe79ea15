"""User data <-> :class:`~localcluster.protocol.Payload`, exceptions <-> bytes.

cloudpickle so that functions from ``__main__``, a notebook cell, a lambda or a
closure travel; pickle protocol 5 so that large buffers (numpy arrays, bytes,
bytearrays) stay out of the pickle stream and cross as shared memory.

pickle keeps ``bytes`` and ``bytearray`` in the stream (its C pickler has no hook for
them), so a large one at the top level is wrapped to travel as one out-of-band buffer
like an array; a ``memoryview`` anywhere travels as its buffer (pickle refuses it).

Futures inside task arguments pickle as placeholders: the parent's pickler records
each as a dependency (a dispatch-table entry of that pickler, so other objects pay
nothing), and the worker's unpickler resolves each to the value in its store
(``loads(payload, store)``). A Future pickled anywhere else (by the user) comes back
to its client in the parent, through the hook future.py installs.
"""
from __future__ import annotations

import copyreg
import io
import pickle
import sys
import threading
import traceback
import types
from collections import ChainMap
from typing import Any, Callable, Mapping, Optional

import cloudpickle

from .basics import TransferError
from .protocol import OUT_OF_BAND, Payload, broken_seal, seals_of
from .remote import detached_traceback, explain_here

_local = threading.local()


def _as_bytes(buf: Any) -> bytes:
    return buf if type(buf) is bytes else bytes(buf)


def _as_memoryview(buf: Any, fmt: str, shape: tuple) -> memoryview:
    view = memoryview(buf)
    return view if view.format == fmt and view.shape == shape else view.cast("B").cast(fmt, shape)  # type: ignore[call-overload]


def _reduce_memoryview(view: memoryview) -> tuple:
    if not view.c_contiguous:    # strided or Fortran-ordered: the rebuild reads C order
        view = memoryview(view.tobytes(order="C")).cast(view.format, view.shape)  # type: ignore[call-overload]
    return (_as_memoryview, (pickle.PickleBuffer(view), view.format, view.shape))


class _OutOfBand:
    """A large top-level bytes or bytearray, pickled as one out-of-band buffer."""
    __slots__ = ("obj",)

    def __init__(self, obj: Any):
        self.obj = obj

    def __reduce__(self) -> tuple:
        return (_as_bytes if type(self.obj) is bytes else bytearray, (pickle.PickleBuffer(self.obj),))


def _wrap(obj: Any) -> Any:
    t = type(obj)
    return _OutOfBand(obj) if (t is bytes or t is bytearray) and len(obj) >= OUT_OF_BAND else obj


_cloudpickle_code = cloudpickle.Pickler.dispatch_table[types.CodeType]


def _reduce_code(code: types.CodeType) -> tuple:
    """cloudpickle's reduction of a code object, with its real file name: cloudpickle writes
    "<dynamic-code>" there, so a task's frames would show neither file nor source line."""
    rebuild, args = _cloudpickle_code(code)
    return rebuild, tuple(code.co_filename if type(a) is str and a == "<dynamic-code>" else a for a in args)


def keep_file_names_in_cloudpickle() -> None:
    """Have cloudpickle's own Pickler keep a code object's file name too, as ours does: for
    ``localcluster.dask.install``, whose client pickles the tasks with cloudpickle (dask's
    serializer), so that a script's function in a crash's frames on a dask worker reads as its
    file and line, not "<dynamic-code>". Process-wide (cloudpickle has no other hook), and
    only the name: a function pickles as before, with its file's name in place of that one."""
    table = cloudpickle.Pickler.dispatch_table
    if table.get(types.CodeType) is not _reduce_code:
        table[types.CodeType] = _reduce_code


class _CPickler(pickle.Pickler):
    """The C pickler (results going back to the parent), taught memoryviews."""
    dispatch_table = {**copyreg.dispatch_table, memoryview: _reduce_memoryview}


class _CloudPickler(cloudpickle.Pickler):
    """cloudpickle, taught memoryviews as buffers (its own reduction copies them to bytes),
    and ``extra`` reductions of this pickler's own."""
    dispatch_table = ChainMap({memoryview: _reduce_memoryview, types.CodeType: _reduce_code},
                              cloudpickle.Pickler.dispatch_table)

    def __init__(self, file: Any, protocol: int, buffer_callback: Any = None, extra: Optional[dict] = None):
        if extra:   # before __init__: the C pickler reads its dispatch table once, there
            self.dispatch_table = ChainMap(extra, type(self).dispatch_table)
        super().__init__(file, protocol=protocol, buffer_callback=buffer_callback)


class _Reusable:
    """One cloudpickle Pickler per thread, reused: building a Pickler costs more than
    pickling a small task's arguments. ``deps``, while a task's arguments are pickled,
    collects the keys of the Futures among them."""

    def __init__(self) -> None:
        self.file = io.BytesIO()
        self.buffers: list = []
        self.deps: Optional[dict] = None
        self.pickler = _CloudPickler(self.file, protocol=5, buffer_callback=self._keep)
        self._future_type: Optional[type] = None

    def _reduce_future(self, fut: Any) -> tuple:
        if self.deps is not None:
            self.deps[fut.key] = fut.client.id
        return (_placeholder, (fut.key, fut.client.id))

    def _know_futures(self) -> None:
        if _future_type is not None and self._future_type is not _future_type:
            self._future_type = _future_type
            self.pickler = _CloudPickler(self.file, protocol=5, buffer_callback=self._keep,
                                         extra={_future_type: self._reduce_future})

    def _keep(self, pb: pickle.PickleBuffer) -> bool:
        if pb.raw().nbytes >= OUT_OF_BAND:
            self.buffers.append(pb)
            return False
        return True

    def dumps(self, obj: Any) -> tuple[bytes, list]:
        f = self.file
        self._know_futures()
        try:
            self.pickler.dump(obj)
            return f.getvalue(), self.buffers
        finally:
            self.buffers = []
            self.pickler.clear_memo()
            f.seek(0)
            f.truncate()


def _pickler() -> _Reusable:
    p = getattr(_local, "pickler", None)
    if p is None:
        p = _local.pickler = _Reusable()
    return p


def _payload(meta: bytes, buffers: list) -> Payload:
    if not buffers and len(meta) < OUT_OF_BAND:     # most: small, all in the stream
        return Payload(meta, (), len(meta))
    nbytes = len(meta) + sum(pb.raw().nbytes for pb in buffers)
    if len(meta) >= OUT_OF_BAND:
        meta = pickle.PickleBuffer(meta)
    return Payload(meta, tuple(buffers), nbytes, seals_of(meta, buffers))


def dumps(obj: Any) -> Payload:
    return _payload(*_pickler().dumps(_wrap(obj)))


def loads(payload: Payload, store: Any = None) -> Any:
    """``store``: in the worker, where each Future among task arguments finds its value.
    Raises TransferError (its key and place left for the caller to fill in) when the bytes
    are not the ones that were pickled: no value is ever made of another value's bytes, and
    the user's data is never blamed for them."""
    if payload.seals:
        detail = broken_seal(payload)
        if detail is not None:
            raise TransferError("", "", detail)
    if store is None:
        return pickle.loads(payload.meta, buffers=payload.buffers)
    return _ArgsUnpickler(io.BytesIO(payload.meta), payload.buffers, store).load()


class _ArgsUnpickler(pickle.Unpickler):
    """Task arguments in the worker: each Future's placeholder becomes its value from ``store``."""

    def __init__(self, file: Any, buffers: Any, store: Mapping[str, Any]):
        super().__init__(file, buffers=buffers)
        self._store = store

    def find_class(self, module: str, name: str) -> Any:
        if module == __name__ and name == "_placeholder":
            store = self._store
            return lambda key, client_id=None: store[key]
        return super().find_class(module, name)


def self_contained(payload: Payload) -> bool:
    """True when the payload is a copy of its value rather than a view of its memory:
    most of it is in the pickle stream (a non-contiguous array, many small objects)."""
    meta = payload.meta
    return (len(meta) if type(meta) is bytes else meta.raw().nbytes) >= OUT_OF_BAND


def dumps_result(obj: Any) -> Payload:
    """A result going back to the parent: the C pickler when it can (several times
    faster for small values), cloudpickle for what only it can pickle (lambdas,
    classes made inside the task). Pickling by reference is safe in this direction:
    pickle checks that the name resolves to the very same object here."""
    if _plain((obj,)):
        # None, numbers, short strings: most results. The C pickler alone, without a Pickler
        # and a BytesIO made for each; the bytes are the same.
        return _payload(pickle.dumps(obj, protocol=5), [])
    buffers: list = []

    def keep(pb: pickle.PickleBuffer) -> bool:
        if pb.raw().nbytes >= OUT_OF_BAND:
            buffers.append(pb)
            return False
        return True
    f = io.BytesIO()
    try:
        _CPickler(f, protocol=5, buffer_callback=keep).dump(_wrap(obj))
    except Exception:
        return dumps(obj)
    return _payload(f.getvalue(), buffers)


# Argument types the C pickler writes exactly as cloudpickle does (so a pure key does
# not depend on the path taken) and that can hold neither a Future nor a large buffer.
_PLAIN = frozenset({int, float, bool, type(None), str, complex})


def _plain(args: tuple) -> bool:
    for a in args:
        t = type(a)
        if t not in _PLAIN and (t is not bytes or len(a) >= OUT_OF_BAND):
            return False
    return True


def dumps_plain_many(argss: list) -> Optional[list]:
    """The payloads of ``(args, {})`` for each ``args``, as ``dumps_collecting`` makes them,
    when every argument of every one is plain; else None. A big ``map`` in one loop."""
    out = []
    dumps, no_kwargs = pickle.dumps, {}  # type: ignore[var-annotated]
    for args in argss:
        if not _plain(args):
            return None
        meta = dumps((args, no_kwargs), 5)
        out.append(Payload(meta, (), len(meta)) if len(meta) < OUT_OF_BAND else _payload(meta, []))
    return out


_NO_KWARGS: dict = {}
_SMALL = 256        # str and bytes arguments kept unpickled: shorter than this


class PlainArgs(tuple):
    """The positional arguments of a task that are few, small and immutable (numbers, short
    strings and bytes, None), kept as they are and pickled as ``(args, {})`` only when its Run
    is sent.

    Stands in for a :class:`Payload` (``meta``, ``buffers``, ``nbytes``; pickles as one),
    for tasks with no pure key to hash: a large ``map(..., pure=False)`` hands its futures
    back without pickling each task's arguments, and a queued task holds this tuple, smaller
    than a Payload and its bytes (benchmarks/README.md has the figures). Nothing the caller
    holds can change the arguments meanwhile: each one is immutable."""
    __slots__ = ()
    buffers = seals = ()

    @property
    def meta(self) -> bytes:
        return pickle.dumps((tuple(self), _NO_KWARGS), 5)    # the bytes dumps_collecting makes

    @property
    def nbytes(self) -> int:
        return len(self.meta)

    def __reduce__(self) -> tuple:
        meta = self.meta
        return Payload(meta, (), len(meta)).__reduce__()

    def __eq__(self, other: Any) -> bool:      # as the Payload it stands for (1 == 1.0, but not their pickles)
        if type(other) is PlainArgs or type(other) is Payload:
            return not other.buffers and self.meta == other.meta
        return NotImplemented

    def __ne__(self, other: Any) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self) -> int:
        return hash(self.__reduce__())      # the Payload's hash

    def __repr__(self) -> str:
        return f"PlainArgs{tuple(self)!r}"


def _small_plain(args: tuple) -> bool:
    if len(args) > 16:
        return False
    for a in args:
        t = type(a)
        if t is str or t is bytes:
            if len(a) >= _SMALL:
                return False
        elif t not in _PLAIN:
            return False
    return True


def plain_args(args: tuple) -> Any:
    """``args`` kept unpickled when it may be, else None: a lone argument other than None
    as itself, several (or none, or a lone None) as a :class:`PlainArgs`. Its task's Run
    reads them back as a PlainArgs (:func:`task_args`). The lone argument of a loop of
    submits or of ``map(f, range(n))`` keeps no tuple: a queued task holds less."""
    if not _small_plain(args):
        return None
    return args[0] if len(args) == 1 and args[0] is not None else PlainArgs(args)


def plain_args_many(argss: list) -> Optional[list]:
    """:func:`plain_args` of each ``args``, or None if any may not be kept unpickled."""
    if not all(map(_small_plain, argss)):
        return None
    return [a[0] if len(a) == 1 and a[0] is not None else PlainArgs(a) for a in argss]


def task_args(kept: Any) -> Any:
    """A task's arguments as :func:`plain_args` kept them (or as pickled: a Payload), as a
    Payload or a PlainArgs: what a Run carries."""
    t = type(kept)
    return kept if t is Payload or t is PlainArgs else PlainArgs((kept,))


def dumps_collecting(obj: Any) -> tuple[Payload, dict]:
    """Pickle task arguments; returns the payload and the futures found inside, as
    {key: id of the client the future belongs to}."""
    args, kwargs = obj
    if not kwargs and _plain(args):
        # map(f, range(n)) and its kind: the C pickler alone, the cheapest way there is.
        return _payload(pickle.dumps(obj, protocol=5), []), {}
    p = _pickler()
    p.deps = deps = {}  # type: ignore[var-annotated]
    try:
        return _payload(*p.dumps(_wrap(obj))), deps
    finally:
        p.deps = None


def future_reduce(key: str, client_id: Optional[str] = None) -> tuple:
    """``Future.__reduce__``, for a Future pickled by anyone but us: a placeholder."""
    return (_placeholder, (key, client_id))


# future.py installs these (it sits above us): the Future type, which our picklers turn
# into placeholders, and how a placeholder unpickled in the parent becomes a Future again.
_future_type: Optional[type] = None
_parent_resolver: Optional[Callable[[str, Optional[str]], Any]] = None


def install_futures(future_type: type, resolve: Callable[[str, Optional[str]], Any]) -> None:
    global _future_type, _parent_resolver
    _future_type, _parent_resolver = future_type, resolve


def resolve_future(key: str, client_id: Optional[str] = None) -> Any:
    """What a Future pickled by ``key`` (of client ``client_id``, None: any) is in this process."""
    return _placeholder(key, client_id)


def _placeholder(key: str, client_id: Optional[str] = None) -> Any:
    if _parent_resolver is None:
        raise ValueError(f"a Future ({key!r}) was unpickled outside any task and any client")
    return _parent_resolver(key, client_id)


def pickle_function(fn: Any) -> bytes:
    f = io.BytesIO()
    _CloudPickler(f, protocol=5).dump(fn)
    return f.getvalue()


# --- exceptions -----------------------------------------------------------------------
#
# On the wire: (head, body, traceback). head is plain strings, always readable: type name,
# message, formatted traceback, step, and why the body is missing if it is. body is the
# exception pickled so that a class whose __init__ does not take its own args (a
# ``BadRecord(rec, why)`` that calls ``super().__init__(message)``) still comes back as
# itself, so ``except BadRecord`` works. Only when even that fails does a TaskError stand in.

def _default_reduce(cls: type) -> bool:
    return cls.__reduce__ is BaseException.__reduce__ and cls.__reduce_ex__ is object.__reduce_ex__


def _rebuild_exception(cls: type, args: tuple, state: Optional[dict], cause: Any, context: Any,
                       suppress: bool) -> BaseException:
    """pickle's way first (``cls(*args)``), then, when __init__ refuses those args, the
    instance is made without calling it: ``__new__``, its args and its ``__dict__``."""
    try:
        exc = cls(*args)
    except Exception:
        exc = cls.__new__(cls, *args)
        exc.args = args
    if state:
        exc.__dict__.update(state)
    exc.__cause__, exc.__context__, exc.__suppress_context__ = cause, context, suppress
    return exc


class _ExceptionPickler(cloudpickle.Pickler):
    chained = True      # False: drop __cause__/__context__ (a second try, when the chain cannot pickle)

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, BaseException) and _default_reduce(type(obj)):
            chain = (obj.__cause__, obj.__context__) if self.chained else (None, None)
            return (_rebuild_exception, (type(obj), obj.args, getattr(obj, "__dict__", None) or None, *chain,
                                         obj.__suppress_context__))
        return super().reducer_override(obj)


def _pickle_exception(exc: BaseException, chained: bool) -> bytes:
    f = io.BytesIO()
    p = _ExceptionPickler(f, protocol=5)
    p.chained = chained
    p.dump(exc)
    return f.getvalue()


def dumps_exception(exc: BaseException, step: str = "") -> bytes:
    """``exc`` with its traceback (tblib) and, beside it, what a stand-in needs if the
    parent cannot rebuild it."""
    tb_text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    if sys.version_info < (3, 11):     # 3.11+ prints the notes (remote.note_origin's among them)
        tb_text += "".join(f"{n}\n" for n in getattr(exc, "__notes__", None) or ())
    try:
        from tblib import Traceback
        tb = Traceback(exc.__traceback__).to_dict() if exc.__traceback__ else None
    except Exception:  # pragma: no cover - tblib failing must not hide the real error
        tb = None
    body, why = None, ""
    for chained in (True, False):
        try:
            body = _pickle_exception(exc, chained)
            break
        except Exception as e:
            why = f"{type(e).__name__}: {e}"
    head = (_qualname(type(exc)), _message(exc), tb_text, step, why)
    return pickle.dumps((head, body, tb), protocol=5)


def as_exception(error: Any, key: Optional[str] = None) -> BaseException:
    """A task's error as the scheduler holds it (pickled bytes, or an exception) -> the exception."""
    return error if isinstance(error, BaseException) else loads_exception(error, key)


def loads_exception(data: bytes, key: Optional[str] = None) -> BaseException:
    """The exception a task ended with (``key``: that task, for the message of a stand-in)."""
    from ..death import TaskError
    (type_name, message, tb_text, step, why), body, tb = pickle.loads(data)
    if body is None:
        return TaskError(type_name, message, tb_text, _join(step, f"the exception could not be pickled on the "
                                                                 f"worker ({why})"))
    try:
        exc = pickle.loads(body)
    except Exception as e:
        return TaskError(type_name, message, tb_text, _join(
            step, f"the exception could not be unpickled in the parent ({type(e).__name__}: {e}). Pass every "
                  f"argument of its __init__ to super().__init__(...) so it can be rebuilt, and make sure "
                  f"the parent can import its class"))
    if tb is not None:
        try:
            from tblib import Traceback
            exc = exc.with_traceback(detached_traceback(Traceback.from_dict(tb)))
        except Exception:  # pragma: no cover
            pass
    explain_here(exc)
    if not isinstance(exc, Exception):
        # SystemExit or KeyboardInterrupt from a task must not end or interrupt the caller
        return TaskError(type_name, _stopping(exc, tb_text, key), tb_text, step, original=exc)
    return exc


def _stopping(exc: BaseException, tb_text: str, key: Optional[str]) -> str:
    frames = [l.strip() for l in tb_text.splitlines() if l.strip().startswith("File ")]
    where = f" at {frames[-1]}" if frames else ""
    task = f"task {key!r}" if key else "the task"
    if isinstance(exc, SystemExit):
        what = f"{task} called sys.exit({exc.code!r}) (SystemExit, exit code {exc.code!r}){where}"
    else:
        what = f"{type(exc).__name__} was raised inside {task}{where}"
    return (f"{what}. It fails only this task: the caller gets this TaskError, and .original holds the "
            f"{type(exc).__name__}")


def _message(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # noqa: BLE001 - a broken __str__ must not hide the error itself
        return f"<{type(exc).__name__} whose str() fails>"


def _join(step: str, why: str) -> str:
    return f"{step}; {why}" if step else why


def serialization_error(exc: BaseException, step: str) -> BaseException:
    """The same kind of exception, its message prefixed with the step that failed
    ("pickling the result of task 'f-1' failed on worker 'worker-0': ...")."""
    from ..death import TaskError
    if isinstance(exc, TransferError):      # the bytes are not the data's: never blame the data
        return TransferError(exc.key or "the arguments", exc.where or f"read while {step}", exc.detail)
    if isinstance(exc, ImportError):
        why = "every module the function and the data refer to must be importable there"
    else:
        why = "the worker is fine; the data must be picklable with cloudpickle"
    msg = f"{step}: {type(exc).__name__}: {exc}. {why[0].upper()}{why[1:]}."
    try:
        new = type(exc)(msg)
        if str(new) != msg:
            raise TypeError
        if isinstance(exc, ImportError):     # which module: remote.note_origin names it
            new.name, new.path = exc.name, exc.path  # type: ignore[attr-defined]  # an ImportError too
    except Exception:
        new = TaskError(_qualname(type(exc)), str(exc), "".join(traceback.format_exception(exc)), step)
    new.__cause__ = None
    return new.with_traceback(exc.__traceback__)


def _qualname(cls: type) -> str:
    mod = cls.__module__
    return cls.__qualname__ if mod in ("builtins", "__main__") else f"{mod}.{cls.__qualname__}"


def describe(obj: Any) -> str:
    text = repr(obj)
    return text if len(text) <= 80 else text[:77] + "..."
