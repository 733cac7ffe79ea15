"""tests/unit starts no process: a test here that starts one (a cluster's workers, a
subprocess, a fork) fails, and belongs in tests/integration."""
from __future__ import annotations

import sys

import pytest

# the audit events of every way this interpreter starts a process
_STARTS = {"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.system", "os.exec"}
_seen: list = []
_watching = [False]


def _audit(event: str, args: tuple) -> None:
    if _watching[0] and event in _STARTS:
        _seen.append(f"{event}{args[:2]!r}")


sys.addaudithook(_audit)      # for the rest of the session: a hook cannot be removed, so it is switched


@pytest.fixture(autouse=True)
def starts_no_process():
    _seen.clear()
    _watching[0] = True
    try:
        yield
    finally:
        _watching[0] = False
    assert not _seen, f"a unit test started a process ({_seen[0]}): move it to tests/integration"
