"""One Nanny per worker process, living in the parent: spawn, supervise, reap.

The nanny owns everything about one process that the scheduler thread waits on:
its channel, its exit sentinel (a pidfd: readable the instant the process
dies), its captured stdout/stderr pipe and its status board. It samples the
process's memory, kills it when asked and remembers *why* it killed it, and
after the death gathers the observations that ``death.classify`` turns into a cause.

Workers are started with ``python -c`` rather than multiprocessing's spawn, so a
user script needs no ``if __name__ == "__main__"`` guard and its top level runs
once; they are session leaders, so Ctrl-C in a terminal reaches only the user's
process and their own children can be killed as a group.
"""
from __future__ import annotations

import itertools
import logging
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from typing import Any, Callable, Optional

from ..worker import logs
from ..wire.board import Board
from ..wire.channel import Channel
from ..system.cgroup import WorkerGroup
from ..system.machine import descendants, open_statm, rss_of
from ..system.machine import rss as read_rss
from ..system.oom import OomWatch
from .output import STACKS_TAIL_LINE, OutputStream
from ..worker.boot import boot_argv, settings_frame
from ..worker.process import STACKS_HEAD

logger = logging.getLogger("localcluster")

_groups = itertools.count()      # cgroup names stay unique across clusters of one process

# How long the stacks thread may wait for the GIL before the stacks asked for before a kill
# come from SIGUSR1 instead (``last_stacks_arrived``): half the policy's STACK_GRACE, so that
# the signal's dump still has time to arrive.
GIL_WAIT = 0.5

_WORKER_ENV = {
    # dask's pre-spawn environment: return freed memory to the OS promptly, and do
    # not let every worker start one BLAS thread per core.
    "MALLOC_TRIM_THRESHOLD_": "65536",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
}


