"""What the machine offers: usable CPUs, memory (cgroup-aware), and clean-up of
directories left by clusters whose process was killed."""
from __future__ import annotations

import os
import re
import shutil


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


def available_memory() -> int:
    """Total memory, or the limit of the memory cgroup this process runs in if lower."""
    import psutil
    total = psutil.virtual_memory().total
    candidates = ["/sys/fs/cgroup/memory.max"]
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _id, ctrl, path = line.rstrip("\n").split(":", 2)
                if "memory" in ctrl.split(","):
                    candidates.append(f"/sys/fs/cgroup/memory{path}/memory.limit_in_bytes")
                elif ctrl == "":
                    candidates.append(f"/sys/fs/cgroup{path}/memory.max")
    except OSError:
        pass
    for path in candidates:
        try:
            with open(path) as f:
                text = f.read().strip()
            if text.isdigit():
                total = min(total, int(text))
        except OSError:
            pass
    return total


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
