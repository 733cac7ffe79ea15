"""localcluster/wire/channel.py on its own: framing over a socket pair, partial sends and the
outbox, buffers passed as memfd descriptors (and none leaked), the per-frame descriptor
limit, and the end of a channel (clean, or in the middle of a frame)."""
from __future__ import annotations

import array
import os
import pickle
import random
import re
import select
import socket
import subprocess
import sys
import textwrap
import threading
from typing import Optional

import numpy as np
import pytest
from _util import shm_names as _shm

import localcluster
from localcluster.wire import channel, serialize
from localcluster.wire.channel import BlockingChannel, Channel
from localcluster.wire.protocol import MEMFD_THRESHOLD, OUT_OF_BAND

pytestmark = pytest.mark.timeout(30)

needs_memfd = pytest.mark.skipif(not channel.HAVE_MEMFD, reason="no os.memfd_create on this system")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(localcluster.__file__)))
INLINE = max(OUT_OF_BAND, MEMFD_THRESHOLD // 2)     # out of band, but below the memfd threshold
BIG = 2 * MEMFD_THRESHOLD + 123                     # crosses as a memfd


def _fds() -> set:
    """Open descriptors (without the one that listed them, closed by then)."""
    return {fd for fd in os.listdir("/proc/self/fd") if os.path.exists(f"/proc/self/fd/{fd}")}


def _memfds() -> list:
    """The channel's memfds open in this process."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:localcluster"):
                out.append(fd)
        except OSError:      # the descriptor that listed the directory
            pass
    return out


@pytest.fixture
def pair(socket_pair):
    return socket_pair


@pytest.fixture
def memfds(monkeypatch):
    """Counts the memfds the channel creates (the real function still does the work)."""
    made = []
    real = channel._to_memfd

    def spy(buf):
        fd = real(buf)
        made.append(buf.nbytes)
        return fd
    monkeypatch.setattr(channel, "_to_memfd", spy)
    return made


def pump(tx: Channel, rx: Channel, want: int) -> list:
    """Single-threaded: flush ``tx`` when writable and read ``rx`` when readable until
    ``want`` messages arrived (select waits on the sockets, never a sleep)."""
    got: list = []
    while len(got) < want:
        writers = [tx.sock] if tx.wants_write() else []
        readable, writable, _ = select.select([rx.sock], writers, [], 10)
        assert readable or writable, f"no progress: {len(got)} of {want} messages after 10 s"
        if writable:
            tx.flush()
        if readable:
            got.extend(rx.receive())
    return got


def frame_bytes(msg) -> tuple[bytes, list]:
    chunks, fds = channel.encode(msg)
    return b"".join(bytes(memoryview(c).cast("B")) for c in chunks), fds


def data_of(i: int, n: int) -> bytes:
    return random.Random(i).randbytes(n)


# --- framing ---------------------------------------------------------------------------------

def test_round_trip_both_ends(pair):
    a, b = pair
    parent, worker = Channel(a), BlockingChannel(b)
    msg = {"key": "x-1", "values": [1, 2.5, None, "é"], "nested": (b"abc", bytearray(b"def"))}
    assert parent.send(msg) is True                       # small: went out at once
    assert not parent.wants_write()
    assert worker.recv_all() == [msg]
    worker.send(("reply", 7))
    readable, _, _ = select.select([a], [], [], 10)
    assert readable
    assert parent.receive() == [("reply", 7)]
    assert parent.receive() == []                          # nothing more: no message, no error


def test_a_frame_arriving_one_byte_at_a_time(pair):
    a, b = pair
    rx = Channel(b)
    msg = ("hello", list(range(50)), b"\x00\xff" * 20)
    data, fds = frame_bytes(msg)
    assert fds == []
    for i in range(len(data) - 1):
        a.sendall(data[i:i + 1])
        assert rx.receive() == [], f"a message came out after {i + 1} of {len(data)} bytes"
    a.sendall(data[-1:])
    assert rx.receive() == [msg]


def test_several_frames_in_one_read_come_out_in_order(pair):
    a, b = pair
    rx = BlockingChannel(b)
    msgs = [("m", i, "x" * i) for i in range(40)]
    frames = [frame_bytes(m) for m in msgs]
    assert all(fds == [] for _, fds in frames)
    joined = b"".join(data for data, _ in frames)
    cut = len(joined) // 2 + 3                            # the second write starts mid-frame
    a.sendall(joined[:cut])
    first = rx.recv_all()
    a.sendall(joined[cut:])
    rest = []
    while len(first) + len(rest) < len(msgs):
        rest.extend(rx.recv_all())
    assert 0 < len(first) < len(msgs)
    assert first + rest == msgs


def _small_buffers(a: socket.socket, b: socket.socket) -> None:
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)


def test_a_frame_larger_than_the_socket_buffer_is_queued_then_flushed(pair):
    a, b = pair
    _small_buffers(a, b)
    tx, rx = Channel(a), Channel(b)
    big = serialize.dumps(data_of(1, INLINE))             # one out-of-band buffer, sent inline
    assert len(big.buffers) == 1 and big.buffers[0].raw().nbytes < MEMFD_THRESHOLD
    assert tx.send(("big", big)) is False                 # part of the frame is pending
    assert tx.wants_write()
    assert tx.send(("small", 1)) is False                 # queued behind it, not interleaved
    assert tx.send(("small", 2)) is False
    got = pump(tx, rx, 3)
    assert [m[0] for m in got] == ["big", "small", "small"]
    assert serialize.loads(got[0][1]) == data_of(1, INLINE)
    assert [got[1][1], got[2][1]] == [1, 2]
    assert not tx.wants_write() and tx.flush() is True


def test_what_a_partial_send_leaves_is_a_view_of_the_frame_never_a_copy():
    """A large frame leaves a socket buffer's worth at a time: copying the rest of a chunk
    after each send made sending one quadratic in its size (issue 53)."""
    head, body = b"h" * 16, data_of(4, 1 << 20)
    (rest,) = channel._skip([head, body], len(head) + 1000)
    assert rest.obj is body and bytes(rest) == body[1000:]
    (rest,) = channel._skip([rest], 5000)                    # a view of a view: still the frame's bytes
    assert rest.obj is body and bytes(rest) == body[6000:]
    first, second = channel._skip([head, body], 3)
    assert first.obj is head and bytes(first) == head[3:] and second is body
    assert channel._skip([head, body], 0) == [head, body]


@needs_memfd
def test_a_partial_send_passes_its_descriptors_once(pair, memfds):
    """A frame with a memfd buffer and an inline one, cut by a small socket buffer: the
    descriptor rides with the first piece, the rest follows without it, nothing leaks."""
    a, b = pair
    _small_buffers(a, b)
    before = _fds()
    tx, rx = Channel(a), Channel(b)
    big, inline = data_of(2, BIG), np.frombuffer(data_of(3, INLINE), dtype=np.uint8)
    assert tx.send({"big": serialize.dumps(big), "inline": inline}) is False
    assert memfds == [BIG]
    (got,) = pump(tx, rx, 1)
    assert serialize.loads(got["big"]) == big
    assert np.array_equal(got["inline"], inline)
    del got                                               # (a live mapping holds a descriptor)
    assert _fds() == before                               # the memfd was closed on both ends


# --- buffers as descriptors -----------------------------------------------------------------

@needs_memfd
def test_large_buffers_travel_as_memfds_and_no_descriptor_leaks(pair, memfds):
    a, b = pair
    before, shm_before = _fds(), _shm()
    tx, rx = Channel(a), BlockingChannel(b)
    raw = data_of(4, BIG)
    arr = np.arange(300_000, dtype=np.float64).reshape(-1, 3)[:, ::2].copy()     # 1.6 MB
    msg = ("data", serialize.dumps(raw), serialize.dumps(arr))
    chunks, fds = channel.encode(msg)
    try:
        on_socket = sum(memoryview(c).nbytes for c in chunks)
        assert len(fds) == 2 and on_socket < OUT_OF_BAND  # the bytes do not cross the socket
    finally:
        for fd in fds:
            os.close(fd)
    memfds.clear()
    assert tx.send(msg) is True
    assert sorted(memfds) == sorted([len(raw), arr.nbytes])
    (got,) = rx.recv_all()
    assert got[0] == "data"
    assert all(type(pb) is pickle.PickleBuffer for pb in got[1].buffers)
    assert serialize.loads(got[1]) == raw
    back = serialize.loads(got[2])
    assert back.dtype == arr.dtype and np.array_equal(back, arr)
    assert back.flags.writeable                           # a private mapping: the receiver may write
    back[0, 0] = -1.0
    assert _shm() == shm_before                           # nothing named in /dev/shm
    del got, back
    assert _fds() == before and _memfds() == []           # every descriptor closed on both ends


@needs_memfd
@pytest.mark.xfail(sys.version_info < (3, 13), strict=True, raises=AssertionError,
                   reason="before 3.13 mmap.mmap keeps a duplicate of the memfd (no trackfd=False): each live "
                          "received buffer holds a descriptor, so a worker holding more large received buffers "
                          "than RLIMIT_NOFILE fails with EMFILE")
def test_received_buffers_hold_no_descriptor_while_alive(pair):
    a, b = pair
    tx, rx = Channel(a), BlockingChannel(b)
    arrays = [np.full(MEMFD_THRESHOLD, i, dtype=np.uint8) for i in range(8)]
    assert tx.send(arrays) is True
    (got,) = rx.recv_all()
    assert all(np.array_equal(x, y) for x, y in zip(got, arrays))
    held = len(_memfds())
    del got                                               # (released before asserting: no leak either way)
    assert _memfds() == []
    assert held == 0, f"{held} descriptors held by {len(arrays)} received buffers"


@pytest.mark.parametrize("nbytes", [
    OUT_OF_BAND // 2,                                     # in the pickle stream
    pytest.param(INLINE),                                   # inline in the frame, flagged writable
    pytest.param(BIG, marks=needs_memfd),                 # a memfd, mapped privately
])
def test_a_received_array_is_as_writable_as_the_one_sent(pair, nbytes):
    a, b = pair
    tx, rx = Channel(a), Channel(b)
    arr = np.arange(nbytes // 8, dtype=np.float64)
    assert arr.flags.writeable
    tx.send(serialize.dumps(arr))
    (payload,) = pump(tx, rx, 1)
    back = serialize.loads(payload)
    assert np.array_equal(back, arr)
    writable = back.flags.writeable
    del payload, back
    assert writable


def _mapping(address: int) -> dict:
    """The /proc/self/smaps fields (kB) of the mapping that holds ``address``."""
    header = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) ")
    fields: Optional[dict] = None
    with open("/proc/self/smaps") as f:
        for line in f:
            h = header.match(line)
            if h:
                if fields is not None:
                    break
                if int(h[1], 16) <= address < int(h[2], 16):
                    fields = {}
            elif fields is not None and line.rstrip().endswith(" kB"):
                name, _, rest = line.partition(":")
                fields[name] = int(rest.split()[0])
    assert fields is not None, f"no mapping holds {address:#x}"
    return fields


@needs_memfd
def test_a_received_memfd_is_mapped_not_copied_until_written(pair):
    """Receiving 8 MB maps the sender's pages (in the RSS at once, for memory supervision)
    and copies none of them; writing one byte copies one page."""
    a, b = pair
    tx, rx = Channel(a), BlockingChannel(b)
    arr = np.arange(MEMFD_THRESHOLD, dtype=np.float64)      # 8 MB
    tx.send(serialize.dumps(arr))
    (payload,) = rx.recv_all()
    back = serialize.loads(payload)
    assert np.array_equal(back, arr)
    m = _mapping(back.__array_interface__["data"][0])
    assert m["Rss"] * 1024 >= arr.nbytes, m                  # populated when it arrived
    assert m["Anonymous"] == 0, m                             # no copy was made
    back[12345] = -1.0
    m = _mapping(back.__array_interface__["data"][0])
    assert m["Anonymous"] == 4, m                             # one page, copied on write
    assert arr[12345] == 12345.0
    del payload, back


@needs_memfd
def test_a_received_payload_can_be_sent_on_as_it_is(memfds):
    """What arrives (PickleBuffers over mappings) relays through a second channel unchanged."""
    a1, b1 = socket.socketpair()
    a2, b2 = socket.socketpair()
    src, mid_in, mid_out, dst = Channel(a1), BlockingChannel(b1), Channel(a2), BlockingChannel(b2)
    try:
        raw = data_of(5, BIG)
        assert src.send(("put", serialize.dumps(raw))) is True
        (msg,) = mid_in.recv_all()
        assert mid_out.send(msg) is True
        assert len(memfds) == 2                           # the relay passed a memfd too
        (relayed,) = dst.recv_all()
        assert relayed[0] == "put" and serialize.loads(relayed[1]) == raw
        del msg, relayed
    finally:
        for c in (src, mid_in, mid_out, dst):
            c.close()


def _relay(memfds: list, change, changed_after_sealing: bool = False) -> tuple:
    """worker -> parent -> worker: what the last worker got, and how many memfds were written."""
    a1, b1 = socket.socketpair()
    a2, b2 = socket.socketpair()
    src, mid_in, mid_out, dst = BlockingChannel(a1), Channel(b1), Channel(a2), BlockingChannel(b2)
    try:
        arr = np.arange(BIG // 8, dtype=np.float64)
        src.send(("put", serialize.dumps(arr)))
        (msg,) = pump(mid_out, mid_in, 1)
        change(msg[1])
        assert mid_out.send(msg) is True
        (relayed,) = dst.recv_all()
        del msg
        payload = relayed[1]
        if changed_after_sealing:       # the seal sees it; here the bytes themselves are the point
            with pytest.raises(localcluster.TransferError):
                serialize.loads(payload)
            return arr, pickle.loads(payload.meta, buffers=payload.buffers), len(memfds)
        return arr, serialize.loads(payload), len(memfds)
    finally:
        for c in (src, mid_in, mid_out, dst):
            c.close()


@needs_memfd
def test_the_parent_relays_a_memfd_without_copying_it(memfds):
    """A value on its way from one worker to another: the parent passes on the memfd the
    holder wrote (one memfd in all) and the bytes arrive intact."""
    sent, got, written = _relay(memfds, lambda payload: None)
    assert np.array_equal(got, sent)
    assert written == 1


@needs_memfd
def test_data_let_go_to_user_code_is_copied_when_sent_again(memfds):
    """Once the parent gives a received value to user code (let_go), its descriptor is
    closed: what user code wrote into it is what a later send carries, in a new memfd."""
    def user_writes(payload):
        channel.let_go(payload.buffers)
        value = serialize.loads(payload)
        value[7] = -7.0
    sent, got, written = _relay(memfds, user_writes, changed_after_sealing=True)
    assert got[7] == -7.0 and np.array_equal(got[8:], sent[8:])
    assert written == 2


@needs_memfd
@pytest.mark.slow
def test_descriptor_limit_per_frame(pair, memfds):
    """At most ``_MAX_FDS`` (SCM_MAX_FD) memfds per frame: the buffers past the limit go
    inline. Two frames at the limit sent back to back lose no descriptor on the way."""
    a, b = pair
    limit = channel._MAX_FDS
    before = _fds()
    tx, rx = Channel(a), Channel(b)
    arrays = [np.full(MEMFD_THRESHOLD, i % 256, dtype=np.uint8) for i in range(limit + 2)]
    tx.send(("over", arrays))
    assert len(memfds) == limit                           # the last two went inline
    tx.send(("at", arrays[:limit]))
    assert len(memfds) == 2 * limit
    got = pump(tx, rx, 2)
    assert [g[0] for g in got] == ["over", "at"]
    for (_, received), n in zip(got, (limit + 2, limit)):
        assert len(received) == n
        for i, arr in enumerate(received):                # each buffer in its own place
            assert arr.shape == (MEMFD_THRESHOLD,) and arr[0] == i % 256 and arr[-1] == i % 256
            assert np.array_equal(arr, arrays[i])
    del got, received, arr
    assert _fds() == before


def test_stream_of_mixed_sizes_from_a_thread(pair):
    """A worker thread sending blocking, the parent reading non-blocking: order and bytes kept."""
    a, b = pair
    tx, rx = BlockingChannel(a), Channel(b)
    rng = random.Random(11)
    sizes = [rng.choice([0, 10, 1000, OUT_OF_BAND - 1, OUT_OF_BAND, INLINE, MEMFD_THRESHOLD, BIG])
             for _ in range(40)]
    errors: list = []

    def send_all():
        try:
            for i, n in enumerate(sizes):
                tx.send((i, serialize.dumps(data_of(i, n))))
        except BaseException as e:   # noqa: BLE001 - reported by the test
            errors.append(e)
    t = threading.Thread(target=send_all)
    t.start()
    got: list = []
    try:
        while len(got) < len(sizes) and not errors:
            readable, _, _ = select.select([b], [], [], 10)
            assert readable, f"stalled after {len(got)} messages"
            got.extend(rx.receive())
    finally:
        t.join(20)
    assert not t.is_alive() and not errors
    assert [i for i, _ in got] == list(range(len(sizes)))
    for i, payload in got:
        assert serialize.loads(payload) == data_of(i, sizes[i])


def test_concurrent_blocking_sends_keep_frames_whole(pair):
    a, b = pair
    b.settimeout(20)                                      # a hang becomes an error, not a stuck test
    tx, rx = BlockingChannel(a), BlockingChannel(b)
    nthreads, per_thread = 3, 15
    errors: list = []

    def send(t: int):
        try:
            for i in range(per_thread):
                tx.send((t, i, data_of(t * 1000 + i, INLINE // 2 + i)))
        except BaseException as e:   # noqa: BLE001
            errors.append(e)
    threads = [threading.Thread(target=send, args=(t,)) for t in range(nthreads)]
    for t in threads:
        t.start()
    got: list = []
    try:
        while len(got) < nthreads * per_thread and not errors:
            got.extend(rx.recv_all())
    finally:
        for t in threads:
            t.join(20)
    assert not errors and not any(t.is_alive() for t in threads)
    for t in range(nthreads):
        mine = [(i, data) for (tt, i, data) in got if tt == t]
        assert [i for i, _ in mine] == list(range(per_thread))        # each sender's order kept
        assert all(data == data_of(t * 1000 + i, INLINE // 2 + i) for i, data in mine)


@needs_memfd
def test_descriptors_cross_a_process_boundary(tmp_path):
    """A real second process (no fork): it echoes what it receives; memfds go both ways."""
    parent_sock, child_sock = socket.socketpair()
    script = tmp_path / "echo.py"
    script.write_text(textwrap.dedent("""
        import socket, sys
        from localcluster.wire.channel import BlockingChannel
        chan = BlockingChannel(socket.socket(fileno=int(sys.argv[1])))
        try:
            while True:
                for msg in chan.recv_all():
                    chan.send(("echo", msg))
        except EOFError:
            pass
        chan.close()
    """))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
    proc = subprocess.Popen([sys.executable, str(script), str(child_sock.fileno())],
                            pass_fds=(child_sock.fileno(),), env=env, stderr=subprocess.PIPE)
    child_sock.close()
    chan = Channel(parent_sock)
    try:
        raw = data_of(6, BIG)
        chan.send(serialize.dumps(raw))
        chan.send("small")
        got: list = []
        while len(got) < 2:
            readable, _, _ = select.select([parent_sock], [], [], 20)
            assert readable, "the echo process did not answer"
            got.extend(chan.receive())
        assert got[0][0] == "echo" and serialize.loads(got[0][1]) == raw
        assert got[1] == ("echo", "small")
        del got
    finally:
        chan.close()                                       # EOF: the child leaves its loop
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err.decode()


# --- what cannot be sent ----------------------------------------------------------------------

@pytest.mark.parametrize("end", [Channel, BlockingChannel])
def test_an_unpicklable_message_raises_and_writes_nothing(pair, end):
    a, b = pair
    before = _fds()
    tx, rx = end(a), Channel(b)
    big = serialize.dumps(data_of(7, BIG))
    with pytest.raises(TypeError):
        tx.send((big, threading.Lock()))                  # fails after a memfd-sized buffer
    assert _fds() == before
    tx.send("after")
    readable, _, _ = select.select([b], [], [], 10)
    assert readable and rx.receive() == ["after"]        # no half frame went before it


@needs_memfd
@pytest.mark.parametrize("closed", ["the peer", "the channel itself"])
def test_a_send_that_cannot_go_is_dropped_and_closes_its_descriptors(pair, closed):
    a, b = pair
    tx = Channel(a)
    (b if closed == "the peer" else tx).close()
    before = _fds()
    assert tx.send(("x", serialize.dumps(data_of(8, BIG)))) is True   # dropped, quietly
    assert not tx.wants_write()
    assert _fds() == before                               # its memfd closed all the same


@needs_memfd
@pytest.mark.parametrize("size", ["small", "memfd"])
def test_a_blocking_send_to_a_closed_peer_calls_gone_then_raises(pair, size):
    """The worker's end: a send that finds the parent's end closed calls ``gone`` on the
    sending thread (the worker ends there, as on EOF), and closes its descriptors."""
    a, b = pair
    told: list = []
    tx = BlockingChannel(a, gone=lambda: told.append(threading.current_thread().name))
    b.close()
    before = _fds()
    payload = serialize.dumps(data_of(8, BIG)) if size == "memfd" else "x"
    with pytest.raises(ConnectionError):
        tx.send(("reply", payload))
    assert told == [threading.current_thread().name]
    assert _fds() == before


# --- the end ----------------------------------------------------------------------------------

def _blocking(sock):
    sock.settimeout(10)                                   # a hang would be a TimeoutError, not EOFError
    return BlockingChannel(sock)


def _read_until_eof(rx, got: list) -> None:
    """Read into ``got`` until the receiver raises EOFError (at most 100 reads)."""
    for _ in range(100):
        if isinstance(rx, Channel):
            select.select([rx.sock], [], [], 10)
            got.extend(rx.receive())
        else:
            got.extend(rx.recv_all())
    raise AssertionError(f"no EOFError after 100 reads; got {got!r}")


def _messages_before_eof(rx) -> list:
    """Every message the receiver yields before it reports the end (which it must)."""
    got: list = []
    with pytest.raises(EOFError):
        _read_until_eof(rx, got)
    return got


@pytest.mark.parametrize("end", [Channel, _blocking])
def test_clean_eof_after_whole_messages(pair, end):
    a, b = pair
    tx, rx = BlockingChannel(a), end(b)
    msgs = [("m", i) for i in range(3)]
    for m in msgs:
        tx.send(m)
    tx.close()
    assert _messages_before_eof(rx) == msgs              # everything sent before the end arrives
    with pytest.raises(EOFError):                         # and the end stays the end
        rx.receive() if isinstance(rx, Channel) else rx.recv_all()


@pytest.mark.parametrize("cut", ["in the header", "in the sizes", "in an inline buffer"])
@pytest.mark.parametrize("end", [Channel, _blocking])
def test_eof_in_the_middle_of_a_frame(pair, end, cut):
    a, b = pair
    before = _fds()
    rx = end(b)
    msg = ("half", serialize.dumps(data_of(10, OUT_OF_BAND)), serialize.dumps(data_of(11, OUT_OF_BAND)))
    data, fds = frame_bytes(msg)
    assert fds == [] and len(data) < 4 * OUT_OF_BAND     # half of it fits in the socket buffer
    n = {"in the header": 5, "in the sizes": channel._HEAD.size + 4, "in an inline buffer": len(data) // 2}[cut]
    a.sendall(data[:n])
    a.close()
    assert _messages_before_eof(rx) == []                # no message made of half a frame
    rx.close()
    assert not (_fds() - before)


@needs_memfd
@pytest.mark.parametrize("end", [Channel, _blocking])
def test_eof_after_half_a_frame_that_passed_a_descriptor(pair, end):
    """The memfd of the cut frame arrived; closing the receiver closes it."""
    a, b = pair
    rx = end(b)
    before = _fds()
    data, fds = frame_bytes(("half", serialize.dumps(data_of(12, BIG)), serialize.dumps(data_of(13, OUT_OF_BAND))))
    try:
        assert len(fds) == 1
        half = len(data) // 2
        assert a.sendmsg([data[:half]], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]) == half
    finally:
        for fd in fds:
            os.close(fd)
    a.close()
    assert _messages_before_eof(rx) == []
    assert len(_memfds()) == 1                            # the receiver holds the cut frame's memfd...
    rx.close()
    assert _memfds() == []                                # ...until it is closed
    assert not (_fds() - before)


def test_drain_after_the_peer_died_returns_a_frame_larger_than_one_read(pair):
    """A dying worker's last large frame is all in the socket: drain() keeps reading past
    a read that ends inside it (a single receive() would return nothing and stop)."""
    a, b = pair
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
    b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    big = [bytearray(data_of(i, 700_000)) for i in range(3)]    # inline buffers: a 2.1 MB frame
    tx, rx = BlockingChannel(a), Channel(b)
    tx.send(("last words", big))
    tx.close()
    (msg,) = rx.drain()
    assert msg[0] == "last words" and [bytes(x) for x in msg[1]] == [bytes(x) for x in big]
    assert rx.drain() == []
    rx.close()


def test_lone_messages_in_the_fixed_layout_interleave_with_pickled_frames(pair):
    """Frames of both kinds, in one stream, split at every byte: each comes out as it went in."""
    from localcluster.wire import protocol as P
    args = serialize.dumps(((1, "a"), {}))
    msgs = [P.Run(1, "k-1", 3, b"fn", args, ()), P.Steal((7,)), P.Finished(1, 5, "int", args, 0.5, 1.5, 1),
            P.Batch((P.Run(2, "k-2", 3, None, args, ()),)), P.Run(3, "k-3", 3, None, args, ("k-1",)),
            P.Finished(4, 99, "str", None, 0.25, 2.5, 2), P.Free(("k-0", "k-1")), P.Failed(5, b"error", 1.0, 2.0, 1),
            P.Cancel((6,)), P.Skipped(6)]
    frames = [channel.encode(m) for m in msgs]
    assert [c[0][channel._HEAD.size:][:1] == b"\x80" for c, _ in frames] == [False, True, False, True, True, False,
                                                                             False, False, False, False]
    stream = b"".join(c for chunks, _ in frames for c in chunks)
    reader = channel._Reader()
    got = []
    for i in range(len(stream)):
        reader.feed(stream[i:i + 1], [])
        got.extend(reader.messages())
    assert got == msgs


def test_a_read_of_one_whole_frame_is_decoded_straight_and_a_split_one_keeps_its_order():
    """A read that brings exactly one whole frame, nothing buffered before it, is decoded
    from the read itself; a read that ends inside a frame, or holds two, goes through the
    reader's buffer; either way every message comes out once, in order."""
    from localcluster.wire import protocol as P
    a, b = socket.socketpair()
    parent, worker = Channel(a), BlockingChannel(b)
    try:
        def frame(seq):
            chunks, fds = channel.encode(P.Skipped(seq))
            assert not fds
            return b"".join(bytes(c) for c in chunks)

        b.sendall(frame(1))
        assert [m.seq for m in _receive_all(parent)] == [1]
        two, three = frame(2), frame(3)
        b.sendall(two + three[:5])                  # one whole frame and a part of the next
        assert [m.seq for m in _receive_all(parent)] == [2]
        b.sendall(three[5:])
        assert [m.seq for m in _receive_all(parent)] == [3]
        b.sendall(frame(4))                         # whole again, nothing buffered: straight
        assert [m.seq for m in _receive_all(parent)] == [4]
        a.sendall(frame(5) + frame(6))              # the worker's end: two in one read
        assert [m.seq for m in worker.recv_all()] == [5, 6]
        a.sendall(frame(7))
        assert [m.seq for m in worker.recv_all()] == [7]
    finally:
        parent.sock.close()
        worker.close()


def _receive_all(chan: Channel) -> list:
    select.select([chan], [], [], 10)
    return chan.receive()


# --- every way a buffer crosses, mixed in one frame ----------------------------------------

# Sizes on both sides of each threshold: in the pickle stream, out of band and inline, memfd or
# copied in by the sender (vmcopy), and empty.
_EDGES = (0, 1, OUT_OF_BAND - 1, OUT_OF_BAND, MEMFD_THRESHOLD // 2, MEMFD_THRESHOLD - 1, MEMFD_THRESHOLD,
          MEMFD_THRESHOLD + 1, BIG, 3 * MEMFD_THRESHOLD + 4095)


def _land_here(msg):
    """What the parent does for a worker that said where its buffers go (dispatch.copy_in),
    with this process as both: copy each stashed buffer into the fresh memory named."""
    if type(msg) is not channel.Incoming:
        return msg, 0
    return msg.msg, msg.landing


@pytest.mark.parametrize("copied_in", [False, True], ids=["memfd", "copied-in"])
def test_a_frame_of_buffers_of_mixed_sizes_and_ways_arrives_in_its_order(pair, copied_in, seed):
    """Random frames of byte strings whose sizes straddle every threshold: each crosses its own
    way (in the stream, inline, memfd, stashed and copied in), and the receiver hands them back
    in the order sent. The header once listed copied-in buffers before the others, which
    swapped a small and a large value sent in one frame (issue 48)."""
    from localcluster.wire import vmcopy
    if copied_in and not vmcopy.available(os.getpid()):
        pytest.skip("this process may not copy into its own memory (process_vm_writev refused)")
    rng = random.Random(seed)
    a, b = pair
    tx, rx = Channel(a), BlockingChannel(b)
    if copied_in:
        tx.copies_into(os.getpid())
    try:
        for round_ in range(12):
            sent = [rng.randbytes(rng.choice(_EDGES)) for _ in range(rng.randint(1, 6))]
            got: list = []
            reader = threading.Thread(target=lambda: got.extend(rx.recv_all()))
            reader.start()
            tx.queue(("frame", round_, [serialize.dumps(bytearray(x)) for x in sent]))
            while not tx.flush():
                select.select([], [tx.sock], [], 10)
            reader.join(10)
            (msg,) = got
            inner, landing = _land_here(msg)
            for token, dest in landing or ():
                vmcopy.write_to(os.getpid(), tx.take(token), vmcopy.address(dest)[0])
            assert inner[:2] == ("frame", round_)
            back = [bytes(serialize.loads(p)) for p in inner[2]]
            assert [len(x) for x in back] == [len(x) for x in sent], f"seed {seed}"
            assert back == sent, f"seed {seed}: round {round_}"
    finally:
        tx.close()
        rx.close()
