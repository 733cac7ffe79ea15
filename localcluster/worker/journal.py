"""A journal's entries on disk, and the task that writes them (``Journaled``): one file per
result, written by the worker that computed it as it finishes, beside a SQLite index of
what is there. The parent's side (which tasks to journal, what to reuse) is journal.py.

An entry is named by its id: the hash of the task's key and of its code's fingerprint
(``entry_id``), so a worker knows the name from the key it runs, and a changed function
never finds an older entry. A file appears whole or not at all (written to a temporary
name, then ``rename``); a worker killed while writing leaves only a temporary file, which
a later cluster removes. Each file carries a CRC-32 of everything after its first 16 bytes
and its own id: a file damaged on disk, cut short or put under another name is never
read as a value (a ValueError saying what is wrong), and its task is computed again.

A small result (one whose pickle holds all of it: under 64 KiB) is kept in its row of the index
instead, with a CRC-32 of its id and pickle: a file's creation costs more than a small task.

File: ``MAGIC`` | u32 CRC-32 of the rest | u64 length of the rest | rest, where rest is
u16 id length | id | u32 parts | parts x (u64 size, u8 read-only) | the pickle stream |
its out-of-band buffers.

The index (``index.sqlite3``, WAL) has a row per entry: its id, key, size, the run that
wrote it and when. It is what the parent looks up before placing a task; the files are
the truth, so a row whose file is gone or damaged costs a recomputation, never a wrong
value. Any thread of any process: each process has its own connection.
"""
from __future__ import annotations

import hashlib
import logging
import os
import pickle
import sqlite3
import struct
import threading
import time
import zlib
from typing import Any

from ..wire import serialize
from ..wire.protocol import Payload
from . import context, logs

__all__ = ["Journaled", "change", "parsed_row", "connect", "discard", "disconnect", "entry_id", "entry_path", "index", "read_entry",
           "write_entry"]

logger = logging.getLogger("localcluster.journal")

MAGIC = b"LCJRNL01"
INDEX = "index.sqlite3"
RESULTS = "results"
TEMPORARY = "tmp"           # entries being written: <entry>.<pid>-<thread>.tmp
_HEAD = struct.Struct("<8sIQ")       # magic, crc of the rest, length of the rest
_PART = struct.Struct("<QB")
SCHEMA = ("CREATE TABLE IF NOT EXISTS entries (id TEXT PRIMARY KEY, key TEXT NOT NULL, size INTEGER NOT NULL, "
          "run TEXT NOT NULL, written REAL NOT NULL, crc INTEGER, data BLOB)",
          "CREATE TABLE IF NOT EXISTS runs (run TEXT PRIMARY KEY, record TEXT NOT NULL)")


class _Damaged(ValueError):
    """An entry's file is not what was written (damaged on disk, cut short, another's)."""


def entry_id(key: str, fingerprint: str) -> str:
    """The id of the entry of task ``key`` made by the code of ``fingerprint``."""
    return hashlib.sha1(f"{key}\0{fingerprint}".encode("utf-8", "surrogatepass"),
                        usedforsecurity=False).hexdigest()


def entry_path(folder: str, entry: str) -> str:
    return os.path.join(folder, RESULTS, entry[:2], entry)


# --- the files ------------------------------------------------------------------------------

_CHUNK = 8 << 20      # bytes checksummed and written at a time: each still in the CPU's cache when written
_made: set = set()    # the folders of results this process made already


