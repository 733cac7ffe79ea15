"""Why a worker died: the cause taxonomy, the ``WorkerDeath`` record, and the
errors a task can end with because of a death.

Everything here is pure: the nanny gathers the observations (exit status, which
signal it sent itself and why, OOM-killer evidence, captured output) and these
functions turn them into a cause, a blame and a sentence for the user.
"""
from __future__ import annotations

import os
import re
import signal as _signal
from concurrent.futures import CancelledError
from dataclasses import dataclass, field, replace
from typing import Optional

from .config import format_bytes
from .wire.basics import RemoteTraceback, TransferError, thread_ident

__all__ = [
    "WorkerDeath", "KilledWorker", "TaskTimeoutError", "RemoteTraceback", "LostDataError", "TaskError", "ClusterBroken",
    "TransferError", "ClusterRestarted", "ClusterClosed", "WorkerStartupError",
    "CAUSES", "classify", "signal_name", "exit_signal", "describe_exit", "crash_stack", "crashing_thread", "thread_ident",
]

CAUSES = ("requested", "exit", "exception", "memory-limit", "memory-leak", "oom-killer", "crash",
          "signal", "timeout", "unresponsive")

# Signals a process raises against itself when it breaks (as opposed to being killed).
CRASH_SIGNALS = frozenset(
    getattr(_signal, name) for name in ("SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGABRT", "SIGSYS", "SIGTRAP")
    if hasattr(_signal, name)
)
NANNY_REASONS = ("requested", "memory-limit", "memory-leak", "timeout", "unresponsive")


def signal_name(signum: Optional[int]) -> Optional[str]:
    if not signum:
        return None
    try:
        return _signal.Signals(signum).name
    except ValueError:
        return f"SIG{signum}"


def exit_signal(exitcode: Optional[int]) -> Optional[str]:
    """The name of the signal that ended a process (``Popen.returncode`` < 0), else None."""
    return signal_name(-exitcode) if exitcode is not None and exitcode < 0 else None


def describe_exit(exitcode: Optional[int]) -> str:
    """loky's habit: ``SIGSEGV(-11)``, ``EXIT(3)``."""
    if exitcode is None:
        return "UNKNOWN"
    if exitcode < 0:
        return f"{exit_signal(exitcode)}({exitcode})"
    return f"EXIT({exitcode})"


def classify(exitcode: Optional[int], nanny_reason: Optional[str] = None,
             oom_evidence: "bool | str | None" = False, machinery_error: bool = False) -> str:
    """The cause of one death, from what the nanny observed.

    exitcode: ``Popen.returncode`` (negative: killed by that signal).
    nanny_reason: why the nanny itself stopped the process, if it did.
    oom_evidence: evidence of the kernel's OOM killer across the death (truthy: the
    sentence that says which, from oom.OomWatch).
    machinery_error: the worker reported that its own code (not a task) failed.
    """
    if nanny_reason is not None:
        if nanny_reason not in NANNY_REASONS:
            raise ValueError(f"unknown nanny reason {nanny_reason!r}")
        return nanny_reason
    signum = -exitcode if exitcode is not None and exitcode < 0 else None
    if signum is not None:
        if signum in CRASH_SIGNALS:
            return "crash"
        if signum == _signal.SIGKILL and oom_evidence:
            return "oom-killer"
        return "signal"
    if machinery_error:
        return "exception"
    return "exit"


# faulthandler prints "Current thread 0x00007f... (most recent call first):" then
# indented "  File ..." lines; other threads follow as "Thread 0x...".
_CURRENT = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-fA-F]+)(?: \[.*?\])? \(most recent call first\):")


_PACKAGE_FILE = f'File "{os.path.dirname(os.path.abspath(__file__))}{os.sep}'
_BOOTSTRAP = re.compile(r'(threading\.py", line \d+ in (run|_bootstrap|_bootstrap_inner)|File "<string>", line \d+ in <module>)$')


