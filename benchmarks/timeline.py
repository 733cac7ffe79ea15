#!/usr/bin/env python
"""Where a round trip's time goes: one submit(noop).result() after another, each step timed
across both processes.

    python benchmarks/timeline.py [--n 3000] [--workers 1] [--threads 1]

Hooks wrap a few of localcluster's functions (in this process, and in each worker through
its ``initializer``) and stamp ``time.perf_counter()`` (CLOCK_MONOTONIC on Linux: one clock
for every process) as each round trip passes. A step's figure is the median over the round
trips, after 50 warm-up ones; the sum of the medians is close to, not exactly, the median
of the totals. Each hook costs ~0.3 µs, so the total reads a little above bench.py's round
trip. localcluster only; Linux. Last, how many times a round trip the workers' threads slept
and were woken (voluntary context switches, from /proc): a wake-up taken off the path shows
there whatever the machine's load. The same count for the parent's scheduler thread: a
round trip its user thread reads itself should not wake it.

Steps, in order (the process that spends the time in brackets):

    submit   -> send     [parent, user thread] the Client makes the task, the scheduler places
                          it, the Run is framed
    send     -> wrecv     [both] sendmsg, which wakes the worker's reading thread, until its
                          recvmsg returns
    wrecv    -> wrun      [worker] decoding the Run, queueing it, handing the channel on
    wrun     -> wran      [worker] the run: arguments unpickled, the call, the result pickled and stored
    wran     -> wreply    [worker] the status board, the reply queued
    wreply   -> wsend     [worker] framing the Finished
    wsend    -> woke      [both] sendmsg, until the parent's reading thread is out of select:
                          the user's thread waiting in result(), which reads its worker's
                          channel itself (Supervisor.read_for), or else the scheduler thread
    woke     -> decoded   [parent] recvmsg and decoding
    decoded  -> resolving [parent] the scheduler handles the result
    resolving-> got       [parent] the Future resolved and result() returns; when the scheduler
                          thread read the reply, the user's thread wakes and takes the GIL too
"""
from __future__ import annotations

import argparse
import bisect
import os
import statistics
import sys
import threading
import time
from collections import defaultdict

STEPS = ("submit", "send", "wrecv", "wrun", "wran", "wreply", "wsend", "woke", "decoded", "resolving", "got")
MARKS: dict = defaultdict(list)


def _mark(name: str) -> None:
    MARKS[name].append(time.perf_counter())


def _wrap(owner, attr: str, before: "str | None" = None, after: "str | None" = None) -> None:
    fn = getattr(owner, attr)

    def wrapper(*args, **kwargs):
        if before:
            _mark(before)
        out = fn(*args, **kwargs)
        if after:
            _mark(after)
        return out
    setattr(owner, attr, wrapper)


def install_worker_hooks() -> None:
    """The worker's initializer: runs in the worker before it serves."""
    from localcluster.wire import channel
    from localcluster.worker import process as worker
    _wrap(channel, "_recv_into", after="wrecv")
    _wrap(channel, "_send_chunks", before="wsend")
    _wrap(worker.Worker, "_run", before="wrun", after="wran")
    _wrap(channel.BlockingChannel, "send", before="wreply")


def worker_marks() -> dict:
    """Run as a task: what the hooks stamped in this worker."""
    return dict(MARKS)


def _install_parent_hooks() -> None:
    from localcluster.wire import channel
    from localcluster import client, future
    from localcluster.engine import dispatch
    from localcluster.supervision import reading, supervisor
    _wrap(client.Client, "submit", before="submit")
    _wrap(channel, "_send_chunks", before="send")
    _wrap(supervisor.Supervisor, "_on_channel", before="woke")
    _wrap(reading.LentReading, "_read_lent", before="woke")
    _wrap(dispatch.Dispatcher, "on_worker_messages", before="decoded")
    _wrap(future.Future, "settle", before="resolving")


def noop(x):
    return x


