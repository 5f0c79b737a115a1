"""How much each output channel of a layer matters: the score channel pruning ranks channels by.

The L1 or L2 norm of a channel's kernel slice, the batch norm's ``|gamma|`` after it, or the
first-order Taylor estimate of the loss change when the channel goes, each divided by its
layer's mean so layers compare.
"""

from __future__ import annotations

from tfopt.core._keras import keras

import numpy as np

from tfopt.compress.common import OptimizeError
from tfopt.config.optimize import IMPORTANCES as IMPORTANCE  # noqa: F401 - the measures

L = keras.layers


def _kernel_out(layer) -> np.ndarray:
    """The kernel whose last axis holds the layer's output channels."""
    return (
        layer.pointwise_kernel if isinstance(layer, L.SeparableConv2D) else layer.kernel
    ).numpy()


def _taylor(model: keras.Model, names: list[str], batches) -> dict[str, np.ndarray]:
    """``(sum over the kernel slice of weight x gradient)^2`` per output channel, averaged over ``batches``."""
    from tfopt.core._keras import tf

    kernels = [
        model.get_layer(n).pointwise_kernel
        if isinstance(model.get_layer(n), L.SeparableConv2D)
        else model.get_layer(n).kernel
        for n in names
    ]
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    total = {n: np.zeros(int(k.shape[-1])) for n, k in zip(names, kernels)}
    count = 0
    for x, y in batches:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=False))
        for n, k, g in zip(names, kernels, tape.gradient(loss, kernels)):
            w = k.numpy().astype(np.float64)
            total[n] += np.sum((w * g.numpy()).reshape(-1, w.shape[-1]), axis=0) ** 2
        count += 1
    if not count:
        raise OptimizeError(
            "taylor importance got no batch; give taylor_batches >= 1 and a non-empty training split"
        )
    return {n: t / count for n, t in total.items()}


def importance(
    model: keras.Model, producers: list[str], method: str, batches=None
) -> dict[str, np.ndarray]:
    """Producer -> importance of each of its output channels, divided by the layer's mean.

    Args:
        model: The model (its layers called once).
        producers: Names of its Conv2D, SeparableConv2D and Dense layers to score.
        method: One of :data:`IMPORTANCE`; ``bn`` falls back to ``l1`` for a producer without a
            batch norm right after it.
        batches: ``(images, labels)`` batches, for ``taylor`` only.
    """
    consumers: dict[str, list] = {}
    for layer in model.layers:
        for node in layer.inbound_nodes:
            for inbound in (
                node.inbound_layers
                if isinstance(node.inbound_layers, list)
                else [node.inbound_layers]
            ):
                consumers.setdefault(inbound.name, []).append(layer)
    taylor = (
        _taylor(model, producers, batches if batches is not None else [])
        if method == "taylor"
        else {}
    )
    out = {}
    for name in producers:
        layer = model.get_layer(name)
        kernel = _kernel_out(layer).reshape(-1, _kernel_out(layer).shape[-1])
        bn = [c for c in consumers.get(name, []) if isinstance(c, L.BatchNormalization) and c.scale]
        if method == "taylor":
            score = taylor[name]
        elif method == "bn" and len(bn) == 1:
            score = np.abs(bn[0].gamma.numpy())
        elif method == "l2":
            score = np.sqrt(np.sum(kernel.astype(np.float64) ** 2, axis=0))
        else:
            score = np.sum(np.abs(kernel.astype(np.float64)), axis=0)
        mean = float(np.mean(score))
        out[name] = score / mean if mean > 0 else np.ones_like(score, dtype=np.float64)
    return out
