"""Tasks that submit tasks, through real worker processes: get_client, worker_client,
secede, rejoin, get_worker, a Client closed over, futures made in tasks returned to the
parent, and a death while a task waits on its children."""
from __future__ import annotations

import gc
import os
import random
import signal
import threading

import psutil
import pytest

from localcluster import Client, LocalCluster, get_client, get_worker, rejoin, secede, worker_client
from _util import block_until, release, wait_for


def fib(n):
    if n < 2:
        return n
    with worker_client() as c:
        a = c.submit(fib, n - 1)
        b = c.submit(fib, n - 2)
        return a.result() + b.result()


def fib_impure(n):
    if n < 2:
        return n
    with worker_client() as c:
        a, b = c.submit(fib_impure, n - 1, pure=False), c.submit(fib_impure, n - 2, pure=False)
        return c.gather([a, b])[0] + b.result()


def inc(x):
    return x + 1


def add_from_task(x):
    c = get_client()
    return c.submit(inc, x).result() + c.gather(c.map(inc, [x, x]))[1]


def make_future(x):
    return get_client().submit(inc, x)


def worker_children_and_client():
    """What a task sees: Client() is the worker's client, and no process was started for it."""
    c = Client()
    return type(c).__name__, c is get_client(), len(psutil.Process().children(recursive=True))


def text(path):
    if not os.path.exists(path):
        return ""
    with open(path) as f:
        return f.read()


def in_slot(log, tag, path=None):
    """Append ``tag start``/``tag end`` around the wait for ``path`` (if any)."""
    with open(log, "a") as f:
        f.write(f"{tag} start\n")
    if path:
        block_until(path)
    with open(log, "a") as f:
        f.write(f"{tag} end\n")
    return tag


def seceding(log, go):
    secede()
    in_slot(log, "seceded", go)
    rejoin()
    return in_slot(log, "rejoined")


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_fib_with_worker_client_on_one_worker_of_one_thread():
    """The issue's "done when": every level waits on its children with its slot given back."""
    with LocalCluster(n_workers=1, threads_per_worker=1, forward_logs=False) as cluster, Client(cluster) as client:
        assert client.submit(fib, 8).result(30) == 21
        assert client.submit(fib_impure, 9, pure=False).result(30) == 34     # 109 tasks, none shared
        pid = next(iter(cluster.workers.values())).pid
        # every thread started for a seceded task is gone: main, executor, flusher, heartbeat, stacks
        wait_for(lambda: psutil.Process(pid).num_threads() == 5, 10)


@pytest.mark.slow
def test_get_client_submits_through_the_parent_scheduler(client):
    assert client.submit(add_from_task, 1).result(30) == 4
    name, same, children = client.submit(worker_children_and_client).result(30)
    assert (name, same, children) == ("TaskClient", True, 0)


@pytest.mark.slow
def test_client_with_arguments_in_a_task_says_what_to_do(client):
    def nested_cluster():
        return Client(n_workers=2)
    with pytest.raises(RuntimeError, match=r"would start a new cluster inside this worker.*get_client\(\)"):
        client.submit(nested_cluster).result(30)


@pytest.mark.slow
def test_a_client_closed_over_is_the_workers_client_in_a_task(client):
    def uses_outer_client(x):
        return client.submit(inc, x).result()          # the user's Client, pickled into the task
    assert client.submit(uses_outer_client, 41).result(30) == 42


@pytest.mark.slow
def test_futures_made_in_tasks_come_back_as_the_parents_futures(client):
    inner = client.submit(make_future, 10).result(30)
    assert type(inner).__name__ == "Future" and inner.client is client
    assert inner.result(30) == 11
    gc.collect()
    assert client.submit(inc, inner).result(30) == 12         # passed on as a dependency
    assert inner.key in client.who_has()
    # beside what only cloudpickle pickles (the result goes its way, not the C pickler's)
    fn, fut = client.submit(lambda: (lambda: 5, get_client().submit(inc, 1))).result(30)
    assert fn() == 5 and fut.client is client and fut.result(30) == 2


@pytest.mark.slow
def test_keys_a_task_lets_go_of_are_released(client):
    def submit_and_drop():
        c = get_client()
        f = c.submit(inc, 100, key="dropped-by-task")
        return f.result()
    assert client.submit(submit_and_drop).result(30) == 101
    # the task's future is gone: its worker gives the reference back, and nothing else holds it
    wait_for(lambda: "dropped-by-task" not in client.who_has(), 10)


