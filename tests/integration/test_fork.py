"""os.fork() beside a running cluster: the child's copy of localcluster is inert (its
calls raise a RuntimeError that says what happened, its exit stops nobody's workers and
removes no directory), the parent's cluster goes on as if nothing happened, and
multiprocessing's fork context works beside it. Real forks, in a child Python process
running a script, so that the forked child's exit runs its atexit hooks for real."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from _util import stop_session

SCRIPT = textwrap.dedent('''
    import json, multiprocessing, os, sys, time
    from localcluster import Client, LocalCluster

    def inc(x):
        return x + 1

    def until(path):
        while not os.path.exists(path):
            time.sleep(0.01)
        return path

    def square(x):
        return x * x

    def errors_in_child(client, done, pending):
        out = {}
        for name, call in [("submit", lambda: client.submit(inc, 1)),
                           ("map", lambda: client.map(inc, [1, 2])),
                           ("pending.result", lambda: pending.result()),
                           ("gather", lambda: client.gather([pending])),
                           ("scale", lambda: client.cluster.scale(3))]:
            try:
                call()
                out[name] = "no error"
            except RuntimeError as e:
                out[name] = str(e)
        out["done.result"] = done.result()               # resolved before the fork: still there
        with LocalCluster(n_workers=1, forward_logs=False) as own, Client(own) as c2:
            out["own cluster"] = c2.submit(inc, 41).result(30)
        client.close()                                   # inert: the parent's workers live on
        client.cluster.close()
        return out

    with LocalCluster(n_workers=2, forward_logs=False) as cluster, Client(cluster) as client:
        done = client.submit(inc, 1)
        assert done.result(30) == 2
        marker = sys.argv[1]
        pending = client.submit(until, marker, pure=False)
        pids = sorted(w.pid for w in cluster.workers.values())
        r, w = os.pipe()
        child = os.fork()
        if child == 0:                                   # normal exit: atexit hooks run
            os.close(r)
            try:
                report = errors_in_child(client, done, pending)
            except BaseException as e:
                report = {"crash": repr(e)}
            os.write(w, json.dumps(report).encode())
            os.close(w)
            sys.exit(0)
        os.close(w)
        report = json.loads(os.read(r, 1 << 16).decode() or "{}")
        _, status = os.waitpid(child, 0)
        with multiprocessing.get_context("fork").Pool(2) as pool:
            report["fork pool"] = pool.map(square, range(10))
        open(marker, "w").close()                        # the parent's task may end now
        report["pending"] = pending.result(30) == marker
        report["child status"] = os.waitstatus_to_exitcode(status)
        report["after"] = client.gather(client.map(inc, range(50)))
        report["same workers"] = sorted(w.pid for w in cluster.workers.values()) == pids
        report["deaths"] = [d.message for d in cluster.deaths]
        report["directory kept"] = os.path.isdir(cluster.local_directory)
        print(json.dumps(report))
''')


def test_a_forked_child_is_inert_and_the_parent_goes_on(tmp_path):
    script = tmp_path / "fork_beside_a_cluster.py"
    script.write_text(SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "marker")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=50)
    finally:        # a hung fork must not outlive the test: the whole session goes
        stop_session(proc)
    assert proc.returncode == 0, stderr
    report = json.loads(stdout.strip().splitlines()[-1])
    assert "crash" not in report, report
    for call in ("submit", "map", "pending.result", "gather", "scale"):
        assert "is a fork of it" in report[call] and "Create a new LocalCluster in the child" in report[call], \
            (call, report[call])
    assert report["done.result"] == 2 and report["own cluster"] == 42 and report["pending"]
    assert report["child status"] == 0
    assert report["fork pool"] == [x * x for x in range(10)]
    assert report["after"] == list(range(1, 51))
    assert report["same workers"] and report["deaths"] == [] and report["directory kept"]
