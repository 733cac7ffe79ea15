"""Lock, Semaphore, Event, Queue and Variable (dask's coordination primitives), held by the
scheduler: first the pure scheduler (no processes; every invariant checked after every
event), then through real worker processes, where the tasks measure what they saw."""
from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from _util import block_until, release, stop_session, wait_for
from test_resources import counted, text
from test_scheduler import Checked, death, died, fail, finish, running, sends, spec

from localcluster import Client, Event, KilledWorker, LocalCluster, Lock, Queue, Semaphore, Variable
from localcluster.scheduler.records import Reply
from localcluster.wire import protocol as P
from localcluster.wire import serialize
from localcluster.cluster import validate
from localcluster.scheduler import events as E

# --- the pure scheduler -----------------------------------------------------------------


def sched(*workers):
    s = Checked()
    for w in workers:
        s.handle(E.AddWorker(w, 2))
    return s


def ask(s, worker, request, body, seq=0):
    """A task's request: the answers it gets now, {request: data}."""
    return answers(s.handle(E.Asked(worker, [P.Ask(request, seq, body)])))


def answers(actions, worker=None):
    """{request: data} of the Answers to tasks (of ``worker``'s only, if given), and
    {("parent", request): value} of the Replies to the parent (when no worker is given)."""
    out = {m.request: m.data for _w, m in sends(actions, P.Answer, worker)}
    if worker is None:
        out.update({("parent", a.request): a.value for a in actions if isinstance(a, Reply)})
    return out


def acquire(name, lease, n=1, wait=True, kind="semaphore"):
    return P.Acquire(kind, name, lease, n, wait)


def test_leases_are_granted_in_order_and_a_release_hands_the_next_one_on():
    s = sched("w1", "w2")
    assert ask(s, "w1", 1, acquire("s", "a", 2)) == {1: True}
    assert ask(s, "w2", 1, acquire("s", "b", 2)) == {1: True}
    assert ask(s, "w2", 2, acquire("s", "c", 2)) == {}          # waits
    assert ask(s, "w1", 2, acquire("s", "d", 2)) == {}          # waits behind c
    assert ask(s, "w1", 3, acquire("s", "e", 2, wait=False)) == {3: False}
    assert ask(s, "w1", 4, P.Leases("semaphore", "s")) == {4: 2}
    out = s.handle(E.Asked("w1", [P.Ask(5, 0, P.Release("semaphore", "s", "a"))]))
    assert answers(out, "w1") == {5: True} and answers(out, "w2") == {2: True}     # c, first in line
    assert ask(s, "w1", 6, P.Release("semaphore", "s", "a")) == {6: False}          # not held any more
    assert ask(s, "w1", 7, P.Release("semaphore", "s", "b")) == {7: True, 2: True}  # d's turn


def test_a_new_request_waits_behind_those_already_waiting():
    s = sched("w1")
    ask(s, "w1", 1, acquire("L", "a", kind="lock"))
    ask(s, "w1", 2, acquire("L", "b", kind="lock"))
    assert ask(s, "w1", 3, P.Release("lock", "L", "a")) == {3: True, 2: True}
    assert ask(s, "w1", 4, acquire("L", "c", kind="lock", wait=False)) == {4: False}


def test_a_lock_and_a_semaphore_of_one_name_are_two_things_and_max_leases_must_agree():
    s = sched("w1")
    assert ask(s, "w1", 1, acquire("x", "a", kind="lock")) == {1: True}
    assert ask(s, "w1", 2, acquire("x", "b", 3)) == {2: True}
    answer = ask(s, "w1", 3, acquire("x", "c", 2))[3]
    assert isinstance(answer, ValueError) and "max_leases=3" in str(answer) and "max_leases=2" in str(answer)


