"""Peer of benchmark B4: the recipe of tfmot's tutorial "Pruning in Keras example".

Tutorial: "Pruning in Keras example",
https://www.tensorflow.org/model_optimization/guide/pruning/pruning_with_keras
(tensorflow/model-optimization, ``g3doc/guide/pruning/pruning_with_keras.ipynb``).

What a user following it does to a trained MNIST model, step by step as the tutorial says (its
first step, training the float model 4 epochs, is the benchmark's: every side starts from the
same trained float model and the same training images):

1. Wraps the whole model with ``prune_low_magnitude``: ``PolynomialDecay`` from 50% to 80%
   sparsity, ``begin_step=0``, ``end_step = ceil(images * (1 - 0.1) / 128) * 2`` (the schedule
   reaches 80% at the last step of the fine-tuning), the schedule's default frequency (100).
2. Recompiles with ``optimizer='adam'`` (Adam, learning rate 1e-3), sparse categorical
   cross-entropy from logits, accuracy.
3. Fine-tunes 2 epochs, batch 128, ``validation_split=0.1``, with the ``UpdatePruningStep``
   callback (its ``PruningSummaries`` only writes TensorBoard logs and is left out).
4. ``strip_pruning``, then saves the Keras model as ``.h5`` without the optimizer.
5. Converts with ``TFLiteConverter.from_keras_model`` and ``optimizations = [Optimize.DEFAULT]``
   (post-training dynamic-range quantization: int8 weights, no representative dataset).
6. Measures sizes as the tutorial does: a zip (deflate) of each file, the gzipped baseline
   Keras ``.h5`` against the gzipped pruned + quantized ``.tflite`` (its "10x smaller").

The benchmark then scores the ``.tflite`` on the test split with the same evaluator as tfopt's
models and compresses every ``.tflite`` the same way (gzip -9) for the side-by-side ratio.
``prune=False`` runs the same fine-tuning and conversion without the pruning wrapper: the
equally trained float control of this recipe.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
import zipfile

from tfopt.core._keras import keras, tf

import numpy as np

TUTORIAL = 'tfmot "Pruning in Keras example" (pruning_with_keras)'
URL = "https://www.tensorflow.org/model_optimization/guide/pruning/pruning_with_keras"
BATCH_SIZE = 128
EPOCHS = 2
VALIDATION_SPLIT = 0.1
INITIAL_SPARSITY, FINAL_SPARSITY = 0.50, 0.80
FREQUENCY = (
    100  # PolynomialDecay's default: masks change at steps 100, 200, ... (tfmot counts from 1)
)


def fresh_copy(model: keras.Model) -> keras.Model:
    """A new model with ``model``'s architecture and weights (tfmot wraps models in place)."""
    copy = keras.models.clone_model(model)
    copy.set_weights(model.get_weights())
    return copy


def zipped_size(path: str) -> int:
    """The tutorial's ``get_gzipped_model_size``: bytes of a deflate zip archive holding ``path``."""
    with tempfile.TemporaryDirectory() as tmp:
        archive = os.path.join(tmp, "model.zip")
        with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as z:
            z.write(path, arcname=os.path.basename(path))
        return os.path.getsize(archive)


def h5_zipped_size(model: keras.Model) -> int:
    """Zipped bytes of ``model`` saved as Keras ``.h5`` without the optimizer (the tutorial's baseline)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.h5")
        keras.models.save_model(model, path, include_optimizer=False)
        return zipped_size(path)


def tflite_dynamic_range(model: keras.Model) -> bytes:
    """``TFLiteConverter.from_keras_model`` with ``Optimize.DEFAULT`` and no representative dataset."""
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    return converter.convert()


def tflite_zipped_size(content: bytes) -> int:
    """Zipped bytes of a ``.tflite`` file, as the tutorial measures it."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.tflite")
        with open(path, "wb") as f:
            f.write(content)
        return zipped_size(path)


def run(
    model: keras.Model,
    x_train: np.ndarray,
    y_train: np.ndarray,
    *,
    seed: int,
    prune: bool = True,
    epochs: int = EPOCHS,
    steps_per_epoch: int | None = None,
    frequency: int = FREQUENCY,
) -> dict:
    """Fine-tunes a copy of the trained ``model`` with the tutorial's pruning recipe.

    Args:
        model: The trained float model (left untouched).
        x_train: Training images, as the model takes them.
        y_train: Integer labels.
        seed: Seeds Keras (weight order of the shuffles, dropout).
        prune: False: the same fine-tuning without pruning (the recipe's float control).
        epochs: Fine-tuning epochs (the tutorial's 2; fewer only for smoke runs).
        steps_per_epoch: Caps the steps (smoke runs only); the schedule ends with them.
        frequency: Steps between mask updates (the tutorial's default 100; smoke runs: fewer).

    Returns:
        ``{"tflite": bytes, "sparsity", "fit_seconds", "tutorial_ratio", "h5_zip_bytes",
        "baseline_h5_zip_bytes", "tflite_zip_bytes"}``; ``tutorial_ratio`` is the tutorial's own
        figure (zipped baseline ``.h5`` / zipped pruned + quantized ``.tflite``).
    """
    import tensorflow_model_optimization as tfmot  # after tfopt.core._keras: the tf_keras flavour

    keras.utils.set_random_seed(seed)
    train_images = len(x_train) * (1 - VALIDATION_SPLIT)
    steps = steps_per_epoch or math.ceil(train_images / BATCH_SIZE)
    end_step = steps * epochs  # np.ceil(num_images / batch_size) * epochs in the tutorial
    work = fresh_copy(model)
    callbacks = []
    if prune:
        schedule = tfmot.sparsity.keras.PolynomialDecay(
            initial_sparsity=INITIAL_SPARSITY,
            final_sparsity=FINAL_SPARSITY,
            begin_step=0,
            end_step=end_step,
            frequency=frequency,
        )
        work = tfmot.sparsity.keras.prune_low_magnitude(work, pruning_schedule=schedule)
        callbacks.append(tfmot.sparsity.keras.UpdatePruningStep())
    work.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    if steps_per_epoch:  # smoke runs: only the first batches of each epoch
        keep = int(steps_per_epoch * BATCH_SIZE / (1 - VALIDATION_SPLIT))
        x_train, y_train = x_train[:keep], y_train[:keep]
    started = time.perf_counter()
    work.fit(
        x_train,
        y_train,
        batch_size=BATCH_SIZE,
        epochs=epochs,
        validation_split=VALIDATION_SPLIT,
        callbacks=callbacks,
        verbose=0,
    )
    seconds = time.perf_counter() - started
    final = tfmot.sparsity.keras.strip_pruning(work) if prune else work
    content = tflite_dynamic_range(final)
    kernels = [w for layer in final.layers for w in layer.get_weights() if w.ndim >= 2]
    zeros = sum(int((w == 0).sum()) for w in kernels) / max(1, sum(w.size for w in kernels))
    baseline_zip, tflite_zip = h5_zipped_size(model), tflite_zipped_size(content)
    return {
        "tflite": content,
        "sparsity": round(zeros, 4),
        "fit_seconds": round(seconds, 1),
        "baseline_h5_zip_bytes": baseline_zip,
        "h5_zip_bytes": h5_zipped_size(final),
        "tflite_zip_bytes": tflite_zip,
        "tutorial_ratio": round(baseline_zip / tflite_zip, 2),
    }
