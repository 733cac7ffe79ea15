"""resources= (dask's abstract worker resources): workers declare {"MEM": 2}, tasks ask
{"MEM": 1}, and a worker is never sent runs asking more than it has.

First the pure scheduler (no processes, every invariant checked after every event, as in
tests/unit/test_scheduler.py), then through real worker processes, where each task measures
the real concurrency itself."""
from __future__ import annotations

import fcntl
import os
import signal
import time

import pytest
from _util import wait_for

from localcluster import Client, LocalCluster, TaskTimeoutError
from localcluster.death import KilledWorker
from localcluster.wire import protocol as P
from test_scheduler import Checked, death, died, finish, resolves, running, runs, sends, spec as _spec
from localcluster.scheduler.records import Deliver
from localcluster.client.future import gateway_of
from localcluster.scheduler import events as E

MEM1 = (("MEM", 1),)
MEM2 = (("MEM", 2),)
GPU1 = (("GPU", 1),)


def spec(key, *deps, resources=None, **kw):
    return _spec(key, *deps, resources=resources, **kw)


def sched(*workers, nthreads=1, resources=None, **kw):
    s = Checked(resources=resources, **kw)
    for w in workers:
        s.handle(E.AddWorker(w, nthreads))
    return s


def claimed(s, worker):
    return sorted(s.tasks[k].key for seq, k in s.workers[worker].processing.items()
                  if seq in s.workers[worker].claims and k is not None)


# --- the pure scheduler -----------------------------------------------------------------

def test_a_worker_is_sent_no_more_runs_than_its_resources_allow_prefetch_included():
    s = sched("w1", nthreads=4, resources={"MEM": 2})
    acts = s.handle(E.Submit([spec(f"t{i}", resources=MEM1) for i in range(6)]))
    assert runs(acts) == [("t0", "w1"), ("t1", "w1")]          # 4 threads, 12 slots: MEM allows 2
    assert s.workers["w1"].available == {"MEM": 0}
    assert runs(finish(s, "t0")) == [("t2", "w1")]
    assert s.workers["w1"].available == {"MEM": 0} and claimed(s, "w1") == ["t1", "t2"]
    for k in ("t1", "t2"):
        finish(s, k)
    assert s.workers["w1"].available == {"MEM": 0} and claimed(s, "w1") == ["t3", "t4"]


def test_a_task_waiting_for_resources_holds_up_neither_plain_tasks_nor_other_requests():
    s = sched("w1", nthreads=4, resources={"MEM": 2, "GPU": 1})
    acts = s.handle(E.Submit([spec("m0", resources=MEM2), spec("m1", resources=MEM2, priority=9),
                     spec("g0", resources=GPU1), spec("plain0"), spec("plain1")]))
    assert sorted(k for k, _ in runs(acts)) == ["g0", "m1", "plain0", "plain1"]
    assert s.tasks["m0"].state == "ready"
    assert runs(finish(s, "m1")) == [("m0", "w1")]


def test_queues_are_merged_by_priority():
    s = Checked(resources={"MEM": 1})
    s.handle(E.Submit([spec("low", priority=0), spec("mem", resources=MEM1, priority=5), spec("mid", priority=1)]))
    assert [k for k, _ in runs(s.handle(E.AddWorker("w1", 1)))] == ["mem", "mid", "low"]


def test_only_workers_that_declare_a_resource_get_the_tasks_asking_for_it():
    s = Checked()
    s.handle(E.AddWorker("w1", 2))
    s.handle(E.AddWorker("gpu", 1, {"GPU": 1}))
    acts = s.handle(E.Submit([spec(f"g{i}", resources=GPU1) for i in range(3)] + [spec(f"p{i}") for i in range(4)]))
    assert [w for k, w in runs(acts) if k.startswith("g")] == ["gpu"]
    assert s.workers["w1"].claims == {} and s.workers["w1"].available == {}


def test_a_cancelled_run_keeps_its_claim_until_its_worker_answers():
    """Python cannot stop a running task: a cancelled one runs on, and holds what it asked."""
    s = sched("w1", nthreads=2, resources={"MEM": 1})
    s.handle(E.Submit([spec("a", resources=MEM1), spec("b", resources=MEM1)]))
    seq_a = s.tasks["a"].seq
    acts = s.handle(E.CancelKeys(["a"]))
    assert sends(acts, P.Cancel) == [("w1", P.Cancel((seq_a,)))] and runs(acts) == []
    assert s.workers["w1"].claims == {seq_a: MEM1} and s.tasks["b"].state == "ready"
    assert runs(s.handle(E.Reported("w1", [P.Finished(seq_a, 8, "int", None, 0.0)]))) == [("b", "w1")]     # it ended: b goes


