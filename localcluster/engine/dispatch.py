"""The dispatcher: scheduler events in, the scheduler's instructions carried out.

Data flow::

    user threads (submit, scatter, fetch ...) ─┐
    worker messages (scheduler thread) ────────┼─► drive(): Scheduler.handle under the lock ─► instructions
    released keys (any thread, lock-free) ─────┘         │
        Send    -> queued on the worker's Outlet under the lock, in order; the Flush that
                   sends them is carried out by the same thread right after it lets go of
                   the lock (or the messages stay corked behind a backlog, for the
                   scheduler thread's next tick; or, the socket full, the loop is asked to
                   wait until it is writable)
        Retire  -> queued for the supervisor, which takes it on the scheduler thread
        Resolve, FailAll -> the listeners (the clients' futures), outside the lock (a Resolve
                           "retrying" under it: futures pending again before the run can end)
        Deliver, Reply -> the waiting request

``drive`` is the one place the scheduler is driven (``Scheduler.handle``) and the cluster's
lock taken for it; ``event``, ``request``, ``submit``, ``on_worker_messages``,
``free_released``, ``uncork`` and the supervisor's decisions all go through it.

Threads: ``drive`` runs on whichever thread brings the event, so a submit costs no
thread hop; ``on_worker_messages``, ``free_released``, ``uncork`` and ``take_retired``
run on the scheduler thread.

A loop of submits (each within ``BURST`` seconds of the one before, with no wait between)
is deferred: ``submit`` queues its ``Submit`` events lock-free, and whoever next passes
``drive`` (the next event, a wait or read of the state, the scheduler thread, woken by the
first of them, or the submit that makes ``BATCH``) hands them to ``Scheduler.handle``
first, in order, ahead of its own events. One placement and one send a batch instead of one each: ~15%
less of the parent's time a task (benchmarks/README.md). A submit followed by ``result()``
is never deferred.

Owns (under the cluster's lock): the outlets (one per worker channel, connected and
disconnected by the supervisor), the listeners to resolve, the request futures of fetch
and replicate, the workers retired and not yet taken, and the keys released by
garbage-collected futures. It calls nothing above it: what the supervisor must do, it
takes from here (``take_retired``). An exception out of the scheduler is a bug in
localcluster: it breaks the cluster at once (``Lifecycle`` to BROKEN, ``ClusterBroken``
to every pending future), never a hang.
"""
from __future__ import annotations

import contextlib
import errno
import logging
import math
import pickle
import threading
import time
import traceback
import weakref
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Protocol, Sequence

from ..wire import protocol as P
from ..wire import vmcopy
from ..wire.recycle import Recycler
from ..scheduler import events as E, state as S
from ..scheduler.records import Reply
from ..wire.channel import Channel, let_go
from ..death import ClusterBroken
from .history import History
from .lifecycle import Lifecycle, Phase
from .loop import EventLoop
from ..wire.serialize import as_exception, dumps_exception

logger = logging.getLogger("localcluster")

_RELEASE_CHUNK = 5000      # keys let go under the lock at once: a short hold of the lock
_RELEASE_TURN = 0.05       # seconds of releasing per wake-up, then the loop's other work
BURST = 0.0002             # seconds: a submit this soon after the last, with no wait between, is deferred
BATCH = 64                 # submits deferred at most: the submitting thread admits them then
RECYCLE_BUDGET = 1 << 30   # bytes of result memory kept warm for the next copy out of a worker


class Listener(Protocol):
    """Hears how tasks end (a Client's futures)."""

    def resolve(self, key: str, status: str, value: Any) -> None: ...

    def fail_pending(self, exc: BaseException) -> None: ...


@dataclass(eq=False)
class Outlet:
    """The way out to one worker: its channel, and what is held back for it."""
    worker: str
    chan: Channel
    cork: list = field(default_factory=list)    #: messages held back while it has a backlog; under the lock
    #: its process, when this one may copy out of it (vmcopy.py): fetched values come as Located
    pid: Optional[int] = None


