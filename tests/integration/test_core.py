"""The core runtime through real worker processes: the happy path and clear errors."""
from __future__ import annotations

import asyncio
import concurrent.futures as cf
import gc
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time
import weakref

import psutil
import pytest
from _util import block_until, wait_for

import localcluster
from localcluster import Client, LocalCluster, TaskError, as_completed, config, wait
from localcluster.client.future import gateway_of, table_of


def inc(x):
    return x + 1


def add(a, b):
    return a + b


def div(a, b):
    return a / b


def getpid(*_):
    return os.getpid()


class Unpicklable(Exception):
    def __init__(self, a, b):
        super().__init__(a)
        self.lock = threading.Lock()


def raise_unpicklable():
    raise Unpicklable("bad thing", 2)


class BadUnpickle:
    def __reduce__(self):
        return (_boom, ())


def _boom():
    raise RuntimeError("cannot rebuild me")


@pytest.mark.slow
def test_submit_map_gather(client):
    assert client.submit(inc, 1).result(timeout=10) == 2
    assert client.gather(client.map(add, range(50), range(50))) == [2 * i for i in range(50)]
    assert client.submit(lambda x, y=1: x * y, 3, y=4).result(10) == 12


def test_closures_and_lambdas(client):
    k = 7
    def closure(x):
        return x + k
    assert client.submit(closure, 1).result(10) == 8
    assert client.map(lambda x: x * k, [1, 2])[1].result(10) == 14


@pytest.mark.slow
def test_futures_as_arguments_move_between_workers(client):
    xs = client.map(inc, range(20))
    total = client.submit(sum, xs)
    assert total.result(10) == sum(range(1, 21))
    nested = client.submit(lambda d: d["a"][0] + d["b"], {"a": [xs[0]], "b": xs[1]})
    assert nested.result(10) == 3
    pids = set(client.gather(client.map(getpid, range(10), pure=False)))
    assert len(pids) == 2


@pytest.mark.slow
def test_failed_dependency_fails_dependents(client):
    x = client.submit(div, 1, 0)
    y = client.submit(add, x, 10)
    with pytest.raises(ZeroDivisionError):
        y.result(10)
    assert x.status == "error" and y.status == "error"


@pytest.mark.slow
def test_remote_traceback_has_task_frames(client):
    import traceback
    with pytest.raises(ZeroDivisionError) as info:
        client.submit(div, 1, 0).result(10)
    text = "".join(traceback.format_exception(info.value))
    assert "in div" in text and "return a / b" in text


@pytest.mark.slow
def test_gather_skip_errors(client):
    fs = [client.submit(div, 1, d) for d in (1, 0, 2)]
    assert client.gather(fs, errors="skip") == [1.0, 0.5]
    with pytest.raises(ZeroDivisionError):
        client.gather(fs)
    with pytest.raises(ValueError, match="errors"):
        client.gather(fs, errors="ignore")


def test_unpicklable_argument_names_it(client):
    with pytest.raises(TypeError, match=r"could not pickle argument 1 .*lock.* of add\(\)"):
        client.submit(add, 1, threading.Lock())


@pytest.mark.slow
def test_unpicklable_result_names_step_and_worker_survives(client, cluster):
    pids = {i.pid for i in cluster.workers.values()}
    with pytest.raises(TypeError, match=r"pickling the result of task .* failed on worker .*_thread.lock"):
        client.submit(lambda: threading.Lock()).result(10)
    assert client.submit(inc, 41).result(10) == 42
    assert {i.pid for i in cluster.workers.values()} == pids and cluster.deaths == []


@pytest.mark.slow
def test_unpicklable_exception_becomes_task_error(client):
    with pytest.raises(TaskError) as info:
        client.submit(raise_unpicklable).result(10)
    err = info.value
    assert err.type_name.endswith("Unpicklable") and "bad thing" in err.message
    assert "raise_unpicklable" in err.traceback_text
    assert pickle.loads(pickle.dumps(err)).type_name == err.type_name


