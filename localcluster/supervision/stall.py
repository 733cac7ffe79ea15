"""Why nothing progresses: a pure diagnosis of a cluster that finishes no task.

``diagnose(view)`` takes plain data about the cluster (what is pending, the workers with
their status and memory, the oldest task not running yet, the tasks running now) and
returns None while work can progress, or a ``Stall``: a kind and one sentence that says
why nothing moves and what to do. ``StallClock`` decides when a stall is worth a WARNING:
after ``stall_warning`` seconds with no task finished or started, once per stall.

Both are fed by the cluster's scheduler thread (stallwatch.py) and read by the timeouts of
``wait``, ``gather`` and ``result``; nothing here touches a process, a lock or a clock.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, NamedTuple, Optional, Sequence

from ..config import format_bytes

__all__ = ["WorkerView", "RunningTask", "QueuedTask", "ClusterView", "Stall", "diagnose", "unexplained",
           "StallClock", "BUSY_FACTOR"]

# Tasks that simply run long are progress-free but not stuck: they are warned about only
# after this many times stall_warning (5 minutes by default), when the user may well
# want to know which task holds everything up.
BUSY_FACTOR = 10

_GONE_DEPENDENCY = {"erred": "failed", "lost": "was lost with its worker", "unknown": "is unknown to the scheduler"}


@dataclass(frozen=True)
class WorkerView:
    name: str
    status: str                     # starting, running, paused, closing (as cluster.workers)
    memory: Optional[int] = None    # RSS, bytes
    managed: int = 0                # bytes of results it holds in memory (spillable)
    nthreads: int = 1
    running: int = 0                # tasks whose function runs on it now


@dataclass(frozen=True)
class RunningTask:
    key: str
    worker: str
    seconds: float                  # how long it has run


@dataclass(frozen=True)
class QueuedTask:
    """The oldest pending task that is not running."""
    key: str
    state: str                                  # waiting, ready, processing (sent, not started)
    deps: Mapping[str, str] = field(default_factory=dict)   # waiting: dependency key -> its state
    restricted_to: Optional[frozenset] = None   # workers=... (not a mere preference)


@dataclass(frozen=True)
class ClusterView:
    pending: Mapping[str, int]                  # task state (waiting, ready, processing) -> count
    workers: Sequence[WorkerView] = ()
    memory_limit: Optional[int] = None
    memory_pause: Optional[float] = None
    respawns: int = 0                           # workers the cluster is about to start
    oldest: Optional[QueuedTask] = None
    running: Sequence[RunningTask] = ()         # longest running first

    @property
    def total(self) -> int:
        return sum(self.pending.values())


class Stall(NamedTuple):
    kind: str       # no-worker, starting, closing, dependency, paused, restricted, busy, unknown
    reason: str

    @property
    def stuck(self) -> bool:
        """Nothing can ever move without the user (or a worker's recovery); busy is only slow."""
        return self.kind != "busy"

    def __str__(self) -> str:
        return self.reason


def diagnose(view: ClusterView) -> Optional[Stall]:
    """None when the pending work can progress, else why it cannot (see the module docstring)."""
    total = view.total
    if not total:
        return None
    up = [w for w in view.workers if w.status in ("running", "paused")]
    starting = sum(w.status == "starting" for w in view.workers) + view.respawns
    if not up:
        return _nobody(view, starting)
    oldest = view.oldest
    if oldest is not None and oldest.state == "waiting":
        bad = [(d, s) for d, s in sorted(oldest.deps.items()) if s in _GONE_DEPENDENCY]
        if bad:
            dep, state = bad[0]
            return Stall("dependency", f"task {oldest.key!r} waits for {dep!r}, which {_GONE_DEPENDENCY[state]}, "
                                       f"so it can never run; cancel it, or submit its dependency again")
    open_ = [w for w in up if w.status == "running"]
    if not open_:
        return Stall("paused", _all_paused(view, up, starting))
    if oldest is not None and oldest.state == "ready" and oldest.restricted_to:
        by_name = {w.name: w for w in view.workers}
        if not any(by_name[n].status == "running" for n in oldest.restricted_to if n in by_name):
            where = ", ".join(f"{n} is {by_name[n].status if n in by_name else 'gone'}"
                              for n in sorted(oldest.restricted_to))
            return Stall("restricted", f"task {oldest.key!r} may run only on {_names(oldest.restricted_to)} "
                                       f"(workers=...), and none of them takes tasks: {where}; submit it with "
                                       f"workers= naming a running worker, or allow_other_workers=True")
    return _busy(view, open_)


def _nobody(view: ClusterView, starting: int) -> Stall:
    if starting:
        return Stall("starting", f"no worker is up yet: {starting} {'is' if starting == 1 else 'are'} starting "
                                 f"(a slow import or initializer holds {'it' if starting == 1 else 'them'}, "
                                 f"or {'it keeps' if starting == 1 else 'they keep'} failing: see "
                                 f"cluster.deaths and client.get_worker_logs())")
    if view.workers:
        return Stall("closing", "every worker is closing (scale down, restart or close) and none is starting; "
                                "call cluster.scale(n) to start some")
    return Stall("no-worker", "no worker is running and none is starting (n_workers=0, or scaled down to 0); "
                              "call cluster.scale(n) to start some")


def _all_paused(view: ClusterView, up: list, starting: int) -> str:
    who = ("the worker is" if len(up) == 1 else "both workers are" if len(up) == 2
           else f"all {len(up)} workers are")
    memory = ", ".join(f"{w.name} {format_bytes(w.memory)}" for w in up)
    limit = f" of {format_bytes(view.memory_limit)} limit" if view.memory_limit else ""
    pause = f", above memory_pause={view.memory_pause:.0%}" if view.memory_pause else ""
    managed = sum(w.managed for w in up)
    if managed:
        held = (f"{format_bytes(managed)} of it is results still in memory: release the futures you no "
                f"longer need")
    else:
        held = ("nothing is left to spill: the memory is held by the tasks' own code (a module-level cache "
                "or a leak), not by results; set memory_leak_restart (seconds) so that such a worker is "
                "restarted for you, or restart the workers (client.restart())")
    more = f"; {starting} more starting" if starting else ""
    return (f"{who} paused: {memory}{limit}{pause}; {held}, or raise memory_limit. No new task is sent to "
            f"{'it' if len(up) == 1 else 'them'} until memory falls below memory_pause{more}")


def _busy(view: ClusterView, open_: list) -> Optional[Stall]:
    """Tasks that run and run: every open thread busy, or everything else waits for them."""
    if not view.running:
        return None
    threads = sum(w.nthreads for w in open_)
    busy = sum(w.running for w in open_)
    not_started = view.pending.get("ready", 0) + max(0, view.pending.get("processing", 0) - len(view.running))
    if busy < threads and not_started:
        return None          # free threads and work for them: placement is about to start it
    first = view.running[0]
    n = len(view.running)
    lead = "every worker thread is busy" if busy >= threads else \
        f"nothing else can start before the running {'task ends' if n == 1 else f'{n} tasks end'}"
    return Stall("busy", f"{lead}: the longest running task, {first.key!r}, has run {first.seconds:.0f} s on "
                         f"{first.worker}")


def unexplained(view: ClusterView) -> str:
    """The sentence for a stall that ``diagnose`` finds no reason for (a localcluster bug)."""
    oldest = view.oldest
    what = f"the oldest, {oldest.key!r}, is {oldest.state}" if oldest else "none of them is queued"
    free = sum(w.nthreads - w.running for w in view.workers if w.status == "running")
    return (f"{what}, and {_count(free, 'worker thread')} {'is' if free == 1 else 'are'} free, yet nothing "
            f"starts (cluster.dump_stacks() shows what the workers do)")


def _names(names: frozenset) -> str:
    return ", ".join(sorted(names))


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


class StallClock:
    """When to say a stall: ``after`` seconds with no progress (a new progress token) while
    work is pending, once per stall; again only after progress resumed and stopped anew.
    ``look`` after a check that found nothing to say puts the next look off, so that a
    cluster that stays busy is not diagnosed on every tick."""

    def __init__(self, after: float, busy_after: Optional[float] = None):
        self.after = after
        self.busy_after = after * BUSY_FACTOR if busy_after is None else busy_after
        self._token: object = None
        self._since = 0.0
        self._said = False
        self._next_look = 0.0

    def quiet_for(self, now: float, token: object) -> Optional[float]:
        """Seconds without progress when a look is due (at least ``after``, this stall not
        said yet, no look put off); None otherwise."""
        if token != self._token or self._token is None:
            self._token, self._since, self._said, self._next_look = token, now, False, 0.0
            return None
        quiet = now - self._since
        if self._said or quiet < self.after or now < self._next_look:
            return None
        return quiet

    def should_say(self, quiet: float, stall: Stall) -> bool:
        return quiet >= (self.busy_after if stall.kind == "busy" else self.after)

    def said(self) -> None:
        self._said = True

    def idle(self, now: float) -> None:
        """Nothing is pending: being quiet is no stall."""
        self._since = now

    def look_later(self, now: float, delay: float) -> None:
        self._next_look = now + delay
