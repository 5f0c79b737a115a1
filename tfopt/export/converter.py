"""The TFLite converter's path: a Keras model to a .tflite flatbuffer, quantized by the converter.

:func:`by_converter` converts for the modes the converter makes itself; :mod:`tfopt.export.tflite`
chooses between it and LiteRT Quantizer for each mode. Here also: the representative dataset,
drawn deterministically from the run's own training pipeline (``calibration_batches``), the float32
copy of a mixed-precision model, sparse encoding, I/O types, and the string stripping every
exported file gets. Only TFLite builtin ops are allowed unless the caller opts into Select TF ops;
an op without a builtin kernel becomes a ``ConversionError`` naming the op and the layer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from tfopt.core._keras import keras, tf

import numpy as np

from tfopt.compress.common import tfmot_imported
from tfopt.config import DataConfig
from tfopt.core import native_stderr

# TF 2.21: the MLIR converter's error class is not in tf.lite's public API; nor is editing a flatbuffer
# or converting a Keras model without writing it to a SavedModel each time.
from tfopt.core._compat import save_for_converter, saved_model_converter  # noqa: E402
from tfopt.core.errors import ConfigError, ModelError
from tfopt.data.pipeline import make_dataset
from tfopt.data.sources import DatasetInfo
from tfopt.export.choices import (
    IO_TYPES,
    MODES,
    QUANTIZERS,
    SPARSITY_CHOICES,
    check_choice,
)
from tfopt.export.explain import (  # noqa: F401 - part of the converter's surface
    CONVERTER_ERRORS as _CONVERTER_ERRORS,
)
from tfopt.export.explain import NOT_CONVERTER_ERRORS as _NOT_CONVERTER_ERRORS
from tfopt.export.explain import explain_error, flex_ops  # noqa: F401
from tfopt.export.flatbuffer import (  # noqa: F401 - part of the converter's surface
    IO_DTYPES,
    ConversionError,
    finish,
    modify_io,
    strip_strings,
)

# Below this fraction of zero weights the sparse encoding costs more than it saves.
SPARSITY_THRESHOLD = 0.5


@dataclass(frozen=True)
class ConvertOptions:
    """How to convert, beyond the mode.

    Attributes:
        io: ``float``, ``int8`` or ``uint8``: the input/output type of full-integer (``int8``)
            models. Other modes keep float I/O.
        allow_select_tf_ops: Let ops without a builtin kernel run as TF Select (Flex) ops; the
            .tflite then needs the Flex delegate at run time.
        sparsity: ``auto`` (try the sparse weight encoding when at least ``SPARSITY_THRESHOLD``
            of the weights are zero, keep it if the file is smaller), ``on`` or ``off``.
        strip_strings: Strip tensor names and other strings the runtime does not need
            (:func:`strip_strings`).
        recipe: The ai-edge-quantizer recipe file of mode ``recipe``.
        quantizer: Who quantizes ``dynamic``, ``float16``, ``int8`` and ``int16x8``:
            ``converter`` (the TFLite converter) or ``litert`` (LiteRT Quantizer,
            ai-edge-quantizer, from the float32 .tflite). The converter is the default: it was
            the better path for every mode in benchmark B9q (docs/export.md, "Who quantizes").
    """

    io: str = "float"
    allow_select_tf_ops: bool = False
    sparsity: str = "auto"
    strip_strings: bool = False
    recipe: str = ""
    quantizer: str = "converter"

    def __post_init__(self):
        check_choice("io", self.io, IO_TYPES, "--io")
        check_choice("sparsity", self.sparsity, SPARSITY_CHOICES, "--sparsity")
        check_choice("quantizer", self.quantizer, QUANTIZERS, "--quantizer")
        if self.quantizer == "litert" and self.io != "float":
            raise ConfigError(
                f"--io {self.io} is the converter's: tfopt's LiteRT Quantizer recipes keep float "
                "I/O; drop --io or use --quantizer converter"
            )


@dataclass
class Converted:
    """One converted model."""

    mode: str
    content: bytes
    io: str  # the I/O type actually used: float unless int8 with int8/uint8 I/O
    sparse: bool = False  # written with the sparse weight encoding
    qat: bool = False  # converted from a quantization-aware-trained model
    notes: list[str] = field(default_factory=list)
    recipe: list[dict] | None = None  # the ai-edge-quantizer recipe it was quantized with
    quantizer: str | None = "converter"  # who quantized it: converter | litert | None (float32)


def check_modes_for(model: keras.Model, modes: Sequence[str]) -> None:
    """Refuses modes a model cannot take (a QAT model converts to int8 only) before any work."""
    if is_qat_model(model):
        others = [m for m in modes if m != "int8"]
        if others:
            raise ConfigError(
                f"the model is quantization-aware trained (QAT): it converts to int8 only, not "
                f"{', '.join(others)}; use --modes int8 (export the float model for the other modes)"
            )


def calibration_batches(
    data_cfg: DataConfig, steps: int, info: DatasetInfo | None = None
) -> list[np.ndarray]:
    """Draws ``steps`` image batches from the run's training pipeline, deterministically.

    The pipeline is the one the run trained on (same source, batch size, seed and shuffle), with
    deterministic ordering forced, augmentation off (calibration must see the inputs inference
    will see) and no cache (a partial pass would only be thrown away). Two calls give the same
    batches.

    Args:
        data_cfg: The run's data config.
        steps: How many batches (>= 1).
        info: The prepared dataset, when already at hand.

    Returns:
        Up to ``steps`` float32 arrays ``[B, H, W, C]`` (fewer when the split is shorter).

    Raises:
        ConfigError: ``steps`` < 1.
    """
    if steps < 1:
        raise ConfigError(f"calibration steps={steps} must be >= 1 (--calibration-steps)")
    cfg = dataclasses.replace(data_cfg, deterministic=True, augment="none", cache="none")
    ds = make_dataset(cfg, "train", training=True, info=info).take(steps)
    return [np.asarray(x, dtype=np.float32) for x, _ in ds.as_numpy_iterator()]


def representative_fn(batches: Sequence[np.ndarray]) -> Callable[[], Iterator[list[np.ndarray]]]:
    """Returns the converter's ``representative_dataset`` over fixed batches."""

    def gen():
        for batch in batches:
            yield [batch]

    return gen


