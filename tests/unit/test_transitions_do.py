"""The transitions table says what each transition does (records.TRANSITIONS), and these tests
hold the scheduler to it: random event sequences driven through a real Scheduler's door, with
the modelled workers of test_scheduler_machine answering, and after every call each key whose
state changed is checked against the sentence of its last transition (tests/_transition_checks.py).
Every pair of the table must be reached: a pair never reached is a gap in the generator. Then
a handler broken on purpose, which the checks name; then the bugs they found. No processes."""
from __future__ import annotations

import os
import random
from collections import Counter

import pytest

from localcluster.scheduler import events as E
from localcluster.scheduler import forgetting
from localcluster.scheduler.records import TRANSITIONS, Deliver, Spec, WorkerState, copies_dropped
from localcluster.scheduler.state import Scheduler
from localcluster.wire import protocol as P

from _transition_checks import DOES, CheckedDoor, TransitionBroken
from test_scheduler_machine import ARGS, BIG, ERR, SMALL, SchedulerMachine

#: TRANSITIONS_SEED=n replays one run of the random test (each run prints its seed)
SEED_VARIABLE = "TRANSITIONS_SEED"


def test_the_checks_cover_exactly_the_table():
    assert set(DOES) == set(TRANSITIONS), (f"checked, not in the table: {set(DOES) - set(TRANSITIONS)}; "
                                           f"in the table, not checked: {set(TRANSITIONS) - set(DOES)}")


