"""What an exported classifier gives out: probabilities (the default) or logits, under fixed names.

tfopt trains on logits (a model's final softmax is removed for training, see
``tfopt.models.heads.to_logits``); an app's runtime expects class probabilities. :func:`plan`
decides how the softmax comes back (``--outputs probabilities``, the default) or the logits stay
(``--outputs logits``); a model that already gives probabilities (a user's file) is recognised by
its outputs, not by its layers, so a Keras 3 model reached through a SavedModel is read the same
way. After conversion :func:`name_io` names the signature's input ``image`` and its output after
what it holds, so the file reads the same in every runtime.
"""

from __future__ import annotations

from dataclasses import dataclass

from tfopt.core._keras import keras

import numpy as np

from tfopt.core.errors import ConfigError, ModelError
from tfopt.export.choices import OUTPUTS, check_choice


def check(outputs: str) -> str:
    """``outputs`` when it is one of :data:`OUTPUTS`.

    Raises:
        ConfigError: any other value.
    """
    return check_choice("outputs", outputs, OUTPUTS, "--outputs")


def gives_probabilities(scores: np.ndarray) -> bool:
    """Whether every row of ``scores`` is a probability distribution (>= 0, summing to 1)."""
    scores = np.asarray(scores, dtype=np.float64)
    return bool(
        scores.ndim == 2
        and scores.size
        and np.all(scores >= -1e-6)
        and np.allclose(scores.sum(axis=-1), 1.0, atol=1e-3)
    )


@dataclass(frozen=True)
class Plan:
    """How the exported files come to give what ``--outputs`` asks for."""

    model: keras.Model  # the model to convert
    append_softmax: bool  # a float SOFTMAX op goes after the converted model's float output
    note: str  # what was done, for the log and the record


def plan(model: keras.Model, outputs: str, sample: np.ndarray, integer_io: bool) -> Plan:
    """Decides how the exported files end in ``outputs``.

    A logits model asked for probabilities is converted as it is and gets a float softmax
    appended to each converted file (:func:`append_softmax`): the probabilities are exact, and
    every quantized mode still quantizes the logits it was measured on. Integer outputs
    (``--io int8`` / ``uint8``) cannot take a float op, so there the softmax joins the Keras
    model before conversion and is quantized with it, as the field's integer classifiers are.

    Args:
        model: The tf_keras model (one input, one ``[N, classes]`` output).
        outputs: ``probabilities`` or ``logits``.
        sample: A few inputs, to tell a model that already ends in a softmax.
        integer_io: Whether int8 files get integer inputs and outputs.

    Raises:
        ConfigError: logits asked of a model whose softmax is not its own last layer.
    """
    check(outputs)
    already = gives_probabilities(model(sample[:32], training=False))
    if outputs == "probabilities":
        if already:
            return Plan(model, False, "probabilities (the model's own softmax)")
        if not integer_io:
            return Plan(model, True, "probabilities (a float softmax after the logits)")
        head = keras.layers.Softmax(name="probabilities", dtype="float32")(model.outputs[0])
        return Plan(
            keras.Model(model.inputs, head, name=model.name),
            False,
            "probabilities (a softmax added before conversion, quantized with integer I/O)",
        )
    if not already:
        return Plan(model, False, "logits")
    from tfopt.models.heads import to_logits

    stripped, done = to_logits(model)
    if stripped is model or gives_probabilities(stripped(sample[:32], training=False)):
        raise ConfigError(
            "--outputs logits: the model's softmax is inside it, not its last layer, so its "
            "logits cannot be exported; use --outputs probabilities"
        )
    return Plan(stripped, False, done)


def append_softmax(content: bytes) -> bytes:
    """``content`` with a float SOFTMAX op after its one float output, which it replaces.

    Raises:
        ModelError: the output is not one float32 tensor (integer outputs take their softmax
            before conversion, see :func:`plan`).
    """
    from tfopt.core._compat import read_tflite_model, tflite_schema, write_tflite_model

    schema = tflite_schema()
    model = read_tflite_model(content)
    graph = model.subgraphs[0]
    if len(graph.outputs) != 1 or graph.tensors[graph.outputs[0]].type != schema.TensorType.FLOAT32:
        raise ModelError(
            "a softmax can only follow one float32 output; give integer-output models their "
            "softmax before conversion"
        )
    softmax = schema.BuiltinOperator.SOFTMAX
    codes = model.operatorCodes
    index = next(
        (
            i
            for i, c in enumerate(codes)
            if max(c.builtinCode, c.deprecatedBuiltinCode) == softmax and c.version == 1
        ),
        None,
    )
    if index is None:
        code = schema.OperatorCodeT()
        code.builtinCode = code.deprecatedBuiltinCode = softmax
        code.version = 1
        codes.append(code)
        index = len(codes) - 1
    old = graph.outputs[0]
    tensor = schema.TensorT()
    tensor.shape = graph.tensors[old].shape
    tensor.shapeSignature = graph.tensors[old].shapeSignature
    tensor.type = schema.TensorType.FLOAT32
    tensor.name = "probabilities" if graph.tensors[old].name is not None else None  # stripped
    tensor.buffer = len(model.buffers)
    model.buffers.append(schema.BufferT())
    graph.tensors.append(tensor)
    op = schema.OperatorT()
    op.opcodeIndex = index
    op.inputs = [old]
    op.outputs = [len(graph.tensors) - 1]
    op.builtinOptionsType = schema.BuiltinOptions.SoftmaxOptions
    op.builtinOptions = schema.SoftmaxOptionsT()
    op.builtinOptions.beta = 1.0
    graph.operators.append(op)
    graph.outputs = [len(graph.tensors) - 1]
    for sig in model.signatureDefs or []:
        for item in sig.outputs or []:
            if item.tensorIndex == old:
                item.tensorIndex = graph.outputs[0]
    return write_tflite_model(model)


def name_io(content: bytes, outputs: str) -> bytes:
    """``content`` with its signature's input named ``image`` and its output ``outputs``.

    The input and output tensors take the same names (unless they were stripped).

    Raises:
        ModelError: the model does not have one input and one output.
    """
    from tfopt.core._compat import read_tflite_model, write_tflite_model

    model = read_tflite_model(content)
    graph = model.subgraphs[0]
    if len(graph.inputs) != 1 or len(graph.outputs) != 1:
        raise ModelError(
            f"the model has {len(graph.inputs)} inputs and {len(graph.outputs)} outputs; an "
            "exported classifier takes one image and gives one score tensor"
        )
    for tensor, name in (
        (graph.tensors[graph.inputs[0]], "image"),
        (graph.tensors[graph.outputs[0]], outputs),
    ):
        if tensor.name is not None:
            tensor.name = name
    for sig in model.signatureDefs or []:
        if len(sig.inputs or []) == 1 and len(sig.outputs or []) == 1:
            sig.inputs[0].name = "image"
            sig.outputs[0].name = outputs
    return write_tflite_model(model)
