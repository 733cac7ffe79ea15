"""One script, two clusters: localcluster by default, dask.distributed with
CLUSTER_BACKEND=distributed. Only the import block differs; everything below it is the
portable API, in dask's names and meanings. It prints what is portable, one fact a line,
and the two backends print the same lines (tests/external/test_distributed_compat.py checks it).

    python examples/portable.py
    CLUSTER_BACKEND=distributed python examples/portable.py     # pip install distributed

What it deliberately does not print, because the two differ (README: "When one machine
is not enough"): worker names (``worker-0`` here, ``tcp://127.0.0.1:40123`` in dask), the
lines of get_worker_logs (strings here, (level, message) pairs in dask; dead workers are
kept here), restart's return value (the Client here, None in dask), the message of
KilledWorker (each death's cause here), and what becomes of futures across a restart.
"""
import os
import tempfile
import time
from concurrent.futures import CancelledError

import dask
import dask.array as da
import numpy as np

# --- the only backend-specific block ------------------------------------------------------
if os.environ.get("CLUSTER_BACKEND") == "distributed":
    import dask
    from distributed import Client, KilledWorker, LocalCluster, as_completed, fire_and_forget, wait
    dask.config.set({"distributed.scheduler.allowed-failures": 0})
    CLUSTER_OPTIONS = {"dashboard_address": None}
else:
    from localcluster import Client, KilledWorker, LocalCluster, as_completed, fire_and_forget, wait
    CLUSTER_OPTIONS = {"allowed_failures": 0}
# ------------------------------------------------------------------------------------------


def inc(x):
    return x + 1


def fail(x):
    raise ValueError(f"no {x}")


def total(a):
    return float(a.sum())


def pid(_tag):
    return os.getpid()


def die():
    os._exit(3)     # the worker process ends in the middle of the task


def basics(client):
    print("submit", client.submit(inc, 1).result())
    futures = client.map(inc, range(10))
    print("map+gather", client.gather(futures))
    done, not_done = wait(futures)
    print("wait", len(done), len(not_done))
    print("as_completed", sorted(f.result() for f in as_completed(client.map(inc, range(20, 25)))))
    pairs = as_completed(client.map(inc, range(30, 33)), with_results=True)
    print("as_completed with_results", sorted(result for _, result in pairs))
    bad = client.submit(fail, 1)
    print("exception", type(bad.exception()).__name__, bad.status)
    print("gather errors=skip", client.gather([client.submit(inc, 2), bad], errors="skip"))
    try:
        client.gather([bad])
    except ValueError as e:
        print("gather raises the task's own", type(e).__name__, e)


def data_and_placement(client):
    big = client.scatter(np.arange(2_000_000, dtype=float), hash=False)     # 16 MB
    client.replicate([big], n=2)
    print("scatter+replicate", client.submit(total, big).result())
    logs = client.get_worker_logs()
    print("get_worker_logs", len(logs), "workers")
    first, second = sorted(logs)                  # worker names (addresses in dask)
    here = [client.submit(pid, i, workers=[first], pure=False) for i in range(3)]
    there = client.submit(pid, 0, workers=[second], pure=False)
    pids = client.gather(here)
    print("workers=", len(set(pids)), pids[0] != there.result())


def cancel_and_death(client):
    slow = client.submit(time.sleep, 5, pure=False)
    client.cancel([slow])
    try:
        slow.result(timeout=10)
    except CancelledError as e:
        print("cancel", slow.cancelled(), slow.status, isinstance(e, CancelledError))
    doomed = client.submit(die)
    try:
        doomed.result(timeout=60)
    except KilledWorker as e:
        print("KilledWorker", e.task == doomed.key, e.allowed_failures)


def touch(path):
    open(path, "w").close()


def batches_and_run(client):
    client.wait_for_workers(2)                       # the one that died is replaced
    ac = as_completed(client.map(inc, range(40, 46)))
    print("as_completed batches", sorted(r for batch in ac.batches() for r in client.gather(batch)), ac.is_empty())
    ac = as_completed(client.map(inc, range(3)))
    ac.clear()
    print("as_completed clear", ac.is_empty(), ac.count(), ac.next_batch(block=False))
    pids = client.run(os.getpid)                     # keyed by worker name here, address in dask
    first = sorted(pids)[0]
    print("run", len(pids), len(set(pids.values())), client.run(inc, 1, workers=[first]) == {first: 2})
    try:
        client.run(fail, 2)
    except ValueError as e:
        print("run raises the worker's own", type(e).__name__, e)
    print("run on_error=return", sorted(type(v).__name__ for v in client.run(fail, 3, on_error="return").values()))
    info = client.scheduler_info()
    print("scheduler_info", len(info["workers"]), set(info["workers"]) == set(pids))
    [x] = client.scatter([list(range(10))], workers=[first], hash=False)
    print("who_has", list(client.who_has([x])[x.key]) == [first])
    print("has_what", x.key in client.has_what()[first], set(client.has_what()) == set(pids))
    print("nthreads", sorted(client.nthreads().values()), client.ncores() == client.nthreads())
    print("processing", set(client.processing()) == set(pids),
          all(isinstance(key, str) for keys in client.processing().values() for key in keys))
    print("run_on_scheduler", client.run_on_scheduler(inc, 1), client.run_on_scheduler(os.getpid) == os.getpid())
    done = client.submit(inc, 100)
    done.result()
    steps = [s[1:4] for s in client.story(done.key) if s[0] == "scheduler"]
    print("story", steps[-1] == (done.key, "processing", "memory"))


def fire_forget_and_collections(client):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "fired")
        fire_and_forget(client.submit(touch, path, pure=False))   # no reference kept
        deadline = time.monotonic() + 30
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.01)
        print("fire_and_forget", os.path.exists(path))
    print("compute", client.compute(dask.delayed(inc)(1)).result(), client.compute([da.ones(10, chunks=5).sum()],
                                                                                  sync=True))
    kept = client.persist(da.arange(10, chunks=5))
    print("persist", type(kept).__name__, client.compute(kept.sum()).result(), len(client.who_has(kept)))


def default_scheduler(client):
    # the Client is dask's default scheduler while it is open: plain compute() and persist()
    y = client.persist(da.ones((100, 100), chunks=10) + 1)
    workers = set(client.run(os.getpid).values())
    on_workers = set(da.ones(4, chunks=2).map_blocks(lambda b: b * 0 + os.getpid(), dtype=float).compute().tolist())
    print("default scheduler", y.mean().compute(), on_workers <= workers, os.getpid() not in on_workers)
    z, = dask.persist(da.arange(10, chunks=5))
    print("dask.persist", z.sum().compute(), len(client.who_has(z)))


def main():
    with LocalCluster(n_workers=2, threads_per_worker=1, **CLUSTER_OPTIONS) as cluster:
        with Client(cluster) as client:
            client.wait_for_workers(2)
            basics(client)
            data_and_placement(client)
            cancel_and_death(client)
            batches_and_run(client)
            fire_forget_and_collections(client)
            default_scheduler(client)
            client.restart()
            print("after restart", client.submit(inc, 41).result())
        print("dask's scheduler once the client is closed:", dask.config.get("scheduler", None))
        other = Client(cluster)
        other.shutdown()                                 # that client, and the cluster it was given
        print("shutdown", other.status)


if __name__ == "__main__":
    main()
