"""localcluster/config.py on its own: defaults, the order keyword > config.set >
LOCALCLUSTER_* environment variable > default for every key, config.set as a context
manager, and the message of every rejected value (it names the key and what is accepted)."""
from __future__ import annotations

import math
import os
import pathlib

import numpy as np
import pytest

from localcluster import config

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(autouse=True)
def clean_config(monkeypatch):
    """No LOCALCLUSTER_* variable and no config.set override from outside the test; the
    overrides a test makes are undone after it."""
    for name in list(os.environ):
        if name.startswith("LOCALCLUSTER_"):
            monkeypatch.delenv(name)
    with config._cleared():
        yield


def env_name(key: str) -> str:
    return "LOCALCLUSTER_" + key.upper()


# For every key: a value from the environment (a string), one for config.set, one as a
# keyword, each with the value it must resolve to. Each differs from what it must beat,
# so each level is seen to win.
LEVELS = {
    "n_workers": (("2", 2), (3, 3), ("4", 4)),
    "threads_per_worker": (("2", 2), (3, 3), (5, 5)),
    "memory_limit": (("1GiB", 2**30), ("500MB", 500 * 10**6), (123456789, 123456789)),
    "allowed_failures": (("0", 0), (5, 5), (9, 9)),
    "local_directory": (("/tmp/from-env", "/tmp/from-env"), ("/tmp/from-set", "/tmp/from-set"),
                        (pathlib.Path("/tmp/from-kw"), "/tmp/from-kw")),
    "forward_logs": (("ALL", "all"), (False, False), ("yes", True)),
    "worker_ttl": (("5", 5.0), (None, None), (7, 7.0)),
    "scheduler_watchdog": (("12", 12.0), ("none", None), (3.5, 3.5)),
    "stall_warning": (("0", None), (2, 2.0), ("1.5", 1.5)),
    "worker_cgroup": (("off", False), (True, True), (False, False)),
    "run_registry": (("off", False), (True, True), (False, False)),
    "journal": (("/tmp/j-env", "/tmp/j-env"), ("/tmp/j-set", "/tmp/j-set"), (pathlib.Path("/tmp/j-kw"), "/tmp/j-kw")),
    "memory_ceiling": (("1.5", 1.5), (2, 2.0), (1.25, 1.25)),
    "memory_target": (("0.5", 0.5), (0.4, 0.4), (False, None)),
    "memory_pause": (("0.85", 0.85), ("0.7", 0.7), (0.75, 0.75)),
    "memory_terminate": (("0.99", 0.99), (1, 1.0), ("false", None)),
    "memory_sample_interval": (("0.5", 0.5), (0.25, 0.25), (2, 2.0)),
    "memory_leak_restart": (("30", 30.0), (None, None), (5, 5.0)),
    "adapt_interval": (("0.25", 0.25), (2, 2.0), (0.1, 0.1)),
    "log_lines": (("10", 10), (20, 20), ("30", 30)),
    "spin_wait": (("0", None), (0.001, 0.001), ("0.0005", 0.0005)),
    "resources": (("MEM=2, GPU=0.5", {"MEM": 2, "GPU": 0.5}), ({"MEM": 4}, {"MEM": 4}),
                  ({"GPU": np.int64(1)}, {"GPU": 1})),
}


TWO_VALUED = {"worker_cgroup", "run_registry"}


def test_every_key_is_covered_here():
    assert set(LEVELS) == set(config.DEFAULTS) == set(config.resolve())


def test_resolve_defaults():
    cfg = config.resolve()
    assert cfg == config.DEFAULTS
    assert cfg is not config.DEFAULTS                      # a copy: the caller may change it
    for key, value in config.DEFAULTS.items():
        assert config.get(key) == value
        assert config._check(key, value) == value          # every default passes its own validator


def test_resolve_with_ellipsis_means_not_given():
    with config.set(allowed_failures=7):
        assert config.resolve(allowed_failures=...)["allowed_failures"] == 7


