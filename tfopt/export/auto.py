"""Latency-aware int8 (mode ``int8_auto``): the ops whose int8 kernel is slower than float stay float.

Full-integer int8 is not always faster on a CPU: XNNPACK's int8 convolution over a 1-channel
image, for one, is several times slower than its float kernel, and tiny ops gain nothing from int8
while the QUANTIZE / DEQUANTIZE around them cost time. :func:`search` finds out, per op, on the
machine it runs on:

1. Convert the model to float32 and to int8. The int8 model comes from TFLite's quantization
   debugger (:mod:`tfopt.export.fidelity`), whose ``denylisted_nodes`` later keep chosen ops in
   float. Pair the ops of the two models: the same ops in the same order once int8's QUANTIZE and
   DEQUANTIZE are set aside (a mismatch is a ConversionError, not a guess).
2. Per-op latency: every op is timed alone as a one-op model (:mod:`tfopt.export.ops`), float
   and int8 interleaved over ``rounds``; each op's figure is the median of its rounds' p50.
3. Decision: the ops whose int8 p50 is above their float p50 (and that the debugger can keep in
   float) form the slow set.
4. Candidates: plain int8, then the slow ops kept in float cumulatively, the largest loss first,
   the whole slow set always among them (at most ``max_candidates`` models).
5. Keeping an op in float adds a DEQUANTIZE before it and a QUANTIZE after it, which one-op
   timings do not see: every candidate is timed end to end (interleaved rounds, p50 at
   ``threads``) and scored by ``evaluate_fn`` against the fidelity gate, on held-out data the caller
   chooses (the export uses the validation split, never the test split).
6. The fastest candidate that passes the gate is chosen; when none passes, the one with the best
   agreement (and the export reports the failed gate).
"""

from __future__ import annotations

import functools
import logging
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from tfopt.core.errors import ConfigError
from tfopt.core.log import PROGRESS
from tfopt.export import benchmark as bench
from tfopt.export import converter, fidelity
from tfopt.export.evaluate import EvalResult
from tfopt.export.ops import OpRunner, model_ops, single_op_model

log = logging.getLogger(__name__)

# Ops the quantizer inserts at float <-> int8 borders: not ops of the model itself.
_BORDER_OPS = ("QUANTIZE", "DEQUANTIZE")


@dataclass
class OpTiming:
    """One op of the model, timed alone in float32 and in int8."""

    index: int  # the op's index in the float32 model
    op: str  # builtin op name, e.g. CONV_2D
    node: str  # the float op's output tensor name: what the debugger's ``denylisted_nodes`` takes
    float_rounds: list[float] = field(default_factory=list)  # p50 (ms) of every round
    int8_rounds: list[float] = field(default_factory=list)
    denylistable: bool = True  # the quantization debugger can keep it in float
    error: str | None = None  # why it could not be timed alone

    @property
    def float_ms(self) -> float | None:
        """Median over rounds of the float op's p50 (None when not timed)."""
        return statistics.median(self.float_rounds) if self.float_rounds else None

    @property
    def int8_ms(self) -> float | None:
        """Median over rounds of the int8 op's p50 (None when not timed)."""
        return statistics.median(self.int8_rounds) if self.int8_rounds else None

    @property
    def loss_ms(self) -> float | None:
        """How much slower the int8 kernel is (negative: faster)."""
        if self.float_ms is None or self.int8_ms is None:
            return None
        return self.int8_ms - self.float_ms

    @property
    def slower(self) -> bool:
        """True when this op goes into the slow set: timed, int8 slower, and the debugger can keep it in float."""
        return self.denylistable and self.loss_ms is not None and self.loss_ms > 0

    def to_dict(self) -> dict:
        """JSON-friendly dict, with the medians and the decision."""
        return {
            **asdict(self),
            "float_ms": self.float_ms,
            "int8_ms": self.int8_ms,
            "int8_speedup": (
                self.float_ms / self.int8_ms if self.float_ms and self.int8_ms else None
            ),
            "slower_in_int8": self.slower,
        }


@dataclass
class Candidate:
    """One mixed model: int8 with ``float_nodes`` kept in float."""

    float_nodes: list[str]
    size_bytes: int
    p50_rounds: list[float]  # end-to-end p50 (ms) of every round, at the first thread count
    result: EvalResult
    gate: fidelity.GateResult
    rounds_by_threads: dict[int, list[float]] = field(default_factory=dict)  # every thread count

    def __post_init__(self):
        self.rounds_by_threads = self.rounds_by_threads or {1: list(self.p50_rounds)}

    @property
    def p50_ms(self) -> float:
        """Median over rounds of the end-to-end p50 at the first thread count."""
        return statistics.median(self.p50_rounds)

    def to_dict(self) -> dict:
        """JSON-friendly dict."""
        return {
            "float_nodes": self.float_nodes,
            "size_bytes": self.size_bytes,
            "p50_ms": self.p50_ms,
            "p50_rounds": self.p50_rounds,
            "p50_rounds_by_threads": {str(t): r for t, r in self.rounds_by_threads.items()},
            "result": self.result.to_dict(),
            "gate": self.gate.to_dict(),
        }


