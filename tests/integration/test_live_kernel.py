"""The dashboard in a real Jupyter kernel (nbclient): its HTML parts change over the
kernel's comm channel while a cell runs work, with no call from the notebook; and the
cell value of a client is the live widget, with the static HTML beside it.

nbclient runs in a subprocess of its own, as in test_notebook.py."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from _util import require

# nbclient runs in the child; here only whether it is there (importing it takes 2.5 s)
require('nbclient', 'ipykernel', 'ipywidgets')

CELLS = [
    "import time\nfrom localcluster import Client\nclient = Client(n_workers=2, forward_logs=False)\n"
    "view = client.cluster.dashboard()\nview",
    "client.gather(client.map(time.sleep, [0.3 + i / 1000 for i in range(10)]))\n"
    "deadline = time.monotonic() + 10\n"
    "while '<b class=\"lc-done\">10</b>' not in view.header.value and time.monotonic() < deadline:\n"
    "    time.sleep(0.05)\n"
    "print(view.header.model_id)",
    "client",
    "view.close()\nclient.close()",
]

RUNNER = """
import json, sys
import nbformat
from nbclient import NotebookClient

updates = []
class Recording(NotebookClient):
    def handle_comm_msg(self, outs, msg, cell_index):
        state = msg["content"]["data"].get("state", {})
        if msg["msg_type"] == "comm_msg" and "value" in state:
            updates.append([msg["content"]["comm_id"], cell_index, state["value"]])
        return super().handle_comm_msg(outs, msg, cell_index)

nb = nbformat.v4.new_notebook()
nb.cells = [nbformat.v4.new_code_cell(src) for src in json.loads(sys.argv[1])]
Recording(nb, timeout=60, kernel_name="python3").execute()
print(json.dumps([[cell.get("outputs", []) for cell in nb.cells], updates]))
"""


@pytest.mark.timeout(150)
@pytest.mark.slow
def test_the_dashboard_changes_over_the_comm_while_work_runs():
    proc = subprocess.run([sys.executable, "-c", RUNNER, json.dumps(CELLS)], capture_output=True, text=True,
                          timeout=140)
    assert proc.returncode == 0, proc.stderr[-3000:]
    outputs, updates = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not [o for cell in outputs for o in cell if o.get("output_type") == "error"], outputs
    shown = outputs[0][0]["data"]
    assert "application/vnd.jupyter.widget-view+json" in shown
    header = outputs[1][0]["text"].strip()
    during = [value for comm, cell, value in updates if comm == header and cell == 1]
    # the cell only waited: every one of these came from the widget's own thread, over the comm
    assert len(set(during)) >= 2, during
    assert '<b class="lc-done">10</b> done' in during[-1] and "2 workers" in during[-1]
    # the client's cell value: the same live widget, and the static view for exports
    value = outputs[2][0]["data"]
    assert value["application/vnd.jupyter.widget-view+json"]["model_id"] == shown[
        "application/vnd.jupyter.widget-view+json"]["model_id"]
    assert 'class="lc-cluster"' in value["text/html"] and value["text/plain"].startswith("<LocalCluster")