@pytest.mark.cluster(n_workers=1)
@pytest.mark.slow
def test_secede_gives_the_slot_back_and_rejoin_waits_for_one(client, tmp_path):
    """One worker, one thread: a seceded task lets another run; rejoining waits until the
    other has ended, so no two tasks ever ran in the slot at once."""
    log, go, stop = str(tmp_path / "log"), str(tmp_path / "go"), str(tmp_path / "stop")
    a = client.submit(seceding, log, go)
    wait_for(lambda: "seceded start" in text(log))
    b = client.submit(in_slot, log, "other", stop)         # runs in the slot given back
    wait_for(lambda: "other start" in text(log))
    release(go)                                            # a wants its slot back: it waits for b
    wait_for(lambda: "seceded end" in text(log))
    assert not a.done()
    release(stop)
    assert b.result(30) == "other" and a.result(30) == "rejoined"
    lines = text(log).split("\n")
    assert lines.index("other end") < lines.index("rejoined start")


def test_get_worker_names_the_worker_and_its_data(client):
    [x] = client.scatter([123], workers=["worker-0"])

    def look(x):
        w = get_worker()
        return w.name, sorted(w.data), w.address.endswith(w.name)
    name, keys, address = client.submit(look, x, workers=["worker-0"]).result(30)
    assert name == "worker-0" and x.key in keys and address
    with pytest.raises(ValueError, match="not in a localcluster worker"):
        get_worker()
    assert get_client() is client           # outside a task: the current Client


def child(log, key_go):
    with open(log, "a") as f:
        f.write(f"child {os.getpid()}\n")
    block_until(key_go)
    return 7


def parent_of(log, go, workers):
    me = get_worker().name
    other = [w for w in workers if w != me][0]
    with worker_client() as c:
        f = c.submit(child, log, go, workers=[other], allow_other_workers=True)
        return f.result() * 6


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_a_death_while_a_task_waits_on_its_children_reruns_it_without_redoing_them(client, cluster, tmp_path):
    log, go = str(tmp_path / "log"), str(tmp_path / "go")
    names = sorted(cluster.workers)
    top = client.submit(parent_of, log, go, names, workers=[names[0]], allow_other_workers=True)
    wait_for(lambda: text(log).count("child") == 1)
    os.kill(cluster.workers[names[0]].pid, signal.SIGKILL)       # the parent's worker, mid-wait
    wait_for(lambda: len(cluster.deaths) == 1)
    death = cluster.deaths[0]
    assert death.cause == "signal"
    assert "was waiting for the tasks it submitted (seceded)" in death.message, death.message
    release(go)
    assert top.result(60) == 42
    assert text(log).count("child") == 1, "the child ran again: its work was lost or duplicated"


def suicidal():
    os.kill(os.getpid(), signal.SIGKILL)


def parent_of_suicidal(workers):
    other = [w for w in workers if w != get_worker().name][0]
    with worker_client() as c:
        return c.submit(suicidal, workers=[other]).result()


@pytest.mark.cluster(allowed_failures=0)
@pytest.mark.slow
def test_a_death_says_which_task_submitted_the_task_it_ran(client, cluster):
    from localcluster import KilledWorker
    names = sorted(cluster.workers)
    top = client.submit(parent_of_suicidal, names, workers=[names[0]])
    with pytest.raises(KilledWorker, match=r"Task 'suicidal-\w+' \(submitted by task 'parent_of_suicidal-\w+'\)"):
        top.result(60)
    assert "'suicidal-" in cluster.deaths[0].message
    assert f"was submitted by task {top.key!r}" in cluster.deaths[0].message


def seceded_past_timeout(rejoins):
    """Gives its slot back (and takes one again, with ``rejoins``), then runs on past its timeout."""
    secede()
    if rejoins:
        rejoin()
    threading.Event().wait(300)         # interrupted by the worker's stop, never by this wait


@pytest.mark.timeout(90)
@pytest.mark.parametrize("rejoins", [False, True], ids=["seceded", "rejoined"])
@pytest.mark.slow
def test_a_seceded_tasks_timeout_is_enforced(tmp_path, rejoins):
    """A task that called secede() has left its executor's row of the status board; its
    timeout still stops its worker, and the error names the task, the worker and where it was."""
    from localcluster import TaskTimeoutError
    with LocalCluster(n_workers=1, threads_per_worker=1, forward_logs=False) as cluster, Client(cluster) as client:
        late = client.submit(seceded_past_timeout, rejoins, timeout=0.5, pure=False)
        with pytest.raises(TaskTimeoutError) as info:
            late.result(30)
        err = info.value
        assert err.task == late.key and err.worker == "worker-0" and err.timeout == 0.5 and err.elapsed >= 0.5
        assert f"Task {late.key!r} ran for" in str(err) and "seceded_past_timeout" in str(err), str(err)
        (death,) = cluster.deaths
        assert death.cause == "timeout" and late.key in death.tasks
        assert client.submit(inc, 1).result(30) == 2            # its replacement runs the next ones


