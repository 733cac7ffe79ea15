"""cluster.adapt(minimum, maximum) through real processes: the size follows a burst of work
up and back down, and data a retiring worker holds is handed to another first. The
decisions themselves are tested without processes in tests/unit/test_policy.py."""
from __future__ import annotations

import logging
import time

import pytest

from localcluster import Client, LocalCluster
from localcluster.system.machine import usable_cpus

from _util import block_until, release, wait_for
from localcluster.client.future import gateway_of

BIG = 1 << 20       # above INLINE_RESULT: the result stays on its worker


def square(i: int, marker: str) -> int:
    block_until(marker)
    return i * i


def big(tag: int, marker: str, runs: str) -> bytes:
    block_until(marker)
    with open(runs, "a") as f:      # one line per run: a recompute would add one
        f.write(f"{tag}\n")
    return bytes([tag]) * BIG


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_adapt_goes_from_0_to_2_and_back_to_0_around_a_burst(tmp_path, caplog):
    marker = str(tmp_path / "go")
    caplog.set_level(logging.WARNING, logger="localcluster")
    with LocalCluster(n_workers=0, threads_per_worker=1, memory_limit=None, forward_logs=False,
                      adapt_interval=0.1) as cluster, Client(cluster) as client:
        cluster.adapt(minimum=0, maximum=2)     # returns at once: nothing to do yet
        assert cluster.workers == {}
        futures = client.map(square, range(6), marker=marker)
        assert "no worker" not in caplog.text       # adapting: a worker is on its way, nothing to say
        cluster.wait_for_workers(2, timeout=30)     # six tasks wait: as many workers as allowed
        assert len(cluster.workers) == 2
        release(marker)
        assert client.gather(futures, timeout=30) == [i * i for i in range(6)]
        # idle: back to 0 (small results are kept in the parent: no worker has to stay for them)
        wait_for(lambda: not cluster.workers, timeout=30)
        assert [d.cause for d in cluster.deaths] == ["requested", "requested"]     # never a third
        assert client.gather(futures) == [i * i for i in range(6)]
        # a second burst calls them back
        assert client.submit(square, 7, marker).result(30) == 49
        wait_for(lambda: not cluster.workers, timeout=30)


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_scaling_down_hands_a_retiring_workers_data_to_the_one_that_stays(tmp_path):
    marker, runs = str(tmp_path / "go"), str(tmp_path / "runs")
    with LocalCluster(n_workers=2, threads_per_worker=1, memory_limit=None, forward_logs=False,
                      adapt_interval=0.1) as cluster, Client(cluster) as client:
        # one large result on each worker, both still wanted
        a = client.submit(big, 1, marker, runs, workers=["worker-0"])
        b = client.submit(big, 2, marker, runs, workers=["worker-1"])
        wait_for(lambda: len(gateway_of(client).running_tasks()) == 2, timeout=30)
        cluster.adapt(0, 2)
        release(marker)
        wait_for(lambda: a.done() and b.done(), timeout=30)  # noqa: F821 - called before the del below
        # adapt may already be handing a's data over by now: a sits on worker-0, on both, or
        # on worker-1 alone; b never moves
        assert client.who_has([a, b])[b.key] == ("worker-1",)
        assert client.who_has([a, b])[a.key] in {("worker-0",), ("worker-0", "worker-1"),
                                                 ("worker-1", "worker-0"), ("worker-1",)}
        # nothing runs: it shrinks, but not below one worker while they hold data still needed
        # (the death is recorded a moment before the worker leaves cluster.workers)
        wait_for(lambda: len(cluster.deaths) == 1 and list(cluster.workers) == ["worker-1"], timeout=30)
        assert cluster.deaths[0].cause == "requested"
        assert client.who_has([a, b]) == {a.key: ("worker-1",), b.key: ("worker-1",)}     # handed off
        assert a.result(30) == bytes([1]) * BIG and b.result(30) == bytes([2]) * BIG
        with open(runs) as f:
            assert sorted(f.read().split()) == ["1", "2"]       # each ran once: nothing recomputed
        del a, b        # nothing held any more: the last one goes too
        wait_for(lambda: not cluster.workers, timeout=30)


def test_adapt_refuses_bad_bounds():
    with LocalCluster(n_workers=0, memory_limit=None, forward_logs=False) as cluster:
        with pytest.raises(ValueError, match=r"adapt\(minimum=3, maximum=2\): minimum is above maximum"):
            cluster.adapt(3, 2)
        for bad in (-1, 1.5, "2", True):
            with pytest.raises(ValueError, match=r"adapt\(minimum=.*expected an integer >= 0"):
                cluster.adapt(minimum=bad, maximum=4)
            with pytest.raises(ValueError, match=r"adapt\(maximum=.*expected an integer >= 0"):
                cluster.adapt(maximum=bad)
        with pytest.raises(ValueError, match=r"adapt\(wait_count=0\): expected an integer >= 1"):
            cluster.adapt(0, 2, wait_count=0)
        with pytest.raises(ValueError, match=r"adapt\(interval='soon'\): expected a number of seconds > 0"):
            cluster.adapt(0, 2, interval="soon")
        assert cluster.workers == {}        # nothing refused changed anything


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_adapt_again_replaces_the_bounds_and_scale_stops_it():
    with LocalCluster(n_workers=0, memory_limit=None, forward_logs=False) as cluster:
        cluster.adapt(1, 1, interval="50ms")
        cluster.wait_for_workers(1, timeout=30)     # minimum 1: one worker with no work at all
        cluster.adapt(0, 1, wait_count=2, interval=0.05)    # replaced: idle, it goes after 0.1 s
        wait_for(lambda: not cluster.workers, timeout=30)
        cluster.scale(2)                            # scale() ends adapting: both stay, idle
        # No event says "nothing happened": ten idle periods of the last adapt(), then look.
        time.sleep(1.0)
        assert len(cluster.workers) == 2 and len(cluster.deaths) == 1


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_adapt_with_no_maximum_stops_at_the_cpus(tmp_path):
    marker, cpus = str(tmp_path / "go"), usable_cpus()
    with LocalCluster(n_workers=0, memory_limit=None, forward_logs=False, adapt_interval=0.1) as cluster, \
            Client(cluster) as client:
        cluster.adapt()
        futures = client.map(square, range(cpus + 2), marker=marker)
        cluster.wait_for_workers(cpus, timeout=30)
        release(marker)
        assert client.gather(futures, timeout=30) == [i * i for i in range(cpus + 2)]
        wait_for(lambda: not cluster.workers, timeout=30)
        assert len(cluster.deaths) == cpus          # never one more than the CPUs
        cluster.adapt(minimum=cpus + 1)             # no maximum: the minimum, then
        cluster.wait_for_workers(cpus + 1, timeout=30)
