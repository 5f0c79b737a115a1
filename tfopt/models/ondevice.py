"""The on-device training module: a classifier cut before its last Dense layer, as a .tflite
whose head trains in LiteRT through ``infer``, ``train``, ``save`` and ``restore`` signatures
(what ``tfopt export --trainable`` writes, :mod:`tfopt.export.trainable`, and what federated
clients train with ``--client-runtime litert``).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass

from tfopt.core._keras import keras, tf

import numpy as np

from tfopt.core.errors import ModelError
from tfopt.models.heads import to_logits

SIGNATURES = ("infer", "train", "save", "restore")


@dataclass(frozen=True)
class Split:
    """A classifier cut before its last Dense layer."""

    backbone: keras.Model  # input -> the head's input features, frozen in the file
    head: keras.layers.Dense  # the layer that trains on the device

    def section(self) -> dict:
        """What the record says of the split."""
        trainable = int(np.prod(self.head.kernel.shape)) + int(self.head.units)
        return {
            "head": self.head.name,
            "trainable_params": trainable,
            "frozen_params": int(self.backbone.count_params()),
            "frozen_layers": len(self.backbone.layers),
        }


def split(model: keras.Model) -> Split:
    """Cuts ``model`` before its last Dense layer (a final softmax is dropped first).

    Raises:
        ModelError: a model whose output does not come from a Dense layer on flat features;
            the line names the layer.
    """
    model, _ = to_logits(model)
    layer = model.get_layer(model.output_names[0])
    activation = getattr(getattr(layer, "activation", None), "__name__", "")
    if not isinstance(layer, keras.layers.Dense) or activation != "linear":
        raise ModelError(
            f"--trainable retrains the last Dense layer, and {model.name!r} ends in "
            f"{layer.name!r} ({type(layer).__name__}); give a classifier whose scores come "
            "from a Dense layer"
        )
    if len(layer.input.shape) != 2:
        raise ModelError(
            f"--trainable: the head {layer.name!r} reads a {len(layer.input.shape)}-d tensor; "
            "the head must read flat features (add a pooling or Flatten layer before it)"
        )
    return Split(keras.Model(model.inputs, layer.input, name="backbone"), layer)


class OnDevice(tf.Module):
    """The four signatures over a frozen backbone and a trainable head."""

    def __init__(self, part: Split, image_shape, learning_rate: float, outputs: str):
        super().__init__(name="on_device")
        self.backbone = part.backbone
        kernel = part.head.kernel.numpy().astype(np.float32)
        self.kernel = tf.Variable(kernel, name="kernel")
        bias = part.head.bias.numpy() if part.head.use_bias else np.zeros(kernel.shape[1])
        self.bias = tf.Variable(bias.astype(np.float32), name="bias")
        self.learning_rate = float(learning_rate)
        self.outputs = outputs
        image = tf.TensorSpec([None, *image_shape], tf.float32, name="image")
        label = tf.TensorSpec([None], tf.int32, name="label")
        self.infer = tf.function(self._infer, input_signature=[image])
        self.train = tf.function(self._train, input_signature=[image, label])
        self.save = tf.function(self._save, input_signature=[])
        self.restore = tf.function(
            self._restore,
            input_signature=[
                tf.TensorSpec(kernel.shape, tf.float32, name="kernel"),
                tf.TensorSpec(kernel.shape[1:], tf.float32, name="bias"),
            ],
        )

    def _logits(self, image):
        features = tf.cast(self.backbone(image, training=False), tf.float32)
        return features, tf.matmul(features, self.kernel) + self.bias

    def _infer(self, image):
        _, logits = self._logits(image)
        if self.outputs == "logits":
            return {"logits": logits}
        return {"probabilities": tf.nn.softmax(logits)}

    def _train(self, image, label):
        features, logits = self._logits(image)
        onehot = tf.one_hot(label, tf.shape(logits)[1], dtype=tf.float32)
        loss = -tf.reduce_mean(tf.reduce_sum(onehot * tf.nn.log_softmax(logits), axis=-1))
        # d(mean cross-entropy)/d(logits), written out: builtin kernels only.
        grad = (tf.nn.softmax(logits) - onehot) / tf.cast(tf.shape(image)[0], tf.float32)
        self.kernel.assign_sub(self.learning_rate * tf.matmul(features, grad, transpose_a=True))
        self.bias.assign_sub(self.learning_rate * tf.reduce_sum(grad, axis=0))
        return {"loss": loss}

    def _save(self):
        return {"kernel": tf.identity(self.kernel), "bias": tf.identity(self.bias)}

    def _restore(self, kernel, bias):
        self.kernel.assign(kernel)
        self.bias.assign(bias)
        return self._save()


def convert(part: Split, image_shape, learning_rate: float, outputs: str) -> bytes:
    """The bare flatbuffer with the four signatures (``infer`` is subgraph 0, which metadata
    describes and single-signature runtimes run)."""
    module = OnDevice(part, image_shape, learning_rate, outputs)
    signatures = {name: getattr(module, name).get_concrete_function() for name in SIGNATURES}
    with tempfile.TemporaryDirectory(prefix="tfopt-trainable-") as saved:
        tf.saved_model.save(module, saved, signatures=signatures)
        converter = tf.lite.TFLiteConverter.from_saved_model(saved, signature_keys=list(SIGNATURES))
        converter.experimental_enable_resource_variables = True
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
        return converter.convert()


def runners(content: bytes) -> dict:
    """LiteRT's signature runners of a trainable file, by name (one interpreter: they share
    the head's variables)."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=content)
    return {name: interpreter.get_signature_runner(name) for name in SIGNATURES}
