"""Atomic artifact writes: a crash never leaves a half-written file or directory in place."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np


def _default(obj: Any) -> Any:
    # Keras hands callbacks numpy scalars (e.g. epoch numbers after a resume are numpy.int64).
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def write_bytes(path: str, data: bytes) -> None:
    """Writes ``data`` to ``path`` atomically (temp file in the same directory, fsync, rename)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
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

    On an exception the temp directory is removed and ``path`` is left as it was.
    """
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".tmp-" + os.path.basename(path) + "-", dir=parent)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if os.path.exists(path):
        old = tempfile.mkdtemp(prefix=".old-", dir=parent)
        os.rmdir(old)
        os.replace(path, old)
    os.replace(tmp, path)
    if old:
        shutil.rmtree(old, ignore_errors=True) if os.path.isdir(old) else os.unlink(old)


@contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """Yields a temp file path (same suffix, same directory) that is renamed to ``path`` on success."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=os.path.splitext(path)[1], dir=directory)
    os.close(fd)
    os.unlink(tmp)  # writers (e.g. Keras) create the file themselves
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
