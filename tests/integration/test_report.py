"""The pictures: ``localcluster.report`` opened in a real headless Chromium, and the
``_repr_html_`` views, all drawn from one real run with a memory kill and a segfault."""
from __future__ import annotations

import ctypes
import re
import time
from types import SimpleNamespace

import pytest
from _util import browser as system_browser

import localcluster
from localcluster import Client, KilledWorker, LocalCluster, worker_client

np = pytest.importorskip("numpy")

LIMIT = 400 * 2**20


def hog():
    """Grows 20 MB at a time until its nanny stops it at memory_terminate."""
    blocks = []
    for _ in range(100):
        blocks.append(np.ones(20 * 2**20 // 8))
        time.sleep(0.02)
    return len(blocks)


def crash():
    ctypes.string_at(0)


def square(x):
    return np.full(2**18, x) ** 2          # 2 MB: results stay on their worker


def total(a):
    return float(a.sum())


def fails(x):
    raise ValueError(f"bad input {x}")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One real run inside report(): 40 tasks of two functions, 3 failures, a memory
    kill and a segfault. The cluster is closed before the tests look at what it left."""
    path = tmp_path_factory.mktemp("report") / "run.html"
    with localcluster.report(path) as rep:
        with LocalCluster(n_workers=2, memory_limit=LIMIT, allowed_failures=0, forward_logs=False) as cluster, \
                Client(cluster) as client:
            client.gather(client.map(total, client.map(square, range(20))))
            failed = client.map(fails, range(3))
            client.gather(failed, errors="skip")
            errors = {}
            for name, fn in (("memory", hog), ("crash", crash)):
                with pytest.raises(KilledWorker) as info:
                    client.submit(fn).result(60)
                errors[name] = info.value
            deaths = list(cluster.deaths)
            cluster_html = cluster._repr_html_()
            client_html = client._repr_html_()
            future_html = failed[0]._repr_html_()
    return SimpleNamespace(path=path, report=rep, errors=errors, deaths=deaths, cluster_html=cluster_html,
                           client_html=client_html, future_html=future_html)



@pytest.fixture
def page(run):
    executable = system_browser()
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 960, "height": 900})
            problems: list = []
            page.on("console", lambda m: problems.append(m.text) if m.type in ("error", "warning") else None)
            page.on("pageerror", lambda exc: problems.append(str(exc)))
            page.on("request", lambda r: problems.append(f"fetched {r.url}") if not r.url.startswith("file:") else None)
            page.goto(run.path.as_uri())
            yield page
            assert problems == [], problems
        finally:
            browser.close()


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_the_report_opens_in_a_real_browser(run, page, tmp_path):
    stream = page.locator("svg.lc-stream").bounding_box()
    assert stream["width"] >= 800 and stream["height"] >= 4 * 16, stream
    tasks = page.locator("rect.lc-task")
    assert tasks.count() == 20 + 20 + 3 + 2      # square, total, fails, and the two killed runs
    statuses = [tasks.nth(i).get_attribute("data-status") for i in range(tasks.count())]
    assert statuses.count("error") == 3 and statuses.count("lost") == 2
    widths = [tasks.nth(i).bounding_box()["width"] for i in range(tasks.count())]
    # render.py draws each at least 1 unit wide; the page may scale the SVG by a hair (0.99997)
    assert min(widths) >= 0.99 and max(widths) < stream["width"]
    groups = {tasks.nth(i).get_attribute("data-group") for i in range(tasks.count())}
    assert groups == {"square", "total", "fails", "hog", "crash"}
    assert page.locator("svg.lc-timeline polyline.lc-memline").count() >= 2
    assert page.locator("svg.lc-timeline line.lc-limit").count() == 3      # target, pause, terminate
    table = page.locator("table.lc-deaths-table").inner_text()
    assert "memory-limit" in table and "crash" in table and "SIGSEGV" in table
    summary = page.locator("table.lc-summary").inner_text()
    assert re.search(r"tasks finished\s+40", summary) and re.search(r"tasks failed\s+3", summary)
    page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
    assert (tmp_path / "report.png").stat().st_size > 20_000


@pytest.mark.timeout(120)
@pytest.mark.parametrize("cause", ["memory-limit", "crash"])
@pytest.mark.slow
def test_a_death_marker_sits_at_the_time_of_the_death(run, page, cause):
    """The marker is where the cluster says the worker died, and that worker's own memory
    line ends at its last sample, which is not after the death (two independent records:
    the death, and the nanny's samples). How long before the death the last sample was is
    the scheduler thread's pace, not the report's: under load it came 8 % of the timeline early once."""
    death = next(d for d in run.deaths if d.cause == cause)
    svg = page.locator("svg.lc-timeline")
    box = svg.bounding_box()
    t0, t1, left, width = (float(svg.get_attribute(a)) for a in ("data-t0", "data-t1", "data-left", "data-width"))
    marker = svg.locator(f'g.lc-death[data-cause="{cause}"] circle')
    dot = marker.bounding_box()
    x = dot["x"] + dot["width"] / 2 - box["x"]
    assert abs(x - (left + (death.time - t0) / (t1 - t0) * width)) <= 1.5
    points = svg.locator(f'polyline.lc-memline[data-worker="{death.worker}"]').get_attribute("points")
    last_x = float(points.split()[-1].split(",")[0])
    cluster = run.report.clusters[0]
    last_sample = max(t for t, _ in cluster.history.memory()[death.worker] if t0 <= t <= t1)
    assert last_sample <= death.time
    assert abs(last_x - (left + (last_sample - t0) / (t1 - t0) * width)) <= 0.1, (last_x, x)
    assert last_x <= x + 1.5


def test_the_report_is_self_contained(run):
    text = run.path.read_text()
    assert "<script" not in text and "http://" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "https://" not in text and "@import" not in text
    assert run.report.html() == text


def test_report_refuses_bad_input_and_reuse(run, tmp_path):
    with pytest.raises(TypeError, match="report\\(path=3\\)"):
        localcluster.report(3)
    with pytest.raises(RuntimeError, match="already used"):
        with run.report:
            pass


def test_a_report_is_written_when_the_block_fails(tmp_path):
    path = tmp_path / "failed.html"
    with pytest.raises(ZeroDivisionError):
        with localcluster.report(path):
            with Client(n_workers=1, forward_logs=False) as client:
                client.submit(lambda: 1 / 0).result(30)
    assert "tasks failed" in path.read_text()


# --- the notebook views ---------------------------------------------------------------------

def test_cluster_view_shows_workers_memory_bars_and_a_timeline_with_deaths(run):
    html = run.cluster_html
    assert html.count("lc-membar") >= 2 and "lc-timeline" in html
    assert "results held / unmanaged" in html
    assert html.count('class="lc-death"') == 2 and 'data-cause="memory-limit"' in html
    assert all(f'data-line="{k}"' in html for k in ("target", "pause", "terminate"))
    assert "<script" not in html and run.client_html.count("lc-workers") == 1


def test_killed_worker_view_shows_cause_signal_memory_frames_and_folded_log(run):
    memory, crashed = run.errors["memory"]._repr_html_(), run.errors["crash"]._repr_html_()
    assert ">memory-limit<" in memory and "lc-membar" in memory
    assert ">crash<" in crashed and "SIGSEGV" in crashed and "in crash" in crashed     # the crashing frame
    assert "<details" in crashed and "Fatal Python error" in crashed
    assert run.deaths[-1]._repr_html_().startswith('<div class="lc-death-card"')


def test_cluster_view_splits_results_held_from_unmanaged_memory():
    from localcluster.views import render
    MiB = 2**20
    worker = SimpleNamespace(name="worker-0", pid=1, status="paused", processing=(), memory=300 * MiB,
                             memory_limit=400 * MiB, managed=20 * MiB, spilled=5 * MiB, unmanaged=280 * MiB)
    starting = SimpleNamespace(**{**vars(worker), "name": "worker-1", "memory": None, "unmanaged": None})
    html = render.cluster_view("c", [worker, starting], {}, {}, [], 400 * MiB)
    assert ">20.00 MiB / 280.00 MiB<" in html and "spilled: 5.00 MiB" in html
    assert html.count('class="lc-split"') == 2 and ">unknown<" in html


def test_future_view_and_escaping(run):
    assert ">error<" in run.future_html and "ValueError: bad input 0" in run.future_html
    from localcluster.views import render  # user text is escaped, never markup
    card = render.death_card(SimpleNamespace(
        worker="<b>w</b>", pid=1, cause="crash", signal=None, exitcode=1, tasks=("<script>",), memory=None,
        peak_memory=None, memory_limit=None, stack=None, message="&", log_tail=()))
    assert "<script>" not in card and "&lt;b&gt;w" in card and "&amp;" in card


def fib(n):
    if n < 2:
        return n
    with worker_client() as c:
        return sum(c.gather([c.submit(fib, n - 1), c.submit(fib, n - 2)]))


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_the_task_stream_says_which_task_submitted_which(tmp_path):
    """Tasks that submit tasks: each child's record names its parent, the bars say so, and
    the summary counts them."""
    path = tmp_path / "fib.html"
    with localcluster.report(path):
        with LocalCluster(n_workers=1, threads_per_worker=1, forward_logs=False) as cluster, Client(cluster) as client:
            top = client.submit(fib, 3)
            assert top.result(30) == 2
            records = {r.key: r for r in cluster.history.tasks()}
    by = {key: r.submitter for key, r in records.items()}
    assert by[top.key] is None and len(records) == 4      # fib(3), fib(2), fib(1) (one pure key, run once), fib(0)
    # fib(2): submitted by the top task, and submits in turn
    (middle,) = [k for k, s in by.items() if s == top.key and k in by.values()]
    children = [k for k, s in by.items() if s == top.key]
    grandchildren = [k for k, s in by.items() if s == middle]
    # fib(1)'s key is pure and both submit it: under load fib(2) can submit it first
    assert len(children) + len(grandchildren) == 3 and len(children) in (1, 2)
    assert all(k.startswith("fib-") for k in children + grandchildren)
    page = path.read_text()
    assert f'data-submitter="{top.key}"' in page and f"submitted by task {top.key}" in page
    # 3 runs, or 4 when fib(2) ended and let go of fib(1) before the top task submitted it:
    # then it runs again
    assert re.search(r"runs of tasks submitted by tasks</td><td[^>]*>[34] \(by 2 tasks: fib-", page), \
        page[page.find("runs of tasks submitted by tasks"):][:300]
