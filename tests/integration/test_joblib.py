"""joblib's Parallel and scikit-learn's n_jobs on the cluster, through the "localcluster"
backend, with real workers: results, data of real sizes, deaths and errors."""
from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from localcluster import Client, KilledWorker, LocalCluster

joblib = pytest.importorskip("joblib")
np = pytest.importorskip("numpy")
import localcluster.joblib  # noqa: E402 - registers the backend
from localcluster.client.future import gateway_of  # noqa: E402

# joblib 1.3 (the oldest the joblib extra allows) has no "generator_unordered"
UNORDERED = "generator_unordered" if tuple(int(p) for p in joblib.__version__.split(".")[:2]) >= (1, 4) else "generator"


def where(x):
    return x * x, os.getpid()


def scale(a, k):
    return a * k


def crash():
    return ctypes.string_at(0)


def fails(x):
    if x == 3:
        raise ValueError("three is not allowed")
    return x


def nap(seconds):
    time.sleep(seconds)
    return seconds


def held_until(gate, x):
    """``x`` once ``gate`` (a localcluster.Event) is set; bounded, so a broken test fails, never hangs."""
    return x, gate.wait(30)


def nested(x):
    """A Parallel call inside a task: which backend it gets, and where its calls ran."""
    backend, _ = joblib.parallel.get_active_backend()
    inner = joblib.Parallel(n_jobs=2)(joblib.delayed(where)(i) for i in range(4))
    return type(backend).__name__, os.getpid(), {pid for _, pid in inner}


def _children() -> set:
    return {p.pid for p in psutil.Process().children(recursive=True)}


@pytest.mark.slow
def test_parallel_runs_on_the_given_client(client):
    worker_pids = {w.pid for w in client.cluster.workers.values()}
    with joblib.parallel_config(backend="localcluster", client=client):
        assert joblib.effective_n_jobs(-1) == 2              # 2 workers x 1 thread
        out = joblib.Parallel()(joblib.delayed(where)(i) for i in range(200))
    assert [v for v, _ in out] == [i * i for i in range(200)]
    assert {pid for _, pid in out} == worker_pids        # both workers, never this process


@pytest.mark.slow
def test_parallel_uses_the_current_client_by_default(client):
    assert Client.current() is client
    with joblib.parallel_config(backend="localcluster"):
        out = joblib.Parallel(n_jobs=-1, return_as=UNORDERED)(
            joblib.delayed(where)(i) for i in range(20))
        out = sorted(out)
    assert [v for v, _ in out] == [i * i for i in range(20)]
    assert {pid for _, pid in out} <= {w.pid for w in client.cluster.workers.values()}


@pytest.mark.slow
def test_parallel_without_a_client_starts_one_and_stops_it():
    assert Client.current(allow_none=True) is None
    before = _children()
    with joblib.parallel_config(backend="localcluster"):
        assert joblib.effective_n_jobs(-1) >= 2
        assert _children() == before, "asking for n_jobs must not start a cluster nobody stops"
        out = joblib.Parallel(n_jobs=2)(joblib.delayed(where)(i) for i in range(10))
        assert Client.current(allow_none=True) is None       # closed with the Parallel call
    assert [v for v, _ in out] == [i * i for i in range(10)] and os.getpid() not in {p for _, p in out}
    alive = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    assert not alive, f"the backend's own workers outlived the Parallel call: {alive}"


@pytest.mark.slow
def test_multi_megabyte_arrays_through_joblib(client):
    arrays = [np.full(2**19, float(i)) for i in range(6)]            # 4 MiB each
    with joblib.parallel_config(backend="localcluster", client=client):
        out = joblib.Parallel(n_jobs=2)(joblib.delayed(scale)(a, 2) for a in arrays)
    assert [o.nbytes for o in out] == [4 * 2**20] * 6 and [o[-1] for o in out] == [2.0 * i for i in range(6)]


@pytest.mark.slow
def test_a_batch_is_handed_to_joblib_as_it_finishes(client):
    """Callback-based retrieval (joblib's ``supports_retrieve_callback``): each batch's
    done-callback gives joblib its results as the batch ends; joblib's own thread never
    fetches them. Unordered, the first result comes out while the other batch is still
    held on the worker, until the test lets it go."""
    backend = localcluster.joblib.LocalClusterBackend(client=client)
    assert backend.supports_retrieve_callback
    gate = localcluster.Event(client=client)
    with joblib.parallel_config(backend=backend):
        out = joblib.Parallel(n_jobs=2, batch_size=1, return_as=UNORDERED)(
            [joblib.delayed(held_until)(gate, "held"), joblib.delayed(where)(3)])
        first = next(out)
        assert first[0] == 9, "the finished batch waited for the held one"
        gate.set()
        assert list(out) == [("held", True)]


