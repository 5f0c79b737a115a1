"""Every use of a private TensorFlow / tf_keras / tfmot / LiteRT API, and every workaround for an
upstream defect, in one place: this module (tf_keras, tfmot, TensorFlow) and
:mod:`tfopt.core._compat_fit` (tf_keras' fit loop) and :mod:`tfopt.core._compat_lite` (LiteRT and
the TFLite converter), whose names it re-exports.

Each entry says what upstream lacks or gets wrong, the version it was checked against
(``TARGETS``) and the upstream issue where one is known. ``tests/test_compat.py`` holds one test
per entry that fails, naming the entry to change or remove, as soon as upstream changes what it
relies on: a private name disappears, a public equivalent appears, or a defect is fixed.

Private APIs (no public API does the job):

    PRUNE_WRAPPERS, CLUSTER_WRAPPERS       tfmot wrapper classes, for isinstance checks
    QUANTIZE_LAYERS                        tfmot QuantizeLayer (quantizes a QAT model's input)
    prune_registry_supports                tfmot PruneRegistry (which built-in layers prune)
    prunable_weight_names                  tfmot PruneRegistry._weight_names
    cluster_registry_supports              tfmot ClusteringRegistry (which layers cluster)
    clusterable_weight_names               tfmot ClusteringRegistry._weight_names
    is_graph_network                       tf_keras Model._is_graph_network
    producing_layer                        tf_keras KerasTensor._keras_history
    convert_variables_to_constants_v2      tensorflow.python.framework.convert_to_constants
    ConverterError                         tensorflow.lite.python.convert_phase (the TFLite converter's error)
    interpreter_ops_details                LiteRT Interpreter._get_ops_details
    read_tflite_model, write_tflite_model  LiteRT tools.flatbuffer_utils (.tflite <-> editable object)
    saved_model_converter                  tensorflow.lite.python.lite (a Keras model's converter, saved once)
    save_for_converter                     tf_keras keras_option_scope (a SavedModel without layer traces)
    fit_resumes_at                         tf_keras Model._training_state (fit's mid-epoch start)
    build_step_state                       tf_keras compiled_loss / compiled_metrics ``build`` (trace once)
    random_generators                      tf_keras Layer._random_generator (dropout's RNG state)
    accept_remote_logs                     tf_keras Callback._supports_tf_logs (batch hooks under PS)

Workarounds for upstream defects:

    fix_for_keras_format                   tfmot QAT models do not reload from ``.keras``
    StepCountingClusteringSummaries        tfmot ClusteringSummaries miscounts steps
    tfmot_layer_dtype                      tfmot pruning / clustering break under mixed precision
    float32_global_policy                  tfmot QAT breaks under mixed precision

tfmot is imported on first use, never by importing this module: exporting a float model must
not load it (it takes seconds).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from tfopt.core._keras import keras

# TensorFlow 2.21 / tf_keras 2.21: freezing a concrete function's variables into constants (for
# the FLOPs profiler) has no public API; tf.compat.v1.graph_util only freezes v1 GraphDefs.
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

# The fit-loop and LiteRT / TFLite-converter entries live in modules of their own, re-exported here.
from tfopt.core._compat_fit import (
    accept_remote_logs,
    build_step_state,
    fit_resumes_at,
    random_generators,
)
from tfopt.core._compat_lite import (  # noqa: F401 - signature_invoker is used through here too
    ConverterError,
    interpreter_ops_details,
    modify_model_io_type,
    read_tflite_model,
    save_for_converter,
    saved_model_converter,
    signature_invoker,
    tflite_schema,
    write_tflite_model,
)

#: The versions every entry was checked against: the oldest and the newest of setup.cfg's range
#: (CI runs the suite on the newest and its fast tier on the oldest).
TARGETS = {
    "tensorflow": ("2.19", "2.21"),
    "tf_keras": ("2.19", "2.21"),
    "tensorflow-model-optimization": ("0.8.1",),
    "ai-edge-litert": ("2.3",),
}

__all__ = [
    "TARGETS",
    "keras_saved_model_metadata",
    "PRUNE_WRAPPERS",  # noqa: F822 (made on first use by __getattr__)
    "CLUSTER_WRAPPERS",  # noqa: F822 (made on first use by __getattr__)
    "QUANTIZE_LAYERS",  # noqa: F822 (made on first use by __getattr__)
    "prune_registry_supports",
    "prunable_weight_names",
    "cluster_registry_supports",
    "clusterable_weight_names",
    "is_graph_network",
    "producing_layer",
    "model_node_indices",
    "convert_variables_to_constants_v2",
    "ConverterError",
    "interpreter_ops_details",
    "modify_model_io_type",
    "parameter_server_workers",
    "read_tflite_model",
    "write_tflite_model",
    "tflite_schema",
    "saved_model_converter",
    "save_for_converter",
    "fix_for_keras_format",
    "StepCountingClusteringSummaries",  # noqa: F822 (made on first use by __getattr__)
    "tfmot_layer_dtype",
    "float32_global_policy",
    "fit_resumes_at",
    "build_step_state",
    "random_generators",
    "accept_remote_logs",
]


# -- private APIs -------------------------------------------------------------------------------


def _prune_wrappers() -> tuple:
    """tfmot 0.8.1 exports ``prune_low_magnitude`` but not the class it wraps layers in
    (``PruneLowMagnitude``); recognising a pruned layer needs the private class.
    """
    from tensorflow_model_optimization.python.core.sparsity.keras.pruning_wrapper import (
        PruneLowMagnitude,
    )

    return (PruneLowMagnitude,)


def _cluster_wrappers() -> tuple:
    """tfmot 0.8.1 exports ``cluster_weights`` but not the classes it wraps layers in
    (``ClusterWeights`` and its MultiHeadAttention / RNN variants).
    """
    from tensorflow_model_optimization.python.core.clustering.keras.cluster_wrapper import (
        ClusterWeights,
        ClusterWeightsMHA,
        ClusterWeightsRNN,
    )

    return (ClusterWeights, ClusterWeightsMHA, ClusterWeightsRNN)


def _quantize_layers() -> tuple:
    """tfmot 0.8.1 exports ``QuantizeWrapper`` / ``QuantizeWrapperV2`` but not ``QuantizeLayer``, the
    layer ``quantize_apply`` puts after the model input; recognising a QAT model needs it.
    """
    from tensorflow_model_optimization.python.core.quantization.keras.quantize_layer import (
        QuantizeLayer,
    )

    return (QuantizeLayer,)


def _prune_registry():
    from tensorflow_model_optimization.python.core.sparsity.keras.prune_registry import (
        PruneRegistry,
    )

    return PruneRegistry


def _clustering_registry():
    from tensorflow_model_optimization.python.core.clustering.keras.clustering_registry import (
        ClusteringRegistry,
    )

    return ClusteringRegistry


def prune_registry_supports(layer) -> bool:
    """True when tfmot's pruning registry knows the built-in layer class of ``layer``.

    tfmot 0.8.1: ``prune_low_magnitude`` finds out only by raising ValueError on the whole model;
    the registry that decides (``PruneRegistry``) is private.
    """
    return bool(_prune_registry().supports(layer))


def prunable_weight_names(layer) -> list[str]:
    """Names of the weights tfmot prunes in the built-in ``layer`` (e.g. ``["kernel"]``; ``[]``: none).

    tfmot 0.8.1: ``PruneRegistry._weight_names`` (private) raises KeyError for the RNN layers the
    registry supports; tfmot prunes ``kernel`` and ``recurrent_kernel`` of their cells.
    """
    registry = _prune_registry()
    if not registry.supports(layer):
        return []
    try:
        return list(registry._weight_names(layer))
    except KeyError:  # RNN layers: the weights belong to their cells
        return ["kernel", "recurrent_kernel"]


def cluster_registry_supports(layer) -> bool:
    """True when tfmot's clustering registry knows the built-in layer class of ``layer``.

    tfmot 0.8.1: ``cluster_weights`` only warns and leaves an unknown layer alone; the registry
    that decides (``ClusteringRegistry``) is private.
    """
    return bool(_clustering_registry().supports(layer))


def clusterable_weight_names(layer) -> list[str]:
    """Names of the weights tfmot clusters in the built-in ``layer`` (``[]``: none, or no trainable weights).

    tfmot 0.8.1: ``ClusteringRegistry._weight_names`` (private) raises KeyError for the RNN and
    MultiHeadAttention layers the registry supports; tfmot clusters their kernels.
    """
    registry = _clustering_registry()
    if not registry.supports(layer):
        return []
    try:
        return list(registry._weight_names(layer))
    except KeyError:  # RNN layers and cells, MultiHeadAttention: their kernels
        return sorted(
            {
                w.name.split("/")[-1].split(":")[0]
                for w in layer.trainable_weights
                if "kernel" in w.name
            }
        )


def is_graph_network(model) -> bool:
    """True for a functional (or built Sequential) tf_keras model, False for a subclassed one.

    tf_keras 2.21 has no public way to tell a layer-graph model (which tfmot can rewrite) from a
    subclassed one: the ``Functional`` class and ``Model._is_graph_network`` are private.
    """
    return bool(getattr(model, "_is_graph_network", False))


def producing_layer(tensor) -> keras.layers.Layer:
    """The layer that produced a symbolic tf_keras tensor (e.g. one of ``model.outputs``).

    tf_keras 2.21 keeps it only in the private ``KerasTensor._keras_history``; the public
    ``model.output_names`` are de-duplicated names, not necessarily layer names.
    """
    return tensor._keras_history.layer


def model_node_indices(model, layer) -> list[int]:
    """Which calls of ``layer`` (indices into ``layer.inbound_nodes``) belong to ``model``'s graph.

    A layer object used by several models (a clone's source, a tfmot-stripped model) keeps the
    nodes of all of them; tf_keras 2.21 records a model's own in the private
    ``Functional._network_nodes`` (keys ``<layer>_ib-<index>``).
    """
    own = getattr(model, "_network_nodes", None)
    indices = range(len(layer.inbound_nodes))
    return list(indices) if own is None else [i for i in indices if f"{layer.name}_ib-{i}" in own]


def parameter_server_workers(strategy) -> int:
    """The worker count of a ``ParameterServerStrategy``.

    ParameterServerStrategyV2 keeps its cluster resolver in the private ``_cluster_resolver``
    (``Strategy.cluster_resolver`` reads ``strategy.extended`` and returns None), and its worker
    count in ``extended._num_workers`` when it has no resolver.
    """
    resolver = strategy.cluster_resolver or getattr(strategy, "_cluster_resolver", None)
    if resolver is not None:
        return resolver.cluster_spec().num_tasks("worker")
    return strategy.extended._num_workers


def sharded_container(variable):
    """The ``ShardedVariable`` that ``variable`` is a shard of, or None for a whole variable.

    A tf_keras layer lists a sharded weight as its shards (``layer.weights``); TensorFlow links each
    shard to its container only through the private weak reference ``_sharded_container``.
    """
    ref = getattr(variable, "_sharded_container", None)
    return ref() if ref is not None else None


def keras_saved_model_metadata(path: str) -> list[tuple[str, str]]:
    """``(node_path, metadata JSON)`` of every object a tf_keras SavedModel's ``keras_metadata.pb`` describes.

    tf_keras 2.21 revives layers from this metadata (a Lambda's stored bytecode included); its
    message class lives in ``tf_keras.protobuf``, which tf_keras does not document.

    Raises:
        OSError: the file cannot be read.
        google.protobuf.message.DecodeError: it is not a SavedMetadata message.
    """
    import os

    from tf_keras.protobuf import saved_metadata_pb2

    proto = saved_metadata_pb2.SavedMetadata()
    with open(os.path.join(path, "keras_metadata.pb"), "rb") as f:
        proto.ParseFromString(f.read())
    return [(node.node_path, node.metadata) for node in proto.nodes]


def fix_for_keras_format(model: keras.Model) -> None:
    """Makes a default-scheme QAT model save what a ``.keras`` reload will look for.

    tfmot 0.8.1 with tf_keras 2.21: a model from ``quantize_model`` / ``quantize_apply`` saved as
    ``.keras`` does not load back (ValueError: "Layer 'quantize_layer' expected 5 variables, but
    received 3"). Upstream fix proposed in https://github.com/tensorflow/model-optimization/pull/1123
    (open); the same family of weight-count mismatches: model-optimization#524, #887.

    * ``QuantizeLayer.build`` never marks the layer built, so a reload from its build config
      builds it a second time: drop its build config (the reload builds it once, on call).
    * ``QuantizeWrapperV2.build`` appends the inner layer's trainable weights and then the
      quantized ones again, so it saves duplicates a reload does not create: keep only the
      quantized weights as the wrapper's own (private ``_weight_vars`` / ``_trainable_weights``;
      the inner layer still saves all of its own), and drop the build configs so a reload builds
      the inner layer inside the wrapper's build, as ``quantize_apply`` did.

    Args:
        model: A default-scheme QAT model (changed in place; call before saving).
    """
    import tensorflow_model_optimization as tfmot

    for layer in model.layers:
        if isinstance(layer, tfmot.quantization.keras.QuantizeWrapper):
            own = []
            for weight, _, _ in layer._weight_vars:
                if not any(weight is o for o in own):
                    own.append(weight)
            layer._trainable_weights[:] = own
            layer.get_build_config = _no_build_config
            layer.layer.get_build_config = (
                _no_build_config  # built by the wrapper, after its own weights
            )
        elif isinstance(layer, _quantize_layers()):
            layer.get_build_config = _no_build_config


def _no_build_config():
    return None


def _make_step_counting_clustering_summaries():
    import tensorflow_model_optimization as tfmot

    class StepCountingClusteringSummaries(tfmot.clustering.keras.ClusteringSummaries):
        """tfmot's ClusteringSummaries, writing each histogram at the right training step.

        tfmot 0.8.1 (no upstream issue found) counts one step per ``on_train_batch_begin`` call
        and asserts that its count is at least Keras' batch index. With ``steps_per_execution``
        > 1 Keras calls once per execution with the index of its last step, which breaks that
        assertion (AssertionError) whenever some callback makes Keras call batch hooks (a
        progress bar, ``UpdatePruningStep``). Without such a callback Keras calls no batch hook
        at all and every epoch's histograms land on step 0. Here the step is the step number
        itself, and at the end of an epoch the optimizer's step count (also right after a
        resume).
        """

        def __init__(self, log_dir: str):
            super().__init__(log_dir=log_dir)
            self._steps = self._epoch_start = 0

        def on_epoch_begin(self, epoch, logs=None):
            super().on_epoch_begin(epoch, logs)
            self._epoch_start = self._steps

        def on_train_batch_begin(self, batch, logs=None):
            keras.callbacks.TensorBoard.on_train_batch_begin(
                self, batch, logs
            )  # not tfmot's one-per-call count

        def on_train_batch_end(self, batch, logs=None):
            self._steps = self.continuous_batch = self._epoch_start + batch + 1
            super().on_train_batch_end(batch, logs)

        def on_epoch_end(self, epoch, logs=None):
            iterations = getattr(getattr(self.model, "optimizer", None), "iterations", None)
            if iterations is not None:
                self._steps = self.continuous_batch = int(iterations.numpy())
            super().on_epoch_end(epoch, logs)

    StepCountingClusteringSummaries.__module__ = __name__
    StepCountingClusteringSummaries.__qualname__ = "StepCountingClusteringSummaries"
    return StepCountingClusteringSummaries


def tfmot_layer_dtype(policy: str) -> str | None:
    """The dtype policy of the layers tfmot prunes or clusters, and of their wrappers, under ``policy``.

    ``"float32"`` under a mixed policy, ``None`` (keep the global policy) under float32; the other
    layers keep the mixed policy. tfmot 0.8.1 under ``mixed_bfloat16`` / ``mixed_float16``:

    * pruning: the mask update assigns a mixed-dtype product to the float32 mask variable, which
      fails under MirroredStrategy (ValueError: "Tensor conversion requested dtype float32 for
      Tensor with dtype bfloat16"); https://github.com/tensorflow/model-optimization/issues/409
      (open).
    * clustering: every centroid initialization reads the weights as the wrapper casts them
      (bfloat16 / float16) and its kernels accept float32 only (InvalidArgumentError); no
      upstream issue found.
    """
    return None if policy == "float32" else "float32"


@contextmanager
def float32_global_policy() -> Iterator[None]:
    """Sets the global Keras dtype policy to float32 inside the block, then restores it.

    tfmot 0.8.1 with TF 2.21: QAT cannot run in a mixed dtype. TensorFlow's fake-quantization
    kernels (``FakeQuantWithMinMaxVars``) accept float32 only
    (https://github.com/tensorflow/tensorflow/issues/51857, model-optimization#824), and
    ``quantize_apply`` under a mixed global policy fails
    (https://github.com/tensorflow/model-optimization/issues/367, open). The annotation and
    quantize wrappers take the global policy, so they are created inside this block.
    """
    previous = keras.mixed_precision.global_policy().name
    keras.mixed_precision.set_global_policy("float32")
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(previous)


# tfmot-backed names are built on first access (PEP 562), so importing this module never loads tfmot.
_LAZY = {
    "PRUNE_WRAPPERS": _prune_wrappers,
    "CLUSTER_WRAPPERS": _cluster_wrappers,
    "QUANTIZE_LAYERS": _quantize_layers,
    "StepCountingClusteringSummaries": _make_step_counting_clustering_summaries,
}


def __getattr__(name: str):
    if name in _LAZY:
        value = globals()[name] = _LAZY[name]()
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
