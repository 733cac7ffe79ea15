"""localcluster.dask on a real dask.distributed cluster: ``dask scheduler`` and ``dask worker
--nworkers 2 --nanny`` processes on 127.0.0.1 (allowed-failures 0), one cluster per test,
all stopped at its end. The user's side runs in tests/_dask_driver.py, a process of its own,
which prints what the user sees; the same script without ``install()`` shows dask's plain text.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import localcluster
from _cgroups import memory_group
from _util import wait_for
from test_readme import SHOWN, matches

pytest.importorskip("distributed")

pytestmark = pytest.mark.timeout(500)

REPO = Path(localcluster.__file__).resolve().parent.parent
DRIVER = Path(__file__).resolve().parents[1] / "_dask_driver.py"
HOLD = DRIVER.parent / "_dask_hold.py"
MiB = 1 << 20


def _env(tmp: "Path | None" = None, allowed_failures: int = 0) -> dict:
    """``tmp``: the cluster's TMPDIR (worker directories, the nannies' records), the test's own."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": str(allowed_failures)}
    if tmp is not None:
        tmp.mkdir(exist_ok=True)
        env["TMPDIR"] = str(tmp)
    return env


def records_left(tmp_path: Path) -> list:
    """What the nannies' and workers' records left in the cluster's TMPDIR (a clean stop:
    nothing, not even the folder that held them)."""
    return sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "tmp").glob("localcluster-dask-*"))


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM (dask closes its nannies and their workers), then SIGKILL to what is left of
    its process group (its own session: the worker processes are in it too)."""
    if proc.poll() is None:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(30)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


@contextlib.contextmanager
def dask_cluster(tmp_path: Path, memory_limit: str = "0", cgroup: "str | None" = None, allowed_failures: int = 0,
                 hold: "Path | None" = None):
    """A scheduler and one ``dask worker --nworkers 2 --nanny``; yields the scheduler file.
    ``cgroup``: the worker command (nannies and workers) starts in that cgroup. ``hold``: a
    worker starting while that file exists waits for it to go (tests/_dask_hold.py)."""
    scheduler_file = tmp_path / "scheduler.json"
    py = sys.executable
    logs = [open(tmp_path / "scheduler.log", "w"), open(tmp_path / "worker.log", "w")]
    procs = []
    try:
        procs.append(subprocess.Popen(
            [py, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
             "--scheduler-file", str(scheduler_file)], env=_env(tmp_path / "tmp", allowed_failures), stdout=logs[0],
            stderr=subprocess.STDOUT, start_new_session=True))
        wait_for(lambda: scheduler_file.exists() or procs[0].poll() is not None, 60)   # a file another process writes
        assert procs[0].poll() is None, (tmp_path / "scheduler.log").read_text()
        worker = [py, "-m", "distributed.cli.dask_worker", "--scheduler-file", str(scheduler_file), "--nworkers", "2",
                  "--nthreads", "1", "--nanny", "--memory-limit", memory_limit, "--no-dashboard", "--host", "127.0.0.1"]
        env = _env(tmp_path / "tmp")
        if hold is not None:
            worker += ["--preload", str(HOLD)]
            env["LOCALCLUSTER_TEST_HOLD"] = str(hold)
        if cgroup is not None:      # join the group, then become the worker command: all it starts is in it
            worker = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', cgroup, *worker]
        procs.append(subprocess.Popen(worker, env=env, stdout=logs[1],
                                      stderr=subprocess.STDOUT, start_new_session=True))
        yield scheduler_file
    finally:
        for proc in reversed(procs):
            _stop(proc)
        for log in logs:
            log.close()


def drive(scheduler_file: Path, scenario: str, mode: str, workdir: Path, gather: bool = True) -> dict:
    args = [str(scheduler_file), scenario, mode, str(workdir), "gather" if gather else "result"]
    proc = subprocess.run([sys.executable, str(DRIVER), *args],
                          capture_output=True, text=True, timeout=240, env=_env(), cwd=str(DRIVER.parent))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def readme_text_blocks() -> list:
    """The README's and the site's pages' printed blocks."""
    return re.findall(r"^```text\n(.*?)^```", SHOWN, flags=re.S | re.M)


