"""The portable part of the API means the same under localcluster and dask.distributed:
examples/portable.py runs under both (switched by CLUSTER_BACKEND) and prints the same;
the portable methods take dask's keywords, and the few they don't are listed here."""
from __future__ import annotations

import inspect
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import localcluster
from localcluster import Client

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "portable.py"
RESOURCES = SCRIPT.parent / "resources.py"
TASKS = SCRIPT.parent / "tasks.py"
COORDINATION = SCRIPT.parent / "coordination.py"
DASK_API = SCRIPT.parent / "dask_api.py"

# dask keywords of the portable methods that localcluster does not take, each with why
# (README, "When one machine is not enough"). The test fails when this list goes stale.
NOT_TAKEN = {
    "scatter": {"timeout": "scatter is a local copy", "asynchronous": "no async client"},
    "gather": {"direct": "data always comes straight from the workers"},
    "cancel": {"asynchronous": "no async client",
               "reason": "the CancelledError names the task and who cancelled it, not a reason of the caller's",
               "msg": "the CancelledError names the task and who cancelled it, not a message of the caller's"},
    "replicate": {"workers": "copies go to any n workers", "branching_factor": "no tree of transfers"},
    "get_worker_logs": {"nanny": "the nanny is a thread of the client, its log is the client's"},
}
# Keywords that dask passes on to the function but localcluster takes for itself.
TAKEN_FROM_FN = {"submit": {"timeout"}, "map": {"timeout"}}
# dask's scheduling keywords that localcluster takes out of **kwargs (hints dropped, the rest refused).
FROM_KWARGS = {"submit": {"fifo_timeout", "actor", "actors"},
               "map": {"fifo_timeout", "actor", "actors", "batch_size"},
               "compute": {"resources", "fifo_timeout", "actors"},
               "persist": {"resources", "fifo_timeout", "actors"}}
METHODS = ["submit", "map", "scatter", "gather", "cancel", "replicate", "restart", "wait_for_workers",
           "get_worker_logs", "run", "compute", "persist", "who_has", "scheduler_info", "nthreads", "ncores",
           "has_what", "processing", "run_on_scheduler", "story", "shutdown", "retry", "publish_dataset",
           "get_dataset", "list_datasets", "unpublish_dataset", "log_event", "get_events", "subscribe_topic",
           "unsubscribe_topic", "get_task_stream", "dump_cluster_state", "nbytes", "upload_file", "register_plugin",
           "unregister_worker_plugin", "retire_workers", "restart_workers", "register_worker_callbacks",
           "as_current", "futures_of"]
AS_COMPLETED = ["add", "update", "count", "is_empty", "has_ready", "next_batch", "batches", "clear"]


