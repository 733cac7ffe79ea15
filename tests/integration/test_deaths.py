"""Every cause of the death taxonomy, produced for real and classified, blamed and recovered from."""
from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
import time

import psutil
import pytest
from _util import block_until, release, wait_for, wait_running

from localcluster import (Client, ClusterRestarted, KilledWorker, LocalCluster, LostDataError, TaskError,
                          TaskTimeoutError, WorkerStartupError)

pytestmark = pytest.mark.timeout(90)


def inc(x):
    return x + 1


# --- failures, each a small function the crash table combines with a crash point -----

def fail(how):
    if how == "raise":
        raise ValueError("task raised on purpose")
    if how == "sys.exit":
        sys.exit(5)
    if how == "os._exit":
        os._exit(3)
    if how == "segfault":
        import ctypes
        ctypes.string_at(0)
    if how == "abort":
        os.abort()
    raise AssertionError(how)


class FailOnUnpickle:
    def __init__(self, how):
        self.how = how

    def __reduce__(self):
        return (fail, (self.how,))


class FailOnPickle:
    def __init__(self, how):
        self.how = how

    def __reduce__(self):
        fail(self.how)


def at_call(how):
    fail(how)


def at_unpickle(arg):
    return arg


def at_pickle_result(how):
    return FailOnPickle(how)


EXPECT = {
    # failure: (exception the future raises, cause of the death or None, signal)
    "raise": (ValueError, None, None),
    "sys.exit": (TaskError, None, None),         # wrapped: a task must not end the caller
    "os._exit": (KilledWorker, "exit", None),
    "segfault": (KilledWorker, "crash", "SIGSEGV"),
    "abort": (KilledWorker, "crash", "SIGABRT"),
}


# The conftest's cluster with allowed_failures=0: the first death that blames a task gives it up.
fragile = pytest.mark.cluster(allowed_failures=0)


def at_unpickle_result():
    return FailOnUnpickle("raise")


@fragile
@pytest.mark.parametrize("point", ["pickle-args", "unpickle-result"])
def test_crash_table_in_the_client(cluster, client, point):
    """loky's two crash points on the parent's side; only "raise" makes sense there
    (a segfault would take the user's own process down, as it would without us)."""
    if point == "pickle-args":
        with pytest.raises(TypeError, match=r"could not pickle argument 0 .* of at_unpickle\(\).*task raised"):
            client.submit(at_unpickle, FailOnPickle("raise"))
    else:
        fut = client.submit(at_unpickle_result)
        with pytest.raises(ValueError, match=r"unpickling the result of task .* in the client failed.*task raised"):
            fut.result(30)
    assert cluster.deaths == []
    assert client.submit(inc, 1).result(30) == 2


POINTS = ["call", "unpickle-args", "pickle-result"]
# Every failure at every point; the quick tier (pytest -m "not slow") each failure at one point,
# every point in turn.
CRASH_TABLE = [pytest.param(point, how, id=f"{point}-{how}", marks=() if h % len(POINTS) == p else pytest.mark.slow)
               for p, point in enumerate(POINTS) for h, how in enumerate(EXPECT)]


@fragile
@pytest.mark.parametrize("point,how", CRASH_TABLE)
def test_crash_table(cluster, client, point, how):
    if point == "call":
        fut = client.submit(at_call, how)
    elif point == "unpickle-args":
        fut = client.submit(at_unpickle, FailOnUnpickle(how))
    else:
        fut = client.submit(at_pickle_result, how)
    exc_type, cause, sig = EXPECT[how]
    with pytest.raises(exc_type) as info:
        fut.result(30)
    if cause is None:
        assert cluster.deaths == []
    else:
        (death,) = cluster.deaths
        assert death.cause == cause and death.signal == sig
        assert death.tasks == (fut.key,) and death.blamed == (fut.key,)
        assert info.value.task == fut.key and info.value.deaths == (death,)
        assert death.exitcode == (3 if how == "os._exit" else -getattr(signal, sig))
        assert fut.key in death.message and death.worker in death.message and str(death.pid) in death.message
        if cause == "crash":
            assert "Current thread" in death.stack
            assert f"{cause}, {sig}" in str(info.value)
    assert client.submit(inc, 1).result(30) == 2     # the cluster keeps computing


