"""The rest of dask's Client API (issue 50): Future.retry / traceback / type / release and
Client.retry; datasets; events; the task stream; dump_cluster_state. examples/dask_api.py
prints the same for each under distributed (tests/external/test_distributed_compat.py); here, what a
one-machine run can check."""
from __future__ import annotations

import itertools
import os
import time
import traceback

import pytest

from _util import wait_for
from localcluster import Client, LocalCluster
from localcluster.client.future import table_of


@pytest.fixture(scope="module")
def shared():
    with LocalCluster(n_workers=2, forward_logs=False) as cluster, Client(cluster) as client:
        client.submit(int, pure=False).result(60)       # the workers are up
        yield client


def inc(x):
    return x + 1


def fails_once(path):
    """Fails the first time it runs (it leaves ``path`` behind), then returns 42."""
    if not os.path.exists(path):
        open(path, "w").close()
        raise ValueError("the first run fails")
    return 42


def test_retry_runs_a_failed_task_and_the_failed_input_again(shared, tmp_path):
    first = shared.submit(fails_once, str(tmp_path / "ran"))
    second = shared.submit(inc, first)
    with pytest.raises(ValueError, match="the first run fails"):
        second.result(30)
    assert first.status == second.status == "error"
    second.retry()      # runs its failed input again first, and tells that input's futures too
    assert second.status == "pending" and first.status == "pending"
    assert second.result(30) == 43 and first.result(30) == 42 and first.status == "finished"
    done = shared.submit(inc, 1)
    assert done.result(30) == 2
    shared.retry([done, first])     # nothing failed: nothing runs again
    assert done.status == "finished" and done.result() == 2


def test_retry_of_a_task_that_fails_again_fails_again(shared, tmp_path):
    fut = shared.submit(fails_once, str(tmp_path / "missing-dir" / "ran"))    # open() fails every time
    assert isinstance(fut.exception(30), FileNotFoundError)
    shared.retry(fut)
    assert isinstance(fut.exception(30), FileNotFoundError) and fut.status == "error"


def test_traceback_is_the_tasks_own_frames(shared, tmp_path):
    fut = shared.submit(fails_once, str(tmp_path / "ran"))
    lines = traceback.format_tb(fut.traceback(timeout=30))
    assert len(lines) == 1 and "fails_once" in lines[0] and 'raise ValueError("the first run fails")' in lines[0]
    ok = shared.submit(inc, 1)
    assert ok.traceback(30) is None


def test_type_is_the_results_type_once_finished(shared, tmp_path):
    small = shared.submit(inc, 1)
    big = shared.submit(bytes, 8 << 20)        # left on its worker: its type is read there
    failed = shared.submit(fails_once, str(tmp_path / "ran"))
    for fut in (small, big, failed):
        fut.exception(30)
    assert (small.type, big.type, failed.type) == (int, bytes, None)
    assert table_of(shared).state(big.key).needs_fetch()       # not fetched for it


def test_release_lets_go_of_the_key_at_once(shared):
    fut = shared.submit(inc, 10)
    fut.result(30)
    key = fut.key
    assert key in shared.who_has()
    fut.release()
    fut.release()           # once only: the key is not let go of twice
    wait_for(lambda: key not in shared.who_has())       # freed on the scheduler's next turn
    del fut                 # garbage collection does not let go of it again
    again = shared.submit(inc, 10)
    assert again.result(30) == 11 and again.key == key


# --- datasets -------------------------------------------------------------------------------

def publish_from_task(name):
    from localcluster import get_client
    client = get_client()
    client.publish_dataset(client.get_dataset(name).result() * 2, name=f"{name}-doubled")
    return sorted(client.list_datasets(), key=str)