def beats(candidate: Candidate, plain: Candidate) -> bool:
    """True when ``candidate`` is faster than ``plain`` beyond the measured noise at every thread
    count: each of its rounds faster than every round of ``plain``."""
    return all(
        max(rounds) < min(plain.rounds_by_threads[t])
        for t, rounds in candidate.rounds_by_threads.items()
    )


def choose(candidates: Sequence[Candidate]) -> int:
    """The candidate to export (``candidates[0]`` is plain int8).

    Plain int8 when it passes the gate, unless another passing candidate :func:`beats` it (then
    the fastest of those by the sum of medians over thread counts): int8_auto is never slower
    than plain int8 at the thread counts it was asked for. When plain int8 fails the gate, the
    fastest passing candidate; when none passes, the one with the best agreement.
    """

    def total(i: int) -> float:
        return sum(statistics.median(r) for r in candidates[i].rounds_by_threads.values())

    passing = [i for i, c in enumerate(candidates) if c.gate.passed]
    if not passing:
        return max(range(len(candidates)), key=lambda i: candidates[i].result.agreement or 0.0)
    if 0 not in passing:
        return min(passing, key=total)
    better = [i for i in passing if i and beats(candidates[i], candidates[0])]
    return min(better, key=total) if better else 0


@dataclass
class AutoResult:
    """What the latency-aware search measured and chose."""

    threads: int
    ops: list[OpTiming]
    candidates: list[Candidate]
    chosen: int  # index into candidates
    content: bytes = b""  # the chosen model

    @property
    def slow(self) -> list[str]:
        """The nodes whose int8 kernel measured slower than float."""
        return [t.node for t in slow_ops(self.ops)]

    @property
    def passed(self) -> bool:
        """True when the chosen candidate passed the gate."""
        return self.candidates[self.chosen].gate.passed

    def to_dict(self) -> dict:
        """JSON-friendly dict (without the model bytes)."""
        return {
            "threads": self.threads,
            "ops": [t.to_dict() for t in self.ops],
            "slow": self.slow,
            "candidates": [c.to_dict() for c in self.candidates],
            "chosen": self.chosen,
            "float_nodes": self.candidates[self.chosen].float_nodes,
            "passed": self.passed,
        }


def explain(found: AutoResult, threads: Sequence[int]) -> str:
    """The one line that says what int8_auto kept in float and why, with end-to-end timings."""
    chosen, plain = found.candidates[found.chosen], found.candidates[0]
    counts = "/".join(str(t) for t in threads)
    if not found.passed:
        why = "no candidate passed the gate on validation"
    elif found.chosen == 0:
        why = f"plain int8: no candidate beat it beyond the timing noise at {counts} thread(s)"
    elif not plain.gate.passed:
        why = (
            f"plain int8 failed the gate ({'; '.join(plain.gate.reasons)}): the passing candidate "
            f"fastest over {counts} thread(s)"
        )
    else:
        why = f"faster than plain int8 in every timing round at {counts} thread(s), gate passed"
    timed = ", ".join(
        f"{t}t {statistics.median(chosen.rounds_by_threads[t]):.3f} vs "
        f"{statistics.median(plain.rounds_by_threads[t]):.3f} ms"
        for t in chosen.rounds_by_threads
    )
    return (
        f"int8_auto: int8 measured slower than float for {', '.join(found.slow) or 'no op'} "
        f"({threads[0]} thread(s)); kept in float: {', '.join(chosen.float_nodes) or 'no op'} "
        f"({why}; end to end {timed} for plain int8)"
    )


def recipe(found: AutoResult) -> list[dict]:
    """The search's per-op choice as an ai-edge-quantizer recipe: full-integer int8 everywhere,
    the chosen float ops kept float. ``tfopt export --modes recipe --recipe FILE`` re-applies it
    (with ai-edge-quantizer's int8, not the converter's: the same choice, not the same bytes)."""
    from tfopt.export import aeq

    kept = set(found.candidates[found.chosen].float_nodes)
    nodes = [(t.op, t.node) for t in found.ops if t.node in kept]
    return aeq.keep_float([{"regex": ".*", "operation": "*", "algorithm_key": aeq.MIN_MAX,
                            "op_config": aeq.static_int8()}], nodes)  # fmt: skip


