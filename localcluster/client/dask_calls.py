"""The calls of dask's Client that only the user's process has, for ``Client`` (client.py),
which keeps each public method where users call it and hands it here: ``get_versions``,
``get_worker_logs``, plugins, uploads, the workers' keys, and ``compute``/``persist`` of dask
collections (the graph's glue is in integrations/daskgraph.py, imported on first use: dask
loads only for a program that uses it). The calls a task's client has too (submit, map,
gather, scatter, cancel, run, who_has, scheduler_info) are written once, in worker/api.py.

``DaskCalls`` is made by its Client with what it needs by name: the client (its public
methods and ``cluster``), its gateway (gateway.py), its check that it is open and its check
of submit's options.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib.abc
import importlib.util
import inspect
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional

from ..engine.plugins import is_scheduler_plugin
from ..wire import serialize
from ..config import check_duration, check_int, check_resources
from .specs import name_of
from ..worker.arguments import dask_keywords
from .future import gateway_of, loads_for
from ..published import Published, Subscription
from ..worker import setup

if TYPE_CHECKING:
    from ..gateway import Gateway


class DaskCalls:
    # Used by the user threads that call its Client; its subscriptions under _lock.
    def __init__(self, client: Any, gateway: Gateway, check: Callable[[], None], options: Callable[..., Any]):
        self._client = client          # the Client: gather, cluster
        self._gateway = gateway        # the cluster's internal protocol, as the Client holds it
        self._check = check            # the Client's: raises if it is closed (or a fork's)
        self._options = options        # the Client's check of submit's options
        #: datasets and events, asked of the scheduler through the client's gateway
        self.published = Published(self._ask, self._give_back, lambda payload: loads_for(client, payload))
        self._subscriptions: dict = {}       #: topic -> Subscription (subscribe_topic)
        self._lock = threading.Lock()

    def _ask(self, body: Any, timeout: Optional[float]) -> Any:
        self._check()
        answer = self._gateway.coordinate(body, timeout)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def _give_back(self, keys: tuple) -> None:
        for key in keys:
            self._gateway.release(key)

    def subscribe_topic(self, topic: str, handler: Callable[[tuple], Any]) -> None:
        if not isinstance(topic, str):
            raise TypeError(f"subscribe_topic(topic={topic!r}): expected a topic name (a str)")
        if not callable(handler):
            raise TypeError(f"subscribe_topic({topic!r}, handler=...): expected a callable, "
                            f"got {serialize.describe(handler)}")
        self.unsubscribe_topic(topic)       # one handler a topic, as in dask
        with self._lock:
            self._subscriptions[topic] = Subscription(self.published, topic, handler)

    def unsubscribe_topic(self, topic: str) -> None:
        with self._lock:
            sub = self._subscriptions.pop(topic, None)
        if sub is not None:
            sub.stop()

    def close(self) -> None:
        """The client closes: every subscription ends."""
        for topic in list(self._subscriptions):
            self.unsubscribe_topic(topic)

    def get_versions(self, check: bool = False) -> dict:
        from ..worker.boot import versions
        mine = versions()
        theirs = self._gateway.worker_versions()
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

    def _workers(self, call: str, workers: Any) -> dict:
        """cluster.workers, or the named ones (unknown names: a ValueError naming the known)."""
        self._check()
        infos = self._client.cluster.workers
        if workers is None:
            return infos
        names = self._gateway.check_worker_names(workers)
        return {name: info for name, info in infos.items() if name in names}

    def nthreads(self, workers: Any) -> dict[str, int]:
        return {name: w.nthreads for name, w in self._workers("nthreads", workers).items()}

    def has_what(self, workers: Any) -> dict[str, tuple]:
        infos = self._workers("has_what", workers)
        held: dict = {name: [] for name in infos}
        for key, names in self._gateway.who_has(None).items():
            for name in names:
                if name in held:
                    held[name].append(key)
        return {name: tuple(keys) for name, keys in held.items()}

    def processing(self, workers: Any) -> dict[str, tuple]:
        return {name: tuple(w.processing) for name, w in self._workers("processing", workers).items()}

    def run_on_scheduler(self, function: Callable, args: tuple, kwargs: dict) -> Any:
        if not callable(function):
            raise TypeError(f"run_on_scheduler() needs a callable first, got {serialize.describe(function)}")
        self._check()
        result = function(*args, **kwargs)
        if inspect.isawaitable(result):
            import asyncio

            async def run() -> Any:
                return await result
            try:
                return asyncio.run(run())
            except RuntimeError as e:
                if "running event loop" not in str(e):
                    raise
                raise RuntimeError(f"run_on_scheduler({name_of(function)}) is an async function and this "
                                   f"thread runs an event loop already: await {name_of(function)}() there "
                                   f"yourself (the scheduler is this process)") from None
        return result

    def story(self, keys: tuple) -> list[tuple]:
        self._check()
        names = []
        for k in keys:
            if hasattr(k, "key") and hasattr(k, "client"):      # a Future
                k = k.key
            if not isinstance(k, str):
                raise TypeError(f"story() takes keys (strings) or Futures, got {serialize.describe(k)}")
            names.append(k)
        return self._gateway.story(names)

    def get_task_stream(self, start: Any, stop: Any, count: Optional[int], plot: Any) -> list:
        """dask's task stream records of the runs the cluster's history keeps: those ended
        between ``start`` and ``stop`` (unix times, or how long ago: "60s"), the last ``count``."""
        self._check()
        if plot:
            raise NotImplementedError("get_task_stream(plot=...): there is no Bokeh figure here; "
                                      "`with localcluster.report('run.html'):` draws the task stream, "
                                      "with each worker's memory and every death, in one HTML page")
        records = self._client.cluster.history.tasks()
        now = time.time()
        bounds = [None if b is None else now - check_duration(b, "get_task_stream", name)
                  if isinstance(b, str) else float(b) for b, name in ((start, "start"), (stop, "stop"))]
        if bounds[0] is not None:
            records = [r for r in records if r.stop >= bounds[0]]
        if bounds[1] is not None:
            records = [r for r in records if r.stop <= bounds[1]]
        if count is not None:
            records = records[-check_int(count, "get_task_stream", "count", lo=0):] if count else []
        return stream_records(self._client, records)

    def dump_cluster_state(self, filename: str, exclude: Any, format: str) -> str:
        """``Client.dump_cluster_state``: the file written (its format: docs/dask-api.md)."""
        self._check()
        if format not in _DUMP_FORMATS:
            raise ValueError(f"dump_cluster_state(format={format!r}): expected one of {sorted(_DUMP_FORMATS)}")
        exclude = set(exclude or ())
        unknown = exclude - set(DUMP_SECTIONS)
        if unknown:
            raise ValueError(f"dump_cluster_state(exclude={sorted(unknown)!r}): the sections are {list(DUMP_SECTIONS)}")
        state = {"localcluster": _version(), "time": time.time()}
        for section in DUMP_SECTIONS:
            if section not in exclude:
                state[section] = getattr(self, f"_dump_{section.replace('-', '_')}")()
        path = os.fspath(filename) + _DUMP_FORMATS[format]
        _write_dump(path, format, _plain(state))
        return path

    def _dump_cluster(self) -> dict:
        cluster = self._client.cluster
        return {"local_directory": cluster.local_directory, "config": dict(cluster.config),
                "started": self._gateway.started, "status": repr(cluster)}

    def _dump_workers(self) -> dict:
        return {name: dataclasses.asdict(w) for name, w in self._client.cluster.workers.items()}

    def _dump_tasks(self) -> dict:
        return self._gateway.tasks_dump()[0]

    def _dump_transitions(self) -> list:
        return self._gateway.tasks_dump()[1]

    def _dump_deaths(self) -> list:
        return [dataclasses.asdict(d) for d in self._client.cluster.deaths]

    def _dump_task_stream(self) -> list:
        return stream_records(self._client, self._client.cluster.history.tasks()[-_DUMP_STREAM:])

    def _dump_events(self) -> dict:
        return self.published.get_events(None)

    def _dump_logs(self) -> dict:
        return self._client.cluster.get_logs(_DUMP_LOG_LINES)

    def retire_workers(self, workers: Any, close_workers: bool, kwargs: dict) -> dict:
        self._check()
        if workers is None:
            raise ValueError("retire_workers() names the workers to let go (workers=[...], names as in "
                             "cluster.workers); cluster.scale(n) lets the cluster choose which")
        if not close_workers:
            raise NotImplementedError("retire_workers(close_workers=False): a localcluster worker that takes no "
                                      "work has no use here; it exits once its data is handed on")
        names = self._gateway.check_worker_names(workers)
        info = self._client.scheduler_info(-1)["workers"]
        self._gateway.retire(names, float(kwargs.get("timeout") or 60.0))
        return {name: info.get(name, {"name": name}) for name in sorted(names)}

    def restart_workers(self, workers: Any, timeout: Any) -> dict:
        self._check()
        names = self._gateway.check_worker_names(workers)
        seconds = check_duration(timeout, "restart_workers", "timeout") if isinstance(timeout, str) else timeout
        self._gateway.restart_workers(names, float(seconds))
        return {name: "OK" for name in sorted(names)}

    # --- what every worker runs, those started later too (worker/setup.py) ----------------------

    def _steps(self, change: Callable[[list], list]) -> None:
        """The cluster's list of setup steps, changed by ``change`` (one writer at a time)."""
        path = os.path.join(self._client.cluster.local_directory, setup.SETUP_FILE)
        with _steps_lock:
            setup.write_steps(path, change(setup.read_steps(path)))

    def upload_file(self, filename: Any, load: bool) -> None:
        self._check()
        path = os.fspath(filename)
        ext = os.path.splitext(path)[1]
        if ext not in (".py",) + setup.PACKAGES:
            raise ValueError(f"upload_file({path!r}): expected a .py, .egg, .zip, .whl or .pyz file")
        with open(path, "rb") as f:
            data = f.read()
        uploads = os.path.join(self._client.cluster.local_directory, setup.UPLOADS)
        os.makedirs(uploads, mode=0o700, exist_ok=True)
        target = os.path.join(uploads, os.path.basename(path))
        tmp = f"{target}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, target)
        if ext == ".py":        # its compiled copy may look as new as the file: never reused
            with contextlib.suppress(OSError):
                os.remove(importlib.util.cache_from_source(target))
        step = ("upload", target, bool(load))
        self._steps(lambda steps: [s for s in steps if s[:2] != step[:2]] + [step])
        self._client.run(setup.apply_upload, target, bool(load))

    def register_plugin(self, plugin: Any, name: Any) -> Any:
        self._check()
        if name is None:
            name = getattr(plugin, "name", None) or f"{type(plugin).__name__}-{os.urandom(8).hex()}"
        if not isinstance(name, str):
            raise TypeError(f"register_plugin(name={name!r}): expected a str")
        if is_scheduler_plugin(plugin):         # in this process, where the scheduler is
            self._gateway.scheduler_plugins.add(name, plugin)
            return "OK"
        _refuse_other_plugins(plugin)
        try:
            data = serialize.pickle_function(plugin)
        except Exception as e:
            raise TypeError(f"register_plugin: could not pickle {serialize.describe(plugin)}: "
                            f"{type(e).__name__}: {e}") from e
        step = ("plugin", name, data)
        # first for the workers to come (a replacement runs it), then on those running now
        self._steps(lambda steps: [s for s in steps if s[:2] != step[:2]] + [step])
        done = self._client.run(setup.add_plugin, name, data) or {}
        return {worker: {"status": "OK"} for worker in done}

    def unregister_scheduler_plugin(self, name: str) -> None:
        self._check()
        if not self._gateway.scheduler_plugins.remove(name):
            raise ValueError(f"unregister_scheduler_plugin({name!r}): no scheduler plugin of that name is registered")

    def unregister_worker_plugin(self, name: str) -> dict:
        self._check()
        found: list = []

        def without(steps: list) -> list:
            found.extend(s for s in steps if s[:2] == ("plugin", name))
            return [s for s in steps if s[:2] != ("plugin", name)]
        self._steps(without)
        if not found:
            raise ValueError(f"The worker plugin {name!r} does not exist (register_plugin names it by its "
                             f"name attribute, or the name= given)")
        done = self._client.run(setup.remove_plugin, name) or {}
        return {worker: {"status": "OK"} for worker in done}

    def get_worker_logs(self, n: Optional[int], workers: Any) -> dict[str, list]:
        logs = self._client.cluster.get_logs(n)
        if workers is None:
            return logs
        wanted = {workers} if isinstance(workers, str) else set(workers)
        return {name: lines for name, lines in logs.items() if name in wanted}

    def compute(self, collections: Any, sync: bool, optimize_graph: bool, options: dict, traverse: bool,
                kwargs: dict) -> Any:
        import dask
        from ..integrations.daskgraph import compute
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
        from ..integrations.daskgraph import persist
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


