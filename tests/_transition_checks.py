"""What each transition of ``records.TRANSITIONS`` does, as checks: the table's sentences made
executable, test-side, so that the package's hot path (``Transitions.apply``, a closure over
the table) pays nothing for them.

``DOES`` maps exactly the table's (old, new) pairs to a function of a :class:`Step` (the key,
the task before and after one call of the door, the instructions it returned) that returns
what the step did not do of what its sentence says, as short phrases. :class:`CheckedDoor`
wraps ``Scheduler.handle``: after each call, each key whose state changed is held to the
sentence of its *last* transition in that call, read from the story ring
(``Transitions.since``). A key's earlier transitions in the same call are not checked: what
a later one does may undo them (a run finished, then its result let go of).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Optional

from localcluster.death import LostDataError, TransferError
from localcluster.scheduler import events as E
from localcluster.scheduler.records import TRANSITIONS, Deliver, Resolve, Send, Task
from localcluster.wire import protocol as P

PENDING = ("waiting", "ready", "processing")


@dataclass(frozen=True)
class Before:
    """What the checks need of a task as it was before the call."""
    task: Task                  # the object itself: a key made anew during the call is another Task
    state: str
    worker: Optional[str]
    seq: int
    who_has: frozenset
    fetchers: tuple             # client fetches waiting for it


def _before(s: Any) -> dict:
    return {k: Before(ts, ts.state, ts.worker, ts.seq, frozenset(ts.who_has), ts.fetchers)
            for k, ts in s.tasks.items()}


@dataclass
class Step:
    """One key's last transition in one call of the door, and what the checks read."""
    s: Any                      # the Scheduler, as the call left it
    key: str
    old: str
    new: str
    event: str
    was: Optional[Before]       # the task before the call (None: not known then)
    out: list                   # the call's instructions
    events: tuple               # the call's events

    @property
    def ts(self) -> Optional[Task]:
        return self.s.tasks.get(self.key)

    def sent(self, kind: type, worker: Optional[str] = None) -> list:
        """The messages of type ``kind`` about this key sent (to ``worker``) in the call."""
        found = []
        for a in self.out:
            if type(a) is not Send or type(a.msg) is not kind or (worker is not None and a.worker != worker):
                continue
            m = a.msg
            if kind is P.Cancel:
                mine = self.was is not None and self.was.seq in m.seqs
            elif kind is P.Free:
                mine = self.key in m.keys
            else:
                mine = m.key == self.key
            if mine:
                found.append(a)
        return found

    def resolved(self, status: str) -> list:
        return [a for a in self.out if type(a) is Resolve and a.key == self.key and a.status == status]

    def seq_left_processing(self) -> list:
        """The run the task was processing before the call no longer counts as its run on its worker."""
        was = self.was
        ws = self.s.workers.get(was.worker) if was is not None else None
        if ws is None:
            return []
        problems = []
        if ws.processing.get(was.seq) == self.key:
            problems.append(f"run {was.seq} still in {was.worker}'s processing")
        if was.seq in ws.processing and not self.sent(P.Cancel, was.worker):
            problems.append(f"run {was.seq} kept busy on {was.worker} with no Cancel sent")
        if was.seq in ws.claims and was.seq not in ws.processing:
            problems.append(f"run {was.seq}'s claim on {was.worker} not freed")
        return problems


def _processing_was(step: Step) -> list:
    was = step.was
    if was is None or was.state != "processing" or (step.ts is not None and was.task is not step.ts):
        return ["it was not processing before the call"]
    return []


# --- the checks, each one phrase a claim of its sentence ----------------------------------

def _linked(step: Step) -> list:
    ts, tasks = step.ts, step.s.tasks
    return [f"input {d!r} does not list it as a dependent" for d in ts.deps
            if d not in tasks or step.key not in tasks[d].dependents]


def _waits_on_missing(step: Step) -> list:
    ts, tasks = step.ts, step.s.tasks
    missing = {d for d in ts.deps if d not in tasks or tasks[d].state != "memory"}
    problems = [] if ts.waiting_on else ["waiting_on empty"]
    if set(ts.waiting_on) != missing:
        problems.append(f"waiting_on {sorted(ts.waiting_on)}, inputs not in memory {sorted(missing)}")
    return problems


def _queued(step: Step) -> list:
    ts = step.ts
    problems = [] if step.key in step.s.ready_keys else ["not queued on Placement"]
    return problems + ([f"waiting_on {sorted(ts.waiting_on)} not emptied"] if ts.waiting_on else [])


def _fails(step: Step, status: str = "error") -> list:
    """Its error kept; its futures fail (a Resolve of ``status``); its pending dependents fail too."""
    ts, tasks = step.ts, step.s.tasks
    problems = [] if ts.error is not None else ["no error kept"]
    problems += [] if step.resolved(status) else [f"no Resolve {status!r} for its futures"]
    problems += [f"waiting_on {sorted(ts.waiting_on)} not emptied"] if ts.waiting_on else []
    pending = [d for d in ts.dependents if d in tasks and tasks[d].state in PENDING]
    return problems + ([f"dependents {sorted(pending)} still pending"] if pending else [])


