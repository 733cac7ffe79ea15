"""The scheduler's records (Task, WorkerState), what the client submits (Spec) and
the actions the state machine emits (Send, Resolve, FailAll, Deliver, Retire)."""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Literal, Optional

from ..wire import protocol as P
from ..wire import serialize


# --- actions ----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Send:
    worker: str
    msg: Any


@dataclass(frozen=True, slots=True)
class Resolve:
    """The futures of ``key`` end: status finished (value = Payload, or None when the data
    stays on a worker), error (value = pickled exception bytes or an exception), cancelled
    (value = the CancelledError that says who cancelled it)."""
    key: str
    status: str
    value: Any = None


@dataclass(frozen=True, slots=True)
class FailAll:
    """Every pending future fails with ``error`` (restart, close): one action for a whole
    queue, so closing with 200,000 tasks queued makes no object and no lookup per task."""
    error: BaseException


@dataclass(frozen=True, slots=True)
class Deliver:
    """Answer to a Fetch event (the data of ``key`` or the exception that stops it) or to a
    Call (``key`` says what was called; data: its result)."""
    request: int
    key: str
    data: Optional[P.Payload] = None
    error: Any = None


@dataclass(frozen=True, slots=True)
class Reply:
    """Answer to a request of the parent's own threads (a Lock, Event, Queue ... of the
    user's process): ``value`` is the Answer a task would get."""
    request: int
    value: Any = None


@dataclass(frozen=True, slots=True)
class Retire:
    """The worker has nothing left that anyone needs: stop it (cause ``requested``)."""
    worker: str


@dataclass(slots=True, eq=True)
class Terms:
    """What the Specs of one call share: the function and the options. Never changed once
    made; not ``frozen`` only because a frozen dataclass sets each field through
    object.__setattr__, several times dearer on the hot path."""
    fn_id: int
    fn: bytes
    priority: int = 0
    retries: int = 0
    timeout: Optional[float] = None
    workers: Optional[frozenset] = None     # names it may run on (None: any)
    loose: bool = False                     # workers are a preference (allow_other_workers)
    resources: Optional[tuple] = None       # ((name, amount), ...) sorted: what one run holds on its worker
    submitter: Optional[str] = None         # the task that submitted it from its worker (get_client), if one did


def _of_terms(name: str) -> property:
    return property(operator.attrgetter("terms." + name), doc=f"``Terms.{name}``, shared")


class Spec:
    """A task as the client submits it: its key, arguments and inputs, and the Terms it
    shares with the other tasks of its call (a map's, or a loop of submits of one function
    with the default options): 64 bytes a task instead of 128. Never changed once made.
    ``Spec(key, fn_id, fn, args, deps, priority, ...)`` makes Terms of its own.
    ``kept``: the arguments as the client keeps them (serialize.plain_args: a lone plain
    argument as itself); ``args`` reads them as a Payload or a PlainArgs."""
    __slots__ = ("key", "kept", "deps", "terms")

    def __init__(self, key: str, fn_id: int, fn: bytes, args: Any, deps: tuple, *options: Any) -> None:
        self.key, self.kept, self.deps, self.terms = key, args, deps, Terms(fn_id, fn, *options)

    @classmethod
    def sharing(cls, key: str, args: Any, deps: tuple, terms: Terms) -> "Spec":
        spec = _new(cls)
        spec.key, spec.kept, spec.deps, spec.terms = key, args, deps, terms
        return spec

    def with_key(self, key: str) -> "Spec":
        return Spec.sharing(key, self.kept, self.deps, self.terms)

    @property
    def args(self) -> Any:
        return serialize.task_args(self.kept)

    fn_id = _of_terms("fn_id")
    fn = _of_terms("fn")
    priority = _of_terms("priority")
    retries = _of_terms("retries")
    timeout = _of_terms("timeout")
    workers = _of_terms("workers")
    loose = _of_terms("loose")
    resources = _of_terms("resources")
    submitter = _of_terms("submitter")

    def __eq__(self, other: Any) -> bool:
        if type(other) is not Spec:
            return NotImplemented
        return (self.key, self.args, self.deps, self.terms) == (other.key, other.args, other.deps, other.terms)

    __hash__ = None     # as the dataclass it was: mutable, unhashable

    def __repr__(self) -> str:
        return f"Spec(key={self.key!r}, args={self.args!r}, deps={self.deps!r}, terms={self.terms!r})"


_new = object.__new__