_steps_lock = threading.Lock()      # one writer of a cluster's setup steps at a time


def _refuse_other_plugins(plugin: Any) -> None:
    """A nanny plugin of dask's has nothing to attach to here: say so."""
    mod = sys.modules.get("distributed.diagnostics.plugin")
    if mod is not None and isinstance(plugin, mod.NannyPlugin):
        raise NotImplementedError("register_plugin(a NannyPlugin): a localcluster nanny is a thread of this "
                                  "process; a WorkerPlugin's setup runs in every worker, replacements included")
    if not any(callable(getattr(plugin, m, None)) for m in ("setup", "teardown", "transition")):
        raise TypeError(f"register_plugin() takes a worker plugin (setup(worker), teardown(worker), "
                        f"transition(key, start, finish): localcluster.WorkerPlugin or distributed.WorkerPlugin), "
                        f"got {serialize.describe(plugin)}")


#: the sections of dump_cluster_state's file, in order (docs/dask-api.md says what each holds)
DUMP_SECTIONS = ("cluster", "workers", "tasks", "transitions", "deaths", "task-stream", "events", "logs")
_DUMP_FORMATS = {"json": ".json", "yaml": ".yaml", "msgpack": ".msgpack.gz"}
_DUMP_STREAM = 10_000           # the newest runs of the task stream written
_DUMP_LOG_LINES = 200           # each worker's last log lines written


