"""Shared fixtures. ``no_leaks`` runs around every test and fails it if it leaves a
child process, a thread, a file descriptor or a /dev/shm entry behind; ``validated`` checks
the scheduler's invariants of every LocalCluster the test makes, however it makes it."""
from __future__ import annotations

import gc
import itertools
import os
import shutil
import sys
import tempfile
import threading
import time
import weakref

import psutil
import pytest

from _util import shm_names as _shm
from _xdist import (  # noqa: F401  (hooks: two test processes that end when one dies)
    pytest_configure, pytest_timeout_set_timer, pytest_unconfigure, pytest_xdist_make_scheduler)

from localcluster import Client, LocalCluster
from localcluster.cluster import live_clusters, validate, watch


def _fds() -> set:
    """Open descriptors, without the /proc files a live cluster's scheduler thread opens and
    closes every few milliseconds to sample its workers (a module-scoped cluster runs across
    tests): such an fd is always the lowest free number, so it looked like one that stayed open."""
    if not os.path.isdir("/proc/self/fd"):
        return set()
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("/proc/"):
                continue
        except OSError:       # closed while we looked: not open any more
            continue
        out.add(fd)
    return out




def _settle(check, timeout: float = 5.0):
    """Resources are released by other threads/processes: give them a moment (waiting on
    the condition itself, re-checked on each garbage collection and thread exit)."""
    deadline = time.monotonic() + timeout
    leftover = check()
    while leftover and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.02)
        leftover = check()
    return leftover


@pytest.fixture(autouse=True)
def no_leaks():
    me = psutil.Process()
    children = {p.pid for p in me.children(recursive=True)}
    threads = set(threading.enumerate())
    fds = _fds()
    shm = _shm()
    yield
    def new_children():
        alive = []
        for p in me.children(recursive=True):
            try:
                if p.pid not in children and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
            except psutil.Error:     # gone (or reaped) while we looked
                pass
        return alive

    def describe(p):
        try:
            return (p.pid, p.cmdline()[:3])
        except psutil.Error:
            return (p.pid, "exited")
    left = _settle(new_children)
    described = [describe(p) for p in left]
    for p in left:
        try:
            p.kill()
        except psutil.Error:
            pass
    assert not left, f"test left child processes behind: {described}"
    left_threads = _settle(lambda: [t for t in threading.enumerate() if t not in threads and t.is_alive()])
    assert not left_threads, f"test left threads behind: {left_threads}"
    left_fds = _settle(lambda: _fds() - fds)
    assert not left_fds, f"test left file descriptors open: {sorted(left_fds)} -> " + ", ".join(
        os.path.realpath(f"/proc/self/fd/{fd}") if os.path.exists(f"/proc/self/fd/{fd}") else "?" for fd in left_fds)
    left_shm = _settle(lambda: _shm() - shm)
    assert not left_shm, f"test left /dev/shm entries: {sorted(left_shm)}"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (setup.cfg): a test process per core this process may run on, two at most.
    Every test starts workers of its own, so more test processes than that only queue for
    the cores, and the tests that wait on a deadline wait longer. PYTEST_XDIST_AUTO_NUM_WORKERS
    still decides when set."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(2, cores))


def pytest_collection_finish(session):
    """What exists once the tests are collected (pytest, the imported libraries, the test
    modules) lives to the end of the session: freeze it out of the garbage collector's
    reach. A full collection then walks only what the tests made since, instead of every
    object of numpy, pandas and dask each time a test or a teardown calls gc.collect()."""
    gc.collect()
    gc.freeze()


_CACHES: dict = {}      # the session's folder for the tests' registries, and a counter


@pytest.fixture(scope="session", autouse=True)
def _run_registry_of_the_session(tmp_path_factory):
    """The clusters of the suite, and of the scripts it runs, record their runs in a registry
    of the suite's own (runs.py), never in the user's cache: a test that kills a script would
    make the user's next cluster say so."""
    saved = os.environ.get("XDG_CACHE_HOME")
    tempfile.gettempdir()       # this process's, fixed before any test points TMPDIR elsewhere
    _CACHES["base"] = tmp_path_factory.mktemp("caches")
    _CACHES["count"] = itertools.count()
    os.environ["XDG_CACHE_HOME"] = str(_CACHES["base"] / "session")
    yield
    if saved is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = saved


@pytest.fixture(scope="session", autouse=True)
def _children_import_this_checkout():
    """A test's child interpreter (a script, ``python -c``) imports the localcluster under
    test, the one this process imported, not whichever the interpreter finds first: run from
    a second checkout (a git worktree) beside an editable install of another, the children
    ran the other's code."""
    import localcluster
    saved = os.environ.get("PYTHONPATH")
    here = os.path.dirname(os.path.dirname(os.path.abspath(localcluster.__file__)))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here, saved]))
    yield
    if saved is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = saved


