#!/usr/bin/env python
"""Side-by-side benchmarks: localcluster vs ProcessPoolExecutor vs loky vs dask.distributed.

    python benchmarks/bench.py [--quick] [--only NAME[,NAME...]] [--peers P[,P...]] [--timeout S]

Every peer runs with 2 worker processes of 1 thread each. Each (peer, group of
metrics) runs in a fresh child interpreter (``bench.py --child ...``), one at a
time, so that peers do not share imports, helper processes or CPU time, and so
that a hang is bounded: the parent dumps the child's stacks (faulthandler,
SIGUSR1), stops it, and kills whatever it left behind. The parent is a Linux
child subreaper, so processes a child orphans are found and reported as leaks.

Results: a table on stdout and ``benchmarks/results/latest.json``.
See benchmarks/README.md for what each metric means and how it is aggregated.

Keep this module's top level light (stdlib only): dask's nannies start with
multiprocessing "spawn" and re-import it as ``__mp_main__``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

import scale

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results", "latest.json")
N_WORKERS = 2
ARRAY_BYTES = 100_000_000          # "100 MB": 12.5 M float64
PEERS = ("localcluster", "ppe", "ppe_spawn", "loky", "dask", "floor")
OPTIONAL_PEERS = ()
PEER_TITLES = {"localcluster": "localcluster", "ppe": "ProcessPool", "loky": "loky", "dask": "dask",
               "ppe_spawn": "ProcessPool(spawn)", "floor": "floor"}
NOT_A_PEER = ("floor",)            # a column of the table, never "the best peer"
RESULT_TIMEOUT = 120.0             # any single wait inside a metric


# ---------------------------------------------------------------------------------------
# Task functions (module level: PPE pickles them by reference, the others by value)
# ---------------------------------------------------------------------------------------

def noop(*args):
    return None


def getpid(*args):
    return os.getpid()


def sleep_pid(seconds):
    time.sleep(seconds)
    return os.getpid()


def touch(a):
    """'In' only: read one element per 4 KiB page (so shared-memory pages are really
    mapped in), return a scalar."""
    return float(a.reshape(-1)[:: 4096 // a.itemsize].sum()) + a.nbytes


def identity(a):
    return a


def make_array(n):
    import numpy as np
    return np.ones(n)


def touch_pages(a):
    """What the parent does with a returned array: read one element per 4 KiB page."""
    return float(a.reshape(-1)[:: 4096 // a.itemsize].sum())


def victim(marker):
    """First attempt: publish our pid, then sleep until killed. Rerun: return at once."""
    pidfile = marker + ".pid"
    if os.path.exists(pidfile):
        return ("rerun", os.getpid())
    tmp = f"{pidfile}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(str(os.getpid()))
    os.rename(tmp, pidfile)
    time.sleep(60)
    return ("first attempt survived", os.getpid())


# ---------------------------------------------------------------------------------------
# Peers: one small adapter each, so that the metric functions are peer-agnostic
# ---------------------------------------------------------------------------------------

class Peer:
    name = "?"
    notes: dict

    def __init__(self, workers: int = N_WORKERS, threads: int = 1):
        self.notes = {}
        self.workers = workers      # processes
        self.threads = threads      # tasks at once per process (the pools: always 1)

    def start(self) -> float:
        """Construct the pool; returns seconds until 'all workers up' if the constructor
        guarantees that, else None."""
        raise NotImplementedError

    def submit(self, fn, *args):
        raise NotImplementedError

    def result(self, fut, timeout=RESULT_TIMEOUT):
        return fut.result(timeout=timeout)

    def results(self, futs, timeout=RESULT_TIMEOUT):
        end = time.monotonic() + timeout
        return [f.result(timeout=max(0.0, end - time.monotonic())) for f in futs]

    def map(self, fn, items, timeout=RESULT_TIMEOUT):
        raise NotImplementedError

    def map_futures(self, fn, items):
        """The peer's own map, returning as soon as it hands back its futures (or iterator)."""
        raise NotImplementedError

    def gather_all(self, fs) -> list:
        return list(fs)

    def worker_names(self) -> list:
        """Names to pin tasks with (peers that keep data on workers only)."""
        raise NotImplementedError

    def submit_on(self, worker, fn, *args):
        raise NotImplementedError

    def wait(self, futs) -> None:
        """Until done, without bringing results to the caller."""
        raise NotImplementedError

    def pool_pids(self) -> dict:
        """{"workers": [...], "nannies": [...]}"""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class ClientClusterPeer(Peer):
    """A peer made of a client and the cluster it drives (localcluster, dask)."""
    client = cluster = None

    def close(self):
        if self.client is not None:
            self.client.close()
        if self.cluster is not None:
            self.cluster.close()
        self.client = self.cluster = None


class LocalClusterPeer(ClientClusterPeer):
    name = "localcluster"

    def __init__(self, workers: int = N_WORKERS, threads: int = 1):
        super().__init__(workers, threads)
        import localcluster  # noqa: F401  (import time is not part of any metric)
        self.lc = localcluster
        self.cluster = self.client = None
        self.notes["version"] = localcluster.__version__

    def start(self):
        t0 = time.perf_counter()
        self.cluster = self.lc.LocalCluster(n_workers=self.workers, threads_per_worker=self.threads)
        up = time.perf_counter() - t0
        self.client = self.lc.Client(self.cluster)
        return up

    def submit(self, fn, *args, pure=False):
        return self.client.submit(fn, *args, pure=pure)

    def map(self, fn, items, timeout=RESULT_TIMEOUT):
        fs = self.client.map(fn, items, pure=False)
        self.lc.wait(fs, timeout=timeout)
        return self.client.gather(fs)

    def map_futures(self, fn, items):
        return self.client.map(fn, items, pure=False)

    def gather_all(self, fs) -> list:
        return self.client.gather(fs)

    def pool_pids(self):
        return {"workers": [w.pid for w in self.cluster.workers.values()], "nannies": []}

    def worker_names(self):
        return sorted(self.cluster.workers)

    def submit_on(self, worker, fn, *args):
        return self.client.submit(fn, *args, pure=False, workers=[worker])

    def wait(self, futs):
        self.lc.wait(futs, timeout=RESULT_TIMEOUT)



