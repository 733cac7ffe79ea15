"""A real Jupyter kernel: functions and classes defined in notebook cells run on workers,
and worker output shows up in the cell that caused it.

nbclient runs in a subprocess of its own: jupyter_client leaves ZMQ sockets to the
garbage collector, which this suite's strict warnings and leak checks would blame on us.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

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
