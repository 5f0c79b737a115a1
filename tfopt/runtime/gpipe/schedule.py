"""The 1F1B schedule (PipeDream-flush; Narayanan et al., 2021) of a pipelined training step.

GPipe runs every micro-batch's forward pass before any backward pass, so each stage holds the
activations of all M micro-batches. Under 1F1B stage k runs K-k-1 forward passes to fill the
pipeline, then alternates one forward and one backward pass, then drains the backward passes: it
holds at most K-k micro-batches' activations, whatever M. The gradients are the same: each
micro-batch's loss is weighted by its share of the batch, its gradients are summed over the
micro-batches and applied once. The order is made binding in the graph: each pass of a stage
runs after the previous pass of the same stage (control dependencies), as on a device that does
one thing at a time.
"""

from __future__ import annotations

from tfopt.core._keras import keras, tf


def microbatch_sizes(batch, microbatches: int):
    """The sizes of ``microbatches`` near-equal parts of a batch of ``batch`` examples."""
    base, extra = batch // microbatches, batch % microbatches
    return base + tf.cast(tf.range(microbatches) < extra, batch.dtype)


def one_f_one_b(stages: int, microbatches: int) -> list[list[tuple[str, int]]]:
    """Each stage's passes in 1F1B order: ``("F", m)`` a forward pass of micro-batch m, ``("B", m)``
    its backward pass."""
    order = []
    for k in range(stages):
        warm = min(stages - k - 1, microbatches)
        passes = [("F", m) for m in range(warm)]
        for m in range(warm, microbatches):
            passes += [("F", m), ("B", m - warm)]
        passes += [("B", m) for m in range(microbatches - warm, microbatches)]
        order.append(passes)
    return order


def _ready(op: tuple[str, int], k: int, done: set, last: int) -> bool:
    kind, m = op
    if kind == "F":
        return k == 0 or ("F", k - 1, m) in done
    return ("F", k, m) in done and (k == last or ("B", k + 1, m) in done)


def one_f_one_b_step(model, x, y, sample_weight):
    """Predictions and gradients (in ``model.trainable_variables``' order) of one 1F1B step.

    Args:
        model: A :class:`~tfopt.runtime.gpipe.Pipelined` model, compiled.
        x, y, sample_weight: The batch.
    """
    k_stages, m_count = len(model.stages), model.microbatches
    n = tf.shape(x)[0]
    sizes = microbatch_sizes(n, m_count)

    def parts(t):
        return [None] * m_count if t is None else tf.split(t, sizes, num=m_count)

    xs, ys, ws = parts(x), parts(y), parts(sample_weight)
    share = [tf.cast(sizes[m], tf.float32) / tf.cast(n, tf.float32) for m in range(m_count)]
    scaling = isinstance(model.optimizer, keras.mixed_precision.LossScaleOptimizer)
    calls = [model._stage_call(stage) for stage in model.stages]
    taped, upstream, predictions = {}, {}, [None] * m_count
    total = {v.ref(): tf.zeros_like(v) for v in model.trainable_variables}
    previous: list[list] = [[] for _ in range(k_stages)]
    order = one_f_one_b(k_stages, m_count)
    position, done = [0] * k_stages, set()
    while any(position[k] < len(order[k]) for k in range(k_stages)):
        for k in range(k_stages):
            if position[k] == len(order[k]) or not _ready(
                order[k][position[k]], k, done, k_stages - 1
            ):
                continue
            kind, m = order[k][position[k]]
            with tf.device(model.devices[k]), tf.control_dependencies(previous[k]):
                if kind == "F":
                    inputs = xs[m] if k == 0 else taped[(k - 1, m)][2]
                    with tf.GradientTape() as tape:
                        tape.watch(inputs)
                        outputs = calls[k](inputs)
                        target = outputs
                        if k == k_stages - 1:
                            predictions[m] = outputs
                            loss = model.compiled_loss(ys[m], outputs, ws[m]) * share[m]
                            target = model.optimizer.get_scaled_loss(loss) if scaling else loss
                    taped[(k, m)] = (tape, inputs, outputs, target)
                    previous[k] = [outputs]
                else:
                    tape, inputs, _, target = taped.pop((k, m))
                    weights = model.stages[k].trainable_variables
                    sources = [inputs, *weights] if k > 0 else weights
                    grads = tape.gradient(
                        target,
                        sources,
                        output_gradients=None if k == k_stages - 1 else upstream.pop((k + 1, m)),
                    )
                    if k > 0:
                        upstream[(k, m)], grads = grads[0], grads[1:]
                    for v, g in zip(weights, grads, strict=True):
                        if g is not None:
                            total[v.ref()] += g
                    previous[k] = [g for g in grads if g is not None] + (
                        [upstream[(k, m)]] if k > 0 else []
                    )
            done.add((kind, k, m))
            position[k] += 1
    grads = [total[v.ref()] for v in model.trainable_variables]
    if scaling:
        grads = model.optimizer.get_unscaled_gradients(grads)
    if model.losses:  # weight regularization: once per step, not per micro-batch
        with tf.GradientTape() as tape:
            penalty = tf.add_n(model.losses)
        extra = tape.gradient(penalty, model.trainable_variables)
        grads = [g if e is None else g + e for g, e in zip(grads, extra, strict=True)]
    with tf.device(model.devices[-1]):
        return tf.concat(predictions, 0), grads
