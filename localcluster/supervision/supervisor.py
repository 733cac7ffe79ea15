"""The supervisor: the I/O around every worker process, from spawn to reap. What to do about
a worker is decided by the supervision policy (policy.py, no I/O); this module observes,
turns what it sees into the policy's events, and carries out its instructions.

Data flow (all on the scheduler thread unless said)::

    spawn ─► Nanny (process, channel, output pipes, pidfd, board) ─► registered in the loop
    channel readable ─► Ready ─► policy.ready ─► Accept (ceiling, Scheduler.add_worker) or Refuse
                        task messages ─► Dispatcher.on_worker_messages (what was corked goes too)
    channel writable ─► the backlog flushed (the dispatcher asked the loop to wait for it)
    output readable  ─► OutputStream.read (the bounded log; forwarded to the same stream)
    tick             ─► memory sample ─► policy.sampled ─► SetPaused / Kill / HandOff (a leak)
                     ─► the status boards ─► policy.observed (timeouts, heartbeats) ─► DumpStacks
                     ─► a dump arrived ─► policy.stacks_arrived ─► Kill
                     ─► policy.tick: deadlines of stopping workers, respawns that are due
                     ─► adapting: Scheduler.demand ─► policy.adapting ─► Spawn / HandOff
    Retire (scheduler, any thread) ─► queued in the dispatcher ─► taken here (take_retired),
                        after each event and on every wake-up ─► policy.retired ─► SendStop
    pidfd readable   ─► reap ─► classify ─► WorkerDeath ─► WorkerDied event
                        ─► policy.exited ─► a respawn, or GiveUp (WorkerStartupError)

Each policy event runs under the cluster's lock (``_decide``), with what it asks of the
scheduler; signals, messages and spawns are carried out after the lock is let go of.

Threads: the scheduler thread runs everything above. User threads only read, under the
cluster's lock: ``snapshot``, ``logs``, ``dump_stacks``, ``wait_for``; and one that waits
for a single future reads its worker's channel itself (``read_for``, its part
``LentReading`` in reading.py): the loop lends it the channel, and its task results go to
the dispatcher from that thread, so the reply wakes one thread instead of two. Frames with
anything else it leaves, in order, for the scheduler thread (``Nanny.left_for_loop``).

Owns: the nannies (name -> Nanny; only the scheduler thread adds or removes one, under
the lock, and connects or disconnects its channel in the dispatcher in the same hold),
the policy, ``deaths`` (appended under the lock, oldest first, in the same hold that takes the
dead worker's nanny out) and the logs of dead
workers. It calls down only: the dispatcher, the scheduler, the loop, the lifecycle
(REFUSED when workers cannot start).
"""
from __future__ import annotations

import itertools
import logging
import os
import selectors
import shutil
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from ..worker import logs
from ..wire import protocol as P
from ..wire import vmcopy
from ..scheduler import events as E, state as S
from ..death import WorkerDeath, classify, crash_stack, crashing_thread, exit_signal, thread_ident, thread_stack
from ..engine.dispatch import Dispatcher
from ..engine.history import History, key_group
from ..engine.lifecycle import Lifecycle, Phase
from ..engine.loop import EventLoop
from .nanny import Nanny, join_groups
from .output import OutputStream
from .reading import OWN, LentReading
from .policy import (Accept, Adapt, DumpStacks, GiveUp, HandOff, Kill, Limits, Note, Policy, Refuse, SendStop, SetPaused,
                     Slot, Spawn)

logger = logging.getLogger("localcluster")


@dataclass
class WorkerInfo:
    """A snapshot of one worker, as ``cluster.workers[name]``."""
    name: str
    pid: int
    status: str                    # starting, running, paused, closing
    memory: Optional[int]          # RSS of the worker and its children, bytes
    peak_memory: Optional[int]
    memory_limit: Optional[int]
    managed: int                   # bytes of results held in memory
    spilled: int                   # bytes of results spilled to disk
    processing: tuple              # keys assigned to it
    nthreads: int
    memory_history: list = field(repr=False, default_factory=list)   # [(unix time, rss)]
    unmanaged: Optional[int] = None   # RSS less the results held and reusable: what the tasks' own code keeps
    running: dict = field(default_factory=dict)   # key -> seconds it has run, for the runs started
    reusable: int = 0              # bytes kept warm for the next large value (given back after 1 s unused)


