"""Was a worker's SIGKILL the kernel's OOM killer, and whose memory ran out?

The nanny holds one :class:`OomWatch` per worker. It keeps, from the worker's start to
its death, what can tell an OOM kill from a ``kill -9``:

* the kernel log (/dev/kmsg, where readable): ``Killed process <pid>`` names the victim
  exactly, and the ``oom-kill:`` line before it names the cgroup whose limit ran out;
* the ``oom_kill`` counter of every memory cgroup the worker was seen in, sampled with
  its membership at the memory-sampling cadence (~1 s): its own group (only its own
  processes are in it), a group a task or a job system moved it into, the group it shares
  with the parent when it has none of its own;
* the counters of the groups enclosing those (a container's limit);
* the machine's ``oom_kill`` in /proc/vmstat.

They differ in what they prove. The kernel log names the pid; a group that held only the
worker's processes when last seen rises only for them. A group shared with other
processes, an enclosing group (cgroup v2 counts its descendants' kills) and the machine
rise for anyone's OOM kill, so an OOM kill elsewhere in the same second would pass for the
worker's: they count only where nothing exact can speak (the worker was last seen in no
group of its own, and the kernel log is unreadable), and the machine's only where no
cgroup counter is readable at all.

The kernel log is used only in the initial PID namespace: it names pids as that namespace
sees them, and in a container's a pid of ours may be an unrelated host process's. There it
is exact both ways: once every OOM kill the machine counted since the last look has its
``Killed process`` record, a worker it does not name was not OOM-killed.

Pure functions (parsing and the judgement) first; then the watcher, which reads files.
The scheduler thread creates, samples and closes it.
"""
from __future__ import annotations

import os
import re
import time
from typing import Iterable, NamedTuple, Optional

from . import machine
from ..config import format_bytes

__all__ = ["Kill", "KernelLog", "OomWatch", "Rise", "ancestors", "cgroup_name", "judge", "parse_counters",
           "parse_kmsg", "parse_limit"]

KMSG = "/dev/kmsg"
VMSTAT = "/proc/vmstat"
_INIT_PID_NS = 0xEFFFFFFC      # the inode of the initial PID namespace (PROC_PID_INIT_INO)
KMSG_WAIT = 0.25               # the kernel logs a kill just after sending the SIGKILL: a moment's grace
_ROOTS = {"v1": "/sys/fs/cgroup/memory", "v2": "/sys/fs/cgroup"}    # as machine.memory_cgroups maps them


# --- pure: parsing ------------------------------------------------------------------------

