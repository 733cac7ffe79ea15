"""At most 2 memory-heavy tasks at once per worker, whatever its threads: dask's abstract
resources. localcluster by default, dask.distributed with CLUSTER_BACKEND=distributed; only
the import block differs, and both print the same (tests/external/test_distributed_compat.py).

    python examples/resources.py
    CLUSTER_BACKEND=distributed python examples/resources.py

Each task counts itself in and out of a file under flock, so the concurrency printed is
what the tasks really saw, not what the scheduler meant.
"""
import fcntl
import os
import tempfile
import time

# --- the only backend-specific block ------------------------------------------------------
if os.environ.get("CLUSTER_BACKEND") == "distributed":
    from distributed import Client, LocalCluster
    CLUSTER_OPTIONS = {"dashboard_address": None}
else:
    from localcluster import Client, LocalCluster
    CLUSTER_OPTIONS = {}
# ------------------------------------------------------------------------------------------


def step(path, delta):
    """Add ``delta`` to the tasks running now; keep the most seen at once."""
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        now, most = map(int, (f.read() or "0 0").split())
        now += delta
        f.seek(0)
        f.truncate()
        f.write(f"{now} {max(most, now)}")


def heavy(path, i):
    step(path, +1)
    time.sleep(0.4)          # stands for a task that holds a lot of memory for a while
    step(path, -1)
    return i * i


def most_at_once(path):
    with open(path) as f:
        return int(f.read().split()[1])


def main():
    with tempfile.TemporaryDirectory() as tmp, \
            LocalCluster(n_workers=1, threads_per_worker=4, resources={"MEM": 2}, **CLUSTER_OPTIONS) as cluster, \
            Client(cluster) as client:
        heavy_log, light_log = os.path.join(tmp, "heavy"), os.path.join(tmp, "light")
        futures = client.map(heavy, [heavy_log] * 6, range(6), resources={"MEM": 1}, pure=False)
        print("results", client.gather(futures))
        print("MEM=1 tasks at once on a MEM=2 worker:", most_at_once(heavy_log))
        both = client.submit(heavy, light_log, 7, resources={"MEM": 2}, pure=False)
        print("a task asking all of MEM:", both.result())


if __name__ == "__main__":
    main()
