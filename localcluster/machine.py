"""What the machine offers, read from /proc and /sys (the one place that reads them):
usable CPUs, memory and the memory cgroups a process lives in, a process's RSS, the
OOM killer's counters, and clean-up of directories left by clusters whose process was
killed. Pure functions; any thread."""
from __future__ import annotations

import os
import re
import shutil
from typing import Optional


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss(pid: "int | str" = "self") -> "int | None":
    """Resident set size of a process in bytes, from /proc (cheap: no psutil), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        if pid == "self" and not os.path.exists("/proc/self/statm"):  # pragma: no cover - not Linux
            import resource
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return None


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def memory_cgroups(pid: "int | str" = "self") -> list[tuple[str, str]]:
    """The memory cgroups ``pid`` lives in, as (version, directory): "v1" for the memory
    controller's own hierarchy, "v2" for the unified one. Empty off Linux or if unreadable."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _id, controllers, path = parts
        if "memory" in controllers.split(","):
            out.append(("v1", f"/sys/fs/cgroup/memory{path}"))
        elif controllers == "":
            out.append(("v2", f"/sys/fs/cgroup{path}"))
    return out


def available_memory() -> int:
    """Total memory, or the limit of the memory cgroup this process runs in if lower."""
    import psutil
    total = psutil.virtual_memory().total
    candidates = ["/sys/fs/cgroup/memory.max"] + [
        os.path.join(d, "memory.limit_in_bytes" if v == "v1" else "memory.max") for v, d in memory_cgroups()]
    for path in candidates:
        try:
            with open(path) as f:
                text = f.read().strip()
            if text.isdigit():
                total = min(total, int(text))
        except OSError:
            pass
    return total


def oom_counters(pid: Optional[int] = None) -> list[str]:
    """Files whose ``oom_kill`` counter rises when the kernel's OOM killer strikes:
    the system-wide /proc/vmstat and the memory cgroup of ``pid``."""
    paths = ["/proc/vmstat"] if os.path.exists("/proc/vmstat") else []
    if pid is None:
        return paths
    for version, directory in memory_cgroups(pid):
        candidate = os.path.join(directory, "memory.oom_control" if version == "v1" else "memory.events")
        if os.path.exists(candidate):
            paths.append(candidate)
    return paths


def read_oom_count(paths: list[str]) -> dict[str, int]:
    out = {}
    for path in paths:
        try:
            with open(path) as f:
                for line in f:
                    if line.startswith("oom_kill "):
                        out[path] = int(line.split()[1])
                        break
        except (OSError, ValueError):
            pass
    return out


def purge_stale_directories(base: str) -> None:
    """Remove spill directories whose owning process is gone: a parent killed with
    SIGKILL cannot clean up after itself, so the next cluster does it."""
    try:
        names = os.listdir(base)
    except OSError:
        return
    for name in names:
        m = re.fullmatch(r"localcluster-(\d+)-\w+", name)
        if m is None or int(m.group(1)) == os.getpid():
            continue
        try:
            os.kill(int(m.group(1)), 0)
        except ProcessLookupError:
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)
        except PermissionError:   # alive, someone else's
            pass
