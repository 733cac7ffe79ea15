"""The journal across processes (issue 49, parts 1, 2 and 4): a run killed, crashed or
OOM-killed mid-map, and the next run on its journal computing only what it had not finished
and saying how it ended; two processes on one journal at once. Each run is a script of the
user's, in a process of its own."""
from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from _cgroups import memory_group
from _runs_story import end, env, script, spawn
from test_readme import _blocks, matches

from localcluster.system import kernel_log

pytestmark = pytest.mark.timeout(120)

# A map of 200 short tasks on the journal argv[1]; with argv[2] == "stop", it prints once 60
# have finished and waits on its stdin (the test kills it there, or it kills itself: argv[3]).
MAPPER = """
    import ctypes, json, os, sys, time
    from localcluster import Client, LocalCluster

    def work(x):
        time.sleep(0.01)
        return x * x

    with LocalCluster(n_workers=2, journal=sys.argv[1], forward_logs=False) as cluster, Client(cluster) as client:
        futures = client.map(work, range(200))
        if sys.argv[2] == "stop":
            for i, f in enumerate(futures, 1):
                f.result()
                if i == 60:
                    break
            if sys.argv[3:] == ["segfault"]:
                ctypes.string_at(0)
            print("stopped", flush=True)
            sys.stdin.read()
        right = client.gather(futures) == [x * x for x in range(200)]
        journal = cluster.journal
        previous = journal.previous
        print(json.dumps({"right": right, "reused": journal.reused, "stored": journal.stored,
                          "previous": previous and [previous.pid, previous.cause, previous.signal,
                                                    previous.message]}), flush=True)
"""


def mapper(tmp_path, *args: str) -> subprocess.Popen:
    return spawn(tmp_path, script(tmp_path, "mapper.py", MAPPER), str(tmp_path / "journal"), *args)


def again(tmp_path) -> tuple[dict, str]:
    import json
    proc = mapper(tmp_path, "go")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1]), err


@pytest.mark.slow
def test_a_map_killed_midway_is_finished_by_the_next_run_which_says_so(tmp_path):
    proc = mapper(tmp_path, "stop")
    try:
        assert proc.stdout.readline().strip() == "stopped", proc.stderr.read()
        proc.send_signal(signal.SIGKILL)
    finally:
        end(proc)
    assert proc.returncode == -signal.SIGKILL
    second, err = again(tmp_path)
    assert second["right"]
    # what had finished is reused; what was running at the kill (two workers) may run again
    assert second["reused"] >= 60 and second["reused"] + second["stored"] == 200, second
    assert second["previous"][:2] == [proc.pid, "signal"], second
    assert "Its workers saw it end at" in second["previous"][3], second     # their end note
    lines = [line for line in err.splitlines() if f"pid {proc.pid}" in line]
    assert len(lines) == 1 and "the last run on the journal" in lines[0] and "reused" in lines[0], err
    assert all(matches(b, lines[0]) for b in _blocks("the last run on the journal")), lines[0]     # the docs' line
    third, err = again(tmp_path)
    assert third == {"right": True, "reused": 200, "stored": 0, "previous": None}, third
    assert "previous run" not in err and "last run on the journal" not in err, err


def _kernel_log_or_skip() -> None:
    found = kernel_log.read(limit=1)
    if isinstance(found, kernel_log.Unreadable):
        pytest.skip(f"the kernel log is not readable here: {found.reason}")


@pytest.mark.slow
def test_a_segfault_of_the_users_process_is_a_crash_on_the_journal(tmp_path):
    _kernel_log_or_skip()
    proc = mapper(tmp_path, "stop", "segfault")
    end(proc, kill=False)
    assert proc.returncode == -signal.SIGSEGV
    second, _err = again(tmp_path)
    assert second["right"] and second["reused"] >= 60, second
    assert second["previous"][:3] == [proc.pid, "crash", "SIGSEGV"], second


OOM = """
    import os, sys
    with open(os.path.join(sys.argv[2], "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))
    from localcluster import Client, LocalCluster

    def block(i):
        return bytes([i % 256]) * (1 << 20)

    with LocalCluster(n_workers=1, memory_limit="1GiB", worker_cgroup=False, forward_logs=False,
                      journal=sys.argv[1]) as cluster, Client(cluster) as client:
        values = client.gather(client.map(block, range(20)))
        print("ready", flush=True)
        sys.stdin.readline()
        hog = []
        while True:
            hog.append(b"\\x01" * (8 << 20))
"""

AFTER_OOM = """
    import json, sys
    from localcluster import Client, LocalCluster

    def block(i):
        return bytes([i % 256]) * (1 << 20)

    with LocalCluster(n_workers=1, forward_logs=False, journal=sys.argv[1]) as cluster, Client(cluster) as client:
        right = client.gather(client.map(block, range(20))) == [bytes([i]) * (1 << 20) for i in range(20)]
        p = cluster.journal.previous
        print(json.dumps([right, cluster.journal.reused, p.pid, p.cause, p.message]))
"""


@pytest.mark.slow
def test_a_run_oom_killed_by_its_own_allocations_is_told_once_and_its_results_reused(tmp_path):
    import json
    _kernel_log_or_skip()
    journal = str(tmp_path / "journal")
    with memory_group("journal-oom", 300 << 20) as (path, _version):
        proc = spawn(tmp_path, script(tmp_path, "oom.py", OOM), journal, path)
        try:
            assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
            proc.stdin.write("go\n")
            proc.stdin.flush()
            proc.communicate(timeout=60)
        finally:
            end(proc)
    assert proc.returncode == -signal.SIGKILL
    after = subprocess.run([sys.executable, script(tmp_path, "after.py", AFTER_OOM), journal], capture_output=True,
                           text=True, env=env(), cwd=tmp_path, timeout=60)
    assert after.returncode == 0, after.stderr
    right, reused, pid, cause, message = json.loads(after.stdout.strip().splitlines()[-1])
    assert right and reused == 20 and pid == proc.pid and cause == "oom-killer", after.stdout
    assert "memory" in message, message
    lines = [line for line in after.stderr.splitlines() if f"pid {proc.pid}" in line]
    assert len(lines) == 1 and "oom-killer" in lines[0] and "out of memory" in lines[0], after.stderr


@pytest.mark.slow
def test_two_processes_on_one_journal_at_once_are_both_right(tmp_path):
    import json
    procs = [mapper(tmp_path, "go") for _ in range(2)]
    outs = []
    for proc in procs:
        out, err = proc.communicate(timeout=90)
        assert proc.returncode == 0, err
        outs.append(json.loads(out.strip().splitlines()[-1]))
    assert all(o["right"] and o["previous"] is None for o in outs), outs
    assert all(o["reused"] + o["stored"] <= 200 for o in outs), outs
    third, _err = again(tmp_path)
    assert third["reused"] == 200 and third["right"], third
