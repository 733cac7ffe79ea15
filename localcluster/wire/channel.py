"""A framed, duplex message channel over a Unix socket pair, with file-descriptor passing.

Why not ``multiprocessing.Connection``: it cannot pass file descriptors, and large
buffers would cross the socket byte by byte. Here a message is pickled with
protocol 5; every out-of-band buffer of ``MEMFD_THRESHOLD`` bytes or more is
written once into an anonymous ``memfd`` and its descriptor rides along with the
frame (SCM_RIGHTS). The receiver maps it copy-on-write, so nothing is named in
/dev/shm and nothing can leak: the memory is freed with the last mapping.

Every out-of-band buffer is received as a ``PickleBuffer``, the type it was sent
as, so whatever arrives (a Payload in a ``Data`` reply, say) can be sent on again
as it is: a relay or a re-export never needs to know where its bytes came from.
The parent's end keeps each received memfd's descriptor, so a value relayed from one
worker to another passes on the same memfd: one copy (the holder's write) from worker
to worker, not three. It lets the descriptor go (:func:`let_go`) before the bytes reach
user code.

Frame layout (little endian)::

    u64 total | u32 n_buffers | u64 env_len | n_buffers x u64 (size; bit 63: memfd, bit 62:
    read-only; bit 61: copied in by the sender, and a u64 token follows) | envelope | inline buffers

The envelope is the pickled message, or (a first byte other than pickle's PROTO) a lone
Run, Finished, Failed, Skipped, Cancel or Free in protocol's fixed layout, with no buffers.

An inline buffer comes back as writable as it was sent (a bytearray, or a writable
array's memory); a memfd mapping is private, so always writable.

Where the parent may copy into its worker's memory (vmcopy.py, ``copies_into``), its
channel does not write large buffers into memfds: it stashes them (``take`` hands them
back) and frames a token in their place (size bit 61). The worker's reader allocates fresh
memory for each and yields the message wrapped in :class:`Incoming`, not to be used until
the parent has copied the bytes in (ARCHITECTURE.md).

The parent's end is non-blocking: ``send`` never waits for a slow worker; what
does not fit goes to an outbox that the scheduler thread flushes when the socket
is writable. The worker's end blocks.
"""
from __future__ import annotations

import array
import errno
import itertools
import mmap
import os
import pickle
import socket
import struct
import sys
import threading
from collections import deque
from typing import Any, Callable, Iterator, NamedTuple, Optional

from . import vmcopy
from .protocol import MEMFD_THRESHOLD, pack_lone, unpack_lone

HAVE_MEMFD = hasattr(os, "memfd_create")
_CLOEXEC = getattr(socket, "MSG_CMSG_CLOEXEC", 0)     # Linux; elsewhere descriptors arrive inheritable
_HEAD = struct.Struct("<QIQ")
_SIZE = struct.Struct("<Q")
_FD_FLAG = 1 << 63
_RO_FLAG = 1 << 62
_IN_FLAG = 1 << 61          # the sender copies it into the receiver's memory itself (vmcopy.py); a token follows
_SIZE_MASK = _IN_FLAG - 1
_MAX_FDS = 253  # SCM_MAX_FD
# How a buffer of a frame crosses (encode); any other value is a held memfd's descriptor, passed on
_STASHED, _INLINE, _MEMFD = -1, -2, -3
_PICKLE = b"\x80"          # a pickle's first byte (PROTO); else the envelope is protocol.pack_lone's
_RECV = 1 << 18            # bytes per read, into a buffer kept by the reader
_RECV_MAX = 1 << 22        # one read of a large frame: more reads take the rest


def _to_memfd(buf: memoryview) -> int:
    fd = os.memfd_create("localcluster", os.MFD_CLOEXEC)
    try:
        done, n = 0, buf.nbytes
        while done < n:
            done += os.write(fd, buf[done:])
        return fd
    except BaseException:
        os.close(fd)
        raise


# A private mapping: the receiver may write into what it got (copy-on-write, page by
# page) and the sender's bytes never change under it. In a worker its pages are mapped at
# once (MADV_POPULATE_READ), so that the data counts in the worker's RSS and memory
# supervision sees what it holds; the parent maps them as they are read.
# MAP_POPULATE would do that too, but on a private writable mapping it breaks
# copy-on-write up front: a second full copy of every buffer, several times dearer than
# populating for reading. It stays the fallback for kernels before 5.14.
_MADV_POPULATE_READ = 22
_populate_read = hasattr(mmap.mmap, "madvise")
_PROT = mmap.PROT_READ | mmap.PROT_WRITE


