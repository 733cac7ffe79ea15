"""What the worker's side of the wire and the parent's diagnosis (death.py) both need:
how a thread's ident is kept on the status board, the exception that carries a task's
traceback as text, and the one that says a transfer of localcluster's went wrong. Here rather than in death.py, so that a worker does not import the
diagnosis, and with it concurrent.futures, dataclasses' users and config (a noticeable
part of its start: ``python -X importtime`` shows it)."""
from __future__ import annotations


def thread_ident(ident: int) -> int:
    """A thread's ident as the status board keeps it and faulthandler prints it: the board's
    slots are signed 64-bit, so the top bit is dropped on both sides of every comparison."""
    return ident & 0x7FFFFFFFFFFFFFFF


class RemoteTraceback(Exception):
    """The ``__cause__`` of a task's exception where the raiser dropped its traceback (joblib
    does): the traceback it had on the worker, as text.

    Never raised by itself: it is printed under the task's exception, to read where the
    task failed on the worker.

    Attributes:
        text: the worker's traceback.
    """

    def __init__(self, text: str):
        self.text = text
        super().__init__(text)

    def __str__(self) -> str:
        return f'\n"""\n{self.text}"""'


class TransferError(RuntimeError):
    """A value's bytes arrived other than they were sent: localcluster lost track of a transfer
    between two of its processes. Never the user's data or code: each value is sealed where it
    is pickled (its buffers' lengths and a sample of their bytes) and checked where it lands,
    and a copy that breaks its seal is never unpickled. It is fetched again, or computed again
    from its lineage, first; this is what the user gets only when that failed ``tries`` times.

    Raised by ``result()`` (or a task that needed the value). Submit the work again, and
    report the message with ``client.get_versions()`` to the localcluster maintainers.

    Attributes:
        key: the key of the value.
        where: where its bytes were found wrong, in words.
        detail: how they differ from what was sent.
        tries: how many times it was fetched or computed, each with the same result.
        from_client: the bytes were this process's own (submit's arguments, scatter).
    """

    def __init__(self, key: str, where: str, detail: str, tries: int = 1, from_client: bool = False):
        self.key, self.where, self.detail, self.tries = key, where, detail, tries
        self.from_client = from_client      # the bytes were the client's own (arguments, scatter)
        super().__init__(key, where, detail, tries, from_client)

    def __str__(self) -> str:
        again = (f" It was fetched or computed again {self.tries - 1} time{'s' * (self.tries > 2)}, with the "
                 f"same result." if self.tries > 1 else "")
        ours = ("This is a failure of localcluster, not of your data or your code" if not self.from_client else
                "Unless your code changed an array after passing it to submit() or scatter() and before the "
                "task started (arguments are read when they are sent, not at submit(): pass a copy), this is a "
                "failure of localcluster, not of your data or your code")
        return (f"localcluster lost track of a transfer: the data of {self.key!r} {self.where} is not what was "
                f"sent ({self.detail}).{again} {ours}: no value was made of the wrong bytes. Submit the work "
                f"again, and please report this message with client.get_versions() to the localcluster "
                f"maintainers.")

    def __reduce__(self):
        return (TransferError, (self.key, self.where, self.detail, self.tries, self.from_client))
