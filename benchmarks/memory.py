#!/usr/bin/env python
"""How well localcluster's memory sampling works: interval reached, CPU cost, overshoot.

    python benchmarks/memory.py                 # full run, ~2 minutes
    python benchmarks/memory.py --quick         # ~30 s, fewer/shorter runs
    python benchmarks/memory.py --only interval,cpu,overshoot --seconds 10 --repeats 5

The parent samples each worker's RSS every ``memory_sample_interval`` seconds on
its scheduler thread and SIGKILLs a worker above ``memory_terminate`` (0.95) of
``memory_limit``. Three measurements:

1. interval   A 2-worker idle cluster with the default interval, for ``--seconds``
              (10 s): the gaps between consecutive samples of each worker, from
              ``cluster.workers[name].memory_history`` (samples taken inside the window).
2. cpu        The CPU time of the process that holds the cluster (time.process_time
              and psutil user/system) over ``--seconds`` of an idle 2-worker cluster, for
              memory_sample_interval = 1.0 (the baseline: sampling effectively off),
              0.05, 0.02 and 0.01, as % of one core; the scheduler thread's own CPU
              clock and the workers' CPU are shown too.
3. overshoot  ``n_workers=1, memory_limit="500MiB", allowed_failures=0``; a task stamps
              time.time() into a file, then allocates 1 GiB: "fast" = ``b"x" * (1 << 30)``
              (one malloc, memset touches every page), "gradual" = 10 MiB chunks
              (``b"x" * (10 << 20)``, each touched) with no pause. The death's
              ``.memory``/``.peak_memory`` (the last sample) is compared with the 0.95 x limit
              threshold, and so is the kernel's own peak RSS of the killed worker
              (``ru_maxrss`` of the reaped children of the process that ran the cluster:
              what the worker really reached, including what it touched between the
              sample and the SIGKILL). Time = the death's ``.time`` minus the task's stamp.
              ``--repeats`` (5) trials per (allocation, interval), interval in 0.01, 0.02,
              0.05, trials interleaved; min / median / max.

Every cluster runs in a fresh child interpreter (``memory.py --child KIND JSON``), one
at a time, inside ``with``; each child has a deadline (on expiry: SIGUSR1 = faulthandler
stacks, SIGTERM = close the cluster, SIGKILL). The parent is a Linux child subreaper:
anything a child leaves behind is re-parented to it, reported, and killed. At the end the
script checks that none of the worker pids it saw is alive, also among the
``ps aux | grep localcluster.worker`` lines (whose count before and after the run is printed;
other sessions' clusters show up there). Exit status 1 on any error or leftover process.
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

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MiB = 2 ** 20
LIMIT = 500 * MiB                 # "500MiB"
CHUNK = 10 * MiB
CPU_INTERVALS = (1.0, 0.05, 0.02, 0.01)
OVERSHOOT_INTERVALS = (0.01, 0.02, 0.05)
MODES = ("fast", "gradual")
SETTLE = 1.0                      # idle runs: seconds after start-up before the window opens


# ---------------------------------------------------------------------------------------
# Task functions (pickled by value: this module is __main__ in the child)
# ---------------------------------------------------------------------------------------

def alloc_fast(stamp):
    with open(stamp, "w") as f:
        f.write(repr(time.time()))
    hog = b"x" * (1 << 30)          # one 1 GiB malloc (mmap), memset touches every page
    return len(hog)


def alloc_gradual(stamp, chunk=CHUNK, total=1 << 30):
    with open(stamp, "w") as f:
        f.write(repr(time.time()))
    hog = []
    while len(hog) * chunk < total:
        hog.append(b"x" * chunk)     # each chunk touched by memset, no pause
    return len(hog) * chunk


# ---------------------------------------------------------------------------------------
# Children: one cluster each
# ---------------------------------------------------------------------------------------

def _quiet_logging() -> None:
    import logging
    log = logging.getLogger("localcluster")
    log.addHandler(logging.NullHandler())
    log.propagate = False


def child_idle(p: dict) -> dict:
    """An idle 2-worker cluster: CPU over the window and the sample timestamps."""
    import threading
    import psutil
    from localcluster import LocalCluster

    kw = {"n_workers": 2, "forward_logs": False}
    if p["interval"] is not None:
        kw["memory_sample_interval"] = p["interval"]
    me = psutil.Process()
    with LocalCluster(**kw) as cluster:
        interval = cluster.config["memory_sample_interval"]
        (sched,) = [t for t in threading.enumerate() if t.name == "localcluster-scheduler"]
        clock = time.pthread_getcpuclockid(sched.ident)
        time.sleep(p["settle"])
        infos = cluster.workers
        pids = [i.pid for i in infos.values()]
        procs = [psutil.Process(pid) for pid in pids]

        w0 = [sum(x.cpu_times()[:2]) for x in procs]
        ps0 = me.cpu_times()
        t0, pc0, th0 = time.time(), time.process_time(), time.clock_gettime(clock)
        time.sleep(p["seconds"])
        t1, pc1, th1 = time.time(), time.process_time(), time.clock_gettime(clock)
        ps1 = me.cpu_times()
        w1 = [sum(x.cpu_times()[:2]) for x in procs]

        infos = cluster.workers
        history = {name: [t for t, _rss in i.memory_history if t0 <= t <= t1] for name, i in infos.items()}
        rss = {name: i.memory for name, i in infos.items()}
        deaths = len(cluster.deaths)
    return {
        "interval": interval, "wall": t1 - t0, "process_cpu": pc1 - pc0,
        "user": ps1.user - ps0.user, "system": ps1.system - ps0.system,
        "scheduler_thread_cpu": th1 - th0, "workers_cpu": sum(w1) - sum(w0),
        "history": history, "rss": rss, "deaths": deaths, "pids": pids,
    }


def child_trial(p: dict) -> dict:
    """One fast/gradual 1 GiB allocation against a 500 MiB limit."""
    import resource
    from localcluster import Client, KilledWorker, LocalCluster

    stamp = os.path.join(p["tmp"], "start")
    fn = alloc_fast if p["mode"] == "fast" else alloc_gradual
    out: dict = {}
    with LocalCluster(n_workers=1, memory_limit="500MiB", allowed_failures=0,
                      memory_sample_interval=p["interval"], forward_logs=False) as cluster, \
            Client(cluster) as client:
        (info,) = cluster.workers.values()
        out["pids"] = [info.pid]
        out["baseline"] = info.memory
        out["threshold"] = cluster.config["memory_terminate"] * cluster.memory_limit
        fut = client.submit(fn, stamp, pure=False)
        try:
            out["result"] = fut.result(timeout=60)
            out["outcome"] = "finished (not killed)"
        except KilledWorker:
            out["outcome"] = "KilledWorker"
        except Exception as e:  # noqa: BLE001 - reported, not hidden
            out["outcome"] = f"{type(e).__name__}: {e}"[:300]
        out["raised_at"] = time.time()
        deadline = time.monotonic() + 10
        while not cluster.deaths and time.monotonic() < deadline:
            time.sleep(0.01)
        if cluster.deaths:
            d = cluster.deaths[0]
            out.update(cause=d.cause, memory=d.memory, peak_memory=d.peak_memory, death_time=d.time,
                       death_pid=d.pid, ndeaths=len(cluster.deaths))
        out["pids"] += [i.pid for i in cluster.workers.values()]
        try:
            with open(stamp) as f:
                out["started"] = float(f.read())
        except (OSError, ValueError):
            out["started"] = None
    # every worker of this process has been reaped by now (close() waits): the kernel's
    # peak RSS of the largest one, i.e. of the worker that was killed
    out["kernel_peak"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    return out


def child_main(kind: str, params: str) -> int:
    import faulthandler
    faulthandler.enable()
    faulthandler.register(signal.SIGUSR1, all_threads=True)

    def on_term(signum, frame):
        raise SystemExit(f"SIGTERM: deadline passed ({kind})")
    signal.signal(signal.SIGTERM, on_term)
    sys.path.insert(0, ROOT)
    _quiet_logging()
    p = json.loads(params)
    result = child_idle(p) if kind == "idle" else child_trial(p)
    print("RESULT " + json.dumps(result), flush=True)
    return 0


# ---------------------------------------------------------------------------------------
# Parent
# ---------------------------------------------------------------------------------------

# Child-process hygiene is bench.py's: one subreaper, one leftover check for both scripts.
from bench import _become_subreaper, _leftovers  # noqa: E402


class Run:
    def __init__(self) -> None:
        self.errors: list[str] = []
        self.leaked: list[str] = []
        self.pids: set[int] = set()

    def child(self, kind: str, params: dict, timeout: float) -> dict | None:
        import psutil
        cmd = [sys.executable, os.path.abspath(__file__), "--child", kind, json.dumps(params)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for sig, grace in ((signal.SIGUSR1, 1.0), (signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
                try:
                    proc.send_signal(sig)
                except ProcessLookupError:
                    pass
                try:
                    out, err = proc.communicate(timeout=grace)
                    break
                except subprocess.TimeoutExpired:
                    continue
            else:
                out, err = "", "(no output: the child did not die)"
            self.errors.append(f"{kind} {params}: timed out after {timeout:g} s\n{err[-4000:]}")
        for p in _leftovers():
            try:
                desc = f"pid {p.pid}: {' '.join(p.cmdline())[:150]}"
                p.kill()
            except psutil.Error:
                desc = f"pid {p.pid}"
            self.leaked.append(f"after {kind} {params}: {desc}")
        result = None
        for line in out.splitlines():
            if line.startswith("RESULT "):
                result = json.loads(line[len("RESULT "):])
        if result is None:
            if proc.returncode == 0 or not self.errors or kind not in self.errors[-1]:
                self.errors.append(f"{kind} {params}: exit code {proc.returncode}, no result\n{err[-4000:]}")
            return None
        self.pids.update(result.get("pids", []))
        return result


def _worker_ps_lines() -> list[str]:
    """``ps aux | grep localcluster.worker`` (without the grep itself)."""
    try:
        out = subprocess.run(["ps", "aux"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [l for l in out.splitlines() if "localcluster.worker" in l and "grep" not in l]


def _percentile(values: list, q: float) -> float:
    s = sorted(values)
    if not s:
        return float("nan")
    k = max(0, min(len(s) - 1, int(round(q / 100 * len(s) + 0.5)) - 1))   # nearest rank
    return s[k]


def _gaps(history: dict) -> list[float]:
    out = []
    for times in history.values():
        out += [b - a for a, b in zip(times, times[1:])]
    return out


def _mmm(values: list, fmt: str = "{:.1f}") -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    return " / ".join(fmt.format(v) for v in (min(values), statistics.median(values), max(values)))


def _table(headers: list, rows: list) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]

    def line(cells: list) -> str:
        return "  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows])


def _machine() -> str:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            thp = f.read().strip()
    except OSError:
        thp = "?"
    import psutil
    return (f"Python {platform.python_version()}, {platform.system()} {platform.release()}, "
            f"{os.cpu_count()} CPUs, {psutil.virtual_memory().total / 2**30:.1f} GiB RAM, THP {thp}, "
            f"load average {os.getloadavg()[0]:.2f}")


def measure_interval(run: Run, seconds: float) -> dict:
    print(f"\n## 1. Sampling interval reached (2 idle workers, default interval, {seconds:g} s)\n", flush=True)
    r = run.child("idle", {"interval": None, "seconds": seconds, "settle": SETTLE}, timeout=seconds + 90)
    if r is None:
        print("failed (see errors below)")
        return {}
    gaps = [g * 1000 for g in _gaps(r["history"])]
    per_worker = {name: len(t) for name, t in r["history"].items()}
    iv = r["interval"] * 1000
    print(_table(["configured", "samples/worker", "mean gap", "median", "p99", "max", "min"],
                 [[f"{iv:g} ms", " + ".join(str(n) for n in per_worker.values()),
                   f"{statistics.mean(gaps):.2f} ms", f"{statistics.median(gaps):.2f} ms",
                   f"{_percentile(gaps, 99):.2f} ms", f"{max(gaps):.2f} ms", f"{min(gaps):.2f} ms"]]))
    late = sum(1 for g in gaps if g > 1.5 * iv)
    print(f"\n{len(gaps)} gaps over {r['wall']:.2f} s; {late} longer than 1.5x the interval; "
          f"ideal count {r['wall'] / r['interval']:.0f} per worker.")
    return r


def measure_cpu(run: Run, seconds: float) -> dict:
    print(f"\n## 2. CPU cost of sampling (2 idle workers, {seconds:g} s per interval)\n", flush=True)
    res = {}
    for iv in CPU_INTERVALS:
        r = run.child("idle", {"interval": iv, "seconds": seconds, "settle": SETTLE}, timeout=seconds + 90)
        if r is not None:
            res[iv] = r
    base = res.get(1.0)
    rows = []
    for iv, r in res.items():
        wall = r["wall"]
        ticks = sum(len(t) for t in r["history"].values())   # worker samples in the window
        gaps = [g * 1000 for g in _gaps(r["history"])]
        extra = extra_per_sample = "-"
        if base is not None and iv != 1.0:
            d = r["process_cpu"] / wall - base["process_cpu"] / base["wall"]
            extra = f"{100 * d:+.2f}"
            dn = ticks / wall - sum(len(t) for t in base["history"].values()) / base["wall"]
            if dn > 0:
                extra_per_sample = f"{1e6 * d / dn:.0f}"
        rows.append([f"{iv:g} s", f"{ticks / wall:.1f}",
                     f"{statistics.mean(gaps):.2f} / {_percentile(gaps, 99):.2f}" if gaps else "-",
                     f"{r['process_cpu']:.3f}", f"{r['user']:.2f} + {r['system']:.2f}",
                     f"{100 * r['process_cpu'] / wall:.2f}", extra,
                     f"{100 * r['scheduler_thread_cpu'] / wall:.2f}", extra_per_sample,
                     f"{100 * r['workers_cpu'] / wall:.2f}"])
    print(_table(["interval", "samples/s", "gap mean/p99 ms", "parent CPU s", "user + sys s",
                  "% of a core", "vs 1.0 s (pp)", "sched. thread %", "µs/extra sample", "workers' CPU %"],
                 rows))
    print("\n'samples/s' counts worker samples (2 per tick); 'µs/extra sample' = the extra parent CPU "
          "over the 1.0 s baseline divided by the extra samples taken; user + sys from psutil (10 ms ticks), "
          "'parent CPU s' from time.process_time().")
    return res


def measure_overshoot(run: Run, repeats: int) -> dict:
    print(f"\n## 3. Overshoot of a 1 GiB allocation (1 worker, memory_limit=500MiB, allowed_failures=0, "
          f"{repeats} trials each)\n", flush=True)
    configs = [(mode, iv) for mode in MODES for iv in OVERSHOOT_INTERVALS]
    trials: dict = {c: [] for c in configs}
    with tempfile.TemporaryDirectory(prefix="lc-memory-bench-") as tmp:
        for i in range(repeats):                     # interleaved: drift spreads over all configs
            for mode, iv in configs:
                d = os.path.join(tmp, f"{mode}-{iv}-{i}")
                os.mkdir(d)
                r = run.child("trial", {"mode": mode, "interval": iv, "tmp": d}, timeout=120)
                if r is not None:
                    trials[(mode, iv)].append(r)
    rows, raw = [], []
    threshold = None
    for (mode, iv), rs in trials.items():
        killed = [r for r in rs if r.get("cause") == "memory-limit" and r.get("outcome") == "KilledWorker"]
        for r in rs:
            if r not in killed:
                run.errors.append(f"trial {mode} {iv}: outcome {r.get('outcome')}, cause {r.get('cause')}")
        if not killed:
            rows.append([mode, f"{iv:g} s", f"0/{len(rs)}"] + ["-"] * 7)
            continue
        threshold = killed[0]["threshold"]
        over = [(r["memory"] - r["threshold"]) / MiB for r in killed]
        peak = [(r["peak_memory"] - r["threshold"]) / MiB for r in killed]
        kern = [(r["kernel_peak"] - r["threshold"]) / MiB for r in killed]
        t = [r["death_time"] - r["started"] for r in killed if r.get("started")]
        rate = [(r["memory"] - r["baseline"]) / MiB / (r["death_time"] - r["started"])
                for r in killed if r.get("started") and r.get("baseline")]
        notify = [1000 * (r["raised_at"] - r["death_time"]) for r in killed]
        rows.append([mode, f"{iv:g} s", f"{len(killed)}/{len(rs)}", _mmm(over), _mmm(peak), _mmm(kern),
                     _mmm(t, "{:.2f}"), f"{statistics.median(rate):.0f}" if rate else "-",
                     f"{statistics.median(rate) * iv:.0f}" if rate else "-", _mmm(notify, "{:.1f}")])
        raw.append(f"  {mode:7} {iv:g} s: sampled +MiB {[round(x, 1) for x in over]}, "
                   f"kernel +MiB {[round(x, 1) for x in kern]}, s {[round(x, 2) for x in t]}")
    print(_table(["alloc", "interval", "killed", ".memory - thr MiB", ".peak_memory - thr",
                  "kernel peak - thr", "start->death s", "rate MiB/s", "rate x interval MiB",
                  "death->KilledWorker ms"], rows))
    thr = f"{threshold / MiB:.1f} MiB" if threshold else "0.95 x 500 MiB"
    print(f"\nthreshold thr = memory_terminate x limit = {thr}; cells are min / median / max. "
          "'kernel peak' = ru_maxrss of the killed worker (what it really reached); 'rate' = "
          "(.memory - RSS before the task) / (start->death), the allocation speed seen by the sampler; "
          "'rate x interval' = the most one interval can overshoot at that speed; "
          "'death->KilledWorker' = from the death record to the client's exception.\n")
    print("\n".join(raw))
    return trials


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--child", nargs=2, metavar=("KIND", "JSON"), help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="3 s windows, 2 trials per configuration")
    ap.add_argument("--only", default="interval,cpu,overshoot", help="comma-separated: interval,cpu,overshoot")
    ap.add_argument("--seconds", type=float, default=None, help="idle window (default 10, quick 3)")
    ap.add_argument("--repeats", type=int, default=None, help="trials per overshoot configuration (default 5, quick 2)")
    ap.add_argument("--json", default=None, help="also write the raw results to this path")
    args = ap.parse_args()
    if args.child:
        return child_main(*args.child)

    seconds = args.seconds or (3.0 if args.quick else 10.0)
    repeats = args.repeats or (2 if args.quick else 5)
    only = {x.strip() for x in args.only.split(",") if x.strip()}
    unknown = only - {"interval", "cpu", "overshoot"}
    if unknown:
        ap.error(f"unknown --only names: {', '.join(sorted(unknown))}")

    subreaper = _become_subreaper()
    before = _worker_ps_lines()
    started = time.monotonic()
    print(f"# localcluster memory sampling benchmark\n\n{_machine()}; subreaper: {subreaper}; "
          f"localcluster.worker processes already running: {len(before)}")
    run = Run()
    results: dict = {}
    if "interval" in only:
        results["interval"] = measure_interval(run, seconds)
    if "cpu" in only:
        results["cpu"] = {str(k): v for k, v in measure_cpu(run, seconds).items()}
    if "overshoot" in only:
        results["overshoot"] = {f"{m} {iv}": v for (m, iv), v in measure_overshoot(run, repeats).items()}

    import psutil
    alive = []
    for pid in sorted(run.pids):
        try:
            cmd = " ".join(psutil.Process(pid).cmdline())
        except psutil.Error:
            continue
        if "localcluster.worker" in cmd:
            alive.append(pid)
    after = _worker_ps_lines()
    ours = [l for l in after if l.split()[1].isdigit() and int(l.split()[1]) in run.pids]
    print(f"\n## Leftovers\n\nworker pids seen: {len(run.pids)}, still alive: {len(alive)}; processes left "
          f"behind by children: {len(run.leaked)}; `ps aux | grep localcluster.worker`: {len(after)} line(s) "
          f"now ({len(ours)} of them this run's), {len(before)} before the run (other sessions' clusters "
          f"count there too).")
    for line in run.leaked + [f"worker still alive: pid {p}" for p in alive]:
        print("  LEAK " + line)
    if run.errors:
        print(f"\n## Errors ({len(run.errors)})\n")
        for e in run.errors:
            print(e.rstrip() + "\n")
    print(f"\ntotal {time.monotonic() - started:.0f} s, load average at the end {os.getloadavg()[0]:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": results, "errors": run.errors, "leaked": run.leaked + alive}, f, indent=1)
    return 1 if run.errors or run.leaked or alive or ours else 0


if __name__ == "__main__":
    sys.exit(main())