@dataclass(frozen=True, slots=True)
class Export:
    """Data asked of a holder: relayed to ``target``, or delivered to a client fetch."""
    key: str
    holder: str
    target: Optional[str]               # None: a client fetch
    client_request: Optional[int]       # the fetch to deliver to (None for a relay)


@dataclass(frozen=True, slots=True)
class Whereabouts:
    """Where a task stands, for a message that says why its future is not done yet."""
    state: str                          # a Task state, or "unknown"
    worker: Optional[str] = None        # processing: where it was sent
    seq: int = 0                        # processing: the run, to find its start on the worker's board
    waiting_for: tuple = ()             # waiting: the dependencies not in memory yet
    workers: int = 0                    # workers the scheduler knows (able to run tasks)
    paused: int = 0                     # of which paused for memory
    restricted_to: Optional[frozenset] = None
    resources: Optional[tuple] = None   # what it asks (Spec.resources)


TaskState = Literal["waiting", "ready", "processing", "memory", "erred", "lost", "released"]

# Every change of a Task's state that the scheduler may make, (old, new), and what it does to
# the task's other fields and what goes out with it. Anything else is a bug in localcluster,
# raised at once as an AssertionError (``Transitions.apply``) instead of surfacing later as a
# broken invariant or a hang. state.py's docstring lists the same pairs with why each happens
# (a test checks the two agree); invariants.py checks, after every event in the tests, the
# fields each state must have, which these leave. What each says it does is checked by the
# tests, held to the same pairs (tests/_transition_checks.py: after every call of the door, each
# key's last transition), never here: ``apply`` is on the hot path.
# A task is made "released" and moved on in the same event.
TRANSITIONS: dict = {
    ("released", "waiting"): "linked to its inputs (dependents), waiting_on the ones not in memory",
    ("released", "ready"): "linked to its inputs, queued on Placement",
    ("released", "memory"): "scattered: its copies stored (who_has, has: a Put each) or its data kept here; "
                             "its futures resolve",
    ("released", "erred"): "its error kept, waiting_on empty; its futures fail, and its pending dependents",
    ("waiting", "ready"): "waiting_on emptied; queued on Placement",
    ("waiting", "erred"): "waiting_on emptied, its error kept; its futures fail, and its pending dependents",
    ("waiting", "released"): "fetches waiting answered (gone), waiting_on emptied; dropped from tasks and "
                             "unlinked from its inputs unless a dependent links to it",
    ("ready", "processing"): "a Run sent: worker and seq set, in its worker's processing, resources claimed",
    ("ready", "waiting"): "waiting_on the lost input; its queue entry dropped when met",
    ("ready", "erred"): "its error kept; its futures fail, and its pending dependents",
    ("ready", "released"): "fetches waiting answered (gone); dropped from tasks and unlinked from its inputs "
                           "unless a dependent links to it",
    ("processing", "memory"): "its run answered (out of processing, claim freed); its worker holds a copy "
                              "(who_has, has), small data kept here; its futures resolve, dependents may be ready",
    ("processing", "ready"): "its run given back, failed with retries left, or not started (an input arrived "
                             "damaged); queued on Placement again",
    ("processing", "waiting"): "its run lost with its worker, taken back, or not started; waiting_on the inputs "
                               "not in memory",
    ("processing", "erred"): "its run answered, lost with its worker, or taken back; its error kept; its futures "
                             "fail, and its pending dependents",
    ("processing", "released"): "its run taken back (a Cancel): the slot stays busy (processing maps the seq "
                                "to None) until the worker answers; fetches waiting answered (gone); dropped from "
                                "tasks unless a dependent links to it",
    ("memory", "waiting"): "every copy gone (who_has empty): computed again, inputs pulled back",
    ("memory", "lost"): "its last copy gone (died, or damaged) and nothing to compute it from: its error "
                        "(LostDataError, or TransferError) to its futures and its pending dependents",
    ("memory", "released"): "its copies let go of (a Free to each holder), its data dropped; dropped from tasks "
                            "unless a dependent links to it",
    ("erred", "released"): "dropped from tasks unless a dependent links to it, which keeps it with its error "
                           "(a retry drops the error first, and moves it on at once)",
    ("lost", "released"): "dropped from tasks unless a dependent links to it, which keeps it with its error: "
                          "a dependent submitted later fails with that error",
}

# old -> {new: (old, new)}: one lookup both checks a transition and finds the tuple to record
_STEPS: dict = {old: {n: (o, n) for o, n in TRANSITIONS if o == old} for old, _new in TRANSITIONS}