def named(fn) -> set:
    return {n for n, p in inspect.signature(fn).parameters.items()
            if n not in ("self", "func", "fn") and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def both(script: Path = SCRIPT) -> tuple:
    """What ``script`` prints under localcluster and under distributed: the two run side by
    side, each in a process of its own (each mostly waits for its cluster to start)."""
    # the localcluster under test, not whichever one the interpreter would import from examples/
    path = os.pathsep.join(filter(None, [str(Path(localcluster.__file__).parent.parent), os.environ.get("PYTHONPATH")]))
    procs = {backend: subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       text=True, env={**os.environ, "CLUSTER_BACKEND": backend, "PYTHONPATH": path})
             for backend in ("localcluster", "distributed")}
    # dask.distributed's side takes over 100 s when two whole suites load the machine
    out, deadline = {}, time.monotonic() + 200
    try:
        for backend, proc in procs.items():
            stdout, stderr = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            assert proc.returncode == 0, f"{backend}: {stderr[-3000:]}"
            out[backend] = stdout.splitlines()
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return out["localcluster"], out["distributed"]


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_one_script_prints_the_same_under_both():
    pytest.importorskip("distributed")
    ours, theirs = both()
    assert ours[0] == "submit 2" and ours[-3] == "after restart 42" and len(ours) == 33
    # the Client is dask's default scheduler while open, and dask's setting comes back at close
    assert ours[-2:] == ["dask's scheduler once the client is closed: None", "shutdown closed"]
    assert "KilledWorker True 0" in ours and "workers= 1 True" in ours and "cancel True cancelled True" in ours
    for line in ("as_completed batches [41, 42, 43, 44, 45, 46] True", "as_completed clear True 0 []",
                 "run 2 2 True", "run raises the worker's own ValueError no 2",
                 "run on_error=return ['ValueError', 'ValueError']", "scheduler_info 2 True", "who_has True",
                 "fire_and_forget True", "compute 2 [np.float64(10.0)]", "persist Array 45 2",
                 "default scheduler 2.0 True True", "dask.persist 45 2", "has_what True True",
                 "nthreads [1, 1] True", "processing True True", "run_on_scheduler 2 True", "story True"):
        assert line in ours, line
    assert ours == theirs


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_resources_mean_the_same_under_both():
    """examples/resources.py: 6 tasks asking MEM=1 of a worker with MEM=2 and 4 threads
    run at most 2 at once (measured by the tasks), under either backend."""
    pytest.importorskip("distributed")
    ours, theirs = both(RESOURCES)
    assert ours == ["results [0, 1, 4, 9, 16, 25]", "MEM=1 tasks at once on a MEM=2 worker: 2",
                    "a task asking all of MEM: 49"]
    assert ours == theirs


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_tasks_that_submit_tasks_mean_the_same_under_both():
    """examples/tasks.py: fib(8) via worker_client on 1 worker x 1 thread, get_client with
    secede and rejoin, get_worker, run, cancel and who_has from a task, under either backend."""
    pytest.importorskip("distributed")
    ours, theirs = both(TASKS)
    assert ours == ["fib(8) on 1 worker x 1 thread: 21", "get_client, secede, rejoin in a task: 6",
                    "get_worker().name is a worker's: True", "run in a task (workers, its own among them): 1 True",
                    "cancel and who_has in a task: True cancelled 1"]
    assert ours == theirs


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_coordination_means_the_same_under_both():
    """examples/coordination.py: Lock, Semaphore, Event, Queue and Variable between tasks and
    the user's process, under either backend (the tasks measure what they saw)."""
    pytest.importorskip("distributed")
    ours, theirs = both(COORDINATION)
    assert ours == ["Lock: tasks inside at once: 1", "Semaphore(2): tasks inside at once: 2",
                    "Event: done before set: 0", "Event: after set: [0, 1, 2]",
                    "Queue: from the tasks: [0, 1, 4, 9] left: 0", "Variable: set by a task: 42",
                    "Lock: taken here: True by someone else in 0.1 s: False"]
    assert ours == theirs


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_the_rest_of_the_client_means_the_same_under_both():
    """examples/dask_api.py: Future.retry / traceback / type / release, datasets between clients
    and from a task, events and a subscription, the task stream, upload_file twice, a worker
    plugin, an actor, rebalance and retire_workers, under either backend."""
    pytest.importorskip("distributed")
    ours, theirs = both(DASK_API)
    assert ours[:3] == ["failed ValueError error", "traceback fails_once", "retried 43 42 finished"]
    assert "upload 2 [2, 2, 2]" in ours and "plugin set up 3" in ours and ours[-1].startswith("retired 2 False")
    assert "actor [11, 13, 16] 16" in ours
    assert len(ours) == 16 and ours == theirs


def test_dask_local_cluster_keywords_are_taken_or_refused_saying_why():
    """dashboard_address means nothing here (no server) and is taken as such; processes=False
    is refused (every worker is a process); silence_logs is the level of worker records handed on."""
    import logging
    with localcluster.LocalCluster(n_workers=0, dashboard_address=":8787", processes=True,
                                   silence_logs=logging.WARN) as c:
        assert c.config["silence_logs"] == logging.WARNING
    with localcluster.LocalCluster(n_workers=0, dashboard_address=None, silence_logs=None) as c:
        assert c.config["silence_logs"] == 0
    with pytest.raises(ValueError, match=r"processes=False\): localcluster runs every worker in a process of its "
                                         r"own.*ThreadPoolExecutor"):
        localcluster.LocalCluster(n_workers=0, processes=False)
    with pytest.raises(ValueError, match=r"silence_logs='loud'\): expected a logging level"):
        localcluster.LocalCluster(n_workers=0, silence_logs="loud")


# Coordination: each public method takes dask's keywords; ours may also take client= where
# dask's constructor does not (its Lock and Semaphore find theirs alone).
COORDINATION_METHODS = {"Lock": ["__init__", "acquire", "release", "locked", "get_value"],
                        "Semaphore": ["__init__", "acquire", "release", "get_value", "close"],
                        "Event": ["__init__", "set", "clear", "is_set", "wait"],
                        "Queue": ["__init__", "put", "get", "qsize", "close"],
                        "Variable": ["__init__", "set", "get", "delete"]}


def test_coordination_takes_dask_keywords():
    distributed = pytest.importorskip("distributed")
    for cls, methods in COORDINATION_METHODS.items():
        for method in methods:
            theirs = named(getattr(getattr(distributed, cls), method))
            ours = named(getattr(getattr(localcluster, cls), method))
            assert theirs <= ours and ours - theirs <= {"client"}, f"{cls}.{method}: {ours ^ theirs}"


