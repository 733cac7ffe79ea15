"""Helpers shared by the tests."""
from __future__ import annotations

import time


def wait_for(predicate, timeout: float = 30.0) -> None:
    """Poll ``predicate`` until it holds. Only for state that another process changes and
    that no event announces (a worker's garbage collection, its heartbeat spilling);
    everything else waits on the event itself."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)
