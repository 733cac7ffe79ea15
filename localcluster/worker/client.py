"""Tasks that submit tasks: ``get_client``, ``worker_client``, ``secede``, ``rejoin`` and
``get_worker``, with dask's meanings.

In a task, ``get_client()`` returns this process's :class:`TaskClient`: it talks to the
parent's scheduler over the worker's own channel (``Worker.ask`` and ``Worker.tell``,
process.py: an ``Ask`` with one body of protocol.py a meaning), with no socket and no
cluster of its own. The keys it submits are the parent's like any other; each
:class:`TaskFuture` is a reference the parent counts (``scheduler/asking.py``), given back
when the future is garbage-collected. A TaskFuture returned from a task becomes, in the
parent, that Client's Future of the same key.

A TaskClient and its TaskFutures carry the Client's and the Future's names only: the protocol
between them and the cluster (outcomes, references given back, coordination requests) lives
on the :class:`TaskChannel`, found by ``channel_of``, which a task's code never reaches.

Outside a worker (in the user's process) ``get_client()`` is the current Client, found
through the lookup client.py installs (this module sits below it). Loaded by a worker
only when a task first asks for it: the worker's start imports none of this.
"""
from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Mapping
from concurrent.futures import CancelledError
from typing import Any, Callable, Iterator, Optional

from ..wire import protocol as P
from ..wire import serialize
from ..published import NO_DEFAULT, Datasets, Published
from . import api, arguments, context, process
from .future import Future, FutureState, conclude_all
from .holding import KeyTable

__all__ = ["get_client", "worker_client", "secede", "rejoin", "get_worker", "TaskClient", "TaskFuture"]

# client.py installs it: client id (or None: the current one) -> a Client of this process, or None
_parent_lookup: Optional[Callable[[Optional[str]], Any]] = None
_made = threading.Lock()
_client: "Optional[TaskClient]" = None


def install_parent(lookup: Callable[[Optional[str]], Any]) -> None:
    global _parent_lookup
    _parent_lookup = lookup


def in_worker() -> bool:
    """True in a localcluster worker process (a task, or a thread a task started)."""
    return context.current()[0] is not None


def _worker() -> "process.Worker":
    worker = context.current()[0]
    if worker is None:
        raise ValueError("not in a localcluster worker: get_worker(), secede(), rejoin() and worker_client() "
                         "work inside a task (submit a function that calls them)")
    return worker


def get_client(address: Any = None, timeout: Optional[float] = None, resolve_address: bool = True) -> Any:
    """In a task: a client of the cluster that runs it (the same one for every task of this
    worker), talking to the parent's scheduler over this worker's channel. Elsewhere: the
    current Client. ``address`` and ``resolve_address`` are dask's, with no meaning here.

    Raises:
        ValueError: outside a task, when no Client of this process is running.
    """
    global _client
    worker = context.current()[0]
    if worker is None:
        client = _parent_lookup(None) if _parent_lookup is not None else None
        if client is None:
            raise ValueError("No global client found and no address provided: create a localcluster "
                             "Client() first (inside a task, get_client() returns the worker's)")
        return client
    with _made:
        if _client is None:
            _client = TaskClient(worker)
            serialize.install_futures(TaskFuture, _rebuild_in_worker)
        return _client


@contextlib.contextmanager
def worker_client(timeout: Optional[float] = None, separate_thread: bool = True) -> Iterator["TaskClient"]:
    """In a task: ``get_client()``, with the task's thread slot given back meanwhile
    (``secede()``, then ``rejoin()`` on the way out), so that the tasks it waits for can
    run on this worker's threads. A recursive ``fib`` runs on one thread this way."""
    _worker()
    client = get_client()
    if separate_thread:
        secede()
    try:
        yield client
    finally:
        if separate_thread:
            rejoin()


def secede() -> None:
    """Give this task's thread slot back: the worker runs another task meanwhile (one more
    thread), and the scheduler counts the slot free. For a task that waits on others."""
    _worker().secede()


def rejoin() -> None:
    """Take a thread slot again after ``secede()``: waits for one to be free (before any
    queued task), so the worker never runs more tasks at once than it has threads."""
    _worker().rejoin()


