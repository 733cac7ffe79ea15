"""The death taxonomy and configuration as pure functions: no processes, no sleeps."""
from __future__ import annotations

import os
import pickle
import signal

import pytest

import localcluster
from localcluster import config
from localcluster.death import (CAUSES, KilledWorker, LostDataError, TaskTimeoutError, WorkerDeath,
                                classify, crash_stack, crashing_thread, death_message, describe_exit,
                                signal_name, thread_stack, top_frames)

PKG = os.path.dirname(localcluster.__file__)     # where this checkout's worker.py frames point

SEGV, BUS, ILL, FPE, ABRT = (-signal.SIGSEGV, -signal.SIGBUS, -signal.SIGILL, -signal.SIGFPE,
                             -signal.SIGABRT)
KILL, TERM, INT = -signal.SIGKILL, -signal.SIGTERM, -signal.SIGINT

# What CPython's faulthandler writes (all_threads=True) when a task segfaults, with a
# line of task output before it and the interpreter's epilogue after it.
FAULTHANDLER = f"""\
computing row 17
Fatal Python error: Segmentation fault

Thread 0x00007f3b2a7fc640 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "{PKG}/worker.py", line 230 in _beat
  File "/usr/lib/python3.11/threading.py", line 975 in run

Current thread 0x00007f3b2affd640 (most recent call first):
  File "jobs/job.py", line 3 in f
  File "jobs/job.py", line 7 in g
  File "{PKG}/worker.py", line 190 in _run
  File "/usr/lib/python3.11/threading.py", line 975 in run

Thread 0x00007f3b2c1a5740 (most recent call first):
  File "{PKG}/worker.py", line 95 in main

Extension modules: numpy.core._multiarray_umath (total: 1)""".splitlines()
CRASH_TID = 0x00007F3B2AFFD640


def make_death(worker="worker-0", cause="crash", exitcode=SEGV, **kw):
    return WorkerDeath(worker=worker, pid=4242, cause=cause, exitcode=exitcode,
                       signal=signal_name(-exitcode) if exitcode is not None and exitcode < 0 else None,
                       **kw)


# --- classify: every row of the table ---------------------------------------------------

@pytest.mark.parametrize("reason", ["requested", "memory-limit", "timeout", "unresponsive"])
@pytest.mark.parametrize("exitcode", [KILL, TERM, SEGV, 0, 1, None])
def test_nanny_reason_wins(reason, exitcode):
    assert classify(exitcode, reason, oom_evidence=True, machinery_error=True) == reason


def test_unknown_nanny_reason_is_rejected():
    with pytest.raises(ValueError, match="bogus"):
        classify(KILL, "bogus")


@pytest.mark.parametrize("exitcode", [SEGV, BUS, ILL, FPE, ABRT])
def test_fatal_signals_of_its_own_are_crash(exitcode):
    assert classify(exitcode) == "crash"
    assert classify(exitcode, oom_evidence=True, machinery_error=True) == "crash"


def test_sigkill_with_oom_evidence_is_oom_killer():
    assert classify(KILL, oom_evidence=True) == "oom-killer"


@pytest.mark.parametrize("exitcode", [KILL, TERM, INT])
def test_outside_signal_without_oom_evidence_is_signal(exitcode):
    assert classify(exitcode) == "signal"


def test_oom_evidence_only_counts_for_sigkill():
    assert classify(TERM, oom_evidence=True) == "signal"


def test_exit_code_with_machinery_error_is_exception():
    assert classify(1, machinery_error=True) == "exception"


@pytest.mark.parametrize("exitcode", [0, 1, 3, 5])
def test_plain_exit_code_is_exit(exitcode):
    assert classify(exitcode) == "exit"


def test_classify_returns_only_known_causes():
    seen = {classify(SEGV), classify(KILL, oom_evidence=True), classify(KILL), classify(3),
            classify(1, machinery_error=True)}
    seen |= {classify(KILL, r) for r in ("requested", "memory-limit", "memory-leak", "timeout", "unresponsive")}
    assert seen == set(CAUSES)


# --- exit codes and signal names --------------------------------------------------------

