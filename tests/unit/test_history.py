"""The cluster's history without processes: the task stream and the memory series."""
from __future__ import annotations

import gc

import pytest

from localcluster.engine import history
from localcluster.engine.history import History, TaskRecord

pytestmark = pytest.mark.timeout(30)


def test_tasks_come_back_as_records_in_the_order_their_ends_were_seen():
    h = History()
    h.task("a", "worker-0", 1, 10.0, 10.5, "finished")
    h.task("b", "worker-1", 2, 10.1, 10.2, "lost")
    got = h.tasks()
    assert got == [TaskRecord("a", "worker-0", 1, 10.0, 10.5, "finished"),
                   TaskRecord("b", "worker-1", 2, 10.1, 10.2, "lost")]
    assert all(type(r) is TaskRecord for r in got)
    assert got[1].worker == "worker-1" and got[1].status == "lost"
    got.clear()                                         # a copy: the stream is untouched
    assert len(h.tasks()) == 2


def test_the_task_stream_keeps_the_newest(monkeypatch):
    monkeypatch.setattr(history, "TASKS", 5)
    h = History()
    for i in range(12):
        h.task(f"k{i}", "w", 1, float(i), float(i) + 1, "finished")
    assert [r.key for r in h.tasks()] == ["k7", "k8", "k9", "k10", "k11"]


def test_kept_task_records_are_not_left_to_the_cyclic_collector():
    # 100,000 records a cluster keeps must not be traversed by every full collection of the
    # user's process: once collected, the stored records are no longer tracked.
    h = History()
    keys = [f"key-{i}" for i in range(5000)]
    gc.collect()
    before = len(gc.get_objects())
    for i, key in enumerate(keys):
        h.task(key, "worker-0", 1, float(i), float(i) + 0.5, "finished")
    gc.collect()
    assert len(gc.get_objects()) - before < 100          # a NamedTuple per record: +5,000


def test_a_full_series_halves_its_resolution_and_keeps_each_pairs_larger_sample(monkeypatch):
    monkeypatch.setattr(history, "POINTS", 8)
    h = History()
    for i in range(8):
        h.sample("w", float(i), 100 if i == 5 else i)
    points = h.memory()["w"]
    assert len(points) == 4 and (5.0, 100) in points     # the spike survives the halving
    assert [v for _, v in points] == [1, 3, 100, 7]
    h.sample("w", 8.0, 1)                                # stride 2: held, not yet kept
    assert h.memory()["w"][-1] == (8.0, 1)               # ...but readers see it


def test_dead_workers_series_are_bounded(monkeypatch):
    monkeypatch.setattr(history, "DEAD_WORKERS", 2)
    h = History()
    for name in ("w0", "w1", "w2", "live"):
        h.sample(name, 1.0, 10)
    for name in ("w0", "w1", "w2"):
        h.died(name)
    assert sorted(h.memory()) == ["live", "w1", "w2"]


def test_a_run_a_task_submitted_names_its_submitter():
    h = History()
    h.task("child-1", "worker-0", 1, 10.0, 10.5, "finished", submitter="parent-1")
    h.task("parent-1", "worker-0", 2, 9.0, 11.0, "finished")
    child, parent = h.tasks()
    assert child.submitter == "parent-1" and parent.submitter is None
    assert child == TaskRecord("child-1", "worker-0", 1, 10.0, 10.5, "finished", submitter="parent-1")


@pytest.mark.parametrize("ended", [0, 1, 3, 4, 6, 50])
def test_the_tail_holds_the_newest_ended_runs_with_the_lost_runs_among_them(monkeypatch, ended):
    monkeypatch.setattr(history, "TASKS", 8)
    h = History()
    statuses = ["finished", "lost", "error", "finished", "lost", "lost", "finished", "finished", "lost", "finished"]
    for i, status in enumerate(statuses):
        h.task(f"k-{i}", "w-1", 1, float(i), i + 0.5, status)
    kept = [(f"k-{i}", s) for i, s in enumerate(statuses)][-8:]       # the stream keeps the newest 8
    want = []
    for key, status in reversed(kept):
        if sum(s != "lost" for _, s in want) == ended:
            break
        want.insert(0, (key, status))
    got = h.tail(ended, raw=True)
    assert [(r[0], r[5]) for r in got] == (want if ended else [])
    assert [r.key for r in h.tail(ended)] == [r[0] for r in got]          # the same, as TaskRecords