def test_a_withdrawn_request_is_answered_with_what_a_timeout_means_and_only_once():
    s = sched("w1")
    ask(s, "w1", 1, acquire("L", "a", kind="lock"))
    assert ask(s, "w1", 2, acquire("L", "b", kind="lock")) == {}
    assert ask(s, "w1", 0, P.Withdraw(2)) == {2: False}
    assert ask(s, "w1", 0, P.Withdraw(2)) == {}                 # answered already: not twice
    assert ask(s, "w1", 3, P.Release("lock", "L", "a")) == {3: True}    # nobody is left to grant
    assert not s.coordination.semaphores
    # a request answered before its withdrawal arrives is not answered again
    ask(s, "w1", 4, P.WaitEvent("e"))
    assert answers(E.opened(s.handle(E.Coordinate(P.SetEvent("e", True))))[1], "w1") == {4: True}
    assert ask(s, "w1", 0, P.Withdraw(4)) == {}


def test_the_parent_asks_and_is_answered_with_replies():
    s = sched("w1")
    req, out = E.opened(s.handle(E.Coordinate(acquire("L", "p", kind="lock"))))
    assert answers(out) == {("parent", req): True}
    req2, out = E.opened(s.handle(E.Coordinate(acquire("L", "q", kind="lock"))))
    assert answers(out) == {}
    assert answers(s.handle(E.Withdraw(req2))) == {("parent", req2): False}
    assert ask(s, "w1", 1, acquire("L", "t", kind="lock")) == {}
    _, out = E.opened(s.handle(E.Coordinate(P.Release("lock", "L", "p"))))
    assert answers(out, "w1") == {1: True}


def test_an_event_wakes_every_waiter_and_clear_makes_them_wait_again():
    s = sched("w1", "w2")
    assert ask(s, "w1", 1, P.WaitEvent("e")) == {}
    assert ask(s, "w2", 1, P.WaitEvent("e")) == {}
    assert ask(s, "w2", 2, P.WaitEvent("e", False)) == {2: False}
    out = E.opened(s.handle(E.Coordinate(P.SetEvent("e", True))))[1]
    assert answers(out, "w1") == {1: True} and answers(out, "w2") == {1: True}
    assert ask(s, "w1", 3, P.WaitEvent("e")) == {3: True}
    E.opened(s.handle(E.Coordinate(P.SetEvent("e", False))))
    assert ask(s, "w1", 4, P.WaitEvent("e")) == {}
    assert ask(s, "w1", 0, P.Withdraw(4)) == {4: False}
    assert not s.coordination.events          # down with no waiter: nothing kept


def item(value, *keys):
    return serialize.dumps(value), keys


def test_a_queue_is_first_in_first_out_and_bounded_by_maxsize():
    s = sched("w1")
    for i in range(2):
        assert ask(s, "w1", 10 + i, P.QueuePut("q", *item(i), maxsize=2)) == {10 + i: True}
    assert ask(s, "w1", 12, P.QueuePut("q", *item(2), maxsize=2)) == {}        # full: waits
    assert ask(s, "w1", 13, P.QueueSize("q")) == {13: 2}
    got = ask(s, "w1", 14, P.QueueGet("q"))
    assert [serialize.loads(p) for p, _k in got[14]] == [0] and got[12] is True    # room: the put went in
    got = ask(s, "w1", 15, P.QueueGet("q", -1))
    assert [serialize.loads(p) for p, _k in got[15]] == [1, 2]
    assert ask(s, "w1", 16, P.QueueGet("q", -1)) == {16: ()}
    assert ask(s, "w1", 17, P.QueueGet("q", 2)) == {}                          # a batch of 2 waits for both
    assert ask(s, "w1", 18, P.QueuePut("q", *item(3))) == {18: True}
    got = ask(s, "w1", 19, P.QueuePut("q", *item(4)))
    assert got[19] is True and [serialize.loads(p) for p, _k in got[17]] == [3, 4]
    assert not s.coordination.queues


