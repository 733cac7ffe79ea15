"""Run the test suite several times in a row while every core is kept busy.

    python tests/run_loaded.py [--runs 10] [-- pytest arguments]

Flaky timing shows up on a loaded machine: this starts one busy-loop process per core,
runs pytest ``--runs`` times, always kills the loops, and prints one line per run and
a final "N runs, F failures". Not collected by pytest (no test_ prefix).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("pytest_args", nargs="*", help="after --: arguments for pytest")
    args = parser.parse_args()
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
    failures = 0
    try:
        for i in range(1, args.runs + 1):
            t0 = time.monotonic()
            proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args.pytest_args],
                                  capture_output=True, text=True)
            tail = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "(no output)"
            failures += proc.returncode != 0
            print(f"run {i}: exit {proc.returncode} in {time.monotonic() - t0:.0f} s: {tail}", flush=True)
            if proc.returncode != 0:
                print(proc.stdout[-4000:], flush=True)
    finally:
        for p in loops:
            p.kill()
            p.wait()
    print(f"{args.runs} runs, {failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
