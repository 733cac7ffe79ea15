#!/usr/bin/env python
"""What the parent pays per task, by measures that a loaded machine hardly moves.

    python benchmarks/parent_cost.py [--n 200000] [--repeats 3]

bench.py's queue and big-map rows read RSS and wall time, which move with the allocator's
state and the machine's load. These read the same costs where they are deterministic or
nearly so, to compare two commits side by side on any machine (run it in two checkouts):

* traced bytes per finished task whose future is held (``tracemalloc``, 10,000 no-ops
  submitted one by one and waited for): what each task leaves in the parent;
* the user thread's CPU seconds for ``map(noop, range(n))`` to hand back its futures
  (``time.thread_time``: the caller's own work, not the wait for a CPU), and its wall time;
* ``close()`` with a second such map queued: wall and the calling thread's CPU.

localcluster only, 2 workers x 1 thread, each figure over ``--repeats`` rounds.

    python benchmarks/parent_cost.py --allocators [--sizes 1000,10000]

reads instead where bench.py's "parent memory per pending task" goes, for N no-ops submitted
one by one on a fresh warmed cluster (one process per size, as bench.py measures them): the
RSS per task, the bytes pymalloc handed out per task (objects of up to 512 bytes), and what
glibc's malloc handed out (larger blocks: the tables of the dicts and sets keyed by task, the
task stream's columns). glibc only (``mallinfo2``).
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import time
import tracemalloc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (its task functions and warm-up, so that they pickle the same way)
import scale  # noqa: E402


def traced_per_task(peer: bench.Peer, n: int = 10_000) -> float:
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        futures = [peer.submit(bench.noop, i) for i in range(n)]
        peer.results(futures)
        gc.collect()
        return (tracemalloc.get_traced_memory()[0] - before) / n
    finally:
        tracemalloc.stop()


def map_back(peer: bench.Peer, n: int) -> tuple[float, float]:
    gc.collect()
    wall, cpu = time.perf_counter(), time.thread_time()
    futures = peer.map_futures(bench.noop, range(n))
    wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
    peer.gather_all(futures)
    return wall, cpu


def close_queued(n: int) -> tuple[float, float]:
    peer = bench.LocalClusterPeer()
    peer.start()
    bench.warm_up(peer)
    queued = peer.map_futures(bench.noop, range(n))
    wall, cpu = time.perf_counter(), time.thread_time()
    peer.close()
    wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
    del queued
    return wall, cpu


def _pymalloc_used() -> int:
    """Bytes in pymalloc's allocated blocks (sys._debugmallocstats, which writes to fd 2)."""
    import re
    import tempfile
    with tempfile.TemporaryFile() as f:
        saved = os.dup(2)
        try:
            os.dup2(f.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        f.seek(0)
        text = f.read().decode()
    return int(re.search(r"# bytes in allocated blocks\s*=\s*([\d,]+)", text).group(1).replace(",", ""))


def allocators(n: int) -> str:
    import ctypes

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                                         "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = MallInfo2
    peer = bench.LocalClusterPeer()
    peer.start()
    try:
        bench.warm_up(peer)
        gc.collect()
        time.sleep(0.3)
        glibc, pymalloc, rss = libc.mallinfo2().uordblks, _pymalloc_used(), scale._rss()
        futures = [peer.submit(bench.noop, i) for i in range(n)]
        rss, glibc, pymalloc = scale._rss() - rss, libc.mallinfo2().uordblks - glibc, _pymalloc_used() - pymalloc
        peer.results(futures)
    finally:
        peer.close()
    return f"{n:,} submitted one by one, per task: RSS {rss / n:.0f} B, pymalloc {pymalloc / n:.0f} B, glibc {glibc / n:.0f} B"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=200_000, help="tasks in each map (default 200,000)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--allocators", action="store_true", help="where the queue rows' memory goes, instead")
    ap.add_argument("--sizes", default="1000,10000", help="with --allocators: the Ns (default 1000,10000)")
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)    # a child of --allocators
    args = ap.parse_args()
    if args.one is not None:
        print(allocators(args.one), flush=True)
        return
    if args.allocators:
        import subprocess
        for n in [int(x) for x in args.sizes.split(",")]:
            for _ in range(args.repeats):
                subprocess.run([sys.executable, os.path.abspath(__file__), "--one", str(n)], check=True)
        return
    import localcluster
    print(f"localcluster {localcluster.__version__} from {os.path.dirname(localcluster.__file__)}, "
          f"load average {os.getloadavg()[0]:.1f}")
    peer = bench.LocalClusterPeer()
    peer.start()
    try:
        bench.warm_up(peer)
        traced = [traced_per_task(peer) for _ in range(args.repeats)]
        maps = [map_back(peer, args.n) for _ in range(args.repeats)]
    finally:
        peer.close()
    closes = [close_queued(args.n) for _ in range(args.repeats)]
    print("traced bytes per finished task, future held: " + ", ".join(f"{t:.0f}" for t in traced))
    print(f"map of {args.n:,} no-ops, futures back, wall / user thread CPU (s): "
          + ", ".join(f"{w:.2f} / {c:.2f}" for w, c in maps))
    print(f"close() with {args.n:,} queued, wall / calling thread CPU (s): "
          + ", ".join(f"{w:.2f} / {c:.2f}" for w, c in closes))


if __name__ == "__main__":
    main()
