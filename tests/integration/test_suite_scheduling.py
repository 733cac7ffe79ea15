"""The suite's two test processes (setup.cfg, tests/conftest.py) through real pytest-xdist:
a test process that dies mid-run (as pytest-timeout ends one whose test overran) is reported
and replaced, and the run ends. tests/unit/test_xdist_scheduling.py drives the scheduler
itself through random runs."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_HOOK = '''
import pytest

@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    from _xdist_scheduling import LoadScopeThatSurvivesACrash
    return LoadScopeThatSurvivesACrash(config, log)
'''


@pytest.mark.slow
def test_a_run_whose_test_process_dies_after_finishing_modules_ends_and_names_the_test(tmp_path):
    """pytest-dev/pytest-xdist#1378: the process that dies has finished whole modules before.
    The stock scheduler sends them again as empty orders and the run never ends."""
    for name in "abcdef":
        (tmp_path / f"test_{name}.py").write_text("def test_1(): pass\ndef test_2(): pass\n")
    (tmp_path / "test_g.py").write_text(
        "import os\ndef test_1(): pass\ndef test_2(): os._exit(1)\ndef test_3(): pass\n")
    for name in "hij":
        (tmp_path / f"test_{name}.py").write_text("def test_1(): pass\n")
    (tmp_path / "conftest.py").write_text(_HOOK)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [TESTS, os.environ.get("PYTHONPATH")])))
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:localcluster",
         "-n", "2", "--dist", "loadscope", "-o", "addopts=", str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=50)
    assert "1 failed, 17 passed" in run.stdout, run.stdout + run.stderr
    assert "crashed while running 'test_g.py::test_2'" in run.stdout, run.stdout
