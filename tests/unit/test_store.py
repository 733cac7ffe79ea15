"""localcluster/worker/store.py on its own: results and payloads in, values and payloads out,
spilling least-recently-used first past ``target``, reloading as writable as before,
StoreError naming the key, and the figures handed to ``on_change``."""
from __future__ import annotations

import os
import pickle
import random
import threading

import numpy as np
import pytest

from localcluster.wire import serialize
from localcluster.wire.board import Board
from localcluster.wire.protocol import OUT_OF_BAND, Payload
from localcluster.worker.store import Store, StoreError

pytestmark = pytest.mark.timeout(30)

SIZE = 4 * OUT_OF_BAND          # large enough to travel out of band


def put(store: Store, key: str, value) -> Payload:
    """As the worker stores a task's result: the value and the payload made to measure it."""
    payload = serialize.dumps_result(value)
    store.put_result(key, value, payload)
    return payload


def blob(i: int, n: int = SIZE) -> bytes:
    return random.Random(i).randbytes(n)


class Recorder:
    """The ``on_change`` callback: every (managed, spilled, nkeys) it was handed."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, int]] = []

    def __call__(self, managed: int, spilled: int, nkeys: int) -> None:
        self.calls.append((managed, spilled, nkeys))

    @property
    def last(self):
        return self.calls[-1]


@pytest.fixture
def changes():
    return Recorder()


def spill_files(directory) -> list[str]:
    return sorted(os.listdir(directory)) if os.path.isdir(directory) else []


def spilled_keys(store: Store) -> set:
    return set(store._disk)


def consistent(store: Store, changes: Recorder, sizes: dict) -> None:
    """The figures agree with each other, with the files on disk and with what was stored."""
    managed, spilled, nkeys = changes.last
    assert (managed, spilled) == (store.managed, store.spilled)
    assert managed + spilled == sum(sizes.values())
    assert nkeys == len(spilled_keys(store))
    assert spilled == sum(sizes[k] for k in spilled_keys(store))
    if store.directory is not None:
        assert len(spill_files(store.directory)) == nkeys


# --- in and out ------------------------------------------------------------------------------

def test_put_result_keeps_the_value_itself(tmp_path, changes):
    store = Store(str(tmp_path), None, changes)
    value = {"a": [1, 2, 3], "b": np.arange(10)}
    payload = put(store, "k", value)
    assert "k" in store and "other" not in store
    assert store["k"] is value                             # no copy, no unpickling
    assert changes.last == (payload.nbytes, 0, 0)
    assert store.managed == payload.nbytes


def test_put_result_of_a_self_contained_payload_keeps_only_the_payload(tmp_path, changes):
    """A non-contiguous array pickles as a copy: the copy is kept, the value dropped."""
    store = Store(str(tmp_path), None, changes)
    value = np.arange(4 * SIZE // 8, dtype=np.float64).reshape(-1, 4)[:, ::2]
    payload = put(store, "k", value)
    assert serialize.self_contained(payload)
    assert store.payload("k") is payload                   # what is held, ready to send
    first = store["k"]
    assert first is not value and np.array_equal(first, value)
    assert store["k"] is first                             # unpickled once, then kept
    assert changes.last == (payload.nbytes, 0, 0)


def test_put_payload_is_unpickled_on_first_use(tmp_path, changes):
    store = Store(str(tmp_path), None, changes)
    payload = serialize.dumps([blob(1), "x"])
    store.put_payload("dep", payload)
    assert store.payload("dep") is payload                 # not unpickled to be sent on
    value = store["dep"]
    assert value == [blob(1), "x"]
    assert store["dep"] is value
    assert serialize.loads(store.payload("dep")) == value  # pickled again from the value
    assert changes.last == (payload.nbytes, 0, 0)


def test_payload_of_a_kept_value_is_its_pickle(tmp_path):
    store = Store(str(tmp_path), None)
    arr = np.arange(SIZE // 8, dtype=np.int64)
    put(store, "arr", arr)
    p = store.payload("arr")
    assert len(p.buffers) == 1                             # the array travels out of band
    assert np.array_equal(serialize.loads(p), arr)


def test_missing_keys_raise_keyerror(tmp_path):
    store = Store(str(tmp_path), 1)
    with pytest.raises(KeyError):
        store["nope"]
    with pytest.raises(KeyError):
        store.payload("nope")


def test_putting_a_key_again_replaces_it(tmp_path, changes):
    store = Store(str(tmp_path), None, changes)
    put(store, "k", blob(1))
    second = put(store, "k", b"short")
    assert store["k"] == b"short"
    assert changes.last == (second.nbytes, 0, 0)


def test_putting_a_spilled_key_again_removes_its_spill_file(tmp_path, changes):
    store = Store(str(tmp_path), 1, changes)
    put(store, "k", blob(1))
    sizes = {"filler": put(store, "filler", blob(2)).nbytes}
    assert spilled_keys(store) == {"k"}
    old_files = spill_files(tmp_path)
    sizes["k"] = put(store, "k", blob(3)).nbytes
    assert spilled_keys(store) == {"filler"}
    assert set(spill_files(tmp_path)).isdisjoint(old_files)       # the old k's file is gone
    consistent(store, changes, sizes)
    assert store["k"] == blob(3)


def test_free_forgets_keys_in_memory_and_on_disk(tmp_path, changes):
    store = Store(str(tmp_path), 2 * SIZE, changes)
    for i in range(4):
        put(store, f"k{i}", blob(i))
    assert spilled_keys(store) and len(spill_files(tmp_path)) == len(spilled_keys(store))
    store.free(("k0", "k3", "never-stored"))
    assert "k0" not in store and "k3" not in store
    assert store["k1"] == blob(1) and store["k2"] == blob(2)
    store.free(("k1", "k2"))
    assert changes.last == (0, 0, 0)
    assert spill_files(tmp_path) == []                     # every spill file removed
    assert (store.managed, store.spilled) == (0, 0)


# --- spilling ---------------------------------------------------------------------------------

def test_spills_least_recently_used_first_when_managed_exceeds_target(tmp_path, changes):
    store = Store(str(tmp_path), int(2.5 * SIZE), changes)
    sizes = {}
    for key in ("a", "b"):
        sizes[key] = put(store, key, blob(ord(key))).nbytes
    assert spilled_keys(store) == set() and spill_files(tmp_path) == []
    sizes["c"] = put(store, "c", blob(ord("c"))).nbytes
    assert spilled_keys(store) == {"a"}                    # the oldest went
    consistent(store, changes, sizes)
    assert store.managed <= store.target
    store["b"]                                             # b is now more recent than c
    sizes["d"] = put(store, "d", blob(ord("d"))).nbytes
    assert spilled_keys(store) == {"a", "c"}
    consistent(store, changes, sizes)


def test_the_key_just_put_stays_in_memory_even_above_target(tmp_path, changes):
    store = Store(str(tmp_path), SIZE // 2, changes)
    payload = put(store, "huge", blob(1))
    assert spilled_keys(store) == set()
    assert changes.last == (payload.nbytes, 0, 0) and store.managed > store.target


def test_without_a_directory_or_target_nothing_spills(tmp_path, changes):
    for directory, target in ((None, 1), (str(tmp_path), None)):
        store = Store(directory, target, changes)
        sizes = {f"k{i}": put(store, f"k{i}", blob(i)).nbytes for i in range(3)}
        assert spilled_keys(store) == set()
        consistent(store, changes, sizes)
    assert spill_files(tmp_path) == []


def _values():
    ro = np.arange(SIZE // 8, dtype=np.float64)
    ro.flags.writeable = False
    return {
        "bytes": blob(1),
        "small bytes": b"tiny",
        "bytearray": bytearray(blob(2)),
        "small bytearray": bytearray(b"tiny"),
        "array": np.arange(SIZE // 8, dtype=np.float64).reshape(-1, 8),
        "read-only array": ro,
        "fortran array": np.asfortranarray(np.arange(SIZE // 8, dtype=np.int32).reshape(64, -1)),
        "strided array": np.arange(SIZE // 4, dtype=np.int64)[::3],
        "nested": {"x": [np.arange(SIZE // 8), bytearray(blob(3))], "y": ("z", 1.5)},
    }


def _writable(value):
    if isinstance(value, np.ndarray):
        return value.flags.writeable
    if isinstance(value, dict):
        return [_writable(value["x"][0]), _writable(value["x"][1])]
    return isinstance(value, bytearray)


def _equal(a, b) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("name", list(_values()))
@pytest.mark.parametrize("stored_as", ["result", "payload"])
def test_reload_from_disk_keeps_value_type_and_writability(tmp_path, changes, name, stored_as):
    value = _values()[name]
    store = Store(str(tmp_path), 1, changes)
    if stored_as == "result":
        put(store, "k", value)
    else:
        store.put_payload("k", serialize.dumps(value))
    put(store, "filler", b"x")                             # pushes k out: target is 1 byte
    assert spilled_keys(store) == {"k"}
    back = store["k"]
    assert "k" not in spilled_keys(store)                  # reloaded (and the filler spilled instead)
    assert _equal(back, value)
    assert _writable(back) == _writable(value)
    if isinstance(back, bytearray):
        back[0] ^= 0xFF                                    # really writable
    elif isinstance(back, np.ndarray) and back.flags.writeable:
        back.flat[0] = 7


def test_a_spilled_payload_is_read_without_reloading(tmp_path, changes):
    store = Store(str(tmp_path), 1, changes)
    put(store, "k", blob(1))
    put(store, "filler", blob(2))
    assert spilled_keys(store) == {"k"}
    before, files = list(changes.calls), spill_files(tmp_path)
    managed = store.managed
    p = store.payload("k")
    assert serialize.loads(p) == blob(1)
    assert spilled_keys(store) == {"k"} and spill_files(tmp_path) == files   # still on disk
    assert changes.calls == before and store.managed == managed               # nothing moved
    assert p.nbytes == serialize.dumps_result(blob(1)).nbytes


def test_reloading_spills_others_to_stay_under_target(tmp_path, changes):
    store = Store(str(tmp_path), int(1.5 * SIZE), changes)
    sizes = {k: put(store, k, blob(i)).nbytes for i, k in enumerate("ab")}
    assert spilled_keys(store) == {"a"}
    assert store["a"] == blob(0)
    assert spilled_keys(store) == {"b"}
    consistent(store, changes, sizes)
    assert store["b"] == blob(1)
    assert spilled_keys(store) == {"a"}
    consistent(store, changes, sizes)


def test_a_failed_spill_keeps_the_data_in_memory(tmp_path, changes, capsys):
    missing = tmp_path / "gone"                            # the spill directory does not exist
    store = Store(str(missing), 1, changes)
    sizes = {"k": put(store, "k", blob(1)).nbytes}
    sizes["j"] = put(store, "j", blob(2)).nbytes
    err = capsys.readouterr().err
    assert "'k'" in err and "stays in memory" in err
    assert store["k"] == blob(1)
    consistent(store, changes, sizes)
    sizes["i"] = put(store, "i", blob(3)).nbytes           # j now fails; k is not retried
    err = capsys.readouterr().err
    assert "'j'" in err and "'k'" not in err
    consistent(store, changes, sizes)


def test_spill_for_rss_spills_until_under_the_limit_or_empty(tmp_path, changes):
    store = Store(str(tmp_path), None, changes)           # no target: only the RSS check spills
    sizes = {f"k{i}": put(store, f"k{i}", blob(i)).nbytes for i in range(3)}
    store.spill_for_rss(1 << 62)                           # far above any RSS: nothing to do
    assert spilled_keys(store) == set()
    store.spill_for_rss(0)                                 # never reached: everything goes, then it stops
    assert spilled_keys(store) == set(sizes) and store.managed == 0
    consistent(store, changes, sizes)
    assert all(store[k] == blob(i) for i, k in enumerate(sizes))


def test_spill_for_rss_without_a_directory_does_nothing(changes):
    store = Store(None, None, changes)
    put(store, "k", blob(1))
    calls = list(changes.calls)
    store.spill_for_rss(0)
    assert spilled_keys(store) == set() and changes.calls == calls


def test_spilling_for_rss_gives_back_the_warm_memory_a_spilled_value_leaves(tmp_path, changes):
    """A value the parent copied into recycled memory (wire/recycle.py) leaves it warm when
    spilled, and RSS does not fall: ``let_go`` gives it back after each spill, so spilling
    stops once under the line instead of emptying the store."""
    from localcluster.system.machine import rss
    from localcluster.wire.recycle import Recycler
    recycler = Recycler(1 << 30)
    store = Store(str(tmp_path), None, changes)
    n = 64 << 20
    for key in ("old", "new"):          # "old" is spilled first (least recently used)
        value = np.full(n // 8, 7.0)
        made = serialize.dumps_result(value)
        buf = recycler.take(n)
        buf[:] = made.buffers[0].raw()  # as the parent's copy: every page written
        store.put_payload(key, Payload(made.meta, (pickle.PickleBuffer(buf),), made.nbytes))
        del value, made, buf
    line = rss() - n // 2               # one value's memory given back brings RSS under it
    store.spill_for_rss(line, lambda: recycler.trim(everything=True))
    assert spilled_keys(store) == {"old"} and rss() < line
    assert store["old"].sum() == store["new"].sum() == 7.0 * (n // 8)


# --- errors name the key ----------------------------------------------------------------------

def _spill_one(tmp_path, changes, key="the-key"):
    store = Store(str(tmp_path), 1, changes)
    put(store, key, blob(1))
    put(store, "filler", blob(2))
    assert spilled_keys(store) == {key}
    (path,) = [os.path.join(tmp_path, f) for f in spill_files(tmp_path)]
    return store, path


def test_a_spill_file_deleted_behind_its_back_raises_storeerror_naming_the_key(tmp_path, changes):
    store, path = _spill_one(tmp_path, changes)
    os.unlink(path)
    for read in (lambda: store["the-key"], lambda: store.payload("the-key")):
        with pytest.raises(StoreError) as info:
            read()
        text = str(info.value)
        assert "'the-key'" in text and path in text and "FileNotFoundError" in text
    assert store["filler"] == blob(2)                      # the rest of the store is unaffected
    store.free(("the-key",))
    assert "the-key" not in store and changes.last[1:] == (0, 0)


def test_a_truncated_spill_file_raises_storeerror_naming_the_key(tmp_path, changes):
    store, path = _spill_one(tmp_path, changes)
    os.truncate(path, os.path.getsize(path) // 2)
    with pytest.raises(StoreError, match="'the-key'"):
        store["the-key"]


def test_unpickling_failure_raises_storeerror_naming_the_key(tmp_path):
    store = Store(str(tmp_path), None)
    store.put_payload("bad", Payload(b"not a pickle", (), 12))
    with pytest.raises(StoreError, match="unpickling the stored data of 'bad'") as info:
        store["bad"]
    assert isinstance(info.value.__cause__, pickle.UnpicklingError)


def test_pickling_failure_of_payload_raises_storeerror_naming_the_key(tmp_path):
    store = Store(str(tmp_path), None)
    lock = threading.Lock()
    store.put_result("locked", lock, serialize.dumps(0))  # a payload made some other way
    assert store["locked"] is lock
    with pytest.raises(StoreError, match="pickling the stored data of 'locked'"):
        store.payload("locked")


# --- figures ------------------------------------------------------------------------------------

def test_on_change_figures_follow_every_step(tmp_path, changes):
    store = Store(str(tmp_path), int(2.5 * SIZE), changes)
    sizes: dict = {}
    for i in range(6):
        sizes[f"k{i}"] = put(store, f"k{i}", blob(i, SIZE + i)).nbytes
        consistent(store, changes, sizes)
    for key in ("k0", "k5", "k1"):
        assert store[key] == blob(int(key[1]), SIZE + int(key[1]))
        consistent(store, changes, sizes)
    store.free(("k2", "k5"))
    del sizes["k2"], sizes["k5"]
    consistent(store, changes, sizes)
    assert all(m >= 0 and s >= 0 and n >= 0 for m, s, n in changes.calls)


def test_figures_reach_a_status_board(tmp_path):
    board = Board(1)
    try:
        store = Store(str(tmp_path), int(1.5 * SIZE), board.set_store)
        put(store, "a", blob(1))
        put(store, "b", blob(2))
        assert board.store() == (store.managed, store.spilled, 1)
        store.free(("a", "b"))
        assert board.store() == (0, 0, 0)
    finally:
        board.close()


def test_a_key_being_spilled_or_reloaded_is_never_seen_as_missing(tmp_path):
    """Spilling moves a key from memory to disk (and a load back) in two steps under the
    store's lock; ``in`` read without it saw a held key as missing between them, and a task
    parked for good for an input its worker had (found by tests/integration/test_differential.py)."""
    import threading
    s = Store(str(tmp_path), target=1 << 20)
    s.put_payload("k", serialize.dumps(bytes(1 << 20)))       # at the target: in memory
    stop, misses = threading.Event(), []

    def look():
        while not stop.is_set():
            if "k" not in s:
                misses.append(1)
    reader = threading.Thread(target=look)
    reader.start()
    try:
        for i in range(60):
            s.put_payload(f"x{i}", serialize.dumps(bytes(16)))     # past the target: "k" spills
            with s._lock:
                s._load("k")                                        # read by a task: back in memory
            s.free((f"x{i}",))
    finally:
        stop.set()
        reader.join(10)
    assert misses == []
