"""Per-example gradient norms without per-example gradients, for the layers where a formula exists.

DP-SGD needs each example's gradient norm, to clip it, and then only the sum of the clipped
gradients. For a layer computing ``z = a W (+ b)``, example ``i``'s kernel gradient is
``a_i^T g_i`` with ``g_i = dL_i/dz_i``, and its norm comes from ``a_i`` and ``g_i`` alone
(Goodfellow 2015; "ghost clipping", Li et al. 2022; "fast gradient clipping", Lee and Kifer
2021, as TensorFlow Privacy's ``gradient_norms`` registry does it):

- ``Dense`` on ``[B, D]``: ``|a_i|^2 |g_i|^2``; on ``[B, T, D]``:
  ``sum_{t,t'} (a_t . a_t')(g_t . g_t')`` (the Gram "ghost" norm); the bias, ``|sum_t g_t|^2``.
- ``Conv2D``: the same over the input patches (im2col, ``tf.image.extract_patches``): the
  per-example kernel gradient ``sum_t p_t g_t^T`` as one batched einsum, or the Gram form when
  ``T^2 (P + C)`` multiply-adds are fewer than ``T P C`` (T positions, P patch size, C filters).
- ``Embedding``: ``sum_{t,t'} [id_t = id_t'] (g_t . g_t')``.
- ``LayerNormalization`` and ``GroupNormalization`` over the last axis, ``y = x_hat gamma + beta``
  per channel: example ``i``'s gradients are ``sum_t x_hat_t g_t`` and ``sum_t g_t`` (x_hat:
  the input normalized by the example's own statistics, recomputed from the recorded input).

So one forward pass records each such layer's input ``a`` and pre-activation output ``z``, one
backward pass gives every ``g``, the norms give the clip factors ``c_i``, and a second backward
pass of ``sum_i c_i L_i`` gives the sum of clipped gradients directly. Layers with trainable
weights and no formula here (or called more than once, or a grouped or channels-first
convolution) get their per-example gradients the vectorized way (:mod:`tfopt.privacy.dpsgd`),
and their squared norms are added.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from tfopt.core._keras import keras, tf

GHOST, VECTORIZED = "ghost", "vectorized"


@dataclass(frozen=True)
class Split:
    """Which trainable layers get their norms from a formula, and which the vectorized way."""

    ghost: tuple = ()  # layers with a formula
    vectorized: tuple = ()  # the other layers with trainable weights
    methods: dict = field(default_factory=dict)  # layer name -> how its norms are computed

    @property
    def vectorized_variables(self) -> list:
        """The trainable variables whose per-example gradients are computed one by one."""
        return [v for layer in self.vectorized for v in layer.trainable_weights]


def split(model: keras.Model, formulas: bool = True) -> Split:
    """Sorts the model's layers with trainable weights by how their per-example norms come
    (``formulas=False``: every layer the vectorized way)."""
    ghost, vectorized, methods, seen = [], [], {}, set()
    for layer in leaves(model):
        if not layer.trainable_weights or id(layer) in seen:
            continue
        seen.add(id(layer))
        how = _formula(layer) if formulas else ""
        if how:
            ghost.append(layer)
            methods[layer.name] = f"{GHOST}: {how}"
        else:
            vectorized.append(layer)
            methods[layer.name] = f"{VECTORIZED}: {type(layer).__name__}"
    return Split(tuple(ghost), tuple(vectorized), methods)


def leaves(model):
    """The model's layers, those of nested models in their place."""
    for layer in model.layers:
        if isinstance(layer, keras.Model):
            yield from leaves(layer)
        else:
            yield layer


def _formula(layer) -> str:
    """The name of the layer's norm formula, or "" when it has none (or is called twice)."""
    if len(getattr(layer, "_inbound_nodes", ())) > 1:
        return ""
    kind = type(layer)
    if kind is keras.layers.Dense:
        return "activations x output gradients"
    if kind is keras.layers.Conv2D:
        if layer.groups != 1 or layer.data_format != "channels_last":
            return ""
        return "input patches x output gradients"
    if kind is keras.layers.Embedding:
        return "output gradients of equal ids"
    if kind in _NORMALIZATIONS and _last_axis_only(layer):
        return "normalized inputs x output gradients"
    return ""