@pytest.mark.slow
def test_argument_that_fails_to_unpickle_on_worker(client, cluster):
    with pytest.raises(RuntimeError, match="unpickling the arguments of task .*cannot rebuild me"):
        client.submit(lambda x: x, BadUnpickle()).result(10)
    assert cluster.deaths == []


@pytest.mark.parametrize("exc", [SystemExit(3), KeyboardInterrupt()])
@pytest.mark.slow
def test_systemexit_and_keyboardinterrupt_are_task_errors(client, cluster, exc):
    def boom():
        raise exc
    with pytest.raises(TaskError) as info:      # never the caller's own SystemExit / KeyboardInterrupt
        client.submit(boom).result(10)
    assert type(info.value.original) is type(exc)
    assert client.submit(inc, 1).result(10) == 2
    assert cluster.deaths == []


@pytest.mark.slow
def test_pure_keys(client):
    a, b = client.submit(add, 1, 2), client.submit(add, 1, 2)
    assert a.key == b.key and a.key.startswith("add-")
    assert client.submit(add, 1, 3).key != a.key
    c, d = client.submit(add, 1, 2, pure=False), client.submit(add, 1, 2, pure=False)
    assert c.key != d.key
    assert client.submit(add, 1, 2, key="mine").key == "mine"
    assert a.result(10) == b.result(10) == c.result(10) == 3


@pytest.mark.slow
def test_garbage_collected_future_frees_worker_memory(client, cluster):
    import numpy as np
    fut = client.submit(np.ones, 2_000_000)            # 16 MB stays on the worker
    fut.result(10)
    wait_for(lambda: sum(i.managed for i in cluster.workers.values()) >= 16_000_000)
    del fut
    gc.collect()
    wait_for(lambda: sum(i.managed for i in cluster.workers.values()) < 1_000_000)
    assert not cluster.scheduler.tasks


def test_ended_futures_are_counted_not_weakly_held_and_the_last_one_lets_their_key_go(client, cluster):
    """Nothing reaches an ended future again, so the client keeps how many of a key are
    alive instead of a weakref each (80 bytes a task); a future of the key made afterwards
    is still resolved, and the key lives until the last of them goes."""
    a = client.submit(bytes, 4_000_000)          # pure: the same key each time, kept on the worker
    assert len(a.result(30)) == 4_000_000
    wait_for(lambda: weakref.getweakrefcount(a) == 0)  # noqa: F821 - called before the del below
    b = client.submit(bytes, 4_000_000)
    assert b.key == a.key and len(b.result(30)) == 4_000_000
    wait_for(lambda: weakref.getweakrefcount(b) == 0)  # noqa: F821 - called before the del below
    del a
    gc.collect()
    assert client.submit(len, b).result(30) == 4_000_000     # b still holds the data
    del b
    gc.collect()
    wait_for(lambda: not cluster.scheduler.tasks and sum(w.managed for w in cluster.workers.values()) == 0)


@pytest.mark.parametrize("again", ["map", "unpickled"])
def test_a_key_held_by_two_futures_of_one_client_is_let_go_with_the_last(client, cluster, again):
    """Two futures of one key (a pure map over [x, x], or a future pickled and unpickled):
    the client counts once in the key, and lets it go once, with the last of them."""
    if again == "map":
        a, b = client.map(bytes, [4_000_000, 4_000_000])
    else:
        a = client.submit(bytes, 4_000_000)
        b = pickle.loads(pickle.dumps(a))
    assert a.key == b.key and len(b.result(30)) == 4_000_000
    del a
    gc.collect()
    assert client.submit(len, b).result(30) == 4_000_000
    del b
    gc.collect()
    wait_for(lambda: not cluster.scheduler.tasks and sum(w.managed for w in cluster.workers.values()) == 0)


