"""Every byte arrives: one table of data kind x size x path, through real workers.

Each cell makes a value, moves it along one path, and asserts the exact value that
comes back (a content fingerprint computed where the value lands, and the value itself
where it returns to the parent), that no worker died (except the one the path kills),
and that nothing is left: no data memfd open in any worker, no managed or spilled bytes,
no spill file, and (the autouse ``no_leaks`` fixture) no process, thread or fd here.

``workers=`` forces each path: where data is scattered, where a result is made, and
where its dependent runs, so the table covers every route deterministically.
"""
from __future__ import annotations

import gc
import os
import signal
import threading

import pytest

import _data
from _util import wait_for
from _data import KINDS, SIZES, fingerprint, identity, make
from localcluster import Client, LocalCluster, wait
from localcluster.engine import dispatch
from localcluster.wire import protocol as P
from localcluster.cluster import validate

# The quick tier (pytest -m "not slow") runs a diagonal of each table, the full run all of it:
# one kind for each size (of each other path: sizes and paths of the same parity meet), the
# kinds taken in turn, so that each table covers every size, every path and, with the next
# table's turn, every kind, in 6 cells (18 for the paths' 366) instead of 61.
SLOW = pytest.mark.slow


def table(turn: int, paths: tuple = ("",)) -> list:
    """(kind, n[, path]) for every kind and size (and path), and the int 0 (quick on the paths' first)."""
    cells, quick = [], {}
    for p, path in enumerate(paths):
        for s, label in enumerate(SIZES):
            if len(paths) == 1 or s % 2 == p % 2:
                quick[(label, path)] = KINDS[(turn + len(quick)) % len(KINDS)]
    for p, path in enumerate(paths):
        more = (path,) if path else ()
        for kind in KINDS:
            for label, n in SIZES.items():
                cells.append(pytest.param(kind, n, *more, id="-".join((kind, label) + more),
                                          marks=() if quick.get((label, path)) == kind else SLOW))
        cells.append(pytest.param("int", 0, *more, id="-".join(("int",) + more), marks=() if p == 0 and len(paths) > 1 else SLOW))
    return cells


def large_only(quick: tuple) -> list:
    return [pytest.param(kind, SIZES["50MB"], id=kind, marks=() if kind in quick else SLOW) for kind in KINDS]


def assert_same(got, expected):
    assert type(got) is type(expected)
    assert fingerprint(got) == fingerprint(expected)


def names(cluster):
    return sorted(cluster.workers)


def settle(client, cluster, deaths_before=0):
    """After a cell: no death beyond those the path caused, nothing held anywhere."""
    gc.collect()
    assert len(cluster.deaths) == deaths_before, [d.message for d in cluster.deaths]
    validate(cluster)
    def empty():
        return all(i.managed == 0 and i.spilled == 0 for i in cluster.workers.values())
    wait_for(empty)
    for name in names(cluster):
        assert client.submit(_data.memfds_here, workers=[name], pure=False).result(30) == 0
    # the checks' own results were stored, and may have been spilled: gone again first
    gc.collect()
    wait_for(empty)
    for name in names(cluster):
        spill_dir = os.path.join(cluster.local_directory, name)
        assert not os.path.isdir(spill_dir) or os.listdir(spill_dir) == []


def _warmed(cluster, client):
    # The done-callbacks thread starts on first use: start it now, so that no cell sees a new thread.
    client.submit(_data.warm_up, "numpy", pure=False).add_done_callback(lambda f: None)
    for kind in ("pandas", "numpy"):
        wait(client.map(_data.warm_up, [kind] * 4, pure=False), timeout=60)
    return cluster, client


@pytest.fixture(scope="module")
def pair():
    with LocalCluster(n_workers=2, forward_logs=False) as cluster, Client(cluster) as client:
        yield _warmed(cluster, client)


@pytest.fixture(scope="module")
def spilling():
    """Workers that spill everything they hold within a heartbeat (target: 1 % of 1 GiB)."""
    with LocalCluster(n_workers=2, memory_limit="1GiB", memory_target=0.01, forward_logs=False) as cluster, \
            Client(cluster) as client:
        yield _warmed(cluster, client)


# --- the paths ---------------------------------------------------------------------------

def scatter_then_task_on_holder(client, cluster, v):
    w0, _w1 = names(cluster)
    [f] = client.scatter([v], workers=[w0])
    assert client.submit(fingerprint, f, workers=[w0]).result(60) == fingerprint(v)


