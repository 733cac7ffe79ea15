"""The per-user run registry on disk, and who a process is: where each run of a cluster
keeps its record, so that a later process can tell how it ended (runs.py says it).

One small JSON file per run, replaced whole (write a temporary file, then ``rename``),
rather than one SQLite database: each file has exactly one writer, the run's own process,
so two processes never contend for a lock, and a reader sees a record whole or not at all;
a damaged file costs that one run, never the registry; and the cache directory is often a
home directory on NFS, where SQLite's locking is unreliable and a rename is still atomic.
A run's file is named by its start, so the names sort oldest first, and its state is the
suffix: ``.run.json`` (alive, closed or ended unseen) and ``.told.json`` (ended without
closing, and reported). Reporting is a ``rename`` from the one to the other: of two
processes starting at once, exactly one succeeds, and only it says so.

Pure functions over files and /proc; any thread.
"""
from __future__ import annotations

import json
import os
import socket
import time
from typing import Iterator, NamedTuple, Optional

__all__ = ["END", "KEEP", "RUN", "TOLD", "Identity", "directory", "file_name", "identity", "load", "mark_told",
           "process_start", "records", "remove_oldest", "write"]

KEEP = 100                  # runs kept; the oldest files go as new runs start
RUN, TOLD = ".run.json", ".told.json"
END = ".end"                 # a run's end note, which its workers write if its process dies
BOOT_ID = "/proc/sys/kernel/random/boot_id"


class Identity(NamedTuple):
    """What tells one process apart from any other, now or later: its pid, when it started
    (a pid reused is another start), the boot it runs in, and where (a home shared over NFS
    holds other machines' runs; another PID namespace names other processes by our pids)."""
    pid: int
    start: Optional[int]      # /proc/<pid>/stat starttime, in clock ticks after boot; None off Linux
    boot: Optional[str]
    host: str
    pid_ns: Optional[int]     # the inode of its PID namespace


def directory() -> str:
    """``$XDG_CACHE_HOME/localcluster``, else ``~/.cache/localcluster`` (read now: a test
    points it elsewhere)."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):          # the XDG spec: a relative one is to be ignored
        base = os.path.join(os.path.expanduser("~"), ".cache")
    if not os.path.isabs(base):          # no home: never a folder relative to wherever we are
        base = os.path.join(os.path.abspath(os.sep), "nonexistent-home", ".cache")
    return os.path.join(base, "localcluster")


def process_start(pid: "int | str" = "self") -> tuple[Optional[int], Optional[str]]:
    """(starttime in clock ticks after boot, state letter) of ``pid`` from /proc, or (None, None)
    when it is gone or unreadable. A zombie ("Z") runs nothing any more."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode("ascii", "replace")
    except OSError:
        return None, None
    fields = text[text.rfind(")") + 2:].split()     # the name may hold spaces and parentheses
    try:
        return int(fields[19]), fields[0]
    except (IndexError, ValueError):
        return None, None


def _read_text(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def identity(pid: "int | str" = "self") -> Identity:
    """This process's Identity (``pid``: another's, as far as /proc shows it)."""
    try:
        ns: Optional[int] = os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        ns = None
    return Identity(os.getpid() if pid == "self" else int(pid), process_start(pid)[0], _read_text(BOOT_ID),
                    socket.gethostname(), ns)


def _ensure(folder: str) -> None:
    os.makedirs(folder, mode=0o700, exist_ok=True)
    if os.stat(folder).st_mode & 0o077:       # made by someone else with a looser umask: ours to keep private
        os.chmod(folder, 0o700)


def write(folder: str, name: str, record: dict) -> None:
    """Replace ``name`` (a run's file) with ``record``, whole: a reader sees the old record or
    the new one. Not synced to disk: a record lost with the machine is the last second's.
    OSError naming the path when it cannot be written."""
    try:
        _ensure(folder)
        path = os.path.join(folder, name)
        tmp = f"{path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, json.dumps(record, separators=(",", ":")).encode())
        finally:
            os.close(fd)
        os.rename(tmp, path)
    except (OSError, TypeError, ValueError) as e:
        try:
            os.unlink(f"{os.path.join(folder, name)}.{os.getpid()}.tmp")
        except OSError:
            pass
        raise OSError(f"{os.path.join(folder, name)}: {e}") from None


def records(folder: str) -> Iterator[str]:
    """The names of the run files in ``folder``, oldest first (empty if there is none)."""
    try:
        names = os.listdir(folder)
    except OSError:
        return iter(())
    return iter(sorted(n for n in names if n.endswith((RUN, TOLD))))


def load(folder: str, name: str) -> Optional[dict]:
    """One record, or None when it went meanwhile; ValueError naming the path when it is
    damaged or unreadable."""
    path = os.path.join(folder, name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ValueError(f"{path}: {e}") from None
    try:
        with os.fdopen(fd, "rb") as f:
            data = f.read(1 << 20)
    except OSError as e:
        raise ValueError(f"{path}: {e}") from None
    try:
        record = json.loads(data)
    except ValueError as e:     # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ValueError(f"{path}: not a run record ({e})") from None
    if not isinstance(record, dict):
        raise ValueError(f"{path}: not a run record (a JSON {type(record).__name__})")
    return record


def mark_told(folder: str, name: str) -> bool:
    """Claim a run's report: True for the one process whose rename succeeds."""
    try:
        os.rename(os.path.join(folder, name), os.path.join(folder, name[:-len(RUN)] + TOLD))
    except OSError:
        return False
    return True


def remove_oldest(folder: str, keep: int = KEEP) -> None:
    """Bound the registry to the newest ``keep`` runs (and leftover temporary files and end
    notes of processes long gone)."""
    names = list(records(folder))
    for name in names[:max(0, len(names) - keep)]:
        stem = name[:-len(RUN if name.endswith(RUN) else TOLD)]
        for path in (os.path.join(folder, name), os.path.join(folder, stem + END)):
            try:
                os.unlink(path)
            except OSError:
                pass
    try:
        leftovers = [n for n in os.listdir(folder) if n.endswith((".tmp", END))]
    except OSError:
        return
    for name in leftovers:
        path = os.path.join(folder, name)
        if name.endswith(END) and any(os.path.exists(os.path.join(folder, name[:-len(END)] + s)) for s in (RUN, TOLD)):
            continue            # its run's: removed with it, or when its end is told
        try:
            if time.time() - os.stat(path).st_mtime > 3600:
                os.unlink(path)
        except OSError:
            pass


def file_name(started: float, pid: int) -> str:
    """A run's file: its start (sortable) and pid."""
    return f"{int(started * 1e6):020d}-{pid}{RUN}"
