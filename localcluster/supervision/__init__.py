"""Supervision: the worker processes, from spawn to reap.

- ``policy.py``: ``Policy``, what to do about each worker (pure: events in, instructions out).
- ``supervisor.py``: ``Supervisor``, the I/O shell that observes, asks the policy, and acts.
- ``nanny.py``: ``Nanny``, one worker process seen from the parent (an I/O handle).
- ``output.py``: the worker's stdout and stderr pipes, and the bounded log.
- ``stallwatch.py``: one WARNING, saying why, when nothing has ended for a while.
- ``stall.py``: why a cluster is stuck, in words (pure: plain data in, a ``Stall`` out).
- ``capacity.py``: how many workers fit on this machine, asked before any is started.
- ``reading.py``: a user thread that waits for a future reads its worker's channel itself.
"""