def test_describe_exit():
    assert describe_exit(SEGV) == "SIGSEGV(-11)"
    assert describe_exit(KILL) == "SIGKILL(-9)"
    assert describe_exit(3) == "EXIT(3)"
    assert describe_exit(0) == "EXIT(0)"
    assert describe_exit(None) == "UNKNOWN"


def test_signal_name():
    assert signal_name(signal.SIGBUS) == "SIGBUS"
    assert signal_name(None) is None and signal_name(0) is None
    assert signal_name(200) == "SIG200"


# --- the faulthandler text --------------------------------------------------------------

def test_crash_stack_is_the_crashing_threads_block():
    stack = crash_stack(FAULTHANDLER)
    lines = stack.splitlines()
    assert lines[0] == "Fatal Python error: Segmentation fault"
    assert "computing row 17" not in stack
    assert 'File "jobs/job.py", line 3 in f' in stack
    assert "_beat" not in stack and "in main" not in stack      # other threads stay in the log
    assert "Extension modules" not in stack


def test_crash_stack_picks_the_last_fatal_error():
    first = ["Fatal Python error: Aborted", "", "Current thread 0x0000000000000001 (most recent call first):",
             '  File "old.py", line 1 in old', ""]
    stack = crash_stack(first + FAULTHANDLER)
    assert stack.startswith("Fatal Python error: Segmentation fault") and "old.py" not in stack


def test_crash_stack_without_fatal_error():
    assert crash_stack(["hello", "world"]) is None
    assert crash_stack([]) is None


def test_crashing_thread():
    assert crashing_thread(crash_stack(FAULTHANDLER)) == CRASH_TID
    assert crashing_thread("\n".join(FAULTHANDLER)) == CRASH_TID
    assert crashing_thread(None) is None
    assert crashing_thread("Fatal Python error: Aborted") is None


def test_crashing_thread_with_thread_name():
    """Python 3.14 adds the thread's name in brackets."""
    text = "Current thread 0x00007f00000000aa [worker-thread] (most recent call first):\n  File \"x.py\", line 1 in f"
    assert crashing_thread(text) == 0x7F00000000AA


def test_top_frames():
    stack = crash_stack(FAULTHANDLER)
    assert top_frames(stack, 2) == ['File "jobs/job.py", line 3 in f', 'File "jobs/job.py", line 7 in g']
    assert len(top_frames(stack)) == 2      # localcluster's worker loop and the thread bootstrap are dropped
    assert "worker.py" not in stack and "threading.py" not in stack
    assert top_frames("\n".join(FAULTHANDLER), 10)[-1].endswith("in run")   # stops at the block's end
    assert len(top_frames("\n".join(FAULTHANDLER), 10)) == 4
    assert top_frames(None) == [] and top_frames("no stack here") == []


def test_thread_stack_is_one_threads_block_from_the_newest_dump():
    older = ["Thread 0x00007f3b2a7fc640 (most recent call first):", '  File "/old.py", line 1 in old', ""]
    stack = thread_stack(older + FAULTHANDLER, 0x00007F3B2A7FC640)
    assert stack.splitlines() == ["Thread 0x00007f3b2a7fc640 (most recent call first):",
                                  '  File "/usr/lib/python3.11/threading.py", line 320 in wait']
    assert thread_stack(FAULTHANDLER, CRASH_TID).count("job.py") == 2
    assert thread_stack(FAULTHANDLER, 0x1234) is None


# --- the messages -----------------------------------------------------------------------

@pytest.mark.parametrize("cause", CAUSES)
def test_death_message_for_every_cause(cause):
    exitcode = {"crash": SEGV, "signal": TERM, "oom-killer": KILL, "memory-limit": TERM, "timeout": KILL,
                "unresponsive": KILL, "requested": 0, "exit": 3, "exception": 1, "memory-leak": KILL}[cause]
    msg = death_message("worker-1", 99, cause, exitcode, ("task-a",), 900 * 2**20, None, 2**30,
                        crash_stack(FAULTHANDLER) if cause == "crash" else None)
    assert "worker-1" in msg and "99" in msg
    if cause != "requested":
        assert "'task-a'" in msg
    assert "1.00 GiB" in msg and "900.00 MiB" in msg


