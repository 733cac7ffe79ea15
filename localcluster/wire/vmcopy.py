"""Copy bytes straight between this process's memory and a child process's, with Linux's
``process_vm_writev`` and ``process_vm_readv``: one copy, into the receiver's fresh memory.

Why (benchmarks/copy_paths.py; the figures are in benchmarks/README.md): a memfd's pages
are 4 KiB shmem pages, each faulted on the writer's side and again on the reader's, which
makes a large value several times slower to move than one copy into fresh memory. Anonymous
memory may have transparent huge pages (``MADV_HUGEPAGE``, which the kernel grants where
``enabled`` is ``madvise`` or ``always``), and a copy by the parent into the worker's
huge-page buffer, or out of it, comes close to that floor.

Who may: the caller needs ptrace access to the other process. Yama's default policy
(``ptrace_scope`` 1) allows it from a process to its descendants, so the parent copies both
ways and a worker never does. Where it is refused (``ptrace_scope`` 2 or 3, a seccomp filter,
no such call), :func:`available` says so once per process and the callers keep memfds.

Pure functions and one probe; any thread. The buffers passed must stay alive, and the
remote range mapped, until a call returns: the callers own that.
"""
from __future__ import annotations

import ctypes
import errno
import mmap
import os
import sys
from typing import Any, Optional

__all__ = ["available", "address", "write_to", "read_from", "fresh", "HUGE"]

HUGE = 2 << 20          # buffers this large get transparent huge pages, when the kernel grants them
_MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", 14)
_MAX_CHUNK = 1 << 30    # bytes per call: the kernel moves at most MAX_RW_COUNT (~2 GiB) at once


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class _PyBuffer(ctypes.Structure):
    _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.c_void_p), ("len", ctypes.c_ssize_t),
                ("itemsize", ctypes.c_ssize_t), ("readonly", ctypes.c_int), ("ndim", ctypes.c_int),
                ("format", ctypes.c_char_p), ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                ("suboffsets", ctypes.c_void_p), ("internal", ctypes.c_void_p)]


def _calls() -> Optional[tuple]:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        calls = (libc.process_vm_writev, libc.process_vm_readv)
        get, release = ctypes.pythonapi.PyObject_GetBuffer, ctypes.pythonapi.PyBuffer_Release
    except (OSError, AttributeError):
        return None
    for fn in calls:
        fn.argtypes = [ctypes.c_int, ctypes.POINTER(_Iovec), ctypes.c_ulong, ctypes.POINTER(_Iovec),
                       ctypes.c_ulong, ctypes.c_ulong]
        fn.restype = ctypes.c_ssize_t
    get.argtypes, get.restype = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int], ctypes.c_int
    release.argtypes, release.restype = [ctypes.POINTER(_PyBuffer)], None
    return calls + (get, release)


_CALLS = _calls()
_verdict: Optional[bool] = None       # this process may copy into and out of its children (probed once)


def address(buf: Any) -> tuple[int, int]:
    """(address, length in bytes) of a C-contiguous buffer, read-only ones too. The address is
    good while ``buf`` (or the object exporting it) lives."""
    if _CALLS is None:
        raise OSError(errno.ENOSYS, "no process_vm_readv/writev here")
    view = _PyBuffer()
    _CALLS[2](buf, ctypes.byref(view), 0)      # PyBUF_SIMPLE: raises BufferError if not contiguous
    try:
        return view.buf or 0, view.len
    finally:
        _CALLS[3](ctypes.byref(view))


def _move(call: Any, pid: int, local: int, remote: int, n: int, what: str) -> None:
    done = 0
    while done < n:
        size = min(n - done, _MAX_CHUNK)
        lo, re_ = _Iovec(local + done, size), _Iovec(remote + done, size)
        got = call(pid, ctypes.byref(lo), 1, ctypes.byref(re_), 1, 0)
        if got < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what} process {pid}: {os.strerror(err)}")
        if got == 0:        # the remote range ends early: unmapped under us
            raise OSError(errno.EFAULT, f"{what} process {pid}: {done} of {n} bytes moved, then nothing")
        done += got


def write_to(pid: int, buf: Any, remote: int) -> None:
    """Copy all of ``buf`` into process ``pid`` at address ``remote``."""
    local, n = address(buf)
    _move(_CALLS[0], pid, local, remote, n, "writing into")


def read_from(pid: int, remote: int, n: int, into: Optional[Any] = None) -> Any:
    """``n`` bytes of process ``pid`` from address ``remote``, into ``into`` (a writable
    buffer of at least ``n`` bytes) or into a :func:`fresh` mapping, which is returned."""
    out = fresh(n) if into is None else into
    if n:
        local, size = address(out)
        if size < n:
            raise ValueError(f"read_from: a buffer of {size} bytes cannot take {n}")
        _move(_CALLS[1], pid, local, remote, n, "reading from")
    return out


def fresh(n: int) -> Any:
    """Writable anonymous memory of ``n`` bytes (an mmap; a bytearray when tiny), with
    transparent huge pages asked for when it is large: 512 times fewer page faults."""
    if n < mmap.PAGESIZE:
        return bytearray(n)
    # private: an anonymous mapping is shared by default, which makes it shmem, which gets no
    # huge pages where shmem_enabled is "never", the kernel's default
    m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if n >= HUGE and hasattr(m, "madvise"):
        try:
            m.madvise(_MADV_HUGEPAGE)
        except OSError:         # THP off ("never"), or a kernel without it: 4 KiB pages, still correct
            pass
    return m


def available(pid: int) -> bool:
    """Whether this process may copy into and out of its child ``pid``: probed once, by
    reading a few bytes of the child's own copy of a string every process maps at the same
    place (its command line's start, through /proc), then remembered for the process."""
    global _verdict
    if _verdict is not None:
        return _verdict
    if _CALLS is None:
        _verdict = False
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        arg_start = int(fields[45])              # field 48 of proc(5): arg_start
        read_from(pid, arg_start, 1, bytearray(1))
    except (OSError, ValueError, IndexError) as e:
        if isinstance(e, OSError) and e.errno == errno.ESRCH:
            return False                          # that child is gone: no verdict for the others
        _verdict = False
        return False
    _verdict = True
    return True
