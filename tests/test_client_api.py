"""The Client calls real dask programs use (issue 25), through real worker processes:
as_completed's batches, Client.run, fire_and_forget, scheduler_info, who_has, compute and
persist of dask collections, and a deep-copyable Client. The same calls run unchanged
against dask.distributed in tests/test_distributed_compat.py."""
from __future__ import annotations

import copy
import os
import time

import pytest

from localcluster import Client, as_completed, wait


def inc(x):
    return x + 1


def wait_for_file(path, value):
    """A task that runs until the test lets it go (the file appears)."""
    deadline = time.monotonic() + 30
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.005)
    return value


# --- as_completed ----------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_as_completed_next_batch_has_ready_and_is_empty(client):
    futures = client.map(inc, range(6))
    wait(futures)
    ac = as_completed(futures)
    assert ac.has_ready() and not ac.is_empty() and ac.count() == 6
    batch = ac.next_batch(block=False)
    assert sorted(f.result() for f in batch) == [1, 2, 3, 4, 5, 6]
    assert ac.is_empty() and not ac.has_ready() and ac.next_batch(block=False) == []
    with pytest.raises(StopIteration):
        ac.next_batch(block=True)


@pytest.mark.timeout(60)
def test_as_completed_batches_wait_for_what_is_running(client, tmp_path):
    gate = str(tmp_path / "go")
    slow = client.submit(wait_for_file, gate, "slow", pure=False)
    fast = client.map(inc, range(4))
    ac = as_completed([slow, *fast], with_results=True)
    first = ac.next_batch()          # blocks until at least one is done
    assert first and all(f in fast for f, _ in first)
    wait(fast)
    rest = [] if ac.is_empty() else ac.next_batch(block=False)
    assert ac.count() == 1 and not ac.has_ready()       # the slow one still runs
    open(gate, "w").close()
    batches = list(ac.batches())
    assert batches == [[(slow, "slow")]]
    assert sorted(r for _, r in first + rest) == [1, 2, 3, 4] and ac.is_empty()


def fail(x):
    raise ValueError(f"no {x}")


@pytest.mark.timeout(60)
def test_as_completed_batch_stops_before_an_error_and_the_next_call_raises_it(client):
    good, bad = client.submit(inc, 1), client.submit(fail, 1)
    wait([good, bad])
    ac = as_completed([good, bad], with_results=True)
    got = []
    with pytest.raises(ValueError, match="no 1"):
        while True:
            got += ac.next_batch()
    assert got == [(good, 2)] or got == []
    loose = as_completed([good, bad], with_results=True, raise_errors=False)
    results = dict(loose.next_batch(block=False))
    assert results[good] == 2 and isinstance(results[bad], ValueError)


@pytest.mark.timeout(60)
def test_as_completed_clear_forgets_running_futures(client, tmp_path):
    gate = str(tmp_path / "go")
    slow = client.map(wait_for_file, [gate] * 2, [1, 2], pure=False)
    ac = as_completed(slow)
    assert ac.count() == 2
    ac.clear()
    assert ac.is_empty() and list(ac) == []
    open(gate, "w").close()
    wait(slow)
    assert not ac.has_ready() and ac.is_empty()      # finishing later does not bring them back


# --- deepcopy ---------------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_dask_config_deep_copies_with_client_get_as_scheduler(client):
    dask = pytest.importorskip("dask")
    assert copy.deepcopy(client) is client and copy.copy(client) is client
    with dask.config.set(scheduler=client.get):
        copied = copy.deepcopy(dask.config.config)
        assert copied["scheduler"] == client.get and copied["scheduler"].__self__ is client
        assert dask.delayed(inc)(1).compute() == 2