@dataclass(frozen=True)
class WorkerSettings:
    """What every worker of one cluster is started with."""
    threads: int
    memory_limit: Optional[int]
    config: dict
    initializer: Optional[str]     # the path of the pickled (initializer, initargs), 0600
    directory: str                 # the cluster's local directory: one spill directory per worker
    end_note: Optional[str] = None  # the run's end note (runs.py), or None when the run is not recorded


class Supervisor:
    def __init__(self, settings: WorkerSettings, lock: threading.Lock, changed: threading.Condition,
                 scheduler: S.Scheduler, dispatch: Dispatcher, loop: EventLoop, history: History, life: Lifecycle):
        self._settings = settings
        self._history = history
        self._config = settings.config
        self._lock = lock
        self._changed = changed
        self._scheduler = scheduler
        self._dispatch = dispatch
        self._loop = loop
        self._life = life
        self.policy = Policy(Limits.from_config(settings.memory_limit, settings.config))
        self.nannies: dict[str, Nanny] = {}      #: the I/O handles, name -> Nanny; added and removed under the lock
        self.deaths: list[WorkerDeath] = []
        self._dead_logs: dict[str, list] = {}
        self._said: dict = {}          # what a worker said once for the whole cluster (logs.ONCE); reading threads
        self._names = itertools.count()
        #: user threads reading for their futures
        self._reading = LentReading(loop, dispatch, self._handle_left, settings.config.get("spin_wait") or 0.0)

    @property
    def target(self) -> int:
        return self.policy.target

    # --- the policy's decisions, carried out ---------------------------------------------------

    def _decide(self, event: Callable[[], list]) -> None:
        """Run a policy event under the lock, with what it asks of the scheduler; then the
        rest (signals, messages, spawns) outside it. Scheduler thread only."""
        todo = self._dispatch.drive(make=lambda: self._verdict(event))
        if not todo:
            return
        spawns = 0
        for i in todo:
            t = type(i)
            n = self.nannies.get(getattr(i, "worker", ""))
            if t is Spawn:
                if self._life.error is None:
                    spawns += 1
            elif n is None:
                continue
            elif t is Kill:
                n.kill()
            elif t is SendStop:
                n.stop()
            elif t is DumpStacks:
                n.ask_last_stacks(time.monotonic())
            elif t is Note:
                n.add_log(i.line)
        if spawns:
            self.spawn(spawns)
        self.retire_pending()

    def _verdict(self, event: Callable[[], list]) -> tuple[list, list]:
        """Caller holds the lock (Dispatcher.drive): the policy's instructions, and the
        scheduler events they ask for."""
        life = self._life
        self.policy.cluster_is(life.phase is Phase.STARTING, Phase.CLOSING in life.passed)
        todo = event()
        self.policy.validate()
        self._changed.notify_all()      # waiters wake once the lock is let go of, after the events
        events: list = []
        for i in todo:
            t = type(i)
            if t is SetPaused:
                events.append(E.SetPaused(i.worker, i.paused))
            elif t is HandOff:
                events.append(E.HandOff(i.worker))     # it hands its data on first
            elif t is Accept and i.worker in self.nannies:
                # Before its first task, what it allocates meets the kernel's limit; in the
                # same hold of the lock as the policy's verdict, so that nobody sees it ready
                # before the scheduler can give it work.
                n = self.nannies[i.worker]
                n.enforce_ceiling()
                events.append(E.AddWorker(n.name, n.nthreads))
            elif t is Refuse:
                self._life.to(Phase.REFUSED, i.error)           # the constructor raises it
            elif t is GiveUp:
                self._life.to(Phase.REFUSED, i.error)
                events.append(E.Clear(i.error))
        return todo, events

    def retire_pending(self) -> None:
        """Stop the workers the scheduler let go of (from any thread's event): here, on the
        scheduler thread and outside the lock, as every signal and message to a nanny."""
        for name in self._dispatch.take_retired():
            self._decide(lambda: self.policy.retired(name, time.monotonic()))

    # --- size ---------------------------------------------------------------------------------

    def spawn(self, count: int = 1) -> None:
        """``count`` workers back to back, then their moves into their cgroups (``join_groups``)."""
        started: list[Nanny] = []
        try:
            for _ in range(count):
                started.append(self._spawn_one())
        finally:
            join_groups(started)

    def _spawn_one(self) -> Nanny:
        s = self._settings
        name = f"worker-{next(self._names)}"
        n = Nanny(name, s.threads, s.memory_limit, s.config, os.path.join(s.directory, name), s.initializer,
                  s.config["forward_logs"], s.config["log_lines"], s.end_note)
        n.spawn()
        copyable = vmcopy.available(n.pid)      # once per process: whether a fetch may copy out of it
        with self._lock:
            self.nannies[name] = n
            self._dispatch.connect(name, n.chan, n.pid if copyable else None)
            self.policy.spawned(name, n.pid, time.monotonic())
        self._loop.register(n.chan, lambda mask: self._on_channel(n, mask))
        for stream in n.outputs:
            self._loop.register(stream.fd, lambda _mask, stream=stream: self._on_output(stream))  # type: ignore[misc]
        if n.sentinel is not None:
            self._loop.register(n.sentinel, lambda _mask: self._on_exit(n))
        return n

    def _idleness(self) -> dict:
        """Caller holds the lock. Each worker's rank for a scale-down, the idlest first: not
        ready, then fewest runs, then least data."""
        load = self._scheduler.load
        return {name: (0, 0, 0) if (runs_keys := load(name)) is None else (1, *runs_keys) for name in self.policy.slots}

    def scale(self, target: int) -> None:
        """The user's scale(): adapting stops."""
        self._decide(lambda: self.policy.scale(target, time.monotonic(), self._idleness()))

    def refill(self) -> None:
        """Back up to the target after restart(), adapting or not."""
        self._decide(lambda: self.policy.refill(time.monotonic(), self._idleness()))

    def adapt(self, bounds: Adapt) -> None:
        self._decide(lambda: self.policy.adapt(bounds, time.monotonic(), self._idleness()))

    @property
    def adapting(self) -> bool:
        return self.policy.adaptive is not None

    def _adapt(self, now: float) -> None:
        """The adapt tick: what the scheduler says the work could use, for the policy."""
        a = self.policy.adaptive
        threads = self._settings.threads
        if a is None:
            return
        self._decide(lambda: self.policy.adapting(now, self._scheduler.demand(a.maximum * threads), threads,
                                                  self._scheduler.data_only_on_workers, self._idleness))

    def retire(self, names: list) -> None:
        """retire_workers (scheduler thread): these leave, their data handed on first."""
        self._decide(lambda: self.policy.retire(names, time.monotonic()))

    def restart_some(self, names: list) -> None:
        """restart_workers (scheduler thread): these exit, as many fresh ones start."""
        self._decide(lambda: self.policy.restart(names, time.monotonic()))

    def wait_gone(self, names: list, timeout: float) -> None:
        """User thread: until none of ``names`` is a worker any more (its death recorded)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                if self._life.error is not None:
                    raise self._life.error
                left = [n for n in names if n in self.policy.slots]
                if not left:
                    return
                if deadline - time.monotonic() <= 0:
                    raise TimeoutError(f"{', '.join(left)} still running after {timeout:g} s (a task they run "
                                       f"holds them: retiring waits for it, as dask's does)")
                self._changed.wait(deadline - time.monotonic())

    def stop_all(self) -> None:
        """Ask every worker to exit (restart); each is killed if it does not."""
        self._decide(lambda: self.policy.stop_all(time.monotonic()))

    def begin_close(self) -> None:
        self._decide(lambda: self.policy.close(time.monotonic()))

    def keep_going(self) -> bool:
        """Whether the scheduler thread goes on: not once closing found every worker gone,
        nor after a break (then it kills and reaps the workers first)."""
        if self._life.broken:
            self.reap_all()
            return False
        return not (self._life.phase is Phase.CLOSING and not self.nannies)

    def reap_all(self) -> None:
        """Kill and reap every worker now (after a break, or at close)."""
        for n in list(self.nannies.values()):
            try:
                self._force_reap(n)
            except Exception:  # pragma: no cover - best effort: the cluster is already broken
                logger.exception("could not reap %s", n.name)

    def kill_all(self) -> None:
        """From another thread, when workers ignored Stop (a C call holding the GIL)."""
        for n in list(self.nannies.values()):
            n.kill()

    def _force_reap(self, n: Nanny) -> None:
        if n.exitcode is None and n.proc is not None:
            n.kill()
            try:
                n.reap()
            except Exception:  # pragma: no cover
                pass
        n.close()
        with self._lock:
            self.nannies.pop(n.name, None)
            self._dispatch.disconnect(n.name)
            self.policy.slots.pop(n.name, None)

    def wait_for(self, count: int, timeout: float, at_least: bool = False) -> None:
        """User thread: until exactly ``count`` workers are up (a retiring one counts until
        gone), or with ``at_least``, until ``count`` or more are."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                if self._life.error is not None:
                    raise self._life.error
                # A worker the scheduler was told is dead is not up, though the policy hears of
                # its death a moment later: its futures (KilledWorker) may wake the caller first.
                died = self._scheduler.died
                slots = {name: s for name, s in self.policy.slots.items() if not died(name)}
                ready = sum(1 for s in slots.values() if s.ready)
                if ready == len(slots) == count or (at_least and ready >= count):
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{ready} of {count} workers were up after {timeout:g} s")
                self._changed.wait(left)

    # --- the tick -----------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Memory samples, the status boards (timeouts, heartbeats), stack dumps that arrived,
        deadlines and respawns: each an event for the policy."""
        policy = self.policy
        for name in policy.sample_due(now):
            self._sample(self.nannies[name], now)
        timeout_of = self._scheduler.timeout_of
        for name, slot in list(policy.slots.items()):
            n = self.nannies.get(name)
            if n is None or n.board is None:
                continue
            if slot.ready:
                runs = {seq: (now - started, timeout_of(seq))
                        for seq, (_ident, started) in self._running(n, False).items()}
                beat = n.board.heartbeat() / 1e9
                # most ticks the board shows nothing for the policy: then no lock is taken
                if policy.late_run(runs) is not None or policy.silent(beat, now):
                    self._decide(lambda: policy.observed(name, now, runs, beat))
            elif slot.step == "stacks" and n.last_stacks_arrived(now):
                self._decide(lambda: policy.stacks_arrived(name))
        self._decide(lambda: policy.tick(now))
        self._adapt(now)

    def _sample(self, n: Nanny, now: float) -> None:
        rss = n.sample(now)
        if rss is not None:
            self._history.sample(n.name, time.time(), rss)
        managed = reusable = 0
        if n.board is not None:
            managed, reusable = n.board.store()[0], n.board.reusable()
            self._history.moving(n.name, n.board.moving())
        self._decide(lambda: self.policy.sampled(n.name, now, rss, managed, reusable))

    def _on_channel(self, n: Nanny, mask: int) -> None:
        if mask & selectors.EVENT_WRITE and n.chan.flush():     # the backlog went out
            self._loop.want_write(n.chan, False)
        if mask & selectors.EVENT_READ:
            with n.reading:
                self._take_left(n)
                try:
                    msgs = n.chan.receive()
                except (EOFError, OSError):
                    msgs = None
                else:
                    if msgs:
                        self._on_messages(n, msgs)
            if msgs is None:
                self._loop.unregister(n.chan)
                if n.sentinel is None:   # no pidfd: EOF is our death notice
                    self._on_exit(n)

    def _take_left(self, n: Nanny) -> None:
        """Under ``n.reading``: the frames a borrower left for this thread, before any newer one."""
        while n.left_for_loop:
            self._on_messages(n, n.left_for_loop.popleft())

    def _handle_left(self, n: Nanny) -> None:
        with n.reading:
            self._take_left(n)

    # --- a user thread reading for its future (reading.py) -------------------------------

    def read_for(self, worker: str, done: Callable[[], bool], watch: Callable[[Optional[Callable[[], None]]], None],
                 deadline: Optional[float]) -> None:
        """On a user thread that waits for one future whose task runs on ``worker``: read that
        worker's channel here until ``done()`` or ``deadline`` (``LentReading.read_for``)."""
        n = self.nannies.get(worker)        # a dict read; lend() says whether its channel is live
        if n is not None:
            self._reading.read_for(n, done, watch, deadline)

    def reads_here(self) -> bool:
        """Whether this thread is reading a worker's channel for its future (read_for):
        like the scheduler thread, it must not run what could wait for that channel."""
        return self._reading.reads_here()

    def _on_output(self, stream: OutputStream) -> None:
        if not stream.read():
            self._loop.unregister(stream.fd)
        with self._changed:
            self._changed.notify_all()          # dump_stacks waits for lines

    def _on_messages(self, n: Nanny, msgs: list) -> None:
        tasks: list = []
        own: list = []           # Ready and Fatal are the supervisor's; the rest the scheduler's
        asks: list = []          # requests from tasks (get_client, secede ...)
        for m in msgs:
            for one in (m.messages if type(m) is P.Batch else (m,)):
                t = type(one)
                (own if t in OWN else asks if t is P.Ask else tasks).append(one)
        records: list = []
        ready = pressed = False
        for m in own:
            t = type(m)
            if t is P.Ready:
                n.versions, ready = m.versions, True
            elif t is P.Log:
                records += m.records
            elif t is P.Pressure:
                pressed = True
            else:
                n.fatal = m.traceback
        if ready:
            self._history.up(n.name, time.time(), time.monotonic() - n.started)
            rss = n.sample(time.monotonic())
            self._decide(lambda: self.policy.ready(n.name, time.monotonic(), rss))
        if pressed:     # a sample now, not at the next tick: its prefetch is asked back at once
            self._sample(n, time.monotonic())
        if asks:        # before the results: a task's submits come before its own end
            self._dispatch.on_task_requests(n.name, asks)
        self._dispatch.on_worker_messages(n.name, tasks)
        if records:     # outside the lock: the user's handlers may take their time
            logs.emit(n.name, records, n.add_log, self._config["forward_logs"] is not False,
                      self._config.get("silence_logs", 0), self._said)
        self.retire_pending()

    # --- deaths -------------------------------------------------------------------------------

    def _on_exit(self, n: Nanny) -> None:
        # Messages and output written before the death come first: a result that
        # arrived is a result, and the crash stack is in the pipe.
        with n.reading:             # after what a borrower is handling, and what it left here
            self._take_left(n)
            if n.chan is not None and not n.chan.closed:
                try:
                    msgs = n.chan.drain()
                except OSError:
                    msgs = []
                if msgs:
                    self._on_messages(n, msgs)
        exitcode = n.reap()
        for fileobj in (n.chan, n.sentinel, *(stream.fd for stream in n.outputs)):
            if fileobj is not None:
                self._loop.unregister(fileobj)
        if n.spill_dir:   # its spilled data died with it; nothing may outlive it on disk
            shutil.rmtree(n.spill_dir, ignore_errors=True)
        death = self._record_death(n, exitcode)
        n.close()
        if death.cause != "requested":
            # one line on the console by default; the whole story is in the death and the exception
            lead = (f"Worker exceeded {int(self._config['memory_terminate'] * 100)}% memory budget. Restarting. "
                    if death.cause == "memory-limit" else "")
            logger.log(logging.WARNING if self._config["forward_logs"] else logging.INFO, death.headline(lead))
        ran = death.cause == "memory-limit" and self._history.most_run(n.name, key_group) is not None
        self._decide(lambda: self.policy.exited(death, time.monotonic(), ran))

    def _record_death(self, n: Nanny, exitcode: int) -> WorkerDeath:
        slot = self.policy.slots.get(n.name)
        reason = slot.reason if slot is not None else None
        timed_out = slot.timed_out if slot is not None else None
        running = self._running(n, False)
        lines = list(n.log)
        stack = self._death_stack(reason, timed_out, exitcode, running, lines)
        oom = n.oom.evidence() if exitcode == -signal.SIGKILL and reason is None and n.oom is not None else None
        cause = classify(exitcode, reason, oom_evidence=oom,
                         machinery_error=bool(n.fatal) or slot is None or slot.state == "starting")
        crashed_seq = None
        if cause == "crash" and stack:
            ident = crashing_thread(stack)
            matches = [seq for seq, (tid, _t) in running.items() if tid == thread_ident(ident or 0)]
            crashed_seq = matches[0] if matches else 0   # 0: a thread that ran no task
        keys: tuple = ()

        def make() -> tuple:
            nonlocal keys
            self._record_lost(n, running)
            key_of = self._scheduler.key_of
            keys = tuple(k for k in (key_of(s) for s in sorted(running)) if k)
            if cause == "memory-leak":
                blamed = self.policy.leak_blame(keys)
            else:
                blamed = self._scheduler.blame(cause, running, crashed_seq, timed_out[0] if timed_out else None)
            detail = oom if cause == "oom-killer" else self._death_detail(n, slot, cause, timed_out, lines)
            for more in self._scheduler.death_notes(n.name):
                detail = f"{detail} {more}" if detail else more
            limit = self._settings.memory_limit
            memory = slot.memory if slot is not None else None
            peak = slot.peak_memory if slot is not None else None
            managed = slot.managed if slot is not None and slot.memory is not None else None
            death = WorkerDeath(
                worker=n.name, pid=n.pid, cause=cause, exitcode=exitcode,
                signal=exit_signal(exitcode),
                tasks=keys, memory=memory, peak_memory=peak, memory_limit=limit,
                stack=stack, log_tail=tuple(lines[-50:]), time=time.time(),
                blamed=blamed, detail=detail, managed=managed).explained()
            # In the same hold as its death: nobody sees the death and the worker still
            # listed (cluster.workers), nor the worker gone and no death.
            self.deaths.append(death)
            self.nannies.pop(n.name, None)
            self._dead_logs[n.name] = list(n.log)
            return death, (E.WorkerDied(death, timed_out),)

        def heard(actions: list) -> None:
            # its runs went into the task stream as lost; those whose task the death ends
            # (KilledWorker, past its timeout) count it failed, as a run that raised does
            self._history.gave_up(sum(1 for a in actions if type(a) is S.Resolve and a.status == "error"
                                      and a.key in keys))
            # its sends were dropped with it (its outlet went before they were queued)
            self._dispatch.disconnect(n.name)
            self._changed.notify_all()
        return self._dispatch.drive(make=make, heard=heard)

    def _record_lost(self, n: Nanny, running: dict) -> None:
        """The runs the death cut short, into the task stream (before the scheduler forgets
        them). Caller holds the lock."""
        rows, now, mono = n.board.rows(), time.time(), time.monotonic()
        for seq, (_tid, started) in sorted(running.items()):
            key = self._scheduler.key_of(seq)
            if key is not None:
                spec = self._scheduler.spec_of(key)
                self._history.task(key, n.name, rows.get(seq, 0), now - (mono - started), now, "lost",
                                   submitter=spec.submitter if spec else None)
        self._history.died(n.name)

    def _death_stack(self, reason: Optional[str], timed_out: Optional[tuple], exitcode: Optional[int],
                     running: dict, lines: list) -> Optional[str]:
        if reason in ("timeout", "unresponsive"):     # the stacks asked for before the kill
            seq = timed_out[0] if timed_out else min(running, default=None)
            return thread_stack(lines, running[seq][0]) if seq in running else None
        if exitcode is None or exitcode >= 0:
            return None
        return crash_stack(lines, all_threads=self._config["forward_logs"] == "all")

    def _death_detail(self, n: Nanny, slot: Optional[Slot], cause: str, timed_out: Optional[tuple],
                      lines: list) -> Optional[str]:
        """Caller holds the lock."""
        if cause == "timeout" and timed_out:
            seq, elapsed = timed_out
            return (f"Task {self._scheduler.key_of(seq)!r} ran {elapsed:.2f} s, past its timeout of "
                    f"{self._scheduler.timeout_of(seq):g} s.")
        if cause == "memory-leak" and slot is not None and slot.leak:
            ran = self._history.most_run(n.name, key_group)
            return (f"{slot.leak}: probably a leak in the tasks' code"
                    + (f" ({ran[0]!r} ran {ran[1]} times on this worker)" if ran else "") + ".")
        if cause == "exception" and n.fatal:
            return "Last line of its traceback: " + n.fatal.strip().splitlines()[-1]
        tail = [l for l in lines if l.strip()]
        if cause == "exception" and tail:
            return "Last line of its output: " + tail[-1].strip()
        return None

    # --- reading, from user threads ---------------------------------------------------------

    def snapshot(self) -> dict[str, WorkerInfo]:
        out = {}
        history = self._history.memory()
        key_of = self._scheduler.key_of
        with self._lock:
            now = time.monotonic()
            for name, n in self.nannies.items():
                slot = self.policy.slots.get(name)
                if slot is None:
                    continue
                managed, spilled, _nkeys = n.board.store() if n.board is not None else (0, 0, 0)
                reusable = n.board.reusable() if n.board is not None else 0
                unmanaged = None if slot.memory is None else max(0, slot.memory - managed - reusable)
                out[name] = WorkerInfo(
                    name, n.pid, self.policy.status(name), slot.memory, slot.peak_memory,
                    self._settings.memory_limit, managed, spilled,
                    self._scheduler.processing_on(name), n.nthreads,
                    history.get(name, []), unmanaged,
                    {key_of(seq): now - t for seq, (_ident, t) in n.board.running().items()
                     if key_of(seq)} if n.board is not None else {}, reusable)
        return out

    def _running(self, n: Nanny, locked: bool = True) -> dict:
        """seq -> (thread ident, start in monotonic seconds) of each run on ``n``'s threads: the
        rows of its status board, and the runs that seceded, which left their row (the
        scheduler has them from their Secede). ``locked``: the caller holds the lock."""
        running = n.board.running()
        if self._scheduler.seceding():          # most clusters: no task ever seceded, no lock
            if locked:
                running.update(self._scheduler.off_board(n.name))
            else:
                with self._lock:
                    running.update(self._scheduler.off_board(n.name))
        return running

    def running_since(self, worker: Optional[str], seq: int) -> Optional[float]:
        """Caller holds the lock. When run ``seq`` started on ``worker`` (monotonic), if it has."""
        n = self.nannies.get(worker) if worker else None
        started = self._running(n).get(seq) if n is not None and n.board is not None else None
        return started[1] if started else None

    def running_keys(self) -> dict[str, str]:
        """Caller holds the lock. Key -> worker for every run a worker thread has taken up."""
        return {key: n.name for n in self.nannies.values() if n.board is not None
                for key in map(self._scheduler.key_of, self._running(n)) if key}

    def versions(self) -> dict[str, dict]:
        with self._lock:
            return {n.name: dict(n.versions) for n in self.nannies.values()
                    if n.name in self.policy.slots and self.policy.slots[n.name].ready}

    def logs(self, n: Optional[int] = None) -> dict[str, list]:
        with self._lock:
            logs = dict(self._dead_logs)
            for name, nanny in self.nannies.items():
                logs[name] = list(nanny.log)
        return {name: (lines[-n:] if n else lines) for name, lines in logs.items()}

    def dump_stacks(self, worker: Optional[str] = None, timeout: float = 2.0) -> dict[str, str]:
        """The live stacks of every thread of each worker (its stacks thread, with the GIL)."""
        with self._lock:
            targets = [n for name, n in self.nannies.items() if worker in (None, name)
                       and name in self.policy.slots and self.policy.slots[name].ready]
        requests = {n.name: n.request_stacks() for n in targets}
        deadline = time.monotonic() + timeout
        out: dict[str, str] = {}
        with self._changed:
            while True:
                for n in targets:
                    text = None if n.name in out else n.stacks_for(requests[n.name])
                    if text is not None:
                        out[n.name] = self._label_threads(n, text)
                if len(out) == len(targets) or time.monotonic() > deadline:
                    return out
                self._changed.wait(0.05)

    def _label_threads(self, n: Nanny, text: str) -> str:
        """Say which task each executor thread is running, from the status board."""
        for seq, (ident, _started) in self._running(n).items():
            key = self._scheduler.key_of(seq)
            if key:
                text = text.replace(f"0x{ident:016x} (most recent call first):",
                                    f"0x{ident:016x} (most recent call first) running task {key!r}:")
        return text
