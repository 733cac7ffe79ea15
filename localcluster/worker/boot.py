"""A worker process's start and its end by failure: ``BOOT``, the ``python -c`` program the
nanny runs (nanny.py), and ``main``, which makes the ``Worker`` (process.py) and serves.

The process is started with ``python -c``, so the user's ``__main__`` is never re-executed
here; it dies with its parent (PR_SET_PDEATHSIG, and EOF on the channel); faulthandler
writes fatal-signal stacks, with every thread's ident, into the captured stderr. When the
run is recorded (runs.py), the signal the parent's death sends is one faulthandler catches
in C, without the GIL: it writes every thread's stack into the run's end note, whose time
is the moment the parent went, and then ends the process as SIGKILL would have. Before any
message, the channel brings the parent's ``multiprocessing`` authkey (``take_authkey``), adopted
before the first task (``adopt_authkey``); then
the user's initializer runs once. If the worker's own machinery fails, ``fatal`` (process.py)
says so on stderr and to the parent and the process exits 1.
"""
from __future__ import annotations

import faulthandler
import marshal
import os
import pickle
import signal
import sys
import traceback

from . import context, logs, process
from .process import Worker


def take_authkey(fd: int) -> bytes:
    """The parent's ``multiprocessing`` authkey, so that a Manager proxy (or any connection
    to the parent's multiprocessing servers) a task receives authenticates as it would in
    the parent or in a loky worker. It precedes every message on the channel (4 bytes of
    length, then the key), never in argv, which ``ps`` shows to every user (SECURITY.md)."""
    size = int.from_bytes(_read_exact(fd, 4), "big")
    return _read_exact(fd, size)


def adopt_authkey(key: bytes) -> None:
    """Make ``key`` this process's authkey: after Ready is sent and before any task runs, since
    importing multiprocessing is a noticeable part of a start (or before the initializer,
    which may use it too)."""
    from multiprocessing import current_process
    current_process().authkey = key


