"""The scheduler as a pure state machine: events in, actions out. No processes, no sleeps."""
from __future__ import annotations

import dataclasses
import functools
import inspect
import pickle

import pytest

from concurrent.futures import CancelledError

from localcluster.wire import protocol as P
from localcluster.wire import serialize
from localcluster.death import KilledWorker, LostDataError, TaskTimeoutError, WorkerDeath, signal_name
from localcluster.scheduler.records import FailAll, Spec, Task
from localcluster.death import blamed_runs
from localcluster.scheduler.state import Deliver, Resolve, Retire, Scheduler, Send
from localcluster.wire.serialize import dumps
from localcluster.scheduler import events as E

ARGS = dumps(((), {}))
BIG = 1 << 20           # a result that stays on its worker
ERR = b"pickled error"


# --- helpers ---------------------------------------------------------------------------

def spec(key, *deps, priority=0, retries=0, timeout=None, fn_id=1, workers=None, loose=False, resources=None):
    return Spec(key, fn_id, b"fn-bytes", ARGS, tuple(deps), priority, retries, timeout,
                frozenset(workers) if workers else None, loose, resources)


def death(worker, cause="signal", exitcode=-9):
    return WorkerDeath(worker=worker, pid=1234, cause=cause, exitcode=exitcode,
                       signal=signal_name(-exitcode) if exitcode is not None and exitcode < 0 else None)


def scatter(s, key, workers, small=False):
    """Scatter to exactly these workers: (payload, actions). Large data keeps no copy in the parent."""
    payload = dumps(2 if small else b"x" * (P.INLINE_RESULT + 1))
    return payload, s.handle(E.Scatter([(key, payload)], frozenset(workers), broadcast=True))


class Checked(Scheduler):
    """The Scheduler, with every invariant checked after every public call (``validate``).
    Built by introspection, not from a list: a new event is checked the day it is added."""

    _depth = 0      # an event calling another through self is checked once, at its end

    def validate(self) -> None:
        # a query validate() makes (the story of a broken rule's key) checks nothing again
        self._depth += 1
        try:
            Scheduler.validate(self)
        finally:
            self._depth -= 1


def _checked(event):
    @functools.wraps(event)
    def run(self, *args, **kwargs):
        self._depth += 1
        try:
            out = event(self, *args, **kwargs)
        finally:
            self._depth -= 1
        if not self._depth:
            self.validate()
        return out
    run.checked = True
    return run


def public_methods(cls) -> list:
    """Every public method of ``cls`` (its own and inherited) but validate itself."""
    return [name for name, _ in inspect.getmembers(cls, inspect.isfunction)
            if not name.startswith("_") and name != "validate"]


for _name in public_methods(Scheduler):
    setattr(Checked, _name, _checked(getattr(Scheduler, _name)))


def sched(*workers, nthreads=1, allowed_failures=3):
    s = Checked(allowed_failures)
    for w in workers:
        s.handle(E.AddWorker(w, nthreads))
    return s


def sends(actions, kind=None, worker=None):
    """[(worker, msg)] of the Send actions, optionally of one message type / to one worker."""
    return [(a.worker, a.msg) for a in actions if isinstance(a, Send)
            and (kind is None or isinstance(a.msg, kind)) and (worker is None or a.worker == worker)]


def runs(actions):
    """Run messages in order: [(key, worker)]."""
    return [(m.key, w) for w, m in sends(actions, P.Run)]


def resolves(actions):
    return {a.key: a for a in actions if isinstance(a, Resolve)}


def delivers(actions):
    return [a for a in actions if isinstance(a, Deliver)]


def finish(s, key, data=None, nbytes=BIG, duration=0.005):
    ts = s.tasks[key]
    return s.handle(E.Reported(ts.worker, [P.Finished(ts.seq, nbytes, "int", data, duration)]))

def b_needs_a_from_w1():
    """``a`` finished on w1, w1 paused, then ``b(a)`` submitted: b must run on w2."""
    s = sched("w1", "w2")
    s.handle(E.Submit([spec("a")]))
    finish(s, "a")
    s.handle(E.SetPaused("w1", True))
    return s, s.handle(E.Submit([spec("b", "a")]))



def fail(s, key, error=ERR):
    ts = s.tasks[key]
    return s.handle(E.Reported(ts.worker, [P.Failed(ts.seq, error)]))


def running(s, *keys):
    """The ``running`` board for worker_died: seq -> (thread id, start time)."""
    return {s.tasks[k].seq: (i, 0.0) for i, k in enumerate(keys)}


def died(s, d, board, crashed_seq=None, timed_out=None):
    """As the supervisor does it: the scheduler names the blamed keys, the death records
    them, and the scheduler hears of the death."""
    blamed = s.blame(d.cause, board, crashed_seq, timed_out[0] if timed_out else None)
    return s.handle(E.WorkerDied(dataclasses.replace(d, blamed=blamed), timed_out))


# --- submission and assignment ---------------------------------------------------------

def test_checked_validates_after_every_public_method_of_the_scheduler(monkeypatch):
    """No event escapes ``Checked``: the door (``handle``) and every query of Scheduler, found
    by introspection, run validate() once after them; a handle of several events once."""
    methods = public_methods(Scheduler)
    assert "handle" in methods
    assert [name for name in methods if not getattr(getattr(Checked, name), "checked", False)] == []
    s = sched("w1")
    s.handle(E.Submit([spec("a")]))
    calls = []
    monkeypatch.setattr(s, "validate", lambda: calls.append(1))
    s.handle(E.Drop(["a"]))
    assert calls == [1]
    monkeypatch.undo()
    s.gone.add("w1")            # a live worker also listed as dead: broken
    with pytest.raises(AssertionError, match="w1 is both live and gone"):
        s.knows("a")            # even a query finds it


def test_the_door_is_one_table_from_every_event_class_and_nothing_else_changes_the_state():
    """Every event class of events.py has its handler in ``HANDLERS``, and the only public
    method of Scheduler that changes its state is ``handle``: the others are queries (each
    leaves ``validate`` and the transitions as they were)."""
    from localcluster.scheduler import state
    classes = {c for c in vars(E).values() if isinstance(c, type) and c.__module__ == E.__name__}
    assert classes - {E.Opened} == set(state.HANDLERS)
    for cls in state.HANDLERS:
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen, cls
    s = sched("w1", "w2")
    s.handle(E.Submit([spec("a"), spec("b", "a")]), E.Submit([spec("c")]))
    finish(s, "a")
    mark = s.transitions.since(None)[1]
    before = {k: (ts.state, set(ts.who_has), ts.wanted) for k, ts in s.tasks.items()}
    seq = s.tasks["c"].seq
    asked = (s.who_has(), s.whereabouts("b"), s.demand(10), s.data_only_on_workers(), s.load("w1"), s.processing_on("w2"),
             s.death_notes("w1"), s.backlogged("w1"), s.key_of(seq), s.spec_of("a"), s.run_ending("c", True),
             s.blame("signal", {seq: (1, 0.0)}, None, None), s.timeout_of(seq), s.worker_of("c"),
             s.unsatisfiable("d", ()), s.off_board("w1"), s.seceding(), s.died("w1"), s.story("a"),
             s.key_states(), s.progress(), s.has_tasks(), s.args_of("b"), s.runs_sent(), s.oldest_pending({}),
             s.open_workers(), s.transitions_of("a"), s.nbytes(), s.dump())
    assert asked[-10][1] == [s.tasks[k].state for k in asked[-10][0]] and asked[-9][0] == 2
    assert asked[-5] == ({"processing": 2}, ("b", "processing", {}, None)) and asked[-4] == ["w1", "w2"]
    assert asked[0] == {"a": tuple(s.tasks["a"].who_has), "b": (), "c": ()} and asked[4] is not None
    assert s.transitions.since(mark)[0] == []
    assert before == {k: (ts.state, set(ts.who_has), ts.wanted) for k, ts in s.tasks.items()}


def test_several_events_through_the_door_place_once_at_the_end():
    """``handle(*events)``: placement runs once, after the last (as a burst of submits
    deferred by the dispatcher is admitted): both tasks go out in one pass."""
    s = sched("w1", nthreads=2)
    acts = s.handle(E.Submit([spec("a")]), E.Submit([spec("b")]))
    assert runs(acts) == [("a", "w1"), ("b", "w1")]
    req, rest = E.opened(s.handle(E.Fetch("a")))
    assert req > 0 and all(type(a) is not E.Opened for a in rest)


def test_task_waits_for_a_worker():
    s = Checked()
    assert runs(s.handle(E.Submit([spec("a")]))) == []
    assert s.tasks["a"].state == "ready"
    assert runs(s.handle(E.AddWorker("w1", 1))) == [("a", "w1")]
    assert s.tasks["a"].state == "processing"