@pytest.mark.slow
def test_crash_blames_only_the_task_on_the_crashing_thread(tmp_path):
    marker = str(tmp_path / "go")
    with LocalCluster(n_workers=1, threads_per_worker=2, allowed_failures=0, forward_logs=False) as c, \
            Client(c) as cl:
        slow = cl.submit(block_until, marker, pure=False)    # still running when its neighbour crashes
        wait_running(c, slow)
        crash = cl.submit(at_call, "segfault")
        with pytest.raises(KilledWorker):
            crash.result(30)
        (death,) = c.deaths
        assert set(death.tasks) == {slow.key, crash.key} and death.blamed == (crash.key,)
        release(marker)
        assert slow.result(30) is None                 # rescheduled, not blamed


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_killed_from_outside_is_signal_and_task_reruns(client, cluster, sig, tmp_path):
    marker = str(tmp_path / "go")
    fut = client.submit(block_until, marker, pure=False)
    n = wait_running(cluster, fut)
    os.kill(n.pid, sig)
    wait_for(lambda: len(cluster.deaths) == 1)
    release(marker)
    assert fut.result(30) is None
    (death,) = cluster.deaths
    assert death.cause == "signal" and death.signal == sig.name and death.tasks == (fut.key,)
    assert "killed from outside" in death.message and sig.name in death.message
    assert cluster.scheduler.tasks[fut.key].suspicious == 1
    wait_for(lambda: len(cluster.workers) == 2)


def add(x, y):
    return x + y


@pytest.mark.cluster(allowed_failures=0)
def test_a_dead_worker_is_not_listed_once_its_death_is(client, cluster, tmp_path):
    """From the moment ``cluster.deaths`` shows a worker's death, ``cluster.workers`` never
    lists that worker: the death is recorded and the worker let go of in one step. A thread
    looks at both as fast as it can while a worker is SIGKILLed; the death fails its task
    and a thousand that wait for it, whose futures are told after the lock is let go of: a
    moment a reader would fall into were the worker let go of after that."""
    marker = str(tmp_path / "go")
    blocker = client.submit(block_until, marker, pure=False)
    waiting = client.map(add, [blocker] * 1000, range(1000), pure=False)
    victim = wait_running(cluster, blocker)
    listed, stop = [], threading.Event()

    def look():
        while not stop.is_set() and not listed:
            if cluster.deaths:
                workers = cluster.workers
                listed.append(workers[victim.name].status if victim.name in workers else None)
    watcher = threading.Thread(target=look, name="test-death-watcher")
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)         # the watcher gets the GIL between any two steps
    watcher.start()
    try:
        os.kill(victim.pid, signal.SIGKILL)
        with pytest.raises(KilledWorker):
            blocker.result(30)
        watcher.join(30)                # it has seen the death, and looked
    finally:
        stop.set()
        watcher.join(30)
        sys.setswitchinterval(interval)
        release(marker)
    assert listed == [None], f"{victim.name} listed as {listed[0]!r} after its death was recorded"
    assert all(isinstance(f.exception(30), KilledWorker) for f in waiting)


@pytest.mark.slow
def test_killed_worker_after_allowed_failures_names_every_death():
    with LocalCluster(n_workers=2, allowed_failures=2, forward_logs=False) as c, Client(c) as cl:
        fut = cl.submit(at_call, "segfault")
        with pytest.raises(KilledWorker) as info:
            fut.result(60)
        err = info.value
        assert len(err.deaths) == 3 and err.last_worker == err.deaths[-1].worker
        text = str(err)
        assert f"Task {fut.key!r}" in text and text.count("crash, SIGSEGV") == 3 and "at_call" in text
        again = pickle.loads(pickle.dumps(err))
        assert again.task == err.task and len(again.deaths) == 3
        dependent = cl.submit(inc, fut)
        with pytest.raises(KilledWorker):
            dependent.result(30)
        assert cl.submit(inc, 1).result(30) == 2


