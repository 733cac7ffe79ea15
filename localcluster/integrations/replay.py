"""``recreate_error_locally``: run a failed task again where the user can debug it.

An ordinary exception is replayed in the caller's own process (so ``pdb`` works).
A task that killed its workers would kill the caller too, so it is replayed in a
throwaway process instead, and what happened there is reported as a WorkerDeath.
"""
from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from typing import TYPE_CHECKING, Any

from ..client.future import gateway_of
from ..wire import serialize
from ..death import KilledWorker, TaskTimeoutError, WorkerDeath, classify, crash_stack, exit_signal

if TYPE_CHECKING:
    from ..client.future import Future


_REPLAY = ("import sys, json, pickle, faulthandler; cfg = json.loads(sys.argv[1]); sys.path[:] = cfg['sys_path']; "
           "faulthandler.enable(all_threads=True); "
           "fn, args, kwargs = pickle.load(open(cfg['task'], 'rb')); "
           "r = fn(*args, **kwargs); print('localcluster replay: the task returned', type(r).__name__)")


class ReplayedDeath(Exception):
    """The replayed task killed its throwaway process, as it killed the workers.

    Raised by ``client.recreate_error_locally(future)`` for a task given up as KilledWorker or
    TaskTimeoutError, which is replayed in a throwaway process rather than in yours. The
    message tells how that process ended and its output: the cause is in the task itself
    (its memory, a crash in a C extension, an endless loop).

    Attributes:
        key: the replayed task's key.
        death: a WorkerDeath of the throwaway process (its cause, signal, stack, output).
    """

    def __init__(self, key: str, death: WorkerDeath):
        self.key, self.death = key, death
        super().__init__(key, death)

    def __str__(self) -> str:
        tail = "\n".join(self.death.log_tail[-20:])
        return (f"Replaying task {self.key!r} in a throwaway process (pid {self.death.pid}) killed it too: "
                f"{self.death.message}\nIts output:\n{tail}")


def _task_inputs(client: Any, key: str) -> tuple:
    gateway = gateway_of(client)
    spec = gateway.task_spec(key)
    if spec is None:
        raise ValueError(f"task {key!r} is no longer known to the cluster (released or restarted); "
                         f"keep its future alive to replay it")
    deps = {}
    if spec.deps:
        for dkey, payload in zip(spec.deps, gateway.fetch(list(spec.deps))):
            deps[dkey] = serialize.loads(payload.result())
    fn = pickle.loads(spec.fn)
    args, kwargs = serialize.loads(spec.args, deps)
    return fn, args, kwargs


def recreate_error_locally(client: Any, future: Future) -> Any:
    exc = future.exception()
    if exc is None:
        raise ValueError(f"future {future.key!r} did not fail ({future.status}); nothing to recreate")
    fn, args, kwargs = _task_inputs(client, future.key)
    if not isinstance(exc, (KilledWorker, TaskTimeoutError)):
        return fn(*args, **kwargs)
    return _replay_in_subprocess(future.key, fn, args, kwargs,
                                 timeout=exc.timeout * 2 if isinstance(exc, TaskTimeoutError) else None)


def _replay_in_subprocess(key: str, fn: Any, args: tuple, kwargs: dict, timeout: Any = None) -> Any:
    import cloudpickle
    fd, path = tempfile.mkstemp(prefix="localcluster-replay-", suffix=".pkl")
    try:
        with os.fdopen(fd, "wb") as f:
            cloudpickle.dump((fn, args, kwargs), f)
        cfg = {"sys_path": [p if p else os.getcwd() for p in sys.path], "task": path}
        proc = subprocess.Popen([sys.executable, "-c", _REPLAY, json.dumps(cfg)], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        reason = None
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            reason = "timeout"
    finally:
        os.unlink(path)
    lines = out.decode(errors="replace").splitlines()
    code = proc.returncode
    if code == 0 and reason is None:
        print("\n".join(lines))
        return None
    cause = classify(code, reason)
    stack = crash_stack(lines) if code < 0 else None
    death = WorkerDeath(worker="replay", pid=proc.pid, cause=cause, exitcode=code,
                        signal=exit_signal(code), tasks=(key,), stack=stack,
                        log_tail=tuple(lines[-50:]), time=time.time()).explained(replay_hint=False)
    raise ReplayedDeath(key, death)