def test_run_message_carries_the_task_and_sends_the_function_once_per_worker():
    s = sched("w1")
    acts = s.handle(E.Submit([spec("a"), spec("b")]))
    (_, ra), (_, rb) = sends(acts, P.Run)
    assert (ra.key, ra.fn_id, ra.fn, ra.args, ra.deps) == ("a", 1, b"fn-bytes", ARGS, ())
    assert rb.fn is None and rb.fn_id == 1
    assert ra.seq != rb.seq


def test_capacity_limits_and_balance_across_two_workers():
    s = sched("w1", "w2")
    acts = s.handle(E.Submit([spec(f"t{i}") for i in range(10)]))
    placed = runs(acts)
    assert len(placed) == 6                                     # 1 thread + 2 prefetch each
    assert [w for _, w in placed] == ["w1", "w2"] * 3
    assert sum(ts.state == "ready" for ts in s.tasks.values()) == 4
    more = runs(finish(s, "t0"))
    assert more == [("t6", "w1")]


def test_capacity_scales_with_threads():
    s = sched("w1", nthreads=2)
    assert len(runs(s.handle(E.Submit([spec(f"t{i}") for i in range(10)])))) == 6


def test_priority_order():
    s = Checked()
    s.handle(E.Submit([spec("low", priority=0), spec("high", priority=5), spec("mid", priority=1),
              spec("low2", priority=0)]))
    assert [k for k, _ in runs(s.handle(E.AddWorker("w1", 1)))] == ["high", "mid", "low"]


def test_fifo_among_equal_priority():
    s = Checked()
    s.handle(E.Submit([spec(k) for k in "edcba"]))
    assert [k for k, _ in runs(s.handle(E.AddWorker("w1", 1)))] == ["e", "d", "c"]


# --- dependencies ----------------------------------------------------------------------

def test_task_waits_for_its_dependency_and_runs_where_the_data_is():
    s = sched("w1", "w2")
    assert runs(s.handle(E.Submit([spec("a"), spec("b", "a")]))) == [("a", "w1")]
    assert s.tasks["b"].state == "waiting"
    acts = finish(s, "a")
    assert runs(acts) == [("b", "w1")]
    assert not sends(acts, P.Export) and not sends(acts, P.Put)


def test_dependency_on_other_worker_is_relayed():
    s = sched("w1", "w2")
    assert runs(s.handle(E.Submit([spec("a"), spec("c")]))) == [("a", "w1"), ("c", "w2")]
    finish(s, "a", nbytes=BIG)
    finish(s, "c", nbytes=1000)
    acts = s.handle(E.Submit([spec("b", "a", "c"), spec("b2", "a", "c")]))
    assert runs(acts) == [("b", "w1"), ("b2", "w1")]           # where most of the input is
    exports = sends(acts, P.Export)
    assert len(exports) == 1                                      # one relay for both
    holder, exp = exports[0]
    assert holder == "w2" and exp.key == "c"
    assert exp.locate               # the parent copies it out itself, where it may (wire/vmcopy.py)
    payload = dumps(41)
    acts = s.handle(E.Reported("w2", [P.Data(exp.request, "c", payload, None)]))
    assert sends(acts) == [("w1", P.Put("c", payload, 0, "worker 'w2'"))]
    assert s.tasks["c"].who_has == {"w1", "w2"}


def test_a_relay_answering_after_its_key_was_released_and_submitted_again_is_dropped():
    """Found by the state machine: a retiring worker hands its data on; the key is released
    and submitted again before the relay answers. The late copy must not count as a holder
    of the running task (the invariant 'processing but has data' broke)."""
    s = sched("w1", "w2")
    s.handle(E.Submit([spec("a")]))
    s.handle(E.HandOff("w1"))                                   # 'a' runs there: it stays until it ends
    acts = finish(s, "a", nbytes=BIG)                # its data is handed to w2 first
    (holder, exp), = sends(acts, P.Export)
    assert holder == "w1" and exp.key == "a"
    s.handle(E.Drop(["a"]))
    s.handle(E.Submit([spec("a")]))
    assert s.tasks["a"].state == "processing"
    acts = s.handle(E.Reported("w1", [P.Data(exp.request, "a", dumps(41), None)]))
    assert not sends(acts, P.Put) and s.tasks["a"].who_has == frozenset()


def test_small_result_in_parent_is_put_directly():
    s = sched("w1", "w2")
    s.handle(E.Submit([spec("a")]))
    small = dumps(1)
    finish(s, "a", data=small, nbytes=small.nbytes)
    s.handle(E.SetPaused("w1", True))
    acts = s.handle(E.Submit([spec("b", "a")]))
    assert runs(acts) == [("b", "w2")]
    assert sends(acts, P.Put) == [("w2", P.Put("a", small, 0, "the parent's copy"))]
    assert not sends(acts, P.Export)


def test_relay_error_fails_the_dependent():
    s, acts = b_needs_a_from_w1()
    (_, exp), = sends(acts, P.Export)
    acts = s.handle(E.Reported("w1", [P.Data(exp.request, "a", None, ERR)]))
    seq_b = s.tasks["b"].seq
    assert resolves(acts)["b"].status == "error" and resolves(acts)["b"].value == ERR
    assert sends(acts, P.Cancel) == [("w2", P.Cancel((seq_b,)))]


# --- failures and retries --------------------------------------------------------------

def test_failure_propagates_to_dependents():
    s = sched("w1")
    s.handle(E.Submit([spec("a"), spec("b", "a"), spec("c", "b"), spec("x")]))
    acts = fail(s, "a")
    res = resolves(acts)
    assert set(res) == {"a", "b", "c"}
    assert all(r.status == "error" and r.value == ERR for r in res.values())
    assert s.tasks["x"].state == "processing"


def test_submit_on_erred_dependency_fails_at_once():
    s = sched("w1")
    s.handle(E.Submit([spec("a")]))
    fail(s, "a")
    acts = s.handle(E.Submit([spec("b", "a")]))
    assert resolves(acts)["b"].value == ERR and not runs(acts)


def test_submit_on_unknown_dependency_fails():
    s = sched("w1")
    acts = s.handle(E.Submit([spec("b", "nope")]))
    assert isinstance(resolves(acts)["b"].value, CancelledError)


def test_retries_rerun_then_fail():
    s = sched("w1", "w2")
    s.handle(E.Submit([spec("a", retries=2)]))
    seqs = [s.tasks["a"].seq]
    for _ in range(2):
        acts = fail(s, "a")
        assert not resolves(acts) and len(runs(acts)) == 1
        seqs.append(s.tasks["a"].seq)
    assert len(set(seqs)) == 3
    acts = fail(s, "a")
    assert resolves(acts)["a"].status == "error"


def test_late_message_about_an_old_run_is_ignored():
    s = sched("w1")
    s.handle(E.Submit([spec("a", retries=1)]))
    old = s.tasks["a"].seq
    fail(s, "a")
    acts = s.handle(E.Reported("w1", [P.Finished(old, BIG, "int", None, 0.0)]))
    assert not resolves(acts) and s.tasks["a"].state == "processing"


# --- pure keys: dedup ------------------------------------------------------------------

def test_same_key_twice_shares_state():
    s = sched("w1")
    acts = s.handle(E.Submit([spec("a"), spec("a")]))
    assert runs(acts) == [("a", "w1")]
    assert s.tasks["a"].wanted == 2
    acts = finish(s, "a")
    assert list(resolves(acts)) == ["a"]


def test_same_key_after_done_resolves_at_once():
    s = sched("w1")
    s.handle(E.Submit([spec("a")]))
    small = dumps(3)
    finish(s, "a", data=small, nbytes=small.nbytes)
    acts = s.handle(E.Submit([spec("a")]))
    assert acts == [Resolve("a", "finished", small)]
    s.handle(E.Submit([spec("e")]))
    fail(s, "e")
    assert s.handle(E.Submit([spec("e")])) == [Resolve("e", "error", ERR)]


# --- release and forget ----------------------------------------------------------------

def test_release_frees_data_on_the_worker():
    s = sched("w1")
    s.handle(E.Submit([spec("a")]))
    finish(s, "a")
    assert sends(s.handle(E.Drop(["a"]))) == [("w1", P.Free(("a",)))]
    assert "a" not in s.tasks and "a" not in s.workers["w1"].has


def test_release_waits_for_the_last_reference():
    s = sched("w1")
    s.handle(E.Submit([spec("a"), spec("a")]))
    finish(s, "a")
    assert s.handle(E.Drop(["a"])) == []
    assert sends(s.handle(E.Drop(["a"])), P.Free) == [("w1", P.Free(("a",)))]