def test_a_withdrawn_put_lets_its_futures_go_and_a_withdrawn_get_takes_nothing():
    s = sched("w1")
    s.handle(E.Submit([spec("a")]))
    finish(s, "a")
    ask(s, "w1", 1, P.QueuePut("q", *item(0), maxsize=1))
    ask(s, "w1", 2, P.QueuePut("q", *item("future", "a"), maxsize=1))
    assert s.tasks["a"].wanted == 2
    assert ask(s, "w1", 0, P.Withdraw(2)) == {2: False}
    assert s.tasks["a"].wanted == 1
    ask(s, "w1", 3, P.QueueGet("q"))
    assert ask(s, "w1", 4, P.QueueGet("q")) == {}
    assert ask(s, "w1", 0, P.Withdraw(4)) == {4: None}


def test_futures_in_a_queued_value_are_held_while_queued_and_handed_to_the_task_that_takes_it():
    s = sched("w1", "w2")
    s.handle(E.Submit([spec("a")]))
    finish(s, "a")
    ask(s, "w1", 1, P.QueuePut("q", *item("future", "a")))
    s.handle(E.Drop(["a"]))                            # the client's future is gone: the queue keeps it
    assert "a" in s.tasks and s.tasks["a"].wanted == 1
    got = ask(s, "w2", 2, P.QueueGet("q"))
    assert got[2][0][1] == ("a",)
    assert s.asking.holds["w2"]["a"][0] == 1      # the reference is w2's now
    s.handle(E.Asked("w2", [P.Ask(0, 0, P.Hold(("a",))), P.Ask(0, 0, P.Drop(("a",)))]))   # its own, then the handed one back
    assert s.tasks["a"].wanted == 1
    s.handle(E.Asked("w2", [P.Ask(0, 0, P.Drop(("a",)))]))
    assert "a" not in s.tasks


def test_a_future_cancelled_while_queued_is_not_let_go_of_twice():
    """Found by the state machine: a cancel drops every reference to a key, the queue's too;
    the key submitted again is another task, whose one reference (the client's) stays."""
    s = sched("w1")
    s.handle(E.Submit([spec("a")]))                   # pending: a cancel drops it for everyone
    ask(s, "w1", 1, P.QueuePut("q", *item("future", "a")))
    s.handle(E.CancelKeys(["a"]))
    s.handle(E.Submit([spec("a")]))
    assert ask(s, "w1", 2, P.QueueGet("q"))[2][0][1] == ()
    assert s.tasks["a"].wanted == 1
    E.opened(s.handle(E.Coordinate(P.SetVariable("v", *item("future", "a")))))
    s.handle(E.CancelKeys(["a"]))
    s.handle(E.Submit([spec("a")]))
    E.opened(s.handle(E.Coordinate(P.SetVariable("v", None))))
    assert s.tasks["a"].wanted == 1


def test_a_future_cancelled_while_queued_whose_task_an_erred_dependent_keeps_is_no_reference_any_more():
    """Found by the state machine in a loaded run: a cancelled task that a dependent still
    links to stays as a released record, the very Task the queue's token names, and a new
    dependent runs that Task again. The token counts no more (the cancel dropped every
    reference): nothing is handed over or let go of for it."""
    s = sched("w1", "w2")
    s.handle(E.Submit([spec("a")]))
    finish(s, "a")
    s.handle(E.Submit([spec("d", "a")]))
    assert s.tasks["d"].worker in s.tasks["a"].who_has      # a is there: no transfer
    fail(s, "d")
    ask(s, "w1", 1, P.QueuePut("q", *item("future", "a")))
    assert s.tasks["a"].wanted == 2                 # the client's and the queue's
    where = next(iter(s.tasks["a"].who_has))
    died(s, death(where), {})                       # a is lost, and wanted: it runs again
    assert s.tasks["a"].state in ("waiting", "ready", "processing")
    s.handle(E.CancelKeys(["a"]))                                 # validate() runs after it (Checked)
    kept = s.tasks["a"]
    assert kept.state == "released" and kept.wanted == 0 and "d" in s.tasks
    s.handle(E.Submit([spec("e", "a")]))                      # a runs again, the same Task, for e
    assert s.tasks["a"] is kept and kept.state != "released" and kept.wanted == 0
    assert ask(s, "w1", 2, P.QueueGet("q"))[2][0][1] == ()
    assert kept.wanted == 0 and s.tasks["e"].wanted == 1


