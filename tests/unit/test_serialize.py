"""localcluster/wire/serialize.py on its own: user data to Payload and back (types, formats,
shapes, memory order and writability kept), which buffers leave the pickle stream,
exceptions to bytes and back, and serialization_error()."""
from __future__ import annotations

import pickle
import threading
import traceback

import numpy as np
import pytest

from localcluster.wire import serialize
from localcluster.death import TaskError
from localcluster.wire.protocol import OUT_OF_BAND, SHARED_MAX, Payload, shared

pytestmark = pytest.mark.timeout(30)


def over_the_wire(payload: Payload, writable: bool) -> Payload:
    """The Payload as the receiving end of a channel sees it: pickled with its buffers out
    of band, and each buffer a fresh copy (a private mapping is writable; inline bytes are not)."""
    bufs: list = []
    data = pickle.dumps(payload, protocol=5, buffer_callback=bufs.append)
    copies = [pickle.PickleBuffer(bytearray(b.raw()) if writable else bytes(b.raw())) for b in bufs]
    return pickle.loads(data, buffers=copies)


ROUTES = {
    "direct": lambda p: p,
    "wire, writable buffers": lambda p: over_the_wire(p, True),
    "wire, read-only buffers": lambda p: over_the_wire(p, False),
}


@pytest.fixture(params=list(ROUTES))
def route(request):
    return ROUTES[request.param]


def buffer_sizes(payload: Payload) -> list[int]:
    return [pb.raw().nbytes for pb in payload.buffers]


def meta_size(payload: Payload) -> int:
    m = payload.meta
    return len(m) if type(m) is bytes else m.raw().nbytes


# --- bytes, bytearray, memoryview ---------------------------------------------------------------

@pytest.mark.parametrize("n", [0, 10, OUT_OF_BAND - 1, OUT_OF_BAND, 3 * OUT_OF_BAND + 5])
@pytest.mark.parametrize("kind", [bytes, bytearray])
def test_bytes_and_bytearray_round_trip(kind, n, route):
    value = kind(np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8).tobytes())
    back = serialize.loads(route(serialize.dumps(value)))
    assert type(back) is kind and back == value
    if kind is bytearray:
        back[:0] = b"x"                                    # still a bytearray: writable, resizable
        assert len(back) == n + 1


@pytest.mark.parametrize("n, out_of_band", [(OUT_OF_BAND - 1, False), (OUT_OF_BAND, True)])
@pytest.mark.parametrize("make", [
    bytes, bytearray,
    lambda n: np.zeros(n, dtype=np.uint8),
    lambda n: memoryview(bytearray(n)),
], ids=["bytes", "bytearray", "array", "memoryview"])
def test_out_of_band_buffers_only_for_large_values(make, n, out_of_band):
    value = make(n)
    payload = serialize.dumps(value)
    if out_of_band:
        assert buffer_sizes(payload) == [n]               # the data itself, out of the stream
        assert meta_size(payload) < OUT_OF_BAND
        assert not serialize.self_contained(payload)
    else:
        assert buffer_sizes(payload) == []
        assert meta_size(payload) >= n
    assert payload.nbytes == meta_size(payload) + sum(buffer_sizes(payload))
    assert all(type(pb) is pickle.PickleBuffer for pb in payload.buffers)


def test_large_bytes_inside_a_container_stay_in_the_stream():
    """Only a top-level bytes is wrapped: inside a list pickle keeps it in the stream, and
    the payload is then a copy of its value (self-contained), its meta itself out of band."""
    payload = serialize.dumps([b"a" * OUT_OF_BAND])
    assert buffer_sizes(payload) == []
    assert type(payload.meta) is pickle.PickleBuffer and serialize.self_contained(payload)
    assert serialize.loads(payload) == [b"a" * OUT_OF_BAND]


def _memoryviews():
    big = OUT_OF_BAND // 4 + 1                             # int32 elements: just above the threshold
    return {
        "bytes, 1-d": memoryview(b"abcdef"),
        "int32, 2-d": memoryview(np.arange(12, dtype=np.int32).reshape(3, 4)),
        "float64, 3-d, large": memoryview(np.arange(big, dtype=np.float64).reshape(1, -1, 1)),
        "int32, large": memoryview(np.arange(big, dtype=np.int32)),
        "strided, 1-d": memoryview(bytearray(range(100)))[::3],
        "strided, 2-d": memoryview(np.arange(40, dtype=np.int16).reshape(5, 8))[::2],
        "strided, large": memoryview(np.arange(big * 2, dtype=np.int32))[::2],
        "0-d": memoryview(np.array(2.5)),
    }