def test_a_dataset_holds_its_futures_for_every_client(shared):
    other = Client(shared.cluster, set_as_default=False)
    try:
        fut = other.submit(inc, 41)
        other.publish_dataset(answer=fut, plain=[1, 2])
        key = fut.key
        del fut
        other.close()           # its futures are gone; the dataset holds the key
        assert sorted(shared.list_datasets()) == ["answer", "plain"]
        got = shared.get_dataset("answer")
        assert got.key == key and got.result(30) == 42 and shared.get_dataset("plain") == [1, 2]
        assert shared.submit(publish_from_task, "answer").result(30) == ["answer", "answer-doubled", "plain"]
        assert shared.get_dataset("answer-doubled") == 84
        with pytest.raises(KeyError, match="Dataset 'plain' already exists.*override=True"):
            shared.publish_dataset(plain=3)
        shared.publish_dataset(3, name="plain", override=True)
        assert shared.datasets["plain"] == 3 and "plain" in shared.datasets and len(shared.datasets) == 3
        del got
        shared.unpublish_dataset("answer")
        wait_for(lambda: key not in shared.who_has())       # nothing holds it any more
        with pytest.raises(KeyError, match="Dataset 'answer' not found"):
            shared.get_dataset("answer")
        assert shared.get_dataset("answer", default=None) is None
        shared.datasets["by-item"] = 5
        del shared.datasets["by-item"], shared.datasets["plain"]
        shared.unpublish_dataset("never-published")     # as in dask: nothing to do
        assert list(shared.datasets) == ["answer-doubled"]
        with pytest.raises(ValueError, match="names each dataset"):
            shared.publish_dataset(1)
    finally:
        other.close()
        for name in shared.list_datasets():
            shared.unpublish_dataset(name)


# --- events ---------------------------------------------------------------------------------

def log_from_task(x):
    from localcluster import get_client, get_worker
    get_worker().log_event("from-tasks", {"x": x})
    return len(get_client().get_events("from-tasks"))


def test_events_from_the_client_and_from_tasks(shared):
    import threading
    seen, arrived = [], threading.Event()

    def handler(event):
        seen.append(event)
        if len(seen) == 3:
            arrived.set()
    shared.log_event("from-tasks", "before")        # logged before the subscription: not handed to it
    shared.subscribe_topic("from-tasks", handler)
    try:
        assert shared.submit(log_from_task, 1).result(30) == 2
        shared.log_event(["from-tasks", "other"], {"x": 2})
        shared.log_event("from-tasks", {"x": 3})
        assert arrived.wait(30)
    finally:
        shared.unsubscribe_topic("from-tasks")
    events = shared.get_events("from-tasks")
    worker = events[1][1]["worker"]         # a worker's event names it, as dask's
    assert worker in shared.cluster.workers
    assert [msg for _t, msg in events] == ["before", {"x": 1, "worker": worker}, {"x": 2}, {"x": 3}]
    assert seen == list(events[1:])
    assert all(a <= b for (a, _), (b, _) in zip(events, events[1:]))       # times, in order
    assert shared.get_events("other") == ((events[2][0], {"x": 2}),) and shared.get_events("nothing") == ()
    assert {"from-tasks", "other"} <= set(shared.get_events())
    shared.log_event("from-tasks", "after")        # unsubscribed: the handler is not called
    assert len(seen) == 3
    with pytest.raises(TypeError, match="expected a topic name"):
        shared.log_event(3, "x")


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_worker_death_is_an_event_with_its_cause():
    import signal
    import threading
    with LocalCluster(n_workers=1, forward_logs=False) as cluster, Client(cluster) as client:
        name, pid = next((w.name, w.pid) for w in cluster.workers.values())
        told = threading.Event()
        client.subscribe_topic(name, lambda event: told.set())
        os.kill(pid, signal.SIGKILL)
        assert told.wait(30)
        [(when, msg)] = client.get_events(name)
        assert client.get_events("all") == ((when, msg),)
        assert msg["action"] == "remove-worker" and msg["worker"] == name and msg["cause"] == "signal"
        assert msg["signal"] == "SIGKILL" and msg["expected"] is False and msg["death"] == cluster.deaths[-1]
        assert msg["message"] == cluster.deaths[-1].message


# --- the task stream and dump_cluster_state -------------------------------------------------

