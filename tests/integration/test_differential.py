"""A differential test of the data path: random programs of data moves run on a real
LocalCluster, every value checked against the same code run in this process.

A seeded generator draws each program. Its values have many sizes (0 B, 1 B, around a page,
around OUT_OF_BAND (64 KiB, also INLINE_RESULT), between those two, around MEMFD_THRESHOLD
(1 MiB), around 2 MiB (vmcopy.HUGE), a few MB, and a few values of tens of MB, within a byte
budget). They have many dtypes (f8, f2, i4, big-endian i8, u1, c8, c16, bool, a packed
structured dtype) and memory orders (C, Fortran, transposes, non-contiguous slices with steps,
reversed and offset views, 0-d). There are bytes and bytearrays too, and lists, tuples and dicts
that hold several of them of different sizes at once, nested sometimes: one frame holds
buffers that cross in different ways (issue 48). Each value is made from (seed, index) by
``make_value``, the same function here and on the workers (they import this module by name).

The operations are chosen at random:

- make a value on a worker;
- read values with a task on another worker (a relay; it returns their fingerprints);
- tasks of tasks of tasks, each on a worker of its own, each combining inputs of different
  sizes, futures and values passed by value. The tasks check their inputs against the
  fingerprints computed here and raise if one differs. They pack their inputs into a
  container, pick an element out of one, take a view of one (a transpose, a step, a
  reversal), concatenate the bytes of several, or make a new value after reading them;
- scatter to one worker, to several, as a list, a single value or a dict, and broadcast;
- replicate;
- fetch results in a shuffled order, with ``client.gather`` and with ``.result()``;
- cancel futures, some of them with dependents in flight, and drop futures.

Depending on the cluster, programs also spill (a memory_target of 1 % makes each worker spill
what it holds; the spill op waits for a spill and the next reads reload it), SIGKILL workers in
the middle of it all, or move data by memfd only (the parent may not copy with
process_vm_readv/writev, as under Yama's ptrace_scope 2).

The checks: every result the client gets must equal the value computed here (type, dtype,
shape and content, whatever the strides and byte order). A task that reads inputs checks each one where it
landed. A kill may cost only what it must: results come back (computed again from their
lineage if need be), and only data scattered to workers that were all killed may raise
LostDataError (theirs, or their dependents'), or a result computed from scattered data let
go of before a kill (the kill may take its only copy, and it cannot be made again). Only futures that were cancelled, or depend on
one that was, may raise CancelledError. Every death is one of the test's kills (cause
"signal"). After each cluster, no worker holds or spills anything. A "transfer went wrong"
warning (a copy that broke its seal: localcluster fixing its own failure) fails the test too.
A failure names the seed, the program, the operation that made the value and the last
operations. A green run prints how many values it checked.

The quick tier runs a fixed seed with a small budget (a few seconds). The slow test draws a
fresh seed (printed; ``LOCALCLUSTER_SEED=<seed>`` replays it, the kills' timing aside) and
cycles through the configurations, two programs each. ``LOCALCLUSTER_DIFF_SECONDS=3600
pytest tests/integration/test_differential.py -m slow`` runs its loop for an hour.
"""
from __future__ import annotations

import collections
import concurrent.futures as cf
import contextlib
import gc
import hashlib
import logging
import os
import random
import signal
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import pytest

import localcluster
from _util import release, released
from localcluster.wire import protocol, vmcopy

KiB, MiB = 1 << 10, 1 << 20
OOB, MEMFD, HUGE = protocol.OUT_OF_BAND, protocol.MEMFD_THRESHOLD, vmcopy.HUGE
TIMEOUT = 30.0          # seconds any one wait may take: past it the test fails and says why
FAST_SEED = 20261128    # the quick tier's seed (LOCALCLUSTER_SEED overrides it)
SECONDS = float(os.environ.get("LOCALCLUSTER_DIFF_SECONDS") or 0)   # the slow loop's length, when set


# --- values: made and fingerprinted the same way here and on the workers -----------------------

DTYPES = {"f8": "<f8", "f2": "<f2", "i4": "<i4", "i8>": ">i8", "u1": "|u1", "c8": "<c8", "c16": "<c16",
          "b1": "|b1", "rec": [("i", "<i4"), ("x", "<f8"), ("s", "S3")]}     # rec: 15 bytes, packed
LAYOUTS_1D = ("C", "step", "rev", "sub")
LAYOUTS_ND = ("C", "F", "T", "slice")


