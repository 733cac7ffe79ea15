#!/usr/bin/env python
"""joblib's default backend (loky) vs the "localcluster" backend, in one run:

    python benchmarks/joblib_backend.py [--repeats N]

Both with 2 worker processes of 1 thread: ``joblib.Parallel(n_jobs=2)`` on loky's
reusable executor, and ``parallel_config(backend="localcluster", client=client)`` on
``LocalCluster(n_workers=2, threads_per_worker=1)``. Rows:

* ``tiny x N``: ``Parallel(n_jobs=2)(delayed(tiny)(i) for i in range(N))``, joblib's
  auto-batching on (batch_size="auto", the default);
* ``GridSearchCV iris`` / ``digits``: ``GridSearchCV(SVC(), 6 candidates, cv=3,
  n_jobs=-1).fit`` (18 fits), the same search ``tests/integration/test_joblib.py`` runs on iris;
* ``norm 40 MB x 20``: ``Parallel(n_jobs=2)(delayed(norm)(a) for a in arrays)`` over 20
  float64 arrays of 40 MB each (issue 53): the calls cost nothing, the arguments' way to the
  workers is the whole time. loky memory-maps them (its default ``max_nbytes="1M"``);
* ``cold GridSearchCV iris``: the first search from nothing: for loky it starts the
  executor's workers, for localcluster the cluster (``LocalCluster`` + ``Client``); both
  pay their workers' first import of scikit-learn.

Warm rows: the median of ``--repeats`` runs after one warm-up run on the same workers.
Ratio = loky time / localcluster time: > 1 means localcluster is faster. On a 2-core
machine anything else running skews every number: the load average is printed.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

# The checkout this script is in, not whatever localcluster the interpreter would import
# (`python benchmarks/x.py` puts benchmarks/ first on sys.path, not the repository)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import joblib  # noqa: E402
import numpy as np  # noqa: E402
from joblib.externals.loky import get_reusable_executor  # noqa: E402
from sklearn.datasets import load_digits, load_iris  # noqa: E402
from sklearn.model_selection import GridSearchCV  # noqa: E402
from sklearn.svm import SVC  # noqa: E402

import localcluster.joblib  # noqa: F401, E402 - registers the "localcluster" backend
from localcluster import Client, LocalCluster  # noqa: E402

GRID = {"C": [0.1, 1, 10], "kernel": ["linear", "rbf"]}


def tiny(x):
    return x + 1


def run_tiny(n: int) -> None:
    out = joblib.Parallel(n_jobs=2)(joblib.delayed(tiny)(i) for i in range(n))
    assert out[-1] == n


def norm(a):
    return float(np.linalg.norm(a))


def run_norms(arrays: list) -> None:
    out = joblib.Parallel(n_jobs=2)(joblib.delayed(norm)(a) for a in arrays)
    assert len(out) == len(arrays)


def run_search(data: tuple) -> float:
    X, y = data
    return GridSearchCV(SVC(), GRID, cv=3, n_jobs=-1).fit(X, y).best_score_


def timed(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def warm_rows(repeats: int, datasets: dict, arrays: list) -> dict:
    """Every warm row in the backend now in force: one warm-up, then the median."""
    jobs = {"tiny x 1,000": (run_tiny, 1_000), "tiny x 10,000": (run_tiny, 10_000)}
    jobs.update({f"GridSearchCV {name}": (run_search, data) for name, data in datasets.items()})
    jobs["norm 40 MB x 20"] = (run_norms, arrays)
    out = {}
    for row, (fn, arg) in jobs.items():
        fn(arg)
        out[row] = statistics.median(timed(fn, arg) for _ in range(repeats))
    return out


def measure_loky(repeats: int, datasets: dict, arrays: list) -> dict:
    get_reusable_executor().shutdown(wait=True)          # cold: no loky worker yet
    rows = {"cold GridSearchCV iris": timed(run_search, datasets["iris"])}
    rows.update(warm_rows(repeats, datasets, arrays))
    get_reusable_executor().shutdown(wait=True)          # leave no worker behind
    return rows


def measure_localcluster(repeats: int, datasets: dict, arrays: list) -> dict:
    start = time.perf_counter()
    with LocalCluster(n_workers=2, threads_per_worker=1, forward_logs=False) as cluster, Client(cluster) as client:
        with joblib.parallel_config(backend="localcluster", client=client):
            run_search(datasets["iris"])
            rows = {"cold GridSearchCV iris": time.perf_counter() - start}
            rows.update(warm_rows(repeats, datasets, arrays))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    datasets = {"iris": load_iris(return_X_y=True), "digits": load_digits(return_X_y=True)}
    arrays = [np.random.default_rng(i).random(5_000_000) for i in range(20)]      # 40 MB each
    load_before = os.getloadavg()
    loky = measure_loky(args.repeats, datasets, arrays)
    ours = measure_localcluster(args.repeats, datasets, arrays)
    load_after = os.getloadavg()

    print(f"joblib {joblib.__version__}, localcluster {localcluster.__version__} "
          f"({os.path.dirname(os.path.dirname(localcluster.__file__))}), "
          f"{os.cpu_count()} CPUs, 2 workers x 1 thread each, median of {args.repeats} warm runs")
    print(f"{'':<24}{'loky':>10}{'localcluster':>14}{'ratio':>8}")
    for row in ours:
        print(f"{row:<24}{loky[row]:>9.3f}s{ours[row]:>13.3f}s{loky[row] / ours[row]:>8.2f}")
    print("ratio = loky / localcluster: > 1 means localcluster is faster")
    print(f"issue 53's target: norm 40 MB x 20 within 1.2x of loky (ratio >= {1 / 1.2:.2f}): "
          f"{'met' if loky['norm 40 MB x 20'] * 1.2 >= ours['norm 40 MB x 20'] else 'NOT met'}")
    print(f"load average (1 min) before {load_before[0]:.2f}, after {load_after[0]:.2f}")


if __name__ == "__main__":
    main()
