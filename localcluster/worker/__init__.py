"""The worker process (imports only ``wire``, ``system`` and these modules: it starts fast).

- ``process.py``: ``BOOT`` and ``main``: its channel, executor threads, memory monitor.
- ``store.py``: the results it holds, spilled to disk past ``memory_target``.
- ``logs.py``: its ``logging`` records, forwarded to the parent's ``localcluster.worker`` logger.
"""
