"""``cluster.insights()``: where each worker's time went, and the slowest tasks.

Everything is read from what the cluster keeps anyway (``history.py``): each run's start,
duration and (un)pickling seconds as its worker reported them with its ``Finished``, each
worker's start-up (spawn to ready) and each death. Nothing more is recorded per task.

Per worker (a replacement is a worker of its own, with its own name):

- ``tasks``: runs that ended (finished or failed) on it;
- ``busy``: seconds in the tasks' functions; ``serde``: seconds unpickling their
  functions and arguments and pickling their results (both summed over its threads);
- ``transfer``: seconds it spent moving data for others and for itself: serving the data
  other workers and the client fetch from it, and storing what is sent to it (its status
  board counts them, on the thread that reads its channel); None when never read;
- ``idle``: its thread-seconds from ready to now (or its death) spent on none of these;
- ``startup``: seconds from spawn to ready; ``lost``: run time its death cut short
  (work done again elsewhere).
"""
from __future__ import annotations

import html
import reprlib
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Optional

from . import render

__all__ = ["Insights", "WorkerInsight", "SlowTask", "insights", "summarize_args"]

SLOWEST = 10


@dataclass
class WorkerInsight:
    name: str
    tasks: int = 0
    busy: float = 0.0
    idle: float = 0.0
    serde: float = 0.0
    startup: Optional[float] = None
    lost: float = 0.0
    transfer: Optional[float] = None
    alive: float = 0.0        # thread-seconds from ready to now or its death
    died: Optional[str] = None   # its cause of death, if it died


@dataclass
class SlowTask:
    key: str
    duration: float
    worker: str
    args: str
    status: str = "finished"


@dataclass
class Insights:
    workers: list = field(default_factory=list)
    slowest: list = field(default_factory=list)

    @property
    def busy(self) -> float:
        return sum(w.busy for w in self.workers)

    @property
    def tasks(self) -> int:
        return sum(w.tasks for w in self.workers)

    def __str__(self) -> str:
        heads = ("worker", "tasks", "busy s", "idle s", "serde s", "transfer s", "start-up s", "lost s", "died")
        rows = [(w.name, str(w.tasks), f"{w.busy:.2f}", f"{w.idle:.2f}", f"{w.serde:.3f}", _seconds(w.transfer, 3),
                 _seconds(w.startup), f"{w.lost:.2f}", w.died or "") for w in self.workers]
        out = [_text_table(heads, rows)]
        if self.slowest:
            out += ["", "slowest tasks:",
                    _text_table(("key", "seconds", "worker", "arguments"),
                                [(t.key, f"{t.duration:.3f}", t.worker, t.args) for t in self.slowest])]
        return "\n".join(out)

    def html(self) -> str:
        e = html.escape
        rows = [[e(w.name), str(w.tasks), _bar(w), f"{w.busy:.2f}", f"{w.idle:.2f}", f"{w.serde:.3f}",
                 _seconds(w.transfer, 3), _seconds(w.startup), f"{w.lost:.2f}",
                 render.cause_badge(w.died) if w.died else ""] for w in self.workers]
        parts = [render.table(("worker", "tasks", "time", "busy s", "idle s", "serde s", "transfer s", "start-up s",
                               "lost s", "died"), rows, "lc-insights")]
        if self.slowest:
            slow = [[f"<code>{e(t.key)}</code>", f"{t.duration:.3f}", e(t.worker), f"<code>{e(t.args)}</code>"]
                    for t in self.slowest]
            parts += ['<div style="margin-top:6px;font-weight:600">slowest tasks</div>',
                      render.table(("key", "seconds", "worker", "arguments"), slow, "lc-slowest")]
        return f'<div class="lc-insights-view" style="{render.FONT}">' + "".join(parts) + "</div>"

    def _repr_html_(self) -> str:
        return self.html()


def _seconds(value: Optional[float], decimals: int = 2) -> str:
    return "-" if value is None else f"{value:.{decimals}f}"


