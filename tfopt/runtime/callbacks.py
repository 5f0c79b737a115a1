"""Keras callbacks tfopt adds to every fit: per-epoch metrics files and epoch timing."""

from __future__ import annotations

import csv
import io
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor

from tfopt.core._keras import keras

from tfopt.core.fileio import write_json, write_text
from tfopt.runtime import sharding


class EpochTimer(keras.callbacks.Callback):
    """Records the wall time of every epoch (``self.seconds``)."""

    def __init__(self):
        super().__init__()
        self.seconds: list[float] = []
        self._start = 0.0

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.seconds.append(time.perf_counter() - self._start)


class MetricsLogger(keras.callbacks.Callback):
    """Writes ``metrics.csv`` and ``metrics.json`` (one row per epoch) atomically.

    Only the process that should write (the chief) gets ``enabled=True``. When training
    resumes from a backup, the rows of the epochs before the resumed one are read back from
    ``metrics.json``, so the history covers the whole run.
    """

    def __init__(
        self,
        out_dir: str,
        enabled: bool = True,
        timer: EpochTimer | None = None,
        first_epoch: int = 0,
    ):
        super().__init__()
        self.out_dir = out_dir
        self.timer = timer
        self.enabled = enabled
        self.first_epoch = (
            first_epoch  # epochs of the run before this fit (a later phase of one run)
        )
        self.rows: list[dict] = self._earlier_rows() if enabled else []

    def _earlier_rows(self) -> list[dict]:
        try:
            with open(os.path.join(self.out_dir, "metrics.json"), encoding="utf-8") as f:
                rows = json.load(f)
        except (OSError, ValueError):
            return []
        return [r for r in rows if isinstance(r, dict) and isinstance(r.get("epoch"), int)]

    def on_epoch_begin(self, epoch, logs=None):
        # Epochs from this one on are (re)run now; rows of a crashed attempt at them are dropped.
        self.rows = [r for r in self.rows if r["epoch"] <= self.first_epoch + int(epoch)]

    def on_epoch_end(self, epoch, logs=None):
        row = {"epoch": self.first_epoch + int(epoch) + 1}
        row.update({k: float(v) for k, v in (logs or {}).items()})
        if self.timer and self.timer.seconds:
            row["epoch_seconds"] = round(self.timer.seconds[-1], 4)
        self.rows = [r for r in self.rows if r["epoch"] < row["epoch"]] + [row]
        if not self.enabled:
            return
        keys = list(dict.fromkeys(k for r in self.rows for k in r))
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=keys)
        writer.writeheader()
        writer.writerows(self.rows)
        write_text(os.path.join(self.out_dir, "metrics.csv"), buf.getvalue())
        write_json(os.path.join(self.out_dir, "metrics.json"), self.rows)


class PlainValidation(keras.callbacks.Callback):
    """Validates a strategy-free copy of the model on one process at the end of every epoch.

    Distributed evaluation hands a replica an empty batch whenever the last partial batch is
    smaller than the per-replica batch, and oneDNN's CPU Conv2D mishandles empty batches in
    TF 2.21. Copying the weights into a plain model and evaluating the whole split in one
    process is exact under every strategy, parameter servers included. The evaluation runs in
    a helper thread because strategy scopes are thread-local and fit's scope is active here.

    Args:
        copy: The strategy-free, compiled model that is evaluated.
        dataset: The validation split.
        enabled: False on processes that only take part in reading the weights.
        weights_fn: Returns the weights for ``copy`` (default: the trained model's own, e.g.
            a Distiller passes its plain student's).
    """

    def __init__(self, copy: keras.Model, dataset, enabled: bool = True, weights_fn=None):
        super().__init__()
        self.copy = copy
        self.dataset = dataset
        self.enabled = enabled
        self.weights_fn = weights_fn

    def evaluate(self, model: keras.Model) -> dict:
        """Evaluates ``model``'s current weights (through ``weights_fn`` when given) on the split."""
        sharding.set_full_weights(
            self.copy, self.weights_fn() if self.weights_fn else sharding.full_weights(model)
        )
        with ThreadPoolExecutor(1) as pool:
            return pool.submit(
                self.copy.evaluate, self.dataset, return_dict=True, verbose=0
            ).result()

    def on_epoch_end(self, epoch, logs=None):
        # Every worker reads the weights: reading sync-on-read variables (batch-norm statistics)
        # under MultiWorkerMirroredStrategy is a collective all-reduce.
        weights = self.weights_fn() if self.weights_fn else sharding.full_weights(self.model)
        if not self.enabled or logs is None:
            return
        sharding.set_full_weights(self.copy, weights)
        with ThreadPoolExecutor(1) as pool:
            results = pool.submit(
                self.copy.evaluate, self.dataset, return_dict=True, verbose=0
            ).result()
        logs.update({f"val_{k}": float(v) for k, v in results.items()})