def test_a_variable_keeps_its_futures_until_set_again_or_deleted_and_wakes_its_waiters():
    s = sched("w1")
    s.handle(E.Submit([spec("a"), spec("b")]))
    finish(s, "a")
    finish(s, "b")
    assert ask(s, "w1", 1, P.GetVariable("v")) == {}
    req, out = E.opened(s.handle(E.Coordinate(P.SetVariable("v", *item("future", "a")))))
    assert answers(out)[("parent", req)] is None and answers(out, "w1")[1][1] == ("a",)
    assert s.tasks["a"].wanted == 3        # the client's, the variable's, the one handed to w1
    s.handle(E.Drop(["a"]))
    s.handle(E.Asked("w1", [P.Ask(0, 0, P.Drop(("a",)))]))
    E.opened(s.handle(E.Coordinate(P.SetVariable("v", *item("future", "b")))))
    assert "a" not in s.tasks and s.tasks["b"].wanted == 2
    E.opened(s.handle(E.Coordinate(P.SetVariable("v", None))))
    assert s.tasks["b"].wanted == 1 and not s.coordination.variables
    assert ask(s, "w1", 2, P.GetVariable("v")) == {}
    assert ask(s, "w1", 0, P.Withdraw(2)) == {2: None}


def test_a_death_gives_back_the_leases_of_its_tasks_and_forgets_what_they_waited_for():
    s = sched("w1", "w2")
    s.handle(E.Submit([spec("t")]))
    seq = s.tasks["t"].seq
    worker = s.tasks["t"].worker
    other = "w2" if worker == "w1" else "w1"
    ask(s, worker, 1, acquire("L", "a", kind="lock"), seq)
    ask(s, worker, 2, acquire("s", "b", 1), seq)
    ask(s, worker, 3, P.WaitEvent("e"), seq)
    ask(s, worker, 4, P.QueuePut("q", *item(1), maxsize=1), seq)
    ask(s, worker, 5, P.QueuePut("q", *item(2), maxsize=1), seq)
    assert ask(s, other, 1, acquire("L", "x", kind="lock")) == {}
    assert s.coordination.held_by(worker) == (
        "Its tasks held Lock 'L', Semaphore 's' (1 of 1 leases): released with the death, so that the tasks "
        "waiting for them go on.")
    assert s.coordination.held_by(other) is None
    out = died(s, death(worker), running(s, "t"))
    assert answers(out, other) == {1: True}
    assert ("semaphore", "s") not in s.coordination.semaphores and not s.coordination.events
    assert len(s.coordination.queues["q"].items) == 1 and not s.coordination.queues["q"].putters


def test_a_restart_gives_back_the_tasks_leases_to_the_parent_that_waits():
    s = sched("w1")
    ask(s, "w1", 1, acquire("L", "a", kind="lock"))
    req, out = E.opened(s.handle(E.Coordinate(acquire("L", "p", kind="lock"))))
    assert answers(out) == {}
    assert answers(s.handle(E.Clear(RuntimeError("restart")))) == {("parent", req): True}


