"""User data <-> :class:`~localcluster.protocol.Payload`, exceptions <-> bytes.

cloudpickle so that functions from ``__main__``, a notebook cell, a lambda or a
closure travel; pickle protocol 5 so that large buffers (numpy arrays, bytes,
bytearrays) stay out of the pickle stream and cross as shared memory.

Futures inside arguments pickle as placeholders (``Future.__reduce__``): the
parent records them as dependencies while pickling, the worker swaps each one
for the value in its store while unpickling. Non-future objects pay nothing.
"""
from __future__ import annotations

import io
import pickle
import threading
import traceback
from typing import Any, Optional

import cloudpickle

from .protocol import Payload

OUT_OF_BAND = 1 << 16        # buffers at least this large leave the pickle stream
_local = threading.local()


class _Reusable:
    """One cloudpickle Pickler per thread, reused: building a Pickler costs more than
    pickling a small task's arguments."""

    def __init__(self) -> None:
        self.file = io.BytesIO()
        self.buffers: list = []
        self.pickler = cloudpickle.Pickler(self.file, protocol=5, buffer_callback=self._keep)

    def _keep(self, pb: pickle.PickleBuffer) -> bool:
        if pb.raw().nbytes >= OUT_OF_BAND:
            self.buffers.append(pb)
            return False
        return True

    def dumps(self, obj: Any) -> tuple[bytes, list]:
        f = self.file
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


def dumps(obj: Any) -> Payload:
    meta, buffers = _pickler().dumps(obj)
    nbytes = len(meta) + sum(pb.raw().nbytes for pb in buffers)
    if len(meta) >= OUT_OF_BAND:
        meta = pickle.PickleBuffer(meta)
    return Payload(meta, tuple(buffers), nbytes)


def loads(payload: Payload) -> Any:
    return pickle.loads(payload.meta, buffers=payload.buffers)


def dumps_result(obj: Any) -> Payload:
    """A result going back to the parent: the C pickler when it can (several times
    faster for small values), cloudpickle for what only it can pickle (lambdas,
    classes made inside the task). Pickling by reference is safe in this direction:
    pickle checks that the name resolves to the very same object here."""
    buffers: list = []

    def keep(pb: pickle.PickleBuffer) -> bool:
        if pb.raw().nbytes >= OUT_OF_BAND:
            buffers.append(pb)
            return False
        return True
    try:
        meta = pickle.dumps(obj, protocol=5, buffer_callback=keep)
    except Exception:
        return dumps(obj)
    nbytes = len(meta) + sum(pb.raw().nbytes for pb in buffers)
    if len(meta) >= OUT_OF_BAND:
        meta = pickle.PickleBuffer(meta)
    return Payload(meta, tuple(buffers), nbytes)


def dumps_collecting(obj: Any) -> tuple[Payload, tuple]:
    """Pickle task arguments; returns the payload and the keys of the futures found inside."""
    prev = getattr(_local, "deps", None)
    _local.deps = deps = {}
    try:
        return dumps(obj), tuple(deps)
    finally:
        _local.deps = prev


def future_reduce(key: str, client_id: Optional[str] = None) -> tuple:
    """``Future.__reduce__``: record the dependency, leave a placeholder."""
    deps = getattr(_local, "deps", None)
    if deps is not None:
        deps[key] = None
    return (_placeholder, (key,))


def _placeholder(key: str) -> Any:
    store = getattr(_local, "store", None)
    if store is None:
        from .future import _future_from_key
        return _future_from_key(key)
    return store[key]


class resolving:
    """Context in the worker: placeholders unpickle to values from ``store``."""

    def __init__(self, store: Any):
        self.store = store

    def __enter__(self) -> None:
        self.prev = getattr(_local, "store", None)
        _local.store = self.store

    def __exit__(self, *exc: object) -> None:
        _local.store = self.prev


def pickle_function(fn: Any) -> bytes:
    return cloudpickle.dumps(fn, protocol=5)


# --- exceptions -----------------------------------------------------------------------

def dumps_exception(exc: BaseException, step: str = "") -> bytes:
    """Pickle ``exc`` with its traceback (tblib). If it cannot be pickled, a TaskError
    that keeps the type name, message and formatted traceback stands in."""
    from .death import TaskError
    tb_text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        from tblib import Traceback
        tb = Traceback(exc.__traceback__).to_dict() if exc.__traceback__ else None
    except Exception:  # pragma: no cover - tblib failing must not hide the real error
        tb = None
    try:
        data = cloudpickle.dumps((exc, tb, step), protocol=5)
        pickle.loads(data)  # an exception can pickle yet fail to unpickle (bad __init__ signature)
        return data
    except Exception as e:
        why = f"the exception could not be pickled ({type(e).__name__}: {e})"
        stand_in = TaskError(_qualname(type(exc)), str(exc), tb_text, f"{step}; {why}" if step else why)
        return cloudpickle.dumps((stand_in, None, step), protocol=5)


def loads_exception(data: bytes) -> BaseException:
    exc, tb, _step = pickle.loads(data)
    if tb is not None:
        try:
            from tblib import Traceback
            exc = exc.with_traceback(Traceback.from_dict(tb).as_traceback())
        except Exception:  # pragma: no cover
            pass
    return exc


def restate(exc: BaseException, step: str) -> BaseException:
    """The same kind of exception, its message prefixed with the step that failed
    ("pickling the result of task 'f-1' failed on worker 'worker-0': ...")."""
    from .death import TaskError
    msg = f"{step}: {type(exc).__name__}: {exc}. The worker is fine; the data must be picklable with cloudpickle."
    try:
        new = type(exc)(msg)
        if str(new) != msg:
            raise TypeError
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
