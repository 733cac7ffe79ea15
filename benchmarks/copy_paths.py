#!/usr/bin/env python
"""Ways to move 100 MB between two processes, side by side with the floor (one copy into
fresh memory), for the data path of issue 28 (bw_in_GBps, bw_roundtrip_GBps).

    python benchmarks/copy_paths.py [--mb 100] [--reps 8]

Each way ends with the bytes readable in the receiving process and one element per page
read there (as bench.py's ``touch`` task and its parent do). Linux only; numpy.

- floor: ``a.copy()`` in one process (fresh anonymous memory, one copy);
- memfd (what localcluster does today): the sender writes a new memfd, passes its descriptor,
  the receiver maps it privately and populates it for reading;
- warm memfd (a pool of pre-faulted segments): the same, into a memfd whose pages exist
  already (written once before the timed runs), so the kernel allocates nothing;
- vm_writev, vm_readv, warm: the same into memory written before (wire/recycle.py lends it);
- vm_writev, vm_readv: the parent copies straight between its memory and a worker's with
  ``process_vm_writev`` / ``process_vm_readv`` (one copy, into the receiver's fresh anonymous
  memory; the receiver says where its buffer is first). Allowed from a parent to its child
  under the default Yama ptrace policy; a worker may not do it to its parent. The receiver's
  buffer is numpy's (which asks for transparent huge pages above 4 MB, as the floor's copy
  does), and once an anonymous mapping of 4 KiB pages, to show what the page size costs.

Ratios are against the floor in the same run: > 0.8 is issue 28's target.
"""
from __future__ import annotations

import argparse
import array
import ctypes
import mmap
import os
import socket
import statistics
import sys
import time

import numpy as np

PAGE = mmap.PAGESIZE
_MADV_POPULATE_READ = 22


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _vm_call(name: str):
    libc = ctypes.CDLL(None, use_errno=True)
    fn = getattr(libc, name)
    fn.argtypes = [ctypes.c_int, ctypes.POINTER(_Iovec), ctypes.c_ulong, ctypes.POINTER(_Iovec), ctypes.c_ulong,
                   ctypes.c_ulong]
    fn.restype = ctypes.c_ssize_t

    def call(pid: int, local: int, remote: int, n: int) -> None:
        done = 0
        while done < n:       # one call moves at most what the kernel takes at once (MAX_RW_COUNT)
            lo, re_ = _Iovec(local + done, n - done), _Iovec(remote + done, n - done)
            got = fn(pid, ctypes.byref(lo), 1, ctypes.byref(re_), 1, 0)
            if got <= 0:
                raise OSError(ctypes.get_errno(), f"{name}: {os.strerror(ctypes.get_errno())}")
            done += got
    return call


