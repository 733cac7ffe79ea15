"""Scheduler plugins (dask's SchedulerPlugin protocol) in the user's process: told of every
transition in order, of workers that come and go (a real SIGKILL), started at registration and
closed with the cluster; never on the scheduler thread; a plugin that raises is logged and goes on."""
from __future__ import annotations

import os
import signal
import threading

import pytest

from localcluster import Client, LocalCluster
from _util import wait_for

pytestmark = pytest.mark.timeout(120)


def inc(x):
    return x + 1


class Recorder:
    """A plugin written to dask's protocol, without distributed."""

    def __init__(self):
        self.calls: list = []
        self.threads: set = set()
        self.closed = threading.Event()

    def start(self, scheduler):
        self.calls.append(("start", sorted(scheduler.workers)))

    def transition(self, key, start, finish, *args, stimulus_id=None, **kwargs):
        self.threads.add(threading.current_thread().name)
        self.calls.append(("transition", key, start, finish))

    def add_worker(self, scheduler=None, worker=None):
        self.calls.append(("add_worker", worker))

    def remove_worker(self, scheduler=None, worker=None, **kwargs):
        self.calls.append(("remove_worker", worker))

    def close(self):
        self.calls.append(("close",))
        self.closed.set()

    def steps(self, key):
        return [c[2:] for c in self.calls if c[0] == "transition" and c[1] == key]


def test_a_scheduler_plugin_is_told_transitions_workers_and_close():
    plugin = Recorder()
    with LocalCluster(n_workers=2, forward_logs=False) as cluster, Client(cluster) as client:
        names = sorted(cluster.workers)
        assert client.register_plugin(plugin, name="rec") == "OK"
        assert plugin.calls[0] == ("start", names)
        fs = client.map(inc, range(5))
        assert client.gather(fs) == [1, 2, 3, 4, 5]
        key = fs[0].key
        wait_for(lambda: ("memory",) in [s[1:] for s in plugin.steps(key)], 30)
        steps = plugin.steps(key)
        assert steps[-1] == ("processing", "memory") and steps.index(("processing", "memory")) > 0, steps
        assert plugin.threads == {"localcluster-callbacks"}         # never the scheduler thread
        victim = names[0]
        os.kill(cluster.workers[victim].pid, signal.SIGKILL)
        wait_for(lambda: ("remove_worker", victim) in plugin.calls, 30)
        wait_for(lambda: any(c[0] == "add_worker" for c in plugin.calls), 60)   # its replacement
    assert plugin.closed.wait(10) and plugin.calls[-1] == ("close",)


class Failing(Recorder):
    def transition(self, key, start, finish, **kwargs):
        super().transition(key, start, finish)
        raise RuntimeError("a plugin's own bug")


def test_a_plugin_that_raises_is_logged_once_and_goes_on(caplog):
    plugin = Failing()
    with LocalCluster(n_workers=1, forward_logs=False) as cluster, Client(cluster) as client:
        client.register_plugin(plugin, name="failing")
        assert client.submit(inc, 1).result(30) == 2
        assert client.submit(inc, 2).result(30) == 3
        wait_for(lambda: len([c for c in plugin.calls if c[0] == "transition"]) >= 6, 30)
        client.unregister_scheduler_plugin("failing")
        assert plugin.closed.is_set()
        with pytest.raises(ValueError, match="no scheduler plugin of that name"):
            client.unregister_scheduler_plugin("failing")
    said = [r for r in caplog.records if "scheduler plugin 'failing' raised in transition()" in r.getMessage()]
    assert len(said) == 1


def test_distributeds_scheduler_plugin_with_a_coroutine_start():
    plugin_mod = pytest.importorskip("distributed.diagnostics.plugin")

    class Counter(plugin_mod.SchedulerPlugin):
        def __init__(self):
            self.started, self.memory = False, set()

        async def start(self, scheduler):
            self.started = True

        def transition(self, key, start, finish, *args, **kwargs):
            if finish == "memory":
                self.memory.add(key)

    plugin = Counter()
    with LocalCluster(n_workers=1, forward_logs=False) as cluster, Client(cluster) as client:
        client.register_plugin(plugin)
        assert plugin.started
        fs = client.map(inc, range(4))
        client.gather(fs)
        wait_for(lambda: plugin.memory >= {f.key for f in fs}, 30)


def test_the_story_ring_tells_what_came_after_a_mark_across_wraps_and_what_was_lost():
    """Transitions.since, against a list of every transition made (random counts, seed printed)."""
    import random
    from localcluster.scheduler.records import Spec, Task, Transitions
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = random.Random(seed)
    ring = Transitions(8)
    made: list = []
    events, mark, lost = ring.since(None)
    assert (events, lost) == ([], 0)
    for _ in range(40):
        for _ in range(rng.randrange(0, 12)):
            ts = Task(f"k{len(made)}", Spec(f"k{len(made)}", None, (), {}, ()), len(made))
            ring.apply(ts, "waiting", "e")
            made.append((ts.key, "released", "waiting", "e"))
        events, new_mark, lost = ring.since(mark)
        told = made[len(made) - (new_mark - mark):] if new_mark > mark else []
        assert lost == max(0, len(told) - 8) and events == told[lost:]
        mark = new_mark
