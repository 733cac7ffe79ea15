"""The supervision policy without processes: events in, instructions out, plain asserts.
Every event goes through ``Checked``, which runs ``validate()`` after it."""
from __future__ import annotations

import pytest

from localcluster.death import WorkerDeath, WorkerStartupError
from localcluster.supervision.policy import (HANDOFF_GRACE, STACK_GRACE, STARTUP_RETRIES, STOP_GRACE, Accept, Adapt,
                                             DumpStacks, GiveUp, HandOff, Kill, Limits, Note, Policy, Refuse,
                                             SendStop, SetPaused, Spawn)

MiB = 2**20
LIMIT = 500 * MiB


class Checked:
    """The policy, with ``validate()`` after every public call (by construction, not a list)."""

    def __init__(self, policy: Policy):
        self.policy = policy

    def __getattr__(self, name):
        attr = getattr(self.policy, name)
        if name.startswith("_") or not callable(attr):
            return attr

        def checked(*args, **kwargs):
            out = attr(*args, **kwargs)
            self.policy.validate()
            return out
        return checked


def make(**limits) -> Checked:
    return Checked(Policy(Limits(limits.pop("limit", LIMIT), **limits)))


def started(p: Checked, *names: str, now: float = 0.0) -> None:
    for i, name in enumerate(names):
        p.spawned(name, 100 + i, now)
        assert p.ready(name, now, 20 * MiB) == [Accept(name)]
    p.cluster_is(starting=False, closing=False)


def death(name: str, cause: str, tasks: tuple = ()) -> WorkerDeath:
    return WorkerDeath(name, 1, cause, -9, "SIGKILL", tasks=tasks)


def kinds(out: list) -> list:
    return [type(i).__name__ for i in out]


# --- size and start-up -------------------------------------------------------------------------

def test_scale_spawns_up_and_hands_off_the_idlest_down():
    p = make()
    assert p.scale(3, 0.0, {}) == [Spawn(), Spawn(), Spawn()]
    started(p, "w0", "w1", "w2")
    out = p.scale(1, 1.0, {"w0": (1, 5, 0), "w1": (1, 0, 0), "w2": (1, 0, 3)})
    assert out == [HandOff("w1"), HandOff("w2")]
    assert p.status("w1") == p.status("w2") == "closing" and p.status("w0") == "running"
    # a scale-down waits for the worker's tasks however long they run: no deadline
    assert p.tick(1000.0) == []
    assert p.retired("w1", 1000.0) == [SendStop("w1")]
    assert p.tick(1000.0 + STOP_GRACE + 0.1) == [Kill("w1")]


def test_a_worker_not_yet_ready_is_stopped_without_a_hand_off():
    p = make()
    p.spawned("w0", 1, 0.0)
    assert p.scale(0, 0.0, {}) == [SendStop("w0")]
    assert p.ready("w0", 0.1, 20 * MiB) == []      # its Ready arrives late: ignored


def test_limit_too_small_is_refused_while_starting_and_a_failed_start_later():
    p = make(limit=30 * MiB)
    p.spawned("w0", 7, 0.0)
    out = p.ready("w0", 0.0, 28 * MiB)
    assert kinds(out) == ["Refuse", "SendStop"]
    assert "memory_limit=30.00 MiB is too small" in str(out[0].error) and "pid 7" in str(out[0].error)
    p = make(limit=30 * MiB)
    p.cluster_is(starting=False, closing=False)
    p.spawned("w1", 8, 0.0)
    out = p.ready("w1", 0.0, 28 * MiB)
    assert kinds(out) == ["Note", "Kill"] and "too small" in out[0].line


def test_failed_starts_back_off_then_give_up():
    p = make()
    p.cluster_is(starting=False, closing=False)
    p.policy.target = 1
    now = 0.0
    delays = []
    for i in range(STARTUP_RETRIES):
        p.spawned(f"w{i}", i, now)
        out = p.exited(death(f"w{i}", "exception"), now)
        if i < STARTUP_RETRIES - 1:
            assert out == []
            delays.append(p.respawn_at[-1] - now)
            assert p.tick(now + delays[-1] - 0.01) == []
            now += delays[-1]
            assert p.tick(now) == [Spawn()]
    assert kinds(out) == ["GiveUp"] and isinstance(out[0].error, WorkerStartupError)
    assert delays == pytest.approx([0.1, 0.2]) and p.respawn_at == []


def test_an_accepted_start_clears_the_run_of_failures():
    p = make()
    p.cluster_is(starting=False, closing=False)
    p.spawned("w0", 1, 0.0)
    p.exited(death("w0", "exception"), 0.0)
    p.spawned("w1", 2, 0.2)
    p.ready("w1", 0.2, 20 * MiB)
    assert p.startup_failures == []