STORY_LENGTH = 1 << 14      # transitions kept, of all keys together: 3 preallocated lists of that length


class Transitions:
    """The only writer of ``Task.state`` (dask's ``_transition``), and the story: the last
    ``STORY_LENGTH`` transitions of all keys, read for one key when something breaks.

    One bounded record for every key, not one per key: a deque per task would cost more than
    a pending task may cost the parent in all (benchmarks/README.md). The hot path (submit, run, finish,
    release: four transitions a task) pays two dict lookups and three list stores each, and
    allocates nothing: ``apply`` is a closure over the table and a ring of three lists."""
    __slots__ = ("apply", "_read", "_since", "length")

    def __init__(self, length: int = STORY_LENGTH):
        length = 1 << max(0, length - 1).bit_length()      # a power of two: the ring wraps with a mask
        self.length = length
        #: apply(ts, new, event): move ``ts`` to state ``new``; ``event`` (a constant string)
        #: says why, for the story. A pair TRANSITIONS does not list raises AssertionError with
        #: the story (a bug in localcluster: the cluster breaks with ClusterBroken). Called under
        #: the cluster's lock by whichever thread brings the event; the ring is written only here.
        self.apply, self._read, self._since = _ring(length, self.story)

    def since(self, mark: Optional[int]) -> tuple[list, int, int]:
        """The transitions made after ``mark`` (None: from now on), oldest first, as
        ``events`` gives them; the mark to pass next; and how many were lost (more than the
        ring holds were made since)."""
        return self._since(mark)

    def events(self) -> list:
        """The transitions kept, oldest first: [(key, old, new, event)]."""
        return self._read()

    def of(self, key: str) -> list:
        """The transitions of ``key`` still kept, oldest first: [(old, new, event)]."""
        return [(old, new, event) for k, old, new, event in self._read() if k == key]

    def story(self, key: str) -> str:
        """The story of ``key``, to print with an error about it."""
        lines = [f"  {old} -> {new}  ({event})" for old, new, event in self.of(key)]
        return (f"story of {key!r} (its transitions among the last {self.length:,} of all keys):\n"
                + ("\n".join(lines) if lines else "  (none kept)"))


def _ring(length: int, story: Callable[[str], str]) -> tuple:
    """(apply, read) over a ring of ``length`` transitions: three preallocated lists, so that
    recording one makes no object (a tuple each would cost every task on the hot path)."""
    keys: list = [None] * length
    steps: list = [None] * length        # the table's own (old, new) tuples: shared, not made
    events: list = [None] * length
    at = 0
    laps = 0                             # times the ring wrapped: (laps, at) is a mark that never repeats
    mask = length - 1
    table = _STEPS

    def apply(ts: Task, new: str, event: str) -> None:
        nonlocal at, laps
        try:
            step = table[ts.state][new]
        except KeyError:
            raise AssertionError(f"internal error in localcluster's scheduler: task {ts.key!r} may not go "
                                    f"from {ts.state!r} to {new!r} (event {event!r}).\n{story(ts.key)}") from None
        ts.state = new
        keys[at] = ts.key
        steps[at] = step
        events[at] = event
        at = (at + 1) & mask
        if not at:
            laps += 1

    def read() -> list:
        order = range(at) if keys[at] is None else [*range(at, length), *range(at)]   # not yet full: no wrap
        return [(keys[i], *steps[i], events[i]) for i in order]

    def since(mark: Optional[int]) -> tuple[list, int, int]:
        now = laps * length + at
        if mark is None or mark >= now:
            return [], now, 0
        lost = max(0, now - mark - length)
        first = mark + lost
        return [(keys[i & mask], *steps[i & mask], events[i & mask]) for i in range(first, now)], now, lost

    return apply, read, since


# The shared empty value of a Task's sets until the first element: an empty set costs as
# much as a small one, and most tasks leave some of theirs empty for life (the sizes:
# benchmarks/README.md). Read it like a set; change it only through the Task's methods
# below, which make a set of its own on the first add.
EMPTY: frozenset = frozenset()


class _Rare:
    """The fields of a Task that most tasks never change from their defaults (deaths blamed,
    fetches waiting, cancels, retries used, an error): made on the first change, so that a
    task holds one slot for them instead of six, 200 -> 160 bytes a Task."""
    __slots__ = ("suspicious", "deaths", "fetchers", "cancels", "retries", "error", "damages")

    def __init__(self, retries: int) -> None:
        self.suspicious, self.deaths, self.fetchers, self.cancels, self.retries = 0, (), (), 0, retries
        self.error: Any = None
        self.damages = 0


