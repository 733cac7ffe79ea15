"""The journal of finished work (``LocalCluster(journal=PATH)``): the parent's side.

Which tasks are kept: those with a deterministic key (``submit``/``map`` with pure=True, the
default, their key made or given; a dask graph's keys), never ``pure=False`` ones (an actor's
making is one), never errors. An
entry is valid for a key and a fingerprint of the code that made it (``fingerprint``):
the function's bytecode, constants, nested functions, defaults and closure values, and
the code of the functions and classes of its own module that it names. A pure task's key
is made here from that fingerprint and a token of its arguments (``token``), so that the
same call in a later process has the same key; an argument with no deterministic token
leaves its task unjournaled, with one warning naming its type.

Before a task is placed, its entry is looked up in the index (``Keeper.lookup``): a task
whose entry exists is not sent to the scheduler at all; its Future is finished at once,
holding an ``InJournal`` that ``result()`` reads in this process. A later task that needs
it as an input has it run first as a ``Journaled`` task (worker/journal.py), which reads the
file on the worker that needs it. Every other journaled task runs as a ``Journaled`` too,
which writes its result there as it finishes. Nothing here runs per task without a journal.

``Journal`` is what the user holds (``cluster.journal``); ``Keeper`` is the cluster's
internal side, reached by the Clients through the gateway.
"""
from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import fractions
import functools
import hashlib
import json
from pickle import loads as pickle_loads
import logging
import os
import pathlib
import shutil
import sqlite3
import sys
import threading
import time
import types
import uuid
import weakref
from typing import Any, Callable, Optional

from . import runs
from .config import format_bytes
from .runs import PreviousRun
from .system import registry
from .wire import serialize
from .worker import journal as J
from .worker.future import Later

__all__ = ["InJournal", "Journal", "JournalError", "Keeper", "entry_id", "fingerprint", "open_journal", "pure_key",
           "graph_code", "token", "why_untokenizable"]

logger = logging.getLogger("localcluster")

_CHUNK = 500          # ids a lookup asks the index at once (SQLite's limit on variables is 999 or more)


class JournalError(RuntimeError):
    """The journal cannot be used as it is (its index is damaged beyond rebuilding): the
    message names its folder and what to do.

    Raised where the cluster opens its journal (``LocalCluster(journal=...)``), when its
    index was damaged and could not be made again from the results in the folder. Remove
    the index file the message names (the results beside it are kept and found again), or
    give ``journal=`` another folder.
    """


class _Untokenizable(Exception):
    """A value with no deterministic token: what it is, in words."""


# --- tokens and fingerprints ----------------------------------------------------------------

_PLAIN = (type(None), bool, int, float, complex, type(...))
_BY_REPR = (range, slice, datetime.date, datetime.time, datetime.timedelta, decimal.Decimal, fractions.Fraction,
            pathlib.PurePath, uuid.UUID)


def token(obj: Any) -> Optional[str]:
    """A hex digest that is the same for equal values in any process, or None when ``obj``
    holds something that has none (``why_untokenizable`` says what)."""
    h = hashlib.sha1(usedforsecurity=False)
    try:
        _feed(h, obj, set())
    except (_Untokenizable, RecursionError):
        return None
    return h.hexdigest()


def why_untokenizable(obj: Any) -> str:
    try:
        _feed(hashlib.sha1(usedforsecurity=False), obj, set())
    except _Untokenizable as e:
        return str(e)
    except RecursionError:
        return "a structure nested too deeply"
    return ""


def _text(h: Any, tag: bytes, data: bytes) -> None:
    h.update(tag + b"%d:" % len(data))
    h.update(data)


def _feed(h: Any, obj: Any, seen: set) -> None:
    t = type(obj)
    if t in _PLAIN:
        _text(h, b"p", f"{t.__name__}:{obj!r}".encode())
    elif t is str:
        _text(h, b"s", obj.encode("utf-8", "surrogatepass"))
    elif t in (bytes, bytearray):
        _text(h, b"b", bytes(obj))
    elif t in (tuple, list):
        h.update(b"(%d" % len(obj) if t is tuple else b"[%d" % len(obj))
        for x in obj:
            _feed(h, x, seen)
    elif t is dict:
        _items(h, b"{", [(token_or_raise(k, seen), v) for k, v in obj.items()], seen)
    elif t in (set, frozenset):
        h.update(b"<%d" % len(obj))
        for tok in sorted(token_or_raise(x, seen) for x in obj):
            h.update(tok.encode())
    else:
        _feed_other(h, obj, t, seen)