@pytest.mark.slow
def test_timeout_kills_worker_and_spares_neighbours(tmp_path):
    marker = str(tmp_path / "go")
    with LocalCluster(n_workers=1, threads_per_worker=2, forward_logs=False) as c, Client(c) as cl:
        neighbour = cl.submit(block_until, marker, pure=False)    # running when the kill comes
        wait_running(c, neighbour)
        late = cl.submit(time.sleep, 300, timeout=0.3, pure=False)
        with pytest.raises(TaskTimeoutError) as info:
            late.result(60)
        assert info.value.timeout == 0.3 and info.value.elapsed >= 0.3
        assert "past its timeout of 0.3 s" in str(info.value)
        (death,) = c.deaths
        assert death.cause == "timeout" and set(death.tasks) == {late.key, neighbour.key}
        assert death.blamed == ()
        release(marker)
        assert neighbour.result(30) is None
        assert c.scheduler.tasks[neighbour.key].suspicious == 0


def hold_the_gil():
    return sum(range(10 ** 11))     # C loop that never releases the GIL


@pytest.mark.slow
def test_unresponsive_worker_dumps_stacks_then_dies():
    with LocalCluster(n_workers=1, worker_ttl=1.0, allowed_failures=0, forward_logs=False) as c, Client(c) as cl:
        fut = cl.submit(hold_the_gil)
        with pytest.raises(KilledWorker):
            fut.result(60)
        (death,) = c.deaths
        assert death.cause == "unresponsive" and death.tasks == (fut.key,)
        tail = "\n".join(death.log_tail)
        assert "no heartbeat" in tail and "hold_the_gil" in tail and "Thread 0x" in tail


@pytest.mark.slow
def test_an_unresponsive_death_names_the_stuck_frame_in_killed_worker():
    """The frame the task held the GIL in reaches the user in the exception text, not only
    in death.stack or the log."""
    import inspect
    line = inspect.getsourcelines(hold_the_gil)[1] + 1
    with LocalCluster(n_workers=1, worker_ttl=3, allowed_failures=0, forward_logs=False) as c, Client(c) as cl:
        fut = cl.submit(hold_the_gil)
        start = time.monotonic()
        with pytest.raises(KilledWorker) as info:
            fut.result(60)
        took = time.monotonic() - start
        text = str(info.value)
        assert f"line {line} in hold_the_gil" in text, text
        assert "stuck in: File " in text and "test_deaths.py" in text, text
        (death,) = c.deaths
        assert death.cause == "unresponsive"
        assert "It was stuck in File " in death.message and f"line {line} in hold_the_gil" in death.message
        assert took < 3 + 10, f"worker_ttl=3, yet KilledWorker came after {took:.1f} s"


def sleep_in_user_code(seconds):
    time.sleep(seconds)


@pytest.mark.slow
def test_a_timeout_names_the_frame_the_task_was_in():
    import inspect
    line = inspect.getsourcelines(sleep_in_user_code)[1] + 1
    with LocalCluster(n_workers=1, forward_logs=False) as c, Client(c) as cl:
        # The worker imports this module (pytest and all) first, or a loaded machine's import
        # can outlast the 0.3 s and the stack shows importlib, not the task's frame.
        assert cl.submit(inc, 1).result(30) == 2
        with pytest.raises(TaskTimeoutError) as info:
            cl.submit(sleep_in_user_code, 300, timeout=0.3, pure=False).result(60)
        assert f"line {line} in sleep_in_user_code" in str(info.value), str(info.value)
        wait_for(lambda: len(c.deaths) == 1)
        (death,) = c.deaths
        assert death.cause == "timeout"
        assert "It was in File " in death.message and f"line {line} in sleep_in_user_code" in death.message
        assert "was in: File " in death.summary() and "in sleep_in_user_code" in death.summary()


def _calls(depth):
    return _calls(depth - 1) if depth else None