def _touch(view: np.ndarray) -> float:
    return float(view[:: PAGE // view.itemsize].sum())


def _map(fd: int, n: int) -> tuple:
    m = mmap.mmap(fd, n, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    os.close(fd)
    m.madvise(_MADV_POPULATE_READ)
    return m, np.frombuffer(m, dtype=np.float64)


def _send_fd(sock: socket.socket, tag: bytes, fd: int) -> None:
    sock.sendmsg([tag], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])


def _recv(sock: socket.socket) -> tuple:
    msg, anc, _f, _a = sock.recvmsg(64, socket.CMSG_SPACE(4))
    fds = [array.array("i", data)[0] for _l, _k, data in anc]
    return msg, fds


def child(sock: socket.socket, n: int) -> None:
    out = np.ones(n // 8)               # what this "worker" sends back in the out-ways
    kept = np.zeros(n // 8)             # written once: the warm buffer of the "writev-warm" way
    warm = os.memfd_create("warm-out", os.MFD_CLOEXEC)
    os.write(warm, out.data.cast("B"))
    while True:
        msg, fds = _recv(sock)
        if not msg:
            os._exit(0)
        if msg == b"memfd":                         # in: map what came
            m, v = _map(fds[0], n)
            s = _touch(v)
            del v
            m.close()
            sock.send(b"%d" % s)
        elif msg in (b"writev", b"writev-4k", b"writev-warm"):     # in: a buffer; say where it is
            if msg == b"writev":        # numpy asks for huge pages (MADV_HUGEPAGE) above 4 MB
                dst = np.empty(n // 8)
            elif msg == b"writev-warm":     # pages written before: what wire/recycle.py lends
                dst = kept
            else:                       # an anonymous mapping of 4 KiB pages
                m = mmap.mmap(-1, n)
                dst = np.frombuffer(m, dtype=np.float64)
            sock.send(b"%d" % dst.ctypes.data)
            sock.recv(1)
            sock.send(b"%d" % _touch(dst))
            del dst
        elif msg == b"out-memfd":                   # out: a new memfd of the array
            fd = os.memfd_create("out", os.MFD_CLOEXEC)
            os.write(fd, out.data.cast("B"))
            _send_fd(sock, b"fd", fd)
            os.close(fd)
        elif msg == b"out-warm":                    # out: the warm memfd, rewritten in place
            os.pwrite(warm, out.data.cast("B"), 0)
            _send_fd(sock, b"fd", os.dup(warm))
        elif msg == b"out-readv":                   # out: where the array is
            sock.send(b"%d" % out.ctypes.data)
            sock.recv(1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=100)
    ap.add_argument("--reps", type=int, default=8)
    args = ap.parse_args(argv)
    if not sys.platform.startswith("linux"):
        print("copy_paths.py needs memfd and process_vm_*: Linux only", file=sys.stderr)
        return 1
    n = args.mb * 1_000_000 // 8 * 8
    src = np.ones(n // 8)
    here, there = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        here.close()
        child(there, n)
    there.close()
    writev, readv = _vm_call("process_vm_writev"), _vm_call("process_vm_readv")
    warm_in = os.memfd_create("warm-in", os.MFD_CLOEXEC)
    os.write(warm_in, src.data.cast("B"))

    def floor() -> None:
        c = src.copy()
        _touch(c)

    def memfd_in() -> None:
        fd = os.memfd_create("in", os.MFD_CLOEXEC)
        os.write(fd, src.data.cast("B"))
        _send_fd(here, b"memfd", fd)
        os.close(fd)
        here.recv(64)

    def warm_memfd_in() -> None:
        os.pwrite(warm_in, src.data.cast("B"), 0)
        _send_fd(here, b"memfd", os.dup(warm_in))
        here.recv(64)

    def vm_writev_in(tag: bytes = b"writev") -> None:
        here.send(tag)
        addr = int(here.recv(64))
        writev(pid, src.ctypes.data, addr, n)
        here.send(b"x")
        here.recv(64)

    def memfd_out(tag: bytes) -> None:
        here.send(tag)
        _msg, fds = _recv(here)
        m, v = _map(fds[0], n)
        _touch(v)
        del v
        m.close()

    kept = np.zeros(n // 8)

    def vm_readv_out(warm: bool = False) -> None:
        here.send(b"out-readv")
        addr = int(here.recv(64))
        dst = kept if warm else np.empty(n // 8)
        readv(pid, dst.ctypes.data, addr, n)
        here.send(b"x")
        _touch(dst)

    ways = {"floor (a.copy())": floor, "in: memfd (today)": memfd_in, "in: warm memfd (pool)": warm_memfd_in,
            "in: process_vm_writev": vm_writev_in, "in: vm_writev, 4 KiB pages": lambda: vm_writev_in(b"writev-4k"),
            "in: vm_writev, warm memory": lambda: vm_writev_in(b"writev-warm"),
            "out: memfd (today)": lambda: memfd_out(b"out-memfd"),
            "out: warm memfd (pool)": lambda: memfd_out(b"out-warm"), "out: process_vm_readv": vm_readv_out,
            "out: vm_readv, warm memory": lambda: vm_readv_out(True)}
    times: dict = {k: [] for k in ways}
    try:
        for _ in range(args.reps + 1):          # the first round warms up, not counted
            for name, way in ways.items():
                t0 = time.perf_counter()
                way()
                times[name].append(time.perf_counter() - t0)
    finally:
        here.close()
        os.waitpid(pid, 0)
    best = {k: min(v[1:]) for k, v in times.items()}
    floor_t = best["floor (a.copy())"]
    print(f"{args.mb} MB, best of {args.reps} (median in brackets); ratio: the floor's time over the way's")
    for name, t in best.items():
        med = statistics.median(times[name][1:])
        print(f"  {name:26s} {t * 1e3:7.1f} ms ({med * 1e3:6.1f})  {n / t / 1e9:5.2f} GB/s  {floor_t / t:5.2f}x floor")
    return 0


if __name__ == "__main__":
    sys.exit(main())