def _read_exact(fd: int, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = os.read(fd, n - len(out))
        if not chunk:
            raise EOFError("the parent closed the channel before sending the worker's authkey")
        out += chunk
    return out


# The settings cross as marshal (built in: json's import would be part of every start), over
# the channel before anything else, not in argv: ``ps`` shows the worker's first line, a
# comment naming it, instead of kilobytes of hex. Read before localcluster is importable (the
# settings hold the parent's sys.path), so with nothing but os.
BOOT = ("import os, sys, marshal\n"
        "def _take(n, fd=int(sys.argv[1])):\n"
        "    got = b''\n"
        "    while len(got) < n:\n"
        "        more = os.read(fd, n - len(got))\n"
        "        if not more:\n"
        "            raise SystemExit(0)\n"        # the parent is gone before we started
        "        got += more\n"
        "    return got\n"
        "cfg = marshal.loads(_take(int.from_bytes(_take(4), 'big')))\n"
        "del _take\n"
        "sys.path[:] = cfg['sys_path']\n"
        "from localcluster.worker.boot import main; main(cfg)\n")


def boot_argv(cfg: dict) -> list:
    """The worker's command line: what ``ps`` shows of it is its first line, a comment naming
    it; its settings (``settings_frame``) come over the channel."""
    title = f"# localcluster {cfg['name']} (parent {cfg['parent_pid']})\n"
    return [sys.executable, "-c", title + BOOT, str(cfg["sock_fd"])]


def settings_frame(cfg: dict) -> bytes:
    """What the parent writes on the channel before anything else: ``cfg`` (plain values only:
    str, numbers, None, lists, dicts), marshalled, after its length."""
    data = marshal.dumps(cfg)
    return len(data).to_bytes(4, "big") + data


SA_NODEFER = 0x40000000


def _die_with_parent(parent_pid: int, end_note: "str | None") -> None:
    """Ask the kernel to end this process when its parent ends: with SIGKILL, or, given the
    run's ``end_note`` file, with ``context.END_SIGNAL``, which faulthandler answers in C (no GIL
    needed, so a task holding it does not delay it) by writing every thread's stack there
    and then letting the signal's default action end the process."""
    sig = signal.SIGKILL
    if end_note and hasattr(faulthandler, "register"):
        try:
            fd = os.open(end_note, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            fd = -1           # the note is gone (the run's record could not be written): no note
        if fd >= 0:
            faulthandler.register(context.END_SIGNAL, file=fd, all_threads=True, chain=True)
            _one_delivery_at_a_time(context.END_SIGNAL)
            # blocked by a worker thread that started us (a cluster made in a task): ours to take
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {context.END_SIGNAL})
            context.end_note = fd
            sig = context.END_SIGNAL
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            PR_SET_PDEATHSIG = 1
            libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        except Exception:  # pragma: no cover - the channel EOF still ends us
            pass
    if os.getppid() != parent_pid:   # the parent died before prctl took effect
        context.parent_gone()
        os._exit(0)


def _one_delivery_at_a_time(sig: int) -> None:
    """Keep ``sig`` blocked while faulthandler's handler for it runs. The kernel sends the
    parent-death signal again each time the dying parent hands this process on from one of
    its threads to the next, and faulthandler registers with SA_NODEFER: a second delivery
    during the dump would find it busy, skip, and end the process halfway through the note
    (or before its first byte, when the note's time is all a later run reads). With the
    signal blocked in the handler, and taken by one thread only (the stacks thread), the
    next delivery waits for the dump to end. Where the C layout of ``struct sigaction`` is
    not the one below, this does nothing."""
    import ctypes
    import platform
    if not sys.platform.startswith("linux") or platform.machine() not in ("x86_64", "aarch64"):
        return

    class SigAction(ctypes.Structure):      # glibc's and musl's, on these two
        _fields_ = [("handler", ctypes.c_void_p), ("mask", ctypes.c_ulong * 16), ("flags", ctypes.c_int),
                    ("restorer", ctypes.c_void_p)]
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        action = SigAction()
        if libc.sigaction(sig, None, ctypes.byref(action)) != 0:
            return
        action.flags &= ~SA_NODEFER
        action.mask[(sig - 1) // 64] |= 1 << ((sig - 1) % 64)
        libc.sigaction(sig, ctypes.byref(action), None)
    except (OSError, AttributeError):    # no libc to call: faulthandler's own flags stay
        pass


def _raise_oom_score() -> None:
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("500")
    except OSError:  # pragma: no cover - not Linux
        pass


def main(cfg: dict) -> None:
    _die_with_parent(cfg["parent_pid"], cfg.get("end_note"))
    _raise_oom_score()
    faulthandler.enable(file=sys.stderr, all_threads=True)
    if hasattr(faulthandler, "register"):
        faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C is the parent's to handle
    if hasattr(signal, "pthread_sigmask"):          # blocked by the parent's thread that started us
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    # pass_fds hands them over inheritable: a program a task starts with close_fds=False
    # would get our channel to the parent and the board (SECURITY.md).
    for fd in (cfg["sock_fd"], cfg["board_fd"], cfg.get("stacks_fd")):
        if fd is not None:
            os.set_inheritable(fd, False)
    context.started()
    worker = None
    try:
        key = take_authkey(cfg["sock_fd"])
        worker = Worker(cfg)
        context.started(worker)
        if cfg.get("log_level") is not None:
            logs.install(worker.log, cfg["log_level"])
        if cfg.get("initializer") is not None:
            adopt_authkey(key)
            with open(cfg["initializer"], "rb") as f:       # 0600 in the cluster's 0700 directory
                init, initargs = pickle.load(f)
            init(*initargs)
        setup = cfg.get("setup")
        if setup is not None and os.path.exists(setup):    # uploads and plugins (worker/setup.py)
            adopt_authkey(key)
            with open(setup, "rb") as f:        # 0600 in the cluster's 0700 directory
                run_steps, steps = pickle.load(f)
            run_steps(*steps)
        worker.serve(versions(), lambda: adopt_authkey(key))
    except SystemExit:
        raise
    except BaseException:
        process.fatal(worker, traceback.format_exc(), cfg.get("name"))


def versions() -> dict:
    """What this process runs: Python, platform and the packages whose versions must match
    the parent's (Ready, and Client.get_versions)."""
    import platform
    out = {"python": platform.python_version(), "platform": sys.platform}
    for mod in ("localcluster", "cloudpickle", "tblib"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:
            out[mod] = None
    if "numpy" in sys.modules:
        out["numpy"] = sys.modules["numpy"].__version__
    return out
