"""What runs inside a worker process.

Threads::

    reader role      one thread at a time reads the channel: Run -> run queue (or parked until
                     its deps arrive), Put/Free -> store, Export -> Data reply, Cancel, Steal
                     (queued runs given back), Stop;
                     EOF -> exit. An idle executor takes the role itself, so a Run that arrives
                     at an idle worker is executed by the thread that read it: no thread hop
                     (a GIL hand-off between threads costs more than a process round trip).
                     The main thread reads only while every executor is busy, called once
                     nobody has read for a moment (turn.py: a kernel timer, not a wake-up per
                     run), and is nudged off the socket (a self-pipe) as soon as one becomes idle.
    executor x N     take runs from the run queue, mark the status board, run, reply
    flusher          sends results that executors batched while more runs were queued
    heartbeat        stamps the board every second (a GIL held by C code stops it: that is
                     how the parent tells "unresponsive"), spills when RSS passes target, and
                     gives back landing memory unused for a second (recycle.py)
    stacks           answers ``dump_stacks``: writes every thread's stack to stderr, with the
                     GIL held (``answer_stacks``); the one thread that takes the parent-death
                     signal (boot.py), so that its dumps into the end note never overlap

The process starts in boot.py (``BOOT``, ``main``), which makes the ``Worker`` and serves.
"""
from __future__ import annotations

import faulthandler
import itertools
import os
import pickle
import select
import signal
import socket
import sys
import threading
import time
import traceback
from collections import deque
from typing import Any, Callable, Optional

from ..wire.basics import TransferError
from ..wire import protocol as P
from ..wire import remote, serialize
from ..wire.recycle import Recycler
from ..wire.board import Board
from ..system.cgroup import SharedAllowance
from ..wire.channel import BlockingChannel, Incoming, encode
from ..system.machine import open_statm, rss, rss_of
from ..system.spin import poll_for
from . import calls, context
from .context import before_reply, here
from .store import Store, StoreError
from .transfers import Transfers
from .turn import MainTurn

FLUSH_DELAY = 0.002
# A worker that answered polls for the next run this many times as long as the parent's
# thread waits for a reply: the next run comes only once the parent handled the reply, the
# user's code went on and submitted again (a window of spin_wait alone missed runs on a
# slow VM, and each miss cost a wake-up).
SPIN_AFTER_REPLY = 4
# A task waiting for other tasks' results gives its slot back if the answer is not there by
# then: results already done come back within a round trip, with no secession to pay for.
LEND_AFTER = 0.002
RECYCLE_BUDGET = 1 << 30     # bytes of warm landing memory kept, without a memory_limit (a quarter of it with one)
# The lines around a dump of every thread's stack that the parent asked for (dump_stacks),
# each naming the newest request it answers; the parent's reader knows them (output.py).
STACKS_HEAD = "Stacks of every thread, for request {}:"
STACKS_TAIL = "End of the stacks for request {}."