def churn_then_overrun(threads):
    """Runs past its timeout while ``threads`` threads call and return without pause."""
    def churn():
        while True:
            _calls(5)
    for _ in range(threads):
        threading.Thread(target=churn, daemon=True).start()
    time.sleep(300)


@pytest.mark.slow
def test_the_stacks_before_a_timeout_kill_are_whole_while_other_threads_run():
    """The stacks asked for before a kill come from the worker's stacks thread, which writes
    them holding the GIL. faulthandler in a signal handler would read the frames of threads
    that run meanwhile. That could crash the worker, and its death then read SIGSEGV and lost
    the task's stack, instead of the timeout that killed it."""
    from localcluster.worker.process import STACKS_TAIL
    tail = STACKS_TAIL.split("{}")[0]
    with LocalCluster(n_workers=1, threads_per_worker=1, forward_logs=False) as c, Client(c) as cl:
        for n in range(3):
            # the new worker imports this module first: an import can outlast the timeout
            assert cl.submit(_calls, 0, pure=False).result(60) is None
            with pytest.raises(TaskTimeoutError):
                cl.submit(churn_then_overrun, 3, timeout=0.5, pure=False).result(60)
            wait_for(lambda: len(c.deaths) == n + 1)
        for death in c.deaths:
            assert (death.cause, death.signal) == ("timeout", "SIGKILL"), death
            assert any(line.startswith(tail) for line in death.log_tail), death.log_tail
            assert "in churn_then_overrun" in (death.stack or ""), death.stack


@pytest.mark.slow
def test_exit_from_a_non_task_thread_is_exit():
    def exit_soon():
        import threading
        import os
        threading.Timer(0.05, os._exit, (4,)).start()
        return 1
    with LocalCluster(n_workers=1, forward_logs=False) as c, Client(c) as cl:
        assert cl.submit(exit_soon).result(30) == 1
        wait_for(lambda: len(c.deaths) == 1)
        (death,) = c.deaths
        assert death.cause == "exit" and death.exitcode == 4 and death.tasks == ()
        wait_for(lambda: len(c.workers) == 1 and all(i.status == "running" for i in c.workers.values()))
        assert cl.submit(inc, 1).result(30) == 2


def broken_initializer():
    raise ImportError("No module named 's3fs'")


@pytest.mark.slow
def test_startup_failure_stops_retrying_with_a_clear_error():
    with pytest.raises(WorkerStartupError) as info:
        LocalCluster(n_workers=1, initializer=broken_initializer, forward_logs=False)
    text = str(info.value)
    assert "stopped restarting" in text and "No module named 's3fs'" in text
    deaths = info.value.deaths
    assert len(deaths) == 3 and all(d.cause == "exception" and d.exitcode == 1 for d in deaths)
    assert "s3fs" in deaths[0].message


@pytest.mark.slow
def test_an_initializer_from_a_script_names_its_file_when_it_fails(tmp_path):
    """A script's functions travel by value; their frames must still name the script, not
    cloudpickle's "<dynamic-code>" (the README's tour showed it)."""
    script = tmp_path / "setup_script.py"
    script.write_text("def broken_setup():\n    raise ImportError(\"No module named 's3fs'\")\n")
    namespace = {"__name__": "__main__"}        # what a script run with `python script.py` is
    exec(compile(script.read_text(), str(script), "exec"), namespace)
    with pytest.raises(WorkerStartupError) as info:
        LocalCluster(n_workers=1, initializer=namespace["broken_setup"], forward_logs=False)
    text = str(info.value)
    assert f'File "{script}", line 2, in broken_setup' in text and "<dynamic-code>" not in text, text


