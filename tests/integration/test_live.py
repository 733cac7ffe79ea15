"""The live views: the dashboard widget (its parts change by themselves while work runs),
insights (where each worker's time went), and the terminal's status block."""
from __future__ import annotations

import io
import os
import re
import signal
import sys
import time
from types import SimpleNamespace

import pytest

import localcluster
from localcluster.views import dashboard as dash
from localcluster.views.insights import insights
from localcluster.views.live import live, status_lines
from tests._util import wait_for

pytestmark = pytest.mark.timeout(60)


def nap(x):
    time.sleep(0.1)
    return x


@pytest.mark.slow
def test_the_dashboard_is_a_widget_that_redraws_itself(cluster, client):
    widgets = pytest.importorskip("ipywidgets")
    view = cluster.dashboard(interval=0.2)
    try:
        assert isinstance(view, widgets.Widget)
        assert cluster.dashboard() is view               # one live view per cluster, shared by every cell
        before = view.header.value
        futures = client.map(nap, range(6))
        client.gather(futures)
        # nobody calls anything: the widget's thread redraws it every ~2 s (later, loaded)
        wait_for(lambda: '<b class="lc-done">6</b> done' in view.header.value, timeout=10)
        assert view.header.value != before
        workers = view.parts[0].value
        assert all(name in workers for name in cluster.workers) and "lc-splitbar" in workers
        assert view.parts[1].value == view.parts[2].value == view.parts[3].value == ""   # drawn when shown
        view.tabs.selected_index = dash.TABS.index("progress")
        wait_for(lambda: re.search(r"<code>nap</code>.*?<td[^>]*>6</td>", view.parts[1].value), timeout=10)
        view.tabs.selected_index = dash.TABS.index("task stream")
        wait_for(lambda: view.parts[2].value.count('class="lc-task"') == 6, timeout=10)
        view.tabs.selected_index = dash.TABS.index("insights")
        wait_for(lambda: "lc-insights" in view.parts[3].value, timeout=10)
    finally:
        view.close()
    assert view.closed and not view._thread.is_alive()


def test_a_costly_refresh_waits_a_hundred_times_its_cpu_time(cluster, monkeypatch):
    pytest.importorskip("ipywidgets")
    real = dash.Snapshot.take

    def costly(self, tab="workers"):
        t = time.thread_time()
        while time.thread_time() - t < 0.02:      # 20 ms of CPU: the next refresh waits 2 s
            pass
        return real(self, tab)

    monkeypatch.setattr(dash.Snapshot, "take", costly)
    view = cluster.dashboard(interval=0.01)
    try:
        wait_for(lambda: view.refreshes >= 2, timeout=10)    # the first draw, then the thread's first
        seen = view.refreshes
        time.sleep(1.0)      # nothing to wait for: the point is that no refresh comes (~30 without the rule)
        assert view.refreshes == seen
    finally:
        view.close()


def test_the_dashboard_thread_ends_with_its_cluster():
    pytest.importorskip("ipywidgets")
    with localcluster.LocalCluster(n_workers=1, forward_logs=False) as cluster:
        view = cluster.dashboard(interval=0.05)
    wait_for(lambda: view.closed, timeout=30)       # its thread's last act, after its last drawing
    # The last drawing shows the cluster ended: closed, or stopped when a loaded machine's
    # refresh came between the scheduler thread's stop and close()'s end.
    assert re.search(r"\b(closed|stopped)\b", view.header.value), view.header.value
    view.close()


def test_without_ipywidgets_the_dashboard_is_the_static_view(cluster, monkeypatch):
    monkeypatch.setitem(sys.modules, "ipywidgets", None)
    view = cluster.dashboard()
    assert isinstance(view, dash.StaticView) and 'class="lc-cluster"' in view._repr_html_()
    assert cluster._repr_mimebundle_() is None            # outside a kernel: IPython asks _repr_html_


@pytest.mark.slow
def test_insights_of_twenty_tasks_of_a_tenth_of_a_second(cluster, client):
    futures = client.map(nap, range(20))
    client.gather(futures)
    ins = cluster.insights()
    assert ins.tasks == 20 and sum(w.tasks for w in ins.workers) == 20
    assert 1.9 <= ins.busy <= 2.6, ins.busy
    assert {w.name for w in ins.workers} == set(cluster.workers)
    assert all(w.startup is not None and 0 < w.startup < 30 for w in ins.workers)
    assert all(w.idle >= 0 and w.serde >= 0 and w.lost == 0 for w in ins.workers)
    assert ins.slowest[0].duration >= 0.1 and ins.slowest[0].worker in cluster.workers
    assert re.fullmatch(r"\d+", ins.slowest[0].args)               # its argument, held while futures live
    text = str(ins)
    assert text.splitlines()[0].split()[:3] == ["worker", "tasks", "busy"] and "slowest tasks:" in text
    assert 'class="lc-insights"' in ins._repr_html_() and 'class="lc-slowest"' in ins.html()