def _let_go(step: Step) -> list:
    """A pending task released: the fetches waiting for it answered, waiting_on emptied, and
    dropped from tasks (and unlinked from its inputs) unless a dependent links to it."""
    was, ts = step.was, step.ts
    answered = {a.request for a in step.out if type(a) is Deliver and a.key == step.key}
    unanswered = [req for req in (was.fetchers if was is not None else ()) if req not in answered]
    problems = [f"fetches {unanswered} not answered"] if unanswered else []
    problems += [f"waiting_on {sorted(ts.waiting_on)} not emptied"] if ts is not None and ts.waiting_on else []
    return problems + _dropped_unless_linked(step)


def _dropped_unless_linked(step: Step) -> list:
    """Dropped from tasks (and unlinked from its inputs) unless a dependent links to it."""
    ts, tasks = step.ts, step.s.tasks
    if ts is None:
        deps = step.was.task.deps if step.was is not None else ()
        return [f"input {d!r} still lists it as a dependent" for d in deps
                if d in tasks and step.key in tasks[d].dependents]
    if not any(d in tasks and step.key in tasks[d].deps for d in ts.dependents):
        return ["kept in tasks with no dependent linking to it"]
    return []


def _no_data(step: Step) -> list:
    ts = step.ts
    if ts is None:
        held = [w for w, ws in step.s.workers.items() if step.key in ws.has]
        return [f"{held} still list it in has"] if held else []
    return ([f"who_has {sorted(ts.who_has)} not emptied"] if ts.who_has else []) + \
        (["its data kept"] if ts.data is not None else [])


def _error_kept_unless_dropped(step: Step) -> list:
    """Dropped from tasks unless a dependent links to it; kept, it keeps its error."""
    ts = step.ts
    problems = ["its error dropped while kept"] if ts is not None and ts.error is None else []
    return problems + _dropped_unless_linked(step)


def released_waiting(step: Step) -> list:
    return _linked(step) + _waits_on_missing(step)


def released_ready(step: Step) -> list:
    return _linked(step) + _queued(step)


def released_memory(step: Step) -> list:
    ts = step.ts
    problems = [] if ts.terms is None else ["not scattered data"]
    problems += [] if ts.who_has or ts.data is not None else ["no copy stored and no data kept"]
    for w in sorted(ts.who_has):
        if not step.sent(P.Put, w):
            problems.append(f"no Put to holder {w}")
        if step.key not in step.s.workers[w].has:
            problems.append(f"holder {w} does not list it in has")
    resolved = step.resolved("finished")
    return problems + ([] if resolved and resolved[0].value is ts.data else ["no Resolve 'finished' with its data"])


def released_erred(step: Step) -> list:
    return _fails(step)


def ready_processing(step: Step) -> list:
    ts, workers = step.ts, step.s.workers
    ws = workers.get(ts.worker)
    if ws is None:
        return [f"worker {ts.worker!r} not running"]
    problems = [] if ws.processing.get(ts.seq) == step.key else [f"run {ts.seq} not in {ws.name}'s processing"]
    runs = [a for a in step.sent(P.Run, ws.name) if a.msg.seq == ts.seq]
    problems += [] if runs else [f"no Run {ts.seq} sent to {ws.name}"]
    need = ts.terms.resources
    if need is not None and ws.claims.get(ts.seq) != need:
        problems.append(f"resources {need} not claimed on {ws.name}")
    return problems


def ready_waiting(step: Step) -> list:
    ts, tasks = step.ts, step.s.tasks
    problems = [] if ts.waiting_on else ["waiting_on empty"]
    lost = [d for d in ts.waiting_on if d in tasks and tasks[d].state == "memory"]
    return problems + ([f"waits on {lost}, in memory"] if lost else [])


def processing_memory(step: Step) -> list:
    problems = _processing_was(step)
    if problems:
        return problems
    ts, was = step.ts, step.was
    problems = step.seq_left_processing()
    problems += [] if ts.worker is None else [f"worker still {ts.worker!r}"]
    ws = step.s.workers.get(was.worker)
    if ws is not None and (was.worker not in ts.who_has or step.key not in ws.has):
        problems.append(f"its worker {was.worker} not a holder (who_has {sorted(ts.who_has)})")
    if ts.data is not None and ts.nbytes > P.INLINE_RESULT:
        problems.append(f"data of {ts.nbytes} bytes kept here")
    resolved = step.resolved("finished")
    problems += [] if resolved and resolved[-1].value is ts.data else ["no Resolve 'finished' with its data"]
    tasks = step.s.tasks
    stuck = [d for d in ts.dependents if d in tasks and step.key in tasks[d].waiting_on]
    return problems + ([f"dependents {sorted(stuck)} still wait on it"] if stuck else [])


