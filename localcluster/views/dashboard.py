"""``cluster.dashboard()``: the live view in Jupyter, without a listening socket.

An ipywidgets widget (HTML parts in tabs) whose values a thread of its own
(``localcluster-dashboard``) sets about once a second; the kernel sends each change over
its comm channel, so the view moves while the kernel runs other cells or waits in
``gather``. The progress, the task stream and the insights are drawn only while their tab
is shown. Each refresh reads the cluster once: ``cluster.workers`` (one take of the
cluster's lock, as any user call), the history's counts of tasks done and failed (kept as
runs end: no task record is read for them) and the states of the tasks the scheduler holds
(a copy of a dict, no lock; their groups only for the progress tab); the scheduler thread
does nothing more for it. Task records are read only for the tab that shows them. The HTML
of a part is sent only when it changed.

What it costs the cluster: the refresh runs in the user's process and holds the GIL while
it computes, which delays the scheduler thread's and the submitting thread's wake-ups. So
it reads no more than it draws (the workers tab reads no task record; only the progress
tab counts per group), and it waits 100 times its own CPU time when that is longer than
``interval``: never more than 1 % of a core.

The thread ends when the widget is closed, or once it has drawn the closed cluster, or
when the cluster is garbage. One widget per cluster is shared by every cell showing it.
Without ipywidgets, ``dashboard()`` gives the static view (``cluster._repr_html_``).
"""
from __future__ import annotations

import html
import sys
import threading
import time
import weakref
from collections import Counter
from itertools import compress, filterfalse
from operator import itemgetter, methodcaller
from typing import Any, Optional

from ..engine.history import key_group
from . import render
from .insights import insights

__all__ = ["dashboard", "mimebundle", "Snapshot", "StaticView", "WIDGET_MIME"]

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
STREAM_SECONDS = 60.0
STREAM_BARS = 1000         # the newest task bars drawn live: the SVG sent a second stays small
KEYS_KEPT = 1_000_000      # failed keys remembered so that a task failing again counts once
RECENT_KEYS = 100_000      # the progress tab's newest finished keys remembered (two halves, rolling), for
                           # the same: a rerun comes soon after (a retry), and a million keys would cost more
FRACTIONS = ("memory_target", "memory_pause", "memory_terminate")
TABS = ("workers", "progress", "task stream", "insights")
COST_SHARE = 0.01          # a refresh waits at least its CPU time / COST_SHARE before the next
CHUNK = 2000               # task records read at a time, each chunk a short hold of the GIL...
GIL_PAUSE = 0.0002         # ...and a pause between chunks, long enough for a waiting thread to take it
_PENDING = frozenset(("waiting", "ready", "processing"))


_FIRST, _STATUS, _SPLIT = itemgetter(0), itemgetter(5), methodcaller("rpartition", "-")


def _heads(keys: Any) -> Any:
    """``key.rpartition("-")[0]`` of each key, in C (no Python call per key)."""
    return map(_FIRST, map(_SPLIT, keys))


_open: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()     # cluster -> its live widget
_open_lock = threading.Lock()


class StaticView:
    """What ``dashboard()`` gives without ipywidgets: the cluster's static HTML, drawn when shown."""

    def __init__(self, cluster: Any):
        self.cluster = cluster

    def _repr_html_(self) -> str:
        return self.cluster._repr_html_()


def dashboard(cluster: Any, interval: float = 1.0) -> Any:
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return StaticView(cluster)
    with _open_lock:
        widget = _open.get(cluster)
        if widget is None or widget.closed:
            widget = _open[cluster] = _widget_class()(cluster, interval)
    return widget