class Driver:
    """Random events through the checked door of a fresh Scheduler, the modelled workers of
    SchedulerMachine carrying out what it sends. Each action is small; ``step`` picks one by weight."""

    def __init__(self, rng: random.Random, reached: Counter):
        self.rng = rng
        self.m = SchedulerMachine(reached)

    def step(self) -> None:
        names, weights = zip(*WEIGHTS)
        getattr(self, self.rng.choices(names, weights)[0])()
        self.m.s.validate()

    def _held(self) -> list:
        return self.m.held_keys()

    def _pick(self, items):
        items = sorted(items)
        return self.rng.choice(items) if items else None

    def submit(self, n: int = 1) -> None:
        """``n`` tasks of one call (a map: more than the workers take at once), on held inputs,
        with or without retries; a key already held is submitted again."""
        held = self._held()
        deps = tuple(sorted(self.rng.sample(held, min(len(held), self.rng.choice([0, 1, 1, 2])))))
        workers = None
        if self.m.workers and self.rng.random() < 0.1:
            workers = frozenset([self._pick(self.m.workers)])
        retries, loose, need = self.rng.choice([0, 0, 1]), self.rng.random() < 0.5, \
            self.rng.choice([None] * 5 + [(("MEM", 1),)])
        names = [self.rng.choice("abcdef")] if n == 1 else [f"m{i}" for i in range(n)]
        timeout = 1.0 if self.rng.random() < 0.2 else None
        specs = [Spec(f"{name}({','.join(deps)})", 1, b"fn", ARGS, deps, 0, retries, timeout, workers, loose, need)
                 for name in names]
        for spec in specs:
            self.m.held[spec.key] += 1
        self.m.carry_out(self.m.door(E.Submit(specs)))

    def map(self) -> None:
        self.submit(self.rng.randint(3, 8))

    def scatter(self) -> None:
        key = next(self.m.scattered)
        self.m.held[key] += 1
        small = self.rng.random() < 0.3
        self.m.carry_out(self.m.door(E.Scatter([(key, SMALL if small else BIG)])))

    def release(self) -> None:
        key = self._pick(self._held())
        if key is not None:
            self.m.held[key] -= 1
            self.m.carry_out(self.m.door(E.Drop([key])))

    def cancel(self) -> None:
        key = self._pick(self._held())
        if key is not None:
            self.m.carry_out(self.m.door(E.CancelKeys([key])))

    def retry(self) -> None:
        erred = [k for k in self._held() if k in self.m.s.tasks and self.m.s.tasks[k].state == "erred"]
        if erred:
            self.m.carry_out(self.m.door(E.Retry([self._pick(erred)])))

    def fetch(self) -> None:
        key = self._pick(self._held())
        if key is not None:
            self.m.carry_out(E.opened(self.m.door(E.Fetch(key)))[1])

    def add_worker(self) -> None:
        if len(self.m.workers) < 4:
            self.m.add(self.rng.choice([1, 2]))

    def worker_dies(self) -> None:
        """Killed, crashed (the runs it had started blamed: KilledWorker past allowed_failures),
        out of memory, or killed for a run past its timeout (TaskTimeoutError)."""
        name = self._pick(self.m.workers)
        if name is not None:
            cause = self.rng.choice(["signal", "crash", "memory-limit", "timeout"])
            self.m.die(name, cause, crashed=cause == "crash", timed_out=cause == "timeout")

    def run_starts(self) -> None:
        name = self._pick(n for n, w in self.m.workers.items() if w.queue)
        if name is not None:
            w = self.m.workers[name]
            startable = [seq for seq in w.queue if seq not in w.started and set(w.deps[seq]) <= w.store]
            if startable and len(w.started) < w.nthreads:
                w.started.add(self.rng.choice(startable))

    def hand_off(self) -> None:
        name = self._pick(self.m.workers)
        if name is not None:
            self.m.carry_out(self.m.door(E.HandOff(name)))

    def pause(self) -> None:
        name = self._pick(self.m.workers)
        if name is not None:
            self.m.carry_out(self.m.door(E.SetPaused(name, self.rng.random() < 0.6)))

    def run_ends(self) -> None:
        """A run ends on its worker: a small or big result, an error, or damaged inputs."""
        name = self._pick(n for n, w in self.m.workers.items() if w.queue)
        if name is None:
            return
        w = self.m.workers[name]
        startable = [seq for seq in w.queue if seq in w.started or set(w.deps[seq]) <= w.store]
        if not startable:
            return
        seq = self.rng.choice(startable)
        key = w.queue.pop(seq)
        w.asks.pop(seq, None)
        w.started.discard(seq)
        outcome = self.rng.choices(["small", "big", "error", "damaged"], [3, 3, 2, 1])[0]
        if outcome == "damaged":
            w.replies.append(P.Damaged(self.rng.choice(("",) + tuple(w.deps[seq])), seq, 0, "damaged in a test"))
        elif outcome == "error":
            w.replies.append(P.Failed(seq, ERR))
        else:
            w.store.add(key)
            w.replies.append(P.Finished(seq, 4, "int", SMALL, 0.001) if outcome == "small"
                             else P.Finished(seq, BIG.nbytes, "bytes", None, 0.001))
        if self.rng.random() < 0.7:
            self.frame(name)

    def frame(self, name=None) -> None:
        """A worker's answers arrive (steals and exports answered first)."""
        name = name or self._pick(n for n, w in self.m.workers.items() if w.replies or w.exports or w.steals)
        if name is None:
            return
        w = self.m.workers[name]
        for key, req in w.exports:
            w.replies.append(P.Data(req, key, BIG, None) if key in w.store
                             else P.Data(req, key, None, b"gone"))
        for asked in w.steals:
            taken = tuple(seq for seq in asked if seq in w.queue and seq not in w.started)
            for seq in taken:
                del w.queue[seq]
                w.asks.pop(seq, None)
            w.replies.append(P.Unqueued(asked, taken))
        w.exports, w.steals = [], []
        msgs, w.replies = w.replies, []
        if msgs:
            self.m.carry_out(self.m.door(E.Reported(name, msgs)))

    def copies_damaged(self) -> None:
        """From now on Puts arrive damaged (not stored), or whole again (the model's switch)."""
        self.m.damaging = not self.m.damaging and self.rng.random() < 0.5


WEIGHTS = [("submit", 5), ("map", 1), ("scatter", 1), ("release", 3), ("cancel", 1), ("retry", 1), ("fetch", 1),
           ("add_worker", 1.5), ("worker_dies", 1.5), ("hand_off", 0.3), ("pause", 0.5), ("run_ends", 8), ("run_starts", 2),
           ("frame", 3), ("copies_damaged", 0.5)]


