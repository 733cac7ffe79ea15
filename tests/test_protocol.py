"""localcluster/protocol.py on its own: every message is a small frozen value that pickles
as ``(class, fields)`` and comes back equal."""
from __future__ import annotations

import inspect
import pickle

import pytest

from localcluster import protocol as P

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