def test_requested_deaths_on_scale_down_and_close():
    with LocalCluster(n_workers=2, forward_logs=False) as c, Client(c) as cl:
        holder, other = sorted(c.workers)
        [big] = cl.scatter([bytes(200_000)], workers=[holder])    # too large to keep a copy in the parent
        ballast = cl.scatter([bytes(200_000), bytes(200_001)], workers=[other])
        c.scale(1)                                  # retires the worker holding fewer keys: the holder
        assert len(c.workers) == 1
        assert [(d.worker, d.cause) for d in c.deaths] == [(holder, "requested")]
        assert cl.submit(len, big).result(30) == 200_000     # data moved before the worker left
        deaths = c.deaths
        gathered = [len(v) for v in cl.gather(ballast)]
        c.scale(2)
        assert len(c.workers) == 2
    assert [d.cause for d in deaths] == ["requested"] * 3
    assert all(d.blamed == () for d in deaths)
    assert deaths[0].worker == holder and gathered == [200_000, 200_001]


def test_results_lost_with_a_worker_are_recomputed_from_lineage(client, cluster):
    x = client.submit(lambda: bytes(300_000), pure=False)      # large: lives only on its worker
    x.result(30)
    holder = next(iter(cluster.scheduler.tasks[x.key].who_has))
    os.kill(cluster.workers[holder].pid, signal.SIGKILL)
    wait_for(lambda: len(cluster.deaths) == 1)
    assert client.submit(len, x).result(30) == 300_000
    assert len(x.result(30)) == 300_000


def test_scattered_data_lost_raises_lost_data_error(client, cluster):
    data = client.scatter(bytes(300_000))
    (holder,) = cluster.scheduler.tasks[data.key].who_has
    os.kill(cluster.workers[holder].pid, signal.SIGKILL)
    wait_for(lambda: len(cluster.deaths) == 1)
    with pytest.raises(LostDataError, match="replicate") as info:
        data.result(30)
    assert info.value.key == data.key and info.value.worker == holder
    with pytest.raises(LostDataError):
        client.submit(len, data).result(30)
    assert data.status == "lost"


def test_replicate_survives_one_death(client, cluster):
    data = client.scatter(bytes(300_000))
    client.replicate(data, n=2)
    assert len(cluster.scheduler.tasks[data.key].who_has) == 2
    os.kill(cluster.workers[sorted(cluster.workers)[0]].pid, signal.SIGKILL)
    wait_for(lambda: len(cluster.deaths) == 1)
    assert len(data.result(30)) == 300_000
    assert client.submit(len, data).result(30) == 300_000


@pytest.mark.slow
def test_restart_cancels_pending_and_gives_fresh_workers(client, cluster):
    old = {i.pid for i in cluster.workers.values()}
    pending = client.submit(time.sleep, 30, pure=False)
    client.restart()
    with pytest.raises(ClusterRestarted, match="restarted"):
        pending.result(10)
    assert len(cluster.workers) == 2 and not old & {i.pid for i in cluster.workers.values()}
    assert {d.cause for d in cluster.deaths} == {"requested"}
    assert client.submit(inc, 1).result(10) == 2


def exit_now():
    os._exit(3)


@pytest.mark.slow
def test_restart_just_after_a_death_starts_exactly_as_many_workers(tmp_path):
    # The dead worker's replacement waits for the next tick; restart in between starts a
    # full set itself, and the replacement must not come on top (restart waits for exactly n).
    with LocalCluster(n_workers=2, threads_per_worker=1, allowed_failures=0, forward_logs=False) as cluster, \
            Client(cluster) as client:
        with pytest.raises(KilledWorker):
            client.submit(exit_now).result(30)
        client.restart(timeout=20)
        assert len(cluster.workers) == 2 and client.submit(inc, 1).result(10) == 2
        cluster.scale(3)
        client.wait_for_workers(3, timeout=20)
        assert len(cluster.workers) == 3


@pytest.mark.slow
def test_twenty_restarts_neither_hang_nor_leak(client, cluster):
    for i in range(20):
        client.restart()
        assert client.submit(inc, i).result(10) == i + 1
    assert len(cluster.deaths) == 40