def whoami(tag):
    return get_worker().name, os.getpid(), tag


def runs_everywhere():
    """Not seceded: the worker's one slot stays this task's while the calls run, its own too."""
    return get_client().run(whoami, "t")


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_run_from_a_task_answers_from_every_worker_its_own_too(client, cluster):
    got = client.submit(runs_everywhere, pure=False).result(30)
    assert got == {name: (name, w.pid, "t") for name, w in cluster.workers.items()}


def runs_on(workers, on_error):
    def boom():
        raise ValueError(f"boom on {get_worker().name}")
    c = get_client()
    try:
        out = c.run(boom, workers=workers, on_error=on_error)
    except ValueError as e:
        return "raised", str(e)
    return {name: (type(v).__name__, str(v)) for name, v in out.items()}


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_run_from_a_task_on_named_workers_with_errors(client):
    assert client.submit(runs_on, ["worker-1"], "raise", pure=False).result(30) == ("raised", "boom on worker-1")
    assert client.submit(runs_on, ["worker-0"], "return", pure=False).result(30) == {
        "worker-0": ("ValueError", "boom on worker-0")}
    assert client.submit(runs_on, None, "ignore", pure=False).result(30) == {}
    kind, msg = client.submit(runs_on, ["worker-9"], "raise", pure=False).result(30)
    assert kind == "raised" and "no running worker is called 'worker-9'" in msg and "worker-0" in msg


def cancels_its_child(log, go):
    c = get_client()
    f = c.submit(in_slot, log, "child", go, pure=False)
    block_until(log)                       # the child started, on the other worker
    assert f.cancel()                      # Future.cancel too (then Client.cancel again: no-op)
    c.cancel([f])
    try:
        f.result()
    except Exception as e:                 # noqa: BLE001 - the answer is the exception
        return f.cancelled(), f.status, type(e).__name__, f.key
    return "not cancelled"


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_cancel_from_a_task_cancels_for_everyone(client, cluster, tmp_path):
    log, go = str(tmp_path / "log"), str(tmp_path / "go")
    cancelled, status, error, key = client.submit(cancels_its_child, log, go).result(30)
    assert (cancelled, status, error) == (True, "cancelled", "CancelledError")
    wait_for(lambda: key not in cluster.scheduler.tasks, 10)
    release(go)


def holds_and_asks():
    c = get_client()
    [y] = c.scatter([5])
    z = c.submit(inc, 1, workers=["worker-1"])          # worker-0's one thread runs this task
    z.result()
    info = c.scheduler_info()
    return (y.key, z.key, c.who_has([y, z]), c.who_has(), sorted(info["workers"]), info["total_threads"],
            {n: w["nthreads"] for n, w in info["workers"].items()})


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_who_has_and_scheduler_info_from_a_task(client):
    [x] = client.scatter([1], workers=["worker-1"])
    y, z, has, every, names, threads, each = client.submit(holds_and_asks, workers=["worker-0"]).result(30)
    assert has[z] == ("worker-1",) and len(has[y]) == 1 and set(has) == {y, z}
    assert every[x.key] == ("worker-1",) and {y, z} <= set(every)
    assert names == ["worker-0", "worker-1"] and threads == 2 and each == {"worker-0": 1, "worker-1": 1}


def cancels_an_ended_one():
    c = get_client()
    f = c.submit(inc, 1, pure=False)
    f.result()
    return f.cancel(), f.status, f.result()


@pytest.mark.slow
def test_cancel_from_a_task_leaves_an_ended_future_as_it_was(client):
    assert client.submit(cancels_an_ended_one, pure=False).result(30) == (False, "finished", 2)


def down(n):
    """A chain that waits for its next link without seceding (as a new user writes it)."""
    return 0 if n == 0 else 1 + get_client().submit(down, n - 1).result()


def down_gathered(n):
    c = get_client()
    return 0 if n == 0 else 1 + c.gather([c.submit(down_gathered, n - 1)])[0]


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_a_task_waiting_for_its_children_gives_its_slot_back_without_seceding():
    """50 links, each waiting in result() (or gather) for the next, on 1 worker x 1 thread:
    dask hangs (every slot waits on a child that cannot run); here each wait gives the slot
    back and takes it again, as Ray does, and then the worker is back to one slot."""
    with LocalCluster(n_workers=1, threads_per_worker=1, forward_logs=False) as cluster, Client(cluster) as client:
        assert client.submit(down, 50).result(90) == 50
        assert client.submit(down_gathered, 20).result(60) == 20
        assert client.submit(add_from_task, 1).result(30) == 4       # done results: no secession needed
        pid = next(iter(cluster.workers.values())).pid
        # every thread started for a waiting task is gone: main, executor, flusher, heartbeat, stacks
        wait_for(lambda: psutil.Process(pid).num_threads() == 5, 10)
        assert list(client.nthreads().values()) == [1]          # the slots lent were all taken back


