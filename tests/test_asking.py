"""The requests of tasks (get_client on a worker) as scheduler events: plain asserts, no
processes (tests/test_worker_client.py has them through real workers)."""
from __future__ import annotations

from localcluster.wire import protocol as P
from test_scheduler import death, finish, sched, sends, spec


def ask(s, worker, seq, body, request=0):
    return s.asked(worker, [P.Ask(request, seq, body)])


def test_a_seceded_run_stays_watched_off_the_board_until_it_ends():
    """A run that seceded left its row of the worker's status board: the supervisor reads its
    thread and start from ``off_board`` (to enforce its timeout), rejoined or not, until it ends."""
    s = sched("w1", "w2")
    s.submit([spec("a", timeout=1.0), spec("b")])
    a, b = s.tasks["a"], s.tasks["b"]
    ask(s, a.worker, a.seq, P.Secede(100.0, 7))
    assert s.asking.off_board(a.worker) == {a.seq: (7, 100.0)}
    assert s.workers[a.worker].nthreads == 2
    ask(s, a.worker, a.seq, P.Rejoin())
    assert s.workers[a.worker].nthreads == 1
    assert s.asking.off_board(a.worker) == {a.seq: (7, 100.0)}, "a rejoined run is still off the board"
    finish(s, "a")
    assert s.asking.off_board("w1") == s.asking.off_board("w2") == {} and not s.asking.offboard
    ask(s, b.worker, b.seq, P.Secede(200.0, 8))
    s.worker_died(death(b.worker))
    assert not s.asking.offboard and not s.asking.seceded


def test_a_secede_without_a_start_counts_the_slot_but_is_not_watched():
    """A Secede that carries no start (0) must not look like a run that began at time 0."""
    s = sched("w1")
    s.submit([spec("a")])
    a = s.tasks["a"]
    ask(s, "w1", a.seq, P.Secede())
    assert s.workers["w1"].nthreads == 2 and s.asking.off_board("w1") == {}
    finish(s, "a")
    assert s.workers["w1"].nthreads == 1
