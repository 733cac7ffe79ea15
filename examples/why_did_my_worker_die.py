"""A tour of dask's "Why did my worker die?" page, scenario by scenario, and what
localcluster tells you in each case, without opening a log.

Run it: python examples/why_did_my_worker_die.py
"""
import os
import signal
import sys
import textwrap
import time

from localcluster import Client, KilledWorker, LocalCluster, TaskTimeoutError, WorkerStartupError

# With the default settings each death prints one line on stderr ("localcluster: worker-0
# (pid ...) died: crash, SIGSEGV, running ..."); the tour prints what the exception says.
MiB = 2 ** 20


def show(title, text):
    print(f"\n=== {title} " + "=" * max(0, 70 - len(title)))
    print(textwrap.indent(str(text).rstrip(), "  "))


def segfault():
    import ctypes
    ctypes.string_at(0)          # reads address 0: SIGSEGV, as a buggy C extension would


def allocate_forever():
    hog = []
    while True:
        hog.append(bytearray(10 * MiB))
        hog[-1][::4096] = b"x" * len(hog[-1][::4096])   # touch every page: real RSS


def sleep_and_return(seconds):
    time.sleep(seconds)
    return f"slept {seconds} s"


def hold_the_gil():
    return sum(range(10 ** 11))  # a C loop that never lets other threads run


def exit_from_a_library():
    os._exit(3)                  # what a library calling exit() on error looks like


with LocalCluster(n_workers=2, memory_limit="300MiB", allowed_failures=1, worker_ttl=2) as cluster, \
        Client(cluster) as client:

    # 1. Worker asked to exit (scale down): expected, nothing to do, its data moves first.
    data = client.scatter(bytes(100_000))
    cluster.scale(1)
    show("1. The worker was asked to exit (cluster.scale(1))", cluster.deaths[-1].message)
    cluster.scale(2)

    # 2. Sudden exit by segfault: the crashing line, not "check the logs".
    try:
        client.submit(segfault).result()
    except KilledWorker as e:
        show("2. Sudden exit: a segfault in compiled code", e)
        show("   WorkerDeath.stack (the crashing thread)", e.deaths[-1].stack)

    # 3. Killed by the nanny for memory, with the figures.
    try:
        client.submit(allocate_forever).result()
    except KilledWorker as e:
        show("3. Killed by the nanny: memory over budget", e)
        # On a loaded machine the kernel's ceiling (a little above the limit) can win the race
        # with the nanny's sample: that death says oom-killer, and its log has no such line.
        log_line = next((l for d in e.deaths for l in d.log_tail if "memory budget" in l), None)
        if log_line is not None:
            show("   the worker's log says", log_line)

    # 4. Killed from outside (kill -9): not the task's fault; it simply runs again.
    fut = client.submit(sleep_and_return, 1.0, pure=False)
    while not any(info.processing for info in cluster.workers.values()):
        time.sleep(0.01)
    victim = next(info for info in cluster.workers.values() if info.processing)
    time.sleep(0.2)
    os.kill(victim.pid, signal.SIGKILL)
    result = fut.result()                      # rescheduled after the death, so it is recorded
    show("4. Sudden exit: `kill -9` from outside", f"{cluster.deaths[-1].message}\n\n"
         f"The task was rescheduled and still returned: {result!r}")

    # 5. A library that calls exit().
    try:
        client.submit(exit_from_a_library).result()
    except KilledWorker as e:
        show("5. The process exited by itself (os._exit(3) inside a library)", e.deaths[-1].message)

    # 6. A task that runs too long: the nanny stops it and says by how much, and where it was.
    try:
        client.submit(sleep_and_return, 60, timeout=0.5).result()
    except TaskTimeoutError as e:
        show("6. A task past its timeout", e)

    # 7. A worker that stops answering (a C call holding the GIL): stacks first, then the kill.
    try:
        client.submit(hold_the_gil).result()
    except KilledWorker as e:
        show("7. An unresponsive worker (GIL held by C code)",
             e.deaths[-1].message + "\n\nWhere the task was (WorkerDeath.stack; every thread is in log_tail):\n"
             + e.deaths[-1].stack)

    print(f"\nThe cluster is still computing: sum(range(10)) = {client.submit(sum, range(10)).result()}")
    print(f"cluster.deaths holds all {len(cluster.deaths)} deaths, oldest first: "
          f"{[d.cause for d in cluster.deaths]}")

# 8. An unrecoverable exception at start-up (dask's version-mismatch / missing module case).
def broken_setup():
    import s3fs  # noqa: F401


try:
    LocalCluster(n_workers=1, initializer=broken_setup, forward_logs=False)
except WorkerStartupError as e:
    show("8. Unrecoverable exception: workers die while starting", e)

# 9. The kernel's OOM killer, where this machine lets us make a memory cgroup (root, Linux).
def oom_demo():
    root = None
    with open("/proc/self/cgroup") as f:
        for line in f:
            _id, ctrl, path = line.rstrip("\n").split(":", 2)
            if "memory" in ctrl.split(","):
                root, limit_file = f"/sys/fs/cgroup/memory{path}", "memory.limit_in_bytes"
            elif ctrl == "" and root is None and os.path.exists(f"/sys/fs/cgroup{path}/memory.max"):
                root, limit_file = f"/sys/fs/cgroup{path}", "memory.max"
    if root is None:
        return "skipped: no memory cgroup on this machine"
    group = os.path.join(root, f"localcluster-tour-{os.getpid()}")
    try:
        os.mkdir(group)
        with open(os.path.join(group, limit_file), "w") as f:
            f.write(str(150 * MiB))
    except OSError as e:
        return f"skipped: cannot create a memory cgroup here ({e.strerror}); run as root on Linux"
    try:
        with LocalCluster(n_workers=1, memory_limit=None, allowed_failures=0, forward_logs=False) as c, \
                Client(c) as cl:
            (info,) = c.workers.values()
            with open(os.path.join(group, "cgroup.procs"), "w") as f:
                f.write(str(info.pid))            # the worker now lives in a 150 MiB box
            # The kernel log names the victim where it is readable (root); elsewhere the box's
            # own counter does, once the nanny's look (about once a second) has seen it there.
            time.sleep(1.5)
            try:
                cl.submit(allocate_forever).result()
            except KilledWorker as e:
                return e.deaths[-1].message
    finally:
        for _ in range(100):
            try:
                os.rmdir(group)
                break
            except OSError:
                time.sleep(0.05)


show("9. Killed by the kernel's OOM killer (worker in a 150 MiB memory cgroup)", oom_demo())
sys.stdout.flush()
