"""Client: the user's side of the cluster (Future, wait and as_completed live in future.py).

A :class:`Future` is a ``concurrent.futures.Future``: ``concurrent.futures.wait``,
``as_completed`` and ``asyncio.wrap_future`` work on it. It becomes done when
its task ends; a small result arrived with it and is unpickled on the first
``result()``, a large one stays on its worker until ``result()`` fetches it.
When the last Future of a key is garbage-collected, the key is released and
its data freed on the workers.
"""
from __future__ import annotations

import concurrent.futures as cf
import contextlib
import dataclasses
import gc
import hashlib
import itertools
import os
import threading
import time
import weakref
from collections import OrderedDict
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Optional

from . import future as _future
from .wire import serialize
from .cluster import LocalCluster
from .config import check_int, check_resources, check_seconds
from .engine.lifecycle import Phase
from .future import Future, as_completed, wait  # noqa: F401 - re-exported
from .future import walk as _walk
from .scheduler.records import Spec
from .worker import client as _in_tasks

__all__ = ["Client", "Future", "wait", "as_completed"]  # the last three re-exported from future.py

_fn_ids = itertools.count(1)


def _lookup(client_id: Optional[str]) -> Optional["Client"]:
    """The Client of this process with that id (None: the current one), for worker/client.py."""
    if client_id is None:
        return Client.current(allow_none=True)
    client = _future.client_by_id(client_id)
    return client if isinstance(client, Client) else None
_unique = itertools.count()
_PREFIX = os.urandom(4).hex()


