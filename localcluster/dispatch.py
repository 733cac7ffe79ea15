"""The dispatcher: scheduler events in, the scheduler's actions carried out.

Data flow::

    user threads (submit, scatter, fetch ...) ─┐
    worker messages (scheduler thread) ────────┼─► event(): Scheduler under the lock ─► actions
    released keys (any thread, lock-free) ─────┘         │
        Send    -> queued on the worker's channel under the lock, in order, and sent by
                   the same thread right after it lets go of the lock (or corked behind a
                   backlog, or left for the scheduler thread when the socket is full)
        Retire  -> the supervisor stops that worker
        Resolve, FailAll -> the clients' futures, outside the lock
        Deliver -> the waiting request

Threads: ``event`` runs on whichever thread brings the event, so a submit costs no
thread hop; ``on_worker_messages``, ``free_released``, ``uncork`` and the channel
write-interest run on the scheduler thread.

Owns (under the cluster's lock): the clients to resolve, the request futures of fetch
and replicate, the keys released by garbage-collected futures, and ``broken``: once
set, every event and every later call raises it. The workers themselves belong to the
supervisor, bound after both are made (each needs the other): ``nanny(name)``,
``retire(name)`` and ``watch_channel(nanny)``. An exception out of the scheduler
is a bug in localcluster: it breaks the cluster at once with ``ClusterBroken``
(every pending future fails), never a hang.
"""
from __future__ import annotations

import logging
import threading
import traceback
import weakref
from collections import deque
from concurrent.futures import Future
from typing import Any, Callable, Optional

from . import protocol as P
from . import scheduler as S
from .channel import let_go
from .death import ClusterBroken
from .history import History
from .loop import EventLoop
from .nanny import Nanny
from .serialize import as_exception

logger = logging.getLogger("localcluster")

_RELEASE_CHUNK = 5000      # keys let go under the lock at once (~20 µs each)


