"""The calls of dask's Client beyond submit, map and gather, for ``Client`` (client.py), which
keeps each public method where users call it and hands it here: ``run`` (a function on
every worker, outside the task slots), ``who_has``, ``scheduler_info``, ``get_versions``,
``get_worker_logs``, and ``compute``/``persist`` of dask collections (the graph's glue is in
integrations/daskgraph.py, imported on first use: dask loads only for a program that uses it).

``DaskCalls`` is made by its Client with what it needs by name: the client (its public
methods and ``cluster``, ``gateway``), its check that it is open, its ``Specs`` (functions
and arguments pickled as for submit) and its check of submit's options.
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable, Iterator, Optional

from .wire import serialize
from .config import check_int, check_resources
from .client_specs import Options, Specs, dask_keywords, name_of
from .future import futures_of


class DaskCalls:
    # Used by the user threads that call its Client; no state of its own.
    def __init__(self, client: Any, check: Callable[[], None], specs: Specs, options: Callable[..., Options]):
        self._client = client          # the Client: gather, cluster, gateway
        self._check = check            # the Client's: raises if it is closed (or a fork's)
        self._specs = specs            # the Client's function cache and argument pickling
        self._options = options        # the Client's check of submit's options

    def get_versions(self, check: bool = False) -> dict:
        from .worker.boot import versions
        mine = versions()
        theirs = self._client.gateway.worker_versions()
        if check:
            bad = []
            for name, v in theirs.items():
                for pkg in sorted(set(mine) | set(v)):
                    if pkg == "numpy" and (pkg not in mine or pkg not in v):
                        continue
                    if mine.get(pkg) != v.get(pkg):
                        bad.append(f"{pkg}: client {mine.get(pkg)} vs {name} {v.get(pkg)}")
            if bad:
                raise ValueError("Mismatched versions between the client and workers:\n  " + "\n  ".join(bad)
                                 + "\nInstall the same versions everywhere (workers use the client's "
                                 "interpreter; a package upgraded while the cluster runs needs client.restart()).")
        return {"client": mine, "workers": theirs}

    def run(self, function: Callable, args: tuple, kwargs: dict, workers: Any, wait: bool, nanny: bool,
            on_error: str) -> Optional[dict]:
        """``Client.run``: {worker name: result}, or None with ``wait=False``."""
        if on_error not in ("raise", "return", "ignore"):
            raise ValueError(f"run(on_error={on_error!r}): expected 'raise', 'return' or 'ignore'")
        if not callable(function):
            raise TypeError(f"run() needs a callable first, got {serialize.describe(function)}")
        if nanny:
            raise NotImplementedError("run(nanny=True): a localcluster nanny is a thread of this process, "
                                      "not a process of its own; call the function here instead")
        self._check()
        gateway = self._client.gateway
        names = gateway.check_worker_names(workers) if workers is not None else None
        _, fn_bytes = self._specs.function(function)
        payload, found = self._specs.pickle_args(function, args, kwargs)
        if found:
            raise TypeError(f"run({name_of(function)}, ...): its arguments hold futures ({next(iter(found))!r}), "
                            f"which client.run does not resolve; pass their result() instead")
        answers = gateway.run(fn_bytes, payload, names, f"client.run({name_of(function)})")
        if not wait:
            return None
        out: dict = {}
        for name, answer in answers.items():
            try:
                out[name] = serialize.loads(answer.result())
            except Exception as e:
                if on_error == "raise":
                    raise
                if on_error == "return":
                    out[name] = e
        return out

    def who_has(self, futures: Any) -> dict[str, tuple]:
        self._check()
        keys = None if futures is None else list(dict.fromkeys(f.key for f in futures_of(futures)))
        return self._client.gateway.who_has(keys)

    def scheduler_info(self, n_workers: int) -> dict:
        self._check()
        check_int(n_workers, "scheduler_info", "n_workers", lo=-1)
        cluster = self._client.cluster
        workers = cluster.workers
        shown = list(workers.values()) if n_workers == -1 else list(workers.values())[:n_workers]
        return {
            "type": "Scheduler", "id": os.path.basename(cluster.local_directory),
            "address": f"localcluster://{os.getpid()}", "services": {}, "started": self._client.gateway.started,
            "n_workers": len(workers), "total_threads": sum(w.nthreads for w in workers.values()),
            "total_memory": sum(w.memory_limit or 0 for w in workers.values()),
            "workers": {w.name: _worker_identity(w, cluster.local_directory, cluster.config["resources"])
                        for w in shown},
        }

    def get_worker_logs(self, n: Optional[int], workers: Any) -> dict[str, list]:
        logs = self._client.cluster.get_logs(n)
        if workers is None:
            return logs
        wanted = {workers} if isinstance(workers, str) else set(workers)
        return {name: lines for name, lines in logs.items() if name in wanted}

    def compute(self, collections: Any, sync: bool, optimize_graph: bool, options: dict, traverse: bool,
                kwargs: dict) -> Any:
        import dask
        from .integrations.daskgraph import compute
        options = self._graph_options("compute", kwargs, **options)
        single = not isinstance(collections, (list, tuple, set, frozenset))
        items = [collections] if single else list(collections)
        if traverse:
            items = [dask.delayed(c) if isinstance(c, (list, tuple, set, dict, Iterator)) else c for c in items]
        futures = compute(self._client, items, optimize_graph, options, **kwargs)
        result = self._client.gather(futures) if sync else futures
        return result[0] if single else result

    def persist(self, collections: Any, optimize_graph: bool, options: dict, kwargs: dict) -> Any:
        import dask
        from .integrations.daskgraph import persist
        options = self._graph_options("persist", kwargs, **options)
        single = not isinstance(collections, (list, tuple, set, frozenset))
        items = [collections] if single else list(collections)
        for c in items:
            if not dask.is_dask_collection(c):
                raise TypeError(f"persist() takes dask collections, got {serialize.describe(c)}")
        result = persist(self._client, items, optimize_graph, options, **kwargs)
        return result[0] if single else result

    def _graph_options(self, call: str, kwargs: dict, workers: Any, allow_other_workers: Any, retries: Any,
                       priority: Any) -> dict:
        """submit's options for every task of a graph; dask's scheduling keywords out of ``kwargs``."""
        dask_keywords(call, kwargs, ("fifo_timeout",))
        resources = kwargs.pop("resources", None)
        self._options(True, retries or 0, None, priority, workers, allow_other_workers,
                      check_resources(resources, call))           # checked as submit's
        options: dict = {"retries": retries or 0, "priority": priority}
        if workers is not None:
            options.update(workers=workers, allow_other_workers=allow_other_workers)
        if resources:
            options["resources"] = resources
        return options


def _worker_identity(w: Any, directory: str, resources: Optional[dict]) -> dict:
    """One worker as dask's ``scheduler_info()["workers"][...]`` shows it (a WorkerInfo in)."""
    return {"type": "Worker", "id": w.name, "name": w.name, "host": "localhost", "pid": w.pid,
            "nthreads": w.nthreads, "memory_limit": w.memory_limit or 0, "status": w.status, "resources": dict(resources or {}),
            "local_directory": directory, "last_seen": time.time(), "services": {}, "nanny": None,
            "metrics": {"executing": len(w.processing), "memory": w.memory, "managed_bytes": w.managed,
                        "spilled_bytes": {"memory": w.managed, "disk": w.spilled}}}