def test_a_client_counts_once_in_a_key_it_holds_already():
    """A client lets a key go once, when its last future of it goes: a spec of a key it
    holds already (``again``) adds no reference, and a task made anew counts it once."""
    s = sched("w1")
    s.handle(E.Submit([spec("a"), spec("a")], {"a": 1}))            # map over [x, x]: one reference
    assert s.tasks["a"].wanted == 1
    finish(s, "a")
    acts = s.handle(E.Submit([spec("a")], {"a": 1}))                # one more future of it: resolved at once
    assert list(resolves(acts)) == ["a"] and s.tasks["a"].wanted == 1
    assert list(resolves(s.handle(E.Hold("a", counted=False)))) == ["a"] and s.tasks["a"].wanted == 1
    assert sends(s.handle(E.Drop(["a"])), P.Free) == [("w1", P.Free(("a",)))]
    s.handle(E.Submit([spec("b")], {"b": 1}))                       # its holder's earlier task was forgotten
    assert s.tasks["b"].wanted == 1


def test_release_of_unknown_key_is_harmless():
    assert sched("w1").handle(E.Drop(["nope"])) == []


def test_released_dependency_kept_while_dependent_needs_it():
    s = sched("w1")
    s.handle(E.Submit([spec("a"), spec("b", "a")]))
    finish(s, "a")
    assert s.handle(E.Drop(["a"])) == []                    # b is still running on it
    assert s.tasks["a"].state == "memory" and "a" in s.workers["w1"].has


def test_released_dependency_freed_when_its_last_dependent_finishes():
    s = sched("w1")
    s.handle(E.Submit([spec("a"), spec("b", "a")]))
    finish(s, "a")
    s.handle(E.Drop(["a"]))
    acts = finish(s, "b")
    assert ("w1", P.Free(("a",))) in sends(acts, P.Free)   # nobody needs a any more
    assert sends(s.handle(E.Drop(["b"])), P.Free) == [("w1", P.Free(("b",)))]
    assert s.tasks == {}


def test_resubmitting_a_released_task_with_other_dependencies_relinks_them():
    # dask.compute twice on shared keys: a and b are released but kept in the table,
    # because c (in memory) still lists them. b comes back with a's value inlined, so no
    # dependency at all: a must stop listing b, and, wanted by nothing, be forgotten.
    s = sched("w1")
    s.handle(E.Submit([spec("a"), spec("b", "a"), spec("c", "b")]))
    for key in "abc":
        finish(s, key)
    s.handle(E.Drop(["a"]))
    s.handle(E.Drop(["b"]))
    assert s.tasks["a"].state == s.tasks["b"].state == "released"
    s.handle(E.Submit([spec("b")]))                           # validate() checks every link
    assert "a" not in s.tasks
    assert s.tasks["b"].state == "processing" and s.tasks["c"].state == "memory"


def test_release_of_dependent_frees_unwanted_dependency():
    s = sched("w1")
    s.handle(E.Submit([spec("a"), spec("b", "a")]))
    finish(s, "a")
    s.handle(E.Drop(["a"]))
    seq_b = s.tasks["b"].seq
    acts = s.handle(E.Drop(["b"]))                           # b was still processing
    assert sends(acts, P.Cancel) == [("w1", P.Cancel((seq_b,)))]
    assert sends(acts, P.Free) == [("w1", P.Free(("a",)))]
    assert s.tasks == {}


def test_release_of_processing_task_cancels_its_run():
    s = sched("w1")
    s.handle(E.Submit([spec("a")]))
    seq = s.tasks["a"].seq
    assert sends(s.handle(E.Drop(["a"]))) == [("w1", P.Cancel((seq,)))]
    assert s.tasks == {}
    assert s.workers["w1"].processing == {seq: None}     # busy until the worker answers
    s.handle(E.Reported("w1", [P.Skipped(seq)]))
    assert s.workers["w1"].processing == {}


def test_cancelled_run_keeps_its_slot_until_the_worker_answers():
    s = sched("w1")
    s.handle(E.Submit([spec(k) for k in "abcd"]))
    seq_a = s.tasks["a"].seq
    acts = s.handle(E.CancelKeys(["a"]))
    assert runs(acts) == [] and s.tasks["d"].state == "ready"
    assert runs(s.handle(E.Reported("w1", [P.Skipped(seq_a)]))) == [("d", "w1")]


def test_recomputed_input_nobody_needs_any_more_is_freed_when_it_finishes():
    s = sched("w1", "w2")
    s.handle(E.Submit([spec("a"), spec("b", "a")]))
    finish(s, "a")
    finish(s, "b")
    s.handle(E.Drop(["a"]))                                  # freed: b is done
    assert runs(died(s, death("w1"), {})) == [("a", "w2")]   # b lost: a comes back for it
    s.handle(E.CancelKeys(["b"]))                                 # ... and then nobody needs a
    acts = finish(s, "a")
    assert sends(acts, P.Free) == [("w2", P.Free(("a",)))]
    assert not resolves(acts) or resolves(acts)["a"].status == "finished"


# --- stealing: runs queued behind a busy thread go to an idle worker -------------------

def w1_busy_w2_idle(**kw):
    """a, c, e on w1 (a running, c and e queued behind it), b, d, f on w2, all finished."""
    s = sched("w1", "w2")
    s.handle(E.Submit([spec(k, **kw) for k in "abcdef"]))
    assert [s.tasks[k].worker for k in "abcdef"] == ["w1", "w2"] * 3
    for k in "bd":
        assert sends(finish(s, k), P.Steal) == []
    return s, finish(s, "f")


def test_an_idle_worker_takes_back_the_newest_run_queued_behind_a_busy_thread():
    s, acts = w1_busy_w2_idle()
    seq_e = s.tasks["e"].seq
    assert sends(acts, P.Steal) == [("w1", P.Steal((seq_e,)))]        # one idle thread: one run
    assert s.handle(E.Reported("w2", [P.Finished(999, BIG, "int", None, 0.005)])) == []         # nothing more asked meanwhile
    acts = s.handle(E.Reported("w1", [P.Unqueued((seq_e,), (seq_e,))]))
    assert runs(acts) == [("e", "w2")] and s.tasks["e"].state == "processing"
    assert sends(finish(s, "e"), P.Steal) == [("w1", P.Steal((s.tasks["c"].seq,)))]


def test_a_run_that_had_started_stays_and_finishes_where_it_is():
    s, acts = w1_busy_w2_idle()
    seq_e = s.tasks["e"].seq
    acts = s.handle(E.Reported("w1", [P.Unqueued((seq_e,), ())]))
    assert runs(acts) == [] and s.tasks["e"].worker == "w1"
    assert sends(acts, P.Steal) == [("w1", P.Steal((s.tasks["c"].seq,)))]   # not e again
    assert resolves(finish(s, "e"))["e"].status == "finished"


def test_a_run_cancelled_while_asked_back_is_freed_not_placed_again():
    s, _ = w1_busy_w2_idle()
    seq_e = s.tasks["e"].seq
    s.handle(E.CancelKeys(["e"]))
    acts = s.handle(E.Reported("w1", [P.Unqueued((seq_e,), (seq_e,))]))
    assert runs(acts) == [] and "e" not in s.tasks and seq_e not in s.workers["w1"].processing


def test_runs_only_their_worker_may_run_are_not_asked_back():
    s = sched("w1", "w2")
    s.handle(E.Submit([spec(k, workers=["w1"]) for k in "ace"] + [spec(k, workers=["w2"]) for k in "bdf"]))
    for k in "bdf":
        assert sends(finish(s, k), P.Steal) == []
    assert len(s.workers["w1"].processing) == 3


def test_a_run_whose_inputs_the_idle_worker_lacks_by_much_is_not_asked_back():
    s = sched("w1", "w2")
    s.handle(E.Submit([spec("big")]))
    finish(s, "big", nbytes=1 << 30)                    # on w1
    s.handle(E.Submit([spec(k, "big") for k in "ace"] + [spec(k) for k in "bdf"]))
    assert [s.tasks[k].worker for k in "acebdf"] == ["w1"] * 3 + ["w2"] * 3
    for k in "bdf":
        assert sends(finish(s, k), P.Steal) == []


def test_runs_asked_of_a_worker_that_dies_are_forgotten_and_run_again():
    s, _ = w1_busy_w2_idle()
    acts = died(s, death("w1"), {})
    assert not s.placement.stealing and not s.placement.started
    assert sorted(runs(acts)) == [("a", "w2"), ("c", "w2"), ("e", "w2")]


# --- cancel ----------------------------------------------------------------------------

def test_cancel_cancels_dependents_and_the_running_run():
    s = sched("w1")
    s.handle(E.Submit([spec("a"), spec("b", "a"), spec("c", "b"), spec("x")]))
    seq_a = s.tasks["a"].seq
    acts = s.handle(E.CancelKeys(["a"]))
    res = resolves(acts)
    assert set(res) == {"a", "b", "c"} and all(r.status == "cancelled" for r in res.values())
    # each says why: the one cancelled, and what each dependent went with
    assert str(res["a"].value) == ("Task 'a' was cancelled by Client.cancel or Future.cancel in your process, and "
                                   "its data is let go of: submit it again to compute it.")
    assert str(res["c"].value).startswith("Task 'c' was cancelled with 'a', an input it needs (directly or not), "
                                          "cancelled by Client.cancel or Future.cancel in your process, and")
    assert sends(acts, P.Cancel) == [("w1", P.Cancel((seq_a,)))]
    assert set(s.tasks) == {"x"}


