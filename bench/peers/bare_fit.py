"""Peer of B7 (framework overhead): a bare tf_keras ``model.fit`` on NumPy arrays.

The recipe is the first end-to-end example of the Keras guide "Training & evaluation with the
built-in methods" (fchollet; https://keras.io/guides/training_with_built_in_methods/), which is
also what a beginner's MNIST fit looks like. As that guide does it:

1. MNIST as NumPy arrays: images as float32 scaled to [0, 1], integer labels; 10,000 training
   images held out as the validation set (here: tfopt's own split of the official 60k into 50k
   train + 10k validation, read back as arrays, so both sides see the very same numbers).
2. A functional model, compiled with an optimizer, ``SparseCategoricalCrossentropy`` and an
   accuracy metric.
3. ``model.fit(x_train, y_train, batch_size=..., epochs=..., validation_data=(x_val, y_val))``:
   Keras slices the arrays into batches, reshuffles them every epoch and evaluates the
   validation arrays at each epoch end.

What is held equal to the tfopt run it is compared with (so that only the framework differs):
the architecture (built by tfopt's model registry) and its initial weights (the same global
seed before the build, checked by a weights digest), the optimizer (Adam with the same cosine
decay to 0 over all steps), the loss, the metric, the global batch and the steps per epoch (the
training arrays are cut to a whole number of batches: tfopt drops the last partial batch of
every pass), the strategy (tfopt's own factory, so ``mirrored`` is the same 2 logical CPU
devices with ``ReductionToOneDevice``) and the precision policy. Two settings: Keras' defaults
(one step per ``tf.function`` call) and ``steps_per_execution`` equal to tfopt's.
"""

from __future__ import annotations

from collections.abc import Sequence

from tfopt.core._keras import keras

import numpy as np

from tfopt.config import DataConfig, RuntimeConfig
from tfopt.data import pipeline, sources
from tfopt.models.registry import build_model
from tfopt.runtime import strategy as strategy_lib


def load_arrays(data: DataConfig) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], tuple, int]:
    """The training and validation splits as NumPy arrays, read through tfopt's data layer.

    Returns:
        ``({"train": (x, y), "validation": (x, y)}, image_shape, num_classes)``; images float32
        in [0, 1] of shape ``[N, H, W, C]``, labels int64.
    """
    info = sources.prepare(data)
    out = {}
    for split in ("train", "validation"):
        xs, ys = [], []
        for xb, yb in pipeline.make_dataset(data, split, training=False, info=info):
            xs.append(xb.numpy())
            ys.append(yb.numpy())
        out[split] = (np.concatenate(xs), np.concatenate(ys))
    return out, tuple(info.image_shape), info.num_classes


def whole_batches(x: np.ndarray, y: np.ndarray, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """The first ``len(x) // batch_size * batch_size`` examples: every step a full batch, as tfopt's."""
    n = len(x) // batch_size * batch_size
    return x[:n], y[:n]


def make_strategy(name: str, cpu_replicas: int = 2):
    """The strategy, from tfopt's own factory (``mirrored`` without GPUs: ``cpu_replicas`` logical CPU
    devices and ``ReductionToOneDevice``). Call it first: it splits the CPU before TensorFlow starts."""
    return strategy_lib.make_strategy(RuntimeConfig(strategy=name, cpu_replicas=cpu_replicas), None)


def build(
    strategy,
    *,
    precision: str,
    model_name: str,
    image_shape: Sequence[int],
    num_classes: int,
    dropout: float,
    seed: int,
    learning_rate: float,
    total_steps: int,
    steps_per_execution: int | None,
):
    """Sets the precision policy and the global seed, then builds and compiles the model in ``strategy``'s scope.

    Args:
        steps_per_execution: None = Keras' default (one step per ``tf.function`` call).

    Returns:
        The compiled model.
    """
    keras.mixed_precision.set_global_policy(precision)
    keras.utils.set_random_seed(seed)
    with strategy.scope():
        model = build_model(model_name, image_shape, num_classes, dropout)
        schedule = keras.optimizers.schedules.CosineDecay(
            learning_rate, decay_steps=max(1, total_steps)
        )
        extra = {} if steps_per_execution is None else {"steps_per_execution": steps_per_execution}
        model.compile(
            optimizer=keras.optimizers.Adam(schedule),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            **extra,
        )
    return model


def fit(
    model, arrays: dict, *, batch_size: int, epochs: int, callbacks: Sequence = (), verbose="auto"
):
    """The guide's ``fit``: NumPy arrays in, validation arrays evaluated at each epoch end."""
    x, y = whole_batches(*arrays["train"], batch_size)
    return model.fit(
        x,
        y,
        batch_size=batch_size,
        epochs=epochs,
        validation_data=arrays["validation"],
        callbacks=list(callbacks),
        verbose=verbose,
    )
