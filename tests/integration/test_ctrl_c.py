"""Ctrl-C: a real SIGINT sent to a Python process blocked in gather, result(), wait, map
or scale raises KeyboardInterrupt in it within half a second, and the cluster stays
usable afterwards, then closes cleanly. The signal goes to a child interpreter running
a script, as it would from a terminal."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from _util import stop_session, wait_for

SCRIPT = textwrap.dedent('''
    import os, signal, sys, time
    # What a terminal gives. A test run started in the background by a shell without job
    # control (`cmd &`) hands SIGINT down ignored, and Python then installs no handler.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    import localcluster
    from localcluster import Client, LocalCluster

    def until(path):
        while not os.path.exists(path):
            time.sleep(0.01)

    def inc(x):
        return x + 1

    phase, marker = sys.argv[1], sys.argv[2]
    with LocalCluster(n_workers=1, forward_logs=False) as cluster, Client(cluster) as client:
        blocked = client.submit(until, marker, pure=False)
        calls = {
            "result": lambda: blocked.result(),
            "gather": lambda: client.gather([blocked, client.submit(inc, 1)]),
            "wait": lambda: localcluster.wait([blocked]),
            "map": lambda: [client.map(inc, range(200_000)) for _ in range(100)],
            "scale": lambda: cluster.scale(40),
        }
        try:
            print("go", flush=True)      # inside the try: a signal right after it is still caught
            calls[phase]()
            print("returned", flush=True)
        except KeyboardInterrupt:
            print(f"interrupted {time.monotonic():.6f}", flush=True)
        open(marker, "w").close()
        assert blocked.result(30) is None
        assert client.submit(inc, 41).result(30) == 42
        print("usable", flush=True)
    print("closed", flush=True)
''')


def _main_thread(pid: int) -> tuple:
    """(state, CPU ticks) of the process's main thread, from /proc."""
    with open(f"/proc/{pid}/task/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return fields[0], int(fields[11]) + int(fields[12])


def _in_the_call(pid: int, phase: str, ticks_at_go: int) -> bool:
    """The blocking calls put the main thread to sleep in its wait; map keeps it computing."""
    state, ticks = _main_thread(pid)
    return ticks > ticks_at_go + 5 if phase == "map" else state == "S"


@pytest.mark.parametrize("phase", ["result", "gather", "wait", "map", pytest.param("scale", marks=pytest.mark.slow)])
def test_ctrl_c_interrupts_the_call_and_the_cluster_stays_usable(tmp_path, phase):
    script = tmp_path / "ctrl_c.py"
    script.write_text(SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), phase, str(tmp_path / "marker")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "go"
        _state, ticks = _main_thread(proc.pid)
        wait_for(lambda: _in_the_call(proc.pid, phase, ticks))
        sent = time.monotonic()
        os.kill(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=30)     # under pytest-timeout's 60 s, so finally runs
    finally:
        stop_session(proc)
    lines = out.split()
    assert proc.returncode == 0, err
    assert "interrupted" in lines, (out, err)
    latency = float(lines[lines.index("interrupted") + 1]) - sent
    assert latency < 0.5, f"KeyboardInterrupt came {latency:.3f} s after SIGINT"
    assert out.rstrip().endswith("usable\nclosed"), out