@pytest.mark.parametrize("name", list(_memoryviews()))
def test_memoryview_keeps_format_shape_and_values(name, route):
    view = _memoryviews()[name]
    back = serialize.loads(route(serialize.dumps(view)))
    assert type(back) is memoryview
    assert (back.format, back.shape, back.itemsize) == (view.format, view.shape, view.itemsize)
    assert back.tolist() == view.tolist()


def test_memoryview_inside_a_container():
    view = memoryview(np.arange(6, dtype=np.int64).reshape(2, 3))
    back = serialize.loads(serialize.dumps({"v": [view]}))
    assert back["v"][0].shape == (2, 3) and back["v"][0].tolist() == view.tolist()


def test_fortran_ordered_memoryview_directly():
    """A large Fortran-ordered view unpickled from its own buffer is the view itself."""
    view = memoryview(np.asfortranarray(np.arange(OUT_OF_BAND, dtype=np.int32).reshape(256, -1)))
    assert view.f_contiguous and not view.c_contiguous
    back = serialize.loads(serialize.dumps(view))
    assert back.shape == view.shape and back.tolist() == view.tolist()


@pytest.mark.parametrize("n, route_name", [(12, "direct"), (OUT_OF_BAND, "wire, writable buffers")])
def test_fortran_ordered_memoryview_keeps_its_values(n, route_name):
    view = memoryview(np.asfortranarray(np.arange(n, dtype=np.int32).reshape(4, -1)))
    assert view.f_contiguous and not view.c_contiguous
    back = serialize.loads(ROUTES[route_name](serialize.dumps(view)))
    assert back.shape == view.shape
    assert back.tolist() == view.tolist()


# --- numpy ------------------------------------------------------------------------------------------

def _arrays():
    large = OUT_OF_BAND // 8 * 4
    return {
        "small contiguous": np.arange(10, dtype=np.int16),
        "large contiguous": np.arange(large, dtype=np.float64).reshape(-1, 4),
        "small non-contiguous": np.arange(40, dtype=np.int32).reshape(5, 8)[:, ::3],
        "large non-contiguous": np.arange(2 * large, dtype=np.float64).reshape(-1, 4)[:, ::2],
        "small fortran": np.asfortranarray(np.arange(20, dtype=np.float32).reshape(4, 5)),
        "large fortran": np.asfortranarray(np.arange(large, dtype=np.complex128).reshape(64, -1)),
        "structured": np.array([(1, 2.0), (3, 4.0)] * 5000, dtype=[("a", "i4"), ("b", "f8")]),
        "read-only": np.arange(large, dtype=np.uint8),
    }


@pytest.mark.parametrize("name", list(_arrays()))
def test_numpy_arrays_round_trip(name, route):
    arr = _arrays()[name]
    if name == "read-only":
        arr.flags.writeable = False
    back = serialize.loads(route(serialize.dumps(arr)))
    assert type(back) is np.ndarray
    assert back.dtype == arr.dtype and back.shape == arr.shape
    assert np.array_equal(back, arr)
    if arr.flags.f_contiguous and not arr.flags.c_contiguous:
        assert back.flags.f_contiguous                     # memory order kept


@pytest.mark.parametrize("name", ["large contiguous", "large fortran", "large non-contiguous"])
def test_large_arrays_which_travel_out_of_band(name):
    arr = _arrays()[name]
    payload = serialize.dumps(arr)
    if arr.flags.c_contiguous or arr.flags.f_contiguous:
        assert buffer_sizes(payload) == [arr.nbytes] and not serialize.self_contained(payload)
    else:                                                  # numpy pickles a copy in the stream
        assert buffer_sizes(payload) == [] and serialize.self_contained(payload)
    assert payload.nbytes >= arr.nbytes


def test_an_array_unpickled_from_its_own_buffer_shares_it():
    arr = np.arange(OUT_OF_BAND, dtype=np.uint8)
    back = serialize.loads(serialize.dumps(arr))
    assert np.shares_memory(back, arr)                     # no copy in-process
    writable = serialize.loads(over_the_wire(serialize.dumps(arr), writable=True))
    assert writable.flags.writeable


