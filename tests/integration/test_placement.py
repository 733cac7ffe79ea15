"""Placement you can ask for (workers= / allow_other_workers=), through real workers."""
from __future__ import annotations

import os
import signal

import numpy as np
import pytest
from _util import block_until, wait_for

from localcluster import Client, LocalCluster


def getpid(*_):
    return os.getpid()


@pytest.fixture
def trio():
    with LocalCluster(n_workers=3, forward_logs=False) as cluster, Client(cluster) as client:
        yield cluster, client


@pytest.mark.slow
def test_submit_and_map_run_where_they_are_told(trio):
    cluster, client = trio
    w0, w1, w2 = sorted(cluster.workers)
    pid = {name: info.pid for name, info in cluster.workers.items()}
    assert {client.submit(getpid, i, workers=w1, pure=False).result(30) for i in range(8)} == {pid[w1]}
    assert set(client.gather(client.map(getpid, range(12), workers=[w0, w2], pure=False))) <= {pid[w0], pid[w2]}
    assert set(client.gather(client.map(getpid, range(12), workers=[w2], allow_other_workers=True,
                                        pure=False))) == {pid[w2]}


def test_scatter_puts_data_where_it_is_told(trio):
    cluster, client = trio
    w0, w1, w2 = sorted(cluster.workers)
    [f] = client.scatter([np.ones(1_000_000)], workers=[w2])
    f.result(30)
    # the figures come from the workers' boards, written once the data is stored
    wait_for(lambda: cluster.workers[w2].managed >= 8_000_000)
    assert cluster.workers[w0].managed == cluster.workers[w1].managed == 0
    fs = client.scatter([np.ones(1_000_000)] * 2, workers=[w0, w1], broadcast=True)
    client.gather(fs)
    wait_for(lambda: cluster.workers[w0].managed >= 16_000_000 and cluster.workers[w1].managed >= 16_000_000)


def pid_once_released(path):
    block_until(path)
    return os.getpid()


@pytest.mark.slow
def test_a_preference_falls_back_and_a_requirement_says_why_it_cannot(trio, tmp_path):
    cluster, client = trio
    w0, w1, _w2 = sorted(cluster.workers)
    dead_pid = cluster.workers[w0].pid
    release = str(tmp_path / "release")
    loose = client.submit(pid_once_released, release, workers=[w0], allow_other_workers=True)
    strict = client.submit(getpid, 2, workers=[w0], pure=False)     # queued behind it on w0
    os.kill(dead_pid, signal.SIGKILL)
    with pytest.raises(RuntimeError, match=rf"may run only on {w0}.*allow_other_workers=True"):
        strict.result(30)
    open(release, "w").close()
    assert loose.result(30) not in (dead_pid, None)                # reran elsewhere
    with pytest.raises(ValueError, match=rf"no running worker is called '{w0}'"):
        client.submit(getpid, 3, workers=[w0])                     # a dead name is refused up front
    assert client.submit(getpid, 4, workers=[w0], allow_other_workers=True).result(30) != dead_pid


def test_bad_workers_arguments_are_refused_clearly(trio):
    cluster, client = trio
    with pytest.raises(ValueError, match=r"no running worker is called 'nope'; the workers are"):
        client.submit(getpid, workers=["nope"])
    with pytest.raises(TypeError, match=r"workers=3: expected a worker name or a list of names"):
        client.submit(getpid, workers=3)
    with pytest.raises(TypeError, match=r"allow_other_workers='yes': expected True or False"):
        client.map(getpid, [1], workers=sorted(cluster.workers)[:1], allow_other_workers="yes")
    with pytest.raises(ValueError, match="nope"):
        client.scatter([1], workers="nope")
    assert client.scatter([1], workers="nope", allow_other_workers=True)[0].result(30) == 1
