"""Other libraries' front doors.

- ``executor.py``: ``client.get_executor()``, a ``concurrent.futures.Executor``.
- ``daskgraph.py``: ``client.get``, dask graphs run on the cluster.
- ``joblib.py``: the ``localcluster`` joblib backend (public path ``localcluster.joblib``).
- ``pytest_plugin.py``: the ``localcluster_client`` fixture (public path ``localcluster.pytest_plugin``).
- ``replay.py``: ``client.recreate_error_locally``, a failed task run again here.
- ``dask_client.py``: the client's side of ``localcluster.dask.install`` on a dask.distributed cluster.
- ``dask_nanny.py``: what ``localcluster.dask.install`` runs in dask's nannies and workers.
"""
