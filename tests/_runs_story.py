"""The story of a run killed mid-map and the next process that says so (tests/integration/test_runs.py,
and the README's line in tests/integration/test_readme.py): child scripts run in a folder of the test's,
as ``python <name>``, so that their argv is what a user's would be."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from _util import wait_for

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A map of short tasks that prints how many have finished once it reaches argv[1], then waits
# for its stdin (never closed by the killing tests): the test kills it there.
MAPPER = """
    import sys, time
    from localcluster import Client, LocalCluster

    def work(x):
        time.sleep(0.002)
        return x

    with LocalCluster(n_workers=2, forward_logs=False) as cluster, Client(cluster) as client:
        futures = client.map(work, range(5000))
        for i, f in enumerate(futures, 1):
            f.result()
            if i == int(sys.argv[1]):
                print(i, flush=True)
                break
        sys.stdin.read()
"""

# The next process: its first cluster says how the last run ended; nothing is left after.
NEXT = """
    import localcluster
    from localcluster import LocalCluster
    with LocalCluster(n_workers=1, forward_logs=False):
        pass
    print(len(localcluster.previous_runs()))
"""


def env() -> dict:
    out = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
    out.pop("PYTHONFAULTHANDLER", None)       # a handled fault leaves no segfault line in the kernel log
    out.pop("LOCALCLUSTER_FORWARD_LOGS", None)
    return out


def script(folder, name: str, body: str) -> str:
    """The script ``name`` in ``folder``, for ``spawn``."""
    (folder / name).write_text(textwrap.dedent(body))
    return name


def _own_tmp(folder) -> dict:
    """env() with a temporary folder of the test's own: a killed run's cluster folder is
    removed, and said, by the next process of the test, never first by a cluster of another
    test (or another suite) on the machine."""
    tmp = os.path.join(str(folder), "tmp")
    os.makedirs(tmp, exist_ok=True)
    return dict(env(), TMPDIR=tmp)


def spawn(folder, name: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, name, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_own_tmp(folder), cwd=folder)


def end(proc: subprocess.Popen, kill: bool = True) -> None:
    if kill and proc.poll() is None:
        proc.kill()
    proc.communicate(timeout=30)


def records(registry) -> list:
    return [json.loads((registry / n).read_text()) for n in sorted(os.listdir(registry)) if n.endswith(".json")]


def record_of(registry, pid: int) -> dict:
    found = [r for r in records(registry) if r["pid"] == pid]
    return found[0] if found else {}


def kill_mid_map(folder, registry, finished: int) -> subprocess.Popen:
    """A mapping child SIGKILLed once its record counts ``finished`` tasks finished; reaped."""
    proc = spawn(folder, script(folder, "mapper.py", MAPPER), str(finished))
    try:
        assert proc.stdout.readline().strip() == str(finished), proc.stderr.read()
        wait_for(lambda: record_of(registry, proc.pid).get("finished", 0) >= finished, timeout=10)
    finally:
        end(proc)
    return proc


def next_process(folder) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, script(folder, "next.py", NEXT)], capture_output=True, text=True,
                          env=_own_tmp(folder), cwd=folder, timeout=30)
