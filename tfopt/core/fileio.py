"""Atomic artifact writes: a crash never leaves a half-written file or directory in place.

Artifacts get the permissions the user's umask gives (0644 files / 0755 directories under
umask 022), like any file ``open()`` creates: TensorBoard or a serving process running as
another user must be able to read a model we wrote. ``tempfile.mkstemp``/``mkdtemp`` would
create them 0600/0700, so temp siblings are created here with the modes ``open()`` asks for.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import numpy as np

# What open() and mkdir() ask for; the kernel then applies the umask (and a default ACL).
_FILE_MODE = 0o666
_DIR_MODE = 0o777
_FILE_FLAGS = (
    os.O_WRONLY
    | os.O_CREAT
    | os.O_EXCL
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_BINARY", 0)
)
_T = TypeVar("_T")


def _default(obj: Any) -> Any:
    # Keras hands callbacks numpy scalars (e.g. epoch numbers after a resume are numpy.int64).
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def _sibling(
    directory: str, prefix: str, suffix: str, create: Callable[[str], _T]
) -> tuple[str, _T]:
    """Creates a new, uniquely named entry in ``directory`` with ``create(path)``; O_EXCL-style."""
    for _ in range(100):
        path = os.path.join(directory, f"{prefix}{secrets.token_hex(6)}{suffix}")
        try:
            return path, create(path)
        except FileExistsError:
            continue
    raise FileExistsError(f"could not create a temporary file in {directory} (100 names taken)")


def _new_file(directory: str, prefix: str = ".tmp-", suffix: str = "") -> tuple[str, int]:
    """A new empty file beside the target, mode 0666 minus the umask; returns (path, fd)."""
    return _sibling(directory, prefix, suffix, lambda p: os.open(p, _FILE_FLAGS, _FILE_MODE))


def _new_dir(directory: str, prefix: str) -> str:
    """A new empty directory beside the target, mode 0777 minus the umask."""
    return _sibling(directory, prefix, "", lambda p: os.mkdir(p, _DIR_MODE))[0]


def write_bytes(path: str, data: bytes) -> None:
    """Writes ``data`` to ``path`` atomically (temp file in the same directory, fsync, rename).

    The file gets the mode the umask gives (0644 under umask 022), as ``open()`` would.
    """
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp, fd = _new_file(directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_text(path: str, text: str) -> None:
    """Writes UTF-8 ``text`` to ``path`` atomically."""
    write_bytes(path, text.encode("utf-8"))


def write_json(path: str, obj: Any) -> None:
    """Writes ``obj`` as indented JSON atomically; numpy scalars and arrays are converted."""
    write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=_default) + "\n")


@contextmanager
def atomic_dir(path: str) -> Iterator[str]:
    """Yields a temp directory beside ``path`` that replaces ``path`` when the block succeeds.

    The directory gets the mode the umask gives (0755 under umask 022); what the block writes
    into it keeps the modes its writers give. On an exception the temp directory is removed and
    ``path`` is left as it was.
    """
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    tmp = _new_dir(parent, ".tmp-" + os.path.basename(path) + "-")
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if os.path.lexists(path):
        old = _new_dir(parent, ".old-")
        os.rmdir(old)  # only its unique name is needed: the current `path` moves there
        os.replace(path, old)
    os.replace(tmp, path)
    if old:
        _remove(old)


@contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """Yields a temp file path (same suffix, same directory) that is renamed to ``path`` on success.

    The writer creates the file itself (e.g. Keras ``model.save``). Whatever mode it gives the
    file (a copy of a private 0600 scratch file keeps 0600), the artifact gets the mode the umask
    gives (0644 under umask 022).
    """
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp, fd = _new_file(directory, suffix=os.path.splitext(path)[1])
    mode = os.fstat(fd).st_mode & 0o7777  # 0666 minus the umask: what a plain open() gives
    os.close(fd)
    os.unlink(tmp)  # writers (e.g. Keras) create the file themselves
    try:
        yield tmp
        if os.path.isfile(tmp) and not os.path.islink(tmp):
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    finally:
        if os.path.lexists(tmp):
            _remove(tmp)


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        os.unlink(path)


def tree_digest(path: str) -> str:
    """The sha256 of a file, or of a directory's files (relative names and contents, in sorted order)."""
    h = hashlib.sha256()
    if not os.path.isdir(path):
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        return h.hexdigest()
    for root, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(files):
            full = os.path.join(root, name)
            h.update(os.path.relpath(full, path).encode() + b"\0" + tree_digest(full).encode())
    return h.hexdigest()
