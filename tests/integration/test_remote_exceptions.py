"""A task's exception reaches the caller as itself, whatever its __init__ looks like; a
SystemExit or KeyboardInterrupt from a task never ends or interrupts the caller."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import traceback

import pytest

import localcluster
from localcluster import TaskError

pytestmark = pytest.mark.timeout(60)


class BadRecord(Exception):
    """Two required arguments, one message to super(): pickle's cls(*args) cannot rebuild it."""

    def __init__(self, record, why):
        super().__init__(f"record {record!r}: {why}")
        self.record, self.why = record, why


class Unrebuildable(Exception):
    def __init__(self, lock):
        super().__init__("holds a lock")
        self.lock = lock          # a lock cannot be pickled at all


class NotInTheParent(Exception):
    pass


def raise_bad_record():
    raise BadRecord({"id": 7}, "negative amount")


def raise_chained():
    try:
        raise KeyError("inner")
    except KeyError as e:
        raise BadRecord(1, "outer") from e


def raise_unrebuildable():
    raise Unrebuildable(threading.Lock())


def raise_stop(kind):
    if kind == "exit":
        sys.exit(3)
    raise KeyboardInterrupt


def raise_unknown_class():
    # a class the parent cannot import: defined in a module that exists only in the worker
    import types
    mod = types.ModuleType("only_in_the_worker")
    exec("class Gone(Exception):\n    def __init__(self, a, b):\n        super().__init__(f'{a}{b}')", mod.__dict__)
    sys.modules["only_in_the_worker"] = mod
    raise mod.Gone(1, 2)


def test_except_catches_an_exception_whose_init_takes_two_arguments(client):
    with pytest.raises(BadRecord) as info:
        client.submit(raise_bad_record).result(30)
    err = info.value
    assert err.record == {"id": 7} and err.why == "negative amount"
    assert str(err) == "record {'id': 7}: negative amount"
    assert any(f.name == "raise_bad_record" for f in __import__("traceback").extract_tb(err.__traceback__))


def test_the_task_frames_of_a_received_exception_lead_nowhere(client):
    """They show the task's files and lines, and no frame of the parent that received them:
    an exception kept by pytest or IPython keeps nothing of the cluster's code alive."""
    with pytest.raises(BadRecord) as info:
        client.submit(raise_bad_record).result(30)
    tb, remote = info.value.__traceback__, []
    while tb is not None:
        if tb.tb_frame.f_code.co_name == "raise_bad_record":
            remote.append(tb)
        tb = tb.tb_next
    (last,) = remote
    assert last.tb_frame.f_code.co_filename == __file__ and last.tb_frame.f_back is None
    assert last.tb_lineno == raise_bad_record.__code__.co_firstlineno + 1
    assert "raise BadRecord" in "".join(traceback.format_tb(last))


def test_the_cause_chain_survives(client):
    with pytest.raises(BadRecord) as info:
        client.submit(raise_chained).result(30)
    assert isinstance(info.value.__cause__, KeyError) and info.value.__cause__.args == ("inner",)


def test_an_exception_that_cannot_pickle_becomes_task_error(client):
    with pytest.raises(TaskError) as info:
        client.submit(raise_unrebuildable).result(30)
    err = info.value
    assert err.type_name.endswith("Unrebuildable") and err.message == "holds a lock"
    assert "could not be pickled on the worker" in str(err) and "raise_unrebuildable" in err.traceback_text


def test_an_exception_the_parent_cannot_rebuild_says_so(client):
    with pytest.raises(TaskError) as info:
        client.submit(raise_unknown_class).result(30)
    text = str(info.value)
    assert "only_in_the_worker.Gone: 12" in text
    assert "could not be unpickled in the parent" in text and "super().__init__" in text


def imports_what_no_one_has():
    import not_installed_anywhere  # noqa: F401


def test_str_of_a_missing_module_says_where_and_what_to_do(client):
    """The explanation is in the message, which str() and a log line show, not in the notes,
    which they do not; a traceback shows it once."""
    with pytest.raises(ModuleNotFoundError) as info:
        client.submit(imports_what_no_one_has).result(30)
    err = info.value
    first, failed, here = str(err).split("\n")
    assert first == "No module named 'not_installed_anywhere'" and err.name == "not_installed_anywhere"
    assert failed.startswith("The import of 'not_installed_anywhere' failed on worker 'worker-")
    assert here.startswith("In your process 'not_installed_anywhere' is not importable either: install it")
    assert not getattr(err, "__notes__", None)
    assert "".join(traceback.format_exception(err)).count("The import of") == 1


@pytest.mark.parametrize("kind, name", [("exit", "SystemExit"), ("interrupt", "KeyboardInterrupt")])
def test_a_stopping_exception_from_a_task_is_wrapped(client, kind, name):
    fut = client.submit(raise_stop, kind)
    with pytest.raises(TaskError) as info:
        fut.result(30)
    err = info.value
    assert type(err.original).__name__ == name and name in str(err) and "raise_stop" in str(err)
    assert f"task {fut.key!r}" in str(err)
    if kind == "exit":
        assert err.original.code == 3 and "sys.exit(3)" in str(err) and "exit code 3" in str(err)
    assert client.submit(abs, -1).result(30) == 1          # the worker carries on
    assert client.cluster.deaths == []


@pytest.mark.slow
def test_an_uncaught_sys_exit_in_a_task_is_not_a_silent_exit_of_the_script(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""
        import sys
        from localcluster import LocalCluster, Client

        def finish():
            sys.exit(3)

        if __name__ == "__main__":
            with LocalCluster(n_workers=1) as cluster, Client(cluster) as client:
                client.submit(finish).result(30)
    """))
    repo = os.path.dirname(os.path.dirname(os.path.abspath(localcluster.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=50,
                          cwd=tmp_path, env=env)
    assert proc.returncode == 1, proc.stderr           # an uncaught exception, not exit status 3
    last = proc.stderr.strip().splitlines()[-1]
    assert "TaskError" in proc.stderr and "SystemExit" in proc.stderr and "finish" in proc.stderr, last
