"""Backups every N steps and at each epoch end, exact resume, preemption and the NaN guard.

One mechanism for every strategy (Keras' ``BackupAndRestore`` refuses OneDeviceStrategy, loses
the data position mid-epoch and writes nothing mid-epoch under ParameterServerStrategy):

- **What is saved:** the model (weights, optimizer slots and step, loss scale, pruning steps,
  QAT ranges, dropout RNG state when ``runtime.deterministic`` makes it a variable), the global
  step and the learning-rate scale of the NaN guard, as a TensorFlow checkpoint ``ckpt-<step>``.
  With backups every N steps it is written by a compiled ``tf.train.Checkpoint.write`` (traced
  at the first backup, ~0.1 s; an eager write walks the object graph in Python every time: 20-30
  ms for ``cnn`` and its Adam state against 5 ms); epoch-end backups alone are written eagerly.
  The checkpoint lands under a temporary name and is renamed, then the ``checkpoint`` state file
  is replaced atomically (paths relative to its directory), then older backups are deleted: a
  write killed halfway leaves the previous backup restorable; the two newest are kept. Stale
  ``*_temp`` debris of a killed write is removed when a run opens its backups.
- **Who writes:** the chief, into the run's work directory (shared storage on a cluster: every
  worker restores from it). Other MultiWorkerMirrored workers write the same checkpoint into a
  scratch directory and delete it (saving may all-reduce sync-on-read variables: every worker
  must take part).
- **Resume:** ``restore()`` loads the newest backup and returns its global step; the Job starts
  the input stream there (see :mod:`tfopt.data.pipeline`) and ``fit`` continues at that epoch and
  step, so the run goes on as if never stopped.
- **Preemption:** SIGTERM sets a flag; at the next step boundary (every worker agrees under
  MultiWorkerMirrored) a backup is written and :class:`~tfopt.core.errors.Preempted` raised: the
  command exits 143, and a restart loses no step.
- **NaN guard:** a non-finite loss (or non-finite weights about to be backed up) raises
  :class:`NonFinite`; weights that are not finite are never backed up. The Job rolls back.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal

from tfopt.core._keras import keras, tf

import numpy as np

from tfopt.core import _compat
from tfopt.core.errors import Preempted, TfoptError, TrainingError
from tfopt.core.fileio import write_text

KEEP = 2  # backups kept: the newest may be the one a kill interrupted


class NonFinite(Exception):
    """The loss or the weights became NaN or Inf at global step ``step``."""

    def __init__(self, step: int, what: str):
        super().__init__(f"{what} is not finite at step {step}")
        self.step, self.what = step, what


def remove_debris(directory: str) -> None:
    """Removes the temporary files of checkpoint writes that were killed halfway."""
    for path in glob.glob(os.path.join(glob.escape(directory), "*_temp*")):
        shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) else os.unlink(path)


def finite(model: keras.Model) -> bool:
    """True when every weight of ``model`` is finite."""
    return all(
        np.isfinite(w).all() for w in model.get_weights() if np.issubdtype(w.dtype, np.floating)
    )


def _reason(error: Exception) -> str:
    """The line of an OS or TensorFlow error that says what went wrong.

    A compiled op's error starts with "Graph execution error:" and the op's traceback; the reason
    is the line before the ``[[{{node ...}}]]`` marker.
    """
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    lines = [
        ln.strip()
        for ln in (getattr(error, "message", None) or str(error)).splitlines()
        if ln.strip()
    ]
    marker = next((i for i, ln in enumerate(lines) if ln.startswith("[[")), None)
    return lines[marker - 1] if marker else (lines[0] if lines else type(error).__name__)


class Backup(keras.callbacks.Callback):
    """Backs up a model during ``fit`` and restores it before (see the module docstring).

    Args:
        model: The compiled model ``fit`` trains.
        directory: Where backups live (the chief's; every worker restores from it).
        steps_per_epoch: Steps of one epoch.
        every: Also back up every this many steps (0: at epoch ends only).
        chief: This process writes ``directory``; others write ``scratch`` and delete it.
        scratch: A directory of this process's own.
        strategy: The distribution strategy (agreement on preemption, PS synchronisation).
        lr_scale: The optimizer's learning-rate scale variable (saved with the backup).
    """

    def __init__(
        self,
        model: keras.Model,
        directory: str,
        *,
        steps_per_epoch: int,
        every: int,
        chief: bool,
        scratch: str,
        strategy,
        lr_scale=None,
    ):
        super().__init__()
        _compat.accept_remote_logs(self)  # ParameterServerStrategy allows batch hooks only then
        self.directory, self.spe, self.every, self.chief = directory, steps_per_epoch, every, chief
        self.strategy = strategy
        self.ps = isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy)
        self.synced = (
            getattr(strategy.extended, "_num_workers", 1) > 1 and not self.ps
        )  # MultiWorkerMirrored
        self.step_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="backup_step")
        items = {"model": model, "step": self.step_var}
        with (
            strategy.scope()
        ):  # dropout's random state (a variable only under runtime.deterministic)
            items.update({f"rng{i}": g for i, g in enumerate(_compat.random_generators(model))})
        if lr_scale is not None:
            items["lr_scale"] = lr_scale
        self.checkpoint = tf.train.Checkpoint(**items)
        self.write_to = directory if chief else os.path.join(scratch, "backup-copy")
        if chief:
            os.makedirs(directory, exist_ok=True)
            remove_debris(directory)
        self._write = None  # the compiled checkpoint write, traced at the first backup
        self.epoch = 0
        self.saved_step = -1
        self.step = 0
        self._preempted = False
        self._previous_handler = None
        self._agree = None

    # -- restore ------------------------------------------------------------------------------

    def restore(self) -> int:
        """Restores the newest backup in :attr:`directory`; returns its global step (0: none)."""
        latest = tf.train.latest_checkpoint(self.directory)
        if latest is None:
            self.step = self.saved_step = 0
            return 0
        try:
            # Every object this run has already made must come from the backup: a model of another
            # shape, or a backup of another input, is refused instead of half restored. (read, not
            # restore: backups are written with write(), which keeps no save counter.)
            self.checkpoint.read(latest).expect_partial().assert_existing_objects_matched()
        except (AssertionError, ValueError) as e:  # unmatched objects; a variable of another shape
            raise TrainingError(
                f"the backup {latest!r} does not match this run's model ({str(e).splitlines()[0][:200]})"
                "; re-run with --overwrite to start over"
            ) from None
        self.step = self.saved_step = int(self.step_var.numpy())
        return self.step

    # -- fit hooks ------------------------------------------------------------------------------

    def on_train_begin(self, logs=None):
        self._preempted = False
        try:
            self._previous_handler = signal.signal(signal.SIGTERM, self._on_sigterm)
        except ValueError:  # not the main thread: preemption is then the launcher's business
            self._previous_handler = None

    def on_train_end(self, logs=None):
        self.release()

    def release(self) -> None:
        """Gives SIGTERM back to the handler that had it before ``fit`` (idempotent)."""
        if self._previous_handler is not None:
            signal.signal(signal.SIGTERM, self._previous_handler)
            self._previous_handler = None

    def _on_sigterm(self, signum, frame) -> None:
        self._preempted = True

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = int(epoch)

    def on_train_batch_end(self, batch, logs=None):
        self.step = self.epoch * self.spe + int(batch) + 1
        if not self.ps and logs and "loss" in logs and not np.isfinite(float(logs["loss"])):
            raise NonFinite(self.step, f"the loss ({float(logs['loss'])})")
        if self._should_stop():
            self.save()
            raise Preempted(
                f"stopped by SIGTERM at step {self.step}: backup written to {self.directory}; "
                "run the same command again to resume"
            )
        if self.every and self.step // self.every > self.saved_step // self.every:
            self.save()

    def on_epoch_end(self, epoch, logs=None):
        self.step = (int(epoch) + 1) * self.spe
        loss = (logs or {}).get("loss")
        if loss is not None and not np.isfinite(float(loss)):
            raise NonFinite(self.step, f"the loss ({float(loss)})")
        if self.step != self.saved_step:
            self.save()

    def _should_stop(self) -> bool:
        if not self.synced:
            return self._preempted
        if self._agree is None:  # one compiled all-reduce, reused at every step boundary
            strategy = self.strategy

            @tf.function
            def agree(flag):
                return strategy.reduce(
                    tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.identity(flag)), axis=None
                )

            self._agree = agree
        return bool(self._agree(tf.constant(1 if self._preempted else 0, tf.int32)).numpy())

    # -- save ---------------------------------------------------------------------------------

    def save(self) -> None:
        """Writes a backup at :attr:`step` (never of non-finite weights).

        Raises:
            NonFinite: the weights are not finite; nothing is written.
            TfoptError: the backup cannot be written; the previous one is intact.
        """
        if self.ps:  # let the steps already scheduled on the workers finish
            tf.distribute.experimental.coordinator.ClusterCoordinator(self.strategy).join()
        if not finite(self.model):
            raise NonFinite(self.step, "the weights")
        self.step_var.assign(self.step)
        try:
            self._write_files()
        except (OSError, tf.errors.OpError) as e:
            raise TfoptError(
                f"cannot write a backup to {self.directory} at step {self.step} "
                f"({_reason(e)}); free space or fix permissions there; "
                "the previous backup is intact"
            ) from None
        finally:
            if not self.chief:
                shutil.rmtree(self.write_to, ignore_errors=True)
        self.saved_step = self.step

    def _write_files(self) -> None:
        """Writes ``ckpt-<step>``, records it as the newest in the state file, keeps the ``KEEP`` newest."""
        name = f"ckpt-{self.step}"
        os.makedirs(
            self.write_to, exist_ok=True
        )  # a worker's scratch copy is deleted after each backup
        path = os.path.join(self.write_to, name)  # written under *_temp names, then renamed
        if not self.every:  # epoch-end backups only: too few to repay tracing the write (~0.1 s)
            self.checkpoint.write(path)
        else:
            if self._write is None:
                self._write = tf.function(self.checkpoint.write)
            self._write(tf.constant(path))
        state = tf.train.get_checkpoint_state(self.write_to)
        older = [os.path.basename(p) for p in (state.all_model_checkpoint_paths if state else [])]
        older = [n for n in older if n != name]
        kept = (older + [name])[-KEEP:]
        # The state file tf.train.latest_checkpoint reads, with paths relative to the directory.
        write_text(
            os.path.join(self.write_to, "checkpoint"),
            f'model_checkpoint_path: "{name}"\n'
            + "".join(f'all_model_checkpoint_paths: "{n}"\n' for n in kept),
        )
        for old in older[: len(older) + 1 - KEEP]:
            for file in glob.glob(
                os.path.join(glob.escape(self.write_to), glob.escape(old) + ".*")
            ):
                os.unlink(file)