def context_switches(pid: int) -> dict:
    """Voluntary context switches of each thread of process ``pid`` (a thread that sleeps
    and is woken counts one each time): {"main": n, thread id: n, ...}."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                n = next(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches"))
        except (OSError, StopIteration):
            continue
        out["main" if int(tid) == pid else tid] = n
    return out


def measure(n: int, workers: int, threads: int) -> dict:
    import localcluster
    _install_parent_hooks()
    with localcluster.LocalCluster(n_workers=workers, threads_per_worker=threads, forward_logs=False,
                                   initializer=install_worker_hooks) as cluster, \
            localcluster.Client(cluster) as client:
        for i in range(50):
            client.submit(noop, -i, pure=False).result(60)
        starts, ends = [], []
        MARKS.clear()
        pids = [w.pid for w in cluster.workers.values()]
        before = [context_switches(p) for p in pids]
        sched = next(t.native_id for t in threading.enumerate() if t.name == "localcluster-scheduler")
        sched_before = context_switches(os.getpid())[str(sched)]
        for i in range(n):
            t0 = time.perf_counter()
            client.submit(noop, i, pure=False).result(60)
            starts.append(t0)
            ends.append(time.perf_counter())
        after = [context_switches(p) for p in pids]
        sched_woken = context_switches(os.getpid())[str(sched)] - sched_before
        parent = {k: sorted(v) for k, v in MARKS.items()}
        marks = defaultdict(list)
        for k, v in parent.items():
            marks[k] += v
        for name in cluster.workers:
            for k, v in client.submit(worker_marks, workers=[name], pure=False).result(60).items():
                marks[k] += v
    marks = {k: sorted(v) for k, v in marks.items()}
    marks["got"] = ends
    steps: dict = {f"{a} -> {b}": [] for a, b in zip(STEPS, STEPS[1:])}
    totals = []
    for t0, t1 in zip(starts, ends):
        # each step: the first stamp of its kind after the previous step's, within this round trip
        points = [t0]
        for name in STEPS[1:-1]:
            arr = marks.get(name, [])
            i = bisect.bisect_left(arr, points[-1])
            if i == len(arr) or arr[i] > t1:
                break
            points.append(arr[i])
        else:
            points.append(t1)
            for (a, b), x, y in zip(zip(STEPS, STEPS[1:]), points, points[1:]):
                steps[f"{a} -> {b}"].append((y - x) * 1e6)
            totals.append((t1 - t0) * 1e6)
    switches = {"main": sum(a.get("main", 0) - b.get("main", 0) for a, b in zip(after, before)) / n,
                "all": sum(sum(a.values()) - sum(b.get(t, 0) for t in a) for a, b in zip(after, before)) / n,
                "scheduler": sched_woken / n}
    return {"steps": {k: statistics.median(v) for k, v in steps.items() if v}, "aligned": len(totals),
            "n": n, "total_median": statistics.median(totals) if totals else None, "switches": switches}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=3000, help="round trips (default 3000)")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    if not sys.platform.startswith("linux"):
        print("timeline.py needs one monotonic clock across processes: Linux only", file=sys.stderr)
        return 1
    res = measure(args.n, args.workers, args.threads)
    print(f"{res['aligned']} of {res['n']} round trips aligned; median total {res['total_median']:.0f} µs "
          f"({args.workers} worker(s) x {args.threads} thread(s))")
    for step, us in res["steps"].items():
        print(f"  {step:24s} {us:7.1f} µs")
    print(f"  {'sum of the medians':24s} {sum(res['steps'].values()):7.1f} µs")
    sw = res["switches"]
    print(f"  the workers' threads slept and were woken {sw['all']:.2f} times a round trip "
          f"(their main threads {sw['main']:.2f}); the parent's scheduler thread {sw['scheduler']:.2f}")
    return 0


if __name__ == "__main__":
    import timeline          # by name, so that the worker's initializer and task pickle by reference
    sys.exit(timeline.main())
