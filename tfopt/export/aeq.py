"""Quantization recipes beyond the converter, applied with Google's ai-edge-quantizer.

The TFLite converter quantizes every op a mode covers: its dynamic range mode also quantizes
DEPTHWISE_CONV_2D, which XNNPACK cannot run with a float input and int8 weights, so those ops fall
back to LiteRT's builtin kernels (MobileNetV2 runs 2.7x slower than float). ai-edge-quantizer
(LiteRT Quantizer, a dependency of tfopt) quantizes a float .tflite op by op from a *recipe*: a JSON
list of entries (``regex`` on an op's output tensor name, ``operation``, ``algorithm_key``,
``op_config``; the last matching entry wins). Its public API only: ``quantizer.Quantizer``,
``recipe``, ``qtyping``.

Recipes tfopt names (export modes):

- ``dynamic_selective``: dynamic-range int8 weights on CONV_2D and FULLY_CONNECTED only;
  depthwise stays float, so every op stays on XNNPACK.
- ``int8_weights``: weight-only int8 on every op that takes it; the weights are dequantized to
  float when the model loads (4x smaller file, float speed).
- ``int4_weights``: weight-only int4 (8x smaller weights); LiteRT 2.3 runs int4 DEQUANTIZE and
  int4 convolutions on its builtin kernels, not XNNPACK, so it is for size, not speed.
- ``recipe``: the recipe file given with ``--recipe`` (one that ``int8_auto`` wrote, edited or not).

With ``--quantizer litert`` the converter's ``dynamic``, ``float16``, ``int8`` and ``int16x8`` are
made here too, from the float32 model: every op that takes it, dynamic-range int8, float16
weights (convolutions, fully-connected and embeddings), static int8 (calibrated, asymmetric
per-tensor activations) or w8a16 (symmetric int16 activations), float I/O.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from collections.abc import Sequence
from importlib import metadata

import numpy as np

from tfopt.core.errors import ConfigError

PACKAGE = "ai-edge-quantizer"
MIN_VERSION, MAX_VERSION = (0, 10), (0, 11)  # tested with 0.10.0 (which pins ai-edge-litert 2.3.0)
EXTRA = "tfopt depends on it: pip install 'ai-edge-quantizer>=0.10,<0.11'"
NO_QUANTIZE = "no_quantize"
MIN_MAX = "min_max_uniform_quantize"
FLOAT_CASTING = "float_casting"
# The ops whose weights LiteRT Quantizer casts to float16 (the converter's float16 casts every
# float constant).
FLOAT16_OPS = (
    "CONV_2D",
    "DEPTHWISE_CONV_2D",
    "FULLY_CONNECTED",
    "CONV_2D_TRANSPOSE",
    "EMBEDDING_LOOKUP",
)


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def require():
    """Imports ai-edge-quantizer's ``quantizer``, ``recipe`` and ``qtyping``, checking its version.

    Raises:
        ConfigError: it is not installed, or its version is outside the tested range.
    """
    wanted = f">={'.'.join(map(str, MIN_VERSION))},<{'.'.join(map(str, MAX_VERSION))}"
    try:
        version = metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:
        raise ConfigError(
            f"this mode quantizes with {PACKAGE} ({wanted}), which is not installed; {EXTRA}"
        ) from None
    if not MIN_VERSION <= _version_tuple(version)[:2] < MAX_VERSION:
        raise ConfigError(
            f"{PACKAGE} {version} is installed; tfopt needs {PACKAGE}{wanted}: {EXTRA}"
        )
    from ai_edge_quantizer import qtyping, quantizer, recipe

    return quantizer, recipe, qtyping


def _weights(bits: int) -> dict:
    return {"num_bits": bits, "symmetric": True, "granularity": "CHANNELWISE", "dtype": "INT"}


def _entry(operation: str, op_config: dict | None, regex: str = ".*", algorithm: str = MIN_MAX):
    entry = {"regex": regex, "operation": operation, "algorithm_key": algorithm}
    if op_config is not None:
        entry["op_config"] = op_config
    return entry


def _dynamic(bits: int) -> dict:
    return {"weight_tensor_config": _weights(bits), "compute_precision": "INTEGER",
            "explicit_dequantize": False}  # fmt: skip


def weight_only(bits: int) -> dict:
    """The op config of weight-only quantization: ``bits`` weights, dequantized to float at load."""
    return {"weight_tensor_config": _weights(bits), "compute_precision": "FLOAT",
            "explicit_dequantize": True}  # fmt: skip


def _float16() -> dict:
    return {"weight_tensor_config": {"num_bits": 16, "dtype": "FLOAT"},
            "compute_precision": "FLOAT", "explicit_dequantize": True}  # fmt: skip


def static_int8() -> dict:
    """The op config of full-integer int8: asymmetric per-tensor activations, per-channel weights."""
    activations = {"num_bits": 8, "symmetric": False, "granularity": "TENSORWISE", "dtype": "INT"}
    return {
        "activation_tensor_config": activations,
        "weight_tensor_config": _weights(8),
        "compute_precision": "INTEGER",
        "explicit_dequantize": False,
    }


def static_a16w8() -> dict:
    """The op config of w8a16: symmetric per-tensor int16 activations, per-channel int8 weights."""
    activations = {"num_bits": 16, "symmetric": True, "granularity": "TENSORWISE", "dtype": "INT"}
    return {**static_int8(), "activation_tensor_config": activations}


def _float_edges() -> list[dict]:
    # The graph's inputs and outputs stay float: a QUANTIZE op in, a DEQUANTIZE op out, as the
    # converter's int8 and int16x8 (--io float) have them.
    return [_entry(op, None, algorithm=NO_QUANTIZE) for op in ("INPUT", "OUTPUT")]


def named_recipe(mode: str) -> list[dict]:
    """The recipe of one of tfopt's ai-edge-quantizer modes (see the module docstring), or of a
    converter mode quantized by LiteRT Quantizer instead (``--quantizer litert``: ``dynamic``,
    ``float16``, ``int8``, ``int16x8``)."""
    if mode == "dynamic":
        return [_entry("*", _dynamic(8))]
    if mode == "float16":
        return [_entry(op, _float16(), algorithm=FLOAT_CASTING) for op in FLOAT16_OPS]
    if mode == "int8":
        return [_entry("*", static_int8()), *_float_edges()]
    if mode == "int16x8":
        return [_entry("*", static_a16w8()), *_float_edges()]
    if mode == "dynamic_selective":
        return [_entry(op, _dynamic(8)) for op in ("CONV_2D", "FULLY_CONNECTED")]
    if mode == "int8_weights":
        return [_entry("*", weight_only(8))]
    if mode == "int4_weights":
        return [_entry("*", weight_only(4))]
    raise ConfigError(f"no ai-edge-quantizer recipe is named {mode!r}")


def scope(node: str) -> str:
    """The name ai-edge-quantizer matches a recipe's ``regex`` against: the op's output tensor
    names, each followed by ``;`` (one output here)."""
    return f"{node};"


def keep_float(recipe: list[dict], nodes: Sequence[tuple[str, str]]) -> list[dict]:
    """``recipe`` with the ops ``(op name, output tensor name)`` kept in float (entries appended last)."""
    return recipe + [
        _entry(op, None, regex=f"^{re.escape(scope(node))}$", algorithm=NO_QUANTIZE)
        for op, node in nodes
    ]


def read_recipe(path: str) -> list[dict]:
    """Reads a recipe JSON file (a list of entries with ``regex`` and ``operation``).

    Raises:
        ConfigError: the file is missing, not JSON, or not a list of such entries.
    """
    try:
        with open(path, encoding="utf-8") as f:
            recipe = json.load(f)
    except OSError as e:
        raise ConfigError(
            f"cannot read --recipe {path!r} ({e.strerror}); give a recipe JSON file"
        ) from None
    except ValueError as e:
        raise ConfigError(
            f"--recipe {path!r} is not JSON ({e}); give an ai-edge-quantizer recipe"
        ) from None
    if not isinstance(recipe, list) or not recipe:
        raise ConfigError(
            f"--recipe {path!r} holds no entries; an ai-edge-quantizer recipe is a JSON list of "
            '{"regex", "operation", "algorithm_key", "op_config"} entries'
        )
    for i, entry in enumerate(recipe, 1):
        missing = [
            k for k in ("regex", "operation") if not isinstance(entry, dict) or k not in entry
        ]
        if missing:
            raise ConfigError(
                f"--recipe {path!r}: entry {i} has no {' or '.join(missing)}; every entry names "
                '"regex" (matched against op output tensor names) and "operation" (e.g. CONV_2D, "*")'
            )
        try:
            re.compile(entry["regex"])
        except re.error as e:
            raise ConfigError(
                f"--recipe {path!r}: entry {i}'s regex {entry['regex']!r} is not a regular expression ({e})"
            ) from None
    return recipe


def check_recipe(recipe: list[dict], ops: Sequence[tuple[str, str]], where: str) -> None:
    """Refuses an entry that names an op the model lacks: nothing would be quantized by it.

    Args:
        recipe: The recipe's entries.
        ops: The float model's ``(op name, output tensor name)`` pairs.
        where: The recipe's path, for the message.

    Raises:
        ConfigError: naming the entry, and the ops the model holds.
    """
    for i, entry in enumerate(recipe, 1):
        op, regex = entry["operation"], re.compile(entry["regex"])
        if op == "*":
            continue
        if not any(name == op and regex.search(scope(node)) for name, node in ops):
            held = ", ".join(sorted({name for name, _ in ops}))
            raise ConfigError(
                f"--recipe {where!r}: entry {i} names {op} ops matching {entry['regex']!r}, which the "
                f"model does not hold (its ops: {held}); fix the entry's operation or regex"
            )


def _calibration_data(batches: Sequence[np.ndarray], input_name: str, limit: int = 256) -> dict:
    examples = [row[None] for batch in batches for row in np.asarray(batch, np.float32)][:limit]
    return {"serving_default": [{input_name: x} for x in examples]}


def quantize(
    float_content: bytes,
    recipe: list[dict],
    *,
    calibration: Sequence[np.ndarray] | None = None,
    where: str = "recipe",
) -> bytes:
    """Quantizes a float .tflite with ai-edge-quantizer as ``recipe`` says.

    Args:
        float_content: A float32 .tflite (the converter's, no optimizations).
        recipe: Recipe entries (see :func:`named_recipe`, :func:`read_recipe`).
        calibration: Float input batches, for recipes with activation quantization (static).
        where: The recipe's name or path, for messages.

    Returns:
        The quantized flatbuffer.

    Raises:
        ConfigError: ai-edge-quantizer is missing or out of range; the recipe asks an op for a
            quantization it does not support; a static recipe without calibration data.
    """
    quantizer, _, _ = require()
    qt = quantizer.Quantizer(bytearray(float_content))
    # Its progress bars (tqdm, on sys.stderr) are not tfopt's progress lines.
    with contextlib.redirect_stderr(io.StringIO()):
        return _quantize(qt, float_content, recipe, calibration, where)


def _quantize(qt, float_content, recipe, calibration, where) -> bytes:
    try:
        qt.load_quantization_recipe(recipe)
        calibrated = None
        if qt.need_calibration:
            if not calibration:
                raise ConfigError(
                    f"{where} quantizes activations and needs calibration data; export from a run "
                    "(or give --dataset) so batches can be drawn"
                )
            from ai_edge_litert.interpreter import Interpreter

            name = Interpreter(model_content=float_content).get_signature_list()["serving_default"][
                "inputs"
            ][0]
            calibrated = qt.calibrate(_calibration_data(calibration, name), num_threads=2)
        result = qt.quantize(calibrated, enable_progress_bar=False, enable_progress_report=False)
    except ValueError as e:  # AEQ's answer to a config its policy refuses for an op
        first = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
        raise ConfigError(f"{where}: ai-edge-quantizer refused the recipe: {first}") from None
    return bytes(result.quantized_model)
