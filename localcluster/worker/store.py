"""A worker's data: results and received values, spilled to disk least-recently-used
first when managed memory passes ``target`` of the memory limit.

One shape for every entry, whatever the type: an :class:`Entry` holds the value *or*
its :class:`Payload` (pickled form with its out-of-band buffers), never both, and
its size ``nbytes`` is the payload's, measured once when it is stored. So data is
held once, and anything stored can be sent on, spilled, reloaded and measured the
same way:

- a task's result is kept as the value, unless pickling it had to copy it (a
  non-contiguous array, a big list): then the copy is kept and the value dropped;
- data received from the parent is kept as its payload and unpickled on first use
  (a dependency that is never read costs no unpickling), then kept as the value;
- spilling writes the payload (pickling the value first if needed) and forgets both;
  reloading reads the payload back.

Failures name the key and the step (:class:`StoreError`); a spill that fails leaves
the entry in memory rather than losing it.
"""
from __future__ import annotations

import os
import pickle
import sys
import threading
from collections import OrderedDict
from typing import Any, Callable, Optional

from ..wire.basics import TransferError
from ..wire import serialize
from ..system.machine import rss
from ..wire.protocol import Payload

_ABSENT = object()


class StoreError(RuntimeError):
    """Stored data could not be reloaded, unpickled or pickled; says which key and which step.

    A worker raises it when the data of a key it holds cannot be unpickled for a task, pickled
    to be sent, or read back from its spill file (the message names the key, the step and the
    first error, which is also its ``__cause__``). A value whose type does not survive pickling
    and unpickling fails so; a spill file fails so when the disk under the cluster's
    ``local_directory`` is full or the file was removed.
    """


class Entry:
    __slots__ = ("value", "payload", "nbytes", "unspillable")

    def __init__(self, value: Any, payload: Optional[Payload], nbytes: int):
        self.value = value          # _ABSENT until unpickled
        self.payload = payload      # None once unpickled
        self.nbytes = nbytes
        self.unspillable = False    # spilling it failed once; do not retry in a loop