def test_task_stream_as_a_block_and_as_a_call(shared, tmp_path):
    from localcluster import get_task_stream
    shared.gather(shared.map(inc, range(3)))            # before the block: not in it
    with get_task_stream() as ts:
        done = shared.map(inc, range(100, 104))
        shared.gather(done)
        failed = shared.submit(fails_once, str(tmp_path / "ran"))
        failed.exception(30)
    assert sorted(r["key"] for r in ts.data) == sorted([f.key for f in done] + [failed.key])
    for r in ts.data:
        [span] = r["startstops"]
        assert span["action"] == "compute" and span["start"] <= span["stop"]
        assert r["worker"] in shared.cluster.workers and r["thread"] == 1
    by_key = {r["key"]: r for r in ts.data}
    assert by_key[failed.key]["status"] == "error" and "nbytes" not in by_key[failed.key]
    assert all(by_key[f.key]["status"] == "OK" and by_key[f.key]["nbytes"] > 0 for f in done)
    everything = shared.get_task_stream()
    assert everything[-5:] == ts.data and len(everything) >= 8
    assert shared.get_task_stream(count=2) == ts.data[-2:] and shared.get_task_stream(count=0) == []
    newest = max(s["stop"] for r in ts.data for s in r["startstops"])
    assert shared.get_task_stream(start=newest) == [r for r in everything if r["startstops"][0]["stop"] >= newest]
    assert shared.get_task_stream(start="2 min") == everything and shared.get_task_stream(stop=0) == []
    with pytest.raises(NotImplementedError, match="localcluster.report"):
        shared.get_task_stream(plot=True)
    assert shared.nbytes(done, summary=False) == {f.key: by_key[f.key]["nbytes"] for f in done}
    assert shared.nbytes(done) == {"inc": sum(by_key[f.key]["nbytes"] for f in done)}


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_dump_cluster_state_tells_a_post_mortem(tmp_path):
    import json
    import signal
    with LocalCluster(n_workers=1, forward_logs=False) as cluster, Client(cluster) as client:
        failed = client.submit(fails_once, str(tmp_path / "nowhere" / "ran"))
        failed.exception(30)
        kept = client.submit(inc, 1)
        kept.result(30)
        client.log_event("mine", {"a": 1})
        name, pid = next((w.name, w.pid) for w in cluster.workers.values())
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: cluster.deaths and client.get_events(name))
        path = client.dump_cluster_state(str(tmp_path / "dump"))
        assert path == str(tmp_path / "dump.json")
        with open(path) as f:
            state = json.load(f)
        assert list(state) == ["localcluster", "time", "cluster", "workers", "tasks", "transitions", "deaths",
                               "task-stream", "events", "logs"]
        assert state["tasks"][failed.key]["state"] == "erred"
        assert state["tasks"][failed.key]["error"]["type"] == "FileNotFoundError"
        # the result lived on the dead worker only: computed again (waiting, ready...) or back in memory
        assert state["tasks"][kept.key]["dependencies"] == [] and kept.key in {t[0] for t in state["transitions"]}
        [death] = state["deaths"]
        assert death["cause"] == "signal" and death["signal"] == "SIGKILL" and death["worker"] == name
        assert death["message"] == cluster.deaths[0].message and "log_tail" in death and "stack" in death
        assert {r["key"] for r in state["task-stream"]} >= {failed.key, kept.key}
        assert state["events"]["mine"][0][1] == {"a": 1} and state["events"][name][0][1]["cause"] == "signal"
        assert name in state["logs"] and state["cluster"]["config"]["n_workers"] == 1
        smaller = client.dump_cluster_state(str(tmp_path / "small"), exclude=["logs", "task-stream"])
        with open(smaller) as f:
            assert "logs" not in json.load(f)
        with pytest.raises(ValueError, match="the sections are"):
            client.dump_cluster_state(str(tmp_path / "x"), exclude=["nothing"])


# --- upload_file and worker plugins ---------------------------------------------------------

def version_of(module):
    import importlib
    return importlib.import_module(module).VERSION


