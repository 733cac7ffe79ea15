"""A task's exception as its user reads it: where it was raised, and only its own frames.

On the worker, :func:`note_origin` adds a note (PEP 678) naming the worker, its pid and
the task; a ``ModuleNotFoundError`` says the import failed there. In the parent,
:func:`explain_here` adds what only the parent knows (is that module importable here?),
moving a missing module's explanation into its message, and, on Python 3.10, which prints
no notes, hangs the notes at the end of the cause chain. :func:`detached_traceback`
rebuilds the worker's frames, and :func:`task_frames` finds them again in a traceback that
grew each time the exception was raised, so that ``result()`` and ``gather`` raise it with
the task's frames under one of ours.
"""
from __future__ import annotations

import importlib.util
import os
import sys
import types
from typing import Any, Optional

from .basics import RemoteTraceback

# The notes this module writes begin so: they are replaced, never added twice (a module-level
# exception instance raised by several tasks on one worker is the same object each time).
_OURS = ("Raised on worker ", "The import of ", "In your process ")


def _notes(exc: BaseException) -> list:
    notes = getattr(exc, "__notes__", None)
    return list(notes) if isinstance(notes, list) else []


def _set_notes(exc: BaseException, notes: list) -> None:
    try:
        exc.__notes__ = notes  # type: ignore[attr-defined]  # on 3.11+ what add_note writes; on 3.10 kept for explain_here
    except Exception:  # noqa: BLE001 - an exception that refuses attributes keeps its message alone
        pass


def note_origin(exc: BaseException, worker: str, pid: int, key: str) -> None:
    """On the worker: say where ``exc`` was raised (replacing a note of ours it already has)."""
    notes = [n for n in _notes(exc) if not (isinstance(n, str) and n.startswith(_OURS))]
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        note = (f"The import of {exc.name!r} failed on worker {worker!r} (pid {pid}), in task {key!r}: the "
                f"workers' Python ({sys.executable}) does not find it on their sys.path.")
    else:
        note = f"Raised on worker {worker!r} (pid {pid}) in task {key!r}."
    _set_notes(exc, notes + [note])


def explain_here(exc: BaseException) -> None:
    """In the parent, once for each exception received: a module missing on a worker is looked
    up here, and on 3.10 the notes become a cause that prints. The explanation of a missing
    module goes into its message, not its notes: ``str()`` (a log line, ``f"{e}"``) shows no
    notes, and it is the whole of what the error means here."""
    notes = _notes(exc)
    ours = [n for n in notes if isinstance(n, str) and n.startswith("The import of ")]
    if isinstance(exc, ModuleNotFoundError) and exc.name and ours and isinstance(exc.msg, str):
        exc.msg = "\n".join([exc.msg, *ours, _here(exc.name)])      # what str() of an ImportError shows
        notes = [n for n in notes if n not in ours]
        _set_notes(exc, notes)
    if sys.version_info < (3, 11) and notes:
        _chain_end(exc).__cause__ = RemoteTraceback("\n".join(str(n) for n in notes) + "\n")


def _here(name: str) -> str:
    """Whether ``name`` imports in this process, and what to do either way."""
    top = name.partition(".")[0]
    try:
        spec = importlib.util.find_spec(top)    # the top-level name only: nothing is imported
    except (ImportError, ValueError):
        spec = None
    versions = "client.get_versions(check=True) compares the versions on both sides."
    if spec is None:
        return (f"In your process {top!r} is not importable either: install it in the environment the "
                f"workers run in ({sys.executable}), then client.restart(); {versions}")
    where = spec.origin if spec.origin not in (None, "built-in", "frozen") else "a namespace package"
    return (f"In your process {top!r} is importable (from {where}), so the workers see another environment: "
            f"they run {sys.executable} with the sys.path this process had when they started. Make it "
            f"importable there (install it in that environment, or set sys.path first), then "
            f"client.restart(), which starts them with this process's sys.path; {versions}")


def _chain_end(exc: BaseException) -> BaseException:
    """The last exception of ``exc``'s chain, as the traceback module follows it."""
    seen = {id(exc)}
    while True:
        nxt = exc.__cause__ if exc.__cause__ is not None else (
            None if exc.__suppress_context__ else exc.__context__)
        if nxt is None or id(nxt) in seen:
            return exc
        seen.add(id(nxt))
        exc = nxt


def strip_own_frames(tb: Optional[types.TracebackType]) -> Optional[types.TracebackType]:
    """On the worker: ``tb`` without its leading frames of localcluster (the task's runner)."""
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(_PACKAGE):
        tb = tb.tb_next
    return tb


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep     # localcluster/, two up

# A generator that never ran: its frame has no f_back. Each remote frame is one of these,
# renamed, so that a received traceback leads nowhere (see detached_traceback).
_GENERATOR = (lambda: (yield)).__code__


def detached_traceback(tb: Any) -> Optional[types.TracebackType]:
    """A real traceback of tblib's ``Traceback`` whose frames lead nowhere. tblib's own
    ``as_traceback`` raises in frames whose ``f_back`` is the stack that called it, so an
    exception kept by pytest or IPython (``sys.last_value``) would keep every local of the
    code that received it alive: the erred Future among them, and so its key and all it
    depends on in the cluster. A generator that never ran has a frame with no ``f_back``."""
    entries = []
    while tb is not None:
        code = tb.tb_frame.f_code
        entries.append((code.co_filename, code.co_name, tb.tb_lineno, tb.tb_frame.f_globals))
        tb = tb.tb_next
    out = None
    for filename, name, lineno, f_globals in reversed(entries):
        qualname = {"co_qualname": name} if hasattr(_GENERATOR, "co_qualname") else {}   # 3.11+: IPython shows it
        code = _GENERATOR.replace(co_filename=filename, co_name=name, co_firstlineno=lineno, **qualname)
        frame = types.FunctionType(code, dict(f_globals))().gi_frame
        # lasti 0: an instruction without column positions, which the stand-in code could only
        # get wrong (with -1, the 3.11 and 3.12 printers write an empty line for the carets)
        out = types.TracebackType(out, frame, 0, lineno)
    return out


def task_frames(exc: BaseException) -> Optional[types.TracebackType]:
    """The frames ``exc`` had on its worker, without those added in this process each time it
    was raised (concurrent.futures', ours and the caller's); None when it has none."""
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_back is None and frame.f_code.co_code == _GENERATOR.co_code:
            return tb
        tb = tb.tb_next
    return None
