#!/usr/bin/env python
"""What the live dashboard costs: bench.py's ``submit`` and ``map`` on one localcluster
(2 workers of 1 thread), in rounds alternating without and with ``cluster.dashboard()``
open and refreshing once a second, for ``--minutes`` (10 by default). One run, one ratio:

    python benchmarks/live.py [--minutes M] [--output PATH]

Each round runs submit (5,000 no-ops, one by one, then their results) and map (20,000
no-ops); a metric's figure per mode is the median of its rounds, and the ratio is
with / without (1.0: no cost), also as the median of each pair of neighbouring rounds;
the spread of the rounds without the dashboard says how much is noise, and a bootstrap 95 %
interval of the ratio says whether the difference is measurable at all (it is when the
interval leaves out 1.0). Before every round, in both modes, the collector runs
(``gc.collect()``, as pyperf does between runs): the harness's own steps (building a widget,
closing the last one, timing its refreshes) leave garbage that would otherwise be collected
during whichever round follows them. It also times
the refreshes themselves (on the widget's thread) and ``cluster.workers``, the one take
of the cluster's lock a refresh makes. The widget needs ipywidgets (no kernel: its
messages go nowhere, the drawing is the same). Results: a table on stdout and
``benchmarks/results/live.json``.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import time

import bench

HERE = os.path.dirname(os.path.abspath(__file__))
SUBMIT_N, MAP_N = 5000, 20_000


def one_round(peer: bench.Peer) -> dict:
    submit = bench.submit_loop(peer, SUBMIT_N, 1)["value"]
    t0 = time.perf_counter()
    out = peer.map(bench.noop, range(MAP_N))
    assert len(out) == MAP_N
    return {"submit_tps": submit, "map_tps": MAP_N / (time.perf_counter() - t0)}


def timed_refreshes(view, n: int = 20) -> tuple:
    """Wall and CPU milliseconds of ``n`` refreshes (the wall time includes waits for the GIL)."""
    wall, cpu = [], []
    for _ in range(n):
        t0, c0 = time.perf_counter(), time.thread_time()
        view.refresh()
        wall.append((time.perf_counter() - t0) * 1e3)
        cpu.append((time.thread_time() - c0) * 1e3)
    return wall, cpu


def ratio_interval(without: list, with_: list, n: int = 2000) -> tuple:
    """A bootstrap 95 % interval of median(with) / median(without): each mode's rounds
    resampled with replacement, ``n`` times (a fixed seed: the same data, the same interval)."""
    rng = random.Random(0)
    ratios = sorted(statistics.median(rng.choices(with_, k=len(with_)))
                    / statistics.median(rng.choices(without, k=len(without))) for _ in range(n))
    return ratios[int(0.025 * n)], ratios[int(0.975 * n) - 1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--output", default=os.path.join(HERE, "results", "live.json"))
    args = ap.parse_args(argv)
    peer = bench.LocalClusterPeer()
    peer.start()
    rounds: dict = {"without": [], "with": []}
    refresh_ms: list = []
    refresh_cpu: list = []
    lock_us: list = []
    refreshes = 0
    end = time.monotonic() + args.minutes * 60
    try:
        one_round(peer)                      # warm-up: imports, caches, the first spawn's pages
        i = 0
        while time.monotonic() < end or min(len(r) for r in rounds.values()) < 2:
            mode = ("without", "with")[i % 2]
            view = peer.cluster.dashboard(interval=1.0) if mode == "with" else None
            gc.collect()
            rounds[mode].append(one_round(peer))
            if view is not None:
                refreshes += view.refreshes
                wall, cpu = timed_refreshes(view, 5)
                refresh_ms += wall
                refresh_cpu += cpu
                view.close()
            for _ in range(20):
                t0 = time.perf_counter()
                peer.cluster.workers
                lock_us.append((time.perf_counter() - t0) * 1e6)
            i += 1
    finally:
        peer.close()
    table = {}
    for metric in ("submit_tps", "map_tps"):
        without = statistics.median(r[metric] for r in rounds["without"])
        with_ = statistics.median(r[metric] for r in rounds["with"])
        pairs = [w[metric] / o[metric] for o, w in zip(rounds["without"], rounds["with"])]
        table[metric] = {"without": without, "with": with_, "ratio": with_ / without,
                         "pair_ratio_median": statistics.median(pairs),
                         "ratio_95": ratio_interval([r[metric] for r in rounds["without"]],
                                                    [r[metric] for r in rounds["with"]]),
                         "cv_without": statistics.pstdev(r[metric] for r in rounds["without"]) / without,
                         "raw": {m: [r[metric] for r in rounds[m]] for m in rounds}}
    result = {"minutes": args.minutes, "rounds": {m: len(r) for m, r in rounds.items()}, "metrics": table,
              "refreshes_during_rounds": refreshes, "refresh_ms_median": statistics.median(refresh_ms),
              "refresh_ms_max": max(refresh_ms),
              "refresh_cpu_ms_median": statistics.median(refresh_cpu), "cluster_workers_us_median": statistics.median(lock_us),
              "loadavg": os.getloadavg()}
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(result, f, indent=1)
    print(f"{args.minutes:g} min, {len(rounds['without'])} rounds without and {len(rounds['with'])} with the "
          f"dashboard ({refreshes} refreshes during them)")
    for metric, row in table.items():
        print(f"  {metric:11s} without {row['without']:9.0f}/s   with {row['with']:9.0f}/s   "
              f"ratio {row['ratio']:.3f} (95 % interval {row['ratio_95'][0]:.3f}-{row['ratio_95'][1]:.3f}; "
              f"round by round: {row['pair_ratio_median']:.3f}; "
              f"spread of the rounds without: {row['cv_without']:.0%})")
    print(f"  one refresh: {result['refresh_cpu_ms_median']:.2f} ms of CPU median, {result['refresh_ms_median']:.2f} ms "
          f"wall ({result['refresh_ms_max']:.2f} max), on the widget's thread; cluster.workers (its one take of the lock): "
          f"{result['cluster_workers_us_median']:.0f} µs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