@pytest.mark.slow
def test_large_array_round_trip_is_writable(client):
    np = pytest.importorskip("numpy")
    arr = np.arange(5_000_000, dtype="f8")             # 40 MB: crosses as shared memory
    back = client.submit(lambda a: a * 2, arr).result(20)
    assert back.flags.writeable and back[-1] == arr[-1] * 2
    back[0] = 1.0
    assert client.submit(np.sum, arr).result(20) == arr.sum()


def test_scatter_and_gather(client):
    np = pytest.importorskip("numpy")
    arr = np.arange(1000)
    f = client.scatter(arr)
    assert client.submit(np.sum, f).result(10) == arr.sum()
    many = client.scatter([1, 2, 3])
    assert client.gather(many) == [1, 2, 3]
    d = client.scatter({"a": 1, "b": 2}, broadcast=True)
    assert client.gather(d) == {"a": 1, "b": 2}


@pytest.mark.slow
def test_cancel_pending_dependents(client):
    ev = client.submit(time.sleep, 30)
    dep = client.submit(lambda *_: 1, ev)
    client.cancel([ev])
    assert ev.cancelled() and dep.cancelled()
    with pytest.raises(cf.CancelledError):
        dep.result(10)
    assert client.submit(inc, 1).result(10) == 2


def until(path):
    block_until(path)
    return os.getpid()


@pytest.mark.parametrize("long_task", ["running", "cancelled and running on"])
@pytest.mark.slow
def test_runs_queued_behind_a_long_task_move_to_an_idle_worker(tmp_path, long_task):
    """Prefetch puts runs on a worker ahead of time; one stuck behind a long task (or a
    cancelled one, which runs on: Python cannot interrupt it) is given back to an idle worker."""
    marker = tmp_path / "go"
    with LocalCluster(n_workers=2, threads_per_worker=1, forward_logs=False) as c, Client(c) as cl:
        w0 = sorted(c.workers)[0]
        long = cl.submit(until, str(marker), workers=[w0], pure=False)
        wait_for(lambda: long.key in gateway_of(cl).running_tasks())
        shorts = cl.map(getpid, range(40), pure=False)
        if long_task != "running":
            cl.cancel([long])
        done, not_done = wait(shorts, timeout=20)
        assert not not_done, f"{len(not_done)} runs still wait behind the long task"
        assert {f.result() for f in shorts} >= {c.workers[name].pid for name in c.workers if name != w0}
        marker.touch()
        if long_task == "running":
            assert long.result(30) == c.workers[w0].pid


def late_bytes(path, n):
    block_until(path)
    with open(f"{path}.ended", "w"):
        pass
    return b"old" * n


@pytest.mark.slow
def test_a_cancelled_run_ending_late_leaves_the_result_of_its_key_run_again(tmp_path):
    """Cancelled while running, the first run goes on; the key submitted again runs on the
    other thread and stores its result. The first run ending must not drop that result."""
    marker, n = tmp_path / "go", 1 << 20
    with LocalCluster(n_workers=1, threads_per_worker=2, forward_logs=False) as c, Client(c) as cl:
        first = cl.submit(late_bytes, str(marker), n, key="k")
        wait_for(lambda: "k" in gateway_of(cl).running_tasks())
        cl.cancel([first])
        second = cl.submit(bytes, 3 * n, key="k")
        assert cl.submit(len, second).result(30) == 3 * n
        marker.touch()
        wait_for(lambda: os.path.exists(f"{marker}.ended"))     # and its result is made and dropped now
        assert cl.submit(len, second, pure=False).result(10) == 3 * n      # parked forever if k was dropped
        assert second.result(30) == bytes(3 * n)


@pytest.mark.slow
def test_future_is_a_concurrent_futures_future(client):
    fs = client.map(inc, range(10))
    done, not_done = cf.wait(fs, timeout=10)
    assert len(done) == 10 and not not_done
    assert sorted(f.result() for f in cf.as_completed(client.map(inc, range(5, 10)))) == list(range(6, 11))

    async def main():
        return await asyncio.wrap_future(client.submit(add, 20, 22))
    assert asyncio.run(main()) == 42
    seen = []
    f = client.submit(inc, 1)
    f.add_done_callback(lambda fut: seen.append(fut.result()))
    f.result(10)
    wait_for(lambda: seen == [2])