class _WorkerData(Mapping):
    """The worker's data as a read-only mapping: key -> value (spilled values come back)."""

    def __init__(self, store: Any):
        self._store = store

    def __getitem__(self, key: str) -> Any:
        if key not in self._store:
            raise KeyError(key)
        return self._store[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._store.keys())

    def __len__(self) -> int:
        return len(self._store.keys())


class TaskWorker:
    """What ``get_worker()`` gives a task: the worker's ``name``, its ``data`` (key -> value
    of what it holds), ``nthreads``, ``pid``, and an ``address`` naming it (dask code reads one)."""

    def __init__(self, worker: "process.Worker"):
        self.name = worker.name
        self.id = worker.name
        self.data = _WorkerData(worker.store)
        self.nthreads = worker.nthreads
        self.pid = os.getpid()
        self.address = f"localcluster://{self.pid}/{worker.name}"

    def __repr__(self) -> str:
        return f"<localcluster worker {self.name!r} pid {self.pid}>"

    def log_event(self, topic: Any, msg: Any) -> None:
        """Log an event from this worker (dask's ``Worker.log_event``): ``Client.log_event``'s, a
        dict message given the worker's name under "worker", as dask's scheduler adds its address."""
        if isinstance(msg, dict):
            msg = {**msg, "worker": self.name}
        get_client().log_event(topic, msg)


def get_worker() -> TaskWorker:
    """The worker running this task: its ``name``, its ``data`` (key -> value of what it
    holds) and an ``address``.

    Raises:
        ValueError: outside a task.
    """
    return TaskWorker(_worker())


def client_in_task(client_id: str) -> Any:
    """A Client unpickled: in a worker, the worker's client (a task that closed over the
    user's Client uses the cluster that runs it); in the parent, that Client again."""
    if in_worker():
        return get_client()
    client = _parent_lookup(client_id) if _parent_lookup is not None else None
    if client is None:
        raise ValueError(f"Client {client_id!r} was unpickled in a process where it does not run (closed, "
                         f"or another process): create a Client here, or use get_client() in a task")
    return client


def _rebuild_in_worker(key: str, client_id: Optional[str] = None) -> "TaskFuture":
    """A Future unpickled in a worker (in a result or a value): one more reference, held here."""
    channel = channel_of(get_client())
    fut = TaskFuture(key, channel.table.take(key)[0])
    channel.tell(P.Hold((key,)))
    return fut


def _rebuild(key: str) -> Any:
    """A TaskFuture unpickled: in a worker, a TaskFuture held there; in the parent, the
    Client's Future of the key (serialize's placeholder: future.py finds its client)."""
    if in_worker():
        return _rebuild_in_worker(key)
    return serialize.resolve_future(key)


def _seq() -> int:
    run = context.current()[1]
    return run.seq if run is not None else 0


