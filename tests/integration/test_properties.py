"""Bad input by the thousand (hypothesis): config values and LOCALCLUSTER_* strings,
cluster settings, submit options, keys, futures nested in containers (and futures of a
closed client), gather/wait/as_completed over mixed inputs. Every example ends in a
correct result or a TypeError/ValueError/RuntimeError that names the argument; none in
a hang, a dead scheduler thread or a leaked process (the no_leaks fixture, and
``validate(cluster)`` after each example).

CI runs a fixed seed and a bounded number of examples; ``LOCALCLUSTER_HYPOTHESIS=long``
runs many more with a random seed.
"""
from __future__ import annotations

import os

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import localcluster  # noqa: E402
from localcluster import Client, LocalCluster, config  # noqa: E402
from localcluster.cluster import validate  # noqa: E402

LONG = os.environ.get("LOCALCLUSTER_HYPOTHESIS") == "long"
settings.register_profile("ci", derandomize=True, deadline=None, database=None, max_examples=60,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", deadline=None, database=None, max_examples=3000,
                          suppress_health_check=[HealthCheck.too_slow])
PROFILE = settings.get_profile("long" if LONG else "ci")

KEYS = sorted(config.DEFAULTS)

anything = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=-10**400, max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=30),
    st.text(alphabet="0123456789.eEkKmMgGiIbB -+_auto", max_size=12), st.binary(max_size=8),
    st.lists(st.integers(), max_size=3), st.just(object()), st.complex_numbers(),
)


def _named(exc: BaseException, *names: str) -> bool:
    text = str(exc)
    return any(n in text for n in names)


@PROFILE
@given(key=st.sampled_from(KEYS), value=anything)
def test_config_set_accepts_or_names_the_key(key, value):
    try:
        with config.set(**{key: value}):
            got = config.get(key)
    except ValueError as e:
        assert _named(e, key), e
        return
    with config.set(**{key: got}):                      # what was kept is accepted again, unchanged
        assert config.get(key) == got or (got != got)


@PROFILE
@given(key=st.sampled_from(KEYS), text=st.text(alphabet=st.characters(blacklist_categories=("Cs",),
                                                                     blacklist_characters="\x00"), max_size=20))
def test_environment_strings_are_taken_or_refused_naming_the_variable(key, text):
    name = "LOCALCLUSTER_" + key.upper()
    old = os.environ.get(name)
    os.environ[name] = text
    try:
        with config._cleared():
            config.get(key)
    except ValueError as e:
        assert name in str(e), e
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


@PROFILE
@given(text=st.one_of(st.text(max_size=30), st.from_regex(r"\s*[0-9]{0,400}\.?[0-9]{0,5}\s*[kKmMgGtT]?i?[bB]?\s*",
                                                           fullmatch=True)))
def test_parse_bytes_returns_a_count_or_value_error(text):
    try:
        n = config.parse_bytes(text)
    except ValueError:
        return
    assert isinstance(n, int) and n >= 0


@PROFILE
@given(n_workers=anything, threads_per_worker=anything, memory_limit=anything)
def test_cluster_settings_are_checked_before_anything_starts(n_workers, threads_per_worker, memory_limit):
    try:
        config.resolve(n_workers=n_workers, threads_per_worker=threads_per_worker, memory_limit=memory_limit)
    except ValueError as e:
        assert _named(e, "n_workers", "threads_per_worker", "memory_limit"), e


def inc(x):
    return x + 1


def same(x):
    return x


_OPTS = st.one_of(st.none(), st.booleans(), st.integers(-3, 5), st.floats(allow_nan=True), st.text(max_size=5))


