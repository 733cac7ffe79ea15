"""What the user reads when a task raises: the task's own file and source line, at most two
frames of localcluster above them (none of concurrent.futures'), and a note naming the
worker, its pid and the task, once. Run as a user runs it: a script in a fresh interpreter,
whose ``__main__`` functions travel by value, printing through the interpreter's own hook."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import traceback

import pytest

import localcluster

pytestmark = pytest.mark.timeout(60)

PACKAGE = os.path.dirname(os.path.abspath(localcluster.__file__))
REPO = os.path.dirname(PACKAGE)

SCRIPT = '''
import asyncio, linecache, sys, traceback
from localcluster import Client, LocalCluster

def divide(a, b):
    return a / b

def use(name):
    __import__(name)

# a notebook cell: its code compiled under a name only the client's linecache knows
CELL = "def cell(x):\\n    return x[3]\\n"
linecache.cache["<ipython-input-7-abc>"] = (len(CELL), None, CELL.splitlines(True), "<ipython-input-7-abc>")
exec(compile(CELL, "<ipython-input-7-abc>", "exec"))

def section(name, call, show=sys.excepthook):
    print(f"=== {name}", file=sys.stderr, flush=True)
    try:
        call()
    except Exception:
        show(*sys.exc_info())      # what an uncaught exception prints (IPython: linecache's lines)
    sys.stderr.flush()

async def awaiting(fut):
    return await fut

if __name__ == "__main__":
    with LocalCluster(n_workers=1, forward_logs=False) as cluster, Client(cluster) as client:
        print(f"=== pid {cluster.workers['worker-0'].pid}", file=sys.stderr)
        section("result", lambda: client.submit(divide, 1, 0).result())
        section("gather-list", lambda: client.gather([client.submit(divide, 1, 1), client.submit(divide, 2, 0)]))
        section("gather-dict", lambda: client.gather({"x": [{"y": client.submit(divide, 3, 0)}], "z": 1}))
        section("await", lambda: asyncio.run(awaiting(client.submit(divide, 4, 0))))
        fut = client.submit(divide, 5, 0)
        section("twice-1", fut.result)
        section("twice-2", fut.result)
        section("dependent", lambda: client.submit(abs, fut).result())
        sys.path.insert(0, sys.argv[1])     # after the workers started: importable here only
        section("module-here", lambda: client.submit(use, "only_in_the_client").result())
        section("module-nowhere", lambda: client.submit(use, "not_installed_anywhere").result())
        section("cell", lambda: client.submit(cell, []).result(), traceback.print_exception)
        print("=== uncaught", file=sys.stderr, flush=True)
        client.submit(divide, 6, 0).result()
'''


@pytest.fixture(scope="module")
def printed(tmp_path_factory):
    """The script's stderr, by section, and the script's path and its worker's pid."""
    tmp = tmp_path_factory.mktemp("frames")
    (tmp / "mods").mkdir()
    (tmp / "mods" / "only_in_the_client.py").write_text("X = 1\n")
    script = tmp / "job.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, str(script), str(tmp / "mods")], capture_output=True, text=True,
                          timeout=50, cwd=tmp, env=env)
    assert proc.returncode == 1, proc.stderr           # the last one is uncaught
    parts = re.split(r"^=== (.+)\n", proc.stderr, flags=re.M)
    sections = dict(zip(parts[1::2], parts[2::2]))
    (pid,) = [int(name.split()[1]) for name in sections if name.startswith("pid ")]
    return sections, str(script), pid


def _ours(text: str) -> list:
    """The frames printed that belong to localcluster or concurrent.futures."""
    files = re.findall(r'^\s*File "([^"]+)", line \d+', text, flags=re.M)
    return [f for f in files if f.startswith(PACKAGE + os.sep) or f"concurrent{os.sep}futures" in f]


def _note(pid: int, func: str) -> str:
    return rf"Raised on worker 'worker-0' \(pid {pid}\) in task '{func}-[0-9a-f]+'\."