def token_or_raise(obj: Any, seen: set) -> str:
    h = hashlib.sha1(usedforsecurity=False)
    _feed(h, obj, seen)
    return h.hexdigest()


def _items(h: Any, tag: bytes, items: list, seen: set) -> None:
    h.update(tag + b"%d" % len(items))
    for tok, value in sorted(items, key=lambda kv: kv[0]):
        h.update(tok.encode())
        _feed(h, value, seen)


def _feed_other(h: Any, obj: Any, t: type, seen: set) -> None:
    module = getattr(t, "__module__", "") or ""
    if hasattr(obj, "__dask_tokenize__") and not isinstance(obj, type):
        _text(h, b"d", f"{module}.{t.__qualname__}".encode())
        _feed(h, obj.__dask_tokenize__(), seen)
    elif (module == "numpy" or module.startswith("numpy.")) and isinstance(obj, _numpy_types()):
        _numpy(h, obj, t)
    elif module.startswith("pandas."):
        _pandas(h, obj, seen)
    elif isinstance(obj, enum.Enum):
        _text(h, b"e", f"{module}.{t.__qualname__}.{obj.name}".encode())
    elif isinstance(obj, _BY_REPR):
        _text(h, b"r", f"{module}.{t.__qualname__}:{obj!r}".encode())
    elif t.__name__ == "Future" and module.startswith("localcluster"):
        _text(h, b"f", obj.key.encode())
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        _text(h, b"c", f"{module}.{t.__qualname__}".encode())
        for f in dataclasses.fields(obj):
            _feed(h, f.name, seen)
            _feed(h, getattr(obj, f.name), seen)
    elif callable(obj) and not _library_name(module):
        _text(h, b"F", _fingerprint(obj, seen).encode())
    elif _library_name(module):
        _text(h, b"L", _pickled(obj, module, t))
    else:
        raise _Untokenizable(f"a {module}.{t.__qualname__}")


def _pickled(obj: Any, module: str, t: type) -> bytes:
    """A value of an installed package's type, as pickle writes it (its functions by name):
    the same in another process, or at worst a different token (a miss), never a wrong hit."""
    import pickle
    try:
        return f"{module}.{t.__qualname__}@{_library_name(module)}:".encode() + pickle.dumps(obj, protocol=4)
    except Exception as e:  # noqa: BLE001 - whatever pickle refuses has no token
        raise _Untokenizable(f"a {module}.{t.__qualname__} ({type(e).__name__}: {e})") from None


def _numpy_types() -> tuple:
    import numpy as np
    return (np.ndarray, np.generic, np.dtype)


def _numpy(h: Any, obj: Any, t: type) -> None:
    import numpy as np
    if isinstance(obj, np.ndarray):
        if obj.dtype.hasobject:
            raise _Untokenizable("a numpy array of Python objects")
        _text(h, b"n", f"{obj.dtype.str}{obj.shape}".encode())
        h.update(np.ascontiguousarray(obj).data.cast("B"))
    elif isinstance(obj, np.generic):
        _text(h, b"g", f"{obj.dtype.str}".encode() + obj.tobytes())
    elif isinstance(obj, np.dtype):
        _text(h, b"t", obj.str.encode())
    else:
        raise _Untokenizable(f"a numpy.{t.__qualname__}")


def _pandas(h: Any, obj: Any, seen: set) -> None:
    import pandas as pd
    if not isinstance(obj, (pd.DataFrame, pd.Series, pd.Index)):
        raise _Untokenizable(f"a {type(obj).__module__}.{type(obj).__qualname__}")
    _text(h, b"P", type(obj).__name__.encode())
    _feed(h, [str(d) for d in (obj.dtypes if isinstance(obj, pd.DataFrame) else [obj.dtype])], seen)
    if isinstance(obj, pd.DataFrame):
        _feed(h, [str(c) for c in obj.columns], seen)
    _numpy(h, pd.util.hash_pandas_object(obj, index=not isinstance(obj, pd.Index)).to_numpy(), object)


