"""Fidelity gate for converted models, and selective quantization when int8 fails it.

The gate compares a .tflite with its Keras model on held-out data: top-1 agreement must reach
``Thresholds.min_agreement`` and accuracy may drop by at most ``max_accuracy_drop_pt`` points.
When full-integer int8 fails, ``selective_search`` runs TFLite's per-layer quantization
debugger (``tf.lite.experimental.QuantizationDebugger``), ranks layers by their quantization
error in units of their quantization step (RMSE / scale: about 0.29 for a well-behaved layer),
and re-quantizes with the worst 1, 2, ... layers left in float (``denylisted_nodes``) until the
gate passes, recording size and fidelity of every step of the way.
"""

from __future__ import annotations

import csv
import io
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from tfopt.core._keras import keras, tf

import numpy as np

from tfopt.core import native_stderr
from tfopt.core.errors import ConfigError
from tfopt.export.converter import ConvertOptions, make_converter, modify_io, representative_fn
from tfopt.export.evaluate import EvalResult


@dataclass(frozen=True)
class Thresholds:
    """What a converted model must achieve against its Keras model."""

    min_agreement: float = 0.99  # fraction of examples with the same top-1 class
    max_accuracy_drop_pt: float = 0.5  # percentage points of accuracy it may lose

    def __post_init__(self):
        if not 0.0 <= self.min_agreement <= 1.0:
            raise ConfigError(
                f"min agreement {self.min_agreement} must be in [0, 1] (--min-agreement 0.99)"
            )
        if not (self.max_accuracy_drop_pt >= 0 and math.isfinite(self.max_accuracy_drop_pt)):
            raise ConfigError(
                f"max accuracy drop {self.max_accuracy_drop_pt} must be >= 0 points "
                "(--max-accuracy-drop 0.5)"
            )


@dataclass
class GateResult:
    """The gate's verdict and, when it fails, why."""

    passed: bool
    reasons: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        """JSON-friendly dict."""
        return asdict(self)


def check(result: EvalResult, thresholds: Thresholds) -> GateResult:
    """Applies the gate to one evaluation (which must include the Keras comparison)."""
    if result.agreement is None or result.accuracy_delta_pt is None:
        raise ConfigError(
            "the fidelity gate needs the Keras model's outputs; evaluate with a reference"
        )
    reasons = []
    if result.agreement < thresholds.min_agreement:
        reasons.append(f"agreement {result.agreement:.4f} < {thresholds.min_agreement}")
    if -result.accuracy_delta_pt > thresholds.max_accuracy_drop_pt:
        reasons.append(
            f"accuracy drop {-result.accuracy_delta_pt:.2f} pt > {thresholds.max_accuracy_drop_pt} pt"
        )
    return GateResult(passed=not reasons, reasons=reasons)


@dataclass
class LayerError:
    """One quantized tensor as the debugger saw it."""

    tensor_name: str  # the node name ``denylisted_nodes`` takes
    op_name: str
    rmse_over_scale: float  # quantization error in quantization steps (~0.29 when healthy)
    mean_squared_error: float
    scale: float


@dataclass
class Trial:
    """One selective-quantization attempt."""

    float_layers: list[str]
    size_bytes: int
    result: EvalResult
    gate: GateResult

    def to_dict(self) -> dict:
        """JSON-friendly dict."""
        return {
            "float_layers": self.float_layers,
            "size_bytes": self.size_bytes,
            "result": self.result.to_dict(),
            "gate": self.gate.to_dict(),
        }


@dataclass
class SelectiveResult:
    """What selective quantization found."""

    ranking: list[LayerError]
    trials: list[Trial]
    chosen: int  # index into trials: the first that passed, else the best agreement
    content: bytes = b""  # the chosen model

    @property
    def passed(self) -> bool:
        """True when some trial passed the gate."""
        return self.trials[self.chosen].gate.passed

    def to_dict(self) -> dict:
        """JSON-friendly dict (without the model bytes)."""
        return {
            "ranking": [asdict(r) for r in self.ranking],
            "trials": [t.to_dict() for t in self.trials],
            "chosen": self.chosen,
            "passed": self.passed,
        }


def quantization_debugger(
    model: keras.Model, calibration: Sequence[np.ndarray], debug_batches: Sequence[np.ndarray]
):
    """A ``tf.lite.experimental.QuantizationDebugger`` for the int8 conversion of ``model``.

    Args:
        model: The float Keras model.
        calibration: Representative batches (the int8 calibration).
        debug_batches: Batches the debugger runs through to collect per-layer error statistics.
    """
    converter = make_converter(
        model, "int8", calibration=calibration, options=ConvertOptions(io="float")
    )
    with warnings.catch_warnings(), native_stderr.quiet():
        warnings.simplefilter(
            "ignore"
        )  # the debugger drives the deprecated tf.lite interpreter internally
        return tf.lite.experimental.QuantizationDebugger(
            converter=converter, debug_dataset=representative_fn(debug_batches)
        )


