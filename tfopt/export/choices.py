"""The export stage's named choices and their parsers (no TensorFlow import: CLIs fail fast).

``MODES`` is the registry of post-training quantization modes: each entry says how the TFLite
converter is set up for it, so adding a mode is one entry here (plus, if it needs one, a new
converter setting in :func:`tfopt.export.tflite.make_converter`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tfopt.core.errors import ConfigError
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
# What --modes means when not given. The dynamic-range entry is dynamic_auto: int8 arithmetic only
# where it is measured not slower than float (plain dynamic is asked by name).
DEFAULT_MODES = ("float32", "dynamic_auto", "float16", "int8", "int8_auto", "int16x8")
IO_TYPES = ("float", "int8", "uint8")
#: Who quantizes the modes both can make (--quantizer): the TFLite converter, or LiteRT Quantizer
#: (ai-edge-quantizer) from the float32 .tflite. The ai-edge-quantizer modes are LiteRT Quantizer's
#: only.
QUANTIZERS = ("converter", "litert")
BOTH_QUANTIZERS = ("dynamic", "float16", "int8", "int16x8")
#: What an exported classifier gives out (``--outputs``; tfopt.export.outputs).
OUTPUTS = ("probabilities", "logits")
SPARSITY_CHOICES = ("auto", "on", "off")
KERNELS = ("xnnpack", "builtin", "both")
# LiteRT runtime settings a latency can be timed with (--runtime): the Interpreter with its default
# XNNPACK delegate (and --kernels), the Interpreter's experimental_default_delegate_latest_features,
# and ai-edge-litert's CompiledModel on the CPU (its XNNPACK with default CpuOptions).
RUNTIMES = ("interpreter", "latest", "compiled")


def check_choice(what: str, value: str, choices: Sequence[str], flag: str) -> str:
    """Returns ``value`` or raises ConfigError naming the valid choices and the flag."""
    if value not in choices:
        raise ConfigError(f"unknown {what} {value!r}; choose one of {', '.join(choices)} ({flag})")
    return value


def parse_modes(text: str | Sequence[str]) -> list[str]:
    """Parses ``"float32,int8"`` (or a list) into known modes, keeping order, dropping repeats.

    Raises:
        ConfigError: an unknown mode, or no mode at all.
    """
    items = text.split(",") if isinstance(text, str) else list(text)
    modes: list[str] = []
    for item in (i.strip() for i in items):
        if item and item not in modes:
            modes.append(check_choice("mode", item, MODES.names(), "--modes"))
    if not modes:
        raise ConfigError(f"no mode given; choose from {', '.join(MODES)} (--modes float32,int8)")
    return modes


def parse_runtimes(text: str | Sequence[str]) -> list[str]:
    """Parses ``"interpreter,compiled"`` into known runtime settings (order kept, repeats dropped).

    Raises:
        ConfigError: an unknown runtime, or none.
    """
    items = text.split(",") if isinstance(text, str) else list(text)
    out: list[str] = []
    for item in (i.strip() for i in items):
        if item and item not in out:
            out.append(check_choice("runtime", item, RUNTIMES, "--runtime"))
    if not out:
        raise ConfigError(f"no runtime given; choose from {', '.join(RUNTIMES)} (--runtime)")
    return out


def parse_threads(text: str | Sequence[int]) -> list[int]:
    """Parses ``"1,2"`` into distinct thread counts (each >= 1).

    Raises:
        ConfigError: not a comma-separated list of positive integers.
    """
    items = text.split(",") if isinstance(text, str) else list(text)
    out: list[int] = []
    for item in items:
        try:
            n = int(str(item).strip())
        except ValueError:
            raise ConfigError(
                f"thread count {item!r} is not an integer; give e.g. --threads 1,2"
            ) from None
        if n < 1:
            raise ConfigError(f"thread count {n} must be >= 1; give e.g. --threads 1,2")
        if n not in out:
            out.append(n)
    if not out:
        raise ConfigError("no thread count given; use e.g. --threads 1,2")
    return out
