"""asyncio: ``await future``, ``await asyncio.wrap_future(future)`` and
``await client.gather(..., asynchronous=True)`` under ``asyncio.run``, with real workers
and results large enough to stay on their worker until fetched."""
from __future__ import annotations

import asyncio
import time

import pytest

np = pytest.importorskip("numpy")

BIG = 20 * 2**20 // 8        # a 20 MB float64 array: fetched from its worker, not inline


def inc(x):
    return x + 1


def big(seed):
    return np.full(BIG, float(seed))


def slow(x, delay):
    time.sleep(delay)
    return x


def boom():
    raise KeyError("missing")


@pytest.mark.slow
def test_await_a_future_small_large_and_failed(client):
    async def main():
        assert await client.submit(inc, 1) == 2
        arr = await client.submit(big, 3)
        assert arr.shape == (BIG,) and arr[0] == 3.0 and arr[-1] == 3.0
        with pytest.raises(KeyError, match="missing"):
            await client.submit(boom)
        done = client.submit(inc, 41)
        done.result(30)
        assert await done == 42          # already finished: no waiting at all
    asyncio.run(main())


@pytest.mark.slow
def test_await_many_at_once_and_wrap_future(client):
    async def main():
        fs = client.map(big, range(4))
        arrays = await asyncio.gather(*fs)
        assert [a[0] for a in arrays] == [0.0, 1.0, 2.0, 3.0]
        wrapped = await asyncio.wrap_future(client.submit(big, 7))
        assert wrapped[123] == 7.0
        assert await asyncio.wrap_future(client.submit(inc, 9)) == 10
    asyncio.run(main())


@pytest.mark.slow
def test_gather_asynchronous_nested_and_skip(client):
    async def main():
        parts = {"small": client.map(inc, range(5)), "large": [client.submit(big, 1)], "bad": client.submit(boom)}
        out = await client.gather(parts, errors="skip", asynchronous=True)
        assert out["small"] == [1, 2, 3, 4, 5] and out["large"][0][0] == 1.0 and "bad" not in out
        with pytest.raises(KeyError):
            await client.gather([client.submit(boom)], asynchronous=True)
    asyncio.run(main())
    with pytest.raises(TypeError, match="asynchronous='yes'"):
        client.gather([], asynchronous="yes")


@pytest.mark.slow
def test_the_loop_keeps_running_while_a_future_is_awaited(client):
    """Other coroutines run while a task is pending and while a large result is fetched."""
    async def main():
        order = []
        task_done = asyncio.Event()

        async def other():
            while not task_done.is_set():
                order.append("tick")
                await asyncio.sleep(0.01)

        ticker = asyncio.ensure_future(other())
        value = await client.submit(slow, big(5), 0.3)
        task_done.set()
        await ticker
        assert value[0] == 5.0 and order.count("tick") >= 5
    asyncio.run(main())


@pytest.mark.slow
def test_cancelling_the_awaiting_task_leaves_the_cluster_task_running(client):
    fut = client.submit(slow, 1, 0.3)

    async def main():
        waiter = asyncio.ensure_future(_await(fut))
        await asyncio.sleep(0.05)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
    asyncio.run(main())
    assert fut.result(30) == 1 and not fut.cancelled()


async def _await(fut):
    return await fut