@pytest.mark.parametrize("key", list(LEVELS))
def test_keyword_beats_set_beats_environment_beats_default(key, monkeypatch):
    (env, from_env), (set_value, from_set), (kw, from_kw) = LEVELS[key]
    default = config.DEFAULTS[key]
    assert from_env != default and from_set != from_env and from_kw != from_set
    assert from_kw != from_env or key in TWO_VALUED     # a switch has two values: kw beats set
    assert config.resolve()[key] == default
    monkeypatch.setenv(env_name(key), env)
    assert config.get(key) == from_env and config.resolve()[key] == from_env
    with config.set(**{key: set_value}):
        assert config.get(key) == from_set and config.resolve()[key] == from_set
        assert config.resolve(**{key: kw})[key] == from_kw
    assert config.resolve()[key] == from_env               # the block is over: the environment again
    assert config.resolve(**{key: kw})[key] == from_kw
    monkeypatch.delenv(env_name(key))
    assert config.resolve()[key] == default


def test_the_environment_is_read_at_each_call(monkeypatch):
    monkeypatch.setenv("LOCALCLUSTER_LOG_LINES", "11")
    assert config.get("log_lines") == 11
    monkeypatch.setenv("LOCALCLUSTER_LOG_LINES", "12")
    assert config.get("log_lines") == 12


# --- config.set ------------------------------------------------------------------------------

def test_set_as_a_context_manager_restores():
    with config.set(allowed_failures=4, log_lines=50):
        assert (config.get("allowed_failures"), config.get("log_lines")) == (4, 50)
        with config.set(allowed_failures=5):
            assert (config.get("allowed_failures"), config.get("log_lines")) == (5, 50)
        assert (config.get("allowed_failures"), config.get("log_lines")) == (4, 50)
    assert config.get("allowed_failures") == config.DEFAULTS["allowed_failures"]
    assert config.get("log_lines") == config.DEFAULTS["log_lines"]


def test_set_restores_when_the_block_raises():
    with pytest.raises(ZeroDivisionError):
        with config.set(threads_per_worker=6):
            1 / 0
    assert config.get("threads_per_worker") == config.DEFAULTS["threads_per_worker"]


def test_set_restores_an_earlier_global_set():
    config.set(allowed_failures=8)                          # globally (undone by the fixture)
    with config.set(allowed_failures=2):
        assert config.get("allowed_failures") == 2
    assert config.get("allowed_failures") == 8


def test_set_restores_to_the_environment(monkeypatch):
    monkeypatch.setenv("LOCALCLUSTER_ALLOWED_FAILURES", "6")
    with config.set(allowed_failures=1):
        assert config.get("allowed_failures") == 1
    assert config.get("allowed_failures") == 6             # no override left behind


def test_a_bad_value_in_set_applies_nothing():
    with pytest.raises(ValueError, match="threads_per_worker"):
        config.set(allowed_failures=5, threads_per_worker=0)
    assert config.get("allowed_failures") == config.DEFAULTS["allowed_failures"]


def test_set_stores_the_normalised_value():
    with config.set(memory_limit="1 KiB", forward_logs="yes", local_directory=pathlib.Path("/x")):
        assert config.get("memory_limit") == 1024
        assert config.get("forward_logs") is True
        assert config.get("local_directory") == "/x"


# --- unknown keys -----------------------------------------------------------------------------

def test_unknown_key_raises_valueerror_naming_it():
    for call in (lambda: config.set(alowed_failures=1), lambda: config.get("alowed_failures"),
                 lambda: config.resolve(alowed_failures=1)):
        with pytest.raises(ValueError) as info:
            call()
        text = str(info.value)
        assert "'alowed_failures'" in text
        assert all(key in text for key in config.DEFAULTS)    # and lists the known ones


