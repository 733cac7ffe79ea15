"""The Client calls real dask programs use (issue 25), through real worker processes:
as_completed's batches, Client.run, fire_and_forget, scheduler_info, who_has, compute and
persist of dask collections, and a deep-copyable Client. The same calls run unchanged
against dask.distributed in tests/external/test_distributed_compat.py."""
from __future__ import annotations

import copy
import os
import time

import pytest

from localcluster import as_completed, wait
from localcluster.client.future import gateway_of


def inc(x):
    return x + 1


def wait_for_file(path, value):
    """A task that runs until the test lets it go (the file appears)."""
    deadline = time.monotonic() + 30
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.005)
    return value


# --- as_completed ----------------------------------------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.slow
def test_as_completed_next_batch_has_ready_and_is_empty(client):
    futures = client.map(inc, range(6))
    wait(futures)
    ac = as_completed(futures)
    assert ac.has_ready() and not ac.is_empty() and ac.count() == 6
    batch = ac.next_batch(block=False)
    assert sorted(f.result() for f in batch) == [1, 2, 3, 4, 5, 6]
    assert ac.is_empty() and not ac.has_ready() and ac.next_batch(block=False) == []
    with pytest.raises(StopIteration):
        ac.next_batch(block=True)


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_as_completed_batches_wait_for_what_is_running(client, tmp_path):
    gate = str(tmp_path / "go")
    slow = client.submit(wait_for_file, gate, "slow", pure=False)
    fast = client.map(inc, range(4))
    ac = as_completed([slow, *fast], with_results=True)
    first = ac.next_batch()          # blocks until at least one is done
    assert first and all(f in fast for f, _ in first)
    wait(fast)
    rest = [] if ac.is_empty() else ac.next_batch(block=False)
    assert ac.count() == 1 and not ac.has_ready()       # the slow one still runs
    open(gate, "w").close()
    batches = list(ac.batches())
    assert batches == [[(slow, "slow")]]
    assert sorted(r for _, r in first + rest) == [1, 2, 3, 4] and ac.is_empty()


def fail(x):
    raise ValueError(f"no {x}")


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_as_completed_batch_stops_before_an_error_and_the_next_call_raises_it(client):
    good, bad = client.submit(inc, 1), client.submit(fail, 1)
    wait([good, bad])
    ac = as_completed([good, bad], with_results=True)
    got = []
    with pytest.raises(ValueError, match="no 1"):
        while True:
            got += ac.next_batch()
    assert got == [(good, 2)] or got == []
    loose = as_completed([good, bad], with_results=True, raise_errors=False)
    results = dict(loose.next_batch(block=False))
    assert results[good] == 2 and isinstance(results[bad], ValueError)


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_as_completed_clear_forgets_running_futures(client, tmp_path):
    gate = str(tmp_path / "go")
    slow = client.map(wait_for_file, [gate] * 2, [1, 2], pure=False)
    ac = as_completed(slow)
    assert ac.count() == 2
    ac.clear()
    assert ac.is_empty() and list(ac) == []
    open(gate, "w").close()
    wait(slow)
    assert not ac.has_ready() and ac.is_empty()      # finishing later does not bring them back


# --- deepcopy ---------------------------------------------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.slow
def test_dask_config_deep_copies_with_client_get_as_scheduler(client):
    dask = pytest.importorskip("dask")
    assert copy.deepcopy(client) is client and copy.copy(client) is client
    with dask.config.set(scheduler=client.get):
        copied = copy.deepcopy(dask.config.config)
        assert copied["scheduler"] == client.get and copied["scheduler"].__self__ is client
        assert dask.delayed(inc)(1).compute() == 2


# --- fire_and_forget ----------------------------------------------------------------------

def write_file(path, text):
    with open(path + ".part", "w") as f:
        f.write(text)
    os.replace(path + ".part", path)        # whole, or not there
    return text


