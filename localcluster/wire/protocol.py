"""The messages between the parent and a worker: one small frozen class per meaning.

A message travels as a pickle (protocol 5) of the instance; user data inside it
is a :class:`Payload` whose large buffers leave the pickle stream and cross as
memfd file descriptors, or are copied by the parent (``channel.py``), so a large array
is never copied through the socket. A lone Run or Finished with small data, the two messages of every
round trip, travels in a fixed layout instead (:func:`pack_lone`), and so do the other
messages of a task's way there and back (Failed, Skipped, Cancel, Free): each pickle call
costs a fixed overhead that a batch of runs shares and a lone message pays alone.

Task identity on the wire is ``seq``, a number the parent gives each assignment:
a task that is re-run after a death gets a new ``seq``, so a late message about
an old run can never be mistaken for the new one.
"""
from __future__ import annotations

import operator
import pickle
import struct
import zlib
from array import array
from typing import TYPE_CHECKING, Any, Optional, TypeVar

if TYPE_CHECKING:   # typing's own from 3.11 (frozen_default from 3.12); type checkers know both on 3.10
    from typing_extensions import dataclass_transform
else:               # a marker only type checkers read: at run time the package needs no typing_extensions
    def dataclass_transform(**_: Any) -> Any:
        return lambda decorated: decorated

# The size thresholds of the data path, in one place.
INLINE_RESULT = 1 << 16      # results this small travel with Finished and are kept in the parent
OUT_OF_BAND = 1 << 16        # pickle buffers this large leave the pickle stream
MEMFD_THRESHOLD = 1 << 20    # out-of-band buffers this large cross as a memfd, not through the socket


_MISSING = object()


_C = TypeVar("_C")


# For type checkers: a message class is a frozen dataclass, its __init__ taking its fields in order.
@dataclass_transform(frozen_default=True, eq_default=True)
def _dc(cls: type[_C]) -> type[_C]:
    """A frozen class with a slot per annotated field, ``__init__`` taking them in order
    (later ones may have defaults), equality and hash by value, a repr, and a pickle
    of ``(cls, (field, ...))``: one C-level attrgetter call per message.

    Not ``dataclasses.dataclass(frozen=True, slots=True)``: making the classes with it was
    a large part of what a worker spent importing before it could say Ready (each class is
    made twice, with half a dozen generated methods). The ``__init__`` is the one dataclasses
    writes, written at the class's first instance (``_first_init``)."""
    names = tuple(cls.__annotations__)       # in definition order
    ns = {k: v for k, v in cls.__dict__.items() if k not in names and k not in ("__dict__", "__weakref__")}
    ns["__slots__"] = names
    ns["field_defaults"] = {n: cls.__dict__[n] for n in names if n in cls.__dict__}
    ns["__init__"] = _first_init
    ns["__setattr__"] = ns["__delattr__"] = _frozen
    ns["__eq__"], ns["__hash__"], ns["__repr__"] = _eq, _hash, _repr
    new: Any = type(cls.__name__, cls.__bases__, ns)
    if len(names) > 1:
        get = operator.attrgetter(*names)
        new.__reduce__ = lambda self: (new, get(self))
    elif names:
        get1 = operator.attrgetter(names[0])
        new.__reduce__ = lambda self: (new, (get1(self),))
    else:
        new.__reduce__ = lambda self: (new, ())
    new.fields = names
    return new


