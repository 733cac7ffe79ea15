"""Configuration: defaults < ``LOCALCLUSTER_<KEY>`` environment variables <
``config.set(...)`` < keyword arguments to ``LocalCluster``.

Every value goes through one validator per key, so a bad value is rejected with
the same message whether it came from the environment, ``config.set`` or a
keyword argument.
"""
from __future__ import annotations

import math
import numbers
import os
import re
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Literal, Optional, overload

__all__ = ["set", "get", "resolve", "parse_bytes", "format_bytes"]

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2,
    "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_BYTES_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")
_BYTES_HELP = ("a float in (0, 1] (that share of the memory, per worker), bytes as an int or a string "
               "such as '2GiB' or '500MB', 'auto', or None/0 for no limit")


def parse_bytes(text: str) -> int:
    """``"2GiB"`` -> 2147483648. Raises ValueError on anything else."""
    m = _BYTES_RE.match(text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(text)
    n = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not math.isfinite(n):      # 400 digits: more bytes than a float can count
        raise ValueError(text)
    return int(n)


def format_bytes(n: float | None) -> str:
    if n is None:
        return "unknown"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def _bad(key: str, value: Any, accepted: str) -> ValueError:
    return ValueError(f"{key}={value!r} is not valid: expected {accepted}")


def _integer(value: Any, lo: Optional[int]) -> bool:
    """An integer (a numpy integer is one; True is not), and at least ``lo``."""
    return not isinstance(value, bool) and isinstance(value, numbers.Integral) and (lo is None or int(value) >= lo)


def _positive_seconds(value: Any, zero: bool = False) -> bool:
    """A finite number of seconds above 0 (``zero``: or 0). NaN fails: every comparison with it is False."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    number: Any = value       # a numbers.Real compares with 0 (an int too large for a float too)
    return (0 <= number if zero else 0 < number) and number < math.inf


def _argument(call: str, name: str, value: Any) -> str:
    return f"{call}({name}={value!r})" if call else f"{name}={value!r}"


@overload
def check_int(value: Any, call: str, name: str, lo: Optional[int] = 0, none: Literal[""] = "") -> int: ...


@overload
def check_int(value: Any, call: str, name: str, lo: Optional[int] = 0, none: str = "") -> Optional[int]: ...


def check_int(value: Any, call: str, name: str, lo: Optional[int] = 0, none: str = "") -> Optional[int]:
    """An argument of a public call that takes an integer >= ``lo`` (``none``: None is accepted,
    and means that); a short ValueError naming the call, the argument and what it takes."""
    if value is None and none:
        return None
    if not _integer(value, lo):
        accepted = "an integer" + (f" >= {lo}" if lo is not None else "") + (f", or None {none}" if none else "")
        raise ValueError(f"{_argument(call, name, value)}: expected {accepted}")
    return int(value)


def check_seconds(value: Any, call: str, name: str = "timeout", zero: bool = False,
                  none: bool = True) -> Optional[float]:
    """An argument of a public call that takes a number of seconds (``zero``: 0 too; ``none``:
    None, for no limit)."""
    if value is None and none:
        return None
    if not _positive_seconds(value, zero):
        accepted = f"a number of seconds {'>=' if zero else '>'} 0" + (", or None" if none else "")
        raise ValueError(f"{_argument(call, name, value)}: expected {accepted}")
    return float(value)


_TIME_UNITS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0}


def check_duration(value: Any, call: str, name: str) -> float:
    """A delay of a public call that dask writes either way: seconds as a number, or a string
    with a unit ("500ms", "1s", "2 min"); a short ValueError naming the call otherwise."""
    seconds = value
    if isinstance(value, str):
        match = re.fullmatch(r"\s*([0-9.eE+-]+)\s*(ms|s|m|min)?\s*", value)
        try:
            seconds = float(match.group(1)) * _TIME_UNITS[match.group(2) or "s"] if match else None
        except ValueError:
            seconds = None
    if not _positive_seconds(seconds):
        raise ValueError(f"{_argument(call, name, value)}: expected a number of seconds > 0, "
                         f"or a string such as '500ms' or '1s'")
    return float(seconds)


_RESOURCES_HELP = ("a dict of resource names (str) to positive numbers, such as {'MEM': 2, 'GPU': 1}, "
                   "or None for none")


def _amounts(value: Any) -> Optional[dict]:
    """dask's abstract resources: {name: amount > 0}, or None when not that (an empty dict is None).
    From the environment: "MEM=2,GPU=1"."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip()
        if text.lower() in ("", "none"):
            return None
        try:
            value = {name.strip(): float(amount) for name, amount in (item.split("=") for item in text.split(","))}
        except ValueError:
            return None
        value = {k: int(v) if v.is_integer() else v for k, v in value.items()}
    if not isinstance(value, dict):
        return None
    out = {}
    for name, amount in value.items():
        if not isinstance(name, str) or not name or isinstance(amount, bool) or not isinstance(amount, numbers.Real):
            return None
        if not 0 < amount < math.inf:  # type: ignore[operator]  # a numbers.Real: NaN fails too
            return None
        out[name] = int(amount) if isinstance(amount, numbers.Integral) else float(amount)
    return out


def _resources(value: Any) -> Any:
    """What every worker declares: LocalCluster(resources={"MEM": 2})."""
    if value is None or (isinstance(value, (dict, str)) and not value):
        return None
    amounts = _amounts(value)
    if not amounts:
        raise _bad("resources", value, _RESOURCES_HELP)
    return amounts


def check_resources(value: Any, call: str) -> Optional[tuple]:
    """``resources=`` of submit or map: what one run of the task holds on its worker, as
    ((name, amount), ...) sorted by name (hashable: the scheduler queues tasks by it), or
    None for none; a short ValueError naming the call otherwise."""
    if value is None or (isinstance(value, dict) and not value):
        return None
    amounts = _amounts(value) if isinstance(value, dict) else None
    if not amounts:
        raise ValueError(f"{_argument(call, 'resources', value)}: expected {_RESOURCES_HELP}")
    return tuple(sorted(amounts.items()))


def _int(key: str, lo: int, allow_none: bool = False) -> Callable[[Any], Any]:
    accepted = f"an integer >= {lo}" + (" or None" if allow_none else "")

    def check(value: Any) -> Any:
        if value is None and allow_none:
            return None
        if isinstance(value, str):
            if allow_none and value.strip().lower() in ("none", ""):
                return None
            try:
                value = int(value)
            except ValueError:
                raise _bad(key, value, accepted) from None
        if not _integer(value, lo):
            raise _bad(key, value, accepted)
        return int(value)
    return check


def _seconds(key: str, allow_none: bool, zero_is_none: bool = False) -> Callable[[Any], Any]:
    accepted = "a number of seconds > 0" + (" or None to disable" if allow_none else "")
    if zero_is_none:
        accepted = "a number of seconds > 0, or None or 0 to disable"

    def check(value: Any) -> Any:
        if zero_is_none and not isinstance(value, bool) and isinstance(value, (numbers.Real, str)):
            try:
                if float(value) == 0:    # "0", 0, 0.0: off, as None is
                    return None
            except (ValueError, OverflowError):     # not a number, or an int too large for a float
                pass
        if isinstance(value, str):
            if allow_none and value.strip().lower() in ("none", ""):
                return None
            try:
                value = float(value)
            except ValueError:
                raise _bad(key, value, accepted) from None
        if value is None and allow_none:
            return None
        if not _positive_seconds(value):
            raise _bad(key, value, accepted)
        try:
            return float(value)
        except OverflowError:                    # an int with 400 digits is < inf, yet no float
            raise _bad(key, value, accepted) from None
    return check


def _fraction(key: str) -> Callable[[Any], Any]:
    accepted = "a fraction between 0 and 1 (exclusive of 0), or False to disable"

    def check(value: Any) -> Any:
        if value is False or (isinstance(value, str) and value.strip().lower() in ("false", "none")):
            return None
        if value is None:
            return None
        try:
            f = float(value)
        except (TypeError, ValueError, OverflowError):
            raise _bad(key, value, accepted) from None
        if isinstance(value, bool) or not 0 < f <= 1:
            raise _bad(key, value, accepted)
        return f
    return check


def _memory_limit(value: Any) -> Any:
    """dask's forms: bytes (an int, or a string with a unit), a float in (0, 1] for that share
    of the memory this process may use, per worker (kept as the float: the cluster measures
    the memory), "auto", and None or 0 for no limit. As in dask, a number <= 1 is a share,
    so 1 is the whole memory, never one byte."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "0", "")):
        return None
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    def bad() -> ValueError:
        return _bad("memory_limit", value, _BYTES_HELP)
    if isinstance(value, str):
        try:
            number = float(value)         # "0.5" from the environment is a share, as 0.5 is
        except ValueError:
            try:
                return parse_bytes(value) or None
            except ValueError:
                raise bad() from None
    elif isinstance(value, numbers.Integral) and not isinstance(value, bool):
        if value < 0:
            raise bad()
        return None if value == 0 else 1.0 if value == 1 else int(value)   # a numpy integer is an integer
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:
            raise bad() from None
    else:
        raise bad()
    if 0 < number <= 1:
        return number
    if number > 1 and number.is_integer():     # 2e9: bytes written as a float
        return int(number)
    raise bad()                                # 1.5, 0.0, -0.1, nan, inf: neither a share nor bytes


def _ceiling(value: Any) -> Any:
    accepted = "a multiple of memory_limit >= 1 (such as 1.25), or None for no ceiling"
    if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "")):
        return None
    try:
        f = float(value)
    except (TypeError, ValueError, OverflowError):
        raise _bad("memory_ceiling", value, accepted) from None
    if isinstance(value, bool) or not 1 <= f < math.inf:
        raise _bad("memory_ceiling", value, accepted)
    return f


def _bool(key: str) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if isinstance(value, str):
            low = value.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
        if isinstance(value, bool):
            return value
        raise _bad(key, value, "True or False")
    return check


def _forward_logs(value: Any) -> Any:
    """True: worker prints, each to the same stream, and one line per death; "all": also
    faulthandler's full dumps; False: nothing."""
    if isinstance(value, str) and value.strip().lower() == "all":
        return "all"
    try:
        return _bool("forward_logs")(value)
    except ValueError:
        raise _bad("forward_logs", value, "True, False or 'all'") from None


def _directory(value: Any) -> Any:
    if value is None or value == "":
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise _bad("local_directory", value, "a path (str or os.PathLike) or None")
    return os.fspath(value)


def _journal(value: Any) -> Any:
    if value is None or value == "":
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise _bad("journal", value, "a folder's path (str or os.PathLike) to keep finished results in, "
                   "or None for no journal")
    return os.fspath(value)


_VALIDATORS: dict[str, Callable[[Any], Any]] = {
    "n_workers": _int("n_workers", 0, allow_none=True),
    "threads_per_worker": _int("threads_per_worker", 1),
    "memory_limit": _memory_limit,
    "allowed_failures": _int("allowed_failures", 0),
    "local_directory": _directory,
    "forward_logs": _forward_logs,
    "worker_ttl": _seconds("worker_ttl", allow_none=True),
    "scheduler_watchdog": _seconds("scheduler_watchdog", allow_none=True),
    "stall_warning": _seconds("stall_warning", allow_none=True, zero_is_none=True),
    "worker_cgroup": _bool("worker_cgroup"),
    "memory_ceiling": _ceiling,
    "memory_target": _fraction("memory_target"),
    "memory_pause": _fraction("memory_pause"),
    "memory_terminate": _fraction("memory_terminate"),
    "memory_sample_interval": _seconds("memory_sample_interval", allow_none=False),
    "memory_leak_restart": _seconds("memory_leak_restart", allow_none=True),
    "adapt_interval": _seconds("adapt_interval", allow_none=False),
    "log_lines": _int("log_lines", 1),
    "resources": _resources,
    "spin_wait": _seconds("spin_wait", allow_none=True, zero_is_none=True),
    "run_registry": _bool("run_registry"),
    "journal": _journal,
}

DEFAULTS: dict[str, Any] = {
    "n_workers": None,            # None: the CPUs this process may use
    "threads_per_worker": 1,
    "memory_limit": "auto",
    "allowed_failures": 3,
    "local_directory": None,
    "forward_logs": True,
    "worker_ttl": 60.0,
    "worker_cgroup": True,        # a memory cgroup per worker where this process may make one
    "memory_ceiling": 1.2,        # its kernel limit, as a multiple of memory_limit (cgroup.py)
    "scheduler_watchdog": 30.0,   # the scheduler thread busy that long with work pending: broken
    "stall_warning": 30.0,        # no task finished or started that long with work pending: one WARNING (stall.py)
    "memory_target": 0.6,
    "memory_pause": 0.8,
    "memory_terminate": 0.95,
    "memory_sample_interval": 0.02,
    "memory_leak_restart": 10.0,  # paused that long with nothing to spill: restarted as a leak (policy.py)
    "adapt_interval": 0.5,        # adapt(): wait_count (3) intervals in a row needing fewer workers: one goes (policy.py)
    "log_lines": 1000,
    "resources": None,            # every worker's abstract resources, {"MEM": 2, "GPU": 1}: submit(resources=)
    "spin_wait": 0.0002,          # a thread waiting for a reply polls that long before it sleeps, if the machine is calm (spin.py)
    "run_registry": True,         # each run recorded in the user's cache dir; the next says how one ended unclosed (runs.py)
    "journal": None,              # a folder keeping finished results for later runs (journal.py)
}

_lock = threading.Lock()
_overrides: dict[str, Any] = {}


def _check(key: str, value: Any) -> Any:
    if key not in _VALIDATORS:
        raise ValueError(
            f"unknown localcluster config key {key!r}; known keys: {', '.join(sorted(_VALIDATORS))}"
        )
    return _VALIDATORS[key](value)


class _Setter:
    """Returned by :func:`set`: already applied; undone when used as a context manager."""

    def __init__(self, previous: dict[str, Any]):
        self._previous = previous

    def __enter__(self) -> "_Setter":
        return self

    def __exit__(self, *exc: object) -> None:
        with _lock:
            for key, old in self._previous.items():
                if old is _MISSING:
                    _overrides.pop(key, None)
                else:
                    _overrides[key] = old


_MISSING = object()


def set(**values: Any) -> _Setter:  # noqa: A001 - dask's name
    """``config.set(allowed_failures=4)`` globally, or ``with config.set(...):`` for a block."""
    checked = {key: _check(key, value) for key, value in values.items()}
    with _lock:
        previous = {key: _overrides.get(key, _MISSING) for key in checked}
        _overrides.update(checked)
    return _Setter(previous)


def get(key: str) -> Any:
    """The value in force for ``key``, before keyword arguments."""
    if key not in _VALIDATORS:
        _check(key, None)
    with _lock:
        if key in _overrides:
            return _overrides[key]
    env = os.environ.get("LOCALCLUSTER_" + key.upper())
    if env is not None:
        try:
            return _check(key, env)
        except ValueError as e:
            raise ValueError(f"environment variable LOCALCLUSTER_{key.upper()}: {e}") from None
    return DEFAULTS[key]


def resolve(**kwargs: Any) -> dict[str, Any]:
    """All keys: keyword arguments (when not ``...``) win over config and environment."""
    for key in kwargs:
        if key not in _VALIDATORS:
            raise ValueError(f"LocalCluster() got an unknown setting {key!r}; known settings: "
                             f"{', '.join(sorted(_VALIDATORS))}")
    out = {}
    for key in _VALIDATORS:
        value = kwargs.get(key, ...)
        out[key] = get(key) if value is ... else _check(key, value)
    fractions = [out[k] for k in ("memory_target", "memory_pause", "memory_terminate") if out[k]]
    if fractions != sorted(fractions):
        raise ValueError(
            "memory_target, memory_pause and memory_terminate must be increasing; got "
            f"{out['memory_target']}, {out['memory_pause']}, {out['memory_terminate']}"
        )
    return out


@contextmanager
def _cleared() -> Iterator[None]:
    """For tests: no overrides inside the block."""
    with _lock:
        saved = dict(_overrides)
        _overrides.clear()
    try:
        yield
    finally:
        with _lock:
            _overrides.clear()
            _overrides.update(saved)