def test_cancel_processing_dependent_on_another_worker():
    s = sched("w1", "w2")
    s.handle(E.Submit([spec("a")]))
    finish(s, "a")
    s.handle(E.SetPaused("w1", True))
    s.handle(E.Submit([spec("b", "a")]))
    seq_b = s.tasks["b"].seq
    acts = s.handle(E.CancelKeys(["b"]))
    assert resolves(acts)["b"].status == "cancelled"
    assert sends(acts, P.Cancel) == [("w2", P.Cancel((seq_b,)))]
    assert s.tasks["a"].state == "memory"


def test_cancel_finished_or_unknown_does_nothing():
    s = sched("w1")
    s.handle(E.Submit([spec("a")]))
    finish(s, "a")
    assert s.handle(E.CancelKeys(["a", "nope"])) == []
    assert s.tasks["a"].state == "memory"


def test_finished_after_cancel_is_ignored():
    s = sched("w1")
    s.handle(E.Submit([spec("a")]))
    seq = s.tasks["a"].seq
    s.handle(E.CancelKeys(["a"]))
    acts = s.handle(E.Reported("w1", [P.Finished(seq, BIG, "int", None, 0.0)]))
    assert not resolves(acts) and "a" not in s.tasks


def test_finished_after_cancel_frees_its_result():
    """Finished crossed Cancel on the pipe: the worker stored a result nobody will free."""
    s = sched("w1")
    s.handle(E.Submit([spec("a")]))
    seq = s.tasks["a"].seq
    s.handle(E.CancelKeys(["a"]))
    acts = s.handle(E.Reported("w1", [P.Finished(seq, BIG, "int", None, 0.0)]))
    assert ("w1", P.Free(("a",))) in sends(acts, P.Free)


def test_a_cancelled_run_ending_frees_nothing_while_a_newer_run_of_its_key_is_on_that_worker():
    """The Free would reach the worker after the newer run stored its result, and drop it:
    the scheduler would then ask the worker for data it no longer holds (seen in the soak)."""
    s = sched("w1")
    s.handle(E.Submit([spec("k")]))
    old = s.tasks["k"].seq
    s.handle(E.Drop(["k"]))
    s.handle(E.Submit([spec("k")]))
    assert s.tasks["k"].worker == "w1" and s.tasks["k"].seq != old
    assert sends(s.handle(E.Reported("w1", [P.Finished(old, BIG, "int", None, 0.0)])), P.Free) == []
    acts = finish(s, "k")
    assert resolves(acts)["k"].status == "finished" and s.tasks["k"].who_has == {"w1"}


def test_fetch_of_cancelled_task_is_answered():
    s = sched("w1")
    s.handle(E.Submit([spec("a")]))
    req, acts = E.opened(s.handle(E.Fetch("a")))
    assert acts == []
    acts = s.handle(E.CancelKeys(["a"]))
    (d,) = delivers(acts)
    assert d.request == req and isinstance(d.error, CancelledError)


# --- worker death ----------------------------------------------------------------------

def test_death_reschedules_running_task_on_another_worker():
    s = sched("w1", "w2")
    s.handle(E.Submit([spec("a")]))
    old = s.tasks["a"].seq
    d = death("w1")
    acts = died(s, d, running(s, "a"))
    assert runs(acts) == [("a", "w2")]
    ts = s.tasks["a"]
    assert ts.seq != old and ts.suspicious == 1 and ts.deaths == (d,)
    assert "w1" not in s.workers


def test_killed_worker_after_more_than_allowed_failures():
    s = sched("w1", "w2", allowed_failures=1)
    s.handle(E.Submit([spec("a"), spec("b", "a")]))
    d1, d2 = death("w1"), death("w2", cause="crash", exitcode=-11)
    assert runs(died(s, d1, running(s, "a"))) == [("a", "w2")]
    s.handle(E.AddWorker("w3", 1))
    acts = died(s, d2, running(s, "a"))
    assert not runs(acts)
    res = resolves(acts)
    err = res["a"].value
    assert res["a"].status == "error" and isinstance(err, KilledWorker)
    assert err.task == "a" and err.last_worker == "w2" and err.deaths == (d1, d2)
    assert err.allowed_failures == 1
    assert res["b"].value is err


def test_dead_worker_unknown_is_ignored():
    s = sched("w1")
    assert died(s, death("nope"), {}) == []


def test_queued_runs_are_not_blamed():
    s = sched("w1", "w2", allowed_failures=0)
    s.handle(E.Submit([spec("a"), spec("x"), spec("b"), spec("y"), spec("c")]))
    on_w1 = sorted(s.workers["w1"].processing.values())
    assert on_w1 == ["a", "b", "c"]
    acts = died(s, death("w1"), running(s, "a"))
    res = resolves(acts)
    assert list(res) == ["a"] and isinstance(res["a"].value, KilledWorker)
    assert s.tasks["b"].suspicious == 0 and s.tasks["c"].suspicious == 0
    assert s.tasks["b"].state in ("ready", "processing")


def test_crash_blames_only_the_crashed_run():
    s = sched("w1", nthreads=2, allowed_failures=0)
    s.handle(E.Submit([spec("a"), spec("b")]))
    s.handle(E.AddWorker("w2", 1))
    board = running(s, "a", "b")
    acts = died(s, death("w1", "crash", -11), board, crashed_seq=s.tasks["a"].seq)
    res = resolves(acts)
    assert list(res) == ["a"] and isinstance(res["a"].value, KilledWorker)
    assert ("b", "w2") in runs(acts) and s.tasks["b"].suspicious == 0


def test_crash_without_known_thread_blames_all_running():
    s = sched("w1", nthreads=2, allowed_failures=0)
    s.handle(E.Submit([spec("a"), spec("b")]))
    acts = died(s, death("w1", "crash", -11), running(s, "a", "b"), crashed_seq=None)
    assert set(resolves(acts)) == {"a", "b"}


def test_crash_on_a_thread_with_no_task_blames_nobody():
    s = sched("w1", nthreads=2, allowed_failures=0)
    s.handle(E.Submit([spec("a"), spec("b")]))
    acts = died(s, death("w1", "crash", -11), running(s, "a", "b"), crashed_seq=0)
    assert not resolves(acts)
    assert s.tasks["a"].suspicious == 0 and s.tasks["b"].suspicious == 0


def test_requested_death_blames_nothing():
    s = sched("w1", "w2", allowed_failures=0)
    s.handle(E.Submit([spec("a")]))
    acts = died(s, death("w1", "requested", 0), running(s, "a"))
    assert not resolves(acts) and runs(acts) == [("a", "w2")]
    assert s.tasks["a"].suspicious == 0 and s.tasks["a"].deaths == ()


def test_exception_death_blames_nothing():
    s = sched("w1", "w2", allowed_failures=0)
    s.handle(E.Submit([spec("a")]))
    acts = died(s, death("w1", "exception", 1), running(s, "a"))
    assert not resolves(acts) and runs(acts) == [("a", "w2")]


def test_timeout_fails_only_the_late_task():
    s = sched("w1", nthreads=2, allowed_failures=0)
    s.handle(E.Submit([spec("a", timeout=1.0), spec("b"), spec("c", "a")]))
    s.handle(E.AddWorker("w2", 1))
    seq_a = s.tasks["a"].seq
    acts = died(s, death("w1", "timeout", -9), running(s, "a", "b"), timed_out=(seq_a, 1.5))
    res = resolves(acts)
    assert set(res) == {"a", "c"}
    err = res["a"].value
    assert isinstance(err, TaskTimeoutError)
    assert (err.task, err.timeout, err.elapsed, err.worker) == ("a", 1.0, 1.5, "w1")
    assert res["c"].value is err
    assert runs(acts) == [("b", "w2")] and s.tasks["b"].suspicious == 0


def test_timeout_of_query():
    s = sched("w1")
    s.handle(E.Submit([spec("a", timeout=2.5), spec("b")]))
    assert s.timeout_of(s.tasks["a"].seq) == 2.5
    assert s.timeout_of(s.tasks["b"].seq) is None
    assert s.key_of(s.tasks["a"].seq) == "a"
    assert s.timeout_of(999) is None and s.key_of(999) is None


def test_lost_result_recomputed_when_wanted():
    s = sched("w1", "w2")
    s.handle(E.Submit([spec("a")]))
    finish(s, "a")
    acts = died(s, death("w1"), {})
    assert runs(acts) == [("a", "w2")]
    assert s.tasks["a"].suspicious == 0
    acts = finish(s, "a")
    assert resolves(acts)["a"].status == "finished"