class PPEPeer(Peer):
    name = "ppe"

    def __init__(self, workers: int = N_WORKERS, threads: int = 1):
        super().__init__(workers, 1)
        import concurrent.futures as cf
        import multiprocessing
        self.cf = cf
        self.ex = None
        self.notes["start_method"] = multiprocessing.get_start_method()

    def start(self):
        self.ex = self.cf.ProcessPoolExecutor(max_workers=self.workers)
        self.notes["start_method"] = self.ex._mp_context.get_start_method()
        return None           # workers are started lazily, on submit

    def submit(self, fn, *args):
        return self.ex.submit(fn, *args)

    def map(self, fn, items, timeout=RESULT_TIMEOUT):
        return list(self.ex.map(fn, items, timeout=timeout))     # chunksize=1 (the default)

    def map_futures(self, fn, items):
        return self.ex.map(fn, items)        # submits every item before it returns the iterator

    def pool_pids(self):
        return {"workers": list(self.ex._processes), "nannies": []}

    def close(self):
        if self.ex is not None:
            self.ex.shutdown(wait=True, cancel_futures=True)
        self.ex = None


class PPESpawnPeer(PPEPeer):
    """Not in the default set: ProcessPoolExecutor with the "spawn" context, for comparison
    with numbers measured where fork is not the default (macOS, Windows, Python >= 3.14
    uses forkserver on Linux)."""
    name = "ppe_spawn"

    def start(self):
        import multiprocessing
        self.ex = self.cf.ProcessPoolExecutor(max_workers=self.workers,
                                              mp_context=multiprocessing.get_context("spawn"))
        self.notes["start_method"] = "spawn"
        return None


class LokyPeer(PPEPeer):
    name = "loky"

    def __init__(self, workers: int = N_WORKERS, threads: int = 1):
        Peer.__init__(self, workers, 1)
        import loky
        self.loky = loky
        self.ex = None
        self.notes["version"] = loky.__version__

    def start(self):
        self.ex = self.loky.get_reusable_executor(max_workers=self.workers)
        return None

    def close(self):
        if self.ex is not None:
            self.ex.shutdown(wait=True, kill_workers=True)
        self.ex = None


class DaskPeer(ClientClusterPeer):
    name = "dask"

    def __init__(self, workers: int = N_WORKERS, threads: int = 1):
        super().__init__(workers, threads)
        import logging
        import warnings
        import distributed
        warnings.filterwarnings("ignore")            # "Large object ... detected in task graph"
        logging.getLogger("distributed").setLevel(logging.ERROR)
        self.distributed = distributed
        self.cluster = self.client = None
        self.notes["version"] = distributed.__version__

    def start(self):
        d = self.distributed
        t0 = time.perf_counter()
        self.cluster = d.LocalCluster(n_workers=self.workers, threads_per_worker=self.threads, processes=True,
                                      dashboard_address=None)
        up = time.perf_counter() - t0
        self.client = d.Client(self.cluster)
        return up

    def submit(self, fn, *args, pure=False):
        return self.client.submit(fn, *args, pure=pure)

    def results(self, futs, timeout=RESULT_TIMEOUT):
        self.distributed.wait(futs, timeout=timeout)
        return self.client.gather(futs)

    def map(self, fn, items, timeout=RESULT_TIMEOUT):
        fs = self.client.map(fn, items, pure=False)
        self.distributed.wait(fs, timeout=timeout)
        return self.client.gather(fs)

    def worker_names(self):
        return sorted(self.client.scheduler_info()["workers"])

    def submit_on(self, worker, fn, *args):
        return self.client.submit(fn, *args, pure=False, workers=[worker], allow_other_workers=False)

    def wait(self, futs):
        self.distributed.wait(futs, timeout=RESULT_TIMEOUT)

    def pool_pids(self):
        import psutil
        workers = sorted(self.client.run(os.getpid, wait=True).values())
        nannies = sorted({psutil.Process(p).ppid() for p in workers} - {os.getpid()})
        return {"workers": workers, "nannies": nannies}



PEER_CLASSES = {"localcluster": LocalClusterPeer, "ppe": PPEPeer, "loky": LokyPeer, "dask": DaskPeer,
                "ppe_spawn": PPESpawnPeer}


def warm_up(peer: Peer) -> None:
    """Every worker has started and run a task."""
    seen = set()
    for _ in range(20):   # enough sleepers to fill every thread of every worker, twice
        fs = [peer.submit(sleep_pid, 0.05) for _ in range(2 * peer.workers * peer.threads)]
        seen.update(peer.results(fs))
        if len(seen) >= peer.workers:
            break
    for _ in range(50):
        peer.result(peer.submit(noop, 0))


# ---------------------------------------------------------------------------------------
# Metrics. Each returns {row name: value or {"value": v, "note": str, "raw": ...}}.
# ---------------------------------------------------------------------------------------

SIZES = {
    # name: (quick, full); dask gets smaller counts (it does ~600 tasks/s, ~10 ms round trips)
    "submit_n": ((1000, 250), (5000, 1000)),
    "map_n": ((2000, 400), (20000, 2000)),
    "latency_n": ((300, 40), (2000, 200)),
    "repeats": ((2, 1), (5, 3)),
    "bw_repeats": ((2, 2), (4, 3)),
    "startup_repeats": ((2, 1), (5, 3)),
    "recovery_repeats": ((1, 1), (3, 3)),
    "shape_submit_n": ((300, 100), (3000, 600)),
    "shape_latency_n": ((100, 20), (600, 100)),
    "shape_repeats": ((1, 1), (3, 2)),
}


