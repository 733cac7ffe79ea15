"""What runs inside a worker process.

Threads::

    reader role      one thread at a time reads the channel: Run -> run queue (or parked until
                     its deps arrive), Put/Free -> store, Export -> Data reply, Cancel, Steal
                     (queued runs given back), Stop;
                     EOF -> exit. An idle executor takes the role itself, so a Run that arrives
                     at an idle worker is executed by the thread that read it: no thread hop
                     (a GIL hand-off between threads costs more than a process round trip).
                     The main thread reads only while every executor is busy, and is nudged
                     off the socket (a self-pipe) as soon as one becomes idle.
    executor x N     take runs from the run queue, mark the status board, run, reply
    flusher          sends results that executors batched while more runs were queued
    heartbeat        stamps the board every second (a GIL held by C code stops it: that is
                     how the parent tells "unresponsive"), and spills when RSS passes target

The process is started with ``python -c`` (see nanny.py), so the user's
``__main__`` is never re-executed here; it dies with its parent (PR_SET_PDEATHSIG,
and EOF on the channel); faulthandler writes fatal-signal stacks, with every
thread's ident, into the captured stderr.
"""
from __future__ import annotations

import faulthandler
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
from typing import Any

from . import logs
from ..wire import protocol as P
from ..wire import remote, serialize
from ..wire.board import Board
from ..system.cgroup import SharedAllowance
from ..wire.channel import BlockingChannel, encode
from ..system.machine import rss
from .store import Store, StoreError

FLUSH_DELAY = 0.002

_here = threading.local()      # .worker and .seq: the run this executor thread is on
_in_worker = False


def in_worker() -> bool:
    """Whether this process is a localcluster worker (code that would start a cluster of its
    own, such as the joblib backend, runs in the task's thread instead)."""
    return _in_worker


def cancelled() -> bool:
    """Whether the task running on this thread was cancelled (its caller gave up on it):
    work made of steps, such as a joblib batch of calls, stops at the next one."""
    worker = getattr(_here, "worker", None)
    return worker is not None and getattr(_here, "seq", None) in worker.cancelled


def take_authkey(fd: int) -> None:
    """The parent's ``multiprocessing`` authkey, so that a Manager proxy (or any connection
    to the parent's multiprocessing servers) a task receives authenticates as it would in
    the parent or in a loky worker. It precedes every message on the channel (4 bytes of
    length, then the key), never in argv, which ``ps`` shows to every user (SECURITY.md)."""
    size = int.from_bytes(_read_exact(fd, 4), "big")
    key = _read_exact(fd, size)
    from multiprocessing import current_process
    current_process().authkey = key


