"""joblib's own ``test_parallel.py`` (shipped in the joblib wheel; the version is pinned in
pyproject.toml's test extra) run with "localcluster" added to its process backends, next to
loky and multiprocessing. Only the localcluster cases run; each case that fails by design
is listed in ``EXPECTED_FAILURES`` with its reason and marked ``xfail(strict=True)``, so a
new failure fails this test, and so does a listed case that starts passing.

Most cases run with one cluster for them all: a ``Client()`` made before the first of them and
closed after the last, which the backend takes as the current client, as a user's cluster is
taken. A cluster started for each ``Parallel`` call made each case pay for fresh workers that
import joblib's test module again, and the cases test joblib's calls, not our start-up. The
cases in ``OWN_CLUSTERS`` need the backend to start and stop a cluster of its own for each
call (they read joblib's name for its pool, or give up on calls whose batches must stop at
once): they run last, with no current client, each call on a cluster of its own.

The suite runs in a subprocess (``pytest.main`` with ``SuitePlugin``): joblib's tests leave
thread pools and executors behind by design, which our ``no_leaks`` fixture would flag, and
they need their own warning filters rather than this repository's ``filterwarnings = error``.
"""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import types
from typing import Any

import pytest

joblib = pytest.importorskip("joblib")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# The one line of joblib's test module that names its process backends. The module uses
# it in decorators at import, so it is rewritten in the source before the module runs.
PROCESS_LINE = 'PROCESS_BACKENDS = ["multiprocessing", "loky"]'

# Why a case fails with localcluster, by design (README, "joblib: what differs from loky").
UNKNOWN_ELSEWHERE = (
    "the backend is named in a process that never imported localcluster.joblib (a loky worker, "
    "or a fresh `python` running a script): joblib has no plugin entry point through which a "
    "third-party backend could register itself there. Our own workers know it")
NOT_IN_CALLER = (
    "n_jobs=1 still runs on the cluster, never in the calling process (where a crash would end "
    "it): the calls do not run one by one as joblib iterates, and do not see the caller's objects")
NO_MEMMAP = ("large arrays travel in memfd shared memory, not as np.memmap files in a temp_folder: "
             "a task receives a read-only ndarray and no temporary folder is made")

# test id (without "test_parallel.py::"; "*" stands for any text) -> its reason. Each
# pattern must match at least one localcluster case, and every case matched must fail.
EXPECTED_FAILURES: dict[str, str] = {
    "test_nested_loop[loky-localcluster]": UNKNOWN_ELSEWHERE,
    "test_nested_loop[back_compat_backend-localcluster]": UNKNOWN_ELSEWHERE,   # a loky subclass
    "test_backend_nesting_level[parallel_config-localcluster-loky]": UNKNOWN_ELSEWHERE,
    "test_backend_nesting_level[parallel_backend-localcluster-loky]": UNKNOWN_ELSEWHERE,
    "test_parallel_with_interactively_defined_functions[localcluster]": UNKNOWN_ELSEWHERE,
    # 9 cases: 3 ways of defining the function x 3 places to pass it, each in a fresh `python`
    "test_parallel_with_unpicklable_functions_in_args[*-localcluster]": UNKNOWN_ELSEWHERE,
    "test_dispatch_one_job[1-expected_queue0-localcluster]": NOT_IN_CALLER,
    "test_dispatch_one_job[4-expected_queue1-localcluster]": NOT_IN_CALLER,
    # joblib asserts that a task inside Parallel(n_jobs=1) sees the backend of the context
    "test_nested_backend_in_sequential[*-localcluster-*]": NOT_IN_CALLER,
    "test_auto_memmap_on_arrays_from_generator[localcluster]": NO_MEMMAP,
    "test_memmapping_leaks[localcluster]": NO_MEMMAP,
}


# test id pattern -> why its calls need the clusters the backend starts itself (no current client).
OWN_POOL = ("the case reads joblib's name for the backend's pool (None outside a call, the same one "
            "across the calls of a `with Parallel()` block, a new one after an abort)")
STOPS_AT_ONCE = ("joblib gives up on a call whose batches sleep for seconds, and the case times how soon it "
                 "ends: running batches stop at once only on a cluster the backend started (on a user's "
                 "cluster a running call runs to its end)")
OWN_CLUSTERS: dict[str, str] = {
    "test_parallel_as_context_manager[*]": OWN_POOL,
    "test_error_capture[*]": OWN_POOL,
    "test_parallel_timeout_fail[*]": STOPS_AT_ONCE,
    "test_parallel_timeout_fail_with_generator[*]": STOPS_AT_ONCE,
    "test_abort_backend[*]": STOPS_AT_ONCE,
    "test_multiple_generator_call[*]": STOPS_AT_ONCE,
    "test_multiple_generator_call_managed[*]": STOPS_AT_ONCE,
    # the generator dropped with one batch sleeping 30 s: on a shared cluster that batch would
    # hold a worker thread through the next case
    "test_parallel_unordered_generator_returns_fastest_first[*]": STOPS_AT_ONCE,
}


def _matches(name: str, pattern: str) -> bool:
    """``*`` matches any text; nothing else is special (test ids are full of brackets)."""
    return re.fullmatch(".*".join(map(re.escape, pattern.split("*"))), name, re.DOTALL) is not None


def _is_localcluster(value: object) -> bool:
    return value == "localcluster" or type(value).__name__ == "LocalClusterBackend"


