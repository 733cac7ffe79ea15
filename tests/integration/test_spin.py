"""Polling a little before sleeping (system/spin.py): only while the kernel says no task
waits for a CPU, and then a short round trip wakes no sleeping thread, in the worker or in
the user's thread waiting in result()."""
from __future__ import annotations

import os
import socket
import sys
import threading
import time

import pytest

from localcluster import Client, LocalCluster
from localcluster.system import spin

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def psi(tmp_path, monkeypatch):
    """A pressure file of our own, whose "some" total the test sets (µs)."""
    path = tmp_path / "cpu"

    def stalled(total_us: int, avg10: float = 0.0) -> None:
        path.write_text(f"some avg10={avg10:.2f} avg60=0.00 avg300=0.00 total={total_us}\n"
                        f"full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    monkeypatch.setattr(spin, "_PSI", str(path))
    monkeypatch.setattr(spin, "_last", (0.0, None, 1.0, False))
    monkeypatch.setattr(spin, "_ALONE", False)
    return stalled


def test_calm_averages_the_share_of_time_tasks_waited_for_a_cpu(psi):
    total, now = 1_000_000, 100.0

    def look(stalled_share: float) -> bool:         # one look, 0.1 s after the last
        nonlocal total, now
        total += int(stalled_share * 0.1 * 1e6)
        now += 0.1
        psi(total)
        return spin.calm(now=now)

    psi(total, avg10=100.0)
    assert not spin.calm(now=now)                   # the first look: the kernel says fully stalled
    assert [look(0.0) for _ in range(4)] == [False, False, False, True]    # calm from the 4th calm look
    for _ in range(10):
        look(0.05)                                  # a round trip's own share: a woken thread waits a little
    assert look(0.4)                                # a lone burst does not stop polling
    assert look(0.05)
    assert not look(0.7)                            # a busy machine does, at once
    assert [look(0.7) for _ in range(5)] == [False] * 5
    assert [look(0.05) for _ in range(3)] == [False, False, True]          # and back once it calms down
    psi(total + 1_000_000)                          # a second stalled, but
    assert spin.calm(now=now + spin.LOOK / 2)       # too soon to look again: the last view stands
    # a look after long without one takes the kernel's average of the last 10 s
    psi(total + 1_000_000, avg10=40.0)
    assert not spin.calm(now=now + 5.0)
    psi(total + 1_000_000, avg10=3.0)
    assert spin.calm(now=now + 10.0)


def test_a_first_look_on_a_calm_machine_polls_at_once(psi):
    """A new cluster's first round trips, or the first after a pause (a script between two
    steps, a notebook's cell): the kernel's 10 s average says calm, so no warm-up of five
    calm looks (~250 ms of round trips that each woke a sleeping thread)."""
    psi(5_000_000, avg10=2.5)
    assert spin.calm(now=100.0)
    psi(5_000_000, avg10=30.0)
    spin._last = (0.0, None, 1.0, False)
    assert not spin.calm(now=100.0)


def test_on_one_cpu_nothing_is_calm(psi, monkeypatch):
    monkeypatch.setattr(spin, "_ALONE", True)
    psi(1_000_000)
    assert not spin.calm(now=100.0)
    assert not spin.calm(now=100.1)


def test_without_pressure_information_nothing_is_calm(monkeypatch, tmp_path):
    monkeypatch.setattr(spin, "_PSI", str(tmp_path / "absent"))
    monkeypatch.setattr(spin, "_last", (0.0, None, 1.0, False))
    monkeypatch.setattr(spin, "_ALONE", False)
    assert not spin.calm(now=1.0)
    assert not spin.calm(now=1.1)


class Poller:
    """A select.poll stand-in that counts its calls and never has anything ready."""

    def __init__(self):
        self.calls = 0

    def poll(self, timeout):
        assert timeout == 0, "polling must never sleep"
        self.calls += 1
        return []


def test_on_a_busy_machine_a_wait_polls_not_once(monkeypatch):
    monkeypatch.setattr(spin, "calm", lambda now=None: False)
    p = Poller()
    assert spin.poll_for(p, 10.0) == []                 # returns at once: a 10 s window is not spent
    assert p.calls == 0


def test_on_a_calm_machine_a_wait_polls_until_its_window_is_over_or_the_reply_is_there(monkeypatch):
    monkeypatch.setattr(spin, "calm", lambda now=None: True)
    p = Poller()
    assert spin.poll_for(p, 0.002) == []
    assert p.calls >= 1
    assert spin.poll_for(p, 0) == [] and spin.poll_for(p, -1) == []     # no window: no poll
    a, b = socket.socketpair()
    with a, b:
        import select
        real = select.poll()
        real.register(a, select.POLLIN)
        b.send(b"x")
        assert spin.poll_for(real, 10.0) == [(a.fileno(), select.POLLIN)]


# --- through real processes ----------------------------------------------------------------

def always_calm():
    """A worker's initializer: its machine is calm whatever the load (as the parent's, below)."""
    spin.calm = lambda now=None: True


def noop(x):
    return x


POLLS = {"found": 0, "timed out": 0}     # in a worker: its reader's polls, by outcome


def calm_and_counted():
    """A worker's initializer: calm, as always_calm, and each poll of its reader counted by
    whether the next message came within the window (else the reader then sleeps for it)."""
    from localcluster.worker import process
    always_calm()
    poll = process.poll_for

    def counted(poller, window):
        ready = poll(poller, window)
        POLLS["found" if ready else "timed out"] += 1
        return ready
    process.poll_for = counted


def polls() -> dict:
    return dict(POLLS)


def woken(pid: int, tid: "int | None" = None) -> int:
    """Times the threads of process ``pid`` (or only thread ``tid``) slept and were woken."""
    total = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        if tid is not None and int(t) != tid:
            continue
        try:
            with open(f"/proc/{pid}/task/{t}/status") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches"))
        except (OSError, StopIteration):
            continue
    return total


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts from /proc")
def test_a_round_trip_on_a_calm_machine_wakes_neither_the_worker_nor_the_waiting_thread(monkeypatch):
    """Without polling, each round trip puts the worker's reading thread to sleep until the
    next run comes, and the user's thread until the reply comes (a wake-up each). With it,
    neither sleeps. The window is long here (50 ms) so that a loaded machine's delays stay
    inside it; calm is forced, in both processes, for the same reason.

    The worker's reader is counted by its polls' outcomes (as in the test below): the
    kernel's count of its sleeps also counts its waits for the GIL, which another of the
    worker's threads takes while a loaded machine preempts the reader."""
    monkeypatch.setattr(spin, "calm", lambda now=None: True)
    n = 300
    with LocalCluster(n_workers=1, threads_per_worker=1, forward_logs=False, spin_wait=0.05,
                      initializer=calm_and_counted) as cluster, Client(cluster) as client:
        for i in range(20):
            assert client.submit(noop, i, pure=False).result(30) == i
        me = threading.get_native_id()
        (before,) = client.run(polls).values()
        mine0 = woken(os.getpid(), me)
        starts = []
        for i in range(n):
            starts.append(time.monotonic())
            assert client.submit(noop, i, pure=False).result(30) == i
        starts.append(time.monotonic())
        mine = woken(os.getpid(), me) - mine0
        (after,) = client.run(polls).values()
    # a round trip whose next run came later than the window after it started (a loaded
    # machine's): in it, each thread may have slept once, as it should
    late = sum(b - a >= 0.05 for a, b in zip(starts, starts[1:]))
    found, timed_out = (after[k] - before[k] for k in ("found", "timed out"))
    worker, mine = (timed_out - late) / n, (mine - late) / n
    # Without polling: the worker's reader sleeps for every run, this thread for most replies.
    # Not the worker's main thread: its turn at the channel is a timer due 2 ms after a run
    # starts (worker/turn.py), which a loaded machine's slow round trips let fire once each.
    assert found >= n and worker < 0.4 and mine < 0.4, (
        f"slept a round trip: the worker's reader {worker:.2f} (found {found}, gave up {timed_out}), this "
        f"thread {mine:.2f}, besides {late} of {n} round trips longer than the window")


def executor_tid() -> int:
    return threading.get_native_id()


def test_a_worker_that_answered_polls_longer_than_the_parent_for_the_next_run(monkeypatch):
    """The next run comes only after the parent's own turn (its handling of the reply, the
    user's code, the next submit): here the user's code takes 2x spin_wait between two
    round trips, within the worker's window (SPIN_AFTER_REPLY x spin_wait), so the worker's
    reading thread finds the next run while it polls; with a window of spin_wait it would
    give up first and sleep for it, each time.

    Counted by the polls' outcomes, not the kernel's count of the thread's sleeps: those also
    count its waits for the GIL, which beside two whole test suites on two CPUs read 2.8 a
    round trip (the thread preempted, another of the worker's threads takes the GIL)."""
    from localcluster.worker.process import SPIN_AFTER_REPLY
    assert SPIN_AFTER_REPLY >= 3
    monkeypatch.setattr(spin, "calm", lambda now=None: True)
    # The margin, (SPIN_AFTER_REPLY - 2) x window, is what a loaded machine may delay the
    # parent's next submit by (its thread preempted after the user's code) and still count:
    # at 10 ms, three busy loops and another suite beside it on two CPUs gave up 14 times.
    window, n = 0.025, 40
    with LocalCluster(n_workers=1, threads_per_worker=1, forward_logs=False, spin_wait=window,
                      initializer=calm_and_counted) as cluster, Client(cluster) as client:
        for i in range(5):
            assert client.submit(noop, i, pure=False).result(30) == i
        (before,) = client.run(polls).values()
        for i in range(n):
            end = time.perf_counter() + 2 * window
            while time.perf_counter() < end:        # the user's code, on a CPU (not asleep)
                pass
            assert client.submit(noop, i, pure=False).result(30) == i
        (after,) = client.run(polls).values()
    found, timed_out = (after[k] - before[k] for k in ("found", "timed out"))
    # Two polls a round trip: the first finds the key's release, which comes first; the
    # second waits for the next run. With a window of spin_wait (tried by starting the
    # cluster with spin_wait=window / 4) that one gives up every time: 39 found, 38 gave up.
    # Here all but a few find it, also beside three busy loops on two CPUs (76-79 of 79-80).
    assert found >= n and timed_out <= n // 4, f"the worker's reader found {found} and gave up on {timed_out}"