def _read_exact(fd: int, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = os.read(fd, n - len(out))
        if not chunk:
            raise EOFError("the parent closed the channel before sending the worker's authkey")
        out += chunk
    return out


BOOT = ("import sys, json; cfg = json.loads(sys.argv[1]); sys.path[:] = cfg['sys_path']; "
        "from localcluster.worker.process import main; main(cfg)")


def _die_with_parent(parent_pid: int) -> None:
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            PR_SET_PDEATHSIG = 1
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except Exception:  # pragma: no cover - the channel EOF still ends us
            pass
    if os.getppid() != parent_pid:   # the parent died before prctl took effect
        os._exit(0)


def _raise_oom_score() -> None:
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("500")
    except OSError:  # pragma: no cover - not Linux
        pass


class Worker:
    def __init__(self, cfg: dict):
        self.name = cfg["name"]
        self.nthreads = cfg["nthreads"]
        self.board = Board(self.nthreads, fd=cfg["board_fd"])
        # the memfd of every large value it sends is charged to its memory cgroup, however
        # long the receiver keeps it: the group's limit makes room for those (cgroup.py)
        self.allowance = SharedAllowance(*cfg["cgroup"]) if cfg.get("cgroup") else None
        self.chan = BlockingChannel(socket.socket(fileno=cfg["sock_fd"]),
                                    self.allowance.charge if self.allowance else None)
        limit = cfg.get("memory_limit")
        target = cfg.get("memory_target")
        self.spill_at = int(limit * target) if limit and target else None
        pause = cfg.get("memory_pause")
        self.pause_at = int(limit * pause) if limit and pause else None
        self._next_look = 0.0           # monotonic time of the next look at RSS before a run
        self._pressed = False           # said Pressure, and RSS has not fallen below the line since
        self.store = Store(cfg.get("spill_dir"), self.spill_at, self.board.set_store)
        # Under _lock: the run queue, the reader role, the idle count. Two conditions on it, so
        # that a wake-up goes to the one thread that has something to do: a run queued wakes
        # one idle executor (not every thread: with 4 executors that herd cost ~60 µs a round
        # trip), and the main thread is woken only when nobody is left to read.
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)     # idle executors wait here
        self._main_turn = threading.Condition(self._lock)   # the main thread waits here
        self._runs: deque = deque()
        self._reader: Any = None        # who holds the reader role: "main", an executor row, or None
        self._idle = 0                  # executors waiting for work (woken ones count until they run)
        self._nudge_r, self._nudge_w = os.pipe()
        self._nudged = False
        self.parked: dict[int, tuple] = {}          # seq -> (run, missing deps)
        self.fns: dict[int, Any] = {}
        self.cancelled: set = set()
        self.pending: set = set()    # seqs received and not yet answered
        self._out: list = []
        self._out_lock = threading.Lock()
        self._flush_wanted = threading.Event()
        self.heartbeat = cfg.get("heartbeat", 1.0)

    # --- main thread ------------------------------------------------------------------

    def serve(self) -> None:
        for row in range(1, self.nthreads + 1):
            threading.Thread(target=self._execute, args=(row,), name=f"localcluster-exec-{row}", daemon=True).start()
        threading.Thread(target=self._flusher, name="localcluster-flush", daemon=True).start()
        threading.Thread(target=self._heartbeat, name="localcluster-heartbeat", daemon=True).start()
        self.chan.send(P.Ready(os.getpid(), versions()))
        while True:
            with self._lock:
                while self._reader is not None or self._idle:
                    self._main_turn.wait()
                self._reader = "main"
            try:
                while not self._idle:
                    ready, _, _ = select.select([self.chan, self._nudge_r], [], [])
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

    def _read_and_handle(self) -> None:
        try:
            msgs = self.chan.recv_all()
        except (EOFError, OSError):
            os._exit(0)   # the parent is gone
        for msg in msgs:
            self._handle(msg)

    def _handle(self, msg: Any) -> None:
        if isinstance(msg, P.Batch):
            for m in msg.messages:
                self._handle(m)
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
            self.store.put_payload(msg.key, msg.data)
            if msg.ack:
                self.chan.send(P.Stored(msg.ack))
            self._arrived(msg.key)
        elif isinstance(msg, P.Export):
            self._export(msg)
        elif isinstance(msg, P.Free):
            self.store.free(msg.keys)
        elif isinstance(msg, P.Cancel):
            for seq in msg.seqs:
                if self.parked.pop(seq, None) is not None:
                    self.pending.discard(seq)
                    self.chan.send(P.Skipped(seq))
                elif seq in self.pending:
                    self.cancelled.add(seq)
        elif isinstance(msg, P.Steal):
            taken = tuple(seq for seq in msg.seqs if self._unqueue(seq))
            self.pending.difference_update(taken)
            self.chan.send(P.Unqueued(msg.seqs, taken))
        elif isinstance(msg, P.Call):
            # A thread of its own, not the reader's nor an executor's: a worker whose every
            # slot is busy still answers, and a long function never stops the channel's reader.
            threading.Thread(target=self._call, args=(msg,), name=f"localcluster-run-{msg.request}",
                             daemon=True).start()
        elif isinstance(msg, P.Stop):
            self._flush()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        else:
            raise TypeError(f"unexpected message {msg!r}")

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
            frame = encode(P.Data(msg.request, msg.key, payload, None), self.chan.charge)
        except Exception as e:
            error = StoreError(f"sending the data of {msg.key!r} from worker {self.name!r} failed while "
                               f"{step}: {type(e).__name__}: {e}")
            frame = encode(P.Data(msg.request, msg.key, None, serialize.dumps_exception(error)))
        self.chan.send_frame(*frame)

    def _call(self, msg: P.Call) -> None:
        """``Client.run``'s function, on this thread; answer Called with its result or error."""
        step = "unpickling the function"
        try:
            fn = pickle.loads(msg.fn)
            step = "unpickling the arguments"
            args, kwargs = serialize.loads(msg.args)
            step = "running the function"
            result = fn(*args, **kwargs)
            if _awaitable(result):         # dask runs an async function to its end
                import asyncio
                result = asyncio.run(_awaited(result))
            step = "pickling the result"
            reply = P.Called(msg.request, serialize.dumps_result(result), None)
        except BaseException as e:  # noqa: B902 - any error of the function is its answer
            e.__traceback__ = remote.strip_own_frames(e.__traceback__)
            what = "" if step == "running the function" else f"{step} of client.run() failed on worker {self.name!r}"
            if what:
                e = serialize.restate(e, what)
            remote.note_origin(e, self.name, os.getpid(), f"client.run({getattr(fn, '__name__', '?')})"
                               if step != "unpickling the function" else "client.run")
            reply = P.Called(msg.request, None, serialize.dumps_exception(e, what))
        self.chan.send(reply)

    # --- executor threads -------------------------------------------------------------

    def _queue(self, run: P.Run) -> None:
        # One idle executor, if any. An executor that read this run holds the GIL until it
        # takes the first run itself (no hop); the one woken then takes the next, or the reader role.
        with self._lock:
            self._runs.append(run)
            self._work.notify()

    def _next_run(self, row: int) -> Any:
        """A run to execute, or None: then this thread holds the reader role."""
        with self._lock:
            while True:
                if self._runs:
                    if self._reader is None and not self._idle:
                        self._main_turn.notify()    # nobody else is left to read the channel
                    return self._runs.popleft()
                if self._reader is None:
                    self._reader = row
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
        _here.worker = self
        while True:
            run = self._next_run(row)
            if run is None:
                try:
                    self._read_and_handle()
                except BaseException:
                    _fatal(self, traceback.format_exc())
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
            _here.seq = run.seq
            reply = self._run(run, row)
            board.stop(row)
            if run.seq in self.cancelled:   # cancelled while running: the parent wants no result
                self.cancelled.discard(run.seq)
                self.store.free_made_by(run.key, run.seq)     # not a newer run's result
            self._reply(reply)

    def _look_at_memory(self) -> None:
        """At most once a millisecond (a /proc read costs a few µs; a no-op run ~20): say
        Pressure when RSS crosses memory_pause. The run goes ahead; the parent asks back the
        ones queued behind it."""
        now = time.monotonic()
        if now < self._next_look:
            return
        self._next_look = now + 0.001
        used = rss()
        if used is None:
            return
        over = used > self.pause_at
        if over and not self._pressed:
            self.chan.send(P.Pressure(used))
        self._pressed = over

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
            fn = self.fns[run.fn_id]
            if isinstance(fn, bytes):
                fn = self.fns[run.fn_id] = pickle.loads(fn)
            step = "unpickling the arguments"
            # only a task with dependencies has placeholders to resolve (the plain loads is faster)
            args, kwargs = serialize.loads(run.args, self.store if run.deps else None)
            step = "running the task"
            result = fn(*args, **kwargs)
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
                e = serialize.restate(e, what)
            remote.note_origin(e, self.name, os.getpid(), run.key)
            return P.Failed(run.seq, serialize.dumps_exception(e, what), start, time.perf_counter() - t0, row)
        type_name = type(result).__qualname__
        # A cancelled run stores nothing: a newer run of its key may have stored its own
        # result already. Cancel arrives before the key is sent again, so a run that sees
        # no Cancel here stores before any newer run of its key exists.
        if run.seq not in self.cancelled:
            self.store.put_result(run.key, result, payload, run.seq)
        data = payload if payload.nbytes <= P.INLINE_RESULT else None
        return P.Finished(run.seq, payload.nbytes, type_name, data, time.perf_counter() - t0, start, row)

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
            if self.allowance is not None:
                self.allowance.settle()
            if self.spill_at is not None:
                self.store.spill_for_rss(self.spill_at)
            time.sleep(min(0.1, self.heartbeat) if self.spill_at is not None else self.heartbeat)