def weight_sparsity(model: keras.Model) -> float:
    """Returns the fraction of exact zeros among the kernels (weights with >= 2 dims)."""
    kernels = [w for w in model.get_weights() if w.ndim >= 2]
    total = sum(w.size for w in kernels)
    return float(sum(int(np.count_nonzero(w == 0)) for w in kernels) / total) if total else 0.0


def is_qat_model(model: keras.Model) -> bool:
    """True when ``model`` holds tfmot quantization-aware-training layers.

    The one implementation is :func:`tfopt.compress.quantize.is_qat_model`; it is imported only
    when tfmot already is (no model can hold a tfmot layer before), so exporting a float model
    never loads tfmot.
    """
    if not tfmot_imported():
        return False
    from tfopt.compress.quantize import is_qat_model as impl

    return impl(model)


def _is_mixed(model: keras.Model) -> bool:
    return any(
        getattr(getattr(layer, "dtype_policy", None), "compute_dtype", "float32")
        not in ("float32", None)
        for layer in model.layers
    )


def float32_copy(model: keras.Model) -> keras.Model:
    """Returns ``model`` rebuilt with float32 layers when it was built under a mixed policy.

    TFLite has no bfloat16 kernels, and the float16 casts of a mixed_float16 model would end
    up in the graph; the float32 twin with the same weights converts cleanly.
    """
    if (
        not _is_mixed(model)
        or not isinstance(model, keras.Model)
        or not hasattr(model, "get_config")
    ):
        return model

    def scrub(node):
        if isinstance(node, dict):
            if node.get("class_name") in ("Policy", "DTypePolicy") and isinstance(
                node.get("config"), dict
            ):
                return "float32"
            return {
                k: (
                    "float32"
                    if k == "dtype" and isinstance(v, str) and v.startswith("mixed_")
                    else scrub(v)
                )
                for k, v in node.items()
            }
        if isinstance(node, list):
            return [scrub(v) for v in node]
        return node

    copy = keras.Model.from_config(scrub(model.get_config()))
    copy.set_weights(model.get_weights())
    return copy


_saved: dict | None = (
    None  # the cache of saved_models(): {id(model): (model, SavedModel dir)} and its "dir"
)


