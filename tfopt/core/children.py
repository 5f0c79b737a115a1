"""Child processes that end with their parent: the kernel's parent-death signal (Linux)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys


def _prctl():
    """libc's ``prctl``, resolved before any fork (None off Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # pragma: no cover - every Linux libc has it
        return None


#: Set by ``tfopt.launch`` in its private network namespace: servers there are off the network.
ISOLATED_ENV = "TFOPT_ISOLATED"
#: Host names of the loopback: a cluster on them can run in a private network namespace.
LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")
_PR_SET_PDEATHSIG = 1
_PRCTL = _prctl()


def die_with_parent(sig: int = signal.SIGTERM):
    """A ``preexec_fn``: the child gets ``sig`` when the process that started it dies.

    ``tfopt.launch``'s tasks live in sessions of their own (Ctrl-C in the terminal reaches only
    the launcher, which stops them in order), so nothing else would end them when the launcher
    is killed with SIGKILL or its terminal closes; the pipeline runner's launcher likewise. The
    default, SIGTERM, lets a training task write its backup, as on preemption.

    Args:
        sig: The signal the child gets.

    Returns:
        The function to pass as ``subprocess.Popen(preexec_fn=...)``.
    """
    parent = os.getpid()

    def arm() -> None:
        if _PRCTL is not None:
            _PRCTL(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
            if os.getppid() != parent:  # the parent died before the signal was armed
                os.kill(os.getpid(), sig)

    return arm


def run_child(cmd: list[str]) -> int:
    """Runs ``cmd`` (e.g. ``tfopt.launch``) to its end and returns its exit code; it never outlives this process.

    If this process dies, the child gets SIGTERM (:func:`die_with_parent`). On Ctrl-C the child
    is waited for while it stops in order: a terminal's Ctrl-C reached it too (one process
    group), a SIGINT sent to this process alone did not, so it gets SIGTERM; a second Ctrl-C
    does not interrupt the wait. The KeyboardInterrupt is raised again once the child is gone.
    """
    proc = subprocess.Popen(cmd, preexec_fn=die_with_parent())
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGTERM)
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            proc.wait()
        finally:
            signal.signal(signal.SIGINT, previous)
        raise