def _first_init(self: Any, *args: Any, **kwargs: Any) -> None:
    """A message class's ``__init__`` until its first instance, which writes the real one:
    compiling it for every class at import would be most of this module's import, and a
    worker makes a handful of them before its first result."""
    cls = type(self)
    names, defaults = cls.fields, cls.field_defaults
    params = ", ".join(f"{n}=_d_{n}" if n in defaults else n for n in names)
    body = "".join(f"\n    _set(self, {n!r}, {n})" for n in names) or "\n    pass"
    scope = {"_set": object.__setattr__, **{f"_d_{n}": v for n, v in defaults.items()}}
    exec(f"def __init__(self, {params}):{body}", scope)
    init = scope["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    cls.__init__ = init
    init(self, *args, **kwargs)


def _frozen(self: Any, name: str, value: Any = _MISSING) -> None:
    raise AttributeError(f"{type(self).__name__} is frozen: cannot change {name!r}")


def _eq(self: Any, other: Any) -> Any:
    if type(other) is not type(self):
        return NotImplemented
    return self.__reduce__() == other.__reduce__()


def _hash(self: Any) -> int:
    return hash(self.__reduce__())


def _repr(self: Any) -> str:
    return f"{type(self).__name__}({', '.join(f'{n}={v!r}' for n, v in zip(self.fields, self.__reduce__()[1]))})"


@_dc
class Payload:
    """User data pickled with cloudpickle; ``buffers`` are its out-of-band pickle-5 buffers.
    ``seals``: what the parts that leave the pickle stream must be wherever they land
    (:func:`seal`), made once where the value is pickled and carried with it; () when every
    part is in the stream, where the frame's order keeps them."""
    meta: Any          # bytes, or a PickleBuffer when large (so it too leaves the stream)
    buffers: tuple     # PickleBuffers, always: so a Payload can be sent on as it arrived
    nbytes: int
    seals: tuple = ()  # (the meta's seal, or 0 when it is in the stream, then one per buffer)


# How many words a seal samples, spread over a buffer besides its two ends: enough to tell one
# value's buffer from another's, few enough that a seal costs the same at any size.
_WORDS = 512


def seal(buf: Any) -> int:
    """What a buffer of a payload must be where it lands: its length, and a CRC-32 of its first
    and last 64 bytes and of 512 eight-byte words spread over it (at an odd stride, so that
    samples fall at every offset of a larger element), at the same cost whatever the size: it tells a
    buffer from another value's, a shorter or longer one, or memory never written; not a single
    flipped bit between the samples of a large one."""
    view = buf.raw() if type(buf) is pickle.PickleBuffer else memoryview(buf).cast("B")
    n = view.nbytes
    if n <= 16 * _WORDS:
        crc = zlib.crc32(view)
    else:
        words = view[:n - n % 8].cast("Q")
        crc = zlib.crc32(view[:64])
        crc = zlib.crc32(words[::(len(words) // _WORDS) | 1].tobytes(), crc)
        crc = zlib.crc32(view[-64:], crc)
    return n << 32 | crc


def seals_of(meta: Any, buffers: Any) -> tuple:
    """The seals of a payload's parts that leave the pickle stream; () when none do."""
    large_meta = type(meta) is not bytes
    if not buffers and not large_meta:
        return ()
    return (seal(meta) if large_meta else 0, *map(seal, buffers))


def broken_seal(payload: "Payload") -> Optional[str]:
    """None when every out-of-band part of ``payload`` is what it was sealed as; else what
    differs, for the error (which part, its length and seal against the expected)."""
    seals = payload.seals
    if not seals:
        return None
    buffers = payload.buffers
    if len(seals) != len(buffers) + 1:
        return f"{len(buffers)} buffers arrived where {len(seals) - 1} were sent"
    parts = ((seals[0], payload.meta),) if seals[0] else ()
    for i, (want, part) in enumerate((*parts, *zip(seals[1:], buffers))):
        got = seal(part)
        if got != want:
            which = "the pickle stream" if i == 0 and parts else f"buffer {i - len(parts) + 1} of {len(buffers)}"
            return (f"{which}: {got >> 32:,} bytes with seal {got & 0xFFFFFFFF:08x} arrived where "
                    f"{want >> 32:,} bytes with seal {want & 0xFFFFFFFF:08x} were sent")
    return None


SHARED_MAX_BYTES = 24
SHARED_MAX = 4096


def shared(payload: Optional[Payload], memo: dict) -> Optional[Payload]:
    """``payload``, or an equal one already in ``memo``. Small values repeat (None, True,
    small ints): the parent keeps one Payload for each, so that a big map's 200,000
    finished no-ops do not each hold their own (~100 B a task). Bounded: once ``memo``
    holds ``SHARED_MAX``, what is new is kept as it came."""
    if payload is None or payload.buffers:
        return payload
    meta = payload.meta
    if type(meta) is not bytes or len(meta) > SHARED_MAX_BYTES:
        return payload
    known = memo.get(meta)
    if known is not None and known.nbytes == payload.nbytes:
        return known
    if len(memo) < SHARED_MAX:
        memo[meta] = payload
    return payload


def _payload_from_wire(meta: Any, buffers: tuple, nbytes: int, seals: tuple = ()) -> Payload:
    # pickle hands a read-only out-of-band buffer back as a memoryview (READONLY_BUFFER);
    # wrap it again, or the Payload could not be pickled out-of-band a second time.
    if type(meta) is memoryview:
        meta = pickle.PickleBuffer(meta)
    if buffers and any(type(b) is not pickle.PickleBuffer for b in buffers):
        buffers = tuple(b if type(b) is pickle.PickleBuffer else pickle.PickleBuffer(b) for b in buffers)
    return Payload(meta, buffers, nbytes, seals)


def _payload_reduce(self: Payload) -> tuple:
    return (_payload_from_wire, (self.meta, self.buffers, self.nbytes, self.seals)
            if self.seals else (self.meta, self.buffers, self.nbytes))


Payload.__reduce__ = _payload_reduce  # Payload's own, in place of _dc's


# --- parent -> worker ------------------------------------------------------------------

@_dc
class Run:
    """Run a task. ``fn`` is sent once per worker per function (cached under ``fn_id``)."""
    seq: int
    key: str
    fn_id: int
    fn: Optional[bytes]
    args: Payload
    deps: tuple           # keys that must be in the worker's store before it starts


@_dc
class Put:
    """Store data under ``key`` (a scattered value, or a dependency relayed from another worker).
    ``ack``: when not 0, answer :class:`Stored` with it once stored (``replicate`` waits for that)."""
    key: str
    data: Payload
    ack: int = 0
    origin: str = ""    # where the bytes come from (the worker it was relayed from, the client), for a Damaged


@_dc
class Export:
    """Send the data of ``key`` back (for a gather, or to relay it to another worker).
    ``locate``: the parent may copy out of this worker itself (wire/vmcopy.py): answer a
    large value with :class:`Located` instead of :class:`Data`."""
    key: str
    request: int
    locate: bool = False


@_dc
class Free:
    """Drop these keys from the store (memory and spill)."""
    keys: tuple


@_dc
class Cancel:
    """Do not start these queued runs (already-running ones finish and are ignored)."""
    seqs: tuple


@_dc
class Steal:
    """Give back these queued runs if they have not started: a worker with idle threads
    will take them (a run already under way finishes here as usual)."""
    seqs: tuple


@_dc
class Stop:
    """Exit cleanly."""


@_dc
class Call:
    """Run ``fn(*args, **kwargs)`` now, outside the task slots (``Client.run``): ``args`` is
    the pickled ``(args, kwargs)``. Answered by :class:`Called` with the same ``request``.
    The calls of one ``queue`` (an actor's key) run one at a time, in the order they came;
    those of none each at once."""
    request: int
    fn: bytes
    args: Payload
    queue: str = ""


# --- worker -> parent ------------------------------------------------------------------

@_dc
class Ready:
    pid: int
    versions: dict


@_dc
class Finished:
    """A run succeeded. ``data`` is the result itself when it is small (saves a round trip).
    ``start`` (unix seconds), ``duration`` and ``thread`` (the executor, 1..n) feed the task stream;
    ``serde``: the seconds of ``duration`` spent unpickling the function and arguments and
    pickling the result (cluster.insights())."""
    seq: int
    nbytes: int
    type_name: str
    data: Optional[Payload]
    duration: float
    start: float = 0.0
    thread: int = 0
    serde: float = 0.0


@_dc
class Failed:
    """A run failed in user code or in (un)pickling; ``error`` is a pickled exception."""
    seq: int
    error: bytes
    start: float = 0.0
    duration: float = 0.0
    thread: int = 0


@_dc
class Skipped:
    """A cancelled run was dropped before it started."""
    seq: int


@_dc
class Unqueued:
    """The answer to Steal: of the runs ``asked`` for, those ``taken`` out of the queue
    before they started."""
    asked: tuple
    taken: tuple


@_dc
class Data:
    """Reply to :class:`Export`: the data, or the pickled error that stopped it."""
    request: int
    key: str
    data: Optional[Payload]
    error: Optional[bytes]


@_dc
class Located:
    """Reply to ``Export(locate=True)``: where the value's pickled parts are in the worker's
    memory, for the parent to copy out (``process_vm_readv``). The worker keeps them there,
    unchanged, until :class:`Unpin` of the same request (or its death)."""
    request: int
    key: str
    meta: Any           # the pickle's bytes, or (address, nbytes) when large
    spans: tuple        # (address, nbytes) of each out-of-band buffer, in order
    nbytes: int
    seals: tuple = ()   # the Payload's: what the parent must find there


@_dc
class Damaged:
    """A value arrived, or was read, other than it was sealed as (:func:`broken_seal`):
    localcluster lost track of a transfer, and the copy is not used. ``key``: the value whose
    copy on this worker is damaged ("" when it was a run's own arguments); ``seq``: the run
    that could not start for it (0: none); ``request``: the Export it answered (0: none; the
    parent makes those itself when a copy out of a holder breaks its seal). ``detail``: what
    differs. The parent drops that copy and gets the value again, from another copy or by
    computing it again."""
    key: str
    seq: int
    request: int
    detail: str


@_dc
class Landing:
    """Worker to parent: where to copy the large buffers of a frame it received (each stashed
    under a token by the parent's channel): ((token, address), ...), fresh memory of this
    worker, filled by the parent (``process_vm_writev``) before the message is used."""
    where: tuple


@_dc
class Landed:
    """Parent to worker: the buffers of those tokens are in (``ok``), or could not be."""
    tokens: tuple
    ok: bool = True


@_dc
class Unpin:
    """The parent has copied what :class:`Located` showed (or gave up): the worker lets go."""
    request: int


@_dc
class Called:
    """Reply to :class:`Call`: the function's result, or the pickled exception it raised."""
    request: int
    data: Optional[Payload]
    error: Optional[bytes]


@_dc
class Stored:
    """Reply to a :class:`Put` that asked for an acknowledgement: the data is in the store."""
    ack: int


@_dc
class Fatal:
    """The worker's own machinery failed; it exits right after sending this."""
    traceback: str


@_dc
class Pressure:
    """The worker's own RSS crossed memory_pause, seen as it was about to start a run: the
    parent pauses it now rather than at its next sample, while the runs it prefetched can
    still be asked back (a leak of a few MiB per short task crosses the rest of the budget
    between two samples)."""
    rss: int


@_dc
class Log:
    """Python logging records of the worker, flattened to dicts (see logs.py)."""
    records: tuple


@_dc
class Batch:
    """Several messages in one frame, to amortise a syscall and a wake-up."""
    messages: tuple


# --- a running task and the parent's scheduler (get_client, secede, ...) -------------------
#
# One generic pair: a task asks (:class:`Ask`: the worker's request id, the asking run's seq,
# and one body below, a class per meaning), the parent answers that task (:class:`Answer`,
# same request id). A body that wants no answer goes with request 0. Coordination
# primitives (Lock, Event, Queue, ...) are more bodies on the same pair.

@_dc
class Ask:
    """worker -> parent: a request from the task run ``seq`` (0: from no run)."""
    request: int
    seq: int
    body: Any


@_dc
class Answer:
    """parent -> worker: the answer to :class:`Ask` ``request``: ``data``, or the pickled
    exception ``error`` that stops it."""
    request: int
    data: Any
    error: Optional[bytes] = None


@_dc
class NewTask:
    """A task submitted from a task (a Spec less the function id, which the parent gives)."""
    key: str
    fn: bytes
    args: Payload
    deps: tuple
    priority: int = 0
    retries: int = 0
    timeout: Optional[float] = None
    workers: Optional[frozenset] = None
    loose: bool = False
    resources: Optional[tuple] = None


@_dc
class Submit:
    """Body: run these NewTasks; the asking worker holds one reference to each key. No answer."""
    tasks: tuple


@_dc
class Results:
    """Body: the outcome of each key, once each has ended. Answered with a tuple of
    ``(status, Payload or None, pickled error or None)``, one per key."""
    keys: tuple


@_dc
class States:
    """Body: the scheduler's state of each key, now. Answered with a tuple of strings."""
    keys: tuple


@_dc
class Scatter:
    """Body: data from a task, ``((key, Payload), ...)``, held by the asking worker, placed as
    the Client's scatter places it: on ``workers`` (names; None: any), on each of them with
    ``broadcast``, on any worker when none of them runs and ``loose``. No answer."""
    items: tuple
    broadcast: bool = False
    workers: Optional[tuple] = None
    loose: bool = False


@_dc
class Hold:
    """Body: one more reference to each key (a Future unpickled in the worker). No answer."""
    keys: tuple


@_dc
class Drop:
    """Body: one reference less to each key (a Future gone in the worker). No answer."""
    keys: tuple


@_dc
class Secede:
    """Body: the asking run gave its thread slot back (secede()). No answer. ``started``
    (monotonic seconds) and ``thread`` (its ident) are its row of the status board, which it
    leaves: the parent watches its timeout and names its thread from them instead."""
    started: float = 0.0
    thread: int = 0


@_dc
class Rejoin:
    """Body: the asking run took a thread slot again (rejoin()). No answer."""


# --- a task's cancel, run, who_has and scheduler_info (TaskClient, worker/client.py) -------

@_dc
class CancelKeys:
    """Body: cancel these keys' tasks and let go of their data, for every holder (dask's
    ``cancel``, as ``Client.cancel`` does it: force). No answer."""
    keys: tuple


@_dc
class RunOn:
    """Body: ``Client.run`` from a task: ``fn`` (pickled) with ``args`` (the pickled ``(args,
    kwargs)``) on each worker, or those named (None: every open one). Answered once every
    worker has, with ``((worker, (status, Payload or None, pickled error or None)), ...)``;
    request 0 (``wait=False``): not answered. ``name``: the function's, for errors."""
    fn: bytes
    args: Payload
    workers: Optional[tuple] = None
    name: str = "function"


@_dc
class WhoHas:
    """Body: the workers holding each key's data (None: every key). Answered with a dict of
    key -> sorted tuple of worker names."""
    keys: Optional[tuple] = None


@_dc
class Info:
    """Body: the workers, for ``scheduler_info``. Answered with ``((name, threads, resources
    dict), ...)`` of each open worker, by name."""


# --- the fixed layout of a lone Run, Finished, Failed, Skipped, Cancel or Free ----------
#
# The messages of a task's way there and back, one per frame when nothing else is queued:
# a pickle's fixed cost is most of what framing one of them costs.
# Tag byte first: a pickle starts with PROTO (0x80), so the receiver tells them apart.
# Strings are UTF-8 with surrogatepass (any str comes back as it was). Only what the layout
# holds exactly is packed; anything else (dependencies, buffers, a value out of range, a
# start that is not a float) goes as a pickle.

_RUN = struct.Struct("<BQqQIiI")      # tag, seq, fn_id, args.nbytes, len(key), len(fn) or -1, len(args.meta)
_FIN = struct.Struct("<BQQdddIIiQ")   # tag, seq, nbytes, duration, start, serde, thread, len(type_name),
#                                       len(data.meta) or -1, data.nbytes
_FAIL = struct.Struct("<BQddII")      # tag, seq, start, duration, thread, len(error)
_SKIP = struct.Struct("<BQ")          # tag, seq
_MANY = struct.Struct("<BI")          # tag, count: then Cancel's seqs (u64 each), or Free's key lengths (u32 each) and keys
_RUN_TAG, _FIN_TAG, _FAIL_TAG, _SKIP_TAG, _CANCEL_TAG, _FREE_TAG = 0x52, 0x46, 0x58, 0x53, 0x43, 0x44   # R F X S C D


def pack_lone(msg: Any) -> Optional[bytes]:
    """``msg`` in the fixed layout, or None: then it goes as a pickle."""
    t = type(msg)
    try:
        if t is Run:
            args, fn = msg.args, msg.fn
            if msg.deps or args.buffers or (fn is not None and type(fn) is not bytes):
                return None
            meta = args.meta        # read once: serialize.PlainArgs pickles on each read
            if type(meta) is not bytes:
                return None
            nbytes = args.nbytes if type(args) is Payload else len(meta)
            key = msg.key.encode("utf-8", "surrogatepass")
            head = _RUN.pack(_RUN_TAG, msg.seq, msg.fn_id, nbytes, len(key), -1 if fn is None else len(fn),
                             len(meta))
            return b"".join((head, key, fn, meta)) if fn is not None else head + key + meta
        if t is Finished:
            data = msg.data
            if type(msg.duration) is not float or type(msg.start) is not float or type(msg.serde) is not float or (
                    data is not None and (data.buffers or type(data.meta) is not bytes)):
                return None
            name = msg.type_name.encode("utf-8", "surrogatepass")
            if data is None:
                return _FIN.pack(_FIN_TAG, msg.seq, msg.nbytes, msg.duration, msg.start, msg.serde, msg.thread, len(name),
                                 -1, 0) + name
            return _FIN.pack(_FIN_TAG, msg.seq, msg.nbytes, msg.duration, msg.start, msg.serde, msg.thread, len(name),
                             len(data.meta), data.nbytes) + name + data.meta
        if t is Failed:
            if type(msg.error) is not bytes or type(msg.start) is not float or type(msg.duration) is not float:
                return None
            return _FAIL.pack(_FAIL_TAG, msg.seq, msg.start, msg.duration, msg.thread, len(msg.error)) + msg.error
        if t is Skipped:
            return _SKIP.pack(_SKIP_TAG, msg.seq)
        if t is Cancel:
            seqs = msg.seqs
            if type(seqs) is not tuple or any(type(q) is not int for q in seqs):
                return None
            return _MANY.pack(_CANCEL_TAG, len(seqs)) + array("Q", seqs).tobytes()     # one host: native order
        if t is Free:
            keys = msg.keys
            if type(keys) is not tuple or any(type(k) is not str for k in keys):
                return None
            encoded = [k.encode("utf-8", "surrogatepass") for k in keys]
            return b"".join((_MANY.pack(_FREE_TAG, len(keys)), array("I", map(len, encoded)).tobytes(), *encoded))
    except (struct.error, TypeError, AttributeError, OverflowError):    # a field the layout cannot hold
        return None
    return None


def unpack_lone(env: bytes) -> Any:
    """The message :func:`pack_lone` made; ValueError if ``env`` is not one."""
    tag = env[0] if env else None
    if tag == _RUN_TAG and len(env) >= _RUN.size:
        _, seq, fn_id, nbytes, klen, fnlen, mlen = _RUN.unpack_from(env)
        p = _RUN.size + klen
        key = env[_RUN.size:p].decode("utf-8", "surrogatepass")
        fn = None
        if fnlen >= 0:
            fn, p = env[p:p + fnlen], p + fnlen
        if p + mlen == len(env):
            return Run(seq, key, fn_id, fn, Payload(env[p:], (), nbytes), ())
    elif tag == _FIN_TAG and len(env) >= _FIN.size:
        _, seq, nbytes, duration, start, serde, thread, tlen, mlen, dn = _FIN.unpack_from(env)
        p = _FIN.size + tlen
        name = env[_FIN.size:p].decode("utf-8", "surrogatepass")
        if p + max(mlen, 0) == len(env):
            return Finished(seq, nbytes, name, None if mlen < 0 else Payload(env[p:], (), dn), duration, start, thread,
                            serde)
    elif tag == _FAIL_TAG and len(env) >= _FAIL.size:
        _, seq, start, duration, thread, elen = _FAIL.unpack_from(env)
        if _FAIL.size + elen == len(env):
            return Failed(seq, env[_FAIL.size:], start, duration, thread)
    elif tag == _SKIP_TAG and len(env) == _SKIP.size:
        return Skipped(_SKIP.unpack_from(env)[1])
    elif tag == _CANCEL_TAG and len(env) >= _MANY.size:
        n = _MANY.unpack_from(env)[1]
        if _MANY.size + 8 * n == len(env):
            seqs = array("Q")
            seqs.frombytes(env[_MANY.size:])
            return Cancel(tuple(seqs))
    elif tag == _FREE_TAG and len(env) >= _MANY.size:
        n = _MANY.unpack_from(env)[1]
        p = _MANY.size + 4 * n
        if p <= len(env):
            sizes = array("I")
            sizes.frombytes(env[_MANY.size:p])
            keys = []
            for size in sizes:
                keys.append(env[p:p + size].decode("utf-8", "surrogatepass"))
                p += size
            if p == len(env):
                return Free(tuple(keys))
    raise ValueError(f"not a message in the fixed layout: {env[:16]!r}...")


# --- coordination: Lock, Semaphore, Event, Queue, Variable (localcluster/coordination.py) ---
#
# More bodies of the Ask/Answer pair, from a task or (as the same classes, never pickled)
# from the parent's own threads. The scheduler's part ``Coordination`` keeps them. A body
# that may wait is answered when it can be; its asker may give up (:class:`Withdraw`), and
# is then answered at once with what a timeout means for that body.

@_dc
class Acquire:
    """Body: one lease of the semaphore ``name`` (a Lock: ``kind`` "lock", one lease),
    taken under the id ``lease``. Answered True once granted; False at once when ``wait``
    is False and none is free, or when withdrawn."""
    kind: str
    name: str
    lease: str
    max_leases: int
    wait: bool = True


@_dc
class Release:
    """Body: give back the lease ``lease``. Answered True, or False if it was not held
    (already given back, or released with the worker of the task that took it)."""
    kind: str
    name: str
    lease: str


@_dc
class Leases:
    """Body: how many leases of ``name`` are held now. Answered with an int."""
    kind: str
    name: str


@_dc
class SetEvent:
    """Body: set (``flag`` True) or clear the event ``name``. Answered None."""
    name: str
    flag: bool


@_dc
class WaitEvent:
    """Body: wait until the event ``name`` is set (``wait`` False: only look). Answered
    True once set; False when withdrawn, or at once when not set and not waiting."""
    name: str
    wait: bool = True


@_dc
class QueuePut:
    """Body: put ``value`` (a Payload) in the queue ``name``; ``keys``: the futures inside it,
    which the queue holds until a get takes it. Answered True once in (the queue is created
    with ``maxsize`` if new), False when withdrawn while the queue was full."""
    name: str
    value: Payload
    keys: tuple
    maxsize: int = 0


@_dc
class QueueGet:
    """Body: take from the queue ``name``: one item (``batch`` 0), every item there now
    (``batch`` -1, never waits) or ``batch`` items. Answered with a tuple of
    ``(Payload, keys)``, or None when withdrawn. The asker holds the keys until it gives them back."""
    name: str
    batch: int = 0


@_dc
class QueueSize:
    """Body: the number of items in the queue ``name``. Answered with an int."""
    name: str


@_dc
class SetVariable:
    """Body: set the variable ``name`` to ``value`` (a Payload holding futures ``keys``), or
    delete it (``value`` None). Answered None."""
    name: str
    value: Optional[Payload]
    keys: tuple = ()


@_dc
class GetVariable:
    """Body: the value of the variable ``name``, waiting until it is set. Answered with
    ``(Payload, keys)`` (the asker holds the keys until it gives them back), or None when withdrawn."""
    name: str


@_dc
class PublishDataset:
    """Body: publish ``value`` (a Payload holding futures ``keys``) as the dataset ``name``,
    for every client of the cluster. Answered True; False if the name is taken and not ``override``."""
    name: Any
    value: Payload
    keys: tuple = ()
    override: bool = False


@_dc
class GetDataset:
    """Body: the dataset ``name``. Answered with ``(Payload, keys)`` (the asker holds the keys
    until it gives them back), or None if there is none of that name."""
    name: Any


@_dc
class ListDatasets:
    """Body: the names of the datasets published. Answered with a tuple."""


@_dc
class UnpublishDataset:
    """Body: forget the dataset ``name`` (its futures are let go of). Answered True, or False
    if there was none of that name."""
    name: Any


@_dc
class LogEvent:
    """Body: ``msg`` (a Payload) logged at ``time`` (seconds since the epoch) under each of
    ``topics``. Answered None."""
    topics: tuple
    time: float
    msg: Payload


@_dc
class GetEvents:
    """Body: the events kept of ``topic`` (None: of every topic). Answered with a tuple of
    ``(time, Payload)``, or for None a dict of such tuples by topic."""
    topic: Optional[str] = None


@_dc
class NextEvents:
    """Body: the events of ``topic`` after the first ``seen`` ever logged, waiting until there
    is one (``seen`` -1: at once, with none). Answered with ``(how many were ever logged,
    ((time, Payload), ...))``, or None when withdrawn."""
    topic: str
    seen: int


@_dc
class Withdraw:
    """Body: the asker no longer waits for its request ``request``: if it is still waiting,
    answer it now with what a timeout means for it. No answer of its own."""
    request: int


COORDINATION = frozenset({Acquire, Release, Leases, SetEvent, WaitEvent, QueuePut, QueueGet, QueueSize,
                          SetVariable, GetVariable, Withdraw, PublishDataset, GetDataset, ListDatasets,
                          UnpublishDataset, LogEvent, GetEvents, NextEvents})
