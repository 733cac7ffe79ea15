"""How the last run ended (issue 49, parts 2 and 3): the per-user run registry, through real
processes killed, crashed and OOM-killed, and through records written by hand for what a
test cannot cause (a reboot, a reused pid, a damaged file)."""
from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from _cgroups import memory_group
from _runs_story import end, env, kill_mid_map, next_process, record_of, records, script, spawn
from _util import wait_for

import localcluster
from localcluster import LocalCluster, config, runs
from localcluster.system import kernel_log, registry

pytestmark = pytest.mark.timeout(60)

@pytest.mark.slow
def test_a_killed_run_is_told_once_by_the_next_process(tmp_path, run_registry):
    proc = kill_mid_map(tmp_path, run_registry, 50)
    assert proc.returncode == -signal.SIGKILL

    # previous_runs() on a copy of the registry: the run, once
    copy = tmp_path / "copy"
    shutil.copytree(run_registry.parent, copy)
    os.environ["XDG_CACHE_HOME"] = str(copy)       # the fixture's monkeypatch restores it
    found = localcluster.previous_runs()
    assert [r.pid for r in found] == [proc.pid]
    run = found[0]
    assert run.cause == "signal" and run.finished >= 50 and run.pending > 0
    assert "killed from outside" in run.message and "mapper.py" in run.message
    assert run.argv == ("mapper.py", "50") and run.cwd == str(tmp_path)
    assert run.started <= run.ended
    assert localcluster.previous_runs() == []
    assert [r.pid for r in localcluster.previous_runs(reported=True)] == [proc.pid]

    # the next process's first cluster: one WARNING line naming the pid; then nothing left
    os.environ["XDG_CACHE_HOME"] = str(run_registry.parent)
    after = next_process(tmp_path)
    assert after.returncode == 0, after.stderr
    lines = [line for line in after.stderr.splitlines() if "previous run" in line]
    assert len(lines) == 1, after.stderr
    assert f"pid {proc.pid}" in lines[0] and "signal" in lines[0] and "finished" in lines[0]
    assert after.stdout.strip() == "0"
    print(lines[0])


# A task that holds the GIL in one C call (sum over a range) on the worker when its parent is
# killed: it prints the worker's pid once the task is in that call.
HOLDER = """
    import os, sys, time
    from localcluster import Client, LocalCluster

    def hold(path):
        open(path, "w").close()
        return sum(range(10 ** 13))        # one C call: no bytecode runs until it returns

    with LocalCluster(n_workers=1, forward_logs=False) as cluster, Client(cluster) as client:
        future = client.submit(hold, sys.argv[1])
        while not os.path.exists(sys.argv[1]):
            time.sleep(0.01)
        print(list(client.scheduler_info()["workers"].values())[0]["pid"], flush=True)
        sys.stdin.read()
"""


def ended(pid: int) -> bool:
    """The process ``pid`` has ended (a zombie, or gone)."""
    import psutil
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.slow
def test_workers_busy_in_c_end_with_their_parent_and_note_the_moment(tmp_path, run_registry):
    """The parent SIGKILLed while its worker runs a task that holds the GIL: the worker
    still ends at once (no orphan), and the next process's record of the run says when its
    workers saw it end, from their end note (faulthandler, in C), which is then removed."""
    proc = spawn(tmp_path, script(tmp_path, "holder.py", HOLDER), str(tmp_path / "in-c"))
    try:
        worker = int(proc.stdout.readline().strip() or 0)
        assert worker, proc.stderr.read()
        killed = time.time()
        proc.send_signal(signal.SIGKILL)
    finally:
        end(proc)

    wait_for(lambda: ended(worker), timeout=10)
    note = record_of(run_registry, proc.pid)["end_note"]
    with open(note) as f:
        assert "in hold" in f.read()          # the task's stack, as it was
    found = localcluster.previous_runs()
    assert [r.pid for r in found] == [proc.pid]
    assert killed - 1 <= found[0].ended <= time.time() and "Its workers saw it end at" in found[0].message
    assert not os.path.exists(note)


@pytest.mark.slow
def test_the_parent_death_signal_sent_again_and_again_leaves_the_dump_whole(tmp_path, run_registry):
    """The kernel sends a worker its parent-death signal again each time the dying parent hands
    it on from one of its threads to the next: several, within microseconds, under load. Sent
    here in a burst, while the task holds the GIL, they leave every thread's stack in the end
    note, the task's among them, and the worker ended."""

    from localcluster.worker.context import END_SIGNAL
    proc = spawn(tmp_path, script(tmp_path, "holder.py", HOLDER), str(tmp_path / "in-c"))
    try:
        worker = int(proc.stdout.readline().strip() or 0)
        assert worker, proc.stderr.read()
        for _ in range(20):
            os.kill(worker, END_SIGNAL)
        wait_for(lambda: ended(worker), timeout=10)
        with open(record_of(run_registry, proc.pid)["end_note"]) as f:
            note = f.read()
    finally:
        end(proc)
    # a whole dump: the task's stack, and the main thread's, which is written last
    assert "in hold" in note and "in <module>" in note, note


