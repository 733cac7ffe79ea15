"""The futures' keys a client holds, for both clients: :class:`KeyTable` keeps, by key, the one
state every future of that key shares in one client and how many of those futures live. It
hands a state out for each new future (a key that ended and is held again, by a new submit
or an unpickled future, gets a fresh pending state: the futures made before keep what they
had), renews an ended key computed again, and says when the last future of a key goes.

The Client's ``FutureTable`` (client/future.py) is one, and a task's ``TaskTable``
(worker/client.py), both over worker/future.py's ``FutureState``. What each does once the last
future goes (the Client lets the key go once; a task gives back one reference a future) is its own.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Generic, Iterable, Optional, Protocol, TypeVar

__all__ = ["KeyTable", "KeyState"]


class KeyState(Protocol):
    """What the table needs of a key's state."""
    key: str
    holders: int        # live futures of the key (under the table's lock)

    def done(self) -> bool:
        """Whether the key has ended, as far as this client knows."""


S = TypeVar("S", bound=KeyState)


class KeyTable(Generic[S]):
    """key -> the state its futures share. Used by any thread, and from inside the garbage
    collector (a future's ``__del__``): the lock is re-entrant, since a collection while it
    is held may let go of another future."""

    def __init__(self, new: Callable[[Any, str], S]):
        self._new = new                 # new(table, key): a pending state of a key, held by one future
        self.states: dict[str, S] = {}
        self.lock = threading.RLock()

    def take(self, key: str) -> tuple[S, bool]:
        """The state of ``key`` for one more future of it, and whether the key is new here."""
        with self.lock:
            state = self.states.get(key)
            if state is None:
                state = self.states[key] = self._new(self, key)
                return state, True
            if state.done():
                state = self._renewed(state)
            state.holders += 1
            return state, False

    def take_many(self, keys: Iterable[str], make: Callable[..., Any]) -> tuple[list, dict]:
        """``make(key, state=state)`` (a future's class) of one more future of each of ``keys``, under one lock (a whole
        ``map``), and {key: how many of them} for the keys held here already (or by one made
        before them in the call)."""
        made: list = []
        again: dict = {}
        states, new, add = self.states, self._new, made.append
        with self.lock:
            for key in keys:
                state = states.get(key)
                if state is None:
                    state = states[key] = new(self, key)
                else:
                    if state.done():
                        state = self._renewed(state)
                    state.holders += 1
                    again[key] = again.get(key, 0) + 1
                add(make(key, state=state))
        return made, again

    def _renewed(self, ended: S) -> S:
        """A pending state in place of ``ended`` for the futures made from now on, which the
        cluster ends anew; the count of the key's futures carries over."""
        state = self.states[ended.key] = self._new(self, ended.key)
        state.holders = ended.holders
        return state

    def renew(self, key: str) -> None:
        """The key is computed again: its futures from now on wait for that run."""
        with self.lock:
            state = self.states.get(key)
            if state is not None and state.done():
                self._renewed(state)

    def let_go(self, key: str) -> bool:
        """A future of ``key`` is gone; True if it was the last (the key is no longer held here)."""
        with self.lock:
            state = self.states.get(key)
            if state is not None and state.holders > 1:
                state.holders -= 1
                return False
            self.states.pop(key, None)
            return True

    def holds(self, key: str) -> bool:
        return key in self.states

    def state(self, key: str) -> Optional[S]:
        return self.states.get(key)