@contextlib.contextmanager
def saved_models() -> Iterator[None]:
    """Within it, each Keras model is written as a SavedModel once for all of its conversions.

    ``TFLiteConverter.from_keras_model`` writes the model to a temporary SavedModel and reads it
    back on every call: for a small model most of a conversion's time. Inside this context
    :func:`make_converter` does that once per model, without the per-layer traces no converter
    reads (``save_for_converter``), and converts from that SavedModel, the path
    ``from_keras_model`` takes: the flatbuffers are the same, byte for byte. Nested uses share
    the outer cache; the directories are removed on exit. ``tflite.convert`` runs in one.
    """
    global _saved
    if _saved is not None:
        yield
        return
    _saved = {"dir": tempfile.mkdtemp(prefix="tfopt-savedmodels-")}
    try:
        yield
    finally:
        shutil.rmtree(_saved["dir"], ignore_errors=True)
        _saved = None


def _converter_for(model: keras.Model) -> tf.lite.TFLiteConverter:
    if _saved is None:
        return tf.lite.TFLiteConverter.from_keras_model(model)
    hit = _saved.get(id(model))  # the entry holds the model: its id cannot be reused while cached
    if hit is None:
        path = os.path.join(_saved["dir"], str(len(_saved)))
        try:  # as from_keras_model saves it, less the layer traces no converter reads
            save_for_converter(model, path)
        except Exception:  # noqa: BLE001 - from_keras_model then falls back to freezing the model: so do we
            path = None
        hit = _saved[id(model)] = (model, path)
    return (
        saved_model_converter(hit[1]) if hit[1] else tf.lite.TFLiteConverter.from_keras_model(model)
    )


def make_converter(
    model: keras.Model,
    mode: str,
    *,
    calibration: Sequence[np.ndarray] | None = None,
    options: ConvertOptions = ConvertOptions(),
    sparse: bool = False,
) -> tf.lite.TFLiteConverter:
    """Returns a TFLiteConverter set up for ``mode`` (not yet run).

    Args:
        model: A float (or QAT) tf_keras model.
        mode: One of ``MODES``.
        calibration: Representative input batches; required for int8 (except QAT) and int16x8.
        options: I/O type and op-set choices.
        sparse: Add the sparse weight encoding (``Optimize.EXPERIMENTAL_SPARSITY``).

    Raises:
        ConfigError: unknown mode, missing calibration data, or a QAT model asked for a mode
            other than int8.
    """
    spec = MODES.get(check_choice("mode", mode, MODES.names(), "--modes"))
    check_modes_for(model, [mode])
    qat = is_qat_model(model)
    converter = _converter_for(model)
    optimizations = [tf.lite.Optimize.DEFAULT] if spec.optimize else []
    if sparse:
        optimizations.append(tf.lite.Optimize.EXPERIMENTAL_SPARSITY)
    converter.optimizations = optimizations
    if spec.supported_types:
        converter.target_spec.supported_types = [getattr(tf, t) for t in spec.supported_types]
    select = [tf.lite.OpsSet.SELECT_TF_OPS] if options.allow_select_tf_ops else []
    ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    if spec.calibration and not qat:
        if not calibration:
            raise ConfigError(
                f"mode {mode!r} needs calibration batches (the representative dataset); "
                "give calibration steps >= 1"
            )
        converter.representative_dataset = representative_fn(calibration)
    if spec.ops == "int16x8":
        ops = [tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8]
    elif spec.ops == "int8" and not select and not qat:
        # Full-integer: every op must have an int8 kernel, otherwise conversion fails loudly
        # instead of silently leaving float islands. (A QAT model carries its own ranges; this
        # op set would demand a representative dataset from it.)
        ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    if options.io != "float" and options.io in spec.io_types:
        converter.inference_input_type = IO_DTYPES[options.io]
        converter.inference_output_type = IO_DTYPES[options.io]
    converter.target_spec.supported_ops = ops + select
    return converter


