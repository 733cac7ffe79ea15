#!/usr/bin/env python
"""The dispatcher and the scheduler's cost a task, in this process, without workers.

    python benchmarks/dispatch_cost.py

A burst of 20,000 one-task submits through ``Dispatcher.submit`` (deferred, admitted 64 at
a time), then their Finished messages in frames of 8 through ``Dispatcher.on_worker_messages``:
the process time of each part divided by the tasks, best of 3. No socket, no worker, no
other thread: what the door and its bookkeeping cost, nearly unmoved by the machine's load.
Runs against commits from before the door too (their event methods), for paired A/B runs in
two checkouts (benchmarks/README.md, "The scheduler's one door").
"""
from __future__ import annotations

import threading
import time
from typing import Any

from localcluster.engine import dispatch
from localcluster.engine.dispatch import Dispatcher
from localcluster.engine.lifecycle import Lifecycle
from localcluster.scheduler import state as S
from localcluster.scheduler.records import Spec
from localcluster.wire import protocol as P
from localcluster.wire.serialize import dumps

try:
    from localcluster.engine.history import History
except ImportError:             # before it moved from views
    from localcluster.views.history import History  # type: ignore[no-redef]
try:
    from localcluster.scheduler import events as E
except ImportError:             # before the door: the scheduler's event methods
    E = None

ARGS, SMALL = dumps(((), {})), dumps(1)


class Loop:
    """The scheduler thread's loop, absent: every call comes from this thread."""

    def on_loop(self) -> bool:
        return False

    def wake(self) -> None:
        pass

    def run_soon(self, fn: Any) -> None:
        pass


class Listener:
    """A listener that resolves nothing."""

    def resolve(self, *args: Any) -> None:
        pass

    def fail_pending(self, exc: BaseException) -> None:
        pass


def one(n: int = 20000) -> tuple:
    s = S.Scheduler()
    lock = threading.Lock()
    d = Dispatcher(lock, threading.Condition(lock), s, Loop(), History(), Lifecycle())
    d.attach(Listener())
    for w in ("w1", "w2"):
        d.event(E.AddWorker(w, 4)) if E else d.event(s.add_worker, w, 4)
    specs = [[Spec(f"k{i}", 1, b"fn", ARGS, ())] for i in range(n)]
    t0 = time.process_time()
    for sp in specs:
        d.submit(sp, None, list)
    (d.end_burst if hasattr(d, "end_burst") else d.settle)()
    t1 = time.process_time()
    done = 0
    while done < n:
        by: dict = {}
        for ts in s.tasks.values():
            if ts.state == "processing":
                by.setdefault(ts.worker, []).append(ts.seq)
        for w, seqs in by.items():
            for i in range(0, len(seqs), 8):
                frame = [P.Finished(q, 8, "int", SMALL, 0.0) for q in seqs[i:i + 8]]
                d.on_worker_messages(w, frame)
                done += len(frame)
    t2 = time.process_time()
    return (t1 - t0) / n * 1e6, (t2 - t1) / n * 1e6


if __name__ == "__main__":
    dispatch.BURST = 3600.0     # every submit is part of the burst
    results = [one() for _ in range(3)]
    print(f"burst submit {min(r[0] for r in results):.2f} us a task; "
          f"finishing {min(r[1] for r in results):.2f} us a task")