def fingerprint(fn: Any) -> str:
    """A hex digest of the code ``fn`` runs, the same in any process of this Python version:
    _Untokenizable when part of it has no deterministic token (a closure over an open file)."""
    return _fingerprint(fn, set())


def _fingerprint(fn: Any, seen: set) -> str:
    h = hashlib.sha1(usedforsecurity=False)
    h.update(b"py%d.%d;" % sys.version_info[:2])
    _code_of(h, fn, seen)
    return h.hexdigest()


def _code_of(h: Any, fn: Any, seen: set) -> None:
    if id(fn) in seen:      # recursion, or mutual calls: named once
        _text(h, b"again", f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', '')}".encode())
        return
    seen.add(id(fn))
    if isinstance(fn, functools.partial):
        _code_of(h, fn.func, seen)
        _feed(h, (fn.args, fn.keywords), seen)
    elif isinstance(fn, types.MethodType):
        _code_of(h, fn.__func__, seen)
        _feed(h, fn.__self__, seen)
    elif isinstance(fn, types.FunctionType) and _library_name(fn.__module__):
        # an installed package's or Python's own: its code is its version's
        _text(h, b"lib", f"{fn.__module__}.{fn.__qualname__}@{_library_name(fn.__module__)}".encode())
        _feed(h, (fn.__defaults__, fn.__kwdefaults__), seen)
    elif isinstance(fn, types.FunctionType):
        _text(h, b"fn", f"{fn.__module__}.{fn.__qualname__}".encode())
        _code(h, fn.__code__, fn, seen)
        _feed(h, (fn.__defaults__, fn.__kwdefaults__), seen)
        for cell in fn.__closure__ or ():
            try:
                value = cell.cell_contents
            except ValueError:       # a cell not filled yet
                value = None
            _feed(h, value, seen)
    elif isinstance(fn, type):
        _class(h, fn, seen)
    elif isinstance(fn, (types.BuiltinFunctionType, types.BuiltinMethodType, types.MethodWrapperType,
                         types.WrapperDescriptorType, types.MethodDescriptorType)):
        _text(h, b"builtin", f"{getattr(fn, '__module__', None)}.{getattr(fn, '__qualname__', fn)}".encode())
        bound = getattr(fn, "__self__", None)
        if bound is not None and not isinstance(bound, types.ModuleType):
            _feed(h, bound, seen)
    elif callable(fn) and _library_name(type(fn).__module__):
        _feed(h, fn, seen)           # an installed package's callable object: its pickle
    elif callable(fn):
        _class(h, type(fn), seen)
        _feed(h, _state(fn), seen)
    else:
        raise _Untokenizable(f"a {type(fn).__module__}.{type(fn).__qualname__}")


def _state(obj: Any) -> Any:
    state = getattr(obj, "__dict__", None)
    if state is None:
        raise _Untokenizable(f"a {type(obj).__module__}.{type(obj).__qualname__} (a callable without __dict__)")
    return state


def _class(h: Any, cls: type, seen: set) -> None:
    """A class by its name; for one defined in a script or a module of the user's, the code
    of its methods too."""
    _text(h, b"cls", f"{cls.__module__}.{cls.__qualname__}".encode())
    module = sys.modules.get(cls.__module__)
    if module is None or _library(module):
        return
    for name in sorted(vars(cls)):
        member = vars(cls)[name]
        member = getattr(member, "__func__", member)     # staticmethod, classmethod
        if isinstance(member, types.FunctionType):
            _text(h, b"m", name.encode())
            _code_of(h, member, seen)


_libraries: dict = {}      # module name -> "" (the user's) or the version of the package it is part of


def _library_name(name: Optional[str]) -> str:
    """For a module of an installed package or of Python: its package's version (or
    Python's), never empty; "" for one of the user's (a script, a notebook, their own code)."""
    if name is None:
        return ""
    got = _libraries.get(name)
    if got is None:
        module = sys.modules.get(name)
        if module is None or not _library(module):
            got = ""
        else:
            top = sys.modules.get(name.partition(".")[0])
            got = str(getattr(top, "__version__", "") or "py%d.%d" % sys.version_info[:2])
        _libraries[name] = got
    return got


def _library(module: types.ModuleType) -> bool:
    """A module of Python's or of an installed package: its code is its version's."""
    path = getattr(module, "__file__", None) or ""
    return not path or "site-packages" in path or "dist-packages" in path or \
        path.startswith(os.path.dirname(os.__file__))


def _code(h: Any, code: types.CodeType, fn: types.FunctionType, seen: set) -> None:
    h.update(code.co_code)
    _feed(h, (code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars, code.co_argcount,
              code.co_kwonlyargcount, code.co_flags), seen)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _code(h, const, fn, seen)
        else:
            _feed(h, const, seen)
    # the functions and classes of its own module it names: their code is part of its own
    for name in code.co_names:
        callee = fn.__globals__.get(name)
        if isinstance(callee, (types.FunctionType, type)) and getattr(callee, "__module__", None) == fn.__module__:
            _code_of(h, callee, seen)


def graph_code(args: tuple) -> str:
    """A fingerprint of the code of the dask graph nodes among ``args`` (a node's function,
    and those of the nodes fused into it); "" when there is none. _Untokenizable when a
    node's function has no fingerprint."""
    nodes = [a for a in args if type(a).__module__ == "dask._task_spec"]
    if not nodes:
        return ""
    found: set = set()
    for node in nodes:
        _node_code(node, found)
    return hashlib.sha1("".join(sorted(found)).encode(), usedforsecurity=False).hexdigest()


def _node_code(obj: Any, found: set) -> None:
    if type(obj) in (tuple, list):
        for x in obj:
            _node_code(x, found)
    elif type(obj) is dict:
        for x in obj.values():
            _node_code(x, found)
    elif type(obj).__module__ == "dask._task_spec" and hasattr(obj, "func"):
        found.add(fingerprint(obj.func))
        _node_code(obj.args, found)
        _node_code(getattr(obj, "kwargs", None) or {}, found)


# --- the lazy value -------------------------------------------------------------------------

class InJournal(Later):
    """A finished Future's result while it is only in the journal: ``load()`` reads it here
    (and, if the entry turns out damaged or gone, has the task computed again)."""
    __slots__ = ("keeper", "entry", "again")

    def __init__(self, keeper: "Keeper", entry: str, again: Callable[[], Any]):
        self.keeper, self.entry, self.again = keeper, entry, again

    def load(self) -> Any:
        try:
            payload = self.keeper.read(self.entry)
        except (ValueError, OSError) as e:     # damaged, or unreadable
            self.keeper.discard(self.entry, e)
            return self.again()
        return serialize.loads(payload)


# --- the journal ----------------------------------------------------------------------------

class Keeper:
    """The cluster's side of its journal: the index, the fingerprints and wrapped functions
    of this cluster's tasks, what was reused. Any thread."""

    def __init__(self, path: str, run: str):
        self.path = path
        self.run = run                       #: this cluster's run id, in the rows it writes
        self.reused = 0
        self.previous: Optional[PreviousRun] = None
        self._lock = threading.Lock()
        self._fingerprints: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        self._wrapped: dict = {}             # (fn_id, fingerprint) -> (fn_id, bytes) of its Journaled
        self._warned: set = set()

    def fingerprint(self, fn: Any, name: str) -> Optional[str]:
        """``fn``'s fingerprint, made once while it lives; None (one warning) when it has none."""
        try:
            fp = self._fingerprints.get(fn)
        except TypeError:           # not weakly referable, or unhashable: made each time
            fp = None
        if fp is not None:
            return fp
        try:
            fp = fingerprint(fn)
        except (_Untokenizable, RecursionError) as e:
            self.warn_unjournaled(name, f"its function has no deterministic fingerprint ({e})")
            return None
        try:
            self._fingerprints[fn] = fp
        except TypeError:
            pass
        return fp

    def warn_unjournaled(self, name: str, why: str) -> None:
        if (name, why) not in self._warned:
            self._warned.add((name, why))
            logger.warning("localcluster: tasks of %s() are not kept in the journal: %s. They run as usual, each "
                           "time (said once)", name, why)

    def wrapped(self, fn_id: int, fn_bytes: bytes, fp: str, new_id: Callable[[], int],
                load_first: bool = False) -> tuple[int, bytes]:
        """(function id, pickled bytes) of ``fn`` run as a Journaled, made once."""
        with self._lock:
            got = self._wrapped.get((fn_id, fp, load_first))
            if got is None:
                data = serialize.pickle_function(J.Journaled(self.path, self.run, fp, fn_bytes, load_first))
                got = self._wrapped[(fn_id, fp, load_first)] = (new_id(), data)
            return got

    def reader(self, fp: str, new_id: Callable[[], int], terms: Any = None) -> tuple[int, bytes]:
        """(function id, pickled bytes) of the Journaled that reads the entries of ``fp``: of
        the function of ``terms`` (computed again if an entry is damaged), else of none."""
        if terms is None:
            return self.wrapped(-1, b"", fp, new_id)
        got = self._wrapped.get((terms.fn_id, fp, True))
        if got is not None:
            return got
        return self.wrapped(terms.fn_id, pickle_loads(terms.fn).fn_bytes, fp, new_id, load_first=True)

    def lookup(self, entries: list) -> set:
        """The ids among ``entries`` the index holds (an empty set when it cannot be read)."""
        found: set = set()
        try:
            for i in range(0, len(entries), _CHUNK):
                chunk = entries[i:i + _CHUNK]
                rows = J.index(self.path, f"SELECT id FROM entries WHERE id IN ({','.join('?' * len(chunk))})",
                               tuple(chunk))
                found.update(r[0] for r in rows)
        except sqlite3.Error as e:
            self.warn_once("lookup", "localcluster: the journal's index in %s cannot be read (%s); tasks are "
                           "computed as if it were empty", self.path, e)
            return set()
        return found

    def warn_once(self, what: str, text: str, *args: Any) -> None:
        if what not in self._warned:
            self._warned.add(what)
            logger.warning(text, *args)

    def read(self, entry: str) -> Any:
        return J.read_entry(self.path, entry)

    def read_ahead(self, states: list) -> None:
        """The results of these keys' futures (their FutureStates) kept in the index's rows,
        read in one pass and handed to them (``FutureState.prefill``): a gather of many small
        ones without a query each. Those in files, damaged or gone are left for ``result()``."""
        waiting: dict = {}
        for f in states:
            lazy = f.later()
            if type(lazy) is InJournal:
                waiting.setdefault(lazy.entry, []).append(f)
        if not waiting:
            return
        ids = list(waiting)
        try:
            for i in range(0, len(ids), _CHUNK):
                chunk = ids[i:i + _CHUNK]
                rows = J.index(self.path, f"SELECT id, crc, data FROM entries WHERE data IS NOT NULL AND id IN "
                                          f"({','.join('?' * len(chunk))})", tuple(chunk))
                for entry, crc, data in rows:
                    try:
                        payload = J.parsed_row(crc, data, entry, self.path)
                    except ValueError:
                        continue
                    for f in waiting.get(entry, ()):
                        f.prefill(payload)
        except sqlite3.Error:
            return

    def discard(self, entry: str, why: Exception) -> None:
        J.discard(self.path, entry, why)

    def count_reused(self, n: int) -> None:
        with self._lock:
            self.reused += n

    def stored(self) -> int:
        try:
            return J.index(self.path, "SELECT COUNT(*) FROM entries WHERE run = ?", (self.run,))[0][0]
        except sqlite3.Error:
            return 0

    def size(self) -> int:
        try:
            return int(J.index(self.path, "SELECT COALESCE(SUM(size), 0) FROM entries")[0][0])
        except sqlite3.Error:
            return 0

    def clear(self) -> None:
        J.index(self.path, "DELETE FROM entries")
        shutil.rmtree(os.path.join(self.path, J.RESULTS), ignore_errors=True)
        os.makedirs(os.path.join(self.path, J.RESULTS), mode=0o700, exist_ok=True)

    def close(self) -> None:
        J.disconnect(self.path)

    # --- the runs on this journal (runs.py's records) ---------------------------------------

    def write_run(self, record: dict) -> None:
        """This cluster's run record (RunRecorder's), kept in the journal too; never raises."""
        try:
            J.change(self.path, "INSERT OR REPLACE INTO runs VALUES (?, ?)", (self.run, json.dumps(record)))
        except (sqlite3.Error, TypeError, ValueError) as e:
            self.warn_once("runs", "localcluster: the journal in %s cannot record this run (%s); a later run will "
                           "not be able to say how this one ended", self.path, e)

    def tell_previous(self, folders: dict) -> frozenset:
        """As the cluster starts: the runs on this journal that ended without closing, not
        told yet, explained (runs.judged) and claimed; the newest is ``previous``, said in one
        WARNING line with what of its work the journal kept. Their pids."""
        try:
            rows = J.index(self.path, "SELECT run, record FROM runs WHERE run != ?", (self.run,))
        except sqlite3.Error:
            return frozenset()
        me = registry.identity()
        log: list = []            # the kernel log, read once if a run needs it
        ended: list = []
        for run, text in rows:
            try:
                record = json.loads(text)
                if not isinstance(record, dict) or record.get("closed") or record.get("told"):
                    continue
                found = runs.judged(record, me, log)
            except (TypeError, ValueError, KeyError, AttributeError):
                continue          # not as a run writes it: nothing to say of it
            if found is None:
                continue
            record["told"] = True
            try:        # of two clusters starting at once, one claims it
                if J.change(self.path, "UPDATE runs SET record = ? WHERE run = ? AND record = ?",
                            (json.dumps(record), run, text)) != 1:
                    continue
            except sqlite3.Error:
                continue
            runs.forget_note(record)
            ended.append((found, run))
        if not ended:
            return frozenset()
        ended.sort(key=lambda fr: -fr[0].started)
        self.previous, run = ended[0]
        self._say(self.previous, run, folders.get(self.previous.pid))
        return frozenset(found.pid for found, _run in ended)

    def _say(self, last: PreviousRun, run: str, folder: Optional[str]) -> None:
        try:
            kept = J.index(self.path, "SELECT COUNT(*) FROM entries WHERE run = ?", (run,))[0][0]
        except sqlite3.Error:
            kept = 0
        how = f"{last.cause}, {last.signal}" if last.signal else last.cause
        logger.warning("localcluster: the last run on the journal %s (pid %d, %s) ended without closing its cluster "
                       "at %s: %s%s; %d tasks had finished, %d were pending. The %d results it kept in the journal are "
                       "reused, not computed again. cluster.journal.previous.message says more.%s", self.path, last.pid,
                       runs.describe({"argv": last.argv, "notebook": last.notebook}), runs.clock(last.ended), how,
                       " (out of memory)" if last.cause == "oom-killer" else "", max(last.finished, kept),
                       last.pending, kept,
                       f" Its cluster's folder was removed: {folder}" if folder else "")


class Journal:
    """The journal of finished work of a cluster (``LocalCluster(journal=PATH)``): results
    kept in the folder ``path`` for later runs. ``reused``: this cluster's tasks served from
    it; ``stored``: results this cluster wrote; ``bytes``: its size on disk; ``previous``:
    the run on this journal that ended without closing, found as this cluster started
    (runs.PreviousRun), or None; ``clear()`` empties it."""

    def __init__(self, keeper: Keeper):
        self._keeper = keeper

    @property
    def path(self) -> str:
        return self._keeper.path

    @property
    def reused(self) -> int:
        return self._keeper.reused

    @property
    def stored(self) -> int:
        return self._keeper.stored()

    @property
    def bytes(self) -> int:
        return self._keeper.size()

    @property
    def previous(self) -> Optional[PreviousRun]:
        return self._keeper.previous

    def clear(self) -> None:
        """Remove every entry (of every run) from the journal."""
        self._keeper.clear()

    def __repr__(self) -> str:
        return f"<Journal {self.path!r}: {self.reused} reused, {self.stored} stored, {format_bytes(self.bytes)}>"


# --- opening ---------------------------------------------------------------------------------

def open_journal(path: str, run: str) -> Optional[Keeper]:
    """The Keeper of the journal in folder ``path`` (made if missing, 0700); None, with one
    warning, when it cannot be written (the run goes on without it). A path that is a
    file is refused (NotADirectoryError naming ``journal``); a damaged index is rebuilt
    from the files, or refused (JournalError) naming the folder and what to do."""
    path = os.path.abspath(path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise NotADirectoryError(f"journal={path!r}: this is a file, not a folder. Give journal= a folder "
                                 f"(made if missing) to keep the results in")
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        _check_writable(path)
        os.makedirs(os.path.join(path, J.RESULTS), mode=0o700, exist_ok=True)
        os.makedirs(os.path.join(path, J.TEMPORARY), mode=0o700, exist_ok=True)
        sweep(path)
        # SQLite makes its -wal and -shm files with the index's own mode
        os.close(os.open(os.path.join(path, J.INDEX), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
        _open_index(path)
    except OSError as e:
        logger.warning("localcluster: the journal %s cannot be used (%s); this run goes on without it: "
                       "nothing is reused or kept. Give journal= a folder this user may write to, on a disk "
                       "with room", path, e)
        return None
    return Keeper(path, run)


def sweep(path: str) -> int:
    """Remove the temporary files that writers killed mid-entry left in the journal
    ``path``: those whose process is gone, or is another that took its pid since. The
    number removed."""
    folder = os.path.join(path, J.TEMPORARY)
    names = os.listdir(folder)
    if not names:
        return 0
    import psutil         # only now: a first cluster starts without it
    removed = 0
    for name in names:
        try:
            pid = int(name.rsplit(".", 2)[-2].split("-", 1)[0])
            mtime = os.stat(os.path.join(folder, name)).st_mtime
            if psutil.pid_exists(pid) and psutil.Process(pid).create_time() <= mtime + 1:
                continue              # its writer is alive: another process on this journal
        except (ValueError, IndexError, psutil.Error):
            pass                      # not a name we give, or its process went meanwhile
        except FileNotFoundError:
            continue                  # renamed into place meanwhile
        try:
            os.unlink(os.path.join(folder, name))
            removed += 1
        except OSError:
            pass
    return removed


def _check_writable(path: str) -> None:
    probe = os.path.join(path, f".probe-{os.getpid()}")
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    os.close(fd)
    os.unlink(probe)


def _open_index(path: str) -> None:
    try:
        conn = J.connect(path, create=True)
        ok = conn.execute("PRAGMA quick_check").fetchone()
        if ok is None or ok[0] != "ok":
            raise sqlite3.DatabaseError(f"quick_check says {ok[0] if ok else 'nothing'}")
        conn.execute("SELECT id, key, size, run, written, crc, data FROM entries LIMIT 1").fetchall()
        conn.execute("SELECT run, record FROM runs LIMIT 1").fetchall()
    except sqlite3.OperationalError as e:
        if _unwritable(e):
            J.disconnect(path)
            raise OSError(str(e)) from None
        _rebuild(path, e)
    except sqlite3.DatabaseError as e:
        _rebuild(path, e)


def _unwritable(e: sqlite3.Error) -> bool:
    text = str(e).lower()
    return any(w in text for w in ("readonly", "read-only", "disk is full", "unable to open", "disk i/o"))


def _rebuild(path: str, why: Exception) -> None:
    """The index is damaged: moved aside, and made again from the files (each read only
    when used, and checked then)."""
    J.disconnect(path)
    aside = os.path.join(path, f"{J.INDEX}.damaged-{int(time.time())}")
    try:
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(os.path.join(path, J.INDEX + suffix)):
                os.rename(os.path.join(path, J.INDEX + suffix), aside + suffix)
        conn = J.connect(path, create=True)
        rows = []
        results = os.path.join(path, J.RESULTS)
        for sub in sorted(os.listdir(results)) if os.path.isdir(results) else ():
            for name in sorted(os.listdir(os.path.join(results, sub))):
                if len(name) == 40 and not name.endswith(".tmp"):
                    rows.append((name, "", os.path.getsize(os.path.join(results, sub, name)), "rebuilt", time.time(),
                                 None, None))
        conn.executemany("INSERT OR REPLACE INTO entries VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
    except (OSError, sqlite3.Error) as e:
        J.disconnect(path)
        raise JournalError(f"journal={path!r}: its index is damaged ({why}) and could not be made again ({e}). "
                           f"Remove {os.path.join(path, J.INDEX)!r} (the results beside it are kept and found "
                           f"again), or give journal= another folder") from None
    logger.warning("localcluster: the index of the journal %s was damaged (%s); it was made again from the %d "
                   "results there (the damaged one is %s, which you may delete)", path, why, len(rows), aside)


entry_id = J.entry_id


def combined(fp: str, code: str) -> str:
    """A task's fingerprint: its function's and that of the code in its arguments (a dask node's)."""
    return hashlib.sha1(f"{fp}+{code}".encode(), usedforsecurity=False).hexdigest() if code else fp


def pure_key(fp: str, tok: str) -> str:
    """The hash part of a journaled pure task's key: of its code and its arguments' token."""
    return hashlib.sha1(f"{fp}\0{tok}".encode(), usedforsecurity=False).hexdigest()