def seen(out: dict, tmp_path: Path) -> str:
    """A failed assertion's message, in full (pytest cuts the repr of a tuple short): what the
    driver printed, then the scheduler's and the workers' logs."""
    return json.dumps(out, indent=1) + "\n" + logs(tmp_path)


def logs(tmp_path: Path) -> str:
    return "\n".join((tmp_path / n).read_text()[-3000:] for n in ("scheduler.log", "worker.log"))


@pytest.mark.slow
def test_a_segfault_names_sigsegv_crash_and_the_frame_and_without_install_dask_says_nothing(tmp_path):
    with dask_cluster(tmp_path) as scheduler_file:
        plain = drive(scheduler_file, "segfault", "plain", tmp_path)
        ours = drive(scheduler_file, "segfault", "install", tmp_path)
    assert records_left(tmp_path) == []
    # without install(): dask's own text, which says nothing of why
    assert plain["type"] == "distributed.scheduler.KilledWorker", plain
    assert "Inspecting worker logs is often a good next step" in plain["text"]
    assert "SIGSEGV" not in plain["text"] and "crash" not in plain["text"]
    # with it: still a distributed.KilledWorker (except clauses keep working), localcluster's text
    assert ours["killed_worker"] and ours["type"].endswith("DaskKilledWorker"), seen(ours, tmp_path)
    assert ours["deaths"] == ["crash"], seen(ours, tmp_path)
    text = ours["text"]
    assert "SIGSEGV" in text and "crash" in text and "in segfault_here" in text, text
    assert "This is a bug in compiled code" in text
    # gather and compute raise the same (they wait on the same futures)
    assert (ours["gather"], ours["compute"]) == ("DaskKilledWorker True",) * 2, ours
    assert (plain["gather"], plain["compute"]) == ("KilledWorker False",) * 2, plain
    # the docs show both, side by side: they are what a user sees
    for shown in (plain, ours):
        blocks = [b for b in readme_text_blocks() if shown["type"] + ":" in b]
        assert blocks
        for block in blocks:
            assert matches(block, f"{shown['type']}: {shown['text']}"), f"shown:\n{block}\nreal:\n{shown['text']}"
    print(text)


@pytest.mark.slow
def test_a_nanny_restarting_its_worker_while_install_runs_records_the_next_death(tmp_path):
    """dask gives a nanny plugin only to the nannies of connected workers: the nanny of a
    worker being restarted then is given the recorder when its new worker registers."""
    with dask_cluster(tmp_path, hold=tmp_path / "hold") as scheduler_file:
        ours = drive(scheduler_file, "late", "install", tmp_path)
    assert records_left(tmp_path) == []
    assert ours.get("deaths") == ["crash"], seen(ours, tmp_path)
    assert "SIGSEGV" in ours["text"] and "in segfault_here" in ours["text"], ours["text"]


@pytest.mark.slow
def test_a_task_that_killed_two_workers_names_both_deaths(tmp_path):
    """allowed-failures 1: the first death's tasks come from the scheduler's record of what the
    removed worker was running, the last one's from KilledWorker itself."""
    with dask_cluster(tmp_path, allowed_failures=1) as scheduler_file:
        ours = drive(scheduler_file, "segfault", "install", tmp_path, gather=False)
    assert ours.get("deaths") == ["crash", "crash"], seen(ours, tmp_path)
    text = ours["text"]
    assert "was running on 2 workers that died (allowed_failures=1)" in text, text
    assert text.count("crash, SIGSEGV") == 2 and text.count("in segfault_here") == 2, text
    assert all("while running 'segfault_here-" in m for m in ours["messages"]), ours["messages"]


@pytest.mark.slow
def test_a_task_over_the_memory_limit_names_memory_and_limit_with_figures(tmp_path):
    with dask_cluster(tmp_path, memory_limit="400MiB") as scheduler_file:
        ours = drive(scheduler_file, "memory", "install", tmp_path)
    assert records_left(tmp_path) == []
    assert ours.get("deaths") == ["memory-limit"], seen(ours, tmp_path)
    text = ours["text"]
    assert "memory-limit" in text and "of 400.00 MiB limit" in text and "MiB" in text, text
    assert "--memory-limit" in text       # the advice speaks dask's terms
    assert "killed by its nanny for exceeding the memory budget" in ours["messages"][0]
    print(text)


