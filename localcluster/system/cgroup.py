"""A memory cgroup of each worker's own, where this process may make one (as root, or in
a delegated cgroup-v2 subtree; the v1 memory controller counts too).

It gives three things the process tree alone does not:

* a hard ceiling at ``memory_ceiling`` times ``memory_limit`` (``memory.limit_in_bytes``
  / ``memory.max``): a burst between two of the nanny's samples meets the kernel, inside
  the worker's group, instead of taking the machine. The kernel charges a memfd's pages
  to the group of the process that wrote them, and a worker writes the memfd of every
  large value it sends, which its receiver (the client, another worker) may hold for
  hours: counted against the worker, a client keeping results would get the worker
  killed. So the worker keeps its own limit at the ceiling *plus* the shared memory
  charged to its group *plus* what it is writing now (:class:`SharedAllowance`): the
  ceiling bounds what the worker itself holds. Where the parent may copy into and out of
  its workers (wire/vmcopy.py), no memfd is written for a fetch or a relay: what a worker
  receives is copied into its own memory and charged to its group, as anything it
  allocates, and the ceiling counts it. Where memfds carry the data, what a worker receives
  is mapped, not copied, so it stays charged to its writer (the parent, or the worker it
  was relayed from): the ceiling does not count it, the RSS the nanny samples does;
* exact OOM evidence: the group's own ``oom_kill`` counter (``memory.oom_control`` /
  ``memory.events``), which only this worker's processes can raise (oom.py reads it);
* every descendant stops with its worker, even one that left the process group with
  ``setsid``: membership of a cgroup is inherited and cannot be left by an unprivileged
  process.

Where a group cannot be made, ``WorkerGroup.create`` returns None and the nanny does what
it always did (process group kill, counters of the enclosing groups).
"""
from __future__ import annotations

import logging
import os
import re
import signal
import threading
import time
from typing import Optional

from .machine import memory_cgroups, pid_alive

__all__ = ["SharedAllowance", "WorkerGroup", "limit_file", "purge_stale_groups"]

logger = logging.getLogger("localcluster")

def limit_file(version: str) -> str:
    return "memory.limit_in_bytes" if version == "v1" else "memory.max"


class WorkerGroup:
    def __init__(self, path: str, version: str):
        self.path = path
        self.version = version

    @classmethod
    def create(cls, name: str, ceiling: Optional[int] = None) -> "Optional[WorkerGroup]":
        """A new group for worker ``name`` beside this process's memory cgroup, with the
        ``ceiling`` in bytes when given; None where that is not allowed."""
        for version, directory in sorted(memory_cgroups(), key=lambda g: g[0] != "v1"):
            if directory not in _purged:
                _purged.add(directory)
                purge_stale_groups(directory)
            path = os.path.join(directory, f"localcluster-{os.getpid()}-{name}")
            try:
                os.mkdir(path, 0o755)
            except OSError:
                continue
            group = cls(path, version)
            limit = os.path.join(path, limit_file(version))
            try:
                if not os.path.exists(limit):
                    raise OSError(f"no {limit}: the memory controller is not delegated here")
                if ceiling:
                    _write(limit, int(ceiling))
            except OSError:
                group.remove()
                continue
            return group
        return None

    def set_limit(self, limit: int) -> None:
        try:
            _write(os.path.join(self.path, limit_file(self.version)), limit)
        except OSError as e:
            logger.warning("localcluster: the memory ceiling of %s was not set: %s", self.path, e)

    @property
    def oom_counter(self) -> str:
        """The file whose ``oom_kill`` rises only when the OOM killer takes one of this group's
        processes (whatever limit, the group's or the machine's, ran out)."""
        return os.path.join(self.path, "memory.oom_control" if self.version == "v1" else "memory.events")

    def add(self, pid: int) -> bool:
        try:
            with open(os.path.join(self.path, "cgroup.procs"), "w") as f:
                f.write(str(pid))
            return True
        except OSError:
            return False

    def pids(self) -> list[int]:
        try:
            with open(os.path.join(self.path, "cgroup.procs")) as f:
                return [int(line) for line in f if line.strip()]
        except (OSError, ValueError):
            return []

    def kill_all(self) -> None:
        """SIGKILL every process in the group, descendants that called setsid included.
        Repeated until none is left running: one may fork while we read the list."""
        kill_file = os.path.join(self.path, "cgroup.kill")      # cgroup v2, Linux >= 5.14
        if os.path.exists(kill_file):
            try:
                with open(kill_file, "w") as f:
                    f.write("1")
                return
            except OSError:
                pass
        for _ in range(100):
            alive = [pid for pid in self.pids() if not _zombie(pid)]
            if not alive:
                return
            for pid in alive:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.001)

    def remove(self) -> None:
        """Kill what is left and remove the group. A process killed a moment ago stays a
        member until its parent reaps it, so removal is retried briefly; a group whose
        members' parent never reaps them (a container without an init) is left, logged."""
        self.kill_all()
        deadline = time.monotonic() + 2.0
        while True:
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError as e:
                if time.monotonic() > deadline:
                    logger.warning("localcluster: could not remove the worker cgroup %s (%s)", self.path, e)
                    return
                time.sleep(0.01)


