"""The Client is dask's default scheduler while it is open, as distributed's (issue 50):
``x.compute()``, ``dask.compute``, ``dask.persist`` and a persisted collection's ``compute()``
run on the cluster's workers; closing the client gives dask back what it had, and of two
clients the last made is current. ``set_as_default=False`` leaves dask alone.
(examples/portable.py prints the same under distributed: tests/external/test_distributed_compat.py.)"""
from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

import pytest

import localcluster
from localcluster import Client
from localcluster.client.dask_calls import DASK_DEFAULT
from localcluster import futures_of

dask = pytest.importorskip("dask")
da = pytest.importorskip("dask.array")

SHUFFLE = "dataframe.shuffle.method"


def pids(x):
    """The pids of the processes that computed each block of ``x`` (with dask's default scheduler)."""
    return set(x.map_blocks(lambda b: b * 0 + os.getpid(), dtype=float).compute().tolist())


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_compute_and_persist_run_on_the_workers(client):
    y = client.persist(da.ones((100, 100), chunks=10) + 1)
    assert y.mean().compute() == 2.0          # the first idiom of every dask tutorial
    workers = set(client.run(os.getpid).values())
    assert pids(da.ones(10, chunks=2)) <= workers and os.getpid() not in workers
    total, = dask.compute(da.arange(10, chunks=5).sum())
    assert total == 45
    z, = dask.persist(da.arange(10, chunks=5) * 2)        # held on the cluster, not here
    assert len(futures_of(z)) == 2 and z.sum().compute() == 90
    assert dask.delayed(len)("abc").compute() == 3


def test_the_last_client_made_is_current_and_closing_restores_dask(cluster):
    with dask.config.set({"scheduler": "sync"}):        # what the user had: back after both close
        first = Client(cluster)
        second = Client(cluster)
        try:
            assert dask.config.get("scheduler") is DASK_DEFAULT and dask.config.get(SHUFFLE) == "tasks"
            assert Client.current() is second
            second.close()
            assert Client.current() is first and dask.config.get("scheduler") is DASK_DEFAULT
        finally:
            second.close()
            first.close()
        assert dask.config.get("scheduler") == "sync" and dask.config.get(SHUFFLE, None) is None
        # the other order: the first closes first, the second stays the default
        first, second = Client(cluster), Client(cluster)
        first.close()
        assert dask.config.get("scheduler") is DASK_DEFAULT and Client.current() is second
        second.close()
        assert dask.config.get("scheduler") == "sync"


def test_set_as_default_false_leaves_dask_alone(cluster):
    before = dask.config.get("scheduler", None)
    with Client(cluster, set_as_default=False) as hidden:
        assert dask.config.get("scheduler", None) == before
        assert Client.current(allow_none=True) is not hidden


def test_a_users_own_choices_stay(cluster):
    with dask.config.set({SHUFFLE: "p2p"}), Client(cluster):
        assert dask.config.get(SHUFFLE) == "p2p"              # never overridden
        with dask.config.set(scheduler="sync"):               # a choice for a block wins, as in dask
            assert dask.config.get("scheduler") == "sync"
    with Client(cluster):
        dask.config.set(scheduler="threads")                  # set for good while the client is open
    try:
        assert dask.config.get("scheduler") == "threads"     # kept at close: the user's later choice
    finally:
        dask.config.config.pop("scheduler", None)


def test_a_client_dropped_without_close_gives_dask_back(cluster):
    before = dask.config.get("scheduler", None)
    Client(cluster)
    gc.collect()
    assert dask.config.get("scheduler", None) == before


def test_no_client_left_says_so_and_restores(monkeypatch):
    assert localcluster.Client.current(allow_none=True) is None
    with dask.config.set(scheduler=DASK_DEFAULT):             # as a fork of the client's process sees it
        with pytest.raises(RuntimeError, match=r"none is open in this process any more .* previous scheduler"):
            dask.delayed(len)("ab").compute()


def test_the_stand_in_copies_and_pickles_as_itself():
    import copy
    import pickle
    assert copy.deepcopy(DASK_DEFAULT) is DASK_DEFAULT and pickle.loads(pickle.dumps(DASK_DEFAULT)) is DASK_DEFAULT


SCRIPT = """
import os, sys
from localcluster import Client
with Client(n_workers=1, forward_logs=False) as client:
    assert "dask" not in sys.modules            # a program that never uses dask never imports it
    import dask, dask.array as da               # imported after the client: it is the default all the same
    print(set(da.ones(4, chunks=2).map_blocks(lambda b: b * 0 + os.getpid(), dtype=float).compute().tolist())
          == set(client.run(os.getpid).values()))
print(dask.config.get("scheduler", None), [f for f in sys.meta_path if "localcluster" in type(f).__module__])
"""


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_dask_imported_after_the_client():
    here = str(Path(localcluster.__file__).parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=55, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == ["True", "None []"]