class TaskTable(KeyTable[FutureState]):
    """The futures a task's client holds, by key: the state every future of a key shares
    (worker/future.py's, as the Client's), and the futures' Holder in a task. Nothing tells
    it how a key ends: it asks the scheduler (``Results``, ``States``) when a future's
    caller wants to know, or, for a wait or a callback through concurrent.futures, on a
    thread of its own (``watched``)."""

    def __init__(self, channel: "TaskChannel"):
        super().__init__(FutureState)
        self.channel = channel
        self._watching: set = set()       # keys a watching thread asks for (under the lock)

    @property
    def client(self) -> "TaskClient":
        return self.channel.client

    def wait_here(self, state: FutureState, deadline: Optional[float]) -> None:
        """Nothing here: ``wait`` asks."""

    def wait(self, state: FutureState, timeout: Optional[float]) -> bool:
        if not state.done():
            try:
                self.channel.outcomes([state], timeout)
            except TimeoutError:
                pass
        return state.done()

    def ended(self, state: FutureState) -> bool:
        """One round trip to the scheduler; a second for the outcome if it ended there."""
        if self.channel.scheduler_states([state.key])[0] not in _ENDED_THERE:
            return False
        self.channel.outcomes([state], None)
        return True

    def watched(self, state: FutureState) -> None:
        with self.lock:
            if state.key in self._watching:
                return
            self._watching.add(state.key)
        seq = _seq()
        threading.Thread(target=self._watch, args=(state, seq), daemon=True,
                         name=f"localcluster-watch-{state.key}").start()

    def _watch(self, state: FutureState, seq: int) -> None:
        """Ask for the key's outcome on this thread and end its state: wakes the waiters and
        runs the callbacks that concurrent.futures added on its futures."""
        try:
            self.channel.outcomes([state], None, seq, lend=False)
        except Exception as e:  # noqa: BLE001 - the worker is closing: the waiters learn it
            state.conclude("error", e)
        finally:
            with self.lock:
                self._watching.discard(state.key)

    def why_pending(self, key: str) -> str:
        return f"task {key!r} is not done (the scheduler has it {self.channel.scheduler_states([key])[0]})"

    def materialize(self, state: FutureState, kept: Any, deadline: Optional[float],
                    timeout: Optional[float]) -> Any:
        if type(kept) is not P.Payload:     # a task's outcome brings its value: nothing is left elsewhere
            raise AssertionError(f"a task's future of {state.key!r} has no value but {kept!r}")
        return state.swap(kept, serialize.loads(kept))

    def let_go(self, key: str) -> bool:
        """A future of ``key`` was garbage-collected or released: its reference is given back
        (each future holds one in the parent's scheduler). Runs inside the garbage collector."""
        last = super().let_go(key)
        self.channel.worker.drop(key)
        return last

    def reduce(self, key: str) -> tuple:
        return (_rebuild, (key,))


