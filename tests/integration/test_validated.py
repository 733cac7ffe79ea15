"""The conftest's ``validated`` fixture, run the way pytest runs it (a child pytest on a copy
of tests/conftest.py): a broken scheduler invariant fails the test whatever way its cluster
was made and closed; it is never skipped silently."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

import localcluster

REPO = os.path.dirname(os.path.dirname(os.path.abspath(localcluster.__file__)))

INNER = textwrap.dedent('''
    import pytest
    from localcluster import Client, LocalCluster


    def broken(cluster):
        """A live worker also listed as dead: an invariant that nothing else trips over."""
        cluster.scheduler.gone.add(next(iter(cluster.scheduler.workers)))


    @pytest.fixture(scope="module")
    def shared():
        with LocalCluster(n_workers=1, forward_logs=False) as c:
            yield c


    def test_inline_cluster():
        with LocalCluster(n_workers=1, forward_logs=False) as c, Client(c) as client:
            assert client.submit(abs, -1).result(30) == 1
            broken(c)


    def test_inline_cluster_whose_test_expects_an_assertion_error():
        with pytest.raises(AssertionError):
            with LocalCluster(n_workers=1, forward_logs=False) as c:
                broken(c)
                assert False, "the test's own"


    def test_fixture_cluster(cluster):
        broken(cluster)


    def test_module_cluster_outliving_the_test(shared):
        broken(shared)


    def test_fine(cluster, client):
        assert client.submit(abs, -2).result(30) == 2
''')


@pytest.mark.slow
def test_a_broken_invariant_fails_the_test_whatever_made_the_cluster(tmp_path):
    # the conftest imports its /dev/shm rule from _util, and its test-process hooks from _xdist
    for helper in ("conftest.py", "_util.py", "_xdist.py"):
        shutil.copy(os.path.join(os.path.dirname(os.path.dirname(__file__)), helper), tmp_path / helper)
    (tmp_path / "test_inner.py").write_text(INNER)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "-p", "no:randomly",
                           "test_inner.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    # Each outcome: "PASSED test_inner.py::name" / "ERROR test_inner.py::name - AssertionError: ...".
    outcomes = {(kind, name) for kind, name in re.findall(r"^(PASSED|FAILED|ERROR) test_inner\.py::(\w+)", out, re.M)}
    broken = "is both live and gone"
    # test_fine passes, and its teardown (the last of the module) closes the broken module cluster.
    assert ("PASSED", "test_fine") in outcomes and ("ERROR", "test_fine") in outcomes, out
    for name in ("test_inline_cluster", "test_inline_cluster_whose_test_expects_an_assertion_error",
                 "test_fixture_cluster", "test_module_cluster_outliving_the_test"):
        assert ("ERROR", name) in outcomes, (name, out)
    assert out.count(broken) >= 5, out      # the four tests', and the module cluster's at its close
    assert re.search(r"<LocalCluster running: 1 worker.*at close: a scheduler invariant is broken", out), out
    assert re.search(r"at the end of the test: a scheduler invariant is broken", out), out
    assert proc.returncode == 1, out
