"""Write report.html: what a cluster did, drawn as a task stream, memory timelines and
deaths. Run it, then open the file in a browser:

    python examples/report.py && xdg-open report.html

It runs two waves of work, a few failing tasks, a task that eats memory until its
nanny stops the worker, and one that segfaults (each retried once on a fresh worker).
"""
import ctypes
import sys
import time

import numpy as np

import localcluster
from localcluster import Client, KilledWorker, LocalCluster


def load(i):
    time.sleep(0.02 + (i % 7) * 0.005)
    return np.full(2**18, float(i))          # 2 MB: stays on its worker until needed


def total(a):
    return float(a.sum())


def check(i):
    if i % 4 == 0:
        raise ValueError(f"record {i} is malformed")
    return i


def hog():
    blocks = []
    for _ in range(100):
        blocks.append(np.ones(20 * 2**20 // 8))   # 20 MB more every 20 ms
        time.sleep(0.02)
    return len(blocks)


def crash():
    return ctypes.c_int.from_address(0).value     # SIGSEGV


def main(path: str) -> None:
    with localcluster.report(path):
        with LocalCluster(n_workers=2, threads_per_worker=2, memory_limit="400MiB", allowed_failures=1) as cluster, \
                Client(cluster) as client:
            client.gather(client.map(total, client.map(load, range(60))))
            client.gather(client.map(check, range(12)), errors="skip")
            for fn in (hog, crash):
                try:
                    client.submit(fn).result(60)
                except KilledWorker as e:
                    print(f"{fn.__name__}: KilledWorker, {', '.join(d.cause for d in e.deaths)}")
            client.gather(client.map(total, client.map(load, range(100, 140))))
    print(f"wrote {path}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "report.html")
