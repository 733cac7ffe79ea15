"""dask collections on the cluster through ``client.get``: dask.array, dask.bag,
dask.dataframe and dask.delayed graphs run by real workers, multi-MB chunks moving
between them, a task's exception raised as itself, and a segfault inside a graph
reported as a KilledWorker with the graph's own key."""
from __future__ import annotations

import ctypes
import os
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from _util import wait_for
from localcluster import Client, KilledWorker, LocalCluster
from localcluster.integrations.daskgraph import name_of
from localcluster.client.future import gateway_of

dask = pytest.importorskip("dask")
np = pytest.importorskip("numpy")
da = pytest.importorskip("dask.array")
db = pytest.importorskip("dask.bag")


def recording(client, graphs: list):
    """``client.get`` that keeps each graph it is handed (as {key: GraphNode})."""
    from dask._task_spec import convert_legacy_graph

    def get(dsk, keys, **kwargs):
        graphs.append(convert_legacy_graph(dict(dsk.__dask_graph__())))
        return client.get(dsk, keys, **kwargs)
    return get


def forgotten(client, keys) -> bool:
    return all(gateway_of(client).task_spec(name_of(k)) is None for k in keys)


@pytest.mark.slow
def test_array_reductions_over_many_chunks(client):
    x = da.random.default_rng(7).random(3_000_000, chunks=20_000)           # 150 chunks
    y = da.arange(3_000_000, chunks=20_000)
    # num_workers and pool are dask.local's: accepted and ignored; retries applies to every task
    data, total, mean, ysum = dask.compute(x, x.sum(), x.mean(), (y * 2).sum(), scheduler=client.get,
                                           num_workers=8, pool=None, retries=1)
    assert data.shape == (3_000_000,) and x.numblocks == (150,)
    assert total == pytest.approx(data.sum()) and mean == pytest.approx(data.mean())
    assert ysum == (np.arange(3_000_000) * 2).sum()
    ran = [r.key for r in client.cluster.history.tasks()]
    assert len(ran) >= 150 and all(r.status == "finished" for r in client.cluster.history.tasks())


@pytest.mark.slow
def test_under_dask_config_set(client):
    y = da.arange(2_000_000, chunks=10_000)                                  # 200 chunks
    with dask.config.set(scheduler=client.get):
        assert y.sum().compute() == np.arange(2_000_000).sum()
        assert y.std().compute() == pytest.approx(np.arange(2_000_000).std())
    assert len(client.cluster.history.tasks()) >= 400


@pytest.mark.timeout(90)
@pytest.mark.slow
def test_multi_megabyte_chunks_cross_workers(client):
    """4 MB chunks, 8 MB partial products: they move between the two workers for the sum."""
    x = da.random.default_rng(42).random((4000, 1000), chunks=(500, 1000))   # 8 chunks of 4 MB
    graphs: list = []
    data, gram = dask.compute(x, x.T @ x, scheduler=recording(client, graphs))
    np.testing.assert_allclose(gram, data.T @ data)
    ran_on = {r.key: r.worker for r in client.cluster.history.tasks()}
    assert len(set(ran_on.values())) == 2
    # random chunks (4 MB) and x.T @ x blocks (8 MB) that a task on the other worker needed
    crossed = [d for k, node in graphs[0].items() for d in node.dependencies
               if isinstance(d, tuple) and d[0].split("-")[0] in ("random", "chunk_sum")
               and ran_on[name_of(d)] != ran_on[name_of(k)]]
    assert crossed, "no multi-MB input went from one worker to the other"
    wait_for(lambda: forgotten(client, graphs[0]), timeout=10)   # nothing held after compute


@pytest.mark.slow
def test_bag(client):
    bag = db.from_sequence(range(1000), npartitions=8)
    freq = bag.map(lambda v: v % 7).filter(lambda v: v != 3).frequencies()
    folded = bag.map(lambda v: v * v).fold(lambda a, b: a + b)
    got_freq, got_fold = dask.compute(freq, folded, scheduler=client.get)
    assert dict(got_freq) == dict(Counter(v % 7 for v in range(1000) if v % 7 != 3))
    assert got_fold == sum(v * v for v in range(1000))


@pytest.mark.timeout(90)
@pytest.mark.slow
def test_dataframe_groupby_and_sum(client):
    pd = pytest.importorskip("pandas")          # here, not at the top: 2 s of imports the quick tier skips
    dd = pytest.importorskip("dask.dataframe")
    """dask-expr plans the query client-side; every task still runs on the cluster."""
    n = 100_000
    df = pd.DataFrame({"g": np.arange(n) % 13, "v": np.arange(n, dtype=float), "w": np.arange(n) % 5})
    ddf = dd.from_pandas(df, npartitions=8)
    graphs: list = []
    with dask.config.set(scheduler=recording(client, graphs)):
        grouped = ddf.groupby("g").agg({"v": ["sum", "max"], "w": "mean"}).compute()
        total = ddf.v.sum().compute()
    pd.testing.assert_frame_equal(grouped.sort_index(), df.groupby("g").agg({"v": ["sum", "max"], "w": "mean"}))
    assert total == df.v.sum()
    ran = {r.key for r in client.cluster.history.tasks()}
    tasks = {name_of(k) for g in graphs for k, node in g.items() if type(node).__name__ == "Task"}
    assert len(graphs) == 2 and tasks and tasks <= ran


