"""The machine's floor: what the hardware and the interpreter allow before any library is
involved, measured in the same run as the peers so that every target can be a ratio.

- round trip: 100 bytes there and back between two Python processes over a
  ``multiprocessing.Pipe`` (``send_bytes``/``recv_bytes``), median and p90 of the samples,
  each process pinned to a CPU of its own, as a pool's parent and worker run; and, noted
  beside it, the same with the reply read by a second thread and handed over through a
  Future (the wake-up every pool with a receiving thread adds), and the same with both
  processes on one CPU. Pinned because the kernel's own placement decides the figure: on
  this 2-vCPU VM a wake-up on the other CPU costs 80-115 µs a round trip and a switch on
  the same one 22-38, and left alone the kernel put the echo on either, from one run to the
  next (medians of 22 to 96 µs in six runs in a row, 2026-11-27);
- copy: GB/s of one copy of a 100 MB array into freshly allocated memory (``a.copy()``),
  and, for reference, into memory already touched (``np.copyto``);
- start-up: two bare interpreters started side by side, each importing cloudpickle and
  psutil, until both have said so;
- size: the RSS of one idle interpreter that imported cloudpickle.

The rows carry the peers' row names (``rtt_median_us``, ``bw_in_GBps``, ``first_result_s``,
``idle_rss_worker_MB``...), so the floor is one more column of the table.
"""
from __future__ import annotations

import multiprocessing
import os
import statistics
import subprocess
import sys
import time

ARRAY_BYTES = 100_000_000
READY = "import cloudpickle, psutil, sys; sys.stdout.write('ready\\n'); sys.stdout.flush()"
IDLE = ("import cloudpickle, sys; sys.stdout.write('ready\\n'); sys.stdout.flush(); sys.stdin.read()")


def _echo(conn) -> None:
    while True:
        msg = conn.recv_bytes()
        if not msg:
            return
        conn.send_bytes(msg)


def _handed_over(here, payload: bytes, n: int) -> list:
    """The same round trips, each reply read by a second thread that blocks on the pipe and
    hands the reply to the caller through a ``concurrent.futures.Future``: the third wake-up
    (receiver -> caller) that every pool with a receiving thread pays (ProcessPoolExecutor's
    management thread, loky's, dask's event loop, localcluster's scheduler thread)."""
    import threading
    from concurrent.futures import Future
    box: list = [None]

    def receive() -> None:
        for _ in range(n):
            reply = here.recv_bytes()
            box[0].set_result(reply)      # set before the send that this reply answers
    reader = threading.Thread(target=receive, daemon=True)
    reader.start()
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        box[0] = fut = Future()
        here.send_bytes(payload)
        fut.result()
        samples.append((time.perf_counter() - t0) * 1e6)
    reader.join()
    return samples


def _ping_pong(here, payload: bytes, n: int) -> list:
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        here.send_bytes(payload)
        here.recv_bytes()
        samples.append((time.perf_counter() - t0) * 1e6)
    return samples


def _pin(pids: tuple, cpus: tuple) -> None:
    for pid, cpu in zip(pids, cpus):
        os.sched_setaffinity(pid, {cpu})


def round_trip(quick: bool) -> dict:
    n = 300 if quick else 2000
    ctx = multiprocessing.get_context("spawn")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=_echo, args=(there,))
    proc.start()
    payload = b"x" * 100
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_setaffinity") else []
    pids = (os.getpid(), proc.pid)
    same = None
    try:
        if len(allowed) >= 2:
            _pin(pids, (allowed[0], allowed[1]))
        for _ in range(50):
            here.send_bytes(payload)
            here.recv_bytes()
        samples = _ping_pong(here, payload, n)
        handed_over = _handed_over(here, payload, n)
        if len(allowed) >= 2:
            _pin(pids, (allowed[0], allowed[0]))
            same = statistics.median(_ping_pong(here, payload, n))
    finally:
        if allowed:
            os.sched_setaffinity(0, set(allowed))
        here.send_bytes(b"")
        proc.join(10)
    samples.sort()
    p90 = samples[int(round(0.9 * (len(samples) - 1)))]
    hop = statistics.median(handed_over)
    note = f"each process on a CPU of its own; with a receiving thread that hands the reply over " \
           f"through a Future, as every pool does: {hop:.0f} us"
    if same is not None:
        note += f"; both on one CPU: {same:.0f} us"
    return {"rtt_median_us": {"value": statistics.median(samples), "n": n, "receiver_thread_us": hop,
                              "same_cpu_us": same, "note": note},
            "rtt_p90_us": {"value": p90, "n": n}}


def copy(quick: bool) -> dict:
    import numpy as np
    a = np.ones(ARRAY_BYTES // 8)
    fresh, touched = [], []
    target = np.empty_like(a)
    target[:] = 0
    for _ in range(3 if quick else 6):
        t0 = time.perf_counter()
        b = a.copy()
        fresh.append(time.perf_counter() - t0)
        del b
        t0 = time.perf_counter()
        np.copyto(target, a)
        touched.append(time.perf_counter() - t0)
    rate = ARRAY_BYTES / min(fresh) / 1e9
    note = {"fresh_GBps": rate, "touched_GBps": ARRAY_BYTES / min(touched) / 1e9}
    # in+out is two copies of 100 MB: the same rate as one
    return {"bw_in_GBps": {"value": rate, **note}, "bw_roundtrip_GBps": {"value": rate, **note}}


def start_up(quick: bool) -> dict:
    times = []
    for _ in range(3 if quick else 5):
        t0 = time.perf_counter()
        procs = [subprocess.Popen([sys.executable, "-c", READY], stdout=subprocess.PIPE, text=True)
                 for _ in range(2)]
        for p in procs:
            assert p.stdout.readline() == "ready\n"
        times.append(time.perf_counter() - t0)
        for p in procs:
            p.wait(10)
            p.stdout.close()
    best = min(times)
    return {"first_result_s": {"value": best, "raw": times}, "workers_up_s": {"value": best, "raw": times}}


def idle_size(quick: bool) -> dict:
    import psutil
    proc = subprocess.Popen([sys.executable, "-c", IDLE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        time.sleep(0.5)
        rss = psutil.Process(proc.pid).memory_info().rss / 1e6
    finally:
        proc.stdin.close()
        proc.wait(10)
        proc.stdout.close()
    return {"idle_rss_worker_MB": {"value": rss}, "idle_rss_MB": {"value": 2 * rss, "note": "2 idle interpreters"}}


# metric group name (as in bench.py) -> what measures the floor for it
METRICS = {"latency": round_trip, "bandwidth": copy, "startup": start_up, "idle_rss": idle_size}


def measure(metrics: list, quick: bool) -> dict:
    rows: dict = {}
    for m in metrics:
        if m in METRICS:
            rows.update(METRICS[m](quick))
    return rows
