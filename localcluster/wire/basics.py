"""What the worker's side of the wire and the parent's diagnosis (death.py) both need:
how a thread's ident is kept on the status board, and the exception that carries a task's
traceback as text. Here rather than in death.py, so that a worker does not import the
diagnosis, and with it concurrent.futures, dataclasses' users and config (~7 ms of its
start, measured by ``python -X importtime``)."""
from __future__ import annotations


def thread_ident(ident: int) -> int:
    """A thread's ident as the status board keeps it and faulthandler prints it: the board's
    slots are signed 64-bit, so the top bit is dropped on both sides of every comparison."""
    return ident & 0x7FFFFFFFFFFFFFFF


class RemoteTraceback(Exception):
    """The ``__cause__`` of a task's exception where the raiser dropped its traceback (joblib
    does): the traceback it had on the worker, as text."""

    def __init__(self, text: str):
        self.text = text
        super().__init__(text)

    def __str__(self) -> str:
        return f'\n"""\n{self.text}"""'
