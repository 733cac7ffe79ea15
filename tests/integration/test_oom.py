"""The OOM killer, wherever it strikes (oom.py): in a group a task moved its worker into,
under a limit on the whole program (a container's), and only ever against the worker it
killed. Real kills in real memory cgroups, with the kernel log as evidence and without it
(``localcluster.system.oom.KMSG`` pointed nowhere: the cgroup counters alone); then the parsers
and the judgement on strings."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

import localcluster
from localcluster import Client, KilledWorker, LocalCluster
from localcluster.config import format_bytes
from localcluster.system.oom import (Kill, KernelLog, Rise, ancestors, cgroup_name, judge, parse_counters,
                                     parse_kmsg, parse_limit)

from _cgroups import memory_group
from _util import block_until, release, wait_for

MiB = 2**20


# --- real processes in real memory cgroups ------------------------------------------------

def move_in_and_grow(procs_file: str, go=None) -> None:
    """A task that moves its own worker into another memory cgroup, then (once ``go`` exists,
    if given) allocates until the kernel kills it."""
    with open(procs_file, "w") as f:
        f.write(str(os.getpid()))
    if go is not None:
        block_until(go)
    hog = []
    while True:
        hog.append(bytearray(8 * MiB))
        hog[-1][::4096] = b"x" * len(hog[-1][::4096])     # touch every page: real usage


def watcher(cluster, name):
    return cluster._supervisor.nannies[name].oom


@pytest.fixture(params=["kmsg", "counters"])
def evidence(request, monkeypatch):
    """With the kernel log as evidence (where this machine lets us read it), and without:
    the cgroup counters alone."""
    if request.param == "counters":
        monkeypatch.setattr("localcluster.system.oom.KMSG", "/nonexistent/kmsg")
    elif not _kmsg_readable():
        pytest.skip("the kernel log is not readable here")
    return request.param


def _kmsg_readable() -> bool:
    try:
        os.close(os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK))
        return True
    except OSError:
        return False


@pytest.mark.slow
def test_a_worker_a_task_moved_into_a_small_group_is_told_killed_by_the_oom_killer_there(evidence, tmp_path):
    """The tour's scenario 9 as a test: a task moves its worker out of its own group into a
    100 MiB one and allocates. Before oom.py only the own group's counter was read: 'signal'."""
    go = str(tmp_path / "go")
    with memory_group("foreign", 100 * MiB) as (group, version), \
            LocalCluster(n_workers=1, memory_limit=None, allowed_failures=0, forward_logs=False) as c, \
            Client(c) as cl:
        (name,) = c.workers
        fut = cl.submit(move_in_and_grow, os.path.join(group, "cgroup.procs"),
                        go if evidence == "counters" else None)
        if evidence == "counters":     # no kernel log: the group is evidence once the worker was seen in it
            wait_for(lambda: os.path.normpath(group) in watcher(c, name).last_seen)
            release(go)
        with pytest.raises(KilledWorker, match="oom-killer"):
            fut.result(60)
        (death,) = c.deaths
        assert death.cause == "oom-killer" and death.signal == "SIGKILL" and death.tasks == (fut.key,)
        named = f"The memory cgroup {cgroup_name(group, version)} (limit {format_bytes(100 * MiB)}) ran out"
        assert death.detail.startswith(named) and named in death.message
        if evidence == "kmsg":
            assert f"Killed process {death.pid} (" in death.detail
        else:
            assert "where it was last seen, rose" in death.detail


CONTAINED = textwrap.dedent("""
    import json, os, sys
    group, worker_cgroup, kmsg = sys.argv[1], sys.argv[2] == "True", sys.argv[3]
    with open(os.path.join(group, "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))            # the whole program now lives under this limit
    import localcluster.system.oom
    if kmsg == "counters":
        localcluster.system.oom.KMSG = "/nonexistent/kmsg"
    from localcluster import Client, KilledWorker, LocalCluster

    def grow():
        hog = []
        while True:
            hog.append(bytearray(8 << 20))
            hog[-1][::4096] = b"x" * len(hog[-1][::4096])

    with LocalCluster(n_workers=1, memory_limit=None, worker_cgroup=worker_cgroup, allowed_failures=0,
                      forward_logs=False) as c, Client(c) as cl:
        try:
            cl.submit(grow).result(60)
        except KilledWorker as e:
            d = e.deaths[-1]
            print(json.dumps({"cause": d.cause, "detail": d.detail, "message": d.message, "pid": d.pid,
                              "summary": str(e)}))
""")


