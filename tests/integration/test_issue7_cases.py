"""The cases that broke with data of realistic size (issue 7), each as it was reported."""
from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from _data import fingerprint
from localcluster import Client, LocalCluster, wait

MiB = 1 << 20


def first_element_plus(a, i):
    return float(a[0]) + i


def length_plus(b, i):
    return len(b) + i


@pytest.mark.slow
def test_case1_scattered_array_used_by_40_tasks(cluster, client):
    big = client.scatter(np.ones(2_000_000))
    fs = [client.submit(first_element_plus, big, i, pure=False) for i in range(40)]
    assert client.gather(fs) == [1.0 + i for i in range(40)]
    assert cluster.deaths == []
    assert len({cluster.workers[w].pid for w in cluster.workers}) == 2


@pytest.mark.slow
def test_case1_scattered_5mb_bytes_used_by_40_tasks(cluster, client):
    big = client.scatter(b"x" * 5_000_000)
    fs = [client.submit(length_plus, big, i, pure=False) for i in range(40)]
    assert client.gather(fs) == [5_000_000 + i for i in range(40)]
    assert cluster.deaths == []


@pytest.mark.slow
def test_case2_the_scheduler_thread_survives_relaying_large_data(cluster, client):
    w0, w1 = sorted(cluster.workers)
    big = client.scatter(np.arange(2_000_000.0), workers=[w0])
    # Every one of these needs the array relayed through the parent to w1.
    fs = [client.submit(first_element_plus, big, i, workers=[w1], pure=False) for i in range(10)]
    assert client.gather(fs) == [float(i) for i in range(10)]
    assert client.submit(first_element_plus, big, 1, pure=False).result(30) == 1.0   # still serving
    assert cluster.deaths == []


def twenty_mb(i):
    return np.full(20 * MiB // 8, i, dtype="f8")


def total_plus(a, j):
    return float(a.sum()) + j


@pytest.mark.slow
def test_case3_six_20mb_results_each_read_by_three_dependents(cluster, client):
    results = [client.submit(twenty_mb, i, pure=False) for i in range(6)]
    dependents = [client.submit(total_plus, r, j, pure=False) for r in results for j in range(3)]
    n = 20 * MiB // 8
    assert client.gather(dependents, ) == [float(i * n) + j for i in range(6) for j in range(3)]
    assert cluster.deaths == []


@pytest.mark.slow
def test_case4_replicate_a_large_scattered_value_then_lose_one_holder(cluster, client):
    w0, w1 = sorted(cluster.workers)
    value = np.arange(2_000_000.0)
    big = client.scatter(value, workers=[w0])
    client.replicate([big], n=2)
    assert cluster.deaths == []
    assert cluster.workers[w1].managed >= value.nbytes       # the copy is really on w1
    os.kill(cluster.workers[w0].pid, signal.SIGKILL)
    assert client.submit(first_element_plus, big, 1, workers=[w1]).result(30) == 1.0
    np.testing.assert_array_equal(big.result(30), value)
    assert [d.cause for d in cluster.deaths] == ["signal"]    # the kill, not the replicate


def forty_mib(i, kind):
    block = bytes([i % 251]) * (40 * MiB)
    return {"bytes": block, "bytearray": bytearray(block), "numpy": np.frombuffer(block, dtype="u1").copy()}[kind]


@pytest.mark.parametrize("kind", ["bytes", "bytearray", "numpy"])
@pytest.mark.slow
def test_case5_spilling_keeps_a_small_worker_alive_whatever_the_type(kind):
    with LocalCluster(n_workers=1, memory_limit="400MiB", forward_logs=False) as cluster, Client(cluster) as client:
        fs = [client.submit(forty_mib, i, kind, pure=False) for i in range(12)]
        wait(fs, timeout=120)
        assert cluster.deaths == [], [d.message for d in cluster.deaths]
        (info,) = cluster.workers.values()
        assert info.spilled > 0
        assert info.managed + info.spilled >= 12 * 40 * MiB
        for i, f in enumerate(fs):
            assert fingerprint(f.result(60)) == fingerprint(forty_mib(i, kind))
            del f
        assert cluster.deaths == []