def waits_in_task(how):
    """wait() on futures the task submitted, without seceding; then their results."""
    from localcluster import wait as wait_for_futures
    c = get_client()
    fs = c.map(inc, range(5), pure=False)
    done, not_done = wait_for_futures(fs, timeout=30, return_when=how)
    assert done and set(done) | set(not_done) == set(fs)
    if how == "ALL_COMPLETED":
        assert not not_done
    return sorted(f.result() for f in fs)


@pytest.mark.parametrize("how", ["ALL_COMPLETED", "FIRST_COMPLETED", "FIRST_EXCEPTION"])
def test_wait_in_a_task_on_its_own_futures(client, how):
    """dask's idiom ``wait(futures)`` in a task: on a task's futures, not a TypeError."""
    assert client.submit(waits_in_task, how, pure=False).result(30) == [1, 2, 3, 4, 5]


def first_exception_in_task():
    """FIRST_EXCEPTION returns at once once a future failed, with it among the done."""
    from localcluster import wait as wait_for_futures
    c = get_client()
    bad = c.submit(int, "not a number", pure=False)
    wait_for_futures([bad], timeout=30)
    done, _ = wait_for_futures([bad, c.submit(inc, 1, pure=False)], timeout=30, return_when="FIRST_EXCEPTION")
    return bad in done, type(bad.exception()).__name__


def test_wait_first_exception_in_a_task(client):
    assert client.submit(first_exception_in_task, pure=False).result(30) == (True, "ValueError")


def as_completed_in_task():
    """dask's idiom in a task: as_completed over the futures it submitted, with results."""
    from localcluster import as_completed
    c = get_client()
    fs = c.map(inc, range(6), pure=False)
    return sorted(r for _, r in as_completed(fs, with_results=True, timeout=30))


def test_as_completed_in_a_task_on_its_own_futures(client):
    assert client.submit(as_completed_in_task, pure=False).result(30) == [1, 2, 3, 4, 5, 6]


# --- one reading of the Client API's arguments, for a Client and a task's client -------------

def _bad_calls(client):
    """The same calls, made with ``client``: each bad one's error as (type name, message)."""
    def inc(x):
        return x + 1
    calls = [
        lambda: client.submit(42),
        lambda: client.submit(inc, 1, key=7),
        lambda: client.submit(inc, 1, retries=-1),
        lambda: client.submit(inc, 1, timeout="soon"),
        lambda: client.submit(inc, 1, priority=1.5),
        lambda: client.submit(inc, 1, allow_other_workers="yes"),
        lambda: client.submit(inc, 1, resources={"GPU": -1}),
        lambda: client.map(inc),
        lambda: client.map(42, [1]),
        lambda: client.map(inc, [1, 2], key=["only-one"]),
        lambda: client.map(inc, [1, 2], key=7),
        lambda: client.gather([], errors="bogus"),
        lambda: client.run(os.getpid, on_error="bogus"),
        lambda: client.run(42),
        lambda: client.scheduler_info(n_workers=-2),
        lambda: client.scheduler_info(n_workers="all"),
        lambda: client.submit(inc, 1, workers="nobody"),
        lambda: client.map(inc, [1], workers=["worker-0", "nobody"]),
        lambda: client.submit(inc, 1, workers=3),
        lambda: client.submit(inc, 1, workers=[]),
        lambda: client.map(inc, [1], workers=["worker-0", 5]),
        lambda: client.scatter([1], workers="nobody"),
    ]
    said = []
    for call in calls:
        try:
            call()
        except Exception as e:  # noqa: BLE001 - the error is what is compared
            said.append((type(e).__name__, str(e)))
        else:
            said.append(None)
    keys = [f.key for f in client.map(inc, [1, 2], key="pre", fifo_timeout="1s", batch_size=5)]
    mixed = {"ok": client.submit(inc, 1), "bad": [client.submit(inc, "x"), client.submit(inc, 2)],
             "elsewhere": client.submit(inc, 3, workers="nobody", allow_other_workers=True)}
    return said, [k.startswith("pre-") for k in keys], client.gather(client.map(inc, [1, 2], key="pre")), \
        client.gather(mixed, errors="skip")


