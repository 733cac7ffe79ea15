"""Copies straight into and out of a child process (wire/vmcopy.py), through a real child:
it says where its buffers are, the parent writes and reads them, the child checks."""
from __future__ import annotations

import errno
import hashlib
import os
import subprocess
import sys

import pytest

from localcluster.wire import vmcopy

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process_vm_* is Linux's")]

CHILD = r"""
import ctypes, hashlib, mmap, sys
n = int(sys.argv[1])
inbox = mmap.mmap(-1, n)                           # the parent writes here
outbox = bytes(i * 7 % 251 for i in range(n))      # the parent reads this
def addr(b):
    return ctypes.cast(ctypes.c_char_p(b), ctypes.c_void_p).value if isinstance(b, bytes) else \
        ctypes.addressof(ctypes.c_char.from_buffer(b))
print(addr(inbox), addr(outbox), flush=True)
sys.stdin.readline()                               # written
print(hashlib.sha1(inbox).hexdigest(), flush=True)
sys.stdin.readline()                               # read: the parent is done with outbox
"""


@pytest.fixture
def child():
    procs = []

    def start(n):
        p = subprocess.Popen([sys.executable, "-c", CHILD, str(n)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
        procs.append(p)
        inbox, outbox = map(int, p.stdout.readline().split())
        if not vmcopy.available(p.pid):
            pytest.skip("this process may not read its children's memory here (ptrace refused: Yama "
                        "ptrace_scope 2 or 3, or a seccomp filter); localcluster uses memfds then")
        return p, inbox, outbox
    yield start
    for p in procs:
        p.kill()
        p.wait()
        p.stdin.close()
        p.stdout.close()


@pytest.mark.parametrize("n", [1, 4096 * 3 + 5, 3 << 20])     # a byte, pages and a part, past HUGE
def test_bytes_go_into_a_child_and_come_out_of_it_exactly(child, n):
    p, inbox, outbox = child(n)
    data = bytes(range(256)) * (n // 256) + bytes(n % 256)       # read-only: bytes have an address too
    vmcopy.write_to(p.pid, data, inbox)
    p.stdin.write("written\n")
    p.stdin.flush()
    assert p.stdout.readline().strip() == hashlib.sha1(data).hexdigest()
    got = vmcopy.read_from(p.pid, outbox, n)
    assert bytes(got) == bytes(i * 7 % 251 for i in range(n))
    into = bytearray(n + 10)
    assert vmcopy.read_from(p.pid, outbox, n, into) is into and into[:n] == bytes(got)


def test_a_range_the_child_has_not_mapped_is_an_error_not_garbage(child):
    p, _, _ = child(4096)
    with pytest.raises(OSError) as info:
        vmcopy.read_from(p.pid, 8, 4096)                         # page zero: never mapped
    assert info.value.errno == errno.EFAULT and f"process {p.pid}" in str(info.value)
    with pytest.raises(OSError) as info:
        vmcopy.write_to(p.pid, b"x" * 8, 8)
    assert info.value.errno == errno.EFAULT


def test_a_gone_child_is_no_verdict_and_a_small_buffer_is_refused(child):
    p, _, outbox = child(100)
    with pytest.raises(ValueError, match="a buffer of 10 bytes cannot take 100"):
        vmcopy.read_from(p.pid, outbox, 100, bytearray(10))
    p.kill()
    p.wait()
    with pytest.raises(OSError) as info:
        vmcopy.read_from(p.pid, outbox, 100)
    assert info.value.errno == errno.ESRCH


def test_addresses_of_buffers_and_fresh_memory():
    b = bytearray(b"abc")
    import ctypes
    assert vmcopy.address(b) == (ctypes.addressof(ctypes.c_char.from_buffer(b)), 3)
    assert vmcopy.address(memoryview(b)[1:])[0] == vmcopy.address(b)[0] + 1
    with pytest.raises(BufferError):
        vmcopy.address(memoryview(b"abcdef")[::2])               # not contiguous
    big = vmcopy.fresh(vmcopy.HUGE)
    assert len(big) == vmcopy.HUGE and big[:1] == b"\0"
    big.close()
    assert isinstance(vmcopy.fresh(10), bytearray)


def test_the_probe_is_refused_for_a_process_that_is_not_ours_to_read(monkeypatch):
    """As under Yama's ptrace_scope 2: the probe's read fails with EPERM, and the verdict
    stays for the process (the callers keep their memfds)."""
    monkeypatch.setattr(vmcopy, "_verdict", None)

    def refused(*args, **kwargs):
        raise OSError(errno.EPERM, "reading from process 1: Operation not permitted")
    monkeypatch.setattr(vmcopy, "read_from", refused)
    assert not vmcopy.available(os.getpid())
    assert vmcopy._verdict is False


# --- a fetched value copied out of its worker (Export(locate=True) -> Located -> Unpin) -------

from localcluster import Client, LocalCluster  # noqa: E402
from localcluster.engine.dispatch import copy_located  # noqa: E402
from localcluster.wire import protocol as P  # noqa: E402
from localcluster.wire import serialize  # noqa: E402


def big(n):
    return bytes(range(256)) * (n // 256)


def pinned():
    from localcluster.worker.context import current
    return len(current()[0].transfers.pinned)


@pytest.fixture
def reads(monkeypatch):
    """The parent's copies out of a worker: (address, nbytes) of each."""
    seen = []
    real = vmcopy.read_from

    def counted(pid, remote, n, into=None):
        seen.append(n)
        return real(pid, remote, n, into)
    monkeypatch.setattr(vmcopy, "read_from", counted)
    return seen


def test_a_large_result_is_copied_out_of_its_worker_and_let_go_of_there(reads):
    n = 3 << 20
    with LocalCluster(n_workers=1, threads_per_worker=1, forward_logs=False) as cluster, Client(cluster) as client:
        if not vmcopy.available(next(iter(cluster.workers.values())).pid):
            pytest.skip("this process may not read its workers' memory (ptrace refused)")
        reads.clear()
        f = client.submit(big, n)
        assert f.result(30) == big(n)
        assert n in reads                                         # the bytes came by process_vm_readv
        assert client.run(pinned) == {"worker-0": 0}              # and the worker let go of them
        reads.clear()
        assert client.submit(big, 1024).result(30) == big(1024)  # small: with its Finished, as before
        assert reads == []


def test_a_large_value_is_relayed_by_two_copies_through_the_parent(reads):
    n = 3 << 20
    with LocalCluster(n_workers=2, threads_per_worker=1, forward_logs=False) as cluster, Client(cluster) as client:
        if not vmcopy.available(next(iter(cluster.workers.values())).pid):
            pytest.skip("this process may not read its workers' memory (ptrace refused)")
        a, b = cluster.workers
        made = client.submit(big, n, workers=[a])
        assert client.submit(len, made, workers=[b]).result(30) == n
        assert n in reads                                         # out of ``a`` by process_vm_readv
        assert client.run(pinned) == {a: 0, b: 0}
        assert client.submit(lambda x: x == big(n), made, workers=[b]).result(30)


def test_without_the_right_to_read_a_worker_a_large_result_comes_by_memfd(reads, monkeypatch):
    monkeypatch.setattr(vmcopy, "_verdict", False)                # as under ptrace_scope 2
    n = 3 << 20
    with LocalCluster(n_workers=2, threads_per_worker=1, forward_logs=False) as cluster, Client(cluster) as client:
        a, b = cluster.workers
        made = client.submit(big, n, workers=[a])
        assert made.result(30) == big(n)
        assert client.submit(len, made, workers=[b]).result(30) == n           # relayed, by memfd too
        assert reads == [] and client.run(pinned) == {a: 0, b: 0}


def test_a_value_whose_worker_is_gone_before_the_copy_is_left_to_its_death(child):
    """No error for the value's users: the death sends the request elsewhere, or makes the
    value again (test_soak.py: relays from a worker killed mid-copy)."""
    p, _, outbox = child(4096)
    p.kill()
    p.wait()
    assert copy_located(p.pid, "worker-3", P.Located(7, "k", b"meta", ((outbox, 4096),), 4096)) is None


def test_a_value_the_worker_does_not_have_where_it_said_is_an_error_naming_it(child):
    p, _, outbox = child(4096)
    data = copy_located(p.pid, "worker-3", P.Located(7, "k", b"meta", ((8, 4096),), 4096))    # unmapped
    assert data.request == 7 and data.key == "k" and data.data is None
    err = serialize.as_exception(data.error, "k")
    assert f"copying the data of 'k' out of worker 'worker-3' (pid {p.pid}) failed" in str(err)
    assert "Bad address" in str(err) and "report" in str(err)


def first_plus(a, i):
    return a[0] + i


def test_tasks_sent_with_the_landed_their_input_waits_for_run(reads):
    """A scattered value's Put waits in its worker for its bytes; the Runs that need it come
    right behind, and the parent's Landed came in the same frame as Runs (a Batch): handled
    behind the very Put that waited for it, it hung every task (a loaded run found it)."""
    np = pytest.importorskip("numpy")
    with LocalCluster(n_workers=2, threads_per_worker=1, forward_logs=False) as cluster, Client(cluster) as client:
        big = client.scatter(np.ones(2_000_000))
        fs = [client.submit(first_plus, big, i, pure=False) for i in range(40)]
        assert client.gather(fs, timeout=30) == [1.0 + i for i in range(40)]
        assert cluster.deaths == []


def norm(a):
    return float((a * a).sum())


@pytest.mark.slow
def test_a_map_of_large_arguments_twice_never_waits_for_a_landed_sent_with_the_next_run(reads):
    """Each Run carries a buffer the parent copies in. The parent once sent its Landed for one
    Run in the same frame as the next such Run: the worker held that whole frame, the Landed
    with it, behind the Run the Landed lets go, and the map hung (issue 53). A Landed goes in a
    frame of its own now."""
    np = pytest.importorskip("numpy")
    arrays = [np.full(300_000, float(i)) for i in range(20)]       # 2.4 MB each: copied in
    with LocalCluster(n_workers=2, threads_per_worker=1, forward_logs=False) as cluster, Client(cluster) as client:
        if not vmcopy.available(next(iter(cluster.workers.values())).pid):
            pytest.skip("this process may not copy into its workers (ptrace refused)")
        for _round in range(6):
            assert client.gather(client.map(norm, arrays), timeout=30) == [300_000.0 * i * i for i in range(20)]
        assert cluster.deaths == []


def where_and_sum(a, mark=b""):
    """Where ``a`` is, its sum, and the bytes just past its end in the memory it was copied into
    (a buffer is a whole number of 2 MiB pages): what the previous task wrote there, when the
    memory is the same, not fresh (the kernel may hand out the same address for a new map)."""
    import ctypes
    at, n = vmcopy.address(a)
    before = ctypes.string_at(at + n, 8)
    if mark:
        ctypes.memmove(at + n, mark, 8)
    return at, float(a.sum()), before


def noop():
    return None


def test_the_next_argument_lands_in_warm_memory_never_over_a_value_still_held():
    """recycle.py through a worker: the memory a large argument was copied into is used again
    for the next one once the task is over, but never while the store holds a value in it."""
    np = pytest.importorskip("numpy")
    n = 1_000_000                                                 # 8 MB, in a buffer of 8 MiB
    zero = bytes(8)
    with LocalCluster(n_workers=1, threads_per_worker=1, forward_logs=False) as cluster, Client(cluster) as client:
        if not vmcopy.available(next(iter(cluster.workers.values())).pid):
            pytest.skip("this process may not write into its workers' memory (ptrace refused)")
        first, total, seen = client.submit(where_and_sum, np.full(n, 1.0), b"marked-1", pure=False).result(30)
        assert (total, seen) == (n, zero)
        client.submit(noop, pure=False).result(30)                # the executor is past the first run
        at, total, seen = client.submit(where_and_sum, np.full(n, 2.0), pure=False).result(30)
        assert (at, total, seen) == (first, 2.0 * n, b"marked-1")   # the same memory, the new bytes
        client.submit(noop, pure=False).result(30)
        [held] = client.scatter([np.full(n, 3.0)])                # lands there, and the store keeps it
        at, total, seen = client.submit(where_and_sum, held, b"marked-3").result(30)
        assert (at, total, seen) == (first, 3.0 * n, b"marked-1")
        other, total, seen = client.submit(where_and_sum, np.full(n, 4.0), pure=False).result(30)
        assert other != first and (total, seen) == (4.0 * n, zero)     # fresh: the held value's is in use
        assert client.submit(where_and_sum, held).result(30) == (first, 3.0 * n, b"marked-3")   # untouched
        assert cluster.deaths == []


def full(n, x):
    import numpy as np
    return np.full(n, x)


def test_a_result_is_copied_out_into_warm_memory_once_the_last_one_there_is_dropped():
    """The parent's side of recycle.py: a result it no longer refers to leaves its memory for
    the next one; one still held is never written over."""
    import ctypes
    pytest.importorskip("numpy")
    n = 1_000_000
    with LocalCluster(n_workers=1, threads_per_worker=1, forward_logs=False) as cluster, Client(cluster) as client:
        if not vmcopy.available(next(iter(cluster.workers.values())).pid):
            pytest.skip("this process may not read its workers' memory (ptrace refused)")
        f = client.submit(full, n, 1.0, pure=False)
        r = f.result(30)
        first, size = vmcopy.address(r)
        ctypes.memmove(first + size, b"marked-1", 8)             # past its end, in the same 8 MiB
        del f, r
        g = client.submit(full, n, 2.0, pure=False)
        r = g.result(30)
        assert vmcopy.address(r)[0] == first and ctypes.string_at(first + size, 8) == b"marked-1"
        assert r.sum() == 2.0 * n
        h = client.submit(full, n, 3.0, pure=False)
        assert vmcopy.address(h.result(30))[0] != first           # ``r`` is still held
        assert r.sum() == 2.0 * n and h.result().sum() == 3.0 * n
