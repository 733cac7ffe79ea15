"""What the user sees: each view reads a cluster or its futures (the top layer, with the
integrations). The objects users hold import a view only in the method that draws them.

- ``render.py``: HTML for notebooks (clusters, futures, deaths).
- ``report.py``: ``localcluster.report``, one self-contained page.
- ``progress.py``: ``localcluster.progress``, tqdm's bar or a line of text.
- ``dashboard.py``: ``cluster.dashboard()``, the live view in Jupyter.
- ``insights.py``: ``cluster.insights()``, where each worker's time went.
- ``live.py``: ``localcluster.live()``, a status block kept up to date on a terminal.
"""