def _reading_a_pipe(pid: int) -> bool:
    """Whether a thread of ``pid`` waits in a read of a pipe."""
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/wchan") as f:
                if "pipe_read" in f.read():      # anon_pipe_read on newer kernels
                    return True
        except OSError:     # the thread ended while we looked
            pass
    return False


@pytest.mark.slow
def test_the_parent_death_signal_ends_a_worker_whose_stacks_pipe_closed_first(run_registry):
    """A dying parent's files close before the kernel sends its children the parent-death
    signal. The worker's stacks thread sees its pipe end first, and it is the one thread that
    takes that signal: it must still be there when the signal comes."""
    from localcluster import Client
    from localcluster.worker.context import END_SIGNAL
    with LocalCluster(n_workers=1, forward_logs=False) as cluster, Client(cluster) as client:
        assert client.submit(abs, -1).result(30) == 1
        ((name, info),) = cluster.workers.items()
        nanny = cluster._supervisor.nannies[name]
        assert _reading_a_pipe(info.pid)            # the stacks thread, waiting for requests
        fd, nanny._stacks_w = nanny._stacks_w, None
        os.close(fd)                                 # as the parent's death closes it
        wait_for(lambda: not _reading_a_pipe(info.pid), timeout=10)
        os.kill(info.pid, END_SIGNAL)
        wait_for(lambda: ended(info.pid), timeout=10)


CRASHER = """
    import ctypes
    from localcluster import Client, LocalCluster
    with LocalCluster(n_workers=1, forward_logs=False) as cluster, Client(cluster) as client:
        assert client.gather(client.map(abs, range(20))) == list(range(20))
        ctypes.string_at(0)
"""


@pytest.mark.slow
def test_a_segfault_in_your_own_process_is_a_crash(tmp_path, run_registry):
    if isinstance(kernel_log.read(limit=1), kernel_log.Unreadable):
        pytest.skip(f"the kernel log is not readable here: {kernel_log.read(limit=1).reason}")
    proc = spawn(tmp_path, script(tmp_path, "crasher.py", CRASHER))
    end(proc, kill=False)
    assert proc.returncode == -signal.SIGSEGV
    found = localcluster.previous_runs()
    assert [(r.pid, r.cause, r.signal) for r in found] == [(proc.pid, "crash", "SIGSEGV")], found
    assert "SIGSEGV" in found[0].message and "segfault at" in found[0].message


OOM = """
    import os, sys
    with open(os.path.join(sys.argv[1], "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))
    from localcluster import Client, LocalCluster

    def block(i):
        return bytes([i % 256]) * (1 << 20)

    with LocalCluster(n_workers=1, memory_limit="1GiB", worker_cgroup=False, forward_logs=False) as cluster, \\
            Client(cluster) as client:
        held = client.map(block, range(20))
        values = client.gather(held)
        print("ready", flush=True)
        sys.stdin.readline()
        hog = []
        while True:
            hog.append(b"\\x01" * (8 << 20))
"""


@pytest.mark.slow
def test_a_run_oom_killed_by_its_own_allocations_is_told_as_such(tmp_path, run_registry):
    if isinstance(kernel_log.read(limit=1), kernel_log.Unreadable):
        pytest.skip(f"the kernel log is not readable here: {kernel_log.read(limit=1).reason}")
    with memory_group("runs-oom", 300 << 20) as (path, _version):
        proc = spawn(tmp_path, script(tmp_path, "oom.py", OOM), path)
        try:
            assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
            wait_for(lambda: (record_of(run_registry, proc.pid).get("held") or 0) >= 20 << 20, timeout=10)
            proc.stdin.write("go\n")
            proc.stdin.flush()
            proc.communicate(timeout=30)
        finally:
            end(proc)
    assert proc.returncode == -signal.SIGKILL
    found = localcluster.previous_runs()
    assert [(r.pid, r.cause, r.signal) for r in found] == [(proc.pid, "oom-killer", "SIGKILL")], found
    message = found[0].message
    print(message)
    assert "out-of-memory" in message and "memory" in message and "300.00 MiB" in message, message
    assert "results your futures held came to" in message, message


LIVE = """
    import sys
    from localcluster import Client, LocalCluster
    with LocalCluster(n_workers=1, forward_logs=False) as cluster, Client(cluster) as client:
        print(client.submit(abs, -1).result(), flush=True)
        sys.stdin.readline()
"""