@pytest.mark.slow
def test_localcluster_wait_and_as_completed(client):
    fs = client.map(inc, range(20))
    done, not_done = wait(fs, timeout=10)
    assert len(done) == 20
    results = sorted(r for _f, r in as_completed(client.map(inc, range(3)), with_results=True))
    assert results == [1, 2, 3]
    ac = as_completed([client.submit(inc, 100)])
    ac.add(client.submit(inc, 200))
    assert sorted(f.result() for f in ac) == [101, 201]
    with pytest.raises(TimeoutError):
        wait([client.submit(time.sleep, 5, pure=False)], timeout=0.05)


@pytest.mark.slow
def test_executor_semantics(client, cluster):
    ex = client.get_executor()
    assert isinstance(ex, cf.Executor)
    assert list(ex.map(add, range(5), range(5))) == [0, 2, 4, 6, 8]
    with pytest.raises(cf.TimeoutError):
        list(ex.map(time.sleep, [0, 5], timeout=0.5))
    assert ex.submit(inc, 1).result(10) == 2
    ex.shutdown(wait=True)
    with pytest.raises(RuntimeError):
        ex.submit(inc, 1)
    assert client.submit(inc, 1).result(10) == 2          # the cluster stays up
    with client.get_executor() as ex2:
        assert ex2.submit(inc, 5).result(10) == 6


def test_get_versions_check_raises_on_mismatch(client, monkeypatch):
    v = client.get_versions(check=True)
    assert v["client"]["localcluster"] == localcluster.__version__
    assert all(w["python"] == v["client"]["python"] for w in v["workers"].values())
    monkeypatch.setattr(localcluster, "__version__", "999")
    with pytest.raises(ValueError, match=r"localcluster: client 999 vs worker-\d 0\.1\.0"):
        client.get_versions(check=True)


@pytest.mark.slow
def test_recreate_error_locally_runs_here(client):
    f = client.submit(div, 1, 0)
    with pytest.raises(ZeroDivisionError):
        f.result(10)
    with pytest.raises(ZeroDivisionError):
        client.recreate_error_locally(f)


@pytest.mark.slow
def test_tasks_may_start_processes_that_die_with_the_worker(client, cluster):
    def start_child():
        import subprocess
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        import multiprocessing
        return p.pid, multiprocessing.current_process().daemon
    child, daemonic = client.submit(start_child).result(20)
    assert daemonic is False and psutil.pid_exists(child)
    pid = next(i.pid for i in cluster.workers.values())
    for info in cluster.workers.values():
        os.kill(info.pid, signal.SIGKILL)
    wait_for(lambda: not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE)
    wait_for(lambda: len(cluster.deaths) == 2 and len(cluster.workers) == 2 and
             all(i.status == "running" for i in cluster.workers.values()))
    assert pid not in {i.pid for i in cluster.workers.values()}


@pytest.mark.slow
def test_no_listening_socket(client, cluster):
    client.submit(inc, 1).result(10)
    procs = [psutil.Process()] + [psutil.Process(i.pid) for i in cluster.workers.values()]
    for p in procs:
        conns = p.net_connections(kind="inet") if hasattr(p, "net_connections") else p.connections(kind="inet")
        assert conns == [], (p.pid, conns)


@pytest.mark.slow
def test_many_clusters_in_a_row_leak_nothing():
    for _ in range(20):
        with LocalCluster(n_workers=1, forward_logs=False) as c, Client(c) as cl:
            assert cl.submit(inc, 1).result(10) == 2


@pytest.mark.slow
def test_client_alone_starts_and_closes_its_cluster():
    with Client(n_workers=1, forward_logs=False) as cl:
        assert cl.submit(inc, 1).result(10) == 2
        cluster = cl.cluster
    assert "closed" in repr(cluster)
    with pytest.raises(RuntimeError, match="closed"):
        cl.submit(inc, 1)


