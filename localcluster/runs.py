"""How your own process's last run ended: each cluster's record in the per-user registry
(system/registry.py), and the explanation of a run that ended without closing, told as a
worker's death is, from the kernel's evidence.

A cluster's ``RunRecorder`` writes its record as the cluster starts (who: pid, the start
that tells a reused pid apart, the boot, argv or the notebook, cwd), then from the scheduler
thread's tick at most once a second (tasks finished and pending, the bytes of results in
memory, this process's RSS and its memory cgroup's limit), and marks it closed at close.
The first cluster of a later process (``tell_previous``), or ``previous_runs()``, finds the
runs not closed whose process is gone, explains each (``explain``: the kernel log's OOM
kill or fault, a new boot, else a kill from outside), and claims its report, so that it is
said once. A run still alive is never judged: same pid and same start is the same process.
One run record is one dict: a journal of results can hold the same one.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

from .config import format_bytes
from .system import kernel_log, registry
from .system.machine import memory_cgroups, pid_alive, rss
from .system.oom import Kill, judge, parse_limit

__all__ = ["PreviousRun", "RunRecorder", "clock", "describe", "explain", "forget_note", "forget_warnings", "judged", "previous_runs",
           "tell_previous"]

logger = logging.getLogger("localcluster")

VERSION = 1                 # of the record's layout
EVERY = 1.0                 # seconds between two writes of a run's record, at least
SHARE = 0.01                # of the scheduler thread's time the record may take: a slow read waits longer
TOO_SLOW = 0.5              # a write that took this long (a hung network home): recording stops
CAUSES = ("oom-killer", "crash", "machine-restart", "signal")

_warned: set = set()        # what this process has warned of already (the folder, each damaged file)
_said = threading.Event()   # the first cluster of this process has looked for earlier runs


@dataclass(frozen=True)
class PreviousRun:
    """One earlier run of a cluster in this user's processes that ended without closing:
    who it was, ``cause`` (one of "oom-killer", "crash", "machine-restart", "signal"), the
    ``message`` that says what happened and what to do, and how far its work had gone.
    Times are seconds since the epoch; ``ended`` is when its workers saw it go (or, when
    they could not say, its last record)."""
    pid: int
    cause: str
    message: str
    started: float
    ended: float
    finished: int                  # tasks finished by the last record
    pending: int                   # tasks not finished then
    argv: tuple = ()
    cwd: str = ""
    notebook: Optional[str] = None  # the Jupyter kernel's notebook or connection file, when it ran in one
    signal: Optional[str] = None    # SIGKILL, SIGSEGV ..., when known
    memory: Optional[int] = None    # its RSS at the last record
    memory_limit: Optional[int] = None   # its memory cgroup's limit then
    held: Optional[int] = None      # bytes of results in memory then (what its futures held)

    def __str__(self) -> str:
        return self.message


# --- the record ---------------------------------------------------------------------------

def _notebook() -> Optional[str]:
    """The notebook (Jupyter Server 2 names it) or the kernel's connection file, when this
    process is a Jupyter kernel."""
    if "ipykernel" not in sys.modules:
        return None
    name = os.environ.get("JPY_SESSION_NAME")
    if name:
        return name
    try:
        from ipykernel.connect import get_connection_file
        return str(get_connection_file())
    except Exception:        # no kernel app running (ipykernel merely imported): no notebook
        return None


def _memory_limit() -> tuple[Optional[str], Optional[int]]:
    """(this process's memory cgroup, the lowest limit on it or a group enclosing it)."""
    for version, directory in memory_cgroups():
        name = "memory.limit_in_bytes" if version == "v1" else "memory.max"
        root = "/sys/fs/cgroup/memory" if version == "v1" else "/sys/fs/cgroup"
        lowest, d = None, os.path.normpath(directory)
        while d.startswith(root):
            try:
                with open(os.path.join(d, name)) as f:
                    limit = parse_limit(f.read())
            except OSError:
                limit = None
            if limit is not None and (lowest is None or limit < lowest):
                lowest = limit
            if d == root:
                break
            d = os.path.dirname(d)
        return (directory[len(root):] or "/"), lowest
    return None, None


def forget_warnings() -> None:
    """Warn again of what this process warned of already (for tests)."""
    _warned.clear()


def _warn_once(what: str, text: str, *args: Any) -> None:
    if what not in _warned:
        _warned.add(what)
        logger.warning(text, *args)


class RunRecorder:
    """One cluster's record in the registry. Made on the user's thread as the cluster starts
    (its first write); ``tick`` on the scheduler thread; ``closed`` on the closing thread
    after the scheduler thread ended. Never raises: a record that cannot be written is one
    warning, and the cluster goes on without it."""

    def __init__(self, progress: Callable[[], tuple[int, int, int]], use_registry: bool = True,
                 sink: Optional[Callable[[dict], None]] = None, sink_folder: Optional[str] = None):
        self._progress = progress      # () -> (finished, pending, bytes of results in memory); scheduler thread
        self._registry = use_registry   # False: the record goes to ``sink`` only
        self._sink = sink               # given each record written too (a journal's copy); never raises
        self._folder = registry.directory()
        me = registry.identity()
        started = time.time()
        self._name = registry.file_name(started, me.pid)
        #: the file the workers write if this process dies (worker/boot.py): beside the record
        self.end_note: Optional[str] = os.path.join(self._folder, self._name[:-len(registry.RUN)] + registry.END) \
            if use_registry else os.path.join(sink_folder, f"{me.pid}-{int(started * 1e6)}{registry.END}") \
            if sink_folder else None
        cgroup, limit = _memory_limit()
        #: the record as last written (written by one thread at a time: see the class)
        self.record: Optional[dict] = {
            "version": VERSION, "pid": me.pid, "start": me.start, "boot": me.boot, "host": me.host,
            "pid_ns": me.pid_ns, "since_boot": kernel_log.clock(), "started": started,
            "argv": list(sys.argv), "cwd": _cwd(), "notebook": _notebook(), "seen": started,
            "finished": 0, "pending": 0, "held": 0, "rss": rss(), "cgroup": cgroup, "memory_limit": limit,
            "end_note": self.end_note, "closed": False}
        self._next = 0.0                # monotonic: the next tick that writes

    def start(self) -> None:
        """The first write, and the end note made empty for the workers to open (they are
        started after this); without it, a worker outlives nothing and notes nothing."""
        self._write()
        if self.record is None or self.end_note is None:
            return
        try:
            os.close(os.open(self.end_note, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                             0o600))
        except OSError:
            self.end_note = None
        if self._registry:
            registry.remove_oldest(self._folder)

    def _write(self) -> None:
        record = self.record
        if record is None or record["pid"] != os.getpid():    # off, or a forked child's copy
            return
        if self._sink is not None:
            self._sink(record)
        if not self._registry:
            return
        t0 = time.monotonic()
        try:
            registry.write(self._folder, self._name, record)
        except OSError as e:
            self._registry = False
            if self._sink is None:
                self.record = None
            _warn_once("folder", "localcluster: the run registry cannot be written (%s); this run goes on, "
                       "but a later one will not be able to say how it ended. LOCALCLUSTER_RUN_REGISTRY=0 turns "
                       "the registry off", e)
            return
        took = time.monotonic() - t0
        if took > TOO_SLOW:
            self._registry = False
            if self._sink is None:
                self.record = None
            _warn_once("slow", "localcluster: writing the run registry in %s took %.1f s; it is no longer "
                       "written for this run. LOCALCLUSTER_RUN_REGISTRY=0 turns it off", self._folder, took)

    def tick(self, now: float) -> None:
        """On the scheduler thread, every tick: at most once a second (and at most ``SHARE``
        of its time), the run's progress and memory, written."""
        record = self.record
        if record is None or now < self._next:
            return
        t0 = time.monotonic()
        finished, pending, held = self._progress()
        cgroup, limit = _memory_limit()
        record.update(seen=time.time(), finished=finished, pending=pending, held=held, rss=rss(), cgroup=cgroup,
                      memory_limit=limit)
        self._write()
        self._next = now + max(EVERY, (time.monotonic() - t0) / SHARE)

    def closed(self) -> None:
        """The cluster closed: its run ended as asked, and is never reported."""
        record = self.record
        if record is None:
            return
        # the figures of the last tick: a closed run is never told, and a pass over a million
        # tasks queued would lengthen every close
        record.update(seen=time.time(), closed=True)
        self._write()
        self.record = None
        forget_note(record)


def forget_note(record: dict) -> None:
    """Remove the run's end note: it closed, or its end was told."""
    note = record.get("end_note")
    if isinstance(note, str) and note.endswith(registry.END):
        try:
            os.unlink(note)
        except OSError:
            pass


def _noted_end(record: dict) -> Optional[float]:
    """When the run's workers saw its process go (the time of their last words in its end
    note, boot.py), or None: no note, none written, or one older than the run's last record
    (a worker that saw its channel close before, not this end)."""
    note = record.get("end_note")
    if not isinstance(note, str) or not note.endswith(registry.END):
        return None
    try:
        st = os.stat(note)
    except OSError:
        return None
    seen = record.get("seen") or record.get("started") or 0
    return st.st_mtime if st.st_size and st.st_mtime >= seen else None


def _cwd() -> str:
    try:
        return os.getcwd()
    except OSError:          # removed under us
        return ""


# --- the explanation ----------------------------------------------------------------------

def describe(record: dict) -> str:
    """Which run it was, in a few words: the notebook, else the command line."""
    if record.get("notebook"):
        return f"the Jupyter kernel of {record['notebook']}"
    argv = [str(a) for a in record.get("argv") or []]
    text = " ".join(argv) if argv else "python"
    return repr(text if len(text) <= 80 else text[:77] + "...")


def clock(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _work(record: dict) -> str:
    text = (f"It had finished {record.get('finished', 0)} tasks, with {record.get('pending', 0)} pending, "
            f"at its last record, {clock(record.get('seen') or record.get('started') or 0)}.")
    if record.get("ended"):
        text += f" Its workers saw it end at {clock(record['ended'])}."
    return text


def _memory(record: dict) -> str:
    used, limit, held = record.get("rss"), record.get("memory_limit"), record.get("held")
    text = f" Its memory at its last record was {format_bytes(used)}" if used else ""
    if text and limit:
        text += f" against the limit of {format_bytes(limit)} of its memory cgroup {record.get('cgroup')}"
    if held:
        text += ("; the" if text else " The") + f" results your futures held came to {format_bytes(held)}"
    return text + "." if text else ""


def explain(record: dict, found: "Union[Kill, kernel_log.Fault, kernel_log.Unreadable, None]",
            restarted: bool) -> tuple[str, Optional[str], str]:
    """(cause, signal, message) of a run that ended without closing, from what the kernel
    logged of its pid (``found``) or whether the machine restarted since."""
    who = f"Your process (pid {record['pid']}, {describe(record)}, started {clock(record.get('started') or 0)})"
    work = " " + _work(record)
    if restarted:
        return "machine-restart", None, (
            f"{who} ended when the machine restarted (its boot id changed since); nothing more is known of "
            f"its end.{work}")
    if isinstance(found, Kill):
        where = judge(found, True, [], False, False, False, None, _limit_of(found.oom_memcg, record))
        return "oom-killer", "SIGKILL", (
            f"{who} was killed by the kernel's out-of-memory killer (SIGKILL). {where}{_memory(record)}{work} "
            f"Hold fewer results in your process at once (gather in chunks, reduce on the workers, "
            f"write results to files from the tasks), or give it more memory.")
    if isinstance(found, kernel_log.Fault):
        lib = f" in {found.library}" if found.library else ""
        return "crash", found.signal, (
            f"{who} crashed with {found.signal}{lib}: the kernel log says \"{found.line}\".{work} "
            f"This is a bug in compiled code that ran in your own process, not in a task (a C extension, "
            f"ctypes, or a library built for another version); run it again under "
            f"python -X faulthandler to see the Python stack.")
    if isinstance(found, kernel_log.Unreadable):
        return "signal", None, (
            f"{who} ended without closing its cluster. The kernel log could not be read: {found.reason}; so "
            f"an out-of-memory kill or a crash cannot be told from a kill from outside (kill, a job "
            f"scheduler, Jupyter's restart, a container stopping).{_memory(record)}{work}")
    return "signal", None, (
        f"{who} was killed from outside (kill, a job scheduler, Jupyter's restart, a container stopping); "
        f"the kernel recorded nothing.{work}")


def _limit_of(group: Optional[str], record: dict) -> Optional[int]:
    """The limit of the group whose limit ran out: read now, else as last recorded."""
    if not group:
        return None
    for version in {v for v, _ in memory_cgroups()}:
        root, name = ("/sys/fs/cgroup/memory", "memory.limit_in_bytes") if version == "v1" else \
            ("/sys/fs/cgroup", "memory.max")
        try:
            with open(os.path.join(root + group.rstrip("/"), name)) as f:
                limit = parse_limit(f.read())
        except OSError:
            continue
        if limit is not None:
            return limit
    return record.get("memory_limit") if group == record.get("cgroup") else None


# --- finding them -------------------------------------------------------------------------

def _ended(record: dict, me: registry.Identity) -> Optional[bool]:
    """Whether the run's process is gone: None when it is not ours to judge (another machine
    sharing this home, another PID namespace), False while it may be alive; else True, and
    ``restarted`` said by the caller from the boot id."""
    if record.get("closed") or record.get("host") != me.host:
        return None
    if record.get("boot") != me.boot and record.get("boot") and me.boot:
        return True
    if record.get("pid_ns") != me.pid_ns:
        return None
    pid = record.get("pid")
    if not isinstance(pid, int) or pid == me.pid and record.get("start") == me.start:
        return False
    start, state = registry.process_start(pid)
    if start is None:
        return not pid_alive(pid)          # /proc unreadable: alive is alive, whatever its start
    return start != record.get("start") or state == "Z"


def _load(folder: str, name: str) -> Optional[dict]:
    try:
        return registry.load(folder, name)
    except ValueError as e:
        _load_damaged(folder, name, e)
        return None


def _load_damaged(folder: str, name: str, e: ValueError) -> None:
    """One warning for a damaged record, set aside: out of the listing, it is said once."""
    damaged = os.path.join(folder, name + ".damaged")
    try:
        os.rename(os.path.join(folder, name), damaged)
    except OSError:
        damaged = ""
    _warn_once(name, "localcluster: a record in the run registry is damaged and was ignored (%s)%s",
               e, f"; it was moved to {damaged}, which you may delete" if damaged else "")


def _told(record: dict) -> PreviousRun:
    def num(key: str) -> Optional[int]:
        value = record.get(key)
        return value if isinstance(value, int) else None
    return PreviousRun(record["pid"], str(record.get("cause")), str(record.get("message")),
                       float(record.get("started") or 0), float(record.get("ended") or record.get("seen") or 0),
                       num("finished") or 0, num("pending") or 0, tuple(map(str, record.get("argv") or ())),
                       str(record.get("cwd") or ""), record.get("notebook"), record.get("signal"), num("rss"),
                       num("memory_limit"), num("held"))


def judged(record: dict, me: registry.Identity, log: list) -> Optional[PreviousRun]:
    """The run of ``record`` (a registry's or a journal's) explained, its cause, signal and
    message added to it, when its process ended without closing; else None. ``log``: the
    kernel log, read into it on first need. TypeError, ValueError ... for a record that is
    not as a run writes it."""
    if not isinstance(record.get("pid"), int) or not _ended(record, me):
        return None
    restarted = bool(record.get("boot") and me.boot and record["boot"] != me.boot)
    noted = _noted_end(record)
    if noted is not None:
        record["ended"] = noted
    found = None
    if not restarted:
        if not log:
            log.append(kernel_log.read())
        records = log[0]
        found = records if isinstance(records, kernel_log.Unreadable) else \
            kernel_log.evidence(records, record["pid"], record.get("since_boot"))
    cause, signal, message = explain(record, found, restarted)
    record.update(cause=cause, signal=signal, message=message)
    return _told(record)


def _claim(folder: str, name: str, me: registry.Identity, log: list) -> Optional[PreviousRun]:
    """The run in ``name`` explained and claimed as reported by this process, or None (alive,
    closed, not ours to judge, or another process claimed it first)."""
    record = _load(folder, name)
    if record is None or not isinstance(record.get("pid"), int):
        return None
    try:
        run = judged(record, me, log)
    except (TypeError, ValueError, KeyError, AttributeError) as e:     # JSON, but not as a run writes it
        _load_damaged(folder, name, ValueError(f"{os.path.join(folder, name)}: {e!r}"))
        return None
    if run is None:
        return None
    if not registry.mark_told(folder, name):
        return None
    forget_note(record)
    try:
        registry.write(folder, name[:-len(registry.RUN)] + registry.TOLD, record)
    except OSError:
        pass                  # told now, and claimed: only its explanation is not kept
    return run


def previous_runs(reported: bool = False) -> list:
    """This user's earlier runs of a cluster that ended without closing (killed, crashed,
    OOM-killed, the machine restarted) and were not reported yet, newest first, as
    ``PreviousRun`` records with the cause and a message; each is reported once: a second
    call returns none of them. A run still alive is never among them.

    Args:
        reported: those reported already too (the registry keeps the last 100 runs).

    Returns:
        A list of ``PreviousRun``, each with ``pid``, ``cause`` (``oom-killer``, ``crash``,
        ``machine-restart`` or ``signal``), ``message``, ``started``, ``ended``, ``finished``,
        ``pending``, ``argv``, ``cwd``, ``notebook``, ``signal``, ``memory``, ``memory_limit``
        and ``held``.
    """
    folder = registry.directory()
    me = registry.identity()
    log: list = []           # the kernel log, read once and only if a run needs it
    out = []
    for name in registry.records(folder):
        if name.endswith(registry.RUN):
            run = _claim(folder, name, me, log)
        elif reported:
            record = _load(folder, name)
            run = _told(record) if record is not None and isinstance(record.get("pid"), int) else None
        else:
            run = None
        if run is not None:
            out.append(run)
    out.sort(key=lambda r: -r.started)
    return out


def tell_previous(folders: Optional[dict] = None, told: frozenset = frozenset()) -> set:
    """On the first cluster of this process: one WARNING line for the runs that ended
    without closing since the last look. ``folders``: pid -> what the removal of that
    process's cluster folder lost, in words, told in the same line; ``told``: pids a line
    of their own told already (a journal's), claimed here and not told again. The pids told."""
    if _said.is_set():
        return set(told)
    _said.set()
    try:
        runs = [r for r in previous_runs() if r.pid not in told]
    except Exception as e:        # the registry must never stop a cluster from starting
        _warn_once("read", "localcluster: the run registry in %s could not be read (%r); it is ignored",
                   registry.directory(), e)
        return set(told)
    if not runs:
        return set(told)
    last = runs[0]
    how = f"{last.cause}, {last.signal}" if last.signal else last.cause
    more = ""
    if len(runs) > 1:
        more = f"; and {len(runs) - 1} earlier: " + ", ".join(f"pid {r.pid} ({r.cause})" for r in runs[1:4]) + \
            (" ..." if len(runs) > 4 else "")
    folder = (folders or {}).get(last.pid)
    folder = f" Its cluster's folder was removed: {folder}" if folder else ""
    logger.warning("localcluster: your previous run (pid %d, %s) ended without closing its cluster at %s: %s; "
                   "%d tasks had finished, %d were pending%s. localcluster.previous_runs(reported=True)[0].message "
                   "says more.%s", last.pid, describe({"argv": last.argv, "notebook": last.notebook}),
                   clock(last.ended), how, last.finished, last.pending, more, folder)
    return {r.pid for r in runs} | told
