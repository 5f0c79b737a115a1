"""Timing several .tflite files fairly: one graph timed once, in interleaved rounds, with a spread.

Two files whose graphs compute the same thing (the same ops, tensors, weights and quantization;
names, signatures and metadata aside) are one graph: it is timed once and both files get its
figures, so two timings of one graph can never disagree. Distinct graphs are timed in ``rounds``
rounds, one graph after the other within each round, so that a machine that slows down for a
while slows every graph alike. Each figure is the percentile over all of a graph's runs, with the
median of each round beside it: two graphs differ measurably only when every round of one is
faster than every round of the other (:func:`measurable`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

import numpy as np

from tfopt.config.export import ROUNDS  # noqa: F401 - the default lives in the config
from tfopt.core.timing import percentiles, samples
from tfopt.export import benchmark as bench


def graph_key(content: bytes) -> str:
    """A digest of what a runtime computes with: every subgraph's ops, tensors, weights and
    quantization, by position. Tensor and signature names, metadata and packed files are left out.
    """
    from tfopt.core._compat import read_tflite_model

    model = read_tflite_model(content)
    h = hashlib.sha256()

    def put(*values) -> None:
        h.update(repr(values).encode())

    def array(value):
        return None if value is None else np.asarray(value).tolist()

    codes = [
        (max(c.builtinCode, c.deprecatedBuiltinCode), c.customCode, c.version)
        for c in model.operatorCodes
    ]
    for graph in model.subgraphs:
        put("graph", array(graph.inputs), array(graph.outputs))
        for t in graph.tensors:
            q = t.quantization
            quant = q and (array(q.scale), array(q.zeroPoint), q.quantizedDimension)
            data = model.buffers[t.buffer].data if t.buffer else None
            digest = (
                hashlib.sha256(np.asarray(data, np.uint8).tobytes()).hexdigest()
                if data is not None
                else None
            )
            put(
                "tensor",
                array(t.shape),
                t.type,
                quant,
                digest,
                t.isVariable,
                array(t.shapeSignature),
            )
        for op in graph.operators:
            options = op.builtinOptions
            put(
                "op",
                codes[op.opcodeIndex],
                array(op.inputs),
                array(op.outputs),
                op.builtinOptionsType,
                sorted((k, repr(v)) for k, v in vars(options).items()) if options else None,
                array(op.customOptions),
            )
    return h.hexdigest()


def measurable(a: Sequence[float], b: Sequence[float]) -> bool:
    """Whether two sets of per-round medians differ beyond their spread: every round of one is
    faster than every round of the other."""
    return bool(a) and bool(b) and (max(a) < min(b) or max(b) < min(a))


def time_files(
    contents: dict[str, bytes],
    settings: Sequence[tuple[str, str, bool, int]],
    *,
    warmup: int,
    runs: int,
    rounds: int = ROUNDS,
    say: Callable[[str], None] | None = None,
) -> tuple[dict[str, dict], dict[str, str]]:
    """Batch-1 latency of every file at every setting, identical graphs once, in interleaved rounds.

    Args:
        contents: Name -> flatbuffer, in table order.
        settings: ``(key, runtime, xnnpack, threads)`` per setting (see ``BenchSettings.settings``).
        warmup: Untimed runs of each graph before its first round.
        runs: Timed runs of each graph, split evenly over the rounds.
        rounds: Rounds (at most ``runs``).
        say: Progress, one line per setting.

    Returns:
        ``(figures, same)``: ``figures[name][key]`` is ``{"p50_ms", "p95_ms", "mean_ms",
        "min_ms", "runs", "warmup", "threads", "runtime", "kernels", "round_p50_ms"}``;
        ``same[name]`` names the earlier file whose graph a file shares (absent for the first).

    Raises:
        ConfigError: ``runs`` < 1 or ``warmup`` < 0.
    """
    bench.check_runs(runs, warmup)
    rounds = max(1, min(rounds, runs))
    per_round = [runs // rounds + (i < runs % rounds) for i in range(rounds)]
    first: dict[str, str] = {}
    same: dict[str, str] = {}
    for name, content in contents.items():
        key = graph_key(content)
        if key in first:
            same[name] = first[key]
        else:
            first[key] = name
    distinct = list(first.values())
    figures: dict[str, dict] = {name: {} for name in contents}
    for key, runtime, xnnpack, threads in settings:
        if say:
            say(f"timing {len(distinct)} graph(s) at {key}: {rounds} interleaved rounds")
        timers = {}
        try:
            for name in distinct:
                timers[name] = bench.Timer(
                    contents[name], threads=threads, xnnpack=xnnpack, runtime=runtime
                )
                for _ in range(warmup):
                    timers[name].call()
            taken: dict[str, list[np.ndarray]] = {name: [] for name in distinct}
            for n in per_round:
                for name in distinct:
                    taken[name].append(samples(timers[name].call, n))
        finally:
            kernels = {name: timer.close() for name, timer in timers.items()}
        for name in distinct:
            figures[name][key] = {
                **percentiles(np.concatenate(taken[name])),
                "runs": runs,
                "warmup": warmup,
                "threads": threads,
                "runtime": runtime,
                "kernels": kernels[name],
                "round_p50_ms": [float(np.median(r)) * 1e3 for r in taken[name]],
            }
    for name, twin in same.items():
        figures[name] = figures[twin]
    return figures, same