def test_a_death_is_replaced_on_the_next_tick_but_not_when_requested_or_closing():
    p = make()
    p.scale(2, 0.0, {})
    started(p, "w0", "w1")
    assert p.exited(death("w0", "signal", ("t",)), 1.0) == []
    assert p.tick(1.0) == [Spawn()]
    p.spawned("w2", 3, 1.0)
    assert p.exited(death("w1", "requested"), 2.0) == [] and p.tick(2.0) == []
    p.cluster_is(starting=False, closing=True)        # the cluster moves first, then tells the policy
    p.close(3.0)
    assert p.exited(death("w2", "signal"), 3.0) == [] and p.tick(3.0) == []


# --- adapt ---------------------------------------------------------------------------------------

def never_asked() -> bool:
    raise AssertionError("holding() asked while the size does not fall to 0")


def look(p: Checked, now: float, slots: int, threads: int = 1, holding=never_asked, idleness=None) -> list:
    """One adapt tick, as the supervisor sends it."""
    return p.adapting(now, slots, threads, holding, lambda: idleness or {})


def test_adapt_grows_at_once_while_tasks_wait_up_to_maximum():
    p = make()
    p.cluster_is(starting=False, closing=False)
    assert p.adapt(Adapt(0, 2, 1.5), 0.0, {}) == []       # nothing to do, nothing started
    assert look(p, 0.05, 0) == []
    assert look(p, 0.10, 5) == [Spawn(), Spawn()]          # 5 tasks, 1 thread each: capped at 2
    p.spawned("w0", 1, 0.1)
    p.spawned("w1", 2, 0.1)
    assert look(p, 0.15, 5) == [] and p.target == 2        # the starting ones count: no double spawn
    q = make()
    q.adapt(Adapt(0, 4, 1.5), 0.0, {})
    assert look(q, 0.1, 5, threads=2) == [Spawn()] * 3     # 5 slots of 2-thread workers: 3


def test_adapt_shrinks_only_after_the_idle_delay_handing_data_off():
    p = make()
    p.adapt(Adapt(0, 2, 1.5), 0.0, {})
    look(p, 0.0, 4)
    started(p, "w0", "w1")
    assert look(p, 1.0, 1) == []                   # one run left: the surplus clock starts
    assert look(p, 2.4, 1) == []                   # not yet 1.5 s
    assert look(p, 2.5, 1, idleness={"w0": (1, 1, 0), "w1": (1, 0, 4)}) == [HandOff("w1")]
    assert p.target == 1 and p.status("w1") == "closing"
    assert look(p, 2.6, 0) == [] and look(p, 3.9, 0) == []     # the next look: one idle period on
    assert look(p, 4.0, 0, holding=lambda: False) == [HandOff("w0")] and p.target == 0


def test_work_coming_back_during_the_idle_delay_resets_its_clock():
    p = make()
    p.adapt(Adapt(0, 2, 1.5), 0.0, {})
    look(p, 0.0, 2)
    started(p, "w0", "w1")
    assert look(p, 1.0, 0) == []
    assert look(p, 2.0, 2) == []                   # busy again
    assert look(p, 2.1, 0) == [] and look(p, 3.5, 0) == []
    assert kinds(look(p, 3.6, 0, holding=lambda: False)) == ["HandOff", "HandOff"]


def test_adapt_keeps_one_worker_while_workers_hold_needed_data():
    p = make()
    p.adapt(Adapt(0, 2, 1.0), 0.0, {})
    look(p, 0.0, 2)
    started(p, "w0", "w1")
    look(p, 1.0, 0)
    assert look(p, 2.0, 0, holding=lambda: True, idleness={"w0": (1, 0, 1), "w1": (1, 0, 0)}) == [HandOff("w1")]
    assert p.target == 1
    assert look(p, 2.1, 0) == [] and look(p, 3.1, 0, holding=lambda: True) == []    # asked once a period
    assert p.target == 1 and p.status("w0") == "running"
    assert look(p, 4.2, 0, holding=lambda: False) == [HandOff("w0")]


def test_adapt_never_goes_below_minimum_and_brings_the_size_inside_new_bounds():
    p = make()
    p.scale(4, 0.0, {})
    started(p, "w0", "w1", "w2", "w3")
    out = p.adapt(Adapt(1, 2, 1.0), 1.0, {"w0": (1, 3, 0), "w1": (1, 0, 0), "w2": (1, 2, 0), "w3": (1, 0, 0)})
    assert out == [HandOff("w1"), HandOff("w3")] and p.target == 2
    look(p, 1.1, 0)
    assert look(p, 2.1, 0) == [HandOff("w0")] and p.target == 1       # minimum 1: holding() not asked
    assert look(p, 3.2, 0) == [] and look(p, 4.3, 0) == []
    assert p.adapt(Adapt(3, 5, 1.0), 5.0, {}) == [Spawn(), Spawn()] and p.target == 3   # again: replaced
    assert p.adaptive == Adapt(3, 5, 1.0)


