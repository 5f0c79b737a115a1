"""Peers of benchmark B10: tfmot's pruning recipes, the ones a user would reach for to buy speed.

1. "Pruning for on-device inference w/ XNNPACK"
   (https://www.tensorflow.org/model_optimization/guide/pruning/pruning_for_on_device_inference):
   ``prune_low_magnitude`` with ``pruning_policy=PruneForLatencyOnXNNPack()`` (only the 1x1
   convolutions of a subgraph XNNPACK's sparse inference can run) and
   ``ConstantSparsity(0.75, begin_step=0, frequency=100)``; Adam; fine-tuning with
   ``UpdatePruningStep``; ``strip_pruning``; converted with
   ``optimizations = [tf.lite.Optimize.EXPERIMENTAL_SPARSITY]`` so the weights are stored sparse
   (DENSIFY), which is what XNNPACK's sparse inference needs; timed with the default
   interpreter, whose XNNPACK delegate takes the sparse path when the graph qualifies. tfmot
   refuses a model without such a subgraph (``ensure_model_supports_pruning``): recorded.
2. Magnitude pruning at a given sparsity, as "Pruning in Keras example" does it
   (``PolynomialDecay`` from 50% of the target to the target over the fine-tuning, Adam):
   B10 sets the target so the pruned model keeps as many nonzero weights as the channel-pruned
   model has parameters ("the same parameter count").

Every side starts from the same trained model and fine-tunes the same epochs on the same images.
"""

from __future__ import annotations

import math
import time

from tfopt.core._keras import keras, tf

import numpy as np

from bench.peers.tfmot_pruning import fresh_copy

XNNPACK_GUIDE = 'tfmot "Pruning for on-device inference w/ XNNPACK"'
XNNPACK_URL = (
    "https://www.tensorflow.org/model_optimization/guide/pruning/pruning_for_on_device_inference"
)
MAGNITUDE_GUIDE = 'tfmot "Pruning in Keras example" at the channel-pruned model\'s parameter count'
XNNPACK_SPARSITY = 0.75
BATCH_SIZE = 128


def _fit(work, x, y, epochs: int, learning_rate: float, seed: int) -> float:
    import tensorflow_model_optimization as tfmot

    keras.utils.set_random_seed(seed)
    work.compile(
        optimizer=keras.optimizers.Adam(learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    started = time.perf_counter()
    work.fit(
        x,
        y,
        batch_size=BATCH_SIZE,
        epochs=epochs,
        callbacks=[tfmot.sparsity.keras.UpdatePruningStep()],
        verbose=0,
    )
    return round(time.perf_counter() - started, 1)


def _sparsity(model) -> float:
    kernels = [w for layer in model.layers for w in layer.get_weights() if w.ndim >= 2]
    return round(
        sum(int((w == 0).sum()) for w in kernels) / max(1, sum(w.size for w in kernels)), 4
    )


def xnnpack_recipe(
    model: keras.Model,
    x: np.ndarray,
    y: np.ndarray,
    *,
    epochs: int,
    learning_rate: float,
    seed: int = 0,
) -> dict:
    """The XNNPACK guide's pruning of a copy of ``model``.

    Returns:
        ``{"model", "tflite" (sparse-encoded float), "sparsity", "fit_seconds"}``, or
        ``{"refused": message}`` when tfmot refuses the model.
    """
    import tensorflow_model_optimization as tfmot

    sparsity = tfmot.sparsity.keras
    try:
        work = sparsity.prune_low_magnitude(
            fresh_copy(model),
            pruning_schedule=sparsity.ConstantSparsity(
                XNNPACK_SPARSITY, begin_step=0, frequency=100
            ),
            pruning_policy=sparsity.PruneForLatencyOnXNNPack(),
        )
    except ValueError as e:
        return {"refused": str(e).splitlines()[0]}
    seconds = _fit(work, x, y, epochs, learning_rate, seed)
    final = sparsity.strip_pruning(work)
    converter = tf.lite.TFLiteConverter.from_keras_model(final)
    converter.optimizations = [tf.lite.Optimize.EXPERIMENTAL_SPARSITY]
    return {
        "model": final,
        "tflite": converter.convert(),
        "sparsity": _sparsity(final),
        "fit_seconds": seconds,
    }


def magnitude_recipe(
    model: keras.Model,
    x: np.ndarray,
    y: np.ndarray,
    *,
    target: float,
    epochs: int,
    learning_rate: float,
    seed: int = 0,
) -> dict:
    """Magnitude pruning of a copy of ``model`` to ``target`` sparsity (PolynomialDecay from half of it).

    Returns:
        ``{"model", "sparsity", "fit_seconds"}``.
    """
    import tensorflow_model_optimization as tfmot

    sparsity = tfmot.sparsity.keras
    end_step = math.ceil(len(x) / BATCH_SIZE) * epochs
    work = sparsity.prune_low_magnitude(
        fresh_copy(model),
        pruning_schedule=sparsity.PolynomialDecay(
            initial_sparsity=target / 2,
            final_sparsity=target,
            begin_step=0,
            end_step=end_step,
            frequency=max(1, min(100, end_step // 20)),
        ),
    )
    seconds = _fit(work, x, y, epochs, learning_rate, seed)
    final = sparsity.strip_pruning(work)
    return {"model": final, "sparsity": _sparsity(final), "fit_seconds": seconds}
