"""``with localcluster.live():``: one status block kept up to date on a terminal.

Per cluster open in the block: its workers (running, paused, starting), their memory
against the limit, the tasks done, running and failed, and the last death's line. The
block is drawn by rich (``rich.live``) when it is installed, else as one line by tqdm;
with neither, or when the output is not a terminal, nothing is printed at all.
A thread of its own (``localcluster-live``) redraws it every ``interval`` seconds and
ends with the block.
"""
from __future__ import annotations

import sys
import threading
from collections import Counter
from typing import Any, Callable, Optional, TextIO

from ..cluster import live_clusters, watch
from ..config import check_seconds, format_bytes

__all__ = ["live", "status_lines"]


WIDTH = 80        # columns: a line of the block never wraps on a terminal of the usual width


def status_lines(clusters: list, extra: Optional[Callable[[], str]] = None) -> list:
    """The block's lines for these clusters (one ``cluster.workers`` each, and the history's
    counts), each within ``WIDTH`` columns. Tasks are counted, not runs: a task that failed and
    then succeeded on a retry counts done once and not failed, one run again after its result
    was lost counts once, one given up when its worker died (KilledWorker, a timeout) counts
    failed."""
    lines = []
    for c in clusters:
        if c.status == "closed":
            continue
        workers = list(c.workers.values())
        states = Counter(w.status for w in workers)
        memory = sum(w.memory or 0 for w in workers)
        limit = sum(w.memory_limit or 0 for w in workers)
        running = sum(len(w.running) for w in workers)
        state = ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
        head = f"localcluster: {_count(len(workers), 'worker')}" + (f" ({state})" if state else "")
        lines += _wrapped([head, f"memory {format_bytes(memory)}" + (f" of {format_bytes(limit)}" if limit else ""),
                           f"tasks {c.history.done} done, {running} running, {c.history.failed} failed"
                           + _reused(getattr(c, "journal", None))])
        deaths = c.deaths
        if deaths:
            lines.append(_fit("  last death: " + deaths[-1].headline().removeprefix("localcluster: ")))
    if extra is not None:
        lines.append(_fit(extra()))
    return lines or ["localcluster: no cluster open"]


def _reused(journal: Any) -> str:
    """The tasks a cluster's journal served, when it has one and served any."""
    return f", {journal.reused} reused" if journal is not None and journal.reused else ""


def _count(n: int, thing: str) -> str:
    return f"no {thing}" if n == 0 else f"{n} {thing}{'s' if n != 1 else ''}"


def _wrapped(parts: list) -> list:
    """``parts`` joined by " · ", a line while it fits in ``WIDTH``, then the next indented."""
    lines = [parts[0]]
    for part in parts[1:]:
        if len(lines[-1]) + 3 + len(part) <= WIDTH:
            lines[-1] += " · " + part
        else:
            lines.append("  " + part)
    return [_fit(line) for line in lines]


def _fit(line: str) -> str:
    return line if len(line) <= WIDTH else line[:WIDTH - 1] + "…"


class live:
    """Keep one status block of the clusters up to date while the ``with`` block runs: per
    cluster open in it, its workers (running, paused, starting), their memory against the
    limit, the tasks done, running and failed, and the last death's line. Drawn by rich when
    it is installed, else as one line by tqdm; with neither, or when ``file`` is not a
    terminal, nothing is printed at all.

    Args:
        interval: seconds between redraws, by a thread of its own (``localcluster-live``).
        file: where (stdout by default); drawn only if it is a terminal.
        extra: a function whose text is shown under the block (``progress(live=True)``'s count).

    Raises:
        ValueError: an ``interval`` that is not a positive number of seconds.
    """

    def __init__(self, interval: float = 0.5, file: Optional[TextIO] = None,
                 extra: Optional[Callable[[], str]] = None):
        check_seconds(interval, "live", "interval", none=False)
        self.interval = interval
        self.file = file
        self.extra = extra
        self.clusters: list = []
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._unwatch: Optional[Callable[[], None]] = None
        self.drawn = 0                       # redraws so far (0 when not on a terminal)

    def __enter__(self) -> "live":
        out = self.file if self.file is not None else sys.stdout
        isatty = getattr(out, "isatty", None)
        if not (isatty and isatty()):
            return self
        drawer = _drawer(out)
        if drawer is None:
            return self
        self.clusters = live_clusters()
        self._unwatch = watch(self.clusters.append)
        self._thread = threading.Thread(target=self._run, args=(drawer,), name="localcluster-live", daemon=True)
        self._thread.start()
        return self

    def _run(self, drawer: Any) -> None:
        try:
            while True:
                last = self._stop.wait(self.interval)
                drawer.draw(status_lines(self.clusters, self.extra))
                self.drawn += 1
                if last:
                    break
        finally:
            drawer.close()

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(10)
            if self._unwatch is not None:
                self._unwatch()


def _drawer(out: TextIO) -> Any:
    try:
        from rich.console import Console
        from rich.live import Live
        from rich.text import Text
    except ImportError:
        pass
    else:
        return _Rich(Live(Text(""), console=Console(file=out), auto_refresh=False, transient=False), Text)
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return _Tqdm(tqdm, out)


class _Rich:
    def __init__(self, view: Any, text: type):
        self.view, self.text = view, text
        view.start()

    def draw(self, lines: list) -> None:
        self.view.update(self.text("\n".join(lines)), refresh=True)

    def close(self) -> None:
        self.view.stop()


class _Tqdm:
    def __init__(self, tqdm: Any, out: TextIO):
        class Line(tqdm):
            monitor_interval = 0        # no monitor thread outliving the block
        self.bar = Line(total=0, file=out, bar_format="{desc}", leave=True)

    def draw(self, lines: list) -> None:
        self.bar.set_description_str(" | ".join(line.strip() for line in lines), refresh=True)

    def close(self) -> None:
        self.bar.close()
