"""What a task's thread knows about where it runs: this process's Worker, the run the thread
executes, and whether that run seceded or rejoined (process.py writes them; get_client,
secede, get_worker in client.py, the joblib backend and ``cancelled`` read them).
"""
from __future__ import annotations

import os
import signal
import threading
from typing import Any, Optional

#: per executor thread: ``run`` (the Run it executes, or None), ``row``, ``seceded``, ``rejoined``
here = threading.local()
_worker: Optional[Any] = None        # this process's Worker, once boot.py made it
#: called (any thread, never raising) before the worker sends the replies it has gathered:
#: what a reply's result left to finish (a journal's rows) is finished first. Empty unless a
#: task ran with a journal.
before_reply: list = []
_in_worker = False
#: the fd of the run's end note (boot.py), written when the parent is gone; -1 without one
end_note = -1
#: the signal a worker gets when its parent dies, with an end note to write; the last
#: real-time ones are the least likely to be a library's
END_SIGNAL = getattr(signal, "SIGRTMAX", 64) - 3


def started(worker: Optional[Any] = None) -> None:
    """This process is a worker (boot.py's ``main`` says so first), and ``worker`` its Worker
    once made: what ``in_worker``, ``current`` and ``cancelled`` read."""
    global _in_worker, _worker
    _in_worker = True
    if worker is not None:
        _worker = worker


def current() -> tuple:
    """(this process's Worker or None, the run this thread executes or None)."""
    return _worker, getattr(here, "run", None)


def in_worker() -> bool:
    """Whether this process is a localcluster worker (code that would start a cluster of its
    own, such as the joblib backend, runs in the task's thread instead)."""
    return _in_worker


def cancelled() -> bool:
    """Whether the task running on this thread was cancelled (its caller gave up on it):
    work made of steps, such as a joblib batch of calls, stops at the next one."""
    run = getattr(here, "run", None)
    return _worker is not None and run is not None and run.seq in _worker.cancelled


# Worker plugins (worker/setup.py registers them): called with (key, start, finish) around each
# run, and at a clean exit. Empty unless a plugin is registered: one truth test a run.
watchers: list = []           #: callables (key, start, finish)
closing: list = []            #: callables (), run once when the worker exits cleanly


def notify(key: str, start: str, finish: str) -> None:
    """Each watcher hears of a run's transition; one that raises is logged, the run goes on."""
    for watch in list(watchers):
        try:
            watch(key, start, finish)
        except Exception:  # noqa: BLE001 - a plugin's error must not fail the task
            import logging
            logging.getLogger("localcluster.worker").exception("a worker plugin's transition(%r, %r, %r) raised",
                                                                key, start, finish)


def close() -> None:
    """The worker exits cleanly: each closing call runs (a plugin's teardown), errors logged."""
    for call in list(closing):
        try:
            call()
        except Exception:  # noqa: BLE001 - the exit goes on
            import logging
            logging.getLogger("localcluster.worker").exception("a worker plugin's teardown raised")


def parent_gone() -> None:
    """The parent is gone (EOF on the channel): say so in the run's end note, if there is
    one, before the process exits. Its time is what a later run reads."""
    if end_note >= 0:
        try:
            os.write(end_note, b"the channel to the parent closed\n")
        except OSError:
            pass