class TaskChannel:
    """The transport of a task's client, which a task's code never reaches (``channel_of``):
    the worker's channel to the parent's scheduler (``Worker.ask`` and ``Worker.tell``), and
    the TaskFutures this process holds by key. The protocol between a TaskClient, its
    TaskFutures and the cluster lives here, as the Client's lives on its FutureTable."""

    here = "the client's process"
    keeps_plain = False         # a task's arguments travel pickled over the channel

    def __init__(self, worker: "process.Worker", client: "TaskClient"):
        self.worker = worker
        self.client = client            # the TaskClient it serves: its futures' client
        self.make = TaskFuture          # a new future: make(key, state=...)
        self.table = TaskTable(self)        # key -> its futures' state
        self._fns: dict[int, tuple] = {}          # id(fn) -> (fn, its Function)

    def tell(self, body: Any) -> None:
        self.worker.tell(body, _seq())

    def ask(self, body: Any) -> Any:
        """The scheduler's answer (a round trip on the channel)."""
        return self.worker.ask(body, _seq())

    def state_of(self, fut: "TaskFuture") -> FutureState:
        """The state ``fut`` shares with the other futures of its key (one read of the dict:
        no lock). Its future holds the key: it is there."""
        return self.table.states[fut.key]

    def outcomes(self, states: list, timeout: Optional[float], seq: Optional[int] = None,
                 lend: bool = True) -> None:
        """End each of ``states`` as its task ended, once each has (one round trip; with
        ``lend``, the task's thread slot is lent meanwhile). Past ``timeout``: TimeoutError."""
        answer = self.worker.ask(P.Results(tuple(s.key for s in states)), _seq() if seq is None else seq,
                                 timeout, lend=lend)
        conclude_all(states, [(status, payload if status == "finished" else serialize.loads_exception(error, s.key))
                              for s, (status, payload, error) in zip(states, answer.data)])

    def scheduler_states(self, keys: list) -> list:
        """The scheduler's state of each key (memory, erred, processing ...)."""
        return list(self.ask(P.States(tuple(keys))).data)

    def coordinate(self, body: Any, timeout: Optional[float] = None) -> Any:
        """A Lock, Event, Queue ... request (coordination.py): the scheduler's answer; once
        ``timeout`` s have passed, what a timeout means for it (the request is withdrawn)."""
        return self.worker.ask(body, _seq(), timeout, withdraw=True).data

    def give_back(self, keys: tuple) -> None:
        """One reference less to each key: those handed to this worker with a queued value."""
        self.tell(P.Drop(tuple(keys)))

    # --- the Client API's transport (worker/api.py) ------------------------------------------

    @property
    def future(self) -> type:
        """The class of a task's futures."""
        return TaskFuture

    def check(self) -> None:
        """Nothing to check: the worker's channel lives as long as the task."""

    def worker_names(self, workers: Any, strict: bool) -> frozenset:
        """Checked as the Client checks them; ``strict``: against the workers running now
        (one round trip)."""
        return arguments.worker_names(workers, self._running_names if strict else None)

    def _running_names(self) -> list:
        return [name for name, _, _ in self.workers()[1]]

    def function(self, fn: Callable, pure: bool) -> api.Function:
        entry = self._fns.get(id(fn))
        if entry is not None and entry[0] is fn:
            return entry[1]
        try:
            data = serialize.pickle_function(fn)
        except Exception as e:
            raise TypeError(f"could not pickle the function {serialize.describe(fn)}: "
                            f"{type(e).__name__}: {e}") from e
        how = api.Function(0, data, arguments.name_of(fn), arguments.hash_function(data), None)
        if len(self._fns) > 256:
            self._fns.clear()
        self._fns[id(fn)] = (fn, how)
        return how

    def task(self, how: api.Function, key: str, payload: Any, found: dict, opts: api.Options) -> P.NewTask:
        return P.NewTask(key, how.fn_bytes, payload, tuple(found), opts.priority, opts.retries, opts.timeout,
                         opts.workers, opts.loose, opts.resources)

    def many(self, items: list, opts: api.Options, how: api.Function) -> None:
        return None

    def from_journal(self, fn: Callable, items: list, kwargs: dict, keys: list, opts: api.Options,
                     prefix: Optional[str], make: Callable[..., Any]) -> None:
        return None     # the journal is the user's process's

    def actor(self, fn: Callable, args: tuple, kwargs: dict) -> tuple:
        raise NotImplementedError("submit(actor=True) in a task: an actor is made by a Client of your own "
                                  "process; pass its handle to the task, whose calls of it work there")

    def send(self, tasks: list, opts: api.Options) -> list:
        # made before the message: a reply may not outrun them
        futures = self.table.take_many([t.key for t in tasks], self.make)[0]
        self.tell(P.Submit(tuple(tasks)))
        return futures

    def scatter(self, items: list, workers: Optional[frozenset], broadcast: bool, loose: bool) -> list:
        """As the Client's: the scheduler places the data by ``workers`` and ``loose``."""
        futures = self.table.take_many([k for k, _ in items], self.make)[0]
        self.tell(P.Scatter(tuple(items), broadcast, None if workers is None else tuple(sorted(workers)), loose))
        return futures

    def cancel(self, futures: list) -> None:
        self.tell(P.CancelKeys(tuple(f.key for f in futures)))
        for f in futures:
            # the scheduler's words (scheduler/forgetting.py), as a future of the user's process has them
            self.state_of(f).conclude("cancelled", CancelledError(
                f"Task {f.key!r} was cancelled by a task (cancel in the task), and its data is let go of: "
                f"submit it again to compute it."))

    def who_has(self, keys: Optional[tuple]) -> dict:
        return dict(self.ask(P.WhoHas(keys)).data)

    def run(self, fn_bytes: bytes, payload: Any, workers: Optional[frozenset], name: str,
            wait: bool) -> Optional[Iterator[tuple]]:
        body = P.RunOn(fn_bytes, payload, None if workers is None else tuple(sorted(workers)), name)
        if not wait:
            self.tell(body)
            return None
        answer = self.ask(body)
        if answer.error is not None:
            raise serialize.loads_exception(answer.error, f"run({name})")
        return ((worker, functools.partial(_ran, name, worker, *outcome)) for worker, outcome in answer.data)

    def workers(self) -> tuple:
        workers = self.ask(P.Info()).data
        return {"address": f"localcluster://{os.getppid()}"}, [
            (name, threads, functools.partial(dict, type="Worker", id=name, name=name, host="localhost",
                                              nthreads=threads, resources=resources))
            for name, threads, resources in workers]

    def wait(self, futures: list, timeout: Optional[float], deadline: Optional[float]) -> None:
        pending = [s for s in map(self.state_of, futures) if not s.done()]
        if pending:
            self.outcomes(pending, timeout)

    def values(self, futures: list, timeout: Optional[float], deadline: Optional[float]) -> Callable[[Any], Any]:
        return Future.result      # every outcome is here, its value with it


