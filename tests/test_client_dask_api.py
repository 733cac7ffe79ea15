"""The rest of dask's Client API (issue 50): Future.retry / traceback / type / release and
Client.retry; datasets; events; the task stream; dump_cluster_state. examples/dask_api.py
prints the same for each under distributed (tests/test_distributed_compat.py); here, what a
one-machine run can check."""
from __future__ import annotations

import os
import traceback

import pytest

from _util import wait_for
from localcluster import Client, LocalCluster


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
    assert big.needs_fetch()       # not fetched for it


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