def write_entry(folder: str, entry: str, payload: Payload) -> int:
    """Write ``payload`` as the file of entry ``entry``, whole or not at all (a temporary
    file, then ``rename``); its size. One pass over the data: each chunk checksummed, then
    written; the header, with the checksum, written last at the file's start. OSError when
    it cannot be written (nothing is left behind then)."""
    meta = payload.meta.raw() if isinstance(payload.meta, pickle.PickleBuffer) else memoryview(payload.meta)
    parts = [meta] + [pb.raw().cast("B") for pb in payload.buffers]
    name = entry.encode()
    head = struct.pack("<H", len(name)) + name + struct.pack("<I", len(parts)) + \
        b"".join(_PART.pack(p.nbytes, p.readonly) for p in parts)
    path = entry_path(folder, entry)
    tmp = os.path.join(folder, TEMPORARY, f"{entry}.{os.getpid()}-{threading.get_ident()}.tmp")
    try:
        sub = os.path.dirname(path)
        if sub not in _made:
            os.makedirs(sub, mode=0o700, exist_ok=True)
            os.makedirs(os.path.dirname(tmp), mode=0o700, exist_ok=True)
            _made.add(sub)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(tmp, flags, 0o600)
        except FileNotFoundError:       # its folder was removed meanwhile
            os.makedirs(os.path.dirname(tmp), mode=0o700, exist_ok=True)
            fd = os.open(tmp, flags, 0o600)
        try:
            _write_all(fd, memoryview(bytes(_HEAD.size) + head))
            crc, length = zlib.crc32(head), len(head)
            for p in parts:
                for at in range(0, p.nbytes, _CHUNK):
                    chunk = p[at:at + _CHUNK]
                    crc = zlib.crc32(chunk, crc)
                    _write_all(fd, chunk)
                length += p.nbytes
            os.pwrite(fd, _HEAD.pack(MAGIC, crc, length), 0)
            if hasattr(os, "posix_fadvise"):
                # written out now and its pages let go of once clean, as a spill file's: dirty
                # page cache counts against the worker's memory cgroup
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        try:
            os.rename(tmp, path)
        except FileNotFoundError:       # the journal was cleared meanwhile: its folders went with it
            os.makedirs(sub, mode=0o700, exist_ok=True)
            os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return _HEAD.size + length


def _write_all(fd: int, view: memoryview) -> None:
    while view.nbytes:
        view = view[os.write(fd, view):]


def read_entry(folder: str, entry: str) -> Payload:
    """Entry ``entry`` as written (its row's bytes, or its file); FileNotFoundError when there
    is none, a ValueError (saying what is wrong) when it is not what was written."""
    rows = index(folder, "SELECT crc, data FROM entries WHERE id = ?", (entry,))
    if rows and rows[0][1] is not None:
        return parsed_row(rows[0][0], rows[0][1], entry, folder)
    path = entry_path(folder, entry)
    with open(path, "rb") as f:
        data = bytearray(os.fstat(f.fileno()).st_size)
        n = f.readinto(data)
    return _parsed(memoryview(data)[:n], entry, path)


def row_crc(entry: str, meta: bytes) -> int:
    """The CRC-32 of a small result kept in its row: of its id and its pickle."""
    return zlib.crc32(meta, zlib.crc32(entry.encode()))


def parsed_row(crc: Any, data: Any, entry: str, folder: str) -> Payload:
    """The small result kept in its row of the index (its pickle, ``data``, and ``crc``); a
    ValueError when it is not what was written."""
    if type(data) is not bytes or row_crc(entry, data) != crc:
        raise _Damaged(f"the row of entry {entry} in {folder}'s index is damaged (its CRC-32 is not the one "
                       f"written)")
    return Payload(data, (), len(data))


def _parsed(view: memoryview, entry: str, path: str) -> Payload:
    n = view.nbytes
    if n < _HEAD.size:
        raise _Damaged(f"{path}: {n} bytes, shorter than an entry's header")
    magic, crc, length = _HEAD.unpack_from(view)
    if magic != MAGIC:
        raise _Damaged(f"{path}: not a journal entry (it begins {bytes(view[:8])!r})")
    if length != n - _HEAD.size:
        raise _Damaged(f"{path}: {n - _HEAD.size} bytes after the header where {length} were written")
    rest = view[_HEAD.size:]
    if zlib.crc32(rest) != crc:
        raise _Damaged(f"{path}: its CRC-32 is not the one written (its bytes changed on disk)")
    try:
        return _parts(rest, entry, path)
    except _Damaged:
        raise
    except (struct.error, ValueError, UnicodeDecodeError) as e:
        raise _Damaged(f"{path}: {e}") from None