def test_insights_count_what_a_death_cut_short():
    from types import SimpleNamespace as NS
    from localcluster.engine.history import TaskRecord
    records = [TaskRecord("f-1", "worker-0", 1, 100.0, 101.0, "finished", 0.25),
               TaskRecord("g-1", "worker-0", 1, 101.0, 104.0, "lost")]
    death = NS(worker="worker-0", time=104.0, cause="memory-limit")
    ins = insights(records, [("worker-0", 99.0, 0.5)], [death], threads=1, now=200.0)
    (w,) = ins.workers
    assert (w.tasks, w.busy, w.serde, w.lost, w.startup, w.died) == (1, 0.75, 0.25, 3.0, 0.5, "memory-limit")
    assert w.idle == pytest.approx(5.0 - 0.75 - 0.25 - 3.0)
    assert [t.key for t in ins.slowest] == ["f-1"]


def test_insights_count_the_time_moving_data_apart_from_idle():
    from localcluster.engine.history import TaskRecord
    records = [TaskRecord("f-1", "worker-0", 1, 100.0, 101.0, "finished", 0.25)]
    ins = insights(records, [("worker-0", 99.0, 0.5), ("worker-1", 99.0, 0.5)], [], threads=1, now=103.0,
                   transfers={"worker-0": 0.5})
    w0, w1 = ins.workers
    assert (w0.transfer, w1.transfer) == (0.5, None)
    assert w0.idle == pytest.approx(4.0 - 0.75 - 0.25 - 0.5)
    assert str(ins).splitlines()[0].split()[:8] == ["worker", "tasks", "busy", "s", "idle", "s", "serde", "s"]
    assert "transfer s" in str(ins) and 'title="transfer 0.50 s"' in ins.html()


def total(x):
    return len(x)


@pytest.mark.cluster(n_workers=2)
@pytest.mark.slow
def test_insights_show_each_worker_moving_the_data_a_task_on_the_other_needs(cluster, client):
    """A 64 MiB value held by one worker and needed by a task on the other: the holder
    serves it, the other stores it, and each says the seconds it spent (its status board)."""
    holder, other = sorted(cluster.workers)
    data = client.scatter(b"x" * (64 << 20), workers=[holder])
    assert client.submit(total, data, workers=[other]).result(timeout=60) == 64 << 20
    wait_for(lambda: all((w.transfer or 0) > 0 for w in cluster.insights().workers if w.name in (holder, other)))
    moved = {w.name: w.transfer for w in cluster.insights().workers}
    assert moved[holder] > 0 and moved[other] > 0, moved


@pytest.mark.slow
def test_live_prints_nothing_when_stdout_is_not_a_terminal(cluster, client, capsys):
    out = io.StringIO()
    with live(interval=0.05, file=out) as block:
        client.gather(client.map(nap, range(2)))
    assert out.getvalue() == "" and block.drawn == 0
    with live(interval=0.05):
        pass
    assert capsys.readouterr().out == ""


@pytest.mark.slow
def test_live_keeps_one_status_block_on_a_terminal(cluster, client):
    pytest.importorskip("rich")
    master, slave = os.openpty()
    with os.fdopen(slave, "w") as tty:
        with live(interval=0.05, file=tty) as block:
            client.gather(client.map(nap, range(4)))
            wait_for(lambda: block.drawn >= 3)
        tty.flush()
    text = " ".join(_drain(master).decode().split())       # rich wraps at the width of the terminal
    assert "localcluster: 2 workers (2 running)" in text and "tasks 4 done, 0 running, 0 failed" in text


def _drain(master):
    """All a closed pty's terminal side wrote (Linux: EIO once drained)."""
    seen = b""
    try:
        while True:
            chunk = os.read(master, 65536)
            if not chunk:
                break
            seen += chunk
    except OSError:
        pass
    finally:
        os.close(master)
    return seen


def fails_first(path):
    if not os.path.exists(path):
        open(path, "w").close()
        raise ValueError("the first try fails")
    return 1


