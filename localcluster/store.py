"""A worker's data: results and received values, spilled to disk least-recently-used
first when managed memory passes ``target`` of the memory limit.

Values that arrived from the parent are kept as their :class:`Payload` and
unpickled on first use, so a dependency that is never read costs no unpickling.
"""
from __future__ import annotations

import os
import pickle
import threading
from collections import OrderedDict
from typing import Any, Callable, Optional

from . import serialize
from .protocol import Payload

_RAW = object()


def rss() -> int:
    """This process's resident set size, from /proc (no psutil import in the worker)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except OSError:  # pragma: no cover - not Linux
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class Store:
    def __init__(self, directory: Optional[str], target: Optional[int],
                 on_change: Callable[[int, int, int], None] = lambda *a: None):
        self.directory = directory
        self.target = target
        self._mem: OrderedDict[str, list] = OrderedDict()   # key -> [value or payload, is_raw, nbytes]
        self._disk: dict[str, tuple[str, int]] = {}          # key -> (path, nbytes)
        self._lock = threading.RLock()
        self._counter = 0
        self.managed = 0
        self.spilled = 0
        self._on_change = on_change

    def __contains__(self, key: str) -> bool:
        return key in self._mem or key in self._disk

    def put(self, key: str, value: Any, nbytes: int) -> None:
        with self._lock:
            self._discard(key)
            self._mem[key] = [value, False, nbytes]
            self.managed += nbytes
            self._maybe_spill()
            self._changed()

    def put_payload(self, key: str, payload: Payload) -> None:
        with self._lock:
            self._discard(key)
            self._mem[key] = [payload, True, payload.nbytes]
            self.managed += payload.nbytes
            self._maybe_spill()
            self._changed()

    def __getitem__(self, key: str) -> Any:
        with self._lock:
            entry = self._mem.get(key)
            if entry is None:
                path, nbytes = self._disk.pop(key)
                value = _read(path)
                os.unlink(path)
                self.spilled -= nbytes
                entry = self._mem[key] = [value, False, nbytes]
                self.managed += nbytes
                self._maybe_spill(keep=key)
                self._changed()
            else:
                self._mem.move_to_end(key)
            if entry[1]:
                entry[0], entry[1] = serialize.loads(entry[0]), False
            return entry[0]

    def payload(self, key: str) -> Payload:
        """The data of ``key`` ready to send (unpickled values are pickled again)."""
        with self._lock:
            entry = self._mem.get(key)
            if entry is not None and entry[1]:
                return entry[0]
        return serialize.dumps(self[key])

    def free(self, keys: tuple) -> None:
        with self._lock:
            for key in keys:
                self._discard(key)
            self._changed()

    def _discard(self, key: str) -> None:
        entry = self._mem.pop(key, None)
        if entry is not None:
            self.managed -= entry[2]
        disk = self._disk.pop(key, None)
        if disk is not None:
            self.spilled -= disk[1]
            try:
                os.unlink(disk[0])
            except OSError:
                pass

    def _maybe_spill(self, keep: Optional[str] = None) -> None:
        if self.target is None or self.directory is None:
            return
        while self.managed > self.target and self._mem:
            key = next(iter(self._mem))
            if key == keep:
                if len(self._mem) == 1:
                    return
                self._mem.move_to_end(key)
                continue
            self._spill_one(key)

    def spill_for_rss(self, limit: int) -> None:
        """Process memory (not just what we manage) is over ``limit``: spill LRU until under."""
        if self.directory is None:
            return
        with self._lock:
            changed = False
            while self._mem and rss() > limit:
                self._spill_one(next(iter(self._mem)))
                changed = True
            if changed:
                self._changed()

    def _spill_one(self, key: str) -> None:
        value, raw, nbytes = self._mem.pop(key)
        self.managed -= nbytes
        payload = value if raw else serialize.dumps(value)
        self._counter += 1
        path = os.path.join(self.directory, f"{self._counter}.spill")
        _write(path, payload)
        self._disk[key] = (path, nbytes)
        self.spilled += nbytes

    def _changed(self) -> None:
        self._on_change(self.managed, self.spilled, len(self._disk))


def _write(path: str, payload: Payload) -> None:
    meta = bytes(payload.meta.raw()) if isinstance(payload.meta, pickle.PickleBuffer) else payload.meta
    bufs = [pb.raw() if isinstance(pb, pickle.PickleBuffer) else memoryview(pb) for pb in payload.buffers]
    header = pickle.dumps((len(meta), [b.nbytes for b in bufs]))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(len(header).to_bytes(8, "little"))
            f.write(header)
            f.write(meta)
            for b in bufs:
                f.write(b)
    except BaseException:
        os.unlink(path)
        raise


def _read(path: str) -> Any:
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        meta_len, sizes = pickle.loads(f.read(n))
        meta = f.read(meta_len)
        bufs = []
        for size in sizes:
            b = bytearray(size)
            f.readinto(b)
            bufs.append(b)
    return pickle.loads(meta, buffers=bufs)
