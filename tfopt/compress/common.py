"""What every optimization technique shares: model checks, layer selection, rebuilding a model
inside a strategy scope under a precision policy, and the per-layer weight statistics.

The weight statistics (zeros, unique values, gzip size) are always computed from the weights a
model really holds, never from what a tfmot wrapper says it would do.
"""

from __future__ import annotations

import gzip
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from tfopt.core._keras import ensure_tf_keras, keras

import numpy as np

from tfopt.core import _compat
from tfopt.core._compat import is_graph_network, producing_layer
from tfopt.core.errors import OptimizeError  # noqa: F401  (re-exported)
from tfopt.runtime import sharding

#: Kernel-like weights: what pruning and clustering act on (biases and BN statistics are not).
KERNEL_NAMES = ("kernel", "depthwise_kernel", "pointwise_kernel", "embeddings", "recurrent_kernel")


def check_model(model, what: str = "model") -> keras.Model:
    """Refuses Keras 3 and subclassed models with one clear sentence each.

    Args:
        model: The model handed to an optimization technique.
        what: How to call it in the message.

    Returns:
        ``model``, a functional or Sequential tf_keras model.

    Raises:
        ModelError: a Keras 3 model (tfmot needs Keras 2).
        OptimizeError: a subclassed model (tfmot rewrites only layer graphs).
    """
    ensure_tf_keras(model, what)
    if not isinstance(model, keras.Model):
        raise OptimizeError(
            f"the {what} is a {type(model).__name__}, not a keras.Model; give a functional "
            "or Sequential tf_keras model"
        )
    if not (isinstance(model, keras.Sequential) or is_graph_network(model)):
        raise OptimizeError(
            f"the {what} {model.name!r} is a subclassed model ({type(model).__name__}), which tfmot cannot "
            "rewrite; optimize its functional parts instead (e.g. the student of a Distiller, not the Distiller)"
        )
    return model


@dataclass(frozen=True)
class Selection:
    """Which layers a technique wraps: by name or by class name; empty = every supported layer."""

    names: tuple[str, ...] = ()
    types: tuple[str, ...] = ()

    @property
    def everything(self) -> bool:
        """True when no name or type was given."""
        return not self.names and not self.types

    def matches(self, layer) -> bool:
        """True when ``layer`` is selected (its name or its class name is listed)."""
        return self.everything or layer.name in self.names or type(layer).__name__ in self.types

    def check(self, model: keras.Model) -> None:
        """Raises OptimizeError when a listed name or type is not in ``model``."""
        names = [layer.name for layer in model.layers]
        types = sorted({type(layer).__name__ for layer in model.layers})
        for name in self.names:
            if name not in names:
                raise OptimizeError(
                    f"layer {name!r} is not in model {model.name!r}; layers: {', '.join(names)}"
                )
        for typ in self.types:
            if typ not in types:
                raise OptimizeError(
                    f"layer type {typ!r} is not in model {model.name!r}; types: {', '.join(types)}"
                )

    def to_dict(self) -> dict:
        """Returns the selection as JSON-ready data."""
        return {"names": list(self.names), "types": list(self.types)}


def output_layer_names(model: keras.Model) -> set[str]:
    """Names of the layers whose outputs are the model's outputs (they stay float32)."""
    return {producing_layer(t).name for t in model.outputs}


