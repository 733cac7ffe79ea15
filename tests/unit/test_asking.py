"""The requests of tasks (get_client on a worker) as scheduler events: plain asserts, no
processes (tests/integration/test_worker_client.py has them through real workers)."""
from __future__ import annotations

from localcluster.wire import protocol as P
from localcluster.scheduler import events as E
from test_scheduler import death, finish, sched, sends, spec


def ask(s, worker, seq, body, request=0):
    return s.handle(E.Asked(worker, [P.Ask(request, seq, body)]))


def test_a_seceded_run_stays_watched_off_the_board_until_it_ends():
    """A run that seceded left its row of the worker's status board: the supervisor reads its
    thread and start from ``off_board`` (to enforce its timeout), rejoined or not, until it ends."""
    s = sched("w1", "w2")
    s.handle(E.Submit([spec("a", timeout=1.0), spec("b")]))
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
    s.handle(E.WorkerDied(death(b.worker)))
    assert not s.asking.offboard and not s.asking.seceded


def test_a_secede_without_a_start_counts_the_slot_but_is_not_watched():
    """A Secede that carries no start (0) must not look like a run that began at time 0."""
    s = sched("w1")
    s.handle(E.Submit([spec("a")]))
    a = s.tasks["a"]
    ask(s, "w1", a.seq, P.Secede())
    assert s.workers["w1"].nthreads == 2 and s.asking.off_board("w1") == {}
    finish(s, "a")
    assert s.workers["w1"].nthreads == 1


def fn_body(workers=None, name="f"):
    from localcluster.wire.serialize import dumps
    return P.RunOn(b"fn", dumps(((), {})), workers, name)


def answers(actions, worker=None):
    return [m for _w, m in sends(actions, P.Answer, worker)]


def test_a_tasks_run_is_answered_once_every_worker_has():
    s = sched("w1", "w2")
    s.handle(E.Submit([spec("a")]))
    a = s.tasks["a"]
    out = ask(s, a.worker, a.seq, fn_body(), request=5)
    calls = {w: m for w, m in sends(out, P.Call)}
    assert sorted(calls) == ["w1", "w2"] and not answers(out)
    from localcluster.wire.serialize import dumps
    first = s.handle(E.Reported("", [P.Called(calls["w2"].request, dumps(2), None)]))
    assert first == [], "no Deliver for the dispatcher, no answer yet"
    last = s.handle(E.Reported("", [P.Called(calls["w1"].request, None, b"pickled error")]))
    [answer] = answers(last, a.worker)
    assert answer.request == 5 and answer.error is None
    assert dict(answer.data) == {"w1": ("error", None, b"pickled error"), "w2": ("finished", dumps(2), None)}
    assert not s.asking.calls and not s.calls.calls


def test_a_tasks_run_names_a_worker_that_died_meanwhile():
    from localcluster.wire.serialize import loads_exception
    s = sched("w1", "w2")
    s.handle(E.Submit([spec("a")]))
    a = s.tasks["a"]
    other = "w2" if a.worker == "w1" else "w1"
    out = ask(s, a.worker, a.seq, fn_body((other,), "probe"), request=3)
    assert [w for w, _ in sends(out, P.Call)] == [other]
    [answer] = answers(s.handle(E.WorkerDied(death(other))), a.worker)
    [(name, (status, data, error))] = answer.data
    err = loads_exception(error)
    assert name == other and status == "error" and type(err).__name__ == "KilledWorker"
    assert "client.run(probe) from task 'a'" in str(err) and other in str(err)


def test_a_tasks_run_whose_asker_died_is_answered_to_nobody():
    s = sched("w1", "w2")
    s.handle(E.Submit([spec("a")]))
    a = s.tasks["a"]
    other = "w2" if a.worker == "w1" else "w1"
    out = ask(s, a.worker, a.seq, fn_body(), request=4)
    calls = {w: m for w, m in sends(out, P.Call)}
    died = s.handle(E.WorkerDied(death(a.worker)))
    assert not answers(died)
    assert s.handle(E.Reported("", [P.Called(calls[other].request, None, None)])) == [] and not s.asking.calls


def test_a_tasks_run_on_an_unknown_worker_is_refused_and_wait_false_is_not_answered():
    from localcluster.wire.serialize import loads_exception
    s = sched("w1")
    s.handle(E.Submit([spec("a")]))
    a = s.tasks["a"]
    [answer] = answers(ask(s, "w1", a.seq, fn_body(("w9",)), request=2))
    assert "no running worker is called 'w9'; the workers are ['w1']" in str(loads_exception(answer.error))
    out = ask(s, "w1", a.seq, fn_body(), request=0)           # run(wait=False)
    [(_, call)] = sends(out, P.Call)
    assert s.handle(E.Reported("", [P.Called(call.request, None, None)])) == [] and not s.asking.calls


def test_cancel_who_has_and_info_from_a_task():
    s = sched("w1", "w2", nthreads=2)
    s.handle(E.Submit([spec("a"), spec("b"), spec("c")]))
    a = s.tasks["a"]
    c_on = s.tasks["c"].worker
    finish(s, "c")
    [who] = answers(ask(s, a.worker, a.seq, P.WhoHas(("c", "b")), request=1))
    assert who.data == {"c": (c_on,), "b": ()}
    ask(s, a.worker, a.seq, P.Secede(1.0, 1))
    [info] = answers(ask(s, a.worker, a.seq, P.Info(), request=2))
    assert info.data == (("w1", 2, {}), ("w2", 2, {})), "threads as started, not counting a seceded run's"
    out = ask(s, a.worker, a.seq, P.CancelKeys(("b",)))
    [resolve] = [r for r in out if getattr(r, "key", None) == "b" and type(r).__name__ == "Resolve"]
    assert resolve.status == "cancelled"
    assert str(resolve.value).startswith(f"Task 'b' was cancelled by task 'a' on {a.worker} (cancel in the task)")
    assert "b" not in s.tasks


def test_a_cancel_drops_the_references_tasks_hold_and_their_later_drop_lets_go_of_nothing():
    """A task on w1 holds a future of ``a``; the client cancels ``a`` (every reference goes)
    and submits it again. The task's Drop, arriving after, must not let go of the new
    submit's one reference."""
    s = sched("w1")
    s.handle(E.Submit([spec("a")]))
    ask(s, "w1", 0, P.Hold(("a",)))
    assert s.tasks["a"].wanted == 2 and s.asking.holds["w1"]["a"][0] == 1
    s.handle(E.CancelKeys(["a"]))
    assert "w1" not in s.asking.holds
    s.handle(E.Submit([spec("a")]))
    ask(s, "w1", 0, P.Drop(("a",)))
    assert s.tasks["a"].wanted == 1 and s.tasks["a"].state != "released"
