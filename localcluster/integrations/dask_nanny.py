"""What ``localcluster.dask.install`` runs inside a dask.distributed cluster: on each nanny,
the record of every worker process death (``DeathRecorder``); in each worker, faulthandler
writing to a file the nanny reads (``FaultHandler``); on the scheduler, which tasks each
removed worker was running (``RemovalRecorder``).

dask has no plugin hook for a worker process's death (``NannyPlugin`` has ``setup``,
``teardown`` and ``restart``). ``WorkerProcess.mark_stopped`` removes the worker directory,
then calls ``Nanny._on_worker_exit_sync``, which looks ``self._on_worker_exit`` up at call
time: ``DeathRecorder.setup`` shadows it on the nanny instance, and checks first that the
names it wraps exist (``require``), failing loudly with what is missing.

dask hands a nanny plugin to the nannies of the workers connected at that moment, and to
nannies that start later, but not to a nanny whose worker is restarting then (it is not in
``scheduler.workers``). ``RemovalRecorder.add_worker`` closes that gap: when a worker
registers, its nanny is given the scheduler's ``DeathRecorder`` once, before the worker runs
a task; a nanny given it twice keeps one recorder (``DeathRecorder.setup``).

The death is classified with ``localcluster.death.classify``, the same as localcluster's own
nanny, and published as the event ``TOPIC_DEATH``: a ``WorkerDeath`` as a dict (``as_event``;
events must be msgpack-serializable), read back with ``from_event``.
"""
from __future__ import annotations

import asyncio
import dataclasses
import faulthandler
import inspect
import logging
import os
import shutil
import signal
import stat
import tempfile
import time
from collections import defaultdict
from typing import Any, Optional

import psutil
from distributed.diagnostics.plugin import NannyPlugin, SchedulerPlugin, WorkerPlugin
from tornado.ioloop import PeriodicCallback

from ..death import WorkerDeath, classify, crash_stack, exit_signal
from ..system.machine import descendants
from ..system.oom import OomWatch
from ..wire.serialize import keep_file_names_in_cloudpickle

__all__ = ["DeathRecorder", "FaultHandler", "RemovalRecorder", "TOPIC_DEATH", "TOPIC_REMOVED", "as_event",
           "from_event", "task_keys", "record_dir", "remove_record_dir", "require", "NANNY_NAMES", "NANNY_METHODS",
           "MINIMUM_DISTRIBUTED"]

logger = logging.getLogger("localcluster")

TOPIC_DEATH = "localcluster-worker-death"
TOPIC_REMOVED = "localcluster-worker-removed"
MINIMUM_DISTRIBUTED = "2024.12.0"      # pyproject.toml's dask extra says the same
SAMPLE_MS = 100                        # the nanny's look at its worker: pid, RSS, limit, address
LOOK_EVERY = 1.0                       # seconds between two looks at the OOM counters (file reads)
# What DeathRecorder uses of distributed's Nanny; the underscore name is the one it wraps.
# NANNY_METHODS: the class's (checked by install() in the client too), NANNY_NAMES: a nanny's.
NANNY_METHODS = ("_on_worker_exit", "_on_worker_exit_sync", "log_event", "kill", "pid", "worker_address")
NANNY_NAMES = NANNY_METHODS + ("memory_manager", "periodic_callbacks", "status", "address", "process")
_STOPPING = {"closing", "closed", "closing_gracefully", "failed"}
_CLOSING = {"closing", "closed", "failed"}      # Nanny.close sets "closing" before it tears its plugins down
GIVE_TIMEOUT = 30.0                             # seconds a late nanny has to take the DeathRecorder


def require(obj: Any, names: tuple, what: str) -> None:
    """Fail loudly where this distributed lacks what localcluster wraps (its internals move)."""
    import distributed
    missing = [n for n in names if not hasattr(obj, n)]
    sync = getattr(obj, "_on_worker_exit_sync", None)
    if not missing and sync is not None:
        try:
            source = inspect.getsource(sync)
        except (OSError, TypeError):
            source = "self._on_worker_exit"     # no source to read (a zipped install): hasattr must do
        if "self._on_worker_exit" not in source:
            missing.append("_on_worker_exit looked up at call time by _on_worker_exit_sync")
    if missing:
        raise RuntimeError(
            f"localcluster.dask.install: distributed {distributed.__version__}'s {what} has no "
            f"{', '.join(missing)}, which localcluster needs to learn how a worker process ended. It works with "
            f"distributed>={MINIMUM_DISTRIBUTED} (tested with the version its test extra installs); install that, "
            f"or leave install() out (dask's plain KilledWorker).")