def rebuild(
    model: keras.Model,
    policy: str = "float32",
    float32_layers: Iterable[str] = (),
    whole_layers: Iterable[str] = (),
) -> keras.Model:
    """Builds a fresh copy of ``model`` with its weights, in the current (strategy) scope.

    tfmot wrappers must be applied to layers whose variables were created in the same strategy
    scope (PITFALLS: a model loaded outside the scope fails deep inside autograph). The copy also
    sets each layer's dtype policy: output layers and ``float32_layers`` compute in float32, the
    others in ``policy``.

    Args:
        model: A functional or Sequential tf_keras model (e.g. loaded outside any strategy).
        policy: ``float32``, ``mixed_bfloat16`` or ``mixed_float16``.
        float32_layers: Layer names that must compute in float32 whatever ``policy`` says.
        whole_layers: Layer names whose variables must not be sharded (those tfmot will wrap;
            see :mod:`tfopt.runtime.sharding`).

    Returns:
        The copy, with exactly ``model``'s weights.
    """
    keep, whole = output_layer_names(model) | set(float32_layers), set(whole_layers)

    def clone(layer):
        config = layer.get_config()
        if not isinstance(layer, keras.layers.InputLayer) and "dtype" in config:
            config["dtype"] = "float32" if (policy == "float32" or layer.name in keep) else policy
        new = layer.__class__.from_config(config)
        return sharding.build_whole(new) if layer.name in whole else new

    copy = keras.models.clone_model(model, clone_function=clone)
    sharding.set_full_weights(copy, sharding.full_weights(model))
    return copy


def compile_for_eval(model: keras.Model) -> keras.Model:
    """Compiles ``model`` with the loss and metric every tfopt stage reports (logits in, accuracy out)."""
    model.compile(
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"]
    )
    _compat.build_step_state(model)
    return model


def compute_dtypes(model: keras.Model) -> dict[str, str]:
    """Layer name -> the dtype it computes in (a wrapper reports its own policy)."""
    return {
        layer.name: layer.dtype_policy.compute_dtype
        for layer in model.layers
        if not isinstance(layer, keras.layers.InputLayer)
    }


def kernel_variables(layer) -> list:
    """The kernel-like variables of ``layer`` (see ``KERNEL_NAMES``)."""
    return [w for w in layer.weights if w.name.split("/")[-1].split(":")[0] in KERNEL_NAMES]


def m_by_n_violations(kernel: np.ndarray, m: int = 2, n: int = 4) -> tuple[int, int]:
    """Counts groups of ``n`` consecutive weights (TFLite layout) holding fewer than ``m`` zeros.

    Groups run along the input-channel axis of the TFLite layout, like tfmot's m-by-n pruning
    and the sparse kernels that use it: a Conv2D kernel [H, W, C_in, C_out] becomes
    [C_out * H * W, C_in]; a Dense kernel [C_in, C_out] becomes [C_out, C_in]. An incomplete
    last group is padded with zeros, as those kernels do.

    Args:
        kernel: A rank-2 (Dense) or rank-4 (Conv2D) kernel.
        m: Zeros required per group.
        n: Group size.

    Returns:
        ``(violating_groups, groups)``.
    """
    w = np.asarray(kernel)
    if w.ndim == 4:
        rows = np.transpose(w, (3, 0, 1, 2)).reshape(-1, w.shape[2])
    elif w.ndim == 2:
        rows = w.T
    else:
        rows = w.reshape(-1, w.shape[-1])
    pad = (-rows.shape[1]) % n
    rows = np.pad(rows, ((0, 0), (0, pad)))
    zeros = (rows.reshape(rows.shape[0], -1, n) == 0).sum(axis=-1)
    return int((zeros < m).sum()), int(zeros.size)


@dataclass
class LayerRow:
    """One row of the per-layer weight table."""

    layer: str
    type: str
    weight: str
    shape: list[int]
    params: int
    zeros: int
    sparsity: float
    unique: int
    unique_per_channel_max: int
    m_by_n_violations: int | None = None
    m_by_n_groups: int | None = None
    note: str = ""
    extra: dict = field(default_factory=dict)


