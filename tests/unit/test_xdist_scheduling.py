"""The suite's ``--dist loadscope`` scheduler (tests/_xdist.py) ends when a test
process dies. The scheduler is driven here by stand-ins of xdist's test processes, which
keep its rule: a process starts an item only once it holds the next item or the order to
shut down. Random suites, random interleavings and random deaths, with printed seeds; the
stock scheduler, driven the same way, waits forever on some of them."""
from __future__ import annotations

import random
from types import SimpleNamespace

from xdist.scheduler import LoadScopeScheduling

from _xdist import LoadScopeThatSurvivesACrash


class _Process:
    """A test process as the scheduler sees it (xdist's WorkerController)."""

    def __init__(self, name: str):
        self.gateway = SimpleNamespace(id=name)
        self.held: list[int] = []          # the items it was sent and has not run
        self.shutdown_sent = False
        self.down = False

    @property
    def shutting_down(self) -> bool:
        return self.down or self.shutdown_sent

    def shutdown(self) -> None:
        if not self.down:
            self.shutdown_sent = True

    def send_runtest_some(self, indices) -> None:
        self.held.extend(indices)

    def can_start(self) -> bool:
        return bool(self.held) and (len(self.held) >= 2 or self.shutdown_sent)

    def finished(self) -> bool:
        return self.shutdown_sent and not self.held


def _config(processes: int):
    return SimpleNamespace(getvalue={"tx": [f"{processes}*popen"]}.__getitem__,
                           option=SimpleNamespace(loadscopereorder=False))


def _play(scheduler_class, collection: list[str], deadly: set[str], rng: random.Random,
          processes: int = 2, restarts: int = 4):
    """Run ``collection`` as xdist's controller would, a test process dying whenever it runs a
    test in ``deadly``. Returns the tests run, the tests reported as crashed, and the processes
    left waiting for an order that never comes."""
    scheduler = scheduler_class(_config(processes))
    names = (f"gw{n}" for n in range(1000))

    def start():
        process = _Process(next(names))
        scheduler.add_node(process)
        scheduler.add_node_collection(process, collection)
        return process

    for _ in range(processes):
        start()
    scheduler.schedule()
    ran, crashed = [], []
    while True:
        for process in [p for p in scheduler.nodes if p.finished()]:
            assert scheduler.remove_node(process) is None
        ready = [p for p in scheduler.nodes if p.can_start()]
        if not ready:
            break
        process = rng.choice(ready)
        index = process.held.pop(0)
        if collection[index] in deadly:
            process.down = True
            crashed.append(scheduler.remove_node(process))
            if len(crashed) > restarts:          # xdist's --max-worker-restart
                break
            start()
            scheduler.schedule()
        else:
            ran.append(collection[index])
            scheduler.mark_test_complete(process, index)
    return ran, crashed, [p.gateway.id for p in scheduler.nodes if not p.finished()]


def _suite(rng: random.Random) -> list[str]:
    return [f"test_m{m}.py::test_{t}" for m in range(rng.randint(1, 12))
            for t in range(rng.choice([1, 1, 2, 3, 5, 20]))]


def test_every_test_runs_once_and_the_run_ends_whatever_dies(seed):
    rng = random.Random(seed)
    for run in range(300):
        collection = _suite(rng)
        deadly = set(rng.sample(collection, min(len(collection), rng.choice([0, 1, 1, 2, 3]))))
        ran, crashed, waiting = _play(LoadScopeThatSurvivesACrash, collection, deadly, rng)
        where = f"run {run}: {len(collection)} tests, deadly {sorted(deadly)}"
        assert not waiting, f"{where}: processes {waiting} wait for an order that never comes"
        assert sorted(crashed) == sorted(deadly), f"{where}: each deadly test is reported once"
        assert sorted(ran) == sorted(set(collection) - deadly), f"{where}: every other test runs once"


def test_the_stock_scheduler_driven_the_same_way_waits_forever():
    """What the stand-ins catch: the stock scheduler hangs on some of the same random runs."""
    hung = 0
    for seed in range(200):
        rng = random.Random(seed)
        collection = _suite(rng)
        deadly = set(rng.sample(collection, min(len(collection), rng.choice([1, 2]))))
        _, _, waiting = _play(LoadScopeScheduling, collection, deadly, rng)
        hung += bool(waiting)
    assert hung


def test_a_run_without_deaths_keeps_a_scope_in_one_process():
    rng = random.Random(0)
    collection = [f"test_m{m}.py::test_{t}" for m in range(6) for t in range(4)]
    scheduler = LoadScopeThatSurvivesACrash(_config(2))
    processes = [_Process("gw0"), _Process("gw1")]
    for process in processes:
        scheduler.add_node(process)
        scheduler.add_node_collection(process, collection)
    scheduler.schedule()
    where: dict[str, set[str]] = {}
    while any(p.can_start() for p in processes):
        process = rng.choice([p for p in processes if p.can_start()])
        index = process.held.pop(0)
        where.setdefault(collection[index].split("::")[0], set()).add(process.gateway.id)
        scheduler.mark_test_complete(process, index)
    assert len(where) == 6 and all(len(ids) == 1 for ids in where.values())
    assert all(p.finished() for p in processes)
