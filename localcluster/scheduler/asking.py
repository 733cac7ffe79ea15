"""The books of tasks that submit tasks (``get_client`` on a worker): a part of the Scheduler
(composition: same thread, same lock, no I/O). It owns:

- ``holds``: worker -> {key: [references, submitting key]}: the futures tasks on that worker
  hold. Each reference counts in the key's ``Task.wanted``, like a Client's future; a
  Drop from the worker gives one back. A reference the worker never had is never given back
  (a Drop for a key it holds no more is ignored).
- ``orphans``: submitting key -> keys a dead worker held for it. While that task runs again,
  they stay wanted: its rerun submits the same pure keys and finds them done or under way,
  instead of computing them twice. Let go of once it ends (``settled``).
- ``seceded``: seq -> worker of each run that gave its thread slot back (``secede()``): its
  worker's ``nthreads`` counts one more slot until the run rejoins or ends.
- ``offboard``: seq -> (worker, thread ident, start in monotonic seconds) of each run that
  seceded, until it ends (rejoined too): such a run has left its executor's row of the status
  board, so the supervisor reads it here to watch its timeout and name its thread in a death.
- the function ids of what tasks submit: negative, so they never meet a Client's.
- ``calls``: request id of a call to a worker (``Calls.call``) -> (its :class:`_RunAnswer`, index) of each
  call made for a task's ``run`` (``RunOn``): the calls' answers (Delivers) are gathered here,
  not handed to the dispatcher, and the task gets one Answer once every worker has answered.
"""
from __future__ import annotations

from typing import Callable, Optional

from ..wire import protocol as P
from ..wire.serialize import dumps_exception
from .records import Deliver, Send, WorkerState

_FN_IDS_MAX = 4096


