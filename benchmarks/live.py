#!/usr/bin/env python
"""What the live dashboard costs: bench.py's ``submit`` and ``map`` on one localcluster
(2 workers of 1 thread), in rounds alternating without and with ``cluster.dashboard()``
open and refreshing once a second, for ``--minutes`` (10 by default). One run, one ratio:

    python benchmarks/live.py [--minutes M] [--output PATH]

Each round runs submit (5,000 no-ops, one by one, then their results) and map (20,000
no-ops); a metric's figure per mode is the median of its rounds, and the ratio is
with / without (1.0: no cost). The rounds come in blocks of four, without-with-with-without
(ABBA), so that each mode follows each mode equally often and a drift over the block
cancels. Whether the difference is measurable at all: a 95 % interval of the ratio that
leaves out 1.0, by resampling whole blocks (the median of the blocks' own ratios), since
neighbouring rounds drift together; the interval from rounds resampled one by one is also
given. The spread of the rounds without the dashboard says how much is noise. Each
refresh during a round is timed and placed: the submit rounds that had one inside their
timed part are counted, and their ratio is given apart. Each round starts after a random
wait of up to one refresh interval (both modes), so that the refreshes fall anywhere in it. Before every round, in both modes, the collector runs
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
    """bench.py's submit loop (one pass) and map; also when each timed part ran."""
    t0 = time.perf_counter()
    submit = bench.submit_loop(peer, SUBMIT_N, 1)["value"]
    t1 = t0 + SUBMIT_N / submit             # the loop's timed part (its 0.2 s rest after is not)
    t2 = time.perf_counter()
    out = peer.map(bench.noop, range(MAP_N))
    t3 = time.perf_counter()
    assert len(out) == MAP_N
    return {"submit_tps": submit, "map_tps": MAP_N / (t3 - t2), "spans": {"submit_tps": (t0, t1), "map_tps": (t2, t3)}}


def timing(view) -> list:
    """Make the widget's own thread note each refresh: (start, end, CPU seconds)."""
    seen: list = []
    refresh = view.refresh

    def timed() -> bool:
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return refresh()
        finally:
            seen.append((t0, time.perf_counter(), time.thread_time() - c0))
    view.refresh = timed        # the thread looks it up on the instance at each refresh
    return seen


def overlapping(span: tuple, refreshes: list) -> list:
    return [r for r in refreshes if r[0] < span[1] and r[1] > span[0]]


def timed_refreshes(view, n: int = 20) -> tuple:
    """Wall and CPU milliseconds of ``n`` refreshes (the wall time includes waits for the GIL)."""
    wall, cpu = [], []
    for _ in range(n):
        t0, c0 = time.perf_counter(), time.thread_time()
        view.refresh()
        wall.append((time.perf_counter() - t0) * 1e3)
        cpu.append((time.thread_time() - c0) * 1e3)
    return wall, cpu


def block_ratios(rounds: list, metric: str) -> list:
    """Each ABBA block's ratio: mean of its two rounds with / mean of its two without."""
    out = []
    for i in range(0, len(rounds) - 3, 4):
        block = rounds[i:i + 4]
        w = [r[metric] for r in block if r["mode"] == "with"]
        o = [r[metric] for r in block if r["mode"] == "without"]
        out.append(statistics.fmean(w) / statistics.fmean(o))
    return out


