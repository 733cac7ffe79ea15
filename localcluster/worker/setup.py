"""What a cluster asks of every worker, those running and those started later: uploaded files
imported (``Client.upload_file``) and worker plugins set up (``Client.register_plugin``).

The parent keeps the list of steps in the cluster's folder (``SETUP_FILE``: ``run_steps`` and
its steps, pickled); a worker starting runs them after the initializer, before it takes a
task, and a running worker is given each new step with ``Client.run``. A step that raises at
a worker's start is that worker's start-up failure, told with its traceback as any other.

A plugin is dask's ``WorkerPlugin`` protocol: ``setup(worker)``, ``teardown(worker)`` (at a
clean exit, and when the plugin is replaced or unregistered), ``transition(key, start,
finish)`` around each run ("ready" -> "executing" -> "memory" or "error"); each optional.
``worker`` is what ``get_worker()`` gives a task. Loaded in a worker only when a step runs.
"""
from __future__ import annotations

import importlib
import os
import pickle
import pkgutil
import sys
from typing import Any

from . import context
from .client import get_worker

SETUP_FILE = "setup.pkl"        # in the cluster's folder: (run_steps, (steps,)) pickled
UPLOADS = "uploads"             # the cluster's folder of uploaded files, beside it
PACKAGES = (".egg", ".zip", ".whl", ".pyz")

#: name -> (plugin, its transition watcher or None, its teardown call or None) on this worker
_plugins: dict = {}


class WorkerPlugin:
    """A base for worker plugins (dask's ``distributed.WorkerPlugin``, whose subclasses are taken
    too): override what you need. ``name``: registering another of that name replaces it."""

    name: Any = None

    def setup(self, worker: Any) -> None:
        """Run on each worker as it takes the plugin (at its start, or at registration)."""

    def teardown(self, worker: Any) -> None:
        """Run on each worker when it exits cleanly, or when the plugin is replaced or removed."""

    def transition(self, key: str, start: str, finish: str, **kwargs: Any) -> None:
        """A run of ``key`` on this worker went from ``start`` to ``finish``: "ready" to
        "executing", then "executing" to "memory" or "error"."""


class CallbackPlugin(WorkerPlugin):
    """``register_worker_callbacks(setup)``: ``setup()`` as a plugin's setup (``setup(dask_worker=
    worker)`` if it takes that parameter, as dask's does)."""

    def __init__(self, setup: Any):
        self.callback = setup
        self.name = f"worker-callback-{getattr(setup, '__name__', 'setup')}-{os.urandom(4).hex()}"

    def setup(self, worker: Any) -> None:
        import inspect
        try:
            takes = "dask_worker" in inspect.signature(self.callback).parameters
        except (TypeError, ValueError):
            takes = False
        if takes:
            self.callback(dask_worker=worker)
        else:
            self.callback()


def run_steps(steps: list) -> None:
    """At a worker's start: every step the cluster has taken so far, in order."""
    for step in steps:
        if step[0] == "upload":
            apply_upload(*step[1:])
        else:
            add_plugin(step[1], step[2])


def apply_upload(path: str, load: bool) -> list:
    """The uploaded file at ``path`` importable here, and (``load``) its modules imported, or
    reloaded if imported already: a second upload of a module replaces the first. Returns
    the names of the modules it holds."""
    directory, filename = os.path.split(path)
    stem, ext = os.path.splitext(filename)
    if ext == ".py":
        names = [stem]
        if directory not in sys.path:
            sys.path.insert(0, directory)
    else:
        if path not in sys.path:
            sys.path.insert(0, path)
        sys.path_importer_cache.pop(path, None)      # a zip replaced: its listing read anew
        names = [m.name for m in pkgutil.iter_modules([path])]
    importlib.invalidate_caches()
    worker = context.current()[0]
    if worker is not None:
        worker.loaded.clear()       # the tasks' functions of those modules looked up anew
    if load:
        for name in names:
            for loaded in [m for m in list(sys.modules) if m == name or m.startswith(name + ".")]:
                if loaded != name:
                    del sys.modules[loaded]     # a package's submodules come from the new file
            module = sys.modules.get(name)
            if module is not None:
                importlib.reload(module)
            else:
                importlib.import_module(name)
    return names


def add_plugin(name: str, data: bytes) -> None:
    """The plugin pickled in ``data`` set up on this worker under ``name``; one of that name
    already here is torn down first."""
    remove_plugin(name)
    plugin = pickle.loads(data)
    worker = get_worker()
    setup = getattr(plugin, "setup", None)
    if setup is not None:
        setup(worker=worker)
    watch = getattr(plugin, "transition", None)
    teardown = getattr(plugin, "teardown", None)
    close = (lambda: teardown(worker=worker)) if teardown is not None else None
    _plugins[name] = (plugin, watch, close)
    if watch is not None:
        context.watchers.append(watch)
    if close is not None:
        context.closing.append(close)


def remove_plugin(name: str) -> bool:
    """Tear down the plugin ``name`` on this worker, if it has one; True if it had."""
    entry = _plugins.pop(name, None)
    if entry is None:
        return False
    _plugin, watch, close = entry
    if watch is not None:
        context.watchers.remove(watch)
    if close is not None:
        context.closing.remove(close)
        close()
    return True


def plugins() -> list:
    """The names of the plugins set up on this worker, oldest first."""
    return list(_plugins)


def write_steps(path: str, steps: list) -> None:
    """The parent's side: the steps a worker starting takes, written whole (a worker starting
    meanwhile reads the old list or the new one, never a part)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        pickle.dump((run_steps, (steps,)), f)
    os.replace(tmp, path)


def read_steps(path: str) -> list:
    """The parent's side: the steps written so far (none before the first)."""
    try:
        with open(path, "rb") as f:
            _run, (steps,) = pickle.load(f)
    except FileNotFoundError:
        return []
    return list(steps)

