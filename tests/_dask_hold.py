"""A dask worker preload for tests/integration/test_dask_diagnosis.py: a worker starting while the file
``$LOCALCLUSTER_TEST_HOLD`` exists waits (bounded) until it is removed before it registers,
so a test can act while a nanny is restarting its worker."""
import asyncio
import os
import time


async def dask_setup(worker):
    path = os.environ["LOCALCLUSTER_TEST_HOLD"]
    deadline = time.monotonic() + 120
    while os.path.exists(path) and time.monotonic() < deadline:    # another process removes it: polled
        await asyncio.sleep(0.05)
