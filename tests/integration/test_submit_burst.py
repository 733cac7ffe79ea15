"""A burst of submits, deferred and handed to the scheduler together (engine/dispatch.py),
through real workers: nothing a program does can tell, except that the loop is faster."""
from __future__ import annotations

import pytest
from _util import block_until, release, wait_for

from localcluster.engine import dispatch
from localcluster.client.future import gateway_of
from localcluster.cluster import validate

pytestmark = pytest.mark.timeout(60)


def inc(x):
    return x + 1


@pytest.fixture
def burst(monkeypatch):
    """Every submit of the test after the first is part of one burst, however slow the machine."""
    monkeypatch.setattr(dispatch, "BURST", 3600.0)


def test_a_deferred_burst_starts_with_nobody_waiting_and_every_read_sees_it(burst, cluster, client, tmp_path):
    marker = str(tmp_path / "go")
    blockers = [client.submit(block_until, marker, pure=False) for _ in range(2)]
    # The second was deferred: the scheduler thread, woken for it, sends it to the idle worker.
    wait_for(lambda: len(gateway_of(client).running_tasks()) == 2)
    queued = [client.submit(inc, i, pure=False) for i in range(50)]
    assert {gateway_of(client).task_state(f.key) for f in queued} <= {"ready", "processing"}
    for i in range(200):                                # dropped as soon as made
        client.submit(inc, -i, pure=False)
    release(marker)
    assert [f.result() for f in queued] == [i + 1 for i in range(50)]
    client.gather(blockers)
    kept = {f.key for f in blockers + queued}
    wait_for(lambda: set(cluster.scheduler.tasks) == kept)     # the dropped ones were let go
    validate(cluster)


def test_a_burst_that_the_cluster_closes_on_fails_every_future_of_it(burst, cluster, client, tmp_path):
    marker = str(tmp_path / "never")
    fs = [client.submit(block_until, marker, 30, pure=False) for _ in range(20)]
    cluster.close()
    for f in fs:
        with pytest.raises(Exception, match="closed"):
            f.result(timeout=10)
