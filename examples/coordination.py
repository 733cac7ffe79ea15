"""Lock, Semaphore, Event, Queue and Variable between the tasks and your own process.
localcluster by default, dask.distributed with CLUSTER_BACKEND=distributed; only the import
block differs, and both print the same (tests/external/test_distributed_compat.py).

    python examples/coordination.py
    CLUSTER_BACKEND=distributed python examples/coordination.py

Not here, because dask differs: a lease taken by a task whose worker dies. localcluster gives
it back at once and the death's message names it (tests/integration/test_coordination.py); dask expires
it after ``locks.lease-timeout`` (30 s) without a word.
"""
import fcntl
import os
import tempfile
import time

# --- the only backend-specific block ------------------------------------------------------
if os.environ.get("CLUSTER_BACKEND") == "distributed":
    from distributed import Client, Event, LocalCluster, Lock, Queue, Semaphore, Variable
    CLUSTER_OPTIONS = {"dashboard_address": None}
else:
    from localcluster import Client, Event, LocalCluster, Lock, Queue, Semaphore, Variable
    CLUSTER_OPTIONS = {}
# ------------------------------------------------------------------------------------------


def step(path, delta):
    """Add ``delta`` to the tasks inside now; keep the most seen at once."""
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        now, most = map(int, (f.read() or "0 0").split())
        now += delta
        f.seek(0)
        f.truncate()
        f.write(f"{now} {max(most, now)}")


def most_at_once(path):
    with open(path) as f:
        return int(f.read().split()[1])


def guarded(path, i, limit):
    """Into the guarded part under a Lock (``limit`` None) or a Semaphore of ``limit`` leases."""
    with (Lock("file") if limit is None else Semaphore(max_leases=limit, name="pool")):
        step(path, +1)
        time.sleep(0.1)
        step(path, -1)
    return i


def wait_for_go(i):
    return i if Event("go").wait(timeout=30) else None


def produce(i):
    Queue("work").put(i * i)


def publish():
    Variable("answer").set(42)


def main():
    with tempfile.TemporaryDirectory() as tmp, \
            LocalCluster(n_workers=2, threads_per_worker=3, **CLUSTER_OPTIONS) as cluster, \
            Client(cluster) as client:
        path = os.path.join(tmp, "lock")
        client.gather(client.map(guarded, [path] * 6, range(6), [None] * 6))
        print("Lock: tasks inside at once:", most_at_once(path))
        path = os.path.join(tmp, "semaphore")
        client.gather(client.map(guarded, [path] * 6, range(6), [2] * 6))
        print("Semaphore(2): tasks inside at once:", most_at_once(path))

        waiting = client.map(wait_for_go, range(3))
        print("Event: done before set:", sum(f.done() for f in waiting))
        Event("go").set()
        print("Event: after set:", client.gather(waiting))

        client.gather(client.map(produce, range(4)))
        queue = Queue("work")
        print("Queue: from the tasks:", sorted(queue.get() for _ in range(4)), "left:", queue.qsize())

        client.submit(publish).result()
        print("Variable: set by a task:", Variable("answer").get(timeout=10))

        lock = Lock("mine")
        print("Lock: taken here:", lock.acquire(), "by someone else in 0.1 s:", Lock("mine").acquire(timeout=0.1))
        lock.release()


if __name__ == "__main__":
    main()
