"""How cost grows with the queue: the parent's memory and time per task with 1k, 10k and
100k no-ops pending, and a ``map`` of 200,000 no-ops (how long until the futures are
handed back, the parent's peak memory per task, and ``close()`` with a full queue).

Run by bench.py as the "queue" and "bigmap" metrics, for the peers that can hold such a
queue in reasonable time (not dask: ~600 tasks/s would take minutes). The task function
and the warm-up are bench.py's, handed in, so that they pickle the same way there.
"""
from __future__ import annotations

import gc
import os
import threading
import time

QUEUE_SIZES = ((1_000, 10_000), (1_000, 10_000, 100_000))     # quick, full
BIGMAP = (20_000, 200_000)


def _rss() -> int:
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _Peak:
    """The parent's largest RSS while it runs (sampled every 5 ms on a thread)."""

    def __init__(self) -> None:
        self.peak = _rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, _rss())

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return max(self.peak, _rss())


def metric_queue(peer_cls, quick: bool, noop, warm_up) -> dict:
    """Submit N no-ops one by one, then wait for all: bytes of parent memory per pending
    task (RSS after submitting, less before, over N) and µs per task (submit + wait)."""
    peer = peer_cls()
    peer.start()
    rows: dict = {}
    try:
        warm_up(peer)
        for n in QUEUE_SIZES[0 if quick else 1]:
            gc.collect()
            time.sleep(0.3)
            before = _rss()
            t0 = time.perf_counter()
            fs = [peer.submit(noop, i) for i in range(n)]
            after = _rss()
            peer.results(fs, timeout=600)
            total = time.perf_counter() - t0
            rows[f"queue_{n}_B_per_task"] = {"value": max(0, after - before) / n, "n": n}
            rows[f"queue_{n}_us_per_task"] = {"value": total / n * 1e6, "n": n}
            del fs
    finally:
        peer.close()
    return rows


def metric_bigmap(peer_cls, quick: bool, noop, warm_up) -> dict:
    """map(noop, range(N)): seconds until it hands the futures back, until every result is
    in, the parent's peak memory per task; then a second such map and close() at once."""
    n = BIGMAP[0 if quick else 1]
    peer = peer_cls()
    peer.start()
    try:
        warm_up(peer)
        gc.collect()
        before = _rss()
        peak = _Peak()
        t0 = time.perf_counter()
        fs = peer.map_futures(noop, range(n))
        returned = time.perf_counter() - t0
        out = peer.gather_all(fs)
        total = time.perf_counter() - t0
        top = peak.stop()
        assert len(out) == n
        del fs, out
        gc.collect()
        queued = peer.map_futures(noop, range(n))
    finally:
        t1 = time.perf_counter()
        peer.close()
        closing = time.perf_counter() - t1
    del queued
    return {"bigmap_returned_s": {"value": returned, "n": n},
            "bigmap_tasks_per_s": {"value": n / total, "n": n},
            "bigmap_peak_B_per_task": {"value": max(0, top - before) / n, "n": n},
            "bigmap_close_s": {"value": closing, "n": n, "note": f"close() with {n} tasks queued"}}