def test_a_cancelled_run_dropped_before_it_started_releases_at_once():
    s = sched("w1", resources={"MEM": 1})
    s.handle(E.Submit([spec("a", resources=MEM1), spec("b", resources=MEM1)]))
    seq_a = s.tasks["a"].seq
    s.handle(E.CancelKeys(["a"]))
    assert runs(s.handle(E.Reported("w1", [P.Skipped(seq_a)]))) == [("b", "w1")]


def test_a_death_releases_and_its_runs_claim_again_where_they_run_next():
    s = sched("w1", "w2", resources={"MEM": 1})
    s.handle(E.Submit([spec("a", resources=MEM1), spec("b", resources=MEM1), spec("c", resources=MEM1)]))
    assert sorted(claimed(s, "w1") + claimed(s, "w2")) == ["a", "b"]
    on_w1 = claimed(s, "w1")[0]
    acts = died(s, death("w1", "requested"), running(s, on_w1))
    assert runs(acts) == [] and s.tasks[on_w1].state == "ready"    # w2's MEM is taken: it waits
    acts = s.handle(E.AddWorker("w3", 1))                                   # the replacement declares MEM too
    assert runs(acts) == [(on_w1, "w3")] and s.workers["w3"].available == {"MEM": 0}


def test_a_timeout_releases():
    s = sched("w1", nthreads=2, resources={"MEM": 1}, allowed_failures=0)
    s.handle(E.Submit([spec("slow", resources=MEM1, timeout=1.0), spec("next", resources=MEM1)]))
    seq = s.tasks["slow"].seq
    acts = died(s, death("w1", "timeout"), running(s, "slow"), timed_out=(seq, 1.5))
    assert isinstance(resolves(acts)["slow"].value, TaskTimeoutError)
    assert runs(s.handle(E.AddWorker("w2", 2))) == [("next", "w2")]


def test_a_run_given_back_moves_its_claim_to_the_worker_that_takes_it():
    s = sched("w1", "w2", resources={"MEM": 1})
    s.handle(E.Submit([spec("a"), spec("b"), spec("m", resources=MEM1)]))
    assert s.tasks["m"].worker == "w1" and claimed(s, "w1") == ["m"]       # queued behind a
    acts = finish(s, "b")                                                  # w2 idle: m asked back
    seq_m = s.tasks["m"].seq
    assert sends(acts, P.Steal) == [("w1", P.Steal((seq_m,)))]
    acts = s.handle(E.Reported("w1", [P.Unqueued((seq_m,), (seq_m,))]))
    assert runs(acts) == [("m", "w2")]
    assert claimed(s, "w1") == [] and s.workers["w1"].available == {"MEM": 1}
    assert claimed(s, "w2") == ["m"] and s.workers["w2"].available == {"MEM": 0}


def test_a_run_is_not_asked_back_for_a_worker_without_its_resources():
    s = Checked()
    s.handle(E.AddWorker("w1", 1, {"MEM": 1}))
    s.handle(E.AddWorker("w2", 1))
    s.handle(E.Submit([spec("a"), spec("b"), spec("m", resources=MEM1)]))
    assert s.tasks["m"].worker == "w1"
    asked = [seq for _w, m in sends(finish(s, "b"), P.Steal) for seq in m.seqs]
    assert asked == [s.tasks["a"].seq]             # a plain run may move; m may not


def test_a_paused_worker_gives_its_queued_runs_back_with_their_claims():
    s = sched("w1", resources={"MEM": 1})
    s.handle(E.Submit([spec("a"), spec("m", resources=MEM1)]))
    seq_a, seq_m = s.tasks["a"].seq, s.tasks["m"].seq
    assert sends(s.handle(E.SetPaused("w1", True)), P.Steal) == [("w1", P.Steal((seq_a, seq_m)))]
    assert runs(s.handle(E.Reported("w1", [P.Unqueued((seq_a, seq_m), (seq_m,))]))) == []       # a had started: it stays
    assert s.workers["w1"].claims == {} and s.workers["w1"].available == {"MEM": 1}
    assert runs(s.handle(E.AddWorker("w2", 1))) == [("m", "w2")]


