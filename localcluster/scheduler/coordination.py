"""Lock, Semaphore, Event, Queue and Variable, kept by the scheduler: a part of the Scheduler
(composition: same thread, same lock, no I/O, no clock).

Askers. A request comes from a task (its worker, the worker's request id, the asking run's
seq) or from a thread of the parent (no worker; the scheduler's request id). It is answered
with a ``Send`` of an ``Answer`` to that worker, or a ``Reply`` to the parent's request.

Timeouts. There is no clock here: an asker that stops waiting says so (``Withdraw``), and
its request is answered then with what a timeout means for it (False, None). A request
already answered is not answered again: the asker waits for the answer on its way.

Deaths. A worker's death gives back the leases its tasks took (the next waiters get them, in
order) and forgets its tasks' waiting requests and the items they were putting.
``held_by(worker)`` names what the dead worker held, for its death's message.

Datasets and events. Datasets are named values with futures, as a variable's; the event log
keeps the last EVENTS_KEPT events of each topic, across restarts, and answers a subscriber
(``NextEvents``) when one comes after those it has seen. Worker deaths are logged too.

Futures in values. The futures inside a queued item or a variable's value are held while
the value is there (``hold``: each key counts once more in its task's ``wanted``; what is kept
here is a token of that reference, (Task, its cancels), so that a task cancelled meanwhile,
and then run again for a dependent or submitted again, is never let go of twice). A get hands one reference per key to the asker
(``hand_over``): a task's worker holds it in Asking's books until it has made its own futures
and drops it; the parent's thread releases it.
"""
from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ..wire import protocol as P
from .records import Reply, Send, Task


@dataclass(frozen=True, slots=True)
class Asker:
    """Who waits for an answer: a task on ``worker`` (its request id and run), or the
    parent (``worker`` None, the scheduler's request id)."""
    worker: Optional[str]
    request: int
    seq: int = 0

    def answer(self, value: Any) -> Any:
        if self.worker is None:
            return Reply(self.request, value)
        return Send(self.worker, P.Answer(self.request, value))

    def where(self) -> str:
        return "the client" if self.worker is None else f"a task on {self.worker}"


@dataclass(eq=False)
class _Semaphore:
    max_leases: int
    held: dict = field(default_factory=dict)        #: lease id -> Asker that took it
    waiting: deque = field(default_factory=deque)   #: (Asker, lease id), first come first served


@dataclass(eq=False)
class _Event:
    flag: bool = False
    waiting: list = field(default_factory=list)     #: Askers; only while the flag is down


@dataclass(eq=False)
class _Queue:
    maxsize: int
    items: deque = field(default_factory=deque)     #: (Payload, tokens of the references held: (Task, cancels))
    getters: deque = field(default_factory=deque)   #: (Asker, batch); only while they cannot be served
    putters: deque = field(default_factory=deque)   #: (Asker, item); only while the queue is full


@dataclass(eq=False)
class _Topic:
    """The event log of one topic (dask's ``log_event``): the last EVENTS_KEPT events, and
    how many were ever logged (a subscriber asks for those after the ones it has seen)."""
    entries: deque = field(default_factory=lambda: deque(maxlen=EVENTS_KEPT))    #: (time, Payload)
    count: int = 0
    listeners: list = field(default_factory=list)   #: (Asker, how many it has seen), waiting for more


#: events kept of each topic (dask keeps the last 100,000 of each: distributed.admin.low-level-log-length)
EVENTS_KEPT = 100_000

_TIMED_OUT = {"semaphore": False, "event": False, "put": False, "get": None, "variable": None, "events": None}


