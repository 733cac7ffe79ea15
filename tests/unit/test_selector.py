"""localcluster/engine/selector.py: the event loop's selector, which pauses a lent channel
with one epoll_ctl (Epoll) or by unregistering it where there is no epoll (Portable). Both
are run here: on Linux the portable one sits on selectors' epoll, pausing its own way."""
from __future__ import annotations

import selectors
import socket
import sys

import pytest

from localcluster.engine import selector

pytestmark = pytest.mark.timeout(10)

KINDS = [selector.Portable] + ([selector.Epoll] if sys.platform.startswith("linux") else [])
READ, WRITE = selectors.EVENT_READ, selectors.EVENT_WRITE


@pytest.fixture(params=KINDS, ids=lambda k: k.__name__)
def sel(request):
    s = request.param()
    yield s
    s.close()


@pytest.fixture
def pair(socket_pair):
    return socket_pair


def ready(sel) -> list:
    return [(key.fileobj, mask) for key, mask in sel.select(0)]


def test_a_paused_file_is_not_selected_until_resumed_and_keeps_its_handler(sel, pair):
    a, b = pair
    sel.register(a, READ, "handler")
    b.send(b"x")
    assert ready(sel) == [(a, READ)]
    assert sel.pause(a).data == "handler"
    assert ready(sel) == []
    assert sel.get_key(a).data == "handler"         # still registered, for lend's checks
    sel.resume(a)
    assert ready(sel) == [(a, READ)]
    assert sel.get_key(a).data == "handler"


def test_a_hang_up_while_paused_is_reported_once_resumed_and_never_while_paused(sel, pair):
    """The worker died while a user thread read its channel: the loop must not be woken for
    it over and over meanwhile (a level-triggered hang-up would), and sees it once it is
    given back."""
    a, b = pair
    sel.register(a, READ, None)
    sel.pause(a)
    b.close()
    for _ in range(3):
        assert ready(sel) == []
    sel.resume(a)
    assert ready(sel) == [(a, READ)]


def test_events_changed_while_paused_apply_when_resumed(sel, pair):
    a, b = pair
    sel.register(a, READ, "h")
    sel.pause(a)
    assert sel.modify(a, READ | WRITE, "h").events == READ | WRITE
    assert ready(sel) == []
    sel.resume(a)
    assert ready(sel) == [(a, WRITE)]           # writable, nothing to read
    assert sel.get_key(a).events == READ | WRITE


def test_a_file_closed_before_it_is_unregistered_is_found_and_its_number_can_be_taken_again(sel, pair):
    """As with selectors: a socket closed first (fileno() is -1 then) is still unregistered,
    so a new file given the same number registers."""
    a, b = pair
    sel.register(a, READ, None)
    number = a.fileno()
    a.close()
    assert sel.unregister(a).fd == number
    c, d = socket.socketpair()
    try:
        assert number in (c.fileno(), d.fileno())
        mine = c if c.fileno() == number else d
        sel.register(mine, READ, None)
        assert sel.get_key(mine).fd == number
    finally:
        c.close()
        d.close()


def test_a_paused_file_can_be_unregistered_and_resuming_it_then_does_nothing(sel, pair):
    a, b = pair
    sel.register(a, READ, None)
    sel.pause(a)
    sel.unregister(a)
    sel.resume(a)
    b.send(b"x")
    assert ready(sel) == []
    with pytest.raises(KeyError):
        sel.get_key(a)
    sel.register(a, READ, None)                 # and it may be registered anew
    assert ready(sel) == [(a, READ)]


def test_registering_twice_is_refused(sel, pair):
    a, _b = pair
    sel.register(a, READ, None)
    with pytest.raises(KeyError):
        sel.register(a, READ, None)
