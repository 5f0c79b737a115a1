"""Compressing a model that another stage trains (e.g. the distilled student).

The stage builds the model inside ``strategy.scope()``, calls :func:`wrap` there, trains the
wrapped model with its own loss (the Distiller's), then takes :func:`plain_copy` for evaluation
and saving: pruning and clustering wrappers stripped, a QAT model kept quantization-aware and
made savable (it reloads with :func:`tfopt.optimize.load_quantized_model` and converts to int8
from its learned ranges). :func:`measured` reads sparsity or cluster counts back from the saved
weights, never from what a wrapper says it would do.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from tfopt.core._keras import keras

from tfopt.compress import cluster as cluster_lib
from tfopt.compress import prune as prune_lib
from tfopt.compress import quantize as quantize_lib
from tfopt.compress.common import (
    OptimizeError,
    rebuild,
    strip_wrappers,
    total_sparsity,
    weight_table,
)
from tfopt.compress.techniques import ONE_PHASE
from tfopt.core._compat import tfmot_layer_dtype
from tfopt.runtime import precision, sharding


@dataclass
class Compression:
    """A wrapped model, the callbacks its wrappers need, and what run.json records of it."""

    model: keras.Model
    callbacks: list = field(default_factory=list)
    info: dict | None = None


def wrap(
    model: keras.Model,
    technique: str,
    total_steps: int,
    *,
    sparsity: float = 0.75,
    clusters: int = 16,
) -> Compression:
    """Wraps ``model`` for ``technique`` (call inside the strategy scope that built it).

    Args:
        model: A freshly built functional tf_keras model.
        technique: One of :data:`ONE_PHASE`.
        total_steps: Training steps of the stage (pruning reaches its target at 70% of them).
        sparsity: Target sparsity for ``prune``.
        clusters: Centroids per kernel for ``cluster``.

    Raises:
        OptimizeError: unknown technique or a bad sparsity / cluster count.
    """
    if technique not in ONE_PHASE:
        raise OptimizeError(
            f"technique {technique!r} is not valid here; choose one of {', '.join(ONE_PHASE)}"
        )
    if technique == "none":
        return Compression(model)
    policy = precision.policy_name()

    def float32_for(names):
        # Under a mixed policy the wrapped layers compute in float32 (see tfopt.compress.techniques).
        return model if policy == "float32" else rebuild(model, policy, float32_layers=names)

    wrapper_dtype = tfmot_layer_dtype(policy)
    if technique == "prune":
        # Gradual pruning (Zhu & Gupta): 0 -> target over the first 70% of the steps, masks updated
        # every `frequency` steps; end_step is a multiple of it so the last update reaches the target.
        frequency = max(1, total_steps // 50)
        end_step = max(frequency, int(0.7 * total_steps) // frequency * frequency)
        spec = prune_lib.PruneSpec(
            sparsity=sparsity, schedule="polynomial", end_step=end_step, frequency=frequency
        ).validate()
        names = prune_lib.prunable_names(model, spec)
        wrapped = prune_lib.wrap(
            float32_for(names), spec, total_steps, names, wrapper_dtype=wrapper_dtype
        )
        return Compression(
            wrapped,
            prune_lib.callbacks(None),
            {"technique": "prune", **spec.to_dict(), "layers": names},
        )
    if technique == "cluster":
        spec = cluster_lib.ClusterSpec(clusters=clusters).validate()
        names = cluster_lib.clusterable_names(model, spec)
        wrapped = cluster_lib.wrap(float32_for(names), spec, names, wrapper_dtype=wrapper_dtype)
        return Compression(wrapped, [], {"technique": "cluster", **spec.to_dict(), "layers": names})
    spec = quantize_lib.QatSpec().validate()
    names = quantize_lib.quantizable_names(model, spec)
    return Compression(
        quantize_lib.wrap(float32_for(names), spec, names),
        [],
        {"technique": "qat", **spec.to_dict(), "layers": names},
    )


def plain_weights(model: keras.Model) -> list:
    """The weights of ``plain_copy(model)``, in its order (a collective under MultiWorkerMirrored)."""
    return sharding.full_weights(strip_wrappers(model))


def plain_copy(model: keras.Model) -> keras.Model:
    """A strategy-free copy of ``model`` with pruning/clustering stripped: for evaluation and saving.

    A QAT model keeps its wrappers and is made savable (its ``model.keras`` reloads). Every
    worker must call it under MultiWorkerMirroredStrategy (it reads the weights).
    """
    stripped = strip_wrappers(model)
    weights = sharding.full_weights(stripped)
    qat = quantize_lib.is_qat_model(stripped)

    def copy():
        # A helper thread has no strategy scope (scopes are thread-local): the copy is plain.
        with quantize_lib.quantize_scope():
            clone = keras.models.clone_model(stripped)
        clone.set_weights(weights)
        if qat:
            quantize_lib.fix_for_keras_format(
                clone
            )  # so that model.keras reloads (tfmot 0.8.1 saves duplicates)
        return clone

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(copy).result()


def measured(plain: keras.Model, info: dict) -> dict:
    """Sparsity or cluster counts read back from ``plain``'s kernels for the wrapped layers."""
    rows = [r for r in weight_table(plain) if r.layer in info["layers"]]
    if info["technique"] == "prune":
        return {"overall": total_sparsity(rows), "layers": {r.layer: r.sparsity for r in rows}}
    if info["technique"] == "cluster":
        return {
            "unique_max": max(r.unique for r in rows),
            "layers": {r.layer: r.unique for r in rows},
        }
    return {"quantized_layers": len(info["layers"])}