def scatter_then_task_on_other(client, cluster, v):
    w0, w1 = names(cluster)
    [f] = client.scatter([v], workers=[w0])
    assert client.submit(fingerprint, f, workers=[w1]).result(60) == fingerprint(v)


def result_feeds_dependent_on_other(client, cluster, v, kind, n):
    w0, w1 = names(cluster)
    r = client.submit(make, kind, n, workers=[w0])
    assert client.submit(fingerprint, r, workers=[w1]).result(60) == fingerprint(v)


def gather(client, cluster, v, kind, n):
    w0, _w1 = names(cluster)
    r = client.submit(make, kind, n, workers=[w0])
    assert_same(client.gather([r])[0], v)
    assert_same(r.result(60), v)


def broadcast(client, cluster, v):
    [f] = client.scatter([v], broadcast=True)
    for name in names(cluster):
        assert client.submit(fingerprint, f, workers=[name], pure=False).result(60) == fingerprint(v)


def executor_map(client, cluster, v):
    ex = client.get_executor()
    assert_same(list(ex.map(identity, [v], timeout=60))[0], v)
    assert list(ex.map(fingerprint, [v], timeout=60)) == [fingerprint(v)]
    ex.shutdown()


PATHS = {
    "scatter-holder": scatter_then_task_on_holder,
    "scatter-other": scatter_then_task_on_other,
    "result-dependent": result_feeds_dependent_on_other,
    "gather": gather,
    "broadcast": broadcast,
    "executor-map": executor_map,
}


@pytest.mark.parametrize("kind,n,path", table(0, tuple(PATHS)))
def test_data_path(pair, kind, n, path):
    cluster, client = pair
    v = make(kind, n)
    fn = PATHS[path]
    if fn in (result_feeds_dependent_on_other, gather):
        fn(client, cluster, v, kind, n)
    else:
        fn(client, cluster, v)
    settle(client, cluster)


@pytest.mark.parametrize("kind,n", table(3))
def test_spill_reload_and_send_on(spilling, kind, n):
    cluster, client = spilling
    w0, w1 = names(cluster)
    v = make(kind, n)
    r = client.submit(make, kind, n, workers=[w0])
    wait([r], timeout=60)
    wait_for(lambda: cluster.workers[w0].spilled > 0)
    assert client.submit(fingerprint, r, workers=[w0], pure=False).result(60) == fingerprint(v)   # reload
    assert client.submit(fingerprint, r, workers=[w1], pure=False).result(60) == fingerprint(v)   # send on
    assert_same(r.result(60), v)
    del r
    settle(client, cluster)


def kill(cluster, name):
    os.kill(cluster.workers[name].pid, signal.SIGKILL)


@pytest.mark.parametrize("kind,n", table(6))
def test_replicate_then_kill_a_holder(kind, n):
    """Scattered data cannot be recomputed: only the replica can answer after the kill."""
    with LocalCluster(n_workers=2, forward_logs=False) as cluster, Client(cluster) as client:
        w0, w1 = names(cluster)
        v = make(kind, n)
        [f] = client.scatter([v], workers=[w0])
        client.replicate([f], n=2)
        kill(cluster, w0)
        assert client.submit(fingerprint, f, workers=[w1]).result(60) == fingerprint(v)
        assert_same(f.result(60), v)
        wait_for(lambda: len(cluster.deaths) == 1)     # an inline value never needed the death to be known
        assert [d.cause for d in cluster.deaths] == ["signal"]


@pytest.mark.parametrize("kind,n", table(9))
def test_recompute_from_lineage_after_the_holder_is_killed(kind, n):
    with LocalCluster(n_workers=2, forward_logs=False) as cluster, Client(cluster) as client:
        w0, w1 = names(cluster)
        v = make(kind, n)
        r = client.submit(make, kind, n, workers=[w0], allow_other_workers=True)
        wait([r], timeout=60)
        kill(cluster, w0)
        assert client.submit(fingerprint, r, workers=[w1]).result(60) == fingerprint(v)
        assert_same(r.result(60), v)
        wait_for(lambda: len(cluster.deaths) == 1)     # an inline value never needed the death to be known
        assert [d.cause for d in cluster.deaths] == ["signal"]


@pytest.mark.parametrize("kind,n", large_only(("bytes", "pandas")))
def test_a_result_lost_with_the_only_worker_it_may_run_on_says_so(kind, n):
    """Its recompute cannot be placed: the fetch fails with that reason, not a CancelledError
    that blames a release nobody made."""
    with LocalCluster(n_workers=2, forward_logs=False) as cluster, Client(cluster) as client:
        w0, _ = names(cluster)
        r = client.submit(make, kind, n, workers=[w0])
        wait([r], timeout=60)
        kill(cluster, w0)
        with pytest.raises(RuntimeError, match=f"may run only on {w0}.*no such worker is left"):
            r.result(60)