_NORMALIZATIONS = (keras.layers.LayerNormalization, keras.layers.GroupNormalization)


def _last_axis_only(layer) -> bool:
    """Whether the layer normalizes (and scales) along the last axis alone, channels last."""
    try:
        rank = len(layer.input_shape)
    except (AttributeError, RuntimeError):  # not called in a layer graph: no shape to read
        return False
    axes = layer.axis if isinstance(layer.axis, (list, tuple)) else [layer.axis]
    return [a % rank for a in axes] == [rank - 1]


@dataclass
class Record:
    """One call of a ghost layer: its input and its output before the activation."""

    layer: object
    inputs: tf.Tensor
    z: tf.Tensor


@contextlib.contextmanager
def recording(layers):
    """Within the block, each of ``layers`` records its input and pre-activation output (a list
    of :class:`Record`) and still computes what it computed."""
    records: list[Record] = []
    for layer in layers:
        layer.call = _recorded(layer, records)
    try:
        yield records
    finally:
        for layer in layers:
            del layer.call  # the class's call again


def _recorded(layer, records):
    plain = type(layer).call.__get__(layer)

    def call(inputs, *args, **kwargs):
        activation = getattr(layer, "activation", None)
        if activation is None:
            z = plain(inputs, *args, **kwargs)
            records.append(Record(layer, inputs, z))
            return z
        layer.activation = keras.activations.linear
        try:
            z = plain(inputs, *args, **kwargs)
        finally:
            layer.activation = activation
        records.append(Record(layer, inputs, z))
        return activation(z)

    return call


def squared_norms(operands: list) -> tf.Tensor:
    """Each example's squared gradient norm over the recorded layers' weights, shape ``[B]``
    (``operands``: :func:`operands`)."""
    total = None
    for record, a, g in operands:
        if type(record.layer) is keras.layers.Embedding:
            part = _embedding(a, g)
        elif type(record.layer) in _NORMALIZATIONS:
            part = sum(tf.reduce_sum(tf.square(d), 1) for _, d in _affine(record.layer, a, g))
        else:
            part = _linear(a, g, record.layer.use_bias)
        total = part if total is None else total + part
    return total


def weighted_sums(operands: list, factor: tf.Tensor) -> dict:
    """``sum_i factor_i * (example i's gradient)`` of each recorded layer's weights, from the
    same :func:`operands` as the norms (no second backward pass).

    Returns:
        ``variable.ref()`` -> its summed gradient.
    """
    out = {}
    for record, a, g in operands:
        layer = record.layer
        g = g * tf.reshape(factor, [-1] + [1] * (g.shape.rank - 1))
        if type(layer) is keras.layers.Embedding:
            ids = tf.reshape(tf.cast(a, tf.int32), [-1])
            rows = tf.reshape(g, [-1, g.shape[-1]])
            table = layer.embeddings
            out[table.ref()] = tf.math.unsorted_segment_sum(rows, ids, table.shape[0])
            continue
        if type(layer) in _NORMALIZATIONS:
            for weight, d in _affine(layer, a, g):
                out[weight.ref()] = tf.reduce_sum(d, 0)
            continue
        a = tf.reshape(a, [-1, a.shape[-1]])
        g = tf.reshape(g, [-1, g.shape[-1]])
        kernel = tf.matmul(a, g, transpose_a=True)
        out[layer.kernel.ref()] = tf.reshape(kernel, layer.kernel.shape)
        if layer.use_bias:
            out[layer.bias.ref()] = tf.reduce_sum(g, 0)
    return out


def operands(records: list[Record], grads: list) -> list:
    """Each record with its input operand (patches for a convolution, ids for an embedding) and
    its output gradient, in float32: ``(record, a, g)``.

    Args:
        records: What :func:`recording` recorded.
        grads: ``d(sum of per-example losses)/dz`` of each record (unscaled).
    """
    return list(_operands(records, grads))


