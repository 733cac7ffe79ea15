"""A memory cgroup per worker (cgroup.py), here as root: a task's grandchild that left
the process group with setsid dies with its worker, and a burst the nanny's sampling
cannot see meets the kernel's ceiling inside the worker's own group, reported as the
OOM killer with that group's counter as evidence. Where no group may be made, the
fallback is the process group, as before."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil
import pytest

from localcluster import Client, KilledWorker, LocalCluster
from localcluster.cgroup import WorkerGroup

from _util import wait_for

MiB = 2**20


@pytest.fixture
def cgroups_allowed():
    group = WorkerGroup.create("probe", None)
    if group is None:
        pytest.skip("this process may not create a memory cgroup (not root, no delegated subtree)")
    group.remove()


def start_escaping_grandchild() -> int:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    return child.pid


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("cgroup", [True, False])
def test_a_setsid_grandchild_dies_with_its_worker(cgroups_allowed, cgroup):
    with LocalCluster(n_workers=1, forward_logs=False, worker_cgroup=cgroup) as c, Client(c) as cl:
        grandchild = cl.submit(start_escaping_grandchild, pure=False).result(30)
        assert psutil.Process(grandchild).status() != psutil.STATUS_ZOMBIE
        (info,) = c.workers.values()
        os.kill(info.pid, signal.SIGKILL)
        wait_for(lambda: len(c.deaths) == 1)
        assert c.deaths[0].cause == "signal"
        try:
            if cgroup:
                wait_for(lambda: gone(grandchild))
            else:       # the fallback, documented: a process that left the group escapes
                assert not gone(grandchild)
        finally:
            if not gone(grandchild):
                os.kill(grandchild, signal.SIGKILL)


def burst(n_bytes: int) -> int:
    import numpy as np
    return int(np.ones(n_bytes // 8).sum())


def test_a_burst_between_samples_meets_the_ceiling_as_the_oom_killer(cgroups_allowed):
    pytest.importorskip("numpy")
    with LocalCluster(n_workers=1, memory_limit=200 * MiB, memory_ceiling=1.25, memory_sample_interval=30,
                      allowed_failures=0, forward_logs=False) as c, Client(c) as cl:
        fut = cl.submit(burst, 600 * MiB)
        with pytest.raises(KilledWorker, match="oom-killer"):
            fut.result(60)
        (death,) = c.deaths
        assert death.cause == "oom-killer" and death.signal == "SIGKILL" and death.tasks == (fut.key,)
        assert cl.submit(burst, 8 * MiB).result(30) == MiB          # the next worker is fine
