"""What a task's own client costs its thread, per task: a task submits N no-op tasks in a loop
and gathers them, then maps N and gathers them, timing its own thread's CPU
(``time.thread_time()``, which other load inflates less than wall time). One worker of one
thread; the best of ``--repeats`` after a warm-up.

    python benchmarks/in_task.py [--tasks 3000] [--repeats 3]
"""
from __future__ import annotations

import argparse
import time

from localcluster import Client, get_client


def noop(x):
    return x


def loop(n):
    c = get_client()
    t = time.thread_time()
    fs = [c.submit(noop, i, pure=False) for i in range(n)]
    c.gather(fs)
    submitted = (time.thread_time() - t) / n * 1e6
    t = time.thread_time()
    mapped = c.map(noop, range(n), pure=False)
    c.gather(mapped)
    del fs
    return submitted, (time.thread_time() - t) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with Client(n_workers=1, threads_per_worker=1) as client:
        client.submit(loop, 300, pure=False).result()
        runs = [client.submit(loop, args.tasks, pure=False).result() for _ in range(args.repeats)]
    best = [min(x) for x in zip(*runs)]
    print(f"in a task, per task: submit loop + gather {best[0]:.1f} us, map + gather {best[1]:.1f} us")


if __name__ == "__main__":
    main()