def test_a_restart_grants_nothing_to_the_tasks_it_forgets():
    """The tasks of every worker go at once: a lease one of them frees, or an item, never goes
    to a request of another (the hypothesis machine found a Lock granted so, to a task that
    the restart forgets)."""
    s = sched("w1", "w2")
    ask(s, "w1", 1, acquire("L", "a", kind="lock"))
    assert ask(s, "w2", 1, acquire("L", "b", kind="lock")) == {}          # w2's task waits for w1's
    ask(s, "w1", 2, P.QueuePut("q", *item(1)))
    assert ask(s, "w1", 3, P.QueueGet("q", 2)) == {}                       # a batch of 2: waits
    assert ask(s, "w2", 2, P.QueueGet("q", 1)) == {}                       # behind it
    req, out = E.opened(s.handle(E.Coordinate(acquire("L", "p", kind="lock"))))
    out = s.handle(E.Clear(RuntimeError("restart")))
    assert answers(out) == {("parent", req): True}                         # the parent's turn; no task's
    assert s.coordination.waits == {}


def test_a_death_hands_a_queued_item_on_to_the_next_task_waiting():
    s = sched("w1", "w2")
    ask(s, "w1", 1, P.QueuePut("q", *item(1)))
    assert ask(s, "w1", 2, P.QueueGet("q", 2)) == {}
    assert ask(s, "w2", 1, P.QueueGet("q", 1)) == {}
    got = answers(died(s, death("w1"), {}), "w2")
    assert list(got) == [1] and [serialize.loads(p) for p, _keys in got[1]] == [1]


def test_bad_requests_break_nothing():
    s = sched("w1")
    with pytest.raises(TypeError):
        s.coordination.asked(None, P.Secede())


# --- through real worker processes ---------------------------------------------------------

def locked_count(path, i, name="L"):
    with Lock(name):
        return counted(path, i, 0.05)


@pytest.mark.slow
def test_a_lock_lets_one_task_at_a_time_in_across_workers(tmp_path):
    path = str(tmp_path / "count")
    with LocalCluster(n_workers=2, threads_per_worker=2) as cluster, Client(cluster) as client:
        assert client.gather(client.map(locked_count, [path] * 8, range(8))) == list(range(8))
        assert text(path) == "0 1"          # never two at once, measured by the tasks
        validate(cluster)


def try_lock(name, timeout):
    started = time.monotonic()
    got = Lock(name).acquire(timeout=timeout)
    return got, time.monotonic() - started


@pytest.mark.slow
def test_a_lock_held_by_the_user_times_a_task_out_and_then_lets_it_in(client):
    lock = Lock("held-by-parent")
    assert lock.acquire() and lock.locked()
    got, waited = client.submit(try_lock, "held-by-parent", 0.3, pure=False).result(timeout=30)
    assert got is False and waited >= 0.29
    assert Lock("held-by-parent").acquire(blocking=False) is False
    fut = client.submit(try_lock, "held-by-parent", None, pure=False)
    lock.release()
    assert fut.result(timeout=30)[0] is True
    assert Lock("held-by-parent").locked()      # the task took it and never let go (dask's meaning)


def pid_holding(name, marker, go):
    lock = Lock(name)
    lock.acquire()
    release(marker + ".pid.tmp")
    with open(marker, "w") as f:
        f.write(str(os.getpid()))
    block_until(go, timeout=120)
    return "never"


def test_a_lock_held_by_a_task_whose_worker_is_killed_is_released_and_the_death_says_so(tmp_path):
    marker, go = str(tmp_path / "pid"), str(tmp_path / "go")
    with LocalCluster(n_workers=1, allowed_failures=0) as cluster, Client(cluster) as client:
        fut = client.submit(pid_holding, "dying", marker, go)
        wait_for(lambda: os.path.exists(marker) and os.path.getsize(marker) > 0)
        assert Lock("dying").locked()
        waiter = threading.Thread(target=lambda: results.append(Lock("dying").acquire(timeout=60)))
        results: list = []
        waiter.start()
        os.kill(int(text(marker)), signal.SIGKILL)
        with pytest.raises(KilledWorker) as info:
            fut.result(timeout=60)
        waiter.join(60)
        assert results == [True]                # the parent's waiter got the lock the dead task held
        message = info.value.deaths[0].message
        assert message == cluster.deaths[-1].message and "killed from outside by SIGKILL" in message
        assert "Its tasks held Lock 'dying': released with the death, so that the tasks waiting for them go on." \
            in message
        validate(cluster)