class Coordination:
    def __init__(self, task: Callable[[str], Optional[Task]], release: Callable[[list], list],
                 held: Callable[[str, list, Optional[str]], None], key_of: Callable[[int], Optional[str]]):
        self._task = task              # the scheduler's tasks.get
        self._release_keys = release   # the scheduler's letting go (a Drop): one reference less to each key
        self._held = held              # Asking.hold: a task's worker holds these references
        self._key_of = key_of          # the key a run (seq) runs
        #: (kind, name) -> _Semaphore; a Lock is kind "lock". Dropped when nothing is held or waits
        self.semaphores: dict[tuple, _Semaphore] = {}
        #: name -> _Event; dropped when down with no waiter
        self.events: dict[str, _Event] = {}
        #: name -> _Queue; dropped when empty with no waiter
        self.queues: dict[str, _Queue] = {}
        #: name -> (Payload, tokens of the references held) of each variable set
        self.variables: dict[str, tuple] = {}
        #: name -> Askers waiting for the variable to be set
        self.unset: dict[str, list] = {}
        #: (worker, request) -> (what, name) of every request waiting, for Withdraw
        self.waits: dict[tuple, tuple] = {}
        #: name -> (Payload, tokens of the references held) of each dataset published (dask's datasets)
        self.datasets: dict = {}
        #: topic -> _Topic: the event log (dask's log_event), kept across restarts as dask's is
        self.topics: dict[str, _Topic] = {}

    # --- requests ---------------------------------------------------------------------------

    def asked(self, asker: Asker, body: Any) -> list:
        t = type(body)
        if t is P.Acquire:
            return self._acquire(asker, body)
        if t is P.Release:
            return self._release(asker, body)
        if t is P.Leases:
            sem = self.semaphores.get((body.kind, body.name))
            return [asker.answer(len(sem.held) if sem is not None else 0)]
        if t is P.SetEvent:
            return self._set_event(body.name, body.flag) + [asker.answer(None)]
        if t is P.WaitEvent:
            ev = self.events.get(body.name)
            if ev is not None and ev.flag:
                return [asker.answer(True)]
            if not body.wait:
                return [asker.answer(False)]
            self.events.setdefault(body.name, _Event()).waiting.append(asker)
            self._waiting(asker, "event", body.name)
            return []
        if t is P.QueuePut:
            return self._put(asker, body)
        if t is P.QueueGet:
            return self._get(asker, body)
        if t is P.QueueSize:
            q = self.queues.get(body.name)
            return [asker.answer(len(q.items) if q is not None else 0)]
        if t is P.SetVariable:
            return self._set_variable(body) + [asker.answer(None)]
        if t is P.GetVariable:
            value = self.variables.get(body.name)
            if value is not None:
                return [asker.answer(self._given(asker, value))]
            self.unset.setdefault(body.name, []).append(asker)
            self._waiting(asker, "variable", body.name)
            return []
        if t is P.Withdraw:
            return self.withdraw(Asker(asker.worker, body.request, asker.seq))
        if t in _PUBLISHED:
            return self._published(asker, body)
        raise TypeError(f"not a coordination request: {body!r}")

    def withdraw(self, asker: Asker) -> list:
        """``asker`` stopped waiting: answer it now with what a timeout means, unless it was
        answered already (then nothing: the answer is on its way)."""
        entry = self.waits.pop((asker.worker, asker.request), None)
        if entry is None:
            return []
        what, name = entry
        return self._unwait(asker, what, name) + [asker.answer(_TIMED_OUT[what])]

    def _unwait(self, asker: Asker, what: str, name: Any, feed: bool = True) -> list:
        """Take ``asker``'s waiting request out of its queue of waiters (its index entry is
        gone already), letting go of the item it was putting; a container left with nothing
        is dropped, and (``feed``) a queue serves the next getter it now can."""
        out: list = []
        if what == "semaphore":
            sem = self.semaphores[name]
            sem.waiting = deque(w for w in sem.waiting if not _same(w[0], asker))
            self._tidy_semaphore(name, sem)
        elif what == "event":
            ev = self.events[name]
            ev.waiting = [w for w in ev.waiting if not _same(w, asker)]
            if not ev.flag and not ev.waiting:
                del self.events[name]
        elif what in ("get", "put"):
            q = self.queues[name]
            q.getters = deque(g for g in q.getters if not _same(g[0], asker))
            for p in [p for p in q.putters if _same(p[0], asker)]:
                q.putters.remove(p)
                out += self._let_go(list(p[1][1]))
            if feed:                        # a getter of a batch gone: the next may be served now
                out += self._feed(name, q)
        elif what == "events":
            topic = self.topics[name]
            topic.listeners = [w for w in topic.listeners if not _same(w[0], asker)]
        else:
            waiting = [w for w in self.unset[name] if not _same(w, asker)]
            if waiting:
                self.unset[name] = waiting
            else:
                del self.unset[name]
        return out


    # --- Lock and Semaphore -------------------------------------------------------------

    def _acquire(self, asker: Asker, body: Any) -> list:
        name = (body.kind, body.name)
        sem = self.semaphores.get(name)
        if sem is None:
            sem = self.semaphores[name] = _Semaphore(body.max_leases)
        elif sem.max_leases != body.max_leases:
            return [asker.answer(ValueError(
                f"{body.kind.capitalize()} {body.name!r} exists with max_leases={sem.max_leases}; this one asks "
                f"max_leases={body.max_leases}. Use one max_leases per name, or another name."))]
        if body.lease in sem.held:
            return [asker.answer(True)]
        if len(sem.held) < sem.max_leases and not sem.waiting:
            sem.held[body.lease] = asker
            return [asker.answer(True)]
        if not body.wait:
            self._tidy_semaphore(name, sem)
            return [asker.answer(False)]
        sem.waiting.append((asker, body.lease))
        self._waiting(asker, "semaphore", name)
        return []

    def _release(self, asker: Asker, body: Any) -> list:
        name = (body.kind, body.name)
        sem = self.semaphores.get(name)
        if sem is None or sem.held.pop(body.lease, None) is None:
            return [asker.answer(False)]
        return [asker.answer(True)] + self._grant(name, sem)

    def _grant(self, name: tuple, sem: _Semaphore) -> list:
        out = []
        while sem.waiting and len(sem.held) < sem.max_leases:
            asker, lease = sem.waiting.popleft()
            del self.waits[(asker.worker, asker.request)]
            sem.held[lease] = asker
            out.append(asker.answer(True))
        self._tidy_semaphore(name, sem)
        return out

    def _tidy_semaphore(self, name: tuple, sem: _Semaphore) -> None:
        if not sem.held and not sem.waiting:
            del self.semaphores[name]

    # --- Event --------------------------------------------------------------------------

    def _set_event(self, name: str, flag: bool) -> list:
        ev = self.events.get(name)
        if not flag:
            if ev is not None:
                ev.flag = False
                if not ev.waiting:
                    del self.events[name]
            return []
        if ev is None:
            ev = self.events[name] = _Event()
        ev.flag = True
        waiting, ev.waiting = ev.waiting, []
        for asker in waiting:
            del self.waits[(asker.worker, asker.request)]
        return [asker.answer(True) for asker in waiting]

    # --- Queue --------------------------------------------------------------------------

    def _put(self, asker: Asker, body: Any) -> list:
        q = self.queues.get(body.name)
        if q is None:
            q = self.queues[body.name] = _Queue(max(0, body.maxsize))
        item = (body.value, self._hold(body.keys))
        if q.maxsize and len(q.items) >= q.maxsize:
            q.putters.append((asker, item))
            self._waiting(asker, "put", body.name)
            return []
        q.items.append(item)
        return [asker.answer(True)] + self._feed(body.name, q)

    def _get(self, asker: Asker, body: Any) -> list:
        q = self.queues.get(body.name)
        if body.batch < 0:         # everything there now, never waiting
            if q is None:
                return [asker.answer(())]
            items = tuple(q.items)
            q.items.clear()
            return [asker.answer(self._handed(asker, items))] + self._feed(body.name, q)
        if q is None:
            q = self.queues[body.name] = _Queue(0)
        q.getters.append((asker, body.batch))
        self._waiting(asker, "get", body.name)
        return self._feed(body.name, q)

    def _feed(self, name: str, q: _Queue) -> list:
        """Move waiting puts in while there is room, and serve waiting gets in order while
        there are items enough for the first."""
        out: list = []
        while True:
            while q.putters and (not q.maxsize or len(q.items) < q.maxsize):
                asker, item = q.putters.popleft()
                del self.waits[(asker.worker, asker.request)]
                q.items.append(item)
                out.append(asker.answer(True))
            if not q.getters or len(q.items) < max(1, q.getters[0][1]):
                break
            asker, batch = q.getters.popleft()
            del self.waits[(asker.worker, asker.request)]
            items = tuple(q.items.popleft() for _ in range(max(1, batch)))
            out.append(asker.answer(self._handed(asker, items)))
        if not q.items and not q.getters and not q.putters:
            del self.queues[name]
        return out

    def _handed(self, asker: Asker, items: tuple) -> tuple:
        """Items leaving the queue, as ``(Payload, keys)``: the references the queue held go
        to the asker."""
        return tuple((payload, self._hand_over(asker, held, False) if held else ()) for payload, held in items)

    # --- Variable -----------------------------------------------------------------------

    def _set_variable(self, body: Any) -> list:
        old = self.variables.pop(body.name, None)
        out = self._let_go(list(old[1])) if old is not None and old[1] else []
        if body.value is None:
            return out
        value = self.variables[body.name] = (body.value, self._hold(body.keys))
        for asker in self.unset.pop(body.name, []):
            del self.waits[(asker.worker, asker.request)]
            out.append(asker.answer(self._given(asker, value)))
        return out

    def _given(self, asker: Asker, value: tuple) -> tuple:
        """The variable's value for ``asker``, as ``(Payload, keys)``: its futures held once
        more, for the asker."""
        return (value[0], self._hand_over(asker, value[1], True) if value[1] else ())

    # --- datasets and the event log (dask's publish_dataset, log_event) ----------------------

    def _published(self, asker: Asker, body: Any) -> list:
        t = type(body)
        if t is P.PublishDataset:
            if body.name in self.datasets and not body.override:
                return [asker.answer(False)]
            old = self.datasets.pop(body.name, None)
            self.datasets[body.name] = (body.value, self._hold(body.keys))
            return (self._let_go(list(old[1])) if old is not None else []) + [asker.answer(True)]
        if t is P.GetDataset:
            value = self.datasets.get(body.name)
            return [asker.answer(None if value is None else self._given(asker, value))]
        if t is P.ListDatasets:
            return [asker.answer(tuple(self.datasets))]
        if t is P.UnpublishDataset:
            old = self.datasets.pop(body.name, None)
            return (self._let_go(list(old[1])) if old is not None else []) + [asker.answer(old is not None)]
        if t is P.LogEvent:
            return self.log(body.topics, body.time, body.msg) + [asker.answer(None)]
        if t is P.GetEvents:
            if body.topic is None:
                return [asker.answer({name: tuple(topic.entries) for name, topic in self.topics.items()
                                      if topic.entries})]
            topic = self.topics.get(body.topic)
            return [asker.answer(tuple(topic.entries) if topic is not None else ())]
        topic = self.topics.get(body.topic)        # NextEvents
        if body.seen < 0:           # how many were logged until now
            return [asker.answer((topic.count if topic is not None else 0, ()))]
        topic = topic if topic is not None else self.topics.setdefault(body.topic, _Topic())
        if topic.count > body.seen:
            return [asker.answer(_after(topic, body.seen))]
        topic.listeners.append((asker, body.seen))
        self._waiting(asker, "events", body.topic)
        return []

    def log(self, topics: tuple, time: float, msg: Any) -> list:
        """An event (``msg``, a Payload) under each of ``topics``; its subscribers are answered."""
        out: list = []
        for name in topics:
            topic = self.topics.setdefault(name, _Topic())
            topic.entries.append((time, msg))
            topic.count += 1
            for asker, seen in topic.listeners:
                del self.waits[(asker.worker, asker.request)]
                out.append(asker.answer(_after(topic, seen)))
            topic.listeners = []
        return out

    # --- references to the futures inside values ------------------------------------------

    def _hold(self, keys: tuple) -> tuple:
        """One more reference to each known key; its token is (its Task, the cancels it went
        through), so that a task cancelled meanwhile (every reference dropped), and then run
        again for a dependent, or submitted again (another Task), is told apart."""
        held = []
        for key in keys:
            ts = self._task(key)
            if ts is not None and ts.state != "released":
                ts.hold()
                held.append((ts, ts.cancels))
        return tuple(held)

    def _live(self, token: tuple) -> bool:
        """Whether a reference token still counts in its task's ``wanted``: not once its task
        was cancelled, which drops every reference."""
        ts, cancels = token
        return self._task(ts.key) is ts and ts.cancels == cancels

    def _let_go(self, held: list) -> list:
        """Release the references ``_hold`` took, of tasks still known as they were."""
        return self._release_keys([t[0].key for t in held if self._live(t)])

    def _hand_over(self, asker: Asker, held: tuple, again: bool) -> tuple:
        """The references ``held`` (``again``: one more of each) are ``asker``'s now: a task's
        worker keeps them in Asking's books until it drops them. Returns their keys."""
        live = [t[0] for t in held if self._live(t)]
        keys = [ts.key for ts in live]
        if again:
            for ts in live:
                ts.hold()
        if asker.worker is not None and keys:
            self._held(asker.worker, keys, self._key_of(asker.seq))
        return tuple(keys)

    # --- deaths and restarts ------------------------------------------------------------

    def _waiting(self, asker: Asker, what: str, name: Any) -> None:
        self.waits[(asker.worker, asker.request)] = (what, name)

    def held_by(self, worker: str) -> Optional[str]:
        """What the tasks of ``worker`` held, for its death's message (None: nothing)."""
        parts = [f"{kind.capitalize()} {name!r}" + (f" ({sum(1 for a in sem.held.values() if a.worker == worker)} "
                                                     f"of {sem.max_leases} leases)" if kind != "lock" else "")
                 for (kind, name), sem in sorted(self.semaphores.items())
                 if any(a.worker == worker for a in sem.held.values())]
        if not parts:
            return None
        return (f"Its tasks held {', '.join(parts)}: released with the death, so that the tasks waiting for "
                f"them go on.")

    def worker_gone(self, worker: str) -> list:
        """``worker`` died: its tasks' leases go to the next waiters, and their waiting
        requests (and the items they were putting) are forgotten."""
        return self._workers_gone({worker})

    def _workers_gone(self, workers: set) -> list:
        """The tasks of ``workers`` are gone. Every request and lease of theirs goes first, and
        only then are the leases granted and the queues fed: a lease or an item never goes to
        a request of one of them (answered, then forgotten with its worker)."""
        out: list = []
        fed: set = set()
        for key in [k for k in self.waits if k[0] in workers]:
            what, name = self.waits.pop(key)
            out += self._unwait(Asker(key[0], key[1]), what, name, feed=False)
            if what in ("get", "put"):
                fed.add(name)
        for name, sem in list(self.semaphores.items()):
            for lease in [lease for lease, a in sem.held.items() if a.worker in workers]:
                del sem.held[lease]
            out += self._grant(name, sem)
        for name in sorted(fed):
            q = self.queues.get(name)
            if q is not None:
                out += self._feed(name, q)
        return out

    def clear(self) -> list:
        """Every task is forgotten (restart; the caller has dropped every task already): the
        workers go, and with them every lease and request of their tasks; the futures inside
        values are forgotten (their keys no longer exist). What the parent's threads hold and
        wait for stays: a lease freed goes to the next of them."""
        workers = {k[0] for k in self.waits if k[0] is not None}
        workers |= {a.worker for sem in self.semaphores.values() for a in sem.held.values() if a.worker is not None}
        for q in self.queues.values():
            q.items = deque((p, ()) for p, _k in q.items)
            q.putters = deque((a, (p, ())) for a, (p, _k) in q.putters)
        self.variables = {n: (p, ()) for n, (p, _k) in self.variables.items()}
        self.datasets = {n: (p, ()) for n, (p, _k) in self.datasets.items()}
        return self._workers_gone(workers)

    # --- invariants ---------------------------------------------------------------------

    def validate(self) -> None:
        """AssertionError naming the first broken rule."""
        def counted(token: tuple) -> bool:      # in its task's wanted, or its task was cancelled
            return not self._live(token) or token[0].wanted > 0

        waiting: dict = {}
        for name, sem in self.semaphores.items():
            assert sem.held or sem.waiting, f"semaphore {name} kept with nothing held or waiting"
            assert len(sem.held) <= sem.max_leases, f"semaphore {name}: {len(sem.held)} leases > {sem.max_leases}"
            assert not sem.waiting or len(sem.held) == sem.max_leases, f"semaphore {name}: waiters with a lease free"
            for asker, _lease in sem.waiting:
                waiting[(asker.worker, asker.request)] = ("semaphore", name)
        for name, ev in self.events.items():
            assert ev.flag or ev.waiting, f"event {name!r} kept down with no waiter"
            assert not (ev.flag and ev.waiting), f"event {name!r} set with waiters"
            for asker in ev.waiting:
                waiting[(asker.worker, asker.request)] = ("event", name)
        for name, q in self.queues.items():
            assert q.items or q.getters or q.putters, f"queue {name!r} kept empty with no waiter"
            assert not q.getters or len(q.items) < max(1, q.getters[0][1]), f"queue {name!r}: a getter could be served"
            assert not q.putters or (q.maxsize and len(q.items) >= q.maxsize), f"queue {name!r}: a put could go in"
            for asker, _batch in q.getters:
                waiting[(asker.worker, asker.request)] = ("get", name)
            for asker, (_payload, keys) in q.putters:
                waiting[(asker.worker, asker.request)] = ("put", name)
            for _payload, held in list(q.items) + [item for _a, item in q.putters]:
                for token in held:
                    assert counted(token), f"queue {name!r} holds {token[0]!r}, which nothing counts as wanted"
        for name, askers in self.unset.items():
            assert askers and name not in self.variables, f"variable {name!r}: waiters while set, or none kept"
            for asker in askers:
                waiting[(asker.worker, asker.request)] = ("variable", name)
        for kind, values in (("variable", self.variables), ("dataset", self.datasets)):
            for name, (_payload, held) in values.items():
                for token in held:
                    assert counted(token), f"{kind} {name!r} holds {token[0]!r}, which nothing counts as wanted"
        for name, topic in self.topics.items():
            for asker, seen in topic.listeners:
                assert seen >= topic.count, f"topic {name!r}: a subscriber waits for events logged already"
                waiting[(asker.worker, asker.request)] = ("events", name)
        assert waiting == self.waits, f"the index of waiting requests is off: {self.waits} != {waiting}"


_PUBLISHED = frozenset({P.PublishDataset, P.GetDataset, P.ListDatasets, P.UnpublishDataset, P.LogEvent, P.GetEvents,
                        P.NextEvents})


def _after(topic: _Topic, seen: int) -> tuple:
    """(events ever logged, those after the first ``seen`` that are still kept)."""
    new = min(topic.count - seen, len(topic.entries))
    return topic.count, tuple(reversed(list(itertools.islice(reversed(topic.entries), new))))


def _same(a: Asker, b: Asker) -> bool:
    return a.worker == b.worker and a.request == b.request