def run_converter(converter, model, mode: str, options: ConvertOptions) -> bytes:
    """Runs ``converter``; a model or setting it refuses becomes a one-line ConversionError.

    The converter's native output is hidden (its exception repeats it) unless the process dies
    in the call. Exceptions other than the converter's own (see :data:`tfopt.export.explain.CONVERTER_ERRORS`) are bugs
    and propagate with their traceback.
    """
    try:
        with warnings.catch_warnings():
            # Says the float input has no min/max statistics: expected, the input is quantized by
            # the calibrated QUANTIZE op (or the int8 input type) instead.
            warnings.filterwarnings(
                "ignore", message="Statistics for quantized inputs were expected"
            )
            with native_stderr.quiet():
                return converter.convert()
    except _CONVERTER_ERRORS as e:  # their text carries the op names
        if isinstance(e, _NOT_CONVERTER_ERRORS):
            raise
        raise ConversionError(explain_error(e, model, mode, options)) from None


def by_converter(
    model: keras.Model,
    mode: str,
    *,
    calibration: Sequence[np.ndarray] | None = None,
    options: ConvertOptions = ConvertOptions(),
) -> Converted:
    """Converts ``model`` for ``mode`` with the TFLite converter's own quantization.

    Args:
        model: A tf_keras model (float, pruned, or quantization-aware trained).
        mode: A mode the converter makes (``float32``, ``dynamic``, ``float16``, ``int8``,
            ``int16x8``).
        calibration: Representative batches for int8 and int16x8.
        options: I/O type, Select TF ops, sparse encoding.

    Raises:
        ConversionError: the converter failed; the message names the unsupported op(s).
    """
    qat = is_qat_model(model)
    model = float32_copy(model)
    content = run_converter(
        make_converter(model, mode, calibration=calibration, options=options), model, mode, options
    )
    notes: list[str] = []
    sparse = False
    zeros = weight_sparsity(model)
    if options.sparsity == "on" or (options.sparsity == "auto" and zeros >= SPARSITY_THRESHOLD):
        sparse_content = run_converter(
            make_converter(model, mode, calibration=calibration, options=options, sparse=True),
            model,
            mode,
            options,
        )
        problem = _sparse_problem(sparse_content, content, model, calibration)
        if options.sparsity == "on" and problem:
            raise ConversionError(
                f"the sparse-encoded {mode!r} model {problem}; use --sparsity off (or auto)"
            )
        if problem:
            notes.append(f"sparse encoding ({zeros:.0%} zero weights) not used: it {problem}")
        elif options.sparsity == "on" or len(sparse_content) < len(content):
            notes.append(
                f"sparse encoding ({zeros:.0%} zero weights): {len(sparse_content)} bytes "
                f"instead of {len(content)}"
            )
            content, sparse = sparse_content, True
        else:
            notes.append(
                f"sparse encoding tried ({zeros:.0%} zero weights) but not smaller; kept dense"
            )
    io_type = options.io if mode == "int8" else "float"
    return Converted(
        mode=mode,
        content=finish(content, options),
        io=io_type,
        sparse=sparse,
        qat=qat,
        notes=notes,
        quantizer=None if mode == "float32" else "converter",
    )


def _sparse_problem(
    sparse: bytes, dense: bytes, model: keras.Model, calibration: Sequence[np.ndarray] | None
) -> str | None:
    """Why a sparse-encoded model cannot replace the dense one, or None when it can.

    LiteRT's default XNNPACK delegate refuses some sparse quantized kernels (e.g. dynamic-range
    and int8 CONV_2D / FULLY_CONNECTED in LiteRT 2.3): a smaller file that does not run is no gain.
    """
    from tfopt.export.evaluate import TFLiteModel

    sample = (
        np.asarray(calibration[0][:4])
        if calibration
        else np.random.default_rng(0).random((2, *model.input_shape[1:]), dtype=np.float32)
    )
    try:
        got = TFLiteModel(sparse).predict(sample)
    except ModelError as e:
        op = re.search(r"failed to delegate (\w+)", str(e))
        why = (
            f"the XNNPACK delegate refuses its sparse {op.group(1)}"
            if op
            else str(e).split(": ", 1)[-1][:120]
        )
        return f"does not run in the LiteRT interpreter ({why})"
    want = TFLiteModel(dense).predict(sample)
    if not np.allclose(got, want, rtol=1e-3, atol=1e-3):
        return f"gives different outputs than the dense model (max diff {float(np.max(np.abs(got - want))):.3g})"
    return None
