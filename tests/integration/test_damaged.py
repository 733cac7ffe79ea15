"""A copy that is not what was sent (issue 48): every buffer that crosses a process carries its
seal (protocol.seal: its length and a sample of its bytes), made where the value is pickled and
checked where it lands. These tests damage copies in flight for real, in the parent's own copies
into and out of workers (the test's process is the parent), and check that the damaged copy is
never used: the value is sent again, or computed again from its lineage, the user gets the right
value, and a warning names the key and the workers; when every copy arrives damaged, the user
gets TransferError, which says it is localcluster's failure, never the data's."""
from __future__ import annotations

import logging

import numpy as np
import pytest

from localcluster import Client, LocalCluster, TransferError
from localcluster.wire import vmcopy
from localcluster.cluster import validate

pytestmark = pytest.mark.timeout(60)

N = 1_000_000           # float64: 8 MB, copied by the parent into and out of its workers


def made(seed):
    return np.full(N, float(seed))


def total(a):
    return float(a.sum())


@pytest.fixture
def cluster():
    with LocalCluster(n_workers=2, threads_per_worker=1, forward_logs=False) as c:
        if not vmcopy.available(next(iter(c.workers.values())).pid):
            pytest.skip("this process may not copy into its workers (ptrace refused): memfds carry the data")
        yield c


@pytest.fixture
def warnings_said(caplog):
    caplog.set_level(logging.WARNING, logger="localcluster")
    return lambda: [r.getMessage() for r in caplog.records if "a transfer went wrong" in r.getMessage()]


def damage_copies_in(monkeypatch, times):
    """The next ``times`` large buffers the parent copies into a worker are written with
    another value's bytes (of the same size): a mix-up of buffers in flight."""
    left = [times]
    real = vmcopy.write_to

    def write_to(pid, buf, remote):
        view = memoryview(buf).cast("B")
        if left[0] and view.nbytes >= 1 << 20:
            left[0] -= 1
            buf = np.full(view.nbytes // 8 + 1, -7.0).view("u1")[:view.nbytes]
        return real(pid, buf, remote)
    monkeypatch.setattr(vmcopy, "write_to", write_to)
    return left


def damage_copies_out(monkeypatch, times):
    """The next ``times`` large buffers the parent copies out of a worker come out zeroed."""
    left = [times]
    real = vmcopy.read_from

    def read_from(pid, remote, n, into=None):
        out = real(pid, remote, n, into)
        if left[0] and n >= 1 << 20:
            left[0] -= 1
            memoryview(out).cast("B")[:] = bytes(n)
        return out
    monkeypatch.setattr(vmcopy, "read_from", read_from)
    return left


@pytest.mark.slow
def test_a_relayed_copy_damaged_on_its_way_in_is_sent_again(cluster, monkeypatch, warnings_said):
    left = damage_copies_in(monkeypatch, 1)
    a, b = cluster.workers
    with Client(cluster) as client:
        x = client.submit(made, 3, workers=[a])
        assert client.submit(total, x, workers=[b]).result(30) == 3.0 * N
        assert left == [0]
        (said,) = warnings_said()
        assert repr(x.key) in said and repr(b) in said and f"came from worker {a!r}" in said
        assert "not of your data or code" in said
        assert client.submit(np.array_equal, x, made(3), workers=[b]).result(30)
        validate(cluster)


def test_a_tasks_arguments_damaged_on_their_way_in_are_sent_again(cluster, monkeypatch, warnings_said):
    damage_copies_in(monkeypatch, 2)
    with Client(cluster) as client:
        arg = made(5)
        assert client.submit(total, arg).result(30) == 5.0 * N
        said = warnings_said()
        assert len(said) == 2 and all("the arguments of task" in s for s in said)


@pytest.mark.slow
def test_a_copy_damaged_on_its_way_out_of_its_only_holder_is_computed_again(cluster, monkeypatch, warnings_said,
                                                                            tmp_path):
    left = damage_copies_out(monkeypatch, 1)
    a, _b = cluster.workers
    with Client(cluster) as client:
        x = client.submit(made_counted, 11, str(tmp_path), workers=[a])
        client.submit(len, x).result(30)            # in memory on ``a``, its only copy
        assert np.array_equal(x.result(30), made(11))
        assert left == [0]
        (said,) = warnings_said()
        assert f"copied out of worker {a!r}" in said and repr(x.key) in said
        assert len(list(tmp_path.iterdir())) == 2     # made once, and again from its lineage
        validate(cluster)


def made_counted(seed, folder):
    """``made``, leaving a file behind for each run (how many times it was computed)."""
    import tempfile
    tempfile.NamedTemporaryFile(dir=folder, delete=False).close()
    return np.full(N, float(seed))


@pytest.mark.slow
def test_a_copy_damaged_every_time_fails_with_transfer_error_never_a_wrong_value(cluster, monkeypatch):
    damage_copies_in(monkeypatch, 10**6)
    a, b = cluster.workers
    with Client(cluster) as client:
        x = client.submit(made, 2, workers=[a])
        y = client.submit(total, x, workers=[b])
        with pytest.raises(TransferError) as info:
            y.result(30)
        text = str(info.value)
        assert repr(x.key) in text and repr(b) in text and "localcluster lost track of a transfer" in text
        assert "not of your data or your code" in text and "picklable" not in text
        assert "again 3 times" in text
        monkeypatch.undo()
        assert client.submit(total, x, workers=[b], pure=False).result(30) == 2.0 * N      # the cluster goes on
        validate(cluster)


@pytest.mark.slow
def test_buffers_the_parent_could_not_copy_in_are_sent_again(cluster, monkeypatch, warnings_said):
    """process_vm_writev refused once (as for memory the worker unmapped): the worker reports
    the Run it could not start, and the parent sends it again; no worker dies."""
    left = [1]
    real = vmcopy.write_to

    def write_to(pid, buf, remote):
        if left[0]:
            left[0] -= 1
            raise OSError(14, "Bad address")
        return real(pid, buf, remote)
    monkeypatch.setattr(vmcopy, "write_to", write_to)
    with Client(cluster) as client:
        assert client.submit(total, made(4)).result(30) == 4.0 * N
        assert left == [0] and cluster.deaths == []
        (said,) = warnings_said()
        assert "could not copy its buffers" in said