def _internal(frame_line: str) -> bool:
    """A frame of localcluster's own worker loop or of the thread machinery under it."""
    return _PACKAGE_FILE in frame_line or bool(_BOOTSTRAP.search(frame_line.rstrip()))


def _user_frames(lines: list[str]) -> list[str]:
    """Drop localcluster's own frames (all of them kept if nothing else is left)."""
    kept = [l for l in lines if not (l.strip().startswith("File ") and _internal(l))]
    return kept if any(l.strip().startswith("File ") for l in kept) else lines


def thread_stack(log_lines: list[str], ident: int) -> Optional[str]:
    """Thread ``ident``'s block in the newest faulthandler dump in ``log_lines`` (as asked
    for with SIGUSR1 before a timeout kill), without localcluster's own frames."""
    for i in range(len(log_lines) - 1, -1, -1):
        m = _CURRENT.match(log_lines[i].strip())
        if m and thread_ident(int(m.group(1), 16)) == thread_ident(ident):
            block = [log_lines[i]]
            for line in log_lines[i + 1:i + 400]:
                if not (line.strip().startswith("File ") or line.strip().startswith("<")):
                    break
                block.append(line)
            return "\n".join(_user_frames(block)) if len(block) > 1 else None
    return None


def crash_stack(log_lines: list[str], all_threads: bool = False) -> Optional[str]:
    """The crashing thread's stack from the last faulthandler report in a worker's output:
    the "Fatal Python error" line and the "Current thread" block without localcluster's own
    frames (other threads stay in the log). ``all_threads``: the whole report, as written."""
    start = None
    for i in range(len(log_lines) - 1, -1, -1):
        if log_lines[i].startswith("Fatal Python error"):
            start = i
            break
    if start is None:
        return None
    if all_threads:
        end = start + 1
        while end < len(log_lines) and end - start < 2000 and (
                not log_lines[end].strip() or log_lines[end].startswith(" ") or _CURRENT.match(log_lines[end])):
            end += 1
        return "\n".join(log_lines[start:end]).rstrip()
    out = [log_lines[start]]
    inside = False
    for line in log_lines[start + 1:start + 400]:
        s = line.strip()
        if s.startswith("Current thread") or s.startswith("Stack (most recent call first)"):
            inside = True
            out.append(line)
            continue
        if inside:
            if not s or not (s.startswith("File ") or s.startswith("<")):
                break
            out.append(line)
    return "\n".join(_user_frames(out)).rstrip() if len(out) > 1 else log_lines[start]


def crashing_thread(stack: Optional[str]) -> Optional[int]:
    """The ident of the thread faulthandler marked as current (the one that crashed)."""
    if not stack:
        return None
    for line in stack.splitlines():
        m = _CURRENT.match(line.strip())
        if m and line.strip().startswith("Current thread"):
            return int(m.group(1), 16)
    return None


def top_frames(stack: Optional[str], n: int = 3) -> list[str]:
    """The innermost ``n`` frames of the thread a stack is about, for one-line summaries: the
    "Current thread" block of a crash report (the crashing thread), else the first block
    (the one thread ``thread_stack`` kept for a timeout or an unresponsive worker)."""
    if not stack:
        return []
    blocks: list[tuple[bool, list[str]]] = []     # (faulthandler's current thread, frames)
    open_ = False
    for line in stack.splitlines():
        s = line.strip()
        if _CURRENT.match(s) or s.startswith("Stack (most recent call first)"):
            blocks.append((not s.startswith("Thread "), []))
            open_ = True
        elif open_ and s.startswith("File "):
            blocks[-1][1].append(s)
        elif open_ and blocks[-1][1]:
            open_ = False           # the block ended: what follows is not its frames
    chosen = next((f for current, f in blocks if current and f), None) or next((f for _c, f in blocks if f), [])
    return chosen[:n]


