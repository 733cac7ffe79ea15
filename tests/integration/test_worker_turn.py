"""The main thread's turn at a worker's channel (worker/turn.py): called by a kernel timer
(a timerfd) once nobody has read for DELAY, not woken for every run; no signal involved,
so a task and the programs it starts keep every signal as the process had it."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from localcluster import Client, LocalCluster
from localcluster.worker.turn import MainTurn

from _util import wait_running

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def turn():
    t = MainTurn(delay=0.05)
    yield t
    t.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timerfd is Linux's")
def test_the_timer_calls_the_main_thread_after_its_delay_and_the_first_moment_stands(turn):
    assert turn.timed
    t0 = time.monotonic()
    turn.arm()
    assert not turn.due()
    time.sleep(0.03)
    turn.arm()                      # armed already: not put off by another 50 ms
    assert turn.wait(5)
    turn.reset_timer()
    waited = time.monotonic() - t0
    assert 0.045 < waited < 0.075 + 1.0, waited     # the upper bound is the machine's load's
    assert turn.due()
    turn.disarm()
    assert not turn.due()


def test_a_disarmed_turn_is_never_due_and_call_now_calls_at_once_once(turn):
    turn.arm()
    turn.disarm()                   # someone read first
    turn.wait(0.2)                  # the timer set for it may still fire: the turn is not due
    turn.reset_timer()
    assert not turn.due()
    turn.call_now()
    turn.call_now()
    assert turn.wait(0)
    turn.reset_timer()
    assert turn.due()
    assert not turn.wait(0)         # the calls were drained together, and no timer is set
    turn.disarm()
    assert not turn.due()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timerfd is Linux's")
def test_a_timer_that_fired_after_a_disarm_leaves_the_turn_not_due(turn):
    """An executor took the reader role back before the timer fired: the main thread, woken,
    finds nothing due and keeps waiting."""
    turn.arm()
    time.sleep(0.1)
    turn.disarm()
    turn.wait(0.1)
    turn.reset_timer()
    assert not turn.due()
    assert not turn.wait(0.1)       # nothing set again


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timerfd is Linux's")
def test_a_stream_of_short_runs_sets_the_timer_once_and_a_later_run_is_called_at_its_own_moment(turn):
    """Arm and disarm (a run started and ended) make no system call while a timer is set; the
    timer set for the first run fires at its moment, and the main thread sets it again for
    the run armed since, which is then due at its own moment, not the first one's."""
    sets = []
    real = turn._set
    turn._set = lambda seconds: (sets.append(seconds), real(seconds))
    t0 = time.monotonic()
    for _ in range(100):
        turn.arm()
        turn.disarm()
    assert len(sets) == 1
    time.sleep(0.03)
    before = time.monotonic()
    turn.arm()                      # a run that starts 30 ms in (or later, loaded): due 50 ms after
    after = time.monotonic()
    assert turn.wait(5)             # the first timer, at ~50 ms
    turn.reset_timer()
    if time.monotonic() < before + 0.05:    # (a loaded machine may wake this thread later)
        assert not turn.due() and len(sets) == 2 and 0 < sets[1] <= 0.05
        assert turn.wait(5)
        turn.reset_timer()
    # woken between the two bounds of its moment, it may be due or not yet: wait the rest out
    time.sleep(max(0.0, after + 0.05 - time.monotonic()))
    assert turn.due() and time.monotonic() - t0 >= 0.079
    turn.disarm()


def _sleep_in_c(seconds: float):
    """A task in C code that fails on a signal (usleep: -1, EINTR), with whether its thread
    blocks SIGALRM and whether the main thread's turn is timed."""
    import ctypes
    import ctypes.util
    import signal as s
    from localcluster.worker import context
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    rc = libc.usleep(int(seconds * 1e6))
    worker, _run = context.current()
    return rc, ctypes.get_errno() if rc else 0, s.SIGALRM in s.pthread_sigmask(s.SIG_BLOCK, []), worker.turn.timed


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timerfd is Linux's")
def test_a_task_in_c_code_outlasting_the_delay_is_left_alone_and_the_main_thread_serves_meanwhile():
    """The run left nobody reading: the timer calls the main thread, which reads and answers
    while the task still runs; the task's thread sees no signal and blocks none."""
    with LocalCluster(n_workers=1, threads_per_worker=1, forward_logs=False) as c, Client(c) as cl:
        long = cl.submit(_sleep_in_c, 1.0, pure=False)
        wait_running(c, long)
        # answered while the only executor sleeps in C: the main thread took the channel
        assert list(cl.run(lambda: 7).values()) == [7]
        rc, errno, blocked, timed = long.result(30)
    assert (rc, errno) == (0, 0), f"usleep was interrupted (errno {errno})"
    assert not blocked and timed


def _alarm_in_a_child() -> int:
    """A program the task starts sets alarm(1) and waits: SIGALRM must end it."""
    code = "import signal, time; signal.alarm(1); time.sleep(30)"
    return subprocess.run([sys.executable, "-c", code], timeout=60).returncode


def test_a_program_a_task_starts_gets_its_own_sigalrm():
    with LocalCluster(n_workers=1, threads_per_worker=1, forward_logs=False) as c, Client(c) as cl:
        assert cl.submit(_alarm_in_a_child, pure=False).result(60) == -signal.SIGALRM
