"""The suite's two test processes (setup.cfg, tests/_xdist.py) through real pytest-xdist: a
test process that dies mid-run is reported and replaced, a test that overran its time shows
its stacks, and the run ends. tests/unit/test_xdist_scheduling.py drives the scheduler itself
through random runs."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run_under_the_suites_hooks(folder, files: dict) -> subprocess.CompletedProcess:
    """pytest on ``files`` in two test processes, with the hooks of this suite."""
    for name, text in files.items():
        (folder / name).write_text(text)
    (folder / "conftest.py").write_text("from _xdist import *  # noqa: F403\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [TESTS, os.environ.get("PYTHONPATH")])))
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:localcluster",
         "-n", "2", "--dist", "loadscope", "--timeout-method", "thread", "-o", "addopts=", str(folder)],
        cwd=folder, env=env, capture_output=True, text=True, timeout=50)


@pytest.mark.slow
def test_a_run_whose_test_process_dies_after_finishing_modules_ends_and_names_the_test(tmp_path):
    """pytest-dev/pytest-xdist#1378: the process that dies has finished whole modules before.
    The stock scheduler sends them again as empty orders and the run never ends."""
    files = {f"test_{name}.py": "def test_1(): pass\ndef test_2(): pass\n" for name in "abcdef"}
    files["test_g.py"] = "import os\ndef test_1(): pass\ndef test_2(): os._exit(1)\ndef test_3(): pass\n"
    files.update({f"test_{name}.py": "def test_1(): pass\n" for name in "hij"})
    run = _run_under_the_suites_hooks(tmp_path, files)
    assert "1 failed, 17 passed" in run.stdout, run.stdout + run.stderr
    assert "crashed while running 'test_g.py::test_2'" in run.stdout, run.stdout


@pytest.mark.slow
def test_a_test_that_overran_its_time_shows_where_it_was_and_the_rest_run(tmp_path):
    files = {"test_a.py": "import time, pytest\n"
                          "def test_1(): pass\n"
                          "@pytest.mark.timeout(1)\n"
                          "def test_2_waits_forever():\n"
                          "    time.sleep(30)\n"
                          "def test_3(): pass\n",
             "test_b.py": "def test_1(): pass\n"}
    run = _run_under_the_suites_hooks(tmp_path, files)
    assert "1 failed, 3 passed" in run.stdout, run.stdout + run.stderr
    assert "crashed while running 'test_a.py::test_2_waits_forever'" in run.stdout, run.stdout
    assert "Timeout (0:00:01)!" in run.stderr, run.stderr
    assert 'test_a.py", line 5 in test_2_waits_forever' in run.stderr, run.stderr
