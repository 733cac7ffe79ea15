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
    assert vmcopy.available(p.pid)
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
