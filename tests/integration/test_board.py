"""localcluster/wire/board.py on its own: the worker's row (heartbeat, store figures behind a
seqlock), the executor rows (start/stop/running), a second Board on the same memory, a
real second process writing it, and a reader that never waits on a dead writer."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import localcluster
from localcluster.wire.board import Board

pytestmark = pytest.mark.timeout(30)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(localcluster.__file__)))
VERSION = 4            # the seqlock's slot in row 0 (the module's layout)


@pytest.fixture
def board():
    b = Board(3)
    yield b
    b.close()


@pytest.fixture
def reader(board):
    """A second Board on the same memory, as the parent opens the worker's."""
    r = Board(board.nthreads, fd=os.dup(board.fd))
    yield r
    r.close()


def test_a_new_board_is_blank(board):
    assert board.heartbeat() == 0
    assert board.store() == (0, 0, 0)
    assert board.running() == {}


def test_heartbeat_is_the_monotonic_time_of_the_last_beat(board):
    t0 = time.monotonic_ns()
    board.beat()
    t1 = time.monotonic_ns()
    first = board.heartbeat()
    assert t0 <= first <= t1
    board.beat()
    assert first <= board.heartbeat() <= time.monotonic_ns()


def test_start_stop_and_running_rows(board):
    me, other = threading.get_ident(), threading.get_ident() + 1
    t0 = time.monotonic()
    board.start(1, me, 11)
    board.start(3, other, 33)
    t1 = time.monotonic()
    running = board.running()
    assert set(running) == {11, 33}
    assert running[11][0] == me and running[33][0] == other
    for _ident, started in running.values():
        assert t0 <= started <= t1
    board.stop(1)
    assert set(board.running()) == {33}
    assert board.running()[33] == running[33]              # the other row untouched
    board.start(1, me, 12)                                 # a row is reused by the next run
    assert set(board.running()) == {12, 33}
    board.stop(1)
    board.stop(3)
    assert board.running() == {}


def test_rows_do_not_touch_the_workers_row(board):
    board.beat()
    board.set_store(10, 20, 3)
    beat = board.heartbeat()
    for row in range(1, board.nthreads + 1):
        board.start(row, threading.get_ident(), 100 + row)
    assert set(board.running()) == {100 + row for row in range(1, board.nthreads + 1)}
    for row in range(1, board.nthreads + 1):
        board.stop(row)
    assert board.heartbeat() == beat and board.store() == (10, 20, 3)


def test_an_unsigned_thread_ident_fits(board):
    """pthread idents are unsigned: one with the top bit set must not overflow the int64 slot."""
    ident = (1 << 64) - 2
    board.start(2, ident, 5)
    got, _ = board.running()[5]
    assert 0 <= got < (1 << 63)
    assert got == ident & ((1 << 63) - 1)


def test_set_store_and_store_round_trip(board):
    for figures in [(1, 2, 3), (0, 5 << 40, 7), (123456789, 0, 0)]:
        version = board.slots[VERSION]
        board.set_store(*figures)
        assert board.store() == figures
        assert board.slots[VERSION] == version + 2 and board.slots[VERSION] % 2 == 0


def test_a_second_board_on_the_same_fd_sees_the_writers_values(board, reader):
    board.beat()
    board.set_store(111, 222, 2)
    board.start(2, threading.get_ident(), 77)
    assert reader.heartbeat() == board.heartbeat()
    assert reader.store() == (111, 222, 2)
    assert reader.running() == board.running()
    board.set_store(5, 6, 1)                               # later writes too: the memory is shared
    board.stop(2)
    assert reader.store() == (5, 6, 1) and reader.running() == {}


def test_the_board_outlives_its_writer(board):
    r = Board(board.nthreads, fd=os.dup(board.fd))
    try:
        board.set_store(9, 8, 7)
        board.start(1, threading.get_ident(), 42)
        board.close()                                      # the worker is gone...
        assert r.store() == (9, 8, 7)                      # ...its last state is still readable
        assert set(r.running()) == {42}
    finally:
        r.close()


def test_close_closes_the_fd_and_is_idempotent():
    b = Board(1)
    fd = b.fd
    assert os.path.exists(f"/proc/self/fd/{fd}")
    b.close()
    assert b.fd is None and b._mm.closed                   # unmapped, not just forgotten
    with pytest.raises(OSError):
        os.fstat(fd)
    b.close()


def test_store_returns_promptly_when_the_version_is_left_odd(board, reader):
    """A writer killed between the two increments leaves the version odd for good."""
    board.set_store(7, 8, 9)
    board.slots[VERSION] += 1                              # mid-write, forever
    assert board.slots[VERSION] % 2 == 1
    t0 = time.monotonic()
    figures = reader.store()
    elapsed = time.monotonic() - t0
    assert figures == (7, 8, 9)                            # the last figures written
    assert elapsed < 2.0, f"store() took {elapsed:.2f} s with an odd version"


def test_store_in_another_thread_does_not_hang_on_an_odd_version(board, reader):
    board.slots[VERSION] += 1
    done = threading.Event()
    result: list = []

    def read():
        result.append(reader.store())
        done.set()
    t = threading.Thread(target=read)
    t.start()
    try:
        assert done.wait(10), "store() did not return with the version left odd"
    finally:
        t.join(10)
    assert result == [(0, 0, 0)]


def test_a_second_process_writes_the_board(board, tmp_path):
    """A real second process (no fork) opens the board by its fd, writes and exits; then
    one that dies between the two version increments. The parent reads both."""
    script = tmp_path / "writer.py"
    script.write_text(textwrap.dedent("""
        import os, sys, threading
        from localcluster.wire.board import Board
        fd, mode = int(sys.argv[1]), sys.argv[2]
        b = Board(3, fd=fd)
        b.beat()
        b.set_store(1000, 2000, 3)
        b.start(2, threading.get_ident(), 55)
        print(threading.get_ident() & 0x7FFFFFFFFFFFFFFF, flush=True)
        if mode == "die-mid-write":
            b.slots[4] += 1
            b.slots[1] = -1                   # half the figures written, then killed
            os._exit(9)
        b.close()
    """))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
    before = time.monotonic_ns()
    out = subprocess.run([sys.executable, str(script), str(board.fd), "clean"], pass_fds=(board.fd,),
                         env=env, capture_output=True, text=True, timeout=20)
    assert out.returncode == 0, out.stderr
    assert board.heartbeat() >= before                     # CLOCK_MONOTONIC is system-wide
    assert board.store() == (1000, 2000, 3)
    assert board.running()[55][0] == int(out.stdout)
    killed = subprocess.run([sys.executable, str(script), str(board.fd), "die-mid-write"],
                            pass_fds=(board.fd,), env=env, capture_output=True, text=True, timeout=20)
    assert killed.returncode == 9, killed.stderr
    t0 = time.monotonic()
    board.store()                                          # torn, but it returns
    assert time.monotonic() - t0 < 2.0
    assert board.slots[VERSION] % 2 == 1