def slow_ops(timings: Sequence[OpTiming]) -> list[OpTiming]:
    """The ops to keep in float: timed alone, int8 slower than float, and denylistable; in model order."""
    return [t for t in timings if t.slower]


def candidate_sets(timings: Sequence[OpTiming], max_candidates: int = 5) -> list[list[str]]:
    """The float-node sets to try end to end: none, then the slow ops cumulatively, largest loss first.

    The whole slow set is always the last set; with more slow ops than ``max_candidates`` allows,
    the middle prefixes are dropped. A set that keeps every denylistable op in float is left out:
    it is the float model, not an int8 one (and the quantization debugger cannot build it).

    Raises:
        ConfigError: ``max_candidates`` < 2 (plain int8 and the slow set are the least to compare).
    """
    if max_candidates < 2:
        raise ConfigError(
            f"max candidates={max_candidates} must be >= 2 (plain int8 and the slow set) "
            "(--auto-candidates)"
        )
    ranked = sorted(slow_ops(timings), key=lambda t: -(t.loss_ms or 0.0))
    quantized = {t.node for t in timings if t.denylistable}
    sets = [[t.node for t in ranked[:k]] for k in range(len(ranked) + 1)]
    sets = [s for s in sets if not s or not quantized <= set(s)]
    if len(sets) > max_candidates:
        sets = sets[: max_candidates - 1] + [sets[-1]]
    return sets


# -- the models' ops --------------------------------------------------------------------------------


def pair_ops(
    float_ops: Sequence[tuple[str, str]], int8_ops: Sequence[tuple[str, str]]
) -> list[tuple[int, int]]:
    """Pairs every op of the float model with its int8 counterpart: ``[(float index, int8 index)]``.

    Raises:
        converter.ConversionError: the two models do not hold the same ops in the same order.
    """
    f = [i for i, (op, _) in enumerate(float_ops) if op not in _BORDER_OPS]
    q = [i for i, (op, _) in enumerate(int8_ops) if op not in _BORDER_OPS]
    if [float_ops[i][0] for i in f] != [int8_ops[i][0] for i in q]:
        raise converter.ConversionError(
            "int8_auto cannot pair the ops of the float32 and int8 models (float: "
            f"{', '.join(float_ops[i][0] for i in f)}; int8: {', '.join(int8_ops[i][0] for i in q)}); "
            "export --modes int8 (with --float-layers to keep layers in float) instead"
        )
    return list(zip(f, q))


def time_ops(
    float_content: bytes,
    int8_content: bytes,
    *,
    threads: int = 1,
    rounds: int = 3,
    runs: int = 100,
    warmup: int = 10,
) -> list[OpTiming]:
    """Times every op of the float model and its int8 counterpart alone (see the module docstring).

    Args:
        float_content: The float32 .tflite.
        int8_content: The int8 .tflite of the same model.
        threads: Interpreter threads.
        rounds: Interleaved rounds (float op, int8 op, next op, ...).
        runs: Timed invokes per op per round.
        warmup: Untimed invokes first, every round.

    Returns:
        One OpTiming per op of the float model, in model order. An op that cannot run alone
        (e.g. one calling another subgraph) has no rounds and its ``error`` set.
    """
    float_ops, int8_ops = model_ops(float_content), model_ops(int8_content)
    pairs = pair_ops(float_ops, int8_ops)
    timings, runners = [], []
    for fi, qi in pairs:
        timing = OpTiming(index=fi, op=float_ops[fi][0], node=float_ops[fi][1])
        timings.append(timing)
        try:
            runners.append(
                (
                    timing,
                    OpRunner(single_op_model(float_content, fi), threads),
                    OpRunner(single_op_model(int8_content, qi), threads),
                )
            )
        except (
            ValueError,
            RuntimeError,
        ) as e:  # what the interpreter raises for a model it refuses
            timing.error = (
                str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
            )
    for _ in range(rounds):
        for timing, f, q in runners:
            timing.float_rounds.append(f.p50_ms(runs, warmup))
            timing.int8_rounds.append(q.p50_ms(runs, warmup))
    return timings


# -- the search ------------------------------------------------------------------------------------


def _check(rounds: int, runs: int, counts: list[int], warmup: int, max_candidates: int) -> None:
    """Refuses a search setting out of range (one line each)."""
    for name, value, low in (
        ("rounds", rounds, 1),
        ("runs", runs, 1),
        ("threads", min(counts, default=0), 1),
        ("warmup", warmup, 0),
    ):
        if value < low:
            raise ConfigError(f"int8_auto {name}={value} must be >= {low}")
    if max_candidates < 2:
        candidate_sets([], max_candidates)  # raises the one-line error


