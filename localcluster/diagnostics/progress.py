"""``progress(futures)``: a text progress bar that returns when every future is done."""
from __future__ import annotations

import concurrent.futures as cf
import sys
import threading
import time
from typing import Any, Optional, TextIO


def progress(*futures: Any, file: Optional[TextIO] = None, width: int = 40, interval: float = 0.1) -> None:
    """Draw ``[#####     ] 5/10 done, 1 erred`` on ``file`` (stderr) until all futures are done."""
    from ..future import walk
    fs = [f for group in futures for f in walk(group)]
    total = len(fs)
    out = file if file is not None else sys.stderr
    done_event = threading.Event()
    counts = {"done": 0, "erred": 0}
    lock = threading.Lock()

    def on_done(f: cf.Future) -> None:
        with lock:
            counts["done"] += 1
            if f.cancelled() or f.exception() is not None:
                counts["erred"] += 1
            if counts["done"] == total:
                done_event.set()

    for f in fs:
        cf.Future.add_done_callback(f, on_done)
    if total == 0:
        done_event.set()
    start = time.monotonic()

    def draw(final: bool = False) -> None:
        with lock:
            d, e = counts["done"], counts["erred"]
        filled = int(width * d / total) if total else width
        line = f"\r[{'#' * filled}{' ' * (width - filled)}] {d}/{total} done"
        if e:
            line += f", {e} erred"
        line += f" | {time.monotonic() - start:.1f}s"
        out.write(line + ("\n" if final else ""))
        out.flush()

    while not done_event.wait(interval):
        draw()
    draw(final=True)