@pytest.mark.parametrize("section", ["result", "gather-list", "gather-dict", "await", "uncaught"])
@pytest.mark.slow
def test_a_task_error_shows_the_script_line_two_frames_of_ours_at_most_and_where_it_ran(printed, section):
    sections, script, pid = printed
    text = sections[section]
    assert f'File "{script}", line 6, in divide\n    return a / b\n' in text, text
    assert len(_ours(text)) <= 2, text
    assert text.rstrip().count("ZeroDivisionError: division by zero") == 1, text
    assert len(re.findall(_note(pid, "divide"), text)) == 1, text
    # the task's frames come last: below the caller's and ours
    assert text.index(f'File "{script}", line 6, in divide') > max(text.index(f) for f in _ours(text)), text


def test_raised_twice_or_through_a_dependent_the_note_is_there_once(printed):
    sections, script, pid = printed
    for section in ("twice-1", "twice-2", "dependent"):
        text = sections[section]
        assert len(re.findall(_note(pid, "divide"), text)) == 1, text
        assert len(_ours(text)) <= 2, text
    assert sections["twice-1"] == sections["twice-2"]          # no frames piled up by the first raise


def test_a_missing_module_says_the_import_failed_on_the_worker(printed):
    sections, script, pid = printed
    here, nowhere = sections["module-here"], sections["module-nowhere"]
    for name, text in (("only_in_the_client", here), ("not_installed_anywhere", nowhere)):
        assert f"ModuleNotFoundError: No module named '{name}'" in text, text
        assert re.search(rf"The import of '{name}' failed on worker 'worker-0' \(pid {pid}\), in task 'use-",
                         text), text
        assert "client.get_versions(check=True)" in text and "client.restart()" in text, text
        assert f"environment the workers run in ({sys.executable})" in text or sys.executable in text, text
    assert "In your process 'only_in_the_client' is importable (from " in here, here
    assert "In your process 'not_installed_anywhere' is not importable either" in nowhere, nowhere


def test_a_notebook_cell_shows_its_source_line(printed):
    sections, script, pid = printed
    text = sections["cell"]
    assert 'File "<ipython-input-7-abc>", line 2, in cell\n    return x[3]\n' in text, text
    assert len(re.findall(_note(pid, "cell"), text)) == 1, text


# --- in this process: the exception itself ------------------------------------------------

def divide(a, b):
    return a / b


def test_the_exception_keeps_its_type_and_args_and_gets_one_note(client):
    fut = client.submit(divide, 1, 0)
    printed = []
    for _ in range(2):
        with pytest.raises(ZeroDivisionError) as info:
            fut.result(30)
        printed.append("".join(traceback.format_exception(info.type, info.value, info.value.__traceback__)))
    err = info.value
    assert type(err) is ZeroDivisionError and err.args == ("division by zero",)
    worker = client.cluster.workers[re.search(r"worker '(worker-\d)'", err.__notes__[0]).group(1)]
    assert err.__notes__ == [f"Raised on worker {worker.name!r} (pid {worker.pid}) in task {fut.key!r}."]
    assert printed[0] == printed[1]
    assert f'File "{__file__}", line {divide.__code__.co_firstlineno + 1}, in divide' in printed[1]
    with pytest.raises(ZeroDivisionError) as dep:
        client.submit(abs, fut).result(30)
    assert dep.value.__notes__ == err.__notes__            # its dependency's, once


def test_library_frames_on_the_worker_keep_their_real_paths(client):
    with pytest.raises(json.JSONDecodeError) as info:
        client.submit(json.loads, "{").result(30)
    frames = traceback.extract_tb(info.value.__traceback__)
    assert [f.filename for f in frames if f.name == "decode"] == [json.decoder.__file__], frames
    assert sum(f.filename.startswith(PACKAGE + os.sep) for f in frames) <= 2, frames


@pytest.mark.slow
def test_gather_of_a_failed_task_with_asynchronous_raises_it_with_its_frames(tmp_path):
    script = tmp_path / "agather.py"
    script.write_text(textwrap.dedent('''
        import asyncio
        from localcluster import Client, LocalCluster

        def divide(a, b):
            return a / b

        async def main(client):
            return await client.gather([client.submit(divide, 1, 0)], asynchronous=True)

        if __name__ == "__main__":
            with LocalCluster(n_workers=1, forward_logs=False) as cluster, Client(cluster) as client:
                asyncio.run(main(client))
    '''))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=50,
                          cwd=tmp_path, env=env)
    assert proc.returncode == 1
    assert f'File "{script}", line 6, in divide\n    return a / b\n' in proc.stderr, proc.stderr
    assert len(_ours(proc.stderr)) <= 2, proc.stderr