def test_done_and_failed_count_the_runs_the_scheduler_says_count():
    h = History()
    h.task("a", "w-1", 1, 0.0, 1.0, "finished")
    h.task("a", "w-1", 1, 1.0, 2.0, "finished", counts=False)     # a recompute
    h.task("r", "w-1", 1, 2.0, 3.0, "error", counts=False)        # failed with a retry left
    h.task("r", "w-1", 1, 3.0, 4.0, "finished")
    h.task("f", "w-1", 1, 4.0, 5.0, "error")
    h.task("l", "w-1", 1, 5.0, 6.0, "lost")
    assert (h.ended, h.done, h.failed) == (5, 2, 1)


def test_a_run_record_costs_a_few_dozen_bytes_not_a_tuple_and_its_floats():
    import tracemalloc
    h = History()
    keys = [f"key-{i}" for i in range(20_000)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i, key in enumerate(keys):
            h.task(key, "worker-0", 1, 1e9 + i, 1e9 + i + 0.5, "finished", serde=0.001 * i)
        per_record = (tracemalloc.get_traced_memory()[0] - before) / len(keys)
    finally:
        tracemalloc.stop()
    assert per_record < 48, per_record          # a tuple of seven and three floats: ~170; four references, ~60
    assert h.tasks()[-1] == TaskRecord("key-19999", "worker-0", 1, 1e9 + 19999, 1e9 + 19999.5, "finished", 19.999)


def test_records_alike_share_one_worker_status_thread_and_the_table_of_them_stays_small(monkeypatch):
    monkeypatch.setattr(history, "KINDS", 8)
    h = History()
    for i in range(100):        # workers come and go: 100 names, each once
        h.task(f"k{i}", f"worker-{i}", 1, 1.0, 2.0, "finished")
    h.task("again", "worker-99", 1, 3.0, 4.0, "finished")
    runs = h.tasks()
    assert [r.worker for r in runs[-3:]] == ["worker-98", "worker-99", "worker-99"]
    assert 1 <= len(h._tasks._kinds) <= 8
    names = h._tasks._names
    assert names[-1] is names[-3]          # the same tuple for the same worker, status and thread


def test_the_ring_forgets_the_submitter_of_a_record_it_writes_over(monkeypatch):
    monkeypatch.setattr(history, "TASKS", 4)
    h = History()
    for i in range(6):
        h.task(f"k{i}", "w", 1, float(i), i + 1.0, "finished", submitter="parent" if i in (1, 4) else None)
    assert [(r.key, r.submitter) for r in h.tasks()] == [("k2", None), ("k3", None), ("k4", "parent"), ("k5", None)]
    assert [r[0] for r in h.tail(3, raw=True)] == ["k3", "k4", "k5"]


def test_a_reader_racing_the_writer_gets_whole_records_in_order(monkeypatch):
    import sys
    import threading
    monkeypatch.setattr(history, "TASKS", 64)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)              # switch threads between nearly any two bytecodes
    h = History()
    stop = threading.Event()

    def write() -> None:
        i = 0
        while not stop.is_set():
            h.task(f"k{i}", f"w{i}", i, float(i), i + 0.5, "finished", serde=float(i),
                   submitter=f"p{i}" if i % 3 == 0 else None)
            i += 1
    writer = threading.Thread(target=write)
    writer.start()
    try:
        for _ in range(300):
            for rows in (h.tasks(), h.tail(40, raw=True)):
                numbers = [int(r[0][1:]) for r in rows]
                assert numbers == list(range(numbers[0], numbers[0] + len(numbers))) if rows else True
                for r, i in zip(rows, numbers):
                    assert r[1:7] == (f"w{i}", i, float(i), i + 0.5, "finished", float(i))
                    assert (r[7:] if len(r) > 7 else (None,))[0] == (f"p{i}" if i % 3 == 0 else None)
    finally:
        stop.set()
        writer.join()
        sys.setswitchinterval(interval)