@pytest.mark.slow
def test_a_run_still_alive_is_never_told_and_a_closed_one_neither(tmp_path, run_registry):
    proc = spawn(tmp_path, script(tmp_path, "live.py", LIVE))
    try:
        assert proc.stdout.readline().strip() == "1", proc.stderr.read()
        assert localcluster.previous_runs() == []
        with LocalCluster(n_workers=1, forward_logs=False):      # this process's own, open
            assert localcluster.previous_runs() == []
    finally:
        proc.stdin.write("\n")
        proc.stdin.flush()
        proc.communicate(timeout=30)
    assert proc.returncode == 0
    closed = records(run_registry)
    assert len(closed) == 2 and all(r["closed"] for r in closed)
    assert not [n for n in os.listdir(run_registry) if n.endswith(registry.END)]    # their end notes went
    assert localcluster.previous_runs() == []


# --- records written by hand --------------------------------------------------------------

def _fake(folder, **fields) -> str:
    me = registry.identity()
    record = {"version": 1, "pid": me.pid, "start": me.start, "boot": me.boot, "host": me.host,
              "pid_ns": me.pid_ns, "since_boot": kernel_log.clock(), "started": time.time() - 5,
              "argv": ["job.py", "--n", "3"], "cwd": "/data", "notebook": None, "seen": time.time() - 1,
              "finished": 7, "pending": 3, "held": 0, "rss": 100 << 20, "cgroup": "/", "memory_limit": None,
              "closed": False}
    record.update(fields)
    name = registry.file_name(record["started"], record["pid"])
    registry.write(str(folder), name, record)
    return name


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_reused_pid_is_another_process(run_registry):
    me = registry.identity()
    _fake(run_registry, start=me.start - 1)            # our pid, an earlier start: that run is gone
    _fake(run_registry, started=time.time() - 4)       # our pid and start: alive
    found = localcluster.previous_runs()
    assert [(r.pid, r.cause, r.finished, r.pending) for r in found] == [(me.pid, "signal", 7, 3)]
    assert "'job.py --n 3'" in found[0].message


def test_a_new_boot_is_a_machine_restart_and_another_host_is_not_ours(run_registry):
    _fake(run_registry, boot="00000000-0000-0000-0000-000000000000", pid=_dead_pid())
    _fake(run_registry, host="elsewhere", pid=_dead_pid(), started=time.time() - 3)
    found = localcluster.previous_runs()
    assert [r.cause for r in found] == ["machine-restart"]
    assert "machine restarted" in found[0].message


def test_the_kernel_log_is_read_for_the_pid_after_the_runs_start():
    kill = ("3,659,2000000000,-;Memory cgroup out of memory: Killed process 4242 (python) total-vm:481560kB, "
            "anon-rss:163736kB, UID:0 pgtables:492kB oom_score_adj:0")
    context = ("6,658,2000000000,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
               "oom_memcg=/lc-test,task_memcg=/lc-test,task=python,pid=4242,uid=0")
    fault = ("6,819,3000000000,-;python3[4343]: segfault at 0 ip 00007f30d3985ad8 sp 00007ffee15422c8 error 4 in "
             "libc.so.6[167ad8,7f30d3844000+156000] likely on CPU 0 (core 0, socket 0)")
    log = [context, kill, fault]
    found = kernel_log.evidence(log, 4242, since=1900.0)
    assert found.pid == 4242 and found.oom_memcg == "/lc-test" and found.constraint == "CONSTRAINT_MEMCG"
    assert kernel_log.evidence(log, 4242, since=2500.0) is None         # an earlier process with that pid
    crash = kernel_log.evidence(log, 4343, since=2500.0)
    assert crash == kernel_log.Fault(4343, "SIGSEGV", "libc.so.6", crash.line) and "segfault at 0" in crash.line
    cause, sig, message = runs.explain({"pid": 4242, "argv": ["a.py"], "rss": 290 << 20, "held": 200 << 20,
                                        "memory_limit": 300 << 20, "cgroup": "/lc-test"}, found, False)
    assert (cause, sig) == ("oom-killer", "SIGKILL")
    assert "290.00 MiB" in message and "300.00 MiB" in message and "200.00 MiB" in message, message
    cause, _, message = runs.explain({"pid": 1, "argv": []}, kernel_log.Unreadable("no"), False)
    assert cause == "signal" and "could not be read: no" in message


def test_the_monotonic_offset_of_a_time_namespace_is_read_from_its_file():
    assert kernel_log.monotonic_offset("monotonic           0         0\nboottime            0         0\n") == 0
    assert kernel_log.monotonic_offset("monotonic       -3600 500000000\nboottime        -3600         0\n") == -3599.5
    assert kernel_log.monotonic_offset("boottime 86400 0\n") == 0 and kernel_log.monotonic_offset("") == 0