def test_scale_stops_adapting_and_restart_keeps_it():
    p = make()
    p.adapt(Adapt(0, 3, 1.0), 0.0, {})
    look(p, 0.0, 3)
    started(p, "w0", "w1", "w2")
    p.stop_all(1.0)                                # restart: every old one leaves ...
    assert p.refill(1.0, {}) == [Spawn()] * 3 and p.adaptive is not None    # ... and as many come
    for i, name in enumerate(("w3", "w4", "w5")):
        p.spawned(name, 10 + i, 1.0)
    assert kinds(p.scale(1, 2.0, {})) == ["SendStop", "SendStop"]    # two not yet ready: no hand-off
    assert p.adaptive is None and p.surplus_since is None
    assert look(p, 2.1, 10) == []                  # no longer adapting: the work sets nothing


def test_a_death_while_adapting_is_replaced_only_while_the_work_needs_it():
    p = make()
    p.adapt(Adapt(0, 2, 1.0), 0.0, {})
    look(p, 0.0, 2)
    started(p, "w0", "w1")
    p.exited(death("w1", "signal", ("t",)), 1.0)
    assert look(p, 1.0, 1) == [] and p.target == 1     # one task left: its replacement is not due
    assert p.tick(1.05) == []
    p.exited(death("w0", "signal", ("t",)), 2.0)
    assert look(p, 2.0, 1) == [] and p.tick(2.0) == [Spawn()]    # its replacement, due already, comes once
    p.spawned("w2", 3, 2.0)
    assert look(p, 2.05, 1) == []
    p.slots.pop("w2")   # (gone with no replacement due: a target the workers fall short of) ...
    assert look(p, 2.1, 1) == [Spawn()] and p.target == 1      # ... is made up on the adapt tick


def test_adapt_validate_catches_a_target_outside_the_bounds():
    p = make()
    p.adapt(Adapt(0, 2, 1.0), 0.0, {})
    p.policy.target = 3
    with pytest.raises(AssertionError, match="adapting between 0 and 2 with target 3"):
        p.validate()


def test_closing_stops_adapting():
    p = make()
    p.adapt(Adapt(1, 2, 1.0), 0.0, {})
    p.cluster_is(starting=False, closing=True)
    p.close(1.0)
    assert p.adaptive is None and look(p, 1.1, 5) == []


def test_a_memory_kill_of_an_idle_worker_is_a_failed_start():
    p = make()
    started(p, "w0", "w1")
    p.exited(death("w0", "memory-limit"), 1.0)
    assert len(p.startup_failures) == 1
    # between two tasks, after some ran: what they kept killed it, respawning helps
    p.exited(death("w1", "memory-limit"), 1.0, ran_tasks=True)
    assert len(p.startup_failures) == 1 and len(p.respawn_at) == 2


# --- memory -------------------------------------------------------------------------------------

def test_pause_resume_and_terminate():
    p = make()
    started(p, "w0")
    out = p.sampled("w0", 1.0, int(0.85 * LIMIT), 0)
    assert out[0] == SetPaused("w0", True) and "paused" in out[1].line and p.status("w0") == "paused"
    assert p.sampled("w0", 2.0, int(0.85 * LIMIT), 0) == []
    assert p.sampled("w0", 3.0, int(0.5 * LIMIT), 0)[0] == SetPaused("w0", False)
    out = p.sampled("w0", 4.0, int(0.97 * LIMIT), 0)
    assert kinds(out) == ["Note", "Kill"] and "exceeded 95% memory budget" in out[0].line
    assert p.slots["w0"].reason == "memory-limit" and p.slots["w0"].peak_memory == int(0.97 * LIMIT)


def test_no_limit_no_memory_policy():
    p = make(limit=None)
    started(p, "w0")
    assert p.sampled("w0", 1.0, 10 * LIMIT, 0) == []