def test_dumps_result_matches_dumps_and_falls_back_to_cloudpickle():
    arr = np.arange(OUT_OF_BAND, dtype=np.uint8)
    for value in (arr, b"x" * OUT_OF_BAND, {"a": 1}):
        p = serialize.dumps_result(value)
        assert buffer_sizes(p) == buffer_sizes(serialize.dumps(value))
        back = serialize.loads(p)
        assert np.array_equal(back, value) if isinstance(value, np.ndarray) else back == value
    offset = 41
    fn = serialize.loads(serialize.dumps_result(lambda x: x + offset))   # only cloudpickle can
    assert fn(1) == 42


@pytest.mark.parametrize("value", [None, 0, -1, 2**70, 1.5, True, 1j, "x", "é" * 10, b"b" * 10,
                                   b"b" * (OUT_OF_BAND - 1), "s" * OUT_OF_BAND])
def test_a_plain_result_pickles_to_the_same_bytes_on_the_fast_path(value):
    p = serialize.dumps_result(value)
    meta = p.meta if type(p.meta) is bytes else bytes(p.meta.raw())
    assert meta == pickle.dumps(value, protocol=5) and p.buffers == () and p.nbytes == len(meta)
    assert (type(p.meta) is bytes) == (len(meta) < OUT_OF_BAND)     # a large one leaves the stream
    back = serialize.loads(over_the_wire(p, writable=False))
    assert back == value and type(back) is type(value)


def test_small_results_are_kept_as_one_shared_payload_each():
    """The parent keeps one Payload for each small value (protocol.shared), so that a big
    map's finished no-ops do not each hold their own."""
    memo: dict = {}
    values = (None, True, False, 0, 1, 255, "ok", 1.5)
    first = [shared(over_the_wire(serialize.dumps_result(v), writable=False), memo) for v in values]
    again = [shared(over_the_wire(serialize.dumps_result(v), writable=False), memo) for v in values]
    for v, a, b in zip(values, first, again):
        assert a is b
        back = serialize.loads(b)
        assert back == v and type(back) is type(v)
    assert len({id(p) for p in first}) == len(values)      # one per value, not one for all
    big = [shared(over_the_wire(serialize.dumps_result("x" * 100), writable=False), memo) for _ in range(2)]
    assert big[0] is not big[1] and serialize.loads(big[1]) == "x" * 100
    arr = np.arange(OUT_OF_BAND, dtype=np.uint8)
    with_buffers = serialize.dumps_result(arr)
    assert shared(with_buffers, memo) is with_buffers and shared(None, memo) is None


def test_the_shared_payloads_are_bounded():
    memo: dict = {}
    kept = [shared(serialize.dumps_result(i), memo) for i in range(SHARED_MAX + 10)]
    assert len(memo) == SHARED_MAX
    assert shared(serialize.dumps_result(SHARED_MAX + 5), memo) is not kept[SHARED_MAX + 5]   # past the bound: as it came
    assert serialize.loads(kept[-1]) == SHARED_MAX + 9


def test_closures_and_local_classes_travel():
    def make():
        class Local:
            def __init__(self, v):
                self.v = v
        return Local
    Local = make()
    back = serialize.loads(serialize.dumps([Local(3), lambda: 7]))
    assert back[0].v == 3 and back[1]() == 7


def test_a_failed_dumps_leaves_the_threads_pickler_clean():
    with pytest.raises(TypeError):
        serialize.dumps([np.zeros(OUT_OF_BAND, dtype=np.uint8), threading.Lock()])
    small = serialize.dumps(1)
    assert buffer_sizes(small) == [] and serialize.loads(small) == 1
    big = serialize.dumps(bytearray(OUT_OF_BAND))
    assert buffer_sizes(big) == [OUT_OF_BAND]              # not the buffer of the failed call