@pytest.mark.slow
def test_batches_are_the_arguments_of_one_function_not_functions_of_their_own(client):
    """A batch as the task's function was pickled in the stream, its arrays copied and
    framed with it, and each worker kept every one it ran for good, as it keeps functions
    (issue 53). As the argument of one shared function, its arrays travel out of band and go
    with the task."""
    arrays = [np.full(2**17, float(i)) for i in range(6)]            # 1 MiB each
    workers = client.cluster.scheduler.workers
    before = {name: set(ws.fns) for name, ws in workers.items()}
    with joblib.parallel_config(backend="localcluster", client=client):
        out = joblib.Parallel(n_jobs=2, batch_size=1)(joblib.delayed(scale)(a, 2) for a in arrays)
    assert [o[-1] for o in out] == [2.0 * i for i in range(6)]
    assert all(len(ws.fns - before[name]) <= 1 for name, ws in workers.items()), \
        {name: len(ws.fns - before[name]) for name, ws in workers.items()}


@pytest.mark.slow
def test_a_task_error_is_raised_as_itself_with_its_worker_traceback(client):
    with joblib.parallel_config(backend="localcluster", client=client):
        with pytest.raises(ValueError, match="three is not allowed") as info:
            joblib.Parallel(n_jobs=2)(joblib.delayed(fails)(i) for i in range(8))
    cause = info.value.__cause__
    assert isinstance(cause, localcluster.RemoteTraceback)
    assert "in fails" in str(cause) and 'raise ValueError("three is not allowed")' in str(cause)


@pytest.mark.slow
def test_a_segfault_is_our_killed_worker_with_its_cause():
    """Even with a single worker thread (joblib would run n_jobs=1 in this very process)."""
    with LocalCluster(n_workers=1, allowed_failures=0, forward_logs=False) as cluster, Client(cluster) as client:
        with joblib.parallel_config(backend="localcluster", client=client):
            with pytest.raises(KilledWorker) as info:
                joblib.Parallel()(joblib.delayed(crash)() for _ in range(2))
    death = info.value.deaths[-1]
    assert death.cause == "crash" and death.signal == signal.SIGSEGV.name and "in crash" in death.stack
    assert info.value.task.startswith("crash-")
    assert "SIGSEGV" in str(info.value) and "crash" in str(info.value)


def test_a_timeout_cancels_the_rest(client):
    with joblib.parallel_config(backend="localcluster", client=client):
        with pytest.raises(multiprocessing.TimeoutError):         # joblib's own choice of TimeoutError
            joblib.Parallel(timeout=0.3)(joblib.delayed(nap)(s) for s in [0.01, 5, 5, 0.01])
    assert gateway_of(client).running_tasks() == {}


@pytest.mark.slow
def test_nested_parallel_runs_sequentially_on_the_worker(client):
    with joblib.parallel_config(backend="localcluster", client=client):
        out = joblib.Parallel()(joblib.delayed(nested)(i) for i in range(4))
    workers = {w.pid for w in client.cluster.workers.values()}
    for backend, pid, inner_pids in out:
        assert backend == "SequentialBackend" and pid in workers and inner_pids == {pid}