# Each task's client's channel by the client's id: found by ``channel_of``, never on the
# TaskClient or the TaskFuture a task holds.
_channels: "dict[str, TaskChannel]" = {}


def channel_of(client: Any) -> TaskChannel:
    """The transport of ``client``, a task's client (``get_client()`` in a worker)."""
    return _channels[client.id]


def ended_here(fut: "TaskFuture") -> bool:
    """Whether ``fut``'s key is known to have ended, without asking the scheduler."""
    return channel_of(fut.client).state_of(fut).done()


def actor_call(client: Any, fn: Callable, args: tuple, worker: str) -> Any:
    """An actor's method call or attribute read from a task: ``fn(*args)`` on ``worker``."""
    answers = client.run(fn, *args, workers=[worker])
    assert answers is not None      # wait=True: the answers are at hand
    return answers[worker]


class TaskFuture(Future):
    """A key submitted from a task (``TaskClient.submit``): a Future as the Client's are
    (worker/future.py), asking the parent's scheduler how its task ended when asked itself.
    One reference to the key while it lives; pickled (returned from the task, or passed in
    another's arguments) it stays the same key. Made as ``TaskFuture(key, state)``, ``state``
    taken for it from its client's TaskTable."""


class TaskClient:
    """The client of a task (``get_client()`` in a worker): dask's submit, map, gather,
    scatter, cancel, run, who_has and scheduler_info, each a message to the parent's
    scheduler over the worker's channel."""

    def __init__(self, worker: "process.Worker"):
        self.id = f"task-client-{worker.name}-{os.getpid()}"
        self.status = "running"
        self._worker_name = worker.name
        self._channel = _channels[self.id] = TaskChannel(worker, self)
        self._api = api.ClientApi(self._channel)     # the calls, written once for this client and the Client's
        self._published = Published(self._ask, self._channel.give_back)     # datasets and events

    def __repr__(self) -> str:
        return f"<TaskClient of worker {self._worker_name!r}: the cluster's scheduler over its channel>"

    def __enter__(self) -> "TaskClient":
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def close(self) -> None:
        """Nothing to close: the worker's channel is the worker's."""

    def submit(self, fn: Callable, /, *args: Any, key: Optional[str] = None, pure: bool = True, retries: int = 0,
               timeout: Optional[float] = None, priority: int = 0, workers: Any = None,
               allow_other_workers: bool = False, resources: Optional[dict] = None, **kwargs: Any) -> TaskFuture:
        """As ``Client.submit``: ``fn(*args, **kwargs)`` on the cluster; a TaskFuture (one
        implementation for both: worker/api.py)."""
        return self._api.submit(fn, args, kwargs, key, pure, retries, timeout, priority, workers,
                                allow_other_workers, resources)

    def map(self, fn: Callable, /, *iterables: Any, key: Any = None, pure: bool = True, retries: int = 0,
            timeout: Optional[float] = None, priority: int = 0, workers: Any = None,
            allow_other_workers: bool = False, resources: Optional[dict] = None, **kwargs: Any) -> list:
        """As ``Client.map``: one task per item, sent in one message."""
        return self._api.map(fn, iterables, kwargs, key, pure, retries, timeout, priority, workers,
                             allow_other_workers, resources)

    def gather(self, futures: Any, errors: str = "raise", timeout: Optional[float] = None, **kwargs: Any) -> Any:
        """As ``Client.gather``: the results of (nested lists, tuples and dicts of) futures."""
        return self._api.gather(futures, errors, timeout)

    def scatter(self, data: Any, broadcast: bool = False, workers: Any = None, allow_other_workers: bool = False,
                **kwargs: Any) -> Any:
        """As ``Client.scatter``: data placed on the cluster's workers; futures of it."""
        return self._api.scatter(data, broadcast, workers, allow_other_workers)

    def cancel(self, futures: Any, force: bool = False, **kwargs: Any) -> None:
        """As ``Client.cancel``: these futures' tasks are cancelled and their data let go
        of, for every holder (what dask calls ``force=True``, as ``Client.cancel`` does)."""
        self._api.cancel(futures)

    def run(self, function: Callable, /, *args: Any, workers: Any = None, wait: bool = True, nanny: bool = False,
            on_error: str = "raise", **kwargs: Any) -> Optional[dict]:
        """As ``Client.run``: ``function(*args, **kwargs)`` on every worker (or those named)
        now, outside the task slots, on a thread of its own there (this worker's too: no
        deadlock); ``{worker name: result}``. Errors as ``on_error`` says; a worker that dies
        meanwhile gives KilledWorker. ``wait=False``: None at once, the calls go on."""
        return self._api.run(function, args, kwargs, workers, wait, nanny, on_error)

    def who_has(self, futures: Any = None, **kwargs: Any) -> dict:
        """As ``Client.who_has``: key -> the names of the workers holding its data (every key
        the cluster knows when ``futures`` is None)."""
        return self._api.who_has(futures)

    def scheduler_info(self, n_workers: int = -1, **kwargs: Any) -> dict:
        """As ``Client.scheduler_info``, with what a task can know: each open worker (keyed by
        name) with its name, threads and resources; ``n_workers``: at most that many (-1: all)."""
        return self._api.scheduler_info(n_workers)

    # --- datasets and events, as the Client's (published.py) --------------------------------

    def publish_dataset(self, *args: Any, name: Any = None, override: bool = False, **kwargs: Any) -> None:
        self._published.publish(args, name, override, kwargs)

    def get_dataset(self, name: Any, default: Any = NO_DEFAULT, **kwargs: Any) -> Any:
        return self._published.get(name, default)

    def list_datasets(self, **kwargs: Any) -> list:
        return self._published.names()

    def unpublish_dataset(self, name: Any, **kwargs: Any) -> None:
        self._published.unpublish(name)

    @property
    def datasets(self) -> Datasets:
        return Datasets(self._published)

    def log_event(self, topic: Any, msg: Any) -> None:
        self._published.log_event(topic, msg)

    def get_events(self, topic: Optional[str] = None) -> Any:
        return self._published.get_events(topic)

    def _ask(self, body: Any, timeout: Optional[float]) -> Any:
        answer = self._channel.coordinate(body, timeout)
        if isinstance(answer, BaseException):
            raise answer
        return answer