@pytest.mark.slow
def test_a_kill_from_outside_names_sigkill_and_outside_and_an_idle_death_is_listed(tmp_path):
    with dask_cluster(tmp_path) as scheduler_file:
        ours = drive(scheduler_file, "kill", "install", tmp_path)
    assert records_left(tmp_path) == []
    assert ours.get("deaths") == ["signal"], seen(ours, tmp_path)
    text = ours["text"]
    assert "SIGKILL" in text and "outside" in text, text
    # the stacks SIGUSR1 dumped before the kill are the death's log_tail
    assert any(line.strip().endswith("in wait_here") for line in ours["log_tails"][0]), ours["log_tails"]
    # deaths(client): the task's death with its task, and an idle worker's, with none
    by_pid = {pid: (cause, tasks) for pid, cause, tasks in ours["all_deaths"]}
    assert by_pid[ours["idle_pid"]] == ("signal", []), ours["all_deaths"]
    assert any(cause == "signal" and any("wait_here" in str(t) for t in tasks) for cause, tasks in by_pid.values())
    print(text)


@pytest.mark.slow
def test_a_death_no_nanny_reports_is_said_so_not_guessed(tmp_path):
    """The whole machine dies (here: the nannies with their workers): no word comes, and the
    error says that after its wait (2 s here), with dask's KilledWorker type all the same."""
    with dask_cluster(tmp_path) as scheduler_file:
        ours = drive(scheduler_file, "machine", "install", tmp_path)
    assert ours.get("killed_worker") and ours["deaths"] == [], seen(ours, tmp_path)
    assert "no word from its nanny within 2 s" in ours["text"] and "its machine" in ours["text"], ours["text"]
    # the killed group's multiprocessing semaphores (its resource tracker died with it) are gone
    assert ours["semaphores"] and all(name.startswith("sem.") for name in ours["semaphores"]), ours
    assert [n for n in ours["semaphores"] if os.path.exists(os.path.join("/dev/shm", n))] == []
    print(ours["text"])


@pytest.mark.slow
def test_the_kernels_oom_killer_is_told_from_a_kill(tmp_path):
    # no --memory-limit: the cgroup's limit is what runs out, and the kernel kills the biggest process
    with memory_group("dask-oom", 900 * MiB) as (group, _version):
        with dask_cluster(tmp_path, cgroup=group) as scheduler_file:
            ours = drive(scheduler_file, "oom", "install", tmp_path)
        assert records_left(tmp_path) == []
    assert ours.get("deaths") == ["oom-killer"], seen(ours, tmp_path)
    text = ours["text"]
    assert "oom-killer" in text and "SIGKILL" in text, text
    print(text)


def test_install_fails_loudly_where_distributed_lacks_what_it_wraps():
    from localcluster.integrations.dask_nanny import NANNY_NAMES, require

    class OldNanny:
        log_event = kill = memory_manager = pid = worker_address = periodic_callbacks = status = address = None
    with pytest.raises(RuntimeError, match="has no _on_worker_exit, _on_worker_exit_sync") as info:
        require(OldNanny(), NANNY_NAMES, "Nanny")
    assert "distributed>=" in str(info.value)


def test_import_localcluster_never_imports_distributed():
    code = "import sys, localcluster, localcluster.dask; assert 'distributed' not in sys.modules, 'imported'"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50, env=_env())
    assert proc.returncode == 0, proc.stderr


def test_the_explained_error_is_dasks_killedworker_and_survives_pickling():
    import pickle
    import distributed
    from localcluster import WorkerDeath
    from localcluster.integrations.dask_client import DaskKilledWorker
    death = WorkerDeath("tcp://127.0.0.5:40123", 4242, "crash", -11, "SIGSEGV", ("f-1",), stack=(
        'Fatal Python error: Segmentation fault\n\nCurrent thread 0x00007f (most recent call first):\n'
        '  File "/srv/jobs/job.py", line 3 in f'))
    e = DaskKilledWorker("f-1", "tcp://127.0.0.5:40123", 1, (death,), (("tcp://127.0.0.6:40999", 5.0),))
    again = pickle.loads(pickle.dumps(e))
    assert isinstance(again, distributed.KilledWorker) and again.deaths == (death,)
    assert str(again) == str(e)
    text = str(e)
    assert "was running on 2 workers that died (allowed_failures=1)" in text
    assert "crash, SIGSEGV" in text and "line 3 in f" in text
    assert "tcp://127.0.0.6:40999: no word from its nanny within 5 s" in text and "its machine" in text
    assert "recreate_error_locally" not in text      # dask's would run the crash in the user's own process


