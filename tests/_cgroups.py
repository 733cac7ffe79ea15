"""Real memory cgroups for the tests that need the kernel's limits (root, or a delegated
cgroup-v2 subtree; elsewhere the test is skipped, saying why)."""
from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest

from localcluster.system.machine import memory_cgroups


def _nest_root():
    """A memory cgroup this process may make groups in: (directory, version), or (None, None)."""
    for version, directory in memory_cgroups():
        if version == "v1":
            return directory, "v1"
    for version, directory in memory_cgroups():
        if os.path.exists(os.path.join(directory, "cgroup.subtree_control")):
            return directory, "v2"
    return None, None


@contextlib.contextmanager
def memory_group(name: str, limit: int):
    """A new memory cgroup with ``limit`` bytes, removed afterwards whatever happens (what
    is still in it is killed first: only processes a test put there)."""
    root, version = _nest_root()
    if root is None:
        pytest.skip("no memory cgroup to nest into")
    path = os.path.join(root, f"lc-test-{name}-{os.getpid()}")
    try:
        os.mkdir(path)
    except OSError as e:
        pytest.skip(f"this process may not make a memory cgroup here: {e}")
    try:
        with open(os.path.join(path, "memory.limit_in_bytes" if version == "v1" else "memory.max"), "w") as f:
            f.write(str(limit))
        yield path, version
    finally:
        _remove(path)


def _remove(path: str) -> None:
    deadline = time.monotonic() + 20
    while True:
        try:
            with open(os.path.join(path, "cgroup.procs")) as f:
                for pid in f.read().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
        except FileNotFoundError:
            return
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:     # a killed member is a member until reaped
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)