def size(name: str, peer: str, quick: bool) -> int:
    q, f = SIZES[name]
    pair = q if quick else f
    return pair[1] if peer == "dask" else pair[0]


def submit_loop(peer: Peer, n: int, repeats: int) -> dict:
    """No-op tasks per second, submitted one by one, then wait for all results. Best of R."""
    rates = []
    for r in range(repeats):
        t0 = time.perf_counter()
        fs = [peer.submit(noop, i) for i in range(n)]
        peer.results(fs)
        rates.append(n / (time.perf_counter() - t0))
        del fs
        time.sleep(0.2)       # let the previous round's bookkeeping (releases) settle
    return {"value": max(rates), "median": statistics.median(rates), "raw": rates, "n": n}


def round_trips(peer: Peer, n: int) -> list:
    """``n`` sequential submit(noop).result() round trips after 20 more, in µs, sorted."""
    for i in range(20):
        peer.result(peer.submit(noop, -i))
    samples = []
    for i in range(n):
        t0 = time.perf_counter()
        peer.result(peer.submit(noop, i))
        samples.append((time.perf_counter() - t0) * 1e6)
    return sorted(samples)


def metric_submit(peer: Peer, quick: bool) -> dict:
    return {"submit_tps": submit_loop(peer, size("submit_n", peer.name, quick), size("repeats", peer.name, quick))}


def metric_map(peer: Peer, quick: bool) -> dict:
    """No-op tasks per second through map (PPE/loky: executor.map, chunksize=1). Best of R."""
    n = size("map_n", peer.name, quick)
    rates = []
    for r in range(size("repeats", peer.name, quick)):
        t0 = time.perf_counter()
        out = peer.map(noop, range(n))
        rates.append(n / (time.perf_counter() - t0))
        assert len(out) == n
        del out
        time.sleep(0.2)
    return {"map_tps": {"value": max(rates), "median": statistics.median(rates), "raw": rates, "n": n}}


def metric_latency(peer: Peer, quick: bool) -> dict:
    """Sequential submit(f).result() round trips: median and p90 over all samples, µs."""
    n = size("latency_n", peer.name, quick)
    samples = round_trips(peer, n)
    p90 = samples[min(len(samples) - 1, int(round(0.9 * (len(samples) - 1))))]
    return {"rtt_median_us": {"value": statistics.median(samples), "n": n},
            "rtt_p90_us": {"value": p90, "n": n, "raw": {"min": samples[0], "max": samples[-1]}}}


