#!/usr/bin/env python
"""dask task graphs on localcluster (``scheduler=client.get``) vs distributed and dask's
local schedulers, in one run:

    python benchmarks/dask_graph.py [--sizes 3750,37500] [--repeats N] [--profile]

The graph: ``da.ones((n,), chunks=1).sum()``, one-element chunks, so every task is tiny
and the time is the schedulers' own cost per task: ~1.33 n tasks after dask's blockwise
fusion (n chunk tasks, then the tree of partial sums), about 5,000 and 50,000 tasks for
the default sizes. Each run builds the collection afresh and calls ``dask.compute``: the
time includes dask's own client-side work (optimizing the expression, building the
graph), which the row ``graph only`` measures alone (a scheduler that only materializes
the graph and counts its tasks).

Columns: ``localcluster``: ``LocalCluster(n_workers=2, threads_per_worker=1)`` +
``Client``, ``scheduler=client.get``; ``distributed``: ``distributed.Client(processes=True,
n_workers=2, threads_per_worker=1)``'s own scheduler; ``threads`` (2 threads) and ``sync``:
dask's local schedulers in this process. One cluster runs at a time; each first computes
a small graph (its workers import dask and numpy), then each size ``--repeats`` times
(median). ``vs distributed`` = seconds / distributed's seconds: < 1 means faster.
On a 2-core machine anything else running skews every number: the load average is printed.
"""
from __future__ import annotations

import argparse
import cProfile
import logging
import os
import pstats
import statistics
import time

import dask
import dask.array as da
import distributed

import localcluster
from localcluster import Client, LocalCluster


def collection(n: int):
    return da.ones((n,), chunks=1).sum()


def run(n: int, scheduler) -> float:
    """Seconds for one ``dask.compute`` of a fresh collection of size ``n``."""
    start = time.perf_counter()
    (total,) = dask.compute(collection(n), scheduler=scheduler)
    elapsed = time.perf_counter() - start
    assert total == n, total
    return elapsed


def graph_only(sizes: list, repeats: int) -> tuple[dict, dict]:
    """dask's client-side cost alone, and the number of tasks each size makes."""
    from dask._task_spec import Task, convert_legacy_graph
    counts: list = []

    def count(dsk, keys, **kwargs):
        graph = convert_legacy_graph(dict(dsk.__dask_graph__()))
        counts.append(sum(isinstance(node, Task) for node in graph.values()))
        return [1] * len(keys)

    times, tasks = {}, {}
    for n in sizes:
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            dask.compute(collection(n), scheduler=count)
            samples.append(time.perf_counter() - start)
        times[n], tasks[n] = statistics.median(samples), counts[-1]
    return times, tasks


def timed_sizes(sizes: list, repeats: int, scheduler) -> dict:
    run(100, scheduler)                       # warm-up: imports on the workers
    return {n: statistics.median(run(n, scheduler) for _ in range(repeats)) for n in sizes}


def measure_localcluster(sizes: list, repeats: int, profile: bool) -> dict:
    with LocalCluster(n_workers=2, threads_per_worker=1, forward_logs=False) as cluster, Client(cluster) as client:
        out = timed_sizes(sizes, repeats, client.get)
        if profile:
            prof = cProfile.Profile()
            prof.enable()
            run(sizes[-1], client.get)
            prof.disable()
            print(f"--- cProfile of one localcluster run, n={sizes[-1]} (client thread; profiling slows it) ---")
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    return out


def measure_distributed(sizes: list, repeats: int) -> dict:
    logging.getLogger("distributed").setLevel(logging.ERROR)
    with distributed.Client(processes=True, n_workers=2, threads_per_worker=1, dashboard_address=None) as client:
        return timed_sizes(sizes, repeats, client.get)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="3750,37500", help="chunks of the arrays (about 4/3 as many tasks)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--profile", action="store_true", help="cProfile one localcluster run of the largest size")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    load_before = os.getloadavg()
    graph, tasks = graph_only(sizes, args.repeats)
    columns = {"localcluster": measure_localcluster(sizes, args.repeats, args.profile),
               "distributed": measure_distributed(sizes, args.repeats)}
    with dask.config.set(num_workers=2):
        columns["threads"] = timed_sizes(sizes, args.repeats, "threads")
    columns["sync"] = timed_sizes(sizes, args.repeats, "sync")
    columns["graph only"] = graph
    load_after = os.getloadavg()

    print(f"dask {dask.__version__}, distributed {distributed.__version__}, localcluster "
          f"{localcluster.__version__}, {os.cpu_count()} CPUs, 2 workers x 1 thread, median of {args.repeats}")
    print(f"{'tasks':>8}  {'scheduler':<14}{'seconds':>9}{'us/task':>9}{'vs distributed':>16}")
    for n in sizes:
        for name, times in columns.items():
            t = times[n]
            print(f"{tasks[n]:>8,}  {name:<14}{t:>9.2f}{t / tasks[n] * 1e6:>9.0f}{t / columns['distributed'][n]:>16.2f}")
    print("vs distributed = seconds / distributed's seconds: < 1 means faster; every row includes "
          "'graph only' (dask's own client-side work)")
    print(f"load average (1 min) before {load_before[0]:.2f}, after {load_after[0]:.2f}")


if __name__ == "__main__":
    main()
