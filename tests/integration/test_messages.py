"""What a user reads when something goes wrong: quiet by default, never circular, never
silent, never a restart loop. Each test asserts the text or behaviour the user sees."""
from __future__ import annotations

import asyncio
import concurrent.futures as cf
import inspect
import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading

import pytest
from _util import block_until, release, wait_running

import localcluster
from localcluster import (Client, ClusterClosed, KilledWorker, LocalCluster, ReplayedDeath, TaskTimeoutError,
                          WorkerStartupError)

pytestmark = pytest.mark.timeout(90)

PACKAGE = os.path.dirname(os.path.abspath(localcluster.__file__))
REPO = os.path.dirname(PACKAGE)


def run_script(tmp_path, body: str, timeout: float = 80) -> subprocess.CompletedProcess:
    """``body`` as a user's script, run by a fresh interpreter with default settings."""
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(body))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=timeout,
                          cwd=tmp_path, env=env)


# --- 1. a limit below what an idle worker needs --------------------------------------------

def test_a_limit_below_an_idle_worker_is_refused_at_construction():
    with pytest.raises(ValueError) as info:
        LocalCluster(n_workers=1, memory_limit="1KiB")
    text = str(info.value)
    assert "memory_limit=1.00 KiB is too small" in text
    idle = re.search(r"an idle worker needs ([\d.]+) MiB", text)
    assert idle and 5 < float(idle.group(1)) < 500          # the measured footprint of a real worker
    assert "at least" in text and "None for no limit" in text


@pytest.mark.slow
def test_scaling_up_under_a_tiny_limit_ends_in_startup_error_not_a_loop():
    with LocalCluster(n_workers=0, memory_limit="1KiB", forward_logs=False) as c:
        with pytest.raises(WorkerStartupError) as info:
            c.scale(1)
        deaths = info.value.deaths
        assert len(deaths) == 3 and all(d.cause == "memory-limit" and d.tasks == () for d in deaths)
        assert "killed for memory while running no task" in str(info.value)
        assert "1.00 KiB" in str(info.value)
        assert len(c.deaths) == 3                  # and no fourth: the loop stopped


# --- 2. one line per death by default ------------------------------------------------------

SEGFAULT_SCRIPT = """
    from localcluster import LocalCluster, Client

    def crash():
        import ctypes
        ctypes.string_at(0)

    if __name__ == "__main__":
        with LocalCluster(n_workers=2{extra}) as cluster, Client(cluster) as client:
            client.submit(crash).result(60)
"""


@pytest.mark.slow
def test_a_segfault_prints_one_line_per_death_and_the_exception(tmp_path):
    proc = run_script(tmp_path, SEGFAULT_SCRIPT.format(extra=""))
    assert proc.returncode == 1
    err = proc.stderr.splitlines()
    before = err[:err.index("Traceback (most recent call last):")]
    deaths = [l for l in before if "died: crash, SIGSEGV" in l]
    assert len(deaths) == 4                                   # allowed_failures=3 by default
    assert len(before) <= 2 * len(deaths), before
    assert "Fatal Python error" not in proc.stderr and "Thread 0x" not in proc.stderr
    assert all("running 'crash-" in l and "memory" in l and "(pid " in l for l in deaths)
    assert "KilledWorker" in err[-1] or any(l.startswith("localcluster.death.KilledWorker") for l in err)


@pytest.mark.slow
def test_forward_logs_all_shows_the_full_dump(tmp_path):
    proc = run_script(tmp_path, SEGFAULT_SCRIPT.format(extra=', forward_logs="all"'))
    assert proc.returncode == 1
    assert "Fatal Python error: Segmentation fault" in proc.stderr and "Current thread 0x" in proc.stderr


def crash():
    import ctypes
    ctypes.string_at(0)


@pytest.mark.slow
def test_the_death_keeps_only_the_task_thread_without_localclusters_frames():
    with LocalCluster(n_workers=1, allowed_failures=0, forward_logs=False) as c, Client(c) as cl:
        with pytest.raises(KilledWorker):
            cl.submit(crash).result(30)
        (death,) = c.deaths
    assert "in crash" in death.stack and "string_at" in death.stack
    # The package's own folder, not the word: a checkout named localcluster/ holds this file too.
    assert PACKAGE + os.sep not in death.stack and "_bootstrap" not in death.stack
    assert death.stack.count("thread 0x") + death.stack.count("Thread 0x") == 1     # one thread: the task's
    tail = "\n".join(death.log_tail)
    assert "_heartbeat" in tail and "Thread 0x" in tail      # the full dump stays in the log tail
    assert PACKAGE + os.sep in tail         # where the package's frames are: the check above can fail


def test_forward_logs_all_keeps_every_thread_in_the_stack():
    with LocalCluster(n_workers=1, allowed_failures=0, forward_logs="all") as c, Client(c) as cl:
        with pytest.raises(KilledWorker):
            cl.submit(crash).result(30)
        (death,) = c.deaths
    assert death.stack.startswith("Fatal Python error") and "Current thread 0x" in death.stack
    assert "_heartbeat" in death.stack and "in crash" in death.stack


