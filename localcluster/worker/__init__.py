"""The worker process (imports only ``wire``, ``system`` and these modules: it starts fast).

- ``boot.py``: ``BOOT`` and ``main``: the process's start (dies with its parent, authkey,
  initializer) and its end when its own machinery fails.
- ``process.py``: ``Worker``: its channel, executor threads, flusher, heartbeat, memory monitor.
- ``calls.py``: ``Client.run``'s function, run on a thread of its own and answered.
- ``store.py``: the results it holds, spilled to disk past ``memory_target``.
- ``logs.py``: its ``logging`` records, forwarded to the parent's ``localcluster.worker`` logger.
"""