# How a death's stack is introduced: where the worker crashed, hung or was when stopped.
_WHERE = {"crash": ("crashed in", "It crashed in {}."),
          "unresponsive": ("stuck in", "It was stuck in {}."),
          "timeout": ("was in", "It was in {} when stopped.")}
_WHERE_ELSE = ("was in", "It was in {} when it died.")


def blamed_runs(cause: str, running: dict, crashed_seq: Optional[int], timed_out_seq: Optional[int]) -> set:
    """Which of the runs that were executing at a death count towards KilledWorker.

    A crash is blamed on the run on the crashing thread alone, when the stack names
    it; a timeout fails only the late task (with TaskTimeoutError, not KilledWorker);
    an exit the cluster asked for, or a failure of localcluster's own code, blames nobody.
    """
    if cause in ("requested", "exception", "timeout", "memory-leak"):   # a leak: Policy.leak_blame
        return set()
    if cause == "crash" and crashed_seq is not None:
        return {crashed_seq}
    return set(running)



# Said where the user holds the future (a death record, KilledWorker), never by the replay itself.
REPLAY_HINT = {
    "crash": "Replay it in a throwaway process with client.recreate_error_locally(future).",
    "exit-in-task": "Replay it in a throwaway process with client.recreate_error_locally(future).",
}

_ADVICE = {
    "requested": "Nothing to do: the cluster asked for this (close, scale down or restart).",
    "exit": "Something in the worker ended the process outside any task: a thread a task started, an "
            "atexit hook, or a library calling os._exit(). Look for it in the code the tasks run.",
    "exception": "The traceback is in the death's log_tail: if it ends in your initializer, a worker plugin's "
                 "setup or an uploaded module, fix that (client.unregister_worker_plugin(name) removes a plugin); "
                 "else check that the worker can import what the tasks need (client.get_versions(check=True)).",
    "memory-limit": "Give each worker more memory (LocalCluster(memory_limit=...)), use fewer workers, "
                    "or make the task's pieces smaller.",
    "memory-leak": "The memory is held by the tasks' own code, not by results localcluster keeps: look for "
                   "a module-level cache or list that grows with each call, or a library that keeps "
                   "what it is given. The worker was restarted and the work went on; raise memory_limit, or "
                   "set memory_leak_restart=None to pause instead.",
    "oom-killer": "The worker ran out of memory, on the machine or under a memory cgroup's limit (a "
                  "container's, a job's, one a task moved it into); the death says which. Set a memory_limit "
                  "below that room so localcluster stops the worker first, use fewer workers, or make the "
                  "task's pieces smaller.",
    "crash": "This is a bug in compiled code (a C extension, ctypes, or a library built for another "
             "version); the stack shows where.",
    "signal": "Something outside localcluster killed the worker (kill, a job scheduler, a container "
              "limit). The task may not be at fault.",
    "timeout": "The task ran past its timeout; raise submit(..., timeout=...) or make the task faster.",
    "exit-in-task": "One of these tasks, or a library it called, ended the process (os._exit(), or "
                    "sys.exit() from a thread of its own). A sys.exit() in the task itself only fails that task.",
    "unresponsive": "A task held the interpreter (GIL) or blocked the worker for too long; the stacks of "
                    "all threads were written to the worker's log just before. Raise worker_ttl if the "
                    "task is simply slow.",
}


def death_event(death: "WorkerDeath") -> dict:
    """A death as the event log tells it (topics "all" and the worker's name), with dask's
    fields of a worker's removal and ours: its cause and the whole WorkerDeath."""
    return {"action": "remove-worker", "worker": death.worker, "processing-tasks": death.tasks,
            "expected": death.cause == "requested", "cause": death.cause, "signal": death.signal,
            "exitcode": death.exitcode, "message": death.message, "death": death}