def test_lost_result_recomputed_through_released_lineage():
    s = sched("w1", "w2")
    s.handle(E.Submit([spec("a"), spec("b", "a")]))
    finish(s, "a")
    finish(s, "b")
    s.handle(E.Drop(["a"]))
    acts = died(s, death("w1"), {})
    assert runs(acts) == [("a", "w2")]
    assert s.tasks["b"].state == "waiting"
    assert runs(finish(s, "a")) == [("b", "w2")]
    assert resolves(finish(s, "b"))["b"].status == "finished"


def test_lost_result_nobody_needs_is_forgotten():
    s = sched("w1", "w2")
    s.handle(E.Submit([spec("a"), spec("b", "a")]))
    finish(s, "a")
    s.handle(E.Drop(["a"]))                                  # b still running on it: a stays
    small = dumps(2)
    finish(s, "b", data=small, nbytes=small.nbytes)  # b's value lives in the parent
    acts = died(s, death("w1"), {})
    assert not runs(acts) and not resolves(acts)
    assert "a" not in s.tasks or s.tasks["a"].state == "released"
    assert s.tasks["b"].state == "memory"


def test_running_task_whose_input_died_with_it_waits_for_the_recompute():
    s = sched("w1", "w2")
    s.handle(E.Submit([spec("a"), spec("b", "a")]))
    finish(s, "a")
    assert s.tasks["b"].worker == "w1"             # runs where its input is
    acts = died(s, death("w1"), running(s, "b"))
    assert runs(acts) == [("a", "w2")]             # b must not start before a exists again
    assert s.tasks["b"].state == "waiting"
    assert runs(finish(s, "a")) == [("b", "w2")]


def test_lost_chain_recomputed_in_order():
    """Every link of a chain died with w1: only the head may run; the rest wait for it."""
    s = sched("w1", "w2")
    keys = [f"k{i}" for i in range(8)]
    s.handle(E.Submit([spec(keys[0])] + [spec(k, prev) for prev, k in zip(keys, keys[1:])]))
    for k in keys:
        finish(s, k)
    assert s.workers["w1"].has == set(keys)
    acts = died(s, death("w1"), {})
    assert runs(acts) == [("k0", "w2")]
    assert all(s.tasks[k].state == "waiting" for k in keys[1:])


def test_small_result_kept_in_parent_survives_its_worker():
    s = sched("w1", "w2")
    s.handle(E.Submit([spec("a")]))
    small = dumps(1)
    finish(s, "a", data=small, nbytes=small.nbytes)
    acts = died(s, death("w1"), {})
    assert not runs(acts) and s.tasks["a"].state == "memory"
    req, acts = E.opened(s.handle(E.Fetch("a")))
    assert acts == [Deliver(req, "a", small)]


def test_lost_dependency_pulls_back_the_waiting_dependent():
    s, acts = b_needs_a_from_w1()
    seq_b = s.tasks["b"].seq
    assert runs(acts) == [("b", "w2")] and sends(acts, P.Export)[0][0] == "w1"
    acts = died(s, death("w1"), {})
    assert ("w2", P.Cancel((seq_b,))) in sends(acts)
    assert runs(acts) == [("a", "w2")] and s.tasks["b"].state == "waiting"
    acts = finish(s, "a")
    assert runs(acts) == [("b", "w2")] and not sends(acts, P.Export)


def test_scattered_data_lost_with_its_only_worker():
    s = sched("w1", "w2")
    payload, acts = scatter(s, "x", ["w1"])
    assert sends(acts) == [("w1", P.Put("x", payload, 0, "the client (scatter)"))] and resolves(acts)["x"].status == "finished"
    acts = s.handle(E.Submit([spec("b", "x")]))
    assert runs(acts) == [("b", "w1")]
    acts = died(s, death("w1"), running(s, "b"))
    res = resolves(acts)
    assert res["x"].status == "lost" and isinstance(res["x"].value, LostDataError)
    err = res["x"].value
    assert (err.key, err.worker, err.cause) == ("x", "w1", "signal")
    assert res["b"].status == "error" and res["b"].value is err
    assert not runs(acts)
    req, acts = E.opened(s.handle(E.Fetch("x")))
    assert acts == [Deliver(req, "x", error=err)]
    acts = s.handle(E.Submit([spec("c", "x")]))
    assert resolves(acts)["c"].value is err


def test_scattered_data_with_a_replica_or_parent_copy_survives():
    s = sched("w1", "w2")
    scatter(s, "x", ["w1", "w2"])
    scatter(s, "y", ["w1"], small=True)
    acts = died(s, death("w1"), {})
    assert not resolves(acts)
    assert s.tasks["x"].state == "memory" and s.tasks["x"].who_has == {"w2"}
    assert s.tasks["y"].state == "memory"


# --- fetch -----------------------------------------------------------------------------

def test_fetch_exports_from_the_holder():
    s = sched("w1")
    s.handle(E.Submit([spec("a")]))
    finish(s, "a")
    req, acts = E.opened(s.handle(E.Fetch("a")))
    assert sends(acts) == [("w1", P.Export("a", req, True))]
    payload = dumps(7)
    assert s.handle(E.Reported("w1", [P.Data(req, "a", payload, None)])) == [Deliver(req, "a", payload, None)]


def test_fetch_of_pending_task_answered_when_it_finishes():
    s = sched("w1")
    s.handle(E.Submit([spec("a")]))
    req, acts = E.opened(s.handle(E.Fetch("a")))
    assert acts == []
    small = dumps(1)
    acts = finish(s, "a", data=small, nbytes=small.nbytes)
    assert Deliver(req, "a", small) in acts


def test_fetch_of_erred_and_unknown():
    s = sched("w1")
    s.handle(E.Submit([spec("a")]))
    req, acts = E.opened(s.handle(E.Fetch("a")))
    acts = fail(s, "a")
    assert Deliver(req, "a", error=ERR) in acts
    req, acts = E.opened(s.handle(E.Fetch("a")))
    assert acts == [Deliver(req, "a", error=ERR)]
    req, acts = E.opened(s.handle(E.Fetch("nope")))
    assert isinstance(acts[0].error, CancelledError)


def test_pending_fetch_from_dead_holder_goes_to_another_holder():
    s = sched("w1", "w2")
    scatter(s, "x", ["w1", "w2"])
    req, acts = E.opened(s.handle(E.Fetch("x")))
    ((holder, exp),) = sends(acts, P.Export)
    other = ({"w1", "w2"} - {holder}).pop()
    acts = died(s, death(holder), {})
    assert sends(acts) == [(other, P.Export("x", req, True))]
    payload = dumps(1)
    assert s.handle(E.Reported(other, [P.Data(req, "x", payload, None)])) == [Deliver(req, "x", payload, None)]


def test_pending_fetch_from_dead_only_holder_waits_for_recompute():
    s = sched("w1", "w2")
    s.handle(E.Submit([spec("a")]))
    finish(s, "a")
    req, _ = E.opened(s.handle(E.Fetch("a")))
    acts = died(s, death("w1"), {})
    assert runs(acts) == [("a", "w2")] and not delivers(acts)
    acts = finish(s, "a")
    assert sends(acts, P.Export) == [("w2", P.Export("a", req, True))]


def test_pending_fetch_of_scattered_data_from_its_dead_only_holder():
    s = sched("w1", "w2")
    scatter(s, "x", ["w1"])
    req, _ = E.opened(s.handle(E.Fetch("x")))
    acts = died(s, death("w1"), {})
    (d,) = delivers(acts)
    assert d.request == req and isinstance(d.error, LostDataError)


def test_relay_from_dead_holder_goes_to_another_holder():
    s = sched("w1", "w2", "w3")
    scatter(s, "x", ["w1", "w2"])
    s.handle(E.SetPaused("w1", True))
    s.handle(E.SetPaused("w2", True))
    acts = s.handle(E.Submit([spec("b", "x")]))
    assert runs(acts) == [("b", "w3")]
    ((holder, _),) = sends(acts, P.Export)
    other = ({"w1", "w2"} - {holder}).pop()
    acts = died(s, death(holder), {})
    ((h2, exp),) = sends(acts, P.Export)
    assert h2 == other and exp.key == "x"
    payload = dumps(1)
    assert sends(s.handle(E.Reported(other, [P.Data(exp.request, "x", payload, None)]))) == [("w3", P.Put("x", payload, 0, f"worker {other!r}"))]


def test_late_data_from_dead_holder_is_ignored():
    s = sched("w1", "w2")
    scatter(s, "x", ["w1"])
    req, _ = E.opened(s.handle(E.Fetch("x")))
    died(s, death("w1"), {})
    assert s.handle(E.Reported("w1", [P.Data(req, "x", dumps(1), None)])) == []


# --- pause -----------------------------------------------------------------------------