def test_upload_file_replaces_a_module_on_every_worker(shared, tmp_path):
    import zipfile
    source = tmp_path / "uploaded_mod_a.py"
    source.write_text("VERSION = 1\n")
    shared.upload_file(str(source))
    assert shared.run(version_of, "uploaded_mod_a") == {name: 1 for name in shared.cluster.workers}
    source.write_text("VERSION = 2\n")          # the same size: its compiled copy is not reused
    shared.upload_file(str(source))
    assert shared.run(version_of, "uploaded_mod_a") == {name: 2 for name in shared.cluster.workers}
    assert shared.gather(shared.map(version_of, ["uploaded_mod_a"] * 4, pure=False)) == [2] * 4
    package = tmp_path / "uploaded_pkg.zip"
    with zipfile.ZipFile(package, "w") as z:
        z.writestr("uploaded_pkg_b/__init__.py", "VERSION = 'zip 1'\n")
    shared.upload_file(str(package))
    assert shared.submit(version_of, "uploaded_pkg_b", pure=False).result(30) == "zip 1"
    with zipfile.ZipFile(package, "w") as z:
        z.writestr("uploaded_pkg_b/__init__.py", "VERSION = 'zip 2'\n")
    shared.upload_file(str(package))
    assert set(shared.run(version_of, "uploaded_pkg_b").values()) == {"zip 2"}
    with pytest.raises(ValueError, match=r"expected a \.py, \.egg, \.zip, \.whl or \.pyz file"):
        shared.upload_file(str(tmp_path / "notes.txt"))


class Recorder:
    """A worker plugin by dask's protocol (no base class): what it saw, in files of ``folder``."""

    def __init__(self, folder, name="recorder"):
        self.folder, self.name = str(folder), name

    def setup(self, worker):
        with open(os.path.join(self.folder, f"setup-{worker.name}"), "w") as f:
            f.write(str(os.getpid()))

    def teardown(self, worker):
        open(os.path.join(self.folder, f"teardown-{worker.name}"), "w").close()

    def transition(self, key, start, finish, **kwargs):
        with open(os.path.join(self.folder, f"transitions-{os.getpid()}"), "a") as f:
            f.write(f"{key} {start} {finish}\n")


def test_a_plugin_runs_on_every_worker_and_is_replaced_by_name(shared, tmp_path):
    from localcluster import WorkerPlugin
    names = sorted(shared.cluster.workers)
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    assert shared.register_plugin(Recorder(first)) == {name: {"status": "OK"} for name in names}
    assert sorted(os.listdir(first)) == [f"setup-{name}" for name in names]
    fut = shared.submit(inc, 7, workers=names[0])
    fut.result(30)
    transitions = first / f"transitions-{shared.cluster.workers[names[0]].pid}"
    wait_for(lambda: transitions.exists() and len(transitions.read_text().splitlines()) == 2)
    assert transitions.read_text().splitlines() == [f"{fut.key} ready executing", f"{fut.key} executing memory"]
    shared.register_plugin(Recorder(second))       # the same name: the first is torn down, replaced
    assert sorted(os.listdir(first)) == sorted([f"setup-{n}" for n in names] + [f"teardown-{n}" for n in names]
                                               + [transitions.name])
    assert sorted(os.listdir(second)) == [f"setup-{name}" for name in names]
    shared.unregister_worker_plugin("recorder")
    assert sorted(os.listdir(second)) == sorted([f"setup-{n}" for n in names] + [f"teardown-{n}" for n in names])
    with pytest.raises(ValueError, match="The worker plugin 'recorder' does not exist"):
        shared.unregister_worker_plugin("recorder")

    class Refuses(WorkerPlugin):
        name = "refuses"

        def setup(self, worker):
            raise RuntimeError(f"not on {worker.name}")
    with pytest.raises(RuntimeError, match="not on worker-"):
        shared.register_plugin(Refuses())
    shared.unregister_worker_plugin("refuses")
    with pytest.raises(TypeError, match="takes a worker plugin"):
        shared.register_plugin(object())


