"""The main thread's turn at a worker's channel (worker/turn.py): called by a kernel timer
once nobody has read for DELAY, not woken for every run; the worker's other threads never
see the timer's signal."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from localcluster import Client, LocalCluster

from _util import wait_running

pytestmark = pytest.mark.timeout(90)


def _run_here(code: str) -> str:
    """``code`` in a fresh interpreter (SIGALRM and the wakeup fd are process-wide: not in
    pytest's own process, whose timeouts use SIGALRM); what it printed."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_the_timer_calls_the_main_thread_after_its_delay_and_a_disarmed_one_never_does():
    out = _run_here("""
        import time
        from localcluster.worker.turn import MainTurn
        turn = MainTurn(delay=0.05)
        turn.install()
        assert turn.timed
        t0 = time.monotonic()
        turn.arm()
        turn.arm()                      # armed already: the first moment stands
        assert turn.wait(5)
        waited = time.monotonic() - t0
        assert 0.04 < waited < 2, waited
        turn.disarm()                   # it fired: disarming after costs nothing
        turn.arm()
        turn.disarm()                   # someone read first: no call
        assert not turn.wait(0.2)
        turn.now()
        assert turn.wait(0)
        assert not turn.wait(0)         # one call, drained
        print("ok")
    """)
    assert out == "ok"


def test_threads_started_quiet_have_the_timers_signal_blocked_and_the_starter_keeps_its_mask():
    out = _run_here("""
        import signal, threading
        from localcluster.worker.turn import quiet
        seen = {}
        with quiet():
            t = threading.Thread(target=lambda: seen.update(mask=signal.pthread_sigmask(signal.SIG_BLOCK, [])))
            t.start()
        t.join()
        assert signal.SIGALRM in seen["mask"], seen
        assert signal.SIGALRM not in signal.pthread_sigmask(signal.SIG_BLOCK, [])
        print("ok")
    """)
    assert out == "ok"


def test_a_worker_whose_initializer_took_sigalrm_keeps_its_handler_and_calls_the_main_thread_at_once():
    out = _run_here("""
        import signal
        from localcluster.worker.turn import MainTurn
        mine = lambda *a: None
        signal.signal(signal.SIGALRM, mine)
        turn = MainTurn()
        turn.install()
        assert not turn.timed and signal.getsignal(signal.SIGALRM) is mine
        turn.arm()
        assert turn.wait(0)             # no timer: called at once, as a wake-up
        print("ok")
    """)
    assert out == "ok"


def _sleep_in_c(seconds: float):
    """A task in C code that fails on a signal (usleep: -1, EINTR), with its thread's mask
    and whether the main thread's turn is timed."""
    import ctypes
    import ctypes.util
    import signal as s
    from localcluster.worker import process
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    rc = libc.usleep(int(seconds * 1e6))
    worker, _run = process.current()
    return rc, ctypes.get_errno() if rc else 0, s.SIGALRM in s.pthread_sigmask(s.SIG_BLOCK, []), worker.turn.timed


def _took_alarm():
    import signal as s
    s.signal(s.SIGALRM, lambda *a: None)


@pytest.mark.parametrize("initializer", [None, _took_alarm], ids=["default", "initializer-took-sigalrm"])
def test_a_task_in_c_code_outlasting_the_delay_is_never_interrupted_and_the_worker_still_serves(initializer):
    """The task's thread has SIGALRM blocked, so the timer (armed: the run left nobody
    reading) calls the main thread without touching the task; the main thread then reads
    and answers while the task still runs."""
    with LocalCluster(n_workers=1, threads_per_worker=1, forward_logs=False, initializer=initializer) as c, \
            Client(c) as cl:
        long = cl.submit(_sleep_in_c, 1.0, pure=False)
        wait_running(c, long)
        # answered while the only executor sleeps in C: the main thread took the channel
        assert list(cl.run(lambda: 7).values()) == [7]
        rc, errno, blocked, timed = long.result(30)
    assert (rc, errno) == (0, 0), f"usleep was interrupted (errno {errno})"
    assert blocked
    assert timed is (initializer is None)