@dataclass(frozen=True)
class WorkerDeath:
    """One worker death, expected or not (``cluster.deaths``, ``KilledWorker.deaths``).

    Attributes:
        worker: the worker's name.
        pid: its process id.
        cause: one of ``CAUSES`` (``requested``, ``exit``, ``exception``, ``memory-limit``,
            ``memory-leak``, ``oom-killer``, ``crash``, ``signal``, ``timeout``,
            ``unresponsive``), from ``classify``; the guide "Why workers die" explains each.
        exitcode: the process's exit code, if it exited.
        signal: the signal that ended it (``"SIGSEGV"``), if one did.
        tasks: the keys of the tasks it was running.
        memory: its memory at the last sample, in bytes.
        peak_memory: the most it had, in bytes.
        memory_limit: its limit, in bytes (None: none).
        stack: the crashing thread's frames, or the task's thread's for a timeout or an
            unresponsive worker.
        log_tail: its last lines of output and log records.
        time: when it died (``time.time()``).
        message: the whole story in words, as the exceptions show it.
        blamed: which of ``tasks`` it counts against.
        detail: for ``oom-killer``: whose memory ran out and the evidence.
        managed: the bytes of results it held at the last sample (None: not sampled).
    """
    worker: str
    pid: int
    cause: str
    exitcode: Optional[int]
    signal: Optional[str]
    tasks: tuple = ()
    memory: Optional[int] = None
    peak_memory: Optional[int] = None
    memory_limit: Optional[int] = None
    stack: Optional[str] = None
    log_tail: tuple = ()
    time: float = 0.0
    message: str = ""
    blamed: tuple = field(default=(), compare=False)   # derived: which of tasks it counts against
    detail: Optional[str] = field(default=None, compare=False)
    managed: Optional[int] = None      # bytes of results it held at the last sample (None: not sampled)

    @property
    def unmanaged(self) -> Optional[int]:
        """What the tasks' own code kept: memory less the results held."""
        if self.memory is None or self.managed is None:
            return None
        return max(0, self.memory - self.managed)

    def __str__(self) -> str:
        return self.message

    def explained(self, replay_hint: bool = True, advice: Optional[dict] = None) -> "WorkerDeath":
        """This death with its ``message`` written from its own fields (``death_message``);
        ``advice``: what to do, by topic, in another cluster's terms (dask's)."""
        return replace(self, message=death_message(
            self.worker, self.pid, self.cause, self.exitcode, self.tasks, self.memory, self.peak_memory,
            self.memory_limit, self.stack, self.detail, replay_hint, self.managed, advice))

    def _facts(self) -> list[str]:
        parts = [self.cause]
        if self.signal:
            parts.append(self.signal)
        elif self.exitcode is not None:
            parts.append(f"exit code {self.exitcode}")
        if self.memory is not None:
            mem = f"memory {format_bytes(self.memory)}"
            notes = []
            if self.unmanaged is not None and self.cause in _MEMORY_CAUSES:
                notes.append(f"unmanaged {format_bytes(self.unmanaged)}")
            if self.peak_memory and self.peak_memory > self.memory:
                notes.append(f"peak {format_bytes(self.peak_memory)}")
            if notes:
                mem += f" ({', '.join(notes)})"
            if self.memory_limit:
                mem += f" of {format_bytes(self.memory_limit)} limit"
            parts.append(mem)
        return parts

    def headline(self, lead: str = "") -> str:
        """The one console line a death gets by default: who, cause, signal, tasks, memory."""
        facts = self._facts()
        if self.tasks:
            shown = ", ".join(map(repr, self.tasks[:3]))
            more = f" and {len(self.tasks) - 3} more" if len(self.tasks) > 3 else ""
            facts.insert(len(facts) - (self.memory is not None), f"running {shown}{more}")
        if self.cause == "memory-leak" and self.detail:
            return (f"localcluster: {lead}{self.worker} (pid {self.pid}) restarted: {self.detail} "
                    f"Details in cluster.deaths[-1].message")
        return (f"localcluster: {lead}{self.worker} (pid {self.pid}) died: {', '.join(facts)}. "
                f"Details in cluster.deaths[-1].message")

    def _repr_html_(self) -> str:
        from .views.render import death_card
        return death_card(self)

    def summary(self) -> str:
        """One line for ``KilledWorker``'s message."""
        line = f"{self.worker} (pid {self.pid}): " + ", ".join(self._facts())
        frames = top_frames(self.stack, 2)
        if frames:
            label = f"      {_WHERE.get(self.cause, _WHERE_ELSE)[0]}: "
            line += "\n" + label + ("\n" + " " * len(label)).join(frames)
        if self.cause == "oom-killer" and self.detail:     # whose memory ran out, and the evidence
            line += "\n      " + self.detail
        return line