class Worker:
    def __init__(self, cfg: dict):
        self.name = cfg["name"]
        self.nthreads = cfg["nthreads"]
        self.board = Board(self.nthreads, fd=cfg["board_fd"])
        # the memfd of every large value it sends is charged to its memory cgroup, however
        # long the receiver keeps it: the group's limit makes room for those (cgroup.py)
        self.allowance = SharedAllowance(*cfg["cgroup"]) if cfg.get("cgroup") else None
        limit = cfg.get("memory_limit")
        # the memory the parent copies large arguments into, kept warm for the next ones
        self.recycler = Recycler(limit // 4 if limit else RECYCLE_BUDGET)
        charge = self.allowance.charge if self.allowance else None
        self.chan = BlockingChannel(socket.socket(fileno=cfg["sock_fd"]), charge, self.recycler.take, _parent_gone)
        target = cfg.get("memory_target")
        self.spill_at = int(limit * target) if limit and target else None
        pause = cfg.get("memory_pause")
        self.pause_at = int(limit * pause) if limit and pause else None
        # past this RSS, warm memory nobody uses goes back at once (the memory limit's first line)
        self.trim_at = min((x for x in (self.spill_at, self.pause_at) if x), default=limit // 2 if limit else None)
        self._next_look = 0.0           # monotonic time of the next look at RSS before a run
        self._statm = open_statm(os.getpid())   # kept open: a look is one pread, not an open, read and close
        self._pressed = False           # said Pressure, and RSS has not fallen below the line since
        self.store = Store(cfg.get("spill_dir"), self.spill_at, self.board.set_store)
        # Under _lock: the run queue, the reader role, the idle count. A wake-up goes to the one
        # thread that has something to do: a run queued wakes one idle executor (not every
        # thread: a herd of executors costs every round trip), and the main thread is
        # called only once nobody has read the channel for a while (turn.py).
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)     # idle executors wait here
        self.turn = MainTurn()                            # the main thread waits for its turn here
        self._runs: deque = deque()
        self._queues: dict[str, deque] = {}     # under _lock: a queue -> its Calls behind the running one
        self._reader: Any = None        # who holds the reader role: "main", an executor row, or None
        self._idle = 0                  # executors waiting for work (woken ones count until they run)
        (self._nudge_r, self._nudge_w), self._nudged = os.pipe(), False
        # An executor taking the reader role polls the channel for a while before it sleeps
        # (spin.py: only while the machine's CPUs are not contended)
        self.spin_wait = cfg.get("spin_wait", 0.0) * SPIN_AFTER_REPLY
        self._poller = select.poll()
        self._poller.register(self.chan.fileno(), select.POLLIN)
        self.parked: dict[int, tuple] = {}          # seq -> (run, missing deps)
        self.fns: dict[int, bytes] = {}             # fn id -> the function pickled, as sent once
        self.loaded: dict[int, Any] = {}    # unpickled at its first run; emptied by an upload (setup.py)
        self.cancelled: set = set()
        self.pending: set = set()    # seqs received and not yet answered
        self._out: list = []
        self._out_lock = threading.Lock()
        self._flush_wanted = threading.Event()
        self.heartbeat, self.stacks_fd = cfg.get("heartbeat", 1.0), cfg.get("stacks_fd")   # stacks_fd: answer_stacks
        # Tasks that submit tasks (client.py). Under _lock: the executors running a task in a
        # slot (``_busy``; a run that seceded is not), and the seceded runs waiting to rejoin.
        self._busy = 0
        self._rejoining = 0
        self._secessions = 0            # seceded runs not ended: executors then read with an ear for the nudge
        self._rejoin_turn = threading.Condition(self._lock)
        self._rows = itertools.count(self.nthreads + 1)     # names of executors started for seceded runs
        self._asks: dict[int, list] = {}         # request id -> [Event, Answer]; under _asks_lock
        self._asks_lock = threading.Lock()
        self._ask_ids = itertools.count(1)
        self._drops: deque = deque()             # keys of Futures gone in tasks: appended lock-free (GC)
        self.transfers = Transfers(self.chan.send)     # large values the parent copies in and out

    # --- main thread ------------------------------------------------------------------

    def serve(self, versions: dict, before_tasks: Callable[[], None]) -> None:
        """Say Ready (with ``versions``: boot.py's); while the parent answers, call
        ``before_tasks`` and start the threads (each start waits for the new thread to run,
        longer while the other workers start too); then read until the end. A
        message that comes meanwhile waits in the socket."""
        self.chan.send(P.Ready(os.getpid(), versions))
        before_tasks()
        if self.stacks_fd is not None:
            threading.Thread(target=answer_stacks, args=(self.stacks_fd,), name="localcluster-stacks",
                             daemon=True).start()
            if context.end_note >= 0:
                # The stacks thread alone takes the parent-death signal: it was started before
                # this block and keeps the mask it was born with (no Python code of its own
                # needs to run, which a task holding the GIL would delay for good); the
                # threads started from here on inherit the block.
                signal.pthread_sigmask(signal.SIG_BLOCK, {context.END_SIGNAL})
        for row in range(1, self.nthreads + 1):
            threading.Thread(target=self._execute, args=(row,), name=f"localcluster-exec-{row}", daemon=True).start()
        threading.Thread(target=self._flusher, name="localcluster-flush", daemon=True).start()
        threading.Thread(target=self._heartbeat, name="localcluster-heartbeat", daemon=True).start()
        while True:
            self._main_turn()
            try:
                while not self._idle:
                    ready, _, _ = select.select([self.chan, self._nudge_r], [], [])  # type: ignore[type-var]  # a fileno() or an fd
                    if self._nudge_r in ready:
                        os.read(self._nudge_r, 512)
                        with self._lock:
                            self._nudged = False
                    if self.chan in ready:
                        self._read_and_handle()
            finally:
                with self._lock:
                    self._reader = None
                    self._work.notify()     # the executor that became idle takes the role

    def _stop(self) -> None:
        """Exit cleanly, the worker plugins torn down first."""
        if context.closing:
            context.close()
        self._flush()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    def _main_turn(self) -> None:
        """Main thread: wait until nobody reads the channel, no executor is idle to, and the
        turn is due (turn.py), then take the reader role."""
        while True:
            with self._lock:
                self.turn.reset_timer()
                if self._reader is None and not self._idle and self.turn.due():
                    self._reader = "main"
                    self.turn.disarm()
                    return
            self.turn.wait()

    def _read_and_handle(self) -> None:
        try:
            msgs = self.chan.recv_all()
        except (EOFError, OSError):
            _parent_gone()
        for msg in msgs:
            self._handle(msg)

    def _handle(self, msg: Any) -> None:
        if isinstance(msg, P.Batch):    # one by one: the Landed a parked message waits for may be inside
            for m in msg.messages:
                self._handle(m)
        elif self.transfers.holds(msg):
            pass                        # in order, behind a message whose bytes have not landed
        elif isinstance(msg, P.Run):
            if msg.fn is not None:
                self.fns[msg.fn_id] = msg.fn
            self.pending.add(msg.seq)
            missing = {d for d in msg.deps if d not in self.store}
            if missing:
                self.parked[msg.seq] = (msg, missing)
            else:
                self._queue(msg)
        elif isinstance(msg, P.Put):
            self._put(msg)
        elif isinstance(msg, P.Export):
            t = time.perf_counter_ns()
            self._export(msg)
            self.board.moved(time.perf_counter_ns() - t)
        elif isinstance(msg, P.Unpin):
            self.transfers.unpin(msg.request)
        elif type(msg) is Incoming:
            self.transfers.park(msg, self.pending)
        elif isinstance(msg, P.Landed):
            inner = self.transfers.landed(msg)
            self._handle(inner if msg.ok else self._not_landed(inner))
            for held in self.transfers.released():
                self._handle(held)
        elif isinstance(msg, P.Free):
            self.store.free(msg.keys)
        elif isinstance(msg, P.Damaged):      # a message whose buffers never landed (_not_landed)
            self.pending.discard(msg.seq)
            self.chan.send(msg)
        elif isinstance(msg, P.Cancel):
            self._cancel(msg.seqs)
        elif isinstance(msg, P.Steal):
            taken = tuple(seq for seq in msg.seqs if self._unqueue(seq))
            self.pending.difference_update(taken)
            self.chan.send(P.Unqueued(msg.seqs, taken))
        elif isinstance(msg, P.Answer):
            with self._asks_lock:
                waiter = self._asks.pop(msg.request, None)
            if waiter is not None:
                waiter[1] = msg
                waiter[0].set()
        elif isinstance(msg, P.Call):
            # A thread of its own, not the reader's nor an executor's: a worker whose every
            # slot is busy still answers, and a long function never stops the channel's reader.
            if msg.queue and self._queued(msg):
                return
            threading.Thread(target=self._call, args=(msg,), name=f"localcluster-run-{msg.request}",
                             daemon=True).start()
        elif isinstance(msg, P.Stop):
            self._stop()
        else:
            raise TypeError(f"unexpected message {msg!r}")

    def _not_landed(self, inner: Any) -> Any:
        """What a message whose buffers the parent could not copy in stands for: its Runs and
        Puts become Damaged (the parent sends them again; a Run's function is kept, as it
        would have been), its other messages, which carry no such buffers, are as they were."""
        why = "the parent could not copy its buffers into this worker (process_vm_writev failed)"
        out = []
        for one in (inner.messages if isinstance(inner, P.Batch) else (inner,)):
            if isinstance(one, P.Run):
                if one.fn is not None:
                    self.fns[one.fn_id] = one.fn
                out.append(P.Damaged("", one.seq, 0, f"the task's arguments: {why}"))
            elif isinstance(one, P.Put):
                out.append(P.Damaged(one.key, 0, 0, why))
            else:
                out.append(one)
        return out[0] if len(out) == 1 else P.Batch(tuple(out))

    def _put(self, msg: P.Put) -> None:
        t = time.perf_counter_ns()
        if msg.data.seals:
            detail = P.broken_seal(msg.data)
            if detail is not None:      # never stored: the parent drops this copy and sends it again
                self.chan.send(P.Damaged(msg.key, 0, 0, f"{detail}; it came from {msg.origin or 'the parent'}"))
                return
        self.store.put_payload(msg.key, msg.data)
        self.board.moved(time.perf_counter_ns() - t)
        if msg.ack:
            self.chan.send(P.Stored(msg.ack))
        self._arrived(msg.key)

    def _cancel(self, seqs: tuple) -> None:
        """Not started: dropped (Skipped). Started or queued: its result will be ignored."""
        for seq in seqs:
            if self.parked.pop(seq, None) is not None:
                self.pending.discard(seq)
                self.chan.send(P.Skipped(seq))
            elif seq in self.pending:
                self.cancelled.add(seq)

    def _unqueue(self, seq: int) -> bool:
        """Take run ``seq`` out of the queue (or the parked runs) if no executor took it yet."""
        if self.parked.pop(seq, None) is not None:
            return True
        with self._lock:
            for i, run in enumerate(self._runs):
                if run.seq == seq:
                    del self._runs[i]
                    return True
        return False

    def _arrived(self, key: str) -> None:
        for seq, (run, missing) in list(self.parked.items()):
            missing.discard(key)
            if not missing:
                del self.parked[seq]
                self._queue(run)

    def _export(self, msg: P.Export) -> None:
        """Reply with the data of a key. A failure (reloading, pickling, framing) fails this
        request with an error naming the key and the step; the worker carries on."""
        step = "reading it from the store"
        try:
            if msg.key not in self.store:
                raise KeyError(f"worker {self.name!r} no longer holds {msg.key!r}")
            payload = self.store.payload(msg.key)
            step = "framing it for the channel"
            if self.transfers.pin(msg, payload):     # the parent copies it out (transfers.py)
                return
            frame = encode(P.Data(msg.request, msg.key, payload, None), self.chan.charge)
        except Exception as e:
            error = StoreError(f"sending the data of {msg.key!r} from worker {self.name!r} failed while "
                               f"{step}: {type(e).__name__}: {e}")
            frame = encode(P.Data(msg.request, msg.key, None, serialize.dumps_exception(error)))
        self.chan.send_frame(*frame)

    def _call(self, msg: P.Call) -> None:
        """``Client.run``'s function, on this thread (calls.py); answer Called; then the calls
        of its queue that came meanwhile, in order."""
        while msg is not None:
            self.chan.send(calls.answer(msg, self.name))
            msg = self._next_queued(msg.queue) if msg.queue else None

    def _queued(self, msg: P.Call) -> bool:
        """On the reader: True if ``msg`` waits behind its queue's running call (which runs it
        next); False if it is the first, to run now."""
        with self._lock:
            waiting = self._queues.get(msg.queue)
            if waiting is not None:
                waiting.append(msg)
                return True
            self._queues[msg.queue] = deque()
            return False

    def _next_queued(self, queue: str) -> Optional[P.Call]:
        with self._lock:
            waiting = self._queues[queue]
            if waiting:
                return waiting.popleft()
            del self._queues[queue]
            return None

    # --- requests from tasks (client.py: get_client, secede, rejoin) -------------------

    def ask(self, body: Any, seq: int, timeout: Optional[float] = None, withdraw: bool = False,
            lend: bool = False) -> P.Answer:
        """Send ``body`` to the parent's scheduler as a request of run ``seq``; its Answer.
        The channel's reader (another thread) hands the answer over. Past ``timeout``:
        TimeoutError, or with ``withdraw``, the request is withdrawn and its answer (what a
        timeout means for it, or the one already on its way) awaited. With ``lend`` (the
        answer waits for other tasks), a run whose answer is not there at once gives its
        slot back meanwhile (``_lent``)."""
        request = next(self._ask_ids)
        waiter: list = [threading.Event(), None]
        with self._asks_lock:
            self._asks[request] = waiter
        with self._lock:
            if self._reader is None:        # its answer needs a reader: call the main thread now
                self.turn.call_now()
        self._send_drops()
        self.chan.send(P.Ask(request, seq, body))
        if not (self._lent(waiter[0], timeout) if lend else waiter[0].wait(timeout)):
            if withdraw:
                self.chan.send(P.Ask(0, seq, P.Withdraw(request)))
                waiter[0].wait()
                return waiter[1]
            with self._asks_lock:
                self._asks.pop(request, None)
            raise TimeoutError(f"the cluster did not answer within {timeout:g} s")
        return waiter[1]

    def _lent(self, answered: threading.Event, timeout: Optional[float]) -> bool:
        """Wait for ``answered``; past a moment, with this run's slot given back (as ``secede``)
        and taken again after (as ``rejoin``), so that a task waiting for the tasks it submitted
        never holds the slot they need: naive recursion finishes on one thread."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if answered.wait(LEND_AFTER if timeout is None else min(LEND_AFTER, timeout)):
            return True
        lending = getattr(here, "run", None) is not None and not (here.seceded and not here.rejoined)
        if lending:
            self.secede()
        try:
            return answered.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        finally:
            if lending:
                self.rejoin()

    def tell(self, body: Any, seq: int) -> None:
        """Send ``body`` to the parent's scheduler; no answer."""
        self._send_drops()
        self.chan.send(P.Ask(0, seq, body))

    def drop(self, key: str) -> None:
        """A task's Future of ``key`` is gone. Lock-free and silent (it runs in the garbage
        collector, maybe inside a send on this very thread): sent with the next message."""
        self._drops.append(key)

    def _send_drops(self) -> None:
        keys = []
        while self._drops:
            keys.append(self._drops.popleft())
        if keys:
            self.chan.send(P.Ask(0, 0, P.Drop(tuple(keys))))

    def secede(self) -> None:
        """The calling task gives its thread slot back: an executor thread is started in its
        place (the first time: after a rejoin, the one started then still serves), and the
        parent counts the slot free. No-op outside a task or while seceded."""
        run = getattr(here, "run", None)
        if run is None or (here.seceded and not here.rejoined):
            return
        again, here.seceded, here.rejoined = here.seceded, True, False
        thread, started = (0, 0.0) if again else self.board.running().get(run.seq, (0, 0.0))
        if not again:
            self.board.stop(here.row)
        with self._lock:
            self._busy -= 1
            self._secessions += 0 if again else 1
            if self._runs and not self._rejoining:
                self._work.notify()
        if not again:
            threading.Thread(target=self._execute, args=(here.row,), name=f"localcluster-exec-{next(self._rows)}",
                             daemon=True).start()
        self.tell(P.Secede(started, thread), run.seq)

    def rejoin(self) -> None:
        """The calling task, seceded, takes a thread slot again: it waits for one (before
        any queued run) and the parent counts it busy. No-op unless it is seceded."""
        run = getattr(here, "run", None)
        if run is None or not here.seceded or here.rejoined:
            return
        with self._lock:
            self._rejoining += 1
            try:
                while self._busy >= self.nthreads:
                    self._rejoin_turn.wait()
            finally:
                self._rejoining -= 1
            self._busy += 1
        here.rejoined = True
        self.tell(P.Rejoin(), run.seq)

    def _seceded_run_over(self) -> None:
        """A seceded run ended: its thread leaves (an executor took its place), and the slot
        it took back on rejoin, if it did, is free again."""
        with self._lock:
            self._secessions -= 1
            if here.rejoined:
                self._busy -= 1
            if self._rejoining:
                self._rejoin_turn.notify()
            elif self._runs and self._idle:
                self._work.notify()
            elif self._runs and isinstance(self._reader, int) and not self._nudged:
                # the only executor free is reading the channel: call it back to the queue
                self._nudged = True
                os.write(self._nudge_w, b"x")

    def _read_as_executor(self) -> None:
        """The reader role, on an executor. While a seceded run lives, a queued run may wait
        for a slot that frees without a message: then a nudge calls this thread back."""
        if self._secessions:
            ready, _, _ = select.select([self.chan, self._nudge_r], [], [])  # type: ignore[type-var]  # a fileno() or an fd
            if self._nudge_r in ready:
                os.read(self._nudge_r, 512)
                with self._lock:
                    self._nudged = False
            if self.chan not in ready:
                return
        elif self.spin_wait and not self._busy and not self.chan.has_pending():
            # the next run of a short round trip comes soon; not while another executor
            # runs a task, whose turns at the GIL the polling would take
            poll_for(self._poller, self.spin_wait)
        self._read_and_handle()

    # --- executor threads -------------------------------------------------------------

    def _queue(self, run: P.Run) -> None:
        # One idle executor, if any. An executor that read this run holds the GIL until it
        # takes the first run itself (no hop); the one woken then takes the next, or the reader role.
        with self._lock:
            self._runs.append(run)
            self._work.notify()

    def _next_run(self, row: int, ran: bool = False) -> Any:
        """A run to execute, or None: then this thread holds the reader role. ``ran``: this
        thread just ended a run (its slot is free again)."""
        with self._lock:
            if ran:
                self._busy -= 1
            while True:
                if self._rejoining and self._busy < self.nthreads:
                    self._rejoin_turn.notify()      # a seceded task comes back before any queued run
                elif self._runs and self._busy < self.nthreads:
                    if self._reader is None and not self._idle:
                        self.turn.arm()             # nobody else is left to read the channel
                    self._busy += 1
                    return self._runs.popleft()
                if self._reader is None:
                    self._reader = row
                    self.turn.disarm()
                    return None
                self._idle += 1
                if self._reader == "main" and not self._nudged:
                    self._nudged = True
                    os.write(self._nudge_w, b"x")
                self._work.wait()
                self._idle -= 1

    def _execute(self, row: int) -> None:
        ident = threading.get_ident()
        board = self.board
        ran = False
        while True:
            run = self._next_run(row, ran)
            ran = run is not None
            if run is None:
                try:
                    self._read_as_executor()
                except BaseException:
                    fatal(self, traceback.format_exc())
                finally:
                    with self._lock:
                        self._reader = None     # this thread decides next, in _next_run
                continue
            if run.seq in self.cancelled:
                self.cancelled.discard(run.seq)
                self._reply(P.Skipped(run.seq))
                continue
            if self.pause_at is not None:
                self._look_at_memory()
            board.start(row, ident, run.seq)
            here.seceded = here.rejoined = False
            if context.watchers:
                context.notify(run.key, "ready", "executing")
            reply = self._run(run, row)
            seceded = here.seceded
            if not seceded:         # a seceded run left the row to the executor that took its place
                board.stop(row)
            if run.seq in self.cancelled:   # cancelled while running: the parent wants no result
                self.cancelled.discard(run.seq)
                self.store.free_made_by(run.key, run.seq)     # not a newer run's result
            self._reply(reply)
            if context.watchers:
                context.notify(run.key, "executing", "memory" if type(reply) is P.Finished else "error")
            if seceded:
                self._seceded_run_over()
                return

    def _look_at_memory(self) -> None:
        """At most once a millisecond (a /proc read costs a few µs; a no-op run ~20): say
        Pressure when RSS crosses memory_pause. The run goes ahead; the parent asks back the
        ones queued behind it."""
        now = time.monotonic()
        if now < self._next_look:
            return
        self._next_look = now + 0.001
        used = self._rss()
        if used is None:
            return
        over = used > self.pause_at
        if over and not self._pressed:
            self.chan.send(P.Pressure(used))
        self._pressed = over

    def _rss(self) -> Optional[int]:
        return rss_of(self._statm) if self._statm is not None else rss()

    def _reply(self, reply: Any) -> None:
        self.pending.discard(reply.seq)
        with self._out_lock:
            self._out.append(reply)
        if self._runs:    # more runs queued: let the flusher batch replies
            self._flush_wanted.set()
        else:
            self._flush()

    def _run(self, run: P.Run, row: int) -> Any:
        step = "unpickling the function"
        start = time.time()
        t0 = time.perf_counter()
        try:
            fn = self.loaded.get(run.fn_id)
            if fn is None:
                fn = self.loaded[run.fn_id] = pickle.loads(self.fns[run.fn_id])
            step = "unpickling the arguments"
            # only a task with dependencies has placeholders to resolve (the plain loads is faster)
            try:
                args, kwargs = serialize.loads(run.args, self.store if run.deps else None)
            except TransferError as e:      # not the task's: the parent sends what it needs again
                whose = f"the stored copy of {e.key!r}" if e.key else "the task's arguments"
                return P.Damaged(e.key, run.seq, 0, f"{whose}: {e.detail}")
            step = "running the task"
            here.run, here.row = run, row
            t1 = time.perf_counter()
            try:
                result = fn(*args, **kwargs)
            finally:
                here.run = None
            t1 = time.perf_counter() - t1       # the function's own time
            step = "pickling the result"
            payload = serialize.dumps_result(result)
        except BaseException as e:  # noqa: B902 - SystemExit/KeyboardInterrupt in a task are task errors
            # the task's frames from its function down, or from the first one not ours (a __reduce__)
            e.__traceback__ = remote.strip_own_frames(e.__traceback__)
            what = ""
            if step != "running the task":
                what = f"{step} of task {run.key!r} failed on worker {self.name!r}"
                if step == "pickling the result":
                    what += f" (result type {type(result).__module__}.{type(result).__qualname__})"
                e = serialize.serialization_error(e, what)
            remote.note_origin(e, self.name, os.getpid(), run.key)
            return P.Failed(run.seq, serialize.dumps_exception(e, what), start, time.perf_counter() - t0, row)
        type_name = type(result).__qualname__
        # A cancelled run stores nothing: a newer run of its key may have stored its own
        # result already. Cancel arrives before the key is sent again, so a run that sees
        # no Cancel here stores before any newer run of its key exists.
        if run.seq not in self.cancelled:
            self.store.put_result(run.key, result, payload, run.seq)
        data = payload if payload.nbytes <= P.INLINE_RESULT else None
        duration = time.perf_counter() - t0
        return P.Finished(run.seq, payload.nbytes, type_name, data, duration, start, row, duration - t1)

    def log(self, record: dict, urgent: bool) -> None:
        """A logging record for the parent: a warning goes now, lesser ones with the next batch."""
        with self._out_lock:
            self._out.append(P.Log((record,)))
        if urgent:
            self._flush()
        else:
            self._flush_wanted.set()

    def _flush(self) -> None:
        with self._out_lock:
            out, self._out = self._out, []
        for hook in before_reply:      # after the swap: whatever these replies' results left is done
            hook()
        if self._drops:
            keys = []
            while self._drops:
                keys.append(self._drops.popleft())
            out.append(P.Ask(0, 0, P.Drop(tuple(keys))))
        if len(out) == 1:
            self.chan.send(out[0])
        elif out:
            self.chan.send(P.Batch(tuple(out)))

    def _flusher(self) -> None:
        while True:
            self._flush_wanted.wait()
            time.sleep(FLUSH_DELAY)
            self._flush_wanted.clear()
            self._flush()

    def _heartbeat(self) -> None:
        while True:
            self.board.beat()
            if self._drops:          # Futures a long task let go of: their keys go now
                self._flush_wanted.set()
            if self.allowance is not None:
                self.allowance.settle()
            self.recycler.trim()
            if self.trim_at is not None and (self._rss() or 0) > self.trim_at:
                self.recycler.trim(everything=True)     # before any value is spilled or a run paused
            if self.spill_at is not None:
                self.store.spill_for_rss(self.spill_at, lambda: self.recycler.trim(everything=True))
            self.board.set_reusable(self.recycler.cached())
            time.sleep(min(0.1, self.heartbeat) if self.trim_at is not None else self.heartbeat)


def _parent_gone() -> None:
    """The channel to the parent is closed, found by a read or a send: end now."""
    context.parent_gone()
    os._exit(0)


def answer_stacks(fd: int) -> None:
    """The stacks thread: for each request the parent writes on ``fd`` (4 bytes, its number),
    every thread's stack on stderr between ``STACKS_HEAD`` and ``STACKS_TAIL`` naming the newest
    request read, while the parent keeps its end open. faulthandler runs here with the GIL held,
    not in a signal handler: the other threads then wait at a point where their frames are
    whole, so it never follows a frame being pushed or popped (in a signal handler that can
    crash the worker or cut the dump short), and requests that come while it writes are
    answered by the next dump, never dropped. It is also the one thread that takes the
    parent-death signal (boot.py), which the others block: its dumps into the end note then
    come one after another, never one inside another. So it outlives the pipe: a dying parent's
    files close before the kernel sends that signal, and with this thread gone the signal
    would wait, blocked, for ever."""
    while True:
        data = os.read(fd, 4096)        # whole requests: each is one write() under PIPE_BUF, never split
        if not data:
            threading.Event().wait()
        newest = int.from_bytes(data[-4:], "big")
        os.write(2, (STACKS_HEAD.format(newest) + "\n").encode())
        faulthandler.dump_traceback(file=2, all_threads=True)
        os.write(2, (STACKS_TAIL.format(newest) + "\n").encode())


def fatal(worker: Any, tb: str, name: Any = None) -> None:
    """The worker's own machinery failed: say so on stderr and to the parent, exit 1."""
    name = name if name is not None else getattr(worker, "name", "?")
    sys.stderr.write(f"localcluster worker {name!r} failed:\n{tb}")
    sys.stderr.flush()
    if worker is not None:
        try:
            worker.chan.send(P.Fatal(tb))
        except Exception:
            pass
    os._exit(1)