def parse_counters(text: str) -> dict[str, int]:
    """``key value`` lines (memory.events, memory.oom_control, /proc/vmstat) as a dict."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out


def parse_limit(text: str) -> Optional[int]:
    """memory.max / memory.limit_in_bytes; None for no limit ("max", or v1's page-rounded 2**63)."""
    text = text.strip()
    if not text.isdigit() or int(text) >= 1 << 62:
        return None
    return int(text)


def cgroup_name(directory: str, version: str) -> str:
    """A group's path as the kernel writes it (in /proc/<pid>/cgroup and the kernel log)."""
    root = _ROOTS[version]
    rel = os.path.normpath(directory)[len(root):]
    return rel or "/"


def ancestors(directory: str, version: str) -> list[str]:
    """The groups enclosing ``directory``, nearest first, up to its hierarchy's root."""
    root, d, out = _ROOTS[version], os.path.normpath(directory), []
    while d != root and d.startswith(root + "/"):
        d = os.path.dirname(d)
        out.append(d)
    return out


class Kill(NamedTuple):
    """One OOM kill in the kernel log."""
    pid: int
    line: str                          # "Memory cgroup out of memory: Killed process 1234 (python) ..."
    constraint: Optional[str] = None   # CONSTRAINT_MEMCG: a cgroup's limit; CONSTRAINT_NONE: the machine
    oom_memcg: Optional[str] = None    # the group whose limit ran out
    task_memcg: Optional[str] = None   # the victim's group


_KILLED = re.compile(r"Killed process (\d+) \(")
_CONSTRAINT = re.compile(r"^oom-kill:constraint=(\w+)")
_OOM_MEMCG = re.compile(r",oom_memcg=(.*?),task_memcg=")
_TASK_MEMCG = re.compile(r",task_memcg=(.*?),task=")
_PID = re.compile(r",pid=(\d+)(?:,|$)")


def parse_kmsg(record: str) -> "Optional[Kill]":
    """One /dev/kmsg record (``prio,seq,usec,flags;message`` and continuation lines): a
    ``Kill`` for a ``Killed process`` line or an ``oom-kill:`` context line (pid and
    groups, no ``line``), None for anything else."""
    head, _, rest = record.partition(";")
    if not rest or "," not in head:
        return None
    message = rest.split("\n", 1)[0]
    m = _KILLED.search(message)
    if m:
        return Kill(int(m.group(1)), message.split(", UID:")[0].strip())
    if message.startswith("oom-kill:"):
        pids = _PID.findall(message)
        if not pids:
            return None
        memcg, task = _OOM_MEMCG.search(message), _TASK_MEMCG.search(message)
        c = _CONSTRAINT.match(message)
        return Kill(int(pids[-1]), "", c.group(1) if c else None, memcg.group(1) if memcg else None,
                    task.group(1) if task else None)
    return None


class KernelLog:
    """The OOM kills in a stream of kernel log records: ``count`` of them since ``reset()``,
    and the one of ``pid``, with its context line's groups, once it appears."""

    def __init__(self, pid: int):
        self.pid = pid
        self.count = 0
        self.kill: Optional[Kill] = None
        self._context: Optional[Kill] = None

    def feed(self, record: str) -> None:
        k = parse_kmsg(record)
        if k is None:
            return
        if not k.line:                      # the context line comes just before its kill
            self._context = k
            return
        self.count += 1
        ctx, self._context = self._context, None
        if k.pid == self.pid and self.kill is None:
            if ctx is not None and ctx.pid == k.pid:
                k = Kill(k.pid, k.line, ctx.constraint, ctx.oom_memcg, ctx.task_memcg)
            self.kill = k

    def reset(self) -> None:
        self.count = 0


# --- pure: the judgement ------------------------------------------------------------------

# How a group's counter ties a kill to the worker: "own" (its own group) and "solo" (it held
# only the worker's processes at the last look) are exact; "shared" (the worker's group at
# the last look, with other processes in it), "former" (a group it had left by the last
# look) and "enclosing" are not.
EXACT = ("own", "solo")


class Rise(NamedTuple):
    """An ``oom_kill`` counter that rose across the death."""
    group: str          # its name, as the kernel writes it
    kind: str           # own, solo, shared, former, enclosing


def judge(kill: Optional[Kill], kmsg_complete: bool, rises: list, last_seen_exact: bool,
          vmstat_rose: bool, counters_readable: bool, limit_met: "Optional[tuple]" = None,
          oom_memcg_limit: Optional[int] = None, own: Optional[str] = None) -> Optional[str]:
    """The OOM killer's evidence against one worker SIGKILLed from outside, as a sentence,
    or None if there is none.

    kill: the kernel log's record naming the worker's pid. kmsg_complete: the kernel log
    is readable in our PID namespace and holds a record of every OOM kill the machine
    counted across the death. rises: the counters that rose, strongest first.
    last_seen_exact: the worker was last seen only in groups of kinds ``EXACT``.
    limit_met: (group name, limit) of the group whose limit was met, from its failcnt (v1)
    or ``oom`` event (v2). oom_memcg_limit: the limit of the kernel log's ``oom_memcg``.
    own: the name of the worker's own group.
    """
    if kill is not None:
        where = _where(kill.oom_memcg, oom_memcg_limit, own) if kill.constraint == "CONSTRAINT_MEMCG" else \
            "The machine ran out of memory" if kill.constraint == "CONSTRAINT_NONE" else \
            _limit_text(limit_met, own, vmstat_rose)
        return f'{where}: the kernel log says "{kill.line}".'
    if kmsg_complete:
        return None
    exact = [r for r in rises if r.kind in EXACT]
    weak = [r for r in rises if r.kind not in EXACT]
    if exact:
        evidence = exact[0]
    elif weak and not last_seen_exact:
        evidence = weak[0]
    elif vmstat_rose and not counters_readable:
        return ("The machine ran out of memory: oom_kill in /proc/vmstat rose (no memory cgroup counter "
                "or kernel log was readable to tie it to this worker).")
    else:
        return None
    said = {"own": f"the oom_kill counter of its own memory cgroup {evidence.group} rose",
            "solo": f"the oom_kill counter of the memory cgroup {evidence.group}, where it was last seen, rose",
            "shared": f"the oom_kill counter of the memory cgroup {evidence.group}, which it shared "
                      f"with other processes, rose",
            "former": f"the oom_kill counter of the memory cgroup {evidence.group}, where it was seen "
                      f"before, rose",
            "enclosing": f"the oom_kill counter of the enclosing memory cgroup {evidence.group} rose"}
    return f"{_limit_text(limit_met, own, vmstat_rose)}: {said[evidence.kind]}."


def _where(group: Optional[str], limit: Optional[int], own: Optional[str]) -> str:
    what = "its own memory cgroup" if group is not None and group == own else "the memory cgroup"
    size = f" (limit {format_bytes(limit)})" if limit else ""
    return f"{what[0].upper()}{what[1:]} {group}{size} ran out"


def _limit_text(limit_met: "Optional[tuple]", own: Optional[str], vmstat_rose: bool) -> str:
    if limit_met is not None:
        return _where(limit_met[0], limit_met[1], own)
    return ("The machine ran out of memory (oom_kill in /proc/vmstat rose and no memory cgroup the worker "
            "was seen in met its limit)") if vmstat_rose else "Memory ran out"


# --- the watcher ----------------------------------------------------------------------------

class _Group(NamedTuple):
    directory: str
    version: str
    kind: str

    @property
    def name(self) -> str:
        return cgroup_name(self.directory, self.version)

    def counter(self) -> tuple[str, str]:
        """(file, key) of its oom_kill counter. v2: the local one for a group the worker was
        seen in (a kill in a subgroup is not a member's), the hierarchical one for its own
        group (all of it is the worker's) and an enclosing one (that is the point)."""
        if self.version == "v1":
            return os.path.join(self.directory, "memory.oom_control"), "oom_kill"
        local = os.path.join(self.directory, "memory.events.local")
        if self.kind not in ("own", "enclosing") and os.path.exists(local):
            return local, "oom_kill"
        return os.path.join(self.directory, "memory.events"), "oom_kill"

    def limit_counter(self) -> tuple[str, str]:
        """(file, key) of the count of times its own limit was met."""
        if self.version == "v1":
            return os.path.join(self.directory, "memory.failcnt"), ""
        local = os.path.join(self.directory, "memory.events.local")
        return (local if os.path.exists(local) else os.path.join(self.directory, "memory.events")), "oom"

    def limit(self) -> Optional[int]:
        return _read_limit(self.directory, self.version)


def _read_limit(directory: str, version: str) -> Optional[int]:
    try:
        with open(os.path.join(directory, "memory.limit_in_bytes" if version == "v1" else "memory.max")) as f:
            return parse_limit(f.read())
    except OSError:
        return None


def _read(path: str, key: str) -> Optional[int]:
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    if not key:
        text = text.strip()
        return int(text) if text.isdigit() else None
    return parse_counters(text).get(key)


def _init_pid_namespace() -> bool:
    try:
        return os.stat("/proc/self/ns/pid").st_ino == _INIT_PID_NS
    except OSError:
        return False


def _open_kmsg() -> Optional[int]:
    """/dev/kmsg, positioned after its last record, or None where it tells us nothing exact."""
    if not _init_pid_namespace():
        return None
    try:
        fd = os.open(KMSG, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:            # not Linux, or no CAP_SYSLOG under kernel.dmesg_restrict
        return None
    try:
        os.lseek(fd, 0, os.SEEK_END)
    except OSError:
        os.close(fd)
        return None
    return fd


class OomWatch:
    """The OOM evidence about one worker process, from its start to its death.

    ``own``: (directory, version) of the worker's own memory cgroup, which it is joining
    (its membership is not read until the next ``look``). ``look()`` at the sampling
    cadence; ``evidence()`` once, after a SIGKILL the nanny did not send; ``close()``.
    """

    def __init__(self, pid: int, own: "Optional[tuple[str, str]]" = None):
        self.pid = pid
        self.own = _Group(own[0], own[1], "own") if own else None
        self.groups: dict[str, _Group] = {}     # every group it was seen in, and those enclosing them
        self.last_seen: set[str] = set()        # the groups it was in at the last look that read any
        self._kmsg = _open_kmsg()
        self._gap = False                       # kernel log records were lost since the last look
        self.log = KernelLog(pid)
        self._base: dict[tuple[str, str], int] = {}
        if self.own is not None:
            self._track(self.own)
            self.last_seen = {self.own.directory}
            self._rebase()
        else:
            self.look(())

    def look(self, family: Iterable[int]) -> None:
        """Where the worker is now, and fresh baselines: a narrow window before the death
        keeps OOM kills of long ago out of the evidence. ``family``: the pids of the
        worker's descendants (a group holding only these and the worker is its alone)."""
        seen = [(v, os.path.normpath(d)) for v, d in machine.memory_cgroups(self.pid)]
        # A process read while it exits shows in no group (cgroup v1 says "/"): that says
        # nothing about where it lived, so the last real look stands.
        seen = [(v, d) for v, d in seen if d != _ROOTS[v] and os.path.exists(_Group(d, v, "solo").counter()[0])]
        if seen:
            members = {self.pid, *family}
            now = set()
            for version, directory in seen:
                if self.own is not None and directory == self.own.directory:
                    kind = "own"
                else:
                    kind = "solo" if set(_procs(directory)) <= members else "shared"
                self._track(_Group(directory, version, kind))
                now.add(directory)
            for directory in self.last_seen - now:
                g = self.groups.get(directory)
                if g is not None and g.kind in ("solo", "shared"):
                    self.groups[directory] = _Group(g.directory, g.version, "former")
            self.last_seen = now
        self._rebase()

    def _track(self, group: _Group) -> None:
        self.groups[group.directory] = group
        for directory in ancestors(group.directory, group.version):
            if directory not in self.groups:
                self.groups[directory] = _Group(directory, group.version, "enclosing")

    def _files(self) -> list[tuple[str, str]]:
        files = [(VMSTAT, "oom_kill")]
        for g in self.groups.values():
            files += [g.counter(), g.limit_counter()]
        return files

    def _snapshot(self) -> dict[tuple[str, str], int]:
        out = {}
        for path, key in self._files():
            value = _read(path, key)
            if value is not None:
                out[(path, key)] = value
        return out

    def _rebase(self) -> None:
        # counters first, then the log: a kill in between is logged in this window and
        # counted in the next, which only makes evidence() wait out its grace for it
        self._base = self._snapshot()
        self._drain()
        self.log.reset()
        self._gap = False

    def _drain(self) -> None:
        if self._kmsg is None:
            return
        for _ in range(100_000):
            try:
                record = os.read(self._kmsg, 8192)
            except BlockingIOError:
                return
            except BrokenPipeError:     # overwritten before we read them: the next read goes on
                self._gap = True
                continue
            except OSError:
                self._close_kmsg()
                return
            if not record:
                return
            self.log.feed(record.decode("utf-8", "replace"))

    def evidence(self) -> Optional[str]:
        """After the death: the sentence that says why this SIGKILL was the OOM killer's, or None."""
        now = self._snapshot()
        self._drain()

        def rose(f):
            return f in now and f in self._base and now[f] > self._base[f]
        kills = now.get((VMSTAT, "oom_kill"), 0) - self._base.get((VMSTAT, "oom_kill"), 0)
        deadline = time.monotonic() + KMSG_WAIT
        while (self._kmsg is not None and self.log.kill is None and self.log.count < kills
               and time.monotonic() < deadline):
            time.sleep(0.005)
            self._drain()
        complete = self._kmsg is not None and not self._gap and (
            self.log.kill is not None or self.log.count >= kills)
        order = {"own": 0, "solo": 1, "shared": 2, "former": 3, "enclosing": 4}
        groups = sorted(self.groups.values(), key=lambda g: (order[g.kind], -g.directory.count("/")))
        rises = [Rise(g.name, g.kind) for g in groups if rose(g.counter())]
        met = sorted((g for g in self.groups.values() if rose(g.limit_counter())),
                     key=lambda g: -g.directory.count("/"))
        limit_met = (met[0].name, met[0].limit()) if met else None
        kill = self.log.kill
        memcg_limit = None
        if kill is not None and kill.oom_memcg:
            version = next(iter(self.groups.values())).version if self.groups else "v2"
            memcg_limit = _read_limit(_ROOTS[version] + kill.oom_memcg.rstrip("/"), version)
        last_exact = bool(self.last_seen) and all(
            self.groups[d].kind in EXACT for d in self.last_seen if d in self.groups)
        readable = any(f in now for g in self.groups.values() for f in [g.counter()])
        return judge(kill, complete, rises, last_exact, rose((VMSTAT, "oom_kill")), readable, limit_met,
                     memcg_limit, self.own.name if self.own else None)

    def _close_kmsg(self) -> None:
        if self._kmsg is not None:
            os.close(self._kmsg)
            self._kmsg = None

    def close(self) -> None:
        self._close_kmsg()


def _procs(directory: str) -> list[int]:
    try:
        with open(os.path.join(directory, "cgroup.procs")) as f:
            return [int(line) for line in f if line.strip()]
    except (OSError, ValueError):
        return [-1]         # unreadable: not known to be the worker's alone
