"""Supervision, the scheduler thread's half of the nanny's job: the periodic tick
(memory samples -> pause / terminate, task timeouts and heartbeats read from each
worker's status board, escalation of stops) and everything that happens after a
worker process dies (reap, classify, record the WorkerDeath, tell the scheduler,
replace the worker or give up on a start-up crash loop).

A mixin of LocalCluster: it shares the cluster's lock, scheduler and nannies.
"""
from __future__ import annotations

import logging
import shutil
import signal
import time
from typing import Optional

from . import scheduler as S
from .config import format_bytes
from .death import (WorkerDeath, WorkerStartupError, classify, crash_stack, crashing_thread,
                    death_message, signal_name, thread_stack)
from .nanny import Nanny, logger

STARTUP_RETRIES = 3
STOP_GRACE = 2.0
STACK_GRACE = 1.0   # longest wait for the stack dump a timeout kill asks for first


class Supervision:
    def _deadline_kill(self, n: Nanny) -> None:
        n.kill_at = time.monotonic() + STOP_GRACE   # escalated in _tick

    def _tick(self, now: float) -> None:
        if self._released:
            self._free_released()
        self._uncork(list(self._nannies.values()))
        for n in list(self._nannies.values()):
            if n.exitcode is not None:
                continue
            if n.kill_at is not None and now > n.kill_at:
                n.kill(None)       # it ignored Stop for STOP_GRACE seconds, or its dump never came
                continue
            if n.dump_mark is not None and n.dump_complete(n.dump_mark):
                n.dump_mark = None
                n.kill(None)       # the timeout's kill, once the stacks are in the log
                continue
            if not n.ready or n.reason:
                continue
            if now >= n.next_sample:
                n.next_sample = now + self.config["memory_sample_interval"]
                self._check_memory(n, n.sample(now))
            if n.reason is None:
                self._check_timeouts(n, now)
            if n.reason is None:
                self._check_heartbeat(n, now)
        for t in list(self._respawn_at):
            if now >= t:
                self._respawn_at.remove(t)
                if self._status not in ("closing", "closed") and self._broken is None:
                    self._spawn()

    def _check_memory(self, n: Nanny, rss: Optional[int]) -> None:
        """terminate above memory_terminate of the limit; pause / resume around memory_pause."""
        limit, cfg = self.memory_limit, self.config
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
                n.paused = paused
                n.add_log(f"[nanny] {'paused' if paused else 'resumed'}: memory {format_bytes(rss)} "
                          f"{'above' if paused else 'below'} {int(cfg['memory_pause'] * 100)}% of "
                          f"{format_bytes(limit)}")
                self._event(self.scheduler.set_paused, n.name, paused)

    def _check_timeouts(self, n: Nanny, now: float) -> None:
        """A run past its timeout (measured from its real start, on the board) stops the worker,
        after faulthandler has written where every thread was: the death shows where it waited."""
        for seq, (_ident, started) in n.board.running().items():
            timeout = self.scheduler.timeout_of(seq)
            if timeout is not None and now - started > timeout:
                n.timed_out = (seq, now - started)
                n.reason = "timeout"
                n.dump_mark = n.lines_seen
                n.kill_at = now + STACK_GRACE
                n.request_stacks()
                return

    def _check_heartbeat(self, n: Nanny, now: float) -> None:
        """No heartbeat for worker_ttl: dump every thread's stack first, then stop it."""
        ttl = self.config["worker_ttl"]
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

    # --- deaths -----------------------------------------------------------------------

    def _on_exit(self, n: Nanny) -> None:
        # Messages and output written before the death come first: a result that
        # arrived is a result, and the crash stack is in the pipe.
        if n.chan is not None and not n.chan.closed:
            while True:
                try:
                    msgs = n.chan.receive()
                except (EOFError, OSError):
                    break
                if not msgs:
                    break
                self._on_messages(n, msgs)
        exitcode = n.reap()
        for fileobj in (n.chan, n.sentinel, *(stream.fd for stream in n.outputs)):
            if fileobj is not None:
                self._unregister(fileobj)
        if n.spill_dir:   # its spilled data died with it; nothing may outlive it on disk
            shutil.rmtree(n.spill_dir, ignore_errors=True)
        death = self._record_death(n, exitcode)
        with self._changed:
            self._nannies.pop(n.name, None)
            self._dead_logs[n.name] = list(n.log)
            self._changed.notify_all()
        n.close()
        if death.cause != "requested":
            # one line on the console by default; the whole story is in the death and the exception
            lead = (f"Worker exceeded {int(self.config['memory_terminate'] * 100)}% memory budget. Restarting. "
                    if death.cause == "memory-limit" else "")
            logger.log(logging.WARNING if self.config["forward_logs"] else logging.INFO, death.headline(lead))
        self._maybe_respawn(n, death)

    def _record_death(self, n: Nanny, exitcode: int) -> WorkerDeath:
        running = n.board.running()
        lines = list(n.log)
        full = self.config["forward_logs"] == "all"      # asked for everything: every thread, every frame
        stack = crash_stack(lines, all_threads=full) if exitcode is not None and exitcode < 0 else None
        if n.reason in ("timeout", "unresponsive"):     # the stacks asked for before the kill
            seq = n.timed_out[0] if n.timed_out else min(running, default=None)
            stack = thread_stack(lines, running[seq][0]) if seq in running else None
        cause = classify(exitcode, n.reason, oom_evidence=n.oom_evidence() if exitcode == -signal.SIGKILL else False,
                         machinery_error=bool(n.fatal) or not n.ready)
        crashed_seq = None
        if cause == "crash" and stack:
            ident = crashing_thread(stack)
            matches = [seq for seq, (tid, _t) in running.items() if tid == (ident or 0) & 0x7FFFFFFFFFFFFFFF]
            crashed_seq = matches[0] if matches else 0   # 0: a thread that ran no task
        with self._lock:
            keys = tuple(k for k in (self.scheduler.key_of(s) for s in sorted(running)) if k)
            blamed_seqs = S.blamed_runs(cause, running, crashed_seq, n.timed_out[0] if n.timed_out else None)
            blamed = tuple(k for k in (self.scheduler.key_of(s) for s in sorted(blamed_seqs)) if k)
            detail = None
            if cause == "timeout" and n.timed_out:
                tkey = self.scheduler.key_of(n.timed_out[0])
                detail = (f"Task {tkey!r} ran {n.timed_out[1]:.2f} s, past its timeout of "
                          f"{self.scheduler.timeout_of(n.timed_out[0]):g} s.")
            elif cause == "exception" and n.fatal:
                detail = "Last line of its traceback: " + n.fatal.strip().splitlines()[-1]
            elif cause == "exception":
                tail = [l for l in lines if l.strip()]
                if tail:
                    detail = "Last line of its output: " + tail[-1].strip()
            death = WorkerDeath(
                worker=n.name, pid=n.pid, cause=cause, exitcode=exitcode,
                signal=signal_name(-exitcode) if exitcode is not None and exitcode < 0 else None,
                tasks=keys, memory=n.memory, peak_memory=n.peak_memory, memory_limit=self.memory_limit,
                stack=stack, log_tail=tuple(lines[-50:]), time=time.time(),
                message=death_message(n.name, n.pid, cause, exitcode, keys, n.memory, n.peak_memory,
                                      self.memory_limit, stack, detail),
                blamed=blamed, detail=detail)
            self.deaths.append(death)
            actions = self.scheduler.worker_died(death, running, crashed_seq, n.timed_out)
            post = self._apply(actions)
        self._post(post)
        return death

    def _maybe_respawn(self, n: Nanny, death: WorkerDeath) -> None:
        if self._status in ("closing", "closed") or death.cause == "requested":
            return
        # killed for memory while running nothing: respawning cannot help, so it counts
        # as a failed start and the loop ends in WorkerStartupError, never forever
        if not n.ready or (death.cause == "memory-limit" and not death.tasks):
            self._startup_failures.append(death)
            if len(self._startup_failures) >= STARTUP_RETRIES:
                self._broken = WorkerStartupError(tuple(self._startup_failures))
                with self._changed:
                    post = self._apply(self.scheduler.clear(self._broken))
                    self._changed.notify_all()
                self._post(post)
                return
            delay = 0.1 * 2 ** (len(self._startup_failures) - 1)
            self._respawn_at.append(time.monotonic() + delay)
            return
        self._spawn()

    def _force_reap(self, n: Nanny) -> None:
        if n.exitcode is None and n.proc is not None:
            n.kill(None)
            try:
                n.reap()
            except Exception:  # pragma: no cover
                pass
        n.close()
        self._nannies.pop(n.name, None)