def test_paused_worker_gets_nothing_until_unpaused():
    s = sched("w1", "w2")
    s.handle(E.SetPaused("w1", True))
    acts = s.handle(E.Submit([spec(f"t{i}") for i in range(5)]))
    assert {w for _, w in runs(acts)} == {"w2"} and len(runs(acts)) == 3
    assert s.handle(E.SetPaused("w1", True)) == []
    acts = s.handle(E.SetPaused("w1", False))
    assert runs(acts) == [("t3", "w1"), ("t4", "w1")]


def test_a_worker_paused_asks_back_the_runs_it_has_not_started():
    """Its prefetch goes back to the queue, to run elsewhere: a worker paused for memory must
    not run on through dozens of queued runs and meet its limit."""
    s = sched("w1", "w2")
    acts = s.handle(E.Submit([spec(f"t{i}") for i in range(4)]))
    on_w1 = sorted(seq for seq, key in s.workers["w1"].processing.items())
    assert len(on_w1) == 2
    steals = sends(s.handle(E.SetPaused("w1", True)), P.Steal, "w1")
    assert [sorted(m.seqs) for _w, m in steals] == [on_w1]
    # the worker had started the first: it keeps it; the second comes back and goes to w2
    taken = s.workers["w1"].processing[on_w1[1]]
    acts = s.handle(E.Reported("w1", [P.Unqueued(tuple(on_w1), (on_w1[1],))]))
    assert runs(acts) == [(taken, "w2")]
    assert set(s.workers["w1"].processing) == {on_w1[0]}
    assert s.handle(E.SetPaused("w1", True)) == []       # asked once


def test_all_workers_paused_nothing_runs():
    s = sched("w1")
    s.handle(E.SetPaused("w1", True))
    assert runs(s.handle(E.Submit([spec("a")]))) == []
    assert runs(s.handle(E.SetPaused("w1", False))) == [("a", "w1")]


# --- retire ----------------------------------------------------------------------------

def test_retire_idle_worker_at_once():
    s = sched("w1", "w2")
    assert s.handle(E.HandOff("w1")) == [Retire("w1")]
    assert s.handle(E.HandOff("w1")) == []


def test_retire_moves_data_only_it_holds_then_retires():
    s = sched("w1", "w2")
    s.handle(E.Submit([spec("a")]))
    finish(s, "a")
    scatter(s, "x", ["w1", "w2"])
    acts = s.handle(E.HandOff("w1"))
    assert not [a for a in acts if isinstance(a, Retire)]
    ((holder, exp),) = sends(acts, P.Export)
    assert holder == "w1" and exp.key == "a"
    assert runs(s.handle(E.Submit([spec("b")]))) == [("b", "w2")]       # no new work for w1
    payload = dumps(1)
    acts = s.handle(E.Reported("w1", [P.Data(exp.request, "a", payload, None)]))
    assert sends(acts) == [("w2", P.Put("a", payload, 0, "worker 'w1'"))]
    assert Retire("w1") in acts
    assert s.tasks["a"].who_has == {"w1", "w2"}


def test_retire_waits_for_processing_then_moves_its_result():
    s = sched("w1", "w2")
    s.handle(E.Submit([spec("a")]))
    assert s.handle(E.HandOff("w1")) == []
    acts = finish(s, "a")
    assert Retire("w1") not in acts                 # the result lives only on w1
    ((holder, exp),) = sends(acts, P.Export)
    assert holder == "w1" and exp.key == "a"
    acts = s.handle(E.Reported("w1", [P.Data(exp.request, "a", dumps(1), None)]))
    assert Retire("w1") in acts


def test_retire_target_dies_data_moved_elsewhere():
    s = sched("w1", "w2", "w3")
    s.handle(E.Submit([spec("a")]))
    finish(s, "a")
    ((_, exp),) = sends(s.handle(E.HandOff("w1")), P.Export)
    target = s.transfers.exports[exp.request].target
    acts = died(s, death(target), {})
    assert Retire("w1") not in acts                 # a still lives only on w1, w-other is up
    ((holder, exp2),) = sends(acts, P.Export)
    assert holder == "w1" and exp2.key == "a"


def test_retire_with_inline_result_retires_after_finish():
    s = sched("w1", "w2")
    s.handle(E.Submit([spec("a")]))
    s.handle(E.HandOff("w1"))
    small = dumps(1)
    acts = finish(s, "a", data=small, nbytes=small.nbytes)
    assert Retire("w1") in acts


# --- clear -----------------------------------------------------------------------------

def test_clear_resolves_every_unfinished_key():
    s = sched("w1")
    s.handle(E.Submit([spec("m")]))
    finish(s, "m")
    s.handle(E.Submit([spec("p"), spec("w", "p")] + [spec(f"r{i}") for i in range(4)]))
    assert s.tasks["r3"].state == "ready"
    req_p, _ = E.opened(s.handle(E.Fetch("p")))
    req_m, _ = E.opened(s.handle(E.Fetch("m")))
    err = RuntimeError("restarted")
    acts = s.handle(E.Clear(err))
    failed = [a for a in acts if isinstance(a, FailAll)]     # every pending future: p, w, r0-r3
    assert len(failed) == 1 and failed[0].error is err and not resolves(acts)
    assert {d.request for d in delivers(acts)} == {req_p, req_m}
    assert all(d.error is err for d in delivers(acts))
    assert s.tasks == {} and s.workers["w1"].processing == {} and s.workers["w1"].has == set()
    assert runs(s.handle(E.Submit([spec("z")]))) == [("z", "w1")]
    finish(s, "z")
    assert not [a for a in s.handle(E.Clear(err)) if isinstance(a, FailAll)]      # nothing pending: nothing to fail


# --- blame rules -----------------------------------------------------------------------

def test_blamed_runs_rules():
    board = {1: (0, 0.0), 2: (1, 0.0)}
    for cause in ("requested", "exception", "timeout"):
        assert blamed_runs(cause, board, None, 1) == set()
    assert blamed_runs("crash", board, 2, None) == {2}
    assert blamed_runs("crash", board, None, None) == {1, 2}
    for cause in ("exit", "signal", "oom-killer", "memory-limit", "unresponsive"):
        assert blamed_runs(cause, board, None, None) == {1, 2}


# --- placement you can ask for: workers= / allow_other_workers= -------------------------

def test_restricted_task_runs_only_on_its_worker_and_blocks_nobody_else():
    s = sched("w1", "w2")
    acts = s.handle(E.Submit([spec(f"r{i}", workers={"w2"}) for i in range(6)] + [spec("free")]))
    placed = runs(acts)
    assert all(w == "w2" for k, w in placed if k.startswith("r"))
    assert ("free", "w1") in placed                    # not stuck behind the restricted backlog
    held = [k for k in (f"r{i}" for i in range(6)) if s.tasks[k].state == "ready"]
    assert held, "w2 is full: some restricted tasks must wait for it, not go to w1"
    acts = finish(s, placed[0][0])
    assert runs(acts) == [(held[0], "w2")]


def test_loose_restriction_prefers_its_worker_then_falls_back_when_it_is_gone():
    s = sched("w1", "w2")
    acts = s.handle(E.Submit([spec("a", workers={"w2"}, loose=True)]))
    assert runs(acts) == [("a", "w2")]
    acts = died(s, death("w2"), {})               # died before starting it: no blame
    assert runs(acts) == [("a", "w1")]


def test_a_preference_for_a_worker_that_never_ran_is_no_preference():
    # found by hypothesis: workers="" with allow_other_workers=True queued the task for a
    # worker named "" that nobody serves, and it never ran
    s = sched("w1")
    acts = s.handle(E.Submit([spec("a", workers={""}, loose=True), spec("b", workers={"w9", "w1"}, loose=True)]))
    assert sorted(runs(acts)) == [("a", "w1"), ("b", "w1")]


def test_strict_restriction_to_a_dead_worker_fails_with_a_clear_error():
    s = sched("w1", "w2")
    s.handle(E.Submit([spec("a", workers={"w2"})]))
    acts = died(s, death("w2"), {})
    res = resolves(acts)["a"]
    assert res.status == "error" and "may run only on w2" in str(res.value) and "allow_other_workers" in str(res.value)
    acts = s.handle(E.Submit([spec("b", workers={"w2"})]))        # a name that is gone for good
    assert resolves(acts)["b"].status == "error" and not runs(acts)


def test_scatter_places_on_the_least_loaded_worker_or_broadcasts():
    s = sched("w1", "w2")
    big = dumps(b"x" * (P.INLINE_RESULT + 1))
    acts = s.handle(E.Scatter([("a", big), ("b", big)]))
    assert sorted(w for w, _m in sends(acts, P.Put)) == ["w1", "w2"]
    assert resolves(acts)["a"].value is None            # large: no copy kept in the parent
    acts = s.handle(E.Scatter([("c", big)], broadcast=True))
    assert sorted(w for w, _m in sends(acts, P.Put)) == ["w1", "w2"]
    acts = s.handle(E.Scatter([("d", big)], frozenset({"w2"})))
    assert [w for w, _m in sends(acts, P.Put)] == ["w2"]


