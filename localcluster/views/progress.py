"""``progress(futures)``: wait for futures while showing how many are done."""
from __future__ import annotations

import concurrent.futures as cf
import sys
import threading
import time
from typing import Any, NamedTuple, Optional, TextIO


class Progress(NamedTuple):
    finished: int      # ended with a result
    failed: int        # ended with an exception, lost with their data, or cancelled


def progress(*futures: Any, file: Optional[TextIO] = None, interval: float = 0.1, width: int = 40,
             live: bool = False) -> Progress:
    """Block until every future in ``futures`` (Futures, or nested lists/dicts of them) is
    done, drawing a progress bar meanwhile, and return the counts.

    With tqdm installed the bar is ``tqdm.auto``'s: a widget in Jupyter, a text bar in a
    terminal, with ``failed=N`` beside it once a future fails. Without tqdm it is a line
    ``[#####     ] 5/10 done, 1 failed | 2.3 s`` redrawn on ``file`` (stderr by default);
    futures finished from the journal (``LocalCluster(journal=)``), not run, are said beside.
    Failures are counted apart from successes and never stop the wait; nothing is raised
    for them: read the futures (or ``client.gather``) for the errors themselves.

    Args:
        *futures: Futures, or nested lists and dicts of them.
        file: where the bar is drawn (stderr by default; stdout with ``live``).
        interval: seconds between redraws.
        width: the text bar's width in characters, without tqdm.
        live: instead of the bar, ``localcluster.live()``'s status block of the clusters
            (workers, memory, tasks, the last death) with these futures' count under it, on
            ``file`` when it is a terminal.

    Returns:
        ``Progress(finished, failed)``: how many ended with a result, and how many with an
        exception, lost with their data, or cancelled.

    Raises:
        ValueError: an ``interval`` that is not a positive number of seconds.
    """
    from ..config import check_seconds
    from ..client.future import state_of, walk
    check_seconds(interval, "progress", "interval", none=False)
    fs = [f for group in futures for f in walk(group)]
    counts = _Counts(len(fs))
    # finished from the journal (journal.py), not run: said beside the count
    counts.reused = sum(1 for s in map(state_of, fs) if s is not None and s.later() is not None)
    for f in fs:
        cf.Future.add_done_callback(f, counts.done)      # the count only: no need to leave the thread
    if live:
        from .live import live as live_block

        def line() -> str:
            done, failed = counts.read()
            return f"  these futures: {done}/{counts.total} done" + (f", {failed} failed" if failed else "")
        with live_block(interval=max(interval, 0.2), file=file, extra=line):
            counts.all_done.wait()
        return Progress(counts.finished - counts.failed, counts.failed)
    try:
        from tqdm.auto import tqdm
    except ImportError:
        _text(counts, file if file is not None else sys.stderr, interval, width)
    else:
        _tqdm(tqdm, counts, file, interval)
    return Progress(counts.finished - counts.failed, counts.failed)


class _Counts:
    def __init__(self, total: int):
        self.total = total
        self.finished = 0
        self.failed = 0
        self.reused = 0        # of them finished from the journal, not run
        self.lock = threading.Lock()
        self.all_done = threading.Event()
        if total == 0:
            self.all_done.set()

    def done(self, f: cf.Future) -> None:
        with self.lock:
            self.finished += 1
            if f.cancelled() or f.exception() is not None:
                self.failed += 1
            if self.finished == self.total:
                self.all_done.set()

    def read(self) -> tuple:
        with self.lock:
            return self.finished, self.failed


def _tqdm(tqdm: Any, counts: _Counts, file: Optional[TextIO], interval: float) -> None:
    class Bar(tqdm):
        monitor_interval = 0     # we redraw every interval ourselves; tqdm's monitor thread would outlive us
    bar = Bar(total=counts.total, file=file, unit="task", desc="localcluster", mininterval=interval)
    shown = 0
    try:
        while True:
            last = counts.all_done.wait(interval)
            done, failed = counts.read()
            if failed or counts.reused:
                bar.set_postfix(**({"reused": counts.reused} if counts.reused else {}),
                                **({"failed": failed} if failed else {}), refresh=False)
            bar.update(done - shown)
            shown = done
            if last:
                break
    finally:
        bar.close()


def _text(counts: _Counts, out: TextIO, interval: float, width: int) -> None:
    start = time.monotonic()
    while True:
        last = counts.all_done.wait(interval)
        done, failed = counts.read()
        total = counts.total
        filled = int(width * done / total) if total else width
        line = f"\r[{'#' * filled}{' ' * (width - filled)}] {done}/{total} done"
        if counts.reused:
            line += f" ({counts.reused} reused from the journal)"
        if failed:
            line += f", {failed} failed"
        out.write(f"{line} | {time.monotonic() - start:.1f} s" + ("\n" if last else ""))
        out.flush()
        if last:
            return
