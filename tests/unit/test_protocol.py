"""localcluster/wire/protocol.py on its own: every message is a small frozen value that pickles
as ``(class, fields)`` and comes back equal."""
from __future__ import annotations

import inspect
import pickle
import socket

import pytest

from localcluster.wire import protocol as P
from localcluster.wire import serialize
from localcluster import TransferError

pytestmark = pytest.mark.timeout(10)

MESSAGES = [c for c in vars(P).values() if inspect.isclass(c) and c.__module__ == P.__name__ and hasattr(c, "fields")]


def sample(cls: type, n: int = 1):
    if cls is P.Payload:
        return P.Payload(b"meta-%d" % n, (), 6)
    return cls(*(f"{name}-{n}" for name in cls.fields))


def test_every_message_class_is_found():
    assert {"Run", "Finished", "Failed", "Data", "Put", "Stop", "Batch", "Payload"} <= {c.__name__ for c in MESSAGES}


@pytest.mark.parametrize("cls", MESSAGES, ids=lambda c: c.__name__)
def test_a_message_is_a_frozen_value_that_pickles_as_its_fields(cls):
    m = sample(cls)
    assert not hasattr(m, "__dict__")
    back = pickle.loads(pickle.dumps(m, protocol=5))
    assert type(back) is cls and back == m and hash(back) == hash(m)
    if cls is not P.Payload:        # which rebuilds through _payload_from_wire
        assert m.__reduce__() == (cls, tuple(f"{name}-1" for name in cls.fields))
    if cls is not P.Payload:
        shown = ", ".join(f"{name}={value!r}" for name, value in zip(cls.fields, (f"{n}-1" for n in cls.fields)))
        assert repr(m) == f"{cls.__name__}({shown})"
    if cls.fields:
        assert sample(cls, 2) != m
        with pytest.raises(AttributeError, match="frozen"):
            setattr(m, cls.fields[0], "changed")
        with pytest.raises(AttributeError, match="frozen"):
            delattr(m, cls.fields[0])
    with pytest.raises(AttributeError):
        m.not_a_field = 1


def test_defaults_and_missing_arguments():
    assert P.Finished(1, 2, "NoneType", None, 0.5) == P.Finished(1, 2, "NoneType", None, 0.5, 0.0, 0)
    assert P.Put("k", None).ack == 0
    with pytest.raises(TypeError, match="duration"):
        P.Finished(1, 2, "NoneType", None)
    assert P.Skipped(1) != P.Stored(1)        # same fields, different meanings


# --- the fixed layout of a lone Run, Finished, Failed, Skipped, Cancel or Free -----------

def _payload(meta=b"\x80\x05K\x01.", nbytes=None, buffers=()):
    return P.Payload(meta, buffers, len(meta) if nbytes is None else nbytes)


LONE = [
    P.Run(1, "noop-0123abcd", 7, None, _payload(), ()),
    P.Run(2**64 - 1, "", -3, b"\x80\x05fn-bytes", _payload(b""), ()),
    P.Run(5, "clé-\udcff-\u2603", 0, b"", _payload(b"x" * 70_000, nbytes=123), ()),
    P.Finished(1, 5, "int", _payload(), 1.5e-05, 1700000000.25, 1),
    P.Finished(9, 1 << 40, "ndarray", None, 0.0, 0.0, 0),
    P.Finished(3, 0, "Ünïcode\udc80", _payload(b""), 2.0, -1.0, 2**32 - 1),
    P.Failed(4, b"\x80\x05pickled error", 1700000000.5, 0.25, 3),
    P.Failed(2**64 - 1, b"", -1.0, 0.0, 0),
    P.Skipped(7),
    P.Cancel((1, 2**64 - 1, 3)),
    P.Cancel(()),
    P.Free(("a", "clé-\udcff", "", "x" * 300)),
    P.Free(()),
]


@pytest.mark.parametrize("msg", LONE, ids=lambda m: f"{type(m).__name__}-{m.__reduce__()[1][0]!r}"[:40])
def test_a_lone_message_of_a_tasks_way_packs_without_pickle_and_comes_back_equal(msg):
    env = P.pack_lone(msg)
    assert env is not None and env[:1] != pickle.dumps(None, protocol=5)[:1]
    back = P.unpack_lone(env)
    assert back == msg and type(back) is type(msg)
    assert back.__reduce__()[1] == msg.__reduce__()[1]
    assert [type(v) for v in back.__reduce__()[1]] == [type(v) for v in msg.__reduce__()[1]]


