"""Process helpers: a service and its ranks die with the process that started them, and a
free loopback port for them to listen on.

Two mechanisms, both cheap: the kernel's parent-death signal (`PR_SET_PDEATHSIG`, Linux,
delivered when the thread that forked the child exits) and a parent-pid check that callers
poll (`parent_gone`), which also covers other platforms. `PARENT_PID_ENV` carries the pid of
the starting process to the service, which then treats that process's exit as a stop signal.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import sys
from collections.abc import Callable

PARENT_PID_ENV = "RESIDENCY_PARENT_PID"
SCRATCH_ENV = "RESIDENCY_SCRATCH_DIRS"  # folders a started service removes once orphaned
_PR_SET_PDEATHSIG = 1


class Terminated(KeyboardInterrupt):
    """An interruption by a signal other than Ctrl-C (SIGTERM, SIGHUP): handled as
    KeyboardInterrupt (exit 130), recorded as the signal it was."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.signame = signal.Signals(signum).name
        super().__init__(f"{self.signame} received")


def interruption(exc: BaseException) -> str:
    """How an interruption is recorded in a run: the signal's name (`SIGTERM received`,
    `SIGINT (Ctrl-C) received`), else the exception's type and message."""
    if isinstance(exc, Terminated):
        return str(exc)
    if type(exc) is KeyboardInterrupt:
        return "SIGINT (Ctrl-C) received"
    return f"{type(exc).__name__}: {exc}"


def raise_terminated(signum: int, frame: object) -> None:
    """A signal handler: raise `Terminated` in the main thread."""
    raise Terminated(signum)


def remove_scratch() -> None:
    """Remove the folders named by `SCRATCH_ENV` (the starting process is gone, so nobody
    else will)."""
    import shutil

    for folder in filter(None, os.environ.get(SCRATCH_ENV, "").split(os.pathsep)):
        shutil.rmtree(folder, ignore_errors=True)


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


# resolved once, in the parent: a preexec_fn must not load libraries after fork
_PRCTL = _load_prctl()


def die_with_parent(sig: int = signal.SIGTERM) -> bool:
    """Ask the kernel to send `sig` to this process when its parent exits; True if set.

    Safe to call from a `subprocess` `preexec_fn` (no allocation beyond the call itself).
    """
    if _PRCTL is None:
        return False
    return _PRCTL(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0


def pdeathsig_preexec(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A `preexec_fn` that sets the parent-death signal, or None where it is unavailable."""
    if _PRCTL is None:
        return None

    def preexec() -> None:
        die_with_parent(sig)
    return preexec


def parent_gone(parent_pid: int) -> bool:
    """True once `parent_pid` is no longer this process's parent (it exited; we were
    reparented)."""
    return os.getppid() != parent_pid


def watched_parent() -> int | None:
    """The pid named by `PARENT_PID_ENV`, if the starting process asked to be watched."""
    raw = os.environ.get(PARENT_PID_ENV, "")
    return int(raw) if raw.isdigit() and int(raw) > 1 else None


def free_port() -> int:
    """A TCP port free on loopback right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
