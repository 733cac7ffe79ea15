"""A pytest plugin: one cluster for a whole test session, as the ``localcluster_client`` fixture.

    def cube(x):
        return x ** 3

    def test_cube(localcluster_client):
        assert localcluster_client.submit(cube, 3).result() == 27

Installed with localcluster (a ``pytest11`` entry point), so it is there in every test
run of the environment; it costs nothing until a test asks for the fixture (no cluster,
no import beyond pytest's): the cluster starts on first use and closes when the session
ends. Its size: ``pytest --localcluster-workers 4``, or ``localcluster_workers = 4`` in
the ``[pytest]`` ini section; default 2. From tox::

    [testenv]
    deps = localcluster
    commands = pytest --localcluster-workers 4 {posargs}

Without autoloading (``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1``): ``pytest -p localcluster.pytest_plugin``.

Functions and classes defined in test modules (and in conftest.py) work on the workers
under every import mode. The workers start with the session's ``sys.path``, so under
``prepend``/``append`` they import a test module by name; a module a worker could not
import by name (``--import-mode=importlib``, where pytest gives it a name that resolves
only in this process) is registered with ``cloudpickle.register_pickle_by_value`` before
its first test that uses the fixture, so its functions and classes travel whole.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Iterator

import pytest

DEFAULT_WORKERS = 2


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("localcluster")
    group.addoption("--localcluster-workers", type=int, default=None, metavar="N",
                    help=f"workers of the session's localcluster_client cluster (default {DEFAULT_WORKERS})")
    parser.addini("localcluster_workers", f"workers of the localcluster_client cluster (default {DEFAULT_WORKERS})",
                  default=str(DEFAULT_WORKERS))


def _workers(config: Any) -> int:
    value = config.getoption("localcluster_workers")
    if value is None:
        value = config.getini("localcluster_workers")
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise pytest.UsageError(f"--localcluster-workers={value!r}: expected an integer >= 1") from None
    if n < 1:
        raise pytest.UsageError(f"--localcluster-workers={n}: expected an integer >= 1")
    return n


@pytest.fixture(scope="session")
def localcluster_client(pytestconfig: Any) -> Iterator[Any]:
    """A ``localcluster.Client`` on a cluster of ``--localcluster-workers`` workers, shared by the session."""
    from localcluster import Client
    with Client(n_workers=_workers(pytestconfig)) as client:
        yield client


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: Any) -> None:
    """Before a test that uses the fixture: its module and the conftest modules, when a
    worker could not import them by name, are pickled by value (cloudpickle)."""
    if "localcluster_client" not in getattr(item, "fixturenames", ()):
        return
    modules = [getattr(item, "module", None)] + [
        p for p in item.config.pluginmanager.get_plugins()
        if getattr(p, "__file__", None) and os.path.basename(p.__file__) == "conftest.py"]
    for module in modules:
        name = getattr(module, "__name__", None)
        if not name or (name, id(module)) in _checked:
            continue
        _checked.add((name, id(module)))
        if sys.modules.get(name) is module and not _importable(name, module.__file__):
            import cloudpickle  # the module cannot be imported by name on a worker: send it whole
            cloudpickle.register_pickle_by_value(module)


_checked: set = set()     # (module name, id) already looked at


def _importable(name: str, file: str) -> bool:
    """Whether a fresh interpreter with this ``sys.path`` (a worker's) imports ``name`` as
    ``file``. Asks the path finder level by level and never ``sys.modules``: pytest put the
    module there itself, under a name nothing else may resolve (``--import-mode=importlib``
    run from the ``pytest`` script, where the rootdir is not on ``sys.path``)."""
    from importlib.machinery import PathFinder
    spec, path = None, None
    parts = name.split(".")
    for i in range(len(parts)):
        if i and path is None:      # a module, not a package, above the name
            return False
        try:
            spec = PathFinder.find_spec(".".join(parts[:i + 1]), path)
        except (ImportError, ValueError):
            return False
        if spec is None:
            return False
        path = spec.submodule_search_locations
    origin = getattr(spec, "origin", None)
    return bool(origin and file) and os.path.realpath(origin) == os.path.realpath(file)