def test_a_tasks_client_takes_the_keywords_a_client_does():
    """get_client() in a task: its cancel, run, who_has and scheduler_info take what
    Client's do (so dask's, bar those listed in NOT_TAKEN), and so does Future.cancel."""
    from localcluster.worker.client import TaskClient, TaskFuture
    for method in ("submit", "map", "gather", "cancel", "run", "who_has", "scheduler_info"):
        ours, clients = named(getattr(TaskClient, method)), named(getattr(Client, method))
        assert ours <= clients and clients - ours <= {"asynchronous", "workers", "direct", "hash"}, method
    assert named(TaskFuture.cancel) == named(localcluster.Future.cancel)


def test_tasks_that_submit_tasks_take_dask_keywords():
    distributed = pytest.importorskip("distributed")
    for name in ("get_client", "worker_client", "secede", "rejoin", "get_worker"):
        theirs, ours = getattr(distributed, name), getattr(localcluster, name)
        assert named(ours) == named(theirs), name


def test_the_portable_methods_take_dask_keywords():
    distributed = pytest.importorskip("distributed")
    for method in METHODS:
        theirs, ours = named(getattr(distributed.Client, method)), named(getattr(Client, method))
        missing = theirs - ours - FROM_KWARGS.get(method, set())
        assert missing == set(NOT_TAKEN.get(method, {})), f"Client.{method}: dask's {sorted(missing)}"
        assert FROM_KWARGS.get(method, set()) <= theirs
    for method in AS_COMPLETED:
        theirs, ours = getattr(distributed.as_completed, method), getattr(localcluster.as_completed, method)
        assert named(theirs) == named(ours), f"as_completed.{method}"
    assert callable(localcluster.fire_and_forget) and named(localcluster.fire_and_forget) == {"obj"}
    for method, taken in TAKEN_FROM_FN.items():     # where dask hands **kwargs to the function
        assert named(getattr(Client, method)) - named(getattr(distributed.Client, method)) - {
            "allow_other_workers"} == taken, method


# dask keywords of cluster.adapt (LocalCluster.adapt's own and its Adaptive's) that ours does
# not take, each with why (README, "When one machine is not enough").
ADAPT_NOT_TAKEN = {
    "Adaptive": "no class to swap in: the policy is localcluster's own",
    "minimum_cores": "bounds are in workers (threads_per_worker each)",
    "maximum_cores": "bounds are in workers (threads_per_worker each)",
    "minimum_memory": "bounds are in workers (memory_limit each)",
    "maximum_memory": "bounds are in workers (memory_limit each)",
    "target_duration": "every task that waits for a thread is a reason to grow, whatever its duration",
    "worker_key": "no worker groups: workers are retired one by one",
}


def test_adapt_takes_dask_keywords():
    """``cluster.adapt(minimum=0, maximum=2)`` is portable: ours takes dask's keywords with
    their meaning (interval and wait_count as in dask's Adaptive), bar those listed."""
    distributed = pytest.importorskip("distributed")
    from distributed.deploy.adaptive import Adaptive
    theirs = named(distributed.LocalCluster.adapt) | (named(Adaptive.__init__) - {"cluster"})
    ours = named(localcluster.LocalCluster.adapt)
    assert {"minimum", "maximum", "wait_count", "interval"} <= ours <= theirs
    assert theirs - ours == set(ADAPT_NOT_TAKEN)
    defaults = {n: p.default for n, p in inspect.signature(localcluster.LocalCluster.adapt).parameters.items()}
    assert defaults["minimum"] == 0 and defaults["wait_count"] == 3     # dask's too


def keywords(**kwargs):
    return sorted(kwargs)


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_dask_keywords_mean_what_they_mean_in_dask(client):
    """Never passed to the function; hints accepted, what has no meaning here refused."""
    assert client.submit(keywords, fifo_timeout="100 ms", resources=None, actor=False, x=1).result(30) == ["x"]
    assert client.gather(client.map(lambda i: i, [1, 2], batch_size=1, fifo_timeout="1s")) == [1, 2]
    with pytest.raises(ValueError, match=r"asks for resources=\{'GPU': 1\}, which no worker can ever give"):
        client.submit(keywords, resources={"GPU": 1})         # where dask would wait forever
    with pytest.raises(NotImplementedError, match="actors"):
        client.map(keywords, [1], actor=True)
    big = client.scatter(list(range(3)), hash=False, direct=True)
    assert client.gather(big) == [0, 1, 2]
    slow = client.submit(time.sleep, 30, pure=False)
    client.cancel([slow], force=True)
    assert slow.cancelled()
    name = sorted(client.get_worker_logs())[0]
    assert list(client.get_worker_logs(workers=[name])) == [name]
    assert list(client.get_worker_logs(workers=name)) == [name]
    assert client.restart(wait_for_workers=False) is client
    assert client.submit(len, "abc").result(30) == 3