# 3.13+: the mapping keeps no duplicate of the descriptor, so a worker may hold more
# received buffers than it may open files. Before 3.13 each live mapping holds one.
_NO_FD = {"trackfd": False} if sys.version_info >= (3, 13) else {}


class _Held(mmap.mmap):
    """A received memfd's mapping that keeps its descriptor (``fd``), so that the parent
    can pass the same bytes on without copying them: a relay from one worker to another
    costs the holder's one write. Safe because a memfd's bytes never change once sent
    (every mapping of one is private, and its writer closed it), and because a held
    mapping is never written: :func:`let_go` closes the descriptor before the bytes can
    reach user code."""
    fd = -1

    def let_go(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def __del__(self) -> None:
        self.let_go()


def _from_memfd(fd: int, size: int, hold: bool) -> pickle.PickleBuffer:
    global _populate_read
    flags = mmap.MAP_PRIVATE if hold or _populate_read else mmap.MAP_PRIVATE | getattr(mmap, "MAP_POPULATE", 0)
    try:
        m = (_Held if hold else mmap.mmap)(fd, size, flags=flags, prot=_PROT, **_NO_FD)
        if hold:        # the parent: a relay never reads the bytes, so nothing is populated
            m.fd, fd = fd, -1  # type: ignore[attr-defined]  # a _Held here
        elif _populate_read:
            try:
                m.madvise(_MADV_POPULATE_READ)
            except OSError as e:    # the pages fault in when read instead
                if e.errno == errno.EINVAL:     # a kernel before 5.14
                    _populate_read = False
        return pickle.PickleBuffer(m)
    finally:
        if fd >= 0:
            os.close(fd)


def let_go(buffers: Any) -> None:
    """Close the descriptors received ``buffers`` hold (see :class:`_Held`): they are
    about to be given to user code, which may write into them."""
    for pb in buffers:
        with memoryview(pb) as view:
            if type(view.obj) is _Held:
                view.obj.let_go()


def _held_fd(view: memoryview) -> int:
    """The descriptor of a held mapping ``view`` covers in full, else -1."""
    obj = view.obj
    return obj.fd if type(obj) is _Held and view.nbytes == len(obj) else -1


def encode(msg: Any, charge: Optional[Callable[[int], None]] = None,
           stash: Optional[Callable[[memoryview], int]] = None) -> tuple[list, list[int]]:
    """Frame ``msg``: (byte chunks to send, memfd descriptors to pass along). The caller closes
    the fds. ``charge(+n)`` is called before ``n`` bytes of memfd are written, ``charge(-n)`` after.
    ``stash(view) -> token``: a large buffer is kept by the caller, to be copied into the
    receiver's memory once it says where (:class:`Incoming`), instead of crossing as a memfd."""
    env = pack_lone(msg)
    if env is not None:     # a lone Run, Finished, Failed...: no pickle (protocol.pack_lone)
        return [_HEAD.pack(_HEAD.size + len(env), 0, len(env)) + env], []
    buffers: list[pickle.PickleBuffer] = []
    env = pickle.dumps(msg, protocol=5, buffer_callback=buffers.append)
    if not buffers:     # most messages
        return [_HEAD.pack(_HEAD.size + len(env), 0, len(env)) + env], []
    views = [pb.raw() for pb in buffers]
    # How each buffer crosses, decided first: the header lists the buffers in the pickle's
    # order, and the receiver hands them to pickle.loads in that order, whatever their ways.
    ways: list[int] = []            # per buffer: _STASHED, _INLINE, _MEMFD, or a held fd passed on as it is
    n_fds = to_write = 0
    for v in views:
        large = v.nbytes >= MEMFD_THRESHOLD
        fd = _held_fd(v) if large else -1
        if large and stash is not None and fd < 0:      # not a relay of a held memfd: copied in later
            ways.append(_STASHED)
        elif HAVE_MEMFD and large and n_fds < _MAX_FDS:
            n_fds += 1
            ways.append(_MEMFD if fd < 0 else fd)
            to_write += v.nbytes if fd < 0 else 0
        else:
            ways.append(_INLINE)
    if charge is not None and to_write:
        charge(to_write)
    sizes, inline, fds = [], [], []
    try:
        for view, way in zip(views, ways):
            if way == _INLINE:
                inline.append(view)
                sizes.append(view.nbytes | (_RO_FLAG if view.readonly else 0))
            elif way != _STASHED:
                fds.append(_to_memfd(view) if way == _MEMFD else os.dup(way))
                sizes.append(view.nbytes | _FD_FLAG)
            else:
                sizes.append(None)          # its token is taken once nothing else can fail
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    finally:
        if charge is not None and to_write:
            charge(-to_write)
    for i, way in enumerate(ways):
        if way == _STASHED:
            sizes[i] = (views[i].nbytes | _IN_FLAG, stash(views[i]))  # type: ignore[call-overload, misc]
    size_bytes = b"".join(_SIZE.pack(s) if type(s) is int else _SIZE.pack(s[0]) + _SIZE.pack(s[1]) for s in sizes)
    total = _HEAD.size + len(size_bytes) + len(env) + sum(v.nbytes for v in inline)
    head = _HEAD.pack(total, len(views), len(env)) + size_bytes
    if not inline:
        return [head + env], fds
    return [head, env, *inline], fds


class Incoming(NamedTuple):
    """A message whose large buffers the sender copies in itself (vmcopy.py): not to be
    used until it has, once told where each of ``landing``'s fresh buffers is (token, buffer)."""
    msg: Any
    landing: tuple


class _Reader:
    """Accumulates bytes and passed descriptors; yields whole decoded messages."""

    def __init__(self, hold: bool = False, fresh: Callable[[int], Any] = vmcopy.fresh) -> None:
        self.hold = hold            # keep received memfds' descriptors (_Held)
        self.fresh = fresh          # memory for a buffer the sender copies in (recycle.py's take)
        self.buf = bytearray()
        self.pos = 0
        self.fds: deque[int] = deque()
        # Reads land here, reused: recvmsg would allocate a fresh 256 KiB bytes per read,
        # which glibc serves with an mmap and page faults, on every message.
        # An anonymous map: only the pages reads have reached count in the RSS.
        self.scratch = memoryview(mmap.mmap(-1, _RECV))

    def feed(self, data: bytes, ancdata: list) -> None:
        for level, kind, cdata in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(cdata[: len(cdata) - len(cdata) % fds.itemsize])
                self.fds.extend(fds)
        if self.pos and self.pos == len(self.buf):
            self.buf.clear()
            self.pos = 0
        self.buf += data

    def needed(self) -> int:
        """Bytes still missing for the frame at the head (0 if it is whole or unknown)."""
        avail = len(self.buf) - self.pos
        if avail < 8:
            return 0
        (total,) = _SIZE.unpack_from(self.buf, self.pos)
        return max(0, total - avail)

    def messages(self) -> Iterator[Any]:
        buf = self.buf
        while True:
            avail = len(buf) - self.pos
            if avail < _HEAD.size:
                break
            total, nbuf, env_len = _HEAD.unpack_from(buf, self.pos)
            if avail < total:
                break
            p = self.pos + _HEAD.size
            sizes = []
            for _ in range(nbuf):
                (s,) = _SIZE.unpack_from(buf, p)
                p += 8
                if s & _IN_FLAG:            # its token follows
                    s = (s, _SIZE.unpack_from(buf, p)[0])
                    p += 8
                sizes.append(s)
            env = bytes(buf[p:p + env_len])
            p += env_len
            bufs = []
            incoming = []                   # (token, the fresh buffer the sender is to fill)
            for s in sizes:
                if type(s) is tuple:
                    dest = self.fresh(s[0] & _SIZE_MASK)
                    incoming.append((s[1], dest))
                    bufs.append(pickle.PickleBuffer(dest))
                elif s & _FD_FLAG:
                    bufs.append(_from_memfd(self.fds.popleft(), s & _SIZE_MASK, self.hold))
                else:
                    readonly, s = s & _RO_FLAG, s & _SIZE_MASK
                    with memoryview(buf) as view:     # one copy, out of the frame, then released
                        bufs.append(pickle.PickleBuffer((bytes if readonly else bytearray)(view[p:p + s])))
                    p += s
            self.pos += total
            msg = _decode(env, bufs)
            yield Incoming(msg, tuple(incoming)) if incoming else msg
        if self.pos > (1 << 20) and self.pos * 2 > len(buf):
            del buf[:self.pos]
            self.pos = 0

    def close(self) -> None:
        while self.fds:
            os.close(self.fds.popleft())


def _decode(env: bytes, buffers: Any = ()) -> Any:
    """A frame's envelope: a pickle (its buffers out of band), or a lone message's fixed layout."""
    return pickle.loads(env, buffers=buffers) if env[:1] == _PICKLE else unpack_lone(env)


def _recv_into(sock: socket.socket, reader: _Reader) -> Any:
    """One read into ``reader``. Returns the message when the read brought exactly one whole
    frame without buffers and nothing was buffered before it (a round trip's Run or
    Finished): decoded straight from the read, not copied into the reader's buffer and taken
    out through ``messages`` (Python's work for every message). Else None: ``reader.messages()``."""
    want = reader.needed()
    scratch = reader.scratch if want <= _RECV else memoryview(bytearray(min(want, _RECV_MAX)))
    # Received descriptors close on exec from the start: a task thread that starts a
    # program meanwhile must not inherit shared memory (SECURITY.md).
    n, anc, _flags, _addr = sock.recvmsg_into([scratch], socket.CMSG_SPACE(_MAX_FDS * 4), _CLOEXEC)
    if not n:
        for level, kind, cdata in anc:  # pragma: no cover - fds without data cannot happen
            reader.feed(b"", anc)
        raise EOFError("channel closed by peer")
    if not anc and n >= _HEAD.size and reader.pos == len(reader.buf):
        total, nbuf, env_len = _HEAD.unpack_from(scratch)
        if total == n and not nbuf:
            return _decode(bytes(scratch[_HEAD.size:n]))
    reader.feed(scratch[:n], anc)
    return None


def _send_chunks(sock: socket.socket, chunks: list, fds: list[int]) -> int:
    anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    return sock.sendmsg(chunks, anc)


def _skip(chunks: list, n: int) -> list:
    """``chunks`` without their first ``n`` bytes (those sent). What is left of a chunk is a
    view of it, never a copy: a large frame leaves a socket buffer's worth at a time, and
    copying the rest of a large chunk after each send would make sending it quadratic in its
    size, on the scheduler thread."""
    out = []
    for c in chunks:
        if n:
            c = memoryview(c).cast("B")
            if n >= len(c):
                n -= len(c)
                continue
            c, n = c[n:], 0
        out.append(c)
    return out


class BlockingChannel:
    """The worker's end: blocking reads, thread-safe whole-frame sends."""

    def __init__(self, sock: socket.socket, charge: Optional[Callable[[int], None]] = None,
                 fresh: Callable[[int], Any] = vmcopy.fresh, gone: Optional[Callable[[], None]] = None):
        self.sock = sock
        self.charge = charge        # passed to encode(): the memfd bytes it writes
        # called when a send finds the peer's end closed, on whatever thread sent: the worker
        # ends there, as it does on EOF. A thread that only raised would die alone, and the
        # rest of the worker could wait for it for ever.
        self.gone = gone
        self._reader = _Reader(fresh=fresh)
        self._pending: deque = deque()
        self._lock = threading.Lock()

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, msg: Any) -> None:
        self.send_frame(*encode(msg, self.charge))

    def send_frame(self, chunks: list, fds: list[int]) -> None:
        """Send a frame made by :func:`encode` (encode first to tell a message that cannot be
        pickled from a broken socket: nothing is written until the frame is whole)."""
        try:
            with self._lock:
                n = _send_chunks(self.sock, chunks, fds)
                total = sum(memoryview(c).nbytes for c in chunks)
                while n < total:
                    rest = _skip(chunks, n)
                    chunks, total, n = rest, total - n, self.sock.sendmsg(rest)
        except ConnectionError:
            if self.gone is not None:
                self.gone()
            raise
        finally:
            for fd in fds:
                os.close(fd)

    def has_pending(self) -> bool:
        """Whole messages read already and not taken (``recv_all`` returns them at once)."""
        return bool(self._pending)

    def recv_all(self) -> list:
        """Block until at least one whole message; return every whole message read so far."""
        while not self._pending:
            lone = _recv_into(self.sock, self._reader)
            if lone is not None:
                return [lone]
            self._pending.extend(self._reader.messages())
        out = list(self._pending)
        self._pending.clear()
        return out

    def close(self) -> None:
        self._reader.close()
        self.sock.close()


