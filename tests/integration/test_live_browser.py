"""The dashboard as a user sees it: a notebook served by Voilà (a real kernel, ipywidgets'
own front end), opened in headless Chromium from the system's packages; the widget is
visible and its counts move while the work runs, with nobody touching the page.

The test serves on 127.0.0.1 for the browser; localcluster itself opens no socket."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _util import browser

CELLS = [
    "import time\nfrom localcluster import Client\nclient = Client(n_workers=2, forward_logs=False)\n"
    "view = client.cluster.dashboard(interval=0.5)\nview",
    "futures = client.map(time.sleep, [0.5 + i / 1000 for i in range(16)])",
]




def voila():
    found = shutil.which("voila", path=os.path.dirname(sys.executable)) or shutil.which("voila")
    if found is None:
        if os.environ.get("LOCALCLUSTER_REQUIRE_BROWSER"):
            pytest.fail("no voila (pip install -e '.[test]' installs it)")
        pytest.skip("no voila (pip install voila)")
    return found


def write_notebook(path: Path) -> None:
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in CELLS]
    nbformat.write(nb, str(path))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    """``voila notebook`` on a free port, stopped (with its kernel and workers) on exit."""

    def __init__(self, notebook: Path):
        self.port = free_port()
        self.proc = subprocess.Popen(
            [voila(), str(notebook), "--no-browser", f"--port={self.port}", "--Voila.ip=127.0.0.1",
             "--Voila.show_tracebacks=True"], cwd=notebook.parent, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.url = f"http://127.0.0.1:{self.port}/"

    def wait_listening(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.proc.stderr.read()
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)       # a server coming up: nothing to wait on but its port
        raise TimeoutError(f"voila did not listen on {self.port}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)       # voila shuts its kernels down on SIGINT
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.proc.stderr.close()


def open_page(url: str, fn):
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=browser(), args=["--no-sandbox"])
        try:
            page = b.new_page(viewport={"width": 1100, "height": 900}, device_scale_factor=1)
            page.goto(url, timeout=90_000)
            return fn(page)
        finally:
            b.close()


def counts(page) -> str:
    return page.locator(".lc-live-head .lc-counts").inner_text()


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_the_dashboard_is_visible_in_voila_and_moves_by_itself(tmp_path):
    browser()
    notebook = tmp_path / "live.ipynb"
    write_notebook(notebook)
    served = Served(notebook)
    try:
        served.wait_listening()

        def look(page):
            head = page.locator(".lc-live-head")
            head.wait_for(state="visible", timeout=90_000)
            first = counts(page)
            seen = {first}
            page.wait_for_function("() => document.querySelector('.lc-live-head .lc-counts').innerText"
                                   ".includes('16 done')", timeout=60_000, polling=200)
            seen.add(counts(page))
            box = page.locator(".lc-live-workers").bounding_box()
            workers = page.locator(".lc-live-workers").inner_text()
            tabs = page.locator(".lm-TabBar-tab, .p-TabBar-tab").all_inner_texts()
            return first, seen, box, workers, tabs
        first, seen, box, workers, tabs = open_page(served.url, look)
    finally:
        served.stop()
    assert "16 done" not in first and len(seen) >= 2, (first, seen)
    assert box["width"] > 400 and box["height"] > 100, box
    assert "worker-0" in workers and "worker-1" in workers
    assert [t.strip() for t in tabs][:4] == ["workers", "progress", "task stream", "insights"], tabs
