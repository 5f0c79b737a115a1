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

from tfopt.core._keras import keras

import numpy as np

from tfopt.core.errors import ModelError
from tfopt.export.converter import float32_copy, is_qat_model
from tfopt.export.evaluate import _interpreter_class
from tfopt.models.ondevice import SIGNATURES, Split, convert, runners, split  # noqa: F401

FILE = "model_trainable.tflite"


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


def refuse_qat(model: keras.Model) -> None:
    """Refuses a quantization-aware model: the trainable file is float.

    Raises:
        ModelError: the one line that says which run to export instead.
    """
    if is_qat_model(model):
        raise ModelError(
            "--trainable exports a float model, and this one is quantization-aware (QAT); "
            "export the run it was fine-tuned from with --trainable"
        )


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
    refuse_qat(model)
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