def test_a_worker_started_after_its_nannys_recorder_is_gone_writes_nothing(tmp_path, monkeypatch):
    """A nanny closing tears its recorder down (and its directory) before it stops a worker
    that was starting: that worker's faulthandler must not make the directory again, which
    nothing would remove (a loaded run found one left)."""
    import faulthandler
    import types

    import cloudpickle
    from localcluster.integrations.dask_nanny import DeathRecorder, FaultHandler, record_dir, remove_record_dir
    monkeypatch.setitem(cloudpickle.Pickler.dispatch_table, types.CodeType,
                        cloudpickle.Pickler.dispatch_table[types.CodeType])     # the handler's setup changes it
    if faulthandler.is_enabled():           # pytest's, which the handler's teardown turns off
        monkeypatch.setattr(FaultHandler, "teardown", _and_back(FaultHandler.teardown))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    worker = types.SimpleNamespace(nanny="tcp://127.0.0.1:1", address="tcp://127.0.0.1:2")
    handler = FaultHandler()
    handler.setup(worker)
    handler.teardown(worker)
    assert handler.file is None and list(tmp_path.glob("localcluster-dask-*")) == []
    # with the nanny's directory there (its recorder set up), the worker writes into it, and
    # leaves the directory to the nanny when it stops in order
    directory = record_dir(worker.nanny)
    handler = FaultHandler()
    handler.setup(worker)
    try:
        assert sorted(os.listdir(directory)) == [f"address-{os.getpid()}", f"faulthandler-{os.getpid()}.log"]
        assert DeathRecorder.read_address(types.SimpleNamespace(directory=directory), os.getpid()) == worker.address
    finally:
        handler.teardown(worker)
    assert os.listdir(directory) == []
    remove_record_dir(directory)
    assert list(tmp_path.glob("localcluster-dask-*")) == []


def test_the_last_nannys_recorder_leaves_no_folder_behind(tmp_path, monkeypatch):
    """Each nanny's teardown removes its record folder, and the last one the folder of all."""
    from localcluster.integrations.dask_nanny import record_dir, remove_record_dir
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    first, second = record_dir("tcp://127.0.0.1:1"), record_dir("tcp://127.0.0.1:2")
    base = os.path.dirname(first)
    assert os.path.dirname(second) == base and oct(os.stat(base).st_mode & 0o777) == "0o700"
    remove_record_dir(first)
    assert os.listdir(base) == [os.path.basename(second)]          # the other nanny's stays
    remove_record_dir(second)
    assert list(tmp_path.iterdir()) == []
    assert oct(os.stat(os.path.dirname(record_dir("tcp://127.0.0.1:3"))).st_mode & 0o777) == "0o700"   # made again


def test_a_script_function_keeps_its_file_name_through_dasks_pickler(monkeypatch):
    """install() has cloudpickle keep a code object's file name (dask pickles tasks with it), so
    that a crash's frames on a dask worker name the script, not "<dynamic-code>"."""
    import types

    import cloudpickle
    from localcluster.wire.serialize import keep_file_names_in_cloudpickle
    monkeypatch.setitem(cloudpickle.Pickler.dispatch_table, types.CodeType,
                        cloudpickle.Pickler.dispatch_table[types.CodeType])     # undone after the test
    space = {"__name__": "__main__"}
    script = os.path.join("jobs", "job.py")      # a script's own file name, as compile() gives it
    exec(compile("def crash():\n    return 1\n", script, "exec"), space)
    assert cloudpickle.loads(cloudpickle.dumps(space["crash"])).__code__.co_filename == "<dynamic-code>"
    keep_file_names_in_cloudpickle()
    again = cloudpickle.loads(cloudpickle.dumps(space["crash"]))
    assert again.__code__.co_filename == script and again() == 1


def _and_back(teardown):
    def run(self, worker):
        import faulthandler
        try:
            teardown(self, worker)
        finally:
            faulthandler.enable(file=sys.__stderr__, all_threads=True)
    return run
