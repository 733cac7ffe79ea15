"""The scheduler's invariants, checked (``Scheduler.validate``).

Pure and read-only. The scheduler's unit tests check them after every event, and the
integration tests at teardown (``LocalCluster.validate``); an AssertionError names the
first broken rule with the key or worker concerned, followed by the story of that key
(its last transitions, ``Scheduler.story``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Protocol, get_args

from .records import SLACK, Task, TaskState, WorkerState

if TYPE_CHECKING:
    from .asking import Asking
    from .forgetting import Forgetting
    from .placement import Placement
    from .transfers import Transfers


class Scheduler(Protocol):
    """What the checks read of the scheduler (``scheduler.Scheduler`` is one): declared
    here, since the scheduler imports this module and is not imported back."""
    tasks: dict[str, Task]
    workers: dict[str, WorkerState]
    gone: set
    placement: Placement
    forgetting: Forgetting
    transfers: Transfers
    asking: Asking

    @property
    def ready_keys(self) -> set: ...

    def story(self, key: str) -> str: ...

STATES = frozenset(get_args(TaskState))


def check(s: "Scheduler") -> None:
    for key, ts in s.tasks.items():
        try:
            assert ts.key == key, f"task filed under {key!r} is {ts.key!r}"
            assert ts.state in STATES, f"{key!r} has unknown state {ts.state!r}"
            _check_task(s, ts)
        except AssertionError as e:
            raise _with_story(s, e, key) from None
    _check_runs(s)
    _check_workers(s)
    _check_transfers(s)
    _check_references(s)


def _with_story(s: "Scheduler", e: AssertionError, key: Optional[str]) -> AssertionError:
    """The broken rule, then what happened to the key it is about."""
    return AssertionError(f"{e}\n{s.story(key)}") if key is not None else e


def _check_task(s: "Scheduler", ts: Task) -> None:
    key = ts.key
    if ts.state == "processing":
        assert ts.worker in s.workers, f"{key!r} processing on unknown worker {ts.worker!r}"
        assert s.placement.task_of(ts.seq) is ts, f"{key!r}: run {ts.seq} not recorded as this task's"
        assert s.workers[ts.worker].processing.get(ts.seq) == key, f"{key!r} missing from {ts.worker}'s processing"
    if ts.state == "memory":
        assert ts.who_has or ts.data is not None, f"{key!r} in memory with no copy anywhere"
    if ts.state == "ready":
        assert key in s.ready_keys, f"{key!r} is ready but in no ready queue"
    if ts.state == "waiting":
        assert ts.waiting_on <= set(ts.deps), f"{key!r} waits on {ts.waiting_on - set(ts.deps)}, not its deps"
        assert ts.waiting_on, f"{key!r} is waiting on nothing"
        late = [d for d in ts.waiting_on if d not in s.tasks or s.tasks[d].state == "memory"]
        assert not late, f"{key!r} waits on {late}, already in memory or forgotten"
        failed = [d for d in ts.waiting_on if s.tasks[d].state in ("erred", "lost")]
        assert not failed, f"{key!r} waits on {failed}, which failed: it would wait forever"
    else:
        assert not ts.waiting_on, f"{key!r} is {ts.state} but waits on {ts.waiting_on}"
    if ts.state in ("ready", "processing"):
        missing = [d for d in ts.deps if d not in s.tasks or s.tasks[d].state != "memory"]
        assert not missing, f"{key!r} is {ts.state} but its inputs {missing} are not in memory"
    assert (ts.worker is not None) == (ts.state == "processing"), f"{key!r} is {ts.state} with worker {ts.worker!r}"
    if ts.state != "memory":
        assert not ts.who_has and ts.data is None, f"{key!r} is {ts.state} but has data"
    if ts.state in ("erred", "lost"):
        assert ts.error is not None, f"{key!r} is {ts.state} with no error"
    if ts.fetchers:
        assert ts.state in ("waiting", "ready", "processing"), f"{key!r} is {ts.state} with fetches waiting"
    if ts.state == "released":
        assert any(d in s.tasks for d in ts.dependents), f"{key!r} released but kept with no dependents"
    if ts.state in ("waiting", "ready", "processing"):
        assert ts.terms is not None, f"{key!r} is {ts.state} without a spec"
    for name in ts.who_has:
        assert name in s.workers, f"{key!r} held by unknown worker {name!r}"
        assert key in s.workers[name].has, f"{key!r}: {name} in who_has but the worker does not list it"
    for d in ts.deps:
        if d in s.tasks:
            assert key in s.tasks[d].dependents, f"{key!r} depends on {d!r}, which does not list it as dependent"
    for d in ts.dependents:
        assert d not in s.tasks or key in s.tasks[d].deps, f"{key!r} lists dependent {d!r}, which does not depend on it"


def _check_runs(s: "Scheduler") -> None:
    runs, cancelled = s.placement.runs, s.forgetting.cancelled_runs
    for seq, run in runs.items():
        key, worker = run.key, run.worker
        ts = s.tasks.get(key)
        try:
            assert ts is run and ts.state == "processing" and ts.seq == seq, \
                f"run {seq} of {key!r} on {worker} is not that task's current run"
        except AssertionError as e:
            raise _with_story(s, e, key) from None
    empty = {seq for ws in s.workers.values() for seq, k in ws.processing.items() if k is None}
    for seq, key in cancelled.items():
        try:
            assert seq not in runs, f"run {seq} of {key!r} is both running and cancelled"
            assert seq in empty, f"cancelled run {seq} of {key!r} holds no worker's slot"
        except AssertionError as e:
            raise _with_story(s, e, key) from None
    for seq, name in (*s.placement.stealing.items(), *s.placement.started.items()):
        assert name in s.workers and seq in s.workers[name].processing, \
            f"run {seq} asked back from {name}, which does not hold it"


def _check_workers(s: "Scheduler") -> None:
    cancelled = s.forgetting.cancelled_runs
    for name, ws in s.workers.items():
        assert ws.name == name, f"worker filed under {name!r} is {ws.name!r}"
        assert name not in s.gone, f"{name} is both live and gone"
        for seq, key in ws.processing.items():
            try:
                if key is None:
                    assert seq in cancelled, f"{name}: empty slot {seq} that is not a cancelled run"
                else:
                    run = s.placement.task_of(seq)
                    assert run is not None and (run.key, run.worker) == (key, name), \
                        f"{name}: slot {seq} ({key!r}) is not a recorded run"
            except AssertionError as e:
                raise _with_story(s, e, key) from None
        for key in ws.has:
            try:
                assert key in s.tasks and name in s.tasks[key].who_has, f"{name} lists {key!r}, not in its who_has"
            except AssertionError as e:
                raise _with_story(s, e, key) from None
        _check_claims(s, ws)


def _check_claims(s: "Scheduler", ws: WorkerState) -> None:
    """What a worker's runs claim is its resources minus what is available, and never more
    than it has; every run that asks for resources holds its claim."""
    name = ws.name
    for seq, key in ws.processing.items():
        ts = s.tasks.get(key) if key is not None else None
        need = ts.terms.resources if ts is not None and ts.seq == seq and ts.terms is not None else None
        try:
            assert need is None or ws.claims.get(seq) == need, \
                f"{name}: run {seq} of {key!r} asks for {need} but claims {ws.claims.get(seq)}"
        except AssertionError as e:
            raise _with_story(s, e, key) from None
    stray = set(ws.claims) - set(ws.processing)
    assert not stray, f"{name}: runs {sorted(stray)} claim resources but are not processing there"
    assert set(ws.available) == set(ws.resources), f"{name}: available {ws.available} names other resources " \
                                                   f"than it declares {ws.resources}"
    for resource, total in ws.resources.items():
        claimed = sum(amount for need in ws.claims.values() for r, amount in need if r == resource)
        assert abs(total - ws.available[resource] - claimed) <= SLACK * (1 + len(ws.claims)), \
            f"{name}: {resource} {total:g} - available {ws.available[resource]:g} != claimed {claimed:g}"
        assert ws.available[resource] >= -SLACK, f"{name}: {resource} overdrawn: available {ws.available[resource]:g}"
    for need in ws.claims.values():
        assert all(r in ws.resources for r, _amount in need), f"{name}: a claim {need} of what it does not have"


def _check_transfers(s: "Scheduler") -> None:
    t = s.transfers
    for req, e in t.exports.items():
        assert e.holder in s.workers, f"export {req} of {e.key!r} asks dead worker {e.holder}"
        assert (e.target is None) != (e.client_request is None), f"export {req}: a relay or a fetch, not both"
        if e.target is not None:
            assert t.relaying.get((e.key, e.target)) == req, f"relay {req} of {e.key!r} not in relaying"
    for (key, target), req in t.relaying.items():
        assert req in t.exports and t.exports[req].key == key, f"relaying ({key!r}, {target}) has no export"
    for ack, (key, target) in t.unacked.items():
        assert target in s.workers, f"unacked put {ack} of {key!r} to dead worker {target}"
    sent = t.sent_sizes()
    for holder, queue in t.waiting.items():
        assert queue, f"an empty queue of exports kept for {holder}"
        for req in queue:
            assert req in t.exports and t.exports[req].holder == holder, f"waiting export {req} is not {holder}'s"
            assert req not in sent, f"export {req} both sent and waiting"
        assert any(t.exports[r].holder == holder for r in sent), \
            f"exports wait for room at {holder}, yet none was sent there: they would wait forever"
    assert set(sent) == {r for r in t.exports if not any(r in q for q in t.waiting.values())}, \
        "an export neither sent nor waiting"


def _check_references(s: "Scheduler") -> None:
    """Every reference tasks hold (Asking's books: on their workers, and kept for a task to
    run again) counts in its key's ``wanted``: a cancel, which zeroes ``wanted``, drops them."""
    held: dict = {}
    for holds in s.asking.holds.values():
        for key, (count, _owner) in holds.items():
            held[key] = held.get(key, 0) + count
    for keys in s.asking.orphans.values():
        for key in keys:
            held[key] = held.get(key, 0) + 1
    for key, n in held.items():
        ts = s.tasks.get(key)
        if ts is not None:
            assert ts.wanted >= n, _with_story(s, AssertionError(
                f"{key!r}: tasks hold {n} references to it, its wanted counts {ts.wanted}"), key)
