"""``localcluster.progress``: tqdm's bar when tqdm is installed, a text line otherwise;
failures counted apart from successes, with real tasks on real workers."""
from __future__ import annotations

import io
import sys

import pytest

import localcluster


def inc(x):
    return x + 1


def fail_on_odd(x):
    if x % 2:
        raise ValueError(x)
    return x


def test_tqdm_bar_counts_failures_apart(client):
    pytest.importorskip("tqdm")
    out = io.StringIO()
    fs = client.map(fail_on_odd, range(10))
    assert localcluster.progress(fs, file=out) == (5, 5)
    assert all(f.done() for f in fs)
    text = out.getvalue()
    assert "localcluster" in text and "10/10" in text and "failed=5" in text


def test_text_line_without_tqdm(client, monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)         # as if tqdm were not installed
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    out = io.StringIO()
    ok = client.map(inc, range(6))
    bad = client.map(fail_on_odd, [1, 3])
    result = localcluster.progress({"ok": ok}, [bad], file=out)
    assert result.finished == 6 and result.failed == 2
    last = out.getvalue().rstrip("\n").split("\r")[-1]
    assert last.startswith("[" + "#" * 40 + "] 8/8 done, 2 failed | ") and last.endswith(" s")


def test_nothing_to_wait_for_and_bad_interval(monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    out = io.StringIO()
    assert localcluster.progress([], file=out) == (0, 0)
    assert "0/0 done" in out.getvalue()
    with pytest.raises(ValueError, match="interval=0"):
        localcluster.progress([], interval=0)
