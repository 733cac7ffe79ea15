"""The supervision policy: a state machine with no I/O, like the Scheduler.

The supervisor (supervisor.py) observes the worker processes and turns what it sees into
events; this class decides, and answers with instructions for the supervisor to carry out.
Nothing here touches a process, a file, a clock or a thread: time comes in with each event,
so every policy (respawn backoff, pause and resume, timeouts, heartbeats, the leak restart,
the limit too small for an idle worker, stop-then-kill) is tested with plain asserts
(tests/unit/test_policy.py), and ``validate()`` checks the invariants after every event.

Each worker slot is in one state::

    starting ─► running ◄─► paused
       │           │          │
       └───────────┴──────────┴─► stopping(reason, step, deadline) ─► (exited: slot gone)

and stopping goes through one path whatever the reason, in steps, each with a deadline
after which the next step is taken anyway::

    handoff  the scheduler moves the data only this worker holds (scale down, a leak)
    stop     the worker was sent Stop and exits by itself
    stacks   every thread's stack was asked for (timeout, unresponsive), so that the
             death shows where the worker was
    kill     SIGKILL was sent; the exit is what is left to see

The reasons are the nanny's causes of ``death.classify``: requested, memory-limit,
memory-leak, timeout, unresponsive.

Events: ``spawned``, ``ready``, ``sampled``, ``observed`` (the status board: running
tasks, heartbeat), ``stacks_arrived``, ``retired`` (the scheduler let go of it),
``exited``, ``scale``, ``refill``, ``adapt``, ``adapting`` (the adapt tick: how many task
slots the work at hand could fill), ``stop_all``, ``tick``.

Adapting (``cluster.adapt(minimum, maximum)``, dask's meaning): the size follows the work
between the bounds. Tasks that wait for a thread grow it at the first tick that sees them;
it shrinks only once the work has needed fewer workers for ``Adapt.idle`` seconds in a row
(dask: ``wait_count`` looks ``interval`` apart), through the same hand-off as ``scale``,
and never below one worker while workers hold data that is still needed (retiring the
last holder would lose it, and its recompute would call a worker back: a loop).
``scale`` turns adapting off, as in dask. Instructions: :class:`Spawn`,
:class:`Accept`, :class:`Refuse`, :class:`SendStop`, :class:`Kill`, :class:`DumpStacks`,
:class:`HandOff`, :class:`SetPaused`, :class:`Note`, :class:`GiveUp`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from ..config import format_bytes
from ..death import WorkerDeath, WorkerStartupError


__all__ = ["Policy", "Slot", "Limits", "Adapt", "STARTUP_RETRIES", "STOP_GRACE", "STACK_GRACE", "HANDOFF_GRACE"]

STARTUP_RETRIES = 3      # failed starts in a row before WorkerStartupError
STOP_GRACE = 2.0         # a worker that ignores Stop this long is killed
STACK_GRACE = 1.0        # longest wait for the stack dump asked for before a kill
HANDOFF_GRACE = 10.0     # longest wait for a leaking worker's data to move elsewhere
BACKOFF = 0.1            # first delay before a failed start is tried again; doubles each time

STATES = ("starting", "running", "paused", "stopping")
STEPS = ("handoff", "stop", "stacks", "kill")
REASONS = ("requested", "memory-limit", "memory-leak", "timeout", "unresponsive")


# --- instructions ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Spawn:
    """Start one more worker."""


@dataclass(frozen=True)
class Accept:
    """The worker fits its limit idle: enforce its kernel ceiling, give it to the scheduler."""
    worker: str


@dataclass(frozen=True)
class Refuse:
    """The cluster cannot start as configured: the constructor raises this."""
    error: Exception


@dataclass(frozen=True)
class SendStop:
    worker: str


@dataclass(frozen=True)
class Kill:
    worker: str


@dataclass(frozen=True)
class DumpStacks:
    """Every thread's stack into the worker's log, from its stacks thread, or from SIGUSR1 when
    C code holds the GIL (``Nanny.last_stacks_arrived``)."""
    worker: str


@dataclass(frozen=True)
class HandOff:
    """Ask the scheduler to retire the worker: no new work, its data moved elsewhere; its
    ``retired`` event follows."""
    worker: str


@dataclass(frozen=True)
class SetPaused:
    worker: str
    paused: bool


@dataclass(frozen=True)
class Note:
    """A line of the nanny's own in the worker's log."""
    worker: str
    line: str


@dataclass(frozen=True)
class GiveUp:
    """Workers die while starting again and again: fail everything with this error."""
    error: Exception


@dataclass(frozen=True)
class Limits:
    """The memory settings the policy applies (fractions of ``limit``; None or 0: off)."""
    limit: Optional[int]
    target: Optional[float] = 0.6
    pause: Optional[float] = 0.8
    terminate: Optional[float] = 0.95
    sample_interval: float = 0.02
    worker_ttl: Optional[float] = 60.0
    leak_restart: Optional[float] = 10.0    # paused that long with nothing to spill: a leak

    @classmethod
    def from_config(cls, limit: Optional[int], cfg: dict) -> "Limits":
        return cls(limit, cfg["memory_target"], cfg["memory_pause"], cfg["memory_terminate"],
                   cfg["memory_sample_interval"], cfg["worker_ttl"], cfg.get("memory_leak_restart"))


@dataclass(frozen=True)
class Adapt:
    """The bounds of ``cluster.adapt``: ``0 <= minimum <= maximum`` workers; ``idle``: seconds
    the work must need fewer workers than are up before the extra ones are let go."""
    minimum: int
    maximum: int
    idle: float


class Slot:
    """One worker as the policy sees it. Only the policy writes these fields (the supervisor
    reads them under the cluster's lock)."""
    __slots__ = ("name", "pid", "state", "reason", "step", "deadline", "next_sample", "memory",
                 "peak_memory", "managed", "reusable", "paused_since", "timed_out", "leak")

    def __init__(self, name: str, pid: int, now: float):
        self.name = name
        self.pid = pid
        self.state = "starting"                 #: one of STATES
        self.reason: Optional[str] = None       #: stopping: one of REASONS; None otherwise
        self.step: Optional[str] = None         #: stopping: one of STEPS; None otherwise
        self.deadline: Optional[float] = None   #: stopping: the next step is taken then (None: at
                                                #: the kill, and a scale-down's hand-off, which waits
                                                #: for the worker's running tasks however long)
        self.next_sample = now                  #: when memory is sampled next
        self.memory: Optional[int] = None       #: last RSS sample, bytes (worker and children)
        self.peak_memory: Optional[int] = None
        self.managed = 0                        #: bytes of results held in memory (not spilled)
        self.reusable = 0                       #: bytes kept warm for reuse (wire/recycle.py)
        self.paused_since: Optional[float] = None   #: paused: since when
        self.timed_out: Optional[tuple] = None  #: reason timeout: (run seq, seconds it ran)
        self.leak: Optional[str] = None         #: reason memory-leak: the figures, in words

    @property
    def ready(self) -> bool:
        """Accepted and not leaving: the scheduler may give it work."""
        return self.state in ("running", "paused")

    @property
    def unmanaged(self) -> Optional[int]:
        """What the tasks' own code keeps: RSS less the results it holds and the memory kept
        warm for reuse."""
        return None if self.memory is None else max(0, self.memory - self.managed - self.reusable)

    def __repr__(self) -> str:
        extra = f" {self.reason}/{self.step}" if self.state == "stopping" else ""
        return f"<Slot {self.name} {self.state}{extra}>"


class Policy:
    """Every worker slot from spawn to exit, and what to do about each (see the module docstring).

    Thread: the scheduler thread sends every event; user threads read ``slots`` and
    ``target`` under the cluster's lock."""

    def __init__(self, limits: Limits):
        self.limits = limits
        #: the cluster is starting: a worker too small for the limit refuses the cluster
        #: (later it is a failed start); told by ``cluster_is``, never read from the cluster
        self.starting = True
        #: the cluster is closing (or closed): no respawn, no adapting; told by ``cluster_is``
        self.closing = False
        self.slots: dict[str, Slot] = {}            #: name -> slot, for every worker not yet reaped
        self.target = 0                             #: the size scale() asked for
        self.startup_failures: list[WorkerDeath] = []   #: failed starts in a row (cleared by an accepted one)
        self.respawn_at: list[float] = []           #: when a replacement is due, one entry each
        self.leak_suspects: Optional[frozenset] = None  #: keys running at every leak restart so far
        self.adaptive: Optional[Adapt] = None       #: adapt()'s bounds while adapting; None: scale() rules
        self.surplus_since: Optional[float] = None  #: adapting: since when the work needs fewer workers

    # --- queries ---------------------------------------------------------------------------

    def alive(self) -> list[Slot]:
        """Slots that count towards the target: not stopping."""
        return [s for s in self.slots.values() if s.state != "stopping"]

    def sample_due(self, now: float) -> list[str]:
        return [s.name for s in self.slots.values() if s.ready and now >= s.next_sample]

    def status(self, name: str) -> str:
        """As ``cluster.workers[name].status``: starting, running, paused, closing."""
        s = self.slots[name]
        return "closing" if s.state == "stopping" else s.state

    def validate(self) -> None:
        """Raise AssertionError naming the first broken invariant."""
        for name, s in self.slots.items():
            assert s.name == name, f"{s!r} filed under {name!r}"
            assert s.state in STATES, f"{s!r}: unknown state"
            stopping = s.state == "stopping"
            assert (s.reason in REASONS) == stopping, f"{s!r}: reason {s.reason!r} in state {s.state}"
            assert (s.step in STEPS) == stopping, f"{s!r}: step {s.step!r} in state {s.state}"
            open_ended = s.step == "kill" or (s.step == "handoff" and s.reason == "requested")
            assert (s.deadline is not None) == (stopping and not open_ended), \
                f"{s!r}: deadline {s.deadline!r} at step {s.step!r}"
            assert (s.paused_since is not None) == (s.state == "paused"), f"{s!r}: paused_since {s.paused_since}"
            assert (s.timed_out is not None) <= (s.reason == "timeout"), f"{s!r}: timed_out without a timeout"
            assert (s.leak is not None) == (s.reason == "memory-leak"), f"{s!r}: leak {s.leak!r}"
            assert s.peak_memory is None or s.memory is None or s.peak_memory >= s.memory, f"{s!r}: peak below memory"
        assert len(self.startup_failures) < STARTUP_RETRIES or not self.respawn_at, \
            "respawning after giving up on start-ups"
        a = self.adaptive
        assert a is not None or self.surplus_since is None, "an idle clock without adapting"
        assert a is None or 0 <= a.minimum <= self.target <= a.maximum, \
            f"adapting between {a and a.minimum} and {a and a.maximum} with target {self.target}"

    # --- size ------------------------------------------------------------------------------

    def scale(self, target: int, now: float, idleness: dict) -> list:
        """``idleness``: name -> a sortable value, the idlest first (the supervisor knows the
        scheduler's view: not ready, then fewest runs, then least data). The user's scale()
        turns adapting off, as dask's does."""
        self.adaptive = self.surplus_since = None
        return self._resize(target, now, idleness)

    def refill(self, now: float, idleness: dict) -> list:
        """Back up to the target (restart: every old worker is leaving); adapting goes on."""
        return self._resize(self.target, now, idleness)

    def adapt(self, bounds: Adapt, now: float, idleness: dict) -> list:
        """adapt() (again): the new bounds replace the old, and a size outside them is brought
        inside at once; the rest is the work's (``adapting``)."""
        self.adaptive, self.surplus_since = bounds, None
        return self._resize(min(max(len(self.alive()), bounds.minimum), bounds.maximum), now, idleness)

    def adapting(self, now: float, slots: int, threads: int, data_only_on_workers: Callable[[], bool],
                 idleness: Callable[[], dict]) -> list:
        """The adapt tick. ``slots``: task slots the work at hand could fill now (runs on the
        workers and ready tasks no worker took); ``threads``: each worker's; ``data_only_on_workers()``:
        whether workers hold data still needed (asked only when the size would fall to 0)."""
        a = self.adaptive
        if a is None or self._closing():
            return []
        want = min(max(-(-slots // threads), a.minimum), a.maximum)
        have = len(self.alive())
        if want >= have:                # tasks wait for a thread: grow now, never later
            self.surplus_since = None
            # a death's replacement already due (respawn_at, with its backoff) is not doubled
            due = want != self.target or want > have + len(self.respawn_at)
            return self._resize(want, now, idleness()) if due else []
        if self.surplus_since is None:
            self.surplus_since = now
        if now - self.surplus_since < a.idle:
            return []
        self.surplus_since = now        # looked: the next look is one idle period later
        if want == 0 and data_only_on_workers():
            want = min(1, a.maximum)
        return self._resize(want, now, idleness()) if want != self.target else []

    def _resize(self, target: int, now: float, idleness: dict) -> list:
        self.target = target
        alive = self.alive()
        out: list = [Spawn() for _ in range(target - len(alive))]
        if len(alive) > target:
            victims = sorted(alive, key=lambda s: (idleness.get(s.name, ()), s.name))[: len(alive) - target]
            for s in victims:
                out += self._leave(s, "requested", now)
        return out

    def retire(self, names: list, now: float) -> list:
        """retire_workers: these workers leave, their data handed on first, and the cluster's
        size shrinks by as many (adapting, if on, goes on)."""
        out: list = []
        for name in names:
            s = self.slots.get(name)
            if s is not None and s.state != "stopping":
                self.target = max(0, self.target - 1)
                out += self._leave(s, "requested", now)
        return out

    def restart(self, names: list, now: float) -> list:
        """restart_workers: these workers exit now and as many fresh ones start (names are never
        reused); what they held is computed again where needed, as after any death."""
        out: list = []
        for name in names:
            s = self.slots.get(name)
            if s is not None and s.state != "stopping":
                out += [Spawn()] + self._stop(s, "requested", now)
        return out

    def stop_all(self, now: float) -> list:
        """Close or restart: every worker is asked to exit, and killed if it does not."""
        out: list = []
        for s in list(self.slots.values()):
            out += self._stop(s, "requested", now)
        return out

    def close(self, now: float) -> list:
        self.target = 0
        self.adaptive = self.surplus_since = None
        self.respawn_at.clear()
        return self.stop_all(now)

    # --- a worker's life --------------------------------------------------------------------

    def spawned(self, name: str, pid: int, now: float) -> list:
        self.slots[name] = Slot(name, pid, now)
        return []

    def ready(self, name: str, now: float, rss: Optional[int]) -> list:
        """A worker said it is ready. One whose idle footprint already crosses where workers
        are paused or killed would be paused or killed forever: refused, never a restart loop."""
        s = self.slots.get(name)
        if s is None or s.state != "starting":
            return []
        self._record_memory(s, rss)
        too_small = self._limit_too_small(s, rss)
        if too_small and self.starting:
            return [Refuse(ValueError(too_small))] + self._stop(s, "requested", now)
        if too_small:       # scaling up, or a replacement: a failed start (see exited)
            return [Note(name, f"[nanny] {too_small}")] + self._stop(s, "memory-limit", now)
        s.state = "running"
        s.next_sample = now + self.limits.sample_interval
        self.startup_failures.clear()
        return [Accept(name)]

    def sampled(self, name: str, now: float, rss: Optional[int], managed: int, reusable: int = 0) -> list:
        """A memory sample: terminate above memory_terminate of the limit; pause and resume
        around memory_pause; restart a worker paused with nothing left to spill (a leak)."""
        s = self.slots.get(name)
        handing_off = s is not None and s.step == "handoff"     # it still runs its last tasks
        if s is None or not (s.ready or handing_off):
            return []
        s.next_sample = now + self.limits.sample_interval
        self._record_memory(s, rss)
        s.managed, s.reusable = managed, reusable
        lim = self.limits
        if not lim.limit or rss is None:
            return []
        if lim.terminate and rss > lim.terminate * lim.limit:
            # the death's own console line follows at once: this one stays in the log
            if handing_off:
                s.reason, s.leak = "memory-limit", None
            else:
                self._enter(s, "memory-limit")
            return [Note(name, f"[nanny] Worker exceeded {int(lim.terminate * 100)}% memory budget. "
                               f"Restarting ({name}, pid {s.pid}: {format_bytes(rss)} of "
                               f"{format_bytes(lim.limit)})")] + self._kill(s)
        if handing_off:
            return []
        out: list = []
        if lim.pause:
            paused = rss > lim.pause * lim.limit
            if paused != (s.state == "paused"):
                s.state = "paused" if paused else "running"
                s.paused_since = now if paused else None
                out += [SetPaused(name, paused),
                        Note(name, f"[nanny] {'paused' if paused else 'resumed'}: memory {format_bytes(rss)} "
                                   f"{'above' if paused else 'below'} {int(lim.pause * 100)}% of "
                                   f"{format_bytes(lim.limit)}")]
        if s.state == "paused" and self._leaking(s, now):
            s.leak = (f"unmanaged memory {format_bytes(s.unmanaged)} of {format_bytes(lim.limit)} limit "
                      f"(results held: {format_bytes(managed)}), above memory_pause for "
                      f"{now - s.paused_since:.0f} s with nothing to spill")
            out += self._leave(s, "memory-leak", now)
        return out

    def _leaking(self, s: Slot, now: float) -> bool:
        """Paused for leak_restart seconds, and even with every result it holds spilled it
        would stay above memory_target: the memory is the tasks' own, and waiting frees none."""
        lim = self.limits
        return bool(lim.leak_restart and now - s.paused_since >= lim.leak_restart
                    and s.unmanaged > (lim.target or lim.pause) * lim.limit)

    def observed(self, name: str, now: float, runs: dict, heartbeat: float) -> list:
        """What the worker's status board says: ``runs`` maps each run its threads have taken
        up to (seconds since it started, its timeout or None); ``heartbeat``: monotonic time
        of the last beat (0: none yet)."""
        s = self.slots.get(name)
        if s is None or not s.ready:
            return []
        late = self.late_run(runs)
        if late is not None:
            s.timed_out = late
            return self._stop(s, "timeout", now)
        if not self.silent(heartbeat, now):
            return []
        ttl = self.limits.worker_ttl
        return [Note(name, f"[nanny] no heartbeat for {now - heartbeat:.1f} s (worker_ttl={ttl:g}); "
                           f"dumping all thread stacks, then stopping it")] + self._stop(s, "unresponsive", now)

    @staticmethod
    def late_run(runs: dict) -> Optional[tuple]:
        """(seq, seconds it ran) of a run past its timeout, in ``observed``'s ``runs``; else None."""
        for seq, (elapsed, timeout) in runs.items():
            if timeout is not None and elapsed > timeout:
                return seq, elapsed
        return None

    def silent(self, heartbeat: float, now: float) -> bool:
        """No heartbeat for worker_ttl (a worker that never beat yet is not silent)."""
        ttl = self.limits.worker_ttl
        return bool(ttl and heartbeat and now - heartbeat > ttl)

    def stacks_arrived(self, name: str) -> list:
        s = self.slots.get(name)
        if s is None or s.step != "stacks":
            return []
        return self._kill(s)

    def retired(self, name: str, now: float) -> list:
        """The scheduler let go of the worker (its data moved, nothing runs there): it may exit."""
        s = self.slots.get(name)
        if s is None:
            return []
        if s.state != "stopping":       # scale down reaches the scheduler first, then here
            return self._stop(s, "requested", now)
        if s.step == "handoff":
            return self._to_step(s, "stop", now + STOP_GRACE, [SendStop(name)])
        return []

    def tick(self, now: float) -> list:
        """Deadlines of stopping workers, and respawns that are due."""
        out: list = []
        for s in list(self.slots.values()):
            if s.state == "stopping" and s.deadline is not None and now >= s.deadline:
                # the hand-off never finished, Stop was ignored, or the dump never came
                out += self._kill(s) if s.step != "handoff" else self._to_step(
                    s, "stop", now + STOP_GRACE, [SendStop(s.name)])
        due = [t for t in self.respawn_at if now >= t]
        coming = len(self.alive())       # counting the Spawns of this loop: a slot appears only once carried out
        for t in due:
            self.respawn_at.remove(t)
            # scale() or restart() since the death may have made up the number already
            if not self._closing() and coming < self.target:
                out.append(Spawn())
                coming += 1
        return out

    def exited(self, death: WorkerDeath, now: float, ran_tasks: bool = False) -> list:
        """The worker is reaped and its death recorded: forget it, and replace it unless the
        cluster asked for this exit. A worker that died before it was accepted, or was killed
        for memory having never run a task (``ran_tasks``), is a failed start: respawning cannot
        help past a few tries, so the loop ends in WorkerStartupError, never forever. (One that
        ran tasks and was killed between two of them holds what they kept: a leak, not a start.)"""
        s = self.slots.pop(death.worker, None)
        if s is None or self._closing() or death.cause == "requested":
            return []
        if s.state == "starting" or (death.cause == "memory-limit" and not death.tasks and not ran_tasks):
            self.startup_failures.append(death)
            if len(self.startup_failures) >= STARTUP_RETRIES:
                self.respawn_at.clear()
                return [GiveUp(WorkerStartupError(tuple(self.startup_failures)))]
            self.respawn_at.append(now + BACKOFF * 2 ** (len(self.startup_failures) - 1))
            return []
        # On the next tick, not now: starting a process holds the scheduler thread longer
        # than the dead worker's tasks, just sent elsewhere, take to come back.
        self.respawn_at.append(now)
        return []

    def _closing(self) -> bool:
        return self.closing

    def cluster_is(self, starting: bool, closing: bool) -> None:
        """Where the cluster stands, told before each event (the supervisor reads the shared
        Lifecycle under the lock, so that this class reads nothing it was not handed)."""
        self.starting, self.closing = starting, closing

    def leak_blame(self, running: tuple) -> tuple:
        """The keys a leak restart counts against: only those running at every leak restart
        so far. A leak builds up over many tasks, so the task that happens to run when the
        worker is restarted is not its cause; a task running at each of them may be."""
        keys = frozenset(running)
        self.leak_suspects = keys if not self.leak_suspects else self.leak_suspects & keys
        return tuple(k for k in running if k in self.leak_suspects)

    # --- the one way out ----------------------------------------------------------------------

    def _leave(self, s: Slot, reason: str, now: float) -> list:
        """Stop a worker whose data may be needed: the scheduler moves it first."""
        if s.state == "stopping":
            return []
        if s.state == "starting":       # no data, nothing running: no hand-off
            return self._stop(s, reason, now)
        self._enter(s, reason)
        # a scale-down waits for the tasks the worker runs, as dask's retire_workers does;
        # a leaking worker is given a while, then stopped (its runs go elsewhere)
        deadline = None if reason == "requested" else now + HANDOFF_GRACE
        return self._to_step(s, "handoff", deadline, [HandOff(s.name)])

    def _stop(self, s: Slot, reason: str, now: float) -> list:
        """Stop at once, by the step the reason calls for: Stop for an exit the cluster asked
        for, the stacks first where the death should show where the worker was, a kill for
        memory (no time to lose)."""
        if s.state == "stopping":   # only close or restart come here: they cut a hand-off short
            if s.step == "handoff":
                s.reason, s.leak = "requested", None
                return self._to_step(s, "stop", now + STOP_GRACE, [SendStop(s.name)])
            return []
        self._enter(s, reason)
        if reason == "requested":
            return self._to_step(s, "stop", now + STOP_GRACE, [SendStop(s.name)])
        if reason in ("timeout", "unresponsive"):
            return self._to_step(s, "stacks", now + STACK_GRACE, [DumpStacks(s.name)])
        return self._kill(s)

    def _enter(self, s: Slot, reason: str) -> None:
        s.state, s.reason, s.paused_since = "stopping", reason, None
        if reason != "memory-leak":
            s.leak = None

    def _to_step(self, s: Slot, step: str, deadline: Optional[float], out: list) -> list:
        s.step, s.deadline = step, deadline
        return out

    def _kill(self, s: Slot) -> list:
        s.step, s.deadline = "kill", None
        return [Kill(s.name)]

    # --- memory ------------------------------------------------------------------------------

    @staticmethod
    def _record_memory(s: Slot, rss: Optional[int]) -> None:
        if rss is None:
            return
        s.memory = rss
        if s.peak_memory is None or rss > s.peak_memory:
            s.peak_memory = rss

    def _limit_too_small(self, s: Slot, rss: Optional[int]) -> Optional[str]:
        lim = self.limits
        fraction = min((f for f in (lim.pause, lim.terminate) if f), default=None)
        if not lim.limit or not rss or fraction is None or rss <= fraction * lim.limit:
            return None
        return (f"memory_limit={format_bytes(lim.limit)} is too small: an idle worker needs {format_bytes(rss)} "
                f"({s.name}, pid {s.pid}, running no task), above {fraction:.0%} of the limit, where workers "
                f"are paused or killed. Use memory_limit of at least {format_bytes(int(rss / fraction) + 1)} "
                f"plus what the tasks hold, \"auto\", or None for no limit.")