def _content(key: tuple, nbytes: int) -> np.ndarray:
    """``nbytes`` random bytes drawn from ``key`` (a tuple of ints), as a fresh u1 array."""
    words = np.random.default_rng(key).integers(0, 1 << 64, size=(nbytes + 7) // 8, dtype=np.uint64)
    return words.view(np.uint8)[:nbytes]


def _array(key: tuple, dtype: str, layout: str, shape: tuple) -> np.ndarray:
    dt = np.dtype(DTYPES[dtype])
    if layout == "T":
        base = shape[::-1]
    elif layout == "step":
        base = (2 * shape[0] + 1,)
    elif layout == "sub":
        base = (shape[0] + 24,)
    elif layout == "slice":
        base = (2 * shape[0] + 1, 3 * shape[1])
    else:
        base = shape
    raw = _content(key, int(np.prod(base, dtype=np.int64)) * dt.itemsize)
    a = ((raw & 1).view(np.bool_) if dt.kind == "b" else raw.view(dt)).reshape(base)
    if layout == "F":
        return np.asfortranarray(a)
    if layout == "T":
        return a.T
    if layout == "step":
        return a[1::2]
    if layout == "rev":
        return a[::-1]
    if layout == "sub":
        return a[11:11 + shape[0]]
    if layout == "slice":
        return a[1::2, ::3]
    return a


def make_value(spec: tuple) -> Any:
    """The value a spec names: ("array", key, dtype, layout, shape), ("bytes" | "bytearray",
    key, n), ("scalar", v), or ("list" | "tuple" | "dict", [specs])."""
    kind = spec[0]
    if kind == "array":
        return _array(*spec[1:])
    if kind == "bytes":
        return bytes(_content(spec[1], spec[2]))
    if kind == "bytearray":
        return bytearray(_content(spec[1], spec[2]))
    if kind == "scalar":
        return spec[1]
    items = [make_value(s) for s in spec[1]]
    if kind == "list":
        return items
    if kind == "tuple":
        return tuple(items)
    if kind == "dict":
        return {f"k{i}": v for i, v in enumerate(items)}
    raise ValueError(f"not a value spec: {spec!r}")


def _digest(buf: Any) -> str:
    return hashlib.blake2b(buf, digest_size=16).hexdigest()


def native(a: np.ndarray) -> np.ndarray:
    """``a`` in this machine's byte order: numpy itself unpickles a strided big-endian array
    in native order (numpy 2.4: ``pickle.loads(pickle.dumps(np.arange(4, dtype=">i8")[::2]))``
    is ``int64``), so only the values, not their byte order, are the same on every path."""
    return a if a.dtype.isnative else a.astype(a.dtype.newbyteorder("="))


def fingerprint(v: Any) -> tuple:
    """Equal exactly when the values are: type, dtype, shape and a digest of the content in C
    order (whatever the strides and the byte order), recursively for containers."""
    t = type(v)
    if t is np.ndarray:
        v = native(v)
        flat = v.reshape(-1).view(np.uint8) if v.flags.c_contiguous else np.frombuffer(v.tobytes(), np.uint8)
        return ("ndarray", str(v.dtype.descr), v.shape, _digest(flat))
    if t is bytes or t is bytearray:
        return (t.__name__, len(v), _digest(v))
    if t is list or t is tuple:
        return (t.__name__, tuple(fingerprint(x) for x in v))
    if t is dict:
        return ("dict", tuple((k, fingerprint(x)) for k, x in v.items()))
    return (t.__name__, repr(v))


def nbytes_of(v: Any) -> int:
    if isinstance(v, np.ndarray):
        return v.nbytes
    if isinstance(v, (bytes, bytearray)):
        return len(v)
    if isinstance(v, (list, tuple)):
        return sum(nbytes_of(x) for x in v)
    if isinstance(v, dict):
        return sum(nbytes_of(x) for x in v.values())
    return 8


def describe(v: Any) -> str:
    if isinstance(v, np.ndarray):
        order = "C" if v.flags.c_contiguous else "F" if v.flags.f_contiguous else "strided"
        return f"ndarray {v.dtype.str} {v.shape} {order} {v.nbytes} B"
    if isinstance(v, (bytes, bytearray)):
        return f"{type(v).__name__} {len(v)} B"
    if isinstance(v, (list, tuple, dict)):
        items = v.values() if isinstance(v, dict) else v
        return f"{type(v).__name__}[{', '.join(describe(x) for x in items)}]"
    return repr(v)


# --- the tasks: they read their inputs where they land -----------------------------------------

def check(*inputs: Any) -> list:
    """A relay's reader: the fingerprints of its inputs, computed on its worker."""
    return [fingerprint(x) for x in inputs]


def combine(recipe: tuple, expected: list, *inputs: Any) -> Any:
    """Check each input against the fingerprint computed in the test's process, then make a
    new value of them (``apply``, which the test runs on its own copies for the expected value)."""
    got = [fingerprint(x) for x in inputs]
    if len(got) != len(expected):
        raise AssertionError(f"{recipe[0]}: {len(got)} inputs arrived, {len(expected)} were sent")
    for i, (g, e) in enumerate(zip(got, expected)):
        if g != e:
            raise AssertionError(f"{recipe[0]}: input {i} of {len(got)} is not what was sent: "
                                 f"got {g!r}, expected {e!r}")
    return apply(recipe, inputs)


def apply(recipe: tuple, inputs: tuple) -> Any:
    how = recipe[0]
    if how == "pack":           # ("pack", container, spec of a new value or None)
        items = list(inputs) + ([make_value(recipe[2])] if recipe[2] is not None else [])
        return items if recipe[1] == "list" else tuple(items) if recipe[1] == "tuple" else \
            {f"p{i}": x for i, x in enumerate(items)}
    if how == "pick":           # ("pick", path): an element inside the first input
        v = inputs[0]
        for step in recipe[1]:
            v = v[step]
        return v
    if how == "view":           # ("view", how): a view of the first input
        v = inputs[0]
        if recipe[1] == "T":
            return v.T
        if recipe[1] == "rev":
            return v[::-1]
        return v[::2]
    if how == "concat":         # ("concat",): the bytes of every input, one after the other
        return np.frombuffer(b"".join(native(x).tobytes() if isinstance(x, np.ndarray) else bytes(x) for x in inputs),
                             np.uint8)
    if how == "derive":         # ("derive", spec): a new value, made after reading the inputs
        return make_value(recipe[1])
    raise ValueError(f"not a recipe: {recipe!r}")


# --- the generator ------------------------------------------------------------------------------

def _near(center: int, jitter: int):
    return lambda r: max(0, center + r.choice((0, 0, -1, 1, r.randint(-jitter, jitter))))


# label: (weight, how many bytes)
SIZES = {
    "0": (3, lambda r: 0),
    "1": (3, lambda r: 1),
    "small": (8, lambda r: r.randint(2, 3000)),
    "page": (6, _near(4 * KiB, 64)),
    "oob": (12, _near(OOB, 512)),
    "mid": (8, lambda r: r.randint(OOB, MEMFD)),
    "memfd": (12, _near(MEMFD, 4 * KiB)),
    "huge": (7, _near(HUGE, 4 * KiB)),
    "big": (3, lambda r: r.randint(3 * MiB, 8 * MiB)),
    "giant": (1, lambda r: r.randint(16 * MiB, 40 * MiB)),
}
SMALLER = ("0", "1", "small", "page", "oob", "mid")     # what a program makes once its byte budget is spent
LARGER = ("memfd", "huge", "big")


@dataclass(frozen=True)
class Config:
    name: str
    cluster: dict
    kills: int = 0              # SIGKILLs per program, at most
    spill: bool = False
    memfd_only: bool = False


SPILLING = dict(memory_limit="1GiB", memory_target=0.01)       # every worker spills what it holds
CONFIGS = {
    "plain": Config("plain", dict(n_workers=2)),
    "spill": Config("spill", dict(n_workers=2, **SPILLING), spill=True),
    "kills": Config("kills", dict(n_workers=3, threads_per_worker=2, allowed_failures=1000), kills=2),
    "memfd": Config("memfd", dict(n_workers=2), memfd_only=True),
    "spill-kills": Config("spill-kills", dict(n_workers=3, allowed_failures=1000, **SPILLING), kills=1, spill=True),
    "memfd-spill-kills": Config("memfd-spill-kills", dict(n_workers=3, allowed_failures=1000, **SPILLING),
                                kills=2, spill=True, memfd_only=True),
}


@dataclass(frozen=True)
class Budget:
    ops: int                # operations per program
    made: int               # bytes a program makes (the rest of its values are small)
    giants: int             # values of tens of MB a program may make
    pool: int               # bytes held before the oldest values are checked and let go


FAST = Budget(ops=40, made=40 * MiB, giants=0, pool=24 * MiB)
SLOW = Budget(ops=90, made=160 * MiB, giants=2, pool=96 * MiB)


@dataclass
class Stats:
    here: int = 0           # values the client fetched and compared
    there: int = 0          # inputs the tasks checked on the workers
    programs: int = 0
    ops: collections.Counter = field(default_factory=collections.Counter)
    accepted: collections.Counter = field(default_factory=collections.Counter)   # errors the rules allow
    copies: collections.Counter = field(default_factory=collections.Counter)     # the parent's vmcopy calls
    rounds: collections.Counter = field(default_factory=collections.Counter)
    largest: int = 0

    @property
    def values(self) -> int:
        return self.here + self.there

    def __str__(self) -> str:
        return (f"{self.values} values checked ({self.here} fetched by the client, {self.there} read by tasks), "
                f"{self.programs} programs, rounds {dict(self.rounds)}, largest value {self.largest} B, "
                f"ops {dict(sorted(self.ops.items()))}, accepted errors {dict(self.accepted)}, "
                f"parent's vm copies {dict(self.copies)}")


@dataclass(eq=False)
class Entry:
    """A future of the program and what it must give: a value (compared by fingerprint) or,
    for a relay's check, the list of its inputs' fingerprints."""
    name: str
    fut: Any
    fp: Any
    op: str                         # the operation that made it
    lineage: frozenset              # the names of the futures it is computed from, its own included
    roots: frozenset                # the keys of the scattered data among them
    value: Any = None               # the expected value (None for a check)
    nbytes: int = 0
    inputs: int = 0                 # how many inputs its task checked on its worker
    home: str = ""                  # where it was made or placed
    check: bool = False


class Transfers(logging.Handler):
    """Collects localcluster's "a transfer went wrong" warnings: a copy that broke its seal."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.said: list = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "transfer went wrong" in message:
            self.said.append(message)


class Program:
    """One random program on one cluster. ``run`` plays it and checks everything it fetches."""

    def __init__(self, cluster: Any, client: Any, cfg: Config, seed: int, number: int, budget: Budget,
                 stats: Stats, transfers: Transfers, replay: str):
        self.cluster, self.client, self.cfg = cluster, client, cfg
        self.seed, self.number, self.budget, self.stats = seed, number, budget, stats
        self.transfers, self.replay = transfers, replay
        self.rng = random.Random(f"{seed}/{number}")
        self.index = 0          # values drawn
        self.serial = 0         # futures made
        self.made = 0
        self.giants = budget.giants
        self.entries: list[Entry] = []         # every future not yet checked and let go
        self.pool: list[Entry] = []            # the values later operations may read
        self.cancelled: set = set()            # names of the entries cancelled
        self.lost_ok: set = set()              # scattered keys killed with every holder, or let go of before a kill
        self.killed: set = set()
        self.kills = 0
        self.spills = 0
        self.opno, self.op = -1, "(start)"
        self.last_ops: collections.deque = collections.deque(maxlen=8)

    # --- failing -----------------------------------------------------------------------------

    def failure(self, problem: str, e: Optional[Entry] = None) -> AssertionError:
        lines = [f"differential test: seed {self.seed}, program {self.number} on cluster {self.cfg.name!r}: "
                 f"{problem}"]
        if e is not None:
            lines.append(f"  the future {e.name} ({e.fut.key}) was made by op {e.op}")
        lines.append(f"  at op #{self.opno}: {self.op}")
        lines.append("  the ops before it:\n" + "\n".join(f"    {o}" for o in list(self.last_ops)[:-1]))
        lines.append(f"  deaths: {[d.message.splitlines()[0] for d in self.cluster.deaths]}")
        lines.append("  workers: " + "; ".join(
            f"{n} {i.status} running {i.running} processing {len(i.processing)} managed {i.managed} "
            f"spilled {i.spilled}" for n, i in sorted(self.cluster.workers.items())))
        if "timed out" in problem or "TimeoutError" in problem:     # where each worker is stuck
            try:
                stacks = self.client.dump_stacks()
            except Exception as e:  # noqa: BLE001 - the failure is what matters
                stacks = {"?": f"dump_stacks failed: {e!r}"}
            for name, text in sorted(stacks.items()):
                lines.append(f"  {name}'s threads:\n" + "\n".join(f"    {line}" for line in text.splitlines()[-60:]))
        lines.append(f"  replay: {self.replay}")
        return AssertionError("\n".join(lines))

    def said_nothing_wrong(self) -> None:
        """No copy broke its seal: the library caught one of its transfers going wrong (and
        will send it again), which must never happen at all."""
        if self.transfers.said:
            said = self.transfers.said[0]
            e = next((e for e in self.entries if f"'{e.fut.key}'" in said), None)
            raise self.failure(f"localcluster found a damaged copy: {said}", e)

    # --- choices -----------------------------------------------------------------------------

    def workers(self) -> list:
        # cluster.workers may list a worker whose death is recorded already, for the moment
        # its nanny takes to be let go of: never pick a dead one
        dead = {d.worker for d in self.cluster.deaths}
        live = {n: i for n, i in self.cluster.workers.items() if n not in dead}
        names = sorted(n for n, i in live.items() if i.status in ("running", "paused"))
        return names or sorted(live)

    def pick(self, seq: Any) -> Any:
        """One of ``seq``, drawing the same randomness whatever its length: which workers are
        running changes with kills (and their timing), the rest of the program must not."""
        return seq[min(int(self.rng.random() * len(seq)), len(seq) - 1)]

    def another(self, *not_these: str) -> str:
        """A worker, another than ``not_these`` mostly."""
        names = self.workers()
        others = [n for n in names if n not in not_these]
        elsewhere = self.rng.random() < 0.85
        return self.pick(others if others and elsewhere else names)

    def submit(self, fn: Any, *args: Any, worker: str) -> Any:
        return self.client.submit(fn, *args, workers=[worker], pure=False, allow_other_workers=self.cfg.kills > 0)

    def size(self, labels: tuple = tuple(SIZES)) -> int:
        r = self.rng
        if self.made >= self.budget.made:
            labels = tuple(label for label in labels if label in SMALLER) or SMALLER
        labels = tuple(label for label in labels if label != "giant" or self.giants > 0) or ("memfd",)
        label = r.choices(labels, [SIZES[label][0] for label in labels])[0]
        if label == "giant":
            self.giants -= 1
        return SIZES[label][1](r)

    def key(self) -> tuple:
        self.index += 1
        return (self.seed, self.number, self.index)

    def leaf_spec(self, key: tuple, nbytes: int) -> tuple:
        r = self.rng
        x = r.random()
        if x < 0.12:
            return ("bytes", key, nbytes)
        if x < 0.2:
            return ("bytearray", key, nbytes)
        dtype = r.choice(list(DTYPES))
        n = nbytes // np.dtype(DTYPES[dtype]).itemsize
        y = r.random()
        if y < 0.03:
            return ("array", key, dtype, "C", ())
        if y < 0.5:
            return ("array", key, dtype, r.choice(LAYOUTS_1D), (n,))
        layout = r.choice(LAYOUTS_ND)
        cols = r.choice((1, 2, 3, 7, 64, 1000))
        if layout != "slice" and r.random() < 0.2:
            return ("array", key, dtype, layout, (n // (2 * cols), cols, 2))
        return ("array", key, dtype, layout, (n // cols, cols))

    def container_spec(self, key: tuple, depth: int = 0) -> tuple:
        r = self.rng
        k = r.randint(2, 5)
        if r.random() < 0.7:        # sizes that cross in different ways, in one frame
            labels = [r.choice(("small", "page", "oob")), r.choice(("oob", "mid")), r.choice(LARGER)]
            labels += [r.choice(tuple(SIZES)) for _ in range(k - 3)]
            r.shuffle(labels)
            sizes = [self.size((label,)) for label in labels]
        else:
            sizes = [self.size() for _ in range(k)]
        items = []
        for j, n in enumerate(sizes):
            x = r.random()
            if x < 0.1:
                items.append(("scalar", r.choice((j, f"label-{j}", 0.5 * j, None))))
            elif x < 0.22 and depth < 2:
                items.append(self.container_spec(key + (j,), depth + 1))
            else:
                items.append(self.leaf_spec(key + (j,), n))
        return (r.choice(("list", "tuple", "dict")), items)

    def value_spec(self) -> tuple:
        key = self.key()
        if self.rng.random() < 0.3:
            return self.container_spec(key)
        return self.leaf_spec(key, self.size())

    def new_value(self) -> Any:
        value = make_value(self.value_spec())
        self.made += nbytes_of(value)
        return value

    def inputs(self, most: int) -> list:
        """Up to ``most`` values of the pool, a small one and a large one together when there are."""
        r = self.rng
        if not self.pool:
            return []
        k = min(len(self.pool), r.randint(1, most))
        small = [e for e in self.pool if e.nbytes < MEMFD]
        large = [e for e in self.pool if e.nbytes >= MEMFD]
        if k >= 2 and small and large and r.random() < 0.6:
            chosen = [r.choice(small), r.choice(large)]
            rest = [e for e in self.pool if e not in chosen]
            chosen += r.sample(rest, min(len(rest), k - 2))
            r.shuffle(chosen)
            return chosen
        return r.sample(self.pool, k)

    # --- bookkeeping --------------------------------------------------------------------------

    def add(self, fut: Any, value: Any, op: str, parents: list = (), roots: frozenset = frozenset(),
            inputs: int = 0, home: str = "", pool: bool = True) -> Entry:
        self.serial += 1
        name = f"v{self.serial}"
        lineage = frozenset().union(*(p.lineage for p in parents)) | {name}
        roots = frozenset(roots).union(*(p.roots for p in parents))
        e = Entry(name, fut, fingerprint(value), op, lineage, roots, value, nbytes_of(value), inputs, home)
        self.stats.largest = max(self.stats.largest, e.nbytes)
        self.entries.append(e)
        if pool:
            self.pool.append(e)
        return e

    def add_check(self, fut: Any, expected: list, op: str, parents: list) -> None:
        self.serial += 1
        name = f"c{self.serial}"
        lineage = frozenset().union(*(p.lineage for p in parents)) | {name}
        roots = frozenset().union(*(p.roots for p in parents))
        self.entries.append(Entry(name, fut, expected, op, lineage, roots, inputs=len(expected), check=True))

    def let_go(self, gone: list) -> None:
        gone_ids = {id(e) for e in gone}
        self.entries = [e for e in self.entries if id(e) not in gone_ids]
        self.pool = [e for e in self.pool if id(e) not in gone_ids]

    def may_fail(self, e: Entry) -> bool:
        return bool(e.lineage & self.cancelled) or bool(e.roots & self.lost_ok)

    # --- checking -----------------------------------------------------------------------------

    def compare(self, e: Entry, got: Any, how: str) -> None:
        have = got if e.check else fingerprint(got)
        if have != e.fp:
            raise self.failure(f"{how} gave a wrong {'check' if e.check else 'value'}: got {have!r}, "
                               f"expected {e.fp!r}" + ("" if e.check else f" ({describe(e.value)})"), e)
        self.stats.here += 0 if e.check else 1
        self.stats.there += e.inputs

    def accepted(self, e: Entry, error: BaseException) -> bool:
        if isinstance(error, cf.CancelledError):
            if e.lineage & self.cancelled:
                self.stats.accepted["CancelledError"] += 1
                return True
        elif isinstance(error, localcluster.LostDataError):
            if error.key in (e.roots & self.lost_ok):
                self.stats.accepted["LostDataError"] += 1
                return True
        return False

    def fetch_one(self, e: Entry, how: str) -> None:
        try:
            got = e.fut.result(TIMEOUT)
        except BaseException as error:  # noqa: BLE001 - any error is judged
            if not self.accepted(e, error):
                raise self.failure(f"{how}: .result() raised {type(error).__name__}: {error}", e) from error
            # The future keeps this very exception: its traceback would keep this frame, so
            # the program and every future of it, alive (and their data on the workers).
            error.__traceback__ = None
            return
        self.compare(e, got, how)

    def verify(self, entries: list, via: str) -> None:
        """Fetch ``entries`` in a shuffled order (one gather of those that must succeed, or a
        result() each) and compare each with what it must be."""
        entries = list(entries)
        self.rng.shuffle(entries)
        sure = [e for e in entries if not self.may_fail(e)]
        unsure = [e for e in entries if self.may_fail(e)]
        if via == "gather" and sure:
            try:
                got = self.client.gather([e.fut for e in sure], timeout=TIMEOUT)
            except BaseException as error:  # noqa: BLE001 - name the future that raised
                bad = next((e for e in sure if f"'{e.fut.key}'" in str(error)), None) or \
                    next((e for e in sure if e.fut.done() and e.fut.exception(0) is not None), None)
                raise self.failure(f"client.gather of {len(sure)} futures raised {type(error).__name__}: {error}",
                                   bad) from error
            for e, v in zip(sure, got):
                self.compare(e, v, "client.gather")
        else:
            for e in sure:
                self.fetch_one(e, ".result()")
        for e in unsure:
            self.fetch_one(e, ".result() (may fail)")

    # --- operations ---------------------------------------------------------------------------

    def doing(self, what: str) -> None:
        """What the current op does, for the failure message (the steps of a chain each)."""
        line = f"#{self.opno} {what}"
        if self.last_ops and self.last_ops[-1] == f"#{self.opno} {self.op}" and " " not in self.op:
            self.last_ops[-1] = line        # the op's name alone, said in full now
        else:
            self.last_ops.append(line)
        self.op = what

    def op_make(self) -> None:
        spec = self.value_spec()
        value = make_value(spec)
        self.made += nbytes_of(value)
        w = self.another()
        self.doing(f"make {describe(value)} on {w}")
        self.add(self.submit(make_value, spec, worker=w), value, f"#{self.opno} {self.op}", home=w)

    def op_scatter(self) -> None:
        r = self.rng
        how = r.choice(("one", "list", "many", "broadcast", "dict"))
        values = [self.new_value() for _ in range(1 if how == "one" else r.randint(1, 4))]
        names = self.workers()
        if how == "many":       # 2 or more workers, a run of them from a random one
            k, start = r.random(), r.random()
            k = min(len(names), 2 + int(k * (len(names) - 1)))
            targets = [names[(int(start * len(names)) + i) % len(names)] for i in range(k)]
        else:
            targets = [self.pick(names)]
        self.doing(f"scatter {how} {[describe(v) for v in values]}" + ("" if how == "broadcast" else f" to {targets}"))
        aow = self.cfg.kills > 0
        if how == "one" and not isinstance(values[0], (list, tuple, dict)):
            futs = [self.client.scatter(values[0], workers=targets, allow_other_workers=aow)]
        elif how == "broadcast":
            futs = self.client.scatter(values, broadcast=True)
        elif how == "dict":
            d = self.client.scatter({f"s{i}": v for i, v in enumerate(values)}, workers=targets,
                                    allow_other_workers=aow)
            futs = [d[f"s{i}"] for i in range(len(values))]
        else:
            futs = self.client.scatter(values, workers=targets, allow_other_workers=aow)
        for fut, v in zip(futs, values):
            self.add(fut, v, f"#{self.opno} {self.op}", roots=frozenset({fut.key}), home=",".join(targets))

    def arguments(self, chosen: list, by_value: float) -> tuple:
        """Each chosen entry as its future or, now and then, its value (sent with the task)."""
        args, parents, shown = [], [], []
        for e in chosen:
            if self.rng.random() < by_value and e.nbytes <= 8 * MiB:
                args.append(e.value)
                shown.append(f"{e.name}(by value)")
            else:
                args.append(e.fut)
                parents.append(e)
                shown.append(e.name)
        return args, parents, shown

    def op_relay(self) -> None:
        chosen = self.inputs(4)
        if not chosen:
            return self.op_make()
        args, parents, shown = self.arguments(chosen, 0.15)
        w = self.another(chosen[0].home)
        self.doing(f"relay {shown} ({[describe(e.value) for e in chosen]}) to a check on {w}")
        self.add_check(self.submit(check, *args, worker=w), [e.fp for e in chosen], f"#{self.opno} {self.op}",
                       parents)

    def recipe(self, values: list) -> tuple:
        r = self.rng
        first = values[0]
        # A container of what it read: not past 64 MiB (a pack of packs of packs would grow)
        ways = ["pack", "pack", "derive"] if sum(nbytes_of(v) for v in values) <= 64 * MiB else ["derive"]
        if isinstance(first, (list, tuple, dict)) and len(first):
            ways += ["pick", "pick"]
        if (isinstance(first, np.ndarray) and first.ndim >= 1) or isinstance(first, (bytes, bytearray)):
            ways += ["view"]
        if all(isinstance(v, (np.ndarray, bytes, bytearray)) for v in values) and \
                sum(nbytes_of(v) for v in values) <= 16 * MiB:
            ways += ["concat"]
        how = r.choice(ways)
        if how == "pack":
            return ("pack", r.choice(("list", "tuple", "dict")), self.value_spec() if r.random() < 0.5 else None)
        if how == "derive":
            return ("derive", self.value_spec())
        if how == "pick":
            path, v = [], first
            while isinstance(v, (list, tuple, dict)) and len(v) and (not path or r.random() < 0.5):
                step = r.choice(list(v)) if isinstance(v, dict) else r.randrange(len(v))
                path.append(step)
                v = v[step]
            return ("pick", tuple(path))
        if how == "view":
            if isinstance(first, np.ndarray):
                return ("view", r.choice(("T", "rev", "step")))
            return ("view", "rev")
        return ("concat",)

    def op_combine(self, chosen: Optional[list] = None, worker: Optional[str] = None) -> Entry:
        r = self.rng
        chosen = self.inputs(3) if chosen is None else chosen
        fresh = [self.new_value() for _ in range(r.choice((0, 0, 1, 2)) if chosen else r.randint(1, 2))]
        args, parents, shown = self.arguments(chosen, 0.1)
        args += fresh
        shown += [f"new {describe(v)}" for v in fresh]
        values = [e.value for e in chosen] + fresh
        recipe = self.recipe(values)
        w = worker or self.another(*(e.home for e in chosen[:1]))
        self.doing(f"combine {recipe[0]}{recipe[1:2] if recipe[0] in ('pack', 'pick', 'view') else ''} "
                   f"of {shown} on {w}")
        expected = [fingerprint(v) for v in values]
        value = apply(recipe, tuple(values))
        if recipe[0] in ("derive", "concat"):
            self.made += nbytes_of(value)
        elif recipe[0] == "pack":           # its new value, if it has one
            self.made += max(0, nbytes_of(value) - sum(nbytes_of(v) for v in values))
        fut = self.submit(combine, recipe, expected, *args, worker=w)
        return self.add(fut, value, f"#{self.opno} {self.op}", parents, inputs=len(values), home=w)

    def op_chain(self) -> None:
        """A task of a task of a task, each on another worker, each with more inputs now and then."""
        chosen = self.inputs(1)
        if not chosen:
            return self.op_make()
        e, w = chosen[0], chosen[0].home
        for _ in range(self.rng.randint(2, 4)):
            w = self.another(w)
            more = [x for x in self.inputs(2) if x is not e] if self.rng.random() < 0.5 else []
            e = self.op_combine([e] + more, w)

    def op_gather(self) -> bool:
        if not self.entries:
            return False
        chosen = self.rng.sample(self.entries, min(len(self.entries), self.rng.randint(1, 10)))
        via = self.rng.choice(("gather", "result"))
        self.doing(f"fetch {[e.name for e in chosen]} by {via}")
        self.verify(chosen, via)

    def op_replicate(self) -> bool:
        chosen = [e for e in self.inputs(3) if not self.may_fail(e)]
        n = self.rng.choice((2, None))
        if len(self.workers()) < 2 or not chosen:
            return False
        self.doing(f"replicate {[e.name for e in chosen]} n={n}")
        self.client.replicate([e.fut for e in chosen], n=n, timeout=TIMEOUT)

    def op_cancel(self) -> bool:
        r = self.rng
        recent = self.pool[-6:]
        if not recent:
            return False
        chosen = r.sample(recent, min(len(recent), r.randint(1, 2)))
        how = r.choice(("client.cancel", "Future.cancel"))
        self.doing(f"cancel {[e.name for e in chosen]} by {how}")
        if how == "client.cancel":
            self.client.cancel([e.fut for e in chosen])
        else:
            for e in chosen:
                e.fut.cancel()
        self.cancelled |= {e.name for e in chosen}
        self.pool = [e for e in self.pool if not e.lineage & self.cancelled]     # no new reader for them

    def op_drop(self) -> bool:
        r = self.rng
        if not self.pool:
            return False
        chosen = r.sample(self.pool, min(len(self.pool), r.randint(1, 3)))
        checked = r.random() < 0.5
        self.doing(f"drop {[e.name for e in chosen]}" + (" after fetching them" if checked else ""))
        if checked:
            self.verify(chosen, "result")
        self.let_go(chosen)

    def op_kill(self) -> bool:
        names = self.workers()
        victim = self.pick(names)
        if self.kills >= self.cfg.kills or len(names) < 2:
            return False
        self.doing(f"SIGKILL {victim}")
        # Scattered data every holder of which is killed is lost: the futures computed from it
        # (held, or still running for one) may raise LostDataError from now on.
        roots = frozenset().union(*(e.roots for e in self.entries))
        holders = self.client.who_has(None) if roots else {}
        dead = self.killed | {victim}
        self.lost_ok |= {key for key in roots if set(holders.get(key, ())) <= dead}
        # Scattered data let go of cannot make again a result computed from it that dies here.
        self.lost_ok |= roots - {e.fut.key for e in self.entries if e.roots == {e.fut.key}}
        deaths = len(self.cluster.deaths)
        os.kill(self.cluster.workers[victim].pid, signal.SIGKILL)
        self.killed.add(victim)
        self.kills += 1
        # Known to the scheduler before the next op: data scattered from now on goes elsewhere.
        _until(lambda: len(self.cluster.deaths) > deaths, f"the death of {victim} was recorded")

    def op_spill(self) -> bool:
        """Wait until a worker holding values in memory has spilled some of them (its heartbeat
        spills while its RSS is past the target: always, at 1 % of 1 GiB), so that the next
        reads of its values reload them."""
        x = self.rng.random()
        held = {n: i for n, i in self.cluster.workers.items() if i.managed >= OOB}
        if not held:
            return False
        name = sorted(held)[min(int(x * len(held)), len(held) - 1)]
        before = held[name]
        self.doing(f"wait until {name} spills (managed {before.managed} B, spilled {before.spilled} B)")

        def spilled() -> bool:
            now = self.cluster.workers.get(name)
            return now is None or now.spilled > before.spilled or now.managed < before.managed
        _until(spilled, f"{name} spilled", timeout=TIMEOUT)
        self.spills += 1

    # --- the program ---------------------------------------------------------------------------

    def weights(self) -> dict:
        w = dict(make=22, scatter=8, relay=20, combine=18, chain=6, gather=6, replicate=3, cancel=3, drop=4)
        if self.cfg.kills:
            w["kill"] = 3
        if self.cfg.spill:
            w["spill"] = 4
        return w

    def run(self) -> None:
        weights = self.weights()
        ops, odds = list(weights), list(weights.values())
        # Where the cluster kills or spills, a program kills a worker and waits for a spill
        # at least once, in its middle, whatever its draws.
        n = self.budget.ops
        due = {self.rng.randrange(n // 4, 3 * n // 4): "kill"} if self.cfg.kills else {}
        if self.cfg.spill:
            due[self.rng.randrange(n // 4, 3 * n // 4)] = "spill"
        for self.opno in range(n):
            name = self.rng.choices(ops, odds)[0]
            if self.opno in due and not (self.kills if due[self.opno] == "kill" else self.spills):
                name = due[self.opno]
            self.op = name
            self.last_ops.append(f"#{self.opno} {name}")
            try:
                done = getattr(self, f"op_{name}")()
            except AssertionError:
                raise
            except BaseException as error:  # noqa: BLE001 - any error is a failure, with the op
                raise self.failure(f"{type(error).__name__}: {error}") from error
            if done is not False:       # False: nothing to do it on (no value yet, no spill due...)
                self.stats.ops[name] += 1
            self.said_nothing_wrong()
            held = sum(e.nbytes for e in self.pool)
            if held > self.budget.pool:         # the oldest values: checked, then let go
                oldest, total = [], 0
                for e in self.pool:
                    oldest.append(e)
                    total += e.nbytes
                    if held - total <= self.budget.pool // 2:
                        break
                self.doing(f"check and let go of the {len(oldest)} oldest values ({total} B)")
                self.verify(oldest, "gather")
                self.let_go(oldest)
        self.opno += 1
        self.op = "end"
        self.doing("fetch everything left, shuffled")
        half = len(self.entries) // 2
        entries = list(self.entries)
        self.rng.shuffle(entries)
        self.verify(entries[:half], "gather")
        self.verify(entries[half:], "result")
        self.said_nothing_wrong()
        self.entries, self.pool = [], []
        self.stats.programs += 1


def _until(predicate, what: str, timeout: float = 30.0) -> None:
    """Poll for a state another process changes (a death noticed, a spill done by the heartbeat)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached in {timeout:g} s: {what}")
        time.sleep(0.005)


# --- running them -------------------------------------------------------------------------------

@contextlib.contextmanager
def counted_copies(mp: pytest.MonkeyPatch, stats: Stats):
    """Count the parent's copies into and out of workers (none may happen by memfd only)."""
    counts = collections.Counter()
    write_to, read_from = vmcopy.write_to, vmcopy.read_from

    def counted_write(pid, buf, remote):
        counts["into"] += 1
        return write_to(pid, buf, remote)

    def counted_read(pid, remote, n, into=None):
        counts["out of"] += 1
        return read_from(pid, remote, n, into)
    mp.setattr(vmcopy, "write_to", counted_write)
    mp.setattr(vmcopy, "read_from", counted_read)
    yield counts
    stats.copies.update(counts)


@contextlib.contextmanager
def watching_transfers():
    handler = Transfers()
    logger = logging.getLogger("localcluster")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


def run_programs(cluster: Any, client: Any, cfg: Config, seed: int, first: int, budget: Budget, stats: Stats,
                 replay: str, programs: int = 1, until: Optional[float] = None) -> int:
    """Play programs ``first``, ``first + 1``, ... on one cluster: ``programs`` of them, or
    until the monotonic time ``until``. Returns the number of the next."""
    number = first
    deaths = len(cluster.deaths)
    kills = 0
    with watching_transfers() as transfers:
        while (number - first < programs) if until is None else (time.monotonic() < until or number == first):
            program = Program(cluster, client, cfg, seed, number, budget, stats, transfers, replay)
            program.run()
            kills += program.kills
            number += 1
            del program
    _until(lambda: len(cluster.deaths) >= deaths + kills, f"{kills} deaths recorded")
    new = cluster.deaths[deaths:]
    assert len(new) == kills and all(d.cause == "signal" for d in new), \
        f"seed {seed} ({cfg.name}): deaths other than the test's {kills} kills: {[d.message for d in new]}"
    stats.rounds[cfg.name] += 1
    return number


def settled(cluster: Any, seed: int, cfg: Config) -> None:
    """Every future let go: no worker holds or spills anything."""
    def empty() -> bool:
        gc.collect()        # a future in a reference cycle is let go by the collector
        return all(i.managed == 0 and i.spilled == 0 for i in cluster.workers.values())
    try:
        _until(empty, "every worker's managed and spilled bytes back to 0")
    except AssertionError:
        raise AssertionError(f"seed {seed} ({cfg.name}): data left on the workers after every future was let go: "
                             f"{ {n: (i.managed, i.spilled) for n, i in cluster.workers.items()} } (managed, spilled "
                             f"bytes); the scheduler's keys: {sorted(cluster.scheduler.tasks)[:20]}") from None


@contextlib.contextmanager
def cluster_of(cfg: Config, stats: Stats):
    """A cluster (and client) of ``cfg``, by memfd only if it says so: the parent's verdict on
    process_vm_readv/writev is set before the workers start, as under Yama's ptrace_scope 2."""
    with pytest.MonkeyPatch.context() as mp, counted_copies(mp, stats) as copies:
        if cfg.memfd_only:
            mp.setattr(vmcopy, "_verdict", False)
        with localcluster.LocalCluster(forward_logs=False, **cfg.cluster) as cluster, \
                localcluster.Client(cluster) as client:
            yield cluster, client
        if cfg.memfd_only:
            assert not copies, f"the parent copied with process_vm_readv/writev by memfd only: {dict(copies)}"


def replay_line(seed: int, request: Any) -> str:
    return f"LOCALCLUSTER_SEED={seed} pytest '{request.node.nodeid}'" + (" -m slow" if "slow" in request.keywords
                                                                           else "")


@pytest.fixture
def fixed_seed(request):
    """The quick tier's seed: fixed, or LOCALCLUSTER_SEED when set (printed, as ``seed`` does)."""
    value = int(os.environ.get("LOCALCLUSTER_SEED") or FAST_SEED)
    print(f"seed {value} (replay: LOCALCLUSTER_SEED={value} pytest '{request.node.nodeid}')")
    return value


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    with localcluster.LocalCluster(n_workers=2, forward_logs=False) as cluster, localcluster.Client(cluster) as client:
        # The done-callbacks thread starts on first use: now, on a future surely pending (its
        # task waits for a marker file), so that no test sees a new thread.
        marker = str(tmp_path_factory.mktemp("differential") / "go")
        pending = client.submit(released, marker, pure=False)
        pending.add_done_callback(lambda f: None)
        release(marker)
        pending.result(TIMEOUT)
        del pending
        client.gather(client.map(make_value, [("bytes", (0, i), 10) for i in range(4)], pure=False))
        yield cluster, client


# --- the quick tier: a fixed seed, a small budget ---------------------------------------------

@pytest.mark.timeout(120)
def test_random_programs_of_moves_give_the_values_computed_here(pair, fixed_seed, request):
    cluster, client = pair
    stats = Stats()
    run_programs(cluster, client, CONFIGS["plain"], fixed_seed, 0, FAST, stats, replay_line(fixed_seed, request),
                 programs=2)
    settled(cluster, fixed_seed, CONFIGS["plain"])
    print(stats)
    assert stats.values > 0


@pytest.mark.slow       # the quick tier keeps the plain programs; CI runs these under 3.10 and 3.13 too
@pytest.mark.timeout(120)
@pytest.mark.parametrize("config,offset", [("spill-kills", 100), ("memfd", 200)])
def test_random_programs_with_spills_and_kills_or_by_memfd_only(config, offset, fixed_seed, request):
    stats = Stats()
    cfg = CONFIGS[config]
    with cluster_of(cfg, stats) as (cluster, client):
        run_programs(cluster, client, cfg, fixed_seed, offset, FAST, stats, replay_line(fixed_seed, request),
                     programs=2)
        settled(cluster, fixed_seed, cfg)
    print(stats)
    if config == "spill-kills":
        assert stats.ops["kill"] >= 1 and stats.ops["spill"] >= 1, stats


# --- the slow test: a fresh seed, every configuration in turn ----------------------------------

ROUND_SECONDS = 40.0        # one cluster's share of a LOCALCLUSTER_DIFF_SECONDS loop
ROUNDS = ("plain", "spill", "kills", "memfd", "spill-kills", "memfd-spill-kills")


@pytest.mark.slow
@pytest.mark.timeout(int(SECONDS * 1.2) + 600 if SECONDS else 600)
def test_random_programs_for_a_while(seed, request):
    """Every configuration in turn, a program each (a fresh seed each run); with LOCALCLUSTER_DIFF_SECONDS, rounds of
    about 40 s each, in turn, until that many seconds have passed (and each configuration had
    one at least)."""
    stats = Stats()
    replay = replay_line(seed, request)
    start = time.monotonic()
    number, turn = 0, 0
    while True:
        cfg = CONFIGS[ROUNDS[turn % len(ROUNDS)]]
        with cluster_of(cfg, stats) as (cluster, client):
            if SECONDS:
                until = min(start + SECONDS, time.monotonic() + ROUND_SECONDS)
                number = run_programs(cluster, client, cfg, seed, number, SLOW, stats, replay, until=until)
            else:
                number = run_programs(cluster, client, cfg, seed, number, SLOW, stats, replay)
            settled(cluster, seed, cfg)
        turn += 1
        print(f"{time.monotonic() - start:.0f} s, round {turn} ({cfg.name}): {stats.values} values checked")
        if turn >= len(ROUNDS) and (not SECONDS or time.monotonic() - start >= SECONDS):
            break
    print(stats)
    # 6 programs of SLOW's budget check this many values at the least unless their ops did not
    # run; a few seconds asked: a round of each
    least = 700 if not SECONDS or SECONDS >= 120 else 1
    assert stats.values >= least and stats.ops["kill"] >= 1 and stats.ops["spill"] >= 1, stats