def _version() -> str:
    from ..version import __version__
    return __version__


def _plain(obj: Any) -> Any:
    """``obj`` as JSON's types: an exception (a task's error) as its type and message, pickled
    bytes as the exception they hold, anything else unknown as its repr."""
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, dict):
        return {k if isinstance(k, str) else repr(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [_plain(v) for v in obj]
    if isinstance(obj, bytes):
        obj = serialize.as_exception(obj)
    if isinstance(obj, BaseException):
        return {"type": type(obj).__qualname__, "message": str(obj)}
    return repr(obj)


def _write_dump(path: str, format: str, state: dict) -> None:
    if format == "json":
        import json
        with open(path, "w", encoding="utf-8") as f:
            json.dump(state, f, indent=1)
    elif format == "yaml":
        try:
            import yaml
        except ImportError:
            raise ImportError("dump_cluster_state(format='yaml') needs PyYAML (pip install pyyaml); "
                              "format='json' needs nothing") from None
        with open(path, "w", encoding="utf-8") as f:
            yaml.safe_dump(state, f)
    else:
        try:
            import msgpack
        except ImportError:
            raise ImportError("dump_cluster_state(format='msgpack') needs msgpack (pip install msgpack); "
                              "format='json' needs nothing") from None
        import gzip
        with gzip.open(path, "wb") as f:
            f.write(msgpack.packb(state))


_STREAM_STATUS = {"finished": "OK", "error": "error", "lost": "lost"}


def stream_records(client: Any, records: list) -> list:
    """TaskRecords (engine/history.py) as dask's task stream has them, with each result's size
    while it is in memory."""
    sizes = gateway_of(client).nbytes(list({r.key for r in records}))
    return [_stream_record(r, sizes.get(r.key)) for r in records]


def _stream_record(r: Any, nbytes: Optional[int]) -> dict:
    """A TaskRecord as dask's task stream has it: "OK" or "error" (and "lost": its worker
    died under it, a run dask's stream leaves out); ``nbytes`` while the result is in memory."""
    record = {"key": r.key, "worker": r.worker, "thread": r.thread, "status": _STREAM_STATUS.get(r.status, r.status),
              "startstops": [{"action": "compute", "start": r.start, "stop": r.stop}]}
    if nbytes is not None:
        record["nbytes"] = nbytes
    if r.serde:
        record["serde"] = r.serde
    if r.submitter is not None:
        record["submitter"] = r.submitter
    return record


class get_task_stream:     # noqa: N801 - dask's name: a context manager, used as a function
    """The task stream of the runs that end inside a ``with`` block (dask's ``get_task_stream``):
    ``with get_task_stream() as ts: ...``, then ``ts.data``, a list of records as
    ``Client.get_task_stream`` returns them. ``client``: the current one by default."""

    def __init__(self, client: Any = None, plot: Any = False, filename: str = "task-stream.html"):
        if plot:
            raise NotImplementedError("get_task_stream(plot=...): there is no Bokeh figure here; "
                                      "`with localcluster.report('run.html'):` draws the task stream in one page")
        if client is None:
            from .future import latest_client
            client = latest_client()
            if client is None:
                raise ValueError("get_task_stream() needs a running Client: create one first, or pass client=")
        self.client = client
        self.data: list = []
        self.figure = None
        self._start: Optional[int] = None

    def __enter__(self) -> "get_task_stream":
        self._start = self.client.cluster.history.recorded
        return self

    def __exit__(self, *exc: object) -> None:
        self.data.extend(stream_records(self.client, self.client.cluster.history.since(self._start)))


def worker_identity(w: Any, directory: str, resources: Optional[dict]) -> dict:
    """One worker as dask's ``scheduler_info()["workers"][...]`` shows it (a WorkerInfo in)."""
    return {"type": "Worker", "id": w.name, "name": w.name, "host": "localhost", "pid": w.pid,
            "nthreads": w.nthreads, "memory_limit": w.memory_limit or 0, "status": w.status, "resources": dict(resources or {}),
            "local_directory": directory, "last_seen": time.time(), "services": {}, "nanny": None,
            "metrics": {"executing": len(w.processing), "memory": w.memory, "managed_bytes": w.managed,
                        "spilled_bytes": {"memory": w.managed, "disk": w.spilled}}}


# --- the Client as dask's default scheduler ---------------------------------------------------
#
# distributed's Client() sets dask.config's "scheduler" while it is open (set_as_default=True),
# so that x.compute(), dask.compute(...) and dask.persist(...) run on its cluster. Ours does the
# same with one stand-in (DaskDefault) that hands each call to the current Client (the latest
# running one made with set_as_default=True: future.latest_client): a second Client takes over,
# and closing it gives the work back to the first, whatever order they close in. dask's own
# settings are saved when the first default Client opens and restored when the last one closes.
# dask is never imported for this: when it is not loaded yet, the settings are made the moment
# it is (a finder on sys.meta_path), so a program that never uses dask never pays its import.

# dask.config keys set while a Client is the default: the scheduler, and a shuffle that works
# across processes (dask's "disk" shuffle, its choice when no distributed Client is found, is a
# partd store shared by the threads of one process, not by worker processes).
_SHUFFLE = "dataframe.shuffle.method"


class DaskDefault:
    """What dask.config's ``scheduler`` holds while a localcluster Client is dask's default:
    a dask scheduler (``get``) and, for ``dask.persist``, a ``persist``, both handed to the
    current Client. One object for every Client, so that dask.config holds the same value
    whichever is current; it copies and pickles as itself (``copy.deepcopy(dask.config.config)``)."""

    def __call__(self, dsk: Any, keys: Any, **kwargs: Any) -> Any:
        return _current_default("compute").get(dsk, keys, **kwargs)

    def persist(self, collections: Any, optimize_graph: bool = True, **kwargs: Any) -> Any:
        return _current_default("persist").persist(collections, optimize_graph=optimize_graph, **kwargs)

    def __copy__(self) -> "DaskDefault":
        return self

    def __deepcopy__(self, memo: dict) -> "DaskDefault":
        return self

    def __reduce__(self) -> str:
        return "DASK_DEFAULT"

    def __repr__(self) -> str:
        return "<localcluster: the current Client (dask's default scheduler while a Client is open)>"


DASK_DEFAULT = DaskDefault()

_default_lock = threading.RLock()       # re-entrant: a finalizer (garbage collection) may run inside
_state = "off"                  # "off", "waiting" (for dask to be imported) or "on" (dask.config set)
_setter: Any = None             # the dask.config.set that made it "on": its exit restores dask's settings


def _current_default(what: str) -> Any:
    from .future import latest_client
    client = latest_client()
    if client is None:
        release_default()       # nobody is left to restore dask's settings: restore them now
        raise RuntimeError(
            f"dask's default scheduler was a localcluster Client, and none is open in this process any more "
            f"(it was garbage-collected without close(), or this process is a fork of the one that made it), "
            f"so this {what} has nowhere to run. dask's previous scheduler setting is restored: call it again "
            f"to use it, or make a Client first to run it on a cluster.")
    return client


def become_default() -> None:
    """A Client made with ``set_as_default=True`` opened (it is registered, so it is current)."""
    global _state
    with _default_lock:
        if _state != "off":
            return
        if "dask.config" in sys.modules:
            _apply()
        elif importlib.util.find_spec("dask") is not None:
            sys.meta_path.insert(0, _WHEN_DASK_LOADS)
            _state = "waiting"


def release_default() -> None:
    """A default Client closed (or was garbage-collected): when no other is open, dask's
    settings go back to what they were before the first, unless the user has changed its
    scheduler meanwhile (then that choice stays)."""
    global _state, _setter
    from .future import latest_client
    with _default_lock:
        if _state == "off" or latest_client() is not None:
            return
        if _state == "waiting":
            with contextlib.suppress(ValueError):
                sys.meta_path.remove(_WHEN_DASK_LOADS)
        else:
            import dask.config
            if dask.config.get("scheduler", None) is DASK_DEFAULT:
                _setter.__exit__(None, None, None)
            _setter = None
        _state = "off"


def _apply() -> None:      # under _default_lock, dask loaded
    global _state, _setter
    import dask.config
    settings: dict = {"scheduler": DASK_DEFAULT}
    if dask.config.get(_SHUFFLE, None) is None:     # the user's own choice stays
        settings[_SHUFFLE] = "tasks"
    _setter = dask.config.set(settings)
    _state = "on"


def _dask_loaded() -> None:
    """dask was imported while a default Client is open: make the settings now."""
    from .future import latest_client
    with _default_lock:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(_WHEN_DASK_LOADS)
        if _state == "waiting" and "dask.config" in sys.modules and latest_client() is not None:
            _apply()


class _WhenDaskLoads(importlib.abc.MetaPathFinder):
    """Finds ``dask`` with the finders after it, and has ``_dask_loaded`` run once its
    package has run (dask.config is loaded by then)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "dask":
            return None
        finders = sys.meta_path[sys.meta_path.index(self) + 1:] if self in sys.meta_path else []
        for finder in finders:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        run = getattr(loader, "exec_module", None)
        if run is None:
            return None

        def exec_module(module: Any) -> None:
            run(module)
            _dask_loaded()
        try:
            loader.exec_module = exec_module    # this spec's own loader (a finder makes one a spec)
        except (AttributeError, TypeError):
            return None
        return spec


_WHEN_DASK_LOADS = _WhenDaskLoads()
