"""Tasks that submit tasks: worker_client, get_client, secede, rejoin and get_worker; and
cancel, run and who_has from a task.
localcluster by default, dask.distributed with CLUSTER_BACKEND=distributed; only the import
block differs, and both print the same (tests/external/test_distributed_compat.py).

    python examples/tasks.py
    CLUSTER_BACKEND=distributed python examples/tasks.py

Not here, because dask differs: a future a task returns is, in the parent, that Client's
Future of the key under localcluster (tests/integration/test_worker_client.py); dask's arrives
uninitialized ("not properly initialized") unless the task keeps a client alive for it.
"""
import os

# --- the only backend-specific block ------------------------------------------------------
if os.environ.get("CLUSTER_BACKEND") == "distributed":
    from distributed import Client, LocalCluster, get_client, get_worker, rejoin, secede, worker_client
    CLUSTER_OPTIONS = {"dashboard_address": None}
else:
    from localcluster import Client, LocalCluster, get_client, get_worker, rejoin, secede, worker_client
    CLUSTER_OPTIONS = {}
# ------------------------------------------------------------------------------------------


def fib(n):
    """Each level waits on its children with its thread slot given back: no deadlock on one thread."""
    if n < 2:
        return n
    with worker_client() as client:
        a = client.submit(fib, n - 1)
        b = client.submit(fib, n - 2)
        return a.result() + b.result()


def inc(x):
    return x + 1


def submits(x):
    """A task that waits on the tasks it submits gives its slot back first (secede), and
    takes one again (rejoin) before it goes on: on one thread it would wait forever."""
    client = get_client()
    secede()
    total = client.submit(inc, x).result() + sum(client.gather(client.map(inc, [x, x])))
    rejoin()
    return total


def worker_name():
    return get_worker().name


def pid():
    return os.getpid()


def runs_everywhere():
    """client.run from a task: every worker answers, this task's own too (no deadlock)."""
    answers = get_client().run(pid)
    return len(answers), os.getpid() in answers.values()


def cancels_and_asks():
    """On one thread the child cannot start before this task ends: cancel it; then a child
    waited for (its slot given back) and where its data is."""
    client = get_client()
    pending = client.submit(inc, 100)
    client.cancel([pending])
    secede()
    done = client.submit(inc, 1)
    done.result()
    where = client.who_has([done])[done.key]
    rejoin()
    return pending.cancelled(), pending.status, len(where)


def main():
    with LocalCluster(n_workers=1, threads_per_worker=1, **CLUSTER_OPTIONS) as cluster, Client(cluster) as client:
        print("fib(8) on 1 worker x 1 thread:", client.submit(fib, 8).result())
        print("get_client, secede, rejoin in a task:", client.submit(submits, 1).result())
        names = {w["name"] for w in client.scheduler_info()["workers"].values()}
        print("get_worker().name is a worker's:", client.submit(worker_name).result() in names)
        print("run in a task (workers, its own among them):", *client.submit(runs_everywhere).result())
        print("cancel and who_has in a task:", *client.submit(cancels_and_asks).result())


if __name__ == "__main__":
    main()
