"""The three defects a new user saw in the pictures, each drawn without processes: death
labels that overlap, a fresh timeline reading "0.0 s" on every tick, a legend that lists
only the workers sampled so far."""
from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from localcluster.views import render

pytestmark = pytest.mark.timeout(30)

MiB = 2**20


def _death(t, cause, worker="worker-0"):
    return SimpleNamespace(worker=worker, time=t, cause=cause, memory=100 * MiB, signal=None)


def _labels(svg):
    """(x, anchor, y, text) of every death label drawn."""
    return [(float(x), anchor, float(y), text) for x, y, anchor, text in re.findall(
        r'<text class="lc-death-label" x="([\d.]+)" y="([\d.]+)" fill="[^"]+" text-anchor="(\w+)">([^<]+)</text>', svg)]


@pytest.mark.parametrize("n", [3, 4, 6])
def test_death_labels_close_in_time_never_overlap(n):
    # the report of examples/report.py: a memory kill and crashes within a few ms, ~10 s in
    causes = ["memory-limit", "crash", "crash", "memory-limit", "crash", "crash"][:n]
    deaths = [_death(1000.0 + 10 + 0.01 * i, c, f"worker-{i}") for i, c in enumerate(causes)]
    series = {"worker-0": [(1000.0, 50 * MiB), (1020.0, 60 * MiB)]}
    svg = render.memory_timeline(series, 400 * MiB, {}, deaths, span=(1000.0, 1020.0), width=900, height=220)
    labels = _labels(svg)
    assert len(labels) == n
    boxes = []
    for x, anchor, y, text in labels:
        a, b = render.label_extent(x + 3 if anchor == "end" else x - 3, len(text), anchor == "end")
        boxes.append((a, b, y))
    for i, (a, b, y) in enumerate(boxes):
        for c, d, yy in boxes[i + 1:]:
            assert y != yy or b <= c or a >= d, (labels, boxes)


def test_labels_far_apart_share_the_top_row():
    rows = render.label_rows([(100.0, 5, False), (400.0, 5, False), (102.0, 12, False)], 5)
    assert rows == [0, 0, 1]
    assert render.label_rows([(100.0, 5, False)] * 3, 2) == [0, 1, None]     # no room: marker only


def test_a_fresh_timeline_does_not_read_zero_on_every_tick():
    # one sample per worker, a few ms apart: the first repr of a new cluster in a notebook
    series = {"worker-0": [(1000.000, 30 * MiB)], "worker-1": [(1000.004, 31 * MiB)]}
    svg = render.memory_timeline(series, 400 * MiB, {}, [])
    ticks = re.findall(r'<text class="lc-tick"[^>]*>([^<]+)</text>', svg)
    assert len(ticks) == 6 and len(set(ticks)) == 6, ticks
    stream = render.task_stream([("worker-0", 1)], [], [], (1000.0, 1000.003))
    ticks = re.findall(r'<text class="lc-tick"[^>]*>([^<]+)</text>', stream)
    assert len(ticks) == 7 and len(set(ticks)) == 7, ticks
    assert render.tick_labels(0.0, 10.0, 5) == ["0.0 s", "2.0 s", "4.0 s", "6.0 s", "8.0 s", "10.0 s"]


def test_the_first_legend_lists_every_worker():
    # worker-1 started a moment later and has no memory sample yet
    workers = [SimpleNamespace(name=f"worker-{i}", pid=100 + i, status="running", processing=(), memory=30 * MiB,
                               memory_limit=400 * MiB, managed=0, spilled=0, unmanaged=30 * MiB) for i in range(2)]
    html = render.cluster_view("c", workers, {}, {"worker-0": [(1000.0, 30 * MiB)]}, [], 400 * MiB)
    assert re.findall(r'<text class="lc-legend-name"[^>]*>([^<]+)</text>', html) == ["worker-0", "worker-1"]