def record_dir(nanny_address: str, create: bool = True) -> str:
    """The nanny's record directory, outside the worker directory (dask deletes that before
    the exit hook runs), private to this user: the worker finds it from its nanny's address.
    Only the nanny's recorder creates it, and the folder of all of them (``create``), and
    removes both in its teardown (``remove_record_dir``): the last nanny leaves nothing."""
    base = os.path.join(tempfile.gettempdir(), f"localcluster-dask-{os.getuid()}")
    path = os.path.join(base, "".join(c if c.isalnum() or c in ".-" else "-" for c in nanny_address))
    for _attempt in range(3):
        if create:
            try:
                os.mkdir(base, 0o700)
            except FileExistsError:
                pass
        try:
            st = os.lstat(base)
        except FileNotFoundError:
            if not create:
                return path             # no recorder here: the worker writes nothing
            continue                    # another nanny's teardown removed it meanwhile: make it again
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise RuntimeError(f"{base} is not a private directory of this user: remove it, or set TMPDIR "
                               f"elsewhere")
        if not create:
            return path
        try:
            os.mkdir(path, 0o700)       # not makedirs: it would make a missing base with the umask's mode
        except FileExistsError:
            pass
        except FileNotFoundError:
            continue
        return path
    raise RuntimeError(f"localcluster.dask: {base} kept vanishing while the nanny of {nanny_address} made its "
                       f"record folder in it")


def remove_record_dir(path: str) -> None:
    """The nanny's record folder, and the folder of all of them once no other nanny of this
    user has one there (rmdir fails on a folder that is not empty: then it stays)."""
    shutil.rmtree(path, ignore_errors=True)
    try:
        os.rmdir(os.path.dirname(path))
    except OSError:
        pass


def fault_file(directory: str, pid: int) -> str:
    return os.path.join(directory, f"faulthandler-{pid}.log")


def address_file(directory: str, pid: int) -> str:
    return os.path.join(directory, f"address-{pid}")


def as_event(death: WorkerDeath) -> dict:
    """A WorkerDeath as an event message (plain types)."""
    out = dataclasses.asdict(death)
    out.pop("blamed", None)
    out["tasks"], out["log_tail"] = list(out["tasks"]), list(out["log_tail"])
    return out


def _key(k: Any) -> Any:
    """A task key as dask has it: msgpack gives a tuple key back as a list."""
    return tuple(_key(x) for x in k) if isinstance(k, list) else k


def task_keys(keys: list) -> tuple:
    """The keys of an event message as dask has them."""
    return tuple(_key(k) for k in keys)


def from_event(msg: dict) -> WorkerDeath:
    fields = {f.name for f in dataclasses.fields(WorkerDeath)}
    kwargs = {k: v for k, v in msg.items() if k in fields}
    kwargs["tasks"] = task_keys(kwargs.get("tasks", ()))
    kwargs["log_tail"] = tuple(kwargs.get("log_tail", ()))
    return WorkerDeath(**kwargs)


class _Watch:
    """What the nanny last saw of its worker process: the pid is gone by the time the exit
    hook runs (``mark_stopped`` drops the process first)."""

    def __init__(self, pid: int):
        self.pid = pid
        self.rss: Optional[int] = None
        self.peak = 0
        self.limit: Optional[int] = None
        self.address: Optional[str] = None
        self.oom = OomWatch(pid)
        self.looked = time.monotonic()
        self.memory_kill: Optional[int] = None      # RSS when the nanny killed it for memory
        self.requested = False                       # the nanny was asked to stop it


