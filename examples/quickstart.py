"""The happy path: a cluster, tasks, futures as arguments, errors with remote tracebacks.

No ``if __name__ == "__main__":`` guard is needed: workers never re-run this file.
"""
import time

from localcluster import Client, LocalCluster, as_completed


def square(x):
    return x * x


def slow_add(a, b):
    time.sleep(0.1)
    return a + b


start = time.perf_counter()
with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster) as client:
    print(f"{cluster!r} up in {time.perf_counter() - start:.2f} s")

    squares = client.map(square, range(10))                 # futures, computed on the workers
    total = client.submit(sum, squares)                      # futures as arguments: no gather needed
    print("sum of squares:", total.result())

    pairs = [client.submit(slow_add, i, i) for i in range(4)]
    for fut, result in as_completed(pairs, with_results=True):
        print("finished", fut.key, "->", result)

    with client.get_executor() as executor:                  # a concurrent.futures.Executor
        print("executor.map:", list(executor.map(square, [1, 2, 3])))

    bad = client.submit(lambda: 1 / 0)
    try:
        bad.result()
    except ZeroDivisionError as e:
        print("a task's own exception comes back with its type:", repr(e))

    for name, info in cluster.workers.items():
        print(f"{name}: pid {info.pid}, {info.status}, RSS {info.memory / 2**20:.0f} MiB")
