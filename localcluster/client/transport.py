"""The Client's transport (worker/api.py's ``Transport``): how the calls of the Client API,
written once in worker/api.py, reach the cluster from the user's process: through the
cluster's Gateway in this process, with the client's Futures kept on its FutureTable.

Here too is what only the user's process has: the journal (a pure task whose entry it holds
finishes at once, read when asked for), workers= checked against the live cluster, resources
checked against what the workers declare, actors made, and the making of a plain ``map``'s
tasks in one loop.
"""
from __future__ import annotations

import functools
import hashlib
import os
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional

from .. import journal as _journal
from ..scheduler.records import Spec, Terms
from ..wire import serialize
from ..worker import actors as _actors
from ..worker.api import Function, Options
from . import waiting as _waiting
from ..worker.future import FutureState
from .future import Future
from .specs import Specs, new_fn_id, terms_of

if TYPE_CHECKING:
    from ..gateway import Gateway
    from .future import FutureTable


class GatewayTransport:
    """The Client API's transport in the user's process. Used by the user threads that call
    its Client, without a lock of its own (the table and the gateway take theirs)."""

    future = Future
    here = "this process"
    keeps_plain = True

    def __init__(self, client: Any, gateway: Gateway, table: FutureTable, check: Callable[[], None]):
        self._client = client          # the Client: its id and cluster
        self._gateway = gateway        # the cluster's internal protocol
        self._table = table            # key -> the state its Futures share
        self.check = check             # the Client's: raises if it is closed (or a fork's)
        self.specs = Specs()           # functions pickled once
        self._journal = gateway.journal          # the cluster's journal.Keeper, or None
        #: key -> (the Spec that reads it, its own Spec) of a task this client's futures finished
        #: from the journal, not given to the scheduler (until a task needs it as an input, or
        #: its entry is damaged)
        self._from_journal: dict = {}

    # --- submit and map ------------------------------------------------------------------

    def worker_names(self, workers: Any, strict: bool) -> frozenset:
        return self._gateway.check_worker_names(workers, strict)

    def function(self, fn: Callable, pure: bool) -> Function:
        return self.specs.how(fn, pure)

    def task(self, how: Function, key: str, payload: Any, found: dict, opts: Options) -> Spec:
        if found:
            foreign = [k for k, owner in found.items() if owner != self._client.id]
            if foreign:
                raise ValueError(f"the arguments of {how.name}() hold future {foreign[0]!r} of another "
                                 f"Client (closed or not this one): its data is not on this cluster. "
                                 f"Pass its result() instead, or submit from the client that made it.")
        return Spec.sharing(key, payload, tuple(found), terms_of(how, opts))

    def many(self, items: list, opts: Options, how: Function) -> Optional[list]:
        return self.specs.many(items, opts, how)

    def actor(self, fn: Callable, args: tuple, kwargs: dict) -> tuple:
        return _actors.make, (fn, args, dict(kwargs), self._client.id)

    def send(self, tasks: list, opts: Options) -> list[Future]:
        return self._submit(tasks, opts.resources)

    def _submit(self, specs: list, resources: Optional[tuple] = None) -> list[Future]:
        if resources is not None and specs:      # the same for each: one check
            self._gateway.check_resources(specs[0].key, resources)
        again: dict = {}        # filled by track(), before the scheduler reads it

        def track() -> list:
            futures, held_already = self._table.hold_many([s.key for s in specs])
            again.update(held_already)
            return futures
        # inputs finished from the journal go to the scheduler first: their workers read them
        inputs = self._journal_inputs(specs) if self._from_journal else []
        return self._gateway.submit(inputs + specs if inputs else specs, track, again)

    def _journal_inputs(self, specs: list) -> list:
        """The Specs of the inputs of ``specs`` this client finished from the journal, taken
        out of ``_from_journal``: the scheduler counts this client once for each, as its futures hold it."""
        from_journal, out = self._from_journal, []
        for spec in specs:
            for d in spec.deps:
                got = from_journal.pop(d, None)
                if got is not None:
                    out.append(got[0])
        return out

    # --- the journal (journal.py) ---------------------------------------------------------

    def from_journal(self, fn: Callable, items: list, kwargs: dict, keys: list, opts: Options,
                     prefix: Optional[str], make: Callable[..., Spec]) -> Optional[list[Future]]:
        """``fn``'s tasks with the journal: a pure one keyed by the fingerprint of ``fn`` and a
        token of its arguments, each run as a Journaled; those whose entry is there finished
        at once (``_submit_journaled``). None when there is no journal, or ``fn`` has no
        fingerprint (unjournaled)."""
        keeper = self._journal
        if keeper is None:
            return None
        how = self.specs.how(fn, False)
        fp = keeper.fingerprint(fn, how.name)
        if fp is None:
            return None
        wrapped: dict = {}        # fingerprint -> the Function of fn run as a Journaled of it

        def run_as(fpk: str) -> Function:
            if fpk not in wrapped:
                fn_id, data = keeper.wrapped(how.fn_id, how.fn_bytes, fpk, new_fn_id)
                wrapped[fpk] = Function(fn_id, data, how.name, None, Terms(fn_id, data))
            return wrapped[fpk]
        if not kwargs and all(k is None for k in keys):
            fast = self._journaled_plain(fp, f"{prefix or how.name}-", items, terms_of(run_as(fp), opts))
            if fast is not None:
                return self._submit_journaled(keeper, fast[0], fast[1], opts.resources)
        specs: list = []
        entries: list = []          # (entry id, fingerprint) of each spec, None for one not journaled
        plain = None
        for args, k in zip(items, keys):
            k, fpk, why = self._journal_key(fp, how.name, args, kwargs, k, prefix)
            if why is not None:
                keeper.warn_unjournaled(how.name, why)
                plain = plain or self.specs.how(fn, opts.pure)
                specs.append(make(plain, args, kwargs, k, opts, prefix))
                entries.append(None)
                continue
            specs.append(make(run_as(fpk), args, kwargs, k, opts))
            entries.append((_journal.entry_id(k, fpk), fpk))
        return self._submit_journaled(keeper, specs, entries, opts.resources)

    @staticmethod
    def _journaled_plain(fp: str, name: str, items: list, terms: Terms) -> Optional[tuple]:
        """(Specs, entries) of pure tasks whose arguments are all plain (numbers, strings: the
        pickle of such arguments is their token), in one loop; None if any is not."""
        payloads = serialize.dumps_plain_many(items)
        if payloads is None:
            return None
        h, entry_id, share = hashlib.sha1(fp.encode(), usedforsecurity=False), _journal.entry_id, Spec.sharing
        specs, entries = [], []
        for payload in payloads:
            k = h.copy()
            k.update(payload.meta if type(payload.meta) is bytes else payload.meta.raw())
            key = name + k.hexdigest()
            specs.append(share(key, payload, (), terms))
            entries.append((entry_id(key, fp), fp))
        return specs, entries

    @staticmethod
    def _journal_key(fp: str, name: str, args: tuple, kwargs: dict, key: Optional[str],
                     prefix: Optional[str]) -> tuple:
        """(key, fingerprint, None) of a journaled task, or (its own key, None, why it cannot be
        journaled). A pure task's key is made of its code and its arguments' token; an explicit
        key (a dask graph's) is kept, with the code of the graph nodes among its arguments."""
        if key is None:
            tok = _journal.token((args, kwargs))
            if tok is None:
                why = _journal.why_untokenizable((args, kwargs))
                return None, None, f"an argument has no deterministic token ({why})"
            return f"{prefix or name}-{_journal.pure_key(fp, tok)}", fp, None
        try:
            return key, _journal.combined(fp, _journal.graph_code(args)), None
        except Exception as e:  # noqa: BLE001 - any failure of the walk leaves the task unjournaled
            return key, None, f"the code of its dask graph node has no fingerprint ({e})"

    def _submit_journaled(self, keeper: _journal.Keeper, specs: list, entries: list,
                          resources: Optional[tuple]) -> list[Future]:
        """Futures of ``specs``: those whose entry (``entries``) the journal holds finished at
        once, their results read when asked for; the others submitted."""
        found = keeper.lookup([e[0] for e in entries if e is not None])
        from_journal, table = self._from_journal, self._table
        hit = [e is not None and e[0] in found and (s.key in from_journal or not table.holds(s.key))
               for s, e in zip(specs, entries)]
        if not any(hit):
            return self._submit(specs, resources)
        submitted = iter(self._submit([s for s, h in zip(specs, hit) if not h], resources))
        reused = table.hold_many([s.key for s, h in zip(specs, hit) if h])[0]
        out, reuse = [], iter(reused)
        for spec, entry, h in zip(specs, entries, hit):
            if not h:
                out.append(next(submitted))
                continue
            fut = next(reuse)
            # A dependent has it read by its worker: the task itself when it has no inputs (a
            # damaged entry is computed again there), else a reader of the entry alone, since
            # its inputs may be let go of meanwhile (a damaged entry is an error naming it)
            if spec.deps:
                fn_id, data = keeper.reader(entry[1], new_fn_id)
                reader = Spec.sharing(spec.key, serialize.plain_args(()), (), Terms(fn_id, data))
            else:
                fn_id, data = keeper.reader(entry[1], new_fn_id, spec.terms)
                reader = Spec.sharing(spec.key, spec.kept, (), Terms(fn_id, data))
            from_journal[spec.key] = (reader, spec)
            state = table.state(spec.key)
            if state is not None:
                state.conclude("finished", _journal.InJournal(keeper, entry[0], functools.partial(self._again, spec.key)))
            out.append(fut)
        keeper.count_reused(len(reused))
        return out

    def _again(self, key: str) -> Any:
        """The value of ``key`` computed again (its journal entry was damaged or gone)."""
        specs = self._from_journal.pop(key, None)
        if specs is not None:
            self._table.renew(key)
            return self._submit([specs[1]])[0].result()
        fut = self._gateway.acquire(key, lambda: self._table.hold(key))      # a dependent had it made meanwhile
        if fut is None:
            raise RuntimeError(f"the journal entry of task {key!r} is damaged, and the task is no longer known "
                               f"to the cluster: submit it again to compute it")
        return fut.result()

    # --- data ------------------------------------------------------------------------------

    def scatter(self, items: list, workers: Optional[frozenset], broadcast: bool, loose: bool) -> list[Future]:
        if workers is not None and loose and not workers & set(self._client.cluster.workers):
            workers = None
        return self._gateway.scatter(items, lambda: self._table.hold_many([key for key, _ in items])[0],
                                     workers, broadcast)

    def cancel(self, futures: list) -> None:
        self._gateway.cancel([f.key for f in futures])

    def who_has(self, keys: Optional[tuple]) -> dict:
        return self._gateway.who_has(None if keys is None else list(keys))

    def wait(self, futures: list, timeout: Optional[float], deadline: Optional[float]) -> None:
        left = timeout if deadline is None else max(0.0, deadline - time.monotonic())
        # not cf.wait: in a forked child it raises instead of hanging
        _waiting.wait_all(futures, left, "gather", stated=timeout)

    def state_of(self, fut: Future) -> Optional[FutureState]:
        return self._table.state_of(fut)

    def values(self, futures: list, timeout: Optional[float], deadline: Optional[float]) -> Callable[[Any], Any]:
        """``Future.result``, after the results finished from the journal are read in one pass
        and the large ones still on their workers fetched at once (a round trip in all)."""
        if deadline is None and timeout is not None:
            deadline = time.monotonic() + timeout
        states = [s for s in map(self._table.state_of, futures) if s is not None]
        if self._journal is not None:
            self._journal.read_ahead(states)
        lazy = [s for s in states if s.needs_fetch()]
        if lazy:
            fetched = self._gateway.fetch([s.key for s in lazy])
            for state, ff in zip(lazy, fetched):
                try:
                    payload = ff.result(None if deadline is None else max(0.0, deadline - time.monotonic()))
                except BaseException:
                    if not ff.done():
                        raise TimeoutError(f"gather(timeout={timeout:g}): the results were done, but fetching "
                                           f"their data from the workers took longer than {timeout:g} s") from None
                    continue
                state.prefill(payload)
        return Future.result

    # --- the workers ---------------------------------------------------------------------

    def run(self, fn_bytes: bytes, payload: Any, workers: Optional[frozenset], name: str,
            wait: bool) -> Optional[Iterator[tuple]]:
        answers = self._gateway.run(fn_bytes, payload, workers, f"client.run({name})")
        if not wait:
            return None
        return ((worker, functools.partial(_loaded, answer)) for worker, answer in answers.items())

    def workers(self) -> tuple:
        from .dask_calls import worker_identity
        cluster = self._client.cluster
        workers = cluster.workers
        directory, resources = cluster.local_directory, cluster.config["resources"]
        fields = {"id": os.path.basename(directory), "address": f"localcluster://{os.getpid()}", "services": {},
                  "started": self._gateway.started,
                  "total_memory": sum(w.memory_limit or 0 for w in workers.values())}
        return fields, [(w.name, w.nthreads, functools.partial(worker_identity, w, directory, resources))
                        for w in workers.values()]


def _loaded(answer: Any) -> Any:
    """A worker's answer to ``run``: its value, or its error raised."""
    return serialize.loads(answer.result())