def _parts(rest: memoryview, entry: str, path: str) -> Payload:
    (size,) = struct.unpack_from("<H", rest)
    name = bytes(rest[2:2 + size]).decode()
    if name != entry:
        raise _Damaged(f"{path}: it holds entry {name!r}")
    at = 2 + size
    (count,) = struct.unpack_from("<I", rest, at)
    at += 4
    sizes = [_PART.unpack_from(rest, at + i * _PART.size) for i in range(count)]
    at += count * _PART.size
    parts = []
    for nbytes, readonly in sizes:
        part = rest[at:at + nbytes]
        parts.append(part.toreadonly() if readonly else part)
        at += nbytes
    if at != len(rest) or not parts:
        raise _Damaged(f"{path}: its parts do not add up to its length")
    meta = bytes(parts[0])
    return Payload(meta, tuple(pickle.PickleBuffer(p) for p in parts[1:]), at)


# --- the index ------------------------------------------------------------------------------

_connections: dict = {}          # (pid, folder) -> connection: one a process
_connecting = threading.Lock()


def connect(folder: str, create: bool = False) -> sqlite3.Connection:
    """This process's connection to ``folder``'s index (WAL; one writer at a time, others
    wait up to 30 s). ``create``: the tables are made if missing. sqlite3.Error when the
    index cannot be opened."""
    with _connecting:
        conn = _connections.get((os.getpid(), folder))
        if conn is None:
            conn = sqlite3.connect(os.path.join(folder, INDEX), timeout=30, check_same_thread=False,
                                   isolation_level=None)
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                # a commit is not synced: a crash of the machine may cost the last results (or
                # damage the index, which is made again from the files); a process's never does
                conn.execute("PRAGMA synchronous=OFF")
                if create:
                    for statement in SCHEMA:
                        conn.execute(statement)
            except BaseException:
                conn.close()
                raise
            _connections[(os.getpid(), folder)] = conn
        return conn


def disconnect(folder: str) -> None:
    """Close this process's connection to ``folder``'s index (the cluster closed)."""
    with _connecting:
        conn = _connections.pop((os.getpid(), folder), None)
    if conn is not None:
        conn.close()


_index_lock = threading.Lock()     # one statement at a time on a process's shared connection


def index(folder: str, sql: str, args: tuple = ()) -> list:
    """Run one statement on ``folder``'s index; its rows."""
    conn = connect(folder)
    with _index_lock:
        return conn.execute(sql, args).fetchall()


def change(folder: str, sql: str, args: tuple = ()) -> int:
    """Run one statement that changes ``folder``'s index; the rows it changed."""
    conn = connect(folder)
    with _index_lock:
        return conn.execute(sql, args).rowcount


# --- the task -------------------------------------------------------------------------------

_off: set = set()       # journals this process stopped writing to (their disk refused)