def _bar(w: WorkerInsight, width: int = 160) -> str:
    """Busy, (de)serializing, moving data, lost and idle as shares of one bar."""
    moving = w.transfer or 0.0
    total = (w.busy + w.serde + moving + w.lost + w.idle) or 1.0
    parts = "".join(f'<span title="{label} {v:.2f} s" style="display:inline-block;height:10px;'
                    f'width:{v / total * width:.1f}px;background:{c}"></span>'
                    for label, v, c in (("busy", w.busy, "#43a047"), ("serde", w.serde, "#1565c0"),
                                        ("transfer", moving, "#f9a825"), ("lost", w.lost, "#c62828"),
                                        ("idle", w.idle, "#e0e0e0")) if v > 0)
    return f'<span class="lc-timebar" style="display:inline-block;width:{width}px;white-space:nowrap">{parts}</span>'


def _text_table(heads: tuple, rows: list) -> str:
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(heads)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()   # noqa: E731
    return "\n".join([line(heads), line(["-" * w for w in widths])] + [line(r) for r in rows])


def insights(records: Iterable[Any], startups: Iterable[tuple], deaths: Iterable[Any], threads: int,
             args_of: Callable[[str], str] = lambda key: "", now: Optional[float] = None,
             slowest: int = SLOWEST, transfers: Optional[Mapping[str, float]] = None) -> Insights:
    """From TaskRecords, (worker, ready at, start-up seconds) and WorkerDeaths (their
    ``worker``, ``time`` and ``cause``); ``threads`` per worker; ``args_of(key)``: the
    argument summary of a slow task; ``transfers``: worker -> seconds it moved data."""
    now = time.time() if now is None else now
    workers: dict[str, WorkerInsight] = {}
    ready: dict[str, float] = {}
    for name, t, seconds in startups:
        workers.setdefault(name, WorkerInsight(name)).startup = seconds
        ready[name] = t
    ended = {d.worker: d for d in deaths}
    top: list = []
    for r in records:
        w = workers.get(r.worker) or workers.setdefault(r.worker, WorkerInsight(r.worker))
        ran = r.stop - r.start
        if r.status == "lost":
            w.lost += ran
            continue
        w.tasks += 1
        w.busy += ran - r.serde
        w.serde += r.serde
        ready.setdefault(r.worker, r.start)
        top.append((ran, r))
    for name, seconds in (transfers or {}).items():
        workers.setdefault(name, WorkerInsight(name)).transfer = seconds
    for name, w in workers.items():
        death = ended.get(name)
        w.died = death.cause if death is not None else None
        since = ready.get(name)
        if since is not None:
            w.alive = max(0.0, ((death.time if death is not None else now) - since) * threads)
            w.idle = max(0.0, w.alive - w.busy - w.serde - (w.transfer or 0.0) - w.lost)
    top.sort(key=lambda p: p[0], reverse=True)
    slow = [SlowTask(r.key, ran, r.worker, args_of(r.key), r.status) for ran, r in top[:slowest]]
    return Insights(sorted(workers.values(), key=lambda w: render_order(w.name)), slow)


def render_order(name: str) -> tuple:
    head, _, tail = name.rpartition("-")
    return (head, int(tail)) if tail.isdigit() else (name, -1)


SHOWN_ARGS_BYTES = 1 << 16


def summarize_args(payload: Any, width: int = 80) -> str:
    """A short repr of a task's pickled (args, kwargs): unpickled here only when small and
    self-contained (no out-of-band buffers); otherwise its size."""
    if payload is None:
        return "(no arguments kept)"
    meta = payload.meta
    if payload.buffers or not isinstance(meta, bytes) or len(meta) > SHOWN_ARGS_BYTES:
        return f"({payload.nbytes:,} bytes pickled)"
    from ..wire import serialize
    try:
        args, kwargs = serialize.loads(payload)
    except Exception:  # a placeholder of a future it depends on, or a class gone since
        return f"({payload.nbytes:,} bytes pickled)"
    short = reprlib.Repr()
    short.maxstring, short.maxother = 30, 30
    shown = [short.repr(a) for a in args] + [f"{k}={short.repr(v)}" for k, v in kwargs.items()]
    text = ", ".join(shown)
    return text if len(text) <= width else text[:width - 1] + "…"