_ENDED_THERE = frozenset({"memory", "erred", "lost", "released", "unknown"})     # the scheduler's states of an ended key


def wait(fs: list, timeout: Optional[float], return_when: str) -> tuple:
    """``wait`` for futures a task holds: (done, not_done), or TimeoutError past ``timeout``.
    The results come with the answer, so a ``result()`` after it costs no round trip; the task
    gives its slot back while it waits (``Worker.ask``'s lend). FIRST_COMPLETED and
    FIRST_EXCEPTION return at once when one is done (or failed) already, else once all are."""
    distinct = list(dict.fromkeys(fs))
    pending = [f for f in distinct if not ended_here(f)]
    if pending and return_when != "ALL_COMPLETED":
        states = channel_of(pending[0].client).scheduler_states([f.key for f in pending])
        ended = [f for f, state in zip(pending, states) if state in _ENDED_THERE]
        failed = any(f.status != "finished" for f in distinct if ended_here(f)) or \
            any(state in _ENDED_THERE and state != "memory" for state in states)
        if failed or (return_when == "FIRST_COMPLETED" and (ended or len(pending) < len(distinct))):
            pending = ended             # their outcomes are there: no wait
    if pending:
        channel = channel_of(pending[0].client)
        channel.outcomes([channel.state_of(f) for f in pending], timeout)
    done = {f for f in distinct if ended_here(f)}
    return done, set(distinct) - done


def _ran(name: str, worker: str, status: str, data: Any, error: Any) -> Any:
    """What ``run`` of ``name`` gave on ``worker``: its value, or its error raised."""
    if status != "finished":
        raise serialize.loads_exception(error, f"run({name}) on {worker!r}")
    return serialize.loads(data)

