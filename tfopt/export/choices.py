"""The export stage's named choices and their parsers (no TensorFlow import: CLIs fail fast).

``MODES`` is the registry of post-training quantization modes: each entry says how the TFLite
converter is set up for it, so adding a mode is one entry here (plus, if it needs one, a new
converter setting in :func:`tfopt.export.tflite.make_converter`).
"""

from __future__ import annotations

from dataclasses import dataclass

from tfopt.config.export import (  # noqa: F401 - the export's choices live in its config section
    DEFAULT_MODES,
    IO_TYPES,
    KERNELS,
    MODE_NAMES,
    OUTPUTS,
    QUANTIZERS,
    RUNTIMES,
    SPARSITY_CHOICES,
    check_choice,
    parse_modes,
    parse_runtimes,
    parse_threads,
)
from tfopt.core.specs import Registry


@dataclass(frozen=True)
class PtqMode:
    """A post-training quantization mode of the TFLite converter.

    Attributes:
        name: The ``--modes`` name.
        summary: One line for --help.
        optimize: Sets ``tf.lite.Optimize.DEFAULT`` (weights quantized or float16).
        calibration: Needs a representative dataset (activation ranges), unless the model is QAT.
        supported_types: ``target_spec.supported_types`` (e.g. ``("float16",)``).
        ops: ``builtins``; ``int8`` (full-integer: every op must have an int8 kernel, unless the
            model is QAT or Select TF ops are allowed); ``int16x8`` (16-bit activations, 8-bit weights).
        io_types: Input/output types it can give the model (``--io``).
        latency_aware: Chosen by measurement (:mod:`tfopt.export.auto`): int8 with the ops whose
            int8 kernel is slower than float kept in float. The converter settings are int8's.
        quantizer: Quantized by ai-edge-quantizer (:mod:`tfopt.export.aeq`) from the float32
            .tflite, with the recipe of the same name (``recipe``: the ``--recipe`` file).
    """

    name: str
    summary: str
    optimize: bool = True
    calibration: bool = False
    supported_types: tuple[str, ...] = ()
    ops: str = "builtins"
    io_types: tuple[str, ...] = ("float",)
    latency_aware: bool = False
    quantizer: bool = False


MODES: Registry[PtqMode] = Registry(
    "mode",
    (
        PtqMode("float32", "no quantization", optimize=False),
        PtqMode("dynamic", "int8 weights, float activations (dynamic range)"),
        PtqMode("float16", "float16 weights", supported_types=("float16",)),
        PtqMode(
            "int8",
            "full-integer: int8 weights and activations, calibrated",
            calibration=True,
            ops="int8",
            io_types=("float", "int8", "uint8"),
        ),
        PtqMode(
            "int8_auto",
            "int8, with the ops whose int8 kernel is slower (measured with LiteRT) kept in float",
            calibration=True,
            ops="int8",
            io_types=("float", "int8", "uint8"),
            latency_aware=True,
        ),
        PtqMode(
            "int16x8",
            "int16 activations, int8 weights (w8a16), calibrated",
            calibration=True,
            ops="int16x8",
        ),
        PtqMode(
            "dynamic_selective",
            "dynamic-range int8 weights on CONV_2D and FULLY_CONNECTED only, depthwise float: every "
            "op stays on XNNPACK (ai-edge-quantizer)",
            quantizer=True,
        ),
        PtqMode(
            "dynamic_auto",
            "dynamic range, with the ops whose int8 arithmetic is slower (measured with LiteRT) "
            "computing in float from int8 weights: never slower than float32 (ai-edge-quantizer)",
            quantizer=True,
        ),
        PtqMode(
            "int8_weights",
            "weight-only int8, dequantized to float at load: 4x smaller, float speed (ai-edge-quantizer)",
            quantizer=True,
        ),
        PtqMode(
            "int4_weights",
            "weight-only int4 where ops allow it: smallest file, runs on builtin kernels "
            "(ai-edge-quantizer)",
            quantizer=True,
        ),
        PtqMode(
            "recipe",
            "the ops quantized as the --recipe file says (ai-edge-quantizer)",
            calibration=True,
            quantizer=True,
        ),
    ),
)
#: The modes both quantizers make (``--quantizer`` chooses which).
BOTH_QUANTIZERS = ("dynamic", "float16", "int8", "int16x8")
