"""A Future makes its Condition only when somebody waits on it (future.py): every way
of waiting must still wake, whichever comes first, the waiter or the result, with
results resolved by real workers while other threads wait."""
from __future__ import annotations

import concurrent.futures as cf
import random
import threading

import pytest

import localcluster
from localcluster.client.future import state_of
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


def test_a_future_is_a_handle_of_two_attributes_whatever_other_futures_went_through(client):
    """A Future is its key and the state the Futures of its key share: waits, callbacks,
    errors and cancels, of it or of other futures, give it no attribute of its own (each
    name any Future was given would cost every later Future 8 bytes: CPython's shared-key
    instance dicts)."""
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
    assert sorted(vars(fresh)) == ["_s", "key"]
    assert fresh.result(30) == 5
    assert sorted(vars(fresh)) == ["_s", "key"]
    assert sorted(vars(waited)) == ["_s", "key"]


@pytest.mark.slow
def test_waiting_for_all_makes_a_condition_only_for_a_future_pending_at_its_turn(client):
    # cf.wait would take every future's Condition, so make one (1.2 KB) for each of a big map's
    # futures; localcluster.wait and gather wait on one pending future at a time.
    futures = client.map(inc, range(2000))
    head = futures[0]
    head.result(30)                        # waited on: it has a Condition
    done, not_done = localcluster.wait(futures, timeout=30)
    assert len(done) == 2000 and not not_done
    with_condition = sum(_has_condition(f) for f in futures)
    assert with_condition < 1000, with_condition       # results arrive in batches
    before = with_condition
    assert localcluster.wait(futures, timeout=0).not_done == set()
    assert client.gather(futures) == list(range(1, 2001))
    assert sum(_has_condition(f) for f in futures) == before     # all done: none made
    slow = client.submit(block_then, 0.05, pure=False)              # one pending: it is waited on
    assert localcluster.wait(futures + [slow], timeout=30).done == set(futures) | {slow}
    with pytest.raises(TimeoutError, match="1 of 2 futures were not done"):
        localcluster.wait([head, client.submit(block_then, 60, pure=False)], timeout=0.2)


def _has_condition(fut) -> bool:
    state = state_of(fut)
    return state.sync is not None and state.sync.cond is not None


def block_then(seconds):
    threading.Event().wait(seconds)
    return seconds


def test_futures_of_one_key_share_its_state_and_each_is_woken_as_itself(client, tmp_path):
    """Two Futures of one key (pure: the same call) share one FutureState, yet concurrent.
    futures' wait and as_completed give back each Future, and each callback gets its own."""
    gate = tmp_path / "gate"
    one = client.submit(wait_for_file, str(gate))
    two = client.submit(wait_for_file, str(gate))
    assert one is not two and one.key == two.key and state_of(one) is state_of(two)
    seen: list = []
    for fut in (one, two):
        fut.add_done_callback(seen.append)
    finished: list = []
    waiting = threading.Thread(target=lambda: finished.append(cf.wait([one, two], timeout=30)))
    waiting.start()
    wait_for(lambda: len(state_of(one).sync.waiters) == 2)     # both installed: ended from now on
    gate.write_text("")
    waiting.join(30)
    assert finished[0].done == {one, two} and not finished[0].not_done
    wait_for(lambda: len(seen) == 2)
    assert {id(f) for f in seen} == {id(one), id(two)}
    assert list(cf.as_completed([one, two], timeout=30)) in ([one, two], [two, one])
    assert one.result(30) == two.result(30) == "opened"
    assert not state_of(one).sync.waiters and not state_of(one).sync.callbacks    # none kept once ended


def test_a_pending_future_dropped_with_a_waiter_gone_and_a_callback_lets_its_key_go(client, tmp_path):
    """A callback or a past wait keeps no Future alive: dropped, the last Future of a pending
    key lets the key go (and its task is cancelled), as when it held its callbacks itself."""
    gate = tmp_path / "gate"
    fut = client.submit(wait_for_file, str(gate), pure=False)
    key = fut.key
    cf.Future.add_done_callback(fut, lambda f: None)
    assert cf.wait([fut], timeout=0.05).not_done == {fut}
    assert state_of(fut).sync is not None
    del fut
    wait_for(lambda: key not in client.who_has())
    gate.write_text("")


def wait_for_file(path):
    import os
    import time
    while not os.path.exists(path):
        time.sleep(0.01)
    return "opened"
