"""``Client.run`` on a worker: the function of a ``Call``, run on a short thread of its own
(process.py starts it: a worker whose every slot is busy still answers, and a long function
never stops the channel's reader), answered with a ``Called``. The calls of one queue (an
actor's) run one after another on one such thread, in the order they came. An async function is run to
its end, as dask does. The error of a step before or after the function itself (unpickling
it or its arguments, pickling the result) says which step failed, on which worker.
"""
from __future__ import annotations

import os
import pickle
from typing import Any

from ..wire import protocol as P
from ..wire import remote, serialize


def answer(msg: P.Call, worker: str) -> P.Called:
    """Run ``Client.run``'s function on this thread: Called with its result, or its error (one
    that happens unpickling the function or its arguments, or pickling the result, says so)."""
    step = "unpickling the function"
    try:
        fn = pickle.loads(msg.fn)
        step = "unpickling the arguments"
        args, kwargs = serialize.loads(msg.args)
        step = "running the function"
        result = fn(*args, **kwargs)
        if _awaitable(result):         # dask runs an async function to its end
            import asyncio
            result = asyncio.run(_awaited(result))
        step = "pickling the result"
        reply = P.Called(msg.request, serialize.dumps_result(result), None)
    except BaseException as e:  # noqa: B902 - any error of the function is its answer
        e.__traceback__ = remote.strip_own_frames(e.__traceback__)
        what = "" if step == "running the function" else f"{step} of client.run() failed on worker {worker!r}"
        if what:
            e = serialize.serialization_error(e, what)
        remote.note_origin(e, worker, os.getpid(), f"client.run({getattr(fn, '__name__', '?')})"
                           if step != "unpickling the function" else "client.run")
        reply = P.Called(msg.request, None, serialize.dumps_exception(e, what))
    return reply


def _awaitable(obj: Any) -> bool:
    return hasattr(obj, "__await__") and not isinstance(obj, type)


async def _awaited(obj: Any) -> Any:
    return await obj
