"""A number of workers that cannot fit on the machine (memory, pids, file descriptors) is
refused before any worker starts, with the figures: by LocalCluster(n_workers=), scale(n) and
adapt(maximum=). The machine's own limits are replaced where a test needs one reached."""
from __future__ import annotations

import os

import psutil
import pytest
from _util import wait_for

from localcluster import LocalCluster
from localcluster.supervision import capacity
from localcluster.system import machine

pytestmark = pytest.mark.timeout(60)

MiB = 1 << 20


def children() -> set:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def test_ten_million_workers_are_refused_at_once_with_the_figures():
    before = children()
    with pytest.raises(ValueError) as info:
        LocalCluster(n_workers=10_000_000)
    text = str(info.value)
    assert children() == before                     # not one process started
    assert text.startswith("LocalCluster(n_workers=10000000) was refused: 10000000 workers cannot run on this "
                           "machine, and no worker was started for it:")
    # no machine has the 150 TB their "auto" limits need, nor pids for 40 million tasks (pid_max <= 2**22)
    assert "memory_limit=\"auto\" gives each worker" in text and "an idle worker needs 12.00 MiB" in text
    assert "a worker is 5 (its main thread, 1 executor for threads_per_worker=1" in text
    assert "pid_max" in text or "threads-max" in text
    assert "Ask for " in text and " workers or fewer" in text


def test_auto_memory_below_an_idle_worker_is_refused_with_the_most_that_fit(monkeypatch):
    monkeypatch.setattr(machine, "available_memory", lambda: 100 * MiB)
    with pytest.raises(ValueError) as info:
        LocalCluster(n_workers=10)
    text = str(info.value)
    assert ("memory: memory_limit=\"auto\" gives each worker 10.00 MiB (100.00 MiB available / 10), and an idle "
            "worker needs 12.00 MiB or more, above 80% of that (memory_pause)") in text
    assert "at most 6 workers fit" in text and "Ask for 6 workers or fewer" in text
    # without memory_pause, memory_terminate is the line; without either, the limit itself
    with pytest.raises(ValueError, match=r"above 95% of that \(memory_terminate\)"):
        LocalCluster(n_workers=10, memory_pause=None)
    # an explicit limit: so many idle workers that they alone fill the memory
    with pytest.raises(ValueError) as info:
        LocalCluster(n_workers=10, memory_limit="50MiB")
    assert ("memory: 10 idle workers need 120.00 MiB or more (12.00 MiB each), above the 100.00 MiB available; "
            "at most 8 workers fit") in str(info.value)


def test_workers_beyond_a_pids_limit_are_refused_naming_it(monkeypatch):
    counted = []

    def in_use():
        counted.append(1)
        return 60
    limit = ("the pids cgroup's pids.max (/sys/fs/cgroup/box)", 100, in_use, "pids.max of /sys/fs/cgroup/box")
    monkeypatch.setattr(machine, "task_limits", lambda: [limit])
    with pytest.raises(ValueError) as info:
        LocalCluster(n_workers=11)
    text = str(info.value)
    assert ("a worker is 5 (its main thread, 1 executor for threads_per_worker=1, a flusher, a heartbeat and a "
            "stacks thread), 55 for 11, and the pids cgroup's pids.max (/sys/fs/cgroup/box) is 100 with 60 in use; "
            "at most 8 workers fit") in text
    assert "raised (pids.max of /sys/fs/cgroup/box)" in text
    assert counted == [1]
    with pytest.raises(ValueError, match=r"a worker is 7 .* 210 for 30, and .* is 100; at most 14 workers fit"):
        LocalCluster(n_workers=30, threads_per_worker=3)
    assert counted == [1]               # more than the limit itself: what is in use is not counted


def test_workers_beyond_the_file_descriptor_limit_are_refused_naming_it(monkeypatch):
    monkeypatch.setattr(machine, "fd_limits", lambda: (200, 4096, 40))
    with pytest.raises(ValueError) as info:
        LocalCluster(n_workers=11)
    text = str(info.value)
    assert ("file descriptors: this process keeps 10 open for each worker (its socket, pipes, pidfd ...), 174 for 11 "
            "with 64 spare, and its RLIMIT_NOFILE (ulimit -n) is 200 with 40 open; at most 9 workers fit") in text
    assert "resource.setrlimit(resource.RLIMIT_NOFILE, (n, hard)) in your process, up to its hard limit of 4096" in text


def test_scale_and_adapt_beyond_what_fits_are_refused_and_change_nothing(monkeypatch):
    with LocalCluster(n_workers=1, forward_logs=False) as c:
        monkeypatch.setattr(machine, "fd_limits", lambda: (200, 200, 40))
        for call in (lambda: c.scale(12), lambda: c.adapt(maximum=12)):
            with pytest.raises(ValueError) as info:
                call()
            text = str(info.value)
            assert "12 workers cannot run on this machine (1 running now)" in text
            assert "174 for 11 with 64 spare" in text and "at most 10 workers fit" in text
            assert "setrlimit" not in text             # the hard limit is the soft one: nothing to raise here
        assert str(info.value).startswith("adapt(maximum=12) was refused")
        c.scale(1)                                   # what fits goes on as before
        assert len(c.workers) == 1


def test_the_figures_are_a_real_workers(cluster):
    """A worker's threads are tasks_per_worker; the parent's descriptors grow by no more
    than FDS_PER_WORKER for it."""
    names, pids = list(cluster.workers), [w.pid for w in cluster.workers.values()]
    # each starts its threads once it has said Ready: no event of it reaches this process
    wait_for(lambda: all(len(os.listdir(f"/proc/{pid}/task")) == capacity.tasks_per_worker(1) for pid in pids))
    before = held()
    cluster.scale(3)
    (new,) = set(cluster.workers) - set(names)
    kept = {fd: target for fd, target in held().items() if before.get(fd) != target}
    assert f"/proc/{cluster.workers[new].pid}/statm" in kept.values()
    assert 0 < len(kept) <= capacity.FDS_PER_WORKER, kept


def held() -> dict:
    """This process's descriptors that a worker keeps open (fd -> target), without the files
    the scheduler thread opens and closes as it samples (/proc and /sys, but for a statm)."""
    out = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:         # closed meanwhile: a passing one
            continue
        if not target.startswith(("/proc/", "/sys/")) or target.endswith("/statm"):
            out[fd] = target
    return out