def _operands(records, grads):
    for record, g in zip(records, grads):
        g = tf.cast(g, tf.float32)
        kind = type(record.layer)
        if kind is keras.layers.Embedding:
            yield record, record.inputs, g
            continue
        a = tf.cast(record.inputs, tf.float32)
        if kind is keras.layers.Conv2D:
            a, g = _patches(record.layer, a), _flat_positions(g)
        elif kind in _NORMALIZATIONS:
            a, g = _flat_positions(_normalized(record.layer, a)), _flat_positions(g)
        yield record, a, g


def _normalized(layer, x):
    """``x`` normalized as the layer does it before its scale and offset (its epsilon, each
    example's statistics over the channels, or over the positions and channels of a group)."""
    if type(layer) is keras.layers.LayerNormalization:
        mean, variance = tf.nn.moments(x, [-1], keepdims=True)
        return (x - mean) * tf.math.rsqrt(variance + layer.epsilon)
    channels = x.shape[-1]
    grouped = tf.reshape(x, [tf.shape(x)[0], -1, layer.groups, channels // layer.groups])
    mean, variance = tf.nn.moments(grouped, [1, 3], keepdims=True)
    grouped = (grouped - mean) * tf.math.rsqrt(variance + layer.epsilon)
    return tf.reshape(grouped, tf.shape(x))


def _affine(layer, x_hat, g) -> list:
    """``[(weight, each example's gradient [B, C])]`` of the layer's scale and offset, from
    ``x_hat`` and ``g`` of shape ``[B, T, C]``."""
    out = []
    if layer.scale:
        out.append((layer.gamma, tf.reduce_sum(x_hat * g, 1)))
    if layer.center:
        out.append((layer.beta, tf.reduce_sum(g, 1)))
    return out


def _linear(a, g, bias: bool):
    """Squared norms of ``a_i^T g_i`` (and of ``sum_t g_t``) for ``a`` ``[B, (T,) P]`` and ``g``
    ``[B, (T,) C]``."""
    if a.shape.rank == 2:
        out = tf.reduce_sum(tf.square(a), 1) * tf.reduce_sum(tf.square(g), 1)
        return out + tf.reduce_sum(tf.square(g), 1) if bias else out
    a = tf.reshape(a, [tf.shape(a)[0], -1, a.shape[-1]])
    g = tf.reshape(g, [tf.shape(g)[0], -1, g.shape[-1]])
    positions, p, c = a.shape[1], a.shape[-1], g.shape[-1]
    if positions is not None and positions * positions * (p + c) < positions * p * c:
        gram = tf.matmul(a, a, transpose_b=True) * tf.matmul(g, g, transpose_b=True)
        out = tf.reduce_sum(gram, [1, 2])
    else:
        out = tf.reduce_sum(tf.square(tf.einsum("btp,btc->bpc", a, g)), [1, 2])
    return out + tf.reduce_sum(tf.square(tf.reduce_sum(g, 1)), 1) if bias else out


def _patches(layer, a):
    """The input patches each output position of a Conv2D reads, ``[B, H', W', kh*kw*Cin]``."""
    kh, kw = layer.kernel_size
    sh, sw = layer.strides
    dh, dw = layer.dilation_rate
    return tf.image.extract_patches(
        a,
        sizes=[1, kh, kw, 1],
        strides=[1, sh, sw, 1],
        rates=[1, dh, dw, 1],
        padding=layer.padding.upper(),
    )


def _flat_positions(g):
    return tf.reshape(g, [tf.shape(g)[0], -1, g.shape[-1]])


def _embedding(ids, g):
    """Squared norms of an embedding's per-example gradient: rows of equal ids add up."""
    n = tf.shape(g)[0]
    ids = tf.reshape(tf.cast(ids, tf.int64), [n, -1])
    g = tf.reshape(g, [n, tf.shape(ids)[1], -1])
    same = tf.cast(tf.equal(ids[:, :, None], ids[:, None, :]), tf.float32)
    return tf.reduce_sum(same * tf.matmul(g, g, transpose_b=True), [1, 2])