class Channel:
    """The parent's end: non-blocking; ``send`` queues what the socket cannot take now."""

    def __init__(self, sock: socket.socket):
        sock.setblocking(False)
        self.sock = sock
        self._reader = _Reader(hold=True)
        self._outbox: deque = deque()   # (chunks, fds) not yet (fully) sent
        self._lock = threading.Lock()
        self.closed = False
        self.peer: Optional[int] = None     #: the peer's pid, when large buffers are copied into it
        #: token -> a large buffer of a sent frame, kept until the peer says where it goes (any thread: dict ops)
        self._stashed: dict[int, memoryview] = {}
        self._tokens = itertools.count(1)

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, msg: Any) -> bool:
        """Send or queue ``msg``. False: something is queued; call :meth:`flush` when writable."""
        self.queue(msg)
        return self.flush()

    def copies_into(self, pid: int) -> None:
        """From now on large buffers are copied into process ``pid`` (the peer) once it says
        where, not passed as memfds: see :meth:`take`."""
        self.peer = pid

    def _stash(self, view: memoryview) -> int:
        token = next(self._tokens)
        self._stashed[token] = view
        return token

    def take(self, token: int) -> Optional[memoryview]:
        """The buffer stashed under ``token`` (once), for the caller to copy in; None if unknown."""
        return self._stashed.pop(token, None)

    def queue(self, msg: Any) -> bool:
        """Frame ``msg`` and put it at the end of the outbox, in order. True: it is first in
        line and nothing is being sent, so the caller sends it with :meth:`flush`, which it may
        do after letting go of its own locks (order is kept here). False: a backlog is ahead of
        it (sent when the socket is writable), or the channel is closed."""
        chunks, fds = encode(msg, None, self._stash if self.peer is not None else None)
        with self._lock:
            if self.closed:
                for fd in fds:
                    os.close(fd)
                return False
            self._outbox.append((chunks, fds))
            return len(self._outbox) == 1

    def flush(self) -> bool:
        with self._lock:
            return self._flush_locked()

    def _flush_locked(self) -> bool:
        while self._outbox:
            chunks, fds = self._outbox[0]
            try:
                n = _send_chunks(self.sock, chunks, fds)
            except (BlockingIOError, InterruptedError):
                return False
            except OSError:
                # The worker is gone; its sentinel will tell the scheduler. Drop the rest.
                self._drop_locked()
                return True
            for fd in fds:
                os.close(fd)
            rest = _skip(chunks, n)
            if rest:
                self._outbox[0] = (rest, [])
                return False
            self._outbox.popleft()
        return True

    def wants_write(self) -> bool:
        return bool(self._outbox)

    def receive(self) -> list:
        """Whatever whole messages one read brings (maybe none). Raises EOFError at the end."""
        try:
            lone = _recv_into(self.sock, self._reader)
        except (BlockingIOError, InterruptedError):
            return []
        except ConnectionResetError:
            raise EOFError("channel reset by peer") from None
        return [lone] if lone is not None else list(self._reader.messages())

    def drain(self) -> list:
        """After the peer died: every whole message still in the socket, however many
        reads that takes (one read may end inside a large frame)."""
        out: list = []
        while True:
            try:
                lone = _recv_into(self.sock, self._reader)
            except (BlockingIOError, InterruptedError, EOFError, ConnectionResetError):
                return out
            if lone is not None:
                out.append(lone)
            else:
                out.extend(self._reader.messages())

    def _drop_locked(self) -> None:
        for _chunks, fds in self._outbox:
            for fd in fds:
                os.close(fd)
        self._outbox.clear()
        self._stashed.clear()       # the peer is gone: nobody will say where these go

    def close(self) -> None:
        with self._lock:
            self.closed = True
            self._drop_locked()
        self._reader.close()
        self.sock.close()