def sem_count(path, i):
    with Semaphore(2, name="two"):
        return counted(path, i, 0.2)


@pytest.mark.slow
def test_a_semaphore_lets_at_most_max_leases_tasks_in(tmp_path):
    path = str(tmp_path / "count")
    with LocalCluster(n_workers=2, threads_per_worker=3) as cluster, Client(cluster) as client:
        assert client.gather(client.map(sem_count, [path] * 6, range(6))) == list(range(6))
        assert text(path) == "0 2"
        assert Semaphore(2, name="two").get_value() == 0


def wait_event(name, timeout):
    return Event(name).wait(timeout)


@pytest.mark.cluster(n_workers=1, threads_per_worker=4)
@pytest.mark.slow
def test_an_event_set_by_the_user_wakes_every_task_waiting_and_a_timeout_says_false(client):
    event = Event("go")
    waiting = client.map(wait_event, ["go"] * 3, [60] * 3, pure=False)
    assert client.submit(wait_event, "never", 0.2, pure=False).result(timeout=30) is False
    assert not event.is_set() and not any(f.done() for f in waiting)
    event.set()
    assert client.gather(waiting) == [True] * 3 and event.is_set()
    event.clear()
    assert event.wait(timeout=0) is False and Event("go").wait("10ms") is False


def produce(name, i):
    Queue(name).put(i * i)
    return i


def consume(name, n):
    q = Queue(name)
    return [q.get(timeout=30) for _ in range(n)]


@pytest.mark.slow
def test_a_queue_carries_values_between_tasks_and_the_user(client):
    assert client.gather(client.map(produce, ["q1"] * 4, range(4))) == [0, 1, 2, 3]
    q = Queue("q1")
    assert q.qsize() == 4 and sorted(q.get(batch=True)) == [0, 1, 4, 9] and q.get(batch=True) == []
    consumer = client.submit(consume, "q2", 3, pure=False)
    for value in ("a", {"b": 1}, [3]):
        Queue("q2").put(value)
    assert consumer.result(timeout=30) == ["a", {"b": 1}, [3]]
    with pytest.raises(TimeoutError, match="had not a value within 0.2 s"):
        q.get(timeout=0.2)
    bounded = Queue("q3", maxsize=1)
    bounded.put(1)
    with pytest.raises(TimeoutError, match=r"stayed full \(maxsize=1\)"):
        bounded.put(2, timeout="100ms")
    assert bounded.get(batch=1) == [1] and bounded.qsize() == 0


def make_and_share(name):
    from localcluster import get_client
    fut = get_client().submit(pow, 2, 10)
    Variable(name).set(fut)
    return fut.key


def read_shared(name):
    return Variable(name).get(timeout=30).result()


@pytest.mark.slow
def test_futures_in_a_variable_and_a_queue_live_as_long_as_they_are_there(client, cluster):
    key = client.submit(make_and_share, "shared", pure=False).result(timeout=30)
    gc.collect()
    assert client.submit(read_shared, "shared", pure=False).result(timeout=30) == 1024
    fut = Variable("shared").get(timeout=30)
    assert fut.key == key and fut.result(timeout=30) == 1024
    q = Queue("futures")
    mine = client.submit(lambda: "kept", pure=False)
    mine_key = mine.key
    q.put({"nested": [mine]})
    del mine, fut
    gc.collect()
    got = q.get(timeout=30)["nested"][0]
    assert got.key == mine_key and got.result(timeout=30) == "kept"
    Variable("shared").delete()
    with pytest.raises(TimeoutError, match="was not set within"):
        Variable("shared").get(timeout=0.1)
    validate(cluster)


def lock_arg(lock):
    with lock:
        return lock.name