def _bad_calls_in_a_task():
    return _bad_calls(get_client())


def test_a_task_and_the_user_read_the_client_apis_arguments_alike(client):
    """Differential: every bad argument is refused with the same error in a task (get_client)
    as in the user's process, and map's key prefix, dask's hints and gather's skip mean the same."""
    here, prefixed_here, values_here, skipped_here = _bad_calls(client)
    there, prefixed_there, values_there, skipped_there = client.submit(_bad_calls_in_a_task, pure=False).result(60)
    assert None not in here, here
    assert there == here
    assert prefixed_here == prefixed_there == [True, True] and values_here == values_there == [2, 3]
    assert skipped_here == skipped_there == {"ok": 2, "bad": [3], "elsewhere": 4}


def _random_arguments(seed):
    """A few arguments of kinds a call takes, from ``seed``: plain ones, containers, bytes."""
    rng = random.Random(seed)
    kinds = [lambda: rng.randint(-10**6, 10**6), lambda: rng.random(), lambda: rng.choice(["a", "bc", ""]) * 3,
             lambda: tuple(rng.randint(0, 9) for _ in range(rng.randint(0, 3))),
             lambda: [rng.random() for _ in range(rng.randint(0, 3))],
             lambda: {str(i): rng.randint(0, 9) for i in range(rng.randint(0, 3))},
             lambda: rng.randbytes(rng.choice([3, 300]))]
    return [rng.choice(kinds)() for _ in range(6)]


def _same_calls(client, seed):
    """The same calls of submit and map, and the keys and results they give."""
    values = _random_arguments(seed)
    futures = [client.submit(repr, v) for v in values]
    futures += [client.submit(_pair, v, other=seed) for v in values[:2]]
    futures += client.map(repr, values) + client.map(_pair, values[:3], values[3:])
    futures += client.map(repr, values[:2], key="named") + [client.submit(repr, seed, key=f"given-{seed}")]
    impure = [client.submit(repr, 1, pure=False), *client.map(repr, [1, 2], pure=False)]
    names, numbers = zip(*(f.key.rsplit("-", 1) for f in impure))
    # a fresh key is its function's name, its process's prefix (8 hex digits), a number
    return ([f.key for f in futures], client.gather(futures),
            list(names), len({n[:8] for n in numbers}), client.gather(impure))


def _pair(a, other=None):
    return repr((a, other))


def _same_calls_in_a_task(seed):
    return _same_calls(get_client(), seed)


@pytest.mark.timeout(60)
def test_a_task_and_the_user_make_the_same_keys_of_the_same_calls(client):
    """Differential: submit and map of the same function and arguments, pure, named by a
    prefix or a key, make the same keys with the same results in the user's process and in a
    task (one implementation of key making); impure keys are made alike: the function's name,
    the process's prefix, a number."""
    seed = random.randrange(2**32)
    print(f"seed {seed}")
    here = _same_calls(client, seed)
    there = client.submit(_same_calls_in_a_task, seed, pure=False).result(60)
    assert there == here, f"seed {seed}"
    assert here[2] == ["repr"] * 3 and here[3] == 1


def _module_functions(client):
    """dask's functions of the package on this client's futures: wait on one and on a list,
    futures_of in nested containers, as_completed."""
    from localcluster import as_completed, futures_of, wait
    f, g = client.submit(abs, -3, pure=False), client.submit(abs, -4, pure=False)
    done, not_done = wait(f)
    return ([x.key for x in done] == [f.key], bool(not_done),
            [x.key for x in futures_of([f, {"g": (g, f)}])] == [f.key, g.key],
            len(wait([f, g]).done), sorted(x.result() for x in as_completed([f, g])))


def _module_functions_in_a_task():
    from localcluster import fire_and_forget
    out = _module_functions(get_client())
    try:
        fire_and_forget(get_client().submit(abs, -5, pure=False))
    except NotImplementedError as e:
        return out, str(e)
    return out, None


@pytest.mark.timeout(60)
def test_the_packages_functions_take_a_tasks_futures_as_the_users(client):
    """Differential: ``wait(f)``, ``futures_of`` and ``as_completed`` mean the same on a task's
    futures as on the user's (a task's lone future was refused, and futures_of found none);
    fire_and_forget, which a task cannot honour past its end, says so and what to do."""
    here = _module_functions(client)
    there, refused = client.submit(_module_functions_in_a_task, pure=False).result(60)
    assert here == there == (True, False, True, 2, [3, 4])
    assert refused is not None and "Return it from the task" in refused, refused