def _spec_retries(task: "Task") -> int:
    return task.terms.retries if task.terms is not None else 0      # scattered data has no spec


def _rare(name: str, default: Callable[["Task"], Any], doc: str) -> property:
    """A field of a Task kept in its ``rare`` record, read as ``default(task)`` until set."""
    def get(task: "Task") -> Any:
        rare = task.rare
        return default(task) if rare is None else getattr(rare, name)

    def set_(task: "Task", value: Any) -> None:
        rare = task.rare
        if rare is None:
            if value == default(task):
                return
            rare = task.rare = _Rare(_spec_retries(task))
        setattr(rare, name, value)
    return property(get, set_, doc=doc)


def fetches_waiting(tasks: Iterable["Task"]) -> Iterator[tuple["Task", Any]]:
    """(task, request) for each fetch waiting on one of ``tasks``; only the tasks that ever
    had a rare field changed are looked into (a close with 200,000 queued: 0.3 s less)."""
    for ts in tasks:
        rare = ts.rare
        if rare is not None:
            for req in rare.fetchers:  # type: ignore[var-annotated]
                yield ts, req


class Task:
    __slots__ = ("key", "state", "kept", "terms", "deps", "dependents", "waiting_on", "who_has", "worker",
                 "seq", "nbytes", "data", "wanted", "type_name", "order", "rare")

    # Every field: used under the cluster's lock by whichever thread brings the scheduler an
    # event; written by the scheduler and its parts (placement, transfers, forgetting) only.
    def __init__(self, key: str, spec: Optional[Spec], order: int, wanted: int = 0):
        #: the key it is filed under in ``Scheduler.tasks``
        self.key = key
        #: one of TaskState; made "released", then written only by Transitions.apply
        self.state: TaskState = "released"
        # What the client submitted, taken apart (``spec`` puts it together again): the
        # Spec itself goes, one object fewer a task. ``terms`` None: scattered data (which cannot be
        # recomputed), and ``kept`` None too.
        #: the arguments as the Spec kept them (``args``: as a Run carries them)
        self.kept: Any = spec.kept if spec else None
        #: the function and options, shared with the other tasks of its call
        self.terms: Optional[Terms] = spec.terms if spec else None
        #: input keys; each one still in ``tasks`` lists this task among its ``dependents``
        self.deps: tuple = spec.deps if spec else ()
        #: keys of tasks that depend on this one (and list it in their ``deps``)
        self.dependents: "set | frozenset" = EMPTY
        #: waiting: the inputs not in memory yet, never empty; empty in any other state
        self.waiting_on: "set | frozenset" = EMPTY
        #: live workers holding the data (each lists the key in its ``has``); empty unless memory.
        #: Written with the holders' ``has`` by the copies' writer below (``copy_stored`` ...) only
        self.who_has: "set | frozenset" = EMPTY
        #: processing: the worker its run ``seq`` was sent to; None in any other state
        self.worker: Optional[str] = None
        #: its latest run (Placement's number); the current one while processing
        self.seq = 0
        #: memory: the size of its result
        self.nbytes = 0
        #: memory: the result itself when small (kept in the parent), else None
        self.data: Optional[P.Payload] = None
        #: references to it: the clients' (one a client), the tasks' (Asking), the values'
        #: (Coordination); 0 and no pending dependent: it is released. Written by ``hold``,
        #: ``let_go`` and ``let_go_all`` only
        self.wanted = wanted
        #: memory: the type of its result, for reprs
        self.type_name = ""
        #: submission order: ties in priority run oldest first
        self.order = order
        #: the fields below, once one of them is changed (_Rare); None until then
        self.rare: Optional[_Rare] = None

    suspicious = _rare("suspicious", lambda ts: 0,
                       "deaths blamed on it; past ``allowed_failures`` it fails with KilledWorker")
    deaths = _rare("deaths", lambda ts: (), "those deaths (a tuple)")
    fetchers = _rare("fetchers", lambda ts: (),
                     "waiting, ready, processing: fetch requests answered once it is in memory (else ())")
    cancels = _rare("cancels", lambda ts: 0,
                    "cancels it went through: a reference taken before one (a token, coordination.py) "
                    "counts no more, though a dependent may run this very Task again")
    retries = _rare("retries", _spec_retries, "user errors it may still retry after")
    error = _rare("error", lambda ts: None,
                  "erred, lost: the exception (or its pickled bytes) its futures raise; None otherwise")
    damages = _rare("damages", lambda ts: 0,
                    "copies of its data, or of its run's arguments, that arrived damaged (protocol.Damaged); "
                    "past MAX_DAMAGES it fails with TransferError")

    def __repr__(self) -> str:
        return f"<Task {self.key!r} {self.state}>"

    @property
    def spec(self) -> Optional[Spec]:
        """What the client submitted (made anew on each read); None for scattered data."""
        terms = self.terms
        return None if terms is None else Spec.sharing(self.key, self.kept, self.deps, terms)

    @property
    def args(self) -> Any:
        """Its arguments as its Run carries them (a Payload or a PlainArgs)."""
        return serialize.task_args(self.kept)

    # The sets below start as EMPTY: _grown makes a set of the task's own on the first add.
    def add_dependent(self, key: str) -> None:
        self.dependents = _grown(self.dependents, key)

    def drop_dependent(self, key: str) -> None:
        _dropped(self.dependents, key)

    # --- waiting_on: its one writer ---
    def wait_on(self, keys: Any) -> None:
        """Wait for each of ``keys`` (its inputs not in memory), and no other."""
        self.waiting_on = set(keys) or EMPTY

    def wait_for(self, key: str) -> None:
        self.waiting_on = _grown(self.waiting_on, key)

    def arrived(self, key: str) -> None:
        _dropped(self.waiting_on, key)

    def stop_waiting(self) -> None:
        """Wait for nothing: a task waits only while waiting, and an input arriving later is
        nothing to it."""
        self.waiting_on = EMPTY

    # --- wanted: its one writer ---
    def hold(self) -> None:
        """One more reference to it."""
        self.wanted += 1

    def let_go(self) -> None:
        """One reference fewer (never below none)."""
        if self.wanted:
            self.wanted -= 1

    def let_go_all(self) -> None:
        """Every reference dropped (a cancel)."""
        self.wanted = 0

    # who_has: with one holder (most tasks), a frozenset shared by every task that worker
    # alone holds (a set of one for each task would cost as much as an empty one); a set of
    # the task's own from two on.
    # Called by the copies' writer below only (``copy_stored`` ...): ``has`` goes with it.
    def add_holder(self, worker: str) -> None:
        held = self.who_has
        if not held:
            self.who_has = _SOLE.get(worker) or _SOLE.setdefault(worker, frozenset((worker,)))
        elif type(held) is frozenset:
            if worker not in held:
                self.who_has = {*held, worker}
        else:
            held.add(worker)

    def drop_holder(self, worker: str) -> None:
        held = self.who_has
        if worker in held:
            if type(held) is frozenset:      # shared: never changed in place
                self.who_has = EMPTY
            else:
                held.discard(worker)

    def drop_holders(self) -> None:
        self.who_has = EMPTY