@dataclass(frozen=True, slots=True)
class Flush:
    """Send what is queued on ``outlet``'s channel: an instruction made under the lock and
    carried out after it (``post``), so no syscall is made while holding it."""
    outlet: Outlet


_COPIES = (P.Located, P.Landing)     # what the parent copies out of or into a worker itself
_LANDS = (P.Located, P.Landing, P.Data)     # what brings a worker's data here, to copy or to check


def copy_in(outlet: Outlet, m: P.Landing) -> P.Landed:
    """Copy the buffers the worker asks for (stashed by its channel as it framed them) into
    the fresh memory it names; the Landed that lets it use them."""
    tokens = tuple(token for token, _addr in m.where)
    try:
        for token, addr in m.where:
            view = outlet.chan.take(token)
            if view is None:
                return P.Landed(tokens, False)
            vmcopy.write_to(outlet.pid, view, addr)
    except OSError:
        return P.Landed(tokens, False)
    finally:
        for token in tokens:            # whatever is left of them is no longer wanted
            outlet.chan.take(token)
    return P.Landed(tokens)


def copy_located(pid: int, worker: str, m: P.Located,
                 fresh: Callable[[int], Any] = vmcopy.fresh) -> Any:
    """The value a :class:`~localcluster.wire.protocol.Located` shows, copied out of process
    ``pid`` into memory here (``fresh(n)``: recycle.py's take), as the Data it stands for
    (or Data carrying the error). None when the process is gone (its memory with it): as if
    it had died before answering, its death sends the request to another holder, or has
    the value made again (rather than failing the dependents of a relay). A copy that
    is not what the holder sealed becomes a Damaged from that worker: the scheduler drops
    the holder's copy and gets the value again."""
    try:
        meta = m.meta if type(m.meta) is bytes else bytes(vmcopy.read_from(pid, *m.meta))
        buffers = tuple(pickle.PickleBuffer(vmcopy.read_from(pid, addr, n, fresh(n))) for addr, n in m.spans)
    except OSError as e:
        if e.errno == errno.ESRCH:
            return None
        error = RuntimeError(f"copying the data of {m.key!r} out of worker {worker!r} (pid {pid}) failed: "
                             f"{e.strerror or e}. The worker named that memory for the value and keeps it "
                             f"until the parent has read it: this is a bug; please report it to the "
                             f"localcluster maintainers with this message")
        return P.Data(m.request, m.key, None, dumps_exception(error))
    payload = P.Payload(meta, buffers, m.nbytes, m.seals)
    detail = P.broken_seal(payload) if m.seals else None
    if detail is not None:
        return P.Damaged(m.key, 0, m.request, f"copied out of worker {worker!r} (pid {pid}): {detail}")
    return P.Data(m.request, m.key, payload, None)


def _tell_damaged(worker: str, m: P.Damaged, run: Optional[str]) -> None:
    what = (f"the data of {m.key!r}" if m.key else f"the arguments of task {run!r}") + \
        (f", read by task {run!r}," if m.key and run else "")
    logger.warning("localcluster: a transfer went wrong: %s, at worker %r, is not what was sent (%s). It "
                   "was not used: it is sent again, or computed again from its lineage. This is a failure of "
                   "localcluster's, not of your data or code; please report this message with "
                   "client.get_versions() to the localcluster maintainers", what, worker, m.detail)


def checked(worker: str, m: P.Data) -> Any:
    """``m`` itself when its data is what the holder sealed (or it has no out-of-band part),
    else a Damaged from that worker (the scheduler gets the value again)."""
    detail = P.broken_seal(m.data) if m.data is not None and m.data.seals else None
    if detail is None:
        return m
    return P.Damaged(m.key, 0, m.request, f"sent by worker {worker!r}: {detail}")