SCRIPT = """
import os, sys, time
sys.path.insert(0, {root!r})
with open({marker!r}, "a") as f:
    f.write("top-level ran\\n")
from localcluster import Client, LocalCluster

def square(x):
    return x * x

client = Client(n_workers=2, forward_logs=False)
print("result", sum(client.gather(client.map(square, range(10)))))
print("pids", *[i.pid for i in client.cluster.workers.values()], flush=True)
{ending}
"""


def _run_script(tmp_path, ending):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    marker = tmp_path / "marker.txt"
    script = tmp_path / "user_script.py"
    script.write_text(SCRIPT.format(root=root, marker=str(marker), ending=ending))
    return script, marker


@pytest.mark.slow
def test_script_without_main_guard_runs_top_level_once(tmp_path):
    script, marker = _run_script(tmp_path, "client.close()")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "result 285" in out.stdout
    assert marker.read_text().count("top-level ran") == 1


@pytest.mark.parametrize("ending", ["os._exit(0)", "os.kill(os.getpid(), 9)", "pass  # no close(): atexit"])
@pytest.mark.slow
def test_workers_never_outlive_the_parent(tmp_path, ending, monkeypatch):
    monkeypatch.setenv("LOCALCLUSTER_LOCAL_DIRECTORY", str(tmp_path / "spill"))
    script, _ = _run_script(tmp_path, ending)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    line = next(l for l in proc.stdout.splitlines() if l.startswith("pids"))
    pids = [int(p) for p in line.split()[1:]]
    assert len(pids) == 2
    wait_for(lambda: not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                             for p in pids), timeout=5)
    # what a killed parent could not remove, the next cluster does
    with LocalCluster(n_workers=0, local_directory=str(tmp_path / "spill")) as c:
        assert os.listdir(tmp_path / "spill") == [os.path.basename(c.local_directory)]


def test_config_precedence(monkeypatch):
    monkeypatch.setenv("LOCALCLUSTER_ALLOWED_FAILURES", "7")
    monkeypatch.setenv("LOCALCLUSTER_THREADS_PER_WORKER", "2")
    with config.set(allowed_failures=5):
        with LocalCluster(n_workers=1, forward_logs=False, threads_per_worker=3) as c:
            assert c.scheduler.allowed_failures == 5
            assert c.threads_per_worker == 3
    with LocalCluster(n_workers=1, forward_logs=False) as c:
        assert c.scheduler.allowed_failures == 7 and c.threads_per_worker == 2


