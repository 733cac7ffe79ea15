"""The journal of finished work (issue 49, parts 1 and 4): ``LocalCluster(journal=PATH)`` keeps
each deterministic task's result, written by its worker, and a later cluster on the same
folder reuses it instead of running the task; a changed function is a new entry; a damaged
entry is computed again, never served. The processes killed mid-run are in
test_journal_runs.py."""
from __future__ import annotations

import logging
import os
import textwrap

import pytest

import localcluster
from localcluster import Client, LocalCluster, journal as journal_module
from localcluster.worker import journal as J

pytestmark = pytest.mark.timeout(60)


def inc(x):
    return x + 1


def total(*xs):
    return sum(xs)


def made(source: str, name: str = "f"):
    """A function of a module that is not importable (as a script's or a notebook's are):
    each ``made`` is another module, so a function of the same name can change its body."""
    ns = {"__name__": "journal_case"}
    exec(textwrap.dedent(source), ns)
    return ns[name]


def run(path, fn, *iterables, forward_logs=False, **kwargs):
    """``client.map(fn, ...)`` on a fresh one-worker cluster on the journal ``path``:
    (results, reused, stored)."""
    with LocalCluster(n_workers=1, journal=str(path), forward_logs=forward_logs) as cluster, Client(cluster) as client:
        values = client.gather(client.map(fn, *iterables, **kwargs))
        return values, cluster.journal.reused, cluster.journal.stored


def test_a_later_cluster_reuses_what_an_earlier_one_computed(tmp_path):
    path = tmp_path / "journal"
    assert run(path, inc, range(30)) == ([x + 1 for x in range(30)], 0, 30)
    assert os.stat(path).st_mode & 0o777 == 0o700
    assert os.stat(path / J.RESULTS).st_mode & 0o777 == 0o700
    assert os.stat(path / J.INDEX).st_mode & 0o777 == 0o600
    with LocalCluster(n_workers=1, journal=str(path), forward_logs=False) as cluster, Client(cluster) as client:
        futures = client.map(inc, range(30))
        assert all(f.done() for f in futures)           # finished at once, without running
        assert cluster.journal.reused == 30 and cluster.journal.stored == 0
        # inputs that were only in the journal, read by the worker that needs them
        assert client.submit(total, *futures).result() == sum(range(1, 31))
        assert client.submit(inc, 100, key="explicit").result() == 101
        assert cluster.journal.stored == 2 and cluster.journal.bytes > 0
        assert [f.result() for f in futures] == [x + 1 for x in range(30)]
    with LocalCluster(n_workers=1, journal=str(path), forward_logs=False) as cluster, Client(cluster) as client:
        assert client.submit(inc, 100, key="explicit").result() == 101
        assert cluster.journal.reused == 1
        big = made("def f(x):\n    return bytes([x]) * 100_000\n")
        assert client.submit(big, 1).result() == bytes([1]) * 100_000        # a file
        cluster.journal.clear()
        assert cluster.journal.bytes == 0
        assert client.submit(inc, 7).result() == 8 and cluster.journal.reused == 1
        assert client.submit(big, 2).result() == bytes([2]) * 100_000        # its folder made again
        assert cluster.journal.stored == 2


def test_a_changed_body_recomputes_and_a_shifted_range_reuses_the_overlap(tmp_path):
    path = tmp_path / "journal"
    one = made("def f(x):\n    return x * 2\n")
    assert run(path, one, range(20)) == ([x * 2 for x in range(20)], 0, 20)
    same = made("def f(x):\n    return x * 2\n")        # another process's copy of the same code
    assert run(path, same, range(10, 30)) == ([x * 2 for x in range(10, 30)], 10, 10)
    changed = made("def f(x):\n    return x * 3\n")
    assert run(path, changed, range(20)) == ([x * 3 for x in range(20)], 0, 20)


@pytest.mark.slow
def test_a_changed_helper_of_the_same_module_recomputes(tmp_path):
    path = tmp_path / "journal"
    source = "def helper(x):\n    return x {op} 1\n\ndef f(x):\n    return helper(x) * 10\n"
    assert run(path, made(source.format(op="+")), range(5)) == ([(x + 1) * 10 for x in range(5)], 0, 5)
    assert run(path, made(source.format(op="+")), range(5))[1:] == (5, 0)
    assert run(path, made(source.format(op="-")), range(5)) == ([(x - 1) * 10 for x in range(5)], 0, 5)
    closure = "def outer(k):\n    def f(x):\n        return x + k\n    return f\n"
    assert run(path, made(closure, "outer")(1), range(3)) == ([1, 2, 3], 0, 3)
    assert run(path, made(closure, "outer")(2), range(3)) == ([2, 3, 4], 0, 3)


class Opaque:
    def __init__(self, n):
        self.n = n