_SOLE: dict[str, frozenset] = {}     # worker name -> frozenset({name}); names are few


# --- the copies of a value: ``Task.who_has`` and ``WorkerState.has`` are two sides of one
# relation, written together here and nowhere else ------------------------------------------

def copy_stored(ts: Task, ws: "WorkerState") -> None:
    """``ws`` holds a copy of ``ts``'s data (computed there, put, relayed, scattered)."""
    ts.add_holder(ws.name)
    ws.has.add(ts.key)


def copy_dropped(ts: Task, worker: str, ws: "Optional[WorkerState]") -> None:
    """``worker`` holds no copy of ``ts``'s data any more (``ws``: its state, None once gone)."""
    ts.drop_holder(worker)
    if ws is not None:
        ws.has.discard(ts.key)


def copies_dropped(ts: Task, worker: "Callable[[str], Optional[WorkerState]]") -> list:
    """No worker holds ``ts``'s data any more: the names of those that did, in a fixed order."""
    held = ts.who_has
    names = list(held) if len(held) < 2 else sorted(held)
    for name in names:
        ws = worker(name)
        if ws is not None:
            ws.has.discard(ts.key)
    ts.drop_holders()
    return names


def copies_lost(ws: "WorkerState", task: "Callable[[str], Optional[Task]]") -> list:
    """``ws`` died with its copies: the tasks it held copies of, each dropping it as a holder."""
    held = [ts for ts in map(task, ws.has) if ts is not None]
    for ts in held:
        ts.drop_holder(ws.name)
    ws.has.clear()
    return held