@pytest.mark.parametrize("kwargs, match", [
    ({"n_workers": -1}, r"n_workers=-1 .* integer >= 0"),
    ({"memory_limit": "lots"}, r"memory_limit='lots' .*2GiB"),
    ({"threads_per_worker": 0}, r"threads_per_worker=0"),
    ({"allowed_failures": "x"}, r"allowed_failures='x'"),
    ({"memory_target": 1.5}, r"memory_target=1.5"),
])
def test_bad_values_raise_naming_the_key(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LocalCluster(**kwargs)


def test_unknown_key():
    with pytest.raises(ValueError, match="unknown localcluster config key 'nope'"):
        config.set(nope=1)
    with pytest.raises(ValueError, match="unknown setting 'nope'; known settings: adapt_interval, allowed_failures"):
        LocalCluster(nope=1)


@pytest.mark.parametrize("bad, match", [
    (dict(timeout=-1), "timeout=-1"), (dict(retries=-2), "retries=-2"), (dict(key=3), "key must be a string"),
])
def test_submit_validation(client, bad, match):
    with pytest.raises((ValueError, TypeError), match=match):
        client.submit(inc, 1, **bad)
    with pytest.raises(TypeError, match="callable"):
        client.submit(42)


_THREE = threading.Barrier(3, timeout=30)     # one per worker process: passes once three threads wait in it


def meet_ident(_):
    _THREE.wait()
    return threading.get_ident()


@pytest.mark.slow
def test_threads_per_worker():
    with LocalCluster(n_workers=1, threads_per_worker=3, forward_logs=False) as c, Client(c) as cl:
        assert len(set(cl.gather(cl.map(meet_ident, range(3), pure=False)))) == 3


def test_done_callback_may_fetch_a_large_result(client):
    got = []
    done = threading.Event()
    def cb(fut):
        got.append(len(fut.result()))      # 1 MB stays on the worker: this result() fetches
        done.set()
    f = client.submit(lambda: bytes(1_000_000))
    f.add_done_callback(cb)
    assert done.wait(20) and got == [1_000_000]


@pytest.mark.slow
def test_functions_typed_into_a_repl_work(tmp_path):
    """__main__ without a file (python - < stdin), like a REPL or a notebook cell."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {root!r})
        from localcluster import Client
        def cube(x):
            return x ** 3
        offset = 10
        with Client(n_workers=1, forward_logs=False) as c:
            print("got", c.submit(lambda x: cube(x) + offset, 2).result(30))
    """)
    out = subprocess.run([sys.executable, "-"], input=code, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "got 18" in out.stdout


def pool_square_sum(n):
    import multiprocessing
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        return sum(pool.map(abs, range(-n, 0)))


@pytest.mark.slow
def test_multiprocessing_pool_inside_a_task(client):
    assert client.submit(pool_square_sum, 10).result(60) == 55


@pytest.mark.slow
def test_a_future_pickled_in_the_client_comes_back_attached(client):
    x = client.submit(inc, 1)
    again = pickle.loads(pickle.dumps(x))
    assert again.key == x.key and again.result(10) == 2
    assert client.submit(lambda v: [v], x).result(10) == [2]     # nested futures become values


@pytest.mark.slow
def test_map_over_futures(client):
    xs = client.map(inc, range(10))
    ys = client.map(add, xs, range(10))
    assert client.gather(ys) == [2 * i + 1 for i in range(10)]


@pytest.mark.slow
def test_a_future_pickled_in_the_parent_comes_back_to_its_client(client):
    import gc
    f = client.submit(inc, 41)
    assert f.result(30) == 42
    g = pickle.loads(pickle.dumps(f))
    assert g.key == f.key and g.client is client
    del f
    gc.collect()
    assert g.result(30) == 42 and client.submit(inc, g).result(30) == 43   # still held: g is a reference
    other = Client(client.cluster)
    other.close()
    rebuild, args = g.__reduce__()         # what unpickling calls: with the closed client's id
    assert args == (g.key, client.id)
    with pytest.raises(ValueError, match="not known to a running Client"):
        rebuild(g.key, other.id)


@pytest.mark.slow
def test_a_future_with_a_done_callback_is_freed_with_its_data(client):
    """The callbacks thread must not hold the last future it called back about: its 4 MB
    result stays on the worker until that future is gone."""
    called = threading.Event()
    f = client.submit(bytes, 4_000_000)
    f.add_done_callback(lambda fut: called.set())
    assert called.wait(30) and len(f.result(30)) == 4_000_000
    ref = weakref.ref(f)
    del f
    gc.collect()
    assert ref() is None
    wait_for(lambda: sum(w.managed for w in client.cluster.workers.values()) == 0)


class _SeesCollector:
    """An argument that records, as it is pickled for its task, whether the cyclic GC runs."""
    seen: list = []

    def __init__(self, i):
        self.i = i

    def __reduce__(self):
        _SeesCollector.seen.append(gc.isenabled())
        return (int, (self.i,))


def test_map_pauses_the_cyclic_collector_while_it_makes_tasks_and_restores_it(client):
    _SeesCollector.seen = []
    assert gc.isenabled()
    assert client.gather(client.map(abs, [_SeesCollector(-i) for i in range(50)])) == list(range(50))
    assert _SeesCollector.seen == [False] * 50 and gc.isenabled()
    _SeesCollector.seen = []
    gc.disable()             # the user's choice is kept
    try:
        assert client.gather(client.map(abs, [_SeesCollector(-1)], pure=False)) == [1]
        assert not gc.isenabled()
    finally:
        gc.enable()
    with pytest.raises(TypeError):
        client.map(abs, [(x for x in ())], pure=False)      # unpicklable: fails inside, the collector comes back
    assert gc.isenabled()


def test_a_key_is_let_go_with_its_last_future_and_not_before(monkeypatch):
    from localcluster.client.future import Future
    with LocalCluster(n_workers=0, memory_limit=None, forward_logs=False) as cluster, Client(cluster) as client:
        let_go: list = []
        monkeypatch.setattr(gateway_of(client), "release", let_go.append)
        one = Future("one", client)
        del one
        assert let_go == ["one"]
        three = [Future("three", client) for _ in range(3)]
        two = [Future("two", client) for _ in range(2)]
        for n in (1, 0):
            del three[n]
            assert let_go == ["one"]
        three[0].cycle = three[0]        # the last one goes in a collection
        del three
        gc.collect()
        assert let_go == ["one", "three"]
        two.pop()
        table_of(client).fail_pending(RuntimeError("gone"))     # still found: the one left of "two"
        assert two[0].exception(0).args == ("gone",) and let_go == ["one", "three"]
        del two
        assert let_go == ["one", "three", "two"]


def test_a_result_that_is_itself_a_pickled_payload_comes_back_as_itself(client):
    # a finished Future holds its result's Payload until result() unpickles it: a result
    # that is a Payload must not be taken for one still to unpickle
    from localcluster.wire.protocol import Payload
    fut = client.submit(Payload, b"not a pickle", (), 12)
    got = fut.result(10)
    assert type(got) is Payload and got.meta == b"not a pickle" and fut.result(10) is got


# What only the parent uses: the diagnosis of deaths (and config, concurrent.futures with
# it), shutil (and the compressors), json, psutil. A worker that imports them starts slower.
PARENT_ONLY = ("localcluster.death", "localcluster.config", "concurrent.futures", "shutil", "json", "psutil")


def test_a_worker_starts_without_what_only_the_parent_uses(client):
    probe = f"[m for m in {PARENT_ONLY!r} if m in __import__('sys').modules]"
    assert client.submit(eval, probe, pure=False).result(30) == []


def test_a_path_object_on_sys_path_reaches_the_worker(tmp_path, monkeypatch):
    import pathlib
    (tmp_path / "lc_path_probe.py").write_text("WHERE = 'found'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "path", [pathlib.Path(tmp_path)] + [p for p in sys.path if p != str(tmp_path)])
    with LocalCluster(n_workers=1, forward_logs=False) as c, Client(c) as cl:
        assert cl.submit(eval, "__import__('lc_path_probe').WHERE", pure=False).result(30) == "found"


def test_a_worker_that_cannot_be_started_leaves_nothing_open(monkeypatch, tmp_path):
    """The interpreter is gone (a venv removed under a running notebook): the constructor
    says which path failed; the worker's socket pair, status board and cgroup are closed
    (the fixture checks the descriptors)."""
    missing = str(tmp_path / "no-python")
    monkeypatch.setattr(sys, "executable", missing)
    with pytest.raises(OSError, match="no-python"):
        LocalCluster(n_workers=1, forward_logs=False)


def test_a_first_cluster_starts_without_importing_psutil_in_the_parent():
    """psutil's import was ~25 ms of a script's first cluster (the memory total and the
    workers' children are read from the kernel directly); it stays importable for users."""
    code = ("import sys, localcluster as lc\n"
            "with lc.LocalCluster(n_workers=1, forward_logs=False) as c, lc.Client(c) as cl:\n"
            "    assert cl.submit(abs, -1).result(30) == 1\n"
            "    print(c.memory_limit, 'psutil' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    limit, imported = out.stdout.split()
    assert imported == "False"
    assert 0 < int(limit) <= psutil.virtual_memory().total
