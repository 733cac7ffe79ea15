"""Helpers shared by the tests."""
from __future__ import annotations

import os
import threading
import time
from localcluster.client.future import gateway_of
from localcluster.system.machine import frame_of


def wait_for(predicate, timeout: float = 30.0) -> None:
    """Poll ``predicate`` until it holds. Only for state that another process changes and
    that no event announces (a worker's garbage collection, its heartbeat spilling);
    everything else waits on the event itself."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)


def block_until(path: str, timeout: float = 60.0) -> None:
    """Run inside a task: return once the test creates the marker file ``path``. A task
    released at the moment the test chooses, instead of a sleep the test must race."""
    import os
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"marker {path} never appeared")
        time.sleep(0.005)


def release(path) -> None:
    """Create the marker file that ``block_until`` waits for."""
    open(path, "w").close()


def wait_running(cluster, fut, timeout: float = 30.0):
    """Until ``fut``'s task is executing on a worker (read from the workers' status boards);
    returns that worker's WorkerInfo."""
    running = gateway_of(fut.client).running_tasks
    wait_for(lambda: fut.key in running(), timeout)
    return cluster.workers[running()[fut.key]]


def stop_session(proc) -> None:
    """Kill a child started with ``start_new_session=True`` and all it started (its session's
    process group), and reap it: a hung child must not outlive its test."""
    import os
    import signal
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def browser() -> str:
    """The system's Chromium, for the tests that drive a real browser: skipped when there is
    none, failed when LOCALCLUSTER_REQUIRE_BROWSER is set (CI installs it)."""
    import os
    import shutil
    import pytest
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    if os.environ.get("LOCALCLUSTER_REQUIRE_BROWSER"):
        pytest.fail("no Chromium on the PATH (apt-get install chromium); .ci/run installs it")
    pytest.skip("no Chromium on the PATH (apt-get install chromium)")


def require(*modules: str) -> None:
    """Skip the calling test module unless every one of ``modules`` is installed, without
    importing them (for modules that only a child process imports)."""
    import importlib.util

    import pytest
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)}", allow_module_level=True)


def released(path):
    block_until(path)
    return 1


def reading(ident: int) -> bool:
    """Whether thread ``ident`` is inside a read of a lent channel now."""
    frame = frame_of(ident)
    while frame is not None:
        if frame.f_code.co_name == "read_for":
            return True
        frame = frame.f_back
    return False


def released_once_reading(client, tmp_path) -> tuple:
    """A future whose task ends once this thread waits in result(), reading the channel
    (Supervisor.read_for): its reply is read by this thread, whatever the load. And the
    helper thread that ends it (join it after the wait)."""
    marker = str(tmp_path / "go")
    fut = client.submit(released, marker, pure=False)
    me = threading.get_ident()

    def release() -> None:
        wait_for(lambda: reading(me))
        open(marker, "w").close()
    helper = threading.Thread(target=release)
    helper.start()
    return fut, helper


# /dev/shm names that other programs on the machine make at any time (a second test run
# beside this one under tox -p or tests/run_loaded.py, a loky pool): multiprocessing's and
# loky's semaphores, joblib's memmapping folders. localcluster makes none: its shared
# memory is memfd.
_FOREIGN_SHM = ("sem.", "joblib_memmapping_folder_")


def shm_names() -> set:
    """The /dev/shm entries that could be this test run's (the foreign ones left out)."""
    if not os.path.isdir("/dev/shm"):
        return set()
    return {name for name in os.listdir("/dev/shm") if not name.startswith(_FOREIGN_SHM)}
