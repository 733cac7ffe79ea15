"""``with localcluster.report("run.html"):`` writes one self-contained HTML page of what
every cluster did inside the block: the summary counts, the task stream (each task a bar
on its worker thread, coloured by function, failures marked), every worker's memory over
time with its limits and deaths, the deaths with their full messages, and the insights
(each worker's busy, idle and start-up time, the slowest tasks: ``insights.py``).

It records nothing itself: each cluster always keeps a bounded task stream and memory
history (``history.py``), and the page is drawn from them when the block ends, from the
clusters that were open when it began and those made inside it. The page has no script
and fetches nothing: inline CSS and SVG only, so it opens anywhere, offline.
"""
from __future__ import annotations

import datetime
import html
import os
import time
from collections import Counter
from typing import Callable, Optional

from . import render
from .insights import insights
from ..cluster import LocalCluster, live_clusters, watch
from ..version import __version__

__all__ = ["report"]

FRACTIONS = ("memory_target", "memory_pause", "memory_terminate")


class report:
    """Record the clusters' work inside a ``with`` block and write it to ``path`` as HTML.

    The page is written when the block ends, also when it ends with an exception (the
    report of a failed run is the one you need). ``html()`` returns it without writing. It
    is one self-contained file (no CDN): a task stream per worker thread, every worker's
    memory with its limits and deaths, the deaths with their full messages, the insights.

    Args:
        path: the HTML file to write.
        title: the page's title; by default the file's name.

    Raises:
        TypeError: ``path`` is not a file path.
        RuntimeError: the same report used twice.

    Example:
        >>> import os, tempfile
        >>> import localcluster
        >>> path = os.path.join(tempfile.mkdtemp(), "run.html")
        >>> with localcluster.report(path):
        ...     with localcluster.Client(n_workers=1) as client:
        ...         client.gather(client.map(abs, range(3)))
        [0, 1, 2]
        >>> os.path.getsize(path) > 0
        True
    """

    def __init__(self, path: "str | os.PathLike", title: Optional[str] = None):
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"report(path={path!r}): expected a file path (str or os.PathLike)")
        self.path = os.fspath(path)
        self.title = title or f"localcluster report: {os.path.basename(self.path)}"
        self.clusters: list[LocalCluster] = []
        self.start: Optional[float] = None
        self.stop: Optional[float] = None
        self._unwatch: Optional[Callable[[], None]] = None

    def __enter__(self) -> "report":
        if self.start is not None:
            raise RuntimeError("this report was already used; make a new localcluster.report(...)")
        self.start = time.time()
        self.clusters = live_clusters()
        self._unwatch = watch(self.clusters.append)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._unwatch is not None:
            self._unwatch()
        self.stop = time.time()
        with open(self.path, "w", encoding="utf-8") as f:
            f.write(self.html())

    def html(self) -> str:
        """The page, for what was recorded so far."""
        if self.start is None:
            raise RuntimeError("use report(...) as a context manager: with localcluster.report(path): ...")
        span = (self.start, self.stop or time.time())
        sections = [_cluster_section(c, i, span) for i, c in enumerate(self.clusters, 1)]
        when = datetime.datetime.fromtimestamp(span[0]).strftime("%Y-%m-%d %H:%M:%S")
        summary = _summary([s[1] for s in sections], span)
        body = "".join(s[0] for s in sections) or "<p>No cluster ran inside the block.</p>"
        e = html.escape
        return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{e(self.title)}</title>'
                f"<style>body{{{render.FONT};margin:20px;color:#222}}h1{{font-size:20px}}h2{{font-size:16px;"
                f"margin-top:24px}}h3{{font-size:14px}}</style></head><body>"
                f"<h1>{e(self.title)}</h1><p>{when}, {span[1] - span[0]:.1f} s, localcluster {__version__}</p>"
                f"{summary}{body}</body></html>")


