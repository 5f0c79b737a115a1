"""The sidecar evaluator: the ``evaluator`` task evaluates each new backup while training runs.

Like ``keras.utils.SidecarEvaluator``, but over tfopt's backups: the evaluator builds the same
model as the training tasks, then polls the chief's backup directory; every new backup (oldest
first, as long as the chief keeps it) is restored into its own copy and evaluated on the held-out
split. The workers never wait for it.
Each evaluation is printed, appended to ``evaluator.json`` in the run's work directory and written
as TensorBoard scalars (``tensorboard/evaluator``, x axis = the training step). The evaluator stops
after the backup of the last step, or when the chief has committed the run.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

from tfopt.core._keras import keras, tf

from tfopt.core.fileio import write_json

log = logging.getLogger(__name__)


def evaluate_backups(
    model: keras.Model,
    directory: str,
    evaluate: Callable[[], dict],
    *,
    final_step: int,
    out_dirs: tuple[str, str],
    finished: Callable[[], bool],
    poll: float = 1.0,
    prog: str = "tfopt",
) -> list[dict]:
    """Evaluates every new backup in ``directory`` until the one at ``final_step`` (or ``finished()``).

    Args:
        model: A compiled model of the trained architecture (its weights are overwritten).
        directory: The chief's backup directory of this ``fit``.
        evaluate: Evaluates ``model``'s current weights on the held-out split: ``{"loss": ..., ...}``.
        final_step: The global step of the last backup of this ``fit``.
        out_dirs: The run's work directory and final directory: ``evaluator.json`` and
            ``tensorboard/evaluator`` go to the first that exists (the chief may commit meanwhile).
        finished: True once training is over without a backup at ``final_step`` (e.g. committed).
        poll: Seconds between looks at ``directory``.
        prog: Prefix of the printed lines.

    Returns:
        One row per evaluated backup: ``{"step": ..., "loss": ..., "accuracy": ...}``.
    """
    step = tf.Variable(0, dtype=tf.int64, trainable=False)
    checkpoint = tf.train.Checkpoint(model=model, step=step)
    rows: list[dict] = []
    last = -1
    while True:
        fresh = [(n, p) for n, p in _backups(directory) if n > last]
        for number, path in fresh:  # oldest first: every backup still there gets evaluated
            last = number
            try:
                checkpoint.restore(path).expect_partial()
            except (
                tf.errors.NotFoundError,
                tf.errors.DataLossError,
            ):  # pruned or committed meanwhile
                continue
            metrics = evaluate()
            row = {"step": int(step.numpy()), **{k: round(float(v), 6) for k, v in metrics.items()}}
            rows.append(row)
            _write(rows, metrics, out_dirs)
            log.info(
                f"evaluator: step {row['step']} "
                + " ".join(f"{k}={v:.4f}" for k, v in metrics.items()),
                extra={"prog": prog},
            )
            if row["step"] >= final_step:
                return rows
        if not fresh and finished():
            return rows
        if not fresh:
            time.sleep(poll)


def _backups(directory: str) -> list[tuple[int, str]]:
    """(number, path) of the backups ``directory`` lists, oldest first (the number is the step)."""
    state = tf.train.get_checkpoint_state(directory) if os.path.isdir(directory) else None
    out = []
    for path in state.all_model_checkpoint_paths if state else []:
        try:
            out.append((int(path.rsplit("-", 1)[1]), path))
        except (IndexError, ValueError):
            continue
    return sorted(out)


def _write(rows: list[dict], metrics: dict, out_dirs: tuple[str, str]) -> None:
    out_dir = next((d for d in out_dirs if os.path.isdir(d)), None)
    if out_dir is None:
        return
    write_json(os.path.join(out_dir, "evaluator.json"), rows)
    writer = tf.summary.create_file_writer(os.path.join(out_dir, "tensorboard", "evaluator"))
    with writer.as_default(step=rows[-1]["step"]):
        for name, value in metrics.items():
            tf.summary.scalar(f"evaluation_{name}", float(value))
    writer.close()
