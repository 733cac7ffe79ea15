"""Memory: limits, spilling, pausing, the nanny's kill, and the kernel's OOM killer."""
from __future__ import annotations

import logging
import os
import signal
import stat
import time

import pytest
from _cgroups import memory_group
from _util import block_until, release, wait_for

from localcluster import Client, KilledWorker, LocalCluster, config
from localcluster.cluster import available_memory
from localcluster.client.future import gateway_of

np = pytest.importorskip("numpy")
MiB = 2 ** 20
pytestmark = pytest.mark.timeout(120)


def block(i, mib=40):
    return np.full(mib * MiB // 8, i, dtype="f8")


def grow_forever(step_mib=10):
    hog = []
    while True:
        hog.append(np.ones(step_mib * MiB // 8))


@pytest.mark.parametrize("value, expected", [
    ("2GiB", 2 * 2 ** 30), ("500MB", 500 * 10 ** 6), (123456789, 123456789), (None, None), (0, None),
    ("0", None), ("1.5 GiB", int(1.5 * 2 ** 30)), (0.25, 0.25), ("0.5", 0.5), (1, 1.0), ("auto", "auto"),
])
def test_memory_limit_forms(value, expected):
    assert config.resolve(memory_limit=value)["memory_limit"] == expected


def test_memory_limit_auto_divides_available_memory():
    with LocalCluster(n_workers=2, forward_logs=False) as c:
        assert c.memory_limit == available_memory() // 2
        assert all(i.memory_limit == c.memory_limit for i in c.workers.values())


def test_memory_limit_as_a_float_is_that_share_of_the_memory_per_worker(monkeypatch):
    import psutil
    with LocalCluster(n_workers=1, memory_limit=0.25, forward_logs=False) as c:
        assert c.memory_limit == int(available_memory() * 0.25)
        assert 0.2 <= c.memory_limit / psutil.virtual_memory().total <= 0.25
        assert [i.memory_limit for i in c.workers.values()] == [c.memory_limit]
    with config.set(memory_limit=0.5), LocalCluster(n_workers=0) as c:
        assert c.memory_limit == int(available_memory() * 0.5)
    monkeypatch.setenv("LOCALCLUSTER_MEMORY_LIMIT", "0.5")
    with LocalCluster(n_workers=0) as c:
        assert c.memory_limit == int(available_memory() * 0.5)


def test_memory_limit_as_a_float_is_a_share_of_the_enclosing_memory_cgroup(memory_cgroup, tmp_path):
    """In a container (here: a memory cgroup of 150 MiB) the share is of its limit, not of the
    machine's memory, as dask's distributed.system.MEMORY_LIMIT is."""
    import subprocess
    import sys
    import localcluster
    script = (f"import os; open({os.path.join(memory_cgroup, 'cgroup.procs')!r}, 'w').write(str(os.getpid()))\n"
              "from localcluster import LocalCluster\n"
              "with LocalCluster(n_workers=0, memory_limit=0.5) as c: print(c.memory_limit)\n")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(localcluster.__file__)))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env,
                         cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == 75 * MiB


@pytest.mark.parametrize("bad", ["lots", "-5MB", -1, "2 parsecs", 1.5, 0.0, -0.1, True, "1.5"])
def test_bad_memory_limit(bad):
    with pytest.raises(ValueError, match=r"memory_limit=.*'2GiB'.*'auto'.*None"):
        LocalCluster(memory_limit=bad)


@pytest.mark.slow
def test_worker_over_the_limit_is_killed_with_figures(caplog):
    caplog.set_level(logging.INFO, logger="localcluster")    # forward_logs=False: the line is INFO, not WARNING
    limit = 300 * MiB
    with LocalCluster(n_workers=1, memory_limit=limit, allowed_failures=0, forward_logs=False) as c, \
            Client(c) as cl:
        fut = cl.submit(grow_forever)
        with pytest.raises(KilledWorker, match="memory-limit") as info:
            fut.result(60)
        (death,) = c.deaths
        assert death.cause == "memory-limit" and death.signal == "SIGKILL"
        assert death.memory_limit == limit and death.memory > 0.95 * limit
        assert death.peak_memory >= death.memory and death.tasks == (fut.key,)
        assert "exceeding the memory budget" in death.message and "300.00 MiB" in death.message
        assert any("Worker exceeded 95% memory budget. Restarting" in l for l in death.log_tail)
        assert "memory-limit" in str(info.value) and "of 300.00 MiB limit" in str(info.value)
        assert cl.submit(sum, [1, 2]).result(30) == 3
    assert any("Worker exceeded 95% memory budget. Restarting" in r.getMessage() for r in caplog.records)


@pytest.mark.slow
def test_results_spill_to_disk_instead_of_killing_the_worker():
    with LocalCluster(n_workers=1, memory_limit=400 * MiB, forward_logs=False) as c, Client(c) as cl:
        futs = cl.map(block, range(12))
        wait_for(lambda: all(f.done() for f in futs))
        (info,) = c.workers.values()
        assert info.spilled >= 4 * 40 * MiB and info.managed <= 0.6 * 400 * MiB
        spill_dir = os.path.join(c.local_directory, info.name)
        assert stat.S_IMODE(os.stat(c.local_directory).st_mode) == 0o700
        assert len(os.listdir(spill_dir)) >= 4
        assert stat.S_IMODE(os.stat(spill_dir).st_mode) == 0o700          # SECURITY.md
        assert {stat.S_IMODE(os.stat(os.path.join(spill_dir, n)).st_mode) for n in os.listdir(spill_dir)} == {0o600}
        for i, f in enumerate(futs):
            arr = f.result(60)
            assert arr.shape == (5 * MiB,) and arr[0] == i and arr[-1] == i
        assert cl.submit(lambda a: float(a.sum()), futs[0]).result(60) == 0.0
        assert c.deaths == []
        directory = c.local_directory
    assert not os.path.exists(directory)


@pytest.mark.slow
def test_spill_directory_removed_after_the_worker_crashes(tmp_path):
    with LocalCluster(n_workers=1, memory_limit=200 * MiB, local_directory=str(tmp_path),
                      forward_logs=False) as c, Client(c) as cl:
        futs = cl.map(block, range(5))
        wait_for(lambda: all(f.done() for f in futs))
        (info,) = c.workers.values()
        spill_dir = os.path.join(c.local_directory, info.name)
        assert os.listdir(spill_dir)
        os.kill(info.pid, signal.SIGKILL)
        wait_for(lambda: len(c.deaths) == 1)
        assert not os.path.exists(spill_dir)
        assert [f.result(60)[0] for f in futs] == [0, 1, 2, 3, 4]     # recomputed from lineage
    assert os.listdir(tmp_path) == []


def hog_until(mib, marker):
    """Hold ``mib`` outside any task until the test creates ``marker``."""
    import builtins
    import threading
    builtins._hog = np.ones(mib * MiB // 8)
    def free():
        block_until(marker)
        del builtins._hog
    threading.Thread(target=free, daemon=True).start()
    return os.getpid()


@pytest.mark.slow
def test_paused_worker_receives_no_tasks_until_it_recovers(tmp_path):
    marker = str(tmp_path / "free")
    with LocalCluster(n_workers=1, memory_limit=400 * MiB, forward_logs=False) as c, Client(c) as cl:
        cl.submit(hog_until, 300, marker).result(30)     # pause at 320 MiB, terminate at 380
        wait_for(lambda: next(iter(c.workers.values())).status == "paused")
        later = cl.submit(sum, [1, 2])
        assert gateway_of(cl).task_state(later.key) == "ready"          # held back, not sent
        release(marker)
        name = next(iter(c.workers))
        assert later.result(30) == 3
        assert next(iter(c.workers.values())).status == "running"
        log = cl.get_worker_logs()[name]
        assert any(l.startswith("[nanny] paused") for l in log) and any(l.startswith("[nanny] resumed") for l in log)
        assert c.deaths == []


def test_workers_offer_themselves_to_the_oom_killer(cluster):
    for info in cluster.workers.values():
        with open(f"/proc/{info.pid}/oom_score_adj") as f:
            assert int(f.read()) > 0
    with open("/proc/self/oom_score_adj") as f:
        assert int(f.read()) <= 0


def test_workers_report_memory_and_history(client, cluster):
    held = client.submit(block, 1, 20)
    held.result(30)
    wait_for(lambda: all(len(i.memory_history) >= 3 for i in cluster.workers.values()))
    for info in cluster.workers.values():
        assert info.memory > 10 * MiB and info.status == "running"
        t, rss = info.memory_history[-1]
        assert abs(t - time.time()) < 5 and rss > 0
    assert sum(i.managed for i in cluster.workers.values()) >= 20 * MiB


@pytest.fixture
def memory_cgroup():
    with memory_group("memory", 150 * MiB) as (path, _version):
        yield path


def grow_after(marker, first_mib=80):
    """Hold ``first_mib`` MiB until the test has seen it sampled, then grow until killed."""
    first = np.ones(first_mib * MiB // 8)
    block_until(marker)
    grow_forever()
    return first


def test_kernel_oom_killer_death_is_told_apart_from_kill_9(memory_cgroup, tmp_path):
    # the worker is moved into a limited group, as into a container's: out of a group of its
    # own (test_cgroup.py has those), the evidence is the enclosing group's and the machine's
    with LocalCluster(n_workers=1, memory_limit=None, allowed_failures=0, forward_logs=False,
                      worker_cgroup=False) as c, Client(c) as cl:
        (info,) = c.workers.values()
        with open(os.path.join(memory_cgroup, "cgroup.procs"), "w") as f:
            f.write(str(info.pid))
        marker = str(tmp_path / "grow")
        fut = cl.submit(grow_after, marker)
        # the death's figure is the last sample before it; seen once above 70 MiB, it cannot
        # be a figure read while the process was torn down (the kill itself comes too fast
        # for a sample on a loaded machine)
        wait_for(lambda: (c.workers[info.name].memory or 0) > 70 * MiB)
        release(marker)
        with pytest.raises(KilledWorker, match="oom-killer"):
            fut.result(60)
        (death,) = c.deaths
        assert death.cause == "oom-killer" and death.signal == "SIGKILL" and death.tasks == (fut.key,)
        assert "out-of-memory killer" in death.message
        assert death.memory > 50 * MiB and death.peak_memory >= death.memory   # a real figure, not the teardown
        # a plain kill -9 right after is not mistaken for the OOM killer
        wait_for(lambda: len(c.workers) == 1)
        (info,) = c.workers.values()
        os.kill(info.pid, signal.SIGKILL)
        wait_for(lambda: len(c.deaths) == 2)
        assert c.deaths[1].cause == "signal"


def test_an_open_statm_reads_the_processes_rss_as_it_grows_and_nothing_once_it_is_gone():
    """The sampler's pread on a descriptor it keeps: the same figure as opening the file each
    time, it follows the process's growth, and it reads None once the process is reaped
    (never another process's, whatever reuses the pid)."""
    import subprocess
    import sys
    from localcluster.system.machine import open_statm, rss, rss_of
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.readline(); "
                              "b = bytearray(64 << 20); print('grown', flush=True); sys.stdin.readline()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    fd = open_statm(child.pid)
    try:
        assert fd is not None
        before = rss_of(fd)
        assert before is not None and abs(before - rss(child.pid)) < (4 << 20)
        child.stdin.write("grow\n")
        child.stdin.flush()
        assert child.stdout.readline() == "grown\n"
        grown = rss_of(fd)
        assert grown - before >= 60 << 20, (before, grown)
        assert abs(grown - rss(child.pid)) < (4 << 20)
        child.stdin.write("end\n")
        child.stdin.flush()
        child.wait(30)
        assert rss_of(fd) is None
    finally:
        os.close(fd)
        child.kill()
        child.wait()
        child.stdin.close()
        child.stdout.close()


TREE = """
import subprocess, sys, threading
def start():     # from a thread that is not the main one: its children are listed per thread
    kids.append(subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE))
kids = [subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)]
t = threading.Thread(target=start); t.start(); t.join()
print(" ".join(str(k.pid) for k in kids), flush=True)
sys.stdin.read()
for k in kids:
    k.stdin.close(); k.wait()
"""


def test_descendants_are_found_from_every_thread_of_the_tree_and_agree_with_psutil():
    """The sampler's list of a worker's processes: children a non-main thread started
    included, grandchildren included, the same as psutil's scan of all /proc."""
    import subprocess
    import sys
    import psutil
    from localcluster.system.machine import descendants
    top = subprocess.Popen([sys.executable, "-c", TREE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        kids = [int(p) for p in top.stdout.readline().split()]
        assert len(kids) == 2
        assert sorted(descendants(top.pid)) == sorted(kids)
        assert sorted(descendants(top.pid)) == sorted(c.pid for c in psutil.Process(top.pid).children(recursive=True))
        assert descendants(kids[0]) == []
        top.stdin.close()
        top.wait(30)
        assert descendants(top.pid) == []
    finally:
        top.kill()
        top.wait()
        top.stdout.close()


def hold_child_memory(mib: int, marker: str) -> int:
    import subprocess
    import sys
    child = subprocess.Popen([sys.executable, "-c", f"b = bytearray({mib} << 20); b[::4096] = b'x' * len(b[::4096]); "
                              "print(flush=True); import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    child.stdout.readline()
    block_until(marker)
    child.stdin.close()
    child.wait()
    return child.pid


def test_a_workers_memory_counts_the_processes_its_tasks_start(client, cluster, tmp_path):
    marker = str(tmp_path / "go")
    fut = client.submit(hold_child_memory, 200, marker, pure=False)
    try:
        wait_for(lambda: max(i.memory or 0 for i in cluster.workers.values()) > 200 * MiB)
    finally:
        release(marker)
    fut.result(30)
