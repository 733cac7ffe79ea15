"""localcluster/engine/loop.py on its own: the scheduler thread's event loop, run on the test's thread."""
from __future__ import annotations

import os
import socket

import pytest

from localcluster.engine.lifecycle import Lifecycle
from localcluster.engine.loop import EventLoop

pytestmark = pytest.mark.timeout(10)


def run_once(loop: EventLoop) -> None:
    """One select and its handlers, then return."""
    rounds = iter([True, False])
    loop.run(lambda now: None, 60.0, lambda: next(rounds))


class Pipe:
    """A readable end registered as an fd number (a sentinel) or as an object with
    fileno(), -1 once closed (a channel)."""

    def __init__(self, kind: str):
        self.kind = kind
        if kind == "fd":
            self.r, self.w = os.pipe()
        else:
            self.r, self.w = socket.socketpair()

    @property
    def fileobj(self):
        return self.r

    def fd(self) -> int:
        return self.r if self.kind == "fd" else self.r.fileno()

    def make_ready(self) -> None:
        os.write(self.w, b"x") if self.kind == "fd" else self.w.send(b"x")

    def close(self) -> None:
        for end in (self.r, self.w):
            os.close(end) if self.kind == "fd" else end.close()


@pytest.mark.parametrize("kind", ["fd", "object"])
def test_an_event_whose_file_a_handler_of_the_same_batch_closed_is_dropped(kind):
    """A worker's death closes its channel and sentinel while their events wait in the same
    batch, and a replacement may already own their fd numbers: neither the old handler nor
    the new one may see the stale event."""
    loop = EventLoop(Lifecycle(), on_wake=lambda: None)
    pipes = [Pipe(kind), Pipe(kind)]
    called: list = []
    replacements: list = []

    def handler(me: int):
        def h(mask: int) -> None:
            called.append(me)
            other = pipes[1 - me]
            number = other.fd()
            loop.unregister(other.fileobj)
            other.close()
            new = Pipe(kind)                  # takes the closed number
            replacements.append(new)
            assert new.fd() == number
            loop.register(new.fileobj, lambda mask: called.append("replacement"))
        return h
    try:
        for i, p in enumerate(pipes):
            loop.register(p.fileobj, handler(i))
            p.make_ready()                      # both ready in the first select
        run_once(loop)
        assert len(called) == 1, called
    finally:
        loop.close()
        for p in replacements:
            p.close()
        pipes[called[0]].close()


def test_a_lent_file_is_left_out_of_the_selector_until_given_back():
    """A user thread that reads a worker's channel itself borrows it from the loop: the loop
    must not wake for it meanwhile, nor lend it twice, and selects it again once given back."""
    loop = EventLoop(Lifecycle(), on_wake=lambda: None)
    pipe = Pipe("object")
    called: list = []
    try:
        loop.register(pipe.fileobj, called.append)
        pipe.make_ready()
        woken: list = []
        assert loop.lend(pipe.fileobj, lambda: woken.append(1))
        assert not loop.lend(pipe.fileobj, lambda: None)          # one borrower at a time
        loop.want_write(pipe.fileobj, True)     # a backlog: the borrower is woken to write it
        assert woken == [1]
        loop.want_write(pipe.fileobj, False)
        rounds = iter([True, False])
        loop.run(lambda now: None, 0.05, lambda: next(rounds))     # a select that times out
        assert called == []
        loop.give_back(pipe.fileobj)
        run_once(loop)
        assert len(called) == 1
    finally:
        loop.close()
        pipe.close()


def test_a_file_unregistered_while_lent_is_not_selected_again_when_given_back():
    """The worker died while a user thread read its channel: the scheduler thread unregisters
    and closes it; the borrower's give_back must not register a closed file (whose number
    another file may own by then)."""
    loop = EventLoop(Lifecycle(), on_wake=lambda: None)
    pipe = Pipe("object")
    try:
        loop.register(pipe.fileobj, lambda mask: None)
        assert loop.lend(pipe.fileobj, lambda: None)
        loop.unregister(pipe.fileobj)
        loop.give_back(pipe.fileobj)
        assert not loop.lend(pipe.fileobj, lambda: None)          # not registered any more
        loop.want_write(pipe.fileobj, True)         # and no trace of it comes back
        assert not loop.lend(pipe.fileobj, lambda: None)
    finally:
        loop.close()
        pipe.close()
