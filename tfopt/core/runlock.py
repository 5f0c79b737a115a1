"""Which process is writing a run directory: an advisory lock beside it, ``<run>.tfopt-lock``.

The chief of a run holds an exclusive ``flock`` on ``<run>.tfopt-lock`` from its start until its
commit (the kernel drops it when the process dies, ``kill -9`` included, so a crash never
leaves a stale lock). The file records who holds it (pid, host, the cluster of a multi-worker
run), which is what another run's error names and how the workers of one cluster recognize
their own chief's lock when they pick the same default directory.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time

SUFFIX = ".tfopt-lock"
_WAIT = 2.0  # seconds an acquire retries: another start-up may be probing the lock for a moment


class Locked(Exception):
    """The directory is locked by another live run; ``holder`` says by whom (may be empty)."""

    def __init__(self, path: str, holder: dict):
        super().__init__(path)
        self.path, self.holder = path, holder

    def describe(self) -> str:
        """Who holds the lock, for a message: ``pid 123 on host``."""
        h = self.holder
        return f"pid {h.get('pid', '?')} on {h.get('host', '?')}" if h else "another process"


class RunLock:
    """The lock of one run directory (held until :meth:`release` or the process ends).

    Args:
        path: The run directory (the lock file is ``path + SUFFIX``).
        owner: What to record about the holder besides pid and host (e.g. ``{"cluster": ...}``).
    """

    def __init__(self, path: str, owner: dict | None = None):
        self.path = os.path.abspath(path)
        self.file = self.path + SUFFIX
        self.owner = {"pid": os.getpid(), "host": socket.gethostname(), **(owner or {})}
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        """True while this object holds the lock."""
        return self._fd is not None

    def acquire(self) -> RunLock:
        """Takes the lock (retrying briefly while another start-up probes it).

        Raises:
            Locked: another live process holds it.
        """
        if self._fd is not None:
            return self
        deadline = time.monotonic() + _WAIT
        while True:
            os.makedirs(os.path.dirname(self.file), exist_ok=True)
            fd = os.open(self.file, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                if time.monotonic() > deadline:
                    raise Locked(self.path, holder(self.path)) from None
                time.sleep(0.05)
                continue
            # The file may have been released and unlinked between our open and our lock: then
            # the lock is on a file nobody else will open; take the one at the path instead.
            try:
                same = os.fstat(fd).st_ino == os.stat(self.file).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(self.owner).encode())
        self._fd = fd
        return self

    def __del__(self):
        self.release()

    def release(self) -> None:
        """Removes the lock file and drops the lock (no-op when not held)."""
        if self._fd is None:
            return
        try:
            os.unlink(self.file)
        except FileNotFoundError:
            pass
        os.close(self._fd)  # closing drops the flock
        self._fd = None


def holder(path: str) -> dict | None:
    """Who holds the lock of run directory ``path`` (``{}`` when unreadable), or None when nobody does."""
    file = os.path.abspath(path) + SUFFIX
    try:
        fd = os.open(file, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                return json.loads(os.read(fd, 4096) or b"{}")
            except ValueError:
                return {}
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