@pytest.mark.slow
def test_a_tasks_exception_is_raised_as_itself(client):
    @dask.delayed
    def parse(x):
        raise ValueError(f"cannot parse {x}")

    with pytest.raises(ValueError, match="cannot parse 7"):
        dask.compute(dask.delayed(sum)([parse(7), dask.delayed(len)("ab")]), scheduler=client.get)


def flaky(marker: str) -> int:
    if not os.path.exists(marker):
        open(marker, "w").close()
        raise ValueError("first attempt fails")
    return 1


@pytest.mark.slow
def test_a_retry_runs_again_while_the_first_exception_is_kept(client, tmp_path):
    """pytest keeps the exception, as IPython keeps sys.last_value."""
    task = dask.delayed(flaky, pure=True)(str(tmp_path / "m"), dask_key_name="flaky-part-3")
    with pytest.raises(ValueError) as first:
        task.compute(scheduler=client.get)
    wait_for(lambda: forgotten(client, ["flaky-part-3"]), timeout=2)
    assert task.compute(scheduler=client.get) == 1
    assert "first attempt" in str(first.value)


def read_null_pointer(x, *chunks):
    return ctypes.string_at(0) + x


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_a_segfault_in_a_graph_is_a_killed_worker_naming_the_graph_key():
    with LocalCluster(n_workers=1, allowed_failures=0, forward_logs=False) as cluster, Client(cluster) as client:
        chunks = [dask.delayed(np.ones, pure=True)(500_000, dask_key_name=("chunk", i)) for i in range(3)]
        part = dask.delayed(read_null_pointer, pure=True)(b"x", *chunks, dask_key_name=("load-partition", 17))
        other = dask.delayed(sum, pure=True)(chunks, dask_key_name="other")
        with pytest.raises(KilledWorker) as info:
            dask.compute(dask.delayed(len)(part), other, scheduler=client.get)
        # the kept exception holds none of the graph's keys (get clears its frames)
        keys = [("chunk", i) for i in range(3)] + [("load-partition", 17), "other"]
        wait_for(lambda: forgotten(client, keys), timeout=10)
    death = info.value.deaths[0]
    assert death.cause == "crash" and death.signal == "SIGSEGV"
    assert "read_null_pointer" in str(info.value) + (death.stack or "")    # the crashing frame
    assert "('load-partition', 17)" in str(info.value)


@pytest.mark.slow
def test_two_computations_sharing_keys(client):
    x = da.ones((1000, 1000), chunks=(250, 250))
    a = (x + 1).sum()
    b = (x + 1).mean()                      # shares the (x + 1) chunks with a
    assert a.compute(scheduler=client.get) == 2_000_000
    assert dask.compute(a, b, scheduler=client.get) == (2_000_000, 2.0)
    with ThreadPoolExecutor(2) as pool:     # both at once, from two threads, on the same keys
        both = [pool.submit(dask.compute, c, scheduler=client.get) for c in (a, b)]
        assert [f.result(timeout=30) for f in both] == [(2_000_000,), (2.0,)]
    kept = a.persist(scheduler="sync")      # computed elsewhere: a literal in the graph
    assert dask.compute(kept, b, scheduler=client.get) == (2_000_000, 2.0)


@pytest.mark.slow
def test_raw_graphs_literals_and_aliases(client):
    from dask._task_spec import Task, TaskRef
    from dask.highlevelgraph import HighLevelGraph
    big = np.ones(200_000)                                       # 1.6 MB, used twice: one task
    dsk = {"a": 1, "b": (sum, ["a", "a"]), "big": big, "c": (np.sum, "big"), "d": (np.max, "big"),
           "e": "b", ("t", 0): (max, "b", "a")}
    assert client.get(dsk, [["b"], "a", ("t", 0)]) == [[2], 1, 2]
    assert client.get(dsk, "e") == 2                             # an alias of b
    assert client.get(HighLevelGraph.from_collections("x", dsk, ()), ["c", "d"]) == [200_000.0, 1.0]
    ran = Counter(r.key for r in client.cluster.history.tasks())
    assert ran["big"] == 1 and "a" not in ran and "e" not in ran and ran["('t', 0)"] == 1
    with pytest.raises(KeyError, match="not in the graph"):
        client.get({"a": 1}, ["z"])
    with pytest.raises(KeyError, match="needs 'y'"):
        client.get({"a": Task("a", len, TaskRef("y"))}, ["a"])
