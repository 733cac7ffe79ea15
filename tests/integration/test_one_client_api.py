"""Differential: the Client API is one implementation over two transports (worker/api.py), so
the same random program of calls run through the user's Client and through a task's client
(``get_client()`` in a real worker) gives the same results, keys, statuses and errors."""
from __future__ import annotations

import concurrent.futures as cf
import gc
import os
import pickle
import random
import re
import threading
import time
from concurrent.futures import CancelledError

import pytest

from localcluster import get_client, get_worker
from localcluster.worker import api
from _util import block_until


def inc(x):
    return x + 1


def add(a, b):
    return a + b


def fail(x):
    raise ValueError(f"no {x!r}")


def inc_slowly(x):
    time.sleep(1.0)     # longer than the program's late wait (0.05 s) by far, even under load
    return x + 1


def total(xs):
    return sum(xs)


def _future_class(client):
    from localcluster.client.future import Future
    from localcluster.worker.client import TaskFuture
    return TaskFuture if type(client).__name__ == "TaskClient" else Future


def _error(call):
    """(type name, message) of what ``call()`` raises, or ("", its value)."""
    try:
        return "", call()
    except (Exception, CancelledError) as e:  # noqa: BLE001 - the error is what is compared
        # who cancelled differs between the two (the user's process, a task): the rest is the same
        return type(e).__name__, re.sub(r" was cancelled by .*?, and", " was cancelled by ..., and", str(e))


def _key(fut, seed):
    """A key as both runs make it: pure and given keys whole; a fresh key by its name only
    (its number is its process's), and so a key of futures (``total``): a future pickles with
    its client's id, which the pure key of the call hashes."""
    key = fut.key
    if key.startswith((f"k{seed}-", f"p{seed}-")) or (len(key.rsplit("-", 1)[-1]) == 40 and
                                                       not key.startswith("total-")):
        return key
    return key.rsplit("-", 1)[0]


def _let_go(client, key, timeout=5.0):
    """In the user's process, until the scheduler has let ``key`` go: a key its client let go
    of is dropped by the scheduler thread later (Dispatcher.free_released), while a task's
    drop travels in order on its channel; waiting makes both clients' programs see the same
    key states (test_let_go_then_held checks a key held again before its drop arrives)."""
    if key is None or type(client).__name__ != "Client":
        return
    deadline = time.monotonic() + timeout
    while key in client.who_has() and time.monotonic() < deadline:
        time.sleep(0.005)