@pytest.mark.slow
def test_submit_options_run_or_name_the_option(cluster, client):
    names = list(cluster.workers)

    @PROFILE
    @given(timeout=st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True), st.integers(-2, 100),
                             st.text(max_size=4), st.booleans()),
           retries=_OPTS, priority=_OPTS,
           workers=st.one_of(st.none(), st.sampled_from(names), st.lists(st.sampled_from(names + ["nobody"]),
                                                                         max_size=3), st.text(max_size=5),
                             st.integers()),
           loose=st.booleans())
    def prop(timeout, retries, priority, workers, loose):
        try:
            fut = client.submit(inc, 1, timeout=timeout, retries=retries, priority=priority, workers=workers,
                                allow_other_workers=loose, pure=False)
        except (TypeError, ValueError, RuntimeError) as e:
            assert _named(e, "timeout", "retries", "priority", "workers", "allow_other_workers"), e
            return
        try:
            assert fut.result(30) == 2
        except localcluster.TaskTimeoutError:
            assert isinstance(timeout, (int, float)) and timeout < 5
        validate(cluster)
    prop()
    assert client.submit(inc, 41).result(30) == 42


@pytest.mark.slow
def test_keys_are_strings_or_refused(cluster, client):

    @PROFILE
    @given(key=st.one_of(st.text(max_size=40), st.integers(), st.none(), st.binary(max_size=4),
                         st.tuples(st.text(max_size=3), st.integers())))
    def prop(key):
        try:
            fut = client.submit(inc, 1, key=key)
        except (TypeError, ValueError) as e:
            assert "key" in str(e), e
            assert key is not None and not isinstance(key, str)
            return
        if key is not None:
            assert fut.key == key
        assert fut.result(30) == 2
        validate(cluster)
    prop()


def _containers(inner):
    return st.one_of(st.lists(inner, max_size=4), st.tuples(inner, inner),
                     st.dictionaries(st.text(max_size=3), inner, max_size=3))


def _nested(leaves):
    # a named function, not a lambda: hypothesis reads a lambda's source to describe it
    return st.recursive(leaves, _containers, max_leaves=12)


def _resolve(structure, values):
    if isinstance(structure, localcluster.Future):
        return values[structure.key]
    if isinstance(structure, list):
        return [_resolve(x, values) for x in structure]
    if isinstance(structure, tuple):
        return tuple(_resolve(x, values) for x in structure)
    if isinstance(structure, dict):
        return {k: _resolve(v, values) for k, v in structure.items()}
    return structure


@pytest.mark.slow
def test_futures_nested_anywhere_arrive_as_values(cluster, client):
    with LocalCluster(n_workers=0, forward_logs=False) as other, Client(other) as closed_client:
        foreign = closed_client.scatter(7)
    # a future of a closed client: refused, naming what is wrong
    with pytest.raises((ValueError, RuntimeError), match="(?i)closed|not known|another"):
        client.submit(same, [foreign])

    @PROFILE
    @given(data=st.data())
    def prop(data):
        futures = [client.submit(inc, i) for i in range(3)]
        values = {f.key: f.result(30) for f in futures}
        structure = data.draw(_nested(st.one_of(st.integers(-5, 5), st.text(max_size=3),
                                                st.sampled_from(futures))))
        expected = _resolve(structure, values)
        assert client.submit(same, structure).result(30) == expected
        assert client.gather(structure) == expected
        flat = [f for f in futures]
        done, not_done = localcluster.wait(flat, timeout=30)
        assert not not_done and {f.key for f in localcluster.as_completed(flat)} == {f.key for f in flat}
        validate(cluster)
    prop()


@pytest.mark.slow
def test_gather_wait_and_as_completed_refuse_what_is_not_a_future(cluster, client):
    fut = client.submit(inc, 1)
    assert client.gather([fut, 3, "x", {"a": fut}]) == [2, 3, "x", {"a": 2}]

    @PROFILE
    @given(other=st.one_of(st.integers(), st.text(max_size=3), st.none(), st.lists(st.integers(), max_size=2)))
    def prop(other):
        try:
            done, _ = localcluster.wait([fut, other], timeout=30)
        except (TypeError, ValueError, AttributeError) as e:
            assert not isinstance(e, AttributeError), f"AttributeError instead of a clear error: {e}"
            return
        assert fut in done
        try:
            list(localcluster.as_completed([fut, other]))
        except TypeError as e:
            assert "not a Future" in str(e)
        else:
            raise AssertionError("as_completed took a non-future")
    prop()