class Client:
    """Submit work to a LocalCluster. ``Client()`` alone starts its own ``LocalCluster(**kwargs)``."""

    def __new__(cls, cluster: Optional[LocalCluster] = None, **kwargs: Any) -> Any:
        # In a task, Client() is the worker's client (get_client()), not a cluster started
        # inside the worker: what dask gives a task whose code makes a Client.
        if cluster is None and _in_tasks.in_worker():
            if kwargs:
                raise RuntimeError(
                    f"Client({', '.join(f'{k}=...' for k in kwargs)}) inside a task would start a new cluster "
                    f"inside this worker. Use localcluster.get_client() (or worker_client()) to submit to the "
                    f"cluster that runs the task.")
            return _in_tasks.get_client()
        return super().__new__(cls)

    def __init__(self, cluster: Optional[LocalCluster] = None, **kwargs: Any):
        if cluster is not None and not isinstance(cluster, LocalCluster):
            raise TypeError(f"Client(cluster=...) takes a LocalCluster, got {type(cluster).__name__}")
        if cluster is not None and kwargs:
            raise TypeError("pass either a LocalCluster or LocalCluster keyword arguments, not both")
        self._owns_cluster = cluster is None
        self.cluster = cluster if cluster is not None else LocalCluster(**kwargs)
        self.id = f"client-{_PREFIX}-{next(_unique)}"
        self._closed = False
        self._futures: dict[str, Any] = {}      # key -> a weakref of its Future, or a list of them
        self._refs: dict[str, int] = {}
        # Re-entrant: a garbage collection inside track() may run Future.__del__ -> untrack().
        self._refs_lock = threading.RLock()
        self._fn_cache: OrderedDict = OrderedDict()   # id(fn) -> (ref to fn, fn_id, fn_bytes)
        self.gateway = self.cluster.connect(self)     # the cluster's internal protocol, for this client and its futures
        _future.register_client(self)

    @property
    def status(self) -> str:
        """running, closed, or forked (this process is a fork of the cluster's owner)."""
        if self._closed:
            return "closed"
        return "forked" if self.gateway.phase is Phase.FORKED else "running"

    @classmethod
    def current(cls, allow_none: bool = False) -> Optional["Client"]:
        """The most recently created Client of this process that is still running (dask's
        ``Client.current()``); integrations (joblib, the pytest plugin) use it by default."""
        client = _future.latest_client()
        if client is None and not allow_none:
            raise ValueError("no running localcluster Client in this process: create one with Client()")
        return client

    # --- bookkeeping of futures -------------------------------------------------------

    def track(self, fut: Future) -> None:
        """A new Future of ``fut.key`` (the Future calls this as it is made)."""
        with self._refs_lock:
            self._track(fut)

    def track_many(self, futures: list) -> None:
        """New Futures made with ``track=False``: one lock for a whole ``map``."""
        with self._refs_lock:
            for fut in futures:
                self._track(fut)

    def _track(self, fut: Future) -> None:      # under _refs_lock
        key = fut.key
        ref = weakref.ref(fut)
        held = self._futures.get(key)
        if held is None:
            self._futures[key] = ref       # the common case: one future, no list
        elif type(held) is list:
            if len(held) > 2 * self._refs.get(key, 0) + 8:    # mostly dead: prune, amortized O(1)
                held[:] = [r for r in held if r() is not None]
            held.append(ref)
        else:
            self._futures[key] = [held, ref] if held() is not None else ref
        self._refs[key] = self._refs.get(key, 0) + 1

    def untrack(self, key: str) -> None:
        """A Future of ``key`` was garbage-collected; the last one releases the key.
        Runs inside the garbage collector, on any thread: hand the key off, never block."""
        if self.status == "forked":         # the parent's client holds the key
            return
        with self._refs_lock:
            n = self._refs.get(key, 0) - 1
            if n > 0:
                self._refs[key] = n
                return
            self._refs.pop(key, None)
            self._futures.pop(key, None)
        self.gateway.release(key)

    def resolve(self, key: str, status: str, value: Any) -> None:
        """The cluster says how ``key``'s task ended: finished (value: the payload, or None
        while the data stays on a worker), error or lost (value: the exception), cancelled."""
        refs = _refs_of(self._futures.get(key))
        if not refs:
            return
        exc = None
        for ref in refs:
            fut = ref()
            if fut is None or fut.done():
                continue
            if status in ("error", "lost"):
                if exc is None:     # once for every future of the key
                    exc = serialize.as_exception(value, key)
                fut.settle(status, exc)
            else:
                fut.settle(status, value)

    # --- submitting -------------------------------------------------------------------

    def _function(self, fn: Callable) -> tuple[int, bytes]:
        # Weakly held where the callable allows it: a cached bound method must not keep
        # its object alive (CPython's test_no_stale_references), nor a closure its data.
        entry = self._fn_cache.get(id(fn))
        if entry is not None and entry[0]() is fn:
            self._fn_cache.move_to_end(id(fn))
            return entry[1], entry[2]
        try:
            data = serialize.pickle_function(fn)
        except Exception as e:
            raise TypeError(f"could not pickle the function {serialize.describe(fn)}: "
                            f"{type(e).__name__}: {e}") from e
        fn_id = next(_fn_ids)
        try:
            ref: Callable = weakref.ref(fn)
        except TypeError:          # builtins, callable instances without __weakref__
            ref = _Strong(fn)
        self._fn_cache[id(fn)] = (ref, fn_id, data)
        if len(self._fn_cache) > 512:
            self._fn_cache.popitem(last=False)
        return fn_id, data

    def _pickle_args(self, fn: Callable, args: tuple, kwargs: dict) -> tuple:
        try:
            return serialize.dumps_collecting((args, kwargs))
        except Exception as e:
            where = "the arguments"
            for i, a in enumerate(args):
                try:
                    serialize.dumps(a)
                except Exception:
                    where = f"argument {i} ({serialize.describe(a)})"
                    break
            else:
                for k, a in kwargs.items():
                    try:
                        serialize.dumps(a)
                    except Exception:
                        where = f"keyword argument {k!r} ({serialize.describe(a)})"
                        break
            raise TypeError(f"could not pickle {where} of {_name(fn)}(): {type(e).__name__}: {e}. "
                            f"Pass something picklable, or create it inside the task.") from e

    def _spec(self, fn: Callable, args: tuple, kwargs: dict, key: Optional[str], opts: "_Options",
              how: "Optional[_Function]" = None) -> Spec:
        """``how``: the function pickled, named and hashed once, for a whole ``map``."""
        how = how or self._how(fn, opts.pure)
        payload, found = self._pickle_args(fn, args, kwargs)
        if found:
            foreign = [k for k, owner in found.items() if owner != self.id]
            if foreign:
                raise ValueError(f"the arguments of {how.name}() hold future {foreign[0]!r} of another "
                                 f"Client (closed or not this one): its data is not on this cluster. "
                                 f"Pass its result() instead, or submit from the client that made it.")
        deps = tuple(found)
        if key is None:
            if opts.pure:
                h = how.hashed.copy()
                meta = payload.meta
                h.update(meta.raw() if not isinstance(meta, bytes) else meta)
                for b in payload.buffers:
                    h.update(b.raw())
                key = f"{how.name}-{h.hexdigest()}"
            else:
                key = f"{how.name}-{_PREFIX}{next(_unique):x}"
        return Spec(key, how.fn_id, how.fn_bytes, payload, deps, opts.priority, opts.retries, opts.timeout,
                    opts.workers, opts.loose, opts.resources)

    def _how(self, fn: Callable, pure: bool) -> "_Function":
        fn_id, fn_bytes = self._function(fn)
        # sha1 runs on the CPU's SHA instructions: ~2 GB/s, three times blake2b here. A
        # key is an identity, not a security boundary.
        hashed = hashlib.sha1(fn_bytes, usedforsecurity=False) if pure else None
        return _Function(fn_id, fn_bytes, _name(fn), hashed)

    def _check(self) -> None:
        if self.status == "forked":
            self.gateway.check_open()       # says what a fork means
        if self.status != "running":
            raise RuntimeError("this Client is closed")
        self.gateway.check_open()

    def submit(self, fn: Callable, /, *args: Any, key: Optional[str] = None, pure: bool = True, retries: int = 0,
               timeout: Optional[float] = None, priority: int = 0, workers: Any = None,
               allow_other_workers: bool = False, resources: Optional[dict] = None, **kwargs: Any) -> Future:
        """Run ``fn(*args, **kwargs)`` on a worker. Futures among the arguments are replaced by their values.

        ``workers``: a worker name or names the task must run on (dask's meaning); with
        ``allow_other_workers=True`` they are only preferred. ``resources``: what one run
        holds on its worker, ``{"MEM": 1}``, out of what each worker declares
        (``LocalCluster(resources=)``); a ValueError if no worker ever could. dask's
        ``fifo_timeout`` and ``actor`` are never passed to ``fn`` (see ``_dask_keywords``)."""
        _dask_keywords("submit", kwargs, ("fifo_timeout",))
        return self.submit_call(fn, args, kwargs, key=key, pure=pure, retries=retries, timeout=timeout,
                                priority=priority, workers=workers, allow_other_workers=allow_other_workers,
                                resources=resources)

    def submit_call(self, fn: Callable, args: tuple = (), kwargs: Optional[dict] = None, *,
                    key: Optional[str] = None, pure: bool = True, retries: int = 0,
                    timeout: Optional[float] = None, priority: int = 0, workers: Any = None,
                    allow_other_workers: bool = False, resources: Optional[dict] = None) -> Future:
        """``submit`` with the function's arguments passed explicitly, for wrappers (the
        Executor) whose callers may use keywords such as ``key`` or ``timeout`` for ``fn``."""
        if not callable(fn):
            raise TypeError(f"submit() needs a callable first, got {serialize.describe(fn)}")
        if key is not None and not isinstance(key, str):
            raise TypeError(f"key must be a string, got {type(key).__name__}")
        opts = self._options(pure, retries, timeout, priority, workers, allow_other_workers,
                             check_resources(resources, "submit"))
        spec = self._spec(fn, tuple(args), dict(kwargs or {}), key, opts)
        return self._submit([spec], opts.resources)[0]

    def map(self, fn: Callable, /, *iterables: Iterable, key: Any = None, pure: bool = True, retries: int = 0,
            timeout: Optional[float] = None, priority: int = 0, workers: Any = None,
            allow_other_workers: bool = False, resources: Optional[dict] = None, **kwargs: Any) -> list[Future]:
        """``[submit(fn, *args, **kwargs) for args in zip(*iterables)]``, sent in batches."""
        if not callable(fn):
            raise TypeError(f"map() needs a callable first, got {serialize.describe(fn)}")
        if not iterables:
            raise TypeError("map() needs at least one iterable")
        _dask_keywords("map", kwargs, ("fifo_timeout", "batch_size"))   # batches are sized here
        opts = self._options(pure, retries, timeout, priority, workers, allow_other_workers,
                             check_resources(resources, "map"))
        with _no_collection():
            items = list(zip(*iterables))
            if isinstance(key, (list, tuple)):
                if len(key) != len(items):
                    raise ValueError(f"map(key=...) got {len(key)} keys for {len(items)} tasks")
                keys = list(key)
            elif key is None or isinstance(key, str):
                keys = [None] * len(items)
            else:
                raise TypeError("map(key=...) takes a list of keys, or a string prefix")
            specs = []
            how = self._how(fn, opts.pure)
            for args, k in zip(items, keys):
                spec = self._spec(fn, args, kwargs, k, opts, how)
                if isinstance(key, str):
                    spec = dataclasses.replace(spec, key=f"{key}-{spec.key.rsplit('-', 1)[-1]}")
                specs.append(spec)
            return self._submit(specs, opts.resources)

    def _options(self, pure: Any, retries: Any, timeout: Any, priority: Any, workers: Any,
                 allow_other_workers: Any, resources: Optional[tuple] = None) -> "_Options":
        _check_submit_options(retries, timeout, priority)
        if not isinstance(allow_other_workers, bool):
            raise TypeError(f"allow_other_workers={allow_other_workers!r}: expected True or False")
        self._check()
        names = self.gateway.check_worker_names(workers, not allow_other_workers) if workers is not None else None
        return _Options(bool(pure), retries, timeout, priority, names, allow_other_workers, resources)

    def _submit(self, specs: list, resources: Optional[tuple] = None) -> list[Future]:
        if resources is not None and specs:      # the same for each: one check
            self.gateway.check_resources(specs[0].key, resources)
        def track() -> list:
            futures = [Future(s.key, self, track=False) for s in specs]
            self.track_many(futures)
            return futures
        return self.gateway.submit(specs, track)

    def fail_pending(self, exc: BaseException) -> None:
        """Fail every pending future of this client with ``exc`` (restart, close, the cluster broke)."""
        with self._refs_lock:
            refs = [r for held in self._futures.values() for r in _refs_of(held)]
        Future.fail_all([f for r in refs if (f := r()) is not None], exc)

    def scatter(self, data: Any, broadcast: bool = False, workers: Any = None,
                allow_other_workers: bool = False, direct: Any = None, hash: bool = True) -> Any:
        """Put data on the workers; returns Futures (a list for a list, a dict for a dict).
        ``workers``: names to place it on; ``broadcast=True``: a copy on each of them (or on all);
        ``allow_other_workers=True``: any worker when none of ``workers`` is running.
        dask's ``direct`` and ``hash`` are accepted: data always goes straight to the workers,
        and every call makes new keys (dask's ``hash=False``; equal data is not shared)."""
        self._check()
        for flag, value in (("broadcast", broadcast), ("allow_other_workers", allow_other_workers)):
            if not isinstance(value, bool):
                raise TypeError(f"{flag}={value!r}: expected True or False")
        names = self.gateway.check_worker_names(workers, not allow_other_workers) if workers is not None else None
        if names is not None and allow_other_workers and not names & set(self.cluster.workers):
            names = None
        if isinstance(data, dict):
            return dict(zip(data, self.scatter(list(data.values()), broadcast, names)))
        single = not isinstance(data, (list, tuple, set, frozenset))
        values = [data] if single else list(data)
        items = [(f"{type(v).__name__}-{_PREFIX}{next(_unique):x}", serialize.dumps(v)) for v in values]
        futures = self.gateway.scatter(items, lambda: [Future(key, self) for key, _ in items], names, broadcast)
        return futures[0] if single else type(data)(futures) if isinstance(data, (list, tuple)) else futures

    def gather(self, futures: Any, errors: str = "raise", asynchronous: bool = False,
               timeout: Optional[float] = None) -> Any:
        """Results of (nested lists/dicts of) futures; ``errors="skip"`` leaves failed ones out.
        ``asynchronous=True``: a coroutine instead, for ``await client.gather(fs, asynchronous=True)``
        in a running event loop (which it never blocks). ``timeout``: seconds for the whole
        gather; past it, a TimeoutError that says how many are not done and why."""
        if errors not in ("raise", "skip"):
            raise ValueError(f"gather(errors={errors!r}): expected 'raise' or 'skip'")
        if not isinstance(asynchronous, bool):
            raise TypeError(f"gather(asynchronous={asynchronous!r}): expected True or False")
        _future.check_timeout("gather", timeout)
        if asynchronous:
            return self._gather_async(futures, errors, timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        flat = [f for f in _walk(futures) if isinstance(f, Future)]
        _future.wait_all(flat, timeout, "gather")   # not cf.wait: in a forked child it raises instead of hanging
        if errors == "raise":
            # The first error in _rebuild's order, raised from here: the caller's traceback then
            # shows one frame of ours above the task's own, not eight of _rebuild's recursion.
            for f in flat:
                error = f.stored_error()
                if error is not None:
                    raise error
        lazy = [f for f in flat if f.needs_fetch()]
        if lazy:   # fetch all large results at once rather than one round trip each
            fetched = self.gateway.fetch([f.key for f in lazy])
            for f, ff in zip(lazy, fetched):
                try:
                    payload = ff.result(None if deadline is None else max(0.0, deadline - time.monotonic()))
                except BaseException:
                    if not ff.done():
                        raise TimeoutError(f"gather(timeout={timeout:g}): the results were done, but fetching "
                                           f"their data from the workers took longer than {timeout:g} s") from None
                    continue
                f.prefill(payload)
        return _rebuild(futures, errors)

    async def _gather_async(self, futures: Any, errors: str, timeout: Optional[float]) -> Any:
        import asyncio
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        flat = [f for f in _walk(futures) if isinstance(f, Future)]
        for f in flat:
            if not f.done():
                try:
                    if deadline is None:
                        await f
                    else:
                        await asyncio.wait_for(f, max(0.0, deadline - loop.time()))
                except BaseException:  # noqa: BLE001 - gather below raises it, or skips it
                    if not f.done() and deadline is not None and loop.time() >= deadline:
                        # why it is late takes the cluster's lock: not on the event loop's thread
                        raise await loop.run_in_executor(None, _future.timed_out, "gather", flat, timeout) \
                            from None
                    if not f.done():
                        raise       # this coroutine was cancelled
        if errors == "raise":      # here rather than on the executor's thread: no frames of asyncio's
            for f in flat:
                error = f.stored_error()
                if error is not None:
                    raise error
        left = None if deadline is None else max(0.0, deadline - loop.time())
        return await loop.run_in_executor(None, lambda: self.gather(futures, errors, timeout=left))

    def replicate(self, futures: Any, n: Optional[int] = None, timeout: Optional[float] = 60.0) -> None:
        """Keep copies of these futures' data on ``n`` workers (all when None); returns when they exist."""
        check_int(n, "replicate", "n", lo=1, none="for every worker")
        self._check()
        fs = [f for f in _walk(futures) if isinstance(f, Future)]
        cf.wait(fs, timeout)
        self.gateway.replicate([f.key for f in fs], n, timeout)

    def cancel(self, futures: Any, force: bool = False) -> None:
        """Cancel these futures' tasks and release their data. Always what dask calls
        ``force=True``: the keys are cancelled for every client that holds them."""
        self.gateway.cancel([f.key for f in _walk(futures) if isinstance(f, Future)])

    def restart(self, timeout: float = 60.0, wait_for_workers: bool = True) -> "Client":
        """Stop every worker, forget every task (pending futures fail with ClusterRestarted),
        and return when fresh workers are up (also with dask's ``wait_for_workers=False``)."""
        self._check()
        self.cluster.restart(timeout)
        return self

    def wait_for_workers(self, n_workers: Optional[int] = None, timeout: Optional[float] = 60.0) -> None:
        """Return when at least ``n_workers`` workers are up (dask's name and meaning)."""
        self._check()
        self.cluster.wait_for_workers(n_workers, timeout)

    def get_versions(self, check: bool = False) -> dict:
        from .worker.process import versions
        mine = versions()
        theirs = self.gateway.worker_versions()
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

    def run(self, function: Callable, /, *args: Any, workers: Any = None, wait: bool = True, nanny: bool = False,
            on_error: str = "raise", **kwargs: Any) -> Optional[dict]:
        """Call ``function(*args, **kwargs)`` on every worker (or those named by ``workers``)
        now, outside the task slots: a worker whose threads are all busy answers at once.
        Returns ``{worker name: result}``. A worker's error is raised as itself (``on_error=
        "raise"``), put in the dict (``"return"``), or left out (``"ignore"``); a worker that
        dies meanwhile gives KilledWorker, naming the death. An async function is run to its
        end there. ``wait=False``: return None at once, the calls go on (dask's meaning)."""
        if on_error not in ("raise", "return", "ignore"):
            raise ValueError(f"run(on_error={on_error!r}): expected 'raise', 'return' or 'ignore'")
        if not callable(function):
            raise TypeError(f"run() needs a callable first, got {serialize.describe(function)}")
        if nanny:
            raise NotImplementedError("run(nanny=True): a localcluster nanny is a thread of this process, "
                                      "not a process of its own; call the function here instead")
        self._check()
        names = self.gateway.check_worker_names(workers) if workers is not None else None
        _, fn_bytes = self._function(function)
        payload, found = self._pickle_args(function, args, kwargs)
        if found:
            raise TypeError(f"run({_name(function)}, ...): its arguments hold futures ({next(iter(found))!r}), "
                            f"which client.run does not resolve; pass their result() instead")
        answers = self.gateway.run(fn_bytes, payload, names, f"client.run({_name(function)})")
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

    def who_has(self, futures: Any = None, **kwargs: Any) -> dict[str, tuple]:
        """The workers holding each future's data: key -> tuple of worker names (every key
        the cluster knows when ``futures`` is None), as dask's ``who_has``."""
        self._check()
        keys = None if futures is None else list(dict.fromkeys(f.key for f in _future.futures_of(futures)))
        return self.gateway.who_has(keys)

    def scheduler_info(self, n_workers: int = -1, **kwargs: Any) -> dict:
        """dask's ``scheduler_info()``: the cluster and each worker, keyed by worker name.
        ``n_workers``: at most that many workers (-1: all)."""
        self._check()
        check_int(n_workers, "scheduler_info", "n_workers", lo=-1)
        workers = self.cluster.workers
        shown = list(workers.values()) if n_workers == -1 else list(workers.values())[:n_workers]
        return {
            "type": "Scheduler", "id": os.path.basename(self.cluster.local_directory),
            "address": f"localcluster://{os.getpid()}", "services": {}, "started": self.gateway.started,
            "n_workers": len(workers), "total_threads": sum(w.nthreads for w in workers.values()),
            "total_memory": sum(w.memory_limit or 0 for w in workers.values()),
            "workers": {w.name: _worker_identity(w, self.cluster.local_directory, self.cluster.config["resources"])
                        for w in shown},
        }

    def get_worker_logs(self, n: Optional[int] = None, workers: Any = None) -> dict[str, list]:
        """Each worker's last ``n`` log lines, dead workers included; ``workers``: only these names."""
        logs = self.cluster.get_logs(n)
        if workers is None:
            return logs
        wanted = {workers} if isinstance(workers, str) else set(workers)
        return {name: lines for name, lines in logs.items() if name in wanted}

    def dump_stacks(self, worker: Optional[str] = None) -> dict[str, str]:
        """Live stacks of every thread of every worker (or one), without stopping them."""
        return self.cluster.dump_stacks(worker)

    def recreate_error_locally(self, future: Future) -> Any:
        from .integrations.replay import recreate_error_locally
        return recreate_error_locally(self, future)

    def get(self, dsk: Any, keys: Any, **kwargs: Any) -> Any:
        """Run a dask task graph and return the values of ``keys`` (nested as given):
        ``dask.compute(x, scheduler=client.get)`` or ``dask.config.set(scheduler=client.get)``."""
        from .integrations.daskgraph import get
        return get(self, dsk, keys, **kwargs)

    def compute(self, collections: Any, sync: bool = False, optimize_graph: bool = True, workers: Any = None,
                allow_other_workers: bool = False, retries: int = 0, priority: int = 0, traverse: bool = True,
                **kwargs: Any) -> Any:
        """dask collections (delayed, array, bag, dataframe) computed on the cluster: a Future
        for each (a list for a list), or their values with ``sync=True``. ``traverse``: lists,
        tuples, sets and dicts are wrapped in ``dask.delayed`` (dask's meaning); ``kwargs`` go
        to dask's graph optimizations, as in dask."""
        import dask
        from .integrations.daskgraph import compute
        options = self._graph_options("compute", kwargs, workers, allow_other_workers, retries, priority)
        single = not isinstance(collections, (list, tuple, set, frozenset))
        items = [collections] if single else list(collections)
        if traverse:
            items = [dask.delayed(c) if isinstance(c, (list, tuple, set, dict, Iterator)) else c for c in items]
        futures = compute(self, items, optimize_graph, options, **kwargs)
        result = self.gather(futures) if sync else futures
        return result[0] if single else result

    def persist(self, collections: Any, optimize_graph: bool = True, workers: Any = None,
                allow_other_workers: bool = False, retries: int = 0, priority: int = 0, **kwargs: Any) -> Any:
        """dask collections computing on the cluster in the background: each the same collection,
        now backed by Futures of its keys (a list for a list); its data stays on the workers
        for as long as it lives. ``kwargs`` go to dask's graph optimizations, as in dask."""
        import dask
        from .integrations.daskgraph import persist
        options = self._graph_options("persist", kwargs, workers, allow_other_workers, retries, priority)
        single = not isinstance(collections, (list, tuple, set, frozenset))
        items = [collections] if single else list(collections)
        for c in items:
            if not dask.is_dask_collection(c):
                raise TypeError(f"persist() takes dask collections, got {serialize.describe(c)}")
        result = persist(self, items, optimize_graph, options, **kwargs)
        return result[0] if single else result

    def _graph_options(self, call: str, kwargs: dict, workers: Any, allow_other_workers: Any, retries: Any,
                       priority: Any) -> dict:
        """submit's options for every task of a graph; dask's scheduling keywords out of ``kwargs``."""
        _dask_keywords(call, kwargs, ("fifo_timeout",))
        resources = kwargs.pop("resources", None)
        self._options(True, retries or 0, None, priority, workers, allow_other_workers,
                      check_resources(resources, call))           # checked as submit's
        options: dict = {"retries": retries or 0, "priority": priority}
        if workers is not None:
            options.update(workers=workers, allow_other_workers=allow_other_workers)
        if resources:
            options["resources"] = resources
        return options

    def get_executor(self, **submit_kwargs: Any) -> Any:
        from .integrations.executor import ClusterExecutor
        return ClusterExecutor(self, **submit_kwargs)

    def after_fork(self) -> None:
        """In a child forked from this process: inert (its cluster is in Phase.FORKED; lifecycle.py). The
        lock is new: a thread of the parent may have held it at the fork."""
        self._refs_lock = threading.RLock()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        _future.unregister_client(self)
        if self._owns_cluster:
            self.cluster.close()

    def __copy__(self) -> "Client":
        return self

    def __reduce__(self) -> tuple:
        """A Client pickled into a task is that worker's client there (get_client()), as in
        dask; unpickled in this process, it is itself again."""
        return (_in_tasks.client_in_task, (self.id,))

    def __deepcopy__(self, memo: dict) -> "Client":
        """A Client is a handle on a live cluster: a copy is itself. ``copy.deepcopy(dask.config)``
        then works with ``scheduler=client.get`` set (a bound method deep-copies its object)."""
        return self

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Client {self.status} cluster={self.cluster!r}>"

    def _repr_html_(self) -> str:
        head = f'<div style="font-weight:600">Client {self.id} ({self.status})</div>'
        return head + self.cluster._repr_html_()

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> Optional[dict]:
        """In a Jupyter kernel with ipywidgets: the cluster's live dashboard."""
        return self.cluster._repr_mimebundle_(include, exclude)


class _Strong:
    """A strong stand-in for ``weakref.ref`` (callables that cannot be weakly referenced)."""
    __slots__ = ("obj",)

    def __init__(self, obj: Any):
        self.obj = obj

    def __call__(self) -> Any:
        return self.obj


class _Function(NamedTuple):
    """A task function as ``_spec`` needs it: its id and bytes, its name for keys, and the
    sha1 of its bytes for pure keys (copied, then fed each task's arguments)."""
    fn_id: int
    fn_bytes: bytes
    name: str
    hashed: Any


@dataclasses.dataclass(frozen=True)
class _Options:
    pure: bool
    retries: int
    timeout: Optional[float]
    priority: int
    workers: Optional[frozenset]
    loose: bool
    resources: Optional[tuple] = None      # config.check_resources: ((name, amount), ...)


def _worker_identity(w: Any, directory: str, resources: Optional[dict]) -> dict:
    """One worker as dask's ``scheduler_info()["workers"][...]`` shows it (a WorkerInfo in)."""
    return {"type": "Worker", "id": w.name, "name": w.name, "host": "localhost", "pid": w.pid,
            "nthreads": w.nthreads, "memory_limit": w.memory_limit or 0, "status": w.status, "resources": dict(resources or {}),
            "local_directory": directory, "last_seen": time.time(), "services": {}, "nanny": None,
            "metrics": {"executing": len(w.processing), "memory": w.memory, "managed_bytes": w.managed,
                        "spilled_bytes": {"memory": w.managed, "disk": w.spilled}}}


def _check_submit_options(retries: Any, timeout: Any, priority: Any) -> None:
    check_int(retries, "", "retries")
    check_seconds(timeout, "", "timeout")
    check_int(priority, "", "priority", lo=None)


# dask's scheduling keywords of submit and map: as in dask, never passed on to the function.
# Hints are dropped; what localcluster cannot honour is refused rather than given to ``fn``.
_DASK_REFUSED = {"actor": "actors", "actors": "actors"}


def _dask_keywords(call: str, kwargs: dict, hints: tuple) -> None:
    for name in hints:
        kwargs.pop(name, None)
    for name, what in _DASK_REFUSED.items():
        if kwargs.pop(name, None):
            raise NotImplementedError(f"{call}({name}=...) is dask's {what}, which localcluster does not have")


def _name(fn: Any) -> str:
    name = getattr(fn, "__name__", None) or type(fn).__name__
    return "lambda" if name == "<lambda>" else name


_SKIP = object()


def _rebuild(obj: Any, errors: str) -> Any:
    if isinstance(obj, Future):
        if errors == "skip" and (obj.cancelled() or obj.exception() is not None):
            return _SKIP
        try:
            return obj.result()
        except BaseException:
            if errors == "skip":
                return _SKIP
            raise
    if isinstance(obj, dict):
        out = {k: _rebuild(v, errors) for k, v in obj.items()}
        return {k: v for k, v in out.items() if v is not _SKIP}
    if isinstance(obj, (list, tuple, set, frozenset)):
        items = [x for x in (_rebuild(v, errors) for v in obj) if x is not _SKIP]
        return type(obj)(items) if not isinstance(obj, list) else items
    return obj


_collection_paused = 0       # maps under way that paused the cyclic collector (under _collection_lock)
_collection_lock = threading.Lock()


@contextlib.contextmanager
def _no_collection() -> Iterator[None]:
    """The cyclic garbage collector paused while a ``map`` makes its tasks: 200,000 tasks make
    about 1.4 million objects, none of them garbage, and the collector's passes over them
    were 40% of the time ``map`` took to hand its futures back. Nested and concurrent maps
    count; a collector the user had disabled stays disabled."""
    global _collection_paused
    with _collection_lock:
        if _collection_paused == 0 and not gc.isenabled():
            paused = False
        else:
            paused = True
            _collection_paused += 1
            gc.disable()
    try:
        yield
    finally:
        if paused:
            with _collection_lock:
                _collection_paused -= 1
                if _collection_paused == 0:
                    gc.enable()


def _refs_of(held: Any) -> list:
    """The weakrefs ``Client._futures`` holds for a key, as a list (a copy)."""
    if held is None:
        return []
    return list(held) if type(held) is list else [held]


_in_tasks.install_parent(_lookup)      # get_client() outside a task, and a Client unpickled here