class Journaled:
    """A task's function as the journal runs it, on the worker: the function called and its
    result written as the entry of the task's key (never an error: an exception passes
    through, nothing written). ``load_first``: the entry read instead if it is there and whole
    (a dependent needs a result the parent reused). With no function (``fn_bytes`` empty), a
    reader: the entry, or an error naming it."""
    __slots__ = ("folder", "run", "fingerprint", "fn_bytes", "load_first", "_fn")

    def __init__(self, folder: str, run: str, fingerprint: str, fn_bytes: bytes, load_first: bool = False):
        self.folder, self.run, self.fingerprint, self.fn_bytes = folder, run, fingerprint, fn_bytes
        self.load_first = load_first or not fn_bytes
        self._fn: Any = None

    def __reduce__(self) -> tuple:
        return (Journaled, (self.folder, self.run, self.fingerprint, self.fn_bytes, self.load_first))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        run = context.current()[1]
        key = run.key if run is not None else None
        entry = entry_id(key, self.fingerprint) if key is not None else None
        gone: Exception = LookupError("no task key")
        if entry is not None and self.load_first:
            try:
                return serialize.loads(read_entry(self.folder, entry))
            except FileNotFoundError as e:
                gone = e
            except (ValueError, OSError) as e:     # damaged, or unreadable
                discard(self.folder, entry, e)
                gone = e
        if not self.fn_bytes:       # a reader only: the parent reused it, and has not its inputs here
            raise RuntimeError(f"the journal entry of task {key!r} in {self.folder} could not be read ({gone}); "
                               f"it is removed: run the computation again to compute it anew")
        fn = self._fn
        if fn is None:
            fn = self._fn = pickle.loads(self.fn_bytes)
        value = fn(*args, **kwargs)
        if entry is not None and key is not None and self.folder not in _off:
            self._keep(key, entry, value)
        return value

    def _keep(self, key: str, entry: str, value: Any) -> None:
        try:
            payload = serialize.dumps_result(value)
            data, crc = None, None
            if not payload.buffers and type(payload.meta) is bytes:     # small: in the row
                data = payload.meta
                crc, size = row_crc(entry, data), len(data)
            else:
                size = write_entry(self.folder, entry, payload)
            _rows.append((self.folder, (entry, key, size, self.run, time.time(), crc, data)))
            if commit_rows not in context.before_reply:
                context.before_reply.append(commit_rows)
        except (OSError, sqlite3.Error) as e:
            _refused(self.folder, e)
        except Exception as e:    # noqa: BLE001 - a result pickle cannot keep is returned, unkept
            logger.warning("localcluster: the result of task %r is not kept in the journal: it cannot be "
                           "pickled (%s: %s)", key, type(e).__name__, e)


_rows: list = []        # (folder, row) written as results finished, committed before their replies go
_committing = threading.Lock()


def commit_rows() -> None:
    """The rows of the results written since the last call, in one transaction a journal,
    before the worker sends those results' replies (``context.before_reply``): a result the
    parent has seen is in the index, and a row costs a fraction of a commit. Never raises:
    a journal that refuses them is one warning, and no longer written."""
    with _committing:
        if not _rows:
            return
        taken = _rows[:]
        del _rows[:len(taken)]
        by_folder: dict = {}
        for folder, row in taken:
            by_folder.setdefault(folder, []).append(row)
        for folder, rows in by_folder.items():
            try:
                conn = connect(folder)
                with _index_lock:
                    conn.execute("BEGIN IMMEDIATE")
                    try:
                        conn.executemany("INSERT OR REPLACE INTO entries VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
                        conn.execute("COMMIT")
                    except BaseException:
                        conn.execute("ROLLBACK")
                        raise
            except sqlite3.Error as e:
                _refused(folder, e)


def _refused(folder: str, e: Exception) -> None:
    if folder not in _off:
        _off.add(folder)
        # said once a cluster (logs.ONCE): each worker that meets it stops writing, silently after the first
        logger.warning("localcluster: the journal in %s cannot be written (%s); the workers go on without it: "
                       "results are computed and returned as usual, but no longer kept for a later run. Free "
                       "some space, or give journal= a folder this user may write to", folder, e,
                       extra={logs.ONCE: f"journal refused: {folder}"})


def discard(folder: str, entry: str, why: Exception) -> None:
    """A damaged entry: removed (file and row), and its task computed again."""
    logger.warning("localcluster: a journal entry is damaged and was not used (%s); its task is computed "
                   "again", why)
    try:
        os.unlink(entry_path(folder, entry))
    except OSError:
        pass
    try:
        index(folder, "DELETE FROM entries WHERE id = ?", (entry,))
    except sqlite3.Error:
        pass
