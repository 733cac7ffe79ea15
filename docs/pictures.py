"""Redraw the documentation's three pictures from real runs: docs/report.png (examples/report.py's
page), docs/notebook.png (the cluster view of examples/notebook.ipynb, executed by a
real kernel and exported by nbconvert) and docs/live.png (cluster.dashboard() served by
Voilà while work runs, a segfault among it). Needs the test extra and Chromium on the PATH:

    pip install -e ".[test]" && python docs/pictures.py
"""
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

RUN_NOTEBOOK = """
import sys
import nbformat
from nbclient import NotebookClient
from nbconvert import HTMLExporter
nb = nbformat.read(sys.argv[1], as_version=4)
NotebookClient(nb, timeout=120, kernel_name="python3").execute()
open(sys.argv[2], "w", encoding="utf-8").write(HTMLExporter().from_notebook_node(nb)[0])
"""


def shoot(page_path: Path, png: Path, selector: str, nth: int = 0) -> None:
    from playwright.sync_api import sync_playwright
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 980, "height": 900}, device_scale_factor=1)
        page.goto(page_path.as_uri())
        page.locator(selector).nth(nth).screenshot(path=str(png))
        browser.close()


LIVE_CELLS = [
    "import ctypes, time\nfrom localcluster import Client\n"
    "client = Client(n_workers=2, memory_limit='400MiB', allowed_failures=0, forward_logs=False)\n"
    "view = client.cluster.dashboard(interval=0.5)\nview",
    "def crash():\n    ctypes.string_at(0)\n\n"
    "def load(i):\n    time.sleep(0.4)\n    return bytearray(2**20 * (i % 7))\n\n"
    "def fit(x):\n    time.sleep(0.9)\n    return len(x)\n\n"
    "parts = client.map(load, range(60))\nmodels = client.map(fit, parts)\nboom = client.submit(crash)",
]


def shoot_live(png: Path, tmp: str) -> None:
    """cluster.dashboard() in Voilà, shot once a death and some tasks are done, work still running."""
    import nbformat
    from playwright.sync_api import sync_playwright
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in LIVE_CELLS]
    path = Path(tmp) / "live.ipynb"
    nbformat.write(nb, str(path))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    voila = shutil.which("voila", path=os.path.dirname(sys.executable)) or "voila"
    server = subprocess.Popen([voila, str(path), "--no-browser", f"--port={port}", "--Voila.ip=127.0.0.1"],
                              cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1000, "height": 1000}, device_scale_factor=1)
            page.goto(f"http://127.0.0.1:{port}/", timeout=90_000)
            page.wait_for_function("() => { const h = document.querySelector('.lc-live-head');"
                                   " return h && h.innerText.includes('last death')"
                                   " && / [1-9][0-9]* running/.test(h.innerText); }", timeout=90_000, polling=200)
            page.locator(".widget-vbox").filter(has=page.locator(".lc-live-head")).first.screenshot(path=str(png))
            browser.close()
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(30)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.html"
        # run from a copy, so the crash frames in the picture name a throwaway path, not this checkout
        script = Path(shutil.copy(ROOT / "examples" / "report.py", tmp))
        subprocess.run([sys.executable, str(script), str(report)], check=True, cwd=tmp)
        shoot(report, HERE / "report.png", "body")
        notebook = Path(tmp) / "notebook.html"
        subprocess.run([sys.executable, "-c", RUN_NOTEBOOK, str(ROOT / "examples" / "notebook.ipynb"), str(notebook)],
                       check=True, cwd=tmp, env=dict(os.environ, PYDEVD_DISABLE_FILE_VALIDATION="1"))
        shoot(notebook, HERE / "notebook.png", ".lc-cluster", nth=-1)
        shoot_live(HERE / "live.png", tmp)
    print("wrote", HERE / "report.png", HERE / "notebook.png", "and", HERE / "live.png")


if __name__ == "__main__":
    main()