@pytest.mark.slow
def test_functions_defined_in_main():
    """A script's own functions (and lambdas) are pickled by value: workers cannot import __main__."""
    script = (
        "import joblib, localcluster.joblib\n"
        "from localcluster import Client, LocalCluster\n"
        "def square(x):\n"
        "    return x * x\n"
        "with LocalCluster(n_workers=2, forward_logs=False) as cluster, Client(cluster) as client:\n"
        "    with joblib.parallel_config(backend='localcluster', client=client):\n"
        "        print(sum(joblib.Parallel()(joblib.delayed(square)(i) for i in range(50))),\n"
        "              sum(joblib.Parallel()(joblib.delayed(lambda x: x + 1)(i) for i in range(50))))\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=50)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [str(sum(i * i for i in range(50))), str(sum(range(1, 51)))]


@pytest.mark.slow
def test_scikit_learn_grid_search_on_the_cluster(client):
    pytest.importorskip("sklearn")
    from sklearn.datasets import load_iris
    from sklearn.model_selection import GridSearchCV
    from sklearn.svm import SVC

    X, y = load_iris(return_X_y=True)
    grid = {"C": [0.1, 1, 10], "kernel": ["linear", "rbf"]}       # 6 candidates x 3 folds
    serial = GridSearchCV(SVC(), grid, cv=3, n_jobs=1).fit(X, y)
    before = len(client.cluster.history.tasks())
    with joblib.parallel_config(backend="localcluster", client=client):
        search = GridSearchCV(SVC(), grid, cv=3, n_jobs=-1).fit(X, y)
    assert search.best_params_ == serial.best_params_ and search.best_score_ == serial.best_score_
    # The real signal: the cluster's own record of the tasks it ran, where, and how they ended.
    ran = client.cluster.history.tasks()[before:]
    assert len(ran) >= 2 and all(r.key.startswith("_fit_and_score-") for r in ran)
    assert {r.worker for r in ran} == set(client.cluster.workers)      # the fits ran on both workers
    assert all(r.status == "finished" for r in ran)


def test_bad_client_is_refused():
    with pytest.raises(TypeError, match="client=localcluster.Client"):
        localcluster.joblib.LocalClusterBackend(client="tcp://nowhere")


@pytest.mark.parametrize("n_jobs", [0, 0.5])
def test_a_refused_n_jobs_leaves_no_cluster_running(n_jobs):
    # joblib's test_invalid_njobs once left a 2-worker cluster behind, which the next
    # Parallel call took as the user's: its abort then waited for a running batch
    before = _children()
    with pytest.raises(ValueError, match="n_jobs == 0"):
        joblib.Parallel(n_jobs=n_jobs, backend="localcluster")._initialize_backend()
    assert Client.current(allow_none=True) is None
    assert _children() == before


def test_two_parallel_generators_at_once_run_on_a_cluster_each():
    # joblib's test_multiple_generator_call_separated: the second call once took the first
    # call's own cluster for the user's, and lost its results when the first one ended
    assert Client.current(allow_none=True) is None
    before = _children()
    g = joblib.Parallel(n_jobs=2, backend="localcluster", return_as="generator_unordered")(
        joblib.delayed(where)(i) for i in range(10))
    g2 = joblib.Parallel(n_jobs=2, backend="localcluster", return_as="generator")(
        joblib.delayed(where)(i) for i in range(10, 20))
    assert Client.current(allow_none=True) is None        # neither is the process's current client
    first = sorted(g)                                    # the first call ends: its cluster closes
    second = list(g2)
    assert [v for v, _ in first] == [i * i for i in range(10)]
    assert [v for v, _ in second] == [i * i for i in range(10, 20)]
    assert not {p for _, p in first} & {p for _, p in second}, "the two calls shared one cluster"
    assert _children() == before


def test_set_as_default_false_is_never_the_current_client():
    with Client(n_workers=1, forward_logs=False) as mine:
        with Client(n_workers=1, forward_logs=False, set_as_default=False) as hidden:
            assert hidden.status == "running" and Client.current() is mine
    with pytest.raises(TypeError, match=r"set_as_default=\.\.\.\) takes True or False, got 'no'"):
        Client(set_as_default="no")


# --- what joblib's own suite found (issue 25); tests/external/test_joblib_suite.py runs that suite ---

INITIALIZED: list = []        # in a worker: the initializers it ran, in order


def note_init(tag):
    INITIALIZED.append(tag)


def inits_seen(x):
    return os.getpid(), list(INITIALIZED)


def put_pid(shared, x):
    shared[os.getpid()] = x
    return os.getpid()


@pytest.mark.slow
def test_a_multiprocessing_manager_proxy_works_in_a_task_and_the_key_is_not_in_argv(client):
    """Workers get the parent's authkey (else: AuthenticationError: digest sent was rejected),
    over their socket pair: nothing in their command line gives it away."""
    key = bytes(multiprocessing.current_process().authkey)
    for w in client.cluster.workers.values():
        cmdline = " ".join(psutil.Process(w.pid).cmdline())
        assert key.hex() not in cmdline and repr(key) not in cmdline and "authkey" not in cmdline
    with multiprocessing.Manager() as manager:
        shared = manager.dict()
        with joblib.parallel_config(backend="localcluster", client=client):
            pids = joblib.Parallel(n_jobs=2)(joblib.delayed(put_pid)(shared, i) for i in range(20))
        assert set(shared.keys()) == set(pids) <= {w.pid for w in client.cluster.workers.values()}


@pytest.mark.slow
def test_initializer_runs_once_per_worker_in_both_forms(client):
    workers = {w.pid for w in client.cluster.workers.values()}
    with joblib.parallel_config(backend="localcluster", client=client):
        out = joblib.Parallel(n_jobs=2, initializer=note_init, initargs=("call",))(
            joblib.delayed(inits_seen)(i) for i in range(40))
    assert {pid for pid, _ in out} <= workers and all(seen == ["call"] for _, seen in out), out
    with joblib.parallel_config(backend="localcluster", client=client, initializer=note_init, initargs=("config",)):
        out = joblib.Parallel(n_jobs=2)(joblib.delayed(inits_seen)(i) for i in range(40))
        again = joblib.Parallel(n_jobs=2)(joblib.delayed(inits_seen)(i) for i in range(40))
    for pid, seen in out + again:     # once per worker process, not once per call or batch
        assert seen in (["config"], ["call", "config"]) and pid in workers, seen


@pytest.mark.slow
def test_batch_statistics_start_afresh_at_each_call(client):
    backend = localcluster.joblib.LocalClusterBackend(client=client)
    with joblib.parallel_config(backend=backend):
        joblib.Parallel(n_jobs=2)(joblib.delayed(where)(i) for i in range(2000))
    assert backend.compute_batch_size() == 1      # joblib's default: the next call starts small


NESTED = '''
import os, sys, joblib
def inner(x):
    return os.getpid()
def outer(x):
    pids = joblib.Parallel(n_jobs=2, backend="localcluster")(joblib.delayed(inner)(i) for i in range(3))
    return os.getpid(), set(pids), "localcluster.client.client" in sys.modules
'''


def test_a_task_may_name_the_backend_though_its_module_never_imported_it():
    """``outer`` comes from a module that imports joblib only (pickled by value here): the
    batch registers the backend where it is unpickled; the inner call runs in the task's
    thread, without loading the parent's machinery into the worker. A worker that never
    runs a joblib batch does not import joblib at all."""
    namespace = {"__name__": "not_importable"}
    exec(NESTED, namespace)
    with LocalCluster(n_workers=1, forward_logs=False) as cluster, Client(cluster) as client:
        assert client.submit(lambda: "joblib" in sys.modules).result() is False
        with joblib.parallel_config(backend="localcluster", client=client):
            out = joblib.Parallel(n_jobs=2)(joblib.delayed(namespace["outer"])(i) for i in range(2))
    for pid, inner_pids, loaded_client in out:
        assert inner_pids == {pid} and pid != os.getpid() and not loaded_client


def fail_or_nap(x):
    if x == 0:
        raise ValueError("the first call fails")
    time.sleep(x)
    return x


@pytest.mark.slow
def test_an_abort_stops_the_running_batches_of_a_cluster_the_backend_started():
    """As loky kills its workers: the next call of ``with Parallel()`` does not wait behind them."""
    assert Client.current(allow_none=True) is None
    with joblib.parallel_config(backend="localcluster"):
        with joblib.Parallel(n_jobs=2) as parallel:
            with pytest.raises(ValueError, match="the first call fails"):
                parallel(joblib.delayed(fail_or_nap)(x) for x in [0, 30, 30, 30])
            start = time.monotonic()
            assert parallel(joblib.delayed(where)(i) for i in range(4))[0][0] == 0
            assert time.monotonic() - start < 15, "the next call waited behind the abandoned batches"
    assert not [p for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]


def nap_and_log(path, x):
    time.sleep(abs(x))
    if x < 0:
        raise ValueError("the first call fails")
    with open(path, "a") as f:
        f.write("call\n")


@pytest.mark.slow
def test_an_abort_skips_the_rest_of_a_running_batch_on_your_cluster(client, tmp_path):
    """On your own cluster the workers stay; a cancelled batch stops before its next call
    (ten calls of 0.5 s would go on for 5 s: the log stops growing after at most one more)."""
    log = tmp_path / "calls"
    log.touch()
    with joblib.parallel_config(backend="localcluster", client=client):
        with pytest.raises(ValueError, match="the first call fails"):
            joblib.Parallel(n_jobs=2, batch_size=10, pre_dispatch="all")(
                joblib.delayed(nap_and_log)(str(log), x) for x in [-0.5] + [0.5] * 19)
    time.sleep(1.5)                   # the call under way ends; nothing may follow it
    settled = log.read_text().count("call")
    time.sleep(2.0)
    assert log.read_text().count("call") == settled <= 5
