"""Peer of benchmark B4: the recipe of tfmot's tutorial "Weight clustering in Keras example".

Tutorial: "Weight clustering in Keras example",
https://www.tensorflow.org/model_optimization/guide/clustering/clustering_example
(tensorflow/model-optimization, ``g3doc/guide/clustering/clustering_example.ipynb``).

What a user following it does to a trained MNIST model, step by step as the tutorial says (its
first step, training the float model, is the benchmark's: every side starts from the same
trained float model and the same training images):

1. Wraps the whole model with ``cluster_weights``: 16 clusters per weight tensor,
   ``CentroidInitialization.LINEAR`` (centroids evenly spaced between each tensor's min and max).
2. Recompiles with Adam at a small learning rate, 1e-5 ("use smaller learning rate for
   fine-tuning clustered model"), sparse categorical cross-entropy from logits, accuracy.
3. Fine-tunes 1 epoch, batch 500, ``validation_split=0.1``.
4. ``strip_clustering``, then saves the Keras model as ``.h5`` without the optimizer.
5. Converts with ``TFLiteConverter.from_keras_model`` and ``optimizations = [Optimize.DEFAULT]``
   (post-training dynamic-range quantization, no representative dataset).
6. Measures sizes as the tutorial does: a zip (deflate) of each file, the gzipped baseline
   Keras ``.h5`` against the gzipped clustered + quantized ``.tflite`` (its "8x smaller").

The benchmark scores the ``.tflite`` on the test split with the same evaluator as tfopt's models
and gzips every ``.tflite`` the same way for the side-by-side ratio. ``cluster=False`` runs the
same fine-tuning without the clustering wrapper: the equally trained float control.
"""

from __future__ import annotations

import math
import time

from tfopt.core._keras import keras

import numpy as np

from bench.peers.tfmot_pruning import (
    fresh_copy,
    h5_zipped_size,
    tflite_dynamic_range,
    tflite_zipped_size,
)

TUTORIAL = 'tfmot "Weight clustering in Keras example" (clustering_example)'
URL = "https://www.tensorflow.org/model_optimization/guide/clustering/clustering_example"
CLUSTERS = 16
LEARNING_RATE = 1e-5
BATCH_SIZE = 500
EPOCHS = 1
VALIDATION_SPLIT = 0.1


def run(
    model: keras.Model,
    x_train: np.ndarray,
    y_train: np.ndarray,
    *,
    seed: int,
    cluster: bool = True,
    steps_per_epoch: int | None = None,
) -> dict:
    """Fine-tunes a copy of the trained ``model`` with the tutorial's clustering recipe.

    Args:
        model: The trained float model (left untouched).
        x_train: Training images, as the model takes them.
        y_train: Integer labels.
        seed: Seeds Keras (shuffles, dropout).
        cluster: False: the same fine-tuning without clustering (the recipe's float control).
        steps_per_epoch: Caps the steps (smoke runs only).

    Returns:
        ``{"tflite": bytes, "unique_max", "fit_seconds", "tutorial_ratio", "h5_zip_bytes",
        "baseline_h5_zip_bytes", "tflite_zip_bytes"}``; ``unique_max`` is the largest number of
        distinct values in a kernel; ``tutorial_ratio`` the tutorial's own figure.
    """
    import tensorflow_model_optimization as tfmot  # after tfopt.core._keras: the tf_keras flavour

    clustering = tfmot.clustering.keras
    keras.utils.set_random_seed(seed)
    work = fresh_copy(model)
    if cluster:
        work = clustering.cluster_weights(
            work,
            number_of_clusters=CLUSTERS,
            cluster_centroids_init=clustering.CentroidInitialization.LINEAR,
        )
    work.compile(
        optimizer=keras.optimizers.Adam(learning_rate=LEARNING_RATE),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    if steps_per_epoch:  # smoke runs: only the first batches
        keep = int(steps_per_epoch * BATCH_SIZE / (1 - VALIDATION_SPLIT))
        x_train, y_train = x_train[:keep], y_train[:keep]
    started = time.perf_counter()
    work.fit(
        x_train,
        y_train,
        batch_size=BATCH_SIZE,
        epochs=EPOCHS,
        validation_split=VALIDATION_SPLIT,
        verbose=0,
    )
    seconds = time.perf_counter() - started
    final = clustering.strip_clustering(work) if cluster else work
    content = tflite_dynamic_range(final)
    kernels = [w for layer in final.layers for w in layer.get_weights() if w.ndim >= 2]
    baseline_zip, tflite_zip = h5_zipped_size(model), tflite_zipped_size(content)
    return {
        "tflite": content,
        "unique_max": max(len(np.unique(w)) for w in kernels),
        "fit_seconds": round(seconds, 1),
        "steps": math.ceil(len(x_train) * (1 - VALIDATION_SPLIT) / BATCH_SIZE),
        "baseline_h5_zip_bytes": baseline_zip,
        "h5_zip_bytes": h5_zipped_size(final),
        "tflite_zip_bytes": tflite_zip,
        "tutorial_ratio": round(baseline_zip / tflite_zip, 2),
    }