def _step(client, rng, seed, futures, out, marker, small):
    """One random call of the program: its future(s) kept, what it says written to ``out``."""
    op = rng.choice(["submit", "fail", "map_prefix", "map_keys", "scatter", "nested", "rehold", "pickled",
                     "cancel", "who_has", "cf", "late"])
    # a program's own numbers: the pure keys of one seed are never those of another, which
    # the user's client let go of just before (_let_go)
    x = rng.randint(-50, 50) + 1000 * (seed % 10**6)
    if op == "submit":
        futures.append(client.submit(inc, x, pure=rng.random() < 0.7))
        y = rng.randint(100, 103) + 1000 * (seed % 10**6)     # a small range: the same call comes back often
        futures.append(client.submit(inc, y))
        small.setdefault(futures[-1].key, y)
    elif op == "fail":
        futures.append(client.submit(fail, x))
    elif op == "map_prefix":
        futures += client.map(inc, range(x, x + 3), key=f"p{seed}")
    elif op == "map_keys":
        futures += client.map(add, [x, x + 1], [1, 2], key=[f"k{seed}-{x}-a", f"k{seed}-{x}-b"])
    elif op == "scatter":
        data = rng.choice([x, [x, x + 1], {"a": x}, (x, str(x))])
        scattered = client.scatter(data)
        found = api.futures_in(scattered, _future_class(client))
        out.append(("scatter", type(scattered).__name__ if found != [scattered] else "future", len(found)))
        futures += found
    elif op == "nested" and futures:
        # never an input the program lets go of and holds again (rehold): its key then
        # stays as long as its dependent does, which _let_go would wait out
        inputs = [f for f in futures if f.key not in small]
        some = rng.sample(inputs, min(len(inputs), 3))
        futures.append(client.submit(total, [f for f in some]))
    elif op == "rehold" and any(y is not None for y in small.values()):
        key = rng.choice(sorted(k for k, y in small.items() if y is not None))
        y, small[key] = small[key], None        # held again once: then an input like any other
        for f in [f for f in futures if f.key == key]:
            futures.remove(f)
        f = None
        gc.collect()                    # every future of the key gone: released
        _let_go(client, key)
        again = client.submit(inc, y)   # the same pure call: the same key, held anew
        out.append(("rehold", again.key == key, again.result(60)))
        futures.append(again)
    elif op == "pickled" and futures:
        f = rng.choice(futures)
        back = pickle.loads(pickle.dumps(f))
        out.append(("pickled", back.key == f.key, type(back) is type(f)))
        futures.append(back)
    elif op == "cancel":
        blocker = client.submit(block_until, marker, pure=False)
        waiting = client.submit(inc, blocker)
        client.cancel([waiting])
        open(marker, "w").close()
        said, why = _error(waiting.result)          # its key is made of the blocker's, a fresh one
        out.append(("cancel", blocker.result(60), said, why.replace(repr(waiting.key), "<its key>"),
                    waiting.status, waiting.cancelled()))
        os.remove(marker)
    elif op == "cf":
        out.append(("cf",) + _through_concurrent_futures(client, x))
    elif op == "late":
        # Run elsewhere than the program: in a task, the program's wait lends its thread slot
        # (worker/process.py), where the task it waits for could run, and the slot is taken
        # back only once that ends (test_worker_client covers it): the wait would not time out.
        slow = client.submit(inc_slowly, x, pure=False, workers=[_elsewhere(client)])
        said, why = _error(lambda: slow.result(timeout=0.05))
        out.append(("late", said, why.split(":")[0], slow.done(), slow.status,
                    _error(lambda: slow.exception(timeout=0))[0], repr(slow).split(",")[0]))
        out.append(("late", slow.result(60), slow.done(), slow.status, slow.exception()))
    elif op == "who_has" and futures:
        client.gather(futures, errors="skip")
        held = client.who_has(futures)
        out.append(("who_has", sorted(_key(f, seed) for f in futures if f.status == "finished" and
                                      f.key in held and held[f.key]) ==
                    sorted(_key(f, seed) for f in futures if f.status == "finished")))


def _elsewhere(client):
    """A worker that does not run this program (any, in the user's process)."""
    here = get_worker().name if type(client).__name__ == "TaskClient" else None
    return sorted(set(client.scheduler_info()["workers"]) - {here})[0]


def _through_concurrent_futures(client, x):
    """concurrent.futures' own wait, as_completed and callbacks on the client's futures."""
    f = client.submit(inc, x, pure=False)
    done, not_done = cf.wait([f], timeout=60)
    called = threading.Event()
    f.add_done_callback(lambda fut: called.set() if fut is f else None)
    late = client.submit(fail, x, pure=False)
    seen = []
    late.add_done_callback(lambda fut: seen.append(type(fut.exception()).__name__))
    first = cf.wait([late, client.submit(inc, x + 1, pure=False)], timeout=60, return_when=cf.FIRST_EXCEPTION)[0]
    values = sorted(g.result() for g in cf.as_completed([client.submit(inc, x + 2, pure=False),
                                                           client.submit(inc, x + 3, pure=False)], timeout=60))
    return (isinstance(f, cf.Future), len(done), len(not_done), called.wait(10), f.result(), late in first,
            late.traceback() is not None, seen, values)


