"""What the user sees.

- ``history.py``: the task stream and memory samples, bounded.
- ``render.py``: HTML for notebooks (clusters, futures, deaths).
- ``stall.py``: why a cluster is stuck, in words (pure).
- ``report.py``: ``localcluster.report``, one self-contained page.
- ``progress.py``: ``localcluster.progress``, tqdm's bar or a line of text.
"""