_MEMORY_CAUSES = ("memory-limit", "memory-leak", "oom-killer")


def death_message(worker: str, pid: int, cause: str, exitcode: Optional[int], tasks: tuple,
                  memory: Optional[int], peak: Optional[int], limit: Optional[int],
                  stack: Optional[str], detail: Optional[str] = None, replay_hint: bool = True,
                  managed: Optional[int] = None, advice_by_topic: Optional[dict] = None) -> str:
    """The one-paragraph explanation stored in ``WorkerDeath.message``. ``replay_hint``: whether
    to suggest ``recreate_error_locally`` (not when the replay itself is what died)."""
    who = f"Worker {worker!r} (pid {pid})"
    sig = exit_signal(exitcode)
    running = f" while running {', '.join(map(repr, tasks))}" if tasks else ""
    mem = ""
    if memory is not None:
        mem = f" Its memory was {format_bytes(memory)}"
        if peak and peak > memory:
            mem += f" (peak {format_bytes(peak)})"
        mem += f" against a limit of {format_bytes(limit)}." if limit else " (no memory limit set)."
        if managed is not None and cause in _MEMORY_CAUSES:
            mem += (f" Of it, {format_bytes(min(managed, memory))} were results it held and "
                    f"{format_bytes(max(0, memory - managed))} was unmanaged (the tasks' own memory).")
    if cause == "requested":
        head = f"{who} was stopped by the cluster as requested."
    elif cause == "exit" and tasks:
        head = f"{who} exited with code {exitcode} while running {', '.join(map(repr, tasks))}."
    elif cause == "exit":
        head = f"{who} exited with code {exitcode} while running no task."
    elif cause == "exception":
        head = (f"{who} failed outside any task: in its start-up (an initializer, a worker plugin's setup, an "
                f"upload) or in localcluster's own code (exit code {exitcode}){running}.")
    elif cause == "memory-limit":
        head = f"{who} was killed by its nanny for exceeding the memory budget{running}."
    elif cause == "memory-leak":
        head = f"{who} was restarted by its nanny: it stayed paused for memory with nothing left to spill{running}."
    elif cause == "oom-killer":
        head = f"{who} was killed by the operating system's out-of-memory killer (SIGKILL){running}."
    elif cause == "crash":
        head = f"{who} crashed with {sig}{running}."
    elif cause == "signal":
        head = f"{who} was killed from outside by {sig}{running}; localcluster did not send it."
    elif cause == "timeout":
        head = f"{who} was killed by its nanny because a task ran past its timeout{running}."
    elif cause == "unresponsive":
        head = f"{who} stopped answering heartbeats and was killed{running}."
    else:  # pragma: no cover - classify() only returns CAUSES
        head = f"{who} died ({describe_exit(exitcode)}){running}."
    frames = top_frames(stack, 1)
    if frames and cause != "requested":
        head += " " + _WHERE.get(cause, _WHERE_ELSE)[1].format(frames[0])
    if detail:
        head += " " + detail
    topic = advice_topic(cause, tasks)
    advice = (advice_by_topic or _ADVICE)[topic]
    if replay_hint and topic in REPLAY_HINT:
        advice += " " + REPLAY_HINT[topic]
    return head + mem + " " + advice


