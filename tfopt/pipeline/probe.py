"""Is training waiting for its input? The input pipeline alone vs the teacher's training step.

Three timings on this machine, after warm-up: batches of the training input stream alone
(examples/s the pipeline can deliver); the teacher's training step fed by that stream; and the
same step fed one cached batch over and over (no input work: the tf.data performance guide's
"synthetic data" control). The input-bound fraction is the share of the real step the
synthetic one does not need: ``max(0, 1 - synthetic / real)``.
"""

from __future__ import annotations

import time

from tfopt.core._keras import keras

from tfopt.config import RunConfig
from tfopt.core._compat import build_step_state
from tfopt.data.pipeline import make_dataset
from tfopt.data.sources import prepare
from tfopt.models.io import load_model
from tfopt.runs import load_run


def _input_rate(dataset, steps: int, warmup: int, batch: int) -> float:
    it = iter(dataset)
    for _ in range(warmup):
        next(it)
    start = time.perf_counter()
    for _ in range(steps):
        next(it)
    return steps * batch / (time.perf_counter() - start)


class _EpochTimes(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.times: list[float] = []

    def on_epoch_begin(self, epoch, logs=None):
        self._t0 = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.times.append(time.perf_counter() - self._t0)


def _step_ms(model, dataset, steps: int) -> float:
    timer = _EpochTimes()
    model.fit(dataset, epochs=2, steps_per_epoch=steps, verbose=0, callbacks=[timer])
    return 1000 * timer.times[1] / steps  # the first epoch warms up (and traces, on the first call)


def measure(cfg: RunConfig, teacher_dir: str, *, steps: int = 32, warmup: int = 8) -> dict:
    """Times the input pipeline and the teacher's training step with real and with synthetic input.

    Args:
        cfg: The pipeline's base RunConfig (its learning rate; the data are the teacher run's).
        teacher_dir: The teacher's run directory.
        steps: Timed batches per measurement.
        warmup: Batches before the input timing starts.

    Returns:
        ``input_examples_per_sec``, ``train_examples_per_sec``, ``step_ms_real``,
        ``step_ms_synthetic``, ``input_bound_fraction``, ``batch``, ``steps``, ``device``.
    """
    teacher = load_run(teacher_dir)
    data = (
        teacher.config.data
    )  # the teacher's input: its model's own scaling (data.normalize) included
    info = prepare(data)
    batch = data.global_batch_size
    stream = make_dataset(data, "train", training=True, info=info)
    input_rate = _input_rate(stream, steps, warmup, batch)
    synthetic = stream.take(1).cache().repeat()
    # One compiled model for both: the same traced step, fed by one stream or the other.
    model = load_model(teacher.model_path)
    model.compile(
        optimizer=keras.optimizers.Adam(cfg.train.learning_rate),
        steps_per_execution=steps,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    build_step_state(model)  # one trace of the step, not two
    real_ms = _step_ms(model, stream, steps)
    synthetic_ms = _step_ms(model, synthetic, steps)
    return {
        "input_examples_per_sec": round(input_rate, 1),
        "train_examples_per_sec": round(1000 * batch / real_ms, 1),
        "step_ms_real": round(real_ms, 2),
        "step_ms_synthetic": round(synthetic_ms, 2),
        "input_bound_fraction": round(max(0.0, 1.0 - synthetic_ms / real_ms), 4),
        "batch": batch,
        "steps": steps,
        "device": "one device, the default strategy",
    }
