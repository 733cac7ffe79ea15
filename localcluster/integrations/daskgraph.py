"""``Client.get``: dask task graphs on the cluster, so ``dask.compute(x, scheduler=client.get)``
and ``dask.config.set(scheduler=client.get)`` run dask.array, dask.bag, dask.dataframe and
dask.delayed work on localcluster's workers.

The mapping, node by node (dask's ``GraphNode``, after ``convert_legacy_graph``):

* a ``Task`` becomes one localcluster task, ``run_node(node, {dep key: Future})``: the worker
  replaces the Futures by their values (the data moves worker to worker as for any task)
  and calls ``node(values)``. Its key is the dask key written out (``name_of``: a string as
  it is, ``('sum-aggregate-87f7...', 0)`` for a tuple), so a task's error, a timeout or a
  ``KilledWorker`` names the graph's own key. Keys are submitted ``pure``: a dask key names
  its value, so a key the cluster already holds (another computation's) is shared, not rerun;
* a ``DataNode`` (a literal) is no task: its value goes inline into its dependents' arguments,
  unless several use it and it pickles to more than ``INLINE_LITERAL`` bytes: then it is a
  task, so that it is pickled once and the workers share it (and can recompute it if lost);
* an ``Alias`` is no task: it stands for its target's Future (or literal).

Only the ancestors of the requested keys are submitted, in ``dask.order``'s order, which is
topological and depth-first. The scheduler runs ready tasks in submission order, so the
cluster follows dask's order (reductions free their inputs early) without a ``priority``.
A Future is dropped as soon as its last dependent is submitted (the cluster frees the data
once that dependent has run); the requested ones once gathered. On an error every Future
is dropped too, and the frames of the raised exception's traceback below ``get`` are cleared,
so a traceback kept around (pytest, IPython's ``sys.last_value``) holds no key on the cluster:
a retry of the same graph runs again instead of getting the old error back.

Keywords: ``retries``, ``timeout`` (seconds per task), ``priority``, ``workers`` and
``allow_other_workers`` apply to every task, as ``submit``'s. The rest, dask.local's and
distributed's (``num_workers``, ``pool``, ``chunksize``, ``optimize_graph``, ``callbacks``,
``resources``, ``sync``, ...), are accepted and ignored: the cluster has its own workers.

``compute`` and ``persist`` (``Client.compute``, ``Client.persist``) submit the same way
and hand back the Futures instead of gathering them: after dask's own optimizations
(``collections_to_expr(..., optimize_graph)``, then ``FinalizeCompute`` for compute), as
distributed does.

dask is imported only inside these calls: it is an optional dependency.
"""
from __future__ import annotations

import traceback
from typing import Any, Callable, Optional, Protocol

from ..client.future import Future
from ..wire.serialize import dumps


class GraphClient(Protocol):
    """What ``get`` uses of its client (``client.Client`` is one): declared here, below
    client.py, so that this module never imports it."""

    def submit(self, fn: Callable, /, *args: Any, key: Optional[str] = None, pure: bool = True,
               retries: int = 0, timeout: Optional[float] = None, priority: int = 0, workers: Any = None,
               allow_other_workers: bool = False) -> Future: ...

    def gather(self, futures: Any, errors: str = "raise", asynchronous: bool = False,
               timeout: Optional[float] = None) -> Any: ...

SUBMIT_OPTIONS = ("retries", "timeout", "priority", "workers", "allow_other_workers")
INLINE_LITERAL = 64 * 1024


def get(client: GraphClient, dsk: Any, keys: Any, **kwargs: Any) -> Any:
    """Compute ``keys`` (a key, or nested lists of keys) of the graph ``dsk`` (a dict, a
    HighLevelGraph, or anything with ``__dask_graph__``) on ``client``'s cluster; returns their
    values nested as ``keys``. A task's exception is raised as itself; a death, as KilledWorker."""
    from collections.abc import Mapping

    from dask._task_spec import convert_legacy_graph
    from dask.utils import ensure_dict

    if not isinstance(dsk, Mapping):      # dask.compute hands over an expression, as to dask.local
        dsk = dsk.__dask_graph__()
    graph = convert_legacy_graph(ensure_dict(dsk))
    options = {k: v for k, v in kwargs.items() if k in SUBMIT_OPTIONS}
    wanted = list(dict.fromkeys(_flatten(keys)))
    try:
        values = _compute(client, graph, wanted, options)
    except BaseException as e:
        traceback.clear_frames(e.__traceback__)     # let go of the Futures held in those frames
        raise
    return _pack(keys, values)


def _compute(client: GraphClient, graph: dict, wanted: list, options: dict) -> dict:
    """Submit the needed nodes, gather the wanted keys: {key: value}."""
    refs = submit_graph(client, graph, wanted, options)
    futures = {k: v for k, v in refs.items() if isinstance(v, Future)}
    values = dict(zip(futures, client.gather(list(futures.values()))))
    return {k: values[k] if k in values else v for k, v in refs.items()}


