"""A worker's stdout and stderr as the parent reads them.

Each stream is a non-blocking pipe. Its complete lines go into the worker's log
(``Nanny.log``, what ``get_worker_logs`` and ``WorkerDeath.log_tail`` show) and, when
forwarding is on, to the parent's stream of the same name: a print in a task stays
stdout, a warning stays stderr (a notebook shows only the second in red).

faulthandler's dumps (a crash, a hung worker's stacks, ``dump_stacks``) are kept in
the log but not forwarded unless ``forward_logs="all"``: the death's one-line summary
and the exception already say what the dump says, and the dump of every thread of
localcluster's own machinery is noise to a user reading the console.
"""
from __future__ import annotations

import os
import re
import sys
from typing import Callable, Optional

from ..worker.process import STACKS_HEAD, STACKS_TAIL

#: the line after the stacks a worker wrote for a request of dump_stacks, with its number
STACKS_TAIL_LINE = re.compile("^" + re.escape(STACKS_TAIL).replace(r"\{\}", r"(\d+)") + "$")
_STACKS_HEAD_LINE = re.compile("^" + re.escape(STACKS_HEAD).replace(r"\{\}", r"\d+") + "$")
# The first line of a faulthandler dump: the fatal-error banner, or a thread header
# (``dump_traceback`` of every thread starts with one), or the line before the stacks asked for.
_DUMP_START = re.compile(r"^(Fatal Python error: |(Current thread|Thread) 0x[0-9a-fA-F]+\b.*\(most recent call first\):"
                         r"|Stack \(most recent call first\):)|" + _STACKS_HEAD_LINE.pattern)
# What may follow inside a dump: indented frames, blank lines, more thread headers, the
# trailing module and runtime-state lines, and the line after the stacks asked for.
_DUMP_BODY = re.compile(r"^(|  .*|(Current thread|Thread) 0x.*|Stack \(most recent call first\):.*"
                        r"|Extension modules: .*|Python runtime state: .*|<.*>)$|" + STACKS_TAIL_LINE.pattern)


class DumpFilter:
    """Tells, line by line, whether a line belongs to a faulthandler dump."""

    def __init__(self) -> None:
        self.inside = False

    def is_dump(self, line: str) -> bool:
        if _DUMP_START.match(line):
            self.inside = True
        elif self.inside and not _DUMP_BODY.match(line):
            self.inside = False
        return self.inside


class OutputStream:
    """One pipe of one worker. Owned by the scheduler thread (it reads the pipe when
    the selector says it is readable, and once more after the worker is reaped)."""

    def __init__(self, fd: int, name: str, keep: Callable[[str], None], forward: Optional[str],
                 prefix: str) -> None:
        self.fd = fd
        self.name = name                  # "stdout" or "stderr"
        self._keep = keep
        self._forward = forward           # None, "output" (all but dumps) or "all"
        self._prefix = prefix
        self._partial = b""
        self._dumps = DumpFilter()
        os.set_blocking(fd, False)

    def read(self) -> bool:
        """Take what the worker wrote; False at end of file."""
        eof = False
        chunks = []
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            except OSError:
                eof = True
                break
            if not data:
                eof = True
                break
            chunks.append(data)
        if chunks or (eof and self._partial):
            lines = (self._partial + b"".join(chunks)).split(b"\n")
            self._partial = lines.pop()
            if eof and self._partial:
                lines.append(self._partial)
                self._partial = b""
            for raw in lines:
                self._line(raw.decode(errors="replace"))
            if self._forward and self.name == "stdout":
                _flush(sys.stdout)      # a redirected stdout is block-buffered: show it now
        return not eof

    def _line(self, line: str) -> None:
        dump = self._dumps.is_dump(line)
        # forwarded before it is kept: a line readers find in the log is already shown
        if self._forward == "all" or (self._forward == "output" and not dump):
            target = sys.stdout if self.name == "stdout" else sys.stderr
            try:
                target.write(f"{self._prefix}{line}\n")
            except Exception:  # pragma: no cover - a closed stream must not kill the loop
                pass
        self._keep(line)


def _flush(stream) -> None:
    try:
        stream.flush()
    except Exception:  # pragma: no cover - a closed stream must not kill the loop
        pass