@pytest.fixture(scope="session", autouse=True)
def _children_read_compiled_code():
    """Where Python is told not to write bytecode (PYTHONDONTWRITEBYTECODE, as many container
    images set), every worker a test starts would compile localcluster from its source again,
    and the suite starts thousands. Compile the package and the tests once, beside their
    source as pip does for an installed package, so the children read the compiled code.
    (PYTHONPYCACHEPREFIX would keep the tree clean, but it moves where every library's compiled
    code is looked for: the children would compile numpy and pandas instead.)"""
    if sys.dont_write_bytecode:
        import compileall

        import localcluster
        for folder in (os.path.dirname(os.path.abspath(localcluster.__file__)),
                       os.path.dirname(os.path.abspath(__file__))):
            compileall.compile_dir(folder, quiet=2)


@pytest.fixture(autouse=True)
def run_registry(monkeypatch):
    """Each test its own registry, and its own temporary folder (TMPDIR) for the processes it
    starts. A script one test kills is never reported by the first cluster of another test's
    script; the folder its cluster left is never found, removed and told of by another test's
    cluster (a line in a notebook cell's output). Both go when the test ends. The registry's
    own folder (``localcluster/`` below the one returned) is made when it first writes."""
    folder = _CACHES["base"] / f"t{next(_CACHES['count'])}"
    (folder / "tmp").mkdir(parents=True)
    monkeypatch.setenv("XDG_CACHE_HOME", str(folder))
    monkeypatch.setenv("TMPDIR", str(folder / "tmp"))
    yield folder / "localcluster"
    shutil.rmtree(folder, ignore_errors=True)


# --- validate(): the scheduler's invariants, for every cluster a test makes ---------------
#
# Every LocalCluster made in this process checks its scheduler's invariants when it is closed
# (after its close that would be vacuous: the scheduler is cleared), and every one still open
# at the end of a test (a module-scoped fixture's) is checked then. A close inside a test only
# records what it found, and the test fails at its teardown: raising from close() would let a
# test's own ``pytest.raises(AssertionError)`` swallow the finding. A close outside any test (a
# module fixture's teardown) raises, which pytest reports as an error of that teardown.

_found: "list[str] | None" = None       # the current test's broken invariants; None between tests


def _broken(cluster: LocalCluster, when: str, error: AssertionError) -> str:
    return f"{cluster!r} {when}: a scheduler invariant is broken: {error}"


def _validate_at_close(cluster: LocalCluster) -> None:
    """Shadow this cluster's close() with one that validates first. The wrapper holds the
    cluster only weakly: a cycle would keep an abandoned cluster alive until a collection."""
    ref, owner, close = weakref.ref(cluster), os.getpid(), type(cluster).close
    checked = False

    def close_validated(*args, **kwargs):
        nonlocal checked
        c = ref()
        if c is None:
            return None
        # A forked child's copy is not its to close (close() returns), nor to lock.
        if checked or os.getpid() != owner:
            return close(c, *args, **kwargs)
        checked = True
        try:
            validate(c)
        except AssertionError as e:
            message = _broken(c, "at close", e)
            close(c, *args, **kwargs)
            if _found is None:
                raise AssertionError(message) from e
            _found.append(message)
            return None
        return close(c, *args, **kwargs)
    cluster.close = close_validated


@pytest.fixture(scope="session", autouse=True)
def _every_cluster_validates_at_close():
    undo = watch(_validate_at_close)      # session scope: module-scoped clusters are made first
    yield
    undo()


@pytest.fixture(autouse=True)
def validated():
    global _found
    _found = found = []
    try:
        yield
        for c in live_clusters():
            try:
                validate(c)
            except AssertionError as e:
                found.append(_broken(c, "at the end of the test", e))
    finally:
        _found = None
    assert not found, "\n".join(found)


@pytest.fixture
def cluster(request):
    """Two workers of one thread. A test that needs other settings says so with a marker:
    ``@pytest.mark.cluster(allowed_failures=0)``."""
    marker = request.node.get_closest_marker("cluster")
    settings = dict(n_workers=2, threads_per_worker=1, forward_logs=False)
    settings.update(marker.kwargs if marker else {})
    with LocalCluster(**settings) as c:
        yield c


@pytest.fixture
def client(cluster):
    with Client(cluster) as c:
        yield c


@pytest.fixture
def socket_pair():
    """A connected socket pair; whatever the test does not close is closed here."""
    import socket
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


@pytest.fixture
def seed(request):
    """A seed for a randomized test: ``LOCALCLUSTER_SEED`` when set (to replay a failure),
    else a fresh one. Printed at the start of the test, so a failure's output shows it."""
    value = int(os.environ.get("LOCALCLUSTER_SEED") or int.from_bytes(os.urandom(4), "little"))
    print(f"seed {value} (replay: LOCALCLUSTER_SEED={value} pytest '{request.node.nodeid}')")
    return value