# --- 3. a timeout says where the task was --------------------------------------------------

def wait_forever():
    threading.Event().wait()


def _loaded():
    return True


@pytest.mark.slow
def test_a_timeout_death_carries_the_stack_where_the_task_waited():
    with LocalCluster(n_workers=1, forward_logs=False) as c, Client(c) as cl:
        # this module imported on the worker first: on a loaded machine the import alone
        # (pytest and all) can outlast the 0.5 s, and the stack would show the import
        cl.submit(_loaded).result(60)
        with pytest.raises(TaskTimeoutError) as info:
            cl.submit(wait_forever, timeout=0.5).result(60)
        (death,) = c.deaths
    assert death.cause == "timeout"
    assert "in wait_forever" in death.stack and re.search(r"threading\.py\", line \d+ in wait", death.stack)
    text = str(info.value)
    assert info.value.stack == death.stack
    assert "Where it was when stopped" in text and "in wait_forever" in text


# --- 4. advice that fits where it is raised; every error importable -------------------------

@pytest.mark.slow
def test_replayed_death_does_not_advise_what_was_just_called():
    with LocalCluster(n_workers=1, allowed_failures=0, forward_logs=False) as c, Client(c) as cl:
        fut = cl.submit(crash)
        with pytest.raises(KilledWorker) as killed:
            fut.result(30)
        assert "recreate_error_locally" in str(killed.value)     # where the user holds the future
        with pytest.raises(ReplayedDeath) as info:
            cl.recreate_error_locally(fut)
    assert "recreate_error_locally" not in str(info.value)
    assert "SIGSEGV" in str(info.value)


def test_every_error_a_user_can_receive_is_exported():
    """From ``localcluster``, or, for an integration that needs an extra, from its public
    module (``localcluster.dask``: distributed). A private class (a formatting helper) is never raised."""
    import importlib
    import pkgutil
    import localcluster.dask
    defined = set()
    for mod in pkgutil.walk_packages(localcluster.__path__, "localcluster."):
        module = importlib.import_module(mod.name)
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == module.__name__ \
                    and not name.startswith("_"):
                defined.add(name)
    public = set(localcluster.__all__) | set(localcluster.dask.__all__)
    assert defined and defined <= public, defined - public
    assert all(getattr(localcluster, name, None) is not None or getattr(localcluster.dask, name) is not None
               for name in defined)


# --- 5. os._exit inside a task is said as it happened --------------------------------------

def exit_three():
    os._exit(3)


def test_exit_inside_a_task_names_the_code_and_the_task():
    with LocalCluster(n_workers=1, allowed_failures=0, forward_logs=False) as c, Client(c) as cl:
        fut = cl.submit(exit_three)
        with pytest.raises(KilledWorker):
            fut.result(30)
        (death,) = c.deaths
    assert death.cause == "exit"
    assert f"exited with code 3 while running {fut.key!r}" in death.message
    assert "outside a task" not in death.message and "outside any task" not in death.message


# --- 8 and 9. a TimeoutError says why; no worker is never silent ---------------------------

def test_result_timeout_says_the_task_is_running_and_where(client, tmp_path):
    marker = str(tmp_path / "go")
    fut = client.submit(block_until, marker, pure=False)
    n = wait_running(client.cluster, fut)
    dependent = client.submit(len, [fut])
    with pytest.raises(cf.TimeoutError, match=rf"task {re.escape(repr(fut.key))} is still running on "
                                              rf"{n.name} \(started [\d.]+ s ago\)"):
        fut.result(timeout=0.05)
    with pytest.raises(cf.TimeoutError, match=r"is waiting for 1 dependency \('block_until-"):
        dependent.result(timeout=0.05)
    release(marker)
    assert dependent.result(30) == 1


@pytest.mark.slow
def test_every_timeout_quotes_the_timeout_given_not_what_was_left(client, tmp_path):
    """result() waits reading the reply itself first, then as usual with what is left of the
    timeout: the message quotes the caller's (it said "result(timeout=0)")."""
    marker = str(tmp_path / "go")
    fut = client.submit(block_until, marker, pure=False)
    wait_running(client.cluster, fut)
    with pytest.raises(cf.TimeoutError, match=rf"^result\(timeout=0.2\) timed out: task {re.escape(repr(fut.key))} "
                                              rf"is still running"):
        fut.result(timeout=0.2)
    with pytest.raises(cf.TimeoutError, match=r"^exception\(timeout=0.05\) timed out: task "):
        fut.exception(timeout=0.05)
    not_done = r"1 of 1 futures were not done after 0.05 s: task "
    with pytest.raises(TimeoutError, match=r"^gather\(timeout=0.05\): " + not_done):
        client.gather([fut], timeout=0.05)
    with pytest.raises(TimeoutError, match=r"^gather\(timeout=0.05\): " + not_done):
        asyncio.run(client.gather([fut], asynchronous=True, timeout=0.05))
    release(marker)
    assert fut.result(30) is None


