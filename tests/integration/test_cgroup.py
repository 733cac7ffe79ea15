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
from localcluster.system.cgroup import WorkerGroup
from localcluster.wire import vmcopy

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


@pytest.mark.slow
def test_a_burst_between_samples_meets_the_ceiling_as_the_oom_killer(cgroups_allowed):
    pytest.importorskip("numpy")
    with LocalCluster(n_workers=1, memory_limit=200 * MiB, memory_sample_interval=30,
                      allowed_failures=0, forward_logs=False) as c, Client(c) as cl:
        fut = cl.submit(burst, 600 * MiB)
        with pytest.raises(KilledWorker, match="oom-killer"):
            fut.result(60)
        (death,) = c.deaths
        assert death.cause == "oom-killer" and death.signal == "SIGKILL" and death.tasks == (fut.key,)
        assert cl.submit(burst, 8 * MiB).result(30) == MiB          # the next worker is fine


def make(n_bytes: int, fill: float):
    import numpy as np
    return np.full(n_bytes // 8, fill)


def group_of(pid: int) -> str:
    with open(f"/proc/{pid}/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if controllers == "memory":
                return f"/sys/fs/cgroup/memory{path}"
            if controllers == "" and os.path.exists(f"/sys/fs/cgroup{path}/memory.max"):
                return f"/sys/fs/cgroup{path}"
    raise AssertionError(f"worker {pid} is in no memory cgroup")


def shmem(group: str) -> int:
    with open(os.path.join(group, "memory.stat")) as f:
        return next(int(line.split()[1]) for line in f if line.startswith("shmem "))


@pytest.mark.slow
def test_results_the_client_keeps_do_not_count_against_the_ceiling_of_the_worker_that_made_them(cgroups_allowed):
    """The kernel charges a memfd to the group of its writer. Results the client fetches are
    copied out of the worker by the parent where it may (wire/vmcopy.py): the parent's own
    memory then, charged to nobody's group but the parent's. Elsewhere they cross as memfds:
    320 MiB of results kept by the client are charged to a worker whose ceiling is 240 MiB.
    Either way, and with the 80 MiB another worker fetched (relayed by the parent's two copies,
    or as memfds), it must live on, run a task of its own size, and still meet its ceiling in
    a burst."""
    pytest.importorskip("numpy")
    with LocalCluster(n_workers=2, memory_limit=200 * MiB, memory_sample_interval=30, allowed_failures=0,
                      forward_logs=False) as c, Client(c) as cl:
        (maker, other) = c.workers.values()
        kept = []
        for i in range(8):
            fut = cl.submit(make, 40 * MiB, i, workers=[maker.name])
            kept.append(fut.result(60))
            del fut
        # and results the other worker fetched from it
        held = [cl.submit(make, 40 * MiB, 10 + i, workers=[maker.name]) for i in range(2)]
        total = cl.submit(lambda *arrays: sum(float(a[-1]) for a in arrays), *held, workers=[other.name])
        assert total.result(60) == 21.0
        charged = shmem(group_of(maker.pid))
        if vmcopy.available(maker.pid):
            assert charged < 40 * MiB, charged          # no memfd written: neither fetched nor relayed
        else:
            assert charged >= 320 * MiB, charged        # the results kept, at least: memfds
        assert not c.deaths
        assert [float(a[0]) for a in kept] == list(range(8)) and all(a.nbytes == 40 * MiB for a in kept)
        assert cl.submit(burst, 150 * MiB, workers=[maker.name]).result(60) == 150 * MiB // 8
        fut = cl.submit(burst, 600 * MiB, workers=[maker.name])
        with pytest.raises(KilledWorker, match="oom-killer"):
            fut.result(60)
        assert [d.cause for d in c.deaths] == ["oom-killer"]


def _oom_kill_elsewhere() -> None:
    """A real OOM kill, in a 64 MiB group of its own: the machine's counter rises."""
    elsewhere = WorkerGroup.create("elsewhere", 64 * MiB)
    try:
        hog = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read(1); a = []\n"
                                "while True: a.append(bytearray(2**20))"], stdin=subprocess.PIPE)
        assert elsewhere.add(hog.pid)
        hog.stdin.write(b"x")
        hog.stdin.close()
        assert hog.wait(60) == -signal.SIGKILL            # the OOM killer, in its group
    finally:
        elsewhere.remove()


def test_an_oom_kill_elsewhere_on_the_machine_is_not_blamed_on_a_worker_killed_at_that_moment(cgroups_allowed):
    """The machine's counter rises for any OOM kill; a worker in its own group is judged by
    that group's counter alone. memory_sample_interval=30: no fresh baseline in between."""
    with LocalCluster(n_workers=1, memory_sample_interval=30, forward_logs=False) as c:
        (info,) = c.workers.values()
        _oom_kill_elsewhere()
        os.kill(info.pid, signal.SIGKILL)
        wait_for(lambda: len(c.deaths) == 1)
        assert c.deaths[0].cause == "signal"


@pytest.mark.slow
def test_a_worker_read_in_no_group_while_it_exits_is_still_judged_by_its_own_group(cgroups_allowed, monkeypatch):
    """A process read while it exits shows in no cgroup. The nanny's once-a-second look at
    the worker must not take that for leaving its group, or the SIGKILL that follows is
    judged by the machine's counter, and an OOM kill elsewhere passes for the worker's
    own (loaded run 1 on e49ff22: a soak SIGKILL reported as 'oom-killer')."""
    import localcluster.system.machine as machine
    real = machine.memory_cgroups
    with LocalCluster(n_workers=1, memory_sample_interval=0.05, forward_logs=False) as c:
        (info,) = c.workers.values()
        seen = []

        def exiting(pid=None):
            if pid == info.pid:
                seen.append(pid)
                return []
            return real(pid)
        monkeypatch.setattr(machine, "memory_cgroups", exiting)
        # and wherever it is imported by name: the nanny read it there before the fix
        monkeypatch.setattr("localcluster.supervision.nanny.memory_cgroups", exiting, raising=False)
        wait_for(lambda: len(seen) >= 2)     # the nanny looked at least once since
        _oom_kill_elsewhere()
        os.kill(info.pid, signal.SIGKILL)
        wait_for(lambda: len(c.deaths) == 1)
        assert c.deaths[0].cause == "signal"


