"""Weight clustering with tfmot: number of clusters, centroid initialization, per-channel,
sparsity-preserving; stripping; unique values per layer verified from the weights.

Under a mixed precision policy the clustered layers compute in float32 (their wrappers too):
tfmot initializes the centroids from the layer's weights as the wrapper reads them, i.e. cast to
bfloat16/float16, and its k-means++ kernel accepts float32 only. The other layers keep the
mixed policy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tfopt.core._keras import keras

import tensorflow_model_optimization as tfmot

from tfopt.compress.common import OptimizeError, Selection, check_model, weight_table
from tfopt.core._compat import (
    CLUSTER_WRAPPERS,
    StepCountingClusteringSummaries,
    cluster_registry_supports,
    clusterable_weight_names,
)

_clustering = tfmot.clustering.keras
_Init = _clustering.CentroidInitialization
INITS = {
    "kmeans_plus_plus": _Init.KMEANS_PLUS_PLUS,
    "density": _Init.DENSITY_BASED,
    "linear": _Init.LINEAR,
    "random": _Init.RANDOM,
}


@dataclass(frozen=True)
class ClusterSpec:
    """How to cluster.

    Attributes:
        clusters: Centroids per kernel (per output channel with ``per_channel``).
        init: Centroid initialization: kmeans_plus_plus, density, linear or random.
        per_channel: One set of centroids per output channel (Conv2D only; others per tensor).
        preserve_sparsity: Keep zero weights at zero (for a pruned model: the "pc" of PCQAT).
        selection: Layers to cluster; empty = every layer tfmot can cluster.
    """

    clusters: int = 16
    init: str = "kmeans_plus_plus"
    per_channel: bool = False
    preserve_sparsity: bool = False
    selection: Selection = field(default_factory=Selection)

    def validate(self) -> ClusterSpec:
        """Raises OptimizeError naming the bad value and the valid range."""
        if not 2 <= self.clusters <= 256:
            raise OptimizeError(f"clusters={self.clusters} must be in [2, 256], e.g. 16")
        if self.init not in INITS:
            raise OptimizeError(
                f"centroid init {self.init!r} is not valid; choose one of {', '.join(INITS)}"
            )
        return self

    def to_dict(self) -> dict:
        """JSON-ready description (for run.json)."""
        return {
            "clusters": self.clusters,
            "init": self.init,
            "per_channel": self.per_channel,
            "preserve_sparsity": self.preserve_sparsity,
            "selection": self.selection.to_dict(),
        }


def why_not_clusterable(layer, spec: ClusterSpec | None = None) -> str | None:
    """Returns why tfmot will not cluster ``layer`` (None when it can, or it has no weights)."""
    if isinstance(layer, _clustering.ClusterableLayer):
        return None
    if not cluster_registry_supports(layer):
        return (
            f"tfmot has no clustering rule for {type(layer).__name__}; make the class a "
            "tfmot.clustering.keras.ClusterableLayer (get_clusterable_weights) or leave it out of the selection"
        )
    clusters = spec.clusters if spec else 16
    per_channel = bool(spec and spec.per_channel)
    if isinstance(layer, keras.layers.Conv2D) and layer.trainable_weights:
        # The same count tfmot makes before it silently leaves a Conv2D unclustered: it takes the
        # number of channels from the layer's last trainable weight (the bias, or the kernel).
        kernel = layer.kernel.shape.num_elements()
        channels = layer.trainable_weights[
            1 if layer.data_format == "channels_first" else -1
        ].shape.num_elements()
        per = kernel // channels if per_channel else kernel
        if per <= clusters:
            if per_channel and not layer.use_bias:
                return (
                    "tfmot skips per-channel clustering of a Conv2D without bias (it counts channels on the "
                    "kernel); cluster it per tensor or give it a bias"
                )
            return (
                f"{'each channel of ' if per_channel else ''}the kernel holds {per} weights, not more than "
                f"clusters={clusters}; use fewer clusters or leave the layer out"
            )
    return None


def _has_weights(layer) -> bool:
    if isinstance(layer, _clustering.ClusterableLayer):
        return bool(layer.get_clusterable_weights())
    return bool(layer.trainable_weights) and bool(clusterable_weight_names(layer))


def clusterable_names(model: keras.Model, spec: ClusterSpec) -> list[str]:
    """The layers ``wrap`` will cluster: selected, supported and holding enough weights.

    Raises:
        OptimizeError: a layer named or typed in the selection cannot be clustered, or nothing can.
    """
    check_model(model)
    spec.selection.check(model)
    names = []
    for layer in model.layers:
        if (
            isinstance(layer, keras.layers.InputLayer)
            or not spec.selection.matches(layer)
            or not layer.weights
        ):
            continue
        reason = why_not_clusterable(layer, spec)
        if reason and not spec.selection.everything:
            raise OptimizeError(f"layer {layer.name!r}: {reason}")
        if reason is None and _has_weights(layer):
            names.append(layer.name)
    if not names:
        raise OptimizeError(
            f"nothing to cluster in model {model.name!r} with selection {spec.selection.to_dict()}; "
            "run `python -m tfopt.optimize --inspect` to see what can be"
        )
    return names


def wrap(
    model: keras.Model,
    spec: ClusterSpec,
    names: list[str] | None = None,
    wrapper_dtype: str | None = None,
) -> keras.Model:
    """Wraps the chosen layers with ``ClusterWeights``; call inside ``strategy.scope()``.

    Args:
        model: A built model rebuilt in the current scope (tfmot reads its weights for the centroids).
        spec: The clustering spec.
        names: Layers to wrap (default: ``clusterable_names(model, spec)``).
        wrapper_dtype: dtype policy of the wrappers (``float32`` under a mixed policy).

    Returns:
        A new functional model sharing ``model``'s layers, with clustering wrappers.
    """
    names = set(names if names is not None else clusterable_names(model, spec))
    params = {"number_of_clusters": spec.clusters, "cluster_centroids_init": INITS[spec.init]}
    if spec.preserve_sparsity:
        params["preserve_sparsity"] = True
    if wrapper_dtype:
        params["dtype"] = wrapper_dtype

    def clone(layer):
        if layer.name not in names:
            return layer
        kwargs = dict(params)
        # tfmot clusters per channel only along a Conv2D's output channels.
        if spec.per_channel and isinstance(layer, keras.layers.Conv2D):
            kwargs["cluster_per_channel"] = True
        return _clustering.cluster_weights(layer, **kwargs)

    wrapped = keras.models.clone_model(model, clone_function=clone)
    # tfmot leaves a layer it finds too small unclustered with a mere warning: make it an error.
    skipped = [
        layer.name
        for layer in wrapped.layers
        if layer.name in names and not isinstance(layer, CLUSTER_WRAPPERS)
    ]
    if skipped:
        reason = why_not_clusterable(model.get_layer(skipped[0]), spec) or "see tfmot's warning"
        raise OptimizeError(f"tfmot did not cluster layer {skipped[0]!r}: {reason}")
    return wrapped


def callbacks(log_dir: str | None) -> list:
    """``ClusteringSummaries`` (centroid histograms per epoch) for TensorBoard when a ``log_dir`` is given."""
    return [StepCountingClusteringSummaries(log_dir)] if log_dir else []


def strip(model: keras.Model) -> keras.Model:
    """Removes the clustering wrappers (call in the scope that wrapped): clustered plain layers."""
    return _clustering.strip_clustering(model)


def check_clusters(
    model: keras.Model, spec: ClusterSpec, layers: list[str], conv_per_channel: bool = False
) -> dict:
    """Verifies, from a stripped model's weights, that each clustered kernel holds <= clusters values.

    Args:
        model: A stripped (or QAT copy's float) model.
        spec: The clustering spec that was applied.
        layers: The clustered layer names.
        conv_per_channel: Count Conv2D kernels per output channel even without
            ``spec.per_channel`` (after cluster-preserving QAT, see the runner).

    Returns:
        ``{"ok": bool, "layers": {name: {"unique", "unique_per_channel_max", "limit", "per_channel", "ok"}}}``.
    """
    out: dict = {"layers": {}}
    for row in weight_table(model):
        if row.layer not in layers:
            continue
        per_channel = (spec.per_channel or conv_per_channel) and row.type == "Conv2D"
        value = row.unique_per_channel_max if per_channel else row.unique
        out["layers"][row.layer] = {
            "unique": row.unique,
            "unique_per_channel_max": row.unique_per_channel_max,
            "limit": spec.clusters,
            "per_channel": per_channel,
            "ok": value <= spec.clusters,
        }
    out["ok"] = bool(out["layers"]) and all(v["ok"] for v in out["layers"].values())
    return out
