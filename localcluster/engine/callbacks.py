"""The callbacks thread: users' done-callbacks that would otherwise run on the scheduler
thread, where a ``result()`` that must fetch data from a worker would wait on the very
thread that delivers it.

Thread: started on first use (``localcluster-callbacks``); ``run`` and ``close`` may be
called from any thread. Owns: its queue and its thread.
"""
from __future__ import annotations

import logging
import queue
import threading
from typing import Any, Callable, Optional

from ..system.machine import block_interrupts

logger = logging.getLogger("localcluster")


class CallbackThread:
    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()

    def run(self, fn: Callable, fut: Any) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._main, name="localcluster-callbacks", daemon=True)
                self._thread.start()
        self._queue.put((fn, fut))

    def close(self, timeout: float) -> None:
        with self._lock:
            thread = self._thread
        if thread is None:
            return
        self._queue.put(None)
        if threading.current_thread() is not thread:
            thread.join(timeout)

    def _main(self) -> None:
        block_interrupts()
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, fut = item
            try:
                fn(fut)
            except Exception:
                logger.exception("exception calling callback for %r", fut)
            # Not held while waiting for the next one: the last future (and its data on a
            # worker, and whatever the callback closes over) must be freeable at once.
            del item, fn, fut