def test_death_message_crash_names_signal_and_frame():
    msg = death_message("w", 1, "crash", SEGV, ("t",), None, None, None, crash_stack(FAULTHANDLER))
    assert "SIGSEGV" in msg and "job.py" in msg and "line 3 in f" in msg


def test_killed_worker_message():
    stack = crash_stack(FAULTHANDLER)
    deaths = (make_death("worker-0", "crash", SEGV, memory=100 * 2**20, memory_limit=2**30, stack=stack),
              make_death("worker-1", "oom-killer", KILL, memory=2**30, peak_memory=2 * 2**30,
                         memory_limit=2**30))
    err = KilledWorker("inc-123", "worker-1", deaths, allowed_failures=1)
    text = str(err)
    assert "'inc-123'" in text and "2 workers" in text and "allowed_failures=1" in text
    assert "worker-0 (pid 4242): crash, SIGSEGV" in text
    assert "worker-1 (pid 4242): oom-killer, SIGKILL" in text
    assert "100.00 MiB of 1.00 GiB limit" in text and "peak 2.00 GiB" in text
    assert 'job.py", line 3 in f' in text                        # top of the crashing stack
    assert "compiled code" in text and "out of memory" in text    # advice for each cause
    assert (err.task, err.last_worker, err.deaths, err.allowed_failures) == ("inc-123", "worker-1", deaths, 1)


# What the nanny asks for before it kills a worker that stopped answering heartbeats
# (faulthandler on SIGUSR1, all threads, none "current"): the stuck task's thread is a
# plain "Thread" block, the one thread_stack keeps.
STUCK_TID = 0x00007F6A54C416C0
HANG_DUMP = f"""\
[nanny] no heartbeat for 3.0 s (worker_ttl=3); dumping all thread stacks, then stopping it
Thread 0x00007f6a53c3f6c0 (most recent call first):
  File "{PKG}/worker.py", line 344 in _heartbeat
  File "/usr/lib/python3.11/threading.py", line 982 in run

Thread 0x00007f6a54c416c0 (most recent call first):
  File "/srv/app/tests/test_x.py", line 41 in hold_the_gil
  File "/srv/app/tests/test_x.py", line 37 in outer
  File "{PKG}/worker.py", line 292 in _run
  File "/usr/lib/python3.11/threading.py", line 982 in run

Current thread 0x00007f6a55c00b80 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 327 in wait
  File "{PKG}/worker.py", line 119 in serve""".splitlines()


def test_top_frames_reads_the_one_thread_of_a_hang_or_timeout_stack():
    stack = thread_stack(HANG_DUMP, STUCK_TID)
    assert stack.startswith("Thread 0x00007f6a54c416c0")
    assert top_frames(stack, 2) == ['File "/srv/app/tests/test_x.py", line 41 in hold_the_gil',
                                    'File "/srv/app/tests/test_x.py", line 37 in outer']
    # a whole dump: the current thread wins, wherever its block is
    assert top_frames("\n".join(HANG_DUMP), 1) == ['File "/usr/lib/python3.11/threading.py", line 327 in wait']
    # faulthandler's header when it has no thread to name
    assert top_frames('Stack (most recent call first):\n  File "a.py", line 2 in g\n\nafter\n  File "b.py", '
                      'line 9 in h') == ['File "a.py", line 2 in g']


@pytest.mark.parametrize("cause, exitcode, label", [
    ("crash", SEGV, "crashed in:"), ("unresponsive", KILL, "stuck in:"), ("timeout", KILL, "was in:"),
    ("memory-limit", KILL, "was in:")])