def _program(client, seed, marker):
    """The calls of ``seed``'s program, and what they said: keys, values, statuses, errors."""
    rng = random.Random(seed)
    futures, out = [], []
    # key -> y of the futures of inc(y) the program may let go of and hold again (None: it did)
    small: dict = {}
    for _ in range(12):
        _step(client, rng, seed, futures, out, marker, small)
    out.append(("keys", [_key(f, seed) for f in futures]))
    out.append(("skip", client.gather(futures, errors="skip")))
    out.append(("raise", _error(lambda: client.gather(futures))))
    out.append(("nested", client.gather({"all": futures[:2], "one": futures[-1]}, errors="skip")
                if futures else None))
    out.append(("statuses", [f.status for f in futures], [f.done() for f in futures]))
    out.append(("errors", [_error(f.result)[0] if f.status != "finished" else "" for f in futures],
                [_error(f.exception)[0] or type(f.exception()).__name__ for f in futures],
                [f.traceback() is not None for f in futures if f.status == "error"],
                [repr(f).split(",")[0] for f in futures], [f.cancelled() for f in futures]))
    out.append(("bad", _error(lambda: client.gather(futures, errors="bogus")),
                _error(lambda: client.submit(inc, 1, key=3)), _error(lambda: client.map(inc, [1], key=["a", "b"])),
                _error(lambda: client.run(len, on_error="bogus"))))
    info = client.scheduler_info()
    out.append(("info", info["type"], info["n_workers"], sorted(info["workers"])))
    out.append(("run", client.run(add, 1, 2)))
    return out


def _program_in_a_task(seed, marker):
    return _program(get_client(), seed, marker)


@pytest.mark.timeout(120)
def test_the_same_random_program_of_calls_says_the_same_in_a_task_and_in_the_users_process(client, tmp_path):
    """submit, map with a prefix and with keys, scatter, futures nested in arguments, futures
    released and held again, pickled, cancelled while pending, gather with errors= raise and
    skip, who_has, scheduler_info, run: the same through both clients."""
    for _ in range(3):
        seed = random.randrange(2**32)
        print(f"seed {seed}")
        here = _program(client, seed, str(tmp_path / "here"))
        there = client.submit(_program_in_a_task, seed, str(tmp_path / "there"), pure=False).result(90)
        assert there == here, f"seed {seed}"


@pytest.mark.timeout(60)
def test_a_future_of_another_client_in_the_arguments_is_refused_naming_it(client, cluster):
    """The Client's transport checks whose futures a task's arguments hold (a task's client
    takes any: the parent's scheduler knows every key)."""
    from localcluster import Client
    with Client(cluster, set_as_default=False) as other:
        theirs = other.submit(inc, 1)
        with pytest.raises(ValueError, match=rf"hold future {theirs.key!r} of another Client"):
            client.submit(inc, theirs)
        with pytest.raises(ValueError, match="of another Client"):
            client.map(add, [1], [theirs])
        assert client.submit(inc, client.submit(inc, 1)).result(30) == 3


@pytest.mark.timeout(60)
def test_a_future_unpickled_right_after_a_burst_of_submits_is_of_its_key(client):
    """A submit in a burst is deferred (engine/dispatch.py); a future of it unpickled at once
    asks the scheduler whether it knows the key, which it must answer after the deferred
    submits (most of these failed with 'not known to a running Client' before)."""
    for i in range(50):
        futures = [client.submit(inc, 10**6 * i + j) for j in range(3)]
        back = pickle.loads(pickle.dumps(futures[-1]))
        assert back.key == futures[-1].key and back.result(30) == 10**6 * i + 3


def _scatter_placements(client, names):
    """Where each scatter with ``workers=`` put its data (who_has), in the order made."""
    first, last = names
    futures = [client.scatter(i, workers=[last]) for i in range(3)]         # not where fewest keys are
    futures += client.scatter([10, 11], workers=first)
    futures.append(client.scatter(12, workers=[first, last], broadcast=True))
    futures.append(client.scatter(13, workers=["worker-gone"], allow_other_workers=True))
    held = client.who_has(futures)
    out = [sorted(held[f.key]) for f in futures[:-1]] + [len(held[futures[-1].key])]
    out.append(client.gather(futures))
    return out


def _scatter_placements_in_a_task(names):
    return _scatter_placements(get_client(), names)


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_scatter_to_named_workers_places_the_data_there_from_a_task_as_from_the_users_process(client):
    """The same scatter(workers=...) through a task's client and the user's puts the data on
    the same workers (a task's scatter once took workers= as a hint and placed by key count)."""
    names = sorted(client.cluster.workers)
    here = _scatter_placements(client, names)
    there = client.submit(_scatter_placements_in_a_task, names, pure=False).result(30)
    first, last = names
    assert here == [[last]] * 3 + [[first]] * 2 + [[first, last], 1, [0, 1, 2, 10, 11, 12, 13]]
    assert there == here