def mimebundle(cluster: Any, include: Any, exclude: Any) -> Optional[dict]:
    """The live widget's bundle with the static HTML beside it (for nbviewer, exports), in a
    kernel with ipywidgets; None elsewhere (IPython then asks ``_repr_html_``)."""
    if (include is not None and WIDGET_MIME not in include) or (exclude is not None and WIDGET_MIME in exclude):
        return None
    shell = sys.modules.get("IPython") and sys.modules["IPython"].get_ipython()
    if shell is None or getattr(shell, "kernel", None) is None or "ipywidgets" not in sys.modules and not _importable():
        return None
    widget = dashboard(cluster)
    if isinstance(widget, StaticView):
        return None
    bundle = widget._repr_mimebundle_()
    bundle["text/html"] = cluster._repr_html_()
    bundle["text/plain"] = repr(cluster)
    return bundle


def _importable() -> bool:
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    return True


_CLASS: list = []


def _widget_class() -> type:
    """The widget class, made on first use (ipywidgets is optional): a VBox of a header and
    the tabs, with the methods of ``_Live``."""
    if not _CLASS:
        import ipywidgets as W
        body = {k: v for k, v in vars(_Live).items() if not k.startswith("__") or k in ("__init__", "__doc__")}
        _CLASS.append(type("LiveDashboard", (W.VBox,), body))
    return _CLASS[0]


