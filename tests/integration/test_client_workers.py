"""dask's calls about workers and the scheduler (issue 50): nthreads/ncores, has_what,
processing, run_on_scheduler, story, shutdown. examples/portable.py prints the same for each
under distributed (tests/external/test_distributed_compat.py); here, what a one-machine run can check."""
from __future__ import annotations

import os

import pytest

from _util import block_until, release, wait_running
from localcluster import Client, LocalCluster


def inc(x):
    return x + 1


def test_nthreads_and_has_what_by_worker_name(client):
    names = sorted(client.cluster.workers)
    assert client.nthreads() == {name: 1 for name in names} == client.ncores()
    assert client.nthreads(workers=names[0]) == {names[0]: 1}
    x = client.scatter(41, workers=[names[1]])
    assert client.has_what()[names[1]] == (x.key,) and client.has_what()[names[0]] == ()
    assert client.has_what(workers=[names[1]]) == {names[1]: (x.key,)}
    with pytest.raises(ValueError, match=r"no running worker is called 'nobody'"):
        client.has_what(workers=["nobody"])


@pytest.mark.timeout(30)
def test_processing_names_the_running_task(client, tmp_path):
    gate = str(tmp_path / "go")
    fut = client.submit(block_until, gate, pure=False)
    where = wait_running(client.cluster, fut)
    assert client.processing()[where.name] == (fut.key,)
    release(gate)
    fut.result(30)
    assert all(keys == () for keys in client.processing().values())


def test_run_on_scheduler_runs_in_this_process(client):
    assert client.run_on_scheduler(os.getpid) == os.getpid()
    assert client.run_on_scheduler(inc, 1) == 2 and client.run_on_scheduler(lambda *, x: x * 2, x=4) == 8

    async def later(x):
        return x + 10
    assert client.run_on_scheduler(later, 1) == 11
    with pytest.raises(ZeroDivisionError):
        client.run_on_scheduler(lambda: 1 / 0)


@pytest.mark.slow
def test_story_of_a_key(client):
    fut = client.submit(inc, 1)
    fut.result(30)
    story = client.story(fut)
    assert story == client.story(fut.key)
    assert [s[:4] for s in story][-1] == ("scheduler", fut.key, "processing", "memory")
    assert all(isinstance(s[4], str) and s[4] for s in story)       # the event that caused it
    assert client.story("never-submitted") == []
    with pytest.raises(TypeError, match="story\\(\\) takes keys"):
        client.story(3)


def test_shutdown_closes_the_cluster_it_was_given():
    cluster = LocalCluster(n_workers=1, forward_logs=False)
    other = Client(cluster)
    client = Client(cluster)
    client.shutdown()
    assert client.status == "closed"
    with pytest.raises(RuntimeError, match="closed"):
        other.submit(inc, 1)
    other.close()
    client.shutdown()               # again: nothing left to close


def test_futures_of_finds_them_in_lists_and_dicts(client):
    from localcluster import futures_of
    a, b = client.submit(inc, 1), client.submit(inc, 2)
    assert futures_of([a, {"x": b, "y": [a, 3]}]) == [a, b]
    assert futures_of(a) == [a] and futures_of([1, "two"]) == []
