"""Where a stage writes: a work directory while it runs, one atomic rename when it is done.

A stage never writes into its final run directory in place. The chief works in
``<run>.partial/`` (backups, metrics so far, TensorBoard logs), then writes the model and
``run.json`` there and renames the whole directory to ``<run>``: a crash leaves either the new
run or the previous one, never an old ``run.json`` beside new metrics, and the next start
finishes or undoes a commit a crash interrupted (:meth:`RunDir.recover`). ``--overwrite``
replaces only a directory that holds a run. The work directory carries
the fingerprint of the config that made it; re-running the same command resumes from its
backup, a different config is refused unless the user asks to start over (``--overwrite``).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable

from tfopt.core.errors import ConfigError
from tfopt.core.fileio import write_json, write_text
from tfopt.core.runlock import Locked, RunLock
from tfopt.runs import PARTIAL_SUFFIX, RunRecord, update_latest

FINGERPRINT_FILE = "fingerprint.json"
OLD_SUFFIX = ".old"  # the previous run while a commit replaces it
# Written into a run just before a commit renames it to <run>.old: only a <run>.old holding it is
# tfopt's to restore or delete; anything else of that name is the user's and is left alone.
REPLACED_MARKER = ".tfopt-replaced"
_LEFTOVERS = (
    "backup",
    FINGERPRINT_FILE,
)  # what a finished run must not carry (it is never resumed)


def _differences(old: dict, new: dict, prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: {a!r} -> {b!r}")
    return out


def config_yaml(record: RunRecord) -> str:
    """The text of a run's ``config.yaml``: its resolved config, headed by how to rerun it."""
    import yaml

    how = f"tfopt {record.stage} --config config.yaml -o NEW_RUN"
    if record.stage != "train":
        how += f" plus the stage's own flags (run.json, section {record.stage!r})"
    return (
        f"# The resolved config of this {record.stage} run. Rerun it with\n#   {how}\n"
        + yaml.safe_dump(record.config, sort_keys=False)
    )