def test_scatter_with_no_worker_keeps_the_data_and_sends_it_when_needed():
    s = sched()
    big = dumps(b"x" * (P.INLINE_RESULT + 1))
    acts = s.handle(E.Scatter([("a", big)]))
    assert not sends(acts) and resolves(acts)["a"].status == "finished"
    s.handle(E.Submit([spec("b", "a")]))
    acts = s.handle(E.AddWorker("w1", 1))
    assert sends(acts, P.Put) == [("w1", P.Put("a", big, 0, "the parent's copy"))] and runs(acts) == [("b", "w1")]


def test_replicate_answers_once_every_copy_has_arrived():
    s = sched("w1", "w2", "w3")
    payload, _ = scatter(s, "x", ["w1"])
    req, acts = E.opened(s.handle(E.Replicate(["x"], 3)))
    exports = sends(acts, P.Export)
    assert [w for w, _m in exports] == ["w1", "w1"] and not delivers(acts)
    first, second = (m.request for _w, m in exports)
    puts = []
    for request in (first, second):
        acts = s.handle(E.Reported("w1", [P.Data(request, "x", payload, None)]))
        (_w, put), = sends(acts, P.Put)
        assert put.ack and not delivers(acts)           # sent is not stored: wait for the worker
        puts.append(put)
    assert not delivers(s.handle(E.Reported("", [P.Stored(puts[0].ack)])))
    assert delivers(s.handle(E.Reported("", [P.Stored(puts[1].ack)]))) == [Deliver(req, "x")]
    assert s.tasks["x"].who_has == {"w1", "w2", "w3"}
    req, acts = E.opened(s.handle(E.Replicate(["x"], 2)))                    # already enough copies: answered at once
    assert delivers(acts) == [Deliver(req, "")]


def test_replicate_fails_with_the_error_of_a_copy_that_could_not_be_made():
    s = sched("w1", "w2")
    scatter(s, "x", ["w1"])
    req, acts = E.opened(s.handle(E.Replicate(["x"], 2)))
    (_w, export), = sends(acts, P.Export)
    acts = s.handle(E.Reported("w1", [P.Data(export.request, "x", None, ERR)]))
    assert delivers(acts) == [Deliver(req, "x", error=ERR)]


def test_replicate_ends_when_the_target_dies():
    s = sched("w1", "w2")
    scatter(s, "x", ["w1"])
    req, _acts = E.opened(s.handle(E.Replicate(["x"], 2)))
    acts = died(s, death("w2"), {})                # while the copy was being exported
    assert Deliver(req, "x") in delivers(acts)
    s.handle(E.AddWorker("w3", 1))
    req, acts = E.opened(s.handle(E.Replicate(["x"], 2)))
    (_w, export), = sends(acts, P.Export)
    (_w, put), = sends(s.handle(E.Reported("w1", [P.Data(export.request, "x", dumps(1), None)])), P.Put)
    acts = died(s, death("w3"), {})                # after the Put, before Stored
    assert Deliver(req, "x") in delivers(acts)


def test_a_relay_for_a_dependency_asks_for_no_acknowledgement():
    s, acts = b_needs_a_from_w1()
    (_w, export), = sends(acts, P.Export)
    (_w, put), = sends(s.handle(E.Reported("w1", [P.Data(export.request, "a", dumps(1), None)])), P.Put)
    assert put.ack == 0


def test_validate_names_the_broken_invariant():
    s = sched("w1", "w2")
    s.handle(E.Submit([spec("a"), spec("b")]))
    s.validate()
    s.workers["w2"].has.add("a")                       # a copy the task does not know of
    with pytest.raises(AssertionError, match="w2 lists 'a'"):
        s.validate()
    s.workers["w2"].has.discard("a")
    s.tasks["b"].state = "bogus"
    with pytest.raises(AssertionError, match="'b' has unknown state 'bogus'"):
        s.validate()


def test_tasks_one_worker_holds_share_one_holder_set_and_never_change_it_for_each_other():
    s = sched("w1")
    s.handle(E.Submit([spec("a"), spec("b")]))
    finish(s, "a")
    finish(s, "b")
    a, b = s.tasks["a"], s.tasks["b"]
    assert a.who_has == {"w1"} == b.who_has
    assert a.who_has is b.who_has            # one shared frozenset, not a set of 216 bytes per task
    a.add_holder("w2")                       # a replica: a set of a's own
    assert a.who_has == {"w1", "w2"} and b.who_has == {"w1"}
    a.drop_holder("w1")
    b.drop_holder("w1")
    assert a.who_has == {"w2"} and not b.who_has
    a.add_holder("w2")
    assert a.who_has == {"w2"}


def test_release_many_frees_each_workers_keys_in_one_message_and_places_once():
    s = sched("w1", "w2")
    keys = [f"k{i}" for i in range(6)]
    s.handle(E.Submit([spec(k) for k in keys]))
    for k in keys:
        finish(s, k)
    holders = {k: next(iter(s.tasks[k].who_has)) for k in keys}
    acts = s.handle(E.Drop(keys))
    frees = sends(acts, P.Free)
    assert sorted(w for w, _m in frees) == sorted(set(holders.values()))      # one Free per worker
    assert {k for _w, m in frees for k in m.keys} == set(keys)
    assert all(holders[k] == w for w, m in frees for k in m.keys)
    assert not any(k in s.tasks for k in keys)
    assert s.handle(E.Drop(["nobody", "knows"])) == []


def test_equal_small_results_are_kept_as_one_payload():
    """A big map's finished no-ops keep one Payload between them (protocol.shared)."""
    s = sched("w1")
    s.handle(E.Submit([spec("a"), spec("b")]))
    pa, pb = P.Payload(b"\x80\x05N.", (), 4), P.Payload(b"\x80\x05N.", (), 4)
    finish(s, "a", pa, nbytes=4)
    acts = finish(s, "b", pb, nbytes=4)
    assert s.tasks["a"].data is pa and s.tasks["b"].data is pa
    assert [a.value for a in acts if type(a) is Resolve] == [pa]


def test_a_task_erred_for_a_forgotten_input_is_not_linked_to_that_key_submitted_again():
    """Found by the state machine (test_scheduler_machine.py): ``b`` cancelled (forgotten),
    ``a(b)`` submitted with b's future fails at once; ``b`` submitted again must not be
    taken for a's input, which was never linked to it."""
    s = sched("w1")
    s.handle(E.Submit([spec("b")]))
    s.handle(E.CancelKeys(["b"]))
    s.handle(E.Submit([spec("a", "b")]))
    assert s.tasks["a"].state == "erred"
    s.handle(E.Submit([spec("b")]))                     # validate: b lists no dependent a
    assert not s.tasks["b"].dependents
    s.handle(E.Drop(["a"]))
    assert "b" in s.tasks and "a" not in s.tasks


def test_a_run_counts_its_task_done_on_its_first_finish_and_failed_with_no_retry_left():
    """What the live views count (History.done, History.failed), decided as each run ends."""
    s = sched("w1", "w2")
    s.handle(E.Submit([spec("a"), spec("r", retries=1), spec("f")]))
    assert s.run_ending("a", finished=True) == (None, True)
    finish(s, "a")
    died(s, death("w1"), {})                  # a's only copy lost with w1, and still wanted: run again
    assert s.tasks["a"].state == "processing"
    assert s.run_ending("a", finished=True) == (None, False)      # the recompute: a counted already
    assert s.run_ending("r", finished=False) == (None, False)     # a retry left: not failed (yet)
    fail(s, "r")
    assert s.run_ending("r", finished=False) == (None, True)
    assert s.run_ending("f", finished=False) == (None, True)
    assert s.run_ending("gone", finished=True) == (None, True)    # a run whose task was forgotten


def test_a_tasks_rare_fields_read_as_their_defaults_until_one_is_changed():
    """Deaths, fetches waiting, cancels, retries used and an error live in a record made on
    the first change: 16 slots a Task, 160 bytes, and no Spec kept (the 1k-queued benchmark row)."""
    ts = Task("k", spec("k", retries=2), 0)
    assert ts.rare is None and len(Task.__slots__) <= 16
    assert (ts.retries, ts.suspicious, ts.deaths, ts.fetchers, ts.cancels, ts.error) == (2, 0, (), (), 0, None)
    ts.fetchers = ()                    # a default written back: nothing is made
    ts.error = None
    assert ts.rare is None
    ts.retries -= 1
    assert ts.rare is not None and (ts.retries, ts.fetchers, ts.cancels) == (1, (), 0)
    ts.fetchers += (7,)
    ts.suspicious += 1
    assert (ts.fetchers, ts.suspicious, ts.retries) == ((7,), 1, 1)
    assert Task("scattered", None, 1).retries == 0
    err = ValueError("x")
    ts.error = err
    assert ts.error is err and ts.rare.error is err