def test_an_unknown_environment_variable_is_ignored(monkeypatch):
    monkeypatch.setenv("LOCALCLUSTER_NO_SUCH_KEY", "1")
    assert config.resolve() == config.DEFAULTS


# --- bad values -------------------------------------------------------------------------------

BAD = {
    "n_workers": ("an integer >= 0 or None", [-1, "three", 2.5, True, "1.0"]),
    "threads_per_worker": ("an integer >= 1", [0, -3, None, "", "x", 1.5, False]),
    "memory_limit": ("a float in (0, 1]", ["lots", -5, "-1GiB", 1.5, True, "12 parsecs", [1], 0.0, -0.1, "1.5",
                                           math.nan, "inf"]),
    "allowed_failures": ("an integer >= 0", [-1, "x", None, 2.0, True]),
    "local_directory": ("a path (str or os.PathLike) or None", [3, 1.5, True, [b"/tmp"]]),
    "forward_logs": ("True, False or 'all'", ["maybe", 2, None, "some", 1.0]),
    "worker_ttl": ("a number of seconds > 0 or None", [0, -1, "soon", True, [1]]),
    "scheduler_watchdog": ("a number of seconds > 0 or None", [0, -2, "later", False, float("nan")]),
    "stall_warning": ("a number of seconds > 0, or None or 0 to disable", [-1, "soon", True, float("inf"), [1]]),
    "worker_cgroup": ("True or False", ["maybe", 2, None, 1.0]),
    "run_registry": ("True or False", ["sometimes", 0, None, 1.0]),
    "journal": ("a folder's path (str or os.PathLike)", [123, 1.5, True, [b"/tmp"]]),
    "memory_ceiling": ("a multiple of memory_limit >= 1", [0.5, "big", True, -1, float("inf")]),
    "memory_target": ("a fraction between 0 and 1", [0, 1.5, -0.1, "half", True, "0"]),
    "memory_pause": ("a fraction between 0 and 1", [1.01, "2", [0.5]]),
    "memory_terminate": ("a fraction between 0 and 1", [0.0, 7, True]),
    "memory_sample_interval": ("a number of seconds > 0", [None, "none", 0, -0.5, "fast", False]),
    "memory_leak_restart": ("a number of seconds > 0 or None", [0, -1, "soon", True]),
    "adapt_interval": ("a number of seconds > 0", [None, "none", 0, -1, "soon", True, float("inf")]),
    "log_lines": ("an integer >= 1", [0, "many", 10.0, None]),
    "spin_wait": ("a number of seconds > 0, or None or 0 to disable", [-1, "long", True, float("inf")]),
    "resources": ("a dict of resource names (str) to positive numbers", [{"MEM": 0}, {"MEM": -1}, {1: 2},
                  {"GPU": True}, {"GPU": math.nan}, {"GPU": math.inf}, {"": 1}, {"MEM": "2"}, ["MEM"], 3,
                  "MEM", "MEM=x", "=2"]),
}
CASES = [(key, value) for key, (_accepted, values) in BAD.items() for value in values]


def test_every_key_has_bad_values_here():
    assert set(BAD) == set(config.DEFAULTS)


@pytest.mark.parametrize("key, value", CASES, ids=[f"{k}={v!r}" for k, v in CASES])
def test_a_bad_value_names_the_key_and_what_is_accepted(key, value):
    accepted = BAD[key][0]
    for call in (lambda: config.set(**{key: value}), lambda: config.resolve(**{key: value})):
        with pytest.raises(ValueError) as info:
            call()
        text = str(info.value)
        assert f"{key}=" in text and repr(value) in text and accepted in text, text
    assert config.get(key) == config.DEFAULTS[key]          # nothing half-applied


@pytest.mark.parametrize("key, value", [(k, v) for k, v in CASES if isinstance(v, str)],
                         ids=[f"{k}={v!r}" for k, v in CASES if isinstance(v, str)])
