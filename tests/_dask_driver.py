"""The user's side of tests/integration/test_dask_diagnosis.py, run in a process of its own (a dask Client
leaves threads behind in the process that made it): connect to the cluster, maybe
``localcluster.dask.install(client)``, make one worker die under a task (``late``: on a worker whose nanny was
restarting it while ``install()`` ran), and print what the
user sees as JSON: the exception's type, whether it is a ``distributed.KilledWorker``, its
text, its ``.deaths`` and ``localcluster.dask.deaths(client)``.

    python _dask_driver.py SCHEDULER_FILE SCENARIO install|plain WORKDIR gather|result
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time

from dask import delayed
from distributed import KilledWorker


def segfault_here():
    import ctypes
    ctypes.string_at(0)


def grow(limit_bytes: int):
    """Take memory 32 MiB at a time (written, so it is resident) until stopped."""
    chunks = []
    while sum(map(len, chunks)) < limit_bytes:
        chunks.append(b"\x01" * (32 << 20))
        time.sleep(0.01)
    return "never stopped"


def wait_here(workdir: str):
    """Dump this worker's stacks (SIGUSR1: as a user would of a hung worker), write its pid and
    its nanny's, then wait (bounded) for the kill.

    The signal goes to this thread, not the process: a process-directed one is taken by the
    main thread whenever the kernel schedules it, which on a loaded machine came after the
    kill (the death's log_tail was empty); a thread's own signal is handled before
    pthread_kill returns."""
    signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)
    with open(os.path.join(workdir, "pid.tmp"), "w") as f:
        f.write(f"{os.getpid()} {os.getppid()}")
    os.rename(os.path.join(workdir, "pid.tmp"), os.path.join(workdir, "pid"))
    time.sleep(60)
    return "never killed"


def _wait_file(path: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):          # written by a worker process: no event to wait on
        if time.monotonic() > deadline:
            raise TimeoutError(path)
        time.sleep(0.01)
    with open(path) as f:
        return f.read()


def hold_a_restart(client, workdir: str):
    """One worker killed while the file ``hold`` exists (its nanny's new worker waits for it
    to go before it registers: tests/_dask_hold.py): once the scheduler has dropped the
    killed worker, install() runs while its nanny has no worker to be told through. Returns
    what lets the new worker go on, and the workers before."""
    hold = os.path.join(workdir, "hold")
    open(hold, "w").close()
    before = set(client.scheduler_info()["workers"])
    os.kill(next(iter(client.run(os.getpid).values())), signal.SIGKILL)
    deadline = time.monotonic() + 60
    while len(client.scheduler_info()["workers"]) == len(before):    # the scheduler's view: polled
        if time.monotonic() > deadline:
            os.unlink(hold)
            raise TimeoutError("the scheduler never dropped the killed worker")
        time.sleep(0.05)
    return lambda: os.unlink(hold), before


def run(client, scenario: str, workdir: str, before: set, out: dict):
    if scenario == "late":       # a segfault on the worker started after install()
        client.wait_for_workers(len(before), timeout=150)
        (new,) = set(client.scheduler_info()["workers"]) - before
        return client.submit(segfault_here, pure=False, workers=[new]).result(timeout=60)
    if scenario == "segfault":
        future = client.submit(segfault_here, pure=False)
        try:
            return future.result(timeout=60)
        except KilledWorker as e:       # gather and compute raise the same
            if sys.argv[5] != "gather":
                raise
            e.by_gather = _raised(lambda: client.gather([future]))
            e.by_compute = _raised(lambda: client.compute(delayed(segfault_here)()).result(60))
            raise
    if scenario in ("memory", "oom"):
        return client.submit(grow, 8 << 30, pure=False).result(timeout=90)
    if scenario in ("kill", "machine"):
        future = client.submit(wait_here, workdir, pure=False)
        pid, nanny = map(int, _wait_file(os.path.join(workdir, "pid")).split())
        if scenario == "kill":
            os.kill(pid, signal.SIGKILL)
        else:       # the machine dies: its nannies with their workers (the test's `dask worker` session)
            group = os.getpgid(nanny)
            out["semaphores"] = semaphores_of(group)
            os.killpg(group, signal.SIGKILL)
            # multiprocessing's resource tracker, which would unlink them, died in the group too
            # (a machine that dies takes its /dev/shm with it; this one stays up)
            for name in out["semaphores"]:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join("/dev/shm", name))
        return future.result(timeout=60)
    raise ValueError(scenario)


def semaphores_of(group: int) -> list:
    """The /dev/shm names of the named semaphores the processes of ``group`` have mapped
    (dask's nannies talk to their workers through multiprocessing queues)."""
    names = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.getpgid(int(entry)) != group:
                continue
            with open(f"/proc/{entry}/maps") as maps:
                paths = [line.split()[-1] for line in maps]
            names.update(os.path.basename(p) for p in paths if p.startswith("/dev/shm/sem."))
        except (ProcessLookupError, FileNotFoundError, PermissionError):
            continue
    return sorted(names)


def _raised(call) -> str:
    try:
        call()
    except KilledWorker as e:
        return f"{type(e).__name__} {'SIGSEGV' in str(e)}"
    return "nothing"


def kill_an_idle_worker(client) -> int:
    """SIGKILL one worker running nothing; wait until its nanny's record is in."""
    import localcluster.dask
    pids = client.run(os.getpid)
    pid = next(iter(pids.values()))
    before = len(localcluster.dask.deaths(client))
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while len(localcluster.dask.deaths(client)) == before:     # an event on the scheduler: polled
        if time.monotonic() > deadline:
            raise TimeoutError("no death recorded for the idle worker")
        time.sleep(0.05)
    return pid


def main():
    scheduler_file, scenario, mode, workdir = sys.argv[1:5]
    from distributed import Client
    out = {}
    with Client(scheduler_file=scheduler_file, timeout=60) as client:
        # a worker an earlier drive killed is started again by its nanny: under load (the
        # loaded test runs, two suites on two cores) that took over 60 s once
        client.wait_for_workers(2, timeout=150)
        # and every nanny has finished starting (a nanny answers only then): a worker that dies
        # between registering with the scheduler and telling its nanny it started is, to dask,
        # a nanny that failed to start, and `dask worker` then ends with all its nannies (a
        # segfault sent at once did that in a loaded run)
        client.run(os.getpid, nanny=True)
        go_on, before = (lambda: None), set()
        if scenario == "late":
            go_on, before = hold_a_restart(client, workdir)
        if mode == "install":
            import localcluster.dask
            localcluster.dask.install(client, wait=2.0 if scenario == "machine" else 5.0)
        go_on()
        try:
            out["result"] = repr(run(client, scenario, workdir, before, out))
        except KilledWorker as e:
            out.update(type=f"{type(e).__module__}.{type(e).__qualname__}", killed_worker=True, text=str(e),
                       deaths=[d.cause for d in getattr(e, "deaths", ())],
                       messages=[d.message for d in getattr(e, "deaths", ())],
                       log_tails=[list(d.log_tail) for d in getattr(e, "deaths", ())],
                       gather=getattr(e, "by_gather", None), compute=getattr(e, "by_compute", None))
        if mode == "install" and scenario == "kill":
            import localcluster.dask
            idle = kill_an_idle_worker(client)
            out["all_deaths"] = [(d.pid, d.cause, list(d.tasks)) for d in localcluster.dask.deaths(client)]
            out["idle_pid"] = idle
    print(json.dumps(out))


if __name__ == "__main__":
    main()
