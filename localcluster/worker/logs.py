"""A worker's Python ``logging`` records, carried to the parent and handled there by the
logger ``localcluster.worker``, so the user's own handlers see them.

Worker side: ``Forwarder`` sits on the worker's root logger. It flattens each record
(message formatted, exception text rendered, anything unpicklable turned into its repr)
and hands it to the worker, which sends it on its channel: WARNING and above at once
(they may be the last words before a crash), lower levels batched with the next results.
The worker's root level is INFO (lower if the parent's ``localcluster.worker`` level is
lower when it starts), so a DEBUG record nobody asked for is never made; the parent
filters the rest by its level at the time the record arrives.

Parent side: ``emit`` rebuilds each record with its level, logger name, time and
``record.worker`` (the worker's name) kept, adds a line to the worker's log (what
``get_worker_logs`` and a death's log tail show), and passes it to
``logging.getLogger("localcluster.worker")``. With no handler configured anywhere, it is
written to stderr with the worker's name, as the worker's own stderr would have been.
"""
from __future__ import annotations

import logging
import sys
import threading
from typing import Any, Callable

LOGGER = "localcluster.worker"
_PLAIN = (str, int, float, bool, type(None))


def flatten(record: logging.LogRecord) -> dict:
    """The record as a dict of plain values that pickles anywhere."""
    d = dict(record.__dict__)
    d["msg"] = record.getMessage()
    d["args"] = None
    if record.exc_info:
        d["exc_text"] = record.exc_text or logging.Formatter().formatException(record.exc_info)
    d["exc_info"] = None
    for k, v in d.items():
        if not isinstance(v, _PLAIN):
            d[k] = repr(v)
    return d


class Forwarder(logging.Handler):
    """``send(record_dict, urgent)`` for every record; re-entry (a record logged while one is
    being sent, on the same thread) is dropped rather than deadlocking on the channel."""

    def __init__(self, send: Callable[[dict, bool], None]):
        super().__init__()
        self._send = send
        self._busy = threading.local()

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(self._busy, "on", False):
            return
        self._busy.on = True
        try:
            self._send(flatten(record), record.levelno >= logging.WARNING)
        except Exception:  # noqa: BLE001 - logging must never break the task that logged
            self.handleError(record)
        finally:
            self._busy.on = False


def install(send: Callable[[dict, bool], None], level: int) -> Forwarder:
    """In a worker: forward every record of the root logger from ``level`` up."""
    handler = Forwarder(send)
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(level)
    return handler


def worker_level() -> int:
    """The level a worker forwards from: INFO, or lower when the parent already wants lower.
    Not simply the parent's level: a notebook often sets INFO after the workers started."""
    return min(logging.getLogger(LOGGER).getEffectiveLevel(), logging.INFO)


#: a worker's record with this attribute (``extra={ONCE: what}``) says something true of the
#: whole cluster (its journal's disk is full): the parent hands it on once, whichever worker
#: says it first; the others' go into their own logs only
ONCE = "localcluster_once"


def emit(worker: str, records: Any, add_line: Callable[[str], None], to_logging: bool, below: int = 0,
         said: "dict | None" = None) -> None:
    """In the parent: each record into the worker's log and, with ``to_logging``, those of level
    ``below`` and up (``LocalCluster(silence_logs=)``) to the ``localcluster.worker`` logger's
    handlers; a record marked ``ONCE`` only if its mark is not in ``said`` (the cluster's: mark ->
    the worker that said it first; any thread, setdefault being atomic) for another worker."""
    logger = logging.getLogger(LOGGER)
    for d in records:
        record = logging.makeLogRecord(d)
        record.worker = worker
        line = f"{record.levelname} {record.name}: {record.msg}"
        if record.exc_text:
            line += "\n" + record.exc_text
        for part in line.splitlines():
            add_line(part)
        once = d.get(ONCE)
        if said is not None and once is not None and said.setdefault(once, worker) != worker:
            continue
        if not to_logging or record.levelno < below or not logger.isEnabledFor(record.levelno):
            continue
        if logger.hasHandlers():
            logger.handle(record)
        elif record.levelno >= logging.WARNING:      # what logging's last resort would print, named
            sys.stderr.write(f"[{worker}] {line}\n")