def metric_bandwidth(peer: Peer, quick: bool) -> dict:
    """A 100 MB float64 array as a task argument. 'in': the task touches every page and
    returns a scalar, GB/s = 100 MB / time. 'round trip': the task returns the array and
    the parent reads one element per page of the result, GB/s = 200 MB (in + out) / time. Best of R, after one warm-up with the same array."""
    import numpy as np
    a = np.ones(ARRAY_BYTES // 8)
    peer.result(peer.submit(touch, np.ones(1000)))   # numpy imported in the workers
    reps = size("bw_repeats", peer.name, quick)
    out: dict = {}

    def timed(fn, pure=None):
        best, raw = None, []
        for r in range(reps + 1):            # first is the warm-up, not counted
            t0 = time.perf_counter()
            f = peer.submit(fn, a) if pure is None else peer.submit(fn, a, pure=pure)
            res = peer.result(f)
            if fn is identity:          # the caller uses what came back: fault its pages in
                assert touch_pages(res) == len(range(0, len(a), 4096 // a.itemsize))
            dt = time.perf_counter() - t0
            del f, res
            if r:
                raw.append(dt)
                best = dt if best is None else min(best, dt)
        return best, raw

    t, raw = timed(touch)
    out["bw_in_GBps"] = {"value": ARRAY_BYTES / t / 1e9, "seconds": raw}
    t, raw = timed(identity)
    out["bw_roundtrip_GBps"] = {"value": 2 * ARRAY_BYTES / t / 1e9, "seconds": raw}
    if peer.name in ("localcluster", "dask"):     # what a default submit() (pure=True) costs
        t, raw = timed(touch, pure=True)
        out["bw_in_pure_GBps"] = {"value": ARRAY_BYTES / t / 1e9, "seconds": raw}
        # Made on one worker, used on the other: only the move and the touch are timed.
        src, dst = peer.worker_names()[:2]
        best, raw = None, []
        for r in range(reps + 1):
            made = peer.submit_on(src, make_array, ARRAY_BYTES // 8)
            peer.wait([made])
            t0 = time.perf_counter()
            assert peer.result(peer.submit_on(dst, touch, made)) > 0
            dt = time.perf_counter() - t0
            del made
            if r:
                raw.append(dt)
                best = dt if best is None else min(best, dt)
        out["bw_between_GBps"] = {"value": ARRAY_BYTES / best / 1e9, "seconds": raw}
    return out


def metric_idle_rss(peer: Peer, quick: bool) -> dict:
    """RSS (and USS) summed over the pool's processes after a warm-up and 1 s idle: the
    worker processes, and for dask the nanny processes too. MB = 1e6 bytes."""
    import psutil
    time.sleep(1.0)
    pids = peer.pool_pids()
    procs = {p: psutil.Process(p) for p in pids["workers"] + pids["nannies"]}
    rss = {p: pr.memory_info().rss for p, pr in procs.items()}
    uss = {}
    for p, pr in procs.items():
        try:
            uss[p] = pr.memory_full_info().uss
        except (psutil.AccessDenied, AttributeError):
            pass
    worker_rss = [rss[p] for p in pids["workers"]]
    # Everything else this process started (resource trackers, ...): reported, not summed.
    mine = {pr.pid for pr in psutil.Process().children(recursive=True)}
    helpers = {}
    for p in sorted(mine - set(procs)):
        try:
            pr = psutil.Process(p)
            # the interpreter's own path belongs to this machine: the JSON says "python"
            argv = ["python" if a == sys.executable else a for a in pr.cmdline()]
            helpers[p] = {"cmd": " ".join(argv)[:120], "rss_MB": pr.memory_info().rss / 1e6}
        except psutil.Error:
            pass
    out = {
        "idle_rss_MB": {"value": sum(rss.values()) / 1e6, "raw": {"pids": pids, "rss": rss}},
        "idle_rss_worker_MB": {"value": sum(worker_rss) / len(worker_rss) / 1e6,
                               "raw": [r / 1e6 for r in worker_rss]},
    }
    if uss:
        out["idle_uss_MB"] = {"value": sum(uss.values()) / 1e6, "raw": uss}
    if helpers:
        out["idle_rss_MB"]["helpers"] = helpers
    if peer.name == "localcluster":
        out["idle_rss_MB"]["own_report"] = {n: w.memory for n, w in peer.cluster.workers.items()}
    return out


def metric_startup(peer_cls, quick: bool) -> dict:
    """Fresh pool each repeat (imports done beforehand): constructor start -> first
    no-op result, and constructor start -> constructor returned with all workers up
    (localcluster, dask; PPE/loky start workers lazily). Best of R."""
    name = peer_cls.name
    firsts, ups, closes = [], [], []
    for r in range(size("startup_repeats", name, quick)):
        peer = peer_cls()
        try:
            t0 = time.perf_counter()
            up = peer.start()
            peer.result(peer.submit(noop, 0))
            firsts.append(time.perf_counter() - t0)
            if up is not None:
                ups.append(up)
        finally:
            t1 = time.perf_counter()
            peer.close()
            closes.append(time.perf_counter() - t1)
    out = {"first_result_s": {"value": min(firsts), "raw": firsts},
           "close_s": {"value": min(closes), "raw": closes}}
    out["workers_up_s"] = ({"value": min(ups), "raw": ups} if ups else
                           {"value": None, "note": "lazy start"})
    return out


def metric_recovery(peer_cls, quick: bool) -> dict:
    """A task writes its worker's pid to a marker file and sleeps; the parent SIGKILLs
    that pid; seconds from the kill until the rerun's result arrives. Fresh pool for
    each repeat. Median of R. PPE/loky: what the pool does instead."""
    name = peer_cls.name
    times, notes, raw = [], [], []
    tmp = tempfile.mkdtemp(prefix="bench-recovery-")
    try:
        for r in range(size("recovery_repeats", name, quick)):
            peer = peer_cls()
            try:
                peer.start()
                warm_up(peer)
                marker = os.path.join(tmp, f"victim-{r}")
                fut = peer.submit(victim, marker)
                deadline = time.monotonic() + 30
                while not os.path.exists(marker + ".pid"):
                    if time.monotonic() > deadline:
                        raise TimeoutError("the victim task did not start within 30 s")
                    time.sleep(0.001)
                with open(marker + ".pid") as f:
                    pid = int(f.read())
                t0 = time.perf_counter()
                os.kill(pid, signal.SIGKILL)
                try:
                    res = peer.result(fut, timeout=60)
                except Exception as e:  # the pools break
                    dt = time.perf_counter() - t0
                    after = "?"
                    try:
                        peer.result(peer.submit(noop, 1), timeout=10)
                        after = "the pool still accepts work"
                    except Exception as e2:
                        after = f"next submit -> {type(e2).__name__}"
                    notes.append(f"broken ({type(e).__name__}, {dt * 1e3:.0f} ms)")
                    raw.append({"error": f"{type(e).__name__}: {e}"[:300], "seconds": dt, "then": after})
                    continue
                dt = time.perf_counter() - t0
                if res[0] != "rerun" or res[1] == pid:
                    raise AssertionError(f"unexpected rerun result {res!r} (killed pid {pid})")
                times.append(dt)
                raw.append({"seconds": dt, "killed": pid, "rerun_on": res[1]})
            finally:
                peer.close()
    finally:
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
    if times:
        return {"recovery_s": {"value": statistics.median(times), "raw": raw}}
    return {"recovery_s": {"value": None, "note": notes[0] if notes else "?", "raw": raw}}


SHAPE_WORKERS = (1, 2, 4)
SHAPE_THREADS = (1, 4)


def shape_row(workers: int, threads: int, what: str) -> str:
    return f"shape_{workers}x{threads}_{what}"


def metric_shape(peer_cls, quick: bool) -> dict:
    """The submit loop and the round trip at 1, 2 and 4 workers, with 1 and 4 threads per
    worker for the clusters (a pool's process runs one task at a time). A fresh pool for each
    shape, warmed up as the others."""
    name = peer_cls.name
    threads = SHAPE_THREADS if name in ("localcluster", "dask") else (1,)
    out: dict = {}
    for w in SHAPE_WORKERS:
        for t in threads:
            peer = peer_cls(w, t)
            try:
                peer.start()
                warm_up(peer)
                out[shape_row(w, t, "submit_tps")] = submit_loop(peer, size("shape_submit_n", name, quick),
                                                                 size("shape_repeats", name, quick))
                samples = round_trips(peer, size("shape_latency_n", name, quick))
                out[shape_row(w, t, "rtt_us")] = {"value": statistics.median(samples), "n": len(samples),
                                                  "raw": {"min": samples[0], "max": samples[-1]}}
            finally:
                peer.close()
    return out


POOL_METRICS = {             # share one warmed-up pool, run in this order
    "idle_rss": metric_idle_rss,
    "latency": metric_latency,
    "submit": metric_submit,
    "map": metric_map,
    "bandwidth": metric_bandwidth,
}
FRESH_METRICS = {"startup": metric_startup, "recovery": metric_recovery,
                 "queue": lambda cls, quick: scale.metric_queue(cls, quick, noop, warm_up),
                 "bigmap": lambda cls, quick: scale.metric_bigmap(cls, quick, noop, warm_up),
                 "shape": metric_shape}
ALL_METRICS = list(POOL_METRICS) + list(FRESH_METRICS)
GROUPS = [("pool", list(POOL_METRICS)), ("startup", ["startup"]), ("recovery", ["recovery"]),
          ("queue", ["queue"]), ("bigmap", ["bigmap"]), ("shape", ["shape"])]
# Groups run in `passes` passes, each row keeping its best: the pool's rows, the start-up
# (a ratio against the floor, measured in another child: on this VM both sides' best of five
# moved 0.07-0.11 s between runs, so a single pass each compared two moments of the machine)
# and the queue (its 1k row is one RSS delta of ~1 MB, read 640-1,200 B a task in 20 fresh
# processes running the same code). The rest run once: recovery's and shape's targets are
# far from their spread; the big map's peak is near its bound (903-981 B a task against 1,024
# in five runs) but steady, and a second pass of it would add ~4 minutes to a full run.
REPEATED = ("pool", "startup", "queue")
# Metrics only some peers run: a 100,000-task queue would take dask minutes; the floor has
# a figure for four metrics only.
ONLY_FOR = {"queue": ("localcluster", "ppe", "ppe_spawn", "loky"), "bigmap": ("localcluster", "ppe", "ppe_spawn", "loky"),
            "shape": ("localcluster", "ppe_spawn", "loky", "dask")}
FLOOR_METRICS = ("idle_rss", "latency", "bandwidth", "startup")

# Table rows: (row, label, unit, higher is better, targets). A target is (reference column,
# least ratio): the ratio is "localcluster better" (> 1 better), so "<= 0.5x PPE's time" is
# ("ppe_spawn", 2.0) and "<= 5x the floor's round trip" is ("floor", 1/5). Issue 11's table,
# with issue 28's round trip: at most 5x the floor (issue 11 said 3x).
ROWS = [
    ("submit_tps", "no-op submit loop", "tasks/s", True, [("ppe_spawn", 3.0), ("dask", 25.0)]),
    ("map_tps", "no-op map", "tasks/s", True, [("ppe_spawn", 4.0)]),
    ("rtt_median_us", "round trip median", "µs", False, [("ppe_spawn", 2.0), ("floor", 1 / 5)]),
    ("rtt_p90_us", "round trip p90", "µs", False, []),
    ("first_result_s", "start -> first result", "s", False, [("floor", 1 / 1.5)]),
    ("workers_up_s", "start -> all workers up", "s", False, [("floor", 1 / 2)]),
    ("bw_in_GBps", "100 MB array in", "GB/s", True, [("floor", 0.8)]),
    ("bw_roundtrip_GBps", "100 MB array in+out", "GB/s", True, [("floor", 0.8)]),
    ("bw_in_pure_GBps", "100 MB in, pure=True", "GB/s", True, []),
    ("bw_between_GBps", "100 MB worker to worker", "GB/s", True, []),
    ("recovery_s", "SIGKILL -> rerun result", "s", False, [("dask", 2.0)]),
    ("idle_rss_MB", "idle RSS, whole pool", "MB", False, []),
    ("idle_rss_worker_MB", "idle RSS per worker", "MB", False, [("floor", 1 / 1.5)]),
    ("idle_uss_MB", "idle USS, whole pool", "MB", False, []),
    ("close_s", "close()", "s", False, []),
    ("queue_1000_B_per_task", "parent memory per pending task, 1k queued", "B", False, [("max", 1024)]),
    ("queue_10000_B_per_task", "parent memory per pending task, 10k queued", "B", False, [("max", 1024)]),
    ("queue_100000_B_per_task", "parent memory per pending task, 100k queued", "B", False, [("max", 1024)]),
    ("queue_1000_us_per_task", "time per task, 1k queued", "µs", False, []),
    ("queue_10000_us_per_task", "time per task, 10k queued", "µs", False, []),
    ("queue_100000_us_per_task", "time per task, 100k queued", "µs", False, []),
    ("bigmap_returned_s", "big map (200k no-ops; 20k --quick): futures back", "s", False, [("max", 2.0)]),
    ("bigmap_tasks_per_s", "big map: all results", "tasks/s", True, []),
    ("bigmap_peak_B_per_task", "big map: parent peak per task", "B", False, [("max", 1024)]),
    ("bigmap_close_s", "big map: close() with all queued", "s", False, [("max", 0.5)]),
] + [(shape_row(w, t, what), f"{label}, {w} worker{'s' if w > 1 else ''} x {t} thread{'s' if t > 1 else ''}", unit, higher, [])
     for what, label, unit, higher in (("submit_tps", "submit loop", "tasks/s", True), ("rtt_us", "round trip median", "µs", False))
     for w in SHAPE_WORKERS for t in SHAPE_THREADS]


def target_text(targets: list, higher: bool) -> str:
    """("max", v) and ("min", v) are absolute bounds; (peer, r) a least ratio against a column."""
    parts = []
    for ref, least in targets:
        if ref in ("max", "min"):
            parts.append(f"{'<=' if ref == 'max' else '>='} {least:g}")
            continue
        factor = least if higher else 1 / least
        parts.append(f"{'>=' if higher else '<='} {factor:g}x {PEER_TITLES[ref]}")
    return ", ".join(parts)


# ---------------------------------------------------------------------------------------
# Child: run one group of metrics for one peer, write JSON
# ---------------------------------------------------------------------------------------

def child_main(peer_name: str, metrics: list, quick: bool, out_path: str) -> int:
    import faulthandler
    faulthandler.enable()
    faulthandler.register(signal.SIGUSR1, all_threads=True)

    def on_term(signum, frame):
        raise SystemExit(f"stopped by the benchmark parent (signal {signum})")
    signal.signal(signal.SIGTERM, on_term)

    result = {"peer": peer_name, "rows": {}, "errors": {}, "notes": {}}

    def save():
        with open(out_path + ".tmp", "w") as f:
            json.dump(result, f, default=repr)
        os.replace(out_path + ".tmp", out_path)

    try:
        if peer_name == "floor":
            import floor
            result["rows"].update(floor.measure(metrics, quick))
            save()
            return 0
        cls = PEER_CLASSES[peer_name]
        pool = [m for m in metrics if m in POOL_METRICS]
        if pool:
            peer = cls()
            try:
                peer.start()
                warm_up(peer)
                for m in pool:
                    print(f"[{peer_name}] {m} ...", file=sys.stderr, flush=True)
                    t0 = time.perf_counter()
                    try:
                        result["rows"].update(POOL_METRICS[m](peer, quick))
                    except Exception:
                        result["errors"][m] = traceback.format_exc()
                    result["notes"][f"{m}_elapsed_s"] = time.perf_counter() - t0
                    save()
                result["notes"].update(peer.notes)
            finally:
                peer.close()
        for m in metrics:
            if m in FRESH_METRICS:
                print(f"[{peer_name}] {m} ...", file=sys.stderr, flush=True)
                try:
                    result["rows"].update(FRESH_METRICS[m](cls, quick))
                except Exception:
                    result["errors"][m] = traceback.format_exc()
                save()
    except Exception:
        result["errors"]["setup"] = traceback.format_exc()
    save()
    return 0


# ---------------------------------------------------------------------------------------
# Parent
# ---------------------------------------------------------------------------------------

def _become_subreaper() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes
        PR_SET_CHILD_SUBREAPER = 36
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except Exception:
        return False


def _reap_zombies() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _leftovers(settle: float = 5.0) -> list:
    """Descendants still alive after a child finished (orphans reparented to us)."""
    import psutil
    me = psutil.Process()
    deadline = time.monotonic() + settle
    while True:
        _reap_zombies()
        alive = []
        for p in me.children(recursive=True):
            try:
                if p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
            except psutil.Error:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def run_child(peer: str, metrics: list, quick: bool, timeout: float) -> dict:
    import psutil
    fd, out_path = tempfile.mkstemp(prefix=f"bench-{peer}-", suffix=".json")
    os.close(fd)
    os.unlink(out_path)
    errf = tempfile.TemporaryFile(mode="w+")
    cmd = [sys.executable, os.path.abspath(__file__), "--child", peer, "--only", ",".join(metrics),
           "--out", out_path] + (["--quick"] if quick else [])
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=errf, stderr=errf, stdin=subprocess.DEVNULL, cwd=os.path.dirname(HERE))
    _CHILD_PIDS.add(proc.pid)
    hung = False
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        hung = True
        descendants = []
        try:
            descendants = psutil.Process(proc.pid).children(recursive=True)
        except psutil.Error:
            pass
        os.kill(proc.pid, signal.SIGUSR1)      # faulthandler: all thread stacks to stderr
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for p in descendants:
            try:
                p.kill()
            except psutil.Error:
                pass
    elapsed = time.monotonic() - t0
    errf.seek(0)
    log = errf.read()
    errf.close()
    try:
        with open(out_path) as f:
            res = json.load(f)
        os.unlink(out_path)
    except (OSError, ValueError):
        res = {"peer": peer, "rows": {}, "errors": {}, "notes": {}}
    if hung:
        res["errors"]["timeout"] = f"child did not finish in {timeout:g} s; its stacks:\n" + log[-6000:]
    elif proc.returncode != 0:
        res["errors"]["exit"] = f"child exited with {proc.returncode}:\n" + log[-4000:]
    res["log_tail"] = log[-3000:]
    res["elapsed_s"] = elapsed
    left = _leftovers()
    if left:
        res["errors"]["leaked_processes"] = [
            {"pid": p.pid, "cmd": " ".join(p.cmdline())[:200]} for p in left if p.is_running()]
        for p in left:
            try:
                p.kill()
            except psutil.Error:
                pass
        _leftovers(2.0)
    return res


_HIGHER = {row: higher for row, _label, _unit, higher, _targets in ROWS}


def _keep_best(rows: dict, new: dict) -> None:
    """Merge a pass's rows into ``rows``: per row, the better value (every pass's in "passes")."""
    for row, entry in new.items():
        old = rows.get(row)
        v_old = old.get("value") if isinstance(old, dict) else None
        v_new = entry.get("value") if isinstance(entry, dict) else None
        if old is None or v_old is None or row not in _HIGHER:
            rows[row] = entry
            continue
        seen = old.get("passes", [v_old]) + [v_new]
        if v_new is not None and (v_new > v_old if _HIGHER[row] else v_new < v_old):
            rows[row] = dict(entry)
        rows[row]["passes"] = seen


def fmt(v, unit) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, str):
        return v
    if unit in ("tasks/s", "µs", "B"):
        return f"{v:,.0f}"
    if unit == "MB":
        return f"{v:.1f}"
    if unit == "s":
        return f"{v:.3f}"
    return f"{v:.2f}"


def ratio(lc, other, higher) -> "float | None":
    if lc is None or other is None or lc <= 0 or other <= 0:
        return None
    return lc / other if higher else other / lc


def build_table(results: dict, peers: list) -> list:
    rows_out = []
    for row, label, unit, higher, targets in ROWS:
        values = {}
        cells = {}
        for p in peers:
            entry = results.get(p, {}).get("rows", {}).get(row)
            v = entry.get("value") if isinstance(entry, dict) else None
            values[p] = v
            cells[p] = fmt(v, unit) if v is not None else (entry.get("note", "n/a") if isinstance(entry, dict) else "-")
        if all(v is None for v in values.values()) and all(c == "-" for c in cells.values()):
            continue
        lc = values.get("localcluster")
        others = {p: v for p, v in values.items() if p != "localcluster" and p not in NOT_A_PEER and v is not None}
        best_peer = (max if higher else min)(others, key=others.get) if others else None
        checks = []
        for ref, least in targets:
            if ref in ("max", "min"):          # an absolute bound on localcluster's own figure
                met = None if lc is None else (lc <= least if ref == "max" else lc >= least)
                checks.append({"reference": ref, "bound": least, "ratio": None, "met": met})
                continue
            r = ratio(lc, values.get(ref), higher)
            checks.append({"reference": ref, "least_ratio": least, "ratio": r,
                           "met": None if r is None else r >= least})
        rows_out.append({"row": row, "metric": label, "unit": unit, "higher_is_better": higher,
                         "target": target_text(targets, higher), "targets": checks, "values": values,
                         "cells": cells, "best_peer": best_peer,
                         "lc_vs_best_peer": ratio(lc, others.get(best_peer), higher) if best_peer else None,
                         "lc_vs_ppe": ratio(lc, values.get("ppe"), higher),
                         "lc_vs_ppe_spawn": ratio(lc, values.get("ppe_spawn"), higher),
                         "lc_vs_floor": ratio(lc, values.get("floor"), higher)})
    return rows_out


def _verdict(r: dict) -> str:
    met = [c["met"] for c in r["targets"]]
    if not met:
        return "-"
    if None in met:
        return "n/a"
    return "met" if all(met) else "MISSED"


def render(rows: list, peers: list) -> str:
    head = (["metric", "unit"] + [PEER_TITLES[p] for p in peers]
            + ["LC vs best peer", "LC vs PPE(spawn)", "LC vs floor", "target", "met?"])
    lines = []
    for r in rows:
        rb = f"{r['lc_vs_best_peer']:.2f}x ({PEER_TITLES[r['best_peer']]})" if r["lc_vs_best_peer"] else "-"
        rs = f"{r['lc_vs_ppe_spawn']:.2f}x" if r["lc_vs_ppe_spawn"] else "-"
        rf = f"{r['lc_vs_floor']:.2f}x" if r["lc_vs_floor"] else "-"
        lines.append([r["metric"], r["unit"]] + [r["cells"][p] for p in peers]
                     + [rb, rs, rf, r["target"] or "-", _verdict(r)])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines)]
    out = ["| " + " | ".join(h.ljust(w) for h, w in zip(head, widths)) + " |",
           "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    for l in lines:
        out.append("| " + " | ".join(str(c).ljust(w) for c, w in zip(l, widths)) + " |")
    return "\n".join(out)


def chart(rows: list, path: str) -> "str | None":
    """A PNG: for each metric with a target, localcluster's ratio against each reference
    (log scale, > 1 better), with the target's least ratio marked. None without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    bars = [(f"{r['metric']} vs {PEER_TITLES[c['reference']]}", c["ratio"], c["least_ratio"], c["met"])
            for r in rows for c in r["targets"] if c["ratio"]]
    if not bars:
        return None
    fig, ax = plt.subplots(figsize=(9, 0.42 * len(bars) + 1.2))
    ys = range(len(bars))
    ax.barh(ys, [b[1] for b in bars], color=["#43a047" if b[3] else "#e53935" for b in bars])
    ax.scatter([b[2] for b in bars], ys, marker="|", s=400, color="black", zorder=3, label="target")
    ax.set_yticks(list(ys), [b[0] for b in bars], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.axvline(1.0, color="#9e9e9e", linewidth=0.8)
    ax.set_xlabel("localcluster's ratio (> 1: better than the reference); green: target met")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


_CHILD_PIDS: set = set()


def count_localcluster_procs(mine_only: bool = True) -> int:
    """localcluster worker processes alive; ``mine_only``: those started by this run's
    children (their command line carries the parent pid), so that another session's
    clusters on the same machine are not counted."""
    try:
        import psutil
    except ImportError:
        return -1
    n = 0
    for p in psutil.process_iter(["cmdline"]):
        try:
            cmd = p.info["cmdline"] or ()
            if p.pid == os.getpid() or "localcluster.worker" not in " ".join(cmd):
                continue
            if mine_only:
                try:
                    if json.loads(cmd[-1]).get("parent_pid") not in _CHILD_PIDS:
                        continue
                except (ValueError, AttributeError, IndexError):
                    continue
            n += 1
        except psutil.Error:
            pass
    return n


def _compile_localcluster() -> None:
    """Write localcluster's bytecode, as ``pip install`` does for a regular install. An
    editable install has none until a first import writes it, and none at all under
    PYTHONDONTWRITEBYTECODE (set on some CI machines): then every worker compiles the
    package from source as it starts (~17 ms here), while the floor's and the peers'
    packages, installed by pip, are compiled already."""
    import compileall
    import localcluster
    compileall.compile_dir(os.path.dirname(localcluster.__file__), quiet=1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller counts; whole run in about a minute")
    ap.add_argument("--only", default=None,
                    help=f"comma-separated metric names: {', '.join(ALL_METRICS)}")
    ap.add_argument("--peers", default=",".join(PEERS),
                    help=f"comma-separated, from {', '.join(PEERS + OPTIONAL_PEERS)} (default: {','.join(PEERS)})")
    ap.add_argument("--timeout", type=float, default=None,
                    help="seconds allowed per child run (default 120 quick, 600 full)")
    ap.add_argument("--output", default=RESULTS, help="JSON output path")
    ap.add_argument("--passes", type=int, default=None,
                    help="runs of the pool, startup and queue metrics per peer, in alternating peer order; "
                         "each row keeps its best (default 2 full, 1 quick)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    metrics = ALL_METRICS if not args.only else [m.strip() for m in args.only.split(",") if m.strip()]
    bad = [m for m in metrics if m not in ALL_METRICS]
    if bad:
        ap.error(f"unknown metric(s) {bad}; choose from {ALL_METRICS}")
    if args.child:
        return child_main(args.child, metrics, args.quick, args.out)

    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    if any(p not in PEERS + OPTIONAL_PEERS for p in peers):
        ap.error(f"unknown peer in {peers}; choose from {PEERS + OPTIONAL_PEERS}")
    timeout = args.timeout or (120.0 if args.quick else 600.0)
    _compile_localcluster()
    subreaper = _become_subreaper()
    lc_before = count_localcluster_procs(mine_only=False)
    load_before = os.getloadavg()
    if load_before[0] > 0.5 * (os.cpu_count() or 1):
        print(f"warning: load average {load_before[0]:.2f} on {os.cpu_count()} CPUs; something else is "
              f"running and the numbers will be noisy", file=sys.stderr)

    available, skipped = [], {}
    import importlib.util
    for p in peers:
        mod = {"localcluster": "localcluster", "ppe": "concurrent.futures", "loky": "loky",
               "dask": "distributed", "ppe_spawn": "concurrent.futures", "floor": "numpy"}[p]
        if importlib.util.find_spec(mod) is None:
            skipped[p] = f"{mod} is not importable"
            print(f"skipping {p}: {skipped[p]}", file=sys.stderr)
        else:
            available.append(p)

    passes = args.passes if args.passes is not None else (1 if args.quick else 2)
    if passes < 1:
        ap.error("--passes must be at least 1")
    t_start = time.monotonic()
    results: dict = {p: {"peer": p, "rows": {}, "errors": {}, "notes": {}} for p in available}
    # The REPEATED groups run in `passes` passes over the peers, in alternating order (A B C,
    # then C B A): a peer measured while the machine was briefly busy gets a second chance, and
    # every peer the same. Each row keeps its best pass.
    schedule = [(group, members, p) for group, members in GROUPS
                for i in range(passes if group in REPEATED else 1)
                for p in (available if i % 2 == 0 else available[::-1])]
    for group, members, p in schedule:
        todo = [m for m in members if m in metrics and p in ONLY_FOR.get(m, PEERS)
                and (p != "floor" or m in FLOOR_METRICS)]
        if not todo:
            continue
        print(f"== {p}: {', '.join(todo)}", file=sys.stderr, flush=True)
        res = run_child(p, todo, args.quick, timeout)
        _keep_best(results[p]["rows"], res["rows"])
        results[p]["errors"].update({f"{group}:{k}": v for k, v in res["errors"].items()})
        results[p]["notes"].update(res["notes"])
        spent = results[p].setdefault("elapsed_s", {})
        spent[group] = spent.get(group, 0.0) + res["elapsed_s"]
        results[p].setdefault("log_tail", {})[group] = res["log_tail"]
        for k, v in res["errors"].items():
            print(f"   !! {p} {group}/{k}: {str(v).strip().splitlines()[-1] if str(v).strip() else v}",
                  file=sys.stderr, flush=True)

    for p in skipped:
        results[p] = {"peer": p, "skipped": skipped[p], "rows": {}, "errors": {}, "notes": {}}
    rows = build_table(results, available)
    table = render(rows, available)
    # The chart is written beside the JSON, so its directory must exist first.
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    png = chart(rows, os.path.splitext(args.output)[0] + ".png")
    lc_after = count_localcluster_procs()
    lc_after_all = count_localcluster_procs(mine_only=False)
    import multiprocessing
    meta = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "quick": args.quick, "metrics": metrics, "peers": available, "skipped": skipped,
        "python": sys.version.split()[0], "platform": platform.platform(),
        "cpus": os.cpu_count(), "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "n_workers": N_WORKERS, "threads_per_worker": 1, "passes": {"groups": list(REPEATED), "count": passes},
        "ppe_start_method": results.get("ppe", {}).get("notes", {}).get("start_method",
                                                                       multiprocessing.get_start_method()),
        "versions": {p: results[p]["notes"].get("version") for p in available},
        "sizes": {k: {"quick": v[0], "full": v[1], "note": "(others, dask)"} for k, v in SIZES.items()},
        "aggregation": {"submit_tps": "best of R", "map_tps": "best of R", "rtt_*": "median / p90 of all samples",
                        "first_result_s/workers_up_s/close_s": "best of R, fresh pool each, best pass",
                        "queue_*": "one fresh pool a pass, best pass",
                        "bw_*": "best of R after a warm-up", "recovery_s": "median of R, fresh pool each",
                        "idle_*": "one sample after warm-up + 1 s idle"},
        "ratio_convention": "> 1 means localcluster is better (higher throughput or lower time/memory)",
        "localcluster_workers_system_wide_before_after": [lc_before, lc_after_all],
        "localcluster_workers_left_by_this_run": lc_after,
        "loadavg_before_after": [load_before, os.getloadavg()],
        "subreaper": subreaper,
        "elapsed_s": time.monotonic() - t_start,
    }
    with open(args.output, "w") as f:
        json.dump({"meta": meta, "table": rows, "text": table, "peers": results}, f, indent=1, default=repr)

    print(table)
    print(f"\nratios: > 1 means localcluster is better. PPE start method: {meta['ppe_start_method']}. "
          f"{'quick' if args.quick else 'full'} run, {meta['elapsed_s']:.0f} s; "
          f"localcluster workers left by this run: {lc_after} (system-wide before/after: "
          f"{lc_before}/{lc_after_all}); load average before/after: {load_before[0]:.2f}/"
          f"{os.getloadavg()[0]:.2f}. JSON: {args.output}" + (f", chart: {png}" if png else ""))
    problems = [(p, k, v) for p in available for k, v in results[p]["errors"].items()]
    for p, k, v in problems:
        print(f"\n--- {p} {k} ---\n{v if isinstance(v, str) else json.dumps(v, indent=1)}".rstrip())
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