def _awaitable(obj: Any) -> bool:
    return hasattr(obj, "__await__") and not isinstance(obj, type)


async def _awaited(obj: Any) -> Any:
    return await obj


def versions() -> dict:
    import platform
    out = {"python": platform.python_version(), "platform": sys.platform}
    for mod in ("localcluster", "cloudpickle", "tblib"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:
            out[mod] = None
    if "numpy" in sys.modules:
        out["numpy"] = sys.modules["numpy"].__version__
    return out


def main(cfg: dict) -> None:
    _die_with_parent(cfg["parent_pid"])
    _raise_oom_score()
    faulthandler.enable(file=sys.stderr, all_threads=True)
    if hasattr(faulthandler, "register"):
        faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C is the parent's to handle
    if hasattr(signal, "pthread_sigmask"):          # blocked by the parent's thread that started us
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    # pass_fds hands them over inheritable: a program a task starts with close_fds=False
    # would get our channel to the parent and the board (SECURITY.md).
    for fd in (cfg["sock_fd"], cfg["board_fd"]):
        os.set_inheritable(fd, False)
    global _in_worker
    _in_worker = True
    worker = None
    try:
        take_authkey(cfg["sock_fd"])
        worker = Worker(cfg)
        if cfg.get("log_level") is not None:
            logs.install(worker.log, cfg["log_level"])
        if cfg.get("initializer") is not None:
            with open(cfg["initializer"], "rb") as f:       # 0600 in the cluster's 0700 directory
                init, initargs = pickle.load(f)
            init(*initargs)
        worker.serve()
    except SystemExit:
        raise
    except BaseException:
        _fatal(worker, traceback.format_exc(), cfg.get("name"))


def _fatal(worker: Any, tb: str, name: Any = None) -> None:
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
