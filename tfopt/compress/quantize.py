"""Quantization-aware training (QAT) with tfmot: whole model, selected layers, custom layers, and
the collaborative schemes that preserve sparsity and clusters.

Giving an unsupported custom layer a QuantizeConfig (the hook)::

    class ScaleQuantizeConfig(tfmot.quantization.keras.QuantizeConfig):
        def get_weights_and_quantizers(self, layer):
            return [(layer.scale, tfmot.quantization.keras.quantizers.LastValueQuantizer(
                num_bits=8, symmetric=True, narrow_range=False, per_axis=False))]
        def get_activations_and_quantizers(self, layer):
            return []
        def set_quantize_weights(self, layer, quantize_weights):
            layer.scale = quantize_weights[0]
        def set_quantize_activations(self, layer, quantize_activations):
            pass
        def get_output_quantizers(self, layer):
            return [tfmot.quantization.keras.quantizers.MovingAverageQuantizer(
                num_bits=8, per_axis=False, symmetric=False, narrow_range=False)]
        def get_config(self):
            return {}

    tfopt.optimize.register_quantize_config(Scale, ScaleQuantizeConfig)

From then on ``inspect`` reports ``Scale`` layers as quantizable and every QAT technique annotates
them with a fresh ``ScaleQuantizeConfig()``; tfopt adds both classes to ``quantize_scope``. For the
saved model to reload, register the layer for serialization
(``@keras.utils.register_keras_serializable``) and end its ``build`` with
``super().build(input_shape)``.

Precision: TensorFlow's fake-quantization kernels (``FakeQuantWithMinMaxVars``) accept float32
only (tensorflow/model-optimization#367), so the quantized layers are always built with a
float32 policy; under a mixed policy only the layers left unquantized compute in the mixed dtype.

Saving: tf_keras' ``.keras`` format cannot reload a QAT model as tfmot 0.8.1 builds it
(``QuantizeLayer`` is built twice; ``QuantizeWrapperV2`` lists the inner kernel twice, and the
inner layer's weights once more). :func:`savable_copy` returns a default-scheme QAT model whose
layers save the variables a reload creates, so ``model.keras`` round-trips.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from tfopt.core._keras import keras

import tensorflow_model_optimization as tfmot

from tfopt.compress.common import OptimizeError, Selection, all_layers, check_model
from tfopt.core._compat import QUANTIZE_LAYERS, fix_for_keras_format, float32_global_policy
from tfopt.runtime import sharding

_q = tfmot.quantization.keras
SCHEMES = ("default", "prune_preserve", "cluster_preserve", "sparsity_cluster_preserve")

# Layer class -> zero-argument factory of a QuantizeConfig (the documented hook).
_CUSTOM_CONFIGS: dict[type, Callable[[], _q.QuantizeConfig]] = {}


def register_quantize_config(
    layer_class: type, config_factory: Callable[[], _q.QuantizeConfig]
) -> None:
    """Tells every QAT technique how to quantize ``layer_class`` (e.g. a custom layer tfmot lacks).

    Args:
        layer_class: A tf_keras layer class (registered for serialization if models holding it
            are saved and reloaded).
        config_factory: Returns a fresh ``tfmot.quantization.keras.QuantizeConfig`` for one
            layer; usually the QuantizeConfig class itself.

    Raises:
        OptimizeError: the factory does not produce a QuantizeConfig.
    """
    probe = config_factory()
    if not isinstance(probe, _q.QuantizeConfig):
        raise OptimizeError(
            f"register_quantize_config({layer_class.__name__}, ...) needs a factory of "
            f"tfmot.quantization.keras.QuantizeConfig, got {type(probe).__name__}"
        )
    _CUSTOM_CONFIGS[layer_class] = config_factory


def unregister_quantize_config(layer_class: type) -> None:
    """Removes a hook added by :func:`register_quantize_config` (no-op when absent)."""
    _CUSTOM_CONFIGS.pop(layer_class, None)


def _custom_config(layer):
    factory = _CUSTOM_CONFIGS.get(type(layer))
    return factory() if factory else None


@contextmanager
def quantize_scope() -> Iterator[None]:
    """``quantize_scope`` that also knows the custom layers and configs given to the hook."""
    objects: dict = {}
    for cls, factory in _CUSTOM_CONFIGS.items():
        objects[cls.__name__] = cls
        objects[type(factory()).__name__] = type(factory())
    with _q.quantize_scope(objects):
        yield


_BN_FOLDED_AFTER = ("Conv2D", "DepthwiseConv2D", "Dense")


def _producers(layer) -> list:
    out = []
    for node in getattr(layer, "inbound_nodes", []):
        inbound = node.inbound_layers
        out.extend(inbound if isinstance(inbound, (list, tuple)) else [inbound])
    return out


def why_not_quantizable(layer) -> str | None:
    """Returns why the default 8-bit scheme cannot quantize ``layer`` (None when it can)."""
    if type(layer) in _CUSTOM_CONFIGS:
        return None
    if _q.default_8bit.Default8BitQuantizeRegistry().supports(layer):
        return None
    if type(layer).__name__ in ("BatchNormalization", "SyncBatchNormalization"):
        # tfmot quantizes batch norm only as part of a linear Conv2D/DepthwiseConv2D/Dense + BN
        # pattern, which the converter folds into the producing layer.
        producers = _producers(layer)
        if producers and all(
            type(p).__name__ in _BN_FOLDED_AFTER
            and getattr(p, "activation", None) in (None, keras.activations.linear)
            for p in producers
        ):
            return None
        return (
            "tfmot quantizes BatchNormalization only right after a Conv2D/DepthwiseConv2D/Dense without "
            "activation (folded into it); move it there or leave it out of the selection (it then stays float)"
        )
    return (
        f"the default 8-bit scheme has no QuantizeConfig for {type(layer).__name__}; give it one with "
        "tfopt.optimize.register_quantize_config(cls, config_factory) or leave it out of the selection "
        "(it then stays float)"
    )


@dataclass(frozen=True)
class QatSpec:
    """How to run quantization-aware training.

    Attributes:
        scheme: ``default`` (8-bit), ``prune_preserve`` (PQAT), ``cluster_preserve`` (CQAT) or
            ``sparsity_cluster_preserve`` (PCQAT).
        selection: Layers to quantize; empty = every layer the scheme (or the hook) supports.
    """

    scheme: str = "default"
    selection: Selection = field(default_factory=Selection)

    def validate(self) -> QatSpec:
        """Raises OptimizeError for an unknown scheme."""
        if self.scheme not in SCHEMES:
            raise OptimizeError(
                f"QAT scheme {self.scheme!r} is not valid; choose one of {', '.join(SCHEMES)}"
            )
        return self

    def to_dict(self) -> dict:
        """JSON-ready description (for run.json)."""
        return {"scheme": self.scheme, "selection": self.selection.to_dict()}


def make_scheme(name: str):
    """The tfmot QuantizeScheme named ``name`` (see ``SCHEMES``)."""
    if name == "prune_preserve":
        return _q.collab_opts.Default8BitPrunePreserveQuantizeScheme()
    if name in ("cluster_preserve", "sparsity_cluster_preserve"):
        return tfmot.experimental.combine.Default8BitClusterPreserveQuantizeScheme(
            preserve_sparsity=name == "sparsity_cluster_preserve"
        )
    return _q.default_8bit.Default8BitQuantizeScheme()


def quantizable_names(model: keras.Model, spec: QatSpec) -> list[str]:
    """The layers ``wrap`` will annotate: selected and supported (or given a config by the hook).

    Raises:
        OptimizeError: a layer named or typed in the selection cannot be quantized, or none can.
    """
    check_model(model)
    spec.selection.check(model)
    names = []
    for layer in model.layers:
        if isinstance(layer, keras.layers.InputLayer) or not spec.selection.matches(layer):
            continue
        reason = why_not_quantizable(layer)
        if reason and not spec.selection.everything:
            raise OptimizeError(f"layer {layer.name!r}: {reason}")
        if reason is None:
            names.append(layer.name)
    if not names:
        raise OptimizeError(
            f"nothing to quantize in model {model.name!r} with selection "
            f"{spec.selection.to_dict()}; run `python -m tfopt.optimize --inspect`"
        )
    return names


def wrap(model: keras.Model, spec: QatSpec, names: list[str] | None = None) -> keras.Model:
    """Annotates the chosen layers and applies the scheme; call inside ``strategy.scope()``.

    The quantized model is built under a float32 policy (fake quantization is float32-only);
    the global policy is restored afterwards.

    Args:
        model: A model rebuilt in the current scope; for PQAT/CQAT/PCQAT the stripped result
            of pruning/clustering (the scheme reads its zeros and centroids from the weights).
        spec: The QAT spec.
        names: Layers to annotate (default: ``quantizable_names(model, spec)``).

    Returns:
        The QAT model (new layers in the current scope, ``model``'s weights).
    """
    names = set(names if names is not None else quantizable_names(model, spec))

    def annotate(layer):
        if layer.name in names:
            return _q.quantize_annotate_layer(layer, _custom_config(layer))
        return layer

    # Annotation wrappers and quantize wrappers take the global policy: float32 for both.
    with float32_global_policy():
        annotated = keras.models.clone_model(model, clone_function=annotate)
        with quantize_scope():
            try:
                return _q.quantize_apply(annotated, make_scheme(spec.scheme))
            except (ValueError, TypeError, RuntimeError) as e:
                raise OptimizeError(
                    f"tfmot cannot quantize model {model.name!r} with scheme {spec.scheme!r}: "
                    f"{str(e).splitlines()[0]}; run `python -m tfopt.optimize --inspect`"
                ) from None


def savable_copy(
    trained: keras.Model,
    float_model: keras.Model,
    names: list[str],
    weights: dict | None = None,
) -> keras.Model:
    """A strategy-free, default-scheme QAT copy of ``trained`` that evaluates, exports and saves.

    The copy is ``float_model`` annotated like ``trained`` and quantized with the default 8-bit
    scheme, then every variable is copied by name from ``trained``. The collaborative schemes
    keep their effective weights in the kernel itself (PQAT's masked entries get zero
    gradients; CQAT assigns the clustered kernel every step), so the copy holds the same
    sparse / clustered weights and the same quantization ranges without the extra training
    state (centroids, indices, masks) that the ``.keras`` format cannot reload.

    Args:
        trained: The fine-tuned QAT model (any strategy).
        float_model: A float32, strategy-free model with ``trained``'s float architecture.
        names: The annotated layer names (as given to ``wrap``).
        weights: ``{variable name: value}`` read from ``trained`` (read it on every worker under
            MultiWorkerMirroredStrategy, where reading is a collective); default: read now.

    Returns:
        The copy, float32, uncompiled, with ``.keras``-safe variable bookkeeping (see module doc).

    Raises:
        OptimizeError: a variable of the copy has no counterpart in ``trained``.
    """
    if weights is None:
        weights = read_named_weights(trained)
    copy = wrap(float_model, QatSpec("default"), names)
    if len(copy.layers) != len(trained.layers):
        raise OptimizeError(
            f"QAT copy has {len(copy.layers)} layers, the trained model {len(trained.layers)}"
        )
    values = []
    for mine, theirs in zip(copy.layers, trained.layers):
        for name in sharding.whole_names(mine.weights):
            # Auto-named layers (quantize_layer, quantize_layer_1, ...) differ between the two
            # models: match a variable by its name relative to its layer.
            key = _relative(name, mine.name, theirs.name)
            if key not in weights:
                raise OptimizeError(
                    f"QAT copy: variable {name!r} has no counterpart in the trained model"
                )
            values.append(weights[key])
    sharding.set_full_weights(copy, values)
    fix_for_keras_format(copy)
    return copy


def _relative(name: str, own_layer: str, other_layer: str) -> str:
    parts = name.split("/")
    return "/".join(
        other_layer
        if p == own_layer
        else p.replace(own_layer + "_", other_layer + "_", 1)
        if p.startswith(own_layer + "_")
        else p
        for p in parts
    )


def read_named_weights(model: keras.Model) -> dict:
    """``{variable name: numpy value}`` of every weight of ``model`` (a collective under MWMS)."""
    return sharding.named_full_weights(model)


def is_qat_model(model: keras.Model) -> bool:
    """True when ``model`` (or a model nested in it) holds tfmot quantization-aware-training layers.

    The one QAT test of tfopt (export uses it too). It checks the classes themselves
    (``QuantizeWrapper``, its ``QuantizeWrapperV2`` subclass, and ``QuantizeLayer``, which
    quantizes the model input), not class names, which any user layer could share.
    """
    classes = (_q.QuantizeWrapper, _q.QuantizeWrapperV2, *QUANTIZE_LAYERS)
    return any(isinstance(layer, classes) for layer in all_layers(model))


def inner_float_model(qat_model: keras.Model, float_model: keras.Model) -> keras.Model:
    """``float_model`` (same architecture, strategy-free) with the QAT model's float weights.

    Each layer of ``float_model`` takes its weights from the QAT layer that wraps a layer of the
    same name (or from the same-named plain layer), matched by the variable's own name
    (``kernel:0``, ``gamma:0``, ...): a reloaded model scopes its variable names differently.
    """
    by_layer = {}
    for layer in qat_model.layers:
        inner = layer.layer if isinstance(layer, _q.QuantizeWrapper) else layer
        variables = list(layer.weights) + [
            w for w in inner.weights if all(w is not v for v in layer.weights)
        ]
        by_layer[inner.name] = variables
    values = []
    for layer in float_model.layers:
        candidates = {
            name.split("/")[-1]: value
            for name, value in sharding.whole_values(by_layer.get(layer.name, []))
        }
        for var in layer.weights:
            match = candidates.get(var.name.split("/")[-1])
            if match is None:
                raise OptimizeError(
                    f"QAT model lacks the float weight {var.name!r} of layer {layer.name!r}; "
                    "was it built from this model?"
                )
            values.append(match)
    float_model.set_weights(values)
    return float_model


def load_quantized_model(path: str, trust_model: bool = False) -> keras.Model:
    """Loads a model written by a QAT technique (or any tfopt model) inside :func:`quantize_scope`.

    The tfmot layers deserialize only inside that scope; the file still goes through the safe
    loader (``trust_model`` as in :func:`tfopt.models.io.load_model`).
    """
    from tfopt.models.io import load_model

    with quantize_scope():
        return load_model(path, trust_model=trust_model)