def fails_where(marker):
    """A plugin class whose setup fails once ``marker`` exists (made in a test's process)."""
    from localcluster import WorkerPlugin

    class FailsLater(WorkerPlugin):
        name = "fails-later"

        def setup(self, worker):
            if os.path.exists(marker):
                raise RuntimeError("this plugin refuses the new worker")
    return FailsLater()


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_a_replacement_worker_runs_the_plugins_and_uploads(tmp_path):
    import signal
    from localcluster import WorkerStartupError
    source = tmp_path / "uploaded_mod_c.py"
    source.write_text("VERSION = 'c'\n")
    with LocalCluster(n_workers=1, forward_logs=False) as cluster, Client(cluster) as client:
        client.upload_file(str(source))
        client.register_plugin(Recorder(tmp_path))
        [(old, pid)] = [(w.name, w.pid) for w in cluster.workers.values()]
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: cluster.workers and old not in cluster.workers)
        client.wait_for_workers(1, 30)
        [new] = cluster.workers
        assert (tmp_path / f"setup-{new}").read_text() == str(cluster.workers[new].pid)
        assert client.submit(version_of, "uploaded_mod_c").result(30) == "c"
        cluster.scale(0)        # a clean exit: the plugin's teardown runs
        wait_for(lambda: not cluster.workers)
        assert (tmp_path / f"teardown-{new}").exists()
        cluster.scale(1)
        client.wait_for_workers(1, 30)
        [new] = cluster.workers
        # a setup that raises in a new worker: a start-up failure, told with the traceback
        marker = tmp_path / "refuse"
        client.register_plugin(fails_where(str(marker)))
        marker.touch()
        os.kill(cluster.workers[new].pid, signal.SIGKILL)
        with pytest.raises(WorkerStartupError, match=r"(?s)this plugin refuses the new worker.*worker plugin's setup"):
            client.submit(inc, 1, pure=False).result(60)
        last = cluster.deaths[-1]
        assert last.cause == "exception" and "worker plugin's setup" in last.message
        assert any("this plugin refuses the new worker" in line for line in last.log_tail)


# --- retire_workers, restart_workers ---------------------------------------------------------

def large(i):
    return str(i) * 300_000


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_retire_hands_the_data_on_and_restart_recomputes_it():
    with LocalCluster(n_workers=3, forward_logs=False) as cluster, Client(cluster) as client:
        first, second, third = sorted(cluster.workers)
        made = client.map(large, range(6), workers=[first])     # kept on the worker, not in this process
        client.gather(made)
        scattered = client.scatter(bytes(300_000), workers=[first])
        runs = len(client.get_task_stream())
        retired = client.retire_workers(workers=[first])
        assert list(retired) == [first] and retired[first]["name"] == first
        assert sorted(cluster.workers) == [second, third] and cluster.deaths[-1].cause == "requested"
        assert client.gather(made) == [large(i) for i in range(6)] and scattered.result(30) == bytes(300_000)
        assert len(client.get_task_stream()) == runs          # handed on: nothing was computed again
        assert set(client.who_has(made + [scattered]).values()) <= {(second,), (third,)}
        holder = client.who_has([made[0]])[made[0].key][0]
        assert client.restart_workers([holder]) == {holder: "OK"}
        assert holder not in cluster.workers and len(cluster.workers) == 2
        assert cluster.deaths[-1].cause == "requested" and cluster.deaths[-1].worker == holder
        assert client.gather(made) == [large(i) for i in range(6)]     # what it held is computed again
        with pytest.raises(ValueError, match="names the workers to let go"):
            client.retire_workers()
        with pytest.raises(ValueError, match="no running worker is called"):
            client.restart_workers([first])


# --- the smaller names ----------------------------------------------------------------------

def mark_worker(folder, dask_worker):
    open(os.path.join(folder, dask_worker.name), "w").close()


def test_as_current_register_worker_callbacks_and_the_rest(shared, tmp_path):
    import functools
    from localcluster import get_client
    other = Client(shared.cluster)          # made last: the current one
    try:
        assert get_client() is other and Client.current() is other
        with shared.as_current() as same:
            assert same is shared and get_client() is shared and Client.current() is shared
        assert get_client() is other
    finally:
        other.close()
    shared.register_worker_callbacks(functools.partial(mark_worker, str(tmp_path)))
    assert sorted(os.listdir(tmp_path)) == sorted(shared.cluster.workers)
    assert shared.register_worker_callbacks() == {}
    fut = shared.submit(inc, 1)
    assert shared.futures_of([fut, {"x": fut}]) == [fut] and fut.executor is shared
    assert shared.start() is None and shared.asynchronous is False and shared.dashboard_link is None


# --- actors ---------------------------------------------------------------------------------