def _cluster_section(cluster: LocalCluster, number: int, span: tuple) -> tuple:
    t0, t1 = span
    records = [r for r in cluster.history.tasks() if r.stop >= t0 and r.start <= t1]
    deaths = [d for d in cluster.deaths if t0 <= d.time <= t1]
    series = {name: [p for p in pts if t0 <= p[0] <= t1] for name, pts in cluster.history.memory().items()}
    series = {name: pts for name, pts in series.items() if pts}
    workers = sorted({r.worker for r in records} | set(series) | {d.worker for d in deaths}, key=_worker_order)
    lanes = [(w, t) for w in workers for t in range(1, cluster.threads_per_worker + 1)]
    fractions = {k: cluster.config[k] for k in FRACTIONS}
    e = html.escape
    parts = [f'<section class="lc-report-cluster"><h2>Cluster {number}: {e(repr(cluster).strip("<>"))}</h2>',
             "<h3>Task stream</h3>", render.task_stream(lanes, records, deaths, span),
             "<h3>Memory</h3>", render.memory_timeline(series, cluster.memory_limit, fractions, deaths, span,
                                                       width=900, height=220),
             _deaths_table(deaths),
             "<h3>Insights: where each worker's time went</h3>",
             insights(records, [s for s in cluster.history.startups() if t0 <= s[1] <= t1], deaths,
                      cluster.threads_per_worker, now=t1).html(), "</section>"]
    counts = Counter(r.status for r in records)
    facts = {"tasks": counts, "workers": len(workers), "deaths": Counter(d.cause for d in deaths),
             "submitted": Counter(r.submitter for r in records if r.submitter is not None),
             "busy": sum(r.stop - max(r.start, t0) for r in records), "threads": len(lanes) or 1,
             "reused": cluster.journal.reused if cluster.journal is not None else 0}
    return "".join(parts), facts


def _worker_order(name: str) -> tuple:
    head, _, tail = name.rpartition("-")
    return (head, int(tail)) if tail.isdigit() else (name, -1)


def _deaths_table(deaths: list) -> str:
    if not deaths:
        return "<h3>Deaths</h3><p>No worker died.</p>"
    rows = [[time.strftime("%H:%M:%S", time.localtime(d.time)) + f".{int(d.time % 1 * 1000):03d}",
             html.escape(d.worker), str(d.pid), render.cause_badge(d.cause), html.escape(d.signal or "-"),
             render.death_card(d)] for d in deaths]
    return "<h3>Deaths</h3>" + render.table(("time", "worker", "pid", "cause", "signal", "what happened"), rows,
                                            "lc-deaths-table")


def _summary(facts: list, span: tuple) -> str:
    tasks: Counter[str] = Counter()
    deaths: Counter[str] = Counter()
    submitted: Counter[str] = Counter()
    for f in facts:
        tasks.update(f["tasks"])
        deaths.update(f["deaths"])
        submitted.update(f["submitted"])
    wall = span[1] - span[0]
    lanes = sum(f["threads"] for f in facts) or 1
    busy = sum(f["busy"] for f in facts)
    causes = ", ".join(f"{n} {c}" for c, n in deaths.most_common()) or "none"
    rows = [["tasks finished", str(tasks["finished"])], ["tasks failed", str(tasks["error"])],
            ["tasks reused from the journal (not run)", str(sum(f.get("reused", 0) for f in facts))],
            ["tasks lost with a worker", str(tasks["lost"])],
            ["runs of tasks submitted by tasks", _submitted(submitted)], ["clusters", str(len(facts))],
            ["workers", str(sum(f["workers"] for f in facts))],
            ["worker deaths", f"{sum(deaths.values())} ({html.escape(causes)})"],
            ["wall time", f"{wall:.2f} s"], ["thread utilisation", f"{100 * busy / (wall * lanes):.0f} %" if wall else "-"]]
    return '<h2>Summary</h2>' + render.table(("", ""), rows, "lc-summary")


def _submitted(submitted: Counter) -> str:
    """How many runs tasks submitted (get_client in a task), and the busiest submitters."""
    if not submitted:
        return "0"
    top = ", ".join(f"{html.escape(key)}: {n}" for key, n in submitted.most_common(3))
    more = f", and {len(submitted) - 3} more" if len(submitted) > 3 else ""
    return f"{sum(submitted.values())} (by {len(submitted)} task{'s' if len(submitted) != 1 else ''}: {top}{more})"
