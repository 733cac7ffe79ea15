"""``client.get_executor()`` against CPython's own concurrent.futures tests.

The Executor, wait() and as_completed() test classes of the interpreter's
``test.test_concurrent_futures`` run here unchanged, through a small executor type
that builds a real LocalCluster for each test and closes it at shutdown. Nothing of
CPython's code is copied: it is imported from the running interpreter. Some Python
builds ship the ``test`` package without this module; there the file skips and says so
(CI also runs it under an interpreter that has it: see .ci/run).
"""
from __future__ import annotations

import concurrent.futures as cf
import importlib
import sys

import pytest

from localcluster import Client, LocalCluster


def _load():
    """(ExecutorMixin, BaseTestCase, ExecutorTest, WaitTests, AsCompletedTests) of this interpreter."""
    try:   # 3.12+: a package of modules
        util = importlib.import_module("test.test_concurrent_futures.util")
        return (util.ExecutorMixin, util.BaseTestCase,
                importlib.import_module("test.test_concurrent_futures.executor").ExecutorTest,
                importlib.import_module("test.test_concurrent_futures.test_wait").WaitTests,
                importlib.import_module("test.test_concurrent_futures.test_as_completed").AsCompletedTests)
    except ModuleNotFoundError as e:
        if not e.name or not e.name.startswith("test.test_concurrent_futures"):
            raise
    try:   # 3.10, 3.11: one module
        m = importlib.import_module("test.test_concurrent_futures")
    except ModuleNotFoundError:
        pytest.skip(f"this Python {sys.version.split()[0]} ships no test.test_concurrent_futures (its "
                    f"'test' package was trimmed); CPython's executor tests run under an interpreter "
                    f"that has it (tox py310/py313, and the second step of .ci/run)", allow_module_level=True)
    return m.ExecutorMixin, m.BaseTestCase, m.ExecutorTest, m.WaitTests, m.AsCompletedTests


ExecutorMixin, BaseTestCase, ExecutorTest, WaitTests, AsCompletedTests = _load()


class ClusterPoolExecutor(cf.Executor):
    """Built like CPython's executors (``max_workers``), backed by its own LocalCluster;
    ``shutdown`` also closes that cluster, so each test leaves no process behind."""

    def __init__(self, max_workers=None):
        if max_workers is not None and max_workers <= 0:
            raise ValueError("max_workers must be greater than 0")
        # Two cores here: more worker processes than that only slows the tests down.
        self._cluster = LocalCluster(n_workers=min(max_workers or 2, 2), forward_logs=False)
        self._client = Client(self._cluster)
        self._executor = self._client.get_executor()

    def submit(self, fn, /, *args, **kwargs):
        return self._executor.submit(fn, *args, **kwargs)

    def map(self, fn, *iterables, timeout=None, chunksize=1):
        return self._executor.map(fn, *iterables, timeout=timeout, chunksize=chunksize)

    def shutdown(self, wait=True, *, cancel_futures=False):
        self._executor.shutdown(wait=wait, cancel_futures=cancel_futures)
        self._client.close()
        self._cluster.close()


class LocalClusterMixin(ExecutorMixin):
    executor_type = ClusterPoolExecutor


class TestExecutor(LocalClusterMixin, ExecutorTest, BaseTestCase):
    pass


class TestWait(LocalClusterMixin, WaitTests, BaseTestCase):
    pass


class TestAsCompleted(LocalClusterMixin, AsCompletedTests, BaseTestCase):
    pass