def value_of(o):
    return o.n


def fails(x):
    raise ValueError(f"no {x}")


@pytest.mark.slow
def test_what_is_never_kept(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="localcluster")
    with LocalCluster(n_workers=1, journal=str(tmp_path / "j"), forward_logs=False) as cluster, \
            Client(cluster) as client:
        assert client.gather(client.map(value_of, [Opaque(1), Opaque(2)])) == [1, 2]
        assert client.submit(inc, 1, pure=False).result() == 2
        with pytest.raises(ValueError, match="no 3"):
            client.submit(fails, 3).result()
        assert cluster.journal.stored == 0
    said = [r.getMessage() for r in caplog.records if "not kept in the journal" in r.getMessage()]
    assert len(said) == 1 and "value_of()" in said[0] and "Opaque" in said[0], said


def test_a_journal_that_is_not_a_folder_is_refused_naming_it(tmp_path):
    with pytest.raises(ValueError, match=r"journal=123 is not valid"):
        LocalCluster(n_workers=0, journal=123)
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError, match=r"journal=.*file.*not a folder"):
        LocalCluster(n_workers=0, journal=str(tmp_path / "file"))
    with localcluster.config.set(journal=str(tmp_path / "from-config")):
        with LocalCluster(n_workers=0) as cluster:
            assert cluster.journal.path == str(tmp_path / "from-config")
    with LocalCluster(n_workers=0) as cluster:
        assert cluster.journal is None