def advice_topic(cause: str, tasks: tuple) -> str:
    return "exit-in-task" if cause == "exit" and tasks else cause


# --- errors a task (or its future) can end with --------------------------------------

class KilledWorker(Exception):
    """A task was running on too many workers that died; it is blamed and given up.

    Raised by ``result()`` (and ``gather``) of that task's futures once more than
    ``allowed_failures`` workers died while running it. The message tells each death (cause, memory, signal) and what to
    do: find why in ``deaths``, fix the task (or give the workers more memory), and submit it
    again; ``client.recreate_error_locally(future)`` replays it in a throwaway process.

    ``ADVICE``, ``REPLAY`` and ``KEPT`` say what to do and where the deaths are kept; another
    cluster (dask) says it in its own terms.

    Attributes:
        task: the key of the task given up.
        last_worker: the name of the last worker that died running it.
        deaths: a WorkerDeath for each of those deaths, oldest first.
        allowed_failures: the deaths a task was allowed (the cluster's setting).
        submitter: the task that submitted it from a worker (get_client), if one did.
        unheard: (worker, seconds) of deaths nobody reported within that time (on a dask
            cluster, a nanny that said nothing: its machine may have died).
    """

    ADVICE = _ADVICE
    REPLAY = REPLAY_HINT
    KEPT = "Each death is in cluster.deaths and KilledWorker.deaths, with the log tail."

    def __init__(self, task: str, last_worker: Optional[str], deaths: tuple = (), allowed_failures: int = 0,
                 submitter: Optional[str] = None, unheard: tuple = ()):
        self.task = task
        self.last_worker = last_worker
        self.deaths = tuple(deaths)
        self.allowed_failures = allowed_failures
        self.submitter = submitter      #: the task that submitted it from a worker (get_client), if one did
        self.unheard = tuple(unheard)
        super().__init__(task, last_worker, self.deaths, allowed_failures)

    def __str__(self) -> str:
        n = len(self.deaths) + len(self.unheard)
        by = f" (submitted by task {self.submitter!r})" if self.submitter else ""
        lines = [f"Task {self.task!r}{by} was running on {n} worker{'s' if n != 1 else ''} that died "
                 f"(allowed_failures={self.allowed_failures}), so it is given up:"]
        for i, d in enumerate(self.deaths, 1):
            lines.append(f"  {i}. {d.summary()}")
        for i, (worker, seconds) in enumerate(self.unheard, len(self.deaths) + 1):
            lines.append(f"  {i}. {worker}: no word from its nanny within {seconds:g} s of the scheduler's "
                         f"decision, so why it died is not known: its machine (or its nanny) may have died too.")
        topics = list(dict.fromkeys(advice_topic(d.cause, d.tasks) for d in self.deaths if d.cause != "requested"))
        advice = [self.ADVICE[t] for t in topics] + list(dict.fromkeys(
            self.REPLAY[t] for t in topics if t in self.REPLAY))
        if advice:
            lines.append(" ".join(advice))
        lines.append(self.KEPT)
        return "\n".join(lines)

    def __reduce__(self):
        return (type(self), (self.task, self.last_worker, self.deaths, self.allowed_failures, self.submitter,
                             self.unheard))

    def _repr_html_(self) -> str:
        from .views.render import killed_worker
        return killed_worker(self.task, self.allowed_failures, self.deaths, str(self))


