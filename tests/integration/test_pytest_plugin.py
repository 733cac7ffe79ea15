"""The pytest plugin, used as a user would: a separate project, run by pytest in a child
process with ``-p localcluster.pytest_plugin``, under both import modes."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import psutil
import pytest

USER_TESTS = textwrap.dedent('''
    import os
    from dataclasses import dataclass

    def cube(x):
        return x ** 3

    @dataclass
    class Box:
        value: int
        def doubled(self):
            return Box(self.value * 2)

    def test_functions_and_classes_of_this_module_run_on_workers(localcluster_client):
        assert localcluster_client.submit(cube, 3).result(30) == 27
        assert localcluster_client.submit(Box.doubled, Box(4)).result(30) == Box(8)
        pids = set(localcluster_client.gather(localcluster_client.map(lambda i: os.getpid(), range(20), pure=False)))
        assert os.getpid() not in pids

    def test_the_cluster_has_the_requested_size_and_is_shared(localcluster_client):
        assert len(localcluster_client.cluster.workers) == 3
        with open(os.environ["PIDS_FILE"], "w") as f:
            f.write(" ".join(str(w.pid) for w in localcluster_client.cluster.workers.values()))
''')


CONFTEST = textwrap.dedent('''
    import pytest

    def square(x):
        return x * x

    class Pair:
        def __init__(self, a, b):
            self.a, self.b = a, b

    @pytest.fixture
    def helpers():
        return square, Pair
''')

CONFTEST_USER = textwrap.dedent('''
    def test_conftest_functions_and_classes_run_on_workers(localcluster_client, helpers):
        square, Pair = helpers
        assert localcluster_client.submit(square, 4).result(30) == 16
        assert localcluster_client.submit(lambda p: p.a + p.b, Pair(1, 2)).result(30) == 3
''')

UNUSED = textwrap.dedent('''
    import sys

    def test_nothing_is_started_or_imported_for_a_session_without_the_fixture():
        import psutil
        assert not psutil.Process().children()
        assert not [m for m in ("localcluster.client.client", "localcluster.cluster", "cloudpickle") if m in sys.modules]
''')

# How pytest is started: ``python -m pytest`` puts the current directory on sys.path; the
# ``pytest`` script (tox, most shells) does not, so under --import-mode=importlib a worker
# cannot import a test module by name and the plugin must send it by value.
LAUNCHERS = {"python -m pytest": ["-m", "pytest"],
             "pytest script": ["-c", "import sys; del sys.path[0]; import pytest; sys.exit(pytest.console_main())"]}


def run_pytest(project, args, launcher="python -m pytest", autoload=False, env=None, paths=("tests",)):
    return subprocess.run(
        [sys.executable, *LAUNCHERS[launcher], "-p", "no:cacheprovider", *args, "-q", *paths],
        cwd=project, capture_output=True, text=True, timeout=110,
        env={**os.environ, **(env or {}), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "" if autoload else "1"})


def make_project(root, files, ini="[pytest]\n"):
    project = root / "project"
    (project / "tests").mkdir(parents=True)
    (project / "pytest.ini").write_text(ini)
    for name, text in files.items():
        (project / "tests" / name).write_text(text)
    return project


def assert_workers_gone(pids_file):
    pids = [int(p) for p in pids_file.read_text().split()]
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert len(pids) == 3 and not alive, f"workers {alive} outlived the pytest run"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("launcher", list(LAUNCHERS))
@pytest.mark.parametrize("import_mode", ["prepend", "importlib"])
@pytest.mark.slow
def test_a_separate_project_uses_the_plugin(tmp_path, import_mode, launcher):
    """Plugin autoloading off, ``-p localcluster.pytest_plugin`` loads it; a conftest-free project."""
    project = make_project(tmp_path, {"test_user.py": USER_TESTS})
    pids_file = tmp_path / "pids"
    proc = run_pytest(project, ["-p", "localcluster.pytest_plugin", "--localcluster-workers", "3",
                                f"--import-mode={import_mode}"], launcher, env={"PIDS_FILE": str(pids_file)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "2 passed" in proc.stdout
    assert_workers_gone(pids_file)


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_the_entry_point_loads_it_and_the_ini_option_sizes_the_cluster(tmp_path):
    """With autoloading on, the pytest11 entry point loads the plugin (``-p`` with the same name
    is then harmless); ``localcluster_workers`` in the ini file sets the size. A conftest.py's
    functions and classes run on the workers too, here in the hardest case (importlib, pytest script)."""
    project = make_project(tmp_path, {"test_user.py": USER_TESTS, "conftest.py": CONFTEST,
                                      "test_conftest.py": CONFTEST_USER, "test_unused.py": UNUSED},
                           ini="[pytest]\nlocalcluster_workers = 3\n")
    pids_file = tmp_path / "pids"
    proc = run_pytest(project, ["-p", "localcluster.pytest_plugin", "--import-mode=importlib"], "pytest script",
                      autoload=True, env={"PIDS_FILE": str(pids_file)},
                      paths=["tests/test_unused.py", "tests/test_user.py", "tests/test_conftest.py"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "4 passed" in proc.stdout
    assert_workers_gone(pids_file)


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_a_bad_worker_count_is_a_usage_error(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_x.py").write_text("def test_x(localcluster_client):\n    pass\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "localcluster.pytest_plugin", "-p", "no:cacheprovider",
                           "--localcluster-workers", "0", "-q"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=50)
    assert proc.returncode != 0 and "--localcluster-workers=0: expected an integer >= 1" in proc.stdout + proc.stderr