class Store:
    def __init__(self, directory: Optional[str], target: Optional[int],
                 on_change: Callable[[int, int, int], None] = lambda *a: None):
        self.directory = directory
        self.target = target
        self._mem: OrderedDict[str, Entry] = OrderedDict()   # least recently used first
        self._disk: dict[str, tuple[str, int]] = {}          # key -> (path, nbytes)
        self._made: dict[str, int] = {}                      # key -> the run whose result it holds
        self._lock = threading.RLock()
        self._counter = 0
        self.managed = 0
        self.spilled = 0
        self._on_change = on_change

    def __contains__(self, key: str) -> bool:
        # Under the lock: spilling moves a key from memory to disk (and loading back) in two
        # steps, and a reader between them saw a key it holds as missing: a task parked for an
        # input it had, for good, and an Export answered "no longer holds".
        with self._lock:
            return key in self._mem or key in self._disk

    def keys(self) -> list:
        """The keys held, in memory or spilled (get_worker().data)."""
        with self._lock:
            return [*self._mem, *self._disk]

    # --- in ---------------------------------------------------------------------------

    def put_result(self, key: str, value: Any, payload: Payload, seq: int = 0) -> None:
        """A task's result and its pickled form (which the caller made to measure it), made
        by run ``seq`` (see :meth:`free_made_by`)."""
        if serialize.self_contained(payload):
            self._put(key, Entry(_ABSENT, payload, payload.nbytes), seq)
        else:
            self._put(key, Entry(value, None, payload.nbytes), seq)

    def put_payload(self, key: str, payload: Payload) -> None:
        self._put(key, Entry(_ABSENT, payload, payload.nbytes))

    def _put(self, key: str, entry: Entry, seq: int = 0) -> None:
        with self._lock:
            self._discard(key)
            if seq:
                self._made[key] = seq
            self._mem[key] = entry
            self.managed += entry.nbytes
            self._maybe_spill(keep=key)
            self._changed()

    # --- out --------------------------------------------------------------------------

    def __getitem__(self, key: str) -> Any:
        with self._lock:
            entry = self._load(key)
            if entry.value is _ABSENT:
                try:
                    entry.value = serialize.loads(entry.payload)
                except TransferError as e:      # not the user's data: the worker says so (process.py)
                    raise TransferError(key, "stored on this worker", e.detail) from None
                except Exception as e:
                    raise StoreError(f"unpickling the stored data of {key!r} failed: "
                                     f"{type(e).__name__}: {e}") from e
                entry.payload = None
            return entry.value

    def payload(self, key: str) -> Payload:
        """The data of ``key`` ready to send; spilled data is read without coming back into memory."""
        with self._lock:
            entry = self._mem.get(key)
            if entry is None:
                path, _nbytes = self._disk[key]
                return self._read(key, path)
            if entry.payload is not None:
                return entry.payload
            value = entry.value
        try:
            return serialize.dumps(value)
        except Exception as e:
            raise StoreError(f"pickling the stored data of {key!r} failed: {type(e).__name__}: {e}") from e

    def _load(self, key: str) -> Entry:
        entry = self._mem.get(key)
        if entry is not None:
            self._mem.move_to_end(key)
            return entry
        path, nbytes = self._disk[key]
        payload = self._read(key, path)
        del self._disk[key]
        _unlink(path)
        self.spilled -= nbytes
        entry = self._mem[key] = Entry(_ABSENT, payload, nbytes)
        self.managed += nbytes
        self._maybe_spill(keep=key)
        self._changed()
        return entry

    def _read(self, key: str, path: str) -> Payload:
        try:
            return _read(path)
        except Exception as e:
            raise StoreError(f"reloading {key!r} from its spill file {path} failed: "
                             f"{type(e).__name__}: {e}") from e

    # --- forgetting and spilling ------------------------------------------------------

    def free(self, keys: tuple) -> None:
        with self._lock:
            for key in keys:
                self._discard(key)
            self._changed()

    def free_made_by(self, key: str, seq: int) -> None:
        """Free ``key`` if what is stored under it is the result of run ``seq``, not of a
        newer run of the same key (a cancelled run that ended late must not drop that)."""
        with self._lock:
            if self._made.get(key) == seq:
                self._discard(key)
                self._changed()

    def _discard(self, key: str) -> None:
        self._made.pop(key, None)
        entry = self._mem.pop(key, None)
        if entry is not None:
            self.managed -= entry.nbytes
        disk = self._disk.pop(key, None)
        if disk is not None:
            self.spilled -= disk[1]
            _unlink(disk[0])

    def _maybe_spill(self, keep: Optional[str] = None) -> None:
        if self.target is None or self.directory is None:
            return
        while self.managed > self.target:
            victim = next((k for k, e in self._mem.items() if k != keep and not e.unspillable), None)
            if victim is None:
                return
            self._spill_one(victim)

    def spill_for_rss(self, limit: int, let_go: Callable[[], Any] = lambda: None) -> None:
        """Process memory (not just what we manage) is over ``limit``: spill LRU until under.
        ``let_go()`` after each value spilled: memory kept for reuse (recycle.py) that its
        bytes may have returned to, and that RSS still counts, goes back to the system."""
        if self.directory is None:
            return
        with self._lock:
            changed = False
            while rss() > limit:
                victim = next((k for k, e in self._mem.items() if not e.unspillable), None)
                if victim is None:
                    break
                changed |= self._spill_one(victim)
                let_go()
            if changed:
                self._changed()

    def _spill_one(self, key: str) -> bool:
        entry = self._mem[key]
        self._counter += 1
        path = os.path.join(self.directory, f"{self._counter}.spill")
        try:
            _write(path, entry.payload if entry.payload is not None else serialize.dumps(entry.value))
        except Exception as e:
            # Keep it in memory: losing data is worse than running closer to the limit.
            entry.unspillable = True
            sys.stderr.write(f"[localcluster] spilling {key!r} to {path} failed ({type(e).__name__}: {e}); "
                             f"it stays in memory\n")
            return False
        del self._mem[key]
        self.managed -= entry.nbytes
        self._disk[key] = (path, entry.nbytes)
        self.spilled += entry.nbytes
        return True

    def _changed(self) -> None:
        self._on_change(self.managed, self.spilled, len(self._disk))


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


# Spill file: u64 header length | pickled (meta length, [(size, readonly)], seals) | meta | buffers.
# Read-only buffers (bytes) come back as bytes and writable ones as bytearray, so a reloaded
# value is as writable as it was, and a reloaded bytes needs no second copy.

def _write(path: str, payload: Payload) -> None:
    meta = payload.meta.raw() if isinstance(payload.meta, pickle.PickleBuffer) else memoryview(payload.meta)
    bufs = [pb.raw() for pb in payload.buffers]
    header = pickle.dumps((meta.nbytes, [(b.nbytes, b.readonly) for b in bufs], payload.seals))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(len(header).to_bytes(8, "little"))
            f.write(header)
            f.write(meta)
            for b in bufs:
                f.write(b)
            f.flush()
            if hasattr(os, "posix_fadvise"):
                # Start writing it out now and let its pages go once clean: spilled data
                # left as dirty page cache still counts against the worker's memory cgroup.
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    except BaseException:
        _unlink(path)
        raise


def _read(path: str) -> Payload:
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        meta_len, sizes, seals = pickle.loads(f.read(n))
        meta = f.read(meta_len)
        bufs = []
        for size, readonly in sizes:
            if readonly:
                b: Any = f.read(size)
            else:
                b = bytearray(size)
                if f.readinto(b) != size:
                    raise EOFError("spill file is truncated")
            if len(b) != size:
                raise EOFError("spill file is truncated")
            bufs.append(pickle.PickleBuffer(b))
    if len(meta) != meta_len:
        raise EOFError("spill file is truncated")
    return Payload(meta, tuple(bufs), meta_len + sum(s for s, _ in sizes), seals)