_GROUP = re.compile(r"localcluster-(\d+)-.+")
_purged: set = set()     # directories this process has purged (once each is enough)


def purge_stale_groups(directory: str) -> None:
    """Remove the worker groups a killed process left behind (a SIGKILLed parent cannot
    remove them): those named for a pid that no longer runs. The kernel refuses to remove
    a group while any process is in it, so a live group is never lost."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        m = _GROUP.fullmatch(name)
        if m is None or int(m.group(1)) == os.getpid() or pid_alive(int(m.group(1))):
            continue
        try:
            os.rmdir(os.path.join(directory, name))
        except OSError:
            pass


class SharedAllowance:
    """In the worker: its group's limit is ``ceiling`` + the shared memory charged to the
    group + the memfd bytes being written now + ``slack`` (so most sends write nothing).

    The nanny sets the first limit once it accepts the worker (until then there is none,
    and this writes nothing); from then on only the worker writes it, so no two writers
    race. Shared memory is read from the group's ``memory.stat`` when a send needs more
    than the slack left, and at every heartbeat, which also lowers the limit again once
    receivers have dropped what the worker sent them. A limit the kernel refuses (v1 says
    EBUSY to one below usage) is tried again at the next heartbeat; a group that is gone
    switches this off. Any thread; state under ``_lock``.
    """

    def __init__(self, path: str, version: str, ceiling: int, slack: int = 32 << 20):
        self._limit_path = os.path.join(path, limit_file(version))
        self._stat_path = os.path.join(path, "memory.stat")
        self.ceiling = ceiling
        self.slack = slack
        self._lock = threading.Lock()
        self.limit: Optional[int] = None    # as last read or written; None: none set yet (guarded by _lock, as are the next two)
        self.shared = 0                     # shmem charged to the group, as last read
        self.writing = 0                    # memfd bytes being written now
        self.enabled = True

    def charge(self, delta: int) -> None:
        """``+n`` before writing ``n`` bytes of memfd, ``-n`` once written (they are in
        ``memory.stat`` then)."""
        with self._lock:
            self.writing += delta
            if delta > 0 and self.enabled and (
                    self.limit is None or self.ceiling + self.shared + self.writing > self.limit):
                self._update()

    def settle(self) -> None:
        with self._lock:
            if self.enabled:
                self._update(lower=True)

    def _update(self, lower: bool = False) -> None:
        try:
            self.limit = _read_limit(self._limit_path)
            if self.limit is None:
                return
            self.shared = _shmem(self._stat_path)
            want = self.ceiling + self.shared + self.writing + self.slack
            if want > self.limit or (lower and want < self.limit - self.slack):
                _write(self._limit_path, want)
                self.limit = want
        except FileNotFoundError:
            self.enabled = False
        except OSError as e:
            logger.debug("localcluster: the worker's memory limit was not changed: %s", e)


def _read_limit(path: str) -> Optional[int]:
    with open(path) as f:
        text = f.read().strip()
    return None if text == "max" or int(text) >= 1 << 62 else int(text)


def _shmem(stat_path: str) -> int:
    with open(stat_path, "rb") as f:
        for line in f:
            if line.startswith(b"shmem "):
                return int(line.split()[1])
    return 0


def _write(path: str, value: int) -> None:
    with open(path, "w") as f:
        f.write(str(value))


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True
