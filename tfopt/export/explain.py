"""Why the TFLite converter refused a model, in one line: the ops without a builtin kernel and
the Keras layers they come from (found by converting again with Select TF ops and reading the
TFLite analyzer's report)."""

from __future__ import annotations

import contextlib
import io
import re

from tfopt.core._keras import keras, tf

from tfopt.core import native_stderr
from tfopt.core._compat import ConverterError

# What TFLiteConverter.convert raises for a model or a setting it cannot handle (TF 2.21 sources,
# tensorflow/lite/python): ConverterError (unsupported ops, failed legalization), ValueError
# (unsupported settings; calibration data of the wrong dtype), RuntimeError (the calibration
# interpreter, e.g. data of the wrong shape) and tf.errors.OpError (tracing/freezing the model).
# Anything else (ZeroDivisionError, MemoryError, a TypeError) is a bug and keeps its traceback.
CONVERTER_ERRORS = (ConverterError, ValueError, RuntimeError, tf.errors.OpError)
# RuntimeError subclasses that mean a bug, not a model the converter refuses.
NOT_CONVERTER_ERRORS = (NotImplementedError, RecursionError)


def flex_ops(model: keras.Model) -> dict[str, list[str]]:
    """Converts with Select TF ops allowed; returns the Flex ops the TFLite analyzer lists, with their layers.

    Returns:
        ``{op: [Keras layer names]}``; the layer comes from the op's output tensor name
        (``model/<layer>/<Op>``).
    """
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    converter.target_spec.supported_ops = [
        tf.lite.OpsSet.TFLITE_BUILTINS,
        tf.lite.OpsSet.SELECT_TF_OPS,
    ]
    with native_stderr.quiet():
        content = converter.convert()
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        tf.lite.experimental.Analyzer.analyze(model_content=content)
    text = buf.getvalue()
    names = dict(re.findall(r"T#(\d+)\(([^)]*)\)", text))
    found: dict[str, list[str]] = {}
    for op, outputs in re.findall(r"Op#\d+ Flex(\w+)\([^)]*\) -> \[([^\]]*)\]", text):
        layers = found.setdefault(op, [])
        for t in re.findall(r"T#(\d+)", outputs):
            parts = names.get(t, "").split("/")
            if len(parts) >= 3 and parts[1] not in layers:
                layers.append(parts[1])
    return found


def explain_error(error: Exception, model: keras.Model, mode: str, options) -> str:
    """Turns a converter failure into one line naming the unsupported op(s) and their layers."""
    text = str(error)
    ops = set(re.findall(r"'tf\.(\w+)' op is neither a custom op nor a flex op", text))
    for line in re.findall(r"TF Select ops: ([^\n]+)", text):
        ops.update(o.strip() for o in line.split(",") if o.strip())
    layers: dict[str, list[str]] = {}
    if not options.allow_select_tf_ops:
        try:  # the analyzer names the ops that need TF kernels, and (via tensor names) their layers
            layers = flex_ops(model)
        except (
            CONVERTER_ERRORS
        ) as e:  # the analyzer path failed too; fall back to the converter's words
            if isinstance(e, NOT_CONVERTER_ERRORS):
                raise
            layers = {}
        ops.update(layers)
    if ops:
        where = [
            f"{op} (layer {', '.join(map(repr, layers[op]))})" if layers.get(op) else op
            for op in sorted(ops)
        ]
        return (
            f"cannot convert to {mode!r} with TFLite builtin ops: {', '.join(where)} has no builtin TFLite "
            "kernel; replace that layer, or pass --allow-select-tf-ops (the .tflite then needs the "
            "TF Select/Flex delegate at run time)"
        )
    unsupported = re.findall(r"'(tf\.\w+|tfl\.\w+)' op ([^\n]+)", text)
    if unsupported:
        op, why = unsupported[0]
        return f"cannot convert to {mode!r}: op {op} {why.strip()}; change that layer or pick another mode"
    lines = [ln.strip() for ln in text.splitlines() if "error:" in ln]
    detail = (
        lines[0].split("error:", 1)[1].strip()
        if lines
        else text.strip().splitlines()[0]
        if text.strip()
        else type(error).__name__
    )
    return f"cannot convert to {mode!r}: {detail[:300]}"
