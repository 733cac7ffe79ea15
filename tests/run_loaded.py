"""Run the test suite many times in a row on a loaded machine.

    python tests/run_loaded.py [--runs 20] [--parallel 2] [--busy N] [-- pytest arguments]

Flaky timing shows up under load. ``--parallel`` suites run side by side (each is the
other's load: on 2 cores, two suites and their workers keep both busy), ``--busy``
processes spin on top (default: none with --parallel > 1, else one per core). The runs
are counted in the order they end; each prints one line (exit, time, pytest's summary,
the 1-minute load average at its end), a failing run its output, and the last line is
"N runs, F failures, load average min/median/max". Not collected by pytest.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--parallel", type=int, default=1)
    parser.add_argument("--busy", type=int, default=None)
    parser.add_argument("pytest_args", nargs="*", help="after --: arguments for pytest")
    args = parser.parse_args()
    if args.runs < 1 or args.parallel < 1:
        parser.error("--runs and --parallel take a positive number")
    busy = args.busy if args.busy is not None else (0 if args.parallel > 1 else os.cpu_count() or 1)
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    lock = threading.Lock()
    started = [0]
    results: list[int] = []
    loads: list[float] = []
    sampling = threading.Event()

    def sample_load() -> None:
        while not sampling.wait(10):
            loads.append(os.getloadavg()[0])

    def stream() -> None:
        while True:
            with lock:
                if started[0] >= args.runs:
                    return
                started[0] += 1
            t0 = time.monotonic()
            proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args.pytest_args],
                                  capture_output=True, text=True)
            tail = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "(no output)"
            with lock:
                results.append(proc.returncode)
                print(f"run {len(results)}: exit {proc.returncode} in {time.monotonic() - t0:.0f} s: {tail} "
                      f"(load {os.getloadavg()[0]:.1f})", flush=True)
                if proc.returncode != 0:
                    print(proc.stdout[-6000:], proc.stderr[-2000:], flush=True)

    sampler = threading.Thread(target=sample_load, daemon=True)
    sampler.start()
    try:
        streams = [threading.Thread(target=stream) for _ in range(args.parallel)]
        for t in streams:
            t.start()
        for t in streams:
            t.join()
    finally:
        sampling.set()
        for p in loops:
            p.kill()
            p.wait()
    failures = sum(1 for rc in results if rc != 0)
    spread = (f"{min(loads):.1f}/{statistics.median(loads):.1f}/{max(loads):.1f}" if loads else "n/a")
    print(f"{len(results)} runs, {failures} failures, load average min/median/max {spread}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
