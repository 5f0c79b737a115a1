"""On-device training: a .tflite whose classifier head trains in LiteRT (``--trainable``).

LiteRT trains on the device through a model's signatures, as its on-device training guide
does it. The file :func:`make` writes has four:

- ``infer(image) -> {probabilities | logits}``: what the other exports compute;
- ``train(image, label) -> {loss}``: one SGD step of the head on a batch (labels are class
  indices), returning the batch's cross-entropy before the step;
- ``save() -> {kernel, bias}``: the head's weights, for the app to keep;
- ``restore(kernel, bias) -> {kernel, bias}``: puts kept weights back.

The backbone (every layer before the last Dense) is frozen into constants; the head's kernel
and bias are the file's only variables. ``save`` and ``restore`` pass the weights as tensors,
not as a checkpoint path: the file needs no TF Select (Flex) op, so LiteRT's builtin runtime
(Android, iOS, the ai-edge-litert wheel) runs all four signatures, and a federated client
sends exactly what ``save`` returns. The head's gradient is written out (``softmax - onehot``),
so the step uses builtin kernels only and equals the numpy step :func:`verify` checks it against.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass

from tfopt.core._keras import keras, tf

import numpy as np

from tfopt.core.errors import ModelError
from tfopt.export.converter import float32_copy, is_qat_model
from tfopt.export.evaluate import _interpreter_class
from tfopt.models.heads import to_logits

FILE = "model_trainable.tflite"
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
        ModelError: a QAT model, or a model whose output does not come from a Dense layer on
            flat features; the line names the layer.
    """
    if is_qat_model(model):
        raise ModelError(
            "--trainable exports a float model, and this one is quantization-aware (QAT); "
            "export the run it was fine-tuned from with --trainable"
        )
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


class _OnDevice(tf.Module):
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
    module = _OnDevice(part, image_shape, learning_rate, outputs)
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
    Interpreter, _ = _interpreter_class()
    interpreter = Interpreter(model_content=content)
    return {name: interpreter.get_signature_runner(name) for name in SIGNATURES}


def verify(
    content: bytes,
    part: Split,
    x: np.ndarray,
    y: np.ndarray,
    learning_rate: float,
    outputs: str,
) -> dict:
    """Runs the file in LiteRT against independent computations; returns the largest gaps.

    ``infer`` against the Keras layers; one ``train`` step against the same SGD step in numpy
    on the Keras backbone's features; ``restore`` of what ``save`` gave before the step
    against ``infer`` before it. Raises AssertionError (a bug of tfopt's) past float tolerance.
    """
    run = runners(content)
    x = x.astype(np.float32)
    features = part.backbone(x, training=False)
    logits = np.asarray(part.head(features), dtype=np.float64)
    want = _softmax(logits) if outputs == "probabilities" else logits
    before = run["infer"](image=x)[outputs]
    infer_gap = float(np.max(np.abs(before - want)))
    kept = run["save"]()
    features = np.asarray(features, dtype=np.float64)
    kernel, bias = kept["kernel"].astype(np.float64), kept["bias"].astype(np.float64)
    z = features @ kernel + bias
    onehot = np.eye(kernel.shape[1])[y]
    loss = float(-np.mean(np.sum(onehot * _log_softmax(z), axis=1)))
    grad = (_softmax(z) - onehot) / len(x)
    got_loss = float(run["train"](image=x, label=y.astype(np.int32))["loss"])
    stepped = run["save"]()
    step_gap = max(
        float(np.max(np.abs(stepped["kernel"] - (kernel - learning_rate * features.T @ grad)))),
        float(np.max(np.abs(stepped["bias"] - (bias - learning_rate * grad.sum(axis=0))))),
    )
    run["restore"](kernel=kept["kernel"], bias=kept["bias"])
    restore_gap = float(np.max(np.abs(run["infer"](image=x)[outputs] - before)))
    gaps = {
        "infer_vs_keras": infer_gap,
        "loss_vs_numpy": abs(got_loss - loss),
        "train_step_vs_numpy": step_gap,
        "restore": restore_gap,
    }
    assert infer_gap < 1e-3 and step_gap < 1e-4 and restore_gap == 0.0, gaps
    return {"examples": int(len(x)), **{k: float(f"{v:.3g}") for k, v in gaps.items()}}


def make(
    model: keras.Model,
    contract: dict,
    x: np.ndarray,
    y: np.ndarray,
    learning_rate: float,
    outputs: str,
) -> tuple[bytes, dict]:
    """Converts ``model`` to a trainable .tflite and checks it (see :func:`verify`).

    Args:
        model: The tf_keras classifier as loaded (float; a mixed-precision one is exported from
            its float32 twin).
        contract: The export's input contract (``image_shape``).
        x, y: A few held-out examples and their labels, for the checks.
        learning_rate: The SGD step of ``train``.
        outputs: ``probabilities`` or ``logits``: what ``infer`` gives.

    Returns:
        The bare flatbuffer (metadata is attached by the caller) and the record's section.

    Raises:
        ModelError: a model :func:`split` refuses.
    """
    if not learning_rate > 0:
        raise ModelError(f"--trainable-lr {learning_rate} must be > 0; give e.g. 0.01")
    model = float32_copy(model)
    part = split(model)
    content = convert(part, contract["image_shape"], learning_rate, outputs)
    checks = verify(content, part, x, y, learning_rate, outputs)
    section = {
        "file": FILE,
        "signatures": signature_list(content),
        "learning_rate": learning_rate,
        "optimizer": "sgd",
        **part.section(),
        "checks": checks,
    }
    return content, section


def signature_list(content: bytes) -> dict:
    """Each signature's input and output names, as LiteRT lists them."""
    Interpreter, _ = _interpreter_class()
    listed = Interpreter(model_content=content).get_signature_list()
    return {
        k: {"inputs": sorted(v["inputs"]), "outputs": sorted(v["outputs"])}
        for k, v in listed.items()
    }


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _log_softmax(z: np.ndarray) -> np.ndarray:
    m = z.max(axis=1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(axis=1, keepdims=True))