NOT_LONE = [
    P.Run(1, "k", 1, None, _payload(), ("dep",)),                             # dependencies
    P.Run(1, "k", 1, None, _payload(buffers=(pickle.PickleBuffer(b"b"),)), ()),  # out-of-band buffers
    P.Run(1, "k", 1, None, _payload(pickle.PickleBuffer(b"large meta"), nbytes=10), ()),
    P.Run(-1, "k", 1, None, _payload(), ()),                                  # out of the layout's range
    P.Run(2**64, "k", 1, None, _payload(), ()),
    P.Finished(1, 5, "int", _payload(), 1, 1700000000.25, 1),                 # an int duration
    P.Finished(1, 5, "int", _payload(buffers=(pickle.PickleBuffer(b"b"),)), 1.0, 2.0, 1),
    P.Finished(1, 5, "int", None, 1.0, 2.0, 2**32),
    P.Failed(1, b"error", 1, 2.0),                                             # an int start
    P.Failed(1, bytearray(b"error")),
    P.Failed(-1, b"error"),
    P.Skipped(-1),
    P.Cancel((1, -2)),
    P.Cancel([1, 2]),
    P.Free(("a", ("tuple", 0))),
    P.Free(["a"]),
    P.Put("k", _payload()),
]


@pytest.mark.parametrize("msg", NOT_LONE, ids=lambda m: f"{type(m).__name__}-{m.__reduce__()[1][0]!r}"[:40])
def test_what_the_layout_cannot_hold_exactly_goes_as_a_pickle(msg):
    assert P.pack_lone(msg) is None


@pytest.mark.parametrize("env", [b"", b"\x80\x05N.", b"R", P.pack_lone(LONE[0])[:-1], P.pack_lone(LONE[3]) + b"x",
                                 P.pack_lone(P.Failed(1, b"err", 0.0, 0.0))[:-1], P.pack_lone(P.Skipped(1)) + b"x",
                                 P.pack_lone(P.Cancel((1, 2)))[:-1], P.pack_lone(P.Free(("ab", "c")))[:-1],
                                 P.pack_lone(P.Free(("ab",))) + b"x"])
def test_anything_else_is_not_taken_for_a_lone_message(env):
    with pytest.raises(ValueError, match="fixed layout"):
        P.unpack_lone(env)


def test_a_run_of_plain_arguments_kept_unpickled_is_sent_as_the_pickled_one():
    from localcluster.wire import channel, serialize
    args = (7, "seven", None)
    lazy, eager = serialize.plain_args(args), serialize.dumps_collecting((args, {}))[0]
    assert P.pack_lone(P.Run(3, "k", 1, b"fn", lazy, ())) == P.pack_lone(P.Run(3, "k", 1, b"fn", eager, ()))
    # outside the layout (a seq out of its range), it goes as a pickle, and arrives a Payload
    msg = P.Run(2**64, "k", 1, None, lazy, ())
    assert P.pack_lone(msg) is None
    a, b = socket.socketpair()
    with a, b:
        channel.BlockingChannel(a).send(msg)
        [back] = channel.BlockingChannel(b).recv_all()
    assert back == P.Run(2**64, "k", 1, None, eager, ()) and type(back.args) is P.Payload


# --- seals: what each out-of-band part must be where it lands (issue 48) ----------------------

def test_a_payload_is_sealed_where_it_is_pickled_and_a_changed_part_breaks_the_seal(seed):
    """Random values of many sizes, sealed by serialize.dumps: whole, each passes; any part
    swapped for another of the same size, shortened, or with one sampled word changed, fails,
    and the failure says which part and both lengths."""
    import random
    import numpy as np
    rng = random.Random(seed)
    for _ in range(30):
        n = rng.choice([1 << 17, (1 << 17) + 3, 1 << 20, 3 << 20, 10_000_007])     # halves out of band too
        a = np.frombuffer(rng.randbytes(n), dtype="u1").copy()
        p = serialize.dumps([a, a[: n // 2].copy()])
        assert p.seals and len(p.seals) == len(p.buffers) + 1 and P.broken_seal(p) is None
        other = bytearray(memoryview(p.buffers[0]))
        other[rng.randrange(64)] ^= 0xFF                        # within the first 64 bytes: always sampled
        swapped = P.Payload(p.meta, (pickle.PickleBuffer(other), p.buffers[1]), p.nbytes, p.seals)
        assert P.broken_seal(swapped).startswith("buffer 1 of 2:"), seed
        shorter = P.Payload(p.meta, (p.buffers[1], p.buffers[1]), p.nbytes, p.seals)
        assert f"{len(memoryview(p.buffers[1])):,} bytes" in P.broken_seal(shorter)
        assert "were sent" in P.broken_seal(P.Payload(p.meta, p.buffers[:1], p.nbytes, p.seals))
        with pytest.raises(TransferError):
            serialize.loads(swapped)
    big_meta = serialize.dumps([i.to_bytes(8, "little") for i in range(10_000)])     # a large pickle stream
    assert big_meta.seals[0] and P.broken_seal(big_meta) is None
