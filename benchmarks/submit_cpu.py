#!/usr/bin/env python
"""The parent's CPU time a task for a loop of no-op submits, by a measure a loaded machine
hardly moves.

    python benchmarks/submit_cpu.py [--n 5000] [--rounds 4]

bench.py's submit row is wall time: on a machine where other work runs it moves by half
from one run to the next. This reads the CPU seconds of the whole parent process (the
submitting thread, the scheduler thread, the callbacks thread) for ``n`` no-op submits
made one by one and gathered, divided by ``n``: the best of ``rounds``. Run it in two
checkouts, alternating, to compare them (benchmarks/README.md, "The scheduler's one door").
localcluster only, 2 workers x 1 thread.
"""
from __future__ import annotations

import argparse
import time

from localcluster import Client, LocalCluster


def noop(x):
    return x


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    with LocalCluster(n_workers=2, threads_per_worker=1, forward_logs=False) as cluster, Client(cluster) as client:
        client.gather([client.submit(noop, i, pure=False) for i in range(500)])      # warm
        cpu, rate = [], []
        for _ in range(args.rounds):
            t, w = time.process_time(), time.perf_counter()
            futures = [client.submit(noop, i, pure=False) for i in range(args.n)]
            client.gather(futures)
            cpu.append((time.process_time() - t) / args.n * 1e6)
            rate.append(args.n / (time.perf_counter() - w))
            del futures
    print(f"parent CPU {min(cpu):.1f} us a task (best of {args.rounds}); {max(rate):.0f} tasks/s wall (best)")


if __name__ == "__main__":
    main()