def eventually(check, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "the condition did not come true in time"
        time.sleep(0.01)


@pytest.mark.timeout(60)
@pytest.mark.cluster(n_workers=1)
def test_fire_and_forget_runs_a_queued_task_whose_every_reference_is_dropped(client, tmp_path):
    import gc

    from localcluster import fire_and_forget
    gate, out = str(tmp_path / "go"), str(tmp_path / "out")
    blocker = client.submit(wait_for_file, gate, "blocker", pure=False)    # the one thread is busy
    fut = client.submit(write_file, out, "written", pure=False)            # so this one is queued
    key = fut.key
    fire_and_forget(fut)
    del fut
    gc.collect()
    open(gate, "w").close()
    assert blocker.result(30) == "blocker"
    eventually(lambda: os.path.exists(out))
    with open(out) as f:
        assert f.read() == "written"
    eventually(lambda: key not in client.who_has())       # once ended, nothing holds it: released


# --- who_has and scheduler_info -----------------------------------------------------------

@pytest.mark.timeout(60)
def test_who_has_names_the_workers_holding_each_key(client):
    client.wait_for_workers(2)
    first, second = sorted(client.cluster.workers)
    [x] = client.scatter([list(range(1000))], workers=[first], hash=False)
    y = client.submit(len, "abc", workers=[second], pure=False)
    y.result(30)
    assert client.who_has([x]) == {x.key: (first,)}
    assert client.who_has([y, x]) == {y.key: (second,), x.key: (first,)}
    assert {x.key: (first,), y.key: (second,)}.items() <= client.who_has().items()
    client.replicate([x], n=2)
    assert client.who_has(x) == {x.key: (first, second)}
    pid = client.cluster.workers[first].pid
    os.kill(pid, 9)
    eventually(lambda: first not in client.cluster.workers)
    assert client.who_has([x]) == {x.key: (second,)}


@pytest.mark.timeout(60)
def test_scheduler_info_lists_the_workers_by_name(client):
    import psutil
    client.wait_for_workers(2)
    info = client.scheduler_info()
    assert info["type"] == "Scheduler" and info["n_workers"] == 2 and info["total_threads"] == 2
    assert sorted(info["workers"]) == sorted(client.cluster.workers)
    for name, w in info["workers"].items():
        assert w["name"] == w["id"] == name and w["nthreads"] == 1 and w["status"] == "running"
        assert psutil.Process(w["pid"]).ppid() == os.getpid()
    assert len(client.scheduler_info(n_workers=1)["workers"]) == 1


# --- Client.run ---------------------------------------------------------------------------

def add(x, y=0):
    return x + y


def kill_myself():
    import signal
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.timeout(60)
def test_run_answers_from_every_worker_while_their_task_slots_are_busy(client, tmp_path):
    client.wait_for_workers(2)
    gate = str(tmp_path / "go")
    busy = client.map(wait_for_file, [gate] * 2, [1, 2], pure=False)     # one per worker: every slot taken
    eventually(lambda: len(gateway_of(client).running_tasks()) == 2)
    pids = client.run(os.getpid)
    assert pids == {name: w.pid for name, w in client.cluster.workers.items()}
    first = sorted(pids)[0]
    assert client.run(add, 1, y=5, workers=[first]) == {first: 6}
    assert client.run(add, 2, workers=first) == {first: 2}
    open(gate, "w").close()
    assert client.gather(busy) == [1, 2]


@pytest.mark.timeout(60)
def test_a_long_run_does_not_stop_the_worker_reading_its_channel(client, tmp_path):
    import threading
    client.wait_for_workers(2)
    gate = str(tmp_path / "go")
    answers: list = []
    caller = threading.Thread(target=lambda: answers.append(client.run(wait_for_file, gate, "ran")))
    caller.start()
    # every worker is inside the long function: its reader and task slots still work
    # (well within the 30 s the long function waits for its gate)
    assert client.gather(client.map(add, range(20), pure=False), timeout=15) == list(range(20))
    assert not answers
    open(gate, "w").close()
    caller.join(30)
    assert answers == [{name: "ran" for name in client.cluster.workers}]


@pytest.mark.timeout(60)
def test_run_raises_a_workers_error_as_itself_or_returns_it(client):
    client.wait_for_workers(2)
    with pytest.raises(ValueError, match="invalid literal"):
        client.run(int, "x")
    got = client.run(int, "x", on_error="return")
    assert sorted(got) == sorted(client.cluster.workers)
    assert all(isinstance(e, ValueError) for e in got.values())
    assert client.run(int, "x", on_error="ignore") == {}
    with pytest.raises(ValueError, match="on_error"):
        client.run(int, "1", on_error="warn")
    with pytest.raises(ValueError, match="no running worker is called 'nobody'"):
        client.run(os.getpid, workers=["nobody"])


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_a_worker_that_dies_during_run_answers_killed_worker_naming_the_death(client):
    from localcluster import KilledWorker
    client.wait_for_workers(2)
    victim, other = sorted(client.cluster.workers)
    with pytest.raises(KilledWorker) as info:
        client.run(kill_myself, workers=[victim])
    assert info.value.last_worker == victim and info.value.deaths[0].signal == "SIGKILL"
    assert "kill_myself" in str(info.value) and victim in str(info.value)
    client.wait_for_workers(2)
    got = client.run(os.getpid, on_error="return")
    assert other in got and all(isinstance(p, int) for p in got.values())


# --- compute and persist of dask collections -----------------------------------------------

def double(x):
    return 2 * x


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_compute_turns_dask_collections_into_futures(client):
    dask = pytest.importorskip("dask")
    da = pytest.importorskip("dask.array")
    db = pytest.importorskip("dask.bag")
    dd = pytest.importorskip("dask.dataframe")
    import pandas as pd
    from localcluster import Future
    x = da.ones((40, 40), chunks=10)
    total = client.compute(x.sum())
    assert isinstance(total, Future) and total.result(30) == 1600
    bag = db.from_sequence(range(10), npartitions=3).map(double)
    frame = dd.from_pandas(pd.DataFrame({"a": range(10)}), npartitions=2)
    d = dask.delayed(double)(dask.delayed(sum)([1, 2]))
    # (expression-backed and graph-backed collections apart: together dask warns, as with distributed)
    futures = client.compute([x.mean(), bag, d, 7]) + [client.compute(frame.a.sum())]
    assert [type(f) for f in futures] == [Future] * 3 + [int, Future] and futures[3] == 7
    assert client.gather(futures) == [1.0, [2 * i for i in range(10)], 6, 7, 45]
    assert client.compute([d, [d, 1]], sync=True) == [6, [6, 1]]        # traverse: lists become delayed


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_compute_optimizes_the_graph_as_dask_does_unless_told_not_to(client):
    da = pytest.importorskip("dask.array")
    submitted = []
    original = client.submit
    client.submit = lambda *a, **k: submitted.append(k["key"]) or original(*a, **k)
    x = ((da.ones((8, 8), chunks=2) + 1) * 2).sum()
    assert client.compute(x).result(30) == 256
    fused = len(submitted)
    submitted.clear()
    assert client.compute(x, optimize_graph=False).result(30) == 256
    assert fused < len(submitted)          # blockwise fusion: fewer, bigger tasks


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_persist_gives_the_collection_back_backed_by_futures_on_the_cluster(client):
    dask = pytest.importorskip("dask")
    da = pytest.importorskip("dask.array")
    db = pytest.importorskip("dask.bag")
    from localcluster import Future
    x = da.arange(100, chunks=10) * 2
    [y] = client.persist([x])
    b = client.persist(db.from_sequence(range(6), npartitions=2).map(double))
    assert type(y) is type(x) and y.shape == x.shape and y.chunks == x.chunks
    futures = [v for v in y.__dask_graph__().values() if isinstance(v, Future)]
    assert len(futures) == 10
    client.gather(futures)
    assert set(client.who_has(y)) == {f.key for f in futures}
    assert all(holders for holders in client.who_has(y).values())
    assert y.sum().compute() == 9900           # the client is dask's default scheduler
    assert y.sum().compute(scheduler=client.get) == 9900
    assert client.compute(y.sum()).result(30) == 9900
    assert b.compute() == [0, 2, 4, 6, 8, 10]
    assert client.persist(dask.delayed(double)(4)).compute() == 8


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_wait_takes_a_persisted_collection_as_dask_does(client):
    """It waits for the Futures in the collection's graph; a list of collections too."""
    da = pytest.importorskip("dask.array")
    x = client.persist(da.arange(12, chunks=4) * 2)
    inside = set(x.__dask_graph__().values())
    done, not_done = wait(x, timeout=30)
    assert len(done) == 3 and done <= inside and not not_done
    y = client.persist(da.ones(4, chunks=2))
    done, not_done = wait([x, y], timeout=30)
    assert len(done) == 5 and not not_done
    assert x.sum().compute(scheduler=client.get) == 132
    with pytest.raises(TypeError, match=r"item 1 is int 7, not a Future \(nor a persisted dask collection\)"):
        wait([x, 7])


def die():
    os._exit(3)


@pytest.mark.timeout(60)
@pytest.mark.cluster(allowed_failures=0)
@pytest.mark.slow
def test_wait_for_workers_after_a_killed_worker_waits_for_the_replacement(client):
    """The KilledWorker reaches the caller before the policy forgets the dead worker: a
    wait_for_workers(2) right then must not count it (client.run would then miss one)."""
    import logging

    from localcluster import KilledWorker

    class SlowHandler(logging.Handler):
        """A user's handler that takes its time over the death's log line, which the
        scheduler thread writes between failing the futures and telling the policy."""
        def emit(self, record):
            if "died" in record.getMessage():
                time.sleep(0.5)
    handler, logger = SlowHandler(logging.INFO), logging.getLogger("localcluster")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        client.wait_for_workers(2)
        with pytest.raises(KilledWorker):
            client.submit(die, pure=False).result(30)
        client.wait_for_workers(2)
        assert len(client.run(os.getpid)) == 2
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
