"""Keras -> .tflite conversion for every post-training quantization mode.

Modes (``MODES``):

- ``float32``: plain conversion, no quantization.
- ``dynamic``: dynamic-range quantization (int8 weights, float activations quantized on the fly).
- ``float16``: float16 weights, float32 compute.
- ``int8``: full-integer quantization calibrated on a representative dataset; I/O stays float
  or becomes int8/uint8 (``ConvertOptions.io``). A quantization-aware-trained (QAT) model
  converts to int8 with the ranges it learned, no calibration needed.
- ``int16x8``: 16-bit activations, 8-bit weights (calibrated; float I/O).
- ``int8_auto``: int8 with the ops whose int8 kernel is slower kept in float, chosen by measurement
  (:mod:`tfopt.export.auto`; ``convert`` refuses it, the export runner does the search).
- ``dynamic_selective``, ``int8_weights``, ``int4_weights``, ``recipe``: the float32 conversion,
  then quantized op by op by ai-edge-quantizer (:mod:`tfopt.export.aeq`).

``ConvertOptions.strip_strings`` removes what the runtime never reads from the flatbuffer (tensor
names, the subgraph name, the model description): see :func:`strip_strings`.

The representative dataset is drawn deterministically from the run's own training pipeline
(``calibration_batches``). Only TFLite builtin ops are allowed unless the caller opts into
Select TF ops; an op without a builtin kernel becomes a ``ConversionError`` naming the op and
the layer it comes from.
"""

from __future__ import annotations

from collections.abc import Sequence

from tfopt.core._keras import keras

import numpy as np

from tfopt.core.errors import ConfigError
from tfopt.export.choices import BOTH_QUANTIZERS, MODES, check_choice
from tfopt.export.converter import (  # noqa: F401  (the export stage's conversion surface)
    SPARSITY_THRESHOLD,
    ConversionError,
    Converted,
    ConvertOptions,
    by_converter,
    calibration_batches,
    check_modes_for,
    finish,
    flex_ops,
    float32_copy,
    is_qat_model,
    make_converter,
    modify_io,
    representative_fn,
    run_converter,
    saved_models,
    strip_strings,
    weight_sparsity,
)


def convert(
    model: keras.Model,
    mode: str,
    *,
    calibration: Sequence[np.ndarray] | None = None,
    options: ConvertOptions | None = None,
) -> Converted:
    """Converts ``model`` to a .tflite flatbuffer for ``mode``.

    Args:
        model: A tf_keras model (float, pruned, or quantization-aware trained).
        mode: One of ``MODES``.
        calibration: Representative batches for int8 and int16x8 (see ``calibration_batches``).
        options: I/O type, Select TF ops, sparse encoding, quantizer (default ``ConvertOptions()``).

    Returns:
        The flatbuffer and what was done to get it.

    Raises:
        ConfigError: bad mode/options, or no calibration data where needed.
        ConversionError: the converter failed; the message names the unsupported op(s).
    """
    options = options or ConvertOptions()
    if MODES.get(check_choice("mode", mode, MODES.names(), "--modes")).latency_aware:
        raise ConfigError(
            f"mode {mode!r} is chosen by measuring candidate models, not by one conversion: use "
            "tfopt.export.auto.search, or python -m tfopt.export --modes int8_auto"
        )
    with saved_models():  # the model written once for its conversions (a caller's cache, if any)
        if MODES.get(mode).quantizer or (
            options.quantizer == "litert" and mode in BOTH_QUANTIZERS and not is_qat_model(model)
        ):
            return _by_recipe(model, mode, calibration, options)
        return by_converter(model, mode, calibration=calibration, options=options)


def _by_recipe(
    model: keras.Model,
    mode: str,
    calibration: Sequence[np.ndarray] | None,
    options: ConvertOptions,
) -> Converted:
    """The float32 conversion, quantized by ai-edge-quantizer with the mode's recipe."""
    from tfopt.export import aeq
    from tfopt.export.ops import model_ops

    aeq.require()  # before converting: a missing package is one line, at once
    if mode == "recipe":
        if not options.recipe:
            raise ConfigError(
                "mode recipe quantizes as a recipe file says; give --recipe FILE.json"
            )
        recipe, where = aeq.read_recipe(options.recipe), options.recipe
    else:
        recipe, where = aeq.named_recipe("dynamic" if mode == "dynamic_auto" else mode), mode
    model = float32_copy(model)
    base = run_converter(
        make_converter(model, "float32", options=options), model, "float32", options
    )
    notes = [f"{mode}: quantized by ai-edge-quantizer from the float32 model"]
    if mode == "dynamic_auto":
        from tfopt.export import dynamic_auto

        choice = dynamic_auto.choose(base)
        content, recipe = choice.content, choice.recipe
        notes += choice.notes
    else:
        if mode == "recipe":
            aeq.check_recipe(recipe, model_ops(base), where)
        content = aeq.quantize(base, recipe, calibration=calibration, where=where)
    from ai_edge_litert.interpreter import Interpreter

    dtype = np.dtype(Interpreter(model_content=content).get_input_details()[0]["dtype"])
    return Converted(
        mode=mode,
        content=finish(content, options),
        io="float" if dtype.kind == "f" else str(dtype),
        notes=notes,
        recipe=recipe,
        quantizer="litert",
    )