# --- the worker's allowance, on files standing in for a group's ---------------------------

@pytest.fixture
def fake_group(tmp_path):
    def write(name, text):
        (tmp_path / name).write_text(text)

    def limit():
        return (tmp_path / "memory.max").read_text()
    write("memory.max", "max")
    write("memory.stat", "anon 1000\nshmem 0\nfile 0\n")
    return tmp_path, write, limit


def test_the_allowance_writes_nothing_until_the_nanny_sets_a_ceiling(fake_group):
    from localcluster.system.cgroup import SharedAllowance
    path, write, limit = fake_group
    a = SharedAllowance(str(path), "v2", ceiling=100 * MiB, slack=8 * MiB)
    a.charge(50 * MiB)
    a.charge(-50 * MiB)
    a.settle()
    assert limit() == "max"


def test_the_allowance_makes_room_for_what_is_written_and_gives_it_back_once_freed(fake_group):
    from localcluster.system.cgroup import SharedAllowance
    path, write, limit = fake_group
    write("memory.max", str(100 * MiB))                  # the nanny accepted the worker
    a = SharedAllowance(str(path), "v2", ceiling=100 * MiB, slack=8 * MiB)
    a.charge(4 * MiB)                                     # within the slack: no write needed...
    assert int(limit()) == 100 * MiB + 4 * MiB + 8 * MiB  # ...but the first look sets it
    a.charge(-4 * MiB)
    write("memory.stat", f"shmem {4 * MiB}\n")
    a.charge(300 * MiB)                                   # a large result on its way out
    assert int(limit()) >= 100 * MiB + 4 * MiB + 300 * MiB
    a.charge(-300 * MiB)
    write("memory.stat", f"shmem {304 * MiB}\n")          # the receiver keeps it
    a.settle()
    assert int(limit()) >= 100 * MiB + 304 * MiB
    write("memory.stat", "shmem 0\n")                     # and lets it go
    a.settle()
    assert int(limit()) == 100 * MiB + 8 * MiB


def test_the_allowance_stops_when_its_group_is_gone(fake_group):
    from localcluster.system.cgroup import SharedAllowance
    path, write, limit = fake_group
    a = SharedAllowance(str(path / "gone"), "v2", ceiling=100 * MiB)
    a.charge(10 * MiB)
    assert not a.enabled


KILLED_PARENT = """
import os
from localcluster import Client, LocalCluster
with LocalCluster(n_workers=2, forward_logs=False) as c, Client(c) as cl:
    cl.submit(sum, [1, 2]).result(30)
    print(os.getpid(), flush=True)
    os.kill(os.getpid(), 9)
"""


@pytest.mark.slow
def test_groups_a_killed_parent_left_are_removed_by_the_next_cluster_and_live_ones_kept(cgroups_allowed, tmp_path):
    from localcluster.system.machine import memory_cgroups
    script = tmp_path / "killed.py"
    script.write_text(KILLED_PARENT)
    with open(tmp_path / "killed.err", "w") as err_file:
        proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=err_file, text=True)
    out = proc.stdout.read()
    proc.stdout.close()
    # Dead but not reaped: its pid still exists, so no cluster starting meanwhile on this
    # machine (a parallel suite's) may purge its groups before they are counted.
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
    directories = [d for _, d in memory_cgroups()]

    def left_by(pid):
        return [n for d in directories if os.path.isdir(d) for n in os.listdir(d)
                if n.startswith(f"localcluster-{pid}-")]
    try:
        dead = int(out.split()[0])
        assert len(left_by(dead)) == 2          # SIGKILL: it could not clean up
    finally:
        assert proc.wait(60) == -signal.SIGKILL, (tmp_path / "killed.err").read_text()
    # a live process's group, empty or not, whatever its name says, stays
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    live = WorkerGroup.create("live", None)
    try:
        assert live.add(sleeper.pid)
        decoy = os.path.join(os.path.dirname(live.path), f"localcluster-{dead}-decoy")
        os.mkdir(decoy)
        sleeper_group = os.path.basename(live.path)
        with open(os.path.join(decoy, "cgroup.procs"), "w") as f:
            f.write(str(sleeper.pid))       # a process inside a dead pid's group: kept too
        nxt = tmp_path / "next.py"          # the next cluster, in a process of its own
        nxt.write_text(KILLED_PARENT.replace("    os.kill(os.getpid(), 9)\n", ""))
        assert subprocess.run([sys.executable, str(nxt)], capture_output=True, timeout=60).returncode == 0
        assert left_by(dead) == [os.path.basename(decoy)]
        assert sleeper_group in os.listdir(os.path.dirname(live.path))
        with open(os.path.join(live.path, "cgroup.procs"), "w") as f:
            f.write(str(sleeper.pid))
        try:
            os.rmdir(decoy)
        except FileNotFoundError:   # empty now and named after a dead pid: a cluster starting
            pass                    # meanwhile (a parallel suite's) may purge it first, as it should
    finally:
        sleeper.kill()
        sleeper.wait()
        live.remove()
