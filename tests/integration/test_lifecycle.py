"""The one shutdown state: its table of moves without processes, then the phases a real
cluster goes through (running, refused at start, broken, stopped, closed, forked)."""
from __future__ import annotations

import os
import threading

import pytest
from _util import block_until, wait_for, wait_running

from localcluster import ClusterBroken, Client, LocalCluster
from localcluster.engine.lifecycle import MOVES, Lifecycle, Phase
from localcluster.client.future import gateway_of

pytestmark = pytest.mark.timeout(60)


def test_every_phase_has_a_row_and_the_table_is_obeyed():
    assert set(MOVES) == set(Phase)
    for start in Phase:
        for end in Phase:
            life = Lifecycle()
            life.phase = start          # a fresh object placed at ``start`` for the check
            error = RuntimeError("x") if end in (Phase.REFUSED, Phase.BROKEN) else None
            moved = life.to(end, error)
            assert moved == (end in MOVES[start]), (start, end)
            assert life.phase is (end if moved else start)


def test_refused_and_broken_stay_apart_and_the_first_error_is_kept():
    life = Lifecycle()
    refusal = ValueError("memory_limit=30.00 MiB is too small")
    assert life.to(Phase.REFUSED, refusal) and life.error is refusal and not life.broken and not life.open
    assert life.to(Phase.CLOSING) and life.error is refusal      # close() of a refused cluster
    assert not life.to(Phase.RUNNING)                             # never open again
    broken = Lifecycle()
    bug = ClusterBroken("scheduler", "Traceback ...")
    assert broken.to(Phase.BROKEN, bug) and broken.broken
    assert not broken.to(Phase.BROKEN, ClusterBroken("again", "..."))   # a second break changes nothing
    assert broken.error is bug
    assert broken.to(Phase.CLOSING) and broken.broken            # closed after a break: still was broken
    assert broken.to(Phase.STOPPED) and broken.thread_ended and broken.to(Phase.CLOSED)
    assert not broken.to(Phase.FORKED)                            # closed is final


def test_a_fork_marks_it_even_while_another_thread_holds_its_lock():
    life = Lifecycle()
    held = threading.Lock()
    life._lock = held          # stands for a lock a thread of the parent held at the fork
    held.acquire()
    life.forked()              # must not wait for it
    assert life.phase is Phase.FORKED and not life.open
    held.release()


def test_a_real_cluster_goes_running_then_closed():
    cluster = LocalCluster(n_workers=1, forward_logs=False)
    client = Client(cluster)
    assert gateway_of(client).phase is Phase.RUNNING and "running" in repr(cluster)
    assert client.submit(sum, [1, 2]).result(30) == 3
    cluster.close()
    assert gateway_of(client).phase is Phase.CLOSED and "closed" in repr(cluster)
    with pytest.raises(RuntimeError, match="is closed; create a new one"):
        client.submit(sum, [1])
    client.close()


def test_a_limit_too_small_is_refused_not_broken():
    with pytest.raises(ValueError, match="too small") as info:
        LocalCluster(n_workers=1, memory_limit="1KiB", forward_logs=False)
    assert not isinstance(info.value, ClusterBroken)


def test_a_break_stops_the_scheduler_thread_and_commands_fail_at_once(monkeypatch):
    with LocalCluster(n_workers=1, forward_logs=False) as cluster, Client(cluster) as client:
        def boom(specs, again=None):
            raise KeyError("injected failure in Scheduler.submit")
        monkeypatch.setattr(cluster.scheduler.admission, "submit", boom)     # what a Submit event calls
        with pytest.raises(ClusterBroken):
            client.submit(sum, [1])
        wait_for(lambda: gateway_of(client).phase is Phase.STOPPED)   # the thread moves it as it ends
        wait_for(lambda: not any(t.name == "localcluster-scheduler" for t in threading.enumerate()))
        with pytest.raises(ClusterBroken):
            cluster.scale(2)                               # refused before any command is handed over
    assert gateway_of(client).phase is Phase.CLOSED


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_in_a_forked_child_the_phase_is_forked():
    with LocalCluster(n_workers=1, forward_logs=False) as cluster, Client(cluster) as client:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:        # pragma: no cover - the child reports through the pipe
            try:
                ok = gateway_of(client).phase is Phase.FORKED and client.status == "forked"
                os.write(w, b"1" if ok else b"0")
            finally:
                os._exit(0)
        os.close(w)
        answer = os.read(r, 1)
        os.close(r)
        os.waitpid(pid, 0)
        assert answer == b"1"
        assert gateway_of(client).phase is Phase.RUNNING and client.status == "running"


def test_a_closed_cluster_the_user_lets_go_of_is_freed():
    """Nothing of the package keeps a cluster alive once closed and let go of: its workers'
    buffers, its scheduler and its futures' results go with it (one leaked cluster a cycle
    held every result it gathered)."""
    import gc
    import weakref
    with LocalCluster(n_workers=1, forward_logs=False) as cluster, Client(cluster) as client:
        assert client.submit(abs, -1).result(30) == 1
        ref = weakref.ref(cluster)
    del cluster, client
    gc.collect()
    assert ref() is None


def test_every_stop_and_kill_of_a_worker_is_made_on_the_scheduler_thread(monkeypatch, tmp_path):
    """Scale-downs, cancels from the user's thread, a restart: whatever thread brought the
    event, the nanny is signalled and sent Stop from the scheduler thread only."""
    from localcluster.supervision.nanny import Nanny
    seen: list = []
    for name in ("stop", "kill", "ask_last_stacks", "last_stacks_arrived"):
        real = getattr(Nanny, name)

        def recording(self, *args, _real=real, _name=name, **kwargs):
            seen.append((_name, threading.current_thread().name))
            return _real(self, *args, **kwargs)
        monkeypatch.setattr(Nanny, name, recording)
    go = str(tmp_path / "go")
    with LocalCluster(n_workers=3, threads_per_worker=1, forward_logs=False) as c, Client(c) as cl:
        busy = [cl.submit(block_until, go, pure=False, workers=[w]) for w in sorted(c.workers)]
        for f in busy:
            wait_running(c, f)
        down = threading.Thread(target=c.scale, args=(1,))
        down.start()                                  # two workers wait for their task to end
        cl.cancel(busy)                               # on this thread: lets the retiring workers go
        open(go, "w").close()
        down.join(30)
        assert not down.is_alive() and len(c.workers) == 1
        cl.restart()
        assert cl.submit(sum, [1, 2]).result(30) == 3
    assert seen and {thread for _, thread in seen} == {"localcluster-scheduler"}, seen