def median_interval(values: list, n: int = 2000) -> tuple:
    """A bootstrap 95 % interval of the median of ``values`` (a fixed seed)."""
    rng = random.Random(0)
    meds = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(n))
    return meds[int(0.025 * n)], meds[int(0.975 * n) - 1]


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
    order: list = []                         # every round, in the order run, with its mode
    during: list = []                        # (start, end, CPU s) of each refresh during a round
    refresh_ms: list = []
    refresh_cpu: list = []
    lock_us: list = []
    refreshes = 0
    end = time.monotonic() + args.minutes * 60
    try:
        one_round(peer)                      # warm-up: imports, caches, the first spawn's pages
        phase = random.Random(1)             # where in a round the widget's refreshes fall
        i = 0
        while time.monotonic() < end or i % 4 or i < 8:      # whole ABBA blocks, two at least
            mode = ("without", "with", "with", "without")[i % 4]
            view = peer.cluster.dashboard(interval=1.0) if mode == "with" else None
            seen = timing(view) if view is not None else []
            gc.collect()
            # A widget refreshes a second after it is built: without this wait, that first
            # refresh would come after the submit loop (~0.6 s) nearly every round, and the
            # submit row would measure a widget that never refreshes during it. Both modes wait.
            time.sleep(phase.uniform(0.0, 1.0))
            r = one_round(peer)
            r["mode"] = mode
            rounds[mode].append(r)
            order.append(r)
            if view is not None:
                view.stop()                  # its refreshes after the round are timed below
                refreshes += len(seen)
                during += seen
                r["refreshes"] = {m: len(overlapping(span, seen)) for m, span in r["spans"].items()}
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
        blocks = block_ratios(order, metric)
        hit = [r[metric] for r in rounds["with"] if r["refreshes"][metric]]
        table[metric] = {"without": without, "with": with_, "ratio": with_ / without,
                         "pair_ratio_median": statistics.median(pairs),
                         "block_ratio_median": statistics.median(blocks),
                         "block_ratio_95": median_interval(blocks),
                         "ratio_95": ratio_interval([r[metric] for r in rounds["without"]],
                                                    [r[metric] for r in rounds["with"]]),
                         "with_rounds_refreshed": len(hit),
                         "ratio_refreshed": statistics.median(hit) / without if hit else None,
                         "cv_without": statistics.pstdev(r[metric] for r in rounds["without"]) / without,
                         "raw": {m: [r[metric] for r in rounds[m]] for m in rounds},
                         "blocks": blocks}
    result = {"minutes": args.minutes, "rounds": {m: len(r) for m, r in rounds.items()}, "metrics": table,
              "refreshes_during_rounds": refreshes, "refresh_ms_median": statistics.median(refresh_ms),
              "refresh_ms_max": max(refresh_ms),
              "refresh_cpu_ms_median": statistics.median(refresh_cpu), "cluster_workers_us_median": statistics.median(lock_us),
              "refresh_during_rounds_cpu_ms_median": statistics.median(c * 1e3 for _, _, c in during) if during else None,
              "refresh_during_rounds_wall_ms_median": (statistics.median((b - a) * 1e3 for a, b, _ in during)
                                                       if during else None),
              "loadavg": os.getloadavg()}
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(result, f, indent=1)
    print(f"{args.minutes:g} min, {len(rounds['without'])} rounds without and {len(rounds['with'])} with the "
          f"dashboard ({refreshes} refreshes during them)")
    for metric, row in table.items():
        lo, hi = row["block_ratio_95"]
        verdict = "measurable" if not lo <= 1.0 <= hi else "not measurable"
        print(f"  {metric:11s} without {row['without']:9.0f}/s   with {row['with']:9.0f}/s   "
              f"ratio {row['ratio']:.3f}; by ABBA block {row['block_ratio_median']:.3f} (95 % {lo:.3f}-{hi:.3f}: "
              f"{verdict}; rounds one by one: {row['ratio_95'][0]:.3f}-{row['ratio_95'][1]:.3f}); "
              f"spread of the rounds without: {row['cv_without']:.0%}")
        refreshed = row["ratio_refreshed"]
        print(f"  {'':11s} {row['with_rounds_refreshed']} of {len(rounds['with'])} rounds with had a refresh inside"
              + (f" (their ratio {refreshed:.3f})" if refreshed else ""))
    if during:
        print(f"  a refresh during the rounds: {result['refresh_during_rounds_cpu_ms_median']:.2f} ms of CPU, "
              f"{result['refresh_during_rounds_wall_ms_median']:.2f} ms wall (medians)")
    print(f"  one refresh: {result['refresh_cpu_ms_median']:.2f} ms of CPU median, {result['refresh_ms_median']:.2f} ms "
          f"wall ({result['refresh_ms_max']:.2f} max), on the widget's thread; cluster.workers (its one take of the lock): "
          f"{result['cluster_workers_us_median']:.0f} µs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