class Counter:
    def __init__(self, start=0):
        self.n = start

    def increment(self, by=1):
        self.n += by
        return self.n

    def pid(self):
        return os.getpid()


def increment_from_a_task(counter):
    return counter.increment(10).result()


def test_an_actor_keeps_its_state_on_its_worker(shared):
    fut = shared.submit(Counter, 5, actor=True)
    counter = fut.result(30)
    assert counter.increment().result(30) == 6
    calls = [counter.increment(2) for _ in range(5)]        # one at a time on the live object
    assert sorted(c.result(30) for c in calls) == [8, 10, 12, 14, 16] and counter.n == 16
    assert shared.submit(increment_from_a_task, counter).result(30) == 26 and counter.n == 26
    assert counter.pid().result(30) in {w.pid for w in shared.cluster.workers.values()}
    with pytest.raises(AttributeError, match="nothing"):
        counter.nothing        # noqa: B018 - read there, raised here
    with pytest.raises(NotImplementedError, match="actors"):
        shared.map(Counter, [1], actor=True)


def _late_int(value, delay):
    time.sleep(delay)
    return value


class LateInt:
    """An int that takes ``delay`` seconds to unpickle: a call made earlier is readied later."""

    def __init__(self, value, delay):
        self.value, self.delay = value, delay

    def __reduce__(self):
        return _late_int, (self.value, self.delay)


def test_an_actors_calls_run_in_the_order_they_were_made(shared):
    """As dask's: each call sees the ones made before it, however long each takes to get
    ready (each used to run on a thread of its own: the one made last, readied first, took
    the actor first)."""
    counter = shared.submit(Counter, 0, actor=True).result(30)
    calls = [counter.increment(by) for by in range(1, 31)]
    calls += [counter.increment(LateInt(by, (41 - by) * 0.01)) for by in range(31, 41)]
    assert [c.result(30) for c in calls] == list(itertools.accumulate(range(1, 41)))
    assert counter.n == 820


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_an_actors_worker_death_fails_its_calls_with_that_death():
    import signal
    from localcluster import KilledWorker
    with LocalCluster(n_workers=2, forward_logs=False) as cluster, Client(cluster) as client:
        counter = client.submit(Counter, actor=True).result(30)
        pid = counter.pid().result(30)
        runs = len(client.get_task_stream())
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: cluster.deaths)
        with pytest.raises(KilledWorker, match=r"(?s)actor .*increment\(\).*signal, SIGKILL") as raised:
            counter.increment().result(30)
        assert raised.value.deaths == (cluster.deaths[-1],)
        with pytest.raises(KilledWorker, match="signal, SIGKILL"):
            counter.n       # noqa: B018
        assert len(client.get_task_stream()) == runs        # the actor is not made again elsewhere


def test_rebalance_spreads_the_data_evenly(shared):
    first, second = sorted(shared.cluster.workers)
    made = shared.map(large, range(6), workers=[first])
    shared.gather(made)
    before = shared.who_has(made)
    assert set(before.values()) == {(first,)}
    shared.rebalance(made)
    after = shared.who_has(made)
    held = [names[0] for names in after.values()]
    assert all(len(names) == 1 for names in after.values()) and sorted(held).count(first) == 3
    assert shared.gather(made) == [large(i) for i in range(6)]
    shared.rebalance(made, workers=[second])        # over one worker: nothing to move
    assert shared.who_has(made) == after


def test_a_plugin_of_distributeds_is_taken_and_its_nanny_plugin_refused(shared, tmp_path):
    distributed = pytest.importorskip("distributed")

    class Marks(distributed.WorkerPlugin):
        name = "dask-marks"

        def __init__(self, folder):
            self.folder = folder

        def setup(self, worker):
            open(os.path.join(self.folder, worker.name), "w").close()
    shared.register_plugin(Marks(str(tmp_path)))
    try:
        assert sorted(os.listdir(tmp_path)) == sorted(shared.cluster.workers)
    finally:
        shared.unregister_worker_plugin("dask-marks")
    with pytest.raises(NotImplementedError, match="NannyPlugin.*a thread of this"):
        shared.register_plugin(distributed.NannyPlugin())