def test_restricted_tasks_that_do_not_fit_now_are_set_aside():
    s = sched("w1", "w2", nthreads=2, resources={"MEM": 1})
    acts = s.handle(E.Submit([spec("m1", resources=MEM1, workers=["w1"]), spec("m2", resources=MEM1, workers=["w1"]),
                     spec("p", workers=["w1"])]))
    assert sorted(runs(acts)) == [("m1", "w1"), ("p", "w1")]
    assert runs(finish(s, "m1")) == [("m2", "w1")]


def test_scaled_up_workers_declare_the_clusters_resources_and_a_retiring_one_gets_nothing():
    s = sched(resources={"MEM": 2})
    s.handle(E.Submit([spec(f"m{i}", resources=MEM2) for i in range(3)]))
    assert runs(s.handle(E.AddWorker("w1", 2))) == [("m0", "w1")]
    assert runs(s.handle(E.AddWorker("w2", 2))) == [("m1", "w2")]
    s.handle(E.HandOff("w1"))
    assert runs(finish(s, "m0")) == []                       # w1 is leaving: m2 waits for w2
    assert runs(finish(s, "m1")) == [("m2", "w2")]


def test_clear_gives_every_worker_back_all_it_declares():
    s = sched("w1", resources={"MEM": 2})
    s.handle(E.Submit([spec("a", resources=MEM1)]))
    s.handle(E.Clear(RuntimeError("restart")))
    assert s.workers["w1"].available == {"MEM": 2} and s.workers["w1"].claims == {}


def test_a_task_no_worker_can_ever_run_is_named_with_what_it_asks_and_what_each_worker_has():
    s = Checked(resources={"MEM": 2})
    assert s.unsatisfiable("f-1", MEM2) is None
    err = s.unsatisfiable("f-1", (("MEM", 3),))
    assert isinstance(err, ValueError)
    assert "task 'f-1' asks for resources={'MEM': 3}" in str(err)
    assert "no worker runs now, and each worker this cluster starts has {'MEM': 2}" in str(err)
    s.handle(E.AddWorker("w1", 1))
    s.handle(E.AddWorker("w2", 1, {"GPU": 1}))
    assert s.unsatisfiable("f-2", GPU1) is None
    msg = str(s.unsatisfiable("f-2", (("GPU", 1), ("MEM", 1))))
    assert "task 'f-2' asks for resources={'GPU': 1, 'MEM': 1}" in msg
    assert "the workers have: w1 {'MEM': 2}, w2 {'GPU': 1}" in msg


def test_the_invariants_catch_a_claim_that_does_not_add_up():
    s = sched("w1", resources={"MEM": 2})
    s.handle(E.Submit([spec("a", resources=MEM1)]))
    s.workers["w1"].available["MEM"] = 2                   # the claim of a forgotten
    with pytest.raises(AssertionError, match=r"w1: MEM 2 - available 2 != claimed 1"):
        s.validate()
    s.workers["w1"].available["MEM"] = 1
    s.workers["w1"].claims.clear()
    with pytest.raises(AssertionError, match=r"asks for \(\('MEM', 1\),\) but claims None"):
        s.validate()


def test_tasks_asking_nothing_leave_no_trace():
    s = sched("w1", "w2", resources={"MEM": 1})
    s.handle(E.Submit([spec(f"t{i}") for i in range(20)]))
    assert all(not ws.claims and ws.available == {"MEM": 1} for ws in s.workers.values())


# --- through real worker processes ---------------------------------------------------------

