"""The worker process. It starts on ``wire``, ``system`` and these modules only, without the
parent's diagnosis (``death``) or settings (``config``): it starts fast. A task's first
``get_client`` loads ``client.py``, ``api.py``, ``future.py``, ``holding.py`` and ``arguments.py``, with ``config``'s checks and ``published``.

- ``boot.py``: ``BOOT`` and ``main``: the process's start (dies with its parent, authkey,
  initializer) and its end when its own machinery fails.
- ``process.py``: ``Worker``: its channel, executor threads, flusher, heartbeat, memory monitor.
- ``calls.py``: ``Client.run``'s function, run on a thread of its own and answered.
- ``store.py``: the results it holds, spilled to disk past ``memory_target``.
- ``logs.py``: its ``logging`` records, forwarded to the parent's ``localcluster.worker`` logger.
- ``client.py``: tasks that submit tasks (``get_client``, ``secede``, ``rejoin``, ``get_worker``).
- ``api.py``: the Client API's calls (submit, map, gather, scatter, cancel, run, who_has,
  scheduler_info) written once over a transport: a task's (``client.py``'s TaskChannel) or
  the user's process's (client/transport.py); loaded with ``client.py``.
- ``holding.py``: the keys a client holds (``KeyTable``): the one state the futures of a key
  share, renewed when an ended key is held again, and the last future's going; the Client's
  FutureTable is one, and a task's TaskTable.
- ``future.py``: ``Future`` and ``FutureState``: the one state machine of a key's futures and
  concurrent.futures' Future over it, the Client's and a task's (their ``Holder`` differs).
- ``arguments.py``: the Client API's arguments, read and checked the same way by a task's client
  and the Client of the user's process (loaded with ``client.py``, never as the worker starts).
- ``context.py``: what a task's thread knows about where it runs.
- ``turn.py``: when the main thread takes its turn at reading the channel.
- ``transfers.py``: the large values the parent copies into and out of this process.
- ``setup.py``: uploaded files and worker plugins, for the workers running and those to come.
- ``actors.py``: actors (``submit(Cls, actor=True)``), objects living on this worker.
- ``journal.py``: a journal's entries, written by the worker that computed them.
"""
