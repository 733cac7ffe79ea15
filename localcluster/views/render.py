"""HTML and SVG views of clusters, workers, deaths and futures, for Jupyter (the
``_repr_html_`` methods) and the report page.

Plain HTML with inline styles and inline SVG only: no script, no stylesheet to fetch, no
class a sanitiser could strip, so a view renders the same in Jupyter, nbviewer, GitHub
and exported HTML. The functions take the objects' public fields (duck-typed: this
module sits below the ones that define them) and return strings; every piece of text
that came from a user or a worker is escaped.
"""
from __future__ import annotations

import html
from typing import Any, Iterable, Optional

from ..config import DEFAULTS, format_bytes
from ..engine.history import key_group

# One colour per cause of death: the harmful ones warm, the intended ones grey.
CAUSE_COLOURS = {
    "crash": "#c62828", "memory-limit": "#ef6c00", "oom-killer": "#bf360c", "signal": "#6a1b9a",
    "timeout": "#1565c0", "unresponsive": "#5d4037", "exception": "#ad1457", "exit": "#8d6e63",
    "requested": "#78909c",
}
WORKER_COLOURS = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f")
LINES = (("memory_target", "target", "#9e9e9e"), ("memory_pause", "pause", "#ef6c00"),
         ("memory_terminate", "terminate", "#c62828"))
DEFAULT_FRACTIONS = {k: DEFAULTS[k] for k, _label, _colour in LINES}
FONT = "font-family:-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;font-size:13px"
MONO = "font-family:SFMono-Regular,Menlo,Consolas,monospace;font-size:12px"

e = html.escape


def badge(text: str, colour: str) -> str:
    return (f'<span class="lc-badge" style="background:{colour};color:#fff;border-radius:3px;'
            f'padding:1px 6px;font-weight:600">{e(text)}</span>')


def cause_badge(cause: str) -> str:
    return badge(cause, CAUSE_COLOURS.get(cause, "#616161"))


def memory_bar(rss: Optional[int], limit: Optional[int], fractions: Optional[dict] = None, width: int = 160) -> str:
    """RSS against the limit as a bar, with ticks at target, pause and terminate."""
    fractions = fractions or DEFAULT_FRACTIONS
    if rss is None:
        return "<span>unknown</span>"
    if not limit:
        return f"<span>{e(format_bytes(rss))} (no limit)</span>"
    share = min(1.0, rss / limit)
    colour = ("#c62828" if share >= (fractions.get("memory_terminate") or 1)
              else "#ef6c00" if share >= (fractions.get("memory_pause") or 1)
              else "#f9a825" if share >= (fractions.get("memory_target") or 1) else "#43a047")
    ticks = "".join(
        f'<span title="{label}" style="position:absolute;left:{fractions[k] * 100:.1f}%;top:0;bottom:0;'
        f'border-left:1px solid {c}"></span>' for k, label, c in LINES if fractions.get(k))
    return (f'<span class="lc-membar" title="{e(format_bytes(rss))} of {e(format_bytes(limit))}" '
            f'style="display:inline-block;position:relative;width:{width}px;height:12px;background:#eee;'
            f'vertical-align:middle;border-radius:2px">'
            f'<span style="position:absolute;left:0;top:0;bottom:0;width:{share * 100:.1f}%;background:{colour};'
            f'border-radius:2px"></span>{ticks}</span> '
            f'<span>{e(format_bytes(rss))} / {e(format_bytes(limit))}</span>')


def table(headers: Iterable[str], rows: Iterable[Iterable[str]], cls: str) -> str:
    """Cells are HTML already (escaped by the caller)."""
    cell = "padding:2px 10px 2px 0;text-align:left;vertical-align:top"
    head = "".join(f'<th style="{cell};border-bottom:1px solid #ccc">{e(h)}</th>' for h in headers)
    body = "".join("<tr>" + "".join(f'<td style="{cell}">{c}</td>' for c in row) + "</tr>" for row in rows)
    return f'<table class="{cls}" style="border-collapse:collapse;{FONT}"><tr>{head}</tr>{body}</table>'