@pytest.mark.slow
@pytest.mark.parametrize("worker_cgroup", [True, False])
def test_a_limit_on_the_whole_program_is_named_as_the_one_that_ran_out(evidence, worker_cgroup, tmp_path):
    """A container's limit: the program puts itself in a 300 MiB group before it starts its
    cluster; a task grows past it. The worker's own group (or the one it shares with its
    parent) is evidence, and the enclosing group is named as the one that ran out."""
    script = tmp_path / "contained.py"
    script.write_text(CONTAINED)
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(localcluster.__file__)))
    with memory_group("container", 300 * MiB) as (group, version):
        proc = subprocess.run([sys.executable, str(script), group, str(worker_cgroup), evidence],
                              capture_output=True, text=True, timeout=90, env=env)
        assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["cause"] == "oom-killer", out["message"]
    named = f"The memory cgroup {cgroup_name(group, version)} (limit {format_bytes(300 * MiB)}) ran out"
    assert out["detail"].startswith(named) and named in out["message"] and named in out["summary"]
    if evidence == "kmsg":
        assert f"Killed process {out['pid']} (" in out["detail"]
    elif worker_cgroup:
        assert "the oom_kill counter of its own memory cgroup" in out["detail"]
    else:
        assert f"memory cgroup {cgroup_name(group, version)}, which it shared with other processes" in out["detail"]