class _Live:
    """The live view of one cluster (see the module docstring); the methods of the widget."""

    def __init__(self, cluster: Any, interval: float):
        import ipywidgets as W
        self.header = W.HTML()
        self.parts = [W.HTML() for _ in TABS]
        self.tabs = W.Tab(children=self.parts)
        for i, title in enumerate(TABS):
            self.tabs.set_title(i, title)
        super(type(self), self).__init__(children=[self.header, self.tabs])  # type: ignore[call-arg]  # a VBox's
        self.snapshot = Snapshot(cluster)
        self.refreshes = 0
        self._stop = threading.Event()
        self.refresh()
        self._thread = threading.Thread(target=self._run, args=(interval,), name="localcluster-dashboard",
                                        daemon=True)
        self._thread.start()

    @property
    def closed(self) -> bool:
        return self._stop.is_set()

    def refresh(self) -> bool:
        """Read the cluster once and update the parts that changed; False once it is gone."""
        drawn = self.snapshot.take(TABS[self.tabs.selected_index or 0])
        if drawn is None:
            return False
        head, parts, open_ = drawn
        for widget, value in zip([self.header] + self.parts, [head] + parts):
            if value is not None and widget.value != value:
                widget.value = value
        self.refreshes += 1
        return open_

    def _run(self, interval: float) -> None:
        wait = interval
        while not self._stop.wait(wait):
            try:
                spent = time.thread_time()
                if not self.refresh():
                    break
                wait = max(interval, (time.thread_time() - spent) / COST_SHARE)
            except Exception as e:  # never break the kernel's display: say it once and stop
                self.header.value += f'<div style="color:#c62828">live view stopped: {html.escape(repr(e))}</div>'
                break
        self._stop.set()

    def stop(self) -> None:
        """Stop refreshing (the view stays as last drawn)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(5)

    def close(self) -> None:
        self.stop()
        super(type(self), self).close()  # type: ignore[misc]  # a VBox's


class Snapshot:
    """Reads a cluster once per refresh and draws its parts. The header's counts are the
    history's (``History.done``, ``History.failed``: kept as runs end, so a refresh reads no
    task record for them); task records are read only for the tab that shows them: the last
    ``STREAM_BARS`` for the task stream, and those ended since its last drawing for the
    progress tab, which counts each key once."""

    def __init__(self, cluster: Any):
        self._cluster = weakref.ref(cluster)
        self.done: Counter = Counter()       # group -> tasks finished, as of the progress tab's last drawing
        self.failed: Counter = Counter()     # group -> failed
        self.counted_from: Optional[int] = None   # history.ended when the progress counts began (None: never drawn)
        self._ended = 0                      # history.ended when the progress tab was last drawn
        self._groups: dict = {}              # key's head -> group (key_group is a little slow)
        self._finished: set = set()          # keys counted done lately (the history's strings, shared)...
        self._finished_before: set = set()   # ...and the half before those
        self._failed: set = set()            # keys counted failed
        self._group_of: dict = {}            # key -> its group, for the keys the scheduler knows

    def take(self, tab: str = "workers") -> Optional[tuple]:
        """(header, the parts' HTML, still open) or None once the cluster is gone; the
        progress, task stream and insights are drawn only while their tab is the one shown
        (None: unchanged)."""
        cluster = self._cluster()
        if cluster is None:
            return None
        now = time.time()
        status = cluster.status
        workers = list(cluster.workers.values())
        deaths = list(cluster.deaths)
        history = cluster.history
        done, failed_for_good = history.done, history.failed
        running = {k for w in workers for k in w.running}
        keys, states = cluster.scheduler.key_states()
        if tab == "progress":
            self._read_records(history)
            running_by: Counter = Counter()
            for head, n in Counter(_heads(running)).items():
                running_by[self.group(head)] += n
            waiting, erred = self._pending(keys, states)
            waiting -= running_by                # what runs is processing too
            failed = self.failed | erred         # per group, the larger of the errors seen and held now
            n_waiting = sum(waiting.values())
            n_failed = max(failed_for_good, sum(erred.values()))
        else:                                    # the header's totals: one pass, no group
            counts = Counter(states)
            n_waiting = max(0, sum(counts[s] for s in _PENDING) - len(running))
            n_failed = max(failed_for_good, counts["erred"])   # erred: those whose input failed too
        fractions = {k: cluster.config[k] for k in FRACTIONS}
        head = _header(repr(cluster).strip("<>"), workers, done, len(running), n_waiting, n_failed, deaths, now)
        parts = [_workers_part(workers, fractions, deaths, cluster.memory_limit),
                 self._progress_part(running_by, waiting, failed, history) if tab == "progress" else None,
                 self._stream_part(cluster, workers, deaths, now) if tab == "task stream" else None,
                 insights(history.tasks(), history.startups(), deaths, cluster.threads_per_worker,
                          transfers=history.transfers()).html() if tab == "insights" else None]
        return head, parts, status not in ("closed", "stopped", "broken", "forked")

    def _pending(self, keys: list, states: list) -> tuple:
        """(group -> tasks waiting or processing, group -> tasks erred) of the tasks the
        scheduler knows, in one pass in C: each key's group is worked out once, when first seen."""
        group_of = self._group_of
        new = list(filterfalse(group_of.__contains__, keys)) if group_of else keys
        if new:
            if len(group_of) > 2 * len(keys) + 10_000:      # forget the keys long gone
                group_of = self._group_of = {k: group_of[k] for k in keys if k in group_of}
            heads = list(_heads(new))
            groups = {head: self.group(head) for head in set(heads)}     # few distinct heads
            group_of.update(zip(new, map(groups.__getitem__, heads)))
        waiting = Counter(map(group_of.__getitem__, compress(keys, map(_PENDING.__contains__, states))))
        erred = Counter(map(group_of.__getitem__, compress(keys, map("erred".__eq__, states))))
        return waiting, erred        # erred: KilledWorker too (its runs were lost, none erred), and an input failed

    def group(self, head: str) -> str:
        """The group of a key, from its head (``key.rpartition("-")[0]``): few distinct heads."""
        group = self._groups.get(head)
        if group is None:
            group = self._groups[head] = key_group(head) or "(other)"
            if len(self._groups) > 10_000:
                self._groups.clear()
        return group

    def _read_records(self, history: Any) -> None:
        """The records ended since the progress tab's last drawing, into its counts by group.
        Those the history no longer keeps (the newest ``history.TASKS`` are kept) are not
        counted: then the tab counts from the oldest kept (``counted_from``)."""
        ended = history.ended
        gap = ended - self._ended
        new = history.tail(gap, raw=True)     # tuples: key, worker, thread, start, stop, status
        self._ended = ended
        kept = len(new) - list(map(_STATUS, new)).count("lost")
        if self.counted_from is None or kept < gap:      # never drawn, or runs went unread
            self.counted_from = ended - kept
            self.done.clear()
            self.failed.clear()
            self._finished, self._finished_before, self._failed = set(), set(), set()
        # In chunks with a pause between them: a C call over a large set holds the GIL
        # throughout (no switch interval cuts it), and the scheduler thread waits meanwhile.
        for start in range(0, len(new), CHUNK):
            if start:
                time.sleep(GIL_PAUSE)
            self._count(new[start:start + CHUNK])

    def _count(self, records: list) -> None:
        """The finished and failed runs among ``records``, by group, each key once."""
        keys, statuses = list(map(_FIRST, records)), list(map(_STATUS, records))
        if "error" in statuses:
            failed = set(compress(keys, map("error".__eq__, statuses))) - self._failed
            if len(self._failed) < KEYS_KEPT:
                self._failed |= failed
            for head, n in Counter(_heads(failed)).items():
                self.failed[self.group(head)] += n
        if statuses.count("finished") == len(keys):
            fresh = set(keys)
        else:
            fresh = set(compress(keys, map("finished".__eq__, statuses)))
        # a task run again counts once (run again lately: after a retry, the same key resubmitted);
        # ``-``, not ``difference_update``, which walks the whole of the other, large, set
        fresh = fresh - self._finished - self._finished_before
        self._finished |= fresh
        if len(self._finished) >= RECENT_KEYS // 2:
            self._finished_before, self._finished = self._finished, set()
        for head, n in Counter(_heads(fresh)).items():
            self.done[self.group(head)] += n

    def _progress_part(self, running: Counter, waiting: Counter, failed: Counter, history: Any) -> str:
        part = _progress_part(self.done, running, waiting, failed)
        if self.counted_from:
            part += (f'<div style="{render.FONT};color:#777">done and failed: the runs after the first '
                     f'{self.counted_from:,} (the history keeps the newest {history.capacity:,})</div>')
        return part

    def _stream_part(self, cluster: Any, workers: list, deaths: list, now: float) -> str:
        span = (now - STREAM_SECONDS, now)
        records = [r for r in cluster.history.tail(STREAM_BARS) if r.stop >= span[0]]
        names = sorted({w.name for w in workers} | {r.worker for r in records}, key=_order)
        lanes = [(n, t) for n in names for t in range(1, cluster.threads_per_worker + 1)]
        recent = [d for d in deaths if d.time >= span[0]]
        return (f'<div style="{render.FONT}">the last {STREAM_SECONDS:.0f} s</div>'
                + render.task_stream(lanes, records, recent, span, limit=STREAM_BARS))


def _order(name: str) -> tuple:
    head, _, tail = name.rpartition("-")
    return (head, int(tail)) if tail.isdigit() else (name, -1)


def _header(title: str, workers: list, done: int, running: int, waiting: int, failed: int, deaths: list,
            now: float) -> str:
    e = html.escape
    last = ""
    if deaths:
        d = deaths[-1]
        last = (f' · last death: {render.cause_badge(d.cause)} {e(d.worker)} '
                f'{time.strftime("%H:%M:%S", time.localtime(d.time))}')
    return (f'<div class="lc-live-head" style="{render.FONT}"><b>{e(title)}</b><br>'
            f'<span class="lc-counts">{len(workers)} workers · <b class="lc-done">{done}</b> done · '
            f'{running} running · {waiting} waiting · {failed} failed</span>{last}'
            f' <span style="color:#888">(updated {time.strftime("%H:%M:%S", time.localtime(now))})</span></div>')


def _workers_part(workers: list, fractions: dict, deaths: list, limit: Optional[int]) -> str:
    e = html.escape
    rows = []
    for w in workers:
        now_running = ", ".join(f"<code>{e(k)}</code> {s:.1f} s" for k, s in
                                sorted(w.running.items(), key=lambda p: -p[1])[:3]) or "idle"
        rows.append([e(w.name), str(w.pid), e(w.status), split_bar(w, fractions), now_running])
    parts = [f'<div class="lc-live-workers" style="{render.FONT}">',
             render.table(("worker", "pid", "state", "memory: results · other · spilled", "running now"), rows,
                          "lc-workers"),
             render.memory_timeline({w.name: thin(w.memory_history) for w in workers}, limit, fractions, deaths)]
    if deaths:
        parts.append(f"<div><b>{len(deaths)} death{'s' if len(deaths) != 1 else ''}</b>"
                     + (" (last 5)" if len(deaths) > 5 else "") + "</div>")
        for d in reversed(deaths[-5:]):
            parts.append(f'<details class="lc-live-death"><summary>{render.cause_badge(d.cause)} '
                         f'{e(d.headline().removeprefix("localcluster: "))}</summary>{render.death_card(d, fractions)}'
                         f'</details>')
    parts.append("</div>")
    return "".join(parts)


def thin(points: list, most: int = 300) -> list:
    """At most about ``most`` (time, value) points: the largest of each run of neighbours,
    so that a peak (the climb to a memory kill) survives."""
    if len(points) <= most:
        return points
    step = -(-len(points) // most)
    return [max(points[i:i + step], key=_VALUE) for i in range(0, len(points), step)]


_VALUE = itemgetter(1)


def split_bar(w: Any, fractions: dict, width: int = 200) -> str:
    """RSS as results held (managed) and the rest (unmanaged), then what is spilled to disk,
    against the limit, with ticks at target, pause and terminate."""
    limit, rss = w.memory_limit, w.memory
    if rss is None or not limit:
        return render.memory_bar(rss, limit, fractions)
    managed = min(w.managed, rss)
    reusable = min(getattr(w, "reusable", 0), rss - managed)
    segments = (("results held", managed, "#1976d2"), ("kept for reuse", reusable, "#90caf9"),
                ("other (unmanaged)", rss - managed - reusable, "#66bb6a"), ("spilled to disk", w.spilled, "#bdbdbd"))
    at, spans = 0.0, []
    for label, nbytes, colour in segments:
        share = max(0.0, min(1.0 - at, nbytes / limit))
        if share > 0:
            spans.append(f'<span class="lc-seg" data-part="{label}" title="{label}: '
                         f'{html.escape(render.format_bytes(nbytes))}" style="position:absolute;left:{at * 100:.1f}%;'
                         f'top:0;bottom:0;width:{share * 100:.1f}%;background:{colour}"></span>')
            at += share
    ticks = "".join(f'<span title="{label}" style="position:absolute;left:{fractions[k] * 100:.1f}%;top:-2px;'
                    f'bottom:-2px;border-left:2px solid {c}"></span>' for k, label, c in render.LINES if fractions.get(k))
    return (f'<span class="lc-splitbar" style="display:inline-block;position:relative;width:{width}px;height:12px;'
            f'background:#eee;vertical-align:middle">{"".join(spans)}{ticks}</span> '
            f'{html.escape(render.format_bytes(rss))} / {html.escape(render.format_bytes(limit))}'
            + (f' (+{html.escape(render.format_bytes(w.spilled))} spilled)' if w.spilled else ""))


def _progress_part(done: Counter, running: Counter, waiting: Counter, failed: Counter) -> str:
    groups = sorted(set(done) | set(running) | set(waiting) | set(failed),
                    key=lambda g: -(done[g] + running[g] + waiting[g] + failed[g]))
    if not groups:
        return f'<div style="{render.FONT};color:#777">no task yet</div>'
    rows = []
    for g in groups[:30]:
        total = done[g] + running[g] + waiting[g] + failed[g] or 1
        bar = "".join(f'<span title="{label} {n}" style="display:inline-block;height:12px;width:{n / total * 240:.1f}px;'
                      f'background:{c}"></span>'
                      for label, n, c in (("done", done[g], "#43a047"), ("failed", failed[g], "#c62828"),
                                          ("running", running[g], "#1e88e5"), ("waiting", waiting[g], "#e0e0e0")) if n)
        rows.append([f"<code>{html.escape(g)}</code>", f'<span style="display:inline-block;width:240px">{bar}</span>',
                     str(done[g]), str(running[g]), str(waiting[g]), str(failed[g])])
    return render.table(("tasks", "", "done", "running", "waiting", "failed"), rows, "lc-progress")