def counted(path: str, i: int, seconds: float = 0.4) -> int:
    """Count this task in and out of the file at ``path`` under flock: the file keeps the
    tasks running now and the most ever seen at once, measured by the tasks themselves."""
    def step(delta: int) -> None:
        with open(path, "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.seek(0)
            now, most = map(int, (f.read() or "0 0").split())
            now += delta
            f.seek(0)
            f.truncate()
            f.write(f"{now} {max(most, now)}")
    step(+1)
    time.sleep(seconds)
    step(-1)
    return i


def text(path: str) -> str:
    with open(path) as f:
        return f.read()


def held(marker: str, go: str) -> int:
    """Write this worker's pid to ``marker``, then wait for ``go`` (forever if it never comes)."""
    from _util import block_until
    with open(marker + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(marker + ".tmp", marker)
    block_until(go, timeout=120)
    with open(marker + ".ended", "w"):
        pass
    return os.getpid()


def after(marker: str) -> tuple:
    """Whether the process that ran ``held`` is still alive, and whether its task ended."""
    pid = int(text(marker))
    try:
        os.kill(pid, 0)
        alive = True
    except ProcessLookupError:
        alive = False
    return alive, os.path.exists(marker + ".ended"), os.getpid()


@pytest.mark.cluster(n_workers=1, threads_per_worker=4, resources={"MEM": 2})
@pytest.mark.slow
def test_six_tasks_needing_mem_1_on_a_worker_with_mem_2_and_4_threads_never_run_more_than_2_at_once(
        client, tmp_path):
    path = str(tmp_path / "count")
    assert client.gather(client.map(counted, [path] * 6, range(6), resources={"MEM": 1}, pure=False)) == \
        list(range(6))
    assert text(path) == "0 2"                # none running now; 2 at most, and 2 were


def started(client, fut, marker, timeout=30.0):
    wait_for(lambda: os.path.exists(marker), timeout)
    return int(text(marker))


@pytest.mark.cluster(n_workers=1, threads_per_worker=2, resources={"MEM": 1})
@pytest.mark.slow
def test_a_cancelled_task_holds_its_resources_while_it_runs_on_and_releases_them_when_it_ends(
        client, tmp_path):
    marker, go = str(tmp_path / "a"), str(tmp_path / "go")
    a = client.submit(held, marker, go, resources={"MEM": 1}, pure=False)
    started(client, a, marker)
    b = client.submit(after, marker, resources={"MEM": 1})
    client.cancel([a])
    assert a.cancelled()
    # a runs on (Python cannot stop it) and still holds MEM: b waits, a free thread or not
    assert gateway_of(client).task_state(b.key) == "ready"
    open(go, "w").close()
    alive, a_ended, _pid = b.result(30)
    assert a_ended                                   # b started only once a's run was over


@pytest.mark.cluster(n_workers=1, threads_per_worker=2, resources={"MEM": 1}, allowed_failures=0)
@pytest.mark.slow
def test_a_death_releases_the_resources_of_its_runs(cluster, client, tmp_path):
    marker = str(tmp_path / "a")
    a = client.submit(held, marker, str(tmp_path / "never"), resources={"MEM": 1}, pure=False)
    pid = started(client, a, marker)
    b = client.submit(after, marker, resources={"MEM": 1})
    assert gateway_of(client).task_state(b.key) == "ready"       # MEM is a's, though a thread is free
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(KilledWorker):
        a.result(30)
    alive, _ended, b_pid = b.result(60)
    assert not alive and b_pid != pid                # on the replacement, after a's worker was gone


@pytest.mark.cluster(n_workers=1, threads_per_worker=2, resources={"MEM": 1})
@pytest.mark.slow
def test_a_timeout_releases_the_resources_of_its_run(client, tmp_path):
    marker = str(tmp_path / "a")
    a = client.submit(held, marker, str(tmp_path / "never"), resources={"MEM": 1}, timeout=1.0, pure=False)
    pid = started(client, a, marker)
    b = client.submit(after, marker, resources={"MEM": 1})
    assert gateway_of(client).task_state(b.key) == "ready"
    with pytest.raises(TaskTimeoutError):
        a.result(30)
    alive, _ended, b_pid = b.result(60)
    assert not alive and b_pid != pid


def test_a_task_no_worker_can_ever_run_fails_at_submit_naming_it_what_it_asks_and_what_each_worker_has():
    with LocalCluster(n_workers=2, resources={"MEM": 2}, forward_logs=False) as cluster, Client(cluster) as client:
        with pytest.raises(ValueError) as info:
            client.submit(counted, "x", 1, key="big-one", resources={"MEM": 3})
        msg = str(info.value)
        assert "task 'big-one' asks for resources={'MEM': 3}" in msg
        assert "the workers have: worker-0 {'MEM': 2}, worker-1 {'MEM': 2}" in msg
        with pytest.raises(ValueError, match=r"asks for resources=\{'GPU': 1\}"):
            client.map(counted, ["x"], [1], resources={"GPU": 1})
        with pytest.raises(ValueError, match=r"submit\(resources=\{'MEM': -1\}\): expected a dict of resource names"):
            client.submit(counted, "x", 1, resources={"MEM": -1})
        with pytest.raises(ValueError, match=r"map\(resources='MEM'\): expected a dict"):
            client.map(counted, ["x"], [1], resources="MEM")
        assert not cluster.scheduler.tasks                   # nothing was submitted
        assert client.submit(len, "ab", resources={"MEM": 2}).result(30) == 2
        assert client.submit(len, "abc", resources=None).result(30) == 3
    with LocalCluster(n_workers=0, resources={"MEM": 1}) as cluster, Client(cluster) as client:
        with pytest.raises(ValueError, match=r"no worker runs now, and each worker this cluster starts has "
                                             r"\{'MEM': 1\}"):
            client.submit(len, "ab", resources={"MEM": 2})
    with pytest.raises(ValueError, match=r"resources=\{'MEM': 0\} is not valid: expected a dict"):
        LocalCluster(n_workers=0, resources={"MEM": 0})


@pytest.mark.slow
def test_scale_starts_workers_with_the_resources_and_a_waiting_task_says_what_it_waits_for(tmp_path):
    with LocalCluster(n_workers=0, resources={"MEM": 1}, forward_logs=False) as cluster, Client(cluster) as client:
        marker, go = str(tmp_path / "a"), str(tmp_path / "go")
        a = client.submit(held, marker, go, resources={"MEM": 1}, pure=False)   # allowed: workers will have MEM
        b = client.submit(after, marker, resources={"MEM": 1})
        cluster.scale(1)
        started(client, a, marker)
        assert gateway_of(client).task_state(b.key) == "ready"
        assert "queued for resources={'MEM': 1}: what the workers declare is claimed" in \
            gateway_of(client).why_pending(b.key)
        open(go, "w").close()
        assert b.result(30)[1]                                   # after a's end


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_compute_and_persist_pass_resources_to_every_task_of_the_graph():
    """dask's compute(resources=) and persist(resources=): each task of the graph claims them."""
    dask = pytest.importorskip("dask")
    with LocalCluster(n_workers=1, threads_per_worker=2, resources={"MEM": 1}, forward_logs=False) as c, \
            Client(c) as client:
        total = dask.delayed(sum)([dask.delayed(abs)(-i) for i in range(4)])
        assert client.compute(total, resources={"MEM": 1}).result(30) == 6
        (kept,) = client.persist([total], resources={"MEM": 1})
        assert kept.compute(scheduler=client.get) == 6
        with pytest.raises(ValueError, match="no worker can ever give"):
            client.compute(total, resources={"GPU": 1})
        info = client.scheduler_info()
        assert all(w["resources"] == {"MEM": 1} for w in info["workers"].values())


# --- found by the state machine at 3000 examples: a key submitted again -------------------------

def test_a_key_submitted_again_with_other_resources_is_not_placed_by_its_stale_queue_entry():
    """Queue entries are deleted lazily: 'a', queued plain and released, then asking for a GPU
    no worker has, must not be sent to a worker by the old plain entry (KeyError 'GPU'
    broke the cluster)."""
    s = Checked()
    s.handle(E.Submit([spec("a")]))
    s.handle(E.Drop(["a"]))
    s.handle(E.Submit([spec("a", resources=GPU1)]))
    acts = s.handle(E.AddWorker("w1", 1, {"MEM": 2}))
    assert runs(acts) == [] and s.tasks["a"].state == "ready"
    acts = s.handle(E.AddWorker("w2", 1, {"GPU": 1}))
    assert runs(acts) == [("a", "w2")]


def test_a_key_submitted_again_unrestricted_survives_the_death_of_its_old_worker():
    """'b' restricted to w1 and released, then submitted without restriction: w1's death
    scans w1's stale queue and must take 'b' for what it is now (a TypeError broke the cluster)."""
    s = sched("w1", "w2")
    s.handle(E.SetPaused("w1", True))                      # nothing is sent: 'b' stays queued on w1's queue
    s.handle(E.SetPaused("w2", True))
    s.handle(E.Submit([spec("b", workers=frozenset({"w1"}))]))
    s.handle(E.Drop(["b"]))
    s.handle(E.Submit([spec("b")]))
    s.handle(E.WorkerDied(death("w1")))
    assert s.tasks["b"].state == "ready"


def test_a_fetch_waiting_on_a_released_key_is_answered():
    """A fetch of a key not yet in memory, and its last future dropped: the fetch gets an
    answer (the key is gone) instead of waiting for ever."""
    s = Checked()
    s.handle(E.Submit([spec("c")]))
    req, acts = E.opened(s.handle(E.Fetch("c")))
    assert acts == []
    acts = s.handle(E.Drop(["c"]))
    delivered = [a for a in acts if isinstance(a, Deliver) and a.request == req]
    assert len(delivered) == 1 and delivered[0].error is not None
