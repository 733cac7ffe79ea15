"""The keys a client holds (worker/holding.py's KeyTable), which the Client's FutureTable and a
task's TaskChannel both are: a state per key shared by its futures, renewed once ended and
held again, and the last future's going said once."""
from __future__ import annotations

from localcluster.worker.holding import KeyTable


class State:
    def __init__(self, table, key):
        self.key, self.holders, self.ended = key, 1, False

    def done(self):
        return self.ended


def made(key, state):
    return (key, state)


def test_the_futures_of_a_key_share_one_state_and_the_last_to_go_says_so():
    table = KeyTable(State)
    futures, again = table.take_many(["a", "b", "a"], made)
    assert [key for key, _ in futures] == ["a", "b", "a"] and futures[0][1] is futures[2][1] is table.state("a")
    assert again == {"a": 1}        # held before it in the call: the scheduler counts a client once a key
    assert table.take_many(["a"], made)[1] == {"a": 1} and table.state("a").holders == 3
    assert [table.let_go("a") for _ in range(3)] == [False, False, True]
    assert not table.holds("a") and table.holds("b")


def test_an_ended_key_held_again_gets_a_pending_state_and_the_earlier_futures_keep_theirs():
    table = KeyTable(State)
    first, new = table.take("k")
    assert new
    first.ended = True
    second, new = table.take("k")
    assert not new and second is not first and not second.done() and first.done()
    assert second.holders == 2      # the count of the key's futures carries over
    second.ended = True
    table.renew("k")                # computed again: the futures from now on wait for that run
    assert table.state("k") is not second and table.state("k").holders == 2
    assert [table.let_go("k"), table.let_go("k")] == [False, True]