class TaskTimeoutError(TimeoutError):
    """A task ran past its ``timeout``; its worker was stopped to interrupt it.

    Raised by ``result()`` of that task's futures (``submit(..., timeout=...)``). The message
    shows where the task was when stopped: raise the timeout, or split the work into smaller
    tasks. A subclass of the built-in TimeoutError.

    Attributes:
        task: the task's key.
        timeout: its timeout, in seconds.
        elapsed: how long it had run, in seconds.
        worker: the name of the worker stopped (None: not known).
        stack: the task thread's frames when it was stopped, as text (None: not taken).
    """

    def __init__(self, task: str, timeout: float, elapsed: float, worker: Optional[str] = None,
                 stack: Optional[str] = None):
        self.task, self.timeout, self.elapsed, self.worker, self.stack = task, timeout, elapsed, worker, stack
        super().__init__(task, timeout, elapsed, worker, stack)

    def __str__(self) -> str:
        where = f" on worker {self.worker!r}" if self.worker else ""
        text = (f"Task {self.task!r} ran for {self.elapsed:.2f} s{where}, past its timeout of "
                f"{self.timeout:g} s, so its worker was stopped to interrupt it. Raise "
                f"submit(..., timeout=...) or split the work into smaller tasks.")
        if self.stack:
            text += "\nWhere it was when stopped (most recent call first):\n" + "\n".join(
                "  " + l.strip() for l in self.stack.splitlines()[1:])
        return text

    def __reduce__(self):
        return (TaskTimeoutError, (self.task, self.timeout, self.elapsed, self.worker, self.stack))


class LostDataError(Exception):
    """Scattered data that is needed and exists nowhere, so cannot be recomputed: its only
    copy died with a worker, or (``needed_by``) it was released, and then a result computed
    from it was lost and must be computed again.

    Raised by ``result()`` of the futures that need it. Scatter the data again and submit
    again; to survive a worker's death, keep copies (``client.replicate(futures, n=2)`` or
    ``scatter(..., broadcast=True)``) and keep a future of scattered data while results
    computed from it may be needed.

    Attributes:
        key: the scattered data's key.
        worker: the worker that held its only copy (None: not known).
        cause: why that worker died (a WorkerDeath cause), if known.
        needed_by: the key of the lost result that needed it, if that is how it was missed.
    """

    def __init__(self, key: str, worker: Optional[str] = None, cause: Optional[str] = None,
                 needed_by: Optional[str] = None):
        self.key, self.worker, self.cause, self.needed_by = key, worker, cause, needed_by
        super().__init__(key, worker, cause, needed_by)

    def __str__(self) -> str:
        if self.needed_by is not None:
            return (f"{self.needed_by!r} must be computed again (the only copy of its result was lost, "
                    f"with a worker that died), but its input {self.key!r} was scattered data, released "
                    f"since: no copy of it remains, and scattered data cannot be recomputed. Keep a future "
                    f"of scattered data for as long as results computed from it must survive a worker's "
                    f"death, or keep copies of those results on several workers (client.replicate).")
        how = f" (cause: {self.cause})" if self.cause else ""
        return (f"Data {self.key!r} was scattered to worker {self.worker!r}, which died{how}; it was "
                f"the only copy and cannot be recomputed. Scatter it again, and use "
                f"client.replicate(futures, n=2) or scatter(..., broadcast=True) to keep copies "
                f"on several workers.")

    def __reduce__(self):
        return (LostDataError, (self.key, self.worker, self.cause, self.needed_by))


class TaskError(Exception):
    """Stands in for an exception the caller cannot receive as itself: one that could not be
    pickled or rebuilt (type name, message and remote traceback are kept), or a SystemExit or
    KeyboardInterrupt raised inside a task, kept in ``original`` so it never ends the caller.

    Raised by ``result()`` where the task's own exception would have been. Read the type name,
    message and traceback as you would the original's.

    Attributes:
        type_name: the original exception's type name.
        message: its message.
        traceback_text: its traceback on the worker, as text.
        step: what could not be done with it (pickled on the worker, unpickled here), and
            how to fix that, in words; empty if nothing failed.
        original: the SystemExit or KeyboardInterrupt itself, where that is what it stands for.
    """

    def __init__(self, type_name: str, message: str, traceback_text: str = "", step: str = "",
                 original: Optional[BaseException] = None):
        self.type_name, self.message, self.traceback_text, self.step = type_name, message, traceback_text, step
        self.original = original
        super().__init__(type_name, message, traceback_text, step)

    def __str__(self) -> str:
        s = f"{self.type_name}: {self.message}"
        if self.step:
            s = f"{s}\n({self.step})"
        if self.traceback_text:
            s += "\n\nRemote traceback:\n" + self.traceback_text.rstrip()
        return s

    def __reduce__(self):
        return (TaskError, (self.type_name, self.message, self.traceback_text, self.step, self.original))


