"""What the transition checks found (tests/_transition_checks.py): each a bug the table's
sentences, held after every call of the door, caught. No processes."""
from __future__ import annotations

from localcluster.scheduler import events as E
from localcluster.scheduler.records import Deliver, Spec
from localcluster.scheduler.state import Scheduler
from localcluster.wire import protocol as P

from test_scheduler_machine import ARGS, ERR


def test_a_task_that_failed_waits_on_nothing():
    """An erred task kept the inputs it had been waiting on (``waiting_on`` is empty in every
    state but waiting): a task failed at submit, and one failed while waiting."""
    s = Scheduler()
    s.handle(E.AddWorker("w1", 1))
    s.handle(E.Submit([Spec("a", 1, b"fn", ARGS, ())]))
    s.handle(E.Submit([Spec("b", 1, b"fn", ARGS, ("a",))]))
    assert s.tasks["b"].waiting_on == {"a"}
    s.handle(E.Reported("w1", [P.Failed(s.tasks["a"].seq, ERR)]))         # b: waiting -> erred
    s.handle(E.Submit([Spec("c", 1, b"fn", ARGS, ("a",))]))                # c: released -> erred
    assert s.tasks["b"].state == s.tasks["c"].state == "erred"
    assert not s.tasks["b"].waiting_on and not s.tasks["c"].waiting_on
    s.validate()


def test_a_waiting_task_let_go_waits_on_nothing():
    """A waiting task released but kept for a dependent (one that failed) kept its waiting_on."""
    s = Scheduler()
    s.handle(E.AddWorker("w1", 1))
    s.handle(E.Submit([Spec("a", 1, b"fn", ARGS, ()), Spec("x", 1, b"fn", ARGS, ("a",)),
                       Spec("y", 1, b"fn", ARGS, ("x",))]))
    s.handle(E.Reported("w1", [P.Failed(s.tasks["a"].seq, ERR)]))
    assert s.tasks["y"].state == "erred"
    s.handle(E.Retry(["x"]))                    # a runs again, x waits for it
    assert s.tasks["x"].state == "waiting" and s.tasks["a"].state == "processing"
    s.handle(E.Drop(["x"]))                     # released, kept: y links to it
    assert s.tasks["x"].state == "released" and not s.tasks["x"].waiting_on
    s.validate()

def test_a_retried_task_whose_input_fails_again_fails_instead_of_waiting_forever():
    """Retrying ``d`` brings back its released input ``c``, which fails at once (its own input
    failed): ``d`` was left waiting on a failed input, its future never done."""
    s = Scheduler()
    s.handle(E.AddWorker("w1", 1))
    s.handle(E.Submit([Spec("a", 1, b"fn", ARGS, ())]))
    s.handle(E.Reported("w1", [P.Failed(s.tasks["a"].seq, ERR)]))
    s.handle(E.Submit([Spec("c", 1, b"fn", ARGS, ("a",)), Spec("d", 1, b"fn", ARGS, ("c",))]))
    assert s.tasks["d"].state == "erred"
    s.handle(E.Drop(["c"]))                     # released, kept: d links to it
    assert s.tasks["c"].state == "released"
    out = s.handle(E.Retry(["d"]))
    assert s.tasks["d"].state == "erred" and s.tasks["c"].state == "erred"
    assert [a.status for a in out if getattr(a, "key", None) == "d"] == ["retrying", "error"]
    s.validate()


def test_a_fetch_of_a_task_let_go_with_its_last_dependent_is_answered():
    """A fetch waiting on a task nobody holds, kept for a dependent, was never answered when that
    dependent went and took the task with it."""
    s = Scheduler()
    s.handle(E.AddWorker("w1", 1))
    s.handle(E.Submit([Spec("a", 1, b"fn", ARGS, ())]))
    s.handle(E.Submit([Spec("x", 1, b"fn", ARGS, ("a",)), Spec("y", 1, b"fn", ARGS, ("x",))]))
    s.handle(E.Drop(["x"]))                     # kept: y needs it
    request, _ = E.opened(s.handle(E.Fetch("x")))
    out = s.handle(E.Drop(["y"]))
    assert "x" not in s.tasks
    assert [a.request for a in out if type(a) is Deliver and a.key == "x"] == [request]
    s.validate()