class Dispatcher:
    def __init__(self, lock: threading.Lock, changed: threading.Condition, scheduler: S.Scheduler,
                 loop: EventLoop, history: History):
        self._lock = lock
        self._history = history
        self._changed = changed
        self._scheduler = scheduler
        self._loop = loop
        self._workers: Any = None            # the supervisor (see bind)
        self._clients: "weakref.WeakSet" = weakref.WeakSet()
        self.requests: dict[int, Future] = {}      # fetch / replicate answers, by request id
        self._released: deque = deque()      # keys whose last Future is gone; any thread appends
        self._closing = False                # set by the closing thread: released keys no longer matter
        self.broken: Optional[Exception] = None

    def bind(self, workers: Any) -> None:
        self._workers = workers

    # --- events -------------------------------------------------------------------------

    def attach(self, client: Any) -> None:
        self._clients.add(client)

    def release(self, key: str) -> None:
        """No lock and no wake-up (it runs inside the garbage collector): the scheduler
        thread frees released keys on its next tick or wake-up."""
        self._released.append(key)

    def event(self, fn: Callable, *args: Any, before: Optional[Callable[[], Any]] = None) -> Any:
        """Run a scheduler event from any thread and carry out its actions. ``before()`` runs
        first under the same lock (futures must exist before any answer can arrive); its
        return value is returned."""
        if self.broken is not None:
            raise self.broken
        try:
            with self._lock:
                ret = before() if before is not None else None
                post = self.apply(fn(*args))
            self.post(post)
        except Exception:
            self.break_("scheduler", traceback.format_exc())
            raise self.broken from None
        return ret

    def request(self, ask: Callable[[], tuple]) -> Future:
        """``ask()`` (run as an event) returns (request id, actions); the answer arrives as a
        Deliver that resolves the returned Future."""
        fut: Future = Future()

        def run() -> list:
            req, actions = ask()
            self.requests[req] = fut
            return actions
        self.event(run)
        return fut

    def on_worker_messages(self, worker: str, msgs: list) -> list:
        """Task messages of one worker as one batch (placement runs once). Caller holds the lock."""
        key_of, record = self._scheduler.key_of, self._history.task
        for m in msgs:       # into the task stream first: the scheduler forgets the run's key
            t = type(m)
            if t is P.Finished or t is P.Failed:
                key = key_of(m.seq)
                if key is not None:
                    record(key, worker, m.thread, m.start, m.start + m.duration,
                           "finished" if t is P.Finished else "error")
        return self._scheduler.handle_messages(worker, msgs)

    def free_released(self) -> None:
        """In chunks, so that neither a submit waiting for the lock nor close() waits behind
        200,000 keys let go at once (a big map's futures dropped together)."""
        released = self._released
        while released and not self._closing:
            keys = []
            while released and len(keys) < _RELEASE_CHUNK:
                keys.append(released.popleft())
            with self._lock:
                post = self.apply(self._scheduler.release_many(keys))
            self.post(post)

    def stop_releasing(self) -> None:
        """The cluster is closing: what is still to release goes with everything else."""
        self._closing = True
        self._released.clear()

    # --- actions ------------------------------------------------------------------------

    def apply(self, actions: list) -> list:
        """Carry out Send/Retire (the caller holds the lock); return Resolve/Deliver for after it."""
        if not actions:
            return actions
        post: list = []
        sends: dict[str, list] = {}
        for a in actions:
            t = type(a)
            if t is S.Send:
                sends.setdefault(a.worker, []).append(a.msg)
            elif t is S.Resolve or t is S.Deliver or t is S.FailAll:
                post.append(a)
            elif t is S.Retire:
                self._workers.retire(a.worker)
        on_loop = self._loop.on_loop()
        flushes: list = []
        for worker, msgs in sends.items():
            n = self._workers.nanny(worker)
            if n is None or n.chan is None:
                continue
            ws = self._scheduler.workers.get(worker)
            if not on_loop and ws is not None and len(ws.processing) > 2 * ws.nthreads:
                # The worker has a backlog: it will not miss these for a while. Leave them
                # for the scheduler thread to send in one frame when the worker next reports
                # (or on the next tick), instead of one syscall per submit.
                n.cork.extend(msgs)
                continue
            flushes += self.send(n, msgs)
        return flushes + post       # sent first: the worker gets its work before futures resolve

    def post(self, post: list) -> None:
        """Send what was queued under the lock, resolve futures and answer requests; outside the
        lock (callbacks may call back in)."""
        if not post:
            return
        clients = list(self._clients)    # once per batch: iterating a WeakSet is not cheap
        for a in post:
            t = type(a)
            if t is Nanny:        # messages queued under the lock (see send)
                self._flush(a)
            elif t is S.Resolve:
                for client in clients:
                    client.resolve(a.key, a.status, a.value)
            elif t is S.FailAll:
                for client in clients:
                    client.fail_pending(a.error)
            else:
                fut = self.requests.pop(a.request, None)
                if fut is not None and not fut.done():
                    if a.error is not None:
                        fut.set_exception(as_exception(a.error, a.key))
                    else:
                        if a.data is not None:      # going to user code, which may write into it
                            let_go(a.data.buffers)
                        fut.set_result(a.data)

    def send(self, n: Nanny, msgs: list) -> list:
        """Caller holds the lock: queue ``msgs`` (after what ``n`` has corked) on its channel, in
        order. Returns ``[n]`` when the caller is to send them, with :meth:`post`, once it has
        let go of the lock: the syscall (and the worker's wake-up) is not made under the lock,
        which the other thread, submitting or handling results, may be waiting for."""
        if n.cork:   # order matters: corked messages go first
            msgs, n.cork = n.cork + msgs, []
        if n.chan.queue(msgs[0] if len(msgs) == 1 else P.Batch(tuple(msgs))):
            return [n]
        self._watch(n)
        return []

    def _flush(self, n: Nanny) -> None:
        if not n.chan.flush():
            self._watch(n)

    def _watch(self, n: Nanny) -> None:
        """What is queued goes when the socket is writable, sent by the scheduler thread."""
        self._loop.run_soon(lambda: self._workers.watch_channel(n))

    def uncork(self, nannies: list) -> None:
        nannies = [n for n in nannies if n.cork]
        if not nannies:
            return
        flush: list = []
        with self._lock:
            for n in nannies:
                if n.cork and n.chan is not None:
                    flush += self.send(n, [])
        self.post(flush)

    # --- failing everyone ---------------------------------------------------------------

    def refuse(self, exc: Exception) -> None:
        """Every later call raises ``exc`` (start-up failures, a limit too small)."""
        self.broken = exc

    def break_(self, where: str, tb_text: str) -> None:
        """An internal failure: every pending future and every later call fails with
        ClusterBroken; the scheduler thread stops the workers and exits."""
        if isinstance(self.broken, ClusterBroken):
            return
        logger.error("localcluster's %s failed; the cluster is broken:\n%s", where, tb_text)
        self.broken = err = ClusterBroken(where, tb_text)
        # The scheduler's state is suspect: fail the futures directly, not through it.
        for client in list(self._clients):
            client.fail_pending(err)
        self.fail_requests(err)
        # From the watchdog, the stuck scheduler thread may hold the lock: never wait long.
        if self._changed.acquire(timeout=1.0):
            try:
                self._changed.notify_all()
            finally:
                self._changed.release()
        self._loop.wake()

    def fail_requests(self, exc: BaseException) -> None:
        for fut in list(self.requests.values()):
            if not fut.done():
                fut.set_exception(exc)
        self.requests.clear()