def test_dumps_from_several_threads_at_once():
    errors: list = []
    start = threading.Barrier(4)

    def work(t: int):
        try:
            start.wait(10)
            for i in range(50):
                value = (t, i, np.full(OUT_OF_BAND // 8, t * 1000 + i, dtype=np.int64))
                back = serialize.loads(serialize.dumps(value))
                assert back[:2] == (t, i) and np.all(back[2] == t * 1000 + i)
        except BaseException as e:   # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert not errors and not any(t.is_alive() for t in threads)


# --- exceptions --------------------------------------------------------------------------------

class BadRecord(Exception):
    """An __init__ that does not take its own args."""

    def __init__(self, record, why):
        self.record, self.why = record, why
        super().__init__(f"record {record!r}: {why}")


class HoldsALock(Exception):
    def __init__(self, msg):
        super().__init__(msg)
        self.lock = threading.Lock()


def _fail_to_rebuild():
    raise RuntimeError("cannot be rebuilt here")


class RefusesToUnpickle(Exception):
    def __reduce__(self):
        return (_fail_to_rebuild, ())


def raise_here(exc: BaseException):
    raise exc


def caught(exc: BaseException) -> BaseException:
    try:
        raise_here(exc)
    except BaseException as e:   # noqa: BLE001
        return e
    raise AssertionError("unreachable")


def frame_names(exc: BaseException) -> list[str]:
    return [f.name for f in traceback.extract_tb(exc.__traceback__)]


def test_an_exception_round_trips_with_its_traceback():
    exc = caught(ValueError("boom", 42))
    back = serialize.loads_exception(serialize.dumps_exception(exc, step="running task 'x'"))
    assert type(back) is ValueError and back.args == ("boom", 42)
    assert "raise_here" in frame_names(back)               # the remote frames, rebuilt by tblib
    assert frame_names(back)[-1] == frame_names(exc)[-1]


def test_the_chain_comes_back():
    try:
        try:
            raise_here(KeyError("inner"))
        except KeyError as inner:
            raise RuntimeError("outer") from inner
    except RuntimeError as e:
        exc = e
    back = serialize.loads_exception(serialize.dumps_exception(exc))
    assert type(back) is RuntimeError and str(back) == "outer"
    assert type(back.__cause__) is KeyError and back.__cause__.args == ("inner",)
    assert back.__suppress_context__


def test_an_exception_whose_init_refuses_its_args_comes_back_as_itself():
    exc = caught(BadRecord({"id": 3}, "negative size"))
    back = serialize.loads_exception(serialize.dumps_exception(exc))
    assert type(back) is BadRecord
    assert (back.record, back.why) == ({"id": 3}, "negative size") and str(back) == str(exc)


def test_an_unpicklable_exception_becomes_a_taskerror_saying_why():
    exc = caught(HoldsALock("the message"))
    back = serialize.loads_exception(serialize.dumps_exception(exc, step="the step"))
    assert isinstance(back, TaskError)
    assert back.type_name.endswith("HoldsALock") and back.message == "the message"
    assert "could not be pickled on the worker" in back.step and back.step.startswith("the step")
    assert "raise_here" in back.traceback_text


def test_an_exception_that_cannot_be_rebuilt_becomes_a_taskerror_saying_why():
    exc = caught(RefusesToUnpickle("nope"))
    back = serialize.loads_exception(serialize.dumps_exception(exc))
    assert isinstance(back, TaskError) and back.type_name.endswith("RefusesToUnpickle")
    assert "could not be unpickled in the parent" in back.step and "cannot be rebuilt here" in back.step


@pytest.mark.parametrize("exc", [SystemExit(3), KeyboardInterrupt()], ids=["SystemExit", "KeyboardInterrupt"])
def test_a_stopping_exception_never_reaches_the_caller_as_itself(exc):
    back = serialize.loads_exception(serialize.dumps_exception(caught(exc)), key="f-1")
    assert isinstance(back, TaskError) and isinstance(back, Exception)
    assert type(back.original) is type(exc)
    assert "'f-1'" in back.message and "raise_here" in back.message


def test_serialization_error_keeps_the_type_and_prefixes_the_step():
    exc = caught(ValueError("bad value"))
    exc.__cause__ = KeyError("hidden")
    new = serialize.serialization_error(exc, "pickling the result of task 'f-1' failed")
    assert type(new) is ValueError
    assert str(new).startswith("pickling the result of task 'f-1' failed: ValueError: bad value")
    assert new.__cause__ is None
    assert new.__traceback__ is exc.__traceback__


@pytest.mark.parametrize("exc", [KeyError("k"), BadRecord(1, "why"),
                                 UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")],
                         ids=["str differs", "other init", "five args"])
def test_serialization_error_falls_back_to_taskerror(exc):
    exc = caught(exc)
    new = serialize.serialization_error(exc, "the step")
    assert isinstance(new, TaskError)
    assert new.type_name.endswith(type(exc).__qualname__) and new.message == str(exc)
    assert new.step == "the step" and "raise_here" in new.traceback_text
    assert new.__traceback__ is exc.__traceback__


def test_describe_shortens_long_reprs():
    assert serialize.describe([1, 2]) == "[1, 2]"
    long = serialize.describe(list(range(1000)))
    assert len(long) == 80 and long.endswith("...") and long.startswith("[0, 1, 2")


@pytest.mark.parametrize("args", [(1,), (1, "a", 2.5, None, True, 3j, b"x" * 100), (), ("é" * 10_000,)])
def test_plain_arguments_pickle_to_the_same_bytes_on_the_fast_path(args):
    # A pure task's key hashes its pickled arguments: the C pickler's fast path for plain
    # values must write what cloudpickle writes, or the same call would get two keys.
    fast, deps = serialize.dumps_collecting((args, {}))
    slow = serialize.dumps(((args, {})))
    assert deps == {} and bytes(fast.meta.raw() if hasattr(fast.meta, "raw") else fast.meta) == \
        bytes(slow.meta.raw() if hasattr(slow.meta, "raw") else slow.meta)
    assert serialize.loads(fast) == (args, {})


def test_a_map_of_plain_arguments_pickles_each_as_one_call_would_or_not_at_all():
    argss = [(1,), (1, "a", 2.5, None, True, 3j, b"x" * 100), (), ("é" * 40_000,)]
    many = serialize.dumps_plain_many(argss)
    for args, payload in zip(argss, many, strict=True):
        one, _ = serialize.dumps_collecting((args, {}))
        raw = [bytes(p.meta.raw() if isinstance(p.meta, pickle.PickleBuffer) else p.meta) for p in (payload, one)]
        assert raw[0] == raw[1] and payload.nbytes == one.nbytes and payload.buffers == one.buffers == ()
        assert serialize.loads(payload) == (args, {})
    # one argument the fast path cannot take (a container may hold a Future; large bytes
    # leave the stream) and the whole map goes the usual way
    assert serialize.dumps_plain_many([(1,), ([1],)]) is None
    assert serialize.dumps_plain_many([(1,), (b"x" * (1 << 17),)]) is None


# --- PlainArgs: a task's plain arguments, pickled when sent -----------------------------

@pytest.mark.parametrize("args", [(), (1,), (None,), ("é" * 255,), (2**70, -1.5, True, None, 3j),
                                  ("é" * 255, b"x" * 255)])
def test_plain_args_pickle_to_the_payload_dumps_collecting_makes(args):
    lazy = serialize.task_args(serialize.plain_args(args))      # as a Run reads them
    assert type(lazy) is serialize.PlainArgs
    eager, found = serialize.dumps_collecting((args, {}))
    assert found == {}
    assert lazy == eager and eager == lazy and hash(lazy) == hash(eager)
    assert (lazy.meta, lazy.buffers, lazy.nbytes) == (eager.meta, eager.buffers, eager.nbytes)
    back = pickle.loads(pickle.dumps(lazy, protocol=5))      # as a Run holding it is sent
    assert type(back) is Payload and back == eager
    assert serialize.loads(lazy) == (args, {})


def test_plain_args_equal_as_their_pickles_not_as_their_values():
    one, also_one = (serialize.task_args(serialize.plain_args(a)) for a in ((1,), (1.0,)))
    assert one != also_one and one == serialize.task_args(serialize.plain_args((1,)))   # though 1 == 1.0


def test_a_lone_plain_argument_is_kept_as_itself_with_no_tuple_around_it():
    x = 10**12
    assert serialize.plain_args((x,)) is x and serialize.plain_args_many([(x,), (1, 2)])[0] is x
    assert serialize.task_args(Payload(b"m", (), 1)).meta == b"m"    # pickled ones as they are
    # None stands for "not plain" in what plain_args returns: a lone None keeps its tuple
    assert type(serialize.plain_args((None,))) is serialize.PlainArgs
    assert [type(a) for a in serialize.plain_args_many([(None,), ()])] == [serialize.PlainArgs] * 2


@pytest.mark.parametrize("args", [("x" * 256,), (b"x" * 256,), tuple(range(17)), ([1],), ((1, 2),),
                                  (bytearray(b"x"),), (threading.Lock,)])
def test_plain_args_only_for_few_small_immutable_arguments(args):
    assert serialize.plain_args(args) is None
    assert serialize.plain_args_many([(1,), args]) is None


def test_plain_args_refuse_subclasses_of_plain_types():
    import enum

    class Colour(enum.IntEnum):
        RED = 1

    class Name(str):
        pass

    assert serialize.plain_args((Colour.RED,)) is None and serialize.plain_args((Name("a"),)) is None
