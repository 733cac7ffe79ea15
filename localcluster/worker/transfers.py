"""The large values the parent copies straight into and out of this worker's memory
(wire/vmcopy.py; ARCHITECTURE.md has the protocol).

In: the channel hands over a message whose large buffers are fresh memory of this process
(``Incoming``). It is parked, the parent is told where the buffers are (``Landing``), and it
is handled once the parent says they are written (``Landed``). Everything read after it
waits behind it, in order: an Export of the key whose Put is parked must not overtake it.

Out: an Export the parent may copy out (``locate``) is answered with where the value's parts
are (``Located``), and the value stays pinned, unchanged, until the parent says it has read
them (``Unpin``), even if the key is freed meanwhile.

Reader role only (one thread at a time reads the channel, process.py), so no lock.
"""
from __future__ import annotations

from collections import deque
from typing import Any, Callable, Iterator, Optional

from ..wire import protocol as P
from ..wire import vmcopy
from ..wire.channel import Incoming


class Transfers:
    def __init__(self, send: Callable[[Any], Any]):
        self._send = send
        #: request -> the Payload a Located shows the parent, kept unchanged until its Unpin
        self.pinned: dict[int, P.Payload] = {}
        #: tokens -> a message received whose large buffers the parent copies in, until its Landed
        self._landing: dict[tuple, Any] = {}
        #: messages read after a landing one, handled once it has landed; empty while nothing lands
        self._behind: deque = deque()

    def holds(self, msg: Any) -> bool:
        """Keep ``msg`` (True) when it must wait behind a message whose bytes have not landed.
        Never a Landed: that is what they wait for."""
        if self._landing and type(msg) is not P.Landed:
            self._behind.append(msg)
            return True
        return False

    def park(self, msg: Incoming, pending: set) -> None:
        """Keep ``msg``'s inner message until its buffers have landed; its Runs count as
        ``pending`` meanwhile (a Cancel finds them). Tell the parent where to write."""
        inner = msg.msg
        self._landing[tuple(token for token, _buf in msg.landing)] = inner
        for one in (inner.messages if isinstance(inner, P.Batch) else (inner,)):
            if isinstance(one, P.Run):
                pending.add(one.seq)
        self._send(P.Landing(tuple((token, vmcopy.address(buf)[0]) for token, buf in msg.landing)))

    def landed(self, msg: P.Landed) -> Any:
        """The message whose buffers the parent has written (or could not: ``msg.ok`` false),
        to handle now, before :meth:`released`."""
        return self._landing.pop(msg.tokens)

    def released(self) -> Iterator[Any]:
        """The messages held back, in order, until one of them parks again."""
        while self._behind and not self._landing:
            yield self._behind.popleft()

    def pin(self, msg: P.Export, payload: P.Payload) -> bool:
        """Answer ``msg`` with where ``payload`` is, for the parent to copy it out, and keep it
        until its Unpin. False: it goes as Data (not asked to, small, or not contiguous)."""
        if not msg.locate or payload.nbytes < P.MEMFD_THRESHOLD:
            return False
        located = _located(msg, payload)
        if located is None:
            return False
        self.pinned[msg.request] = payload
        self._send(located)
        return True

    def unpin(self, request: int) -> None:
        self.pinned.pop(request, None)


def _located(msg: P.Export, payload: P.Payload) -> Optional[P.Located]:
    """Where ``payload``'s parts are in this process, or None when one has no single
    address (a buffer that is not contiguous)."""
    try:
        meta = payload.meta if type(payload.meta) is bytes else vmcopy.address(payload.meta)
        spans = tuple(vmcopy.address(b) for b in payload.buffers)
    except (BufferError, OSError, TypeError):
        return None
    return P.Located(msg.request, msg.key, meta, spans, payload.nbytes, payload.seals)
