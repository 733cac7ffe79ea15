"""Data of every kind users move, made deterministically on either side, with a
fingerprint that is the same wherever the value is checked (parent or worker).

Imported by the tests and, through cloudpickle's by-reference pickling, by the workers
(they get the parent's sys.path).
"""
from __future__ import annotations

import hashlib
import os

import numpy as np

from localcluster.wire.protocol import INLINE_RESULT, MEMFD_THRESHOLD

KiB, MiB = 1 << 10, 1 << 20
# 1 KiB, each side of every threshold of the data path, and a size users have.
SIZES = {"1KiB": KiB, "inline-": INLINE_RESULT - 512, "inline+": INLINE_RESULT + 512,
         "memfd-": MEMFD_THRESHOLD - 4 * KiB, "memfd+": MEMFD_THRESHOLD + 4 * KiB, "50MB": 50_000_000}


class Blob:
    """A user object with a custom __reduce__ (its bytes travel inside the pickle stream)."""

    def __init__(self, name, data):
        self.name, self.data = name, data

    def __reduce__(self):
        return (Blob, (self.name, bytes(self.data)))

    def __eq__(self, other):
        return type(other) is Blob and (self.name, self.data) == (other.name, other.data)


def _pattern(n, seed=0):
    block = bytes((i * 7 + seed) % 251 for i in range(4096))
    return (block * (n // 4096 + 1))[:n]


def make(kind, n, seed=0):
    """A value of ``kind`` whose main buffer is about ``n`` bytes."""
    if kind == "bytes":
        return _pattern(n, seed)
    if kind == "bytearray":
        return bytearray(_pattern(n, seed))
    if kind == "memoryview":
        return memoryview(bytearray(_pattern(n, seed)))
    if kind == "numpy":
        return np.arange(max(1, n // 8), dtype="f8") + seed
    if kind == "numpy-strided":          # a view of every other element: not contiguous
        return (np.arange(2 * max(1, n // 8), dtype="f8") + seed)[::2]
    if kind == "numpy-fortran":
        return np.asfortranarray((np.arange(4 * max(1, n // 32), dtype="f8") + seed).reshape(-1, 4))
    if kind == "numpy-structured":
        a = np.zeros(max(1, n // 12), dtype=[("i", "<i4"), ("x", "<f8")])
        a["i"] = np.arange(len(a)) + seed
        a["x"] = a["i"] * 0.5
        return a
    if kind == "pandas":
        import pandas as pd
        rows = max(1, n // 16)
        return pd.DataFrame({"x": np.arange(rows, dtype="f8") + seed, "i": np.arange(rows, dtype="i8")})
    if kind == "nested":
        half = max(1, n // 16)
        return {"a": np.arange(half, dtype="f8") + seed, "rest": [np.arange(half, dtype="i8"), "label"]}
    if kind == "int":
        return 42 + seed
    if kind == "reduce":
        return Blob("blob", _pattern(n, seed))
    raise ValueError(kind)


KINDS = ["bytes", "bytearray", "memoryview", "numpy", "numpy-strided", "numpy-fortran", "numpy-structured",
         "pandas", "nested", "reduce"]


def fingerprint(v):
    """(type, shape, digest of the content): equal exactly when the values are equal."""
    h = hashlib.sha1()
    t = type(v).__name__
    if isinstance(v, (bytes, bytearray)):
        h.update(v)
        return t, len(v), h.hexdigest()
    if isinstance(v, memoryview):
        h.update(v.tobytes())
        return t, v.format, v.shape, h.hexdigest()
    if isinstance(v, np.ndarray):
        h.update(np.ascontiguousarray(v).tobytes())
        return t, v.dtype.descr, v.shape, bool(v.flags.f_contiguous and v.ndim > 1), h.hexdigest()
    if type(v).__name__ == "DataFrame":
        return t, list(v.columns), [str(d) for d in v.dtypes], fingerprint(v.index.to_numpy()), \
            [fingerprint(v[c].to_numpy()) for c in v.columns]
    if isinstance(v, dict):
        return t, [(k, fingerprint(x)) for k, x in v.items()]
    if isinstance(v, list):
        return t, [fingerprint(x) for x in v]
    if isinstance(v, Blob):
        return t, v.name, fingerprint(v.data)
    return t, repr(v)


def identity(v):
    return v


def rss_here():
    from localcluster.system.machine import rss
    return rss()


def warm_up(kind):
    """Import what a kind needs in this worker, so it does not count as the value's memory."""
    fingerprint(make(kind, KiB))
    return True


def memfds_here():
    """Data memfds still open in this process (the status board's is not data)."""
    out = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if "memfd:localcluster" in target and "board" not in target:
            out += 1
    return out