class Dispatcher:
    def __init__(self, lock: threading.Lock, changed: threading.Condition, scheduler: S.Scheduler,
                 loop: EventLoop, history: History, life: Lifecycle):
        self._lock = lock
        self._history = history
        self._changed = changed
        self._scheduler = scheduler
        self._loop = loop
        self._life = life
        self._outlets: dict[str, Outlet] = {}      #: worker -> Outlet, for every connected worker; under the lock
        # Weak references to the Clients: a tuple replaced whole on attach (under the lock), read
        # without it. Not a WeakSet: iterating one is dear on every round trip. Dead ones are
        # skipped, and dropped on the next attach.
        self._listeners: tuple = ()
        self._requests: dict[int, Future] = {}     #: fetch / replicate answers, by request id; under the lock
        self._retired: deque = deque()             #: workers the scheduler let go of, for the supervisor
        self._released: deque = deque()            #: keys whose last Future is gone; any thread appends, lock-free
        #: the memory results are copied out of workers into, kept warm for the next (any thread)
        self._recycler = Recycler(RECYCLE_BUDGET)
        #: submits deferred (``submit``): (specs, again), in order; any thread appends lock-free,
        #: only a holder of the lock takes them (``_admit``)
        self._deferred: deque = deque()
        #: the scheduler thread is woken for what is deferred; cleared by ``_admit`` before it
        #: takes any, so that a submit that sees it set is taken by that admit
        self._wake_due = False
        #: when the last submit came (monotonic), or -inf after a wait: a burst is under way while
        #: recent (not 0: a clock that started less than BURST ago, as a test's BURST of an hour
        #: on a machine booted minutes ago, would make the first submit a burst)
        self._last_submit = -math.inf

    # --- the supervisor's side (scheduler thread) ---------------------------------------------

    def connect(self, worker: str, chan: Channel, pid: Optional[int] = None) -> None:
        """Caller holds the lock: ``worker``'s messages go to ``chan`` from now on. ``pid``:
        its process, given when this one may copy out of it (``vmcopy.available``)."""
        self._outlets[worker] = Outlet(worker, chan, pid=pid)
        if pid is not None:
            chan.copies_into(pid)

    def disconnect(self, worker: str) -> None:
        """Caller holds the lock: ``worker`` is gone; what was held back for it goes nowhere."""
        self._outlets.pop(worker, None)

    def take_retired(self) -> list[str]:
        """The workers the scheduler let go of since the last call (oldest first)."""
        out = []
        while self._retired:
            out.append(self._retired.popleft())
        return out

    # --- events -------------------------------------------------------------------------

    def attach(self, listener: Listener) -> None:
        with self._lock:
            self._listeners = tuple(r for r in self._listeners if r() is not None) + (weakref.ref(listener),)

    def _live_listeners(self) -> list:
        return [listener for ref in self._listeners if (listener := ref()) is not None]

    def release(self, key: str) -> None:
        """No lock and no wake-up (it runs inside the garbage collector): the scheduler
        thread frees released keys on its next tick or wake-up."""
        self._released.append(key)

    def drive(self, events: Sequence = (), before: Optional[Callable[[], Any]] = None,
              make: Optional[Callable[[], tuple[Any, Sequence]]] = None, also: Sequence = (),
              answer: Any = None, reporter: Optional[str] = None,
              heard: Optional[Callable[[list], Any]] = None) -> Any:
        """The one place the scheduler is driven, and its lock taken for it. Under the
        cluster's lock: ``before()`` first, its value returned (what must happen in the same
        hold of the lock: futures made before any answer can arrive); or ``make()``, which
        returns (that value, the events), when the events depend on it (the policy's
        verdict, a future unpickled), once the deferred submits have gone through the door;
        else the deferred submits go through it first and ``events`` after them
        (``Scheduler.handle``); ``also`` (sends of the dispatcher's own) after those.
        ``answer``: the Future (or _Slot) of the request an event opens; then the request's
        id is returned instead. On the scheduler thread, what was corked goes too;
        elsewhere, what was corked for ``reporter`` (the worker whose frame this thread
        read). ``heard(instructions)``: a look at what the scheduler asked, under the same
        lock (to record what they say). What the scheduler asked is carried out after the
        lock (``post``)."""
        with self._lock:
            value = before() if before is not None else None
            deferred = self._take_deferred() if self._deferred else ()
            admitted: list = []
            if make is not None:
                if deferred:        # what make() reads of the scheduler includes the submits made before it
                    admitted, deferred = self._scheduler.handle(*deferred), ()
                value, events = make()
            actions = self._scheduler.handle(*deferred, *events) if deferred or events else []
            if admitted:
                actions = admitted + actions
            if heard is not None:
                heard(actions)
            if answer is not None:
                value = next(a.request for a in actions if type(a) is E.Opened)
                self._requests[value] = answer
            post = self.apply(actions + list(also) if also else actions)
            if self._loop.on_loop():
                post += self._uncorked()
            elif reporter is not None and (outlet := self._outlets.get(reporter)) is not None and outlet.cork:
                post += self._queue(outlet, [])
        self.post(post)
        return value

    def event(self, event: Any, before: Optional[Callable[[], Any]] = None, answer: Any = None) -> Any:
        """Drive one scheduler event (events.py) from any thread and carry out its instructions.
        ``before()`` runs first under the same lock (futures must exist before any answer can
        arrive); its return value is returned (``answer``: as :meth:`drive`)."""
        if self._life.error is not None:
            raise self._life.error
        try:
            return self.drive((event,), before, answer=answer)
        except Exception:
            raise self.break_("scheduler", traceback.format_exc()) from None

    # --- submits, deferred in a burst ---------------------------------------------------------

    def submit(self, specs: list, again: Optional[dict], track: Callable[[], Any]) -> Any:
        """Hand tasks (Specs) to the scheduler; ``track()`` makes their futures first (its
        return value is returned). In a burst of submits, deferred (module docstring)."""
        now = time.monotonic()
        burst = now - self._last_submit < BURST
        self._last_submit = now
        if not burst or self._life.error is not None or self._loop.on_loop():
            return self.event(E.Submit(specs, again), before=track)
        ret = track()
        self._deferred.append(E.Submit(specs, again or None))
        if len(self._deferred) >= BATCH:   # admitted here: what a batch holds meanwhile stays small
            self.admit()
        elif not self._wake_due:
            self._wake_due = True
            self._loop.wake()
        return ret

    def _take_deferred(self) -> list:
        """Caller holds the lock: the deferred submits, in the order made, taken."""
        self._wake_due = False      # before taking: a submit appended after this wakes again
        taken = []
        while self._deferred:
            taken.append(self._deferred.popleft())
        return taken

    def admit(self) -> None:
        """Any thread, not holding the lock: what was deferred goes to the scheduler now
        (a broken cluster failed it already)."""
        if self._deferred and self._life.error is None:
            try:
                self.drive()
            except Exception:
                raise self.break_("scheduler", traceback.format_exc()) from None

    def end_burst(self) -> None:
        """:meth:`admit`, and the burst ends: the caller is about to wait for a future (its
        next submit goes at once, as the round trip of ``submit(f).result()`` wants)."""
        self._last_submit = -math.inf
        self.admit()

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """The cluster's lock, for reading the scheduler's state through its queries, with
        every submit this thread made before handed to it first."""
        self.admit()
        with self._lock:
            yield

    def request(self, event: Any) -> Future:
        """Drive ``event``, one that opens a request (events.py); the answer arrives as a
        Deliver or a Reply that resolves the returned Future."""
        return self.open(event)[1]

    def open(self, event: Any) -> tuple[int, Future]:
        """:meth:`request`, with the id of the request opened (to withdraw it)."""
        fut: Future = Future()
        return self.event(event, answer=fut), fut

    def on_worker_messages(self, worker: str, msgs: list) -> None:
        """Task messages of one worker as one batch (placement runs once); what was corked
        for it goes with the answers. The scheduler thread, or a user thread that reads the
        worker's channel while it waits for a future (Supervisor.read_for)."""
        outlet = self._outlets.get(worker)
        if not msgs and (outlet is None or not outlet.cork):
            return
        unpin: list = []
        if outlet is not None and any(type(m) in _LANDS for m in msgs):
            # a Data the worker sent is checked here; one copy_located makes is checked there
            msgs = [checked(worker, m) if type(m) is P.Data else m for m in msgs]
            if outlet.pid is not None and any(type(m) in _COPIES for m in msgs):
                # Copied here, outside the lock, by the thread that read the frame: it holds the
                # nanny's ``reading``, and the worker is reaped only after that (supervisor.py), so
                # its pid cannot belong to another process yet.
                unpin = [S.Send(worker, P.Unpin(m.request)) for m in msgs if type(m) is P.Located]
                unpin += [S.Send(worker, copy_in(outlet, m)) for m in msgs if type(m) is P.Landing]
                fresh = self._recycler.take
                msgs = [copy_located(outlet.pid, worker, m, fresh) if type(m) is P.Located else m for m in msgs
                        if type(m) is not P.Landing]
                msgs = [m for m in msgs if m is not None]
        key_of, record, ending = self._scheduler.key_of, self._history.task, self._scheduler.run_ending
        damaged: list = []

        def into_the_stream() -> None:
            for m in msgs:       # into the task stream first: the scheduler forgets the run's key
                t = type(m)
                if t is P.Damaged:
                    damaged.append((m, key_of(m.seq) if m.seq else None))
                elif t is P.Finished or t is P.Failed:
                    key = key_of(m.seq)
                    if key is not None:
                        finished = t is P.Finished
                        submitter, counts = ending(key, finished)
                        record(key, worker, m.thread, m.start, m.start + m.duration,
                               "finished" if finished else "error", m.serde if finished else 0.0, submitter, counts)
        self.drive((E.Reported(worker, msgs),) if msgs else (), into_the_stream, also=unpin, reporter=worker)
        for m, run in damaged:
            _tell_damaged(worker, m, run)

    def on_task_requests(self, worker: str, asks: list) -> None:
        """Requests from tasks on ``worker`` (Ask: get_client, secede ...), in the order sent,
        before the frame's other task messages (a task submits before it finishes). The
        scheduler answers what it can at once (as Sends); ``Results`` waits on one fetch a
        key, and the answer goes to the task once all are in. Scheduler thread."""
        self.drive((E.Asked(worker, asks),))
        for ask in asks:
            if type(ask.body) is P.Results:
                self._answer_results(worker, ask.request, ask.body.keys)

    def _answer_results(self, worker: str, request: int, keys: tuple) -> None:
        gathering = _Gathering(len(keys), lambda outcomes: self.drive(
            also=[S.Send(worker, P.Answer(request, outcomes))]))
        for i, key in enumerate(keys):
            self.event(E.Fetch(key), answer=_Slot(gathering, i))

    def free_released(self) -> bool:
        """In chunks, so that neither a submit waiting for the lock nor close() waits behind
        200,000 keys let go at once (a big map's futures dropped together); and for at most
        ``_RELEASE_TURN`` seconds a call, so that the scheduler thread goes back to its
        workers' messages between turns (a million keys let go at once would hold it long
        enough for the watchdog to take it for a stuck thread). True: keys are left for the
        next turn, and the caller should wake the loop for it."""
        released = self._released
        end = time.monotonic() + _RELEASE_TURN
        while released and self._life.open:
            keys: list = []
            while released and len(keys) < _RELEASE_CHUNK:
                keys.append(released.popleft())
            # submits deferred before these keys were let go come first (drive)
            self.drive((E.Drop(keys),))
            if released and time.monotonic() >= end:
                return self._life.open
        return False

    def stop_releasing(self) -> None:
        """The cluster is closing: what is still to release goes with everything else."""
        self._released.clear()

    # --- actions ------------------------------------------------------------------------

    def apply(self, actions: list) -> list:
        """Caller holds the lock: queue Sends on the outlets and Retires for the supervisor;
        return the instructions for after the lock (Flush first, then Resolve, FailAll and
        Deliver), to hand to :meth:`post`."""
        if not actions:
            return actions
        post: list = []
        sends: dict[str, list] = {}
        for a in actions:
            t = type(a)
            if t is S.Send:
                sends.setdefault(a.worker, []).append(a.msg)
            elif t is S.Resolve and a.status == "retrying":
                # at once, under the lock: the futures are pending again before the new run
                # can end (its end is posted by whichever thread hears of it, maybe first)
                for listener in self._live_listeners():
                    listener.resolve(a.key, a.status, a.value)
            elif t is S.Resolve or t is S.Deliver or t is S.FailAll or t is Reply:
                post.append(a)
            elif t is S.Retire:
                self._retired.append(a.worker)
                if not self._loop.on_loop():      # the supervisor takes it on the scheduler thread
                    self._loop.wake()
        if not sends:
            return post
        on_loop = self._loop.on_loop()
        flushes: list = []
        for worker, msgs in sends.items():
            outlet = self._outlets.get(worker)
            if outlet is None:
                continue
            if outlet.pid is None and any(type(m) is P.Export and m.locate for m in msgs):
                msgs = [P.Export(m.key, m.request) if type(m) is P.Export else m for m in msgs]   # not ours to read
            if (not on_loop and self._scheduler.backlogged(worker)
                    and not any(type(m) is P.Landed for m in msgs)):
                # The worker has a backlog: it will not miss these for a while. Leave them
                # for the scheduler thread to send in one frame when the worker next reports
                # (or on the next tick), instead of one syscall per submit. Not a Landed: the
                # worker holds back everything it reads behind the value that waits for it.
                outlet.cork.extend(msgs)
                continue
            flushes += self._queue(outlet, msgs)
        return flushes + post       # sent first: the worker gets its work before futures resolve

    def post(self, post: list) -> None:
        """Carry out, outside the lock, what :meth:`apply` returned: send what was queued,
        resolve futures, answer requests (a listener's callbacks may call back in)."""
        if not post:
            return
        listeners = None
        for a in post:
            t = type(a)
            if t is Flush:
                if not a.outlet.chan.flush():
                    self._watch(a.outlet)
                continue
            if listeners is None:
                listeners = self._live_listeners()      # once per batch
            if t is S.Resolve:
                for listener in listeners:
                    listener.resolve(a.key, a.status, a.value)
            elif t is S.FailAll:
                for listener in listeners:
                    listener.fail_pending(a.error)
            elif t is Reply:        # a Lock, Event, Queue ... of the parent's threads
                fut = self._requests.pop(a.request, None)
                if fut is not None and not fut.done():
                    fut.set_result(a.value)
            else:
                fut = self._requests.pop(a.request, None)
                if type(fut) is _Slot:      # a task's Results: the raw outcome, for its worker
                    fut.fill(a)
                elif fut is not None and not fut.done():
                    if a.error is not None:
                        fut.set_exception(as_exception(a.error, a.key))
                    else:
                        if a.data is not None:      # going to user code, which may write into it
                            let_go(a.data.buffers)
                        fut.set_result(a.data)

    def _queue(self, outlet: Outlet, msgs: list) -> list:
        """Caller holds the lock: queue ``msgs`` (after what the outlet has corked) on its
        channel, in order. Returns ``[Flush]`` when the caller is to send them once it has
        let go of the lock: the syscall (and the worker's wake-up) is not made under the lock,
        which the other thread, submitting or handling results, may be waiting for."""
        frames = []
        if outlet.cork or len(msgs) > 1:
            # A Landed goes ahead, in a frame of its own: in one frame with a message whose
            # buffers land too (a Run, a Put), the worker would hold the whole frame, the
            # Landed with it, behind the very message that Landed lets go (worker/transfers.py).
            landed = [m for m in msgs if type(m) is P.Landed]
            if landed:
                msgs = [m for m in msgs if type(m) is not P.Landed]
                frames.append(landed[0] if len(landed) == 1 else P.Batch(tuple(landed)))
        if outlet.cork:   # order matters: corked messages go first
            msgs, outlet.cork = outlet.cork + msgs, []
        if msgs:
            frames.append(msgs[0] if len(msgs) == 1 else P.Batch(tuple(msgs)))
        if not frames:
            return []
        first = outlet.chan.queue(frames[0])
        if len(frames) > 1:
            outlet.chan.queue(frames[1])
        if first:       # the first in line: the Flush sends what follows it too
            return [Flush(outlet)]
        self._watch(outlet)
        return []

    def _watch(self, outlet: Outlet) -> None:
        """What is queued goes when the socket is writable, sent by the scheduler thread
        (the channel's reader, the supervisor, flushes on a write event)."""
        chan = outlet.chan
        self._loop.run_soon(lambda: chan.closed or self._loop.want_write(chan, chan.wants_write()))

    def reusable(self) -> int:
        """Any thread: bytes of result memory this process keeps warm, used by no value."""
        return self._recycler.cached()

    def trim(self, everything: bool = False) -> None:
        """Scheduler thread: let go of result memory unused for a second (all of it, as the
        cluster closes)."""
        self._recycler.trim(everything)

    def uncork(self) -> None:
        """Scheduler thread, every tick: send what was held back behind a backlog (and admit
        what was deferred)."""
        self.drive()

    def _uncorked(self) -> list:
        """Caller holds the lock: what every outlet held back, queued; the Flushes."""
        flush: list = []
        for outlet in self._outlets.values():
            if outlet.cork:
                flush += self._queue(outlet, [])
        return flush

    # --- failing everyone ---------------------------------------------------------------

    def break_(self, where: str, tb_text: str) -> BaseException:
        """An internal failure: every pending future and every later call fails with
        ClusterBroken; the scheduler thread stops the workers and exits. Returns what the
        caller is to raise (the first break's error, when the cluster was already broken)."""
        err = ClusterBroken(where, tb_text)
        if not self._life.to(Phase.BROKEN, err):
            return self._life.error or err
        logger.error("localcluster's %s failed; the cluster is broken:\n%s", where, tb_text)
        self._deferred.clear()      # their futures fail below, with the rest
        # The scheduler's state is suspect: fail the futures directly, not through it. No
        # lock: from the watchdog, the stuck scheduler thread may hold it.
        for listener in self._live_listeners():
            listener.fail_pending(err)
        self.fail_requests(err)
        if self._changed.acquire(timeout=1.0):
            try:
                self._changed.notify_all()
            finally:
                self._changed.release()
        self._loop.wake()
        return err

    def fail_requests(self, exc: BaseException) -> None:
        requests = list(self._requests.values())
        self._requests.clear()
        for fut in requests:
            if type(fut) is not _Slot and not fut.done():
                fut.set_exception(exc)


class _Gathering:
    """The outcomes of one task's ``Results``, one slot a key; ``answer`` is called with
    them all once the last arrives (on the thread that delivers it, outside the lock)."""

    def __init__(self, n: int, answer: Callable[[tuple], Any]):
        self.outcomes: list = [None] * n
        self.left = n
        self.answer = answer
        self.lock = threading.Lock()

    def fill(self, i: int, outcome: tuple) -> None:
        with self.lock:
            self.outcomes[i] = outcome
            self.left -= 1
            last = not self.left
        if last:
            try:
                self.answer(tuple(self.outcomes))
            except Exception:  # noqa: BLE001 - the cluster broke or closed: the worker goes with it
                logger.debug("could not answer a task's results", exc_info=True)


@dataclass(frozen=True)
class _Slot:
    """One key of a :class:`_Gathering`, filled by the Deliver of its fetch."""
    gathering: _Gathering
    index: int

    def fill(self, a: S.Deliver) -> None:
        if a.error is None:
            outcome: tuple = ("finished", a.data, None)
        else:
            error = a.error if isinstance(a.error, bytes) else dumps_exception(a.error)
            outcome = ("error", None, error)
        self.gathering.fill(self.index, outcome)
