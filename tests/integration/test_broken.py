"""An internal error never hangs anyone (fault injection through real processes).

In the parent, a failure of the scheduler (on its thread, or on a user thread that runs
it) breaks the cluster: every pending future and every later call fails at once with
ClusterBroken, which carries the internal traceback; the workers are stopped.
In a worker, a failure while serving data fails that request with a StoreError that
names the key and the step, and the worker lives on.
"""
from __future__ import annotations

import concurrent.futures as cf

import numpy as np
import psutil
import pytest
from _util import block_until, wait_for, wait_running

import localcluster
from localcluster import ClusterBroken, Client, LocalCluster, StoreError, WorkerStartupError


def inc(x):
    return x + 1


def big(seed):
    return np.full(500_000, seed, dtype="f8")


def first(a):
    return float(a[0])


def worker_pids(cluster):
    return {i.pid for i in cluster.workers.values()}


def assert_stopped(pids):
    """The workers were killed and reaped (they exit and are reaped right after the futures fail)."""
    procs = []
    for p in pids:
        try:
            procs.append(psutil.Process(p))
        except psutil.NoSuchProcess:    # already gone: what we wait for
            pass
    gone, alive = psutil.wait_procs(procs, timeout=30)
    assert not alive
    assert not any(psutil.pid_exists(p) for p in pids)


def assert_broken(err):
    assert isinstance(err, ClusterBroken) and not isinstance(err, WorkerStartupError)
    text = str(err)
    assert "bug in localcluster" in text and "injected" in text and "worker(s) in a row" not in text
    assert "Traceback" in err.traceback_text


@pytest.mark.slow
def test_failure_on_the_scheduler_thread_fails_everyone_at_once(monkeypatch, tmp_path):
    with LocalCluster(n_workers=2, forward_logs=False) as cluster, Client(cluster) as client:
        pids = worker_pids(cluster)
        blocked = client.submit(block_until, str(tmp_path / "never"), pure=False)

        def boom(*args, **kwargs):
            raise RuntimeError("injected failure in Outcomes.finished")
        monkeypatch.setattr(cluster.scheduler.outcomes, "finished", boom)     # what a frame of Finished calls
        with pytest.raises(ClusterBroken) as info:
            client.submit(inc, 1).result(timeout=30)
        assert_broken(info.value)
        with pytest.raises(ClusterBroken):
            blocked.result(timeout=30)              # a bystander: failed too, not left hanging
        with pytest.raises(ClusterBroken):
            client.submit(inc, 2)                   # and every later call
        with pytest.raises(ClusterBroken):
            client.scatter([1])
        assert_stopped(pids)


def test_failure_on_a_user_thread_breaks_the_cluster_too(monkeypatch, tmp_path):
    with LocalCluster(n_workers=1, forward_logs=False) as cluster, Client(cluster) as client:
        pids = worker_pids(cluster)
        blocked = client.submit(block_until, str(tmp_path / "never"), pure=False)
        wait_running(cluster, blocked)
        # A wait ends the burst: without it, the next submit could come within BURST of this
        # one on a fast machine, be deferred and reach the scheduler later, by submit_batches.
        with pytest.raises(cf.TimeoutError):
            blocked.result(timeout=0.01)

        def boom(specs, again=None):
            raise KeyError("injected failure in Scheduler.submit")
        monkeypatch.setattr(cluster.scheduler.admission, "submit", boom)     # what a Submit event calls
        with pytest.raises(ClusterBroken) as info:
            client.submit(inc, 1)
        assert_broken(info.value)
        with pytest.raises(ClusterBroken):
            blocked.result(timeout=30)
        assert_stopped(pids)


# --- a worker's own failure while serving data ------------------------------------------------

def _poison_exports():
    from localcluster.worker import store
    real = store.Store.payload

    def payload(self, key):
        if key.startswith("poison"):
            raise OSError("injected export failure")
        return real(self, key)
    store.Store.payload = payload


@pytest.mark.slow
def test_an_export_failure_fails_that_request_and_the_worker_lives_on():
    with LocalCluster(n_workers=2, forward_logs=False, initializer=_poison_exports) as cluster, \
            Client(cluster) as client:
        w0, w1 = sorted(cluster.workers)
        pids = worker_pids(cluster)
        bad = client.submit(big, 1, key="poison-1", workers=[w0])
        with pytest.raises(StoreError, match=r"'poison-1' from worker 'worker-0' failed while reading it "
                                             r"from the store: OSError: injected export failure"):
            bad.result(timeout=30)                   # gather: the export fails
        with pytest.raises(StoreError, match="poison-1"):
            client.submit(first, bad, workers=[w1]).result(timeout=30)     # a relay fails too
        assert client.submit(first, bad, workers=[w0], pure=False).result(timeout=30) == 1.0  # local use is fine
        good = client.submit(big, 2, workers=[w0])
        assert client.submit(first, good, workers=[w1]).result(timeout=30) == 2.0
        assert cluster.deaths == [] and worker_pids(cluster) == pids


def _failing_spill_writes():
    from localcluster.worker import store

    def write(path, payload):
        raise OSError(28, "No space left on device (injected)")
    store._write = write


@pytest.mark.slow
def test_a_spill_that_fails_keeps_the_data_in_memory():
    with LocalCluster(n_workers=1, memory_limit="1GiB", memory_target=0.01, forward_logs=False,
                      initializer=_failing_spill_writes) as cluster, Client(cluster) as client:
        fs = [client.submit(big, i) for i in range(4)]
        assert [client.submit(first, f).result(30) for f in fs] == [0.0, 1.0, 2.0, 3.0]
        assert [float(f.result(30)[0]) for f in fs] == [0.0, 1.0, 2.0, 3.0]
        (info,) = cluster.workers.values()
        assert info.spilled == 0 and info.managed >= 4 * 4_000_000
        assert cluster.deaths == []
        assert any("spilling" in line and "injected" in line for line in client.get_worker_logs()[info.name])


def _failing_spill_reads():
    from localcluster.worker import store

    def read(path):
        raise OSError("injected: spill file unreadable")
    store._read = read


@pytest.mark.slow
def test_a_reload_that_fails_names_the_key_and_the_step():
    with LocalCluster(n_workers=1, memory_limit="1GiB", memory_target=0.01, forward_logs=False,
                      initializer=_failing_spill_reads) as cluster, Client(cluster) as client:
        (name,) = cluster.workers
        f = client.submit(big, 7, key="spilled-7")
        assert f.exception(30) is None      # done, not fetched: a fetch could race the spill
        wait_for(lambda: cluster.workers[name].spilled > 0)   # the worker's heartbeat spills: no event
        with pytest.raises(StoreError, match=r"reloading 'spilled-7' from its spill file .* injected"):
            client.submit(first, f, pure=False).result(timeout=30)
        assert client.submit(inc, 1).result(30) == 2        # the worker is alive and serving
        assert cluster.deaths == []


def test_clusterbroken_is_exported():
    assert "ClusterBroken" in localcluster.__all__ and "StoreError" in localcluster.__all__
