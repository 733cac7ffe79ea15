"""How many workers fit on this machine, asked before any is started: by
``LocalCluster(n_workers=)``, ``scale(n)`` and ``adapt(maximum=)``. A number that cannot fit is
refused at once with the figures, rather than found out process by process (``n_workers=100000``
had started 301 workers after 25 s, each with an "auto" limit of 12 MiB).

Three things run out, each checked against what this process can read of it (a limit it cannot
read refuses nothing):

- memory: an idle worker needs ``IDLE_WORKER`` at the least. With ``memory_limit="auto"`` each
  worker gets the available memory divided by their number, and a worker whose idle footprint
  crosses ``memory_pause`` (or ``memory_terminate``) of its limit is refused once it starts
  (policy.py, with the measured figure): refused here before it starts. Whatever the limit,
  so many idle workers that they alone fill the memory available are refused.
- processes: each worker is ``tasks_per_worker`` kernel tasks (its process and its threads, each
  with a pid), against pid_max and threads-max (the machine's), RLIMIT_NPROC (the user's) and
  the pids cgroups' pids.max (a container's).
- file descriptors: this process keeps ``FDS_PER_WORKER`` open per worker, against its
  RLIMIT_NOFILE.
"""
from __future__ import annotations

from typing import Optional

from ..config import format_bytes
from ..system import machine

__all__ = ["IDLE_WORKER", "FDS_PER_WORKER", "tasks_per_worker", "refusal"]

# Below what any idle worker measures (the interpreter alone takes most of it): refusing below
# it refuses only a number of workers that the measured check would refuse anyway, once they
# had started.
IDLE_WORKER = 12 << 20
# The parent's descriptors of one worker (nanny.py): its socket, its doorbell (an eventfd), its
# status board (the memfd and the mmap's own duplicate), its pidfd, its stdout and stderr
# pipes, the pipe dump_stacks asks on, its /proc/<pid>/statm and /dev/kmsg (oom.py, where readable).
FDS_PER_WORKER = 10
# Descriptors a start needs for a moment beyond those (the child's socket end, its pipes'
# other ends, subprocess's error pipe), and the memfds of values in flight: kept free.
FDS_SPARE = 64
# A worker's threads besides its executors (worker/process.py): the main thread, which reads
# the channel, the flusher, the heartbeat and the stacks thread.
OWN_THREADS = 4


def tasks_per_worker(threads_per_worker: int) -> int:
    """Kernel tasks (pids) a worker takes: its main thread, executors, flusher, heartbeat and stacks."""
    return threads_per_worker + OWN_THREADS


def refusal(call: str, new: int, total: int, threads_per_worker: int, memory_limit: "int | str | None",
            cfg: dict) -> Optional[str]:
    """Why ``new`` more workers (``total`` in all, those running counted) cannot fit, in
    words for the ValueError of ``call``; None if they can. ``memory_limit``: "auto" at
    construction (each worker then gets the available memory divided by ``total``), else
    what each worker has; ``cfg``: the cluster's settings (memory_pause, memory_terminate)."""
    if new <= 0:
        return None
    running = total - new
    found = [f for f in (_memory(total, memory_limit, cfg), _tasks(new, running, threads_per_worker),
                         _fds(new, running)) if f]
    if not found:
        return None
    most = max(0, min(fit for _, fit, _ in found))
    lines = [f"{call} was refused: {total} worker{'s' if total != 1 else ''} cannot run on this machine"
             + (f" ({running} running now)" if running else "") + ", and no worker was started for it:"]
    lines += [f"  - {text}" for text, _, _ in found]
    remedies = "; ".join(dict.fromkeys(remedy for _, _, remedy in found if remedy))
    lines.append(f"Ask for {most} workers or fewer (each may run several tasks at once: threads_per_worker)"
                 + (f"; more would need the limits above raised ({remedies})." if remedies else "."))
    return "\n".join(lines)


def _memory(total: int, memory_limit: "int | str | None", cfg: dict) -> Optional[tuple]:
    available = machine.available_memory()
    # where an idle worker is refused (policy.py): the lower of its pause and terminate lines
    lines = [(cfg[k], k) for k in ("memory_pause", "memory_terminate") if cfg.get(k)]
    fraction, setting = min(lines, default=(1.0, "memory_limit"))
    if memory_limit == "auto":
        each = available // max(1, total)
        if each * fraction >= IDLE_WORKER:
            return None
        fit = int(available * fraction // IDLE_WORKER)
        return (f"memory: memory_limit=\"auto\" gives each worker {format_bytes(each)} ({format_bytes(available)} "
                f"available / {total}), and an idle worker needs {format_bytes(IDLE_WORKER)} or more, above "
                f"{fraction:.0%} of that ({setting}), where a worker is paused or killed; {_most(fit)}", fit, None)
    if total * IDLE_WORKER <= available:
        return None
    fit = available // IDLE_WORKER
    return (f"memory: {total} idle workers need {format_bytes(total * IDLE_WORKER)} or more "
            f"({format_bytes(IDLE_WORKER)} each), above the {format_bytes(available)} available; {_most(fit)}",
            fit, None)


def _tasks(new: int, running: int, threads_per_worker: int) -> Optional[tuple]:
    each = tasks_per_worker(threads_per_worker)
    need = new * each
    worst = None
    for name, limit, used, remedy in machine.task_limits():
        if need > limit:            # too many whatever is in use: not counted
            in_use, room = "", limit
        else:
            now = used()
            if now + need <= limit:
                continue
            in_use, room = f" with {now} in use", limit - now
        fit = running + room // each
        if worst is None or fit < worst[1]:
            worst = (f"processes and threads (each takes a pid): a worker is {each} (its main thread, "
                     f"{threads_per_worker} executor{'s' if threads_per_worker != 1 else ''} for threads_per_worker="
                     f"{threads_per_worker}, a flusher, a heartbeat and a stacks thread), {need} for {new}, and {name} is "
                     f"{limit}{in_use}; {_most(fit)}", fit, remedy)
    return worst


def _fds(new: int, running: int) -> Optional[tuple]:
    soft, hard, used = machine.fd_limits()
    need = new * FDS_PER_WORKER + FDS_SPARE
    if soft < 0 or used + need <= soft:
        return None
    fit = running + max(0, (soft - used - FDS_SPARE) // FDS_PER_WORKER)
    remedy = None
    if hard < 0 or hard > soft:
        remedy = ("ulimit -n, or resource.setrlimit(resource.RLIMIT_NOFILE, (n, hard)) in your process, up to "
                  + (f"its hard limit of {hard}" if hard >= 0 else "any number (no hard limit)"))
    return (f"file descriptors: this process keeps {FDS_PER_WORKER} open for each worker (its socket, pipes, "
            f"pidfd ...), {need} for {new} with {FDS_SPARE} spare, and its RLIMIT_NOFILE (ulimit -n) is {soft} "
            f"with {used} open; {_most(fit)}", fit, remedy)


def _most(fit: int) -> str:
    if fit <= 0:
        return "no worker fits"
    return f"at most {fit} worker{'s' if fit != 1 else ''} fit{'s' if fit == 1 else ''}"
