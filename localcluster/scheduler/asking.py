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
"""
from __future__ import annotations

from typing import Callable, Optional

from .records import WorkerState

_FN_IDS_MAX = 4096


class Asking:
    def __init__(self) -> None:
        self.holds: dict[str, dict[str, list]] = {}
        self.orphans: dict[str, list] = {}
        self.seceded: dict[int, str] = {}
        self.offboard: dict[int, tuple] = {}
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

    def held(self, worker: str, keys: list, owner: Optional[str]) -> None:
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