def test_a_cancelled_future_names_its_task_and_who_cancelled_it(client, tmp_path):
    marker = str(tmp_path / "go")
    head = client.submit(block_until, marker, pure=False)
    tail = client.submit(len, [head])
    called = threading.Event()
    tail.add_done_callback(lambda f: called.set())     # a future with waiters ends the other way
    wait_running(client.cluster, head)
    assert head.cancel()
    assert called.wait(30)
    said = rf"^Task {re.escape(repr(head.key))} was cancelled by Client.cancel or Future.cancel in your process, "
    with pytest.raises(cf.CancelledError, match=said + "and its data is let go of: submit it again"):
        head.result(30)
    with pytest.raises(cf.CancelledError, match=said):
        head.exception(30)
    with pytest.raises(cf.CancelledError, match=said):
        client.gather([head])
    with pytest.raises(cf.CancelledError, match=rf"^Task {re.escape(repr(tail.key))} was cancelled with "
                                                rf"{re.escape(repr(head.key))}, an input it needs"):
        tail.result(30)
    assert head.status == tail.status == "cancelled"
    release(marker)


def test_no_worker_warns_on_submit_and_the_timeout_says_why(caplog):
    with LocalCluster(n_workers=0, forward_logs=False) as c, Client(c) as cl:
        with caplog.at_level(logging.WARNING, logger="localcluster"):
            fut = cl.submit(sum, [1, 2])
            for i in range(100):
                cl.submit(abs, -i)
            cl.map(abs, [-1, -2, -3])
        warnings = [r.getMessage() for r in caplog.records if "no worker" in r.getMessage()]
        assert len(warnings) == 1                     # once while no worker runs, not once per call
        assert fut.key in warnings[0] and "cluster.scale(n)" in warnings[0]
        with pytest.raises(cf.TimeoutError, match="is queued: no worker is running"):
            fut.result(timeout=0.05)
        c.scale(1)
        assert fut.result(30) == 3
        c.scale(0)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="localcluster"):
            cl.map(abs, [-4, -5, -6])                 # a new period with no worker: said again
        warnings = [r.getMessage() for r in caplog.records if "no worker" in r.getMessage()]
        assert len(warnings) == 1 and "3 tasks" in warnings[0]


class HoldAtDeathLine(logging.Handler):
    """Holds the scheduler thread on a death's console line: that line is written after the
    dead worker has left cluster.workers and before its replacement is spawned (on the next
    tick), so a submit made meanwhile lands, every time, where no worker runs yet one is due."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.dead, self.go = threading.Event(), threading.Event()

    def handle(self, record):
        # without the handler's lock, which Handler.handle holds around emit: the test
        # thread's own records (the warning under test) must not queue behind the hold
        self.emit(record)
        return True

    def emit(self, record):
        if " died: " in record.getMessage() and not self.dead.is_set():
            self.dead.set()
            self.go.wait(30)


def test_no_no_worker_warning_while_a_dead_workers_replacement_starts(caplog):
    hold = HoldAtDeathLine()
    log = logging.getLogger("localcluster")
    with LocalCluster(n_workers=1, forward_logs=False) as c, Client(c) as cl, \
            caplog.at_level(logging.INFO, logger="localcluster"):
        log.addHandler(hold)
        try:
            (info,) = c.workers.values()
            os.kill(info.pid, signal.SIGKILL)
            assert hold.dead.wait(30)
            assert c.workers == {}                        # the window: no worker runs
            fut = cl.submit(sum, [1, 2])
            said = [r.getMessage() for r in caplog.records if "no worker" in r.getMessage()]
            assert said == [], said
            with pytest.raises(cf.TimeoutError, match="no worker is up (right now|yet).*starting"):
                fut.result(timeout=0.01)
        finally:
            hold.go.set()
            log.removeHandler(hold)
        assert fut.result(30) == 3
        assert [d.cause for d in c.deaths] == ["signal"]


# --- 10. closing has its own error -----------------------------------------------------------

def test_pending_work_at_close_gets_cluster_closed(tmp_path):
    marker = str(tmp_path / "never")
    c = LocalCluster(n_workers=1, forward_logs=False)
    cl = Client(c)
    fut = cl.submit(block_until, marker, pure=False)
    queued = cl.map(abs, range(-2000, 0))      # failed in one batch, each future all the same
    called = []
    queued[7].add_done_callback(called.append)   # one with a callback, so with a Condition
    c.close()
    with pytest.raises(ClusterClosed, match="closed") as info:
        fut.result(10)
    assert isinstance(info.value, cf.CancelledError)
    assert called == [queued[7]]
    assert all(f.done() and f.status == "error" and isinstance(f.exception(0), ClusterClosed) for f in queued)
    with pytest.raises(ClusterClosed):
        queued[-1].result(0)
    cl.close()


def test_repr_counts_in_good_english():
    with LocalCluster(n_workers=1, forward_logs=False) as c:
        assert "1 worker, 1 thread each" in repr(c)