def test_every_death_with_a_stack_shows_its_frames_labelled_by_cause(cause, exitcode, label):
    stack = crash_stack(FAULTHANDLER) if cause == "crash" else thread_stack(HANG_DUMP, STUCK_TID)
    inner = 'jobs/job.py", line 3 in f' if cause == "crash" else 'test_x.py", line 41 in hold_the_gil'
    second = 'jobs/job.py", line 7 in g' if cause == "crash" else 'test_x.py", line 37 in outer'
    death = make_death("worker-0", cause, exitcode, tasks=("k",), stack=stack)
    lines = death.summary().splitlines()
    assert lines[0].startswith(f"worker-0 (pid 4242): {cause}")
    assert lines[1].startswith(f"      {label} File ") and lines[1].endswith(inner), lines
    assert lines[2].endswith(second) and lines[2].index("File") == lines[1].index("File"), lines
    text = str(KilledWorker("k", "worker-0", (death,), 0))
    assert inner in text and label in text
    msg = death_message("worker-0", 4242, cause, exitcode, ("k",), None, None, None, stack)
    assert inner in msg
    assert {"crash": "It crashed in File", "unresponsive": "It was stuck in File",
            "timeout": "It was in File", "memory-limit": "It was in File"}[cause] in msg


def test_a_death_without_a_stack_shows_no_frame_line():
    death = make_death("worker-0", "unresponsive", KILL, tasks=("k",))
    assert "\n" not in death.summary() and " in:" not in death.summary()
    msg = death_message("worker-0", 1, "unresponsive", KILL, ("k",), None, None, None, None)
    assert "stuck in" not in msg


def test_task_timeout_error_shows_where_the_task_was():
    err = TaskTimeoutError("slow-1", 1.0, 2.5, "worker-3", thread_stack(HANG_DUMP, STUCK_TID))
    text = str(err)
    assert 'test_x.py", line 41 in hold_the_gil' in text and "line 37 in outer" in text
    assert str(pickle.loads(pickle.dumps(err))) == text


def test_killed_worker_pickles_with_its_fields():
    deaths = (make_death(stack=crash_stack(FAULTHANDLER), memory=1, memory_limit=10, log_tail=("a", "b")),)
    err = KilledWorker("k", "worker-0", deaths, 3)
    back = pickle.loads(pickle.dumps(err))
    assert isinstance(back, KilledWorker)
    assert (back.task, back.last_worker, back.deaths, back.allowed_failures) == ("k", "worker-0", deaths, 3)
    assert str(back) == str(err)


def test_task_timeout_error():
    err = TaskTimeoutError("slow-1", 1.0, 2.5, "worker-3")
    assert isinstance(err, TimeoutError)
    text = str(err)
    assert "'slow-1'" in text and "2.50 s" in text and "timeout of 1 s" in text and "'worker-3'" in text
    back = pickle.loads(pickle.dumps(err))
    assert (back.task, back.timeout, back.elapsed, back.worker) == ("slow-1", 1.0, 2.5, "worker-3")
    assert str(back) == text


def test_lost_data_error():
    err = LostDataError("data-1", "worker-2", "signal")
    text = str(err)
    assert "'data-1'" in text and "'worker-2'" in text and "signal" in text and "replicate" in text
    back = pickle.loads(pickle.dumps(err))
    assert (back.key, back.worker, back.cause) == ("data-1", "worker-2", "signal")
    assert str(back) == text


def test_worker_death_str_is_its_message():
    d = make_death(message="Worker 'w' crashed.")
    assert str(d) == "Worker 'w' crashed."
    assert pickle.loads(pickle.dumps(d)) == d


# --- configuration ----------------------------------------------------------------------

@pytest.fixture
def clean_config(monkeypatch):
    import os
    for name in list(os.environ):
        if name.startswith("LOCALCLUSTER_"):
            monkeypatch.delenv(name)
    with config._cleared():
        yield


def test_resolve_defaults(clean_config):
    cfg = config.resolve()
    assert cfg["allowed_failures"] == 3 and cfg["threads_per_worker"] == 1
    assert cfg["memory_limit"] == "auto" and cfg["n_workers"] is None
    assert (cfg["memory_target"], cfg["memory_pause"], cfg["memory_terminate"]) == (0.6, 0.8, 0.95)
    for key in ("n_workers", "threads_per_worker", "memory_limit", "allowed_failures", "local_directory",
                "forward_logs", "worker_ttl", "memory_target", "memory_pause", "memory_terminate"):
        assert key in cfg