def test_logs_are_captured_at_fd_level_and_forwarded(capfd):
    def chatty():
        print("hello from print")
        os.write(2, b"raw write to fd 2\n")
        return 1
    with LocalCluster(n_workers=1, forward_logs=True) as c, Client(c) as cl:
        cl.submit(chatty).result(30)
        wait_for(lambda: any("raw write" in l for lines in cl.get_worker_logs().values() for l in lines))
        logs = cl.get_worker_logs()
        (name,) = logs
        assert "hello from print" in logs[name] and "raw write to fd 2" in logs[name]
        os.kill(c.workers[name].pid, signal.SIGKILL)
        wait_for(lambda: len(c.deaths) == 1)
        assert "hello from print" in cl.get_worker_logs()[name]        # dead workers' logs stay
        assert "hello from print" in c.deaths[0].log_tail
    out, err = capfd.readouterr()
    assert f"[{name}] hello from print" in out and f"[{name}] raw write to fd 2" in err   # each to its own stream
    assert "hello from print" not in err and "raw write" not in out


def test_dump_stacks_of_live_workers(client, tmp_path):
    cluster = client.cluster
    marker = str(tmp_path / "go")
    fut = client.submit(block_until, marker, pure=False)
    wait_running(cluster, fut)
    dumps: list = []

    def every_thread_started() -> bool:
        dumps.append(cluster.dump_stacks(timeout=20))
        return all(s.count("(most recent call first)") == 5 for s in dumps[-1].values())
    # The stacks thread starts first and answers with the threads there are: a young worker's
    # executor may already run a task while its main thread still starts the flusher and the
    # heartbeat. Every thread's stack, once started: main, executor, flusher, heartbeat and
    # the stacks thread.
    wait_for(every_thread_started, timeout=30)
    release(marker)
    for stacks in dumps:
        # the worker's main loop last, and the dump only: not the lines around it
        assert len(stacks) == 2 and all(s.rstrip().endswith("in <module>") and "for request" not in s
                                        for s in stacks.values()), "\n=====\n".join(stacks.values())
        assert sum(f"running task {fut.key!r}" in s for s in stacks.values()) == 1
    assert fut.result(30) is None and cluster.deaths == []


def deep(n):
    return deep(n - 1) + 1 if n else 0


def call_and_return_until(path, started):
    """Frames pushed and popped without a pause, until ``path`` exists."""
    open(started, "w").close()
    while not os.path.exists(path):
        for _ in range(100):
            deep(30)


@pytest.mark.slow
def test_dump_stacks_while_every_thread_calls_and_returns(tmp_path):
    """Each dump whole, and the worker alive, however busy its threads are. faulthandler's
    dump from a signal handler read the frames of threads running meanwhile: it followed a
    frame being pushed (the worker died of SIGSEGV in its own dump) or dropped a request
    that came while its previous dump was being finished (the dump never came)."""
    marker = str(tmp_path / "go")
    with LocalCluster(n_workers=1, threads_per_worker=3, forward_logs=False) as cluster, Client(cluster) as client:
        started = [str(tmp_path / f"started-{i}") for i in range(3)]
        futs = [client.submit(call_and_return_until, marker, s) for s in started]
        wait_for(lambda: all(map(os.path.exists, started)))
        try:
            for i in range(500):
                stacks = cluster.dump_stacks(timeout=10)
                assert list(stacks) == ["worker-0"] and cluster.deaths == [], (i, stacks, cluster.deaths)
                text = stacks["worker-0"]
                # main, 3 executors, flusher, heartbeat (and the stacks thread)
                assert text.count("(most recent call first)") >= 6 and text.rstrip().endswith("in <module>"), text
                assert text.count("in call_and_return_until") == 3, text
        finally:
            release(marker)
        assert client.gather(futs) == [None] * 3 and cluster.deaths == []


@fragile
@pytest.mark.slow
def test_replay_of_a_crashing_task_happens_in_a_throwaway_process(cluster, client):
    from localcluster.integrations.replay import ReplayedDeath
    fut = client.submit(at_call, "segfault")
    with pytest.raises(KilledWorker):
        fut.result(30)
    with pytest.raises(ReplayedDeath) as info:
        client.recreate_error_locally(fut)
    assert info.value.death.cause == "crash" and info.value.death.signal == "SIGSEGV"
    assert "at_call" in info.value.death.stack
    assert psutil.Process().is_running()
