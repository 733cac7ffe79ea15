"""A key let go of and held again at once: the scheduler forgets it only if no future holds it.

A Client lets go of a key when its last Future goes (even inside the garbage collector, on
any thread: Dispatcher.release queues it, lock-free); the scheduler drops it later. A submit,
a map or an unpickled Future of the same key in between holds it again: the drop, made
before, must reach the scheduler before that hold, not after it (else the scheduler forgets
a key a live Future holds, and its data with it). Random keys and orders, seed printed.
"""
from __future__ import annotations

import gc
import pickle
import random

import pytest

from localcluster import Client

pytestmark = pytest.mark.timeout(120)

BIG = 200_000       # bytes: a value that stays on its worker, so a result() must fetch it


def make(n, seed):
    return bytes([seed % 251]) * n


def test_a_key_let_go_of_and_held_again_at_once_keeps_its_data():
    seed = random.randrange(2**32)
    print(f"seed {seed}")
    rng = random.Random(seed)
    with Client(n_workers=2, threads_per_worker=1) as client:
        for round_ in range(40):
            key = f"k-{seed}-{round_ % 3}"
            value = make(BIG, round_ % 3)
            fut = client.submit(make, BIG, round_ % 3, key=key)
            fut.result(timeout=30)
            how = rng.choice(["submit", "unpickle", "map"])
            pickled = pickle.dumps(fut) if how == "unpickle" else None
            del fut
            gc.collect()        # the last Future of the key goes: its drop is queued
            if how == "submit":
                again = client.submit(make, BIG, round_ % 3, key=key)
            elif how == "unpickle":
                try:
                    again = pickle.loads(pickled)
                except ValueError as e:
                    # the drop reached the scheduler first (its thread's turn came): the key is
                    # gone, and unpickling says so, naming it; nothing to hold again
                    assert key in str(e) and "released" in str(e), f"seed {seed}: {e}"
                    continue
            else:
                again = client.map(make, [BIG], [round_ % 3], key=[key])[0]
            # the drop is handed in by now, whichever thread does it
            client.who_has()
            assert again.result(timeout=30) == value, f"seed {seed}, round {round_}, {how}"
            assert client.submit(len, again).result(timeout=30) == BIG, f"seed {seed}, round {round_}, {how}"
            assert key in client.who_has(), f"seed {seed}, round {round_}, {how}: the key was forgotten"
            del again
