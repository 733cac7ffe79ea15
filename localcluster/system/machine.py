"""What the machine offers, read from /proc and /sys (the one place that reads them, but
for the OOM killer's evidence in oom.py): usable CPUs, memory and the memory cgroups a
process lives in, a process's RSS, and clean-up of directories left by clusters whose
process was killed. Pure functions; any thread."""
from __future__ import annotations

import functools
import gc
import os
import re
import signal
import sys
import threading
from types import FrameType
from typing import Any, Callable, Optional


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


def open_statm(pid: int) -> Optional[int]:
    """A descriptor on ``/proc/<pid>/statm``, or None. :func:`rss_of` reads it with one
    pread: the scheduler thread samples each worker many times a second, and an open and
    close per sample would cost several times the read. It stays that process's: once it is
    gone the read fails, even if its pid is reused."""
    try:
        return os.open(f"/proc/{pid}/statm", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


def rss_of(statm_fd: int) -> "int | None":
    """Resident set size in bytes through :func:`open_statm`'s descriptor; None once the process is gone."""
    try:
        return int(os.pread(statm_fd, 128, 0).split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def descendants(pid: int) -> list[int]:
    """Every living descendant of ``pid``, from each thread's ``/proc/<pid>/task/<tid>/children``
    (Linux >= 4.2 with CONFIG_PROC_CHILDREN): a few reads for a worker, where psutil's
    ``children(recursive=True)`` reads the stat file of every process on the machine, once a
    second per worker and once on the critical path of its start. psutil where the kernel
    has no such files."""
    if not _children_files():
        return _descendants_psutil(pid)
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            tids = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue            # gone since its parent listed it
        for tid in tids:
            try:
                with open(f"/proc/{parent}/task/{tid}/children", "rb") as f:
                    kids = [int(k) for k in f.read().split()]
            except (OSError, ValueError):
                continue        # the thread ended meanwhile
            found += kids
            todo += kids
    return found


@functools.lru_cache(maxsize=None)
def _children_files() -> bool:
    return os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


def _descendants_psutil(pid: int) -> list[int]:
    try:
        import psutil
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except Exception:
        return []


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def memory_cgroups(pid: "int | str" = "self") -> list[tuple[str, str]]:
    """The memory cgroups ``pid`` lives in, as (version, directory): "v1" for the memory
    controller's own hierarchy, "v2" for the unified one. Empty off Linux or if unreadable."""
    return _cgroups("memory", pid)


def _cgroups(controller: str, pid: "int | str" = "self") -> list[tuple[str, str]]:
    """The cgroups of ``controller`` that ``pid`` lives in, as (version, directory)."""
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
        if controller in controllers.split(","):
            out.append(("v1", f"/sys/fs/cgroup/{controller}{path}"))
        elif controllers == "":
            out.append(("v2", f"/sys/fs/cgroup{path}"))
    return out


def available_memory() -> int:
    """Total memory, or the limit of the memory cgroup this process runs in if lower."""
    try:        # MemTotal, as psutil reads it, without importing psutil on a first cluster's path
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # pragma: no cover - no sysconf names
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


def task_limits() -> list[tuple[str, int, Callable[[], int], str]]:
    """The limits on processes and threads (the kernel counts each thread as a task, with a
    pid of its own) that a new worker counts against, as (name, limit, in use now, what
    raises it); ``in use`` is a callable, read only where needed. Those this process cannot
    read are left out: nothing is refused on a guess."""
    out: list = []
    machine = _machine_tasks
    for name, path, how in (("the kernel's pid_max", "/proc/sys/kernel/pid_max", "sysctl kernel.pid_max, as root"),
                            ("the kernel's threads-max", "/proc/sys/kernel/threads-max",
                             "sysctl kernel.threads-max, as root")):
        limit = _read_int(path)
        if limit:
            out.append((name, limit, machine, how))
    soft, hard = _rlimit("RLIMIT_NPROC")
    if soft >= 0 and os.geteuid() != 0:        # the kernel does not hold root to it
        raise_to = "its hard limit" + (f" of {hard}" if hard >= 0 else "")
        out.append(("this user's RLIMIT_NPROC (ulimit -u)", soft, user_tasks, f"ulimit -u, up to {raise_to}"))
    for directory in _pids_cgroups():
        limit = _read_int(os.path.join(directory, "pids.max"))
        if limit:
            out.append((f"the pids cgroup's pids.max ({directory})", limit,
                        functools.partial(_read_int, os.path.join(directory, "pids.current"), 0),
                        f"pids.max of {directory} (a container's own limit: its runtime's pids-limit)"))
    return out


def _read_int(path: str, default: Optional[int] = None) -> Optional[int]:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return default
    return int(text) if text.isdigit() else default


def _machine_tasks() -> int:
    """Tasks (processes and threads) on the machine: /proc/loadavg's fourth field, "running/total"."""
    try:
        with open("/proc/loadavg") as f:
            return int(f.read().split()[3].split("/")[1])
    except (OSError, ValueError, IndexError):
        return 0


def user_tasks() -> int:
    """Tasks (processes and threads) of this process's real user, what RLIMIT_NPROC counts:
    every /proc/<pid>/status read, so only called when that limit is close."""
    uid, count = str(os.getuid()), 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:        # gone meanwhile
            continue
        if fields.get("Uid", "").split()[:1] == [uid]:
            count += int(fields.get("Threads", "1").strip() or 1)
    return count


def _pids_cgroups() -> list[str]:
    """The pids cgroup directories this process lives in, innermost first, each ancestor's
    limit applying too (v1: the pids controller's hierarchy; v2: the unified one)."""
    out = []
    for version, directory in _cgroups("pids"):
        root = "/sys/fs/cgroup/pids" if version == "v1" else "/sys/fs/cgroup"
        path = directory[len(root):].rstrip("/")
        while path:
            out.append(root + path)
            path = path.rsplit("/", 1)[0]
    return out


def fd_limits() -> tuple[int, int, int]:
    """(soft limit, hard limit, open now) of this process's file descriptors; a limit of -1
    is none."""
    soft, hard = _rlimit("RLIMIT_NOFILE")
    try:
        used = len(os.listdir("/proc/self/fd")) - 1      # less the one listdir had open
    except OSError:  # pragma: no cover - no /proc
        used = 0
    return soft, hard, used


def _rlimit(name: str) -> tuple[int, int]:
    """(soft, hard) of a resource limit, -1 for none (or where there is no such limit)."""
    try:
        import resource
        soft, hard = resource.getrlimit(getattr(resource, name))
    except (ImportError, AttributeError, OSError, ValueError):  # pragma: no cover - not Linux
        return -1, -1
    return tuple(-1 if v == resource.RLIM_INFINITY else v for v in (soft, hard))


LOCK = ".owner.lock"        # inside each cluster directory; flock()ed by its owner for the cluster's life
_NAME = re.compile(r"localcluster-(\d+)-\w+")
LEGACY_GRACE = 60.0         # a directory without a lock file (made by an older version) this old may go


def make_cluster_directory(parent: str) -> tuple[str, int]:
    """A private (0700) directory for one cluster's spill files, and the descriptor of its
    lock, held (flock) until the caller closes it: while it is held, no other process
    removes the directory, whatever its pid looks like from where that process stands."""
    import fcntl
    import tempfile
    path = tempfile.mkdtemp(prefix=f"localcluster-{os.getpid()}-", dir=parent)   # 0700
    fd = os.open(os.path.join(path, LOCK), os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return path, fd


def purge_stale_directories(base: str) -> list[tuple[str, int, dict]]:
    """Remove the cluster directories in ``base`` whose owner is gone: a parent killed with
    SIGKILL cannot clean up after itself, so the next cluster does it. Returns what it
    removed, for the caller to say so: (path, the pid in its name, what was in it:
    ``contents``).

    Gone means: its lock can be taken (the kernel drops an flock with the last descriptor,
    however the process ended). A pid proves nothing here: under PID namespaces (containers
    sharing a /tmp) another live cluster's pid can be free in ours. Only our own uid's real
    directories are considered; a symlink is never followed."""
    try:
        names = os.listdir(base)
    except OSError:
        return []
    removed = []
    for name in names:
        m = _NAME.fullmatch(name)
        if m is None or int(m.group(1)) == os.getpid():
            continue
        try:
            held = _purge_one(base, name)
        except OSError:       # it went away meanwhile, or is not ours to read: leave it
            continue
        if held is not None:
            removed.append((os.path.join(base, name), int(m.group(1)), held))
    return removed


def _purge_one(base: str, name: str) -> Optional[dict]:
    """What was in the directory (``contents``), if it was removed."""
    import fcntl
    import shutil       # here: a worker imports this module, and shutil brings the compressors
    import stat
    import time
    path = os.path.join(base, name)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        return None                                 # a symlink, a file, or another user's
    dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        try:
            fd = os.open(LOCK, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        except FileNotFoundError:                   # older version, or being made right now
            if time.time() - st.st_mtime > LEGACY_GRACE and not pid_alive(int(_NAME.fullmatch(name).group(1))):
                held = contents(path)
                shutil.rmtree(path, ignore_errors=True)
                return held
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.fstat(dir_fd).st_ino == os.lstat(path).st_ino:      # still the directory we opened
                held = contents(path)
                shutil.rmtree(path, ignore_errors=True)    # fd-based on Linux: follows no symlink inside
                return held
        except BlockingIOError:
            pass                                    # its owner is alive
        finally:
            os.close(fd)
    finally:
        os.close(dir_fd)
    return None


def contents(path: str) -> dict:
    """What a cluster directory holds, by what is at its top: {name: (files, bytes)} (a
    worker's spill folder, the initializer's pickle), its lock left out. No link is followed."""
    out: dict = {}
    try:
        entries = list(os.scandir(path))
    except OSError:
        return out
    for entry in entries:
        if entry.name == LOCK:
            continue
        files = size = 0
        try:
            if entry.is_dir(follow_symlinks=False):
                for root, _dirs, names in os.walk(entry.path):      # os.walk follows no link by default
                    for n in names:
                        st = os.lstat(os.path.join(root, n))
                        files, size = files + 1, size + st.st_size
            else:
                files, size = 1, entry.stat(follow_symlinks=False).st_size
        except OSError:         # going while we look: counted as far as seen
            pass
        out[entry.name] = (files, size)
    return out


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_MAIN = threading.main_thread().ident
try:        # the C functions: signal's own wrap their answers in enums, several µs a call
    from _signal import getsignal as _getsignal, signal as _setsignal  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - not CPython
    _getsignal, _setsignal = signal.getsignal, signal.signal


def hold_interrupts() -> Any:
    """On the main thread: hold Ctrl-C back while a state change that must not be cut in two
    runs, and return what :func:`release_interrupts` needs; elsewhere None (Python raises
    KeyboardInterrupt on the main thread only). The Python handler of SIGINT is swapped for
    one that only remembers the signal: blocking the signal (``pthread_sigmask``) would not
    do, since the kernel then hands it to any other thread that does not block it (a
    Jupyter kernel's, pytest-timeout's), and Python still runs the handler on the main
    thread at once. A handler that is not Python's (SIG_DFL, SIG_IGN) raises nothing:
    then there is nothing to hold."""
    if threading.get_ident() != _MAIN:
        return None
    handler = _getsignal(signal.SIGINT)
    if not callable(handler):
        return None
    caught: list = []
    _setsignal(signal.SIGINT, lambda signum, frame: caught.append(frame))
    return handler, caught


def release_interrupts(held: Any) -> None:
    """The handler back; a Ctrl-C that came meanwhile is handled now (KeyboardInterrupt
    raised here, right after the state change)."""
    if held is not None:
        handler, caught = held
        _setsignal(signal.SIGINT, handler)
        if caught:
            handler(signal.SIGINT, caught[0])


def block_interrupts() -> None:
    """For a thread of ours, at its start: SIGINT is never delivered to it. The kernel
    gives a process-directed signal to any thread that does not block it; one that lands
    on a background thread leaves the main thread asleep in its wait (result(), gather)
    until that wait ends by itself, so Ctrl-C would seem ignored. Processes started from
    such a thread inherit the mask: the worker unblocks SIGINT first thing."""
    import signal
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})


def frame_of(ident: int) -> Optional[FrameType]:
    """The frame thread ``ident`` runs now, or None. With the garbage collector off meanwhile:
    before 3.12, ``sys._current_frames()`` holds the interpreter's thread-list lock while it
    allocates, a collection it sets off may free an object whose teardown takes that lock
    again, and the process hangs with the GIL held (CPython gh-106883)."""
    enabled = gc.isenabled()
    if enabled:
        gc.disable()
    try:
        return sys._current_frames().get(ident)
    finally:
        if enabled:
            gc.enable()