def _flip_middles(folder) -> int:
    flipped = 0
    for root, _dirs, names in os.walk(folder):
        for name in names:
            p = os.path.join(root, name)
            size = os.path.getsize(p)
            if size:
                with open(p, "r+b") as f:
                    f.seek(size // 2)
                    byte = f.read(1)
                    f.seek(size // 2)
                    f.write(bytes([byte[0] ^ 0xFF]))
                flipped += 1
    return flipped


def test_damaged_entries_are_computed_again_never_served(tmp_path, caplog):
    path = tmp_path / "journal"
    big = made("def f(x):\n    return bytes([x]) * 100_000\n")
    expected = [bytes([x]) * 100_000 for x in range(6)]
    assert run(path, big, range(6))[0] == expected
    assert _flip_middles(path / J.RESULTS) == 6
    caplog.set_level(logging.WARNING)
    with LocalCluster(n_workers=1, journal=str(path), forward_logs=False) as cluster, Client(cluster) as client:
        futures = client.map(big, range(6))
        assert cluster.journal.reused == 6           # the index holds them: found damaged as they are read
        assert client.gather(futures[:3]) == expected[:3]
        assert client.submit(len, futures[4]).result() == 100_000      # read on the worker: damaged too
        assert client.gather(futures) == expected
    assert any("damaged" in r.getMessage() for r in caplog.records)
    assert run(path, big, range(6)) == (expected, 6, 0)     # computed again, and kept again


@pytest.mark.slow
def test_cut_short_and_swapped_entries_are_never_served(tmp_path):
    path = tmp_path / "journal"
    f = made("def f(x):\n    return [x] * 50_000\n")
    run(path, f, range(4))
    files = sorted(os.path.join(r, n) for r, _d, ns in os.walk(path / J.RESULTS) for n in ns)
    with open(files[0], "r+b") as fh:
        fh.truncate(os.path.getsize(files[0]) - 10)
    first, second = (open(p, "rb") for p in files[1:3])
    with first, second:
        a, b = first.read(), second.read()
    for p, data in ((files[1], b), (files[2], a)):
        with open(p, "wb") as fh:
            fh.write(data)
    assert run(path, f, range(4))[0] == [[x] * 50_000 for x in range(4)]


@pytest.mark.slow
def test_a_damaged_index_is_made_again_from_the_files(tmp_path, caplog):
    path = tmp_path / "journal"
    big = made("def f(x):\n    return bytes([x]) * 100_000\n")       # a file each
    run(path, big, range(4))
    run(path, inc, range(10))           # small: kept in the index's rows
    index = path / J.INDEX
    for suffix in ("-wal", "-shm"):
        if os.path.exists(str(index) + suffix):
            os.unlink(str(index) + suffix)
    index.write_bytes(b"this is not a database" * 100)
    caplog.set_level(logging.WARNING, logger="localcluster")
    assert run(path, big, range(4)) == ([bytes([x]) * 100_000 for x in range(4)], 4, 0)
    said = [r.getMessage() for r in caplog.records if "index of the journal" in r.getMessage()]
    assert len(said) == 1 and str(path) in said[0] and "4 results" in said[0], said
    assert run(path, inc, range(10)) == ([x + 1 for x in range(10)], 0, 10)     # lost with the index


def test_tokens_and_fingerprints_are_values_not_identities():
    import numpy as np
    t = journal_module.token
    assert t((1, "a", {"k": [1.5, None]}, {3, 2})) == t((1, "a", {"k": [1.5, None]}, {2, 3}))
    assert t((1,)) != t((True,)) != t(("1",))
    assert t(np.arange(5)) == t(np.arange(5)) != t(np.arange(5.0))
    assert t(Opaque(1)) is None
    fp = journal_module.fingerprint
    assert fp(made("def f(x):\n    return x\n")) == fp(made("def f(x):\n    return x\n"))
    assert fp(made("def f(x):\n    return x\n")) != fp(made("def f(x):\n    return -x\n"))
    assert fp(made("def f(x, k=1):\n    return x\n")) != fp(made("def f(x, k=2):\n    return x\n"))


@pytest.mark.slow
def test_a_dask_array_computed_twice_computes_no_block_the_second_time(tmp_path):
    da = pytest.importorskip("dask.array")
    import numpy as np
    path = str(tmp_path / "journal")
    x = da.arange(400, chunks=50).reshape(20, 20).rechunk(5) * 3
    expected = (np.arange(400).reshape(20, 20) * 3).sum(axis=0)
    with LocalCluster(n_workers=1, journal=path, forward_logs=False) as cluster, Client(cluster) as client:
        assert (x.sum(axis=0).compute(scheduler=client.get) == expected).all()
        first = cluster.journal.stored
        assert first > 16 and cluster.journal.reused == 0
    with LocalCluster(n_workers=1, journal=path, forward_logs=False) as cluster, Client(cluster) as client:
        # dask's compute finalizes under a key of its own each time (a uuid): that one task
        # runs, its inputs read by its worker; no block of x is computed
        assert (x.sum(axis=0).compute(scheduler=client.get) == expected).all()
        assert cluster.journal.stored == 1 and cluster.journal.reused > 16
        assert (client.compute(x.sum(axis=0)).result() == expected).all()
        assert cluster.journal.stored == 2


@pytest.mark.slow
def test_bytes_flipped_in_every_file_of_the_journal_never_give_a_wrong_value(tmp_path):
    path = tmp_path / "journal"
    source = "def f(x):\n    return bytes([x]) * (100_000 if x % 2 else 100)\n"
    expected = [bytes([x]) * (100_000 if x % 2 else 100) for x in range(12)]
    assert run(path, made(source), range(12)) == (expected, 0, 12)        # 6 files, 6 rows
    assert _flip_middles(path) >= 7                                      # the files and the index
    try:
        with LocalCluster(n_workers=1, journal=str(path), forward_logs=False) as cluster, Client(cluster) as client:
            futures = client.map(made(source), range(12))
            assert client.submit(total, *[client.submit(len, f) for f in futures]).result() == \
                sum(map(len, expected))
            assert client.gather(futures) == expected
    except localcluster.JournalError as e:
        assert str(path) in str(e)
    assert run(path, made(source), range(12))[0] == expected


def _mounted(folder, options: str):
    """A tmpfs at ``folder`` (root only: else the test is skipped); the undo."""
    import subprocess
    os.makedirs(folder, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    return lambda: subprocess.run(["umount", "-l", str(folder)], check=True)


@pytest.mark.slow
def test_a_full_disk_is_one_warning_and_the_run_goes_on(tmp_path, caplog):
    disk = tmp_path / "small"
    undo = _mounted(disk, "size=1m,mode=0700")
    try:
        caplog.set_level(logging.WARNING)
        f = made("def f(x):\n    return bytes([x]) * 200_000\n")
        # a worker's warning, as its other log records, reaches the console with forward_logs;
        # once for the cluster, whichever of its workers meets the full disk first
        with LocalCluster(n_workers=2, journal=str(disk / "journal"), forward_logs=True) as cluster, \
                Client(cluster) as client:
            futures = client.map(f, range(24))
            values = client.gather(futures)
            on = {w for w in client.who_has(futures).values() for w in w}
            stored = cluster.journal.stored
            logged = [line for w in on for line in client.get_worker_logs()[w] if "cannot be written" in line]
        assert values == [bytes([x]) * 200_000 for x in range(24)]
        assert stored < 24 and len(on) == 2 and len(logged) == 2, (stored, on, logged)     # both met it
        said = [r.getMessage() for r in caplog.records if "cannot be written" in r.getMessage()]
        assert len(said) == 1 and str(disk / "journal") in said[0], said
    finally:
        undo()


@pytest.mark.slow
def test_a_damaged_index_that_cannot_be_set_aside_is_refused_naming_the_journal(tmp_path):
    """The index damaged and pinned in place (a file bind-mounted over it: it cannot be renamed
    aside, as in a folder of another user's): the cluster refuses to start, saying where and
    what to do, rather than use it or lose it."""
    import subprocess
    path = tmp_path / "journal"
    run(path, inc, range(3))
    damaged = tmp_path / "damaged"
    damaged.write_bytes(b"not an index" * 100)
    done = subprocess.run(["mount", "--bind", str(damaged), str(path / J.INDEX)], capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"cannot bind-mount here: {done.stderr.strip()}")
    try:
        with pytest.raises(localcluster.JournalError, match="journal=") as caught:
            LocalCluster(n_workers=1, journal=str(path))
        assert str(path) in str(caught.value) and "Remove" in str(caught.value)
    finally:
        subprocess.run(["umount", "-l", str(path / J.INDEX)], check=True)
    assert run(path, inc, range(3)) == ([1, 2, 3], 3, 0)       # unpinned, the index under it was never touched


@pytest.mark.slow
def test_a_read_only_journal_is_one_warning_and_the_run_goes_on(tmp_path, caplog):
    import subprocess
    disk = tmp_path / "ro"
    undo = _mounted(disk, "size=4m,mode=0700")
    try:
        run(disk / "journal", inc, range(3))
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        caplog.set_level(logging.WARNING, logger="localcluster")
        with LocalCluster(n_workers=1, journal=str(disk / "journal"), forward_logs=False) as cluster, \
                Client(cluster) as client:
            assert cluster.journal is None
            assert client.gather(client.map(inc, range(5))) == [1, 2, 3, 4, 5]
        said = [r.getMessage() for r in caplog.records if "cannot be used" in r.getMessage()]
        assert len(said) == 1 and str(disk / "journal") in said[0], said
    finally:
        undo()


@pytest.mark.slow
def test_progress_the_live_view_and_the_report_show_reused_tasks(tmp_path, monkeypatch):
    import io
    import re
    import sys
    from localcluster.views.live import status_lines
    from localcluster.views.progress import progress
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)       # the text bar, whatever is installed
    path = tmp_path / "journal"
    run(path, inc, range(8))
    with LocalCluster(n_workers=1, journal=str(path), forward_logs=False) as cluster, Client(cluster) as client:
        out = io.StringIO()
        with localcluster.report(tmp_path / "report.html"):
            futures = client.map(inc, range(10))
            assert progress(futures, file=out, interval=0.01) == (10, 0)
            assert "10/10 done (8 reused from the journal)" in out.getvalue()
            assert ", 8 reused" in " ".join(status_lines([cluster]))
    text = re.sub(r"<[^>]+>", "|", (tmp_path / "report.html").read_text())
    assert "tasks reused from the journal (not run)||8|" in text


WRITER = """
import sys
import numpy as np
from localcluster.wire import serialize
from localcluster.worker import journal as J
J.write_entry(sys.argv[1], "ab" * 20, serialize.dumps_result(np.ones(100_000_000)))    # 800 MB
"""


@pytest.mark.slow
def test_a_process_killed_while_writing_an_entry_leaves_none_visible_and_the_next_cluster_sweeps(tmp_path):
    import signal
    import subprocess
    import sys
    import time
    folder = tmp_path / "journal"
    temporary = folder / J.TEMPORARY
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(folder)],
                            env=dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
    try:
        deadline = time.monotonic() + 30
        while not (temporary.is_dir() and any(os.path.getsize(temporary / n) > 1 << 20 for n in os.listdir(temporary))):
            assert proc.poll() is None and time.monotonic() < deadline, "the writer ended before it was killed"
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(30)
    assert not os.path.exists(J.entry_path(str(folder), "ab" * 20))       # only its temporary file is left
    assert len(os.listdir(temporary)) == 1
    (temporary / f"{'cd' * 20}.{os.getpid()}-1.tmp").write_bytes(b"a live writer's")     # this process: alive
    with LocalCluster(n_workers=0, journal=str(folder)) as cluster:
        assert os.listdir(temporary) == [f"{'cd' * 20}.{os.getpid()}-1.tmp"]     # the dead writer's, swept
        with pytest.raises(FileNotFoundError):
            J.read_entry(cluster.journal.path, "ab" * 20)


class Counter:
    def __init__(self):
        self.n = 0

    def add(self, k):
        self.n += k
        return self.n


@pytest.mark.slow
def test_an_actor_and_an_impure_task_with_a_key_are_never_kept(tmp_path):
    path = str(tmp_path / "journal")
    for _ in range(2):
        with LocalCluster(n_workers=1, journal=path, forward_logs=False) as cluster, Client(cluster) as client:
            counter = client.submit(Counter, actor=True, key="the-counter").result()
            assert counter.add(2).result() == 2          # a new object each run, never a stale handle
            assert client.submit(inc, 1, key="impure", pure=False).result() == 2
            assert cluster.journal.stored == 0 and cluster.journal.reused == 0
