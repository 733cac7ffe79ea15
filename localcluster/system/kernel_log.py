"""What the kernel log says of a process that ended unseen: an OOM kill (oom.py's
``Killed process <pid>``, with the ``oom-kill:`` line that names the group whose limit ran
out) or a fatal fault (``<name>[<pid>]: segfault at ...``, with the library it was in).

The log is read whole, from its oldest record still in the ring buffer, once per process
and only when a run is to be explained. Its timestamps (microseconds after boot, not
counting suspend: CLOCK_MONOTONIC's clock) keep a record of an earlier process with the
same pid out; a run's start is read on that clock (``clock``), not on its own, which a
time namespace (a container's, ``unshare --time``) moves. As oom.py, only in the initial
PID namespace: elsewhere the log's pids are not ours. The kernel writes a segfault line
only for a fault no handler caught, and at most ten in five seconds: a process with
``faulthandler`` on, or one among many crashing at once, leaves none.

Pure parsing first, then the one function that reads /dev/kmsg; any thread.
"""
from __future__ import annotations

import os
import re
import time
from typing import NamedTuple, Optional, Union

from .oom import KMSG, Kill, parse_kmsg

__all__ = ["Fault", "Unreadable", "clock", "evidence", "monotonic_offset", "parse_fault", "read"]


class Fault(NamedTuple):
    """One fatal fault of a process, as the kernel logged it."""
    pid: int
    signal: str                 # SIGSEGV, SIGILL, SIGFPE
    library: Optional[str]      # the file the faulting instruction was in ("libc.so.6"), if named
    line: str


class Unreadable(NamedTuple):
    """Why the kernel log could not be read: said in the message instead of a guess."""
    reason: str


# "python3[29449]: segfault at 0 ip ... error 4 in libc.so.6[167ad8,7f30d3844000+156000] ..."
# "traps: python3[29449] general protection fault ip:... error:0 in libfoo.so[...]"
_FAULT = re.compile(r"^(?:traps: )?\S.*?\[(\d+)\]:? (?:trap )?(segfault at|general protection|invalid opcode|"
                    r"divide error)")
_SIGNALS = {"segfault at": "SIGSEGV", "general protection": "SIGSEGV", "invalid opcode": "SIGILL",
            "divide error": "SIGFPE"}
_LIBRARY = re.compile(r" in ([^\s\[]+)\[")


def _split(record: str) -> tuple[Optional[float], str]:
    """(seconds after boot, first message line) of one /dev/kmsg record."""
    head, _, rest = record.partition(";")
    parts = head.split(",")
    try:
        seconds: Optional[float] = int(parts[2]) / 1e6
    except (IndexError, ValueError):
        seconds = None
    return seconds, rest.split("\n", 1)[0]


def parse_fault(record: str) -> Optional[Fault]:
    """A ``Fault`` for a record of a fatal fault, else None."""
    _, message = _split(record)
    m = _FAULT.match(message)
    if not m:
        return None
    lib = _LIBRARY.search(message, m.end())
    return Fault(int(m.group(1)), _SIGNALS[m.group(2)], lib.group(1) if lib else None,
                 message.split(" likely on CPU")[0].strip())


def evidence(records: list, pid: int, since: Optional[float]) -> "Optional[Union[Kill, Fault]]":
    """The first OOM kill or fault of ``pid`` logged at ``since`` (seconds after boot) or
    later, with a second's slack: the kernel's clock and ours drift apart a little."""
    context: Optional[Kill] = None
    for record in records:
        seconds, _ = _split(record)
        kill = parse_kmsg(record)
        if kill is not None and not kill.line:
            context = kill                    # the context line comes just before its kill
            continue
        if since is not None and seconds is not None and seconds < since - 1.0:
            context = None
            continue
        if kill is not None:
            if kill.pid == pid:
                if context is not None and context.pid == pid:
                    return Kill(pid, kill.line, context.constraint, context.oom_memcg, context.task_memcg)
                return kill
            context = None
            continue
        fault = parse_fault(record)
        if fault is not None and fault.pid == pid:
            return fault
    return None


def clock() -> float:
    """Now, on the kernel log's clock: CLOCK_MONOTONIC as the machine reads it. In a time
    namespace this process's monotonic clock is moved by the namespace's offset, which the
    log's timestamps do not have: compared with them as read, a run started an hour ago
    could take an earlier process's record of its pid for its own."""
    try:
        with open("/proc/self/timens_offsets") as f:
            offset = monotonic_offset(f.read())
    except OSError:            # no time namespaces here (before Linux 5.6, or not Linux)
        offset = 0.0
    return time.clock_gettime(time.CLOCK_MONOTONIC) - offset


def monotonic_offset(text: str) -> float:
    """The monotonic clock's offset, in seconds, in ``/proc/self/timens_offsets``' ``text``
    (lines of a clock, seconds and nanoseconds); 0 when it names none."""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] in ("monotonic", str(time.CLOCK_MONOTONIC)):
            return int(parts[1]) + int(parts[2]) / 1e9
    return 0.0


def _init_pid_namespace() -> bool:
    try:
        return os.stat("/proc/self/ns/pid").st_ino == 0xEFFFFFFC      # PROC_PID_INIT_INO
    except OSError:
        return False


def read(limit: int = 1 << 16) -> "Union[list, Unreadable]":
    """Every record still in the kernel's ring buffer (at most ``limit``), oldest first, or
    why it cannot be read. Never blocks."""
    if not _init_pid_namespace():
        return Unreadable("this process is not in the machine's initial PID namespace (a container), "
                          "where the kernel log's pids are not its own")
    try:
        fd = os.open(KMSG, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:            # not Linux, or no CAP_SYSLOG under kernel.dmesg_restrict
        return Unreadable(f"{KMSG} is not readable here ({e.strerror or e})")
    out: list = []
    try:
        while len(out) < limit:
            try:
                data = os.read(fd, 8192)
            except BlockingIOError:
                break
            except BrokenPipeError:     # overwritten while we read: the next read goes on
                continue
            except OSError as e:
                return Unreadable(f"{KMSG} could not be read ({e.strerror or e})")
            if not data:
                break
            out.append(data.decode("utf-8", "replace"))
    finally:
        os.close(fd)
    return out