def _dead(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in "ZX"
    except (OSError, IndexError):
        return True


@pytest.mark.slow
@pytest.mark.parametrize("evidence,worker_cgroup", [("kmsg", True), ("counters", True), ("counters", False)],
                         indirect=["evidence"])
def test_only_the_worker_the_oom_killer_took_is_blamed(evidence, worker_cgroup, tmp_path):
    """Two workers: one OOM-killed in a foreign group, the other SIGKILLed by hand at that
    moment, within one sampling window (the machine's counter rose for both): only the first
    reads oom-killer."""
    go = str(tmp_path / "go")
    with memory_group("foreign", 100 * MiB) as (group, version), \
            LocalCluster(n_workers=2, memory_limit=None, allowed_failures=0, forward_logs=False,
                         worker_cgroup=worker_cgroup) as c, Client(c) as cl:
        (first, second) = sorted(c.workers)
        victim, bystander = c.workers[first].pid, c.workers[second].pid
        fut = cl.submit(move_in_and_grow, os.path.join(group, "cgroup.procs"), go, workers=[first])
        wait_for(lambda: os.path.normpath(group) in watcher(c, first).last_seen)
        release(go)
        wait_for(lambda: _dead(victim), timeout=60)
        os.kill(bystander, signal.SIGKILL)
        with pytest.raises(KilledWorker, match="oom-killer"):
            fut.result(60)
        wait_for(lambda: len(c.deaths) == 2)
        causes = {d.pid: d.cause for d in c.deaths}
        assert causes == {victim: "oom-killer", bystander: "signal"}, [d.message for d in c.deaths]
        assert cgroup_name(group, version) in next(d for d in c.deaths if d.pid == victim).detail


# --- the parsers, on what the kernel writes ---------------------------------------------------

def test_counters_of_memory_events_oom_control_and_vmstat():
    assert parse_counters("low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n")["oom_kill"] == 2
    assert parse_counters("oom_kill_disable 0\nunder_oom 0\noom_kill 7\n") == {
        "oom_kill_disable": 0, "under_oom": 0, "oom_kill": 7}
    assert parse_counters("pgfault 100\noom_kill 1\nnr_foo\n")["oom_kill"] == 1
    assert "oom_kill" not in parse_counters("oom_kill_disable 0\nunder_oom 0\n")     # before Linux 4.13


def test_limits_none_for_unlimited():
    assert parse_limit("157286400\n") == 150 * MiB
    assert parse_limit("max\n") is None
    assert parse_limit("9223372036854771712\n") is None          # v1's "no limit", page-rounded


def test_groups_named_as_the_kernel_does_and_their_ancestors():
    v1 = "/sys/fs/cgroup/memory/job/lc-demo"
    assert cgroup_name(v1, "v1") == "/job/lc-demo" and cgroup_name("/sys/fs/cgroup/memory/", "v1") == "/"
    assert ancestors(v1, "v1") == ["/sys/fs/cgroup/memory/job", "/sys/fs/cgroup/memory"]
    assert ancestors("/sys/fs/cgroup/user.slice/a.scope", "v2") == ["/sys/fs/cgroup/user.slice", "/sys/fs/cgroup"]
    assert ancestors("/sys/fs/cgroup", "v2") == []


MEMCG_CONTEXT = ("6,423,209294670,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,"
                 "mems_allowed=0,oom_memcg=/job/lc-demo,task_memcg=/job/lc-demo/w,task=python,pid=4609,uid=0\n")
MEMCG_KILL = ("3,424,209294714,-;Memory cgroup out of memory: Killed process 4609 (python) total-vm:395900kB, "
              "anon-rss:163712kB, file-rss:7136kB, shmem-rss:0kB, UID:0 pgtables:408kB oom_score_adj:500\n")
GLOBAL_CONTEXT = ("6,500,300000000,-;oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,"
                  "mems_allowed=0-1,3,global_oom,task_memcg=/user.slice,task=python3,pid=77,uid=1000\n")
GLOBAL_KILL = ("3,501,300000100,-;Out of memory: Killed process 77 (python3) total-vm:1kB, anon-rss:1kB, "
               "file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:4kB oom_score_adj:0\n SUBSYSTEM=foo\n")


def test_kernel_log_records():
    assert parse_kmsg(MEMCG_KILL) == Kill(4609, "Memory cgroup out of memory: Killed process 4609 (python) "
                                                "total-vm:395900kB, anon-rss:163712kB, file-rss:7136kB, "
                                                "shmem-rss:0kB")
    assert parse_kmsg(MEMCG_CONTEXT) == Kill(4609, "", "CONSTRAINT_MEMCG", "/job/lc-demo", "/job/lc-demo/w")
    assert parse_kmsg(GLOBAL_CONTEXT) == Kill(77, "", "CONSTRAINT_NONE", None, "/user.slice")
    assert parse_kmsg(GLOBAL_KILL).pid == 77
    for other in ("4,345,209291711,-;python invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0\n",
                  "6,430,1,-;oom_reaper: reaped process 4609 (python), now anon-rss:0kB, file-rss:0kB\n",
                  "3,431,1,-;Memory cgroup out of memory: Kill process 4609 (python) score 1000 or sacrifice child\n",
                  "no prefix; Killed process 12 (x)\n", ""):
        assert parse_kmsg(other) is None, other


def test_the_kernel_log_keeps_the_kill_of_its_pid_with_its_groups_and_counts_every_kill():
    log = KernelLog(4609)
    for record in (GLOBAL_CONTEXT, GLOBAL_KILL, "6,1,1,-;unrelated\n", MEMCG_CONTEXT, MEMCG_KILL):
        log.feed(record)
    assert log.count == 2
    assert log.kill.pid == 4609 and log.kill.oom_memcg == "/job/lc-demo" and log.kill.constraint == "CONSTRAINT_MEMCG"
    log.reset()
    assert log.count == 0 and log.kill is not None
    other = KernelLog(77)
    other.feed(MEMCG_CONTEXT)           # a context line of another pid is not its own
    other.feed(GLOBAL_KILL)
    assert other.kill.constraint is None


# --- choosing the evidence -----------------------------------------------------------------

def decide(kill=None, complete=False, rises=(), last_seen_exact=True, vmstat=False, readable=True, **kw):
    return judge(kill, complete, list(rises), last_seen_exact, vmstat, readable, **kw)


def test_the_kernel_log_naming_the_pid_is_the_evidence_and_names_the_group_that_ran_out():
    kill = parse_kmsg(MEMCG_KILL)
    kill = Kill(kill.pid, kill.line, "CONSTRAINT_MEMCG", "/job/lc-demo", "/job/lc-demo/w")
    text = decide(kill, complete=True, oom_memcg_limit=150 * MiB)
    assert text.startswith('The memory cgroup /job/lc-demo (limit 150.00 MiB) ran out: the kernel log says '
                           '"Memory cgroup out of memory: Killed process 4609 (python)')
    glob = Kill(77, "Out of memory: Killed process 77 (python3)", "CONSTRAINT_NONE")
    assert decide(glob, complete=True).startswith("The machine ran out of memory: the kernel log says")
    own = decide(kill, complete=True, oom_memcg_limit=240 * MiB, own="/job/lc-demo")
    assert own.startswith("Its own memory cgroup /job/lc-demo (limit 240.00 MiB) ran out")


def test_a_complete_kernel_log_that_does_not_name_the_pid_clears_it_whatever_the_counters_say():
    assert decide(None, complete=True, rises=[Rise("/own", "own"), Rise("/job", "enclosing")], vmstat=True) is None


def test_an_exact_group_counter_is_enough_without_the_kernel_log():
    text = decide(rises=[Rise("/job/lc-demo", "solo")], limit_met=("/job/lc-demo", 150 * MiB), vmstat=True)
    assert text == ("The memory cgroup /job/lc-demo (limit 150.00 MiB) ran out: the oom_kill counter of the "
                    "memory cgroup /job/lc-demo, where it was last seen, rose.")
    text = decide(rises=[Rise("/job/w", "own"), Rise("/job", "enclosing")], limit_met=("/job", 300 * MiB))
    assert text.startswith("The memory cgroup /job (limit 300.00 MiB) ran out: the oom_kill counter of its own")
    assert "machine ran out" in decide(rises=[Rise("/job/w", "own")], vmstat=True)


def test_weak_counters_count_only_where_the_worker_was_last_seen_in_no_group_of_its_own():
    weak = [Rise("/job", "enclosing")]
    assert decide(rises=weak, last_seen_exact=True, vmstat=True) is None
    assert "enclosing memory cgroup /job rose" in decide(rises=weak, last_seen_exact=False, vmstat=True)
    shared = decide(rises=[Rise("/job", "shared")], last_seen_exact=False)
    assert "which it shared with other processes" in shared


def test_the_machines_counter_alone_counts_only_when_nothing_better_is_readable():
    assert decide(vmstat=True, readable=True, last_seen_exact=False) is None
    assert decide(vmstat=True, readable=False, last_seen_exact=False).startswith(
        "The machine ran out of memory: oom_kill in /proc/vmstat rose")
    assert decide() is None