def _time_candidates(
    contents, counts, rounds, runs, warmup, time_fn
) -> list[dict[int, list[float]]]:
    """Every candidate's p50 at every thread count, once per round."""
    # The final table's protocol (bench.latency: warmup, then runs timed invokes, p50), in
    # interleaved rounds at every thread count.
    p50s: list[dict[int, list[float]]] = [{t: [] for t in counts} for _ in contents]
    for r in range(rounds):
        order = list(range(len(contents)))
        order = (
            order[r % len(order) :] + order[: r % len(order)]
        )  # rotate: no candidate always goes first
        for t in counts:
            for i in order:
                p50s[i][t].append(
                    time_fn(contents[i], t)
                    if time_fn is not None
                    else bench.latency(contents[i], threads=t, warmup=warmup, runs=runs)["p50_ms"]
                )
    return p50s


def _scored(sets, contents, p50s, threads: int, evaluate_fn, thresholds) -> list[Candidate]:
    """Every candidate, scored by ``evaluate_fn`` and gated, with its timings."""
    candidates = []
    for s, content, by_threads in zip(sets, contents, p50s):
        result = evaluate_fn(content)
        candidates.append(
            Candidate(
                list(s),
                len(content),
                by_threads[threads],
                result,
                fidelity.check(result, thresholds),
                by_threads,
            )
        )
    return candidates


def search(
    model,
    calibration: Sequence[np.ndarray],
    evaluate_fn: Callable[[bytes], EvalResult],
    thresholds: fidelity.Thresholds,
    *,
    io_type: str = "float",
    threads: int | Sequence[int] = 1,
    rounds: int = 3,
    runs: int = 100,
    warmup: int = 10,
    max_candidates: int = 5,
    time_fn: Callable[[bytes, int], float] | None = None,
) -> AutoResult:
    """Int8 with the ops whose int8 kernel is slower kept in float: the fastest such model that passes the gate.

    Args:
        model: The float Keras model (not QAT).
        calibration: Representative batches of the int8 conversion.
        evaluate_fn: Scores a candidate flatbuffer against the Keras model on held-out data that
            is not the test set the final figures are reported on (e.g. the validation split).
        thresholds: The fidelity gate.
        io_type: I/O type of the candidates (``float``, ``int8``, ``uint8``; an op kept in float at
            the model's edge keeps float I/O there).
        threads: Interpreter thread count(s) the candidates are timed at; the ops are timed alone
            at the first. The chosen candidate must beat plain int8 at every one (:func:`choose`).
        rounds: Interleaved rounds for the per-op and the end-to-end timings.
        runs: Timed invokes per model per round.
        warmup: Untimed invokes first.
        max_candidates: Models timed and scored end to end (>= 2).
        time_fn: ``(flatbuffer, threads) -> p50 ms`` for the end-to-end timings (e.g. on the
            phone, ``--device``); default: LiteRT here (``bench.latency``). The ops are always
            timed alone here.

    Returns:
        Every op's timings, every candidate and the chosen model.

    Raises:
        ConfigError: bad ``max_candidates``, ``rounds``, ``runs`` or ``threads``.
        converter.ConversionError: the converter failed, or the float and int8 ops do not pair.
    """
    say = functools.partial(log.log, PROGRESS)  # shown unless --quiet
    counts = [threads] if isinstance(threads, int) else list(threads)
    threads = counts[0] if counts else 0
    _check(rounds, runs, counts, warmup, max_candidates)
    debugger = fidelity.quantization_debugger(model, calibration, list(calibration)[:1])
    nodes = {r.tensor_name for r in fidelity.rank_layers(debugger)}
    float_content = converter.by_converter(
        model, "float32", options=converter.ConvertOptions(sparsity="off")
    ).content
    int8_content = fidelity.requantize(debugger, [])
    say(
        f"int8_auto: timing every op alone in float32 and int8 ({threads} thread(s), {rounds} rounds)"
    )
    timings = time_ops(
        float_content, int8_content, threads=threads, rounds=rounds, runs=runs, warmup=warmup
    )
    for t in timings:
        t.denylistable = t.node in nodes
    sets = candidate_sets(timings, max_candidates)
    say(
        f"int8_auto: int8 slower for {', '.join(t.node for t in slow_ops(timings)) or 'no op'}; "
        f"timing {len(sets)} candidate(s) end to end"
    )
    contents = [fidelity.requantize(debugger, s, io_type) for s in sets]
    p50s = _time_candidates(contents, counts, rounds, runs, warmup, time_fn)
    candidates = _scored(sets, contents, p50s, threads, evaluate_fn, thresholds)
    chosen = choose(candidates)
    return AutoResult(
        threads=threads, ops=timings, candidates=candidates, chosen=chosen, content=contents[chosen]
    )
