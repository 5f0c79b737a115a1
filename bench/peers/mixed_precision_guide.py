"""Peer of B2 (mixed precision): the recipe of TensorFlow's "Mixed precision" guide.

The guide (TensorFlow Core guide "Mixed precision", https://www.tensorflow.org/guide/mixed_precision)
trains with the Keras mixed precision API in these steps, which this module follows with tf_keras:

1. Set the global dtype policy by name (``mixed_precision.set_global_policy('mixed_float16')``;
   the guide names ``mixed_bfloat16`` for TPUs, and on a CPU that is the one with hardware
   support): every layer created afterwards computes in 16 bits and keeps float32 variables.
2. Build the model; end it with the logits layer followed by a separate softmax layer created
   with ``dtype='float32'``, so that the softmax and the model's output are float32.
3. Compile with ``'sparse_categorical_crossentropy'`` on those probabilities, ``RMSprop()`` and an
   accuracy metric. MNIST comes as NumPy arrays, cast to float32 and divided by 255 on the CPU
   (not in 16 bits: CPUs run that math slower).
4. ``model.fit(x_train, y_train, batch_size=..., epochs=..., validation_...)`` (``fit`` applies
   loss scaling itself under ``mixed_float16``), then ``model.evaluate`` on the test arrays; the
   guide compares the time per step against the same script run with the ``float32`` policy.

Differences, each so that only the recipe differs from the tfopt side it is compared with: the
architecture is the same registered model as tfopt's (built by a function the caller passes, the
guide's own toy is a two-layer MLP); the batch size is the tfopt side's (the guide's 8,192 is
sized for its GPU toy model); the guide holds out ``validation_split=0.2`` of the training arrays,
here tfopt's validation split plays that role so both sides train on the very same images; the
time per step is read from the training batches of every epoch after the first (the guide reads
Keras' progress bar), without the validation pass.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from tfopt.core._keras import keras

import numpy as np

from tfopt.config import DataConfig
from tfopt.data import pipeline, sources


def load_arrays(data: DataConfig) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], tuple, int]:
    """The train, validation and test splits as NumPy arrays, read through tfopt's data layer.

    tfopt's pipeline yields what the guide's step 3 makes: float32 images in [0, 1] (pixels / 255)
    and integer labels.

    Returns:
        ``({split: (x, y)}, image_shape, num_classes)``.
    """
    info = sources.prepare(data)
    out = {}
    for split in ("train", "validation", "test"):
        xs, ys = [], []
        for xb, yb in pipeline.make_dataset(data, split, training=False, info=info):
            xs.append(np.asarray(xb, np.float32))
            ys.append(np.asarray(yb))
        out[split] = (np.concatenate(xs), np.concatenate(ys))
    return out, tuple(info.image_shape), info.num_classes


class TrainTimer(keras.callbacks.Callback):
    """Seconds of each epoch's training batches: from the epoch's start to its last batch (no validation)."""

    def __init__(self):
        super().__init__()
        self.seconds: list[float] = []
        self._start = self._last = 0.0

    def on_epoch_begin(self, epoch, logs=None):
        self._start = self._last = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self._last = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.seconds.append(self._last - self._start)


def train(
    policy: str,
    build_logits: Callable[[tuple, int], keras.Model],
    arrays: dict,
    *,
    image_shape: tuple,
    num_classes: int,
    batch_size: int,
    epochs: int,
    seed: int,
) -> dict:
    """Trains one model the guide's way under ``policy`` and scores it on the test arrays.

    Args:
        policy: The global dtype policy (``float32``, ``mixed_bfloat16``, ``mixed_float16``).
        build_logits: ``(image_shape, num_classes) -> keras.Model`` returning logits.
        arrays: :func:`load_arrays`' splits.
        image_shape: One image's shape.
        num_classes: Number of classes.
        batch_size: Examples per step.
        epochs: Passes over the training arrays.
        seed: The global seed set before the model is built (weights, shuffling, dropout).

    Returns:
        ``{"policy", "epoch_seconds", "steps_per_epoch", "examples_per_sec" (epochs after the
        first), "test_accuracy", "output_dtype"}``. The global policy is float32 again afterwards.
    """
    keras.mixed_precision.set_global_policy(policy)  # step 1
    try:
        keras.utils.set_random_seed(seed)
        body = build_logits(image_shape, num_classes)  # step 2: layers created under the policy
        probs = keras.layers.Activation("softmax", dtype="float32", name="predictions")(body.output)
        model = keras.Model(body.input, probs)
        model.compile(
            loss="sparse_categorical_crossentropy",
            optimizer=keras.optimizers.RMSprop(),  # step 3
            metrics=["accuracy"],
        )
        (x, y), val = arrays["train"], arrays["validation"]
        timer = TrainTimer()
        model.fit(
            x,
            y,
            batch_size=batch_size,
            epochs=epochs,
            validation_data=val,
            callbacks=[timer],
            verbose=0,
        )  # step 4
        _, accuracy = model.evaluate(*arrays["test"], batch_size=batch_size, verbose=0)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    steps = -(-len(x) // batch_size)
    steady = timer.seconds[1:] or timer.seconds  # the first epoch traces
    return {
        "policy": policy,
        "epoch_seconds": [round(s, 4) for s in timer.seconds],
        "steps_per_epoch": steps,
        "examples_per_sec": round(len(x) / float(np.median(steady)), 1),
        "test_accuracy": float(accuracy),
        "output_dtype": model.output.dtype.name,
    }
