"""Redraw the README's two pictures from real runs: docs/report.png (examples/report.py's
page) and docs/notebook.png (the cluster view of examples/notebook.ipynb, executed by a
real kernel and exported by nbconvert). Needs the test extra and Chromium on the PATH:

    pip install -e ".[test]" && python docs/pictures.py
"""
import os
import shutil
import subprocess
import sys
import tempfile
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
    print("wrote", HERE / "report.png", "and", HERE / "notebook.png")


if __name__ == "__main__":
    main()
