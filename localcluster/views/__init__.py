"""What the user sees.

- ``history.py``: the task stream and memory samples, bounded.
- ``render.py``: HTML for notebooks (clusters, futures, deaths).
- ``stall.py``: why a cluster is stuck, in words (pure).
- ``report.py``: ``localcluster.report``, one self-contained page.
- ``progress.py``: ``localcluster.progress``, tqdm's bar or a line of text.
- ``dashboard.py``: ``cluster.dashboard()``, the live view in Jupyter.
- ``insights.py``: ``cluster.insights()``, where each worker's time went.
- ``live.py``: ``localcluster.live()``, a status block kept up to date on a terminal.
"""
