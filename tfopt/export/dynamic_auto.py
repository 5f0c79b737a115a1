"""Latency-aware dynamic range (mode ``dynamic_auto``): int8 weights everywhere, int8 arithmetic
only where it is not slower.

Dynamic-range quantization stores weights in int8 and, at run time, quantizes each op's input on
the fly to compute in int8 ("hybrid" kernels). On a small model the on-the-fly quantization and
the hybrid kernels' lack of XNNPACK support (depthwise convolutions, for one) can make the whole
model slower than float32. :func:`choose` decides per op, on the machine it runs on, with LiteRT
Quantizer (ai-edge-quantizer) from the float32 .tflite:

1. Quantize every op dynamically (the ``dynamic`` recipe) and time every op that got int8
   weights alone, float and hybrid interleaved over ``rounds`` (:func:`tfopt.export.auto.time_ops`).
2. The ops whose hybrid p50 is above their float p50 keep int8 weights but compute in float:
   weight-only int8, dequantized once at load (what ``int8_weights`` does to every op). The file
   stays as small as the dynamic one; those ops run at float speed.
3. The mixed model and float32 are timed end to end, interleaved (p50 per round at ``threads``).
   When the mixed model is slower than float32 beyond the spread (every round slower), every op
   falls back to weight-only int8 (``int8_weights``), and the note says so and why.
"""

from __future__ import annotations

import functools
import logging
import re
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tfopt.core.errors import ConfigError
from tfopt.core.log import PROGRESS
from tfopt.export import aeq, auto
from tfopt.export import benchmark as bench
from tfopt.export.ops import op_costs

log = logging.getLogger(__name__)


@dataclass
class DynamicChoice:
    """What :func:`choose` decided and why."""

    content: bytes
    recipe: list[dict]
    ops: list[auto.OpTiming]  # the ops with int8 weights, timed alone (float vs hybrid)
    float_nodes: list[str]  # ops computing in float from int8 weights
    float_rounds: list[float]  # end-to-end p50 (ms) of float32 per round
    mixed_rounds: list[float]  # and of the mixed model
    fallback: bool  # every op weight-only: the mixed model was slower than float32
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        """JSON-friendly dict (without the flatbuffer)."""
        return {
            "ops": [t.to_dict() for t in self.ops],
            "float_nodes": self.float_nodes,
            "float32_p50_rounds": self.float_rounds,
            "mixed_p50_rounds": self.mixed_rounds,
            "fallback_to_int8_weights": self.fallback,
        }


def slow_nodes(timings: Sequence[auto.OpTiming]) -> list[auto.OpTiming]:
    """The timed ops whose hybrid (int8 arithmetic) kernel is slower than their float one."""
    return [t for t in timings if t.loss_ms is not None and t.loss_ms > 0]


def mixed_recipe(nodes: Sequence[auto.OpTiming]) -> list[dict]:
    """Dynamic range everywhere, ``nodes`` weight-only int8 (entries appended last win)."""
    return aeq.named_recipe("dynamic") + [
        {
            "regex": f"^{re.escape(aeq.scope(t.node))}$",
            "operation": t.op,
            "algorithm_key": aeq.MIN_MAX,
            "op_config": aeq.weight_only(8),
        }
        for t in nodes
    ]


def slower_beyond_spread(mixed: Sequence[float], float32: Sequence[float]) -> bool:
    """True when every round of the mixed model is slower than every round of float32."""
    return bool(mixed) and bool(float32) and min(mixed) > max(float32)


def choose(
    float_content: bytes,
    *,
    threads: int = 1,
    rounds: int = 3,
    runs: int = 100,
    warmup: int = 10,
    time_fn: Callable[[bytes, int], float] | None = None,
) -> DynamicChoice:
    """The dynamic-range model with int8 arithmetic only where it is not slower (module docstring).

    Args:
        float_content: The float32 .tflite (the converter's, no optimizations).
        threads: Interpreter threads the ops and the models are timed at.
        rounds: Interleaved rounds, per op and end to end.
        runs: Timed invokes per op or model per round.
        warmup: Untimed invokes first.
        time_fn: ``(flatbuffer, threads) -> p50 ms`` for the end-to-end timings; default: LiteRT
            here (``bench.latency``). The ops are always timed alone here.

    Returns:
        The chosen model, its recipe and the timings behind it.

    Raises:
        ConfigError: ``rounds``, ``runs`` or ``threads`` < 1, ``warmup`` < 0; ai-edge-quantizer
            is missing.
    """
    for name, value, low in (("rounds", rounds, 1), ("runs", runs, 1), ("threads", threads, 1),
                             ("warmup", warmup, 0)):  # fmt: skip
        if value < low:
            raise ConfigError(f"dynamic_auto {name}={value} must be >= {low}")
    say = functools.partial(log.log, PROGRESS)
    dynamic = aeq.quantize(float_content, aeq.named_recipe("dynamic"), where="dynamic_auto")
    say(f"dynamic_auto: timing every op alone in float32 and dynamic range ({threads} thread(s))")
    hybrid = [c.arithmetic == "int8" for c in op_costs(dynamic)]
    timings = [
        t
        for t in auto.time_ops(
            float_content, dynamic, threads=threads, rounds=rounds, runs=runs, warmup=warmup
        )
        if hybrid[t.index]
    ]
    slow = slow_nodes(timings)
    recipe = mixed_recipe(slow)
    mixed = aeq.quantize(float_content, recipe, where="dynamic_auto") if slow else dynamic
    timer = time_fn or (
        lambda content, t: bench.latency(content, threads=t, warmup=warmup, runs=runs)["p50_ms"]
    )
    float_rounds, mixed_rounds = [], []
    for r in range(rounds):  # interleaved, the order alternating
        pair = [(float_rounds, float_content), (mixed_rounds, mixed)]
        for out, content in pair if r % 2 == 0 else pair[::-1]:
            out.append(timer(content, threads))
    kept = ", ".join(f"{t.node} ({t.op})" for t in slow) or "no op"
    notes = [f"dynamic_auto: int8 arithmetic slower than float alone for {kept}: weight-only there"]
    fallback = slower_beyond_spread(mixed_rounds, float_rounds)
    if fallback:
        recipe = aeq.named_recipe("int8_weights")
        mixed = aeq.quantize(float_content, recipe, where="dynamic_auto")
        notes.append(
            f"dynamic_auto: the mixed model took {statistics.median(mixed_rounds):.3f} ms, float32 "
            f"{statistics.median(float_rounds):.3f} ms (p50, {threads} thread(s), every round "
            "slower): every op keeps int8 weights dequantized to float at load (int8_weights)"
        )
    for note in notes:
        say(note)
    return DynamicChoice(
        content=mixed,
        recipe=recipe,
        ops=timings,
        float_nodes=[t.node for t in slow],
        float_rounds=float_rounds,
        mixed_rounds=mixed_rounds,
        fallback=fallback,
        notes=notes,
    )