def test_a_worker_paused_with_nothing_to_spill_is_restarted_as_a_leak():
    p = make(leak_restart=10.0)
    started(p, "w0", "w1")
    p.sampled("w0", 1.0, int(0.85 * LIMIT), 0)
    assert p.sampled("w0", 10.9, int(0.85 * LIMIT), 0) == []        # not yet 10 s
    out = p.sampled("w0", 11.0, int(0.85 * LIMIT), 1 * MiB)
    assert out == [HandOff("w0")]
    slot = p.slots["w0"]
    assert slot.reason == "memory-leak" and "unmanaged memory 424.00 MiB of 500.00 MiB" in slot.leak
    assert "above memory_pause for 10 s with nothing to spill" in slot.leak
    assert len(p.alive()) == 1
    # its data moved: Stop, then a kill if it ignores it; then a replacement
    assert p.retired("w0", 12.0) == [SendStop("w0")]
    assert p.tick(12.0 + STOP_GRACE + 0.01) == [Kill("w0")]
    p.policy.target = 2
    assert p.exited(death("w0", "memory-leak"), 15.0) == [] and p.tick(15.0) == [Spawn()]
    assert p.startup_failures == []


def test_a_paused_worker_holding_results_is_not_a_leak():
    """Spilling its results would bring it down: the worker spills, the policy waits."""
    p = make(leak_restart=10.0)
    started(p, "w0")
    p.sampled("w0", 0.0, int(0.85 * LIMIT), int(0.5 * LIMIT))
    assert p.sampled("w0", 60.0, int(0.85 * LIMIT), int(0.5 * LIMIT)) == []


def test_memory_kept_warm_for_reuse_is_not_taken_for_a_leak():
    p = make(leak_restart=10.0)
    started(p, "w0")
    p.sampled("w0", 0.0, int(0.85 * LIMIT), 0, int(0.4 * LIMIT))
    assert p.sampled("w0", 60.0, int(0.85 * LIMIT), 0, int(0.4 * LIMIT)) == []
    assert p.slots["w0"].unmanaged == int(0.85 * LIMIT) - int(0.4 * LIMIT)


def test_leak_restart_off():
    p = make(leak_restart=None)
    started(p, "w0")
    p.sampled("w0", 0.0, int(0.85 * LIMIT), 0)
    assert p.sampled("w0", 600.0, int(0.85 * LIMIT), 0) == []


def test_a_leaking_worker_whose_hand_off_hangs_is_stopped_then_killed():
    p = make()
    started(p, "w0")
    p.sampled("w0", 0.0, int(0.85 * LIMIT), 0)
    assert p.sampled("w0", 10.0, int(0.85 * LIMIT), 0) == [HandOff("w0")]
    assert p.tick(10.0 + HANDOFF_GRACE) == [SendStop("w0")]
    assert p.tick(10.0 + HANDOFF_GRACE + STOP_GRACE) == [Kill("w0")]


def test_crossing_the_terminate_line_while_handing_off_is_a_memory_kill():
    p = make()
    started(p, "w0")
    p.sampled("w0", 0.0, int(0.85 * LIMIT), 0)
    p.sampled("w0", 10.0, int(0.85 * LIMIT), 0)
    out = p.sampled("w0", 11.0, int(0.99 * LIMIT), 0)
    assert kinds(out) == ["Note", "Kill"] and p.slots["w0"].reason == "memory-limit"


def test_restart_during_a_hand_off_is_requested():
    p = make()
    started(p, "w0")
    p.sampled("w0", 0.0, int(0.85 * LIMIT), 0)
    p.sampled("w0", 10.0, int(0.85 * LIMIT), 0)
    assert p.stop_all(11.0) == [SendStop("w0")] and p.slots["w0"].reason == "requested"


def test_leak_blame_only_for_a_task_running_at_every_leak_restart():
    p = make()
    assert p.leak_blame(("a", "b")) == ("a", "b")
    assert p.leak_blame(("b", "c")) == ("b",)
    assert p.leak_blame(("c",)) == ()
    assert p.leak_blame(("d",)) == ("d",)      # nothing in common any more: a new run of suspects


# --- timeouts, heartbeats: the stacks first, then the kill ----------------------------------------

def test_timeout_dumps_stacks_then_kills_when_they_arrive():
    p = make()
    started(p, "w0")
    assert p.observed("w0", 5.0, {7: (4.0, 5.0)}, 5.0) == []
    assert p.observed("w0", 6.1, {7: (5.1, 5.0)}, 6.0) == [DumpStacks("w0")]
    assert p.slots["w0"].timed_out == (7, 5.1) and p.slots["w0"].reason == "timeout"
    assert p.observed("w0", 6.2, {7: (5.2, 5.0)}, 6.0) == []           # no second decision
    assert p.stacks_arrived("w0") == [Kill("w0")]
    assert p.stacks_arrived("w0") == []


