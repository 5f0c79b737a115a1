"""Where a stage writes: a work directory while it runs, one atomic rename when it is done.

A stage never writes into its final run directory in place. The chief works in
``<run>.partial/`` (backups, metrics so far, TensorBoard logs), then writes the model and
``run.json`` there and renames the whole directory to ``<run>``: a crash leaves either no run
or the previous one, never an old ``run.json`` beside new metrics. The work directory carries
the fingerprint of the config that made it; re-running the same command resumes from its
backup, a different config is refused unless the user asks to start over (``--overwrite``).
"""
from __future__ import annotations

import json
import os
import shutil

from tfopt.errors import ConfigError
from tfopt.fileio import write_json
from tfopt.runs import PARTIAL_SUFFIX, RunRecord, update_latest

FINGERPRINT_FILE = "fingerprint.json"


def _differences(old: dict, new: dict, prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: {a!r} -> {b!r}")
    return out


class RunDir:
    """A run directory being made.

    Args:
        path: The final run directory.
        fingerprint: Digest of what determines the result (see :func:`tfopt.runs.fingerprint`).
        described: The settings behind the fingerprint, as plain data (named in a mismatch error).
        overwrite: Replace a finished run at ``path`` and discard a mismatching work directory.
        chief: Only the chief creates, writes and commits.
    """

    def __init__(self, path: str, fingerprint: str, described: dict, *, overwrite: bool = False, chief: bool = True):
        self.path = os.path.abspath(path)
        self.work = self.path + PARTIAL_SUFFIX
        self.fingerprint = fingerprint
        self.described = described
        self.overwrite = overwrite
        self.chief = chief

    def check(self) -> None:
        """Refuses, before any work, to replace a finished run or resume a different config.

        Raises:
            ConfigError: ``path`` holds a finished run (without ``overwrite``), or the work
                directory was made by another config.
        """
        if os.path.isfile(self.path):
            raise ConfigError(f"-o {self.path!r} is a file; give a directory")
        if os.path.exists(os.path.join(self.path, "run.json")) and not self.overwrite:
            raise ConfigError(f"-o {self.path!r} holds a finished run; give another -o, or --overwrite to replace it")
        if os.path.isdir(self.path) and os.listdir(self.path) and not os.path.exists(
                os.path.join(self.path, "run.json")) and not self.overwrite:
            raise ConfigError(f"-o {self.path!r} is a non-empty directory that is not a tfopt run; give another -o, "
                              "or --overwrite to replace it")
        stored = self._stored()
        if stored is not None and stored.get("fingerprint") != self.fingerprint and not self.overwrite:
            changed = _differences(stored.get("settings", {}), self.described)
            raise ConfigError(
                f"{self.work!r} holds an unfinished run made with other settings ({'; '.join(changed[:4]) or 'unknown'})"
                "; re-run with the same settings to resume it, or add --overwrite to start over")

    @property
    def resuming(self) -> bool:
        """True when a work directory of this very config exists (a crashed run to resume)."""
        stored = self._stored()
        return stored is not None and stored.get("fingerprint") == self.fingerprint

    def _stored(self) -> dict | None:
        try:
            with open(os.path.join(self.work, FINGERPRINT_FILE), encoding="utf-8") as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def open(self) -> None:
        """The chief creates the work directory (discarding a mismatching one) and stamps it."""
        if not self.chief:
            return
        if os.path.isdir(self.work) and not self.resuming:
            shutil.rmtree(self.work)
        os.makedirs(self.work, exist_ok=True)
        write_json(os.path.join(self.work, FINGERPRINT_FILE),
                   {"fingerprint": self.fingerprint, "settings": self.described})

    def commit(self, record: RunRecord) -> str:
        """Writes ``run.json`` into the work directory and renames it into place (chief only).

        The artifacts must already be in :attr:`work`. Backups and the fingerprint stamp are
        removed first: a finished run is never "resumed".

        Returns:
            The run directory.
        """
        for leftover in ("backup", FINGERPRINT_FILE):
            target = os.path.join(self.work, leftover)
            if os.path.isdir(target):
                shutil.rmtree(target)
            elif os.path.exists(target):
                os.unlink(target)
        write_json(os.path.join(self.work, "run.json"), record.to_dict())
        old = None
        if os.path.lexists(self.path):
            old = self.path + ".old"
            if os.path.lexists(old):
                shutil.rmtree(old)
            os.replace(self.path, old)
        os.replace(self.work, self.path)
        if old:
            shutil.rmtree(old, ignore_errors=True)
        update_latest(self.path)
        return self.path