def test_a_task_keeps_what_its_spec_held_and_gives_the_spec_back():
    """The Spec the client made is taken apart (its arguments, shared Terms and inputs kept
    in the Task) and goes: 64 bytes a task. ``spec`` puts an equal one together again."""
    made = Spec.sharing("k", serialize.plain_args((7,)), ("d",), spec("x").terms)
    ts = Task("k", made, 0)
    assert ts.spec == made and ts.spec is not made and ts.terms is made.terms
    assert ts.args == made.args and ts.kept == 7                        # a lone argument, no tuple
    assert Task("scattered", None, 1).spec is None and Task("scattered", None, 1).terms is None


# --- data asked of a holder a window at a time (issue 53) ----------------------------------------

def test_a_holder_is_asked_for_a_window_of_bytes_at_a_time_and_its_answers_make_room():
    """A gather of many large values held by one worker: a spilled one is read back into memory
    to be sent, so the worker is asked for at most ``window`` bytes at once (always one value);
    each answer lets the next go. A holder that dies takes its waiting requests with it: they
    are asked of another holder."""
    from localcluster.scheduler.transfers import EXPORT_WINDOW
    s = sched("w1")
    size = EXPORT_WINDOW // 3 + 1                      # two fit in a window, three do not
    keys = [f"k{i}" for i in range(5)]
    s.handle(E.Submit([spec(k) for k in keys]))
    for k in keys:
        finish(s, k, nbytes=size)
    s.handle(E.AddWorker("w2", 1))
    asked = []
    for k in keys:
        req, acts = E.opened(s.handle(E.Fetch(k)))
        asked.append(req)
        assert len(sends(acts, P.Export)) == (1 if len(asked) <= 2 else 0), k
    assert sorted(s.transfers.sent_sizes()) == asked[:2]
    acts = s.handle(E.Reported("w1", [P.Data(asked[0], "k0", dumps(0), None)]))
    assert [m.key for _w, m in sends(acts, P.Export)] == ["k2"]        # room for one more
    E.opened(s.handle(E.Replicate(["k3", "k4"], None)))                                     # w2 wants copies: they wait too
    acts = s.handle(E.Reported("w1", [P.Data(asked[1], "k1", dumps(1), None)]))
    assert [m.key for _w, m in sends(acts, P.Export)] == ["k3"]
    assert s.exporting("w1").startswith("It was asked to send 5 values")
    assert "to the client" in s.exporting("w1") and "to 'w2'" in s.exporting("w1")
    s.handle(E.WorkerDied(death("w1")))                                  # all five are computed again on w2
    assert not s.transfers.sent_sizes() and not s.transfers.waiting
    assert {s.tasks[k].state for k in keys} <= {"processing", "ready"}
    assert [s.tasks[k].fetchers for k in keys[2:]] == [(r,) for r in asked[2:]]     # they wait for it


# --- copies that break their seal (protocol.Damaged, issue 48) ---------------------------------

def _relay_of_c():
    """``c`` on w2, ``b(c)`` sent to w1: the Export asked of w2 for the relay."""
    s = sched("w1", "w2")
    s.handle(E.Submit([spec("a"), spec("c")]))
    finish(s, "a", nbytes=BIG)
    finish(s, "c", nbytes=BIG)
    acts = s.handle(E.Submit([spec("b", "a", "c")]))
    (holder, exp), = sends(acts, P.Export)
    assert holder == "w2" and exp.key == "c" and runs(acts) == [("b", "w1")]
    return s, exp


def test_a_damaged_copy_out_of_the_only_holder_is_computed_again_then_relayed():
    s, exp = _relay_of_c()
    acts = s.handle(E.Reported("w2", [P.Damaged("c", 0, exp.request, "copied out of worker 'w2': x")]))
    assert ("w2", P.Free(("c",))) in sends(acts)                  # the holder drops its copy
    assert s.tasks["c"].state in ("ready", "processing") and s.tasks["b"].state == "waiting"
    assert s.tasks["c"].damages == 1


def test_a_relay_whose_copies_keep_arriving_damaged_fails_its_dependent_with_transfer_error():
    """Each damaged copy is dropped and relayed again (a new Export to the holder, a new Put);
    the fourth fails the run waiting for it with TransferError, and the holder keeps its copy."""
    from localcluster import TransferError
    s, exp = _relay_of_c()
    for attempt in range(1, 5):
        acts = s.handle(E.Reported("w2", [P.Data(exp.request, "c", dumps(b"x" * 100), None)]))
        assert sends(acts, P.Put) == [("w1", P.Put("c", dumps(b"x" * 100), 0, "worker 'w2'"))]
        seq = s.tasks["b"].seq
        acts = s.handle(E.Reported("w1", [P.Damaged("c", 0, 0, "buffer 1 of 1: ...; it came from worker 'w2'")]))
        exports = sends(acts, P.Export)
        if attempt <= 3:
            assert s.tasks["b"].state == "processing" and [w for w, _m in exports] == ["w2"], attempt
            exp = exports[0][1]
        else:                                                   # given up: b's run is taken back
            assert not exports and sends(acts, P.Cancel) == [("w1", P.Cancel((seq,)))]
    error = s.tasks["b"].error
    assert s.tasks["b"].state == "erred" and isinstance(error, TransferError)
    assert "'c'" in str(error) and "worker 'w1'" in str(error) and "again 3 times" in str(error)
    assert s.tasks["c"].state == "memory" and s.tasks["c"].who_has == {"w2"}


def computed(s, key, *deps, **options):
    """``key`` submitted (of ``deps``, with spec's ``options``) and finished where it was placed."""
    s.handle(E.Submit([spec(key, *deps, **options)]))
    ts = s.tasks[key]
    s.handle(E.Reported(ts.worker, [P.Finished(ts.seq, BIG, "int", None, 0.001)]))
    return ts


def test_a_result_computed_again_from_scattered_data_lost_with_its_worker_says_it_was_lost():
    """``r(x)`` finished; x (scattered) died with w1 and its future was dropped; then r's holder
    dies too: r cannot be made again, and says LostDataError (x lost with w1), not "released,
    submit it again" (found by the differential test, seed 2949032720)."""
    s = sched("w1", "w2")
    _payload, _acts = scatter(s, "x", ["w1"])
    computed(s, "r", "x", workers=["w2"])
    s.handle(E.WorkerDied(death("w1")))
    assert isinstance(s.tasks["x"].error, LostDataError)
    s.handle(E.Drop(["x"]))
    acts = s.handle(E.WorkerDied(death("w2")))
    assert s.tasks["r"].state == "erred" and isinstance(s.tasks["r"].error, LostDataError)
    assert any(isinstance(a, Resolve) and isinstance(a.value, LostDataError) for a in acts)


def test_a_result_computed_again_from_scattered_data_released_since_names_both():
    """``r(x)`` finished on w2; x (scattered, alive on w1) was released; then w2 dies: r
    cannot be made again. It fails with LostDataError naming x and r, not "'x' was released,
    submit it again" (found by the differential test, seed 1715147430)."""
    s = sched("w1", "w2")
    _payload, _acts = scatter(s, "x", ["w1"])
    computed(s, "r", "x", workers=["w2"])
    s.handle(E.Drop(["x"]))
    acts = s.handle(E.WorkerDied(death("w2")))
    error = s.tasks["r"].error
    assert s.tasks["r"].state == "erred" and isinstance(error, LostDataError)
    assert (error.key, error.needed_by) == ("x", "r") and "released since" in str(error)
    assert any(isinstance(a, Resolve) and a.value is error for a in acts)
    assert pickle.loads(pickle.dumps(error)).needed_by == "r"


def test_a_result_computed_again_through_a_released_input_of_released_scattered_data_fails_once():
    """c(b(x)): x scattered, b and x released, c's holder dies. Computing c again brings b back,
    b cannot be made (x is gone) and fails c with it: c ends erred with that LostDataError, and
    the death's handling does not then try to make c wait (found by the differential test, seed
    1281857265: "may not go from 'erred' to 'waiting'", the cluster broken)."""
    s = sched("w1", "w2")
    _payload, _acts = scatter(s, "x", ["w1"])
    computed(s, "b", "x", workers=["w1"])
    computed(s, "c", "b", workers=["w2"], loose=True)
    s.handle(E.Drop(["x"]))
    s.handle(E.Drop(["b"]))
    acts = s.handle(E.WorkerDied(death("w2")))
    error = s.tasks["c"].error
    assert s.tasks["c"].state == "erred" and isinstance(error, LostDataError), s.tasks["c"].state
    assert (error.key, error.needed_by) == ("x", "b")
    assert any(isinstance(a, Resolve) and a.key == "c" for a in acts)