def test_timeout_kills_anyway_when_the_stacks_never_come():
    p = make()
    started(p, "w0")
    p.observed("w0", 6.0, {7: (5.1, 5.0)}, 6.0)
    assert p.tick(6.0 + STACK_GRACE - 0.01) == []
    assert p.tick(6.0 + STACK_GRACE) == [Kill("w0")]


def test_unresponsive_takes_the_same_path():
    p = make(worker_ttl=3.0)
    started(p, "w0")
    assert p.observed("w0", 10.0, {}, 8.0) == []
    out = p.observed("w0", 11.5, {}, 8.0)
    assert kinds(out) == ["Note", "DumpStacks"] and "no heartbeat for 3.5 s (worker_ttl=3)" in out[0].line
    assert p.slots["w0"].reason == "unresponsive"
    assert p.tick(11.5 + STACK_GRACE) == [Kill("w0")]


def test_no_heartbeat_yet_or_no_ttl_is_not_unresponsive():
    assert make(worker_ttl=3.0).observed("nobody", 100.0, {}, 1.0) == []
    p = make(worker_ttl=None)
    started(p, "w0")
    assert p.observed("w0", 100.0, {}, 1.0) == []
    p = make(worker_ttl=3.0)
    started(p, "w0")
    assert p.observed("w0", 100.0, {}, 0.0) == []


def test_stop_all_asks_then_kills():
    p = make()
    started(p, "w0", "w1")
    assert p.stop_all(0.0) == [SendStop("w0"), SendStop("w1")]
    assert p.stop_all(0.5) == []
    assert p.tick(STOP_GRACE) == [Kill("w0"), Kill("w1")]
    assert p.tick(STOP_GRACE + 1) == []


def test_validate_catches_a_broken_invariant():
    p = make()
    started(p, "w0")
    p.slots["w0"].reason = "timeout"        # a reason while running
    with pytest.raises(AssertionError, match="reason"):
        p.validate()


def test_every_instruction_is_a_small_frozen_value():
    for i in (Spawn(), Accept("w"), Refuse(ValueError("x")), SendStop("w"), Kill("w"), DumpStacks("w"),
              HandOff("w"), SetPaused("w", True), Note("w", "x"), GiveUp(ValueError("x"))):
        with pytest.raises(AttributeError):
            i.worker = "other"


def test_adapt_under_any_sequence_of_work_and_deaths_stays_within_its_bounds():
    """Random work, deaths and retirements (hypothesis): after each event ``validate()``
    holds (Checked), never more workers alive than ``maximum``, and never none while tasks
    wait or data is held."""
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies
    event = st.one_of(st.tuples(st.just("look"), st.integers(0, 9), st.booleans()),
                      st.tuples(st.just("die"), st.integers(0, 9), st.booleans()),
                      st.tuples(st.just("retire"), st.integers(0, 9), st.booleans()))

    @hypothesis.settings(max_examples=150, deadline=None)
    @hypothesis.given(st.integers(0, 2), st.integers(0, 3), st.lists(event, max_size=60))
    def run(minimum, extra, events):
        p = make()
        p.cluster_is(starting=False, closing=False)
        names = iter(f"w{i}" for i in range(10**6))
        bounds = Adapt(minimum, minimum + extra, 0.3)
        now = 0.0

        def carry_out(out):
            for i in out:
                if type(i) is Spawn:
                    name = next(names)
                    p.spawned(name, 1, now)
                    p.ready(name, now, 20 * MiB)
                elif type(i) is HandOff:
                    p.retired(i.worker, now)

        carry_out(p.adapt(bounds, now, {}))
        for kind, n, flag in events:
            now += 0.1
            live = sorted(p.slots)
            if kind == "look":
                carry_out(look(p, now, n, holding=lambda: flag))
                carry_out(p.tick(now))
                alive = len(p.alive())
                assert alive <= bounds.maximum
                if n and bounds.maximum:
                    assert alive >= 1
            elif live and kind == "die":
                p.exited(death(live[n % len(live)], "signal" if flag else "requested"), now)
            elif live:
                carry_out(p.retired(live[n % len(live)], now))
    run()


def test_two_replacements_due_in_one_tick_never_overshoot_the_target():
    """Found by the adapt property test: a retired worker and another die one after the other
    (neither asked to), both replacements fall due in the same tick: only as many Spawns as
    the target lacks, though no slot exists yet for the first."""
    p = make()
    p.cluster_is(starting=False, closing=False)
    p.scale(1, 0.0, {})
    started(p, "w0")
    p.exited(death("w0", "signal", ("t",)), 1.0)
    p.policy.respawn_at.append(1.0)          # a second death's replacement, due at the same time
    assert p.tick(1.0) == [Spawn()]