class RunDir:
    """A run directory being made.

    Args:
        path: The final run directory.
        fingerprint: Digest of what determines the result (see :func:`tfopt.runs.fingerprint`).
        described: The settings behind the fingerprint, as plain data (named in a mismatch error).
        overwrite: Replace a finished run at ``path`` and discard a mismatching work directory.
        chief: Only the chief creates, writes, locks and commits.
        cluster: The multi-worker cluster's id (recorded in the lock; None for one process).
        pick: For a default name: picks the next free directory when another run took this one.
    """

    def __init__(
        self,
        path: str,
        fingerprint: str,
        described: dict,
        *,
        overwrite: bool = False,
        chief: bool = True,
        cluster: str | None = None,
        pick: Callable[[], str] | None = None,
    ):
        self.fingerprint = fingerprint
        self.described = described
        self.overwrite = overwrite
        self.chief = chief
        self.cluster = cluster
        self.pick = pick
        self._at(path)

    def _at(self, path: str) -> None:
        self.path = os.path.abspath(path)
        self.work = self.path + PARTIAL_SUFFIX
        self.lock = RunLock(self.path, {"cluster": self.cluster})

    def _lock(self) -> None:
        """The chief locks the directory; a default name (``pick``) moves on to the next free one."""
        for _ in range(8):
            try:
                self.lock.acquire()
                return
            except Locked as e:
                if self.pick is None:
                    raise ConfigError(
                        f"-o {self.path!r} is being written by another run ({e.describe()}); wait for "
                        "it to finish or give another -o (--overwrite never replaces a live run)"
                    ) from None
                self._at(self.pick())
        raise ConfigError(
            f"no free run directory near {self.path!r}: every name is being written; give -o"
        )

    def release(self) -> None:
        """Drops the directory's lock (after a commit, or when the run ends without one)."""
        self.lock.release()

    def check(self) -> None:
        """Refuses, before any work, to replace a finished run or resume a different config.

        The chief first locks the directory (:mod:`tfopt.core.runlock`) for the rest of the run and
        finishes a commit a crash interrupted (:meth:`recover`).

        Raises:
            ConfigError: another live run is writing ``path`` (a default name moves on to the
                next free one instead), ``path`` holds a finished run (without ``overwrite``)
                or a directory that is not a run, or the work directory was made by another config.
        """
        if os.path.isfile(self.path):
            raise ConfigError(f"-o {self.path!r} is a file; give a directory")
        if self.chief:
            self._lock()
        try:
            self._refuse()
        except BaseException:
            self.release()
            raise

    def _refuse(self) -> None:
        recovered = self.recover() if self.chief else None
        foreign = os.path.lexists(self._old) and not self._ours(self._old)
        kept = (
            f" ({self._old!r} beside it was left alone: tfopt did not make it)" if foreign else ""
        )
        if os.path.exists(os.path.join(self.path, "run.json")) and not self.overwrite:
            raise ConfigError(
                f"-o {self.path!r} holds a finished run{recovered or ''}{kept}; give another -o, "
                "or --overwrite to replace it"
            )
        if foreign and os.path.lexists(self.path):
            raise ConfigError(
                f"replacing {self.path!r} needs the name {self._old!r}, which holds something "
                "tfopt did not make; move it away, or give another -o"
            )
        if os.path.isdir(self.work) and os.listdir(self.work) and self._stored() is None:
            raise ConfigError(
                f"{self.work!r} is not a tfopt work directory (no {FINGERPRINT_FILE}), which tfopt "
                "never deletes; move it away, or give another -o"
            )
        if (
            os.path.isdir(self.path)
            and os.listdir(self.path)
            and not os.path.exists(os.path.join(self.path, "run.json"))
        ):
            raise ConfigError(
                f"-o {self.path!r} is a non-empty directory that is not a tfopt run (no run.json), "
                "which --overwrite never replaces; give another -o"
            )
        stored = self._stored()
        if (
            stored is not None
            and stored.get("fingerprint") != self.fingerprint
            and not self.overwrite
        ):
            changed = _differences(stored.get("settings", {}), self.described)
            raise ConfigError(
                f"{self.work!r} holds an unfinished run made with other settings ({'; '.join(changed[:4]) or 'unknown'})"
                "; re-run with the same settings to resume it, or add --overwrite to start over"
            )

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
            shutil.rmtree(self.work)  # a stamped work directory of other settings (see _refuse)
        os.makedirs(self.work, exist_ok=True)
        write_json(
            os.path.join(self.work, FINGERPRINT_FILE),
            {"fingerprint": self.fingerprint, "settings": self.described},
        )

    def commit(self, record: RunRecord) -> str:
        """Writes ``run.json`` and ``config.yaml`` into the work directory and renames it into place
        (chief only).

        ``config.yaml`` is the run's resolved config, which ``--config`` takes back: the same
        command with ``--config <run>/config.yaml`` (and another ``-o``) makes the run again.

        The artifacts must already be in :attr:`work`. The order keeps every state a crash can
        leave recoverable (:meth:`recover`): ``run.json`` is written, the previous run (if any)
        is renamed to ``<run>.old``, the work directory to ``<run>``; only then are the backups,
        the fingerprint stamp and ``<run>.old`` removed, so a finished run is never "resumed"
        and a kill never costs the finished model.

        Returns:
            The run directory.
        """
        if record.config:
            write_text(os.path.join(self.work, "config.yaml"), config_yaml(record))
        write_json(os.path.join(self.work, "run.json"), record.to_dict())
        path = self._move_into_place()
        self.release()
        return path

    def recover(self) -> str | None:
        """Finishes or undoes what a crash during a commit left (chief only; :meth:`check` calls it).

        - a work directory holding ``run.json``: the commit is finished;
        - no run but a ``<run>.old`` holding one: the previous run is restored;
        - a committed run with backups, a stamp or a ``<run>.old`` beside it: they are removed.

        Returns:
            What was done, as a clause for a message (None when nothing was left).
        """
        if os.path.exists(os.path.join(self.work, "run.json")):
            self._move_into_place()
            return " (an interrupted commit of it was finished)"
        if (
            not os.path.lexists(self.path)
            and self._ours(self._old)
            and os.path.exists(os.path.join(self._old, "run.json"))
        ):
            os.replace(self._old, self.path)
            os.unlink(os.path.join(self.path, REPLACED_MARKER))
            return " (restored from an interrupted replacement)"
        if os.path.exists(os.path.join(self.path, "run.json")) and (
            os.path.lexists(self._old)
            or any(
                os.path.lexists(os.path.join(self.path, n)) for n in (*_LEFTOVERS, REPLACED_MARKER)
            )
        ):
            self._clean_up()
        return None

    @property
    def _old(self) -> str:
        return self.path + OLD_SUFFIX

    @staticmethod
    def _ours(old: str) -> bool:
        """A ``<run>.old`` that a commit of tfopt's made: it holds the replacement marker (removed
        last when it is deleted, so a crash mid-way leaves it recognisable)."""
        return not os.path.islink(old) and os.path.isfile(os.path.join(old, REPLACED_MARKER))

    @staticmethod
    def _remove_old(old: str) -> None:
        for name in os.listdir(old):
            if name != REPLACED_MARKER:
                target = os.path.join(old, name)
                if os.path.isdir(target) and not os.path.islink(target):
                    shutil.rmtree(target)
                else:
                    os.unlink(target)
        os.unlink(os.path.join(old, REPLACED_MARKER))
        os.rmdir(old)

    def _move_into_place(self) -> str:
        if os.path.lexists(self.path):
            if self._ours(self._old):
                self._remove_old(self._old)
            elif os.path.lexists(self._old):
                raise ConfigError(
                    f"replacing {self.path!r} needs the name {self._old!r}, which holds something "
                    "tfopt did not make; move it away, then run again to finish"
                )
            write_json(os.path.join(self.path, REPLACED_MARKER), {"replaced_by": self.work})
            os.replace(self.path, self._old)  # refused earlier when a foreign <run>.old is there
        os.replace(self.work, self.path)
        self._clean_up()
        return self.path

    def _clean_up(self) -> None:
        """Removes what a commit leaves: the backups and the stamp of tfopt's work directory (only
        beside that stamp: a ``backup`` of the user's in a finished run stays), and tfopt's
        ``<run>.old``."""
        stamp = os.path.join(self.path, FINGERPRINT_FILE)
        if _is_stamp(stamp):
            for leftover in _LEFTOVERS:  # the stamp last: a crash here leaves it to find again
                target = os.path.join(self.path, leftover)
                if os.path.isdir(target) and not os.path.islink(target):
                    shutil.rmtree(target)
                elif os.path.lexists(target):
                    os.unlink(target)
        if self._ours(self._old):
            self._remove_old(self._old)
        if os.path.lexists(os.path.join(self.path, REPLACED_MARKER)):  # a crash before the rename
            os.unlink(os.path.join(self.path, REPLACED_MARKER))
        update_latest(self.path)


def _is_stamp(path: str) -> bool:
    """Whether ``path`` is the fingerprint stamp :meth:`RunDir.open` writes."""
    try:
        with open(path, encoding="utf-8") as f:
            return "fingerprint" in json.load(f)
    except (OSError, ValueError, TypeError):
        return False