def test_a_bad_environment_variable_names_the_variable_the_key_and_what_is_accepted(key, value, monkeypatch):
    monkeypatch.setenv(env_name(key), value)
    for call in (lambda: config.get(key), lambda: config.resolve()):
        with pytest.raises(ValueError) as info:
            call()
        text = str(info.value)
        assert env_name(key) in text and f"{key}=" in text and BAD[key][0] in text, text
    with config.set(**{key: config.DEFAULTS[key]}):         # config.set still wins over it
        assert config.resolve()[key] == config.DEFAULTS[key]


@pytest.mark.parametrize("key", ["worker_ttl", "memory_sample_interval", "stall_warning", "adapt_interval"])
def test_nan_is_not_a_number_of_seconds(key):
    with pytest.raises(ValueError, match=key):
        config.resolve(**{key: math.nan})
    with pytest.raises(ValueError, match=key):
        config.set(**{key: "nan"})


def test_a_numpy_integer_is_an_integer():
    assert config.resolve(threads_per_worker=np.int64(2))["threads_per_worker"] == 2


def test_memory_limit_as_a_share_of_the_memory_in_every_place_a_setting_comes_from(monkeypatch):
    """dask's forms: a float in (0, 1] is a share (kept as the float, the cluster measures the
    memory); an int is bytes, except that 1, as in dask, is the whole memory and 0 no limit."""
    monkeypatch.setenv(env_name("memory_limit"), "0.5")
    assert config.get("memory_limit") == 0.5
    with config.set(memory_limit=0.25):
        assert config.resolve()["memory_limit"] == 0.25
        assert config.resolve(memory_limit=np.float64(0.75))["memory_limit"] == 0.75
    for value, expected in ((1, 1.0), (1.0, 1.0), ("1", 1.0), (2, 2), (2e9, 2 * 10**9), ("1000", 1000),
                            (np.int64(4096), 4096), (0, None), ("1.5 GB", 1_500_000_000)):
        assert config.resolve(memory_limit=value)["memory_limit"] == expected, value


# --- cross-key and helper checks --------------------------------------------------------------

def test_memory_fractions_must_increase():
    with pytest.raises(ValueError) as info:
        config.resolve(memory_target=0.9)                   # above the default pause
    text = str(info.value)
    assert "memory_target" in text and "memory_pause" in text and "increasing" in text
    assert "0.9" in text and str(config.DEFAULTS["memory_pause"]) in text
    with config.set(memory_pause=0.5):                      # config.set values count too
        with pytest.raises(ValueError, match="increasing"):
            config.resolve()
        cfg = config.resolve(memory_target=False)           # a disabled fraction is left out
        assert cfg["memory_target"] is None and cfg["memory_pause"] == 0.5


@pytest.mark.parametrize("text, expected", [
    ("0", 0), ("123", 123), ("2GiB", 2 * 2**30), ("2 gib", 2 * 2**30), (" 1.5kB ", 1500),
    ("500MB", 500 * 10**6), ("1TiB", 2**40), ("3 t", 3 * 10**12), (".5 MiB", 2**19), ("7b", 7),
])
def test_parse_bytes(text, expected):
    assert config.parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "-1GiB", "1 parsec", "1e9", "2 GiBs", "1.2.3MB"])
def test_parse_bytes_rejects(text):
    with pytest.raises(ValueError):
        config.parse_bytes(text)


@pytest.mark.parametrize("n", [0, 1, 1023, 1024, 1536, 2**20 - 1, 2**20, 5 * 2**30 + 2**29])
def test_format_bytes_reads_back(n):
    text = config.format_bytes(n)
    back = config.parse_bytes(text.replace(" ", ""))
    assert abs(back - n) <= max(1, n) * 0.005              # two decimals of the largest unit
    assert text.endswith(" B") == (n < 1024)


def test_format_bytes_of_unknown():
    assert config.format_bytes(None) == "unknown"
