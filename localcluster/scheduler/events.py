"""The events the scheduler takes: its one door is ``Scheduler.handle(*events)``.

One frozen class a meaning. What the client asks (submit, fetch, cancel ...) is named as
asked; what happened (a worker died, a worker reported) as it happened. ``state.py``'s
``HANDLERS`` is the table from each class to what handles it, and says whether placement
runs after it and whether it opens a request.

An event that opens a request (Fetch, Replicate, Rebalance, Call, Coordinate) is answered
later by a Deliver or a Reply naming that request: ``handle`` returns an :class:`Opened`
first, naming it, so that the caller can wait for the answer before any can arrive.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional


# --- the workers --------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class AddWorker:
    """A worker is up and may be given work. ``resources``: what it declares (None: the
    scheduler's own ``resources``)."""
    name: str
    nthreads: int
    resources: Optional[dict] = None


@dataclass(frozen=True, slots=True)
class SetPaused:
    """A worker paused for memory (no new work), or resumed."""
    worker: str
    paused: bool


@dataclass(frozen=True, slots=True)
class HandOff:
    """A worker is to leave: no new work, data only it holds moved elsewhere, then a Retire."""
    worker: str


@dataclass(frozen=True, slots=True)
class WorkerDied:
    """``death.blamed`` names the runs that count towards KilledWorker (``Scheduler.blame``);
    ``timed_out``: (seq, elapsed) of a run past its timeout."""
    death: Any
    timed_out: Optional[tuple] = None


@dataclass(frozen=True, slots=True)
class Reported:
    """A frame of task messages from one worker (Finished, Failed, Skipped, Unqueued, Data,
    Stored, Called, Damaged), in the order sent."""
    worker: str
    msgs: Any


@dataclass(frozen=True, slots=True)
class Asked:
    """Requests from tasks on ``worker`` (protocol.Ask: get_client, secede ...), in the order sent."""
    worker: str
    asks: Any


# --- the client's tasks -------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Submit:
    """Tasks (Specs). ``again``: {key: n} for n of the specs whose key the submitting client
    holds already, which do not count once more in the key's ``wanted``."""
    specs: Any
    again: Optional[dict] = None


@dataclass(frozen=True, slots=True)
class Scatter:
    """Data from the client: ``items`` is [(key, Payload)]."""
    items: Any
    workers: Optional[frozenset] = None
    broadcast: bool = False


@dataclass(frozen=True, slots=True)
class Hold:
    """One more Future holds ``key`` (``counted``: it counts in the key's ``wanted``)."""
    key: str
    counted: bool = True


@dataclass(frozen=True, slots=True)
class Drop:
    """The clients dropped their last futures of ``keys``."""
    keys: Any


@dataclass(frozen=True, slots=True)
class CancelKeys:
    """``by``: who cancelled them, for their futures' CancelledError."""
    keys: Any
    by: str = "by Client.cancel or Future.cancel in your process"


@dataclass(frozen=True, slots=True)
class Retry:
    """``Client.retry``: each erred task of ``keys`` runs again."""
    keys: Any


@dataclass(frozen=True, slots=True)
class Clear:
    """Everything is forgotten (restart, close): every unfinished future gets ``error``."""
    error: BaseException


# --- requests: answered later by a Deliver or a Reply ---------------------------------------

@dataclass(frozen=True, slots=True)
class Fetch:
    """The client wants the data of ``key``."""
    key: str


@dataclass(frozen=True, slots=True)
class Replicate:
    """Copies of each key's data on ``n`` open workers (all when None)."""
    keys: Any
    n: Optional[int]


@dataclass(frozen=True, slots=True)
class Rebalance:
    """``Client.rebalance``: the moves made are appended to ``moves`` as (key, from, to), for
    the :class:`DropCopies` that follows once the copies are stored."""
    keys: Any
    names: Optional[frozenset]
    moves: list


@dataclass(frozen=True, slots=True)
class DropCopies:
    """After a Rebalance's copies are stored: the original copies let go of."""
    moves: Any


@dataclass(frozen=True, slots=True)
class Call:
    """Run a function on ``worker`` now (``Client.run``), outside the tasks; those of one
    ``queue`` (an actor's calls) in the order they came."""
    worker: str
    fn: bytes
    args: Any
    what: str
    queue: str = ""


@dataclass(frozen=True, slots=True)
class Coordinate:
    """A Lock, Semaphore, Event, Queue or Variable request from a thread of the parent."""
    body: Any


@dataclass(frozen=True, slots=True)
class Withdraw:
    """The parent's thread stopped waiting for ``request`` (a Coordinate)."""
    request: int


# --- an instruction of the door itself ----------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Opened:
    """First of what ``handle`` returns for an event that opens a request: the request id
    its Deliver or Reply will carry."""
    request: int


def opened(instructions: list) -> tuple[int, list]:
    """(the request the first instruction opened, the instructions after it)."""
    first = instructions[0]
    assert type(first) is Opened, f"not an event that opens a request: {first!r}"
    return first.request, instructions[1:]