def _drive(seed: int, least: int, most: int, steps: int) -> Counter:
    """Runs of ``steps`` random actions each, every door call checked: at least ``least`` runs,
    and more (up to ``most``) until every pair of the table was reached. The pairs reached."""
    rng = random.Random(seed)
    reached: Counter = Counter()
    for run in range(most):
        if run >= least and all(reached[pair] for pair in TRANSITIONS):
            break
        driver = Driver(rng, reached)
        for _ in range(steps):
            driver.step()
    return reached


def _seed() -> int:
    seed = int(os.environ.get(SEED_VARIABLE) or random.randrange(1 << 32))
    print(f"random seed: {seed} (replay with {SEED_VARIABLE}={seed})")
    return seed


def _assert_every_pair_reached(reached: Counter, seed: int) -> None:
    never = [pair for pair in TRANSITIONS if not reached[pair]]
    assert not never, (f"pairs the generator never reached (seed {seed}): {never}; "
                       f"reached: {dict(reached)}")


@pytest.mark.timeout(60)
def test_every_transition_does_what_the_table_says():
    seed = _seed()
    _assert_every_pair_reached(_drive(seed, least=10, most=150, steps=150), seed)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_every_transition_does_what_the_table_says_at_length():
    seed = _seed()
    _assert_every_pair_reached(_drive(seed, least=100, most=300, steps=300), seed)


# --- the checks can fail -------------------------------------------------------------------

def _finished_on_w1(door: CheckedDoor, key: str) -> None:
    """``key`` submitted and finished on w1, its data left there (too big to travel back)."""
    door(E.Submit([Spec(key, 1, b"fn", ARGS, ())]))
    door(E.Reported("w1", [P.Finished(door.s.tasks[key].seq, BIG.nbytes, "bytes", None, 0.0)]))


def _no_frees(monkeypatch) -> None:
    """Break letting go on purpose: copies are forgotten, and no worker is told to free them."""
    def forgotten_silently(ts, worker):
        copies_dropped(ts, worker)
        return []
    monkeypatch.setattr(forgetting, "copies_dropped", forgotten_silently)


def test_a_transition_that_stops_doing_what_it_says_is_named_with_its_sentence(monkeypatch):
    door = CheckedDoor(Scheduler())
    door(E.AddWorker("w1", 1))
    _finished_on_w1(door, "k")
    assert door.s.tasks["k"].who_has == {"w1"}
    _no_frees(monkeypatch)
    with pytest.raises(TransitionBroken) as info:
        door(E.Drop(["k"]))
    msg = str(info.value)
    assert "'k' went memory -> released (released)" in msg
    assert repr(TRANSITIONS["memory", "released"]) in msg
    assert "but: no Free to holder w1." in msg and "story of 'k'" in msg


def test_a_run_sent_without_its_claim_is_named(monkeypatch):
    """Another pair, another claim: a Run sent whose resources its worker never counted."""
    door = CheckedDoor(Scheduler())
    door(E.AddWorker("w1", 1, {"MEM": 2}))
    monkeypatch.setattr(WorkerState, "sent", lambda ws, seq, key, need: ws.processing.__setitem__(seq, key))
    with pytest.raises(TransitionBroken) as info:
        door(E.Submit([Spec("k", 1, b"fn", ARGS, (), 0, 0, None, None, False, (("MEM", 1),))]))
    msg = str(info.value)
    assert "'k' went ready -> processing (assign)" in msg and repr(TRANSITIONS["ready", "processing"]) in msg
    assert "but: resources (('MEM', 1),) not claimed on w1." in msg


def test_the_random_test_finds_a_broken_transition(monkeypatch):
    _no_frees(monkeypatch)
    with pytest.raises(TransitionBroken, match=r"went memory -> released .*no Free to holder"):
        _drive(_seed(), least=1, most=50, steps=150)


# --- what the checks found: bugs -----------------------------------------------------------------

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