def rank_layers(debugger) -> list[LayerError]:
    """Runs the debugger and returns the quantized tensors, worst (largest RMSE/scale) first."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        debugger.run()
    buf = io.StringIO()
    debugger.layer_statistics_dump(buf)  # the public way to get tensor names and scales
    buf.seek(0)
    ranking = []
    for row in csv.DictReader(buf):
        scale, mse = float(row["scale"]), float(row["mean_squared_error"])
        ratio = math.sqrt(mse) / scale if scale > 0 and mse >= 0 else float("inf")
        ranking.append(LayerError(row["tensor_name"], row["op_name"], ratio, mse, scale))
    ranking.sort(key=lambda r: -r.rmse_over_scale if math.isfinite(r.rmse_over_scale) else -1e30)
    return ranking


def requantize(debugger, float_nodes: Sequence[str], io_type: str = "float") -> bytes:
    """The int8 model with ``float_nodes`` (debugger tensor names) left in float."""
    with warnings.catch_warnings(), native_stderr.quiet():
        warnings.simplefilter("ignore")
        debugger.options = tf.lite.experimental.QuantizationDebugOptions(
            denylisted_nodes=list(float_nodes)
        )
        return modify_io(bytes(debugger.get_nondebug_quantized_model()), io_type)


def layer_names(ranking: Sequence[LayerError]) -> list[str]:
    """Keras layer names found in the quantized tensors' names (``model/conv0/Conv2D`` -> ``conv0``)."""
    names: list[str] = []
    for r in ranking:
        for part in r.tensor_name.split(";"):
            segments = part.split("/")
            if len(segments) >= 3 and segments[1] not in names:
                names.append(segments[1])
    return names


def nodes_for_layers(ranking: Sequence[LayerError], layers: Sequence[str]) -> list[str]:
    """The debugger node names that compute the given Keras layers (for ``requantize``).

    Raises:
        ConfigError: a layer name matches no quantized tensor (the message lists the valid ones).
    """
    nodes: list[str] = []
    for layer in layers:
        found = [
            r.tensor_name
            for r in ranking
            if any(
                len(seg := part.split("/")) >= 3 and seg[1] == layer
                for part in r.tensor_name.split(";")
            )
        ]
        if not found:
            raise ConfigError(
                f"layer {layer!r} is not a quantized layer of this model; choose from "
                f"{', '.join(layer_names(ranking))} (--float-layers)"
            )
        nodes.extend(n for n in found if n not in nodes)
    return nodes


def selective_search(
    model: keras.Model,
    calibration: Sequence[np.ndarray],
    evaluate_fn: Callable[[bytes], EvalResult],
    thresholds: Thresholds,
    *,
    io_type: str = "float",
    max_float_layers: int = 4,
    debug_steps: int = 8,
) -> SelectiveResult:
    """Keeps the worst-quantized layers in float until int8 passes the gate.

    Args:
        model: The float Keras model.
        calibration: The representative batches used for the int8 conversion.
        evaluate_fn: Scores a candidate flatbuffer (use held-out data that is not the test set
            the final figures are reported on, e.g. the validation split).
        thresholds: The gate.
        io_type: I/O type of the returned model (``float``, ``int8`` or ``uint8``).
        max_float_layers: Give up after leaving this many layers in float.
        debug_steps: Calibration batches the debugger runs through (its per-layer statistics).

    Returns:
        The ranking, every trial and the chosen model (the first passing trial, else the one
        with the best agreement).

    Raises:
        ConfigError: ``max_float_layers`` < 1.
    """
    if max_float_layers < 1:
        raise ConfigError(f"max float layers={max_float_layers} must be >= 1 (--max-float-layers)")
    debugger = quantization_debugger(model, calibration, list(calibration)[: max(1, debug_steps)])
    ranking = rank_layers(debugger)
    trials: list[Trial] = []
    contents: list[bytes] = []
    for k in range(1, min(max_float_layers, len(ranking)) + 1):
        names = [r.tensor_name for r in ranking[:k]]
        content = requantize(debugger, names, io_type)
        result = evaluate_fn(content)
        trials.append(Trial(names, len(content), result, check(result, thresholds)))
        contents.append(content)
        if trials[-1].gate.passed:
            break
    if not trials:
        raise ConfigError("the quantization debugger found no quantized layer to leave in float")
    passing = [i for i, t in enumerate(trials) if t.gate.passed]
    chosen = (
        passing[0]
        if passing
        else max(range(len(trials)), key=lambda i: trials[i].result.agreement or 0.0)
    )
    return SelectiveResult(ranking=ranking, trials=trials, chosen=chosen, content=contents[chosen])