class DeathRecorder(NannyPlugin):
    """On each nanny: every worker process death, classified and published (``TOPIC_DEATH``)."""

    name = "localcluster-deaths"
    idempotent = True

    def setup(self, nanny) -> None:
        require(nanny, NANNY_NAMES, "Nanny")
        self.nanny = nanny
        self.sampler: Optional[PeriodicCallback] = None
        self.watch: Optional[_Watch] = None
        if getattr(nanny.status, "name", "") in _CLOSING:
            return      # given late to a closing nanny: its teardowns have run, nothing would remove a record
        self.directory = record_dir(nanny.address)
        earlier = getattr(vars(nanny).get("_on_worker_exit"), "__self__", None)
        if isinstance(earlier, DeathRecorder):      # given twice: this one takes over, with what that one saw
            earlier.unwrap(nanny)
            self.watch = earlier.watch
        self.pending: set = set()
        self.wrapped = {"_on_worker_exit": getattr(nanny, "_on_worker_exit"),   # distributed's internals: see above
                        "log_event": nanny.log_event, "kill": nanny.kill}
        setattr(nanny, "_on_worker_exit", self.on_worker_exit)    # shadows the method on this instance
        nanny.log_event = self.log_event
        nanny.kill = self.kill
        self.sampler = PeriodicCallback(self.sample, SAMPLE_MS)
        nanny.periodic_callbacks[self.name] = self.sampler
        self.sampler.start()
        self.sample()

    def unwrap(self, nanny) -> None:
        self.sampler.stop()
        nanny.periodic_callbacks.pop(self.name, None)
        for name in self.wrapped:
            vars(nanny).pop(name, None)           # the class's own method shows again

    def teardown(self, nanny) -> None:
        if self.sampler is None:
            return
        self.unwrap(nanny)
        if self.watch is not None:
            self.watch.oom.close()
        remove_record_dir(self.directory)

    def sample(self) -> None:
        pid = self.nanny.pid
        if not pid:
            return
        if self.watch is None or self.watch.pid != pid:
            if self.watch is not None:
                self.watch.oom.close()
            self.watch = _Watch(pid)
        w = self.watch
        try:
            proc = psutil.Process(pid)
            rss = proc.memory_info().rss
            if time.monotonic() - w.looked > LOOK_EVERY:
                w.oom.look(descendants(pid))
                w.looked = time.monotonic()
        except psutil.Error:
            return
        if rss:             # a process being reaped shows none: the last real sample stands
            w.rss = rss
            w.peak = max(w.peak, rss)
        w.limit = self.nanny.memory_manager.memory_limit or None
        # the nanny keeps its last worker's address until the new one has started
        if getattr(getattr(self.nanny.process, "status", None), "name", "") == "running":
            w.address = self.nanny.worker_address or w.address

    def log_event(self, topic, msg):
        if topic == "worker-restart-memory" and self.watch is not None and isinstance(msg, dict):
            if msg.get("pid") == self.watch.pid:
                self.watch.memory_kill = msg.get("rss")
        return self.wrapped["log_event"](topic, msg)

    async def kill(self, *args, **kwargs):
        if self.watch is not None:
            self.watch.requested = True
        return await self.wrapped["kill"](*args, **kwargs)

    async def on_worker_exit(self, exitcode):
        try:
            death = await asyncio.get_running_loop().run_in_executor(None, self.death, exitcode)
            msg = as_event(death)
            msg["nanny"] = self.nanny.address
            self.wrapped["log_event"](TOPIC_DEATH, msg)
        except Exception:       # never in the way of dask's own restart
            logger.exception("localcluster could not record the death of a worker process")
        return await self.wrapped["_on_worker_exit"](exitcode)

    def death(self, exitcode: Optional[int]) -> WorkerDeath:
        w, self.watch = self.watch, None
        if w is None:       # it died before the first sample (within SAMPLE_MS of its start)
            return WorkerDeath(
                worker=f"the worker of nanny {self.nanny.address}", pid=0,
                cause=classify(exitcode, "requested" if exitcode == 0 else None), exitcode=exitcode,
                signal=exit_signal(exitcode), time=time.time()).explained(replay_hint=False)
        try:
            if w.memory_kill is not None:
                reason: Optional[str] = "memory-limit"
            elif w.requested or exitcode == 0 or getattr(self.nanny.status, "name", "") in _STOPPING:
                reason = "requested"
            else:
                reason = None
            evidence = w.oom.evidence() if reason is None and exitcode == -signal.SIGKILL else None
        finally:
            w.oom.close()
        cause = classify(exitcode, reason, evidence)
        faults = self.read_faults(w.pid)       # a crash's report, or the stacks SIGUSR1 asked for
        stack = crash_stack(faults) if cause != "requested" else None
        memory = w.memory_kill if w.memory_kill is not None else w.rss
        return WorkerDeath(
            worker=self.read_address(w.pid) or w.address or f"the worker of nanny {self.nanny.address}", pid=w.pid,
            cause=cause,
            exitcode=exitcode, signal=exit_signal(exitcode), memory=memory,
            peak_memory=w.peak or None, memory_limit=w.limit, stack=stack, log_tail=tuple(faults[-200:]),
            time=time.time(),
            detail=evidence if cause == "oom-killer" else None).explained(replay_hint=False)

    def read_address(self, pid: int) -> Optional[str]:
        """The address the worker wrote when it registered (``FaultHandler``): a worker that
        dies before its nanny learns its address is still named."""
        try:
            with open(address_file(self.directory, pid)) as f:
                address = f.read().strip()
        except OSError:
            return None
        os.unlink(address_file(self.directory, pid))
        return address or None

    def read_faults(self, pid: int) -> list:
        path = fault_file(self.directory, pid)
        try:
            with open(path, errors="replace") as f:
                lines = f.read().splitlines()
        except OSError:
            return []
        os.unlink(path)
        return lines


