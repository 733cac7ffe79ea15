"""A real Jupyter kernel: functions and classes defined in notebook cells run on workers,
and worker output shows up in the cell that caused it.

nbclient runs in a subprocess of its own: jupyter_client leaves ZMQ sockets to the
garbage collector, which this suite's strict warnings and leak checks would blame on us.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from _util import require

# nbclient runs in the child; here only whether it is there (importing it takes 2.5 s)
require('nbclient', 'ipykernel')

CELLS = [
    "from localcluster import Client\nclient = Client(n_workers=2)",
    "def cube(x):\n    return x ** 3\n\nclass Box:\n    def __init__(self, v):\n        self.v = v\n\n"
    "print(client.submit(lambda b: cube(b.v), Box(3)).result(30))",
    "import sys, time\n"
    "def warn():\n    print('a warning from a worker', file=sys.stderr)\n\n"
    "client.submit(print, 'hello from a worker').result(30)\nclient.submit(warn).result(30)\n"
    "while sum(('from a worker' in l) for ls in client.get_worker_logs().values() for l in ls) < 2:\n"
    "    time.sleep(0.01)\n"
    "sys.stdout.flush(); sys.stderr.flush()",
    "client.close()",
]

RUNNER = """
import json, sys
import nbformat
from nbclient import NotebookClient
nb = nbformat.v4.new_notebook()
nb.cells = [nbformat.v4.new_code_cell(src) for src in json.loads(sys.argv[1])]
NotebookClient(nb, timeout=60, kernel_name="python3").execute()
print(json.dumps([cell.get("outputs", []) for cell in nb.cells]))
"""


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_notebook_cells():
    proc = subprocess.run([sys.executable, "-c", RUNNER, json.dumps(CELLS)],
                          capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stderr
    outputs = json.loads(proc.stdout.strip().splitlines()[-1])
    assert any(o.get("name") == "stdout" and o["text"] == "27\n" for o in outputs[1])
    # a worker's print stays stdout (not red in the notebook); its stderr stays stderr
    assert any(o.get("name") == "stdout" and "] hello from a worker" in o["text"] for o in outputs[2])
    assert any(o.get("name") == "stderr" and "] a warning from a worker" in o["text"] for o in outputs[2])
    assert not any(o.get("name") == "stderr" and "hello from a worker" in o["text"] for o in outputs[2])
    assert not any(o.get("output_type") == "error" for cell in outputs for o in cell)


EXAMPLE = """
import json, sys
import nbformat
from nbclient import NotebookClient
from nbconvert import HTMLExporter
nb = nbformat.read(sys.argv[1], as_version=4)
NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": sys.argv[3]}}).execute()
body, _ = HTMLExporter().from_notebook_node(nb)
with open(sys.argv[2], "w", encoding="utf-8") as f:
    f.write(body)
state = nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {}).get("state", {})
print(json.dumps([[cell.get("outputs", []) for cell in nb.cells if cell.cell_type == "code"], state]))
"""


@pytest.mark.timeout(180)
@pytest.mark.slow
def test_example_notebook_runs_in_a_kernel_and_exports_to_html(tmp_path):
    """examples/notebook.ipynb through a real kernel: the cluster view, a memory kill and a
    segfault drawn as HTML, worker logging and printing in their cells; then nbconvert."""
    pytest.importorskip("nbconvert")
    notebook = Path(__file__).resolve().parents[2] / "examples" / "notebook.ipynb"
    html_path = tmp_path / "notebook.html"
    proc = subprocess.run([sys.executable, "-c", EXAMPLE, str(notebook), str(html_path), str(tmp_path)],
                          capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cells, widgets = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not [o for cell in cells for o in cell if o.get("output_type") == "error"]
    html = lambda i: "".join(o.get("data", {}).get("text/html", "") for o in cells[i])   # noqa: E731
    text = lambda i: "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "") for o in cells[i])  # noqa: E731
    first, work, chatty, memory, crash, after, death = (0, 1, 2, 3, 4, 5, 6)
    assert "lc-membar" in html(first) and "worker-1" in html(first)
    # tqdm.auto's widget bar (not its "IProgress not found" complaint), left at 40 of 40
    assert any("widget-view+json" in "".join(o.get("data", {})) for o in cells[work])
    assert "IProgress not found" not in text(work)
    bars = [m["state"] for m in widgets.values() if m["model_name"] in ("IntProgressModel", "FloatProgressModel")]
    assert any(b.get("value") == b.get("max") == 40 for b in bars), bars
    assert any("40/40" in m["state"].get("value", "") for m in widgets.values() if m["model_name"] == "HTMLModel")
    assert "INFO [worker-" in text(chatty) and "myapp: working on 1" in text(chatty)
    assert "] printed by a worker: 1" in text(chatty)
    assert ">memory-limit<" in html(memory) and "lc-membar" in html(memory) and "<details" in html(memory)
    assert ">crash<" in html(crash) and "SIGSEGV" in html(crash) and "in crash" in html(crash)
    assert html(after).count('class="lc-death"') == 2 and "lc-timeline" in html(after)
    assert html(death).startswith('<div class="lc-death-card"')
    exported = html_path.read_text()
    assert "lc-timeline" in exported and "lc-death-card" in exported