class Nanny:
    """One worker process, seen from the parent: an I/O handle with no policy (what to do
    about the worker is the supervision policy's, policy.py).

    Thread: the scheduler thread creates, changes and closes it. User threads read the
    figures (memory, history, log, status) under the cluster's lock. The dispatcher's
    Outlet holds ``chan`` too: it queues task messages on it under that lock and flushes
    them from the thread of the event (the channel has its own lock for that).
    """

    def __init__(self, name: str, nthreads: int, memory_limit: Optional[int], settings: dict,
                 spill_dir: Optional[str], initializer: Optional[str], forward_logs: Any, log_lines: int,
                 end_note: Optional[str] = None):
        # fixed at creation
        self.name = name
        self.nthreads = nthreads
        self.memory_limit = memory_limit
        self.settings = settings
        self.spill_dir = spill_dir
        self.initializer = initializer
        self.forward_logs = forward_logs
        self.end_note = end_note      # the run's end note (runs.py), which the worker writes if the parent dies
        # the process and what connects to it: set by spawn(), released by close()
        self.proc: Optional[subprocess.Popen] = None
        self.pid = 0
        self.started = 0.0
        self.chan: Optional[Channel] = None
        self.sentinel: Optional[int] = None       # pidfd: readable the instant it dies
        self.statm: Optional[int] = None          # its /proc statm, open: each RSS sample is one pread
        self.outputs: list[OutputStream] = []     # the worker's stdout and stderr pipes
        self.board: Optional[Board] = None
        # what it said and wrote
        self.versions: dict = {}
        self.fatal: Optional[str] = None          # traceback the worker sent before dying
        self.log: deque[str] = deque(maxlen=log_lines)
        self.lines_seen = 0                       # lines ever kept (the log itself is bounded)
        # the stacks asked for before a kill: (request, when asked, lines_seen when SIGUSR1 was
        # sent or None while it was not)
        self._last_stacks: Optional[tuple[int, float, Optional[int]]] = None
        self._stacks_w: Optional[int] = None      # where dump_stacks asks the worker's stacks thread
        self._stacks_asked = itertools.count(1)   # the number of each such request
        self.exitcode: Optional[int] = None
        self._children: list[int] = []
        self._children_at = float("-inf")   # the first sample looks, whatever the clock reads (it counts from boot)
        self.oom: Optional[OomWatch] = None       # the OOM killer's evidence, from spawn to death
        self.group: Optional[WorkerGroup] = None  # the worker's own memory cgroup, where allowed
        self.ceiling: Optional[int] = None        # its kernel limit, bytes, once the worker is accepted
        self.in_group = False                     # a member of it at the last look (something may move it out)
        # Moving a process into a cgroup waits for the kernel (an RCU grace period, long on
        # cgroup v1), so a thread does it: the loop thread, which respawns a dead
        # worker while the dead one's tasks run again elsewhere, does not wait. Joined
        # (``_joined``) before anything reads the membership, and before the worker is
        # accepted, so every task runs in the group.
        self._joining: Optional[threading.Thread] = None
        # Reading the channel: the scheduler thread, or a user thread it is lent to while that
        # thread waits for one future (Supervisor.read_for). Frames are read and handled one
        # at a time under ``reading``, so they are handled in the order they came; ``reading``
        # is always taken before the cluster's lock, never under it.
        self.reading = threading.RLock()
        #: frames a borrower read and left for the scheduler thread (they carry more than task
        #: results); handled before anything read after them. Under ``reading``
        self.left_for_loop: deque = deque()
        #: wakes a borrower whose future another thread ended
        self.bell = Doorbell()

    # --- start -----------------------------------------------------------------------

    def spawn(self) -> None:
        parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            # Before any message, the settings, then the key only the worker can read (neither
            # in argv, which ps shows to every user: SECURITY.md).
            key = bytes(multiprocessing.current_process().authkey)
            self.board = Board(self.nthreads)
            stacks_r, self._stacks_w = os.pipe2(os.O_CLOEXEC)
            try:
                self.proc = self._launch(child_sock.fileno(), stacks_r,
                                         lambda frame: parent_sock.sendall(frame + len(key).to_bytes(4, "big") + key))
            finally:
                os.close(stacks_r)
            os.set_blocking(self._stacks_w, False)
        except BaseException:       # nothing of a worker that did not start is left open
            parent_sock.close()
            if self._stacks_w is not None:
                os.close(self._stacks_w)
                self._stacks_w = None
            if self.board is not None:
                self.board.close()
                self.board = None
            if self.group is not None:
                self.group.remove()
                self.group = None
            raise
        finally:
            child_sock.close()
        self.pid = self.proc.pid
        self.started = time.monotonic()
        self.chan = Channel(parent_sock)
        self.bell.open()
        forward = {True: "output", "all": "all"}.get(self.forward_logs)
        self.outputs = [OutputStream(pipe.fileno(), name, self.add_log, forward, f"[{self.name}] ")
                        for pipe, name in ((self.proc.stdout, "stdout"), (self.proc.stderr, "stderr"))]
        try:
            self.sentinel = os.pidfd_open(self.pid)
        except (AttributeError, OSError):  # pragma: no cover - not Linux >= 5.3
            self.sentinel = None
        self.statm = open_statm(self.pid)
        self.oom = OomWatch(self.pid, (self.group.path, self.group.version) if self.group is not None else None)

    def _launch(self, sock_fd: int, stacks_fd: int, preamble: Callable[[bytes], None]) -> subprocess.Popen:
        cfg = {
            "name": self.name, "nthreads": self.nthreads, "parent_pid": os.getpid(),
            "sock_fd": sock_fd, "board_fd": self.board.fd, "stacks_fd": stacks_fd,
            "sys_path": [os.fspath(p) or os.getcwd() for p in sys.path if isinstance(p, (str, os.PathLike))],
            "memory_limit": self.memory_limit, "memory_target": self.settings.get("memory_target"),
            "memory_pause": self.settings.get("memory_pause"),
            "spill_dir": self.spill_dir, "initializer": self.initializer,
            # the cluster's uploads and worker plugins (worker/setup.py), beside the workers' folders
            "setup": os.path.join(os.path.dirname(self.spill_dir), "setup.pkl") if self.spill_dir else None,
            "heartbeat": min(1.0, self.settings["worker_ttl"] / 5) if self.settings.get("worker_ttl") else 1.0,
            "log_level": logs.worker_level(), "spin_wait": self.settings.get("spin_wait") or 0.0,
            "end_note": self.end_note,
        }
        env = dict(os.environ)
        for k, v in _WORKER_ENV.items():
            env.setdefault(k, v)
        env["PYTHONUNBUFFERED"] = "1"
        env.pop("PYTHONSTARTUP", None)
        if self.spill_dir:
            os.makedirs(self.spill_dir, mode=0o700, exist_ok=True)
        self._make_group(cfg)
        preamble(settings_frame(cfg))
        return subprocess.Popen(boot_argv(cfg), pass_fds=(sock_fd, self.board.fd, stacks_fd), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, env=env)

    def _make_group(self, cfg: dict) -> None:
        """Its memory cgroup, made before the process so the worker is told which group's
        limit is its own to keep (cgroup.SharedAllowance); joined once its batch is started
        so every process a task starts is a member."""
        if not self.settings.get("worker_cgroup"):
            return
        factor = self.settings.get("memory_ceiling")
        self.ceiling = int(self.memory_limit * factor) if factor and self.memory_limit else None
        self.group = WorkerGroup.create(f"{self.name}-{next(_groups)}", None)
        if self.group is not None and self.ceiling:
            cfg["cgroup"] = [self.group.path, self.group.version, self.ceiling]

    def join_group(self) -> None:
        """Move the worker into its cgroup: a wait in the kernel (``join_groups``)."""
        self.in_group = self.group.add(self.pid)

    def joined_by(self, thread: threading.Thread) -> None:
        """``thread`` moves the worker into its group; it is waited for before anything
        reads the membership (``_joined``)."""
        self._joining = thread

    def _joined(self, wait: bool = True) -> bool:
        """Whether the move into its group is over (``wait``: wait for it). A worker that
        could not join has no group: its allowance then finds none and stops."""
        joining = self._joining
        if joining is None:
            return True
        if not wait and joining.is_alive():
            return False
        joining.join()
        self._joining = None
        if not self.in_group and self.group is not None:
            self.group.remove()
            self.group = None
        return True

    def enforce_ceiling(self) -> None:
        """Once the worker is accepted (its idle footprint fits the limit, see the
        supervisor), before its first task: from now on what it and its children allocate
        meets the kernel's limit. Not before, so that a limit below an idle worker is told
        as such instead of as the OOM killer."""
        self._joined()
        if self.group is not None and self.ceiling:
            self.group.set_limit(self.ceiling)

    # --- while it runs ---------------------------------------------------------------

    def add_log(self, line: str) -> None:
        """A line of the worker's output, or of the nanny's own (pause, resume, kill)."""
        self.log.append(line)
        self.lines_seen += 1

    def dump_complete(self, mark: int) -> bool:
        """Whether the dump SIGUSR1 asked for when ``lines_seen`` was ``mark`` (``last_stacks_arrived``)
        has fully arrived: faulthandler writes the main thread last, and its outermost frame is
        the ``python -c`` line."""
        new = min(self.lines_seen - mark, len(self.log))
        return any(self.log[-i].strip().startswith('File "<string>"') for i in range(1, new + 1))

    def stacks_for(self, request: int) -> Optional[str]:
        """The dump that answers ``request`` (``request_stacks``), once it has arrived whole:
        the newest one between the lines naming a request at least as new (output.py's
        ``STACKS_HEAD`` and ``STACKS_TAIL``)."""
        lines = list(self.log)
        for end in range(len(lines) - 1, -1, -1):
            m = STACKS_TAIL_LINE.match(lines[end])
            if m:
                if int(m.group(1)) < request:
                    return None             # the newest answer is older: ours is still to come
                head = STACKS_HEAD.format(m.group(1))
                start = next((i for i in range(end - 1, -1, -1) if lines[i] == head), -1)
                return "\n".join(lines[start + 1:end]).strip()
        return None

    def sample(self, now: float) -> Optional[int]:
        """RSS of the worker and its children, bytes; None while it is gone or being torn
        down (the kernel already freed its pages): the last real figure stands."""
        rss = rss_of(self.statm) if self.statm is not None else read_rss(self.pid)
        if not rss:
            return None
        if now - self._children_at > 1.0:
            self._children_at = now
            self._children = descendants(self.pid)
            if self._joined(wait=False):     # not while it moves into its group: it is still in ours
                self.oom.look(self._children)
        for child in self._children:
            r = read_rss(child)
            if r is not None:
                rss += r
        return rss

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.exitcode is not None:
            return
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self) -> None:
        """Ask the worker to exit; the policy escalates to kill() later."""
        if self.chan is not None and not self.chan.closed:
            from ..wire.protocol import Stop
            self.chan.send(Stop())

    def request_stacks(self) -> int:
        """Ask the worker's stacks thread for every thread's stack (``stacks_for`` gives it):
        written with the GIL held, so a worker whose GIL C code holds answers once it lets go.
        Returns the request's number."""
        request = next(self._stacks_asked)
        try:
            os.write(self._stacks_w, request.to_bytes(4, "big"))
        except (OSError, TypeError):    # gone, or requests already waiting: the next dump answers them all
            pass
        return request

    def ask_last_stacks(self, now: float) -> None:
        """Before the policy kills a hung worker (``last_stacks_arrived`` tells when they are
        written): every thread's stack, asked of the stacks thread first (``request_stacks``)."""
        self._last_stacks = (self.request_stacks(), now, None)

    def last_stacks_arrived(self, now: float) -> bool:
        """Whether the stacks asked for before a kill are written. The stacks thread writes
        them once it holds the GIL. When C code holds the GIL for ``GIL_WAIT``, faulthandler
        writes them from SIGUSR1 instead, without the GIL. The handler reads the frames of
        threads that may run meanwhile, and a frame pushed or popped under it can crash the
        worker: the death would then read SIGSEGV instead of the timeout that killed it.
        While C code holds the GIL, no other thread runs Python, so the frames hold still."""
        if self._last_stacks is None:
            return False
        request, asked, signalled = self._last_stacks
        if self.stacks_for(request) is not None:
            return True
        if signalled is not None:
            return self.dump_complete(signalled)
        if now - asked >= GIL_WAIT:
            self._last_stacks = (request, asked, self.lines_seen)
            try:
                os.kill(self.pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        return False

    # --- after death -----------------------------------------------------------------

    def reap(self) -> int:
        """Collect the exit status, kill whatever the worker left behind, drain its output."""
        self._joined()      # first: the pid is not reused while the process is not reaped
        code = self.proc.wait()
        self.exitcode = code
        if self.group is not None:
            self.group.kill_all()                # every descendant, even one that called setsid
        try:
            os.killpg(self.pid, signal.SIGKILL)   # its own children, started by tasks
        except (ProcessLookupError, PermissionError):
            pass
        for stream in self.outputs:
            stream.read()
        return code

    def close(self) -> None:
        self._joined()
        if self.oom is not None:
            self.oom.close()
        for fd_attr in ("sentinel", "statm"):
            fd = getattr(self, fd_attr)
            if fd is not None:
                os.close(fd)
                setattr(self, fd_attr, None)
        if self.chan is not None:
            with self.reading:      # not while a borrower reads it
                self.chan.close()
        self.bell.close()
        if self.proc is not None:
            for pipe in (self.proc.stdout, self.proc.stderr):
                if pipe is not None:
                    pipe.close()
        if self.board is not None:
            self.board.close()
        if self._stacks_w is not None:
            os.close(self._stacks_w)
            self._stacks_w = None
        if self.group is not None:
            self.group.remove()
            self.group = None


class Doorbell:
    """What a thread selects on beside a channel, rung from another thread to wake it: an
    eventfd (a pipe where there is none). Opened with its nanny's process and closed with it;
    a ring after that rings nothing (never a descriptor number that something else has since
    been given)."""

    __slots__ = ("_lock", "_r", "_w", "_closed")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._r = self._w = -1
        self._closed = False

    def open(self) -> None:
        with self._lock:
            if self._r < 0 and not self._closed:
                if hasattr(os, "eventfd"):
                    self._r = self._w = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
                else:  # pragma: no cover - not Linux
                    self._r, self._w = os.pipe()
                    os.set_blocking(self._r, False)
                    os.set_blocking(self._w, False)

    def fileno(self) -> int:
        """The end to select on; -1 unless open."""
        return self._r

    def ring(self) -> None:
        with self._lock:
            if self._w >= 0:
                try:
                    os.write(self._w, (1).to_bytes(8, sys.byteorder))
                except BlockingIOError:     # full: a ring is pending anyway
                    pass

    def quiet(self) -> None:
        """Take the rings heard so far."""
        with self._lock:
            if self._r >= 0:
                try:
                    while os.read(self._r, 512):
                        pass
                except BlockingIOError:
                    pass

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for fd in {self._r, self._w}:
                if fd >= 0:
                    os.close(fd)
            self._r = self._w = -1


def join_groups(nannies: list[Nanny]) -> None:
    """Move just-started workers into their cgroups, from one short-lived thread, once all
    of them are started: a move waits for an RCU grace period, and a fork (the next
    worker's) waits with it on the kernel's cgroup_threadgroup_rwsem; so a cluster's
    workers are spawned back to back and moved after (moved from its own thread as it
    started, each worker made the next one's spawn wait)."""
    grouped = [n for n in nannies if n.group is not None]
    if not grouped:
        return
    joining = threading.Thread(target=lambda: [n.join_group() for n in grouped],
                               name="localcluster-cgroup-join", daemon=True)
    for n in grouped:
        n.joined_by(joining)
    joining.start()