class FaultHandler(WorkerPlugin):
    """In each worker: faulthandler on, writing to a file in its nanny's record directory (a
    crash's stack), and all threads' stacks on SIGUSR1 (a hang's, a timeout's)."""

    name = "localcluster-faulthandler"
    idempotent = True

    def setup(self, worker) -> None:
        keep_file_names_in_cloudpickle()        # a task's own submits keep their file names too
        self.file = None
        if not worker.nanny:
            return
        # A worker started while its nanny closes comes after the recorder's teardown: it
        # writes nothing then (nothing would remove it), as with a nanny that has no recorder.
        directory = record_dir(worker.nanny, create=False)
        try:
            self.file = open(fault_file(directory, os.getpid()), "a")
        except FileNotFoundError:
            return
        faulthandler.enable(file=self.file, all_threads=True)
        faulthandler.register(signal.SIGUSR1, file=self.file, all_threads=True)
        with open(address_file(directory, os.getpid()), "w") as f:
            f.write(worker.address)

    def teardown(self, worker) -> None:
        """A worker that stops in order leaves nothing behind (the directory is its nanny's,
        kept for the next worker, removed by the recorder's teardown)."""
        if self.file is not None:
            faulthandler.unregister(signal.SIGUSR1)
            faulthandler.disable()
            self.file.close()
            for path in (self.file.name, address_file(os.path.dirname(self.file.name), os.getpid())):
                try:
                    os.unlink(path)
                except OSError:        # already gone with the nanny's directory
                    pass


class RemovalRecorder(SchedulerPlugin):
    """On the scheduler: which tasks each removed worker was running (``TOPIC_REMOVED``), so
    that a death can be joined to the tasks it killed. By the time ``remove_worker`` hooks
    run, the worker's tasks have left it: ``transition`` notes where each one runs.

    It also gives the ``DeathRecorder`` to a nanny dask's broadcast missed (``add_worker``)."""

    name = "localcluster-removals"
    idempotent = True

    async def start(self, scheduler) -> None:
        # the scheduler unpickles each task and pickles it again for its worker: its
        # cloudpickle must keep the file names the client's kept (dask_client.install)
        keep_file_names_in_cloudpickle()
        self.scheduler = scheduler
        self.running_on: dict = {}
        self.died: dict = defaultdict(list)
        self.given: set = set()         # the nannies add_worker gave the DeathRecorder to

    async def add_worker(self, scheduler, worker) -> None:
        """Awaited before the worker's registration is answered: the nanny records from its
        worker's first task on."""
        plugin = scheduler.nanny_plugins.get(DeathRecorder.name)
        ws = scheduler.workers.get(worker)
        nanny = getattr(ws, "nanny", None)
        if plugin is None or not nanny or nanny in self.given:
            return
        self.given.add(nanny)
        try:
            async with scheduler.rpc(nanny) as comm:
                await asyncio.wait_for(comm.plugin_add(plugin=plugin, name=DeathRecorder.name), GIVE_TIMEOUT)
        except Exception:       # a nanny gone or closing: the worker goes on without its record
            logger.warning("localcluster could not give nanny %s its death recorder", nanny, exc_info=True)

    def transition(self, key, start, finish, *args, **kwargs) -> None:
        if finish == "processing":
            ts = self.scheduler.tasks.get(key)
            if ts is not None and ts.processing_on is not None:
                self.running_on[key] = ts.processing_on.address
        elif start == "processing":
            worker = self.running_on.pop(key, None)
            if worker is not None and worker not in self.scheduler.workers:
                self.died[worker].append(key)

    def remove_worker(self, scheduler, worker, **kwargs) -> None:
        scheduler.log_event(TOPIC_REMOVED, {"worker": worker, "tasks": self.died.pop(worker, [])})