def submit_graph(client: GraphClient, graph: dict, wanted: list, options: dict) -> dict:
    """Submit the nodes ``wanted`` needs (a graph after ``convert_legacy_graph``): {wanted key:
    its Future, or a literal's value}. The other Futures are let go as soon as their last
    dependent is submitted."""
    from dask.order import order

    needed, uses = _needed(graph, wanted)
    priority = order({k: graph[k] for k in needed})
    keep = set(wanted)
    refs: dict = {}             # key -> its Future, or a literal's value
    for key in sorted(needed, key=priority.__getitem__):
        node = graph[key]
        refs[key] = _submit(client, key, node, {d: refs[d] for d in node.dependencies}, uses, options)
        for d in node.dependencies:         # its last dependent is submitted: the cluster may free d
            uses[d] -= 1
            if not uses[d] and d not in keep:
                del refs[d]
    return {k: refs[k] for k in wanted}


def compute(client: GraphClient, collections: list, optimize_graph: bool, options: dict, **kwargs: Any) -> list:
    """``Client.compute``: one Future per dask collection of ``collections``, as dask's
    (``kwargs`` go to the graph optimizations); what is not a collection is returned as it is."""
    import dask
    from dask._expr import FinalizeCompute
    from dask.base import collections_to_expr
    from dask.core import flatten

    variables = [c for c in collections if dask.is_dask_collection(c)]
    if not variables:
        return list(collections)
    expr = FinalizeCompute(collections_to_expr(variables, optimize_graph, **kwargs)).optimize()
    names = list(flatten(expr.__dask_keys__()))
    futures = _as_futures(client, submit_graph(client, _graph(expr), names, options), options)
    made = iter(names)
    return [futures[next(made)] if dask.is_dask_collection(c) else c for c in collections]


def persist(client: GraphClient, collections: list, optimize_graph: bool, options: dict, **kwargs: Any) -> list:
    """``Client.persist``: each collection rebuilt on Futures of its keys (dask's
    ``__dask_postpersist__``): the same collection, computing on the cluster, its data held
    there for as long as the collection lives."""
    from dask.base import collections_to_expr
    from dask.core import flatten

    expr = collections_to_expr(collections, optimize_graph, **kwargs).optimize()
    keys = expr.__dask_keys__()
    futures = _as_futures(client, submit_graph(client, _graph(expr), list(flatten(keys)), options), options)
    return [rebuild({k: futures[k] for k in flatten(ks)}, *args)
            for (rebuild, args), ks in zip((c.__dask_postpersist__() for c in collections), keys)]


def _graph(expr: Any) -> dict:
    from dask._task_spec import convert_legacy_graph
    from dask.utils import ensure_dict
    return convert_legacy_graph(ensure_dict(expr.__dask_graph__()))


def _as_futures(client: GraphClient, refs: dict, options: dict) -> dict:
    """Every value a Future: a wanted literal becomes a task that returns it."""
    return {k: v if isinstance(v, Future) else client.submit(literal, v, key=name_of(k), pure=True, **options)
            for k, v in refs.items()}


def literal(value: Any) -> Any:
    """On the worker: a literal of the graph, as a task's result."""
    return value


def _submit(client: GraphClient, key: Any, node: Any, deps: dict, uses: dict, options: dict) -> Any:
    """The node's Future; a literal's value; an alias's target's Future or value."""
    from dask._task_spec import Alias, DataNode

    if isinstance(node, DataNode) and (uses.get(key, 0) < 2 or _small(node.value)):
        return node.value
    if isinstance(node, Alias):
        return deps[node.target]
    return client.submit(run_node, node, deps, key=name_of(key), pure=True, **options)


def _small(value: Any) -> bool:
    try:
        return dumps(value).nbytes <= INLINE_LITERAL
    except Exception:  # noqa: BLE001 - submitting it says what cannot be pickled, and where
        return False


def run_node(node: Any, deps: dict) -> Any:
    """On the worker: the node's value, its dependencies' values given."""
    return node(deps)


def name_of(key: Any) -> str:
    """A dask key as a localcluster key: strings as they are, tuples written out."""
    return key if isinstance(key, str) else str(key)


def _needed(graph: dict, wanted: list) -> tuple[set, dict]:
    """The ancestors of ``wanted`` (themselves included), and how many of them use each."""
    needed: set = set()
    uses: dict = {}
    stack = list(wanted)
    while stack:
        key = stack.pop()
        if key in needed:
            continue
        if key not in graph:
            raise KeyError(f"client.get: key {key!r} is not in the graph")
        needed.add(key)
        for d in graph[key].dependencies:
            if d not in graph:
                raise KeyError(f"client.get: key {key!r} needs {d!r}, which is not in the graph")
            uses[d] = uses.get(d, 0) + 1
            stack.append(d)
    return needed, uses


def _flatten(keys: Any) -> Any:
    if isinstance(keys, list):
        for k in keys:
            yield from _flatten(k)
    else:
        yield keys


def _pack(keys: Any, values: dict) -> Any:
    return [_pack(k, values) for k in keys] if isinstance(keys, list) else values[keys]
