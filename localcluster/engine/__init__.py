"""The engine: carries out the scheduler's actions on the scheduler thread and on the
threads that bring events.

- ``dispatch.py``: ``Dispatcher``, events in under the lock, instructions out after it.
- ``loop.py``: ``EventLoop``, the scheduler thread's selector, wake-up pipe and commands.
- ``lifecycle.py``: ``Lifecycle``, the cluster's one shutdown state and its table of moves.
- ``callbacks.py``: users' done-callbacks, kept off the scheduler thread.
- ``watchdog.py``: breaks the cluster loudly when the scheduler thread is stuck.
- ``selector.py``: the loop's selector, which can pause one channel while a user thread borrows it.
- ``plugins.py``: scheduler plugins (dask's ``SchedulerPlugin``), told on the callbacks thread.
- ``history.py``: what the cluster did (the task stream, every worker's memory over time),
  written by the dispatcher and the supervisor, read by the views; bounded.
"""
