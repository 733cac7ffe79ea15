"""What SECURITY.md promises, checked on real processes: no process of a cluster listens
on any socket, and the descriptors of a worker's channel and of the shared memory that
carries large data are never inherited by a program a task starts."""
from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest

from localcluster import Client, LocalCluster

np = pytest.importorskip("numpy")


def listening(pid: int) -> list:
    proc = psutil.Process(pid)
    conns = proc.net_connections(kind="all") if hasattr(proc, "net_connections") else proc.connections(kind="all")
    return [c for c in conns if c.status == psutil.CONN_LISTEN]


def our_children() -> list:
    return [p.pid for p in psutil.Process().children(recursive=True)]


def fds_of_a_child_that_inherits_everything(big) -> list:
    # close_fds=False: every descriptor the worker left inheritable would show up here.
    script = ("import os\n"
              "for fd in sorted(os.listdir('/proc/self/fd'), key=int):\n"
              "    try: print(fd, os.readlink('/proc/self/fd/' + fd))\n"
              "    except OSError: pass   # the listing's own descriptor, closed by now\n")
    out = subprocess.run([sys.executable, "-c", script], close_fds=False, capture_output=True, text=True,
                         check=True).stdout
    return dict(line.split(" ", 1) for line in out.splitlines()), int(big.sum())


def test_no_process_of_a_cluster_listens_on_a_socket():
    with LocalCluster(n_workers=2, threads_per_worker=2, forward_logs=False) as c, Client(c) as cl:
        arr = np.ones(20 * 2**20 // 8)
        assert cl.submit(lambda a: float(a.sum()), cl.scatter(arr)).result(30) == arr.size
        procs = [os.getpid(), *our_children()]
        assert len(procs) >= 3                        # us (scheduler and nannies) and 2 workers
        assert {pid: listening(pid) for pid in procs} == {pid: [] for pid in procs}


@pytest.mark.slow
def test_task_subprocesses_inherit_no_channel_or_memory_descriptor():
    with LocalCluster(n_workers=1, forward_logs=False) as c, Client(c) as cl:
        big = cl.scatter(np.ones(20 * 2**20 // 8, dtype=np.int64))   # arrives as shared memory
        fds, total = cl.submit(fds_of_a_child_that_inherits_everything, big).result(30)
        assert total == 20 * 2**20 // 8
        # 0-2 are the worker's stdio (/dev/null and the pipes its output is read from).
        assert sorted(fds) == ["0", "1", "2"], fds



SECRET = "s3cr3t-token-8f1d2e"


def remember(token):
    os.environ["LC_TEST_TOKEN_SEEN"] = token[::-1]      # proof that it ran, not the secret itself


def token_seen():
    return os.environ.get("LC_TEST_TOKEN_SEEN", "")[::-1]


@pytest.mark.slow
def test_an_initializers_arguments_are_not_on_any_command_line():
    """initargs may hold a secret: every worker runs the initializer with it, and no
    worker's command line (world-readable: ps, /proc/<pid>/cmdline) shows it."""
    with LocalCluster(n_workers=2, initializer=remember, initargs=(SECRET,), forward_logs=False) as c, \
            Client(c) as client:
        for name in c.workers:
            assert client.submit(token_seen, workers=[name], pure=False).result(30) == SECRET
        for info in c.workers.values():
            cmdline = " ".join(psutil.Process(info.pid).cmdline())
            assert SECRET not in cmdline and SECRET.encode().hex() not in cmdline
        path = os.path.join(c.local_directory, "initializer.pkl")
        assert os.stat(path).st_mode & 0o777 == 0o600


_SEEN_AT_INIT: list = []


def note_authkey() -> None:
    import multiprocessing
    _SEEN_AT_INIT.append(bytes(multiprocessing.current_process().authkey))


def authkeys() -> tuple:
    import multiprocessing
    return _SEEN_AT_INIT[:1], bytes(multiprocessing.current_process().authkey)


@pytest.mark.parametrize("initializer", [None, note_authkey])
def test_the_initializer_and_every_task_hold_the_parents_authkey(initializer):
    """The key crosses the channel before any message; the initializer (which may connect to
    a Manager of the parent's) and every task see it, not the worker's own random one."""
    import multiprocessing
    key = bytes(multiprocessing.current_process().authkey)
    with LocalCluster(n_workers=2, initializer=initializer, forward_logs=False) as c, Client(c) as cl:
        for name in c.workers:
            seen = cl.submit(authkeys, workers=[name], pure=False).result(30)
            assert seen == ([key] if initializer else [], key)


def test_a_workers_command_line_names_it_and_holds_none_of_its_settings(tmp_path):
    """ps shows '# localcluster worker-0 (parent <pid>)' first; the settings (the parent's
    sys.path, the spill folder, the cgroup) come over the channel, not argv."""
    with LocalCluster(n_workers=1, local_directory=str(tmp_path), forward_logs=False) as c, Client(c) as client:
        assert client.submit(int, "7").result(30) == 7
        (name, info), = c.workers.items()
        args = psutil.Process(info.pid).cmdline()
        assert args[1] == "-c" and args[2].startswith(f"# localcluster {name} (parent {os.getpid()})\n")
        shown = " ".join(args)
        assert str(tmp_path) not in shown and len(shown) < 1000
