"""Cluster directories in a shared /tmp: a directory is removed only when its owner is
really gone (its lock can be taken), never because its pid looks dead from here, never
when another user owns it, and never through a symlink."""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from localcluster import LocalCluster
from localcluster.system import machine

OTHER_PROCESS = textwrap.dedent("""
    import sys
    from localcluster import LocalCluster
    with LocalCluster(n_workers=1, local_directory=sys.argv[1], forward_logs=False) as cluster:
        print(cluster.local_directory, flush=True)
        sys.stdin.read()          # until told to go (or killed)
""")


def _dead_pid() -> int:
    pid = 4_000_000
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        pid -= 1


@pytest.mark.timeout(60)
def test_a_live_cluster_whose_pid_looks_dead_keeps_its_directory(tmp_path, monkeypatch):
    proc = subprocess.Popen([sys.executable, "-c", OTHER_PROCESS, str(tmp_path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        theirs = proc.stdout.readline().strip()
        assert os.path.isdir(theirs) and os.path.basename(theirs).startswith(f"localcluster-{proc.pid}-")
        real_kill = os.kill

        def kill(pid, sig):            # as from another PID namespace: their pid is free here
            if pid == proc.pid and sig == 0:
                raise ProcessLookupError(pid)
            return real_kill(pid, sig)
        monkeypatch.setattr(os, "kill", kill)
        machine.purge_stale_directories(str(tmp_path))
        with LocalCluster(n_workers=0, local_directory=str(tmp_path)):   # purges on start, too
            assert os.path.isdir(theirs)
        monkeypatch.undo()
        proc.kill()                    # SIGKILL: no chance to clean up; the lock goes with it
        proc.wait(30)
        machine.purge_stale_directories(str(tmp_path))
        assert not os.path.exists(theirs)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        proc.stdout.close()
        proc.stdin.close()


def test_a_directory_of_a_dead_owner_goes_and_ours_stays(tmp_path):
    with LocalCluster(n_workers=0, local_directory=str(tmp_path)) as cluster:
        ours = cluster.local_directory
        assert oct(os.stat(ours).st_mode & 0o777) == "0o700"
        lock = os.path.join(ours, machine.LOCK)
        assert oct(os.stat(lock).st_mode & 0o777) == "0o600"
        dead = tmp_path / f"localcluster-{_dead_pid()}-abcd1234"
        dead.mkdir()
        (dead / machine.LOCK).touch()
        (dead / "spill").mkdir()
        machine.purge_stale_directories(str(tmp_path))
        assert not dead.exists() and os.path.isdir(ours)
    assert not os.path.exists(ours)


def test_another_users_directory_is_never_touched(tmp_path):
    if os.getuid() != 0:
        pytest.skip("needs root to make a directory owned by another uid")
    theirs = tmp_path / f"localcluster-{_dead_pid()}-0ther0ne"
    theirs.mkdir(mode=0o700)
    (theirs / machine.LOCK).touch()
    os.chown(theirs, 65534, 65534)
    os.utime(theirs, (time.time() - 3600, time.time() - 3600))
    machine.purge_stale_directories(str(tmp_path))
    assert theirs.exists()


def test_a_symlink_is_never_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("keep me")
    (victim / machine.LOCK).touch()
    link = tmp_path / f"localcluster-{_dead_pid()}-1inkl1nk"
    link.symlink_to(victim)
    os.utime(link, (time.time() - 3600, time.time() - 3600), follow_symlinks=False)
    machine.purge_stale_directories(str(tmp_path))
    assert (victim / "precious").read_text() == "keep me" and link.is_symlink()


def test_a_directory_without_a_lock_goes_only_when_old_and_its_pid_is_dead(tmp_path):
    """An older version's directory, or one being made this instant (no lock file yet)."""
    pid = _dead_pid()
    fresh = tmp_path / f"localcluster-{pid}-fresh000"
    old = tmp_path / f"localcluster-{pid}-old00000"
    alive = tmp_path / f"localcluster-{os.getppid()}-alive000"
    for d in (fresh, old, alive):
        d.mkdir()
    for d in (old, alive):
        os.utime(d, (time.time() - 3600, time.time() - 3600))
    machine.purge_stale_directories(str(tmp_path))
    assert fresh.exists() and not old.exists() and alive.exists()


def test_the_lock_descriptor_is_not_inherited(tmp_path):
    with LocalCluster(n_workers=1, local_directory=str(tmp_path), forward_logs=False) as cluster:
        (worker,) = cluster.workers.values()
        fds = os.listdir(f"/proc/{worker.pid}/fd")
        targets = {os.readlink(f"/proc/{worker.pid}/fd/{fd}") for fd in fds
                   if os.path.exists(f"/proc/{worker.pid}/fd/{fd}")}
        assert not [t for t in targets if t.endswith(machine.LOCK)]


@pytest.mark.slow
def test_the_owner_lock_holds_even_for_a_stopped_owner(tmp_path):
    """SIGSTOPped is alive: its directory stays."""
    proc = subprocess.Popen([sys.executable, "-c", OTHER_PROCESS, str(tmp_path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        theirs = proc.stdout.readline().strip()
        os.kill(proc.pid, signal.SIGSTOP)
        machine.purge_stale_directories(str(tmp_path))
        assert os.path.isdir(theirs)
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.stdin.close()
        proc.wait(30)
        proc.stdout.close()
    assert not os.path.exists(theirs)     # closed cleanly: it removed its own directory


def test_a_folder_that_cannot_hold_the_clusters_says_which_why_and_what_to_do(tmp_path):
    """/proc exists but no folder can be made in it (root included): not a bare FileNotFoundError."""
    with pytest.raises(FileNotFoundError) as info:
        LocalCluster(n_workers=0, local_directory="/proc")
    text = str(info.value)
    assert text.startswith("[Errno 2] local_directory='/proc': the cluster cannot make its own folder there "
                           "(for its workers' spilled data): '/proc/localcluster-")
    assert "No such file or directory; it does not let folders be made in it (a virtual filesystem" in text
    assert "Give local_directory= a folder this user may write to" in text
    (tmp_path / "a-file").write_text("")
    with pytest.raises(NotADirectoryError, match=r"a part of the path is a file, not a folder\. Give local_directory="):
        LocalCluster(n_workers=0, local_directory=str(tmp_path / "a-file" / "spill"))


def test_removing_a_dead_owners_directory_is_said_with_what_it_held(tmp_path, caplog):
    dead_pid = _dead_pid()
    dead = tmp_path / f"localcluster-{dead_pid}-abcd1234"
    (dead / "worker-0").mkdir(parents=True)
    (dead / machine.LOCK).touch()
    (dead / "worker-0" / "a").write_bytes(b"x" * 3000)
    (dead / "worker-0" / "b").write_bytes(b"x" * 2000)
    (dead / "worker-1").mkdir()
    (dead / "initializer.pkl").write_bytes(b"x" * 10)
    empty = tmp_path / f"localcluster-{dead_pid}-efgh5678"
    empty.mkdir()
    (empty / machine.LOCK).touch()
    caplog.set_level(logging.WARNING, logger="localcluster")
    with LocalCluster(n_workers=0, local_directory=str(tmp_path)):
        pass
    said = {r.getMessage().split(",")[0]: r.getMessage() for r in caplog.records if "removed" in r.getMessage()}
    assert not dead.exists() and not empty.exists() and len(said) == 2
    assert said[f"localcluster: removed {dead}"] == (
        f"localcluster: removed {dead}, the folder of a cluster whose process (pid {dead_pid}) ended without "
        f"closing it (killed, or crashed): it held 4.88 KiB of results its workers had spilled to disk (worker-0: 2 files, "
        f"4.88 KiB), lost with that process. Close a cluster (a with block, or close()) so that it removes its "
        f"folder itself.")
    assert said[f"localcluster: removed {empty}"].endswith("ended without closing it (killed, or crashed): it held no "
                                                          "spilled data.")
