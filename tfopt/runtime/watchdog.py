"""A start-up watchdog: turn a silent multi-worker hang into a one-line error and exit 3.

A MultiWorkerMirroredStrategy task whose peers never start waits for them forever, with no
timeout and no message. Worse, TensorFlow holds the GIL while it waits, so no Python thread
(and no Python signal handler) of the stuck process ever runs again. The watchdog therefore
lives in a tiny separate process (this file run as a script; stdlib only):

* ``__enter__`` starts the watcher with the timeout and the peers, connected by a pipe, and
  points the parent's SIGQUIT at libc's ``_exit`` (a C-level handler that needs no GIL; the
  handler receives the signal number, 3, which becomes the exit status).
* ``__exit__`` closes the pipe; the watcher sees EOF and leaves quietly. It also leaves if the
  parent dies.
* On timeout the watcher checks which peers accept a TCP connection, prints ONE line naming the
  unreachable ones and the fix to the shared stderr, and sends SIGQUIT: the parent exits with
  status 3. Where the C handler cannot be installed, it falls back to SIGKILL (status 137).
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import socket
import subprocess
import sys
import time

EXIT_CODE = 3  # == SIGQUIT: the C handler _exit(signum) exits with it


def probe(address: str, timeout: float = 1.0) -> str | None:
    """Tries one TCP connection to ``host:port``.

    Args:
        address: ``host:port`` (IPv6 hosts may be bracketed: ``[::1]:2222``).
        timeout: Seconds to wait for the connection.

    Returns:
        None when the peer accepts the connection, else a short reason
        (e.g. ``"connection refused"``).
    """
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return None
    except ConnectionRefusedError:
        return "connection refused"
    except TimeoutError:
        return f"no answer in {timeout:g}s"
    except (OSError, ValueError) as e:
        return getattr(e, "strerror", None) or str(e) or type(e).__name__


def timeout_message(
    timeout: float,
    peers: list[str],
    what: str = "multi-worker start-up",
    probe_timeout: float = 1.0,
) -> str:
    """Probes ``peers`` and returns the one-line message the watchdog prints when it fires."""
    down = [(p, why) for p in peers if (why := probe(p, probe_timeout)) is not None]
    head = f"tfopt: {what} did not finish within {timeout:g}s"
    if down:
        listed = ", ".join(f"{p} ({why})" for p, why in down)
        return (
            f"{head}; unreachable peers: {listed}; fix: start those tasks, check the addresses in "
            "TF_CONFIG, or raise it with --set runtime.startup_timeout=SECONDS"
        )
    if peers:
        return (
            f"{head}, although all peers accept connections ({', '.join(peers)}); fix: check that every "
            "task runs the same strategy and TF_CONFIG cluster, or raise it with --set runtime.startup_timeout=SECONDS"
        )
    return f"{head}; fix: raise it with --set runtime.startup_timeout=SECONDS"


def _install_exit_on_sigquit():
    """Makes SIGQUIT call libc ``_exit(3)`` directly; returns the previous handler, or False."""
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
        libc.signal.restype = ctypes.c_void_p
        return libc.signal(signal.SIGQUIT, ctypes.cast(libc._exit, ctypes.c_void_p).value)
    except (OSError, AttributeError, ImportError):  # no libc symbols (e.g. Windows)
        return False


def _restore_sigquit(previous) -> None:
    if previous is False:
        return
    import ctypes

    libc = ctypes.CDLL(None)
    libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.signal(signal.SIGQUIT, previous)


class StartupWatchdog:
    """Context manager that ends the process (status 3) if its block outlives ``timeout`` seconds.

    Example::

        with StartupWatchdog(runtime.startup_timeout, cluster.peers(("chief", "worker"))):
            strategy = make_strategy(runtime, cluster)

    Args:
        timeout: Seconds the block may take; ``None`` or ``<= 0`` disables the watchdog.
        peers: ``host:port`` addresses this task waits for (probed only when it fires).
        what: What the block does, for the message.
    """

    def __init__(
        self, timeout: float | None, peers: list[str], what: str = "multi-worker start-up"
    ):
        self.timeout = timeout
        self.peers = list(peers)
        self.what = what
        self._watcher: subprocess.Popen | None = None
        self._previous = False

    def __enter__(self) -> StartupWatchdog:
        if self.timeout is None or self.timeout <= 0:
            return self
        self._previous = _install_exit_on_sigquit()
        # -I: isolated (no site, no PYTHONPATH); the watcher needs only the stdlib.
        self._watcher = subprocess.Popen(
            [
                sys.executable,
                "-I",
                os.path.abspath(__file__),
                "--pid",
                str(os.getpid()),
                "--timeout",
                repr(float(self.timeout)),
                "--what",
                self.what,
                "--",
                *self.peers,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            close_fds=True,
        )
        return self

    def __exit__(self, *exc) -> None:
        if self._watcher is not None:
            self._watcher.stdin.close()  # EOF tells the watcher the block finished
            self._watcher.wait()
            self._watcher = None
            _restore_sigquit(self._previous)
            self._previous = False


def _watch(pid: int, timeout: float, what: str, peers: list[str]) -> int:
    """The watcher process: wait for EOF on stdin (parent done or dead) or for the timeout."""
    ready, _, _ = select.select([sys.stdin], [], [], timeout)
    if ready:
        return 0
    sys.stderr.write(timeout_message(timeout, peers, what) + "\n")
    sys.stderr.flush()
    try:
        os.kill(pid, signal.SIGQUIT)
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            if select.select([sys.stdin], [], [], 0.05)[0]:  # parent gone: its pipe closed
                return 0
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return 0


if __name__ == "__main__":
    _parser = argparse.ArgumentParser(description="tfopt start-up watcher (internal)")
    _parser.add_argument("--pid", type=int, required=True)
    _parser.add_argument("--timeout", type=float, required=True)
    _parser.add_argument("--what", default="multi-worker start-up")
    _parser.add_argument("peers", nargs="*")
    _args = _parser.parse_args()
    sys.exit(_watch(_args.pid, _args.timeout, _args.what, _args.peers))