@pytest.mark.slow
def test_the_objects_pickle_by_name_into_tasks(client):
    assert client.submit(lock_arg, Lock("by-name")).result(timeout=30) == "by-name"
    sem = Semaphore(3, name="three")
    assert client.submit(lambda s: (s.name, s.max_leases), sem).result(timeout=30) == ("three", 3)
    q = Queue("qq", maxsize=5)
    assert client.submit(lambda q: (q.name, q.maxsize), q).result(timeout=30) == ("qq", 5)


def hammer(n=50):
    """Take and give back the lock ``race`` n times, each wait 1 ms at most: how many it got."""
    lock, got = Lock("race"), 0
    for _ in range(n):
        if lock.acquire(timeout=0.001):
            got += 1
            lock.release()
    return got


@pytest.mark.slow
def test_timeouts_under_contention_leave_no_lease_behind(client, cluster):
    """Short waits racing the releases, from tasks and the user's threads: each request is
    answered once, and every lease is given back (validate() checks the index of waiting
    requests, at the end and after every event in the pure tests)."""
    tasks = client.map(hammer, [50] * 2, pure=False)
    got: list = []
    threads = [threading.Thread(target=lambda: got.append(hammer())) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    got += client.gather(tasks)
    assert len(got) == 5 and all(got) and Lock("race").get_value() == 0
    validate(cluster)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match=r"Semaphore\(max_leases=0\): expected an integer >= 1"):
        Semaphore(0)
    with pytest.raises(TypeError, match=r"Lock\(name=3\)"):
        Lock(3)
    with pytest.raises(ValueError, match=r"Queue\(maxsize=-1\)"):
        Queue("q", maxsize=-1)
    with pytest.raises(RuntimeError, match="needs a running cluster: create a localcluster Client"):
        Lock("nobody").acquire()
    with pytest.raises(RuntimeError, match="released too often"):
        Lock("x").release()


def test_bad_timeouts_and_mismatched_leases_are_named(client):
    with pytest.raises(ValueError, match=r"Lock.acquire\(timeout=-1\)"):
        Lock("t").acquire(timeout=-1)
    with pytest.raises(ValueError, match="non-blocking call takes no timeout"):
        Lock("t").acquire(blocking=False, timeout=1)
    with pytest.raises(ValueError, match=r"Event.wait\(timeout='soon'\)"):
        Event("t").wait("soon")
    two = Semaphore(2, name="m")
    assert two.acquire()
    with pytest.raises(ValueError, match="exists with max_leases=2; this one asks max_leases=3"):
        Semaphore(3, name="m").acquire()
    two.release()


CTRL_C = '''
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
from localcluster import Client, LocalCluster, Lock

def hold(marker):
    with Lock("L"):
        while not os.path.exists(marker):
            time.sleep(0.01)

marker = sys.argv[1]
with LocalCluster(n_workers=1, forward_logs=False) as cluster, Client(cluster) as client:
    holder = client.submit(hold, marker)
    while not Lock("L").locked():
        time.sleep(0.01)
    try:
        print("go", flush=True)
        Lock("L").acquire()
        print("acquired", flush=True)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    open(marker, "w").close()
    holder.result(30)
    print("free", Lock("L").acquire(timeout=10), flush=True)
'''


@pytest.mark.slow
def test_ctrl_c_while_waiting_for_a_lock_leaves_no_lease_granted_to_nobody(tmp_path):
    """The interrupted request is withdrawn: when the task lets the lock go, it is free
    (not granted to the interrupted wait, which would block everyone for good)."""
    from test_ctrl_c import _main_thread
    script = tmp_path / "ctrl_c_lock.py"
    script.write_text(CTRL_C)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "marker")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "go"
        wait_for(lambda: _main_thread(proc.pid)[0] == "S")
        os.kill(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        stop_session(proc)
    assert proc.returncode == 0, err
    assert out.split("\n")[:2] == ["interrupted", "free True"], (out, err)