def processing_ready(step: Step) -> list:
    return _processing_was(step) or step.seq_left_processing() + _queued(step)


def processing_waiting(step: Step) -> list:
    return _processing_was(step) or step.seq_left_processing() + ready_waiting(step)


def processing_erred(step: Step) -> list:
    return _processing_was(step) or step.seq_left_processing() + _fails(step)


def processing_released(step: Step) -> list:
    problems = _processing_was(step)
    if problems:
        return problems
    was = step.was
    ws = step.s.workers.get(was.worker)
    if ws is not None:
        if not step.sent(P.Cancel, was.worker):
            problems.append(f"no Cancel of run {was.seq} sent to {was.worker}")
        if was.seq not in ws.processing or ws.processing[was.seq] is not None:
            problems.append(f"run {was.seq} not kept busy (None) in {was.worker}'s processing")
    return problems + _let_go(step)


def memory_waiting(step: Step) -> list:
    ts, tasks = step.ts, step.s.tasks
    problems = _no_data(step) + ready_waiting(step)
    released = [d for d in ts.deps if d in tasks and tasks[d].state == "released"]
    return problems + ([f"inputs {released} not pulled back"] if released else [])


def memory_lost(step: Step) -> list:
    ts = step.ts
    problems = [] if ts.terms is None else ["not scattered data: it could be computed again"]
    problems += _no_data(step) + _fails(step, "lost")
    if not isinstance(ts.error, (LostDataError, TransferError)):
        problems.append(f"its error is {ts.error!r}, not a LostDataError or TransferError")
    return problems


def _not_stored(step: Step) -> set:
    """Workers that said, in this call, that a Put of the key never stored (it arrived damaged)."""
    return {e.worker for e in step.events if type(e) is E.Reported
            for m in e.msgs if type(m) is P.Damaged and m.key == step.key and not m.seq and not m.request}


def memory_released(step: Step) -> list:
    was = step.was
    problems = []
    for w in sorted((was.who_has if was is not None else frozenset()) - _not_stored(step)):
        if w in step.s.workers and not step.sent(P.Free, w):
            problems.append(f"no Free to holder {w}")
    return problems + _no_data(step) + _dropped_unless_linked(step)


#: (old, new) -> the check of what TRANSITIONS says it does: exactly the table's pairs
DOES: dict[tuple, Callable[[Step], list]] = {
    ("released", "waiting"): released_waiting,
    ("released", "ready"): released_ready,
    ("released", "memory"): released_memory,
    ("released", "erred"): released_erred,
    ("waiting", "ready"): _queued,
    ("waiting", "erred"): _fails,
    ("waiting", "released"): _let_go,
    ("ready", "processing"): ready_processing,
    ("ready", "waiting"): ready_waiting,
    ("ready", "erred"): _fails,
    ("ready", "released"): _let_go,
    ("processing", "memory"): processing_memory,
    ("processing", "ready"): processing_ready,
    ("processing", "waiting"): processing_waiting,
    ("processing", "erred"): processing_erred,
    ("processing", "released"): processing_released,
    ("memory", "waiting"): memory_waiting,
    ("memory", "lost"): memory_lost,
    ("memory", "released"): memory_released,
    ("erred", "released"): _error_kept_unless_dropped,
    ("lost", "released"): _error_kept_unless_dropped,
}


class TransitionBroken(AssertionError):
    """A transition did not do what TRANSITIONS says it does."""


class CheckedDoor:
    """``Scheduler.handle`` with each changed key held to its last transition's sentence after
    each call; ``reached`` counts the pairs checked (for the generator's coverage)."""

    def __init__(self, s: Any, reached: Optional[Counter] = None):
        self.s = s
        self.reached = Counter() if reached is None else reached

    def __call__(self, *events: Any) -> list:
        s = self.s
        before = _before(s)
        _, mark, _ = s.transitions.since(None)
        out = s.handle(*events)
        made, _, lost = s.transitions.since(mark)
        assert not lost, f"{lost} transitions made in one call fell off the story ring"
        last = {key: (old, new, event) for key, old, new, event in made}
        for key, (old, new, event) in last.items():
            step = Step(s, key, old, new, event, before.get(key), out, events)
            if step.ts is None and new != "released":
                raise TransitionBroken(f"{key!r} went {old} -> {new} ({event}) and left tasks\n{s.story(key)}")
            problems = DOES[old, new](step)
            self.reached[old, new] += 1
            if problems:
                raise TransitionBroken(
                    f"{key!r} went {old} -> {new} ({event}), which TRANSITIONS says does: "
                    f"{TRANSITIONS[old, new]!r}; but: {'; '.join(problems)}.\n"
                    f"Events: {events!r}\n{s.story(key)}")
        return out
