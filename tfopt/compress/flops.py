"""Multiply-adds per example of each layer that carries them (convolutions and dense layers).

Counted from the layers' static shapes, as a FLOPs budget or a structured-compression plan needs
them layer by layer; batch normalization, activations and pooling are left out (a converter folds
the first, the others cost little). One multiply-add = 2 FLOPs.
"""

from __future__ import annotations

from tfopt.core._keras import keras

import numpy as np

from tfopt.core._compat import model_node_indices


def _positions(shape, data_format: str = "channels_last") -> int:
    """Output positions per example: every dimension but the batch and the channels."""
    dims = list(shape[1:])
    del dims[0 if data_format == "channels_first" and len(dims) > 1 else -1]
    return int(np.prod(dims)) if dims else 1


def layer_macs(layer, model: keras.Model | None = None) -> int:
    """Multiply-adds per example of ``layer`` over its calls in ``model`` (all calls without one; 0 for
    layers without a kernel)."""
    total = 0
    calls = (
        model_node_indices(model, layer) if model is not None else range(len(layer.inbound_nodes))
    )
    for shape_in, shape_out in (
        (layer.get_input_shape_at(i), layer.get_output_shape_at(i)) for i in calls
    ):
        if isinstance(shape_in, list) or isinstance(shape_out, list):
            continue
        fmt = getattr(layer, "data_format", "channels_last")
        channel = 1 if fmt == "channels_first" else -1
        if isinstance(layer, keras.layers.DepthwiseConv2D):
            kh, kw = layer.kernel_size
            total += _positions(shape_out, fmt) * kh * kw * shape_out[channel]
        elif isinstance(layer, keras.layers.SeparableConv2D):
            kh, kw = layer.kernel_size
            depth = shape_in[channel] * layer.depth_multiplier
            total += _positions(shape_out, fmt) * (kh * kw * depth + depth * shape_out[channel])
        elif isinstance(layer, keras.layers.Conv2D):
            kh, kw = layer.kernel_size
            total += (
                _positions(shape_out, fmt)
                * kh
                * kw
                * shape_in[channel]
                // layer.groups
                * shape_out[channel]
            )
        elif isinstance(layer, keras.layers.Dense):
            total += _positions(shape_out) * shape_in[-1] * shape_out[-1]
    return int(total)


def model_macs(model: keras.Model) -> dict[str, int]:
    """Layer name -> multiply-adds per example, for every layer of ``model`` that has some."""
    return {layer.name: macs for layer in model.layers if (macs := layer_macs(layer, model))}
