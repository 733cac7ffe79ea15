#!/usr/bin/env python
"""What the journal of finished work costs (issue 49, part 4), on two workers:

    python benchmarks/journal.py [--n 10000] [--repeats 5] [--folder DIR]

- a map of ``n`` no-op tasks, gathered: without a journal, with a fresh one (every result
  written), and again on the full journal (every result reused): medians of ``repeats``;
  and a map of ``n`` tasks of 1 ms, computed with a journal, then reused;
- a 100 MB result written as a journal entry (``worker/journal.write_entry``, the code a
  worker runs, with its CRC-32) against the disk's own sequential write of the same bytes
  in the same folder (one ``write`` of a file, then ``rename``), each until ``fsync`` has it
  on the disk, alternating, and the time a
  task returning 100 MB takes end to end with and without the journal.

The folder defaults to one made in the current directory (the disk the journal would be on).
The figures go to benchmarks/README.md ("The journal of finished work").
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from localcluster import Client, LocalCluster  # noqa: E402
from localcluster.wire import serialize  # noqa: E402
from localcluster.worker import journal as J  # noqa: E402

MB100 = 100_000_000


def noop(x):
    return None


def block(seed):
    import numpy as np
    return np.full(MB100 // 8, float(seed))


def sleep_ms(x):
    time.sleep(0.001)
    return x


def timed_map(client, n: int, fn=noop) -> float:
    t = time.perf_counter()
    client.gather(client.map(fn, range(n)))
    return time.perf_counter() - t


def slow_maps(folder: str, n: int) -> dict:
    """Seconds for a map of ``n`` tasks of 1 ms: computed with a fresh journal, then reused."""
    path = os.path.join(folder, "slow")
    with LocalCluster(n_workers=2, forward_logs=False, journal=path) as cluster, Client(cluster) as client:
        client.gather(client.map(noop, range(100)))
        computed = timed_map(client, n, sleep_ms)
    with LocalCluster(n_workers=2, forward_logs=False, journal=path) as cluster, Client(cluster) as client:
        client.gather(client.map(noop, range(100)))
        reused = timed_map(client, n, sleep_ms)
    return {"computed": computed, "reused": reused}


def maps(folder: str, n: int, repeats: int) -> dict:
    """Seconds for the map without a journal, writing a fresh one, reusing a full one."""
    out: dict = {"none": [], "writing": [], "reusing": []}
    with LocalCluster(n_workers=2, forward_logs=False) as cluster, Client(cluster) as client:
        timed_map(client, n)         # warm: the workers' imports, the function cached
        for _ in range(repeats):
            out["none"].append(timed_map(client, n))
    path = os.path.join(folder, "maps")
    for _ in range(repeats):
        shutil.rmtree(path, ignore_errors=True)
        with LocalCluster(n_workers=2, forward_logs=False, journal=path) as cluster, Client(cluster) as client:
            client.gather(client.map(noop, range(n, n + 200)))    # warm, on other keys
            out["writing"].append(timed_map(client, n))
        with LocalCluster(n_workers=2, forward_logs=False, journal=path) as cluster, Client(cluster) as client:
            client.gather(client.map(noop, range(n, n + 200)))
            out["reusing"].append(timed_map(client, n))
            assert cluster.journal.reused == n + 200, cluster.journal
    return {k: statistics.median(v) for k, v in out.items()}


def _synced(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def raw_write(folder: str, data: memoryview) -> float:
    """The disk's own: one write of the bytes to a new file, renamed, and on the disk."""
    path = os.path.join(folder, "raw")
    t = time.perf_counter()
    fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.rename(path + ".tmp", path)
    _synced(path)
    took = time.perf_counter() - t
    os.unlink(path)
    return took


def entry_write(folder: str, payload) -> float:
    """A journal entry of the same bytes, as a worker writes it, and on the disk."""
    t = time.perf_counter()
    J.write_entry(folder, "0" * 40, payload)
    _synced(J.entry_path(folder, "0" * 40))
    took = time.perf_counter() - t
    os.unlink(J.entry_path(folder, "0" * 40))
    return took


def writes(folder: str, repeats: int) -> dict:
    """MB/s of the disk's own write and of a journal entry's, alternating (medians)."""
    value = block(1)
    payload = serialize.dumps_result(value)
    data = memoryview(value).cast("B")
    raw, entry = [], []
    for _ in range(repeats):
        raw.append(raw_write(folder, data))
        entry.append(entry_write(folder, payload))
    return {"disk MB/s": MB100 / 1e6 / statistics.median(raw), "entry MB/s": MB100 / 1e6 / statistics.median(entry)}


def big_task(folder: str, repeats: int) -> dict:
    """Seconds for a task returning 100 MB (left on its worker), without and with a journal."""
    out: dict = {}
    for name, journal in (("none", None), ("journal", os.path.join(folder, "big"))):
        times = []
        with LocalCluster(n_workers=2, forward_logs=False, journal=journal) as cluster, Client(cluster) as client:
            for i in range(repeats + 1):
                t = time.perf_counter()
                f = client.submit(block, i + 0.5)
                f.exception()      # done, its data left on the worker
                times.append(time.perf_counter() - t)
                del f
        out[name] = statistics.median(times[1:])
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--folder", default=None)
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="journal-bench-", dir=args.folder or os.getcwd())
    try:
        m = maps(folder, args.n, args.repeats)
        print(f"map of {args.n} no-ops, gathered (median of {args.repeats}):")
        print(f"  no journal      {m['none']:.3f} s")
        print(f"  writing one     {m['writing']:.3f} s   x{m['writing'] / m['none']:.2f} of no journal")
        print(f"  reusing it all  {m['reusing']:.3f} s   {m['writing'] / m['reusing']:.1f}x faster than computing "
              f"it with the journal, {m['none'] / m['reusing']:.1f}x than without")
        s = slow_maps(folder, args.n)
        print(f"map of {args.n} tasks of 1 ms: computed {s['computed']:.3f} s, reused {s['reused']:.3f} s "
              f"({s['computed'] / s['reused']:.1f}x faster)")
        w = writes(folder, args.repeats)
        print(f"100 MB written and synced: the disk {w['disk MB/s']:.0f} MB/s, a journal entry {w['entry MB/s']:.0f} MB/s "
              f"(x{w['entry MB/s'] / w['disk MB/s']:.2f})")
        b = big_task(folder, args.repeats)
        print(f"a task returning 100 MB: {b['none'] * 1e3:.0f} ms without a journal, {b['journal'] * 1e3:.0f} ms "
              f"with one (+{(b['journal'] - b['none']) * 1e3:.0f} ms)")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