class SuitePlugin:
    """Loads joblib's test module with localcluster among its process backends, keeps only
    the cases that run on localcluster, marks the expected failures, and gives the cases
    not in OWN_CLUSTERS one cluster for them all."""

    def __init__(self, expected: dict[str, str], own: dict[str, str]):
        self.expected = expected
        self.own = own
        self.selected = 0
        self.marked = 0
        self.own_items: set = set()
        self.shared: Any = None         # the Client of the cases that share one cluster
        self.shared_runs = 0

    def pytest_configure(self, config: pytest.Config) -> None:
        import localcluster.joblib  # noqa: F401 - registers the backend before BACKENDS is read

        spec = importlib.util.find_spec("joblib.test.test_parallel")
        with open(spec.origin, encoding="utf-8") as f:
            source = f.read()
        if source.count(PROCESS_LINE) != 1:
            raise RuntimeError(f"joblib {joblib.__version__}'s test_parallel.py no longer has the line "
                               f"{PROCESS_LINE!r}: update tests/external/test_joblib_suite.py to the new version")
        source = source.replace(PROCESS_LINE, PROCESS_LINE[:-1] + ', "localcluster"]')
        module = types.ModuleType(spec.name)
        module.__file__, module.__spec__, module.__package__ = spec.origin, spec, "joblib.test"
        # pytest imports the collected file by this name and finds this module already there
        sys.modules[spec.name] = module
        exec(compile(source, spec.origin, "exec"), module.__dict__)

    def pytest_collection_modifyitems(self, config: pytest.Config, items: list) -> None:
        keep, drop = [], []
        for item in items:
            params = getattr(getattr(item, "callspec", None), "params", {})
            (keep if any(_is_localcluster(v) for v in params.values()) else drop).append(item)
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
        self.selected = len(keep)
        unused = set(self.expected)
        for item in keep:
            name = item.nodeid.split("::", 1)[1]
            for pattern, reason in self.expected.items():
                if _matches(name, pattern):
                    item.add_marker(pytest.mark.xfail(strict=True, reason=reason))
                    unused.discard(pattern)
                    self.marked += 1
                    break
        own = [item for item in keep if self._needs_own(item.nodeid.split("::", 1)[1])]
        self.own_items = set(own)
        idle = [p for p in self.own if not any(_matches(i.nodeid.split("::", 1)[1], p) for i in own)]
        if idle:
            raise pytest.UsageError(f"OWN_CLUSTERS patterns that match no localcluster case of joblib "
                                    f"{joblib.__version__}'s suite: {idle}")
        items[:] = [item for item in keep if item not in self.own_items] + own
        if unused:
            raise pytest.UsageError(f"expected failures that match no localcluster case of joblib "
                                    f"{joblib.__version__}'s suite: {sorted(unused)}")

    def _needs_own(self, name: str) -> bool:
        return any(_matches(name, pattern) for pattern in self.own)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        """Before the case's fixtures: the shared cluster is up for a case that shares it,
        and gone for good before the first case that needs clusters of its own."""
        if item in self.own_items:
            self._close_shared()
        elif self.shared is None:
            from localcluster import Client
            self.shared = Client()
            self.shared_runs += 1

    def _close_shared(self) -> None:
        if self.shared is not None:
            self.shared.close()         # a Client() closes the cluster it started
            self.shared = None

    def pytest_sessionfinish(self) -> None:
        self._close_shared()

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        terminalreporter.write_line(f"localcluster cases: {self.selected}, expected failures: {self.marked}, "
                                    f"on clusters of their own: {len(self.own_items)}, "
                                    f"shared clusters started: {self.shared_runs}")


def run_suite(extra_args: list[str]) -> int:
    """Run in the subprocess: joblib's suite, localcluster cases only."""
    spec = importlib.util.find_spec("joblib.test.test_parallel")
    args = [spec.origin, "-p", "no:cacheprovider", "-o", "addopts=",
            "-o", "filterwarnings=", "-o", "timeout=120", "--rootdir", os.path.dirname(spec.origin),
            "-c", os.devnull, *extra_args]
    return pytest.main(args, plugins=[SuitePlugin(EXPECTED_FAILURES, OWN_CLUSTERS)])


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_joblib_test_parallel_with_localcluster_among_its_backends():
    script = f"import sys; sys.path.insert(0, {HERE!r}); import test_joblib_suite as s; sys.exit(s.run_suite(['-q', '-rfEX']))"
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=880)
    lines = run.stdout.strip().splitlines() or [""]
    summary = lines[-1]
    print(run.stdout[-8000:])
    assert run.returncode == 0, f"joblib's suite with localcluster: {summary}\n{run.stdout[-20000:]}\n{run.stderr[-3000:]}"
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|xfailed|failed|errors?|xpassed|skipped)", summary)}
    cases, marked, own, shared = map(int, re.search(
        r"localcluster cases: (\d+), expected failures: (\d+), on clusters of their own: (\d+), "
        r"shared clusters started: (\d+)", run.stdout).groups())
    assert own >= len(OWN_CLUSTERS) and shared == 1, (own, shared)     # both ways a call finds its cluster ran
    # xpassed: a case joblib itself marks xfail (not strict) for loky's sake, that passes here
    ran = sum(counts.get(k, 0) for k in ("passed", "xfailed", "xpassed", "skipped"))
    assert counts.get("xfailed", 0) == marked and ran == cases, summary
    assert counts.get("passed", 0) >= 120, summary       # the suite did run: 150 cases with joblib 1.6.0
