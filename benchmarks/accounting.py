"""How well a worker's ``managed`` bytes match the RSS growth its data causes, per kind.

    python benchmarks/accounting.py [--size 50000000]

For each kind of the data-path matrix (tests/_data.py), in a fresh 1-worker cluster:
warm the worker up (imports), read its RSS, make a value there (as a task result, and
as scattered data), read its RSS again, and compare the growth with what
``cluster.workers[name].managed`` reports. The test suite asserts the same bound
(10 % + 5 MiB) in tests/integration/test_datapath.py; this prints the figures.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import _data  # noqa: E402
from localcluster import Client, LocalCluster, wait  # noqa: E402

MiB = 1 << 20


def measure(kind: str, n: int, how: str) -> tuple[int, int]:
    with LocalCluster(n_workers=1, forward_logs=False) as cluster, Client(cluster) as client:
        (name,) = cluster.workers
        client.submit(_data.warm_up, kind, pure=False).result(60)
        before = client.submit(_data.rss_here, pure=False).result(60)
        held = client.submit(_data.make, kind, n) if how == "result" else client.scatter([_data.make(kind, n)])[0]
        wait([held], timeout=60)
        after = client.submit(_data.rss_here, pure=False).result(60)
        return cluster.workers[name].managed, after - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=50_000_000)
    args = parser.parse_args()
    print(f"{'kind':<18} {'how':<10} {'managed MiB':>12} {'RSS growth MiB':>15} {'error':>8}")
    for kind in _data.KINDS:
        for how in ("result", "scattered"):
            managed, growth = measure(kind, args.size, how)
            err = (managed - growth) / growth if growth else float("nan")
            print(f"{kind:<18} {how:<10} {managed / MiB:>12.1f} {growth / MiB:>15.1f} {err:>+8.1%}")


if __name__ == "__main__":
    main()