AHEAD = 86400       # seconds a container's clock may be moved by: here a day ahead of the machine's


@pytest.mark.slow
def test_a_run_in_a_time_namespace_is_dated_on_the_kernel_logs_clock(tmp_path, run_registry):
    """A container's time namespace moves its processes' monotonic clock, not the kernel
    log's timestamps. A run's start is what keeps an earlier process's record of the same pid
    out of its explanation (a SIGSEGV was told as an OOM kill of an older pid): it must be
    read on the log's clock, whatever the namespace (this test's own may be one too)."""
    before = kernel_log.clock()
    done = subprocess.run(["unshare", "--time", "--monotonic", str(AHEAD), "--boottime", str(AHEAD), sys.executable,
                           script(tmp_path, "dated.py", """
                               import time
                               from localcluster import LocalCluster
                               with LocalCluster(n_workers=1, forward_logs=False):
                                   print(time.clock_gettime(time.CLOCK_MONOTONIC))
                           """)], cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=60)
    if done.returncode != 0 and "unshare" in done.stderr:
        pytest.skip(f"this process may not make a time namespace (root and Linux 5.6 are needed): {done.stderr}")
    after = kernel_log.clock()
    assert done.returncode == 0, done.stderr
    assert float(done.stdout) > after + AHEAD / 2             # the namespace's clock: a day ahead
    [record] = records(run_registry)
    assert before <= record["since_boot"] <= after, (before, record["since_boot"], after)


def test_a_damaged_record_is_ignored_with_one_warning(run_registry, caplog):
    _fake(run_registry, pid=_dead_pid())
    (run_registry / "00000000000000000001-1.run.json").write_bytes(b'{"pid": 1, "bo\x00\xff')
    (run_registry / "00000000000000000002-2.run.json").write_text('{"pid": 2, "host": "%s", "closed": false, '
                                                                   '"boot": 7, "argv": 3}' % registry.identity().host)
    with caplog.at_level(logging.WARNING, logger="localcluster"):
        found = localcluster.previous_runs()
        assert len(found) == 1
        assert localcluster.previous_runs() == []
    damaged = [r.getMessage() for r in caplog.records if "damaged" in r.getMessage()]
    assert len(damaged) == 2 and "00000000000000000001-1.run.json" in damaged[0], damaged
    assert "00000000000000000002-2.run.json" in damaged[1], damaged


def test_two_processes_at_once_tell_a_run_once(run_registry):
    pid = _dead_pid()
    _fake(run_registry, pid=pid)
    code = "import localcluster; print([r.pid for r in localcluster.previous_runs()])"
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env())
             for _ in range(2)]
    outs = [p.communicate(timeout=30)[0].strip() for p in procs]
    assert sorted(outs, key=len) == ["[]", f"[{pid}]"]


def test_the_registry_keeps_the_last_100_runs_in_a_private_folder(run_registry):
    for i in range(105):
        _fake(run_registry, started=1000.0 + i, closed=True)
    recorder = runs.RunRecorder(lambda: (3, 1, 0))
    recorder.start()
    recorder.tick(time.monotonic())
    recorder.closed()
    names = sorted(os.listdir(run_registry))
    assert len(names) == registry.KEEP
    assert registry.file_name(1000.0, os.getpid()) not in names and registry.file_name(1006.0, os.getpid()) in names
    assert os.stat(run_registry).st_mode & 0o777 == 0o700
    assert {os.stat(run_registry / n).st_mode & 0o777 for n in names} == {0o600}
    assert records(run_registry)[-1]["finished"] == 3


def test_a_registry_that_cannot_be_written_is_one_warning_and_the_cluster_goes_on(run_registry, caplog):
    run_registry.parent.mkdir(exist_ok=True)
    run_registry.write_text("a file where the folder should be")
    runs.forget_warnings()
    with caplog.at_level(logging.WARNING, logger="localcluster"):
        for _ in range(2):
            recorder = runs.RunRecorder(lambda: (0, 0, 0))
            recorder.start()
            recorder.tick(time.monotonic())
            recorder.closed()
    said = [r.getMessage() for r in caplog.records if "run registry cannot be written" in r.getMessage()]
    assert len(said) == 1 and "LOCALCLUSTER_RUN_REGISTRY=0" in said[0]


def test_the_off_switch(run_registry, monkeypatch):
    with pytest.raises(ValueError, match="run_registry"):
        config.set(run_registry="sometimes")
    monkeypatch.setenv("LOCALCLUSTER_RUN_REGISTRY", "0")
    assert config.get("run_registry") is False
    with LocalCluster(n_workers=0):
        pass
    assert not run_registry.exists()
