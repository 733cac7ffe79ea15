"""The supervisor: every worker process from spawn to reap, and what its death means.

Data flow (all on the scheduler thread unless said)::

    spawn ─► Nanny (process, channel, output pipes, pidfd, board) ─► registered in the loop
    channel readable ─► Ready / Fatal here; task messages ─► Dispatcher.on_worker_messages
    output readable  ─► OutputStream.read (the bounded log; forwarded to the same stream)
    tick             ─► memory sample ─► pause / resume / terminate
                     ─► task timeouts and heartbeats, read from each worker's status board
                     ─► escalation of stops; respawns that were delayed
    pidfd readable   ─► reap ─► classify ─► WorkerDeath ─► Scheduler.worker_died ─► respawn,
                        or give up on a start-up crash loop (WorkerStartupError)

Threads: the scheduler thread runs everything above. User threads only read, under the
cluster's lock: ``snapshot``, ``logs``, ``dump_stacks``, ``wait_for``.

Owns: the nannies (name -> Nanny; only the scheduler thread adds or removes one, under
the lock), ``deaths`` (appended under the lock, oldest first), the logs of dead workers,
the run of start-up failures, the respawn schedule and the target size.
"""
from __future__ import annotations

import itertools
import logging
import os
import selectors
import shutil
import signal
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from . import logs
from . import protocol as P
from . import scheduler as S
from .config import format_bytes
from .death import (ClusterBroken, WorkerDeath, WorkerStartupError, classify, crash_stack, crashing_thread,
                    death_message, signal_name, thread_stack)
from .history import History
from .nanny import Nanny

logger = logging.getLogger("localcluster")

STARTUP_RETRIES = 3
STOP_GRACE = 2.0    # a worker that ignores Stop this long is killed
STACK_GRACE = 1.0   # longest wait for the stack dump a timeout kill asks for first
_OWN = (P.Ready, P.Fatal, P.Log)


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


@dataclass(frozen=True)
class WorkerSettings:
    """What every worker of one cluster is started with."""
    threads: int
    memory_limit: Optional[int]
    config: dict
    initializer: Optional[str]     # hex of the pickled (initializer, initargs)
    directory: str                 # the cluster's local directory: one spill directory per worker


