"""The rest of dask's Client API: Future.retry / traceback / type / release, datasets, events,
the task stream, upload_file, worker plugins, actors, rebalance and retire_workers.
localcluster by default, dask.distributed with CLUSTER_BACKEND=distributed; only the import
block differs, and both print the same (tests/external/test_distributed_compat.py).

    python examples/dask_api.py
    CLUSTER_BACKEND=distributed python examples/dask_api.py

Not printed, because the two differ (docs/dask-api.md): worker names, the events' times, a
task stream record's other fields, what becomes of a failed plugin setup in a new worker, and
restart_workers (dask's restarted worker keeps its name; here a fresh one has a new name).
"""
import os
import sys
import tempfile
import threading
import traceback

# --- the only backend-specific block ------------------------------------------------------
if os.environ.get("CLUSTER_BACKEND") == "distributed":
    from distributed import Client, LocalCluster, WorkerPlugin, get_client, get_task_stream, get_worker
    CLUSTER_OPTIONS = {"dashboard_address": None, "processes": True}
else:
    from localcluster import Client, LocalCluster, WorkerPlugin, get_client, get_task_stream, get_worker
    CLUSTER_OPTIONS = {}
# ------------------------------------------------------------------------------------------


def inc(x):
    return x + 1


def fails_once(path):
    if not os.path.exists(path):
        open(path, "w").close()
        raise ValueError("the first run fails")
    return 42


def from_a_task(name):
    client = get_client()
    client.publish_dataset(client.get_dataset(name) * 2, name=f"{name}-doubled")
    get_worker().log_event("from-tasks", {"saw": sorted(client.list_datasets())})
    return sorted(client.list_datasets())


def version_of(module):
    import importlib
    return importlib.import_module(module).VERSION


class Marks(WorkerPlugin):
    """Leaves a file per worker it is set up on."""
    name = "marks"

    def __init__(self, folder):
        self.folder = folder

    def setup(self, worker):
        open(os.path.join(self.folder, f"setup-{os.getpid()}"), "w").close()


def futures(client, folder):
    first = client.submit(fails_once, os.path.join(folder, "ran"))
    second = client.submit(inc, first)
    print("failed", type(second.exception()).__name__, first.status)
    print("traceback", traceback.extract_tb(first.traceback())[-1].name)
    second.retry()
    print("retried", second.result(), first.result(), first.status)
    one = client.submit(inc, 1)
    one.result()
    print("type", one.type.__name__)
    done = client.submit(inc, 10)
    done.result()
    done.release()


def datasets(client):
    other = Client(client.cluster, set_as_default=False)
    answer = other.submit(inc, 41)
    other.publish_dataset(answer=answer, plain=[1, 2])
    del answer
    other.close()
    print("datasets", sorted(client.list_datasets()), client.get_dataset("answer").result())
    print("from a task", client.submit(from_a_task, "plain", pure=False).result(),
          client.get_dataset("plain-doubled"))
    try:
        client.publish_dataset(plain=3)
    except KeyError:
        print("taken: KeyError")
    client.unpublish_dataset("answer")
    print("get a missing one", client.get_dataset("answer", default="the default"), sorted(client.datasets))


def events(client):
    seen, arrived = [], threading.Event()

    def handler(event):
        seen.append(event[1])
        arrived.set()
    client.subscribe_topic("mine", handler)
    for n in range(30):     # dask's subscription reaches its scheduler a while after the call returns
        client.log_event("mine", {"n": n})
        if arrived.wait(1):
            break
    client.unsubscribe_topic("mine")
    mine = [msg for _t, msg in client.get_events("mine")]
    from_tasks = [(list(msg["saw"]), "worker" in msg) for _t, msg in client.get_events("from-tasks")]
    print("events", mine[:1], seen[-1] in mine, from_tasks)


def task_stream(client):
    with get_task_stream(client=client) as ts:
        client.gather(client.map(inc, range(100, 104)))
    print("task stream", len(ts.data), sorted(r["status"] for r in ts.data),
          all(r["startstops"][0]["start"] <= r["startstops"][-1]["stop"] for r in ts.data))


def uploads_and_plugins(client, folder):
    path = os.path.join(folder, "uploaded_mod_d.py")
    for version in (1, 2):
        with open(path, "w") as f:
            f.write(f"VERSION = {version}\n")
        client.upload_file(path)
        print("upload", version, sorted(client.run(version_of, "uploaded_mod_d").values()))
    client.register_plugin(Marks(folder))
    print("plugin set up", len([n for n in os.listdir(folder) if n.startswith("setup-")]))


class Counter:
    n = 0       # dask's actors read an attribute the class declares

    def __init__(self, start):
        self.n = start

    def increment(self, by=1):
        self.n += by
        return self.n


def actors(client):
    counter = client.submit(Counter, 10, actor=True).result()
    # each call awaited before the next: dask runs calls made at once in the order they
    # arrive, which under load is not always the order they were made (localcluster's is)
    print("actor", [counter.increment(by).result() for by in (1, 2, 3)], counter.n)


def workers(client):
    spread = client.map(str, range(6), pure=False)
    client.gather(spread)
    client.rebalance(spread)
    print("rebalanced", client.gather(spread))
    names = sorted(client.scheduler_info()["workers"])
    made = client.map(str, range(4), workers=[names[0]])
    client.gather(made)
    client.retire_workers(workers=[names[0]])
    print("retired", len(client.scheduler_info()["workers"]), names[0] in client.scheduler_info()["workers"],
          client.gather(made))


def main():
    with tempfile.TemporaryDirectory() as folder, \
            LocalCluster(n_workers=3, threads_per_worker=1, **CLUSTER_OPTIONS) as cluster, Client(cluster) as client:
        futures(client, folder)
        datasets(client)
        events(client)
        task_stream(client)
        uploads_and_plugins(client, folder)
        actors(client)
        workers(client)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
