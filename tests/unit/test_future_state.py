"""The one state machine of a key's futures (worker/future.py), the Client's and a task's:
what ``conclude`` does with each way a task ends, and what every future of the key then says,
through concurrent.futures' own wait and callbacks too. A holder here is told how keys end,
as the Client's FutureTable is; the processes' side is tests/integration/test_one_client_api.py."""
from __future__ import annotations

import concurrent.futures as cf
import pickle
import threading

import pytest

from localcluster.client.future import Future as ClientFuture
from localcluster.wire import serialize
from localcluster.worker import future as F
from localcluster.worker.client import TaskFuture
from localcluster.worker.holding import KeyTable


class Told(KeyTable[F.FutureState]):
    """A holder told how keys end (as the Client's table is): nothing to ask."""

    client = "a client"

    def __init__(self) -> None:
        super().__init__(F.FutureState)
        self.gone: list = []

    def wait_here(self, state, deadline):
        pass

    def wait(self, state, timeout):
        return state.wait(timeout)

    def ended(self, state):
        return False

    def watched(self, state):
        pass

    def why_pending(self, key):
        return f"task {key!r} is queued"

    def materialize(self, state, kept, deadline, timeout):
        return state.swap(kept, serialize.loads(kept))

    def let_go(self, key):
        self.gone.append(key)
        return super().let_go(key)

    def reduce(self, key):
        return (str, (key,))


def _two(key="k"):
    table = Told()
    state, _ = table.take(key)
    table.take(key)
    return state, F.Future(key, state), F.Future(key, state)


def test_a_finished_key_gives_every_future_of_it_the_value_unpickled_once():
    state, one, two = _two()
    assert (one.status, one.done(), one.running()) == ("pending", False, False)
    state.conclude("finished", serialize.dumps([1, 2]))
    assert one.result() == [1, 2] and two.result() is one.result()       # unpickled once, shared
    assert (two.status, two.exception(), two.traceback(), two.cancelled()) == ("finished", None, None, False)


def test_an_error_is_raised_by_result_and_returned_by_exception_then_a_retry_makes_it_pending():
    state, one, _ = _two()
    state.conclude("error", ValueError("no"))
    with pytest.raises(ValueError, match="no"):
        one.result()
    assert isinstance(one.exception(), ValueError) and one.status == "error"
    assert F.first_error([state]) is not None
    state.conclude("retrying", None)
    assert one.status == "pending" and not one.done()
    state.conclude("finished", serialize.dumps(3))
    assert one.result() == 3 and F.first_error([state]) is None


def test_a_cancelled_key_raises_a_fresh_cancelled_error_each_time_and_ends_once():
    state, one, two = _two()
    state.conclude("cancelled", cf.CancelledError("by you"))
    for f in (one, two):
        with pytest.raises(cf.CancelledError, match="by you"):
            f.result()
        with pytest.raises(cf.CancelledError):
            f.exception()
    assert one.status == "cancelled" and one.cancelled() and not one.cancel()     # ended: nothing to do
    state.conclude("finished", serialize.dumps(1))          # a late answer changes nothing
    assert one.status == "cancelled"
    with pytest.raises(cf.InvalidStateError):
        one.set_result(1)


def test_a_lost_key_says_lost_and_why():
    state, one, _ = _two()
    why = RuntimeError("its worker died")
    state.conclude("lost", why)
    assert one.status == "lost" and one.exception() is why


def test_concurrent_futures_wait_as_completed_and_callbacks_wake_with_the_future_they_were_added_on():
    state, one, two = _two()
    seen = []
    one.add_done_callback(lambda f: seen.append(f is one))
    two.add_done_callback(lambda f: seen.append(f is two))
    ended = threading.Timer(0.01, lambda: state.conclude("finished", serialize.dumps(5)))
    ended.start()
    done, not_done = cf.wait([one, two], timeout=10)
    ended.join()
    assert done == {one, two} and not not_done and seen == [True, True]
    assert [f.result() for f in cf.as_completed([two, one], timeout=10)] == [5, 5]


def test_a_wait_past_its_timeout_says_why_the_key_is_not_done():
    state, one, _ = _two()
    with pytest.raises(cf.TimeoutError, match=r"result\(timeout=0.01\) timed out: task 'k' is queued"):
        one.result(timeout=0.01)


def test_fail_all_ends_every_pending_key_watched_or_not():
    table = Told()
    states = [table.take(k)[0] for k in "abc"]
    watched = F.Future("a", states[0])
    watched.add_done_callback(lambda f: None)          # a Condition made: the watched way
    states[2].conclude("finished", serialize.dumps(0))
    boom = RuntimeError("the cluster closed")
    F.fail_all(states, boom)
    assert [s.exception for s in states] == [boom, boom, None]


def test_release_lets_the_key_go_once_and_garbage_collection_not_again():
    state, one, two = _two()
    table = state.table
    one.release()
    one.release()
    del one
    assert table.gone == ["k"] and table.holds("k")          # two still holds it
    del two
    assert table.gone == ["k", "k"] and not table.holds("k")


def test_a_future_pickles_as_its_holder_says():
    _, one, _ = _two("key-1")
    assert pickle.loads(pickle.dumps(one)) == "key-1"


def test_the_futures_life_is_written_once_for_the_clients_and_the_tasks_futures():
    """The Client's Future and a task's TaskFuture add to the one Future; neither writes its
    own result, exception, done, status, cancel, release or pickling."""
    shared = {"result", "exception", "done", "cancelled", "status", "cancel", "release", "traceback",
              "__reduce__", "__del__", "__repr__", "_within"}
    for cls in (ClientFuture, TaskFuture):
        assert issubclass(cls, F.Future) and issubclass(cls, cf.Future)
        assert not shared & set(vars(cls)), (cls, shared & set(vars(cls)))