def test_status_lines_count_tasks_not_runs(cluster, client, tmp_path):
    assert client.submit(fails_first, str(tmp_path / "tried"), retries=1, key="flaky-1").result(30) == 1
    first = client.submit(nap, 1, key="nap-1")
    assert first.result(30) == 1
    del first
    wait_for(lambda: "nap-1" not in cluster.scheduler.tasks)
    # the same key submitted again once its task was forgotten: a new task (as in dask), counted
    assert client.submit(nap, 1, key="nap-1").result(30) == 1
    with pytest.raises(ValueError):
        client.submit(fails_first, str(tmp_path / "tried-2"), key="flaky-2").result(30)   # no retry: failed
    wait_for(lambda: cluster.history.ended == 5)
    assert sorted(r.status for r in cluster.history.tasks()) == ["error", "error", "finished", "finished", "finished"]
    # the retried failure is neither failed nor a second task
    assert (cluster.history.done, cluster.history.failed) == (3, 1)
    assert "tasks 3 done, 0 running, 1 failed" in "\n".join(status_lines([cluster]))


def kills_its_worker():
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.cluster(allowed_failures=0)
@pytest.mark.slow
def test_a_task_given_up_after_its_worker_died_counts_failed_as_progress_does(cluster, client):
    """Its only run was lost with the worker (no run raised): the task failed all the same."""
    fut = client.submit(kills_its_worker, key="kills-1")
    with pytest.raises(localcluster.KilledWorker):
        fut.result(30)
    assert localcluster.progress(fut, file=io.StringIO()) == (0, 1)
    assert [r.status for r in cluster.history.tasks()] == ["lost"]
    assert (cluster.history.done, cluster.history.failed) == (0, 1)
    assert "tasks 0 done, 0 running, 1 failed" in "\n".join(status_lines([cluster]))


def test_status_lines_name_the_last_death(cluster):
    lines = status_lines([cluster])
    assert lines[0].startswith("localcluster: 2 workers") and not any("last death" in line for line in lines)


def test_status_lines_count_in_words_and_stay_within_80_columns():
    """One worker is "1 worker"; parts that do not fit on a line go on the next, and what
    is longer still (the last death's line) is cut with "…"."""
    def cluster(n, state="running", done=3, deaths=()):
        workers = {f"worker-{i}": SimpleNamespace(status=state, memory=1 << 30, memory_limit=2 << 30, running=())
                   for i in range(n)}
        return SimpleNamespace(status="running", workers=workers, history=SimpleNamespace(done=done, failed=0),
                               deaths=list(deaths))
    assert status_lines([cluster(1)]) == ["localcluster: 1 worker (1 running) · memory 1.00 GiB of 2.00 GiB",
                                          "  tasks 3 done, 0 running, 0 failed"]
    assert status_lines([cluster(0)])[0].startswith("localcluster: no worker · memory 0 B · tasks 3 done")
    death = SimpleNamespace(headline=lambda: "localcluster: worker-7 (pid 4121) died: memory-limit, SIGTERM, "
                                             "running 'work-1f0c…', memory 1.90 GiB of 2.00 GiB limit. Details in "
                                             "cluster.deaths[-1].message")
    lines = status_lines([cluster(1000, done=123456789, deaths=[death])], extra=lambda: "  these futures: " + "x" * 99)
    assert lines[:2] == ["localcluster: 1000 workers (1000 running) · memory 1000.00 GiB of 2000.00 GiB",
                         "  tasks 123456789 done, 0 running, 0 failed"]
    assert lines[2].startswith("  last death: worker-7 (pid 4121) died: memory-limit, SIGTERM, running")
    assert all(len(line) <= 80 for line in lines) and lines[2].endswith("…") and lines[3].endswith("…")


@pytest.mark.slow
def test_progress_live_shows_the_block_and_the_futures_count(cluster, client):
    pytest.importorskip("rich")
    master, slave = os.openpty()
    with os.fdopen(slave, "w") as tty:
        got = localcluster.progress(client.map(nap, range(3)), file=tty, live=True)
    seen = _drain(master)
    assert b"3/3 done" in seen and got == (3, 0) and b"localcluster: 2 workers" in seen


def test_the_progress_tab_says_when_it_counts_only_the_kept_runs(monkeypatch):
    """Runs the history no longer keeps when the tab is first drawn are not counted by group,
    and the tab says from which run it counts."""
    from localcluster.engine import history
    monkeypatch.setattr(history, "TASKS", 5)
    with localcluster.LocalCluster(n_workers=1, forward_logs=False) as c, localcluster.Client(c) as cl:
        assert cl.gather(cl.map(inc, range(8), pure=False)) == list(range(1, 9))
        wait_for(lambda: c.history.ended == 8)
        head, parts, _ = dash.Snapshot(c).take("progress")
    assert '<b class="lc-done">8</b> done' in head                 # the header counts every task
    assert "the runs after the first 3 (the history keeps the newest 5)" in parts[1]
    assert re.search(r"<code>inc</code>.*?<td[^>]*>5</td>", parts[1])   # the tab, the kept runs


def inc(x):
    return x + 1
