"""What each piece of a model between two cut points costs, measured in seconds.

``--balance time`` (the default) cuts the model into its smallest pieces (one at each place where
one tensor crosses), times each piece's forward and backward pass on a real batch (the median of
a few runs after a warm-up, on the first stage's device) and balances the stages by those
seconds. A piece's time belongs to its last layer: the stages are cut only at piece ends, so
that is all the balance needs. Measured time sees what parameters and multiply-adds miss (a
convolution on a large image has few weights; memory-bound layers cost more than their
multiply-adds), at the price of the timing's noise: a run records the split it measured and a
resumed run cuts there again.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from tfopt.core._keras import keras, tf

from tfopt.runtime.gpipe.stages import _Graph, build_stages, partition, stage_devices

REPEATS = 5


def median_seconds(fn, repeats: int) -> float:
    """The median wall time of ``fn()`` (its outputs read back) over ``repeats`` runs after one
    that traces."""
    fn()  # traces
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        tf.nest.map_structure(lambda t: t.numpy(), fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def stage_step(stage, remat: bool):
    """Forward and backward passes of ``stage`` over a list of micro-batch inputs, in GPipe's
    order on one device: every forward pass, one after another, then every backward pass in
    reverse, one after another (control dependencies make the order binding: without them the
    executor would start a micro-batch's backward pass as soon as its forward pass ended, and
    hold fewer activations than the step does). Returns the inputs' gradients and the summed
    gradients of the stage's weights."""

    def run(h):
        return stage(h, training=True)

    call = tf.recompute_grad(run) if remat else run

    @tf.function
    def step(parts):
        weights, taped, previous = stage.trainable_variables, [], []
        for h in parts:
            with tf.control_dependencies(previous), tf.GradientTape() as tape:
                tape.watch(h)
                total = tf.reduce_sum(tf.cast(call(h), tf.float32))
            taped.append((tape, h, total))
            previous = [total]
        inputs, summed = [], [tf.zeros_like(v) for v in weights]
        for tape, h, total in reversed(taped):
            with tf.control_dependencies(previous):
                grads = tape.gradient(total, [h, *weights])
            inputs.append(grads[0])
            summed = [s if g is None else s + g for s, g in zip(summed, grads[1:], strict=True)]
            previous = [grads[0], *summed]
        return inputs[::-1], summed

    return step


def piece_seconds(model: keras.Model, x: Any, repeats: int = REPEATS) -> dict[str, float]:
    """Each piece's measured forward-and-backward seconds on the batch ``x``.

    Args:
        model: A functional or Sequential tf_keras model :func:`partition` can split.
        x: A batch of the model's inputs (the training batch size: the time of small batches is
            mostly overhead).
        repeats: Timed runs per piece after the warm-up; the median is kept.

    Returns:
        ``{layer name: seconds}`` for the last layer of each piece (every other layer costs 0).
    """
    graph = _Graph(model)
    ends = [*graph.cuts(), len(graph.order) - 1]
    pieces = partition(model, len(ends), cut_after=[graph.order[i] for i in ends[:-1]])
    device = stage_devices(1)[0]
    seconds, h = {}, x
    for piece, end in zip(build_stages(model, pieces, [device] * len(ends)), ends, strict=True):
        step = stage_step(piece, remat=False)
        seconds[graph.order[end]] = median_seconds(lambda s=step, h=h: s([h]), repeats)
        h = piece(h, training=False)
    return seconds
