"""Chaos with data in flight: graphs of tasks with dependencies and 1-20 MB values,
scatters and replicas, while a killer thread SIGKILLs a random worker every so often,
often in the middle of a large transfer. Checks that every result is right (or, for
scattered data whose every copy died, a LostDataError that says so), that no future
hangs, and that every kill is recorded as a death with cause "signal".

    python examples/soak.py [seconds] [seed]        (default: 60 s, seed 0; hours are fine)

tests/integration/test_soak.py runs it for about 30 s, from a fresh seed each run.
"""
from __future__ import annotations

import os
import random
import signal
import sys
import threading
import time

import numpy as np

from localcluster import Client, LocalCluster, LostDataError

MB = 2**20


def leaf(i: int, mb: int) -> np.ndarray:
    return np.full(mb * MB // 8, float(i))


def mix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    n = min(len(a), len(b))
    return a[:n] + b[:n]


def total(*arrays: np.ndarray) -> float:
    return float(sum(a.sum() for a in arrays))


def soak(seconds: float, seed: int = 0, n_workers: int = 3, log=print) -> dict:
    rng = random.Random(seed)
    kills: list = []
    stop = threading.Event()
    report = {"rounds": 0, "tasks": 0, "kills": 0, "lost_scattered": 0, "moved_mb": 0}
    t0 = time.monotonic()
    with LocalCluster(n_workers=n_workers, threads_per_worker=1, allowed_failures=25, memory_limit=None,
                      forward_logs=False) as cluster, Client(cluster) as client:

        def killer() -> None:
            kr = random.Random(seed + 1)
            while not stop.wait(kr.uniform(0.3, 1.2)):
                workers = [w for w in cluster.workers.values() if w.status == "running"]
                if workers:
                    victim = kr.choice(workers)
                    try:
                        os.kill(victim.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        continue
                    # A worker killed a moment ago still shows as running until its death is
                    # handled, and a kill of its unreaped pid succeeds: one death, not two.
                    if victim.pid not in kills:
                        kills.append(victim.pid)

        thread = threading.Thread(target=killer, name="soak-killer", daemon=True)
        thread.start()
        try:
            while time.monotonic() - t0 < seconds:
                n = rng.randint(8, 24)
                sizes = [rng.randint(1, 20) for _ in range(n)]
                leaves = [client.submit(leaf, i, mb, pure=False) for i, mb in enumerate(sizes)]
                pairs = [(rng.randrange(n), rng.randrange(n)) for _ in range(n)]
                mixes = [client.submit(mix, leaves[a], leaves[b], pure=False) for a, b in pairs]
                scattered = client.scatter([np.full(rng.randint(1, 8) * MB // 8, 1.0) for _ in range(2)])
                try:
                    client.replicate(scattered, n=2, timeout=30)
                except LostDataError:
                    pass     # a copy died before it was copied: the checks below see it
                final = client.submit(total, *mixes, pure=False)
                with_scattered = client.submit(total, *scattered, pure=False)
                expected = sum((a + b) * (min(sizes[a], sizes[b]) * MB // 8) for a, b in pairs)
                assert final.result(120) == expected, (final.result(), expected)
                try:
                    got = with_scattered.result(120)
                    assert got == sum(s.result(120).size for s in scattered)
                except LostDataError as e:      # every copy of scattered data died: said so
                    assert "scatter" in str(e) or "lost" in str(e).lower(), e
                    report["lost_scattered"] += 1
                report["rounds"] += 1
                report["tasks"] += 2 * n + 2
                report["moved_mb"] += sum(sizes) + sum(min(sizes[a], sizes[b]) for a, b in pairs)
        finally:
            stop.set()
            thread.join()
        # The last kill may land while the last round ends: its death is recorded once the
        # scheduler thread has handled it, a few ms later. Wait for that, not forever.
        deadline = time.monotonic() + 15
        while set(kills) - {d.pid for d in cluster.deaths} and time.monotonic() < deadline:
            time.sleep(0.01)
        deaths = list(cluster.deaths)
        cluster_deaths = {d.pid: d for d in deaths}
        report["kills"] = len(kills)
        report["deaths"] = len(deaths)
        report["wrong_causes"] = [(pid, cluster_deaths[pid].cause) for pid in kills
                                  if pid in cluster_deaths and cluster_deaths[pid].cause != "signal"]
        report["kills_not_recorded"] = [pid for pid in kills if pid not in cluster_deaths]
        report["seconds"] = round(time.monotonic() - t0, 1)
        directory = cluster.local_directory
    report["directory_left"] = os.path.exists(directory)
    log(f"soak: {report['rounds']} rounds, {report['tasks']} tasks, {report['moved_mb']} MB moved, "
        f"{report['kills']} SIGKILLs, {report['deaths']} deaths recorded, {report['lost_scattered']} scattered "
        f"values lost with every copy, {report['seconds']} s")
    return report


if __name__ == "__main__":
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 60.0
    result = soak(seconds, int(sys.argv[2]) if len(sys.argv) > 2 else 0)
    problems = result["wrong_causes"] or result["kills_not_recorded"] or result["directory_left"]
    sys.exit(1 if problems else 0)