def test_set_as_context_manager(clean_config):
    with config.set(allowed_failures=4):
        assert config.get("allowed_failures") == 4
        assert config.resolve()["allowed_failures"] == 4
        with config.set(allowed_failures=5):
            assert config.get("allowed_failures") == 5
        assert config.get("allowed_failures") == 4
    assert config.get("allowed_failures") == 3


def test_set_globally(clean_config):
    config.set(allowed_failures=7)
    assert config.get("allowed_failures") == 7


def test_env_var_sets_default(clean_config, monkeypatch):
    monkeypatch.setenv("LOCALCLUSTER_ALLOWED_FAILURES", "4")
    assert config.get("allowed_failures") == 4
    assert config.resolve()["allowed_failures"] == 4
    with config.set(allowed_failures=2):                  # config.set wins over the environment
        assert config.resolve()["allowed_failures"] == 2
        assert config.resolve(allowed_failures=6)["allowed_failures"] == 6   # keywords win over both


def test_bad_env_var_names_the_variable(clean_config, monkeypatch):
    monkeypatch.setenv("LOCALCLUSTER_ALLOWED_FAILURES", "lots")
    with pytest.raises(ValueError, match="LOCALCLUSTER_ALLOWED_FAILURES.*allowed_failures"):
        config.get("allowed_failures")


def test_unknown_key_raises_naming_it(clean_config):
    with pytest.raises(ValueError, match="allowd_failures") as e:
        config.set(allowd_failures=1)
    assert "allowed_failures" in str(e.value)                   # lists the known keys
    with pytest.raises(ValueError, match="nope"):
        config.get("nope")
    with pytest.raises((TypeError, ValueError), match="bogus"):
        config.resolve(bogus=1)


@pytest.mark.parametrize("key, value", [
    ("allowed_failures", -1), ("allowed_failures", "x"), ("allowed_failures", True), ("allowed_failures", 1.5),
    ("threads_per_worker", 0), ("n_workers", -2), ("memory_limit", "lots"), ("memory_limit", -5),
    ("forward_logs", "maybe"), ("worker_ttl", 0), ("worker_ttl", "soon"), ("memory_target", 1.5),
    ("memory_pause", "half"), ("local_directory", 3),
])
def test_bad_value_raises_naming_the_key(clean_config, key, value):
    with pytest.raises(ValueError, match=key):
        config.set(**{key: value})
    with pytest.raises(ValueError, match=key):
        config.resolve(**{key: value})
    assert config.get(key) == config.DEFAULTS[key]              # nothing half-applied


def test_bad_value_message_says_what_is_accepted(clean_config):
    with pytest.raises(ValueError, match="integer >= 0"):
        config.set(allowed_failures=-1)


@pytest.mark.parametrize("key, value, expected", [
    ("memory_limit", "2GiB", 2 * 2**30), ("memory_limit", "500MB", 500 * 10**6), ("memory_limit", "auto", "auto"),
    ("memory_limit", None, None), ("memory_limit", 0, None), ("memory_limit", 4096, 4096),
    ("forward_logs", "no", False), ("forward_logs", "1", True), ("worker_ttl", "none", None),
    ("worker_ttl", 5, 5.0), ("memory_pause", False, None), ("n_workers", None, None), ("n_workers", "3", 3),
])
def test_values_are_normalised(clean_config, key, value, expected):
    assert config.resolve(**{key: value})[key] == expected


def test_memory_fractions_must_increase(clean_config):
    with pytest.raises(ValueError, match="increasing"):
        config.resolve(memory_target=0.9, memory_pause=0.8)
    assert config.resolve(memory_target=False, memory_pause=0.5)["memory_target"] is None


def test_parse_and_format_bytes():
    assert config.parse_bytes("1 KiB") == 1024 and config.parse_bytes("1.5kb") == 1500
    with pytest.raises(ValueError):
        config.parse_bytes("12 parsecs")
    assert config.format_bytes(3 * 2**30) == "3.00 GiB" and config.format_bytes(12) == "12 B"
    assert config.format_bytes(None) == "unknown"