class Asking:
    def __init__(self) -> None:
        self.holds: dict[str, dict[str, list]] = {}
        self.orphans: dict[str, list] = {}
        self.seceded: dict[int, str] = {}
        self.offboard: dict[int, tuple] = {}
        self.calls: dict[int, tuple] = {}
        self._fn_ids: dict[bytes, int] = {}
        self._next_fn = -1

    def fn_id(self, fn: bytes) -> int:
        """The id of a function a task submitted (the same bytes, the same id)."""
        known = self._fn_ids.get(fn)
        if known is not None:
            return known
        if len(self._fn_ids) >= _FN_IDS_MAX:      # forgotten ids only cost a resend of the function
            self._fn_ids.clear()
        self._fn_ids[fn] = fn_id = self._next_fn
        self._next_fn -= 1
        return fn_id

    def hold(self, worker: str, keys: list, owner: Optional[str]) -> None:
        """``worker`` holds one more reference to each of ``keys`` (already counted in wanted);
        ``owner``: the task that made them, if a run did."""
        if not keys:
            return
        holds = self.holds.setdefault(worker, {})
        for key in keys:
            entry = holds.get(key)
            if entry is None:
                holds[key] = [1, owner]
            else:
                entry[0] += 1

    def dropped(self, worker: str, keys: tuple) -> list:
        """The keys whose reference ``worker`` gave back (those it did hold), to release."""
        holds = self.holds.get(worker)
        out: list = []
        if not holds:
            return out
        for key in keys:
            entry = holds.get(key)
            if entry is None:
                continue
            entry[0] -= 1
            if not entry[0]:
                del holds[key]
            out.append(key)
        return out

    def cancelled(self, key: str) -> None:
        """``key`` was cancelled, which drops every reference to it: the workers' and those
        kept for tasks to run again. A Drop the worker sends for it later is then ignored,
        instead of letting go of a reference made since (the key submitted again)."""
        for worker in [w for w, holds in self.holds.items() if key in holds]:
            del self.holds[worker][key]
            if not self.holds[worker]:
                del self.holds[worker]
        for owner in [o for o, keys in self.orphans.items() if key in keys]:
            kept = [k for k in self.orphans[owner] if k != key]
            if kept:
                self.orphans[owner] = kept
            else:
                del self.orphans[owner]

    def seceded_on(self, seq: int, ws: Optional[WorkerState], thread: int = 0, started: float = 0.0) -> None:
        if ws is None or seq in self.seceded or ws.processing.get(seq) is None:
            return
        self.seceded[seq] = ws.name
        ws.nthreads += 1
        if started and seq not in self.offboard:
            self.offboard[seq] = (ws.name, thread, started)

    def off_board(self, worker: str) -> dict:
        """seq -> (thread ident, start) of the runs on ``worker`` that seceded and run on, as
        ``Board.running`` gives those on its rows."""
        return {seq: (thread, started) for seq, (w, thread, started) in self.offboard.items() if w == worker}

    def ended(self, seq: int, ws: Optional[WorkerState]) -> None:
        """Run ``seq`` ended (answered, or given back): a slot it still counted is free."""
        self.rejoined(seq, ws)
        self.offboard.pop(seq, None)

    def rejoined(self, seq: int, ws: Optional[WorkerState]) -> None:
        """Run ``seq`` took a slot again, or ended: its worker has one slot less."""
        worker = self.seceded.pop(seq, None)
        if worker is not None and ws is not None and ws.name == worker:
            ws.nthreads -= 1

    def worker_gone(self, worker: str, pending: Callable[[str], bool]) -> list:
        """A worker died: its seceded runs are over; of its references, those made by a task
        that is ``pending`` (to run again) are kept for it, and the rest returned, to release."""
        for seq in [seq for seq, w in self.seceded.items() if w == worker]:
            del self.seceded[seq]
        for seq in [seq for seq, entry in self.offboard.items() if entry[0] == worker]:
            del self.offboard[seq]
        self._callers_gone(worker)
        let_go: list = []
        for key, (count, owner) in self.holds.pop(worker, {}).items():
            if owner is not None and pending(owner):
                self.orphans.setdefault(owner, []).extend([key] * count)
            else:
                let_go.extend([key] * count)
        return let_go

    def settled(self, pending: Callable[[str], bool]) -> list:
        """The keys kept for tasks that are no longer ``pending`` (they ended), to release."""
        done = [owner for owner in self.orphans if not pending(owner)]
        return [key for owner in done for key in self.orphans.pop(owner)]

    def clear(self, worker: Callable[[str], Optional[WorkerState]]) -> None:
        """Everything is forgotten (restart): every reference and secession with it."""
        for seq, name in list(self.seceded.items()):
            self.rejoined(seq, worker(name))
        self.holds.clear()
        self.orphans.clear()
        self.seceded.clear()
        self.offboard.clear()
        self.calls.clear()

    # --- a task's run (RunOn) and scheduler_info (Info) ---------------------------------

    def run_asked(self, worker: str, request: int, body: P.RunOn, asker: Optional[str], known: Callable[[str], bool],
                  live: list, call: Callable[[str, str], tuple]) -> list:
        """``Client.run`` from a task on ``worker``: ``call(name, what)`` (``Calls.call``) on
        each worker ``body`` names (those in ``live`` when None); the answers are gathered
        (``answering``) into one Answer to ``request``. A name no worker has is refused at once."""
        names = list(body.workers) if body.workers is not None else live
        by = f" from task {asker!r}" if asker else " from a task"
        unknown = [n for n in names if not known(n)]
        if unknown:
            error = ValueError(f"run(workers={names!r}){by} on {worker!r}: no running worker is called "
                               f"{', '.join(map(repr, unknown))}; the workers are {live!r}")
            return [Send(worker, P.Answer(request, None, dumps_exception(error)))] if request else []
        gathering = _RunAnswer(worker, request, tuple(names))
        if not names:
            return gathering.answer()
        out: list = []
        for i, name in enumerate(names):
            req, actions = call(name, f"client.run({body.name}){by} on {name!r}")
            self.calls[req] = (gathering, i)
            out += actions
        return self.answering(out)

    def answering(self, actions: list, gone: Optional[str] = None) -> list:
        """``actions`` with the Delivers of a task's run's calls taken out, gathered, and the
        task's Answer added once the last is in. ``gone``: a worker that died (this very
        event): what its tasks asked is answered to nobody."""
        if gone is not None:
            self._callers_gone(gone)
        out: list = []
        for a in actions:
            entry = self.calls.pop(a.request, None) if type(a) is Deliver else None
            if entry is None:
                out.append(a)
                continue
            gathering, i = entry
            error = a.error
            gathering.outcomes[i] = ("finished", a.data, None) if error is None else (
                "error", None, error if isinstance(error, bytes) else dumps_exception(error))
            gathering.left -= 1
            if not gathering.left:
                out += gathering.answer()
        return out

    def _callers_gone(self, worker: str) -> None:
        for req in [req for req, (g, _i) in self.calls.items() if g.worker == worker]:
            self.calls[req][0].request = 0          # still gathered, answered to nobody

    def workers_info(self, workers: list) -> tuple:
        """(name, threads, resources) of each open worker, by name, for a task's scheduler_info:
        threads as started, not counting the slots its seceded runs gave back."""
        gave: dict = {}
        for name in self.seceded.values():
            gave[name] = gave.get(name, 0) + 1
        return tuple((ws.name, ws.nthreads - gave.get(ws.name, 0), dict(ws.resources))
                     for ws in sorted(workers, key=lambda w: w.name) if not ws.closing)


class _RunAnswer:
    """The answers of one task's ``run``, one slot a worker; answered once all are in."""
    __slots__ = ("worker", "request", "names", "outcomes", "left")

    def __init__(self, worker: str, request: int, names: tuple):
        self.worker, self.request, self.names = worker, request, names
        self.outcomes: list = [None] * len(names)
        self.left = len(names)

    def answer(self) -> list:
        """The Answer to the asking task (none for request 0: wait=False, or its worker died)."""
        if not self.request:
            return []
        return [Send(self.worker, P.Answer(self.request, tuple(zip(self.names, self.outcomes))))]