class WorkerStartupError(RuntimeError):
    """Workers die while starting, again and again: the cluster stopped retrying.

    Raised by ``LocalCluster(...)`` and ``scale``/``wait_for_workers`` while starting, and
    afterwards by the cluster's calls and pending futures. The message shows the last one's
    exit and output: fix the start-up error it shows (an initializer or a worker plugin's
    ``setup`` that raises, an import that fails in a fresh interpreter, a memory_limit below
    what an idle worker uses) and create the cluster again.

    Attributes:
        deaths: a WorkerDeath for each of those deaths, oldest first.
    """

    def __init__(self, deaths: tuple):
        self.deaths = tuple(deaths)
        super().__init__(deaths)

    def __str__(self) -> str:
        last = self.deaths[-1] if self.deaths else None
        head = (f"{len(self.deaths)} worker(s) in a row died while starting, so localcluster stopped "
                f"restarting them.")
        if last is None:
            return head
        tail = "\n".join(last.log_tail[-15:])
        if last.cause == "memory-limit" and last.memory and last.memory_limit:
            return (f"{head} Each was killed for memory while running no task: the last one, {last.worker!r} "
                    f"(pid {last.pid}), used {format_bytes(last.memory)} idle against a memory_limit of "
                    f"{format_bytes(last.memory_limit)}. Raise memory_limit (or use None), or load less "
                    f"in the workers' initializer, and create the cluster again.")
        return (f"{head} The last one, {last.worker!r} (pid {last.pid}), ended with "
                f"{exit_signal(last.exitcode) or f'exit code {last.exitcode}'}"
                f". Its last output:\n{tail}\nFix the start-up error above (an initializer or a worker plugin's setup "
                f"that raises, a broken environment, an import that fails in a fresh interpreter) and create the "
                f"cluster again.")


class ClusterRestarted(CancelledError):
    """A pending task was forgotten because the cluster restarted (``client.restart()``).

    Raised by ``result()`` of the futures still pending at the restart (a subclass of
    concurrent.futures' CancelledError). Submit the work again if it is still wanted.
    """


class ClusterClosed(CancelledError):
    """A pending task was forgotten because the cluster closed.

    Raised by ``result()`` of the futures still pending when the cluster closed (a subclass
    of concurrent.futures' CancelledError). Create a new LocalCluster to run the work.
    """


class ClusterBroken(RuntimeError):
    """localcluster's own machinery failed (a bug in localcluster, not in the user's code).

    Every pending future and every later call fails with it at once, never a hang; its
    workers are stopped. Create a new LocalCluster to go on, and report the message (with
    ``client.get_versions()``) to the localcluster maintainers.

    Attributes:
        where: which part of localcluster failed.
        traceback_text: the internal traceback.
    """

    def __init__(self, where: str, traceback_text: str):
        self.where, self.traceback_text = where, traceback_text
        super().__init__(where, traceback_text)

    def __str__(self) -> str:
        last = self.traceback_text.strip().splitlines()[-1] if self.traceback_text.strip() else "?"
        return (f"localcluster's {self.where} failed ({last}). This is a bug in localcluster, not in your "
                f"code. Every pending future and every later call on this cluster fails with this error; "
                f"its workers were stopped. Create a new LocalCluster to go on, and please report this "
                f"traceback with the output of client.get_versions() to the localcluster maintainers:\n"
                f"{self.traceback_text.rstrip()}")

    def __reduce__(self):
        return (ClusterBroken, (self.where, self.traceback_text))
