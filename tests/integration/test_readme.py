"""The printed examples of the README and of the documentation site's pages (docs/) are what the
code prints: each ```text block of a death or an error (and the one-line death quoted in the
prose) is compared with the output of the code that prints it, run in a fresh interpreter,
modulo pids, worker numbers, key hashes, memory figures, durations, the directories of paths,
the line numbers of library files and the carets under source lines. "…" elides text.
tests/integration/test_docs.py runs every other block of every page."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import localcluster

pytestmark = pytest.mark.timeout(120)

REPO = Path(localcluster.__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()
# README.md and every page of the site: a block shown in several places is checked in each
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHOWN = "\n".join(page.read_text() for page in PAGES)
TOUR = REPO / "examples" / "why_did_my_worker_die.py"
# Files whose line numbers the README states: the user's scripts. Library lines (localcluster's,
# the standard library's) move with every edit and every Python version.
USER_FILES = {"div.py", "segv.py", TOUR.name}

SEGFAULT_SCRIPT = """\
from localcluster import LocalCluster, Client

def crash():
    import ctypes
    ctypes.string_at(0)

if __name__ == "__main__":
    with LocalCluster(n_workers=2) as cluster, Client(cluster) as client:
        client.submit(crash).result(60)
"""


def _path(m: re.Match) -> str:
    name = re.split(r"[/\\]", m.group(1))[-1]
    return f'File "{name}", line {m.group(2) if name in USER_FILES else "N"}'


def normalize(text: str) -> str:
    text = re.sub(r'File "([^"]+)", line (\d+)', _path, text)
    text = re.sub(r"\bpid \d+", "pid N", text)
    text = re.sub(r"\bworker-\d+", "worker-N", text)
    text = re.sub(r"(?<=-)[0-9a-f]{4,}…?(?=')", "H", text)            # a task key's hash, whole or cut
    text = re.sub(r"\b\d+(?:\.\d+)? (?:B|KiB|MiB|GiB|TiB)\b", "M", text)
    text = re.sub(r"\b\d+(?:\.\d+)? s\b", "T s", text)
    # the carets under a source line: which lines get them changes with each Python version
    return "\n".join(line.rstrip() for line in text.strip().splitlines() if not re.fullmatch(r"\s*[~^]+\s*", line))


def matches(readme: str, real: str) -> bool:
    pattern = ".*?".join(re.escape(part) for part in normalize(readme).split("…"))
    return re.fullmatch(pattern, normalize(real), flags=re.S) is not None


def _text_blocks() -> list:
    return re.findall(r"^```text\n(.*?)^```", SHOWN, flags=re.S | re.M)


def _blocks(marker: str) -> list:
    """Every block that shows ``marker`` (the README's and the pages'): at least one."""
    blocks = [b for b in _text_blocks() if marker in b]
    assert blocks, f"no page shows {marker!r}"
    return blocks


def _run(path: Path, cwd: Path, timeout: float = 100) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    env.pop("LOCALCLUSTER_FORWARD_LOGS", None)          # the README shows the default console
    return subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=timeout,
                          cwd=cwd, env=env)


# The blocks the tests here (and tests/integration/test_dask_diagnosis.py: dask's plain KilledWorker and
# localcluster.dask's) compare with what their code prints.
KNOWN = ("=== 6. A task past its timeout", "localcluster.death.KilledWorker", "ZeroDivisionError",
         "Attempted to run task", "DaskKilledWorker", "your previous run", "the last run on the journal")


def test_every_printed_block_of_the_readme_has_its_test():
    for block in re.findall(r"^```text\n(.*?)^```", README, flags=re.S | re.M):
        assert sum(marker in block for marker in KNOWN) == 1, f"a README block without a test here:\n{block}"


def test_the_normalization_still_tells_a_wrong_block():
    real = "Task 'f-3fc8a9e5c0' ran for 0.51 s on worker 'worker-8' (pid 12), 23.07 MiB\n  File \"/a/b/x.py\", line 3"
    assert matches("Task 'f-3fc8…' ran for 0.5 s on worker 'worker-1' (pid 9), 1.00 GiB\n  …", real)
    assert not matches("Task 'f-3fc8…' ran for 0.5 s on worker 'worker-1' (pid 9), 1.00 GiB", real)
    assert not matches("Task 'f-3fc8…' took 0.5 s …", real)
    assert matches("x = f()\nValueError", "x = f()\n    ~^^\nValueError")


@pytest.fixture(scope="module")
def tour():
    proc = _run(TOUR, REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.mark.slow
def test_the_timeout_block_is_what_the_tour_prints(tour):
    section = re.search(r"^=== 6\..*?(?=\n\n=== |\Z)", tour.stdout, flags=re.S | re.M)
    assert section, tour.stdout
    for block in _blocks("=== 6. A task past its timeout"):
        assert matches(block, section.group(0)), section.group(0)


@pytest.mark.slow
def test_the_one_line_death_quoted_in_the_prose_is_what_the_tour_prints(tour):
    quotes = re.findall(r"`(localcluster: worker-\d+ \(pid \d+\) died: timeout[^`]*)`", SHOWN)
    lines = [line for line in tour.stderr.splitlines() if "died: timeout" in line]
    assert quotes and lines
    for quoted in quotes:
        assert all(matches(quoted, line) for line in lines), (quoted, lines)


@pytest.mark.slow
def test_the_segfault_block_is_what_a_segfaulting_script_prints(tmp_path):
    script = tmp_path / "segv.py"
    script.write_text(SEGFAULT_SCRIPT)
    assert f"```python\n{SEGFAULT_SCRIPT}```\n" in README      # the script the README shows
    proc = _run(script, tmp_path)
    assert proc.returncode == 1
    for block in _blocks("localcluster.death.KilledWorker"):
        assert 'File "/tmp/segv.py", line 5 in crash' in block      # the line of the script above
        assert matches(block, proc.stderr), proc.stderr


@pytest.mark.slow
def test_the_errors_example_is_what_its_script_prints(tmp_path):
    codes = {b for b in re.findall(r"^```python\n(.*?)^```", SHOWN, flags=re.S | re.M) if "def divide" in b}
    assert len(codes) == 1, "every page shows the same div.py"
    script = tmp_path / "div.py"
    script.write_text(textwrap.dedent(codes.pop()))
    proc = _run(script, tmp_path)
    assert proc.returncode == 1
    for block in _blocks("ZeroDivisionError"):
        stderr = proc.stderr
        if sys.version_info < (3, 11):      # the note prints first, as the cause ("On Python 3.10")
            note = block.strip().splitlines()[-1]
            assert matches(note, stderr.split('"""')[1]), stderr
            block = block.replace(note, "")
            stderr = stderr.split("direct cause of the following exception:\n\n")[1]
        assert matches(block, stderr), stderr


@pytest.mark.slow
def test_the_previous_run_line_is_what_the_next_process_prints(tmp_path, run_registry):
    from _runs_story import kill_mid_map, next_process
    killed = kill_mid_map(tmp_path, run_registry, 50)
    after = next_process(tmp_path)
    assert after.returncode == 0, after.stderr
    for block in _blocks("your previous run"):
        assert matches(block, after.stderr), after.stderr
    assert f"pid {killed.pid}" in after.stderr
