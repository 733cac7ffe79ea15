"""A Future makes its Condition only when somebody waits on it (future.py): every way
of waiting must still wake, whichever comes first, the waiter or the result, with
results resolved by real workers while other threads wait."""
from __future__ import annotations

import concurrent.futures as cf
import random
import threading

import pytest

import localcluster
from _util import wait_for


def inc(x):
    return x + 1


def test_many_threads_wait_on_futures_as_they_resolve(client):
    futures = client.map(inc, range(3000))
    seen: dict = {}
    errors: list = []

    def reader(seed: int) -> None:
        order = list(enumerate(futures))
        random.Random(seed).shuffle(order)
        try:
            for i, fut in order:
                assert fut.result(timeout=30) == i + 1
            seen[seed] = True
        except BaseException as e:   # noqa: BLE001 - reported below, with the thread's seed
            errors.append((seed, e))

    threads = [threading.Thread(target=reader, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and len(seen) == 4


def test_every_kind_of_wait_wakes_on_futures_resolved_later_or_already(client):
    slow = [client.submit(inc, i, pure=False) for i in range(200)]
    called = threading.Event()
    slow[-1].add_done_callback(lambda f: called.set())
    done, not_done = cf.wait(slow, timeout=30)                       # cf.wait installs waiters
    assert not not_done and len(done) == 200
    assert [f.result() for f in cf.as_completed(slow, timeout=30)]    # already done: no waiter
    assert called.wait(30)
    late = client.submit(inc, 1000, pure=False)
    first = cf.wait([late], timeout=30, return_when=cf.FIRST_COMPLETED)
    assert late in first.done and late.result() == 1001
    assert sorted(f.result() for f in localcluster.as_completed(slow)) == list(range(1, 201))
    assert repr(late).startswith("<Future: finished")


def test_a_future_that_nobody_waited_for_resolves_and_reads_back(client):
    futures = client.map(inc, range(500))
    localcluster.wait(futures, timeout=30)
    assert all(f.done() and f.status == "finished" for f in futures)
    assert [f.result() for f in futures] == list(range(1, 501))
    assert client.gather(futures) == list(range(1, 501))


def test_a_callback_runs_though_its_future_was_dropped_at_once_and_then_the_key_goes(client, cluster):
    """``client.submit(f).add_done_callback(log)``: as with an executor or dask, the task is
    not released (so cancelled) before its callback runs; after, nothing holds it."""
    seen: list = []
    called = threading.Event()

    def note(fut):
        seen.append((fut.key, fut.result()))
        called.set()
    client.submit(block_then, 0.2, pure=False).add_done_callback(note)
    assert called.wait(30)
    (key, value), = seen
    assert value == 0.2
    del seen[:]
    wait_for(lambda: key not in cluster.scheduler.tasks)


def test_a_future_keeps_five_attributes_of_its_own_whatever_other_futures_went_through(client):
    """Each attribute name any Future was given costs every later Future 8 bytes (CPython's
    shared-key instance dicts): waits, callbacks, errors and cancels of other futures leave
    a fresh one with five."""
    waited = client.submit(inc, 1, pure=False)
    assert waited.result(30) == 2
    assert cf.wait([client.submit(inc, 2, pure=False)], timeout=30).not_done == set()
    called = threading.Event()
    client.submit(inc, 3, pure=False).add_done_callback(lambda f: called.set())
    assert called.wait(30)
    with pytest.raises(TypeError):
        client.submit(inc, "x", pure=False).result(30)
    client.submit(block_then, 5, pure=False).cancel()
    fresh = client.submit(inc, 4, pure=False)
    assert sorted(vars(fresh)) == ["_result", "_state", "client", "key"]
    assert fresh.result(30) == 5
    assert sorted(vars(fresh)) == ["_result", "_state", "_sync", "client", "key"]


@pytest.mark.slow
def test_waiting_for_all_makes_a_condition_only_for_a_future_pending_at_its_turn(client):
    # cf.wait would take every future's Condition, so make one (1.2 KB) for each of a big map's
    # futures; localcluster.wait and gather wait on one pending future at a time.
    futures = client.map(inc, range(2000))
    head = futures[0]
    head.result(30)                        # waited on: it has a Condition
    done, not_done = localcluster.wait(futures, timeout=30)
    assert len(done) == 2000 and not not_done
    with_condition = sum(f._cond is not None for f in futures)
    assert with_condition < 1000, with_condition       # results arrive in batches
    before = with_condition
    assert localcluster.wait(futures, timeout=0).not_done == set()
    assert client.gather(futures) == list(range(1, 2001))
    assert sum(f._cond is not None for f in futures) == before     # all done: none made
    slow = client.submit(block_then, 0.05, pure=False)              # one pending: it is waited on
    assert localcluster.wait(futures + [slow], timeout=30).done == set(futures) | {slow}
    with pytest.raises(TimeoutError, match="1 of 2 futures were not done"):
        localcluster.wait([head, client.submit(block_then, 60, pure=False)], timeout=0.2)


def block_then(seconds):
    threading.Event().wait(seconds)
    return seconds