def _grown(items: "set | frozenset", item: str) -> set:
    if items is EMPTY:
        return {item}
    items.add(item)
    return items


def _dropped(items: "set | frozenset", item: str) -> None:
    if items:               # EMPTY is falsy, so only a set of the task's own is changed
        items.discard(item)


# Amounts are floats (a task may ask for 0.5 GPU): a sum may be off by this much.
SLACK = 1e-9


class WorkerState:
    __slots__ = ("name", "nthreads", "processing", "has", "fns", "paused", "closing", "resources", "available",
                 "claims")

    # Used under the cluster's lock, like Task's fields.
    def __init__(self, name: str, nthreads: int, resources: Optional[dict] = None):
        #: the key it is filed under in ``Scheduler.workers``; never reused once it died
        self.name = name
        #: task slots: ``threads_per_worker``, plus one for each run there that seceded (secede():
        #: the worker runs one more executor thread meanwhile)
        self.nthreads = nthreads
        #: seq -> key of each run sent and not answered (Placement's ``runs``), or None for a run
        #: taken back that the worker has not answered yet (Forgetting's ``cancelled_runs``)
        self.processing: dict[int, Optional[str]] = {}
        #: keys it holds data of: exactly the tasks that list it in ``who_has``
        self.has: set = set()
        #: function ids already sent with a Run: later runs send the id alone
        self.fns: set = set()
        #: paused for memory: given no new runs, its queued ones asked back
        self.paused = False
        #: being retired: given nothing new; Retire once it runs nothing and holds nothing needed alone
        self.closing = False
        #: the abstract resources it declares (LocalCluster(resources=)), name -> amount; never changed
        self.resources: dict = dict(resources or {})
        #: name -> amount not claimed: ``resources`` minus the claims of its runs, never below 0
        #: (within SLACK); a run is given a worker only where its ``Spec.resources`` fit here
        self.available: dict = dict(self.resources)
        #: seq -> the Spec.resources a run holds here, from its assignment until its seq leaves
        #: ``processing`` (answered, given back, or with the worker's death): a run taken back
        #: (cancelled) that still runs keeps its claim until the worker answers; every key is in
        #: ``processing``. Empty for a worker whose runs ask for nothing (most): no cost then
        self.claims: dict[int, tuple] = {}

    def fits(self, need: tuple) -> bool:
        """Whether a run asking ``need`` (Spec.resources) may be given to this worker now."""
        available = self.available
        return all(available.get(name, 0) + SLACK >= amount for name, amount in need)

    def could_fit(self, need: tuple) -> bool:
        """Whether it could ever: all it declares, nothing claimed."""
        resources = self.resources
        return all(resources.get(name, 0) + SLACK >= amount for name, amount in need)

    # --- processing: its one writer ---
    def sent(self, seq: int, key: str, need: Optional[tuple]) -> None:
        """Run ``seq`` of ``key`` was sent here; it holds ``need`` (Spec.resources) meanwhile."""
        self.processing[seq] = key
        if need is not None:
            self.claim(seq, need)

    def taken_back(self, seq: int) -> None:
        """Run ``seq`` was taken back (Cancel): its slot stays busy until the worker answers."""
        self.processing[seq] = None

    def answered(self, seq: int) -> Optional[str]:
        """Run ``seq`` ended here (answered, given back): its key (None: taken back, or unknown);
        what it claimed is free again."""
        key = self.processing.pop(seq, None)
        if self.claims:                   # most workers: no run holds resources, no call
            self.release(seq)
        return key

    def forget_all(self) -> None:
        """Every run and every copy forgotten (the scheduler clears its tasks)."""
        self.processing.clear()
        self.release_all()
        self.has.clear()

    def claim(self, seq: int, need: tuple) -> None:
        available = self.available
        for name, amount in need:
            available[name] -= amount
        self.claims[seq] = need

    def release(self, seq: int) -> None:
        """Run ``seq`` no longer holds what it claimed (if anything)."""
        need = self.claims.pop(seq, None)
        if need is None:
            return
        if not self.claims:      # nothing claimed: exactly what it declares, with no rounding left over
            self.available = dict(self.resources)
            return
        available = self.available
        for name, amount in need:
            available[name] += amount

    def release_all(self) -> None:
        self.claims.clear()
        self.available = dict(self.resources)