class Supervisor:
    def __init__(self, settings: WorkerSettings, lock: Any, changed: Any, scheduler: S.Scheduler,
                 dispatch: Any, loop: Any, history: History, phase: Callable[[], str]):
        self._settings = settings
        self._history = history
        self._config = settings.config
        self._lock = lock
        self._changed = changed
        self._scheduler = scheduler
        self._dispatch = dispatch
        self._loop = loop
        self._phase = phase                  # the cluster's status: starting, running, closing, closed
        self.nannies: dict[str, Nanny] = {}
        self.deaths: list[WorkerDeath] = []
        self._dead_logs: dict[str, list] = {}
        self._names = itertools.count()
        self._startup_failures: list[WorkerDeath] = []
        self._respawn_at: list[float] = []
        self.target = 0
        self.closing = False

    # --- for the dispatcher (under the lock) --------------------------------------------------

    def nanny(self, name: str) -> Optional[Nanny]:
        return self.nannies.get(name)

    def retire(self, name: str) -> None:
        n = self.nannies.get(name)
        if n is not None and n.reason is None:
            self._stop(n)

    def watch_channel(self, n: Nanny) -> None:
        """Select its channel for reading, and for writing while it has bytes pending."""
        if n.chan is not None and not n.chan.closed:
            self._loop.modify(n.chan, lambda mask: self._on_channel(n, mask), n.chan.wants_write())

    # --- size ---------------------------------------------------------------------------------

    def spawn(self) -> None:
        s = self._settings
        name = f"worker-{next(self._names)}"
        n = Nanny(name, s.threads, s.memory_limit, s.config, os.path.join(s.directory, name), s.initializer,
                  s.config["forward_logs"], s.config["log_lines"])
        n.spawn()
        with self._lock:
            self.nannies[name] = n
        self._loop.register(n.chan, lambda mask: self._on_channel(n, mask))
        for stream in n.outputs:
            self._loop.register(stream.fd, lambda _mask, stream=stream: self._on_output(stream))
        if n.sentinel is not None:
            self._loop.register(n.sentinel, lambda _mask: self._on_exit(n))

    def _alive(self) -> list:
        """Workers neither stopping nor retiring. Caller holds the lock, or is the scheduler thread."""
        return [n for n in self.nannies.values() if not n.reason and not self._scheduler_closing(n.name)]

    def scale(self, target: int) -> None:
        self.target = target
        with self._lock:
            alive = self._alive()
        for _ in range(target - len(alive)):
            self.spawn()
        if len(alive) <= target:
            return
        def idleness(n: Nanny) -> tuple:
            ws = self._scheduler.workers.get(n.name)
            return (0 if not n.ready else 1, len(ws.processing) if ws else 0, len(ws.has) if ws else 0)
        victims = sorted(alive, key=idleness)[: len(alive) - target]
        with self._lock:
            actions: list = []
            for n in victims:
                if n.name in self._scheduler.workers:
                    actions += self._scheduler.retire(n.name)     # it hands its data on first
                else:
                    self._stop(n)
            post = self._dispatch.apply(actions)
        self._dispatch.post(post)

    def _scheduler_closing(self, name: str) -> bool:
        ws = self._scheduler.workers.get(name)
        return ws is not None and ws.closing

    def stop_all(self) -> None:
        """Ask every worker to exit (close, restart); each is killed if it does not."""
        with self._lock:
            for n in self.nannies.values():
                self._stop(n)

    def begin_close(self) -> None:
        self.closing = True
        self.target = 0
        self.stop_all()

    def _stop(self, n: Nanny) -> None:
        n.stop()
        n.kill_at = time.monotonic() + STOP_GRACE     # escalated in tick

    def keep_going(self) -> bool:
        """Whether the scheduler thread goes on: not once closing found every worker gone,
        nor after a break (then it kills and reaps the workers first)."""
        if isinstance(self._dispatch.broken, ClusterBroken):
            self.reap_all()
            return False
        return not (self.closing and not self.nannies)

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
            n.kill(None)

    def _force_reap(self, n: Nanny) -> None:
        if n.exitcode is None and n.proc is not None:
            n.kill(None)
            try:
                n.reap()
            except Exception:  # pragma: no cover
                pass
        n.close()
        self.nannies.pop(n.name, None)

    def wait_for(self, count: int, timeout: float, at_least: bool = False) -> None:
        """User thread: until exactly ``count`` workers are up (a retiring one counts until
        gone), or with ``at_least``, until ``count`` or more are."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                if self._dispatch.broken is not None:
                    raise self._dispatch.broken
                ready = sum(1 for x in self.nannies.values() if x.ready and not x.reason)
                if ready == len(self.nannies) == count or (at_least and ready >= count):
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{ready} of {count} workers were up after {timeout:g} s")
                self._changed.wait(left)

    # --- the tick -----------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        for n in list(self.nannies.values()):
            if n.exitcode is None:
                self._tick_one(n, now)
        for t in list(self._respawn_at):
            if now >= t:
                self._respawn_at.remove(t)
                # scale() or restart() since the death may have made up the number already
                if self._phase() not in ("closing", "closed") and self._dispatch.broken is None \
                        and len(self._alive()) < self.target:
                    self.spawn()

    def _tick_one(self, n: Nanny, now: float) -> None:
        if n.kill_at is not None and now > n.kill_at:
            n.kill(None)       # it ignored Stop for STOP_GRACE seconds, or its dump never came
            return
        if n.dump_mark is not None and n.dump_complete(n.dump_mark):
            n.dump_mark = None
            n.kill(None)       # the timeout's kill, once the stacks are in the log
            return
        if not n.ready or n.reason:
            return
        if now >= n.next_sample:
            n.next_sample = now + self._config["memory_sample_interval"]
            rss = n.sample(now)
            if rss is not None:
                self._history.sample(n.name, time.time(), rss)
            self._check_memory(n, rss)
        if n.reason is None:
            self._check_timeouts(n, now)
        if n.reason is None:
            self._check_heartbeat(n, now)

    def _check_memory(self, n: Nanny, rss: Optional[int]) -> None:
        """terminate above memory_terminate of the limit; pause / resume around memory_pause."""
        limit, cfg = self._settings.memory_limit, self._config
        if not limit or rss is None:
            return
        if cfg["memory_terminate"] and rss > cfg["memory_terminate"] * limit:
            # the death's own console line follows at once: this one stays in the log
            n.add_log(f"[nanny] Worker exceeded {int(cfg['memory_terminate'] * 100)}% memory budget. "
                      f"Restarting ({n.name}, pid {n.pid}: {format_bytes(rss)} of {format_bytes(limit)})")
            n.kill("memory-limit")
            return
        if cfg["memory_pause"]:
            paused = rss > cfg["memory_pause"] * limit
            if paused != n.paused:
                # The scheduler first: a user thread that reads the worker as paused (n.paused)
                # must find it paused for placement too, or a submit in between is sent to it.
                self._dispatch.event(self._scheduler.set_paused, n.name, paused)
                n.paused = paused
                n.add_log(f"[nanny] {'paused' if paused else 'resumed'}: memory {format_bytes(rss)} "
                          f"{'above' if paused else 'below'} {int(cfg['memory_pause'] * 100)}% of "
                          f"{format_bytes(limit)}")

    def _check_timeouts(self, n: Nanny, now: float) -> None:
        """A run past its timeout (measured from its real start, on the board) stops the worker,
        after faulthandler has written where every thread was: the death shows where it waited."""
        for seq, (_ident, started) in n.board.running().items():
            timeout = self._scheduler.timeout_of(seq)
            if timeout is not None and now - started > timeout:
                n.timed_out = (seq, now - started)
                n.reason = "timeout"
                n.dump_mark = n.lines_seen
                n.kill_at = now + STACK_GRACE
                n.request_stacks()
                return

    def _check_heartbeat(self, n: Nanny, now: float) -> None:
        """No heartbeat for worker_ttl: dump every thread's stack first, then stop it."""
        ttl = self._config["worker_ttl"]
        beat = n.board.heartbeat() / 1e9
        if not ttl or not beat or now - beat <= ttl:
            return
        if n.stacks_requested is None:
            n.add_log(f"[nanny] no heartbeat for {now - beat:.1f} s (worker_ttl={ttl:g}); "
                      f"dumping all thread stacks, then stopping it")
            n.request_stacks()
            n.stacks_requested = now
        elif now - n.stacks_requested > 0.5:
            n.kill("unresponsive")

    # --- what a worker sends and writes ------------------------------------------------------

    def _on_channel(self, n: Nanny, mask: int) -> None:
        if mask & selectors.EVENT_WRITE and n.chan.flush():     # the backlog went out
            self.watch_channel(n)
        if mask & selectors.EVENT_READ:
            try:
                msgs = n.chan.receive()
            except (EOFError, OSError):
                self._loop.unregister(n.chan)
                if n.sentinel is None:   # no pidfd: EOF is our death notice
                    self._on_exit(n)
                return
            if msgs:
                self._on_messages(n, msgs)

    def _on_output(self, stream: Any) -> None:
        if not stream.read():
            self._loop.unregister(stream.fd)
        with self._changed:
            self._changed.notify_all()          # dump_stacks waits for lines

    def _on_messages(self, n: Nanny, msgs: list) -> None:
        tasks: list = []
        own: list = []           # Ready and Fatal are the supervisor's; the rest the scheduler's
        for m in msgs:
            for one in (m.messages if type(m) is P.Batch else (m,)):
                (own if type(one) in _OWN else tasks).append(one)
        records: list = []
        with self._lock:
            actions: list = []
            for m in own:
                if type(m) is P.Ready:
                    actions += self._on_ready(n, m)
                elif type(m) is P.Log:
                    records += m.records
                else:
                    n.fatal = m.traceback
            if tasks:
                actions += self._dispatch.on_worker_messages(n.name, tasks)
            post = self._dispatch.apply(actions)
            if n.cork and n.chan is not None:
                post += self._dispatch.send(n, [])
        self._dispatch.post(post)
        if records:     # outside the lock: the user's handlers may take their time
            logs.emit(n.name, records, n.add_log, self._config["forward_logs"] is not False)

    def _on_ready(self, n: Nanny, m: P.Ready) -> list:
        """Caller holds the lock. A worker whose idle footprint already crosses the limit
        would be paused or killed forever: refused, never a restart loop."""
        n.ready, n.versions = True, m.versions
        too_small = self._limit_too_small(n, n.sample(time.monotonic()))
        if too_small and self._phase() == "starting":
            self._dispatch.refuse(ValueError(too_small))    # the constructor raises it
            n.stop()
        elif too_small:     # scaling up: a failed start (see _maybe_respawn)
            n.add_log(f"[nanny] {too_small}")
            n.kill("memory-limit")
        else:
            self._startup_failures.clear()
            n.enforce_ceiling()
        self._changed.notify_all()
        return self._scheduler.add_worker(n.name, n.nthreads) if n.reason is None else []

    def _limit_too_small(self, n: Nanny, rss: Optional[int]) -> Optional[str]:
        limit, cfg = self._settings.memory_limit, self._config
        fraction = min((f for f in (cfg["memory_pause"], cfg["memory_terminate"]) if f), default=None)
        if not limit or not rss or fraction is None or rss <= fraction * limit:
            return None
        return (f"memory_limit={format_bytes(limit)} is too small: an idle worker needs {format_bytes(rss)} "
                f"({n.name}, pid {n.pid}, running no task), above {fraction:.0%} of the limit, where workers "
                f"are paused or killed. Use memory_limit of at least {format_bytes(int(rss / fraction) + 1)} "
                f"plus what the tasks hold, \"auto\", or None for no limit.")

    # --- deaths -------------------------------------------------------------------------------

    def _on_exit(self, n: Nanny) -> None:
        # Messages and output written before the death come first: a result that
        # arrived is a result, and the crash stack is in the pipe.
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
        with self._changed:
            self.nannies.pop(n.name, None)
            self._dead_logs[n.name] = list(n.log)
            self._changed.notify_all()
        n.close()
        if death.cause != "requested":
            # one line on the console by default; the whole story is in the death and the exception
            lead = (f"Worker exceeded {int(self._config['memory_terminate'] * 100)}% memory budget. Restarting. "
                    if death.cause == "memory-limit" else "")
            logger.log(logging.WARNING if self._config["forward_logs"] else logging.INFO, death.headline(lead))
        self._maybe_respawn(n, death)

    def _record_death(self, n: Nanny, exitcode: int) -> WorkerDeath:
        running = n.board.running()
        lines = list(n.log)
        stack = self._death_stack(n, exitcode, running, lines)
        oom = n.oom.evidence() if exitcode == -signal.SIGKILL and n.reason is None and n.oom is not None else None
        cause = classify(exitcode, n.reason, oom_evidence=oom, machinery_error=bool(n.fatal) or not n.ready)
        crashed_seq = None
        if cause == "crash" and stack:
            ident = crashing_thread(stack)
            matches = [seq for seq, (tid, _t) in running.items() if tid == (ident or 0) & 0x7FFFFFFFFFFFFFFF]
            crashed_seq = matches[0] if matches else 0   # 0: a thread that ran no task
        with self._lock:
            self._record_lost(n, running)
            key_of = self._scheduler.key_of
            keys = tuple(k for k in (key_of(s) for s in sorted(running)) if k)
            blamed = self._scheduler.blame(cause, running, crashed_seq, n.timed_out[0] if n.timed_out else None)
            detail = oom if cause == "oom-killer" else self._death_detail(n, cause, lines)
            limit = self._settings.memory_limit
            death = WorkerDeath(
                worker=n.name, pid=n.pid, cause=cause, exitcode=exitcode,
                signal=signal_name(-exitcode) if exitcode is not None and exitcode < 0 else None,
                tasks=keys, memory=n.memory, peak_memory=n.peak_memory, memory_limit=limit,
                stack=stack, log_tail=tuple(lines[-50:]), time=time.time(),
                message=death_message(n.name, n.pid, cause, exitcode, keys, n.memory, n.peak_memory,
                                      limit, stack, detail),
                blamed=blamed, detail=detail)
            self.deaths.append(death)
            post = self._dispatch.apply(self._scheduler.worker_died(death, n.timed_out))
        self._dispatch.post(post)
        return death

    def _record_lost(self, n: Nanny, running: dict) -> None:
        """The runs the death cut short, into the task stream (before the scheduler forgets
        them). Caller holds the lock."""
        rows, now, mono = n.board.rows(), time.time(), time.monotonic()
        for seq, (_tid, started) in sorted(running.items()):
            key = self._scheduler.key_of(seq)
            if key is not None:
                self._history.task(key, n.name, rows.get(seq, 0), now - (mono - started), now, "lost")
        self._history.died(n.name)

    def _death_stack(self, n: Nanny, exitcode: Optional[int], running: dict, lines: list) -> Optional[str]:
        if n.reason in ("timeout", "unresponsive"):     # the stacks asked for before the kill
            seq = n.timed_out[0] if n.timed_out else min(running, default=None)
            return thread_stack(lines, running[seq][0]) if seq in running else None
        if exitcode is None or exitcode >= 0:
            return None
        return crash_stack(lines, all_threads=self._config["forward_logs"] == "all")

    def _death_detail(self, n: Nanny, cause: str, lines: list) -> Optional[str]:
        """Caller holds the lock."""
        if cause == "timeout" and n.timed_out:
            seq, elapsed = n.timed_out
            return (f"Task {self._scheduler.key_of(seq)!r} ran {elapsed:.2f} s, past its timeout of "
                    f"{self._scheduler.timeout_of(seq):g} s.")
        if cause == "exception" and n.fatal:
            return "Last line of its traceback: " + n.fatal.strip().splitlines()[-1]
        tail = [l for l in lines if l.strip()]
        if cause == "exception" and tail:
            return "Last line of its output: " + tail[-1].strip()
        return None

    def _maybe_respawn(self, n: Nanny, death: WorkerDeath) -> None:
        if self._phase() in ("closing", "closed") or death.cause == "requested":
            return
        # killed for memory while running nothing: respawning cannot help, so it counts
        # as a failed start and the loop ends in WorkerStartupError, never forever
        if not n.ready or (death.cause == "memory-limit" and not death.tasks):
            self._startup_failures.append(death)
            if len(self._startup_failures) >= STARTUP_RETRIES:
                error = WorkerStartupError(tuple(self._startup_failures))
                self._dispatch.refuse(error)
                with self._changed:
                    post = self._dispatch.apply(self._scheduler.clear(error))
                    self._changed.notify_all()
                self._dispatch.post(post)
                return
            delay = 0.1 * 2 ** (len(self._startup_failures) - 1)
            self._respawn_at.append(time.monotonic() + delay)
            return
        # On the next tick (within 50 ms), not now: starting a process holds this thread
        # 2-5 ms, while the dead worker's tasks, just sent elsewhere, come back in about 1.
        self._respawn_at.append(time.monotonic())

    # --- reading, from user threads ---------------------------------------------------------

    def snapshot(self) -> dict[str, WorkerInfo]:
        out = {}
        history = self._history.memory()
        with self._lock:
            for name, n in self.nannies.items():
                ws = self._scheduler.workers.get(name)
                managed, spilled, _nkeys = n.board.store() if n.board is not None else (0, 0, 0)
                status = ("closing" if n.reason or (ws and ws.closing) else "paused" if n.paused
                          else "running" if n.ready else "starting")
                out[name] = WorkerInfo(
                    name, n.pid, status, n.memory, n.peak_memory, self._settings.memory_limit, managed,
                    spilled, tuple(k for k in ws.processing.values() if k) if ws else (), n.nthreads,
                    history.get(name, []))
        return out

    def running_since(self, worker: Optional[str], seq: int) -> Optional[float]:
        """Caller holds the lock. When run ``seq`` started on ``worker`` (monotonic), if it has."""
        n = self.nannies.get(worker) if worker else None
        started = n.board.running().get(seq) if n is not None and n.board is not None else None
        return started[1] if started else None

    def running_keys(self) -> dict[str, str]:
        """Caller holds the lock. Key -> worker for every run a worker thread has taken up."""
        return {key: n.name for n in self.nannies.values() if n.board is not None
                for key in map(self._scheduler.key_of, n.board.running()) if key}

    def versions(self) -> dict[str, dict]:
        with self._lock:
            return {n.name: dict(n.versions) for n in self.nannies.values() if n.ready}

    def logs(self, n: Optional[int] = None) -> dict[str, list]:
        with self._lock:
            logs = dict(self._dead_logs)
            for name, nanny in self.nannies.items():
                logs[name] = list(nanny.log)
        return {name: (lines[-n:] if n else lines) for name, lines in logs.items()}

    def dump_stacks(self, worker: Optional[str] = None, timeout: float = 2.0) -> dict[str, str]:
        """The live stacks of every thread of each worker (faulthandler, via SIGUSR1)."""
        with self._lock:
            targets = [n for name, n in self.nannies.items() if worker in (None, name) and n.ready]
            marks = {n.name: n.lines_seen for n in targets}
        for n in targets:
            n.request_stacks()
        deadline = time.monotonic() + timeout
        out: dict[str, str] = {}
        with self._changed:
            while True:
                for n in targets:
                    if n.name not in out and n.dump_complete(marks[n.name]):
                        new = list(n.log)[-(n.lines_seen - marks[n.name]):]
                        out[n.name] = self._label_threads(n, "\n".join(new).strip())
                if len(out) == len(targets) or time.monotonic() > deadline:
                    return out
                self._changed.wait(0.05)

    def _label_threads(self, n: Nanny, text: str) -> str:
        """Say which task each executor thread is running, from the status board."""
        for seq, (ident, _started) in n.board.running().items():
            key = self._scheduler.key_of(seq)
            if key:
                text = text.replace(f"0x{ident:016x} (most recent call first):",
                                    f"0x{ident:016x} (most recent call first) running task {key!r}:")
        return text