def weight_table(
    model: keras.Model,
    m_by_n: tuple[int, int] | None = None,
    inner: Callable = lambda layer: getattr(layer, "layer", layer),
) -> list[LayerRow]:
    """Per-layer statistics of the kernels ``model`` holds right now.

    Args:
        model: A stripped model, or a QAT model (its wrappers' inner layers are read).
        m_by_n: Also count m-by-n group violations, e.g. ``(2, 4)``.
        inner: Maps a (possibly wrapped) layer to the layer that owns the kernel.

    Returns:
        One row per kernel, in layer order.
    """
    rows = []
    for layer in model.layers:
        base = inner(layer)
        kernels = kernel_variables(layer) or kernel_variables(base)
        for var in kernels:
            value = np.asarray(var.numpy())
            zeros = int((value == 0).sum())
            per_channel = max(
                (len(np.unique(value[..., c])) for c in range(value.shape[-1])), default=0
            )
            row = LayerRow(
                layer=base.name,
                type=type(base).__name__,
                weight=var.name.split("/")[-1].split(":")[0],
                shape=list(value.shape),
                params=int(value.size),
                zeros=zeros,
                sparsity=round(zeros / max(1, value.size), 4),
                unique=int(len(np.unique(value))),
                unique_per_channel_max=int(per_channel),
            )
            if m_by_n and value.ndim in (2, 4):
                row.m_by_n_violations, row.m_by_n_groups = m_by_n_violations(value, *m_by_n)
            rows.append(row)
    return rows


def total_sparsity(rows: list[LayerRow]) -> float:
    """Share of zeros over all kernels of a table."""
    params = sum(r.params for r in rows)
    return round(sum(r.zeros for r in rows) / params, 4) if params else 0.0


def weights_gzip_bytes(model: keras.Model) -> int:
    """Bytes of all of ``model``'s weights as float32, gzip level 9 (what sparsity and clustering buy)."""
    raw = b"".join(np.asarray(w, dtype=np.float32).tobytes() for w in model.get_weights())
    return len(gzip.compress(raw, 9))


def format_table(rows: list[LayerRow]) -> str:
    """A fixed-width text table of the per-layer statistics, for the terminal."""
    header = ["layer", "type", "weight", "params", "sparsity", "unique", "max/ch"]
    has_mn = any(r.m_by_n_groups is not None for r in rows)
    if has_mn:
        header.append("m:n bad")
    body = []
    for r in rows:
        line = [
            r.layer,
            r.type,
            r.weight,
            str(r.params),
            f"{r.sparsity:.3f}",
            str(r.unique),
            str(r.unique_per_channel_max),
        ]
        if has_mn:
            line.append(
                "-" if r.m_by_n_groups is None else f"{r.m_by_n_violations}/{r.m_by_n_groups}"
            )
        body.append(line)
    widths = [max(len(x) for x in col) for col in zip(header, *body)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*header)] + [fmt.format(*line) for line in body])


def tfmot_imported() -> bool:
    """True once tfmot has been imported: before that, no model can hold a tfmot layer.

    Code that only inspects models (e.g. export) checks this first, so that a plain float model
    never makes it import tfmot.
    """
    import sys

    return "tensorflow_model_optimization" in sys.modules


def all_layers(model: keras.Model) -> list:
    """Every Keras layer inside ``model``: its layers, nested models' layers and wrappers' inner layers."""
    return [m for m in model.submodules if isinstance(m, keras.layers.Layer)]


def strip_wrappers(model: keras.Model) -> keras.Model:
    """``model`` without tfmot pruning and clustering wrappers; quantization-aware (QAT) wrappers stay.

    A QAT model keeps its wrappers: they hold the ranges it learned, which the int8 conversion
    uses. A model with no pruning or clustering wrapper is returned as it is (and tfmot is not
    imported for it).

    Args:
        model: A tf_keras model, e.g. a pruned or clustered model saved before stripping.

    Returns:
        The stripped model (stripping pruning reuses the wrapped layers; stripping clustering
        builds plain layers holding the clustered weights), or ``model`` itself.
    """
    if not tfmot_imported():
        return model
    import tensorflow_model_optimization as tfmot

    from tfopt.core._compat import CLUSTER_WRAPPERS, PRUNE_WRAPPERS

    if any(isinstance(layer, PRUNE_WRAPPERS) for layer in all_layers(model)):
        model = tfmot.sparsity.keras.strip_pruning(model)
    if any(isinstance(layer, CLUSTER_WRAPPERS) for layer in all_layers(model)):
        model = tfmot.clustering.keras.strip_clustering(model)
    return model