# --- the memory timeline ----------------------------------------------------------------

def memory_timeline(series: dict, limit: Optional[int], fractions: dict, deaths: Iterable[Any] = (),
                    span: Optional[tuple] = None, width: int = 640, height: int = 170) -> str:
    """Every worker's RSS over time as one SVG: a line per worker, dashed lines at target,
    pause and terminate of ``limit``, and a marker where each death happened.
    ``series``: name -> [(unix time, rss)]; ``deaths``: objects with worker, time, cause,
    memory, signal. The plot's time span is in ``data-t0``/``data-t1`` (unix seconds)."""
    deaths = list(deaths)
    fractions = fractions or DEFAULT_FRACTIONS
    times = [t for pts in series.values() for t, _ in pts] + [d.time for d in deaths]
    if not times:
        return '<div class="lc-timeline" style="color:#777">no memory samples yet</div>'
    t0, t1 = span if span else (min(times), max(times))
    t1 = max(t1, t0 + (1e-3 if span else 1.0))      # a fresh cluster's few samples: a 1 s axis
    top = max([v for pts in series.values() for _, v in pts] + [limit or 0] + [d.memory or 0 for d in deaths]) * 1.08
    left, right, up, down = 58, 10, 8, 36
    pw, ph = width - left - right, height - up - down
    def x(t: float) -> float:
        return left + (t - t0) / (t1 - t0) * pw
    def y(v: float) -> float:
        return up + ph - (v / top if top else 0) * ph
    parts = [f'<svg class="lc-timeline" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" data-t0="{t0:.6f}" data-t1="{t1:.6f}" data-left="{left}" '
             f'data-width="{pw}" style="{FONT};font-size:10px;background:#fff">',
             f'<rect x="{left}" y="{up}" width="{pw}" height="{ph}" fill="#fafafa" stroke="#ddd"/>']
    parts += _limit_lines(limit, fractions, y, left, pw)
    parts += _axes(t0, t1, top, x, y, left, up + ph)
    for i, (name, pts) in enumerate(series.items()):
        colour = WORKER_COLOURS[i % len(WORKER_COLOURS)]
        if pts:
            path = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in pts if t0 <= t <= t1)
            parts.append(f'<polyline class="lc-memline" data-worker="{e(name)}" points="{path}" fill="none" '
                         f'stroke="{colour}" stroke-width="1.5"><title>{e(name)}</title></polyline>')
    shown = sorted((d for d in deaths if t0 <= d.time <= t1), key=lambda d: d.time)
    rows = label_rows([(x(d.time), len(d.cause), x(d.time) > left + 0.8 * pw) for d in shown], max(1, (ph - 4) // 11))
    for d, row in zip(shown, rows):      # deaths come in bursts: each label on the first row where it fits
        parts.append(_death_marker(d, x(d.time), y(d.memory or 0), up, up + ph, x(d.time) > left + 0.8 * pw,
                                   None if row is None else up + 10 + 11 * row))
    parts.append(_legend(list(series), left, height - 4))
    parts.append("</svg>")
    return "".join(parts)


CHAR_WIDTH = 6.0       # a generous width of one character of the 10 px labels, in SVG units


def label_extent(x: float, chars: int, leftwards: bool) -> tuple:
    """The horizontal extent of a label of ``chars`` characters anchored at ``x``."""
    width = chars * CHAR_WIDTH + 4
    return (x - 3 - width, x - 3) if leftwards else (x + 3, x + 3 + width)


def label_rows(labels: list, rows: int) -> list:
    """For labels (x, characters, leftwards) in time order, the row of each (0 is the top):
    the first row where it overlaps no label placed before it; None (no label, the marker
    and its tooltip stay) when all ``rows`` are taken there."""
    ends: list = []          # per row, the extents placed on it
    out: list = []
    for x, chars, leftwards in labels:
        a, b = label_extent(x, chars, leftwards)
        for row in range(rows):
            if row == len(ends):
                ends.append([])
            if all(b <= c or a >= d for c, d in ends[row]):
                ends[row].append((a, b))
                out.append(row)
                break
        else:
            out.append(None)
    return out


def tick_labels(t0: float, t1: float, n: int) -> list:
    """``n + 1`` labels from 0 to ``t1 - t0`` seconds, with as many decimals as it takes for
    neighbours to differ (a span of a few milliseconds must not read "0.0 s" on every tick)."""
    span = max(t1 - t0, 0.0)
    for decimals in range(1, 5):
        labels = [f"{span * i / n:.{decimals}f} s" for i in range(n + 1)]
        if len(set(labels)) == len(labels):
            break
    return labels


def _limit_lines(limit: Optional[int], fractions: dict, y: Any, left: float, pw: float) -> list:
    if not limit:
        return []
    out = [f'<line x1="{left}" x2="{left + pw}" y1="{y(limit):.1f}" y2="{y(limit):.1f}" stroke="#000" '
           f'stroke-width="1"><title>memory_limit {e(format_bytes(limit))}</title></line>']
    for k, label, colour in LINES:
        if fractions.get(k):
            yy = y(limit * fractions[k])
            out.append(f'<line class="lc-limit" data-line="{label}" x1="{left}" x2="{left + pw}" y1="{yy:.1f}" '
                       f'y2="{yy:.1f}" stroke="{colour}" stroke-dasharray="4 3"/>'
                       f'<text x="{left + 3}" y="{yy - 2:.1f}" fill="{colour}">{label}</text>')
    return out


def _legend(names: list, left: float, base: float) -> str:
    out, at = [], left
    for i, name in enumerate(names[:12]):
        colour = WORKER_COLOURS[i % len(WORKER_COLOURS)]
        out.append(f'<rect x="{at}" y="{base - 7}" width="10" height="3" fill="{colour}"/>'
                   f'<text class="lc-legend-name" x="{at + 13}" y="{base}" fill="#333">{e(name)}</text>')
        at += 20 + 6 * len(name)
    if len(names) > 12:
        out.append(f'<text x="{at}" y="{base}" fill="#333">and {len(names) - 12} more</text>')
    return "".join(out)


def _axes(t0: float, t1: float, top: float, x: Any, y: Any, left: float, bottom: float) -> list:
    out = []
    for i in range(5):
        v = top * i / 4
        out.append(f'<text x="{left - 4}" y="{y(v) + 3:.1f}" text-anchor="end" fill="#555">'
                   f'{e(format_bytes(v) if v else "0")}</text>')
    for i, label in enumerate(tick_labels(t0, t1, 5)):
        t = t0 + (t1 - t0) * i / 5
        out.append(f'<text class="lc-tick" x="{x(t):.1f}" y="{bottom + 14}" text-anchor="middle" fill="#555">'
                   f'{label}</text>')
    return out


def _death_marker(d: Any, xx: float, yy: float, top: float, bottom: float, label_left: bool,
                  label_y: Optional[float]) -> str:
    colour = CAUSE_COLOURS.get(d.cause, "#616161")
    what = f"{d.worker} died: {d.cause}" + (f", {d.signal}" if d.signal else "")
    if d.memory is not None:
        what += f", {format_bytes(d.memory)}"
    return (f'<g class="lc-death" data-worker="{e(d.worker)}" data-cause="{e(d.cause)}" data-time="{d.time:.6f}">'
            f'<title>{e(what)}</title>'
            f'<line x1="{xx:.1f}" x2="{xx:.1f}" y1="{top}" y2="{bottom}" stroke="{colour}" stroke-width="1" '
            f'stroke-dasharray="2 2"/>'
            f'<circle cx="{xx:.1f}" cy="{yy:.1f}" r="5" fill="{colour}" stroke="#fff"/>'
            + ("" if label_y is None else
               f'<text class="lc-death-label" x="{xx - 3 if label_left else xx + 3:.1f}" y="{label_y}" '
               f'fill="{colour}" text-anchor="{"end" if label_left else "start"}">{e(d.cause)}</text>')
            + '</g>')


# --- deaths -------------------------------------------------------------------------------

def death_card(d: Any, fractions: Optional[dict] = None) -> str:
    """One WorkerDeath: cause badge, who, signal, memory against the limit, the crashing
    frames and the message; the log tail folded."""
    facts = [f"<b>{e(d.worker)}</b> (pid {d.pid})", cause_badge(d.cause)]
    if d.signal:
        facts.append(f"<code>{e(d.signal)}</code>")
    elif d.exitcode is not None:
        facts.append(f"exit code {d.exitcode}")
    if d.tasks:
        shown = ", ".join(f"<code>{e(k)}</code>" for k in d.tasks[:3])
        facts.append("running " + shown + (f" and {len(d.tasks) - 3} more" if len(d.tasks) > 3 else ""))
    parts = [f'<div class="lc-death-card" data-cause="{e(d.cause)}" style="border-left:4px solid '
             f'{CAUSE_COLOURS.get(d.cause, "#616161")};padding:4px 10px;margin:6px 0;{FONT}">',
             f'<div>{" · ".join(facts)}</div>']
    if d.memory is not None:
        parts.append(f"<div>memory {memory_bar(d.memory, d.memory_limit, fractions or {})}"
                     + (f" (peak {e(format_bytes(d.peak_memory))})" if d.peak_memory else "") + "</div>")
    if d.stack:
        parts.append(f'<pre class="lc-stack" style="{MONO};background:#fff3f3;padding:4px;margin:4px 0;'
                     f'white-space:pre-wrap">{e(d.stack)}</pre>')
    parts.append(f'<div class="lc-message" style="margin:4px 0">{e(d.message)}</div>')
    if d.log_tail:
        parts.append(f'<details class="lc-log"><summary>log tail ({len(d.log_tail)} lines)</summary>'
                     f'<pre style="{MONO};white-space:pre-wrap">{e(chr(10).join(d.log_tail))}</pre></details>')
    parts.append("</div>")
    return "".join(parts)


def killed_worker(task: str, allowed_failures: int, deaths: Iterable[Any], text: str) -> str:
    deaths = list(deaths)
    head = (f'<div class="lc-killed" style="{FONT}"><div><b>KilledWorker</b>: task <code>{e(task)}</code> '
            f'was running on {len(deaths)} worker{"s" if len(deaths) != 1 else ""} that died '
            f'(allowed_failures={allowed_failures})</div>')
    advice = text.strip().splitlines()
    tail = [line for line in advice[1:] if not line.startswith(" ")]
    return (head + "".join(death_card(d) for d in deaths)
            + "".join(f"<div>{e(line)}</div>" for line in tail) + "</div>")


# --- clusters, clients, futures ----------------------------------------------------------------

def cluster_view(title: str, workers: Iterable[Any], fractions: dict, series: dict,
                 deaths: Iterable[Any], limit: Optional[int]) -> str:
    """Per worker: pid, state, tasks running, memory against the limit; then the memory
    timeline with every death on it, and the last deaths."""
    deaths, workers = list(deaths), list(workers)
    # every worker in the legend, a worker not sampled yet too (its line comes with its first sample)
    series = {**series, **{w.name: [] for w in workers if w.name not in series}}
    rows = [[e(w.name), str(w.pid), e(w.status), str(len(w.processing)),
             memory_bar(w.memory, w.memory_limit, fractions), _split(w)] for w in workers]
    parts = [f'<div class="lc-cluster" style="{FONT}"><div style="font-weight:600;margin-bottom:4px">{e(title)}</div>',
             table(("worker", "pid", "state", "tasks", "memory", "results held / unmanaged"), rows, "lc-workers"),
             '<div style="margin-top:6px">memory over time</div>',
             memory_timeline(series, limit, fractions, deaths)]
    if deaths:
        shown = deaths[-5:]
        parts.append(f'<details class="lc-deaths"><summary>{len(deaths)} worker death'
                     f'{"s" if len(deaths) != 1 else ""}{" (last 5)" if len(deaths) > 5 else ""}</summary>'
                     + "".join(death_card(d, fractions) for d in reversed(shown)) + "</details>")
    parts.append("</div>")
    return "".join(parts)


def _split(w: Any) -> str:
    """Results the worker holds (managed, spillable) against what its tasks' own code keeps."""
    unmanaged = getattr(w, "unmanaged", None)
    if unmanaged is None:       # not sampled yet: a worker starting
        return '<span class="lc-split">unknown</span>'
    reusable = getattr(w, "reusable", 0)
    warm = f" (+{e(format_bytes(reusable))} kept for reuse)" if reusable else ""
    return (f'<span class="lc-split" title="results held in memory (spilled: {e(format_bytes(w.spilled))}) / '
            f'the rest of its memory, kept by the tasks\' own code; kept for reuse: memory the worker '
            f'keeps warm for the next large value, given back after a second unused">{e(format_bytes(w.managed))} / '
            f'{e(format_bytes(unmanaged))}{warm}</span>')


STATUS_COLOURS = {"pending": "#757575", "finished": "#2e7d32", "error": "#c62828", "lost": "#ef6c00",
                  "cancelled": "#616161"}


def future_view(key: str, status: str, detail: str = "") -> str:
    return (f'<div class="lc-future" style="{FONT}"><b>Future</b> '
            f'{badge(status, STATUS_COLOURS.get(status, "#616161"))} <code>{e(key)}</code>'
            + (f'<div style="{MONO};white-space:pre-wrap;margin-top:2px">{e(detail)}</div>' if detail else "")
            + "</div>")


# --- the task stream -----------------------------------------------------------------------

STREAM_LIMIT = 20_000      # task bars drawn; the newest are kept
GROUP_COLOURS = ("#4e79a7", "#59a14f", "#edc948", "#b07aa1", "#76b7b2", "#ff9da7", "#9c755f", "#bab0ac",
                 "#f28e2b", "#86bcb6")


def task_stream(lanes: list, records: list, deaths: Iterable[Any], span: tuple, width: int = 900,
                limit: int = STREAM_LIMIT) -> str:
    """Each task as a bar on the lane of its worker thread, coloured by function; an error
    outlined red, a run its worker's death cut short hatched, each death a line across its
    worker's lanes. A task submitted by a task says which (its tooltip, ``data-submitter``).
    ``lanes``: [(worker, thread)] top to bottom; ``records``: TaskRecords."""
    t0, t1 = span
    t1 = max(t1, t0 + 1e-3)
    lane_h, left, top = 16, 150, 6
    shown = records[-limit:]
    index = {lane: i for i, lane in enumerate(lanes)}
    height = top + lane_h * len(lanes) + 30
    pw = width - left - 10
    def x(t: float) -> float:
        return left + (min(max(t, t0), t1) - t0) / (t1 - t0) * pw
    groups: dict = {}
    parts = [f'<svg class="lc-stream" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" data-t0="{t0:.6f}" data-t1="{t1:.6f}" data-left="{left}" '
             f'data-width="{pw}" style="{FONT};font-size:10px;background:#fff">',
             '<defs><pattern id="lc-hatch" width="4" height="4" patternUnits="userSpaceOnUse" '
             'patternTransform="rotate(45)"><rect width="2" height="4" fill="#ef6c00"/></pattern></defs>']
    for i, (worker, thread) in enumerate(lanes):
        yy = top + i * lane_h
        parts.append(f'<rect x="{left}" y="{yy}" width="{pw}" height="{lane_h - 2}" fill="{"#f7f7f7" if i % 2 else "#fff"}"/>'
                     f'<text x="{left - 4}" y="{yy + 11}" text-anchor="end" fill="#333">{e(worker)} · {thread}</text>')
    for r in shown:
        i = index.get((r.worker, r.thread))
        if i is not None:
            parts.append(_task_bar(r, x, top + i * lane_h, lane_h, groups))
    for d in deaths:
        rows = [i for (w, _t), i in index.items() if w == d.worker]
        if rows and t0 <= d.time <= t1:
            parts.append(_stream_death(d, x(d.time), top + min(rows) * lane_h, top + (max(rows) + 1) * lane_h))
    parts.append(_stream_axis(t0, t1, x, top + len(lanes) * lane_h + 12))
    parts.append("</svg>")
    return "".join(parts) + _group_legend(groups)


def _task_bar(r: Any, x: Any, yy: float, lane_h: int, groups: dict) -> str:
    group = key_group(r.key)
    colour = groups.setdefault(group, GROUP_COLOURS[len(groups) % len(GROUP_COLOURS)])
    fill = "url(#lc-hatch)" if r.status == "lost" else colour
    stroke = ' stroke="#c62828" stroke-width="1.5"' if r.status == "error" else ""
    w = max(1.0, x(r.stop) - x(r.start))
    by, submitted = ("", "") if r.submitter is None else (
        f' data-submitter="{e(r.submitter)}"', f", submitted by task {e(r.submitter)}")
    return (f'<rect class="lc-task" data-status="{r.status}" data-group="{e(group)}"{by} x="{x(r.start):.1f}" '
            f'y="{yy + 1}" width="{w:.1f}" height="{lane_h - 4}" fill="{fill}"{stroke}>'
            f'<title>{e(r.key)}: {r.status}, {r.stop - r.start:.3f} s{submitted}</title></rect>')


def _stream_death(d: Any, xx: float, y0: float, y1: float) -> str:
    colour = CAUSE_COLOURS.get(d.cause, "#616161")
    return (f'<g class="lc-death" data-worker="{e(d.worker)}" data-cause="{e(d.cause)}" data-time="{d.time:.6f}">'
            f'<title>{e(d.worker)} died: {e(d.cause)}</title>'
            f'<line x1="{xx:.1f}" x2="{xx:.1f}" y1="{y0}" y2="{y1}" stroke="{colour}" stroke-width="2"/>'
            f'<path d="M{xx - 4:.1f},{y0 - 1} l4,5 l4,-5 z" fill="{colour}"/></g>')


def _stream_axis(t0: float, t1: float, x: Any, base: float) -> str:
    return "".join(f'<text class="lc-tick" x="{x(t0 + (t1 - t0) * i / 6):.1f}" y="{base}" text-anchor="middle" '
                   f'fill="#555">{label}</text>' for i, label in enumerate(tick_labels(t0, t1, 6)))


def _group_legend(groups: dict) -> str:
    items = "".join(f'<span style="margin-right:12px"><span style="display:inline-block;width:10px;height:10px;'
                    f'background:{c}"></span> {e(g)}</span>' for g, c in groups.items())
    items += ('<span style="margin-right:12px"><span style="display:inline-block;width:10px;height:10px;'
              'border:2px solid #c62828"></span> error</span><span><span style="display:inline-block;width:10px;'
              'height:10px;background:repeating-linear-gradient(45deg,#ef6c00 0 2px,#fff 2px 4px)"></span> '
              'lost with its worker</span>')
    return f'<div class="lc-legend" style="{FONT};margin:2px 0 8px">{items}</div>'
