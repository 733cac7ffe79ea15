"""A memory cgroup of each worker's own, where this process may make one (as root, or in
a delegated cgroup-v2 subtree; the v1 memory controller counts too).

It gives three things the process tree alone does not:

* with ``memory_ceiling`` (a multiple of ``memory_limit``, off by default), a hard
  ceiling (``memory.limit_in_bytes`` / ``memory.max``): a burst between two of the
  nanny's samples meets the kernel, inside the worker's group, instead of taking the
  machine. Off by default because the kernel charges shared memory to the process that
  first wrote it: the memfd of a large result a client still holds counts against the
  worker that produced it, so a ceiling would kill workers whose results are kept;
* exact OOM evidence: the group's own ``oom_kill`` counter (``memory.oom_control`` /
  ``memory.events``), which only this worker's processes can raise;
* every descendant stops with its worker, even one that left the process group with
  ``setsid``: membership of a cgroup is inherited and cannot be left by an unprivileged
  process.

Where a group cannot be made, ``WorkerGroup.create`` returns None and the nanny does what
it always did (process group kill, counters of the enclosing groups).
"""
from __future__ import annotations

import logging
import os
import signal
import time
from typing import Optional

from .machine import memory_cgroups

__all__ = ["WorkerGroup"]

logger = logging.getLogger("localcluster")

class WorkerGroup:
    def __init__(self, path: str, version: str):
        self.path = path
        self.version = version

    @classmethod
    def create(cls, name: str, ceiling: Optional[int]) -> "Optional[WorkerGroup]":
        """A new group for worker ``name`` beside this process's memory cgroup, with the
        ``ceiling`` in bytes when given; None where that is not allowed."""
        for version, directory in sorted(memory_cgroups(), key=lambda g: g[0] != "v1"):
            path = os.path.join(directory, f"localcluster-{os.getpid()}-{name}")
            try:
                os.mkdir(path, 0o755)
            except OSError:
                continue
            group = cls(path, version)
            limit_file = "memory.limit_in_bytes" if version == "v1" else "memory.max"
            try:
                if not os.path.exists(os.path.join(path, limit_file)):
                    raise OSError(f"no {limit_file}: the memory controller is not delegated here")
                if ceiling:
                    with open(os.path.join(path, limit_file), "w") as f:
                        f.write(str(int(ceiling)))
            except OSError:
                group.remove()
                continue
            return group
        return None

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


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True