# --- memory accounting: what a worker says it holds is what its RSS grew by -------------------

@pytest.mark.parametrize("how", ["result", "scattered"])
@pytest.mark.parametrize("kind,n", large_only(("numpy",)))
def test_managed_memory_matches_rss_growth(kind, n, how):
    with LocalCluster(n_workers=1, forward_logs=False) as cluster, Client(cluster) as client:
        (w,) = names(cluster)
        client.submit(_data.warm_up, kind, pure=False).result(60)
        before = client.submit(_data.rss_here, pure=False).result(60)
        if how == "result":
            held = client.submit(make, kind, n)
        else:
            [held] = client.scatter([make(kind, n)])
        wait([held], timeout=60)
        after = client.submit(_data.rss_here, pure=False).result(60)
        managed = cluster.workers[w].managed
        growth = after - before
        assert abs(managed - growth) <= 0.10 * growth + 5 * (1 << 20), (managed, growth)
        assert client.submit(fingerprint, held).result(60) == fingerprint(make(kind, n))


def test_warm_memory_left_by_a_large_argument_goes_back_to_the_system_when_idle():
    """A worker keeps the memory the parent copied a large argument into, for the next one
    (wire/recycle.py); unused, it goes back within about two heartbeats."""
    np = pytest.importorskip("numpy")
    from localcluster.wire import vmcopy
    n = 50_000_000
    with LocalCluster(n_workers=1, forward_logs=False) as cluster, Client(cluster) as client:
        if not vmcopy.available(next(iter(cluster.workers.values())).pid):
            pytest.skip("this process may not write into its workers' memory (ptrace refused)")
        client.submit(_data.warm_up, "numpy", pure=False).result(60)
        before = client.submit(_data.rss_here, pure=False).result(60)
        assert client.submit(np.sum, np.ones(n // 8), pure=False).result(60) == n // 8
        assert client.submit(_data.rss_here, pure=False).result(60) - before > 0.8 * n     # kept warm
        # ...and reported as such, not as the tasks' own (unmanaged) memory
        name = next(iter(cluster.workers))
        wait_for(lambda: cluster.workers[name].reusable > 0.8 * n and cluster.workers[name].memory > before + 0.8 * n,
                 timeout=30)
        info = cluster.workers[name]
        assert info.unmanaged <= info.memory - info.reusable and "kept for reuse" in cluster._repr_html_()
        wait_for(lambda: client.submit(_data.rss_here, pure=False).result(60) - before < 0.1 * n, timeout=30)
        wait_for(lambda: cluster.workers[name].reusable == 0, timeout=30)


def test_a_large_result_you_drop_is_reported_as_kept_for_reuse_then_goes_back():
    """The parent keeps the memory a large result was copied out into, for the next one; it
    says so (``cluster.reusable``) while nothing uses it, and gives it back within ~2 s."""
    np = pytest.importorskip("numpy")
    from localcluster.wire import vmcopy
    n = 50_000_000
    with LocalCluster(n_workers=1, forward_logs=False) as cluster, Client(cluster) as client:
        if not vmcopy.available(next(iter(cluster.workers.values())).pid):
            pytest.skip("this process may not read its workers' memory (ptrace refused)")
        assert cluster.reusable == 0
        result = client.submit(np.ones, n // 8, pure=False).result(60)
        assert result.nbytes == n and cluster.reusable == 0         # in use: yours, not kept
        del result
        assert cluster.reusable >= n                                # unused now, kept warm
        wait_for(lambda: cluster.reusable == 0, timeout=30)         # and given back
    assert cluster.reusable == 0


# --- values of different sizes on one path at once (issue 48) ------------------------------

def mixed(i: int):
    """Alternately 8 MB and 800 kB: one crosses by copy, the other inside the frame."""
    import numpy as np
    return np.full((1000, 1000) if i % 2 == 0 else (1000, 100), float(i))


def is_mixed(a, i: int) -> bool:
    return a.shape == ((1000, 1000) if i % 2 == 0 else (1000, 100)) and bool((a == i).all())


@SLOW
def test_values_of_mixed_sizes_relayed_between_workers_arrive_whole(pair):
    """The new user's script of issue 48: 60 values made on one worker, each read by a task on
    the other; with sizes alternating, the small and large values relayed together once came
    out swapped ("cannot reshape array of size 1000000 into shape (1000,100)")."""
    cluster, client = pair
    w0, w1 = names(cluster)
    made = [client.submit(mixed, i, workers=[w0], pure=False) for i in range(60)]
    checks = [client.submit(is_mixed, m, i, workers=[w1], pure=False) for i, m in enumerate(made)]
    assert client.gather(checks) == [True] * 60
    del made, checks
    settle(client, cluster)


def both(small, large):
    return small.shape, large.shape, float(small[0, 0]), float(large[0, 0])


def test_a_small_and_a_large_argument_of_one_task_arrive_in_their_places(pair):
    """One frame with a buffer that crosses inside it before one the parent copies in."""
    import numpy as np
    cluster, client = pair
    small, large = np.full((1000, 100), 1.0), np.full((1000, 1000), 2.0)
    assert client.submit(both, small, large, pure=False).result(60) == ((1000, 100), (1000, 1000), 1.0, 2.0)
    assert client.submit(both, large[:, :100], large, pure=False).result(60) == ((1000, 100), (1000, 1000), 2.0, 2.0)
    assert client.submit(both, np.asfortranarray(small), large, pure=False).result(60)[2:] == (1.0, 2.0)
    settle(client, cluster)


# --- a gather of spilled values, a window at a time (issue 53) ------------------------------

def twenty_mb(i: int):
    import numpy as np
    return np.full(20_000_000 // 8, float(i))


def spilled_results(client, cluster, n):
    """``n`` results of 20 MB, half on each worker (placement alone may leave one too few to spill)."""
    names = sorted(cluster.workers)
    fs = [client.submit(twenty_mb, i, pure=False, workers=[names[i % len(names)]], allow_other_workers=True)
          for i in range(n)]
    wait(fs, timeout=120)
    wait_for(lambda: all(w.spilled > 0 for w in cluster.workers.values()), timeout=60)
    return fs


@SLOW
@pytest.mark.timeout(180)
def test_gathering_twice_the_workers_memory_of_spilled_results_kills_no_worker():
    """Each value a worker spilled is read back into memory to be sent; asked for all at once,
    both workers died of it while running nothing (and the values came back only because they
    were computed again). A holder is asked for a window of bytes at a time now."""
    with LocalCluster(n_workers=2, memory_limit="400MiB", forward_logs=False) as cluster, \
            Client(cluster) as client:
        fs = spilled_results(client, cluster, 40)             # 800 MB: twice the workers' memory
        got = client.gather(fs, timeout=120)
        assert [float(a[0]) for a in got] == [float(i) for i in range(40)]
        assert cluster.deaths == [], [d.message for d in cluster.deaths]


@SLOW
@pytest.mark.timeout(180)
def test_a_worker_that_dies_while_sending_its_values_says_so(monkeypatch):
    """With no window (as before the fix), the gather kills a worker; its death names the
    values it was asked to send, not only the tasks' memory. The parent holds every value the
    first workers show it (Located) unread until that worker is gone: it never copies one out
    nor lets the worker unpin it, so each of them holds all it was asked for, passes its limit
    and is killed with its sends under way, whatever the load (a parent that copied as it read
    could free each value before the worker read the next back from its disk)."""
    real, held = dispatch.Dispatcher.on_worker_messages, {}

    def holding(self, worker, msgs):
        if worker in held:
            kept = [m for m in msgs if type(m) is not P.Located]
            held[worker] += len(msgs) - len(kept)
            msgs = kept
        return real(self, worker, msgs)

    # No leak restart: on a busy machine the worker may stay paused for memory long enough to
    # be restarted as a leak before it passes its limit; the cause would depend on the load.
    with LocalCluster(n_workers=2, memory_limit="400MiB", memory_leak_restart=None, forward_logs=False) as cluster, \
            Client(cluster) as client:
        fs = spilled_results(client, cluster, 40)
        held.update((name, 0) for name in cluster.workers)
        monkeypatch.setattr(dispatch.Dispatcher, "on_worker_messages", holding)
        cluster.scheduler.transfers.window = 1 << 40
        out: list = []
        t = threading.Thread(target=lambda: out.append(client.gather(fs, timeout=150)))
        t.start()
        wait_for(lambda: cluster.deaths, timeout=120)
        cluster.scheduler.transfers.window = 64 << 20
        t.join(150)
        death = cluster.deaths[0]
        assert held[death.worker] > 0                 # it died with values shown and not read
        assert death.cause == "memory-limit" and death.tasks == ()
        assert "It was asked to send" in death.message and "to the client (gather or result())" in death.message
        assert [float(a[0]) for a in out[0]] == [float(i) for i in range(40)]
