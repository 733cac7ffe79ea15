"""The event loop's selector: what ``selectors`` gives, plus pausing one file object.

A user thread that waits for a future borrows its worker's channel for every round trip
(``EventLoop.lend``): the scheduler thread must not be woken by its reply meanwhile. With
``selectors`` that is an unregister and a register a round trip, Python's work and two
epoll_ctl (an insert allocates and polls the file again). Here it is one ``epoll.modify``
each way: pausing leaves only ``EPOLLONESHOT`` (a hang-up still reports once, then nothing:
level-triggered, it would wake the scheduler thread over and over while the borrower reads),
and :meth:`Epoll.select` leaves paused file objects out.

Where there is no epoll (not Linux), :class:`Portable`: ``selectors``' default, pausing by
unregistering.

Owns: its registrations (fd -> ``selectors.SelectorKey``) and the paused fds; callers
serialize changes (``EventLoop._reg_lock``), ``select`` runs on the loop thread.
"""
from __future__ import annotations

import math
import select
import selectors
from typing import Any

__all__ = ["make"]

_READ, _WRITE = selectors.EVENT_READ, selectors.EVENT_WRITE


def _fd(fileobj: Any) -> int:
    fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
    if fd < 0:
        raise ValueError(f"invalid file descriptor {fd}")
    return fd


class Epoll:
    def __init__(self) -> None:
        self._ep = select.epoll()
        self._keys: dict[int, selectors.SelectorKey] = {}
        self._paused: set = set()

    def _fd_of(self, fileobj: Any) -> int:
        """Its fd; for a file object closed since it was registered (fileno() -1), the fd it
        was registered under, as selectors finds it, else ValueError."""
        try:
            return _fd(fileobj)
        except ValueError:
            for key in self._keys.values():
                if key.fileobj is fileobj:
                    return key.fd
            raise

    @staticmethod
    def _mask(events: int) -> int:
        return (select.EPOLLIN if events & _READ else 0) | (select.EPOLLOUT if events & _WRITE else 0)

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        fd = _fd(fileobj)
        if fd in self._keys:
            raise KeyError(f"{fileobj!r} (fd {fd}) is already registered")
        key = selectors.SelectorKey(fileobj, fd, events, data)
        self._ep.register(fd, self._mask(events))
        self._keys[fd] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        key = self._keys.pop(self._fd_of(fileobj))
        self._paused.discard(key.fd)
        try:
            self._ep.unregister(key.fd)
        except OSError:             # closed already: the kernel dropped it with its last reference
            pass
        return key

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        key = self._keys[self._fd_of(fileobj)]
        new = selectors.SelectorKey(key.fileobj, key.fd, events, data)
        if key.fd not in self._paused:
            self._ep.modify(key.fd, self._mask(events))
        self._keys[key.fd] = new
        return new

    def pause(self, fileobj: Any) -> selectors.SelectorKey:
        """Not selected until :meth:`resume`; its registration stays."""
        key = self._keys[self._fd_of(fileobj)]
        self._ep.modify(key.fd, select.EPOLLONESHOT)
        self._paused.add(key.fd)
        return key

    def resume(self, fileobj: Any) -> None:
        key = self._keys.get(self._fd_of(fileobj))
        if key is not None and key.fd in self._paused:
            self._paused.discard(key.fd)
            try:
                self._ep.modify(key.fd, self._mask(key.events))
            except OSError:         # closed meanwhile: the kernel dropped it; unregister forgets it
                pass

    def get_key(self, fileobj: Any) -> selectors.SelectorKey:
        return self._keys[self._fd_of(fileobj)]

    def get_map(self) -> dict:
        """fd -> key, live (the loop checks a key is still registered before its handler)."""
        return self._keys

    def select(self, timeout: "float | None" = None) -> list:
        # as selectors does: a timeout rounded up to the millisecond, so as not to wake early
        timeout = -1 if timeout is None else (0 if timeout <= 0 else math.ceil(timeout * 1e3) * 1e-3)
        ready = []
        keys, paused = self._keys, self._paused
        for fd, ev in self._ep.poll(timeout, max(len(keys), 1)):
            key = keys.get(fd)
            if key is None or fd in paused:
                continue
            # a hang-up or an error counts as both, as in selectors
            mask = (_WRITE if ev & ~select.EPOLLIN else 0) | (_READ if ev & ~select.EPOLLOUT else 0)
            ready.append((key, mask & key.events))
        return ready

    def close(self) -> None:
        self._ep.close()
        self._keys.clear()
        self._paused.clear()


class Portable:
    """``selectors``' default, paused by unregistering (two system calls, where there is no
    epoll). Paused keys are few (one a waiting thread): found by the file object itself."""

    def __init__(self) -> None:
        self._sel = selectors.DefaultSelector()
        self._paused: list[selectors.SelectorKey] = []
        self.register, self.get_map, self.select = self._sel.register, self._sel.get_map, self._sel.select

    def _paused_key(self, fileobj: Any) -> "selectors.SelectorKey | None":
        for key in self._paused:
            if key.fileobj is fileobj:
                return key
        return None

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        key = self._paused_key(fileobj)
        if key is None:
            return self._sel.unregister(fileobj)
        self._paused.remove(key)
        return key

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        old = self._paused_key(fileobj)
        if old is None:
            return self._sel.modify(fileobj, events, data)
        new = selectors.SelectorKey(old.fileobj, old.fd, events, data)
        self._paused[self._paused.index(old)] = new
        return new

    def get_key(self, fileobj: Any) -> selectors.SelectorKey:
        key = self._paused_key(fileobj)
        return key if key is not None else self._sel.get_key(fileobj)

    def pause(self, fileobj: Any) -> selectors.SelectorKey:
        key = self._sel.unregister(fileobj)
        self._paused.append(key)
        return key

    def resume(self, fileobj: Any) -> None:
        key = self._paused_key(fileobj)
        if key is not None:
            self._paused.remove(key)
            self._sel.register(key.fileobj, key.events, key.data)

    def close(self) -> None:
        self._sel.close()


def make() -> "Epoll | Portable":
    return Epoll() if hasattr(select, "epoll") else Portable()
